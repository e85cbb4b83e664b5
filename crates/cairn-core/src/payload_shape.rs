//! Validating parses of the hot tool payloads that keep nothing but the
//! invocation id: what the strict lifecycle check ([`LifecycleCheck`],
//! run over every entry at `Session::open` and by `cairn check`) needs.
//!
//! The check must refuse exactly the payloads the full projection
//! ([`ToolState`]) refuses, so it cannot skip them; but parsing them into
//! their own types allocates every string of them (a `toolCompleted`'s
//! output summary is most of a long session's bytes) only to drop it. The
//! shapes below mirror [`ToolRequestedPayload`], [`ToolStartedPayload`] and
//! [`ToolCompletedPayload`] field for field (the same names, the same
//! `default`s, the same types where a type allocates nothing, so the same
//! derived field matching: unknown fields ignored, duplicates and missing
//! required fields refused), with the allocating leaves replaced by
//! checkers that accept exactly what the leaf type accepts from
//! `serde_json` and keep nothing:
//!
//! - [`Text`] for a `String`: a JSON string (escapes checked, UTF-8
//!   checked by the parser), not copied ([`TextLen`]: only its length);
//! - [`TextSeq`] for a `Vec<String>`: an array of such strings;
//! - [`AnyJson`] for a `serde_json::Value`: any JSON value, walked as
//!   `Value`'s own visitor walks it (numbers parsed, so an out-of-range one
//!   is refused as `Value` refuses it; maps and arrays to the parser's
//!   depth limit), building nothing.
//!
//! Rarely present parts (a hook's record, bypasses) and the small verdict
//! keep their own types. A payload a shape refuses is parsed again into its
//! own type for the error text (the same text as before), and if that
//! parse succeeds — a shape stricter than its type, a bug — the type's
//! answer is taken, so a shape can never refuse more than its type. The
//! other direction (a shape accepting what its type refuses) is what the
//! test `shapes_accept_exactly_what_their_types_accept` guards: every
//! field of every shape removed, and replaced by a value of every JSON
//! kind, must be accepted or refused as the type accepts or refuses it.
//!
//! [`LifecycleCheck`]: crate::projection::LifecycleCheck
//! [`ToolState`]: crate::projection::ToolState
//! [`ToolRequestedPayload`]: crate::events::ToolRequestedPayload
//! [`ToolStartedPayload`]: crate::events::ToolStartedPayload
//! [`ToolCompletedPayload`]: crate::events::ToolCompletedPayload

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::events::{BypassRecord, HookRecord, VerdictRecord};
use crate::tool::{ReplayPolicy, Risk};

/// A JSON string where the payload's type has a `String`: checked, not kept
/// (parsed by the parser into its scratch buffer, never allocated).
///
/// (Reading it as raw text instead — skimmed, then only its opening quote
/// looked at — was tried and cost more instructions, for the many short
/// strings: see `docs/benchmarks/long.md`.)
#[derive(Debug, Default)]
pub(crate) struct Text;

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Text, E> {
                Ok(Text)
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Text, E> {
                std::str::from_utf8(v).map(|_| Text).map_err(|_| E::invalid_value(de::Unexpected::Bytes(v), &self))
            }
        }
        d.deserialize_string(V)
    }
}

/// A JSON string's length as text (escapes decoded) and the largest char
/// boundary of it at most [`ELIDED_KEEP`](crate::context::ELIDED_KEEP),
/// where the payload's type has a `String` whose size is all a reader
/// needs (the context's costs): checked as `String` checks it, not kept.
#[derive(Debug, Default)]
pub(crate) struct TextLen {
    pub(crate) len: usize,
    pub(crate) keep: usize,
}

impl<'de> Deserialize<'de> for TextLen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = TextLen;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<TextLen, E> {
                let mut keep = crate::context::ELIDED_KEEP.min(v.len());
                while !v.is_char_boundary(keep) {
                    keep -= 1;
                }
                Ok(TextLen { len: v.len(), keep })
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<TextLen, E> {
                match std::str::from_utf8(v) {
                    Ok(text) => self.visit_str(text),
                    Err(_) => Err(E::invalid_value(de::Unexpected::Bytes(v), &self)),
                }
            }
        }
        d.deserialize_string(V)
    }
}

/// An array of JSON strings where the payload's type has a `Vec<String>`.
#[derive(Debug, Default)]
pub(crate) struct TextSeq;

