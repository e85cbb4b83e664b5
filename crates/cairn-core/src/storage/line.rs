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
//!
//! The replay and `cairn check` decode through a one-pass decode
//! ([`decode_line_inline`]): the line checked as UTF-8 once and parsed as
//! text, the records read by a visitor that mirrors [`FlatRecord`]'s
//! derived one, and the payloads of the entry types an [`EntryRead`]
//! reader asks for read by it as they are parsed (`cairn check`'s tool
//! payloads through their shapes) instead of skimmed as raw text and
//! parsed again. It answers only for a line it accepts whole; any other
//! line goes through the usual decode ([`decode_line_borrowed`]), which
//! gives the error, so the one-pass decode never decides what is refused.

use std::borrow::Cow;

use serde::de::DeserializeSeed;
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

/// What a reader of every entry makes of each one where the lines are
/// decoded (`cairn check`'s decoding threads): the `read` of
/// [`check_file_read`](super::check_file_read).
///
/// Any `Fn(EntryView) -> P + Sync` is one (it reads each payload from its
/// text). A reader may also read the payloads of some entry types as the
/// line is parsed ([`reads_inline`](Self::reads_inline),
/// [`read_inline`](Self::read_inline)): each such payload is then parsed
/// once, where otherwise the line's parse skims it as raw text and the
/// reader parses that text again.
pub trait EntryRead: Sync {
    /// What is made of an entry.
    type Out: Send;

    /// Read `entry` (its payload as text).
    fn read(&self, entry: EntryView<'_>) -> Self::Out;

    /// Whether a payload of `entry_type` may be read by
    /// [`read_inline`](Self::read_inline) (when the entry's `type` comes
    /// before its `payload` in the line, as the writer puts them).
    fn reads_inline(&self, entry_type: &str) -> bool {
        let _ = entry_type;
        false
    }

    /// Read the payload of an entry of `entry_type` from the line's
    /// parser. It must give exactly what [`read`](Self::read) gives an
    /// entry of that type with this payload, or fail; a failure is never a
    /// verdict: the line is then decoded again the usual way (every payload
    /// as text, `read` over each entry), which says what is wrong, if
    /// anything.
    fn read_inline<'de, D: Deserializer<'de>>(&self, entry_type: &str, payload: D) -> Result<Self::Out, D::Error> {
        let _ = (entry_type, payload);
        Err(serde::de::Error::custom("no inline read"))
    }
}

impl<P: Send, F: Fn(EntryView<'_>) -> P + Sync> EntryRead for F {
    type Out = P;

    fn read(&self, entry: EntryView<'_>) -> P {
        self(entry)
    }
}

/// A record of a line decoded by [`decode_line_inline`], with what the
/// reader read of it inline (an entry whose payload was read inline has a
/// `null` payload in its place, not to be looked at).
pub(crate) type InlineRecord<'a, P> = (LineRecord<'a>, Option<P>);

/// Decode a line as [`decode_line_borrowed`] does, with the payloads
/// `reader` reads inline read as they are parsed. Answers only for a line
/// it accepts whole (`true`: `out` holds its records, the same records
/// `decode_line_borrowed` gives, and for the payloads read inline what
/// [`EntryRead::read`] would make of them); anything else (`false`: an
/// invalid line, one that is not UTF-8, a payload the reader's inline read
/// refuses, a record in an unusual form) is left to `decode_line_borrowed`,
/// so this never decides whether or how a line is refused. On `false`,
/// `out` may hold some records of the line.
pub(crate) fn decode_line_inline<'a, R: EntryRead>(
    line: &'a [u8],
    reader: &R,
    out: &mut Vec<InlineRecord<'a, R::Out>>,
) -> bool {
    decode_inline_with(line, reader, &mut |record, read| out.push((record, read)))
}

/// [`decode_line_borrowed`] through the one-pass decode (no payload read
/// inline): the line checked as UTF-8 once, then parsed as text, which
/// costs fewer instructions than parsing bytes (each string checked as it
/// is parsed, each payload's text again); a line it does not accept whole
/// goes through `decode_line_borrowed`, which gives the error. What the
/// store's replay decodes each line with.
pub(crate) fn decode_line_lent<'a>(line: &'a [u8], out: &mut Vec<LineRecord<'a>>) -> Result<(), LineError> {
    if decode_inline_with(line, &|_: EntryView<'_>| (), &mut |record, _| out.push(record)) {
        return Ok(());
    }
    out.clear();
    decode_line_borrowed(line, out)
}

