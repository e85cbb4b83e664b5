//! Token accounting for the bounded request view: what a message costs,
//! the calibrated bytes-per-token estimate, and a ledger of prefix sums so
//! the cost of any suffix of the conversation is two lookups.
//!
//! It owns the arithmetic only: which messages are sent, and compaction,
//! are the turn's (`turn/context.rs`). It must not read or write storage
//! and must not call providers (the turn hands it the provider's
//! tokenizer as a function).

use crate::message::{ContentPart, Message, Role};

/// Bytes a tool result may keep in the prompt once it is older than the
/// current turn; larger ones are cut to their first part, with a marker
/// naming what was left out (the log keeps all of it).
pub const ELIDE_ABOVE: usize = 2048;
/// Bytes of an elided tool result that stay in the prompt.
pub const ELIDED_KEEP: usize = 1024;
/// Bytes a message costs beyond its text (role, framing, ids).
const MESSAGE_OVERHEAD: u64 = 16;
/// Tokens a message costs beyond its text when a tokenizer counts.
const MESSAGE_OVERHEAD_TOKENS: u64 = 8;

/// Tokens an image is counted as: what the APIs charge for an image of
/// about a megapixel (Anthropic ~1,600, OpenAI at most ~1,100 at high
/// detail), so the estimate errs towards too many. Its base64 text is not
/// what the model reads, so it is never counted.
pub const IMAGE_TOKENS: u64 = 1_600;
/// [`IMAGE_TOKENS`] in the byte estimate's unit.
const IMAGE_BYTES: u64 = (IMAGE_TOKENS as f64 * DEFAULT_BYTES_PER_TOKEN) as u64;

/// The bytes-per-token ratio assumed before any usage is reported: on
/// the low side of English prose (~4), so the first estimate errs towards
/// too many tokens.
pub const DEFAULT_BYTES_PER_TOKEN: f64 = 3.2;
/// The estimate's safety margin over the calibrated ratio.
const MARGIN: f64 = 1.1;

/// The bytes of `message` as the estimate counts them: its texts, tool
/// names, ids and arguments, opaque reasoning, and a fixed overhead.
pub fn message_bytes(message: &Message) -> u64 {
    let mut n = MESSAGE_OVERHEAD;
    for part in &message.content {
        let len = match part {
            ContentPart::Text { text } => text.len(),
            ContentPart::ToolCall(call) => {
                call.id.len() + call.name.len() + serde_json::to_string(&call.arguments).map_or(0, |s| s.len()) + 16
            }
            ContentPart::ToolResult { call_id, content, .. } => call_id.len() + content.len() + 16,
            ContentPart::Reasoning { text, opaque, .. } => {
                text.len() + opaque.as_ref().and_then(|o| serde_json::to_string(o).ok()).map_or(0, |s| s.len())
            }
            ContentPart::Image { .. } => IMAGE_BYTES as usize,
        };
        n = n.saturating_add(len as u64);
    }
    n
}

/// The text of `message` a tokenizer counts (texts, calls, results).
pub fn message_text(message: &Message) -> String {
    let mut out = String::new();
    for part in &message.content {
        match part {
            ContentPart::Text { text } | ContentPart::Reasoning { text, .. } => out.push_str(text),
            ContentPart::ToolCall(call) => {
                out.push_str(&call.name);
                out.push_str(&serde_json::to_string(&call.arguments).unwrap_or_default());
            }
            ContentPart::ToolResult { content, .. } => out.push_str(content),
            // Counted apart (`images`): its base64 is not read as text.
            ContentPart::Image { .. } => {}
        }
        out.push('\n');
    }
    out
}

/// The marker that replaces the `rest` bytes cut from a large output.
fn elision_note(rest: usize) -> String {
    format!("\n[… {rest} more bytes of this older output are left out of the prompt; the session log keeps them]")
}

