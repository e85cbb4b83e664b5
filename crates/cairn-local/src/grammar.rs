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
//! - `type`: `object`, `array`, `string`, `integer`, `number`, `boolean`,
//!   `null`, and lists of these (`["string", "null"]`), told apart by their
//!   first byte.
//! - objects with `properties` (at most 64): only declared keys, each at most
//!   once, in any order; `}` is refused until every `required` key that is
//!   declared in `properties` is present; `,` is refused when no key is left.
//! - arrays: `items` with any supported schema (arrays of scalars, objects…).
//! - `enum` and `const` (at most 64 values of any JSON type): the value must
//!   be one of them, spelt as `serde_json` prints it.
//! - strings: any JSON string, escapes checked (`\uXXXX` included), raw
//!   control bytes refused. Integers: `-?(0|[1-9][0-9]*)`; numbers add a
//!   fraction and an exponent. At most 20 bytes per number.
//!
//! # Limits
//!
//! Everything else is *ignored*, so the grammar may accept arguments that a
//! full validator refuses: `pattern`, `format`, `minLength`/`maxLength`,
//! `minimum`/`maximum`, `minItems`/`maxItems`, `uniqueItems`,
//! `additionalProperties` (declared keys only, even when it is `true`),
//! `anyOf`/`oneOf`/`allOf`/`not`, `$ref`. An object schema without
//! `properties` (or with more than 64, or with a key of 125 bytes or more),
//! a missing or unknown `type`, an `enum` of more than 64 values or with a
//! value longer than 250 bytes, or one of the ignored combinators compiles
//! to "any JSON value" (still well-formed JSON, nesting at most
//! [`MAX_DEPTH`] deep). Schemas deeper than 8 levels become "any value"
//! below that depth. Only the first 64 offered tools (with names shorter
//! than 125 bytes) can be called.
//! Object keys and enum values are matched on their exact `serde_json`
//! spelling (no alternative escapes). Strings are checked byte by byte, so a
//! model that emits a broken UTF-8 sequence inside a string gets it replaced
//! by U+FFFD when decoded.
//!
//! This file compiles schemas into nodes; the byte-level machine that walks
//! them is `grammar/machine.rs` ([`State`]). Both must stay free of model and
//! tokenizer types: they see bytes. Token masking lives in `constrain.rs`.

use serde_json::Value;

mod machine;
pub use machine::{Mode, State};

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

#[derive(Debug, Clone)]
pub(crate) enum Node {
    Any,
    Object { props: Vec<(Vec<u8>, NodeId)>, required: u64 },
    Array { items: NodeId },
    String,
    Number { integer: bool },
    Literals(Vec<Vec<u8>>),
    OneOf(Vec<NodeId>),
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
}

impl Grammar {
    /// Compile the grammar for these tools: `(name, input_schema)` pairs.
    pub fn new<'a>(tools: impl IntoIterator<Item = (&'a str, &'a Value)>) -> Self {
        let mut g = Grammar {
            nodes: vec![Node::Any, Node::Literals(vec![b"true".to_vec(), b"false".to_vec(), b"null".to_vec()])],
            names: 0,
            tool_args: Vec::new(),
            tool_names: Vec::new(),
        };
        let mut names = Vec::new();
        for (name, schema) in tools.into_iter().filter(|(n, _)| n.len() < MAX_LITERAL / 2).take(MAX_SET) {
            if g.tool_names.iter().any(|n| n == name) {
                continue;
            }
            let args = g.compile_object_root(schema);
            names.push(serde_json::to_vec(name).unwrap_or_default());
            g.tool_names.push(name.to_string());
            g.tool_args.push(args);
        }
        g.names = g.push(Node::Literals(names));
        g
    }

    /// The offered tool names, in order.
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
            Node::Object { .. } => id,
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
        let Some(obj) = schema.as_object() else { return ANY };
        if depth >= MAX_SCHEMA_DEPTH {
            return ANY;
        }
        if let Some(c) = obj.get("const") {
            return self.literals(std::slice::from_ref(c));
        }
        if let Some(Value::Array(values)) = obj.get("enum") {
            return self.literals(values);
        }
        match obj.get("type") {
            Some(Value::String(t)) => self.compile_type(t, obj, depth),
            Some(Value::Array(types)) => {
                let mut alts = Vec::new();
                let has_number = types.iter().any(|t| t == "number");
                for t in types.iter().filter_map(Value::as_str) {
                    if t == "integer" && has_number {
                        continue;
                    }
                    let id = self.compile_type(t, obj, depth);
                    if id == ANY {
                        return ANY;
                    }
                    alts.push(id);
                }
                if alts.is_empty() { ANY } else { self.push(Node::OneOf(alts)) }
            }
            _ if obj.contains_key("properties") => self.compile_type("object", obj, depth),
            _ if obj.contains_key("items") => self.compile_type("array", obj, depth),
            _ => ANY,
        }
    }

    fn compile_type(&mut self, t: &str, obj: &serde_json::Map<String, Value>, depth: usize) -> NodeId {
        match t {
            "string" => self.push(Node::String),
            "integer" => self.push(Node::Number { integer: true }),
            "number" => self.push(Node::Number { integer: false }),
            "boolean" => self.push(Node::Literals(vec![b"true".to_vec(), b"false".to_vec()])),
            "null" => self.push(Node::Literals(vec![b"null".to_vec()])),
            "array" => {
                let items = obj.get("items").map_or(ANY, |s| self.compile(s, depth + 1));
                self.push(Node::Array { items })
            }
            "object" => match obj.get("properties").and_then(Value::as_object) {
                Some(props) if props.len() <= MAX_SET && props.keys().all(|k| k.len() < MAX_LITERAL / 2) => {
                    let required: Vec<&str> = obj
                        .get("required")
                        .and_then(Value::as_array)
                        .map(|r| r.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    let mut compiled = Vec::new();
                    let mut mask = 0u64;
                    for (i, (key, sub)) in props.iter().enumerate() {
                        if required.contains(&key.as_str()) {
                            mask |= 1 << i;
                        }
                        let encoded = serde_json::to_vec(key).unwrap_or_default();
                        // Strip the quotes: keys are matched between them.
                        let inner = encoded.get(1..encoded.len().saturating_sub(1)).unwrap_or_default().to_vec();
                        let node = self.compile(sub, depth + 1);
                        compiled.push((inner, node));
                    }
                    self.push(Node::Object { props: compiled, required: mask })
                }
                _ => self.any_object(),
            },
            _ => ANY,
        }
    }

    fn literals(&mut self, values: &[Value]) -> NodeId {
        if values.is_empty() || values.len() > MAX_SET {
            return ANY;
        }
        let lits: Vec<Vec<u8>> = values.iter().map(|v| serde_json::to_vec(v).unwrap_or_default()).collect();
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
}
