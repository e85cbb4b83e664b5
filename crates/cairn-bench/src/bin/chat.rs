//! Benchmark: how quickly `cairn chat` answers a person (issue 32), through
//! the real `cairn` binary on a real pseudo-terminal, with a session of
//! 1,000 messages and an editor history of 1,000 prompts.
//!
//! - keypress → echo: from writing a key to the pty until the terminal
//!   receives its echo, against `cat` in raw mode on a pty of its own (the
//!   least a program that echoes keys can cost: the pty round trip).
//! - first word of a paragraph → screen (issue 49.6): the same, one word of
//!   a line still arriving per delta (no newline), against `curl -N`;
//! - streamed delta → screen: from a loopback model server writing one SSE
//!   text delta (a line) until the rendered line reaches the terminal,
//!   against `curl -N` reading the same kind of stream from the same kind
//!   of server onto a pty (network and pty without parsing or rendering).
//!
//! Samples of cairn and of the baseline alternate, so both see the same
//! load. Both figures are compared with a frame (16 ms), the issue's
//! budget. The `cairn` binary is `$CAIRN_BIN`, else the one next to this
//! binary (`scripts/bench chat` builds both). Run: `cargo run --release -p
//! cairn-bench --bin chat` (`--smoke`: tiny sizes).
#![allow(clippy::print_stdout)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use cairn_bench::{Spread, Table, size};
use sha2::{Digest, Sha256};

/// The frame budget of the issue.
const FRAME: Duration = Duration::from_millis(16);
/// How long any one wait may take before the run is declared broken.
const DEADLINE: Duration = Duration::from_secs(60);

/// A program on a pty; what it writes arrives as timestamped chunks.
struct Pty {
    master: std::fs::File,
    child: Child,
    chunks: Receiver<(Instant, Vec<u8>)>,
    /// What arrived and was not yet matched.
    pending: Vec<u8>,
}

impl Pty {
    fn spawn(mut cmd: Command) -> Result<Self> {
        let (mut master, mut slave) = (0, 0);
        let mut ws = libc::winsize { ws_row: 50, ws_col: 120, ws_xpixel: 0, ws_ypixel: 0 };
        // SAFETY: openpty writes two descriptors; no name or termios given.
        let rc = unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), &raw mut ws) };
        if rc != 0 {
            bail!("openpty: {}", std::io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just opened and are owned here.
        let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
        cmd.stdin(Stdio::from(slave.try_clone()?)).stdout(Stdio::from(slave.try_clone()?)).stderr(Stdio::from(slave));
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().context("cannot start the program on a pty")?;
        let master = std::fs::File::from(master);
        let mut from = master.try_clone()?;
        let (tx, chunks): (Sender<(Instant, Vec<u8>)>, _) = channel();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n) = from.read(&mut buf) {
                if n == 0 || tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        });
        Ok(Self { master, child, chunks, pending: Vec::new() })
    }

    fn send(&mut self, bytes: &[u8]) -> Result<()> {
        self.master.write_all(bytes)?;
        Ok(self.master.flush()?)
    }

    /// Forget what arrived so far.
    fn drain(&mut self) {
        while let Ok((_, bytes)) = self.chunks.try_recv() {
            self.pending.extend_from_slice(&bytes);
        }
        self.pending.clear();
    }

    /// Wait for `needle`; the instant the chunk completing it arrived.
    fn wait_for(&mut self, needle: &[u8]) -> Result<Instant> {
        let start = Instant::now();
        loop {
            if let Some(at) = find(&self.pending, needle) {
                self.pending.drain(..at + needle.len());
                // Already here: it arrived no later than now.
                return Ok(Instant::now());
            }
            let left = DEADLINE.checked_sub(start.elapsed()).unwrap_or_default();
            let (when, bytes) = self.chunks.recv_timeout(left).map_err(|_| {
                anyhow::anyhow!(
                    "never saw {:?}; last output: {:?}",
                    String::from_utf8_lossy(needle),
                    String::from_utf8_lossy(&self.pending[self.pending.len().saturating_sub(400)..])
                )
            })?;
            self.pending.extend_from_slice(&bytes);
            if let Some(at) = find(&self.pending, needle) {
                self.pending.drain(..at + needle.len());
                return Ok(when);
            }
        }
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A loopback Chat Completions server that streams one text delta each
/// time it is told to, and says when it wrote it.
struct Model {
    url: String,
    next: Sender<Option<String>>,
    written: Receiver<Instant>,
}

impl Model {
    fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let url = format!("http://{}", listener.local_addr()?);
        let (next, lines) = channel::<Option<String>>();
        let (wrote, written) = channel();
        std::thread::spawn(move || {
            if let Ok((conn, _)) = listener.accept() {
                let _ = serve(conn, &lines, &wrote);
            }
        });
        Ok(Self { url, next, written })
    }

    /// Stream `line` as one delta; when it was handed to the socket.
    fn delta(&self, line: &str) -> Result<Instant> {
        self.next.send(Some(line.to_owned()))?;
        Ok(self.written.recv_timeout(DEADLINE)?)
    }

    /// End the stream.
    fn finish(&self) {
        let _ = self.next.send(None);
    }
}

