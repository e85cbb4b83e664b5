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
//! This module must stay free of model and tokenizer types: it sees bytes.
//! Token masking lives in `constrain.rs`.

use serde_json::Value;

/// Deepest nesting of frames (containers plus the scalar inside).
pub const MAX_DEPTH: usize = 16;
/// Spaces allowed in a row between tokens of the call.
const MAX_WS: u8 = 1;
/// Bytes allowed in one number.
const MAX_NUMBER_LEN: u8 = 20;
/// Most properties, enum values or tools one set may hold (bitmask width).
const MAX_SET: usize = 64;
/// Longest enum value or tool name (JSON-encoded) the grammar matches;
/// object keys must be shorter than half of it (escapes may double them).
const MAX_LITERAL: usize = 250;
/// Schemas deeper than this compile to "any value".
const MAX_SCHEMA_DEPTH: usize = 8;

type NodeId = u16;

/// The node that accepts any JSON value.
const ANY: NodeId = 0;
/// The node that accepts `true`, `false` or `null` (used inside "any").
const KEYWORDS: NodeId = 1;

#[derive(Debug, Clone)]
enum Node {
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
    names: NodeId,
    /// The argument schema node of each tool, in offer order.
    tool_args: Vec<NodeId>,
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

    fn node(&self, id: NodeId) -> &Node {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Esc {
    None,
    Backslash,
    Hex(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NumPh {
    Start,
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
}

impl NumPh {
    fn can_end(self) -> bool {
        matches!(self, NumPh::Zero | NumPh::Int | NumPh::Frac | NumPh::ExpDigits)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ObjSt {
    /// After `{`: a key or `}`.
    Open,
    /// Inside a declared key: candidates and bytes matched.
    Key { cand: u64, pos: u8 },
    /// After a key's closing quote: `:`.
    Colon,
    /// After a value: `,` or `}`.
    AfterValue,
    /// After `,`: a key.
    Comma,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ArrSt {
    Open,
    AfterValue,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallSt {
    /// Expect `{`.
    Open,
    /// Matching `"name"`.
    NameKey(u8),
    /// Expect `:` after `"name"`.
    NameColon,
    /// The name value is being matched (a literal frame above).
    NameValue,
    /// After the name: `,`.
    AfterName,
    /// Matching `"arguments"`.
    ArgsKey(u8),
    /// Expect `:` after `"arguments"`.
    ArgsColon,
    /// After the arguments value: `}`.
    AfterArgs,
}

const NAME_KEY: &[u8] = b"\"name\"";
const ARGS_KEY: &[u8] = b"\"arguments\"";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frame {
    Call {
        st: CallSt,
        tool: u8,
    },
    /// A value of this node is expected next.
    Value {
        node: NodeId,
    },
    Object {
        node: NodeId,
        used: u64,
        st: ObjSt,
        cur: u8,
    },
    /// An object with any keys and values.
    AnyObject {
        st: ObjSt,
    },
    Array {
        items: NodeId,
        st: ArrSt,
    },
    Str {
        esc: Esc,
    },
    Lit {
        node: NodeId,
        cand: u64,
        pos: u8,
    },
    Num {
        integer: bool,
        ph: NumPh,
        len: u8,
    },
}

/// Where the answer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Nothing but spaces yet.
    Start,
    /// Plain text: unconstrained.
    Text,
    /// Inside the tool-call object.
    Call,
    /// The call's closing brace was emitted: nothing may follow.
    Done,
}

/// The parser's state after some bytes. Small and `Copy`, so trying a token
/// is a copy plus a few byte steps.
#[derive(Debug, Clone, Copy)]
pub struct State {
    mode: Mode,
    ws: u8,
    len: u8,
    /// The tool chosen once the name is complete.
    tool: Option<u8>,
    stack: [Frame; MAX_DEPTH],
}

enum Step {
    Accept,
    Reject,
    /// The top frame completed without consuming the byte: pop it and offer
    /// the byte to the frame below, passing the matched literal index.
    PopRefeed(Option<u8>),
}

fn is_ws(b: u8) -> bool {
    b == b' '
}

impl Default for State {
    fn default() -> Self {
        Self::new()
    }
}

impl State {
    /// The state before any output.
    pub fn new() -> Self {
        Self { mode: Mode::Start, ws: 0, len: 0, tool: None, stack: [Frame::Str { esc: Esc::None }; MAX_DEPTH] }
    }

    /// Where the answer stands.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The index (offer order) of the called tool, once its name is complete.
    pub fn tool(&self) -> Option<usize> {
        self.tool.map(usize::from)
    }

    /// Whether the parser is inside a string with no escape pending, where
    /// every byte but `"`, `\` and control bytes keeps the state unchanged.
    pub fn in_free_string(&self) -> bool {
        self.mode == Mode::Call && matches!(self.top(), Some(Frame::Str { esc: Esc::None }))
    }

    /// Whether the answer may end here (end-of-turn token).
    pub fn can_end(&self) -> bool {
        matches!(self.mode, Mode::Text | Mode::Done)
    }

    fn top(&self) -> Option<Frame> {
        (self.len as usize).checked_sub(1).and_then(|i| self.stack.get(i)).copied()
    }

    fn set_top(&mut self, f: Frame) {
        if let Some(slot) = (self.len as usize).checked_sub(1).and_then(|i| self.stack.get_mut(i)) {
            *slot = f;
        }
    }

    fn push(&mut self, f: Frame) -> bool {
        match self.stack.get_mut(self.len as usize) {
            Some(slot) => {
                *slot = f;
                self.len += 1;
                true
            }
            None => false,
        }
    }

    fn take_ws(&mut self, b: u8) -> Option<bool> {
        if !is_ws(b) {
            return None;
        }
        if self.ws < MAX_WS {
            self.ws += 1;
            Some(true)
        } else {
            Some(false)
        }
    }

    /// Feed all bytes; false as soon as one is refused (the state is then
    /// unspecified and must be discarded).
    pub fn feed_all(&mut self, g: &Grammar, bytes: &[u8]) -> bool {
        for &b in bytes {
            if self.mode == Mode::Text {
                return true;
            }
            if !self.feed(g, b) {
                return false;
            }
        }
        true
    }

    /// Feed one byte; false when it cannot continue a valid answer.
    pub fn feed(&mut self, g: &Grammar, b: u8) -> bool {
        match self.mode {
            Mode::Text => true,
            Mode::Done => false,
            Mode::Start => {
                if b == b' ' || b == b'\n' {
                    if self.ws < 2 {
                        self.ws += 1;
                        return true;
                    }
                    return false;
                }
                if b == b'{' {
                    if g.tool_names.is_empty() {
                        // No tools: text only, and text may not look like a call.
                        return false;
                    }
                    self.mode = Mode::Call;
                    self.ws = 0;
                    self.push(Frame::Call { st: CallSt::Open, tool: 0 });
                    self.feed_call(g, b)
                } else {
                    self.mode = Mode::Text;
                    true
                }
            }
            Mode::Call => self.feed_call(g, b),
        }
    }

    fn feed_call(&mut self, g: &Grammar, b: u8) -> bool {
        let mut result = None;
        loop {
            let Some(top) = self.top() else { return false };
            let step = self.step(g, top, b, result);
            match step {
                Step::Accept => {
                    if !is_ws(b) {
                        self.ws = 0;
                    }
                    return true;
                }
                Step::Reject => return false,
                Step::PopRefeed(r) => {
                    self.len -= 1;
                    result = r;
                }
            }
        }
    }

    fn pop_done(&mut self) -> Step {
        self.len -= 1;
        if self.len == 0 {
            self.mode = Mode::Done;
        }
        Step::Accept
    }

    fn step(&mut self, g: &Grammar, top: Frame, b: u8, result: Option<u8>) -> Step {
        match top {
            Frame::Call { st, tool } => self.step_call(g, st, tool, b, result),
            Frame::Value { node } => self.step_value(g, node, b),
            Frame::Object { node, used, st, cur } => self.step_object(g, node, used, st, cur, b),
            Frame::AnyObject { st } => self.step_any_object(st, b),
            Frame::Array { items, st } => match st {
                ArrSt::Open if b == b']' => self.pop_done(),
                ArrSt::Open | ArrSt::AfterValue if is_ws(b) => accept(self.take_ws(b)),
                ArrSt::Open => {
                    self.set_top(Frame::Array { items, st: ArrSt::AfterValue });
                    if !self.push(Frame::Value { node: items }) {
                        return Step::Reject;
                    }
                    self.step_value(g, items, b)
                }
                ArrSt::AfterValue if b == b']' => self.pop_done(),
                ArrSt::AfterValue if b == b',' => {
                    if self.push(Frame::Value { node: items }) {
                        Step::Accept
                    } else {
                        Step::Reject
                    }
                }
                ArrSt::AfterValue => Step::Reject,
            },
            Frame::Str { esc } => {
                let next = match esc {
                    Esc::None => match b {
                        b'"' => return self.pop_done(),
                        b'\\' => Esc::Backslash,
                        0..=0x1f => return Step::Reject,
                        _ => Esc::None,
                    },
                    Esc::Backslash => match b {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Esc::None,
                        b'u' => Esc::Hex(4),
                        _ => return Step::Reject,
                    },
                    Esc::Hex(n) => {
                        if !b.is_ascii_hexdigit() {
                            return Step::Reject;
                        }
                        if n <= 1 { Esc::None } else { Esc::Hex(n - 1) }
                    }
                };
                self.set_top(Frame::Str { esc: next });
                Step::Accept
            }
            Frame::Lit { node, cand, pos } => {
                let Node::Literals(lits) = g.node(node) else { return Step::Reject };
                let mut next = 0u64;
                let mut exact = None;
                for (i, lit) in lits.iter().enumerate() {
                    if cand & (1 << i) == 0 {
                        continue;
                    }
                    if lit.len() == pos as usize {
                        exact = Some(i as u8);
                    } else if lit.get(pos as usize) == Some(&b) {
                        next |= 1 << i;
                    }
                }
                if next != 0 {
                    self.set_top(Frame::Lit { node, cand: next, pos: pos.saturating_add(1) });
                    Step::Accept
                } else if exact.is_some() {
                    Step::PopRefeed(exact)
                } else {
                    Step::Reject
                }
            }
            Frame::Num { integer, ph, len } => {
                let next = match (ph, b) {
                    (NumPh::Start, b'-') => Some(NumPh::Minus),
                    (NumPh::Start | NumPh::Minus, b'0') => Some(NumPh::Zero),
                    (NumPh::Start | NumPh::Minus, b'1'..=b'9') => Some(NumPh::Int),
                    (NumPh::Int, b'0'..=b'9') => Some(NumPh::Int),
                    (NumPh::Zero | NumPh::Int, b'.') if !integer => Some(NumPh::Dot),
                    (NumPh::Dot | NumPh::Frac, b'0'..=b'9') => Some(NumPh::Frac),
                    (NumPh::Zero | NumPh::Int | NumPh::Frac, b'e' | b'E') if !integer => Some(NumPh::Exp),
                    (NumPh::Exp, b'+' | b'-') => Some(NumPh::ExpSign),
                    (NumPh::Exp | NumPh::ExpSign | NumPh::ExpDigits, b'0'..=b'9') => Some(NumPh::ExpDigits),
                    _ => None,
                };
                match next {
                    Some(ph) if len < MAX_NUMBER_LEN => {
                        self.set_top(Frame::Num { integer, ph, len: len + 1 });
                        Step::Accept
                    }
                    Some(_) => {
                        if ph.can_end() {
                            Step::PopRefeed(None)
                        } else {
                            Step::Reject
                        }
                    }
                    None if ph.can_end() => Step::PopRefeed(None),
                    None => Step::Reject,
                }
            }
        }
    }

    fn step_call(&mut self, g: &Grammar, st: CallSt, tool: u8, b: u8, result: Option<u8>) -> Step {
        let set = |s: &mut Self, st| s.set_top(Frame::Call { st, tool });
        match st {
            CallSt::Open if b == b'{' => {
                set(self, CallSt::NameKey(0));
                Step::Accept
            }
            CallSt::Open => Step::Reject,
            CallSt::NameKey(0) if is_ws(b) => accept(self.take_ws(b)),
            CallSt::NameKey(pos) => {
                if NAME_KEY.get(pos as usize) != Some(&b) {
                    return Step::Reject;
                }
                let pos = pos + 1;
                set(self, if pos as usize == NAME_KEY.len() { CallSt::NameColon } else { CallSt::NameKey(pos) });
                Step::Accept
            }
            CallSt::NameColon if b == b':' => {
                set(self, CallSt::NameValue);
                if self.push(Frame::Value { node: g.names }) { Step::Accept } else { Step::Reject }
            }
            CallSt::NameColon => Step::Reject,
            CallSt::NameValue => {
                // The literal frame above completed: record the tool.
                let Some(idx) = result else { return Step::Reject };
                self.tool = Some(idx);
                self.set_top(Frame::Call { st: CallSt::AfterName, tool: idx });
                self.step_call(g, CallSt::AfterName, idx, b, None)
            }
            CallSt::AfterName if is_ws(b) => accept(self.take_ws(b)),
            CallSt::AfterName if b == b',' => {
                set(self, CallSt::ArgsKey(0));
                Step::Accept
            }
            CallSt::AfterName => Step::Reject,
            CallSt::ArgsKey(0) if is_ws(b) => accept(self.take_ws(b)),
            CallSt::ArgsKey(pos) => {
                if ARGS_KEY.get(pos as usize) != Some(&b) {
                    return Step::Reject;
                }
                let pos = pos + 1;
                set(self, if pos as usize == ARGS_KEY.len() { CallSt::ArgsColon } else { CallSt::ArgsKey(pos) });
                Step::Accept
            }
            CallSt::ArgsColon if b == b':' => {
                set(self, CallSt::AfterArgs);
                let Some(&node) = g.tool_args.get(tool as usize) else { return Step::Reject };
                if self.push(Frame::Value { node }) { Step::Accept } else { Step::Reject }
            }
            CallSt::ArgsColon => Step::Reject,
            CallSt::AfterArgs if is_ws(b) => accept(self.take_ws(b)),
            CallSt::AfterArgs if b == b'}' => self.pop_done(),
            CallSt::AfterArgs => Step::Reject,
        }
    }

    fn step_value(&mut self, g: &Grammar, node: NodeId, b: u8) -> Step {
        if is_ws(b) {
            return accept(self.take_ws(b));
        }
        let room = (self.len as usize) + 2 <= MAX_DEPTH;
        let replace = |s: &mut Self, f: Frame| s.set_top(f);
        match g.node(node) {
            Node::Any => match b {
                b'"' => {
                    replace(self, Frame::Str { esc: Esc::None });
                    Step::Accept
                }
                b'-' | b'0'..=b'9' => {
                    replace(self, Frame::Num { integer: false, ph: NumPh::Start, len: 0 });
                    self.feed_top(g, b)
                }
                b't' | b'f' | b'n' => {
                    replace(self, Frame::Lit { node: KEYWORDS, cand: u64::MAX, pos: 0 });
                    self.feed_top(g, b)
                }
                b'{' if room => {
                    replace(self, Frame::AnyObject { st: ObjSt::Open });
                    Step::Accept
                }
                b'[' if room => {
                    replace(self, Frame::Array { items: ANY, st: ArrSt::Open });
                    Step::Accept
                }
                _ => Step::Reject,
            },
            Node::Object { .. } if b == b'{' => {
                replace(self, Frame::Object { node, used: 0, st: ObjSt::Open, cur: 0 });
                Step::Accept
            }
            Node::Array { items } if b == b'[' && room => {
                replace(self, Frame::Array { items: *items, st: ArrSt::Open });
                Step::Accept
            }
            Node::String if b == b'"' => {
                replace(self, Frame::Str { esc: Esc::None });
                Step::Accept
            }
            Node::Number { integer } if b == b'-' || b.is_ascii_digit() => {
                replace(self, Frame::Num { integer: *integer, ph: NumPh::Start, len: 0 });
                self.feed_top(g, b)
            }
            Node::Literals(_) => {
                replace(self, Frame::Lit { node, cand: u64::MAX, pos: 0 });
                self.feed_top(g, b)
            }
            Node::OneOf(alts) => {
                for &alt in alts {
                    if starts(g, alt, b) {
                        // "Any" inside a OneOf stands for "any object".
                        if alt == ANY && b != b'{' {
                            continue;
                        }
                        replace(self, Frame::Value { node: alt });
                        return self.step_value(g, alt, b);
                    }
                }
                Step::Reject
            }
            _ => Step::Reject,
        }
    }

    fn feed_top(&mut self, g: &Grammar, b: u8) -> Step {
        match self.top() {
            Some(top) => match self.step(g, top, b, None) {
                // A fresh scalar cannot complete on its first byte.
                Step::PopRefeed(_) => Step::Reject,
                s => s,
            },
            None => Step::Reject,
        }
    }

    fn step_object(&mut self, g: &Grammar, node: NodeId, used: u64, st: ObjSt, cur: u8, b: u8) -> Step {
        let Node::Object { props, required } = g.node(node) else { return Step::Reject };
        let all: u64 = if props.len() >= 64 { u64::MAX } else { (1u64 << props.len()) - 1 };
        let unused = all & !used;
        let set = |s: &mut Self, used: u64, st: ObjSt, cur: u8| s.set_top(Frame::Object { node, used, st, cur });
        match st {
            ObjSt::Open | ObjSt::AfterValue | ObjSt::Comma if is_ws(b) => accept(self.take_ws(b)),
            ObjSt::Open | ObjSt::AfterValue if b == b'}' => {
                if used & required == *required {
                    self.pop_done()
                } else {
                    Step::Reject
                }
            }
            ObjSt::Open | ObjSt::Comma if b == b'"' => {
                if unused == 0 {
                    return Step::Reject;
                }
                set(self, used, ObjSt::Key { cand: unused, pos: 0 }, cur);
                Step::Accept
            }
            ObjSt::AfterValue if b == b',' => {
                if unused == 0 {
                    return Step::Reject;
                }
                set(self, used, ObjSt::Comma, cur);
                Step::Accept
            }
            ObjSt::Key { cand, pos } => {
                let mut next = 0u64;
                for (i, (key, _)) in props.iter().enumerate() {
                    if cand & (1 << i) == 0 {
                        continue;
                    }
                    if b == b'"' && key.len() == pos as usize {
                        set(self, used | (1 << i), ObjSt::Colon, i as u8);
                        return Step::Accept;
                    }
                    if key.get(pos as usize) == Some(&b) {
                        next |= 1 << i;
                    }
                }
                if next == 0 {
                    return Step::Reject;
                }
                set(self, used, ObjSt::Key { cand: next, pos: pos.saturating_add(1) }, cur);
                Step::Accept
            }
            ObjSt::Colon if b == b':' => {
                let Some(&(_, child)) = props.get(cur as usize) else { return Step::Reject };
                set(self, used, ObjSt::AfterValue, cur);
                if self.push(Frame::Value { node: child }) { Step::Accept } else { Step::Reject }
            }
            _ => Step::Reject,
        }
    }

    fn step_any_object(&mut self, st: ObjSt, b: u8) -> Step {
        let set = |s: &mut Self, st| s.set_top(Frame::AnyObject { st });
        match st {
            ObjSt::Open | ObjSt::AfterValue | ObjSt::Comma if is_ws(b) => accept(self.take_ws(b)),
            ObjSt::Open | ObjSt::AfterValue if b == b'}' => self.pop_done(),
            ObjSt::Open | ObjSt::Comma if b == b'"' => {
                set(self, ObjSt::Colon);
                if self.push(Frame::Str { esc: Esc::None }) { Step::Accept } else { Step::Reject }
            }
            ObjSt::AfterValue if b == b',' => {
                set(self, ObjSt::Comma);
                Step::Accept
            }
            ObjSt::Colon if b == b':' => {
                set(self, ObjSt::AfterValue);
                if self.push(Frame::Value { node: ANY }) { Step::Accept } else { Step::Reject }
            }
            _ => Step::Reject,
        }
    }
}

fn accept(ws: Option<bool>) -> Step {
    if ws == Some(true) { Step::Accept } else { Step::Reject }
}

/// Whether a value of `node` may start with byte `b`.
fn starts(g: &Grammar, node: NodeId, b: u8) -> bool {
    match g.node(node) {
        Node::Any => b"\"-0123456789tfn{[".contains(&b),
        Node::Object { .. } => b == b'{',
        Node::Array { .. } => b == b'[',
        Node::String => b == b'"',
        Node::Number { .. } => b == b'-' || b.is_ascii_digit(),
        Node::Literals(lits) => lits.iter().any(|l| l.first() == Some(&b)),
        Node::OneOf(alts) => alts.iter().any(|&a| starts(g, a, b)),
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
