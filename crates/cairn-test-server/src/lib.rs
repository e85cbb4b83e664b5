//! cairn-test-server: a loopback HTTP/1.1 server for provider tests.
//!
//! It serves scripted replies in order (one per request: recorded
//! real-format SSE streams, error bodies, or hostile behaviour) and records
//! every request it received, so tests assert on both sides of the wire.
//! Hand-written on `std::net` and threads so every byte and every timing of a
//! reply is under the test's control (split at every byte, cut mid-event,
//! stall after the headers, pace a slow model, hold a reply until the test
//! opens a [`Gate`], notice a client that hung up). [`fixtures`] holds
//! recorded streams of the three APIs (files in `tests/data/`) for any
//! crate's tests; [`streams`] builds hostile ones.
//! It must only ever bind to 127.0.0.1, and it is test support: no TLS, no
//! keep-alive (every reply says `Connection: close`), request bodies by
//! `Content-Length` only.
#![deny(missing_docs)]
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod tokens;

/// How an SSE body is cut into writes (each write is one HTTP chunk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// One write for the whole body.
    Whole,
    /// One write per byte.
    EveryByte,
    /// Writes of this many bytes.
    Every(usize),
    /// One write per SSE event (blank-line separated), like a real server.
    PerEvent,
}

/// How the body is framed and how the reply ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Complete body, properly terminated.
    Complete,
    /// Send only the first `n` bytes of the body, then drop the connection
    /// (chunked framing left unterminated, as when a proxy dies).
    CutAt(usize),
    /// Send the headers, then nothing for this long, then close.
    StallAfterHeaders(Duration),
    /// Send the whole body, then keep the connection open and silent for
    /// this long (a server that never ends the stream).
    StallAtEnd(Duration),
}

/// Body framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `Transfer-Encoding: chunked` (what real streaming servers send).
    Chunked,
    /// `Content-Length`.
    Length,
    /// No length: the body ends when the connection closes.
    CloseDelimited,
}

/// One scripted reply.
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Extra headers (`content-type` included).
    pub headers: Vec<(String, String)>,
    /// The body bytes.
    pub body: Vec<u8>,
    /// How the body is cut into writes.
    pub split: Split,
    /// How the body is framed.
    pub framing: Framing,
    /// How the reply ends.
    pub ending: Ending,
    /// A pause before each write after the first (a slowly generating model).
    pub pace: Option<Duration>,
    /// Send the headers, then wait for this gate to open before the body
    /// (a model that thinks until the test says so).
    pub hold: Option<Gate>,
}

/// A latch a test opens: a reply held by it ([`Reply::hold`]) sends its
/// headers, then waits until [`Gate::open`] before its body, so a test can
/// act while the client waits for its first token with no clock involved.
/// Stopping the server lets a held reply go too.
#[derive(Debug, Clone, Default)]
pub struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Open the gate: held replies go on (for good).
    pub fn open(&self) {
        let (open, changed) = &*self.0;
        *open.lock().unwrap_or_else(PoisonError::into_inner) = true;
        changed.notify_all();
    }

    /// Wait until the gate is open or the server stops.
    fn wait(&self, stop: &AtomicBool) {
        let (open, changed) = &*self.0;
        let mut is_open = open.lock().unwrap_or_else(PoisonError::into_inner);
        while !*is_open && !stop.load(Ordering::SeqCst) {
            // Woken by `open`; the timeout only lets a stop be noticed.
            is_open =
                changed.wait_timeout(is_open, Duration::from_millis(50)).unwrap_or_else(PoisonError::into_inner).0;
        }
    }
}

impl Reply {
    /// A 200 `text/event-stream` reply with `body`, chunked per event.
    pub fn sse(body: impl Into<Vec<u8>>) -> Self {
        Self {
            status: 200,
            headers: vec![
                ("content-type".into(), "text/event-stream; charset=utf-8".into()),
                ("cache-control".into(), "no-cache".into()),
            ],
            body: body.into(),
            split: Split::PerEvent,
            framing: Framing::Chunked,
            ending: Ending::Complete,
            pace: None,
            hold: None,
        }
    }

