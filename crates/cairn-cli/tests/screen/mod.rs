//! A program in a real pseudo-terminal whose output is rendered by a
//! terminal emulator (`vt100`), so tests assert what a person would see on
//! the screen, not the bytes: a reader thread feeds everything the program
//! writes to the emulator; tests type bytes, resize the terminal
//! (`TIOCSWINSZ`, which makes the kernel send `SIGWINCH`), and wait for
//! text to appear on the screen with a generous deadline (never a sleep).
//! Like a terminal, it answers cursor position requests.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a test waits for the screen to show something.
pub const DEADLINE: Duration = Duration::from_secs(90);

/// What the reader collected.
struct Seen {
    parser: vt100::Parser,
    /// Every byte written, for checks the grid cannot make (a sequence
    /// that was never sent).
    bytes: Vec<u8>,
    /// Every byte, or only the first `keep_bytes` (big outputs).
    keep_bytes: usize,
    /// Bytes read in all.
    total: usize,
    closed: bool,
}

/// A program on a pty, and its screen.
pub struct Screen {
    master: std::fs::File,
    child: Child,
    seen: Arc<Mutex<Seen>>,
    reader: Option<JoinHandle<()>>,
}

fn size(rows: u16, cols: u16) -> libc::winsize {
    libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 }
}

