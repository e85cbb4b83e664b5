//! JSON-RPC 2.0 over stdio, one message per line, as both faces speak it:
//! a line reader with a size bound ([`LineReader`]), the classification of
//! a line into a request, notification or response ([`Incoming::parse`]),
//! request ids kept as written ([`Id`]: a number beyond 2^53 is echoed
//! digit for digit, never through a float), error objects with the
//! standard codes ([`RpcError`]), and the shared, line-atomic writer
//! ([`Out`]).
//!
//! Bad input is answered, never fatal: a line that is not JSON gets a
//! parse error (-32700, id null), a line over [`MAX_MESSAGE_BYTES`] is
//! skipped to its end and answered with -32600, a batch (JSON array) is
//! refused. This module knows nothing of MCP or ACP methods.

use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

/// A request's id exactly as the client wrote it: a string, a number (kept
/// as its text, so an id beyond 2^53 is echoed digit for digit, never
/// through a float) or null.
#[derive(Debug, Clone)]
pub struct Id(Box<RawValue>);

impl Id {
    /// The null id (answers to what could not be read).
    pub fn null() -> Self {
        Self(RawValue::from_string("null".to_owned()).unwrap_or_else(|_| unreachable!("null is JSON")))
    }

    /// Its JSON text (a key for maps of requests).
    pub fn text(&self) -> &str {
        self.0.get()
    }

    /// Whether `value` (a request id named in a message, e.g. a cancel's)
    /// is this id.
    pub fn is(&self, value: &Value) -> bool {
        serde_json::from_str::<Value>(self.text()).is_ok_and(|v| &v == value)
    }
}

impl PartialEq for Id {
    fn eq(&self, other: &Self) -> bool {
        self.text() == other.text()
    }
}

impl Serialize for Id {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

/// An answer to a request: serialized with the id verbatim.
#[derive(Debug, Clone, Serialize)]
pub struct Answer {
    jsonrpc: &'static str,
    id: Id,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<Value>,
}

/// The raw id of a message, read beside its parsed form.
#[derive(serde::Deserialize)]
struct RawId<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
}

/// The largest message accepted (one line); longer lines are discarded to
/// their newline and answered with an error. 16 MiB holds any prompt with
/// pasted files an editor sends; more is a broken or hostile client.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Standard JSON-RPC error codes.
pub mod code {
    /// The line is not JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// JSON, but not a JSON-RPC 2.0 request (or too large).
    pub const INVALID_REQUEST: i64 = -32600;
    /// No such method.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// The params are wrong.
    pub const INVALID_PARAMS: i64 = -32602;
    /// cairn failed while handling the request.
    pub const INTERNAL_ERROR: i64 = -32603;
}

/// One line read from the input.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A complete line (without its newline).
    Message(Vec<u8>),
    /// A line longer than the limit; its bytes were discarded.
    TooLong(usize),
    /// The input is closed.
    Eof,
}

/// Reads lines of at most `max` bytes, discarding longer ones whole so the
/// next line is read correctly.
#[derive(Debug)]
pub struct LineReader<R> {
    inner: R,
    max: usize,
}

impl<R: BufRead> LineReader<R> {
    /// Lines from `inner`, at most `max` bytes each.
    pub fn new(inner: R, max: usize) -> Self {
        Self { inner, max }
    }

    /// The next line. A last line without a newline still counts.
    pub fn next_line(&mut self) -> std::io::Result<Line> {
        let mut line = Vec::new();
        let mut seen = 0usize;
        let mut too_long = false;
        loop {
            let buf = match self.inner.fill_buf() {
                Ok(buf) => buf,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if buf.is_empty() {
                return Ok(match (seen, too_long) {
                    (0, _) => Line::Eof,
                    (n, true) => Line::TooLong(n),
                    _ => Line::Message(line),
                });
            }
            let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..i], Some(i + 1)),
                None => (buf, None),
            };
            seen = seen.saturating_add(chunk.len());
            if !too_long && seen > self.max {
                too_long = true;
                line = Vec::new();
            }
            if !too_long {
                line.extend_from_slice(chunk);
            }
            let used = done.unwrap_or(buf.len());
            self.inner.consume(used);
            if done.is_some() {
                if too_long {
                    return Ok(Line::TooLong(seen));
                }
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(Line::Message(line));
            }
        }
    }
}

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    /// The code ([`code`]).
    pub code: i64,
    /// What was wrong and what to do.
    pub message: String,
}

