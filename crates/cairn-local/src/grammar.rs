//! The tool-call grammar: a JSON-schema-driven, byte-level pushdown state
//! machine that says whether a byte may continue the output so far.
//!
//! # The language
//!
//! When tools are offered, the answer is either
//! - **plain text**: the first byte that is not a space is anything but `{`;
//!   from then on nothing is constrained and the answer ends at `<|im_end|>`;
//! - or **one tool call**: the first non-space byte is `{` and the whole
//!   answer is exactly
//!   `{"name": "<tool>", "arguments": <value>}` where `<tool>` is one of the
//!   offered names and `<value>` fits that tool's `input_schema`. The answer
//!   ends at the closing brace (no byte may follow it).
//!
//! With no tools (`Grammar::new` of nothing) only plain text is allowed, and
//! it may not start with `{`.
//!
//! Keys appear in that order (`name` first). Between tokens at most one space
//! is allowed (no newlines, no space before `:`), which keeps the model from
//! padding forever.
//!
//! # Supported schema features
//!
//! The aim: a completed call passes `cairn_core::schema::validate` (the
//! check the turn applies) for every keyword listed here.
//!
//! - `type`: `object`, `array`, `string`, `integer`, `number`, `boolean`,
//!   `null`, and lists of these (`["string", "null"]`), told apart by their
//!   first byte. An unknown type name matches nothing, as in core.
//! - objects with `properties` (at most 64): only declared keys, each at most
//!   once, in any order; `}` is refused until every `required` key is
//!   present (a required key missing from `properties` gets the schema of
//!   `additionalProperties`); `,` is refused when no key is left. Without
//!   `properties`, `required` or `additionalProperties: false` make the
//!   object one of declared keys too (possibly none).
//! - arrays: `items` with any supported schema; `minItems`/`maxItems`.
//! - `enum` and `const` (at most 64 values of any JSON type): the value must
//!   be one of them, spelt as `serde_json` prints it; values the rest of the
//!   schema refuses (type, lengths, ranges) are dropped from the set.
//! - strings: any JSON string core can decode: escapes checked (`\uXXXX`
//!   included, surrogates only in pairs), well-formed UTF-8 only, raw
//!   control bytes refused. `minLength`/`maxLength` count characters
//!   (Unicode scalar values, as core counts them) of the decoded string: an
//!   escape is one character, a surrogate pair one too.
//! - numbers: integers `-?(0|[1-9][0-9]*)`; numbers add a fraction and an
//!   exponent; at most 20 bytes. With `minimum`, `maximum`,
//!   `exclusiveMinimum` or `exclusiveMaximum` (also without `type`) a number
//!   has no exponent and at most 15 digits, and a byte is allowed only if
//!   some completion is a value inside the bounds, compared as core compares
//!   them (the `f64` serde_json parses; see `grammar/number.rs`).
//! - A schema no value can satisfy (`minimum` above `maximum`, `minLength`
//!   above `maxLength`, an empty `enum`, `false`…) is never entered: an
//!   optional key with it is never offered, an array with such `items` stays
//!   empty, and a tool whose arguments cannot be satisfied is not offered.
//!
//! # Paths
//!
//! A string marked `"format": "path"` is a path in the working tree:
//! - with `"x-exists"` (`"file"`, `"directory"`, or `true`/`"any"`) and
//!   candidates given ([`Grammar::with_paths`], found by `crate::ground`),
//!   it must be exactly one of the existing candidates of that kind (a trie,
//!   `grammar/path.rs`; spelt as `serde_json` prints it, no alternative
//!   escapes). A required one with no candidate makes its tool uncallable.
//! - otherwise (write tools, or no candidates known) it has path syntax
//!   only: relative, no empty, `.` or `..` component, no backslash. With
//!   `minLength`/`maxLength` it is an ordinary string instead.
//!
//! # Limits
//!
//! Everything else is *ignored*, so the grammar may accept arguments that
//! core's check refuses; each is listed here with why:
//! - `anyOf` (checked by core): alternatives cannot in general be told apart
//!   byte by byte; a schema with `anyOf` and a `type` is compiled from the
//!   `type` alone, one without a `type` is "any value".
//! - `additionalProperties` as a schema, on an object *without*
//!   `properties`: such an object is "any object" (keys and values free).
//!   With `properties`, only declared keys are produced, which core accepts
//!   whatever `additionalProperties` says.
//! - Fallbacks to "any value": an object schema with more than 64 keys (or a
//!   key of 125 bytes or more), an `enum` of more than 64 values or with a
//!   value longer than 250 bytes, a schema nested deeper than 8 levels
//!   below that depth, a missing `type` with nothing else to go by.
//! - Bounded numbers give up the exponent and more than 15 digits (so their
//!   value is parsed exactly); a `number` range no 15-digit decimal falls in
//!   counts as unsatisfiable.
//! - Not checked by core either, so harmless: `pattern`, `format`,
//!   `uniqueItems`, `oneOf`/`allOf`/`not`, `$ref`, `multipleOf`.
//!
//! "Any JSON value" is still well-formed JSON, nesting at most
//! [`MAX_DEPTH`] deep. Only the first 64 offered tools (with names shorter
//! than 125 bytes) can be called. Object keys and enum values are matched on
//! their exact `serde_json` spelling (no alternative escapes).
//!
//! This file compiles schemas into nodes; the byte-level machine that walks
//! them is `grammar/machine.rs` ([`State`]). Both must stay free of model and
//! tokenizer types: they see bytes. Token masking lives in `constrain.rs`.

use serde_json::{Map, Value};

mod machine;
mod number;
mod path;
pub use machine::{Mode, State};
use number::Bounds;
use path::Trie;

use crate::ground::{PathCandidates, PathKind};

/// Deepest nesting of frames (containers plus the scalar inside).
pub const MAX_DEPTH: usize = 16;
/// Most properties, enum values or tools one set may hold (bitmask width).
const MAX_SET: usize = 64;
/// Longest enum value or tool name (JSON-encoded) the grammar matches;
/// object keys must be shorter than half of it (escapes may double them).
const MAX_LITERAL: usize = 250;
/// Schemas deeper than this compile to "any value".
const MAX_SCHEMA_DEPTH: usize = 8;

pub(crate) type NodeId = u16;