/// `message` with its large tool outputs cut to their first part and a
/// marker, or `None` when nothing in it is large.
pub fn elided(message: &Message) -> Option<Message> {
    if message.role != Role::Tool {
        return None;
    }
    let large =
        |part: &ContentPart| matches!(part, ContentPart::ToolResult { content, .. } if content.len() > ELIDE_ABOVE);
    if !message.content.iter().any(large) {
        return None;
    }
    let content = message
        .content
        .iter()
        .map(|part| match part {
            ContentPart::ToolResult { call_id, content, is_error } if content.len() > ELIDE_ABOVE => {
                let mut cut = ELIDED_KEEP;
                while !content.is_char_boundary(cut) {
                    cut -= 1;
                }
                let rest = content.len() - cut;
                ContentPart::ToolResult {
                    call_id: call_id.clone(),
                    content: format!("{}{}", &content[..cut], elision_note(rest)),
                    is_error: *is_error,
                }
            }
            other => other.clone(),
        })
        .collect();
    Some(Message { role: message.role, content })
}

/// The calibrated bytes-per-token ratio of one provider and model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    /// Bytes of request per reported input token.
    pub bytes_per_token: f64,
}

impl Default for Calibration {
    fn default() -> Self {
        Self { bytes_per_token: DEFAULT_BYTES_PER_TOKEN }
    }
}

impl Calibration {
    /// Tokens `bytes` are estimated to be (rounded up, with the margin).
    pub fn tokens(&self, bytes: u64) -> u64 {
        ((bytes as f64) * MARGIN / self.bytes_per_token).ceil() as u64
    }

    /// Learn from a call whose request counted `request_bytes` and for
    /// which the API reported `input_tokens`. Ratios outside 1–8 bytes a
    /// token are not real tokenizers (a server reporting fixed numbers) and
    /// are ignored; the new ratio moves halfway towards the observed one.
    pub fn observe(&mut self, request_bytes: u64, input_tokens: u64) {
        if input_tokens == 0 || request_bytes < 256 {
            return;
        }
        let observed = request_bytes as f64 / input_tokens as f64;
        if !(1.0..=8.0).contains(&observed) {
            return;
        }
        self.bytes_per_token = (self.bytes_per_token + observed) / 2.0;
    }
}

/// What the ledger counts in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unit {
    /// Bytes (converted by a [`Calibration`]).
    Bytes,
    /// Tokens of this provider/model's own tokenizer.
    Tokens(String, String),
}

/// Prefix sums of message costs, full and with old tool outputs elided,
/// extended as messages are appended (each message is costed once).
#[derive(Debug, Clone)]
pub struct Ledger {
    unit: Unit,
    full: Vec<u64>,
    elided: Vec<u64>,
}

impl Default for Ledger {
    fn default() -> Self {
        Self { unit: Unit::Bytes, full: vec![0], elided: vec![0] }
    }
}

impl Ledger {
    /// Start over in `unit` (nothing costed).
    pub fn reset(&mut self, unit: &Unit) {
        *self = Self { unit: unit.clone(), ..Self::default() };
    }

    /// Cost the next message (in the ledger's unit; `count` counts tokens
    /// when the unit is tokens).
    pub fn push(&mut self, m: &Message, count: &dyn Fn(&str) -> Option<u64>) {
        let full = self.cost_of(m, count);
        let short = elided(m).map_or(full, |e| self.cost_of(&e, count));
        let (f, e) = (self.last_full(), self.last_elided());
        self.full.push(f.saturating_add(full));
        self.elided.push(e.saturating_add(short));
    }

    /// What `m` costs in full, in the ledger's unit (what [`Ledger::push`]
    /// adds for it), without adding it.
    pub fn cost_of(&self, m: &Message, count: &dyn Fn(&str) -> Option<u64>) -> u64 {
        match self.unit {
            Unit::Bytes => message_bytes(m),
            Unit::Tokens(..) => {
                let images = m.content.iter().filter(|p| matches!(p, ContentPart::Image { .. })).count() as u64;
                count(&message_text(m)).unwrap_or_else(|| message_bytes(m))
                    + MESSAGE_OVERHEAD_TOKENS
                    + images * IMAGE_TOKENS
            }
        }
    }

    /// What `m` costs in bytes, in full and with its large tool outputs
    /// elided (what [`Ledger::push`] adds in [`Unit::Bytes`]).
    pub fn byte_costs(m: &Message) -> (u64, u64) {
        let full = message_bytes(m);
        (full, elided(m).map_or(full, |e| message_bytes(&e)))
    }

