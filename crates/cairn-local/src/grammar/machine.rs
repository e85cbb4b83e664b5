//! The tool-call grammar's state machine: given the compiled [`Grammar`],
//! says byte by byte whether the output so far can still become a valid
//! answer. A pushdown automaton whose stack is a fixed array of small `Copy`
//! frames, so trying a token is a copy of [`State`] plus a few steps.
//!
//! This module must not compile schemas (that is `grammar.rs`) nor know about
//! tokens (that is `constrain.rs`).

use super::number::Prefix;
use super::path::{Comp, ROOT, SyntaxStep, syntax_step};
use super::{ANY, ANY_ARRAY, Grammar, KEYWORDS, MAX_DEPTH, NUMBER, Node, NodeId, STRING};

/// Spaces allowed in a row between tokens of the call.
const MAX_WS: u8 = 1;
/// Bytes allowed in one number.
const MAX_NUMBER_LEN: u8 = 20;

/// Where a string stands between its quotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Esc {
    /// At a character boundary.
    None,
    /// After `\`.
    Backslash,
    /// Inside `\uXXXX`: hex digits left and what the code unit is.
    Hex {
        left: u8,
        unit: Unit,
    },
    /// After a high surrogate: its low half must follow as `\u`.
    PairBackslash,
    PairU,
    /// Inside a multi-byte UTF-8 character: continuation bytes left and the
    /// range the next one must fall in (which rules out overlong forms,
    /// surrogates and code points above U+10FFFF).
    Utf8 {
        need: u8,
        lo: u8,
        hi: u8,
    },
}

/// What the digits of a `\u` escape read so far make of its code unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    /// No digit yet (a first escape).
    Unknown,
    /// First digit `d`: a surrogate if the next is 8 to f.
    D,
    /// Not a surrogate.
    Plain,
    /// A high surrogate (U+D800–U+DBFF): a low one must follow.
    High,
    /// The escape after a high surrogate: no digit yet, must be `d`.
    LowStart,
    /// The escape after a high surrogate, first digit `d`.
    LowD,
    /// A low surrogate completing a pair.
    Low,
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
        node: NodeId,
        st: ArrSt,
        /// Items started so far (saturating).
        count: u32,
    },
    /// A string: characters so far (Unicode scalar values of the decoded
    /// string, saturating at the limit that still matters) and the limits.
    Str {
        esc: Esc,
        count: u32,
        min: u32,
        max: u32,
    },
    Lit {
        node: NodeId,
        cand: u64,
        pos: u8,
    },
    Num {
        node: NodeId,
        prefix: Prefix,
        len: u8,
    },
    /// A grounded path: the node of its trie reached so far.
    Path {
        node: NodeId,
        at: u32,
    },
    /// A path that may be new: where its component stands, and UTF-8 state.
    NewPath {
        esc: Esc,
        comp: Comp,
    },
}

