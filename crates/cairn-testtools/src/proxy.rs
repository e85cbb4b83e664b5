//! A loopback TCP proxy in front of a server's Unix socket, with the faults
//! of a network between one client and the server: a reset (every
//! connection closed at once, new ones closed as they come), a blackhole
//! (bytes swallowed both ways, connections left open, new ones accepted
//! and swallowed too: a partition, not a reset), and a delay (every chunk
//! delivered late, in order; both ways, or only the server's replies). A fault can be started now or armed to start
//! when the client sends given bytes (e.g. the `COMMIT` of a
//! transaction, so the server is left inside it).
//!
//! It owns only the bytes between client and server; it knows nothing of
//! what they mean beyond the armed pattern. Healing is the caller's: a
//! healed blackhole closes every connection (a healed network finds them
//! dropped by the server's timeouts or keepalives); a healed delay lets
//! what was held arrive, in order, and passes the rest at once.
//!
//! Written for the PostgreSQL fleet tests (a `cairn worker` whose
//! connection is cut); `cairn-pg`'s partition suite has its own proxy with
//! the targeted COMMIT-reply hold of issue 47.1.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

/// What the network does to the client's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Every connection is closed at once; new ones are closed as accepted.
    Reset,
    /// Bytes are swallowed both ways; connections stay open, new ones are
    /// accepted and swallowed too (the server is never reached).
    Blackhole,
    /// Every chunk (both ways) is delivered this long after it was read.
    Delay(Duration),
    /// What the server sends is delivered this long after it was read;
    /// what the client sends passes at once (its commits land in time,
    /// their replies come late).
    DelayReplies(Duration),
}

/// The two ends of one proxied connection, kept to close them.
#[derive(Debug)]
struct Ends {
    client: TcpStream,
    server: Option<UnixStream>,
}

impl Ends {
    fn close(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        if let Some(s) = &self.server {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

#[derive(Debug, Default)]
struct State {
    fault: Option<Fault>,
    /// Start this fault right after the client sends these bytes.
    armed: Option<(Vec<u8>, Fault)>,
    conns: Vec<Ends>,
    /// When each fault started.
    started: Vec<SystemTime>,
    accepted: usize,
}

impl State {
    fn start(&mut self, fault: Fault) {
        self.fault = Some(fault);
        self.armed = None;
        self.started.push(SystemTime::now());
        if fault == Fault::Reset {
            for c in self.conns.drain(..) {
                c.close();
            }
        }
    }
}

type Shared = Arc<Mutex<State>>;

fn lock(state: &Shared) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A chunk to write at a given instant, or the end of the stream.
enum Chunk {
    Data(Instant, Vec<u8>),
    End(Instant),
}

/// A loopback TCP proxy to a Unix socket (see the module's doc). Its
/// threads live as long as the process (a test's proxy ends with it).
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    state: Shared,
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// Writes what `rx` brings to `out` at its instant; at the end (or when
/// writing fails) shuts `out`'s writing side.
fn writer(rx: Receiver<Chunk>, mut out: impl Write, shut: impl Fn()) {
    for chunk in rx {
        let (at, bytes) = match chunk {
            Chunk::Data(at, bytes) => (at, Some(bytes)),
            Chunk::End(at) => (at, None),
        };
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        match bytes {
            Some(b) if out.write_all(&b).is_ok() => {}
            _ => break,
        }
    }
    shut();
}

/// Reads `input` and hands each chunk to `tx` as the current fault says;
/// `from_client` chunks are also matched against the armed pattern.
fn reader(mut input: impl Read, tx: Sender<Chunk>, state: Shared, from_client: bool) {
    let mut buf = vec![0u8; 64 * 1024];
    // The end of the previous chunk, for a pattern cut in two.
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        let fault = {
            let mut s = lock(&state);
            if from_client && let Some((pattern, fault)) = s.armed.clone() {
                let mut hay = std::mem::take(&mut tail);
                hay.extend_from_slice(chunk);
                if contains(&hay, &pattern) {
                    // The bytes that armed it are the fault's first: a
                    // blackholed `COMMIT` leaves the server inside the
                    // transaction it would have ended.
                    s.start(fault);
                } else {
                    tail = hay[hay.len().saturating_sub(pattern.len())..].to_vec();
                }
            }
            s.fault
        };
        let at = match fault {
            Some(Fault::Blackhole) => continue,
            Some(Fault::Reset) => break,
            Some(Fault::Delay(d)) => Instant::now() + d,
            Some(Fault::DelayReplies(d)) if !from_client => Instant::now() + d,
            Some(Fault::DelayReplies(_)) | None => Instant::now(),
        };
        if tx.send(Chunk::Data(at, chunk.to_vec())).is_err() {
            break;
        }
    }
    // The other side hears of the end unless a partition is on (it hears
    // nothing until it heals).
    let fault = lock(&state).fault;
    if fault != Some(Fault::Blackhole) {
        let at = match fault {
            Some(Fault::Delay(d)) => Instant::now() + d,
            Some(Fault::DelayReplies(d)) if !from_client => Instant::now() + d,
            _ => Instant::now(),
        };
        let _ = tx.send(Chunk::End(at));
    }
}

impl Proxy {
    /// Listen on a free loopback port; each connection goes to `socket`.
    pub fn to_unix_socket(socket: &Path) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let state: Shared = Arc::default();
        let st = Arc::clone(&state);
        let socket: PathBuf = socket.to_owned();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let _ = accept(client, &socket, &st);
            }
        });
        Ok(Self { port, state })
    }

    /// The port clients connect to (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Start `fault` now.
    pub fn fault_now(&self, fault: Fault) {
        lock(&self.state).start(fault);
    }

    /// Start `fault` when the client next sends `pattern`; the chunk that
    /// carries it is the fault's first (swallowed by a blackhole, delayed
    /// by a delay, never sent after a reset).
    pub fn arm(&self, pattern: &[u8], fault: Fault) {
        lock(&self.state).armed = Some((pattern.to_vec(), fault));
    }

    /// The fault on now, if any.
    pub fn fault(&self) -> Option<Fault> {
        lock(&self.state).fault
    }

    /// When the latest fault started.
    pub fn last_started(&self) -> Option<SystemTime> {
        lock(&self.state).started.last().copied()
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        lock(&self.state).accepted
    }

    /// End the fault (and disarm): after a blackhole every connection is
    /// closed; after a delay what is held still arrives, in order.
    pub fn heal(&self) {
        let mut s = lock(&self.state);
        if s.fault == Some(Fault::Blackhole) {
            for c in s.conns.drain(..) {
                c.close();
            }
        }
        s.fault = None;
        s.armed = None;
    }
}

