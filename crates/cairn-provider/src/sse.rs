//! Server-sent events framing (the WHATWG `text/event-stream` rules), fed
//! incrementally with byte chunks that may split anywhere.
//!
//! This module owns the wire framing only: lines ending in CRLF, LF or CR
//! (a CR at the end of one chunk and an LF at the start of the next are one
//! line end), `:` comments, `event:`/`data:`/`id:` fields, multi-line `data`
//! joined with `\n`, dispatch on a blank line, and a bound on the size of one
//! event (a line counts with the data of its event, whole or in pieces, so
//! how the stream is split never changes the outcome; `fuzz/` checks that). It must not interpret the data (JSON belongs to the API adapters)
//! and must not allocate per byte: whole lines inside a chunk are parsed in
//! place.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` name, empty when the server sent none (the spec's
    /// default type "message").
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// The last `id:` field of the event, if any.
    pub id: Option<String>,
}

/// Why the byte stream is not valid framing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SseError {
    /// One event grew past the configured bound.
    #[error(
        "a server-sent event grew past {limit} bytes; the server is misbehaving (raise `max_event_bytes` if this is expected)"
    )]
    EventTooLarge {
        /// The bound in bytes.
        limit: usize,
    },
    /// The stream ended in the middle of an event (no blank line after it).
    #[error("the stream ended in the middle of an event ({pending} bytes of it received)")]
    Truncated {
        /// How many bytes of the unfinished event had arrived.
        pending: usize,
    },
}

/// Incremental parser. Feed chunks with [`SseParser::feed`], then call
/// [`SseParser::finish`] at end of stream.
#[derive(Debug)]
pub struct SseParser {
    /// Bytes of a line not yet terminated.
    line: Vec<u8>,
    /// The previous chunk ended in CR: skip one LF at the start of the next.
    skip_lf: bool,
    event: String,
    /// Raw bytes of the data lines; validated as UTF-8 once, at dispatch.
    data: Vec<u8>,
    id: Option<String>,
    /// Whether any field line was seen for the current event.
    started: bool,
    max_event_bytes: usize,
}

impl SseParser {
    /// A parser that refuses events larger than `max_event_bytes`.
    pub fn new(max_event_bytes: usize) -> Self {
        Self {
            line: Vec::new(),
            skip_lf: false,
            event: String::new(),
            data: Vec::new(),
            id: None,
            started: false,
            max_event_bytes,
        }
    }