/// [`decode_line_inline`], handing each record to `push`.
fn decode_inline_with<'a, R: EntryRead>(
    line: &'a [u8],
    reader: &R,
    push: &mut dyn FnMut(LineRecord<'a>, Option<R::Out>),
) -> bool {
    // One UTF-8 pass over the line (mostly ASCII: a fast one), after which
    // the parser checks no string again; `from_slice` would check the
    // strings it parses but not the values it skips inside a payload read
    // inline (e.g. an unknown field's), which the raw skim's text does.
    let Ok(text) = std::str::from_utf8(line) else { return false };
    let mut de = serde_json::Deserializer::from_str(text);
    let first = line.iter().find(|b| !b.is_ascii_whitespace());
    let decoded = if first == Some(&b'[') {
        de.deserialize_seq(InlineSink { reader, push }).is_ok()
    } else {
        match InlineSeed(reader).deserialize(&mut de) {
            Ok((flat, read)) => match flat.into_line_record() {
                Ok(record) => {
                    push(record, read);
                    true
                }
                Err(_) => false,
            },
            Err(_) => false,
        }
    };
    decoded && de.end().is_ok()
}

/// The elements of an array line, decoded by [`InlineSeed`].
struct InlineSink<'r, 'p, 'a, R: EntryRead> {
    reader: &'r R,
    push: &'p mut dyn FnMut(LineRecord<'a>, Option<R::Out>),
}

impl<'a, R: EntryRead> serde::de::Visitor<'a> for InlineSink<'_, '_, 'a, R> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an array of records")
    }

    fn visit_seq<A: serde::de::SeqAccess<'a>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut pushed = 0usize;
        while let Some((flat, read)) = seq.next_element_seed(InlineSeed(self.reader))? {
            (self.push)(flat.into_line_record().map_err(serde::de::Error::custom)?, read);
            pushed += 1;
        }
        if pushed == 0 {
            return Err(serde::de::Error::custom("empty transaction array"));
        }
        Ok(())
    }
}

/// [`FlatRecord`]'s fields, as its derived `Deserialize` names them.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum Field {
    Kind,
    Seq,
    Timestamp,
    Id,
    ParentId,
    #[serde(rename = "type")]
    Type,
    Payload,
    Op,
    Namespace,
    Key,
    Value,
    EntryId,
    Usage,
    Pc,
    #[serde(other)]
    Other,
}

