//! The line codec of the JSONL session file: one physical line in, the
//! records it holds out, and records back to one line.
//!
//! It owns the byte-level format of a line (a single record object or an
//! array of records, see `docs/storage-format.md`) and nothing else: it does
//! no I/O and does not check invariants between records (seq order, parents,
//! duplicates) — that is [`SessionIndex::apply`](super::SessionIndex::apply).
//!
//! `Record`'s derived `Serialize` is an internally tagged enum, and
//! `Box<RawValue>` cannot be deserialized through serde's buffered content,
//! so decoding goes through [`FlatRecord`]: one flat struct with every field
//! optional, payloads kept as raw JSON text (borrowed from the line) without
//! being re-parsed. Replay takes an entry borrowed ([`EntryRef`]: no
//! allocation for its strings and payload); everyone else gets owned
//! [`Record`]s.

use std::borrow::Cow;

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::record::{Entry, EntryView, Header, RawJson, Record, RegisterOp, RegisterRecord, State, UsageRow};

/// Why a line is not a valid record line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LineError {
    /// The bytes are not one JSON value (a torn write, garbage, non-UTF-8).
    #[error("not valid JSON: {0}")]
    Syntax(String),
    /// Valid JSON, but not a record or an array of records.
    #[error("{0}")]
    Shape(String),
}

impl LineError {
    /// Whether the line is not JSON at all (as opposed to JSON of the wrong
    /// shape). Only such a final line counts as torn.
    pub fn is_syntax(&self) -> bool {
        matches!(self, LineError::Syntax(_))
    }
}

/// Every field any record kind may carry, all optional. Unknown fields are
/// ignored (forward compatibility within a storage version).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FlatRecord<'a> {
    #[serde(borrow)]
    kind: Cow<'a, str>,
    seq: Option<u64>,
    timestamp: Option<i64>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    parent_id: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "type")]
    entry_type: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "present")]
    payload: Option<&'a RawValue>,
    op: Option<RegisterOp>,
    #[serde(borrow, default)]
    namespace: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    key: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "present")]
    value: Option<&'a RawValue>,
    #[serde(borrow, default)]
    entry_id: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "present")]
    usage: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    pc: Option<&'a RawValue>,
}

/// A raw field that is present (even as `null`) becomes `Some`.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(d).map(Some)
}

fn owned(raw: &RawValue) -> RawJson {
    RawJson(raw.to_owned())
}

/// An entry record as replay reads it: borrowed from the line.
#[derive(Debug)]
pub(crate) struct EntryRef<'a> {
    pub(crate) seq: u64,
    pub(crate) timestamp: i64,
    pub(crate) id: Cow<'a, str>,
    pub(crate) parent_id: Option<Cow<'a, str>>,
    pub(crate) entry_type: Cow<'a, str>,
    pub(crate) payload: &'a RawValue,
}

impl EntryRef<'_> {
    /// This entry lent as an [`EntryView`].
    pub(crate) fn view(&self) -> EntryView<'_> {
        EntryView {
            seq: self.seq,
            timestamp: self.timestamp,
            id: &self.id,
            parent_id: self.parent_id.as_deref(),
            entry_type: &self.entry_type,
            payload: self.payload.get(),
        }
    }

    /// The owned entry.
    pub(crate) fn into_owned(self) -> Entry {
        Entry {
            id: self.id.into_owned(),
            parent_id: self.parent_id.map(Cow::into_owned),
            seq: self.seq,
            timestamp: self.timestamp,
            entry_type: self.entry_type.into_owned(),
            payload: owned(self.payload),
        }
    }
}

/// A record of a line as replay reads it: an entry borrowed, any other
/// record owned (they are few and small).
#[derive(Debug)]
pub(crate) enum LineRecord<'a> {
    /// An entry, borrowed from the line.
    Entry(EntryRef<'a>),
    /// Any other record.
    Other(Record),
}

impl LineRecord<'_> {
    /// The owned record.
    pub(crate) fn into_owned(self) -> Record {
        match self {
            LineRecord::Entry(entry) => Record::Entry(entry.into_owned()),
            LineRecord::Other(record) => record,
        }
    }
}

fn need<T>(value: Option<T>, kind: &str, field: &str) -> Result<T, LineError> {
    value.ok_or_else(|| LineError::Shape(format!("{kind} record lacks `{field}`")))
}