fn serve(conn: TcpStream, lines: &Receiver<Option<String>>, wrote: &Sender<Instant>) -> Result<()> {
    conn.set_nodelay(true)?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header)?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body)?;
    let mut out = conn;
    out.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")?;
    out.flush()?;
    let event = |data: &str| format!("data: {data}\n\n");
    while let Ok(Some(line)) = lines.recv() {
        let content = serde_json::to_string(&line)?;
        let bytes = event(&format!(r#"{{"choices":[{{"index":0,"delta":{{"content":{content}}}}}]}}"#));
        // The delta leaves now: the clock starts before the write.
        let _ = wrote.send(Instant::now());
        out.write_all(bytes.as_bytes())?;
        out.flush()?;
    }
    out.write_all(event(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#).as_bytes())?;
    out.write_all(event("[DONE]").as_bytes())?;
    out.flush()?;
    Ok(())
}

type Home = cairn_bench::CairnHome;

/// `cairn ARGS` in `home` on a colour terminal, with the benchmark's key.
fn cairn(home: &Home, bin: &Path, args: &[&str]) -> Command {
    let mut cmd = home.command(bin, args);
    cmd.env("TERM", "xterm-256color").env("BENCH_KEY", "k");
    cmd
}

/// A session of `messages` messages (half prompts, half answers), made by
/// a `cairn chat` reading prompts from a pipe; its id.
fn long_session(bin: &Path, home: &Home, messages: usize) -> Result<String> {
    let turns = messages / 2;
    let script: String = (0..turns)
        .map(|k| {
            format!("{}\n", serde_json::json!({"text": format!("answer {k}: {}", "words of an answer ".repeat(8))}))
        })
        .collect();
    let script_path = home.home.join("script.jsonl");
    std::fs::write(&script_path, script)?;
    let mut chat = cairn(home, bin, &["--script", &script_path.display().to_string(), "chat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let prompts: String = (0..turns).map(|k| format!("prompt {k}: tell me about item {k}\n")).collect();
    chat.stdin.take().context("stdin")?.write_all(prompts.as_bytes())?;
    let out = chat.wait_with_output()?;
    if !out.status.success() {
        bail!("making the long session failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let dir = home.home.join("sessions");
    let file = std::fs::read_dir(&dir)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .context("no session file")?;
    let text = std::fs::read_to_string(&file)?;
    let made = text.matches(r#""type":"message""#).count();
    if made < messages {
        bail!("the long session has {made} messages, not {messages}");
    }
    Ok(file.file_stem().context("name")?.to_string_lossy().into_owned())
}

/// The editor's history of prompts typed in `cwd` (where `cairn chat`
/// keeps it: `lineedit.rs`), `n` entries.
fn long_history(home: &Home, n: usize) -> Result<()> {
    let digest = Sha256::digest(home.cwd.as_os_str().as_encoded_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    let dir = home.home.join("history");
    std::fs::create_dir_all(&dir)?;
    let entries: String = (0..n).map(|k| format!("an earlier prompt number {k}\n")).collect();
    std::fs::write(dir.join(hex), format!("#V2\n{entries}"))?;
    Ok(())
}

fn frames(samples: &[Duration]) -> String {
    let s = Spread::of_durations(samples);
    format!(
        "median {:.1}% of a 16 ms frame (IQR {:.1}–{:.1}%, max {:.1}%)",
        s.median / FRAME.as_secs_f64() * 100.0,
        s.q1 / FRAME.as_secs_f64() * 100.0,
        s.q3 / FRAME.as_secs_f64() * 100.0,
        s.max / FRAME.as_secs_f64() * 100.0
    )
}

fn main() -> Result<()> {
    let bin = cairn_bench::cairn_bin()?;
    let messages = size(1_000, 20);
    let keys = size(300, 10);
    let deltas = size(200, 10);
    let mut table = Table::new("chat: keypress and streamed delta to the terminal (issue 32)");
    let home = Home::new()?;
    let id = long_session(&bin, &home, messages)?;
    long_history(&home, size(1_000, 20))?;
    let model = Model::start()?;
    let base_model = Model::start()?;
    // A window the whole history fits in: every request carries all
    // 1,000 messages (no compaction first).
    std::fs::write(
        home.home.join("config.toml"),
        format!(
            "[providers.bench]\nkind = \"openai\"\nbase_url = \"{}/v1\"\nmodel = \"m\"\napi_key_env = \"BENCH_KEY\"\n\
             context_window = 1000000\n",
            model.url
        ),
    )?;
    let mut chat = Pty::spawn(cairn(&home, &bin, &["--provider", "bench", "chat", &id]))?;
    chat.wait_for("Ctrl-D leaves".as_bytes())?;
    chat.wait_for("›".as_bytes())?;
    let mut cat = Pty::spawn({
        let mut c = Command::new("sh");
        c.args(["-c", "stty raw -echo; echo ready; exec cat"]);
        c
    })?;
    cat.wait_for(b"ready")?;
    chat.drain();
    cat.drain();

    // Keypress → echo, cairn's and the baseline's samples alternating.
    let mut key_ours = Vec::with_capacity(keys);
    let mut key_base = Vec::with_capacity(keys);
    for i in 0..keys {
        let key = [b'a' + u8::try_from(i % 26).unwrap_or(0)];
        let mut ours = || -> Result<()> {
            // Only what arrives after the key counts.
            chat.drain();
            let sent = Instant::now();
            chat.send(&key)?;
            key_ours.push(chat.wait_for(&key)?.saturating_duration_since(sent));
            Ok(())
        };
        let mut theirs = || -> Result<()> {
            cat.drain();
            let sent = Instant::now();
            cat.send(&key)?;
            key_base.push(cat.wait_for(&key)?.saturating_duration_since(sent));
            Ok(())
        };
        if i % 2 == 0 {
            ours()?;
            theirs()?;
        } else {
            theirs()?;
            ours()?;
        }
        if (i + 1) % 40 == 0 {
            // Kill the line (Ctrl-U) and let the prompt be redrawn.
            chat.send(b"\x15")?;
            chat.wait_for(b"\x1b[K")?;
        }
    }
    table.compare("keypress → echo, 1,000-message session", &key_ours, "cat in raw mode", &key_base);
    table.figure("keypress → echo against the frame budget", &frames(&key_ours));

    // Streamed delta → screen.
    chat.send(b"\x15")?;
    chat.wait_for(b"\x1b[K")?;
    chat.send(b"stream please\r")?;
    // The baseline needs curl; without it the figure stands alone (said so).
    let have_curl = Command::new("curl").arg("--version").stdout(Stdio::null()).status().is_ok_and(|s| s.success());
    let mut curl = if have_curl {
        Some(Pty::spawn({
            let mut c = Command::new("curl");
            c.args([
                "-sN",
                "-H",
                "content-type: application/json",
                "-d",
                "{}",
                &format!("{}/v1/chat/completions", base_model.url),
            ]);
            c
        })?)
    } else {
        println!("curl not found: the streamed-delta baseline is left out");
        None
    };
    let mut k = 0usize;
    let mut fail = None;
    let mut delta_ours = Vec::new();
    let mut delta_base = Vec::new();
    for i in 0..deltas {
        let mut ours = || {
            k += 1;
            let line = format!("tick {k:06}\n");
            let needle = format!("tick {k:06}");
            chat.drain();
            match model.delta(&line).and_then(|wrote| Ok((wrote, chat.wait_for(needle.as_bytes())?))) {
                Ok((wrote, seen)) => delta_ours.push(seen.saturating_duration_since(wrote)),
                Err(e) => fail = Some(e),
            }
        };
        let mut theirs = || {
            let Some(curl) = curl.as_mut() else { return };
            let needle = format!("base {i:06}");
            curl.drain();
            if let Ok((wrote, seen)) = base_model
                .delta(&format!("{needle}\n"))
                .and_then(|wrote| Ok((wrote, curl.wait_for(needle.as_bytes())?)))
            {
                delta_base.push(seen.saturating_duration_since(wrote));
            }
        };
        if i % 2 == 0 {
            ours();
            theirs();
        } else {
            theirs();
            ours();
        }
        if let Some(e) = fail.take() {
            return Err(e);
        }
    }
    // First word of a paragraph → screen (issue 49.6): one long line
    // streamed a word at a time, no newline until the end; each word must
    // show on its own, before the line is complete.
    let mut word_ours = Vec::new();
    let mut word_base = Vec::new();
    for i in 0..deltas {
        let mut ours = || {
            let needle = format!("word{i:06}");
            chat.drain();
            match model.delta(&format!("{needle} ")).and_then(|wrote| Ok((wrote, chat.wait_for(needle.as_bytes())?))) {
                Ok((wrote, seen)) => word_ours.push(seen.saturating_duration_since(wrote)),
                Err(e) => fail = Some(e),
            }
        };
        let mut theirs = || {
            let Some(curl) = curl.as_mut() else { return };
            let needle = format!("wbase{i:06}");
            curl.drain();
            if let Ok((wrote, seen)) =
                base_model.delta(&format!("{needle} ")).and_then(|wrote| Ok((wrote, curl.wait_for(needle.as_bytes())?)))
            {
                word_base.push(seen.saturating_duration_since(wrote));
            }
        };
        if i % 2 == 0 {
            ours();
            theirs();
        } else {
            theirs();
            ours();
        }
        if let Some(e) = fail.take() {
            return Err(e.context("a word of a paragraph still arriving never reached the screen"));
        }
    }
    let _ = model.delta("end of the paragraph\n");
    model.finish();
    base_model.finish();
    if word_base.is_empty() {
        table.figure("first word of a streamed paragraph → screen", &cairn_bench::describe(&word_ours));
    } else {
        table.compare("first word of a streamed paragraph → screen", &word_ours, "curl -N onto a pty", &word_base);
    }
    if delta_base.is_empty() {
        table.figure("streamed delta → screen, 1,000-message session", &cairn_bench::describe(&delta_ours));
    } else {
        table.compare("streamed delta → screen, 1,000-message session", &delta_ours, "curl -N onto a pty", &delta_base);
    }
    table.figure("streamed delta → screen against the frame budget", &frames(&delta_ours));
    chat.wait_for("›".as_bytes())?;
    chat.send(b"\x04")?;
    table.print();
    Ok(())
}