impl RpcError {
    /// An error with `code` and `message`.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }

    /// -32602 with `message`.
    pub fn params(message: impl Into<String>) -> Self {
        Self::new(code::INVALID_PARAMS, message)
    }

    /// -32603 with `message`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(code::INTERNAL_ERROR, message)
    }

    /// -32601 for `method`.
    pub fn no_method(method: &str, face: &str) -> Self {
        Self::new(code::METHOD_NOT_FOUND, format!("method {method:?} is not supported by cairn's {face} face"))
    }

    /// The JSON object.
    pub fn to_value(&self) -> Value {
        json!({"code": self.code, "message": self.message})
    }
}

/// A classified message.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// A call expecting an answer.
    Request {
        /// Its id (a string or a number), echoed in the answer exactly.
        id: Id,
        /// The method.
        method: String,
        /// The params (`null` when absent).
        params: Value,
    },
    /// A call without an answer.
    Notification {
        /// The method.
        method: String,
        /// The params (`null` when absent).
        params: Value,
    },
    /// An answer to a request this side sent.
    Response {
        /// The id of our request.
        id: Value,
        /// The result, or the error object.
        result: Result<Value, Value>,
    },
}

impl Incoming {
    /// Classify one line. `Err` holds the answer to send back (with the
    /// id when one could be read, else null).
    pub fn parse(line: &[u8]) -> Result<Incoming, (Id, RpcError)> {
        let value: Value = serde_json::from_slice(line).map_err(|e| {
            (
                Id::null(),
                RpcError::new(
                    code::PARSE_ERROR,
                    format!("the line is not valid JSON ({e}); send one JSON-RPC 2.0 object per line"),
                ),
            )
        })?;
        let Value::Object(mut object) = value else {
            let what = if value.is_array() {
                "a batch (JSON array); batches are not supported, send one object per line"
            } else {
                "not a JSON object"
            };
            return Err((Id::null(), RpcError::new(code::INVALID_REQUEST, format!("the message is {what}"))));
        };
        let id = object.remove("id");
        // The id's own text: a number is echoed as written.
        let raw = serde_json::from_slice::<RawId<'_>>(line)
            .ok()
            .and_then(|r| r.id)
            .map(|r| Id(r.to_owned()))
            .filter(|_| id.as_ref().is_some_and(|v| v.is_string() || v.is_number() || v.is_null()));
        let invalid = |with_id: bool, why: &str| {
            let id = if with_id { raw.clone().unwrap_or_else(Id::null) } else { Id::null() };
            Err((id, RpcError::new(code::INVALID_REQUEST, why.to_owned())))
        };
        if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return invalid(true, "the message lacks \"jsonrpc\": \"2.0\"");
        }
        if let Some(id) = &id
            && !(id.is_string() || id.is_number() || id.is_null())
        {
            return invalid(false, "the id must be a string or a number");
        }
        match object.remove("method") {
            Some(Value::String(method)) => {
                let params = object.remove("params").unwrap_or(Value::Null);
                if !(params.is_object() || params.is_array() || params.is_null()) {
                    return invalid(true, "params must be an object or an array");
                }
                Ok(match (id, raw) {
                    (Some(_), Some(raw)) => Incoming::Request { id: raw, method, params },
                    (Some(_), None) => Incoming::Request { id: Id::null(), method, params },
                    (None, _) => Incoming::Notification { method, params },
                })
            }
            Some(_) => invalid(true, "the method must be a string"),
            None => {
                let Some(id) = id else { return invalid(false, "a message needs a method (or an id and a result)") };
                match (object.remove("result"), object.remove("error")) {
                    (Some(result), None) => Ok(Incoming::Response { id, result: Ok(result) }),
                    (None, Some(error)) => Ok(Incoming::Response { id, result: Err(error) }),
                    _ => invalid(true, "a response needs exactly one of result and error"),
                }
            }
        }
    }
}

/// The answer to a line that could not be read as a message.
pub fn refusal(line: &Line) -> Option<Answer> {
    match line {
        Line::TooLong(n) => Some(error_response(
            &Id::null(),
            &RpcError::new(
                code::INVALID_REQUEST,
                format!("the message is {n} bytes, over the limit of {MAX_MESSAGE_BYTES}; it was skipped"),
            ),
        )),
        Line::Message(_) | Line::Eof => None,
    }
}

