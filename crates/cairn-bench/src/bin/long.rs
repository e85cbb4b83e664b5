//! Benchmark: a long session opened, checked, shown and resumed (issue 33),
//! against the parse floor and, when a tole binary is given, against tole.
//!
//! One conversation spec ([`Conversation`]: turns, tool calls per turn,
//! the sizes of questions, tool outputs and answers) is written as a cairn
//! session with the turn's record shapes (the payloads' own constructors,
//! as `cairn_testtools::history` does, but with many calls per turn). Every
//! measure runs in a child process whose peak RSS a small helper process
//! reads from `wait4`'s rusage (Linux counts the spawner's own high-water
//! mark into a child's, so the benchmark never spawns the measured process
//! itself), and the measures of one run are interleaved (their order
//! rotates from run to run) so all see the same load:
//!
//! - **floor**: this binary reading the same file line by line and parsing
//!   each line into a `serde_json::Value` (built and dropped): the cost of
//!   reading and parsing the bytes once;
//! - **store**: `JsonlStore::open` alone (replay into the index), in this
//!   binary, to tell the store's share of `open` from the session's;
//! - **open**: `JsonlStore::open` + `Session::open` (replay, the strict
//!   lifecycle check, the pc check, the lane's context), in this binary;
//! - **check**: `cairn --json check FILE`;
//! - **show**: `cairn show ID` to `/dev/null`;
//! - **resume**: `cairn resume ID --prompt …` on a fresh copy of the file
//!   (made before the child starts, not timed), through a loopback
//!   OpenAI-compatible fake (`cairn-test-server`, in this process) named
//!   in the config with a 128k-token window.
//!
//! Each row: median wall time and peak RSS with min–max over the runs, the
//! peak RSS against the file's size, and the ratios against the floor
//! measured in the same run (ratio of medians, spread of the per-run
//! ratios). With `TOLE=path` (and the feature `tole`) the same
//! conversation is also written by tole-core 0.9.0's own storage code with
//! the commits tole's turn makes, and `tole status ID` and `tole resume ID
//! PROMPT` (through the same fake) join the interleaved runs; the table
//! then adds cairn's `check`/`show` against `tole status` and `resume`
//! against `tole resume`.
//!
//! Run: `cargo run --release -p cairn-bench --bin long` (needs the release
//! `cairn` next to it: `cargo build --release --no-default-features -p
//! cairn-cli`, or `CAIRN_BIN`); against tole: `TOLE=/path/to/tole cargo
//! run --release -p cairn-bench --features tole --bin long`. `--turns N`,
//! `--calls K`, `--runs R` override the spec (default: 1,333 turns of 37
//! calls, 199,950 cairn entries; 7 runs); `--only resume,check` runs only
//! those measures (and the floor); `--write DIR` only writes the
//! conversation to `DIR/long.jsonl`. `--smoke`: a tiny session, two runs,
//! for `scripts/test`. Against the code before a change, in the same
//! runs: `BASE_LONG=path` (this benchmark built from it: `base store`,
//! `base open`) and `BASE_CAIRN=path` (its `cairn`: `base check`, `base
//! show`, `base resume`).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use cairn_bench::{Spread, Table, size};
use cairn_core::approval::Answer;
use cairn_core::events::{ToolCompletedPayload, ToolRequestedPayload, ToolStartedPayload, VerdictRecord};
use cairn_core::message::{ContentPart, Message, Role, ToolCall};
use cairn_core::storage::{Durability, Header, JsonlStore, Storage, StoreOptions, Transaction, to_raw};
use cairn_core::tool::{ReplayPolicy, Risk, ToolReceipt, ToolRequest};
use cairn_core::{Session, SessionConfig};
use cairn_test_server::{Reply, TestServer, streams};
use serde_json::json;

/// What the generated conversation holds: the same for every runtime.
#[derive(Debug, Clone, Copy)]
struct Conversation {
    /// User turns.
    turns: usize,
    /// Tool calls (`read_file`) per turn, each answered.
    calls: usize,
}