impl<'a> FlatRecord<'a> {
    fn into_line_record(self) -> Result<LineRecord<'a>, LineError> {
        let kind = self.kind.as_ref();
        let seq = need(self.seq, kind, "seq")?;
        match kind {
            "entry" => Ok(LineRecord::Entry(EntryRef {
                id: need(self.id, kind, "id")?,
                parent_id: self.parent_id,
                seq,
                timestamp: need(self.timestamp, kind, "timestamp")?,
                entry_type: need(self.entry_type, kind, "type")?,
                payload: need(self.payload, kind, "payload")?,
            })),
            "register" => {
                let op = need(self.op, kind, "op")?;
                let value = match op {
                    RegisterOp::Set => Some(owned(need(self.value, kind, "value")?)),
                    RegisterOp::Delete => None,
                };
                Ok(LineRecord::Other(Record::Register(RegisterRecord {
                    op,
                    seq,
                    namespace: need(self.namespace, kind, "namespace")?.into_owned(),
                    key: need(self.key, kind, "key")?.into_owned(),
                    value,
                })))
            }
            "usage" => Ok(LineRecord::Other(Record::Usage(UsageRow {
                seq,
                id: need(self.id, kind, "id")?.into_owned(),
                entry_id: self.entry_id.map(Cow::into_owned),
                usage: owned(need(self.usage, kind, "usage")?),
            }))),
            "state" => Ok(LineRecord::Other(Record::State(State { seq, pc: owned(need(self.pc, kind, "pc")?) }))),
            "header" => Err(LineError::Shape("a header line may only be the first line".to_owned())),
            other => Err(LineError::Shape(format!("unknown record kind {other:?}"))),
        }
    }
}

fn syntax_or_shape(e: serde_json::Error) -> LineError {
    use serde_json::error::Category;
    match e.classify() {
        Category::Syntax | Category::Eof | Category::Io => LineError::Syntax(e.to_string()),
        Category::Data => LineError::Shape(e.to_string()),
    }
}

/// Decode one line (without its trailing newline) into its records.
///
/// A line is either one record object or a non-empty array of them. The
/// line is parsed once; payloads are copied as raw text, not re-parsed.
pub fn decode_line(line: &[u8]) -> Result<Vec<Record>, LineError> {
    let mut out = Vec::new();
    decode_line_into(line, &mut out)?;
    Ok(out)
}

/// Like [`decode_line`], appending to `out` (replay reuses one vector for
/// every line: no per-line allocation besides the records themselves, which
/// keeps the heap from fragmenting on large files). On error, `out` may
/// hold some records of the line.
pub fn decode_line_into(line: &[u8], out: &mut Vec<Record>) -> Result<(), LineError> {
    decode_with(line, &mut |record| out.push(record.into_owned()))
}

/// Like [`decode_line_into`], with entries borrowed from `line` (replay).
pub(crate) fn decode_line_borrowed<'a>(line: &'a [u8], out: &mut Vec<LineRecord<'a>>) -> Result<(), LineError> {
    decode_with(line, &mut |record| out.push(record))
}

fn decode_with<'a>(line: &'a [u8], push: &mut dyn FnMut(LineRecord<'a>)) -> Result<(), LineError> {
    // from_slice checks UTF-8 inside strings as it parses (everything else
    // in JSON is ASCII), sparing a separate pass over the line.
    let mut de = serde_json::Deserializer::from_slice(line);
    let first = line.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'[') {
        let mut pushed = 0usize;
        de.deserialize_seq(Sink(&mut |record| {
            pushed += 1;
            push(record);
        }))
        .map_err(syntax_or_shape)?;
        if pushed == 0 {
            return Err(LineError::Shape("empty transaction array".to_owned()));
        }
    } else {
        let flat = FlatRecord::deserialize(&mut de).map_err(syntax_or_shape)?;
        push(flat.into_line_record()?);
    }
    de.end().map_err(syntax_or_shape)
}

/// Hands each element of an array line, as a record, to a function.
struct Sink<'f, 'a>(&'f mut dyn FnMut(LineRecord<'a>));

impl<'a> serde::de::Visitor<'a> for Sink<'_, 'a> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an array of records")
    }

    fn visit_seq<A: serde::de::SeqAccess<'a>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(flat) = seq.next_element::<FlatRecord<'a>>()? {
            (self.0)(flat.into_line_record().map_err(serde::de::Error::custom)?);
        }
        Ok(())
    }
}

/// Bytes a record takes when encoded (as an object, or as an element of an
/// array line). Register and state records — the only ones whose bytes can
/// become dead — are measured arithmetically (replay measures one per
/// line); others by encoding into a counter.
pub(super) fn encoded_len(record: &Record) -> u64 {
    match record {
        Record::Register(r) => {
            let op = match r.op {
                RegisterOp::Set => 3,
                RegisterOp::Delete => 6,
            };
            // {"kind":"register","op":"","seq":,"namespace":,"key":}
            let mut len = 54 + op + digits(r.seq) + json_str_len(&r.namespace) + json_str_len(&r.key);
            if let Some(value) = &r.value {
                len += 9 + value.get().len() as u64; // ,"value":
            }
            len
        }
        // {"kind":"state","seq":,"pc":}
        Record::State(st) => 29 + digits(st.seq) + st.pc.get().len() as u64,
        other => counted_len(other),
    }
}