/// A string borrowed from the line where it has no escape (what
/// `Option<Cow<str>>`'s own `Deserialize` accepts, without its copy).
struct LentStr<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for LentStr<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = LentStr<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<LentStr<'de>, E> {
                Ok(LentStr(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<LentStr<'de>, E> {
                Ok(LentStr(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

/// One record object of a line, as [`FlatRecord`]'s derived `Deserialize`
/// reads it (the same fields and field types; unknown fields ignored; a
/// duplicate refused), with the payload read inline when its entry type
/// is known by then and the reader reads it. Only a JSON object: the
/// array form a derived struct also accepts is left to the usual decode.
struct InlineSeed<'r, R>(&'r R);

impl<'a, R: EntryRead> serde::de::DeserializeSeed<'a> for InlineSeed<'_, R> {
    type Value = (FlatRecord<'a>, Option<R::Out>);

    fn deserialize<D: Deserializer<'a>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

/// Set a field once (a second occurrence is refused, as the derive does).
fn once<T, E: serde::de::Error>(slot: &mut Option<T>, value: T) -> Result<(), E> {
    if slot.is_some() {
        return Err(E::custom("duplicate field"));
    }
    *slot = Some(value);
    Ok(())
}

/// The payload of an entry read inline by the reader.
struct ReadPayload<'r, 't, R> {
    reader: &'r R,
    entry_type: &'t str,
}

impl<'a, R: EntryRead> serde::de::DeserializeSeed<'a> for ReadPayload<'_, '_, R> {
    type Value = R::Out;

    fn deserialize<D: Deserializer<'a>>(self, d: D) -> Result<R::Out, D::Error> {
        self.reader.read_inline(self.entry_type, d)
    }
}

impl<'a, R: EntryRead> serde::de::Visitor<'a> for InlineSeed<'_, R> {
    type Value = (FlatRecord<'a>, Option<R::Out>);

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a record")
    }

    fn visit_map<A: serde::de::MapAccess<'a>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kind: Option<LentStr<'a>> = None;
        let mut seq: Option<Option<u64>> = None;
        let mut timestamp: Option<Option<i64>> = None;
        let mut id: Option<Option<LentStr<'a>>> = None;
        let mut parent_id: Option<Option<LentStr<'a>>> = None;
        let mut entry_type: Option<Option<LentStr<'a>>> = None;
        let mut payload: Option<&'a RawValue> = None;
        let mut read: Option<R::Out> = None;
        let mut op: Option<Option<RegisterOp>> = None;
        let mut namespace: Option<Option<LentStr<'a>>> = None;
        let mut key: Option<Option<LentStr<'a>>> = None;
        let mut value: Option<&'a RawValue> = None;
        let mut entry_id: Option<Option<LentStr<'a>>> = None;
        let mut usage: Option<&'a RawValue> = None;
        let mut pc: Option<&'a RawValue> = None;
        while let Some(field) = map.next_key::<Field>()? {
            match field {
                Field::Kind => once(&mut kind, map.next_value()?)?,
                Field::Seq => once(&mut seq, map.next_value()?)?,
                Field::Timestamp => once(&mut timestamp, map.next_value()?)?,
                Field::Id => once(&mut id, map.next_value()?)?,
                Field::ParentId => once(&mut parent_id, map.next_value()?)?,
                Field::Type => once(&mut entry_type, map.next_value()?)?,
                Field::Payload => {
                    let inline = match &entry_type {
                        Some(Some(t)) if self.0.reads_inline(&t.0) => Some(t.0.as_ref()),
                        _ => None,
                    };
                    match inline {
                        Some(t) => {
                            let got = map.next_value_seed(ReadPayload { reader: self.0, entry_type: t })?;
                            once(&mut payload, RawValue::NULL)?;
                            read = Some(got);
                        }
                        None => once(&mut payload, map.next_value()?)?,
                    }
                }
                Field::Op => once(&mut op, map.next_value()?)?,
                Field::Namespace => once(&mut namespace, map.next_value()?)?,
                Field::Key => once(&mut key, map.next_value()?)?,
                Field::Value => once(&mut value, map.next_value()?)?,
                Field::EntryId => once(&mut entry_id, map.next_value()?)?,
                Field::Usage => once(&mut usage, map.next_value()?)?,
                Field::Pc => once(&mut pc, map.next_value()?)?,
                Field::Other => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        let Some(kind) = kind else { return Err(serde::de::Error::missing_field("kind")) };
        let lent = |s: Option<Option<LentStr<'a>>>| s.flatten().map(|s| s.0);
        let flat = FlatRecord {
            kind: kind.0,
            seq: seq.flatten(),
            timestamp: timestamp.flatten(),
            id: lent(id),
            parent_id: lent(parent_id),
            entry_type: lent(entry_type),
            payload,
            op: op.flatten(),
            namespace: lent(namespace),
            key: lent(key),
            value,
            entry_id: lent(entry_id),
            usage,
            pc,
        };
        Ok((flat, read))
    }
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

    /// The one-pass decode (payloads read inline) answers only for lines
    /// the usual decode accepts, with the same records and, for the
    /// payloads it read inline, what the reader makes of their text; the
    /// oracle is the usual decode and `LifecycleCheck::read` over it.
    #[test]
    fn the_inline_decode_agrees_with_the_usual_decode() {
        use crate::projection::{LifecycleCheck, LifecycleReader};
        let requested = r#"{"invocationId":"i1","turnId":"t","request":{"invocationId":"i1","callId":"c","sessionId":"s","tool":"read_file","arguments":{"path":"a"}},"tier":"readOnly","replay":"idempotent"}"#;
        let started = r#"{"invocationId":"i1","callId":"c","tool":"read_file","verdict":{"decision":"approve","by":"policy","at":1}}"#;
        let completed = r#"{"invocationId":"i\"1","callId":"c","tool":"read_file","receipt":{"exitCode":0,"outputSummary":"ok\n\u00e9 é","durationMs":1,"tier":"readOnly","timestamp":1}}"#;
        let tool = |ty: &str, payload: &str| {
            format!(
                r#"{{"kind":"entry","seq":3,"timestamp":1,"id":"e3","parentId":"e2","type":"{ty}","payload":{payload}}}"#
            )
        };
        let set = r#"{"kind":"register","op":"set","seq":4,"namespace":"lane","key":"main","value":"e3"}"#;
        let nested = format!(
            r#"{{"invocationId":"i1","turnId":"t","request":{{"invocationId":"i1","callId":"c","sessionId":"s","tool":"x","arguments":{}{}}}}}"#,
            "[".repeat(126),
            "]".repeat(126)
        );
        // (line, whether the one-pass decode must answer for it)
        let mut lines: Vec<(Vec<u8>, bool)> = vec![
            (tool("toolRequested", requested).into_bytes(), true),
            (tool("toolStarted", started).into_bytes(), true),
            (tool("toolCompleted", completed).into_bytes(), true),
            (tool("message", r#"{"role":"user"}"#).into_bytes(), true),
            (tool("toolFailed", r#"{"invocationId":"i1"}"#).into_bytes(), true),
            (tool("toolFailed", r#"{"nope":1}"#).into_bytes(), true),
            (format!("[{},{},{},{set}]", tool("toolRequested", requested), tool("toolStarted", started), tool("toolCompleted", completed)).into_bytes(), true),
            (format!("  [ {} , {set} ]  ", tool("toolStarted", started)).into_bytes(), true),
            (tool("tool\\u0052equested", requested).into_bytes(), true),
            (tool("toolRequested", requested).replace("\"payload\"", "\"p\\u0061yload\"").into_bytes(), true),
            (tool("toolRequested", requested).replace("\"type\"", "\"t\\u0079pe\"").into_bytes(), true),
            (tool("toolRequested", requested).replace("\"parentId\":\"e2\"", "\"parentId\":null").into_bytes(), true),
            (tool("toolStarted", &started.replace("\"tool\"", "\"extra\":{\"a\":[1,\"\\u00e9\"]},\"tool\"")).into_bytes(), true),
            (tool("toolStarted", &started.replace("\"tool\"", "\"x\":1,\"x\":2,\"tool\"")).into_bytes(), true),
            (tool("toolRequested", requested).replace("\"seq\":3", "\"seq\":3,\"unknown\":[{}],\"unknown\":null").into_bytes(), true),
            // Payload before its type: read from its text.
            (r#"{"kind":"entry","seq":3,"timestamp":1,"id":"e3","payload":{"invocationId":"i1"},"type":"toolFailed"}"#.as_bytes().to_vec(), true),
            (format!(r#"{{"payload":{started},"kind":"entry","seq":3,"timestamp":1,"id":"e3","type":"toolStarted"}}"#).into_bytes(), true),
            // A register carrying an entry's fields (ignored by the record).
            (format!(r#"{{"kind":"register","op":"delete","seq":4,"namespace":"lane","key":"main","type":"toolStarted","payload":{started}}}"#).into_bytes(), true),
            (br#"{"kind":"register","op":"delete","seq":4,"namespace":"lane","key":"main","type":"toolStarted","payload":{}}"#.to_vec(), false),
            (r#"{"kind":"usage","seq":5,"id":"u","entryId":"e3","usage":{"in":1}}"#.as_bytes().to_vec(), true),
            (r#"{"kind":"state","seq":6,"pc":"idle"}"#.as_bytes().to_vec(), true),
            // Refused by the shape: left to the usual decode.
            (tool("toolStarted", &started.replace("\"callId\"", "\"callid\"")).into_bytes(), false),
            (tool("toolCompleted", "null").into_bytes(), false),
            (tool("toolRequested", "[]").into_bytes(), false),
            (tool("toolRequested", &nested).into_bytes(), false),
            // Invalid lines.
            (tool("toolStarted", started).replace("\"type\"", "\"type\":\"message\",\"type\"").into_bytes(), false),
            (tool("toolStarted", started).replace("\"seq\":3", "\"seq\":3,\"seq\":3").into_bytes(), false),
            (tool("toolStarted", &format!("{started},\"payload\":1")).into_bytes(), false),
            (tool("toolStarted", started).replace("\"seq\":3", "\"op\":5,\"seq\":3").into_bytes(), false),
            (tool("toolStarted", started).replace("\"seq\":3", "\"seq\":-3").into_bytes(), false),
            (tool("toolStarted", started).replace("\"seq\":3,", "").into_bytes(), false),
            (tool("toolStarted", started).replace("\"kind\":\"entry\",", "").into_bytes(), false),
            (format!("{} x", tool("toolStarted", started)).into_bytes(), false),
            (format!("[{}", tool("toolStarted", started)).into_bytes(), false),
            (br#"[["entry",3,1,"e3",null,"message",{}]]"#.to_vec(), false),
            (b"[]".to_vec(), false),
            (b"42".to_vec(), false),
            (b"{}".to_vec(), false),
            (b"".to_vec(), false),
            (b"{\"kind\":\"entr".to_vec(), false),
        ];
        // Not UTF-8 where the reader skips (an unknown field of a payload
        // read inline) and where a raw skim looks (a message's payload).
        let mut bad = tool("toolStarted", &started.replace("\"tool\"", "\"extra\":\"\u{1}\",\"tool\"")).into_bytes();
        let at = bad.iter().position(|&b| b == 1).unwrap();
        bad[at] = 0xff;
        lines.push((bad.clone(), false));
        lines.push((
            tool("message", "\"\u{1}\"").into_bytes().into_iter().map(|b| if b == 1 { 0xfe } else { b }).collect(),
            false,
        ));
        let by_text = |e: EntryView<'_>| LifecycleCheck::read(e);
        for (line, answers) in &lines {
            let shown = String::from_utf8_lossy(line);
            let mut want = Vec::new();
            let usual = decode_line_borrowed(line, &mut want);
            // The replay's decode: the same records, or the same error.
            let mut lent = Vec::new();
            let replayed = decode_line_lent(line, &mut lent);
            assert_eq!(replayed, usual, "{shown}");
            if usual.is_ok() {
                assert_eq!(format!("{lent:?}"), format!("{want:?}"), "{shown}");
            }
            for inline_reads in [true, false] {
                let mut got = Vec::new();
                let answered = if inline_reads {
                    decode_line_inline(line, &LifecycleReader, &mut got)
                } else {
                    decode_line_inline(line, &by_text, &mut got)
                };
                if inline_reads {
                    assert_eq!(answered, *answers, "{shown}");
                }
                if !answered {
                    continue;
                }
                assert!(usual.is_ok(), "answered for a line the usual decode refuses: {shown}");
                assert_eq!(got.len(), want.len(), "{shown}");
                for ((got, read), want) in got.iter().zip(&want) {
                    match (got, want) {
                        (LineRecord::Entry(got), LineRecord::Entry(want)) => {
                            let (g, w) = (got.view(), want.view());
                            assert_eq!(
                                (g.seq, g.timestamp, g.id, g.parent_id, g.entry_type),
                                (w.seq, w.timestamp, w.id, w.parent_id, w.entry_type),
                                "{shown}"
                            );
                            match read {
                                Some(read) => {
                                    assert!(inline_reads, "{shown}");
                                    assert_eq!(
                                        format!("{read:?}"),
                                        format!("{:?}", LifecycleCheck::read(w)),
                                        "{shown}"
                                    );
                                }
                                None => assert_eq!(g.payload, w.payload, "{shown}"),
                            }
                        }
                        (LineRecord::Other(got), LineRecord::Other(want)) => assert_eq!(got, want, "{shown}"),
                        _ => panic!("different records: {shown}"),
                    }
                }
            }
        }
        // The fast path is taken for the tool events the writer writes.
        let mut got = Vec::new();
        let line = tool("toolCompleted", completed);
        assert!(decode_line_inline(line.as_bytes(), &LifecycleReader, &mut got));
        assert!(got[0].1.is_some());
    }
}