/// A success response.
pub fn response(id: &Id, result: Value) -> Answer {
    Answer { jsonrpc: "2.0", id: id.clone(), result: Some(result), error: None }
}

/// An error response.
pub fn error_response(id: &Id, error: &RpcError) -> Answer {
    Answer { jsonrpc: "2.0", id: id.clone(), result: None, error: Some(error.to_value()) }
}

/// A notification.
pub fn notification(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params})
}

/// A request this side sends.
pub fn request(id: u64, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// The output: whole lines, one writer at a time, flushed after each.
#[derive(Clone)]
pub struct Out {
    inner: Arc<Mutex<Box<dyn Write + Send>>>,
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Out").finish_non_exhaustive()
    }
}

impl Out {
    /// Lines to `writer`.
    pub fn new(writer: Box<dyn Write + Send>) -> Self {
        Self { inner: Arc::new(Mutex::new(writer)) }
    }

    /// Write `message` as one line. An error means the peer is gone.
    pub fn send<T: Serialize + ?Sized>(&self, message: &T) -> std::io::Result<()> {
        let mut text = serde_json::to_vec(message).map_err(std::io::Error::other)?;
        text.push(b'\n');
        let mut out = self.inner.lock().map_err(|_| std::io::Error::other("output lock poisoned"))?;
        out.write_all(&text)?;
        out.flush()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn lines(input: &[u8], max: usize) -> Vec<Line> {
        let mut reader = LineReader::new(std::io::BufReader::with_capacity(3, input), max);
        let mut out = Vec::new();
        loop {
            let line = reader.next_line().unwrap();
            if line == Line::Eof {
                return out;
            }
            out.push(line);
        }
    }

    #[test]
    fn long_lines_are_skipped_whole_and_the_next_line_is_intact() {
        let got = lines(b"ab\nabcdefgh\ncd\r\nxyzxyzxyz", 4);
        assert_eq!(
            got,
            vec![Line::Message(b"ab".to_vec()), Line::TooLong(8), Line::Message(b"cd".to_vec()), Line::TooLong(9)]
        );
        assert_eq!(
            lines(b"\n\nok", 4),
            vec![Line::Message(vec![]), Line::Message(vec![]), Line::Message(b"ok".to_vec())]
        );
    }

    #[test]
    fn classification_of_hostile_messages() {
        let bad = |s: &str| Incoming::parse(s.as_bytes()).unwrap_err().1.code;
        assert_eq!(bad("{"), code::PARSE_ERROR);
        assert_eq!(bad("\u{0}"), code::PARSE_ERROR);
        assert_eq!(bad("[]"), code::INVALID_REQUEST);
        assert_eq!(bad("3"), code::INVALID_REQUEST);
        assert_eq!(bad(r#"{"id":1,"method":"x"}"#), code::INVALID_REQUEST);
        assert_eq!(bad(r#"{"jsonrpc":"2.0","id":{},"method":"x"}"#), code::INVALID_REQUEST);
        assert_eq!(bad(r#"{"jsonrpc":"2.0","id":1,"method":7}"#), code::INVALID_REQUEST);
        assert_eq!(bad(r#"{"jsonrpc":"2.0","id":1,"method":"x","params":"s"}"#), code::INVALID_REQUEST);
        assert_eq!(bad(r#"{"jsonrpc":"2.0","id":1}"#), code::INVALID_REQUEST);
        let ok = Incoming::parse(br#"{"jsonrpc":"2.0","id":"a","method":"m"}"#).unwrap();
        assert!(matches!(ok, Incoming::Request { ref id, .. } if id.text() == r#""a""#), "{ok:?}");
        // An id beyond 2^53 is kept as written.
        let big = Incoming::parse(br#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"m"}"#).unwrap();
        let Incoming::Request { id, .. } = big else { panic!("{big:?}") };
        assert_eq!(id.text(), "123456789012345678901234567890");
        let answer = serde_json::to_string(&response(&id, json!({}))).unwrap();
        assert!(answer.contains(r#""id":123456789012345678901234567890"#), "{answer}");
        let ok = Incoming::parse(br#"{"jsonrpc":"2.0","id":2,"error":{"code":1}}"#).unwrap();
        assert!(matches!(ok, Incoming::Response { result: Err(_), .. }));
    }
}