impl Conversation {
    /// Entries cairn writes for it: per turn the question, per call the
    /// assistant's call, its intent, start and completion, and the answer.
    fn cairn_entries(&self) -> usize {
        self.turns * (2 + 4 * self.calls)
    }
}

/// The user's question of `turn` (~150 bytes).
fn question(turn: usize) -> String {
    format!(
        "question {turn}: please read the modules under src/ and explain what handle_{turn} does with its \
         arguments and whether the error path is covered by a test"
    )
}

/// The output of call `call` of `turn`: every tenth is a 6 KiB file read,
/// the others four lines (~400 bytes).
fn output(turn: usize, call: usize) -> String {
    let line = format!("fn handle_{turn}_{call}(input: &str, limit: usize) -> Result<String, Error> {{ /* … */ }}\n");
    let lines = if call % 10 == 9 { 6 * 1024 / line.len() } else { 4 };
    line.repeat(lines.max(1))
}

/// The assistant's final answer of `turn` (~200 bytes).
fn answer(turn: usize) -> String {
    format!(
        "handle_{turn} validates its input, trims it to the limit and returns the rest; the error path is covered \
         by test_handle_{turn}_rejects_empty_input, and the other modules only forward their arguments to it."
    )
}

/// Write `conv` as a cairn session `id` in `dir`: one commit per step as
/// the turn makes them (the question; each call with its intent, start and
/// completion; the answer), the lane head moved by each.
fn write_cairn(dir: &Path, id: &str, conv: Conversation) -> Result<PathBuf> {
    let opts = StoreOptions { compact_ratio: None, ..StoreOptions::with_durability(Durability::None) };
    let mut store = JsonlStore::create(dir, Header::new(id, "/bench"), opts)?;
    let mut head: Option<String> = None;
    let mut n = 0usize;
    let mut next_id = || {
        n += 1;
        format!("e{n}")
    };
    let verdict = VerdictRecord { decision: Answer::Approve, by: "policy:readOnly".to_owned(), at: 1_700_000_000_000 };
    for turn in 0..conv.turns {
        let user = next_id();
        store.commit(
            Transaction::new()
                .entry(&user, head.as_deref(), "message", to_raw(&Message::text(Role::User, question(turn)))?)
                .set("lane", "main", to_raw(&user)?),
        )?;
        head = Some(user);
        for call in 0..conv.calls {
            let request = ToolRequest {
                invocation_id: format!("i{turn}.{call}"),
                call_id: format!("call_{turn}_{call}"),
                session_id: id.to_owned(),
                tool: "read_file".to_owned(),
                arguments: json!({"path": format!("src/module_{}.rs", call % 50)}),
            };
            let asking = Message {
                role: Role::Assistant,
                content: vec![
                    ContentPart::Text { text: "Let me read the next module.".to_owned() },
                    ContentPart::ToolCall(ToolCall {
                        id: request.call_id.clone(),
                        name: request.tool.clone(),
                        arguments: request.arguments.clone(),
                    }),
                ],
            };
            let requested = ToolRequestedPayload::new(
                format!("t{turn}"),
                request.clone(),
                Some(Risk::ReadOnly),
                Some(ReplayPolicy::Idempotent),
            );
            let started = ToolStartedPayload::new(&request, verdict.clone());
            let receipt = ToolReceipt {
                exit_code: 0,
                output_summary: output(turn, call),
                structured_output: None,
                affected_entities: Vec::new(),
                duration_ms: 3,
                tier: Risk::ReadOnly,
                timestamp: 1_700_000_000_000,
                truncated: false,
            };
            let completed = ToolCompletedPayload::new(&request, receipt, None, None, Vec::new());
            let mut tx = Transaction::new();
            for (entry_type, raw) in [
                ("message", to_raw(&asking)?),
                ("toolRequested", to_raw(&requested)?),
                ("toolStarted", to_raw(&started)?),
                ("toolCompleted", to_raw(&completed)?),
            ] {
                let entry = next_id();
                tx = tx.entry(&entry, head.as_deref(), entry_type, raw);
                head = Some(entry);
            }
            store.commit(tx.set("lane", "main", to_raw(&head)?))?;
        }
        let done = next_id();
        store.commit(
            Transaction::new()
                .entry(&done, head.as_deref(), "message", to_raw(&Message::text(Role::Assistant, answer(turn)))?)
                .set("lane", "main", to_raw(&done)?),
        )?;
        head = Some(done);
    }
    Ok(store.path().to_owned())
}