/// The node that accepts any JSON value.
pub(crate) const ANY: NodeId = 0;
/// The node that accepts `true`, `false` or `null` (used inside "any").
pub(crate) const KEYWORDS: NodeId = 1;
/// The node of a string without length limits (keys and strings of "any").
pub(crate) const STRING: NodeId = 2;
/// The node of an array of any values (inside "any").
pub(crate) const ANY_ARRAY: NodeId = 3;
/// The node of a number without bounds (inside "any").
pub(crate) const NUMBER: NodeId = 4;
/// The node no value fits (an unsatisfiable schema).
const NEVER: NodeId = 5;

#[derive(Debug, Clone)]
pub(crate) enum Node {
    Any,
    /// No value: keys whose schema compiles to this are never offered.
    Never,
    Object {
        props: Vec<(Vec<u8>, NodeId)>,
        required: u64,
    },
    Array {
        items: NodeId,
        min: u32,
        max: u32,
    },
    /// Length limits in characters (Unicode scalar values); `u32::MAX` is
    /// no upper limit.
    String {
        min: u32,
        max: u32,
    },
    Number {
        integer: bool,
        bounds: Option<Bounds>,
    },
    Literals(Vec<Vec<u8>>),
    OneOf(Vec<NodeId>),
    /// A grounded path: one of the candidates in `Grammar::tries[i]`.
    PathTrie(u16),
    /// A path that may be new: working-tree syntax only (`grammar/path.rs`).
    PathSyntax,
}

/// A compiled set of offered tools: names and argument schemas.
#[derive(Debug, Clone)]
pub struct Grammar {
    nodes: Vec<Node>,
    /// Node of the tool-name literal set (quoted names).
    pub(crate) names: NodeId,
    /// The argument schema node of each tool, in offer order.
    pub(crate) tool_args: Vec<NodeId>,
    /// Tool names, in offer order.
    tool_names: Vec<String>,
    /// Candidate tries of grounded path parameters (`Node::PathTrie`).
    pub(crate) tries: Vec<Trie>,
    /// Whether the answer must be a tool call (no plain text).
    pub(crate) call_only: bool,
    /// The existing paths grounded parameters may name, while compiling
    /// (`None`: not known, such parameters get path syntax only).
    candidates: Option<PathCandidates>,
}

/// A count keyword (`minLength`, `maxItems`…) as core reads it (`as_u64`),
/// saturated to `u32`.
fn count(obj: &Map<String, Value>, key: &str) -> Option<u32> {
    obj.get(key).and_then(Value::as_u64).map(|n| u32::try_from(n).unwrap_or(u32::MAX))
}

