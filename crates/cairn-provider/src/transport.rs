//! One HTTP exchange on a worker thread, delivered to the caller as messages
//! on a channel so the caller can poll its cancel token and enforce its
//! deadlines (first byte, idle, the call's total) while the socket blocks.
//!
//! This module owns the blocking client (`ureq`) and the thread. It must not
//! interpret bodies (SSE and JSON belong to the adapters) nor decide retries.
//! Dropping the [`Exchange`] (cancellation, a timeout, a decoded error)
//! aborts the request: the worker's next hand-over fails because the channel
//! is closed, it drops the response and the connection is closed, so a
//! server still generating stops at once (tested). A server that sends
//! nothing at all keeps the worker blocked in `read` until ureq's per-read
//! timeout (the larger of the first-byte and idle timeouts) closes it, and
//! ureq's global timeout (the call's total) bounds even a trickling one.

use std::io::Read;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::thread;
use std::time::{Duration, Instant};

use cairn_core::CancelToken;

/// A request ready to send. Header values may hold a secret; this type is
/// therefore not `Debug`.
pub(crate) struct Outgoing {
    pub(crate) url: String,
    pub(crate) headers: Vec<(String, String)>,
    /// Shared with the caller: every attempt of a call sends the same
    /// bytes, and a long body is not copied per attempt.
    pub(crate) body: std::sync::Arc<Vec<u8>>,
}

/// What the worker reports.
enum Msg {
    Head { status: u16, headers: Vec<(String, String)> },
    Chunk(Vec<u8>),
    End,
    Failed { kind: FailKind, message: String },
}

/// Transport failure classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailKind {
    Connection,
    /// A per-attempt timeout (connect, first byte, idle): worth a retry.
    Timeout,
    /// The call's total time limit passed: nothing is left to retry with.
    OutOfTime,
    Cancelled,
}

/// When a wait must end, what to say when it does, and which failure that is.
#[derive(Debug, Clone)]
pub(crate) struct Deadline {
    pub(crate) at: Instant,
    /// The message of the failure (it starts with "timed out").
    pub(crate) what: String,
    pub(crate) kind: FailKind,
}

impl Deadline {
    /// A deadline `after` from now (a limit too large for the clock means
    /// "a century", never a panic).
    pub(crate) fn after(after: Duration, what: String, kind: FailKind) -> Self {
        Self { at: later(after), what, kind }
    }

    /// Whichever of the two passes first.
    pub(crate) fn earliest<'a>(&'a self, other: &'a Deadline) -> &'a Deadline {
        if other.at < self.at { other } else { self }
    }

    /// The failure of a wait cut off by this deadline.
    pub(crate) fn failure(&self) -> Failure {
        Failure { kind: self.kind, message: self.what.clone() }
    }
}

/// A century: the stand-in for a limit the clock cannot represent.
const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `now + after`, saturating at a century from now.
pub(crate) fn later(after: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(after.min(CENTURY)).unwrap_or(now)
}

/// A transport failure, already free of secrets (ureq errors name the URL,
/// never header values).
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub(crate) kind: FailKind,
    pub(crate) message: String,
}

/// The response head.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
}

impl Head {
    /// A header value by case-insensitive name.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// A running exchange.
pub(crate) struct Exchange {
    rx: Receiver<Msg>,
    poll: Duration,
}

/// A body piece or the end of the body.
pub(crate) enum Piece {
    Bytes(Vec<u8>),
    End,
}

/// The timeouts the caller enforces (connect is ureq's).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) connect: Duration,
    pub(crate) first_byte: Duration,
    pub(crate) idle: Duration,
    /// The whole call, every attempt included.
    pub(crate) total: Duration,
    pub(crate) poll: Duration,
}

/// Build the shared agent. `http_status_as_error(false)`: error bodies are
/// read and shown. The per-read timeout is a backstop that lets an abandoned
/// worker close its socket; the caller enforces the real idle timeout.
pub(crate) fn agent(limits: &Limits, loopback: bool) -> ureq::Agent {
    // Clamped so that no configured value can overflow ureq's clock sums.
    let cap = |d: Duration| d.min(CENTURY);
    let second = Duration::from_secs(1);
    let mut builder = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(cap(limits.connect)))
        .timeout_recv_response(Some(cap(limits.connect.saturating_add(limits.first_byte))))
        .timeout_per_read(Some(cap(limits.first_byte.max(limits.idle).saturating_add(second))))
        .timeout_global(Some(cap(limits.total.saturating_add(second))))
        .user_agent(concat!("cairn/", env!("CARGO_PKG_VERSION")));
    if loopback {
        // A proxy from the environment must never see loopback traffic.
        builder = builder.proxy(None);
    }
    builder.build().into()
}