fn accept(client: TcpStream, socket: &Path, state: &Shared) -> std::io::Result<()> {
    let mut s = lock(state);
    s.accepted += 1;
    match s.fault {
        Some(Fault::Reset) => {
            let _ = client.shutdown(Shutdown::Both);
            return Ok(());
        }
        Some(Fault::Blackhole) => {
            // Accepted and swallowed: the server is never reached.
            let mut from_client = client.try_clone()?;
            s.conns.push(Ends { client, server: None });
            drop(s);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                while matches!(from_client.read(&mut buf), Ok(n) if n > 0) {}
            });
            return Ok(());
        }
        _ => {}
    }
    let server = UnixStream::connect(socket)?;
    s.conns.push(Ends { client: client.try_clone()?, server: Some(server.try_clone()?) });
    drop(s);
    let (up_tx, up_rx) = channel();
    let (down_tx, down_rx) = channel();
    let (c_read, c_write, c_shut) = (client.try_clone()?, client.try_clone()?, client);
    let (s_read, s_write, s_shut) = (server.try_clone()?, server.try_clone()?, server);
    let (st1, st2) = (Arc::clone(state), Arc::clone(state));
    std::thread::spawn(move || reader(c_read, up_tx, st1, true));
    std::thread::spawn(move || writer(up_rx, s_write, move || drop(s_shut.shutdown(Shutdown::Write))));
    std::thread::spawn(move || reader(s_read, down_tx, st2, false));
    std::thread::spawn(move || writer(down_rx, c_write, move || drop(c_shut.shutdown(Shutdown::Write))));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// An echo server on a Unix socket in `dir`.
    fn echo(dir: &Path) -> PathBuf {
        let path = dir.join("echo.sock");
        let listener = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                std::thread::spawn(move || {
                    let mut out = conn.try_clone().unwrap();
                    let _ = std::io::copy(&mut conn, &mut out);
                });
            }
        });
        path
    }

    fn roundtrip(port: u16, text: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut c = TcpStream::connect(("127.0.0.1", port))?;
        c.set_read_timeout(Some(Duration::from_secs(30)))?;
        c.write_all(text)?;
        let mut got = vec![0u8; text.len()];
        c.read_exact(&mut got)?;
        Ok(got)
    }

    #[test]
    fn passes_resets_swallows_and_heals() {
        let dir = tempfile::tempdir().unwrap();
        let proxy = Proxy::to_unix_socket(&echo(dir.path())).unwrap();
        assert_eq!(roundtrip(proxy.port(), b"hello").unwrap(), b"hello");
        proxy.fault_now(Fault::Reset);
        assert!(roundtrip(proxy.port(), b"hello").is_err(), "a reset connection answered");
        proxy.heal();
        assert_eq!(roundtrip(proxy.port(), b"again").unwrap(), b"again");
        // A blackhole: nothing comes back (a short read timeout: the test
        // waits for an absence, so any wait shows it).
        let mut c = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
        proxy.arm(b"COMMIT", Fault::Blackhole);
        c.write_all(b"xx COMMIT").unwrap();
        let mut got = vec![0u8; 9];
        // What armed it is swallowed, and so would be any reply.
        c.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        assert!(c.read_exact(&mut got).is_err());
        assert_eq!(proxy.fault(), Some(Fault::Blackhole));
        proxy.heal();
        let mut rest = Vec::new();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        assert_eq!(c.read_to_end(&mut rest).unwrap(), 0, "a healed blackhole closes its connections");
        // A delay keeps order.
        proxy.fault_now(Fault::Delay(Duration::from_millis(50)));
        let mut c = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        for part in [&b"one "[..], b"two ", b"three"] {
            c.write_all(part).unwrap();
        }
        let mut got = vec![0u8; 13];
        c.read_exact(&mut got).unwrap();
        assert_eq!(got, b"one two three");
        assert!(proxy.accepted() >= 4);
    }
}