impl Screen {
    /// Start `cmd` on a new `rows`×`cols` pty (its session leader, the pty
    /// its controlling terminal), keeping `scrollback` rows above the screen.
    pub fn spawn(mut cmd: Command, rows: u16, cols: u16, scrollback: usize) -> Self {
        let (mut master, mut slave) = (0, 0);
        let mut ws = size(rows, cols);
        // SAFETY: openpty writes two descriptors; no name or termios given.
        let rc = unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), &raw mut ws) };
        assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: both descriptors were just opened and are owned here.
        let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
        cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave));
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap();
        let master = std::fs::File::from(master);
        let seen = Arc::new(Mutex::new(Seen {
            parser: vt100::Parser::new(
                std::num::NonZeroU16::new(rows).unwrap(),
                std::num::NonZeroU16::new(cols).unwrap(),
                scrollback,
            ),
            bytes: Vec::new(),
            keep_bytes: usize::MAX,
            total: 0,
            closed: false,
        }));
        let mut from = master.try_clone().unwrap();
        let mut reply = master.try_clone().unwrap();
        let into = Arc::clone(&seen);
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match from.read(&mut buf) {
                    // EIO: every slave descriptor is closed (the program left).
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let mut seen = into.lock().unwrap();
                        seen.parser.process(&buf[..n]);
                        // Answer a cursor position request as a terminal
                        // does (the line editor asks before each prompt).
                        if buf[..n].windows(4).any(|w| w == b"\x1b[6n") {
                            let (row, col) = seen.parser.screen().cursor_position();
                            let _ = reply.write_all(format!("\x1b[{};{}R", row + 1, col + 1).as_bytes());
                        }
                        seen.total += n;
                        let room = seen.keep_bytes.saturating_sub(seen.bytes.len()).min(n);
                        seen.bytes.extend_from_slice(&buf[..room]);
                    }
                }
            }
            into.lock().unwrap().closed = true;
        });
        Self { master, child, seen, reader: Some(reader) }
    }

    /// Keep only the first `n` bytes for [`Screen::bytes`] (the screen
    /// still sees all of them).
    pub fn keep_bytes(&self, n: usize) {
        self.seen.lock().unwrap().keep_bytes = n;
    }

    /// Type `bytes`.
    pub fn send(&mut self, bytes: &str) {
        self.master.write_all(bytes.as_bytes()).unwrap();
        self.master.flush().unwrap();
    }

    /// Type a line and Enter.
    pub fn line(&mut self, text: &str) {
        self.send(&format!("{text}\r"));
    }

    /// The screen's text now (scrolled-off rows not included).
    pub fn contents(&self) -> String {
        self.seen.lock().unwrap().parser.screen().contents()
    }

    /// The screen and the `rows` rows above it, as text.
    pub fn contents_with_scrollback(&self) -> String {
        let mut seen = self.seen.lock().unwrap();
        let screen = seen.parser.screen_mut();
        let mut pages = Vec::new();
        let capacity = screen.scrollback_capacity();
        screen.set_scrollback(capacity);
        let back = screen.scrollback();
        let (rows, _) = screen.size();
        let rows = usize::from(rows.get());
        // Page from the oldest row kept down to the live screen.
        let mut offset = back;
        loop {
            screen.set_scrollback(offset);
            pages.push(screen.contents());
            if offset == 0 {
                break;
            }
            offset = offset.saturating_sub(rows);
        }
        screen.set_scrollback(0);
        // Pages overlap when the scrollback is not a multiple of the
        // height: rows may repeat, which no assertion here minds.
        pages.join("\n")
    }

    /// Where `text` starts on the screen (row, column), one row at a time
    /// (no wrapped rows joined).
    pub fn find(&self, text: &str) -> Option<(u16, u16)> {
        let seen = self.seen.lock().unwrap();
        let screen = seen.parser.screen();
        let (_, cols) = screen.size();
        screen.rows(0, cols.get()).enumerate().find_map(|(row, line)| {
            let at = line.find(text)?;
            let col = line[..at].chars().count();
            Some((u16::try_from(row).ok()?, u16::try_from(col).ok()?))
        })
    }

    /// Wait until the last row with text asks an approval question.
    pub fn wait_question(&self) -> String {
        self.wait_until("an approval question on the last row", |t| {
            t.lines().rev().find(|l| !l.trim().is_empty()).is_some_and(|l| l.starts_with("Run it?"))
        })
    }

    /// The foreground colour of the cell at `row`, `col` of the screen.
    pub fn fg(&self, row: u16, col: u16) -> vt100::Color {
        let seen = self.seen.lock().unwrap();
        seen.parser.screen().cell(row, col).map_or(vt100::Color::Default, vt100::Cell::fgcolor)
    }

    /// Whether the cell at `row`, `col` of the screen is bold.
    pub fn bold(&self, row: u16, col: u16) -> bool {
        let seen = self.seen.lock().unwrap();
        seen.parser.screen().cell(row, col).is_some_and(vt100::Cell::bold)
    }

    /// Every byte the program wrote (up to [`Screen::keep_bytes`]).
    pub fn bytes(&self) -> Vec<u8> {
        self.seen.lock().unwrap().bytes.clone()
    }

    /// Bytes the program wrote in all.
    pub fn total_bytes(&self) -> usize {
        self.seen.lock().unwrap().total
    }

    /// Wait until `pred` holds for the screen's text; return that text.
    /// Fails after [`DEADLINE`] with the screen.
    pub fn wait_until(&self, why: &str, pred: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let (text, closed) = {
                let seen = self.seen.lock().unwrap();
                (seen.parser.screen().contents(), seen.closed)
            };
            if pred(&text) {
                return text;
            }
            assert!(!closed, "the program left before the screen showed {why}; the screen:\n{text}");
            assert!(start.elapsed() < DEADLINE, "the screen never showed {why}; the screen:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Wait until the screen shows `text`.
    pub fn wait_for(&self, text: &str) -> String {
        self.wait_until(&format!("{text:?}"), |screen| screen.contains(text))
    }

    /// Wait until the screen shows `text` `n` times.
    pub fn wait_for_n(&self, text: &str, n: usize) -> String {
        self.wait_until(&format!("{text:?} {n} times"), |screen| screen.matches(text).count() >= n)
    }

    /// Wait until the last row with text is the chat's empty prompt (`›`).
    /// Call it after waiting for what comes before the prompt (an answer),
    /// or it may see the previous one.
    pub fn wait_prompt(&self) -> String {
        self.wait_until("an empty prompt on the last row", |t| {
            t.lines().rev().find(|l| !l.trim().is_empty()).is_some_and(|l| l.trim_end() == "›")
        })
    }

    /// Resize the terminal: the kernel sends SIGWINCH to the program.
    pub fn resize(&mut self, rows: u16, cols: u16) {
        let ws = size(rows, cols);
        // SAFETY: TIOCSWINSZ reads one winsize from the pointer.
        let rc = unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &raw const ws) };
        assert_eq!(rc, 0, "TIOCSWINSZ: {}", std::io::Error::last_os_error());
        self.seen
            .lock()
            .unwrap()
            .parser
            .set_size(std::num::NonZeroU16::new(rows).unwrap(), std::num::NonZeroU16::new(cols).unwrap());
    }

    /// Wait for the program to leave (and its output to be read); its exit
    /// code.
    pub fn wait_exit(&mut self) -> i32 {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(start.elapsed() < DEADLINE, "the program did not leave; the screen:\n{}", self.contents());
            std::thread::sleep(Duration::from_millis(20));
        };
        if let Some(reader) = self.reader.take() {
            // The reader ends at EIO once no process holds the slave.
            let _ = reader.join();
        }
        status.code().unwrap_or_else(|| panic!("killed by a signal: {status:?}"))
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        if self.reader.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