    /// A reply with `status`, a content type and a body, sent whole.
    pub fn body(status: u16, content_type: &str, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status,
            headers: vec![("content-type".into(), content_type.into())],
            body: body.into(),
            split: Split::Whole,
            framing: Framing::Length,
            ending: Ending::Complete,
            pace: None,
            hold: None,
        }
    }

    /// A JSON reply (e.g. a provider's error object).
    pub fn json(status: u16, body: &Value) -> Self {
        Self::body(status, "application/json", body.to_string())
    }

    /// An HTML error page, as a proxy or load balancer sends.
    pub fn html(status: u16, page: &str) -> Self {
        Self::body(status, "text/html; charset=utf-8", page)
    }

    /// Add a header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Set how the body is split into writes.
    pub fn split(mut self, split: Split) -> Self {
        self.split = split;
        self
    }

    /// Set the framing.
    pub fn framing(mut self, framing: Framing) -> Self {
        self.framing = framing;
        self
    }

    /// Set how the reply ends.
    pub fn ending(mut self, ending: Ending) -> Self {
        self.ending = ending;
        self
    }

    /// Pause this long before each write after the first.
    pub fn pace(mut self, pause: Duration) -> Self {
        self.pace = Some(pause);
        self
    }

    /// Send the headers, then wait for `gate` to open before the body.
    pub fn hold(mut self, gate: Gate) -> Self {
        self.hold = Some(gate);
        self
    }
}

/// A request the server received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Method (`POST`).
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Headers in arrival order (names lower-cased).
    pub headers: Vec<(String, String)>,
    /// The body bytes.
    pub body: Vec<u8>,
}

impl Recorded {
    /// A header by (case-insensitive) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

#[derive(Debug, Default)]
struct State {
    replies: VecDeque<Reply>,
    requests: Vec<Recorded>,
    /// Replies whose writing failed because the client went away.
    aborted: usize,
    /// The context window requests are checked against, if any.
    context_limit: Option<u64>,
    /// The independent token count of each request body (checked ones).
    token_counts: Vec<u64>,
    /// Requests refused as longer than the window.
    over_limit: usize,
}

/// The running server. Dropping it stops accepting and ends stalls.
#[derive(Debug)]
pub struct TestServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Start on 127.0.0.1 (a free port) with replies served in order. A
    /// request beyond the script gets a 500 JSON error saying so.
    pub fn start(replies: Vec<Reply>) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State { replies: replies.into(), ..State::default() }));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        let accept = thread::Builder::new().name("test-server".into()).spawn(move || {
            for conn in listener.incoming() {
                if sp.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (st, sp) = (st.clone(), sp.clone());
                let _ = thread::Builder::new().name("test-conn".into()).spawn(move || serve(conn, &st, &sp));
            }
        })?;
        Ok(Self { addr, state, stop, accept: Some(accept) })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).requests.clone()
    }

    /// How many requests were received so far (no copy of them: for
    /// benchmarks that must not disturb what they time).
    pub fn request_count(&self) -> usize {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).requests.len()
    }

    /// The body sizes of the requests from the `from`th on, dropping the
    /// recorded requests (bodies and all) up to there.
    pub fn take_body_sizes(&self, from: usize) -> Vec<usize> {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let sizes = s.requests.iter().skip(from).map(|r| r.body.len()).collect();
        for r in &mut s.requests {
            r.body = Vec::new();
        }
        sizes
    }

    /// How many replies were cut short because the client closed the
    /// connection (a cancelled or abandoned request).
    pub fn client_aborts(&self) -> usize {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).aborted
    }

    /// Check every POST body against a context window of `window`
    /// tokens, counted by [`tokens::count_request`] (not cairn's code): a
    /// request over it is answered with OpenAI's real
    /// `context_length_exceeded` error instead of the next reply, and
    /// counted in [`TestServer::over_limit`]. In replies served after
    /// this, `__PROMPT_TOKENS__` is replaced by the request's count, so
    /// usage reports what this tokenizer counted.
    pub fn limit_context(&self, window: u64) {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).context_limit = Some(window);
    }

    /// The token count of every checked request, in order.
    pub fn token_counts(&self) -> Vec<u64> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).token_counts.clone()
    }

    /// Requests refused as longer than the window.
    pub fn over_limit(&self) -> usize {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).over_limit
    }

    /// Queue more replies.
    pub fn push(&self, reply: Reply) {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).replies.push_back(reply);
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect(self.addr);
        if let Some(handle) = self.accept.take() {
            let _ = handle.join();
        }
    }
}

