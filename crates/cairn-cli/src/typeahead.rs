//! Keys typed in `cairn chat` while a turn runs (issue 49.6): the terminal
//! stops echoing them (they were written raw into the streamed answer) and
//! a reader thread keeps them, so they become the next prompt — a line
//! ended with Enter is sent as soon as the turn ends, the rest waits in the
//! line editor to be finished — with the editing keys they held (arrows,
//! Home/End, Backspace, Delete, a bracketed paste) applied, not lost. Esc
//! pressed alone interrupts the turn, as Ctrl-C does. While cairn asks a
//! person something in the turn (an approval), the reader stops and the
//! terminal is as it was, so a key typed ahead is never taken as the
//! answer ([`pause`]).
//!
//! It owns the terminal's mode during a turn and its restoration (also
//! when cairn leaves mid-turn: [`restore`]). It must not interpret a line
//! (`slash.rs` does) nor write anything but one notice on Esc.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

/// Most bytes kept (a paste of a book while the model answers is cut
/// there: the editor would not take more as one prompt anyway).
const MAX_KEYS: usize = 1 << 20;

/// What Esc does (interrupt the running turn).
pub type OnEscape = Arc<dyn Fn() + Send + Sync>;

/// The reader of one turn.
struct Running {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
    saved: libc::termios,
}

struct State {
    running: Option<Running>,
    on_escape: Option<OnEscape>,
}

fn state() -> &'static Mutex<State> {
    static STATE: Mutex<State> = Mutex::new(State { running: None, on_escape: None });
    &STATE
}

/// Keys read so far in this turn.
static KEYS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Start keeping keys for the turn about to run (stdin a terminal).
pub fn start(on_escape: OnEscape) {
    let mut st = lock(state());
    lock(&KEYS).clear();
    st.on_escape = Some(on_escape);
    spawn(&mut st);
}

/// The turn ended: stop reading, put the terminal back, and return what
/// was typed.
pub fn finish() -> Vec<u8> {
    let mut st = lock(state());
    halt(&mut st);
    st.on_escape = None;
    std::mem::take(&mut *lock(&KEYS))
}

/// Put the terminal back as it was before the turn (cairn is leaving).
pub fn restore() {
    if let Ok(mut st) = state().try_lock() {
        halt(&mut st);
    }
}

/// The reader stopped while a question is asked; it goes on when this is
/// dropped.
pub struct Paused(bool);

/// Stop reading keys while cairn asks a person something: the terminal
/// echoes and reads lines again, and what was typed before the question
/// stays the next prompt (never the answer).
pub fn pause() -> Paused {
    let mut st = lock(state());
    let was = st.running.is_some();
    halt(&mut st);
    Paused(was)
}

impl Drop for Paused {
    fn drop(&mut self) {
        if self.0 {
            let mut st = lock(state());
            if st.on_escape.is_some() {
                spawn(&mut st);
            }
        }
    }
}

fn halt(st: &mut State) {
    if let Some(running) = st.running.take() {
        running.stop.store(true, Ordering::SeqCst);
        let _ = running.thread.join();
        let fd = std::io::stdin().as_raw_fd();
        // SAFETY: `saved` came from tcgetattr on this descriptor.
        unsafe {
            libc::tcsetattr(fd, libc::TCSANOW, &raw const running.saved);
        }
    }
}

fn spawn(st: &mut State) {
    if st.running.is_some() {
        return;
    }
    let fd = std::io::stdin().as_raw_fd();
    // SAFETY: a zeroed termios is filled by tcgetattr before use.
    let mut saved: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: fd is stdin; saved is a valid termios.
    if unsafe { libc::tcgetattr(fd, &raw mut saved) } != 0 {
        return;
    }
    let mut quiet = saved;
    // No echo, no line buffering (each key is read as typed); signals
    // (Ctrl-C, Ctrl-Z) stay the terminal's.
    quiet.c_lflag &= !(libc::ECHO | libc::ICANON);
    quiet.c_cc[libc::VMIN] = 1;
    quiet.c_cc[libc::VTIME] = 0;
    // SAFETY: fd is stdin; quiet is a valid termios.
    if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw const quiet) } != 0 {
        return;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let on_escape = st.on_escape.clone();
    let flag = Arc::clone(&stop);
    let thread = std::thread::spawn(move || read_keys(fd, &flag, on_escape.as_ref()));
    st.running = Some(Running { stop, thread, saved });
}

/// Read keys until `stop`: polled, so stopping never waits on a key.
fn read_keys(fd: i32, stop: &AtomicBool, on_escape: Option<&OnEscape>) {
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::SeqCst) {
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&raw mut pfd, 1, 50) };
        if ready <= 0 || pfd.revents & libc::POLLIN == 0 {
            if ready > 0 && pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
                return;
            }
            continue;
        }
        // SAFETY: buf is writable for its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        let Ok(n) = usize::try_from(n) else { continue };
        if n == 0 {
            return;
        }
        let chunk = &buf[..n];
        // Esc alone (not the start of an arrow's or a paste's sequence,
        // which a terminal sends in one write).
        let mut kept = Vec::with_capacity(n);
        let mut i = 0;
        while i < chunk.len() {
            let lone_escape = chunk[i] == 0x1b && !matches!(chunk.get(i + 1), Some(b'[' | b'O'));
            if lone_escape {
                if let Some(escape) = on_escape {
                    escape();
                }
            } else {
                kept.push(chunk[i]);
            }
            i += 1;
        }
        let mut held = lock(&KEYS);
        let room = MAX_KEYS.saturating_sub(held.len());
        held.extend_from_slice(&kept[..kept.len().min(room)]);
    }
}