    /// [`Ledger::byte_costs`] of a tool-result message of one part (what a
    /// `toolCompleted` contributes), from its call id and content, without
    /// building the message or its elided copy.
    pub fn tool_result_byte_costs(call_id: &str, content: &str) -> (u64, u64) {
        let mut keep = ELIDED_KEEP.min(content.len());
        while !content.is_char_boundary(keep) {
            keep -= 1;
        }
        Self::tool_result_byte_costs_of(call_id.len(), content.len(), keep)
    }

    /// [`Ledger::tool_result_byte_costs`] from the lengths alone: the call
    /// id's, the content's and that of the content's longest prefix of at
    /// most [`ELIDED_KEEP`] bytes ending on a char boundary.
    pub(crate) fn tool_result_byte_costs_of(call_id_len: usize, content_len: usize, keep: usize) -> (u64, u64) {
        let bytes = |content_len: usize| MESSAGE_OVERHEAD.saturating_add((call_id_len + content_len + 16) as u64);
        let full = bytes(content_len);
        if content_len <= ELIDE_ABOVE {
            return (full, full);
        }
        (full, bytes(keep + elision_note(content_len - keep).len()))
    }

    /// A ledger in bytes of messages whose costs ([`Ledger::byte_costs`])
    /// are given newest first (full in `full`, elided in `elided`, one
    /// each a message, as a walk from the head up its parents finds them),
    /// turned into the prefix sums in place: no second copy of the costs
    /// while a long session opens. `room` more messages fit before the
    /// vectors grow (a grown vector is a copy, which the first turn after
    /// an open would otherwise pay for every message of the session).
    pub fn from_newest_first(mut full: Vec<u64>, mut elided: Vec<u64>, room: usize) -> Self {
        for costs in [&mut full, &mut elided] {
            costs.reserve(room + 1);
            // The sum before the first message, first once reversed.
            costs.push(0);
            costs.reverse();
            let mut sum = 0u64;
            for c in costs.iter_mut() {
                sum = sum.saturating_add(*c);
                *c = sum;
            }
        }
        Self { unit: Unit::Bytes, full, elided }
    }

    /// Cost the messages not costed yet, in `unit` (starting over when the
    /// unit changed or `messages` is shorter than what is costed).
    pub fn extend(&mut self, messages: &[Message], unit: &Unit, count: &dyn Fn(&str) -> Option<u64>) {
        if &self.unit != unit || self.full.len() > messages.len() + 1 {
            self.reset(unit);
        }
        for m in &messages[self.full.len() - 1..] {
            self.push(m, count);
        }
    }

    fn last_full(&self) -> u64 {
        self.full.last().copied().unwrap_or(0)
    }

    fn last_elided(&self) -> u64 {
        self.elided.last().copied().unwrap_or(0)
    }

    /// The full cost of message `i` (0 past the end).
    pub fn cost(&self, i: usize) -> u64 {
        match (self.full.get(i), self.full.get(i + 1)) {
            (Some(a), Some(b)) => b - a,
            _ => 0,
        }
    }

    /// The unit of the sums.
    pub fn unit(&self) -> &Unit {
        &self.unit
    }

    /// Messages costed.
    pub fn len(&self) -> usize {
        self.full.len() - 1
    }

    /// Whether no message is costed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cost of messages `start..` when those before `current` (the
    /// current turn's first message) have their large tool outputs elided.
    pub fn suffix(&self, start: usize, current: usize) -> u64 {
        let n = self.len();
        let start = start.min(n);
        let current = current.clamp(start, n);
        let old = self.elided[current] - self.elided[start];
        let new = self.full[n] - self.full[current];
        old + new
    }

    /// The cost of messages `start..end`, elided.
    pub fn elided_range(&self, start: usize, end: usize) -> u64 {
        let end = end.min(self.len());
        let start = start.min(end);
        self.elided[end] - self.elided[start]
    }