fn read_request(conn: &TcpStream) -> std::io::Result<Recorded> {
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_owned();
    let path = parts.next().unwrap_or("").to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 {
            break;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    let len = headers.iter().find(|(k, _)| k == "content-length").and_then(|(_, v)| v.parse().ok()).unwrap_or(0usize);
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body)?;
    Ok(Recorded { method, path, headers, body })
}

fn serve(conn: TcpStream, state: &Mutex<State>, stop: &AtomicBool) {
    let Ok(request) = read_request(&conn) else { return };
    if stop.load(Ordering::SeqCst) {
        return;
    }
    let reply = {
        let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
        let checked = s.context_limit.filter(|_| request.method == "POST").map(|limit| {
            let count = tokens::count_request(&request.json());
            (limit, count)
        });
        s.requests.push(request);
        match checked {
            Some((limit, count)) => {
                s.token_counts.push(count);
                if count > limit {
                    s.over_limit += 1;
                    Some(context_length_exceeded(limit, count))
                } else {
                    s.replies.pop_front().map(|mut r| {
                        r.body = replace_bytes(&r.body, b"__PROMPT_TOKENS__", count.to_string().as_bytes());
                        r
                    })
                }
            }
            // Unchecked: no count, so usage says 0 (a client ignores it).
            None => s.replies.pop_front().map(|mut r| {
                r.body = replace_bytes(&r.body, b"__PROMPT_TOKENS__", b"0");
                r
            }),
        }
    };
    let reply = reply.unwrap_or_else(|| {
        Reply::json(
            500,
            &serde_json::json!({"error": {"message": "test server: no scripted reply left", "type": "test"}}),
        )
    });
    let _ = conn.set_nodelay(true);
    if write_reply(conn, &reply, stop).is_err() {
        state.lock().unwrap_or_else(PoisonError::into_inner).aborted += 1;
    }
}

/// OpenAI's answer to a request longer than the model's window (its real
/// body shape).
fn context_length_exceeded(limit: u64, count: u64) -> Reply {
    Reply::json(
        400,
        &serde_json::json!({"error": {
            "message": format!("This model's maximum context length is {limit} tokens. However, your messages resulted in {count} tokens. Please reduce the length of the messages."),
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded"
        }}),
    )
}

fn replace_bytes(body: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        if body[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(body[i]);
            i += 1;
        }
    }
    out
}

fn pieces(body: &[u8], split: Split) -> Vec<&[u8]> {
    match split {
        Split::Whole => vec![body],
        Split::EveryByte => body.chunks(1).collect(),
        Split::Every(n) => body.chunks(n.max(1)).collect(),
        Split::PerEvent => {
            let mut out = Vec::new();
            let mut start = 0;
            let mut i = 0;
            while i < body.len() {
                let rest = &body[i..];
                let sep = if rest.starts_with(b"\r\n\r\n") {
                    4
                } else if rest.starts_with(b"\n\n") {
                    2
                } else {
                    0
                };
                if sep > 0 {
                    out.push(&body[start..i + sep]);
                    i += sep;
                    start = i;
                } else {
                    i += 1;
                }
            }
            if start < body.len() {
                out.push(&body[start..]);
            }
            out
        }
    }
}

fn pause(total: Duration, stop: &AtomicBool) {
    let end = Instant::now() + total;
    while Instant::now() < end && !stop.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(10).min(end.saturating_duration_since(Instant::now())));
    }
}