/// Start the exchange on a worker thread.
pub(crate) fn start(agent: &ureq::Agent, request: Outgoing, poll: Duration) -> Exchange {
    // A small bound keeps a fast server from filling memory while the
    // caller is busy; the worker blocks instead.
    let (tx, rx) = mpsc::sync_channel(64);
    let agent = agent.clone();
    let spawned = thread::Builder::new().name("cairn-http".to_owned()).spawn(move || run(&agent, request, &tx));
    if let Err(e) = spawned {
        // No worker: report it through a fresh channel.
        let (tx, rx) = mpsc::sync_channel(1);
        let _ = tx.send(Msg::Failed { kind: FailKind::Connection, message: format!("cannot start a thread: {e}") });
        return Exchange { rx, poll };
    }
    Exchange { rx, poll }
}

fn run(agent: &ureq::Agent, request: Outgoing, tx: &SyncSender<Msg>) {
    let mut call = agent.post(&request.url);
    for (k, v) in &request.headers {
        call = call.header(k.as_str(), v.as_str());
    }
    let response = match call.send(&request.body[..]) {
        Ok(r) => r,
        Err(e) => {
            let _ = tx.send(failed(&e));
            return;
        }
    };
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    if tx.send(Msg::Head { status, headers }).is_err() {
        return;
    }
    let mut reader = response.into_body().into_reader();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => {
                let _ = tx.send(Msg::End);
                return;
            }
            Ok(n) => {
                if tx.send(Msg::Chunk(buf[..n].to_vec())).is_err() {
                    return;
                }
            }
            Err(e) => {
                let kind =
                    if e.kind() == std::io::ErrorKind::TimedOut { FailKind::Timeout } else { FailKind::Connection };
                let _ = tx.send(Msg::Failed {
                    kind,
                    message: format!("the connection broke while reading the response: {e}"),
                });
                return;
            }
        }
    }
}

fn failed(e: &ureq::Error) -> Msg {
    let kind = match e {
        ureq::Error::Timeout(_) => FailKind::Timeout,
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => FailKind::Timeout,
        _ => FailKind::Connection,
    };
    let message = match e {
        ureq::Error::Timeout(ureq::Timeout::Connect) => "timed out connecting to the server".to_owned(),
        ureq::Error::Timeout(ureq::Timeout::RecvResponse) => "timed out waiting for the response headers".to_owned(),
        ureq::Error::Timeout(t) => format!("timed out ({t:?})"),
        ureq::Error::HostNotFound => "host not found (check the base URL)".to_owned(),
        ureq::Error::ConnectionFailed => {
            "could not connect to the server (is it running? check the base URL)".to_owned()
        }
        other => format!("request failed: {other}"),
    };
    Msg::Failed { kind, message }
}

impl Exchange {
    /// Wait for the response head until `deadline`.
    pub(crate) fn head(&mut self, deadline: &Deadline, cancel: &CancelToken) -> Result<Head, Failure> {
        match self.next(deadline, cancel)? {
            Msg::Head { status, headers } => Ok(Head { status, headers }),
            Msg::Failed { kind, message } => Err(Failure { kind, message }),
            Msg::Chunk(_) | Msg::End => {
                Err(Failure { kind: FailKind::Connection, message: "the response had no head".to_owned() })
            }
        }
    }

    /// Wait for the next body piece until `deadline`.
    pub(crate) fn piece(&mut self, deadline: &Deadline, cancel: &CancelToken) -> Result<Piece, Failure> {
        match self.next(deadline, cancel)? {
            Msg::Chunk(bytes) => Ok(Piece::Bytes(bytes)),
            Msg::End => Ok(Piece::End),
            Msg::Failed { kind, message } => Err(Failure { kind, message }),
            Msg::Head { .. } => {
                Err(Failure { kind: FailKind::Connection, message: "unexpected second response head".to_owned() })
            }
        }
    }

    fn next(&mut self, deadline: &Deadline, cancel: &CancelToken) -> Result<Msg, Failure> {
        loop {
            if cancel.is_cancelled() {
                return Err(Failure { kind: FailKind::Cancelled, message: "the call was cancelled".to_owned() });
            }
            let now = Instant::now();
            if now >= deadline.at {
                return Err(deadline.failure());
            }
            match self.rx.recv_timeout(self.poll.min(deadline.at - now)) {
                Ok(msg) => return Ok(msg),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Failure {
                        kind: FailKind::Connection,
                        message: "the HTTP worker stopped unexpectedly".to_owned(),
                    });
                }
            }
        }
    }
}