impl<'de> Deserialize<'de> for TextSeq {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TextSeq;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TextSeq, A::Error> {
                while seq.next_element::<Text>()?.is_some() {}
                Ok(TextSeq)
            }
        }
        d.deserialize_seq(V)
    }
}

/// Any JSON value where the payload's type has a `serde_json::Value`.
#[derive(Debug, Default)]
pub(crate) struct AnyJson;

impl<'de> Deserialize<'de> for AnyJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = AnyJson;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any valid JSON value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<AnyJson, E> {
                Ok(AnyJson)
            }
            fn visit_i64<E>(self, _: i64) -> Result<AnyJson, E> {
                Ok(AnyJson)
            }
            fn visit_u64<E>(self, _: u64) -> Result<AnyJson, E> {
                Ok(AnyJson)
            }
            fn visit_f64<E>(self, _: f64) -> Result<AnyJson, E> {
                Ok(AnyJson)
            }
            fn visit_str<E>(self, _: &str) -> Result<AnyJson, E> {
                Ok(AnyJson)
            }
            fn visit_none<E>(self) -> Result<AnyJson, E> {
                Ok(AnyJson)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<AnyJson, D::Error> {
                AnyJson::deserialize(d)
            }
            fn visit_unit<E>(self) -> Result<AnyJson, E> {
                Ok(AnyJson)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<AnyJson, A::Error> {
                while seq.next_element::<AnyJson>()?.is_some() {}
                Ok(AnyJson)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<AnyJson, A::Error> {
                while map.next_key::<Text>()?.is_some() {
                    map.next_value::<AnyJson>()?;
                }
                Ok(AnyJson)
            }
        }
        d.deserialize_any(V)
    }
}

/// [`crate::events::ToolRequestedPayload`]'s shape.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // Fields are parsed to be checked, not read.
pub(crate) struct Requested<'a> {
    #[serde(borrow)]
    pub(crate) invocation_id: Cow<'a, str>,
    turn_id: Text,
    request: Request,
    #[serde(default)]
    tier: Option<Risk>,
    #[serde(default)]
    replay: Option<ReplayPolicy>,
    #[serde(default)]
    hook: Option<HookRecord>,
}

/// [`crate::tool::ToolRequest`]'s shape.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // Fields are parsed to be checked, not read.
struct Request {
    invocation_id: Text,
    call_id: Text,
    session_id: Text,
    tool: Text,
    arguments: AnyJson,
}

/// [`crate::events::ToolStartedPayload`]'s shape.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // Fields are parsed to be checked, not read.
pub(crate) struct Started<'a> {
    #[serde(borrow)]
    pub(crate) invocation_id: Cow<'a, str>,
    call_id: Text,
    tool: Text,
    verdict: VerdictRecord,
}

/// [`crate::events::ToolCompletedPayload`]'s shape.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // Fields are parsed to be checked, not read.
pub(crate) struct Completed<'a> {
    #[serde(borrow)]
    pub(crate) invocation_id: Cow<'a, str>,
    call_id: Text,
    tool: Text,
    receipt: KeptReceipt<Text>,
    #[serde(default)]
    full_output: Option<Text>,
    #[serde(default)]
    settled_by: Option<Text>,
    #[serde(default)]
    bypasses: Vec<BypassRecord>,
}

/// [`crate::events::ToolCompletedPayload`]'s shape again, with what its
/// tool-result message is made of lent (the call id, borrowed where it has
/// no escape; the exit code; the output summary's length): what the
/// context's rebuild costs a settled call by, without building the payload
/// and its message (`turn::conversation::costs_of`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // Fields are parsed to be checked, not read.
pub(crate) struct CompletedResult<'a> {
    invocation_id: Text,
    #[serde(borrow)]
    pub(crate) call_id: Cow<'a, str>,
    tool: Text,
    pub(crate) receipt: KeptReceipt<TextLen>,
    #[serde(default)]
    full_output: Option<Text>,
    #[serde(default)]
    settled_by: Option<Text>,
    #[serde(default)]
    bypasses: Vec<BypassRecord>,
}

/// [`crate::tool::ToolReceipt`]'s shape with its exit code and what a
/// reader keeps of its output (`S`: nothing, [`Text`]; its length,
/// [`TextLen`]; or its start, [`TextPrefix`]).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // Fields are parsed to be checked, not read.
pub(crate) struct KeptReceipt<S> {
    pub(crate) exit_code: i32,
    pub(crate) output_summary: S,
    #[serde(default)]
    structured_output: Option<AnyJson>,
    #[serde(default)]
    affected_entities: TextSeq,
    duration_ms: u64,
    tier: Risk,
    timestamp: i64,
    #[serde(default)]
    truncated: bool,
}