fn write_reply(mut conn: TcpStream, reply: &Reply, stop: &AtomicBool) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {} {}\r\n", reply.status, reason(reply.status));
    for (k, v) in &reply.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    match reply.framing {
        Framing::Chunked => head.push_str("transfer-encoding: chunked\r\n"),
        Framing::Length => head.push_str(&format!("content-length: {}\r\n", reply.body.len())),
        Framing::CloseDelimited => {}
    }
    head.push_str("connection: close\r\n\r\n");
    conn.write_all(head.as_bytes())?;
    conn.flush()?;
    if let Some(gate) = &reply.hold {
        gate.wait(stop);
    }
    if let Ending::StallAfterHeaders(d) = reply.ending {
        pause(d, stop);
        let _ = conn.shutdown(Shutdown::Both);
        return Ok(());
    }
    let body = match reply.ending {
        Ending::CutAt(n) => &reply.body[..n.min(reply.body.len())],
        _ => &reply.body[..],
    };
    for (i, piece) in pieces(body, reply.split).into_iter().enumerate() {
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        if let (Some(d), true) = (reply.pace, i > 0) {
            pause(d, stop);
        }
        if piece.is_empty() {
            continue;
        }
        if reply.framing == Framing::Chunked {
            conn.write_all(format!("{:x}\r\n", piece.len()).as_bytes())?;
            conn.write_all(piece)?;
            conn.write_all(b"\r\n")?;
        } else {
            conn.write_all(piece)?;
        }
        conn.flush()?;
    }
    match reply.ending {
        Ending::CutAt(_) => {
            let _ = conn.shutdown(Shutdown::Both);
            return Ok(());
        }
        Ending::StallAtEnd(d) => pause(d, stop),
        _ => {}
    }
    if reply.framing == Framing::Chunked {
        conn.write_all(b"0\r\n\r\n")?;
    }
    conn.flush()?;
    let _ = conn.shutdown(Shutdown::Write);
    // Let the client read everything before the socket goes away.
    let mut sink = [0u8; 256];
    let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
    while matches!(conn.read(&mut sink), Ok(n) if n > 0) {}
    Ok(())
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        408 => "Request Timeout",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        529 => "Overloaded",
        _ => "Status",
    }
}

/// Recorded streams in each API's real wire format (written from the public
/// API references; the files live in `tests/data/`). Tests of any crate can
/// serve them with [`Reply::sse`].
pub mod fixtures {
    /// Chat Completions: text deltas, `finish_reason: stop`, the usage chunk
    /// (19 in, 10 out) and `[DONE]`. Text: "Hello! How can I help — café? ☕".
    pub const CHAT_TEXT: &str = include_str!("../tests/data/chat_text.sse");
    /// Chat Completions: "Let me look." then two parallel tool calls
    /// (`read_file {"path": "src/main.rs"}`, `shell {"argv": ["ls", "-la"]}`)
    /// with arguments split across chunks; 210 in (128 cached), 48 out.
    pub const CHAT_TOOL_CALLS: &str = include_str!("../tests/data/chat_tool_calls.sse");
    /// Responses: a reasoning item with `encrypted_content` and a summary,
    /// a message "Checking Paris now.", a `get_weather` function call;
    /// `response.completed` with 75 in, 140 out.
    pub const RESPONSES_REASONING_TOOL: &str = include_str!("../tests/data/responses_reasoning_tool.sse");
    /// Responses: one message "It is 18°C in Paris."; 310 in (256 cached), 12 out.
    pub const RESPONSES_TEXT: &str = include_str!("../tests/data/responses_text.sse");
    /// Anthropic Messages: a thinking block with its signature, text "I'll
    /// list the directory.", a `shell {"argv": ["ls"]}` tool_use, `ping`s;
    /// stop reason `tool_use`.
    pub const ANTHROPIC_THINKING_TOOL: &str = include_str!("../tests/data/anthropic_thinking_tool.sse");
    /// Anthropic Messages: text "The directory holds two files.", `end_turn`.
    pub const ANTHROPIC_TEXT: &str = include_str!("../tests/data/anthropic_text.sse");

    /// A fixture by its file name (`"chat_text.sse"`).
    pub fn by_name(name: &str) -> Option<&'static str> {
        Some(match name {
            "chat_text.sse" => CHAT_TEXT,
            "chat_tool_calls.sse" => CHAT_TOOL_CALLS,
            "responses_reasoning_tool.sse" => RESPONSES_REASONING_TOOL,
            "responses_text.sse" => RESPONSES_TEXT,
            "anthropic_thinking_tool.sse" => ANTHROPIC_THINKING_TOOL,
            "anthropic_text.sse" => ANTHROPIC_TEXT,
            _ => return None,
        })
    }
}

/// SSE body helpers for building hostile streams.
pub mod streams {
    /// One `data:` event (`event:` line too when `name` is not empty).
    pub fn event(name: &str, data: &str) -> String {
        if name.is_empty() { format!("data: {data}\n\n") } else { format!("event: {name}\ndata: {data}\n\n") }
    }