    /// Feed a chunk; complete events are pushed to `out` in order.
    pub fn feed(&mut self, mut chunk: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if self.skip_lf {
            self.skip_lf = false;
            if let Some(rest) = chunk.strip_prefix(b"\n") {
                chunk = rest;
            }
        }
        while !chunk.is_empty() {
            let Some(end) = memchr::memchr2(b'\n', b'\r', chunk) else {
                self.line.extend_from_slice(chunk);
                self.check_size()?;
                return Ok(());
            };
            let terminator = chunk[end];
            let mut next = end + 1;
            if terminator == b'\r' {
                match chunk.get(next) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    None => self.skip_lf = true,
                }
            }
            // The same bound as for a partial line (see `check_size`), so
            // where the chunks split never changes the outcome.
            if self.line.len() + end + self.data.len() > self.max_event_bytes {
                return Err(SseError::EventTooLarge { limit: self.max_event_bytes });
            }
            if self.line.is_empty() {
                self.process_line(&chunk[..end], out)?;
            } else {
                self.line.extend_from_slice(&chunk[..end]);
                let line = std::mem::take(&mut self.line);
                self.process_line(&line, out)?;
                // Keep the allocation for the next partial line.
                self.line = line;
                self.line.clear();
            }
            chunk = &chunk[next..];
        }
        Ok(())
    }

    /// End of stream: an event that was started but not dispatched is an
    /// error (the stream was cut mid-event).
    pub fn finish(&mut self) -> Result<(), SseError> {
        let pending = self.line.len() + self.data.len();
        if self.started || !self.line.is_empty() {
            // A final line that is only a comment is harmless.
            if !self.started && self.line.first() == Some(&b':') {
                self.line.clear();
                return Ok(());
            }
            return Err(SseError::Truncated { pending });
        }
        Ok(())
    }

    fn check_size(&self) -> Result<(), SseError> {
        if self.line.len() + self.data.len() > self.max_event_bytes {
            return Err(SseError::EventTooLarge { limit: self.max_event_bytes });
        }
        Ok(())
    }

    fn process_line(&mut self, line: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if line.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(());
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                self.started = true;
                self.data.extend_from_slice(value);
                self.data.push(b'\n');
                if self.data.len() > self.max_event_bytes {
                    return Err(SseError::EventTooLarge { limit: self.max_event_bytes });
                }
            }
            b"event" => {
                self.started = true;
                self.event = String::from_utf8_lossy(value).into_owned();
            }
            b"id" => {
                self.started = true;
                if !value.contains(&0) {
                    self.id = Some(String::from_utf8_lossy(value).into_owned());
                }
            }
            // `retry` and unknown fields are ignored, as the spec says.
            _ => {}
        }
        Ok(())
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let started = std::mem::replace(&mut self.started, false);
        let event = std::mem::take(&mut self.event);
        let id = self.id.take();
        if !started || self.data.is_empty() {
            // No data: the spec drops the event (an `event:` line alone).
            self.data.clear();
            return;
        }
        let mut data = std::mem::take(&mut self.data);
        data.pop(); // the trailing '\n' added after the last data line
        let data = match String::from_utf8(data) {
            Ok(text) => text,
            // The spec decodes with replacement characters.
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        };
        out.push(SseEvent { event, data, id });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(bytes: &[u8]) -> Vec<SseEvent> {
        let mut p = SseParser::new(1 << 20);
        let mut out = Vec::new();
        p.feed(bytes, &mut out).unwrap();
        p.finish().unwrap();
        out
    }

    fn ev(event: &str, data: &str) -> SseEvent {
        SseEvent { event: event.into(), data: data.into(), id: None }
    }

    #[test]
    fn simple_events_lf() {
        let out = parse_all(b"data: a\n\nevent: x\ndata: b\n\n");
        assert_eq!(out, vec![ev("", "a"), ev("x", "b")]);
    }

    #[test]
    fn multi_line_data_comments_and_crlf() {
        let out = parse_all(b": keep-alive\r\nevent: e\r\ndata: one\r\ndata:two\r\ndata:  three\r\n\r\n");
        assert_eq!(out, vec![ev("e", "one\ntwo\n three")]);
    }

    #[test]
    fn bare_cr_line_ends() {
        let out = parse_all(b"data: a\r\rdata: b\r\r");
        assert_eq!(out, vec![ev("", "a"), ev("", "b")]);
    }

    #[test]
    fn every_split_point_gives_the_same_events() {
        let input: &[u8] =
            b"event: a\r\ndata: {\"x\": \"\xc3\xa9\xe2\x82\xac\"}\r\n\r\n: c\n\ndata: 1\ndata: 2\rid: 7\r\n\r\n";
        let whole = parse_all(input);
        assert_eq!(whole.len(), 2);
        assert_eq!(whole[0].data, "{\"x\": \"é€\"}");
        assert_eq!(whole[1].id.as_deref(), Some("7"));
        for split in 0..=input.len() {
            let mut p = SseParser::new(1 << 20);
            let mut out = Vec::new();
            p.feed(&input[..split], &mut out).unwrap();
            p.feed(&input[split..], &mut out).unwrap();
            p.finish().unwrap();
            assert_eq!(out, whole, "split at {split}");
        }
        // And one byte at a time.
        let mut p = SseParser::new(1 << 20);
        let mut out = Vec::new();
        for b in input {
            p.feed(std::slice::from_ref(b), &mut out).unwrap();
        }
        p.finish().unwrap();
        assert_eq!(out, whole);
    }

    #[test]
    fn event_without_data_is_dropped() {
        assert_eq!(parse_all(b"event: ping\n\ndata: x\n\n"), vec![ev("", "x")]);
    }

    #[test]
    fn cut_mid_event_is_an_error() {
        let mut p = SseParser::new(1 << 20);
        let mut out = Vec::new();
        p.feed(b"data: {\"a\":1}\n\ndata: {\"b\"", &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert!(matches!(p.finish(), Err(SseError::Truncated { .. })));
        // A complete data line without its blank line is also cut.
        let mut p = SseParser::new(1 << 20);
        p.feed(b"data: x\n", &mut out).unwrap();
        assert!(matches!(p.finish(), Err(SseError::Truncated { .. })));
    }

    #[test]
    fn oversized_event_is_refused_without_buffering_it_all() {
        let mut p = SseParser::new(1000);
        let mut out = Vec::new();
        p.feed(b"data: ", &mut out).unwrap();
        let chunk = vec![b'a'; 600];
        p.feed(&chunk, &mut out).unwrap();
        assert_eq!(p.feed(&chunk, &mut out), Err(SseError::EventTooLarge { limit: 1000 }));
        // Many small data lines also count.
        let mut p = SseParser::new(1000);
        let line = format!("data: {}\n", "b".repeat(100));
        let mut res = Ok(());
        for _ in 0..20 {
            res = p.feed(line.as_bytes(), &mut out);
            if res.is_err() {
                break;
            }
        }
        assert!(matches!(res, Err(SseError::EventTooLarge { .. })));
    }

    #[test]
    fn a_long_complete_line_is_refused_like_a_long_partial_one() {
        let line = format!("event: {}\n\n", "e".repeat(100));
        let mut whole = SseParser::new(64);
        assert_eq!(whole.feed(line.as_bytes(), &mut Vec::new()), Err(SseError::EventTooLarge { limit: 64 }));
        let mut split = SseParser::new(64);
        let res = split.feed(&line.as_bytes()[..80], &mut Vec::new());
        assert_eq!(res, Err(SseError::EventTooLarge { limit: 64 }));
        let comment = format!(": {}\n", "k".repeat(100));
        assert!(SseParser::new(64).feed(comment.as_bytes(), &mut Vec::new()).is_err());
    }

    /// Random streams (field order, line ends, comments, multi-line data,
    /// unicode) cut at random points parse to the events they were built from.
    #[test]
    fn random_streams_and_random_splits_match_the_model() {
        let mut rng = fastrand::Rng::with_seed(0x5eed);
        let pieces = ["a", "{\"k\": 1}", "é€😀", " lead", "x:y", "", "[DONE]"];
        for _ in 0..300 {
            let mut bytes = Vec::new();
            let mut expected = Vec::new();
            for _ in 0..rng.usize(1..6) {
                let eol: &[u8] = [&b"\n"[..], b"\r\n", b"\r"][rng.usize(..3)];
                if rng.bool() {
                    bytes.extend_from_slice(b": comment");
                    bytes.extend_from_slice(eol);
                }
                let name = if rng.bool() { "delta" } else { "" };
                if !name.is_empty() {
                    bytes.extend_from_slice(format!("event: {name}").as_bytes());
                    bytes.extend_from_slice(eol);
                }
                let lines: Vec<&str> = (0..rng.usize(1..4)).map(|_| pieces[rng.usize(..pieces.len())]).collect();
                for line in &lines {
                    // "data:" with or without the optional space.
                    let sep = if line.starts_with(' ') || rng.bool() { "data: " } else { "data:" };
                    bytes.extend_from_slice(format!("{sep}{line}").as_bytes());
                    bytes.extend_from_slice(eol);
                }
                bytes.extend_from_slice(eol);
                expected.push(SseEvent { event: name.into(), data: lines.join("\n"), id: None });
            }
            let mut p = SseParser::new(1 << 20);
            let mut out = Vec::new();
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let n = rng.usize(1..=rest.len().min(9));
                p.feed(&rest[..n], &mut out).unwrap();
                rest = &rest[n..];
            }
            p.finish().unwrap();
            assert_eq!(out, expected, "stream {:?}", String::from_utf8_lossy(&bytes));
        }
    }
}