/// Write `conv` as a tole 0.9 session `id` in `dir` through tole-core's
/// own storage and effect-sandwich API, with the commits tole's turn makes
/// (`tole_core::turn`: the question with the move to Planning; per call
/// the move to ToolCall, the intent with its pending cell, the settlement
/// and the move back to Planning; the answer with the move to Final).
/// The same questions, call inputs, outputs and answers as [`write_cairn`].
/// tole fsyncs every commit, so `dir` should be on a tmpfs.
#[cfg(feature = "tole")]
fn write_tole(dir: &Path, id: &str, conv: Conversation) -> Result<PathBuf> {
    use tole_core::entry::{EntryType, NewEntry};
    use tole_core::machine::{ReplaySafety, begin, finish, settle_ok};
    use tole_core::state::{Pc, StateTransition};
    use tole_core::storage::{Commit, JsonlStorage, Storage as _};
    let mut s = JsonlStorage::create(dir, id, Some("/bench".to_owned()))?;
    let message = |role: &str, text: String| {
        NewEntry::root(EntryType::new(EntryType::MESSAGE), json!({"role": role, "text": text}))
    };
    for turn in 0..conv.turns {
        let seq = s.state().seq;
        s.commit(
            Commit::new().entry(message("user", question(turn))).transition(StateTransition::from(seq, Pc::Planning)),
        )?;
        for call in 0..conv.calls {
            let seq = s.state().seq;
            s.commit(Commit::new().transition(StateTransition::from(seq, Pc::ToolCall)))?;
            let input = json!({"path": format!("src/module_{}.rs", call % 50)});
            let handle = begin(&mut s, "read_file", input, ReplaySafety::Idempotent, None)?;
            settle_ok(&mut s, &handle, json!(output(turn, call)))?;
            finish(&mut s)?;
        }
        let seq = s.state().seq;
        s.commit(
            Commit::new().entry(message("assistant", answer(turn))).transition(StateTransition::from(seq, Pc::Final)),
        )?;
    }
    Ok(dir.join(format!("{id}.jsonl")))
}

/// Write the tole file of `conv` and return its size.
#[cfg(feature = "tole")]
fn tole_file(dir: &Path, id: &str, conv: Conversation) -> Result<u64> {
    let started = Instant::now();
    let path = write_tole(dir, id, conv)?;
    let size = std::fs::metadata(&path)?.len();
    println!(
        "the same conversation for tole: {:.1} MiB (written by tole-core 0.9.0 in {:.1} s)",
        mib(size as f64),
        started.elapsed().as_secs_f64()
    );
    Ok(size)
}

#[cfg(not(feature = "tole"))]
fn tole_file(_dir: &Path, _id: &str, _conv: Conversation) -> Result<u64> {
    anyhow::bail!(
        "TOLE is set, but this binary was built without the `tole` feature (--features tole) that writes tole's file"
    )
}

/// The floor, in a child: read `path` line by line and parse each line
/// into a `serde_json::Value`, dropped before the next.
fn floor_child(path: &Path) -> Result<()> {
    let mut reader = BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
    let mut line = Vec::new();
    let mut lines = 0u64;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        let value: serde_json::Value = serde_json::from_slice(&line)?;
        std::hint::black_box(&value);
        lines += 1;
    }
    ensure!(lines > 0, "empty file");
    Ok(())
}

/// `Session::open` of `path`, in a child (the store opened for writing,
/// as a resume opens it).
fn open_child(path: &Path) -> Result<()> {
    let opts = StoreOptions { compact_ratio: None, ..StoreOptions::with_durability(Durability::None) };
    let store = JsonlStore::open(path, opts)?;
    let session = Session::open(store, SessionConfig::default())?;
    ensure!(session.head().is_some(), "no head");
    Ok(())
}