    /// The smallest `start` in `from..=len` whose suffix costs at most
    /// `budget` (`len` when even the last message alone does not fit).
    pub fn fitting_start(&self, from: usize, current: usize, budget: u64) -> usize {
        let (mut lo, mut hi) = (from.min(self.len()), self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.suffix(mid, current) <= budget {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    }

    /// The largest `start` in `from..=end` such that `start..end` costs at
    /// most `budget`, elided: where a reader of the newest part of a range
    /// begins.
    pub fn fitting_range_start(&self, from: usize, end: usize, budget: u64) -> usize {
        let end = end.min(self.len());
        let (mut lo, mut hi) = (from.min(end), end);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.elided_range(mid, end) <= budget {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(n: usize) -> Message {
        Message {
            role: Role::Tool,
            content: vec![ContentPart::ToolResult { call_id: "c".into(), content: "é".repeat(n), is_error: false }],
        }
    }

    #[test]
    fn a_tool_results_costs_from_its_parts_are_its_messages() {
        for content in ["".to_owned(), "x".repeat(2048), "x".repeat(2049), "é".repeat(1100), "a🦀".repeat(900)] {
            for call_id in ["", "call_1", "c\u{e9}"] {
                let m = Message {
                    role: Role::Tool,
                    content: vec![ContentPart::ToolResult {
                        call_id: call_id.into(),
                        content: content.clone(),
                        is_error: true,
                    }],
                };
                assert_eq!(
                    Ledger::tool_result_byte_costs(call_id, &content),
                    Ledger::byte_costs(&m),
                    "{}",
                    content.len()
                );
            }
        }
    }

    #[test]
    fn suffix_costs_match_a_direct_sum() {
        let messages: Vec<Message> = (0..50)
            .map(|i| if i % 3 == 2 { tool(i * 200) } else { Message::text(Role::User, "x".repeat(i * 7)) })
            .collect();
        let mut ledger = Ledger::default();
        ledger.extend(&messages[..20], &Unit::Bytes, &|_| None);
        ledger.extend(&messages, &Unit::Bytes, &|_| None);
        for start in 0..=50 {
            for current in start..=50 {
                let direct: u64 = messages[start..]
                    .iter()
                    .enumerate()
                    .map(|(i, m)| {
                        if start + i < current {
                            elided(m).map_or_else(|| message_bytes(m), |e| message_bytes(&e))
                        } else {
                            message_bytes(m)
                        }
                    })
                    .sum();
                assert_eq!(ledger.suffix(start, current), direct, "{start} {current}");
            }
        }
        for budget in [0, 100, 5_000, 50_000, u64::MAX] {
            let s = ledger.fitting_start(3, 40, budget);
            assert!(s == 50 || ledger.suffix(s, 40) <= budget);
            assert!(s == 3 || ledger.suffix(s - 1, 40) > budget);
        }
    }

    /// The ledger an open builds from costs found newest first is the
    /// one built by costing the messages in order, and takes more messages
    /// without growing its vectors.
    #[test]
    fn a_ledger_from_newest_first_costs_is_the_ledger_of_the_messages() {
        for n in [0usize, 1, 2, 37] {
            let messages: Vec<Message> = (0..n)
                .map(|i| if i % 3 == 2 { tool(i * 300) } else { Message::text(Role::User, "y".repeat(i * 11)) })
                .collect();
            let mut expected = Ledger::default();
            expected.extend(&messages, &Unit::Bytes, &|_| None);
            let (full, elided): (Vec<u64>, Vec<u64>) = messages.iter().rev().map(Ledger::byte_costs).unzip();
            let mut built = Ledger::from_newest_first(full, elided, 8);
            assert_eq!((&built.full, &built.elided, &built.unit), (&expected.full, &expected.elided, &expected.unit));
            let capacity = (built.full.capacity(), built.elided.capacity());
            for m in messages.iter().take(8) {
                built.push(m, &|_| None);
            }
            assert_eq!((built.full.capacity(), built.elided.capacity()), capacity, "{n} messages");
        }
    }

    #[test]
    fn elision_keeps_a_char_boundary_and_says_what_is_left_out() {
        let e = elided(&tool(5000)).unwrap();
        let ContentPart::ToolResult { content, .. } = &e.content[0] else { panic!() };
        assert!(content.len() < 1200 && content.contains("session log keeps them"), "{content}");
        assert!(elided(&tool(100)).is_none());
        assert!(elided(&Message::text(Role::User, "y".repeat(9000))).is_none());
    }

    #[test]
    fn calibration_ignores_impossible_ratios() {
        let mut c = Calibration::default();
        c.observe(40_000, 10); // a server reporting a fixed number
        assert_eq!(c, Calibration::default());
        c.observe(40_000, 10_000);
        assert!((c.bytes_per_token - 3.6).abs() < 1e-9);
        assert!(c.tokens(3600) >= 1000);
    }
}