/// The start of a JSON string where the payload's type has a `String` of
/// which a reader shows only its beginning (`cairn show`): checked as
/// `String` checks it, its first [`PREFIX_CHARS`] characters kept (one
/// more than shown, so the reader still knows whether it was cut).
#[derive(Debug, Default)]
pub(crate) struct TextPrefix(pub(crate) String);

/// Characters [`TextPrefix`] keeps.
pub(crate) const PREFIX_CHARS: usize = 101;

impl<'de> Deserialize<'de> for TextPrefix {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = TextPrefix;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<TextPrefix, E> {
                let end = v.char_indices().nth(PREFIX_CHARS).map_or(v.len(), |(at, _)| at);
                Ok(TextPrefix(v.get(..end).unwrap_or(v).to_owned()))
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<TextPrefix, E> {
                match std::str::from_utf8(v) {
                    Ok(text) => self.visit_str(text),
                    Err(_) => Err(E::invalid_value(de::Unexpected::Bytes(v), &self)),
                }
            }
        }
        d.deserialize_string(V)
    }
}

/// [`crate::events::ToolCompletedPayload`]'s shape again, keeping what a
/// one-line description shows (`cairn show`): the tool, the exit code and
/// the start of the output summary.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // Fields are parsed to be checked, not read.
pub(crate) struct CompletedLine<'a> {
    invocation_id: Text,
    call_id: Text,
    #[serde(borrow)]
    pub(crate) tool: Cow<'a, str>,
    pub(crate) receipt: KeptReceipt<TextPrefix>,
    #[serde(default)]
    full_output: Option<Text>,
    #[serde(default)]
    settled_by: Option<Text>,
    #[serde(default)]
    bypasses: Vec<BypassRecord>,
}

/// What a one-line description of a `toolCompleted` entry shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCompletedLine {
    /// The tool.
    pub tool: String,
    /// The receipt's exit code.
    pub exit_code: i32,
    /// The start of the receipt's output summary: its first 101
    /// characters (one more than `cairn show` prints, so a cut shows).
    pub output_start: String,
}