/// What the keys typed during a turn come to: lines ended with Enter (each
/// to be sent as a prompt, in order), then the unfinished line split at
/// its cursor.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Queued {
    /// Complete lines.
    pub lines: Vec<String>,
    /// The unfinished line: before and after the cursor.
    pub partial: (String, String),
    /// Ctrl-D was typed on an empty line: leave once the lines are sent
    /// (what it does at the prompt; the keys after it are dropped).
    pub eof: bool,
}

/// Replay `keys` as the line editor would: printable text inserted at the
/// cursor; Left, Right, Home, End (and Ctrl-A, Ctrl-E), Backspace, Delete,
/// Ctrl-U applied; a bracketed paste inserted whole (its newlines stay in
/// the line); Enter ends a line; other sequences and control keys dropped.
pub fn replay(keys: &[u8]) -> Queued {
    let text = String::from_utf8_lossy(keys);
    let chars: Vec<char> = text.chars().collect();
    let mut out = Queued::default();
    let mut line: Vec<char> = Vec::new();
    let mut at = 0usize;
    let mut i = 0usize;
    let mut pasting = false;
    while i < chars.len() {
        let c = chars[i];
        if c == '\x1b' && chars.get(i + 1) == Some(&'[') {
            // A CSI sequence: parameters, then a final byte @..~.
            let mut j = i + 2;
            while j < chars.len() && !('\x40'..='\x7e').contains(&chars[j]) {
                j += 1;
            }
            let params: String = chars[i + 2..j.min(chars.len())].iter().collect();
            let last = chars.get(j).copied();
            i = j + 1;
            match (params.as_str(), last) {
                ("200", Some('~')) => pasting = true,
                ("201", Some('~')) => pasting = false,
                _ if pasting => {}
                ("", Some('D')) => at = at.saturating_sub(1),
                ("", Some('C')) => at = (at + 1).min(line.len()),
                ("" | "1", Some('H')) | ("1" | "7", Some('~')) => at = 0,
                ("" | "1", Some('F')) | ("4" | "8", Some('~')) => at = line.len(),
                ("3", Some('~')) if at < line.len() => {
                    line.remove(at);
                }
                _ => {}
            }
            continue;
        }
        if c == '\x1b' && chars.get(i + 1) == Some(&'O') {
            match chars.get(i + 2) {
                Some('D') => at = at.saturating_sub(1),
                Some('C') => at = (at + 1).min(line.len()),
                Some('H') => at = 0,
                Some('F') => at = line.len(),
                _ => {}
            }
            i += 3;
            continue;
        }
        i += 1;
        if pasting {
            let c = if c == '\r' { '\n' } else { c };
            line.insert(at, c);
            at += 1;
            continue;
        }
        match c {
            '\r' | '\n' => {
                let done: String = line.drain(..).collect();
                if !done.trim().is_empty() {
                    out.lines.push(done);
                }
                at = 0;
            }
            '\x7f' | '\x08' if at > 0 => {
                at -= 1;
                line.remove(at);
            }
            '\x04' if line.is_empty() => {
                out.eof = true;
                break;
            }
            '\x04' if at < line.len() => {
                line.remove(at);
            }
            '\x01' => at = 0,
            '\x05' => at = line.len(),
            '\x15' => {
                line.drain(..at);
                at = 0;
            }
            c if c.is_control() => {}
            c => {
                line.insert(at, c);
                at += 1;
            }
        }
    }
    out.partial = (line[..at].iter().collect(), line[at..].iter().collect());
    out
}

/// Whether stdin is a terminal this module can manage.
pub fn available() -> bool {
    use std::io::IsTerminal;
    std::io::stdin().is_terminal()
}

/// Write one notice line on stderr (Esc pressed).
pub fn notice(text: &str) {
    let _ = writeln!(std::io::stderr(), "\n{text}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_replayed_as_the_editor_would() {
        let q = replay(b"helo\x1b[Dl\x1b[F world");
        assert_eq!(q, Queued { lines: vec![], partial: ("hello world".into(), String::new()), eof: false });
        let q = replay(b"first\rsecx\x7fond\x1b[D\x1b[D");
        assert_eq!(q.lines, ["first"]);
        assert_eq!(q.partial, ("seco".to_owned(), "nd".to_owned()));
        let q = replay(b"\x1b[200~a\rb\x1b[201~!\x1bOH>");
        assert_eq!(q.partial, (">".to_owned(), "a\nb!".to_owned()));
        let q = replay("é\x1b[Dx\x1b[3~".as_bytes());
        assert_eq!(q.partial, ("x".to_owned(), String::new()));
        let q = replay(b"last\r\x04more");
        assert!(q.eof && q.lines == ["last"] && q.partial.0.is_empty(), "{q:?}");
    }
}