/// A fresh string frame for a string node.
fn string_frame(g: &Grammar, node: NodeId) -> Frame {
    let (min, max) = match g.node(node) {
        Node::String { min, max } => (*min, *max),
        _ => (0, u32::MAX),
    };
    Frame::Str { esc: Esc::None, count: 0, min, max }
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
        Self { mode: Mode::Start, ws: 0, len: 0, tool: None, stack: [Frame::Value { node: ANY }; MAX_DEPTH] }
    }

    /// Where the answer stands.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The index (offer order) of the called tool, once its name is complete.
    pub fn tool(&self) -> Option<usize> {
        self.tool.map(usize::from)
    }

    /// Whether the parser is inside a string at a character boundary with no
    /// length limit left to check, where every whole UTF-8 text without `"`,
    /// `\` and control bytes keeps the state unchanged.
    pub fn in_free_string(&self) -> bool {
        self.mode == Mode::Call
            && matches!(self.top(), Some(Frame::Str { esc: Esc::None, count, min, max: u32::MAX }) if count >= min)
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
                } else if g.call_only {
                    // The answer must be a call (see `Grammar::require_call`).
                    false
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
            Frame::AnyObject { st } => self.step_any_object(g, st, b),
            Frame::Array { node, st, count } => {
                let (items, min, max) = match g.node(node) {
                    Node::Array { items, min, max } => (*items, *min, *max),
                    _ => return Step::Reject,
                };
                match st {
                    ArrSt::Open | ArrSt::AfterValue if is_ws(b) => accept(self.take_ws(b)),
                    ArrSt::Open | ArrSt::AfterValue if b == b']' => {
                        if count >= min {
                            self.pop_done()
                        } else {
                            Step::Reject
                        }
                    }
                    ArrSt::Open => {
                        if count >= max {
                            return Step::Reject;
                        }
                        self.set_top(Frame::Array { node, st: ArrSt::AfterValue, count: count.saturating_add(1) });
                        if !self.push(Frame::Value { node: items }) {
                            return Step::Reject;
                        }
                        self.step_value(g, items, b)
                    }
                    ArrSt::AfterValue if b == b',' => {
                        if count >= max {
                            return Step::Reject;
                        }
                        self.set_top(Frame::Array { node, st: ArrSt::AfterValue, count: count.saturating_add(1) });
                        if self.push(Frame::Value { node: items }) { Step::Accept } else { Step::Reject }
                    }
                    ArrSt::AfterValue => Step::Reject,
                }
            }
            Frame::Str { esc, count, min, max } => {
                let (esc, starts_char) = match string_step(esc, b, count >= min) {
                    Some(StrStep::Close) => return self.pop_done(),
                    Some(StrStep::Next { esc, starts_char }) => (esc, starts_char),
                    None => return Step::Reject,
                };
                let count = if starts_char {
                    if count >= max {
                        return Step::Reject;
                    }
                    // Past the minimum, without a maximum, counting further
                    // changes nothing: saturate so the state stays the same.
                    (count + 1).min(if max == u32::MAX { min } else { max })
                } else {
                    count
                };
                self.set_top(Frame::Str { esc, count, min, max });
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
            Frame::Path { node, at } => {
                let Node::PathTrie(t) = g.node(node) else { return Step::Reject };
                let Some(trie) = g.tries.get(usize::from(*t)) else { return Step::Reject };
                // A quote inside a candidate is spelt `\"`, so a child `"`
                // only follows a backslash, where no candidate ends.
                if let Some(next) = trie.child(at, b) {
                    self.set_top(Frame::Path { node, at: next });
                    Step::Accept
                } else if b == b'"' && trie.ends(at) {
                    self.pop_done()
                } else {
                    Step::Reject
                }
            }
            Frame::NewPath { esc, comp } => {
                if esc != Esc::None {
                    // Inside a multi-byte character.
                    return match string_step(esc, b, true) {
                        Some(StrStep::Next { esc, .. }) => {
                            self.set_top(Frame::NewPath { esc, comp });
                            Step::Accept
                        }
                        _ => Step::Reject,
                    };
                }
                match syntax_step(comp, b) {
                    Some(SyntaxStep::Close) => self.pop_done(),
                    Some(SyntaxStep::Next(comp)) => match string_step(Esc::None, b, true) {
                        Some(StrStep::Next { esc, .. }) => {
                            self.set_top(Frame::NewPath { esc, comp });
                            Step::Accept
                        }
                        _ => Step::Reject,
                    },
                    None => Step::Reject,
                }
            }
            Frame::Num { node, prefix, len } => {
                let (integer, bounds) = match g.node(node) {
                    Node::Number { integer, bounds } => (*integer, *bounds),
                    _ => return Step::Reject,
                };
                let next = match bounds {
                    None => prefix.next_unbounded(b, integer),
                    Some(bounds) => prefix.next_bounded(b, integer).filter(|p| p.feasible(integer, &bounds)),
                };
                match next {
                    // The last byte must leave a number that can end.
                    Some(prefix) if len + 1 < MAX_NUMBER_LEN || (len < MAX_NUMBER_LEN && prefix.ph.can_end()) => {
                        self.set_top(Frame::Num { node, prefix, len: len + 1 });
                        Step::Accept
                    }
                    _ => {
                        let complete = prefix.ph.can_end() && bounds.is_none_or(|bounds| bounds.admits(prefix.value()));
                        if complete { Step::PopRefeed(None) } else { Step::Reject }
                    }
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
                    replace(self, string_frame(g, STRING));
                    Step::Accept
                }
                b'-' | b'0'..=b'9' => {
                    replace(self, Frame::Num { node: NUMBER, prefix: Prefix::START, len: 0 });
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
                    replace(self, Frame::Array { node: ANY_ARRAY, st: ArrSt::Open, count: 0 });
                    Step::Accept
                }
                _ => Step::Reject,
            },
            Node::Object { .. } if b == b'{' => {
                replace(self, Frame::Object { node, used: 0, st: ObjSt::Open, cur: 0 });
                Step::Accept
            }
            Node::Array { .. } if b == b'[' && room => {
                replace(self, Frame::Array { node, st: ArrSt::Open, count: 0 });
                Step::Accept
            }
            Node::String { .. } if b == b'"' => {
                replace(self, string_frame(g, node));
                Step::Accept
            }
            Node::Number { .. } if b == b'-' || b.is_ascii_digit() => {
                replace(self, Frame::Num { node, prefix: Prefix::START, len: 0 });
                self.feed_top(g, b)
            }
            Node::Literals(_) => {
                replace(self, Frame::Lit { node, cand: u64::MAX, pos: 0 });
                self.feed_top(g, b)
            }
            Node::PathTrie(_) if b == b'"' => {
                replace(self, Frame::Path { node, at: ROOT });
                Step::Accept
            }
            Node::PathSyntax if b == b'"' => {
                replace(self, Frame::NewPath { esc: Esc::None, comp: Comp::Start });
                Step::Accept
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

    fn step_any_object(&mut self, g: &Grammar, st: ObjSt, b: u8) -> Step {
        let set = |s: &mut Self, st| s.set_top(Frame::AnyObject { st });
        match st {
            ObjSt::Open | ObjSt::AfterValue | ObjSt::Comma if is_ws(b) => accept(self.take_ws(b)),
            ObjSt::Open | ObjSt::AfterValue if b == b'}' => self.pop_done(),
            ObjSt::Open | ObjSt::Comma if b == b'"' => {
                set(self, ObjSt::Colon);
                if self.push(string_frame(g, STRING)) { Step::Accept } else { Step::Reject }
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
        Node::Never => false,
        Node::Object { .. } => b == b'{',
        Node::Array { .. } => b == b'[',
        Node::String { .. } | Node::PathTrie(_) | Node::PathSyntax => b == b'"',
        Node::Number { .. } => b == b'-' || b.is_ascii_digit(),
        Node::Literals(lits) => lits.iter().any(|l| l.first() == Some(&b)),
        Node::OneOf(alts) => alts.iter().any(|&a| starts(g, a, b)),
    }
}

/// What a byte does inside a string.
enum StrStep {
    /// The closing quote.
    Close,
    /// Still inside; `starts_char` when the byte begins a character of the
    /// decoded string (a raw character's first byte or an escape's `\`,
    /// the `\` of a surrogate pair's second half excepted).
    Next { esc: Esc, starts_char: bool },
}

/// One byte of a string: `None` when it cannot continue a string that
/// `serde_json` decodes (bad escape, lone surrogate, invalid UTF-8, raw
/// control byte) or closes it before `long_enough`.
fn string_step(esc: Esc, b: u8, long_enough: bool) -> Option<StrStep> {
    let next = |esc: Esc, starts_char: bool| Some(StrStep::Next { esc, starts_char });
    let utf8 = |need: u8, lo: u8| next(Esc::Utf8 { need, lo, hi: 0xBF }, true);
    match esc {
        Esc::None => match b {
            b'"' if long_enough => Some(StrStep::Close),
            b'"' | 0..=0x1f => None,
            b'\\' => next(Esc::Backslash, true),
            0x20..=0x7f => next(Esc::None, true),
            0xC2..=0xDF => utf8(1, 0x80),
            0xE0 => utf8(2, 0xA0),
            0xE1..=0xEC | 0xEE..=0xEF => utf8(2, 0x80),
            0xED => next(Esc::Utf8 { need: 2, lo: 0x80, hi: 0x9F }, true),
            0xF0 => utf8(3, 0x90),
            0xF1..=0xF3 => utf8(3, 0x80),
            0xF4 => next(Esc::Utf8 { need: 3, lo: 0x80, hi: 0x8F }, true),
            _ => None,
        },
        Esc::Utf8 { need, lo, hi } => {
            if !(lo..=hi).contains(&b) {
                return None;
            }
            next(if need <= 1 { Esc::None } else { Esc::Utf8 { need: need - 1, lo: 0x80, hi: 0xBF } }, false)
        }
        Esc::Backslash => match b {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => next(Esc::None, false),
            b'u' => next(Esc::Hex { left: 4, unit: Unit::Unknown }, false),
            _ => None,
        },
        Esc::PairBackslash if b == b'\\' => next(Esc::PairU, false),
        Esc::PairU if b == b'u' => next(Esc::Hex { left: 4, unit: Unit::LowStart }, false),
        Esc::PairBackslash | Esc::PairU => None,
        Esc::Hex { left, unit } => {
            if !b.is_ascii_hexdigit() {
                return None;
            }
            let d = b.to_ascii_lowercase();
            let unit = match (unit, left) {
                (Unit::Unknown, 4) if d == b'd' => Unit::D,
                (Unit::Unknown, 4) => Unit::Plain,
                (Unit::LowStart, 4) if d == b'd' => Unit::LowD,
                (Unit::LowStart, _) => return None,
                (Unit::D, 3) => match d {
                    b'8'..=b'b' => Unit::High,
                    // A low surrogate with no high one before it.
                    b'c'..=b'f' => return None,
                    _ => Unit::Plain,
                },
                (Unit::LowD, 3) if (b'c'..=b'f').contains(&d) => Unit::Low,
                (Unit::LowD, _) => return None,
                (unit, _) => unit,
            };
            if left > 1 {
                next(Esc::Hex { left: left - 1, unit }, false)
            } else if unit == Unit::High {
                next(Esc::PairBackslash, false)
            } else {
                next(Esc::None, false)
            }
        }
    }
}