/// The one-line description's parts of a `toolCompleted` payload, when
/// [`crate::events::ToolCompletedPayload`] accepts the payload (read through a shape
/// that checks it as the type would, keeping only these parts; this
/// module's test holds it to the type's verdicts), so a
/// long output is not copied to show its start.
pub fn tool_completed_line(payload: &str) -> Option<ToolCompletedLine> {
    let line = serde_json::from_str::<CompletedLine<'_>>(payload).ok()?;
    Some(ToolCompletedLine {
        tool: line.tool.into_owned(),
        exit_code: line.receipt.exit_code,
        output_start: line.receipt.output_summary.0,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::events::{ToolCompletedPayload, ToolRequestedPayload, ToolStartedPayload};

    /// Whether a text parses as a shape, and as its type.
    type Parses = fn(&str) -> bool;

    /// What the shape and the type say of `value`.
    fn agree(value: &Value, shape: Parses, full: Parses) -> (bool, bool) {
        let text = value.to_string();
        (shape(&text), full(&text))
    }

    /// Every object reachable in `value` by a path of keys and indices.
    fn paths(value: &Value, at: Vec<String>, out: &mut Vec<Vec<String>>) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    let mut p = at.clone();
                    p.push(k.clone());
                    out.push(p.clone());
                    paths(v, p, out);
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    let mut p = at.clone();
                    p.push(i.to_string());
                    out.push(p.clone());
                    paths(v, p, out);
                }
            }
            _ => {}
        }
    }

    /// `value` with the member at `path` replaced (`Some`) or removed.
    fn edit(value: &Value, path: &[String], with: Option<&Value>) -> Value {
        let mut out = value.clone();
        let (last, parent_path) = path.split_last().expect("a path");
        let mut parent = &mut out;
        for step in parent_path {
            parent = match parent {
                Value::Object(map) => map.get_mut(step).expect("a key"),
                Value::Array(items) => &mut items[step.parse::<usize>().expect("an index")],
                _ => unreachable!(),
            };
        }
        match (parent, with) {
            (Value::Object(map), Some(v)) => {
                map.insert(last.clone(), v.clone());
            }
            (Value::Object(map), None) => {
                map.remove(last);
            }
            (Value::Array(items), Some(v)) => items[last.parse::<usize>().expect("an index")] = v.clone(),
            (Value::Array(items), None) => {
                items.remove(last.parse::<usize>().expect("an index"));
            }
            _ => unreachable!(),
        }
        out
    }

    /// Every field removed and replaced by each kind of JSON value (and
    /// by the verdicts and tiers a field might hold), plus unknown fields:
    /// the shape and the type accept and refuse the same payloads.
    fn same_verdicts(name: &str, good: &Value, shape: Parses, full: Parses) {
        assert_eq!(agree(good, shape, full), (true, true), "{name}: the good payload");
        let kinds = [
            json!(null),
            json!(true),
            json!(0),
            json!(-1),
            json!(4_294_967_296u64),
            json!(1.5),
            json!("s"),
            json!("readOnly"),
            json!("approve"),
            json!([]),
            json!(["s"]),
            json!([1]),
            json!({}),
            json!({"decision": "approve", "by": "x", "at": 1}),
            json!({"what": "net", "verdict": {"decision": "deny", "reason": "r", "by": "x", "at": 1}}),
            json!({"decision": "deny", "by": "h", "reason": "r"}),
            json!({"decision": "rewrite", "by": "h", "originalArguments": {"a": [1, "b", null]}}),
            json!([{"what": "net", "verdict": {"decision": "approve", "by": "x", "at": 1}}]),
        ];
        let mut all = Vec::new();
        paths(good, Vec::new(), &mut all);
        let mut cases = 0;
        for path in &all {
            let mut variants = vec![edit(good, path, None)];
            variants.extend(kinds.iter().map(|k| edit(good, path, Some(k))));
            for v in variants {
                let (by_shape, by_type) = agree(&v, shape, full);
                assert_eq!(by_shape, by_type, "{name}: at {path:?}: {v}");
                cases += 1;
            }
        }
        // Unknown fields, at the top and inside.
        for path in &all {
            let mut v = good.clone();
            let parent: String = path[..path.len() - 1].iter().map(|p| format!("/{p}")).collect();
            if let Some(Value::Object(map)) = v.pointer_mut(&parent) {
                map.insert("somethingNew".into(), json!({"x": [1, 2]}));
            }
            let (by_shape, by_type) = agree(&v, shape, full);
            assert_eq!(by_shape, by_type, "{name}: unknown field near {path:?}");
        }
        // Numbers a Value refuses, in a Value.
        let text = good.to_string();
        if let Some(at) = text.find("\"arguments\":{") {
            let odd = format!("{}\"arguments\":{{\"n\":1e999,{}", &text[..at], &text[at + 13..]);
            assert_eq!(shape(&odd), full(&odd), "{name}: an out-of-range number in the arguments");
        }
        assert!(cases > 20, "{name}: {cases} cases");
    }

    fn requested_shape(t: &str) -> bool {
        serde_json::from_str::<Requested<'_>>(t).is_ok()
    }
    fn requested_type(t: &str) -> bool {
        serde_json::from_str::<ToolRequestedPayload>(t).is_ok()
    }
    fn started_shape(t: &str) -> bool {
        serde_json::from_str::<Started<'_>>(t).is_ok()
    }
    fn started_type(t: &str) -> bool {
        serde_json::from_str::<ToolStartedPayload>(t).is_ok()
    }
    fn completed_shape(t: &str) -> bool {
        serde_json::from_str::<Completed<'_>>(t).is_ok()
    }
    fn result_shape(t: &str) -> bool {
        serde_json::from_str::<CompletedResult<'_>>(t).is_ok()
    }
    fn line_shape(t: &str) -> bool {
        serde_json::from_str::<CompletedLine<'_>>(t).is_ok()
    }
    fn completed_type(t: &str) -> bool {
        serde_json::from_str::<ToolCompletedPayload>(t).is_ok()
    }

    #[test]
    fn an_outputs_length_and_kept_prefix_are_the_strings() {
        for output in
            ["".to_owned(), "line\n\"q\"\t".repeat(400), "é".repeat(1500), "a🦀".repeat(900), "\u{1}x".repeat(10)]
        {
            let payload = json!({"invocationId": "i", "callId": "c\u{e9}", "tool": "t", "receipt":
                {"exitCode": 0, "outputSummary": output, "durationMs": 1, "tier": "readOnly", "timestamp": 1}});
            let text = payload.to_string();
            let p: CompletedResult<'_> = serde_json::from_str(&text).expect("parses");
            let mut keep = crate::context::ELIDED_KEEP.min(output.len());
            while !output.is_char_boundary(keep) {
                keep -= 1;
            }
            assert_eq!((p.receipt.output_summary.len, p.receipt.output_summary.keep), (output.len(), keep));
            assert_eq!(p.call_id, "c\u{e9}");
        }
    }

    #[test]
    fn shapes_accept_exactly_what_their_types_accept() {
        let verdict = json!({"decision": "approve", "by": "policy:readOnly", "at": 1});
        let requested = json!({
            "invocationId": "i1", "turnId": "t1",
            "request": {"invocationId": "i1", "callId": "c1", "sessionId": "s", "tool": "read_file",
                        "arguments": {"path": "src/a.rs", "n": [1, 2.5, null, true, {"x": "y\n"}]}},
            "tier": "readOnly", "replay": "idempotent",
            "hook": {"decision": "rewrite", "by": "h", "originalArguments": {"a": 1}}
        });
        same_verdicts("toolRequested", &requested, requested_shape, requested_type);
        let started = json!({"invocationId": "i1", "callId": "c1", "tool": "read_file", "verdict": verdict});
        same_verdicts("toolStarted", &started, started_shape, started_type);
        let completed = json!({
            "invocationId": "i1", "callId": "c1", "tool": "read_file",
            "receipt": {"exitCode": 0, "outputSummary": "fn a() {}\n\"quoted\" é \u{1F980}", "structuredOutput": {"k": [1]},
                        "affectedEntities": ["src/a.rs"], "durationMs": 3, "tier": "readOnly",
                        "timestamp": 1_700_000_000_000i64, "truncated": false},
            "fullOutput": "more", "settledBy": "guard",
            "bypasses": [{"what": "net", "verdict": verdict}]
        });
        same_verdicts("toolCompleted", &completed, completed_shape, completed_type);
        same_verdicts("toolCompleted as a result", &completed, result_shape, completed_type);
        same_verdicts("toolCompleted as a line", &completed, line_shape, completed_type);
        // The minimal forms (optional fields absent) too.
        let minimal = json!({
            "invocationId": "i1", "callId": "c1", "tool": "t",
            "receipt": {"exitCode": 0, "outputSummary": "", "durationMs": 0, "tier": "write", "timestamp": 0}
        });
        same_verdicts("minimal toolCompleted", &minimal, completed_shape, completed_type);
        same_verdicts("minimal toolCompleted as a result", &minimal, result_shape, completed_type);
        same_verdicts("minimal toolCompleted as a line", &minimal, line_shape, completed_type);
        let minimal = json!({"invocationId": "i1", "turnId": "t",
            "request": {"invocationId": "i1", "callId": "c", "sessionId": "s", "tool": "t", "arguments": null}});
        same_verdicts("minimal toolRequested", &minimal, requested_shape, requested_type);
        // Duplicate fields, bad escapes, invalid text.
        for bad in [
            r#"{"invocationId":"i","invocationId":"j","callId":"c","tool":"t","verdict":{"decision":"approve","by":"x","at":1}}"#,
            r#"{"invocationId":"i","callId":"c\x","tool":"t","verdict":{"decision":"approve","by":"x","at":1}}"#,
            r#"{"invocationId":"i","callId":"c","tool":"\ud800","verdict":{"decision":"approve","by":"x","at":1}}"#,
            r#"{"invocationId":"i","callId":"c","tool":"t","verdict":{"decision":"approve","by":"x","at":1}"#,
        ] {
            assert_eq!(started_shape(bad), started_type(bad), "{bad}");
        }
    }

    #[test]
    fn a_completed_line_keeps_the_start_a_description_shows() {
        for output in ["", "short\nlines", &"é🦀x".repeat(60)] {
            let payload = json!({
                "invocationId": "i1", "callId": "c1", "tool": "read_file",
                "receipt": {"exitCode": 3, "outputSummary": output, "durationMs": 0, "tier": "write", "timestamp": 0}
            })
            .to_string();
            let full = serde_json::from_str::<ToolCompletedPayload>(&payload).unwrap();
            let line = super::tool_completed_line(&payload).unwrap();
            assert_eq!((line.tool.as_str(), line.exit_code), (full.tool.as_str(), full.receipt.exit_code));
            let start: String = full.receipt.output_summary.chars().take(PREFIX_CHARS).collect();
            assert_eq!(line.output_start, start);
        }
        assert_eq!(super::tool_completed_line(r#"{"tool":"t"}"#), None);
    }
}