impl Grammar {
    /// Compile the grammar for these tools: `(name, input_schema)` pairs.
    /// A tool whose schema no arguments can satisfy (say `minimum` above
    /// `maximum` on a required property) is left out: it cannot be called.
    pub fn new<'a>(tools: impl IntoIterator<Item = (&'a str, &'a Value)>) -> Self {
        Self::with_paths(tools, None)
    }

    /// Compile the grammar for these tools with grounded path parameters:
    /// a string marked `"format": "path"` with `"x-exists"` may only be one
    /// of `candidates` of that kind (a required one with no candidate makes
    /// its tool uncallable, so it is not offered). Without candidates such
    /// parameters get the path syntax of write tools.
    pub fn with_paths<'a>(
        tools: impl IntoIterator<Item = (&'a str, &'a Value)>,
        candidates: Option<&PathCandidates>,
    ) -> Self {
        let mut g = Grammar {
            nodes: vec![
                Node::Any,
                Node::Literals(vec![b"true".to_vec(), b"false".to_vec(), b"null".to_vec()]),
                Node::String { min: 0, max: u32::MAX },
                Node::Array { items: ANY, min: 0, max: u32::MAX },
                Node::Number { integer: false, bounds: None },
                Node::Never,
            ],
            names: 0,
            tool_args: Vec::new(),
            tool_names: Vec::new(),
            tries: Vec::new(),
            call_only: false,
            candidates: candidates.cloned(),
        };
        let mut names = Vec::new();
        for (name, schema) in tools.into_iter().filter(|(n, _)| n.len() < MAX_LITERAL / 2) {
            if g.tool_names.len() == MAX_SET || g.tool_names.iter().any(|n| n == name) {
                continue;
            }
            let args = g.compile_object_root(schema);
            if args == NEVER {
                continue;
            }
            names.push(serde_json::to_vec(name).unwrap_or_default());
            g.tool_names.push(name.to_string());
            g.tool_args.push(args);
        }
        g.names = g.push(Node::Literals(names));
        g.candidates = None;
        g
    }

    /// The node of a string marked `"format": "path"`, `None` to compile it
    /// as a plain string (a new path with length limits).
    fn compile_path(&mut self, obj: &Map<String, Value>) -> Option<NodeId> {
        let kind = match obj.get("x-exists") {
            Some(Value::Bool(true)) => Some(PathKind::Any),
            Some(Value::String(k)) if k == "any" => Some(PathKind::Any),
            Some(Value::String(k)) if k == "file" => Some(PathKind::File),
            Some(Value::String(k)) if k == "directory" => Some(PathKind::Directory),
            _ => None,
        };
        if let (Some(kind), Some(candidates)) = (kind, &self.candidates) {
            // Only candidates core's check accepts (lengths, enum…).
            let schema = Value::Object(obj.clone());
            let paths: Vec<&str> = candidates
                .of_kind(kind)
                .into_iter()
                .filter(|p| cairn_core::schema::validate(&schema, &Value::String((*p).to_string())).is_ok())
                .collect();
            let trie = Trie::new(paths);
            if trie.is_empty() || self.tries.len() >= usize::from(u16::MAX) {
                return Some(NEVER);
            }
            self.tries.push(trie);
            let id = (self.tries.len() - 1) as u16;
            return Some(self.push(Node::PathTrie(id)));
        }
        let limited = obj.contains_key("minLength") || obj.contains_key("maxLength");
        (!limited).then(|| self.push(Node::PathSyntax))
    }

    /// Require the answer to be a tool call: plain text is refused. Has no
    /// effect when no tool can be called.
    pub fn require_call(mut self) -> Self {
        self.call_only = !self.tool_names.is_empty();
        self
    }

    /// The offered tool names that can be called, in order.
    pub fn tool_names(&self) -> &[String] {
        &self.tool_names
    }

    fn push(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        (self.nodes.len() - 1) as NodeId
    }

    pub(crate) fn node(&self, id: NodeId) -> &Node {
        self.nodes.get(id as usize).unwrap_or(&Node::Any)
    }

    /// Arguments are always an object: a schema that is not one still yields
    /// an object (any object when nothing more is known).
    fn compile_object_root(&mut self, schema: &Value) -> NodeId {
        let id = self.compile(schema, 0);
        match self.node(id) {
            Node::Object { .. } | Node::Never => id,
            Node::OneOf(alts) if alts.as_slice() == [ANY] => id,
            _ => self.any_object(),
        }
    }

    fn any_object(&mut self) -> NodeId {
        // "Any object": a OneOf holding only Any, which the dispatch in
        // `Value` frames restricts to `{` (type lists never hold Any).
        self.push(Node::OneOf(vec![ANY]))
    }

    fn compile(&mut self, schema: &Value, depth: usize) -> NodeId {
        let obj = match schema {
            Value::Object(obj) => obj,
            Value::Bool(false) => return NEVER,
            _ => return ANY,
        };
        if depth >= MAX_SCHEMA_DEPTH {
            return ANY;
        }
        if let Some(c) = obj.get("const") {
            return self.literals(std::slice::from_ref(c), schema);
        }
        if let Some(Value::Array(values)) = obj.get("enum") {
            return self.literals(values, schema);
        }
        const ALL_TYPES: [&str; 6] = ["null", "boolean", "number", "string", "array", "object"];
        // Keywords core applies to values of one type only.
        const TYPED_KEYWORDS: [&str; 10] = [
            "minimum",
            "maximum",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "minLength",
            "maxLength",
            "minItems",
            "maxItems",
            "required",
            "additionalProperties",
        ];
        let types: Vec<&str> = match obj.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(types)) => types.iter().filter_map(Value::as_str).collect(),
            _ if obj.contains_key("properties") => vec!["object"],
            _ if obj.contains_key("items") => vec!["array"],
            // Limits without a type still bind the values they apply to.
            _ if TYPED_KEYWORDS.iter().any(|k| obj.contains_key(*k)) => ALL_TYPES.to_vec(),
            _ => return ANY,
        };
        let has_number = types.contains(&"number");
        let mut alts = Vec::new();
        for t in types {
            if t == "integer" && has_number {
                continue;
            }
            match self.compile_type(t, obj, depth) {
                // Core's check knows no other type: it refuses every value.
                None | Some(NEVER) => {}
                Some(id) => alts.push(id),
            }
        }
        match alts.as_slice() {
            [] => NEVER,
            [one] => *one,
            _ => {
                // "Any object" goes last: the dispatch tries alternatives in
                // order and it would take every first byte.
                alts.sort_by_key(|&id| matches!(self.node(id), Node::OneOf(a) if a.as_slice() == [ANY]));
                self.push(Node::OneOf(alts))
            }
        }
    }

    /// The node of one `type` name with the schema's keywords, `None` for an
    /// unknown type name.
    fn compile_type(&mut self, t: &str, obj: &Map<String, Value>, depth: usize) -> Option<NodeId> {
        Some(match t {
            "string" => {
                let min = count(obj, "minLength").unwrap_or(0);
                let max = count(obj, "maxLength").unwrap_or(u32::MAX);
                if min > max {
                    return Some(NEVER);
                }
                if obj.get("format").and_then(Value::as_str) == Some("path")
                    && !obj.contains_key("enum")
                    && let Some(id) = self.compile_path(obj)
                {
                    return Some(id);
                }
                self.push(Node::String { min, max })
            }
            "integer" | "number" => {
                let integer = t == "integer";
                let bounds = Bounds::of(obj);
                if bounds.is_some_and(|b| !number::Prefix::START.feasible(integer, &b)) {
                    return Some(NEVER);
                }
                self.push(Node::Number { integer, bounds })
            }
            "boolean" => self.push(Node::Literals(vec![b"true".to_vec(), b"false".to_vec()])),
            "null" => self.push(Node::Literals(vec![b"null".to_vec()])),
            "array" => {
                let items = obj.get("items").map_or(ANY, |s| self.compile(s, depth + 1));
                let min = count(obj, "minItems").unwrap_or(0);
                let mut max = count(obj, "maxItems").unwrap_or(u32::MAX);
                if items == NEVER {
                    max = 0;
                }
                if min > max {
                    return Some(NEVER);
                }
                self.push(Node::Array { items, min, max })
            }
            "object" => self.compile_object(obj, depth),
            _ => return None,
        })
    }

    fn compile_object(&mut self, obj: &Map<String, Value>, depth: usize) -> NodeId {
        let no_props = Map::new();
        let props = match obj.get("properties").and_then(Value::as_object) {
            Some(props) => props,
            // Keys are still known: the required ones, or none at all.
            None if obj.contains_key("required") || obj.get("additionalProperties") == Some(&Value::Bool(false)) => {
                &no_props
            }
            None => return self.any_object(),
        };
        let required: Vec<&str> = obj
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        // A required key that is not declared takes the schema core applies
        // to it: `additionalProperties` (absent means any value).
        let extra = obj.get("additionalProperties").unwrap_or(&Value::Bool(true));
        let mut keys: Vec<(&str, &Value)> = props.iter().map(|(k, v)| (k.as_str(), v)).collect();
        for key in &required {
            if !props.contains_key(*key) && !keys.iter().any(|(k, _)| k == key) {
                keys.push((key, extra));
            }
        }
        if keys.len() > MAX_SET || keys.iter().any(|(k, _)| k.len() >= MAX_LITERAL / 2) {
            return self.any_object();
        }
        let mut compiled = Vec::new();
        let mut mask = 0u64;
        for (key, sub) in keys {
            let node = self.compile(sub, depth + 1);
            if node == NEVER {
                if required.contains(&key) {
                    return NEVER;
                }
                // No value fits: the key is never offered.
                continue;
            }
            if required.contains(&key) {
                mask |= 1 << compiled.len();
            }
            let encoded = serde_json::to_vec(key).unwrap_or_default();
            // Strip the quotes: keys are matched between them.
            let inner = encoded.get(1..encoded.len().saturating_sub(1)).unwrap_or_default().to_vec();
            compiled.push((inner, node));
        }
        self.push(Node::Object { props: compiled, required: mask })
    }

    /// An `enum`/`const` set: the values core's check accepts under the
    /// whole schema (so `type`, lengths and ranges filter it too).
    fn literals(&mut self, values: &[Value], schema: &Value) -> NodeId {
        if values.is_empty() || values.len() > MAX_SET {
            return if values.is_empty() { NEVER } else { ANY };
        }
        let lits: Vec<Vec<u8>> = values
            .iter()
            .filter(|v| cairn_core::schema::validate(schema, v).is_ok())
            .map(|v| serde_json::to_vec(v).unwrap_or_default())
            .collect();
        if lits.is_empty() {
            return NEVER;
        }
        // Match positions are counted in a byte.
        if lits.iter().any(|l| l.len() > MAX_LITERAL) {
            return ANY;
        }
        self.push(Node::Literals(lits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ground::PathCandidates;
    use serde_json::json;

    fn tools() -> Grammar {
        let read = json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]});
        let list = json!({"type": "object", "properties": {"path": {"type": "string"}}});
        let shell = json!({"type": "object", "properties": {
            "command": {"type": "string"},
            "timeout": {"type": "integer"},
            "mode": {"enum": ["fast", "slow"]},
            "env": {"type": "array", "items": {"type": "string"}},
            "ratio": {"type": ["number", "null"]},
            "dry": {"type": "boolean"},
            "extra": {}
        }, "required": ["command"]});
        Grammar::new([("read_file", &read), ("list_dir", &list), ("shell", &shell)])
    }

    fn accepts(g: &Grammar, text: &str) -> Option<State> {
        let mut s = State::new();
        if s.feed_all(g, text.as_bytes()) { Some(s) } else { None }
    }

    fn complete(g: &Grammar, text: &str) -> bool {
        accepts(g, text).is_some_and(|s| s.mode() == Mode::Done)
    }

    #[test]
    fn accepts_valid_calls() {
        let g = tools();
        for ok in [
            r#"{"name": "read_file", "arguments": {"path": "src/main.rs"}}"#,
            r#"{"name":"list_dir","arguments":{}}"#,
            r#"{"name": "shell", "arguments": {"command": "ls -la \"x\" \u00e9", "timeout": 30}}"#,
            r#"{"name": "shell", "arguments": {"timeout": -0, "command": "x", "mode": "slow", "env": ["A", "B"]}}"#,
            r#"{"name": "shell", "arguments": {"command": "x", "ratio": 1.5e-3, "dry": false, "extra": {"a": [1, null]}}}"#,
            r#"{"name": "shell", "arguments": {"command": "x", "ratio": null, "env": []}}"#,
            " {\"name\": \"list_dir\", \"arguments\": {\"path\": \"é✓\"}}",
        ] {
            assert!(complete(&g, ok), "should accept {ok}");
        }
    }

    #[test]
    fn refuses_invalid_calls() {
        let g = tools();
        for bad in [
            r#"{"name": "write_file""#,
            r#"{"name": "read_file", "arguments": {}}"#,
            r#"{"name": "read_file", "arguments": {"path": 3}}"#,
            r#"{"name": "read_file", "arguments": {"file": "x"}}"#,
            r#"{"name": "read_file", "arguments": {"path": "x", "path": "y"}}"#,
            r#"{"name": "shell", "arguments": {"command": "x", "timeout": 1.5}}"#,
            r#"{"name": "shell", "arguments": {"command": "x", "mode": "medium"}}"#,
            r#"{"name": "shell", "arguments": {"command": "x", "env": [1]}}"#,
            r#"{"name": "shell", "arguments": {"command": "a\qb"}}"#,
            "{\"name\": \"shell\", \"arguments\": {\"command\": \"a\nb\"}}",
            r#"{"arguments": {}, "name": "shell"}"#,
            r#"{"name": "list_dir", "arguments": {}}}"#,
            r#"{"name": "list_dir", "arguments": {}} "#,
            r#"{"name":  "list_dir""#,
            r#"{"name": "list_dir", "arguments": {"path": "a",}}"#,
            r#"{"name": "shell", "arguments": {"command": "x", "timeout": 01}}"#,
        ] {
            assert!(accepts(&g, bad).is_none(), "should refuse {bad}");
        }
    }

    #[test]
    fn a_required_call_refuses_text() {
        let g = tools().require_call();
        assert!(accepts(&g, "The answer").is_none());
        assert!(accepts(&g, " T").is_none());
        assert!(complete(&g, r#"{"name": "list_dir", "arguments": {}}"#));
        // Nothing callable: text stays allowed (no dead end).
        let none = Grammar::new(std::iter::empty()).require_call();
        assert!(accepts(&none, "Hi").is_some());
    }

    #[test]
    fn text_is_unconstrained_and_can_end() {
        let g = tools();
        let s = accepts(&g, "Hello {\"name\": whatever").unwrap();
        assert_eq!(s.mode(), Mode::Text);
        assert!(s.can_end());
        assert!(!State::new().can_end());
        let s = accepts(&g, "{\"name\": \"shell\"").unwrap();
        assert!(!s.can_end());
        assert_eq!(s.mode(), Mode::Call);
    }

    #[test]
    fn records_the_tool_once_the_name_is_complete() {
        let g = tools();
        let s = accepts(&g, r#"{"name": "shell""#).unwrap();
        assert_eq!(s.tool(), None, "the literal completes on the next byte");
        let s = accepts(&g, r#"{"name": "shell","#).unwrap();
        assert_eq!(s.tool(), Some(2));
        assert_eq!(g.tool_names()[2], "shell");
    }

    #[test]
    fn free_string_state_is_detected() {
        let g = tools();
        let s = accepts(&g, r#"{"name": "shell", "arguments": {"command": "ab"#).unwrap();
        assert!(s.in_free_string());
        let s = accepts(&g, r#"{"name": "shell", "arguments": {"command": "ab\"#).unwrap();
        assert!(!s.in_free_string());
    }

    #[test]
    fn numbers_are_bounded() {
        let g = tools();
        let long = format!(r#"{{"name": "shell", "arguments": {{"command": "x", "timeout": {}"#, "9".repeat(30));
        assert!(accepts(&g, &long).is_none());
    }

    #[test]
    fn schema_without_properties_accepts_any_object_arguments() {
        let any = json!({"type": "object"});
        let none = json!(true);
        let g = Grammar::new([("a", &any), ("b", &none)]);
        assert!(complete(&g, r#"{"name": "a", "arguments": {"x": [1, {"y": "z"}], "k": true}}"#));
        assert!(complete(&g, r#"{"name": "b", "arguments": {}}"#));
        assert!(accepts(&g, r#"{"name": "a", "arguments": ["#).is_none());
        assert!(accepts(&g, r#"{"name": "b", "arguments": 3"#).is_none());
    }

    #[test]
    fn oversized_literals_fall_back_to_any_value() {
        let long = "x".repeat(300);
        let schema = json!({"type": "object", "properties": {"v": {"enum": [long.clone()]}}, "required": ["v"]});
        let g = Grammar::new([("a", &schema)]);
        let call = format!(r#"{{"name": "a", "arguments": {{"v": "{long}"}}}}"#);
        assert!(complete(&g, &call));
        assert!(complete(&g, r#"{"name": "a", "arguments": {"v": 1}}"#), "any value is accepted instead");
    }

    #[test]
    fn no_tools_means_text_that_does_not_start_with_a_brace() {
        let g = Grammar::new(std::iter::empty());
        assert!(accepts(&g, " {").is_none());
        assert!(accepts(&g, "{").is_none());
        let s = accepts(&g, "Sure {x}").unwrap();
        assert_eq!(s.mode(), Mode::Text);
    }

    #[test]
    fn nesting_is_bounded() {
        let any = json!({"type": "object"});
        let g = Grammar::new([("a", &any)]);
        let deep = format!(r#"{{"name": "a", "arguments": {{"x": {}"#, "[".repeat(40));
        assert!(accepts(&g, &deep).is_none());
    }

    fn one_tool(args: Value) -> Grammar {
        Grammar::new([("t", &args)])
    }

    fn call(args: &str) -> String {
        format!(r#"{{"name": "t", "arguments": {args}}}"#)
    }

    /// Every call the grammar completes passes core's check; every refused
    /// one is refused by core too (the cases are chosen so the grammar's
    /// narrowing does not show).
    fn agrees(schema: &Value, args: &str, expect: bool) {
        let g = one_tool(schema.clone());
        let got = complete(&g, &call(args));
        assert_eq!(got, expect, "grammar on {args} under {schema}");
        if let Ok(value) = serde_json::from_str::<Value>(args) {
            assert_eq!(cairn_core::schema::validate(schema, &value).is_ok(), expect, "core on {args}");
        }
    }

    #[test]
    fn integer_ranges_are_enforced() {
        // The shape of cairn's read_file: `{"offset": 0}` must be refused.
        let read = json!({"type": "object", "properties": {
            "path": {"type": "string", "minLength": 1},
            "offset": {"type": "integer", "minimum": 1},
            "limit": {"type": "integer", "minimum": 1}
        }, "required": ["path"]});
        agrees(&read, r#"{"path": "a", "offset": 0}"#, false);
        agrees(&read, r#"{"path": "a", "offset": -3}"#, false);
        agrees(&read, r#"{"path": "", "offset": 1}"#, false);
        agrees(&read, r#"{"path": "a", "offset": 1, "limit": 250}"#, true);
        let g = one_tool(read);
        assert!(accepts(&g, r#"{"name": "t", "arguments": {"offset": 0"#).is_none(), "refused at the 0 itself");
        assert!(accepts(&g, r#"{"name": "t", "arguments": {"offset": -"#).is_none());
        let range = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": -5, "maximum": 12}}});
        for ok in ["-5", "-1", "0", "-0", "9", "10", "12"] {
            agrees(&range, &format!(r#"{{"n": {ok}}}"#), true);
        }
        for bad in ["-6", "-10", "13", "120", "100"] {
            agrees(&range, &format!(r#"{{"n": {bad}}}"#), false);
        }
        let open = json!({"type": "object", "properties": {"n": {"type": "integer", "exclusiveMinimum": -2, "exclusiveMaximum": 3}}});
        for (n, ok) in [("-2", false), ("-1", true), ("2", true), ("3", false)] {
            agrees(&open, &format!(r#"{{"n": {n}}}"#), ok);
        }
    }

    #[test]
    fn number_ranges_are_enforced() {
        // The shape of cairn's shell timeout.
        let shell = json!({"type": "object", "properties": {"timeout": {"type": "number", "exclusiveMinimum": 0}}});
        for (n, ok) in [("0", false), ("0.0", false), ("-1", false), ("0.5", true), ("30", true), ("1e3", false)] {
            let g = one_tool(shell.clone());
            assert_eq!(complete(&g, &call(&format!(r#"{{"timeout": {n}}}"#))), ok, "timeout {n}");
        }
        let unit = json!({"type": "object", "properties": {"p": {"type": "number", "minimum": 0.25, "exclusiveMaximum": 0.3}}});
        for (n, ok) in [("0.25", true), ("0.2999", true), ("0.3", false), ("0.24", false), ("0", false), ("1", false)] {
            agrees(&unit, &format!(r#"{{"p": {n}}}"#), ok);
        }
    }

    #[test]
    fn string_lengths_count_decoded_characters() {
        let s = json!({"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 3}}});
        for (text, ok) in [
            (r#""ab""#, true),
            (r#""abc""#, true),
            (r#""abcd""#, false),
            (r#""a""#, false),
            (r#""""#, false),
            ("\"é✓😀\"", true),
            ("\"é✓😀x\"", false),
            (r#""\n\t""#, true),
            (r#""\u00e9\ud83d\ude00b""#, true),
            (r#""\u00e9\ud83d\ude00bc""#, false),
            (r#""\ud83d\ude00""#, false),
        ] {
            agrees(&s, &format!(r#"{{"s": {text}}}"#), ok);
        }
    }

    #[test]
    fn strings_are_what_serde_json_decodes() {
        let g = tools();
        let prefix = br#"{"name": "list_dir", "arguments": {"path": ""#;
        for bad in [
            &b"\\ud800\""[..],
            b"\\udc00",
            b"\\ud800\\u0041",
            b"\\ud800x",
            b"\xc3\"",
            b"\xc0\x80",
            b"\xed\xa0\x80",
            b"\xf4\x90\x80\x80",
            b"\xff",
            b"\x80",
        ] {
            let mut s = State::new();
            let text = [&prefix[..], bad].concat();
            assert!(!s.feed_all(&g, &text), "should refuse {}", String::from_utf8_lossy(bad));
        }
        assert!(complete(&g, r#"{"name": "list_dir", "arguments": {"path": "\uD83D\uDE00 \u00E9"}}"#));
    }

    #[test]
    fn enums_keep_only_values_the_schema_allows() {
        let schema = json!({"type": "object", "properties": {
            "e": {"type": "string", "enum": ["a", 1, "bcd", null], "maxLength": 2}
        }, "required": ["e"]});
        agrees(&schema, r#"{"e": "a"}"#, true);
        agrees(&schema, r#"{"e": 1}"#, false);
        agrees(&schema, r#"{"e": "bcd"}"#, false);
        agrees(&schema, r#"{"e": null}"#, false);
    }

    #[test]
    fn item_counts_are_enforced() {
        let schema = json!({"type": "object", "properties": {
            "v": {"type": "array", "items": {"type": "integer", "maximum": 5}, "minItems": 1, "maxItems": 2}
        }});
        for (v, ok) in [("[]", false), ("[1]", true), ("[1, 2]", true), ("[1, 2, 3]", false), ("[6]", false)] {
            agrees(&schema, &format!(r#"{{"v": {v}}}"#), ok);
        }
    }

    #[test]
    fn unsatisfiable_parts_are_never_entered() {
        let schema = json!({"type": "object", "properties": {
            "bad": {"type": "integer", "minimum": 3, "maximum": 2},
            "none": {"type": "string", "minLength": 5, "maxLength": 1},
            "empty": {"type": "array", "items": false},
            "ok": {"type": "boolean"}
        }});
        let g = one_tool(schema);
        assert!(accepts(&g, r#"{"name": "t", "arguments": {"b"#).is_none());
        assert!(accepts(&g, r#"{"name": "t", "arguments": {"n"#).is_none());
        assert!(complete(&g, r#"{"name": "t", "arguments": {"empty": [], "ok": true}}"#));
        assert!(accepts(&g, r#"{"name": "t", "arguments": {"empty": [1"#).is_none());
        let dead = json!({"type": "object", "properties": {"x": {"enum": []}}, "required": ["x"]});
        let live = json!({"type": "object"});
        let g = Grammar::new([("dead", &dead), ("live", &live)]);
        assert_eq!(g.tool_names(), ["live"], "a tool that cannot be called is not offered");
    }

    #[test]
    fn required_keys_outside_properties_are_produced() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "null"}},
            "required": ["a", "b"], "additionalProperties": {"type": "integer", "minimum": 1}});
        agrees(&schema, r#"{"a": null}"#, false);
        agrees(&schema, r#"{"a": null, "b": 0}"#, false);
        agrees(&schema, r#"{"b": 2, "a": null}"#, true);
        let closed = json!({"type": "object", "additionalProperties": false});
        agrees(&closed, "{}", true);
        agrees(&closed, r#"{"x": 1}"#, false);
    }

    #[test]
    fn limits_without_a_type_bind_their_type() {
        let schema = json!({"type": "object", "properties": {"v": {"minimum": 2, "maxLength": 1}}, "required": ["v"]});
        for (v, ok) in [("1", false), ("2", true), (r#""ab""#, false), (r#""a""#, true), ("null", true), ("[1]", true)]
        {
            agrees(&schema, &format!(r#"{{"v": {v}}}"#), ok);
        }
    }

    /// Bytes tried at each step of a random walk: printable ASCII, the
    /// bytes of some multi-byte characters, and some that are never valid.
    fn candidate_bytes() -> Vec<u8> {
        let mut bytes: Vec<u8> = (0x20..0x7f).collect();
        bytes.extend_from_slice(b"\n\t\x00\x7f\xc3\xa9\xe2\x9c\x93\xf0\x9f\x98\x80\xed\xa0\xc0\xf5\xff");
        bytes
    }

    /// Walk the grammar byte by byte, picking among the allowed bytes (with a
    /// lean towards closing structure so walks end), and return the finished
    /// call. Panics on a dead end: a state with no allowed byte.
    fn random_walk(g: &Grammar, rng: &mut u64, max_bytes: usize) -> Option<Vec<u8>> {
        let mut next = |n: usize| {
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            (*rng % n as u64) as usize
        };
        let candidates = candidate_bytes();
        let mut state = State::new();
        let mut out = vec![b'{'];
        assert!(state.feed(g, b'{'));
        while out.len() < max_bytes {
            let allowed: Vec<u8> = candidates.iter().copied().filter(|&b| state.clone().feed(g, b)).collect();
            assert!(!allowed.is_empty(), "dead end after {}", String::from_utf8_lossy(&out));
            let closing: Vec<u8> = allowed.iter().copied().filter(|b| b"\"}],".contains(b)).collect();
            let pick = if !closing.is_empty() && next(3) == 0 {
                closing[next(closing.len())]
            } else {
                allowed[next(allowed.len())]
            };
            assert!(state.feed(g, pick));
            out.push(pick);
            if state.mode() == Mode::Done {
                return Some(out);
            }
        }
        None
    }

    fn check_walks(tools: &[(&str, &Value)], seed: u64, walks: usize) -> usize {
        let g = Grammar::new(tools.iter().copied());
        if g.tool_names().is_empty() {
            return 0;
        }
        let mut rng = seed | 1;
        let mut finished = 0;
        for _ in 0..walks {
            let Some(out) = random_walk(&g, &mut rng, 600) else { continue };
            finished += 1;
            let text = String::from_utf8_lossy(&out);
            let call: Value = serde_json::from_slice(&out).unwrap_or_else(|e| panic!("{text} does not parse: {e}"));
            let name = call["name"].as_str().unwrap_or_default();
            let (_, schema) =
                tools.iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("unknown tool in {text}"));
            if let Err(e) = cairn_core::schema::validate(schema, &call["arguments"]) {
                panic!("core refuses {text} under {schema}: {e}");
            }
        }
        finished
    }

    #[test]
    fn random_walks_over_hostile_schemas_pass_core() {
        let hostile = json!({"type": "object", "properties": {
            "offset": {"type": "integer", "minimum": 1},
            "neg": {"type": "integer", "minimum": -20, "exclusiveMaximum": -3},
            "huge": {"type": "integer", "maximum": 1e300, "minimum": 9_007_199_254_740_993u64},
            "t": {"type": "number", "exclusiveMinimum": 0, "maximum": 0.5},
            "f": {"type": ["number", "null"], "minimum": -0.1, "maximum": 0.1},
            "s": {"type": "string", "minLength": 2, "maxLength": 4},
            "e": {"enum": ["x", 2, 2.5, [1], {"k": null}, "long"], "maxLength": 3, "maximum": 2},
            "a": {"type": "array", "items": {"type": "string", "maxLength": 1}, "minItems": 2, "maxItems": 3},
            "o": {"required": ["q"], "additionalProperties": {"type": "integer", "maximum": 0}},
            "u": {"minimum": 5, "minLength": 1, "maxItems": 1},
            "any": {}
        }, "required": ["offset", "s", "a", "o"]});
        let read =
            json!({"type": "object", "properties": {"path": {"type": "string", "minLength": 1}}, "required": ["path"]});
        let tools = [("hostile", &hostile), ("read", &read)];
        let finished = check_walks(&tools, 0x9E37_79B9_7F4A_7C15, 300);
        assert!(finished >= 150, "only {finished} of 300 walks finished");
    }

    /// The built-in tools' path parameters, as `cairn-tools` marks them.
    fn path_tools() -> Vec<(&'static str, Value)> {
        vec![
            (
                "read_file",
                json!({"type": "object", "properties": {
                    "path": {"type": "string", "format": "path", "x-exists": "file"},
                    "offset": {"type": "integer", "minimum": 1}
                }, "required": ["path"], "additionalProperties": false}),
            ),
            (
                "list_dir",
                json!({"type": "object", "properties": {
                    "path": {"type": "string", "format": "path", "x-exists": "directory"}
                }, "additionalProperties": false}),
            ),
            (
                "search",
                json!({"type": "object", "properties": {
                    "pattern": {"type": "string"},
                    "path": {"type": "string", "format": "path", "x-exists": true}
                }, "required": ["pattern"], "additionalProperties": false}),
            ),
            (
                "write_file",
                json!({"type": "object", "properties": {
                    "path": {"type": "string", "format": "path"},
                    "content": {"type": "string"}
                }, "required": ["path", "content"], "additionalProperties": false}),
            ),
        ]
    }

    /// A small working tree with awkward names.
    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for d in ["docs", "docs/old", "src", "ab"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        for f in [
            "notes.txt",
            "notes.txt.bak",
            "todo.md",
            "docs/a.md",
            "docs/old/b.md",
            "src/main.rs",
            "a",
            "ab/c",
            "q\"uote.txt",
            "é.txt",
        ] {
            std::fs::write(root.join(f), "x").unwrap();
        }
        std::os::unix::fs::symlink("/etc/passwd", root.join("passwd")).unwrap();
        dir
    }

    #[test]
    fn grounded_paths_exist_on_every_random_walk() {
        let dir = tree();
        let root = dir.path();
        let candidates = PathCandidates::scan(root, &["notes.txt".to_string(), "nothere.txt".to_string()]);
        let tools = path_tools();
        let g = Grammar::with_paths(tools.iter().map(|(n, s)| (*n, s)), Some(&candidates));
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut seen = std::collections::HashSet::new();
        let mut finished = 0;
        for _ in 0..2000 {
            let Some(out) = random_walk(&g, &mut rng, 400) else { continue };
            finished += 1;
            let call: Value = serde_json::from_slice(&out).unwrap();
            let name = call["name"].as_str().unwrap();
            let (_, schema) = tools.iter().find(|(n, _)| *n == name).unwrap();
            cairn_core::schema::validate(schema, &call["arguments"]).unwrap();
            let Some(path) = call["arguments"]["path"].as_str() else { continue };
            // The oracle is the file system itself, not the candidate list.
            let meta = std::fs::symlink_metadata(root.join(path));
            match name {
                "read_file" => assert!(meta.is_ok_and(|m| m.is_file()), "read_file of {path:?} is not a file"),
                "list_dir" => assert!(meta.is_ok_and(|m| m.is_dir()), "list_dir of {path:?} is not a directory"),
                "search" => assert!(meta.is_ok_and(|m| !m.is_symlink()), "search in {path:?} does not exist"),
                _ => {
                    assert!(!path.is_empty() && !path.starts_with('/'), "{path:?}");
                    assert!(path.split('/').all(|c| !c.is_empty() && c != "." && c != ".."), "{path:?}");
                    continue;
                }
            }
            seen.insert((name.to_string(), path.to_string()));
        }
        assert!(finished >= 1000, "only {finished} walks finished");
        // Walks reach every candidate, the awkward ones included.
        for f in ["notes.txt", "notes.txt.bak", "a", "ab/c", "q\"uote.txt", "é.txt", "docs/old/b.md"] {
            assert!(seen.contains(&("read_file".to_string(), f.to_string())), "never read {f}: {seen:?}");
        }
        assert!(seen.contains(&("list_dir".to_string(), ".".to_string())));
        assert!(!seen.iter().any(|(_, p)| p == "passwd" || p == "nothere.txt"));
    }

    #[test]
    fn grounded_prefixes_are_refused_at_the_first_wrong_byte() {
        let candidates = PathCandidates::from_lists(vec!["notes.txt".into()], vec![".".into()]);
        let tools = path_tools();
        let g = Grammar::with_paths(tools.iter().map(|(n, s)| (*n, s)), Some(&candidates));
        let read = r#"{"name": "read_file", "arguments": {"path": ""#;
        assert!(accepts(&g, &format!("{read}notes")).is_some());
        assert!(accepts(&g, &format!("{read}l")).is_none(), "launch.txt does not exist");
        assert!(accepts(&g, &format!("{read}notes.txt\"")).is_some());
        assert!(accepts(&g, &format!("{read}notes.tx\"")).is_none(), "a prefix is not a path");
        assert!(accepts(&g, &format!("{read}notes.txt2")).is_none());
        assert!(accepts(&g, &format!("{read}\\u006eotes.txt")).is_none(), "no alternative spellings");
        // No file at all: read_file cannot be called, list_dir still can.
        let empty = PathCandidates::from_lists(vec![], vec![".".into()]);
        let g = Grammar::with_paths(tools.iter().map(|(n, s)| (*n, s)), Some(&empty));
        assert_eq!(g.tool_names(), ["list_dir", "search", "write_file"]);
        // Without candidates a grounded parameter gets path syntax only.
        let g = Grammar::new(tools.iter().map(|(n, s)| (*n, s)));
        assert!(complete(&g, r#"{"name": "read_file", "arguments": {"path": "any/name.txt"}}"#));
        assert!(accepts(&g, &format!("{read}/etc")).is_none());
        assert!(accepts(&g, &format!("{read}../")).is_none());
    }

    #[test]
    fn a_huge_directory_gives_a_bounded_grammar() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..100_000 {
            std::fs::File::create(dir.path().join(format!("f{i:06}.txt"))).unwrap();
        }
        let named = vec!["f099999.txt".to_string()];
        let c = PathCandidates::scan(dir.path(), &named);
        assert!(c.len() <= crate::ground::MAX_CANDIDATES, "{} candidates", c.len());
        assert!(c.truncated());
        assert_eq!(c.files().first().map(String::as_str), Some("f099999.txt"), "the named file comes first");
        let tools = path_tools();
        let g = Grammar::with_paths(tools.iter().map(|(n, s)| (*n, s)), Some(&c));
        let trie_nodes: usize = g.tries.iter().map(|t| t.len()).sum();
        assert!(trie_nodes <= 3 * crate::ground::MAX_CANDIDATES * 12, "{trie_nodes} trie nodes");
        assert!(complete(&g, r#"{"name": "read_file", "arguments": {"path": "f099999.txt"}}"#));
    }

    fn any_schema() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let bound =
            prop_oneof![(-30i64..30).prop_map(|i| json!(i)), (-300i64..300).prop_map(|i| json!(i as f64 / 10.0)),];
        let opt = |key: &'static str, s: BoxedStrategy<Value>| {
            proptest::option::weighted(0.4, s).prop_map(move |v| v.map(|v| (key.to_owned(), v)))
        };
        let numeric = (
            prop_oneof![
                Just(json!("integer")),
                Just(json!("number")),
                Just(json!(["integer", "null"])),
                Just(Value::Null)
            ],
            opt("minimum", bound.clone().boxed()),
            opt("maximum", bound.clone().boxed()),
            opt("exclusiveMinimum", bound.clone().boxed()),
            opt("exclusiveMaximum", bound.boxed()),
        )
            .prop_map(|(t, a, b, c, d)| {
                let mut m = serde_json::Map::new();
                if !t.is_null() {
                    m.insert("type".into(), t);
                }
                m.extend([a, b, c, d].into_iter().flatten());
                Value::Object(m)
            });
        let count = || (0u64..5).prop_map(|n| json!(n)).boxed();
        let string = (opt("minLength", count()), opt("maxLength", count())).prop_map(|(a, b)| {
            let mut m = serde_json::Map::new();
            m.insert("type".into(), json!("string"));
            m.extend([a, b].into_iter().flatten());
            Value::Object(m)
        });
        let literal = prop_oneof![
            Just(json!("a")),
            Just(json!("abcdef")),
            Just(json!(0)),
            Just(json!(-7)),
            Just(json!(1.5)),
            Just(json!(null)),
            Just(json!(true)),
            Just(json!([1, "x"])),
        ];
        let enumeration = (
            proptest::collection::vec(literal, 0..4),
            prop_oneof![Just(None), Just(Some("string")), Just(Some("integer"))],
            opt("maxLength", count()),
            opt("minimum", (-5i64..5).prop_map(|i| json!(i)).boxed()),
        )
            .prop_map(|(values, t, len, min)| {
                let mut m = serde_json::Map::new();
                m.insert("enum".into(), Value::Array(values));
                if let Some(t) = t {
                    m.insert("type".into(), json!(t));
                }
                m.extend([len, min].into_iter().flatten());
                Value::Object(m)
            });
        let leaf = prop_oneof![numeric, string, enumeration, Just(json!({"type": "boolean"})), Just(json!({}))];
        leaf.prop_recursive(3, 24, 4, move |inner| {
            let keys = prop_oneof![Just("a"), Just("b"), Just("c"), Just("d")];
            prop_oneof![
                (
                    proptest::collection::btree_map(keys.clone(), inner.clone(), 0..4),
                    proptest::collection::btree_set(keys, 0..3),
                    prop_oneof![Just(None), Just(Some(json!(false))), inner.clone().prop_map(Some)],
                )
                    .prop_map(|(props, required, extra)| {
                        let mut m = serde_json::Map::new();
                        m.insert("type".into(), json!("object"));
                        m.insert("properties".into(), json!(props));
                        m.insert("required".into(), json!(required));
                        if let Some(extra) = extra {
                            m.insert("additionalProperties".into(), extra);
                        }
                        Value::Object(m)
                    }),
                (inner, opt("minItems", count()), opt("maxItems", count())).prop_map(|(items, a, b)| {
                    let mut m = serde_json::Map::new();
                    m.insert("type".into(), json!("array"));
                    m.insert("items".into(), items);
                    m.extend([a, b].into_iter().flatten());
                    Value::Object(m)
                }),
            ]
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(96))]
        /// Random schemas from the supported keywords, random walks through
        /// the grammar: no dead end, and every completed call passes core's
        /// check (the oracle shares no code with the grammar).
        #[test]
        fn completed_calls_pass_core(a in any_schema(), b in any_schema(), required in proptest::bool::ANY, seed in proptest::prelude::any::<u64>()) {
            let args = json!({"type": "object", "properties": {"x": a, "y": b},
                "required": if required { json!(["x", "y"]) } else { json!([]) }});
            check_walks(&[("t", &args)], seed, 6);
        }
    }
}