/// `JsonlStore::open` of `path` alone, in a child (what `open` adds to it
/// is the session's own state).
fn store_child(path: &Path) -> Result<()> {
    let opts = StoreOptions { compact_ratio: None, ..StoreOptions::with_durability(Durability::None) };
    let store = JsonlStore::open(path, opts)?;
    ensure!(store.last_seq() > 0, "empty store");
    Ok(())
}

/// Run `cmd` to its end; wall time and peak RSS (bytes) of that child,
/// from `wait4`. Fails when it fails.
///
/// Linux carries the RSS high-water mark of the process that spawned a
/// child into the child's `ru_maxrss` (the spawner's memory is the child's
/// until its exec), so this runs in a small helper process (this binary,
/// `--measure-child`), never in the benchmark's own, which holds the
/// generated conversation and the loopback server.
// The child is reaped by `wait4` (for its rusage), which clippy cannot see.
#[allow(clippy::zombie_processes)]
fn spawn_and_wait(cmd: &mut Command) -> Result<(Duration, u64)> {
    let started = Instant::now();
    let child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn()?;
    let pid = libc::pid_t::try_from(child.id())?;
    let mut stderr = String::new();
    if let Some(mut err) = child.stderr {
        std::io::Read::read_to_string(&mut err, &mut stderr)?;
    }
    let mut status = 0;
    // SAFETY: rusage is plain data; all-zero is a valid value of it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 reaps our own child `pid` and writes into the two
    // locals, which outlive the call.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let elapsed = started.elapsed();
    ensure!(rc == pid, "wait4: {}", std::io::Error::last_os_error());
    ensure!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "{cmd:?} failed ({status}): {stderr}");
    // Linux reports ru_maxrss in KiB.
    Ok((elapsed, u64::try_from(usage.ru_maxrss)? * 1024))
}

/// The helper of [`measure`]: run `args` (program first) with this
/// process's environment and directory; print its seconds and peak RSS.
fn measure_child(args: &[String]) -> Result<()> {
    let (program, rest) = args.split_first().context("no program to measure")?;
    let (time, rss) = spawn_and_wait(Command::new(program).args(rest))?;
    println!("{} {rss}", time.as_secs_f64());
    Ok(())
}

/// A command run through the helper: this binary `--measure-child PROGRAM
/// ARGS…` (environment and directory set on it reach the program).
fn measured(program: &Path, args: &[&str]) -> Result<Command> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("--measure-child").arg(program).args(args);
    Ok(cmd)
}

/// Run a [`measured`] command; the program's wall time and peak RSS.
fn measure(mut helper: Command) -> Result<(Duration, u64)> {
    let out = helper.stdin(Stdio::null()).output()?;
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text.split_whitespace();
    let secs: f64 = parts.next().context("no time")?.parse()?;
    let rss: u64 = parts.next().context("no peak RSS")?.parse()?;
    Ok((Duration::from_secs_f64(secs), rss))
}

/// A private home for both runtimes, on a tmpfs where there is one (tole
/// fsyncs each commit while its file is written; both files then live on
/// the same file system): cairn's `CAIRN_HOME` with the generated session
/// and a config naming the loopback provider, and tole's sessions directory.
struct Home {
    _dir: tempfile::TempDir,
    home: PathBuf,
    sessions: PathBuf,
    tole_sessions: PathBuf,
    url: String,
}

impl Home {
    fn new(url: &str) -> Result<Self> {
        let dir = match tempfile::tempdir_in("/dev/shm") {
            Ok(dir) => dir,
            Err(_) => tempfile::tempdir()?,
        };
        let home = dir.path().join("home");
        let sessions = home.join("sessions");
        let tole_sessions = dir.path().join("tole-sessions");
        std::fs::create_dir_all(&sessions)?;
        std::fs::create_dir_all(&tole_sessions)?;
        std::fs::create_dir_all(home.join("fakehome"))?;
        // The loopback fake as an OpenAI-compatible provider with a 128k
        // window (the first request after opening a long session compacts).
        std::fs::write(
            home.join("config.toml"),
            format!(
                "[providers.fake]\nkind = \"openai-chat\"\nbase_url = \"{url}/v1\"\nmodel = \"bench-model\"\n\
                 api_key_env = \"FAKE_KEY\"\ncontext_window = 128000\n"
            ),
        )?;
        Ok(Self { _dir: dir, home, sessions, tole_sessions, url: url.to_owned() })
    }

