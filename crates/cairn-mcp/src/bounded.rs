//! The bound on one message from a stdio server: a line (one JSON-RPC
//! message) longer than the server's `max_answer_bytes` is cut off before
//! the SDK buffers it, and when it was an answer to a request, that request
//! gets an error saying the size at once, instead of never being answered.
//!
//! The SDK (`rmcp`) drops an oversized line silently and the request it
//! answered waits for the tool timeout; this reader sits between the
//! server's stdout and the SDK, so cairn decides what happens. The id of
//! the answer is read as the line streams past (a small JSON scanner for the
//! top-level `"id"` member, wherever it is in the object), never by
//! buffering the line.
//!
//! It must not change a line within the limit, or decide what the model
//! sees of an answer (`tool.rs` caps that).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

/// The JSON-RPC error code of the answer put in place of an oversized one
/// (in the implementation-defined server-error range).
pub(crate) const OVERSIZED_CODE: i32 = -32_099;

/// How many oversized lines a connection saw whose id could not be read
/// (calls in flight then fail, since one of them may have been answered).
pub(crate) type Unattributed = Arc<AtomicU64>;

/// A reader that cuts lines longer than `limit` bytes.
pub(crate) struct Bounded<R> {
    inner: R,
    limit: usize,
    /// Bytes of the current line so far (without its newline).
    line: usize,
    /// The current line is over the limit: its rest is dropped.
    discarding: bool,
    scan: IdScan,
    /// Bytes ready for the SDK.
    out: Vec<u8>,
    out_at: usize,
    scratch: Vec<u8>,
    unattributed: Unattributed,
}

impl<R> Bounded<R> {
    pub(crate) fn new(inner: R, limit: usize, unattributed: Unattributed) -> Self {
        Self {
            inner,
            limit,
            line: 0,
            discarding: false,
            scan: IdScan::default(),
            out: Vec::new(),
            out_at: 0,
            scratch: vec![0; 64 * 1024],
            unattributed,
        }
    }

    /// Pass `bytes` through, cutting what is over the limit.
    fn feed(&mut self, bytes: &[u8]) {
        let mut rest = bytes;
        while !rest.is_empty() {
            let newline = rest.iter().position(|b| *b == b'\n');
            let end = newline.map_or(rest.len(), |i| i + 1);
            let body = &rest[..newline.unwrap_or(rest.len())];
            self.scan.feed(body);
            if !self.discarding {
                let room = self.limit.saturating_sub(self.line);
                if body.len() <= room {
                    self.out.extend_from_slice(&rest[..end]);
                } else {
                    // What the SDK got of this line ends here: a cut JSON
                    // text, which it ignores as unparsable.
                    self.out.extend_from_slice(&body[..room]);
                    self.out.push(b'\n');
                    self.discarding = true;
                }
            }
            self.line = self.line.saturating_add(body.len());
            if newline.is_some() {
                if self.discarding {
                    self.answer_oversized();
                }
                self.line = 0;
                self.discarding = false;
                self.scan = IdScan::default();
            }
            rest = &rest[end..];
        }
    }

    /// The line just ended was over the limit: answer its request with an
    /// error carrying the size, or count it when its id is unknown.
    fn answer_oversized(&mut self) {
        let id = self.scan.id();
        let Some(id) = id else {
            self.unattributed.fetch_add(1, Ordering::SeqCst);
            return;
        };
        let error = serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {
                "code": OVERSIZED_CODE,
                "message": oversized_message(self.line as u64, self.limit as u64),
                "data": {"cairn": "oversized", "bytes": self.line, "limit": self.limit},
            },
        });
        self.out.extend_from_slice(error.to_string().as_bytes());
        self.out.push(b'\n');
    }
}

/// What a call answered too large is told.
pub(crate) fn oversized_message(bytes: u64, limit: u64) -> String {
    format!(
        "its answer was {bytes} bytes, over the limit of {limit} bytes for one message (raise max_answer_bytes for \
         this server, or ask for less); the tool ran but its answer was not read"
    )
}

impl<R: AsyncRead + Unpin> AsyncRead for Bounded<R> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.out_at < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.out_at);
                buf.put_slice(&this.out[this.out_at..this.out_at + n]);
                this.out_at += n;
                if this.out_at == this.out.len() {
                    this.out.clear();
                    this.out_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut scratch = std::mem::take(&mut this.scratch);
            let mut raw = ReadBuf::new(&mut scratch);
            let polled = Pin::new(&mut this.inner).poll_read(cx, &mut raw);
            let got = raw.filled().len();
            let result = match polled {
                Poll::Ready(r) => r,
                Poll::Pending => {
                    this.scratch = scratch;
                    return Poll::Pending;
                }
            };
            if let Err(e) = result {
                this.scratch = scratch;
                return Poll::Ready(Err(e));
            }
            if got == 0 {
                this.scratch = scratch;
                return Poll::Ready(Ok(()));
            }
            this.feed(&scratch[..got]);
            this.scratch = scratch;
            // When all of it was dropped, read on.
        }
    }
}