fn digits(mut n: u64) -> u64 {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

/// Length of `s` as a JSON string the way serde_json escapes it.
fn json_str_len(s: &str) -> u64 {
    2 + s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum::<u64>()
}

fn counted_len(record: &Record) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, record) {
        Ok(()) => count.0,
        Err(_) => 0,
    }
}

/// Decode the header line (without its trailing newline).
pub fn decode_header(line: &[u8]) -> Result<Header, LineError> {
    let header: Header = serde_json::from_slice(line).map_err(syntax_or_shape)?;
    if header.kind != "header" {
        return Err(LineError::Shape(format!("first line has kind {:?}, expected \"header\"", header.kind)));
    }
    Ok(header)
}

/// Encode records as one line, trailing newline included: a lone record as
/// an object, several as an array.
pub fn encode_line(records: &[Record]) -> Result<Vec<u8>, serde_json::Error> {
    let mut out = match records {
        [one] => serde_json::to_vec(one)?,
        many => serde_json::to_vec(many)?,
    };
    out.push(b'\n');
    Ok(out)
}

/// Encode the header line, trailing newline included.
pub fn encode_header(header: &Header) -> Result<Vec<u8>, serde_json::Error> {
    let mut out = serde_json::to_vec(header)?;
    out.push(b'\n');
    Ok(out)
}

/// One record as a line of text (no newline), as `cairn log` prints it.
pub fn format_record(record: &Record) -> String {
    // Serializing our own types to a String cannot fail (no maps with
    // non-string keys, raw values are already valid JSON).
    serde_json::to_string(record).unwrap_or_else(|e| format!("{{\"error\":{:?}}}", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::record::to_raw;

    fn entry(seq: u64) -> Record {
        Record::Entry(Entry {
            id: format!("e{seq}"),
            parent_id: None,
            seq,
            timestamp: 7,
            entry_type: "message".into(),
            payload: to_raw(&serde_json::json!({"text": "hé \"x\"\n"})).unwrap(),
        })
    }

    #[test]
    fn round_trips_single_and_array_lines() {
        let set = Record::Register(RegisterRecord {
            op: RegisterOp::Set,
            seq: 2,
            namespace: "fact".into(),
            key: "k".into(),
            value: Some(RawJson::from_json("null").unwrap()),
        });
        let del = Record::Register(RegisterRecord {
            op: RegisterOp::Delete,
            seq: 3,
            namespace: "op".into(),
            key: "k".into(),
            value: None,
        });
        let usage = Record::Usage(UsageRow {
            seq: 4,
            id: "u".into(),
            entry_id: Some("e1".into()),
            usage: RawJson::from_json("{\"in\":1}").unwrap(),
        });
        let state = Record::State(State { seq: 5, pc: RawJson::from_json("\"idle\"").unwrap() });
        let one = encode_line(&[entry(1)]).unwrap();
        assert!(one.starts_with(b"{\"kind\":\"entry\""));
        assert_eq!(decode_line(&one[..one.len() - 1]).unwrap(), vec![entry(1)]);
        let all = vec![entry(1), set, del, usage, state];
        let line = encode_line(&all).unwrap();
        assert_eq!(*line.last().unwrap(), b'\n');
        assert_eq!(decode_line(&line[..line.len() - 1]).unwrap(), all);
        let sizes: u64 = all.iter().map(encoded_len).sum();
        assert_eq!(sizes + 4 + 2 + 1, line.len() as u64, "elements, commas, brackets, newline");
    }

    #[test]
    fn register_and_state_sizes_match_their_encoding() {
        let weird = "q\"b\\n\nr\rt\tu\u{1}\u{8}\u{c}é🦀";
        for seq in [0, 9, 10, 99, 100, 12_345_678_901, u64::MAX] {
            for (op, value) in
                [(RegisterOp::Set, Some(RawJson::from_json("{\"a\": [1, 2]}").unwrap())), (RegisterOp::Delete, None)]
            {
                let record = Record::Register(RegisterRecord {
                    op,
                    seq,
                    namespace: format!("lane.{weird}"),
                    key: weird.to_owned(),
                    value,
                });
                assert_eq!(encoded_len(&record), counted_len(&record), "{record:?}");
            }
            let state = Record::State(State { seq, pc: RawJson::from_json("\"x\"").unwrap() });
            assert_eq!(encoded_len(&state), counted_len(&state));
        }
    }

    #[test]
    fn classifies_errors() {
        assert!(decode_line(b"{\"kind\":\"entry\"").unwrap_err().is_syntax());
        assert!(decode_line(b"\xff\xfe").unwrap_err().is_syntax());
        assert!(!decode_line(b"{\"kind\":\"entry\",\"seq\":1}").unwrap_err().is_syntax());
        assert!(!decode_line(b"[]").unwrap_err().is_syntax());
        assert!(!decode_line(b"42").unwrap_err().is_syntax());
        assert!(!decode_line(b"{\"kind\":\"nope\",\"seq\":1}").unwrap_err().is_syntax());
    }
}