    fn cairn(&self, bin: &Path, args: &[&str]) -> Result<Command> {
        let mut cmd = measured(bin, args)?;
        cmd.current_dir(&self.home)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.home.join("fakehome"))
            .env("CAIRN_HOME", &self.home)
            .env("CAIRN_PROVIDER", "fake")
            .env("FAKE_KEY", "bench")
            .env("NO_COLOR", "1");
        Ok(cmd)
    }

    fn tole(&self, bin: &Path, args: &[&str]) -> Result<Command> {
        let dir = self.tole_sessions.display().to_string();
        let mut all = vec!["--sessions-dir", &dir, "--no-config", "--no-skills"];
        all.extend(args);
        let mut cmd = measured(bin, &all)?;
        cmd.current_dir(&self.home)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.home.join("fakehome"))
            .env("CODECORA_HOME", self.home.join("codecora"))
            .env("TOLE_BASE_URL", format!("{}/v1", self.url))
            .env("TOLE_API_KEY", "bench")
            .env("TOLE_MODEL", "bench-model")
            .env("NO_COLOR", "1");
        Ok(cmd)
    }
}

/// The samples of one measure over the runs.
#[derive(Default)]
struct Samples {
    times: Vec<Duration>,
    rss: Vec<u64>,
}

fn mib(bytes: f64) -> f64 {
    bytes / 1048576.0
}