/// Finds the value of the top-level `"id"` member of a JSON object read in
/// pieces (keys and strings may be split anywhere).
#[derive(Debug, Default)]
struct IdScan {
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// At depth 1, the next string is a key.
    expect_key: bool,
    /// Reading a key at depth 1 (its bytes, up to a few).
    key: Option<Vec<u8>>,
    /// The last key read at depth 1.
    last_key_is_id: bool,
    /// Reading the id's value (its raw bytes).
    value: Option<Vec<u8>>,
    found: Option<Vec<u8>>,
}

const MAX_ID: usize = 256;

impl IdScan {
    fn feed(&mut self, bytes: &[u8]) {
        if self.found.is_some() {
            return;
        }
        for &b in bytes {
            if let Some(value) = &mut self.value {
                // The value ends at a `,` or `}` of depth 1 outside a string.
                let ends = !self.in_string && self.depth == 1 && (b == b',' || b == b'}');
                if ends {
                    self.found = self.value.take();
                    return;
                }
                if value.len() < MAX_ID {
                    value.push(b);
                }
            }
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                    if let Some(key) = self.key.take() {
                        self.last_key_is_id = key == b"id";
                    }
                } else if let Some(key) = &mut self.key
                    && key.len() < 8
                {
                    key.push(b);
                }
                continue;
            }
            match b {
                b'"' => {
                    self.in_string = true;
                    if self.depth == 1 && self.expect_key {
                        self.key = Some(Vec::new());
                        self.expect_key = false;
                    }
                }
                b'{' | b'[' => {
                    self.depth += 1;
                    if self.depth == 1 {
                        self.expect_key = true;
                    }
                }
                b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                b',' if self.depth == 1 => self.expect_key = true,
                b':' if self.depth == 1 && self.last_key_is_id => {
                    self.last_key_is_id = false;
                    self.value = Some(Vec::new());
                }
                b':' if self.depth == 1 => self.last_key_is_id = false,
                _ => {}
            }
        }
    }

    /// The id, when one was read (a number or a string).
    fn id(&self) -> Option<serde_json::Value> {
        let raw = self.found.as_ref()?;
        match serde_json::from_slice::<serde_json::Value>(raw) {
            Ok(v @ (serde_json::Value::Number(_) | serde_json::Value::String(_))) => Some(v),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(pieces: &[&str]) -> Option<serde_json::Value> {
        let mut s = IdScan::default();
        for p in pieces {
            s.feed(p.as_bytes());
        }
        s.id()
    }

    #[test]
    fn the_top_level_id_is_found_wherever_it_is_and_however_it_is_split() {
        assert_eq!(scan(&[r#"{"jsonrpc":"2.0","id":7,"result":{"id":99}}"#]), Some(serde_json::json!(7)));
        assert_eq!(
            scan(&[r#"{"result":{"id":99,"x":"\"id\":5"},"i"#, r#"d" : "a,}b" }"#]),
            Some(serde_json::json!("a,}b"))
        );
        assert_eq!(scan(&[r#"{"result":[{"id":1}],"jsonrpc":"2.0"}"#]), None);
    }

    #[test]
    fn a_line_over_the_limit_is_cut_and_its_request_answered_with_the_size() {
        let mut b = Bounded::new(tokio::io::empty(), 16, Arc::default());
        b.feed(br#"{"id":3,"ok":1}"#);
        b.feed(b"\n");
        b.feed(br#"{"jsonrpc":"2.0","id":4,"result":"xxxxxxxxxxxxxxxxxxxxxxxxxxx"}"#);
        b.feed(b"\n{\"id\":5}\n");
        let text = String::from_utf8(b.out.clone()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], r#"{"id":3,"ok":1}"#);
        assert_eq!(lines[1].len(), 16, "the cut line is at most the limit: {text}");
        let answer: serde_json::Value = serde_json::from_str(lines[2]).unwrap_or_default();
        assert_eq!(answer["id"], 4);
        assert_eq!(answer["error"]["data"]["bytes"], 63, "{answer}");
        assert_eq!(lines[3], r#"{"id":5}"#);
    }
}