    /// `n` keepalive comments (`: keepalive`), each its own event-sized
    /// write under [`crate::Split::PerEvent`]: a server that keeps the
    /// connection alive and never answers.
    pub fn keepalives(n: usize) -> String {
        ": keepalive\n\n".repeat(n)
    }

    /// A Chat Completions stream of `n` chunks that carry no content (the
    /// role chunk, then empty deltas), never finishing.
    pub fn chat_empty_chunks(n: usize) -> String {
        let mut out = event("", r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#);
        for _ in 1..n {
            out.push_str(&event("", r#"{"choices":[{"index":0,"delta":{}}]}"#));
        }
        out
    }

    /// An Anthropic stream that starts a message and then only pings.
    pub fn anthropic_pings(n: usize) -> String {
        let mut out = event(
            "message_start",
            r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":3,"output_tokens":1}}}"#,
        );
        for _ in 0..n {
            out.push_str(&event("ping", r#"{"type":"ping"}"#));
        }
        out
    }

    /// A complete Chat Completions stream of `n` text deltas of `size` bytes
    /// each (`a`…), then `finish_reason: stop` and `[DONE]`.
    pub fn chat_text_deltas(n: usize, size: usize) -> String {
        let piece = "a".repeat(size);
        let mut out = String::with_capacity(n * (size + 64) + 128);
        for _ in 0..n {
            out.push_str(&event("", &format!(r#"{{"choices":[{{"index":0,"delta":{{"content":"{piece}"}}}}]}}"#)));
        }
        out.push_str(&event("", r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#));
        out.push_str(&event("", "[DONE]"));
        out
    }

    /// A complete Chat Completions stream answering `text` (JSON-escaped
    /// here), with a usage chunk whose `prompt_tokens` is the
    /// `__PROMPT_TOKENS__` placeholder ([`crate::TestServer::limit_context`]
    /// fills it in), then `[DONE]`.
    pub fn chat_text_with_usage(text: &str) -> String {
        let content = serde_json::to_string(text).unwrap_or_default();
        let mut out = String::new();
        out.push_str(&event(
            "",
            &format!(r#"{{"choices":[{{"index":0,"delta":{{"role":"assistant","content":{content}}}}}]}}"#),
        ));
        out.push_str(&event("", r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#));
        out.push_str(&event(
            "",
            r#"{"choices":[],"usage":{"prompt_tokens":__PROMPT_TOKENS__,"completion_tokens":20,"total_tokens":20}}"#,
        ));
        out.push_str(&event("", "[DONE]"));
        out
    }

    /// A complete Chat Completions stream asking for `n` tool calls of
    /// `tool` with `arguments` (JSON text), call k with id `id(k)`, each
    /// call whole in one chunk; `finish_reason: tool_calls` and `[DONE]`.
    pub fn chat_tool_calls(n: usize, tool: &str, arguments: &str, id: impl Fn(usize) -> String) -> String {
        let args = serde_json::Value::String(arguments.to_owned()).to_string();
        let mut out = String::new();
        for k in 0..n {
            out.push_str(&event(
                "",
                &format!(
                    r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":{k},"id":"{}","type":"function","function":{{"name":"{tool}","arguments":{args}}}}}]}}}}]}}"#,
                    id(k)
                ),
            ));
        }
        out.push_str(&event("", r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#));
        out.push_str(&event("", "[DONE]"));
        out
    }

    /// A Chat Completions stream whose single text delta is `bytes` long.
    pub fn huge_chat_delta(bytes: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(bytes + 512);
        out.extend_from_slice(b"data: {\"id\":\"chatcmpl-huge\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"");
        out.resize(out.len() + bytes, b'a');
        out.extend_from_slice(b"\"},\"finish_reason\":null}]}\n\n");
        out.extend_from_slice(event("", "{\"id\":\"chatcmpl-huge\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}").as_bytes());
        out.extend_from_slice(b"data: [DONE]\n\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw_get(url: &str) -> String {
        let addr = url.trim_start_matches("http://");
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"POST /x HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\nhi").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_in_order_and_records() {
        let server = TestServer::start(vec![
            Reply::sse("data: 1\n\ndata: 2\n\n"),
            Reply::body(429, "text/plain", "slow down").header("retry-after", "1"),
        ])
        .unwrap();
        let first = raw_get(&server.url());
        assert!(first.starts_with("HTTP/1.1 200 OK\r\n"), "{first}");
        assert!(first.contains("transfer-encoding: chunked"));
        assert!(first.ends_with("9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n"), "{first:?}");
        let second = raw_get(&server.url());
        assert!(second.starts_with("HTTP/1.1 429"));
        assert!(second.contains("retry-after: 1") && second.ends_with("slow down"));
        let third = raw_get(&server.url());
        assert!(third.contains("no scripted reply left"));
        let reqs = server.requests();
        assert_eq!(reqs.len(), 3);
        assert_eq!(reqs[0].path, "/x");
        assert_eq!(reqs[0].body, b"hi");
        assert_eq!(reqs[0].header("HOST"), Some("a"));
    }

    #[test]
    fn cut_sends_a_prefix_only() {
        let server =
            TestServer::start(vec![Reply::sse("data: 12345\n\n").split(Split::Whole).ending(Ending::CutAt(5))])
                .unwrap();
        let out = raw_get(&server.url());
        assert!(out.ends_with("5\r\ndata:\r\n"), "{out:?}");
    }

    #[test]
    fn per_event_split() {
        let body = b"data: a\n\ndata: b\r\n\r\ntail";
        let p = pieces(body, Split::PerEvent);
        assert_eq!(p, vec![&b"data: a\n\n"[..], &b"data: b\r\n\r\n"[..], &b"tail"[..]]);
        assert_eq!(pieces(b"abc", Split::EveryByte).len(), 3);
    }

    #[test]
    fn every_fixture_is_well_formed_sse_with_json_data() {
        for name in [
            "chat_text.sse",
            "chat_tool_calls.sse",
            "responses_reasoning_tool.sse",
            "responses_text.sse",
            "anthropic_thinking_tool.sse",
            "anthropic_text.sse",
        ] {
            let body = fixtures::by_name(name).unwrap();
            assert!(body.ends_with("\n\n"), "{name} must end with a blank line");
            let mut events = 0;
            for line in body.lines().filter(|l| l.starts_with("data:")) {
                let data = line["data:".len()..].trim();
                events += 1;
                if data != "[DONE]" {
                    let v: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{name}: {e}: {data}"));
                    assert!(v.is_object(), "{name}: {data}");
                }
            }
            assert!(events >= 5, "{name}");
            // Named events agree with the JSON type (Responses, Anthropic).
            let mut lines = body.lines().peekable();
            while let Some(line) = lines.next() {
                if let Some(name_field) = line.strip_prefix("event: ") {
                    let data = lines.next().unwrap().trim_start_matches("data: ");
                    let v: Value = serde_json::from_str(data).unwrap();
                    assert_eq!(v["type"], name_field, "{name}");
                }
            }
        }
    }

    #[test]
    fn hostile_stream_builders_are_well_formed() {
        let count = |body: &str| body.matches("\n\n").count();
        assert_eq!(count(&streams::keepalives(5)), 5);
        assert_eq!(count(&streams::chat_empty_chunks(4)), 4);
        assert_eq!(count(&streams::anthropic_pings(3)), 4);
        let text = streams::chat_text_deltas(3, 10);
        assert_eq!(text.matches(&"a".repeat(10)).count(), 3);
        assert!(text.ends_with("data: [DONE]\n\n"));
        let calls = streams::chat_tool_calls(3, "echo", r#"{"text":"x"}"#, |k| format!("c{k}"));
        for line in calls.lines().filter(|l| l.starts_with("data: {")) {
            let v: Value = serde_json::from_str(&line[6..]).unwrap();
            if let Some(call) = v["choices"][0]["delta"]["tool_calls"].get(0) {
                assert_eq!(call["function"]["arguments"], r#"{"text":"x"}"#);
            }
        }
        assert!(calls.contains(r#""id":"c2""#));
    }

    #[test]
    fn huge_delta_has_the_size_asked() {
        let body = streams::huge_chat_delta(1000);
        assert!(body.len() > 1000 && body.len() < 1400);
        assert!(body.ends_with(b"data: [DONE]\n\n"));
    }
}