/// The tole binary to compare with (`TOLE=path`), if any.
/// Ask the kernel to drop `path`'s pages from the page cache (clean
/// pages only; a file in use keeps its mapped pages). Best effort: a
/// failure only leaves the cache as it was.
fn drop_from_page_cache(path: &Path) {
    use std::os::fd::AsRawFd as _;
    if let Ok(file) = std::fs::File::open(path) {
        // SAFETY: fadvise on an open descriptor; it changes no memory of ours.
        let _ = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

fn tole_bin() -> Option<PathBuf> {
    std::env::var_os("TOLE").filter(|v| !v.is_empty()).map(PathBuf::from)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("--floor-child") => return floor_child(Path::new(&args[2])),
        Some("--open-child") => return open_child(Path::new(&args[2])),
        Some("--store-child") => return store_child(Path::new(&args[2])),
        Some("--measure-child") => return measure_child(&args[2..]),
        _ => {}
    }
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)?.parse::<usize>().ok());
    let conv = Conversation {
        turns: flag("--turns").unwrap_or(size(1_333, 6)),
        calls: flag("--calls").unwrap_or(size(37, 5)),
    };
    // `--write DIR`: only write the conversation (as DIR/long.jsonl), for
    // profiling a measure by hand.
    if let Some(dir) = args.iter().position(|a| a == "--write").and_then(|i| args.get(i + 1)) {
        let path = write_cairn(Path::new(dir), "long", conv)?;
        println!("{}", path.display());
        return Ok(());
    }
    let runs = flag("--runs").unwrap_or(size(7, 2));
    let bin = cairn_bench::cairn_bin()?;
    let me = std::env::current_exe()?;
    let server = TestServer::start(Vec::new())?;
    let home = Home::new(&server.url())?;
    let id = "long";
    let started = Instant::now();
    let path = write_cairn(&home.sessions, id, conv)?;
    let file_size = std::fs::metadata(&path)?.len();
    println!(
        "conversation: {} turns × {} calls = {} cairn entries, {:.1} MiB (written in {:.1} s); {runs} runs",
        conv.turns,
        conv.calls,
        conv.cairn_entries(),
        mib(file_size as f64),
        started.elapsed().as_secs_f64()
    );
    let tole = tole_bin();
    let tole_size = match tole {
        Some(_) => tole_file(&home.tole_sessions, id, conv)?,
        None => 0,
    };
    let mut names = vec!["floor", "store", "open", "check", "show", "resume"];
    if tole.is_some() {
        names.extend(["tole status", "tole resume"]);
    }
    // The code before a change, in the same runs: BASE_LONG (this
    // benchmark built from it: its store and open children) and BASE_CAIRN
    // (its `cairn`).
    let base_long = std::env::var_os("BASE_LONG").filter(|v| !v.is_empty()).map(PathBuf::from);
    let base_cairn = std::env::var_os("BASE_CAIRN").filter(|v| !v.is_empty()).map(PathBuf::from);
    if base_long.is_some() {
        names.extend(["base store", "base open"]);
    }
    if base_cairn.is_some() {
        names.extend(["base check", "base show", "base resume"]);
    }
    // `--only a,b`: those measures and the floor (every ratio needs it).
    if let Some(only) = args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)) {
        let wanted: Vec<&str> = only.split(',').map(str::trim).collect();
        for w in &wanted {
            ensure!(names.contains(w), "--only: no measure {w:?} (measures: {})", names.join(", "));
        }
        names.retain(|n| *n == "floor" || wanted.contains(n));
    }
    // Every measured binary's pages leave the page cache first: a binary
    // just written by the linker or `cp` sits there in larger folios, and a
    // fault then maps more of it, so two equal binaries could differ by
    // over a MiB of peak RSS by how they were last written.
    for program in
        [Some(bin.clone()), Some(me.clone()), tole.clone(), base_long.clone(), base_cairn.clone()].into_iter().flatten()
    {
        drop_from_page_cache(&program);
    }
    let mut samples: Vec<Samples> = names.iter().map(|_| Samples::default()).collect();
    let path_s = path.display().to_string();
    let copy = home.sessions.join("resumed.jsonl");
    let tole_copy = home.tole_sessions.join("resumed.jsonl");
    for run in 0..runs {
        for k in 0..names.len() {
            let which = (k + run) % names.len();
            let cmd = match names[which] {
                "floor" => measured(&me, &["--floor-child", &path_s])?,
                "store" => measured(&me, &["--store-child", &path_s])?,
                "open" => measured(&me, &["--open-child", &path_s])?,
                "base store" => measured(base_long.as_deref().context("BASE_LONG")?, &["--store-child", &path_s])?,
                "base open" => measured(base_long.as_deref().context("BASE_LONG")?, &["--open-child", &path_s])?,
                "check" => home.cairn(&bin, &["--json", "check", &path_s])?,
                "base check" => {
                    home.cairn(base_cairn.as_deref().context("BASE_CAIRN")?, &["--json", "check", &path_s])?
                }
                "show" => home.cairn(&bin, &["show", id])?,
                "base show" => home.cairn(base_cairn.as_deref().context("BASE_CAIRN")?, &["show", id])?,
                "resume" | "base resume" => {
                    // A fresh copy, its header id its own name (the lookup
                    // checks it); not timed.
                    let text = std::fs::read_to_string(&path)?;
                    std::fs::write(&copy, text.replacen("\"id\":\"long\"", "\"id\":\"resumed\"", 1))?;
                    for _ in 0..4 {
                        server.push(Reply::sse(streams::chat_text_with_usage("ok")));
                    }
                    let which_bin = match names[which] {
                        "resume" => bin.as_path(),
                        _ => base_cairn.as_deref().context("BASE_CAIRN")?,
                    };
                    home.cairn(which_bin, &["resume", "resumed", "--prompt", "one more question"])?
                }
                "tole status" => home.tole(tole.as_deref().context("tole")?, &["status", id])?,
                _ => {
                    let text = std::fs::read_to_string(home.tole_sessions.join(format!("{id}.jsonl")))?;
                    std::fs::write(&tole_copy, text.replacen("\"id\":\"long\"", "\"id\":\"resumed\"", 1))?;
                    for _ in 0..4 {
                        server.push(Reply::sse(streams::chat_text_with_usage("ok")));
                    }
                    home.tole(tole.as_deref().context("tole")?, &["resume", "resumed", "one more question"])?
                }
            };
            let (time, rss) = measure(cmd).with_context(|| names[which])?;
            samples[which].times.push(time);
            samples[which].rss.push(rss);
        }
    }
    let _ = std::fs::remove_file(&copy);
    let _ = std::fs::remove_file(&tole_copy);
    let mut table = Table::new(&format!(
        "long session (issue 33): {} turns × {} calls, {} cairn entries, {:.1} MiB",
        conv.turns,
        conv.calls,
        conv.cairn_entries(),
        mib(file_size as f64)
    ));
    let by_name = |name: &str| names.iter().position(|n| *n == name).map(|i| &samples[i]);
    let floor = &samples[0];
    let floor_rss = Spread::of(&floor.rss.iter().map(|&b| b as f64).collect::<Vec<_>>());
    for (name, s) in names.iter().zip(&samples) {
        let rss: Vec<f64> = s.rss.iter().map(|&b| b as f64).collect();
        let spread = Spread::of(&rss);
        let per_run: Vec<f64> = s.rss.iter().zip(&floor.rss).map(|(&m, &f)| m as f64 / f.max(1) as f64).collect();
        let rss_ratio = Spread::of(&per_run);
        let own_file = if name.starts_with("tole") { tole_size } else { file_size };
        table.figure(
            &format!("{name}: peak RSS"),
            &format!(
                "{:.1} MiB ({:.1}–{:.1}, n={}) = **{:.2}× its file**; {:.2}× the floor's {:.1} MiB (per run {:.2}–{:.2})",
                mib(spread.median),
                mib(spread.min),
                mib(spread.max),
                spread.n,
                spread.median / own_file.max(1) as f64,
                spread.median / floor_rss.median.max(1.0),
                mib(floor_rss.median),
                rss_ratio.min,
                rss_ratio.max
            ),
        );
        if *name != "floor" {
            table.compare(&format!("{name}: wall time"), &s.times, "floor (a Value per line)", &floor.times);
        }
    }
    // cairn against tole on the same conversation: time ratio of medians
    // (per-run spread) and peak RSS ratio, for open/check and resume.
    for name in ["store", "open", "check", "show", "resume"] {
        let base = format!("base {name}");
        if let (Some(new), Some(old)) = (by_name(name), by_name(&base)) {
            table.compare(&format!("{name} vs the code before: wall time"), &new.times, &base, &old.times);
            let rss = |s: &Samples| Spread::of(&s.rss.iter().map(|&b| b as f64).collect::<Vec<_>>()).median;
            table.figure(
                &format!("{name} vs the code before: peak RSS"),
                &format!("{:.1} MiB vs {:.1} MiB", mib(rss(new)), mib(rss(old))),
            );
        }
    }
    for (ours, theirs) in [("check", "tole status"), ("show", "tole status"), ("resume", "tole resume")] {
        if let (Some(a), Some(b)) = (by_name(ours), by_name(theirs)) {
            table.compare(&format!("{ours} vs {theirs}: wall time"), &a.times, theirs, &b.times);
            let rss = |s: &Samples| Spread::of(&s.rss.iter().map(|&b| b as f64).collect::<Vec<_>>()).median;
            table.figure(
                &format!("{ours} vs {theirs}: peak RSS"),
                &format!(
                    "{:.1} MiB vs {:.1} MiB: tole needs {:.2}× cairn's memory",
                    mib(rss(a)),
                    mib(rss(b)),
                    rss(b) / rss(a).max(1.0)
                ),
            );
        }
    }
    if let Some(check) = by_name("check") {
        let rate = file_size as f64 / Spread::of_durations(&check.times).median.max(1e-9);
        table.figure(
            "check: rate",
            &format!("{:.0} MiB/s, {:.0} entries/s", mib(rate), rate / file_size as f64 * conv.cairn_entries() as f64),
        );
    }
    table.print();
    Ok(())
}
