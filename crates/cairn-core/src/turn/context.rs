//! The bounded view of a lane's conversation that a provider call gets,
//! and compaction by summary.
//!
//! A request is: the system prompt, the latest compaction summary on the
//! lane's path (as the first user message), and the newest messages that
//! fit the window minus the output reserve, with large tool outputs older
//! than the current turn cut to their first part. Costs come from the
//! [`Ledger`] (prefix sums extended as messages are appended), so building
//! a request costs O(what is sent + log n), never a scan of the history.
//!
//! A compaction is an effect like a provider call: its intent (`op/compact`
//! naming the covered range) is committed with a CAS on the pc before the
//! summariser is asked; the `compaction` entry (which moves the lane head),
//! its usage rows and the end of the op are one line. A crash between the
//! two re-asks with the recorded range, so one summary is written, never
//! two. Nothing is deleted: the covered entries stay in the log, and a lane
//! forked before the compaction entry never sees it.
//!
//! It must not decide anything about tools or approval, and must not send
//! a request the estimate says does not fit.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{OP_NS, Session, TurnEnv, TurnError};
use crate::context::{Calibration, Ledger, Unit, elided, message_text};
use crate::events::{CompactionPayload, CompactionReason, EntryType, TurnEvent};
use crate::message::{Message, Role};
use crate::provider::{ModelRequest, Provider, ProviderErrorKind, RequestPurpose};
use crate::storage::{Entry, EntryView, SessionIndex, Storage, StorageError};
use crate::tool::ToolSpec;

/// The `op` key of a compaction in flight.
pub(crate) const COMPACT_OP: &str = "compact";

/// Tokens kept free beyond the estimate (framing the estimate cannot see).
const SLACK_TOKENS: u64 = 64;
/// The window assumed for a forced compaction when the provider says none.
const FALLBACK_WINDOW: u64 = 32_768;
/// What the summariser is told.
const SUMMARISE: &str = "You write the running summary of an agent's conversation. The summary replaces \
the older messages in the agent's context, so keep everything the agent needs to continue: the user's goals \
and instructions, decisions made, facts learned, files and commands involved, tool results that still matter, \
and what is still open. Be concise and factual; write only the summary.";

/// The value of `op/compact`: the range a compaction in flight covers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CompactOp {
    /// First entry covered.
    pub(crate) first_entry: String,
    /// Last entry covered (inclusive).
    pub(crate) last_entry: String,
    /// Last covered entry the summariser does not read, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) unread_through: Option<String>,
    /// Why.
    pub(crate) reason: CompactionReason,
}

/// The latest compaction on the lane's path.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Active {
    entry_id: String,
    summary: String,
    /// Messages `0..covered` are covered.
    covered: usize,
    last_entry: String,
}

/// The entry ids of the lane's messages, packed: their bytes in one buffer
/// and where each ends (no allocation per id; an open keeps one per
/// message of the lane).
#[derive(Debug, Clone, Default)]
struct IdList {
    bytes: String,
    ends: Vec<usize>,
}

impl IdList {
    fn push(&mut self, id: &str) {
        self.bytes.push_str(id);
        self.ends.push(self.bytes.len());
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends.get(i - 1).copied().unwrap_or(0) };
        self.bytes.get(start..end)
    }

    /// The position of the last `id` among the first `before` ids.
    fn rposition(&self, before: usize, id: &str) -> Option<usize> {
        (0..before.min(self.len())).rev().find(|&i| self.get(i) == Some(id))
    }

    /// Put the ids in the opposite order, in place (no second list while
    /// a long session opens): the bytes are reversed as a whole, then each
    /// id's bytes back.
    fn reverse(&mut self) {
        // Ends to lengths, in the new order.
        for i in (1..self.ends.len()).rev() {
            self.ends[i] -= self.ends[i - 1];
        }
        self.ends.reverse();
        let mut bytes = std::mem::take(&mut self.bytes).into_bytes();
        bytes.reverse();
        let mut at = 0;
        for end in &mut self.ends {
            let to = at + *end;
            bytes[at..to].reverse();
            *end = to;
            at = to;
        }
        // Each id is its own bytes again, so this is UTF-8; were it not,
        // nothing would match it rather than anything failing.
        self.bytes = String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    }
}

/// The turn's view of the lane's conversation: the entry id and role of
/// each message (the messages themselves stay in the store and are read
/// when a request needs them), the latest compaction, and the costs.
#[derive(Debug, Clone, Default)]
pub(crate) struct ContextState {
    /// The entry id of each message.
    ids: IdList,
    /// The role of each message.
    roles: Vec<Role>,
    active: Option<Active>,
    ledger: Ledger,
    calibrations: BTreeMap<(String, String), Calibration>,
}

/// Messages the bookkeeping of a rebuilt context takes before its vectors
/// grow: a turn's messages are appended without copying the session's
/// (a grown vector is a copy, paid in the turn's peak memory).
const APPEND_ROOM: usize = 4096;

/// What [`rebuild`] reads: a store, or the index that answers its reads
/// (which `Session::open` hands to a second thread; a store need not be
/// `Sync`, its index is).
pub(crate) trait PathReader {
    /// [`Storage::visit_path_views`].
    fn path_views(&self, leaf: &str, f: &mut dyn FnMut(EntryView<'_>)) -> Result<(), StorageError>;
    /// [`Storage::entry`].
    fn entry_by_id(&self, id: &str) -> Option<Entry>;
    /// [`Storage::entry_count`].
    fn entries_held(&self) -> usize;
}

impl<S: Storage> PathReader for S {
    fn path_views(&self, leaf: &str, f: &mut dyn FnMut(EntryView<'_>)) -> Result<(), StorageError> {
        self.visit_path_views(leaf, f)
    }

    fn entry_by_id(&self, id: &str) -> Option<Entry> {
        self.entry(id)
    }

    fn entries_held(&self) -> usize {
        self.entry_count()
    }
}

impl PathReader for SessionIndex {
    fn path_views(&self, leaf: &str, f: &mut dyn FnMut(EntryView<'_>)) -> Result<(), StorageError> {
        self.visit_path_views(leaf, f)
    }

    fn entry_by_id(&self, id: &str) -> Option<Entry> {
        self.entry(id)
    }

    fn entries_held(&self) -> usize {
        self.entry_count()
    }
}

/// The conversation ending at `head`, as context bookkeeping.
///
/// One walk down the parent links from the head, keeping of each message
/// only its id, role and byte costs (the ledger is filled here, so the first
/// step after an open does not read the history again), and of each
/// compaction its position and range: no copy of the path, and the peak of
/// an open stays near the store's own size.
pub(crate) fn rebuild<P: PathReader + ?Sized>(store: &P, head: Option<&str>) -> Result<ContextState, TurnError> {
    let mut state = ContextState::default();
    let Some(head) = head else {
        return Ok(state);
    };
    // Room for every entry (a path holds at most all of them) and a turn's
    // messages, reserved once: the vectors never grow while the walk fills
    // them (each growth a copy and the old buffer left behind) and are
    // turned around in place. Untouched room costs address space, not
    // memory.
    // (+ 1: the ledger's sum before the first message.)
    let most = store.entries_held().saturating_add(APPEND_ROOM + 1);
    let mut ids = IdList { bytes: String::with_capacity(APPEND_ROOM * 32), ends: Vec::with_capacity(most) };
    let mut roles = Vec::with_capacity(most);
    let (mut full, mut elided) = (Vec::with_capacity(most), Vec::with_capacity(most));
    // Compactions, newest first: (messages after it, its entry id, the
    // last entry it covers).
    let mut compactions: Vec<(usize, String, String)> = Vec::new();
    // Each entry is read in place (no copy of its id or payload).
    let walked = store.path_views(head, &mut |entry| {
        if entry.entry_type == EntryType::Compaction.tag() {
            if let Ok(p) = entry.parse::<CompactionPayload>() {
                compactions.push((ids.len(), entry.id.to_owned(), p.last_entry));
            }
        } else if let Some((role, (f, e))) = super::conversation::costs_of(entry.entry_type, entry.payload) {
            full.push(f);
            elided.push(e);
            roles.push(role);
            ids.push(entry.id);
        }
    });
    match walked {
        Ok(()) => {}
        Err(crate::storage::StorageError::NoSuchEntry(id)) => return Err(TurnError::NoSuchEntry(id)),
        Err(e) => return Err(e.into()),
    }
    ids.reverse();
    roles.reverse();
    let n = ids.len();
    state.ledger = Ledger::from_newest_first(full, elided, APPEND_ROOM);
    // The active summary is the newest compaction whose range ends among
    // the messages before it (as a forward replay would leave it).
    for (after, entry_id, last_entry) in compactions {
        let before = n - after;
        if let Some(at) = ids.rposition(before, &last_entry)
            && let Some(entry) = store.entry_by_id(&entry_id)
            && let Ok(p) = entry.payload.parse::<CompactionPayload>()
        {
            state.active = Some(Active { entry_id, summary: p.summary, covered: at + 1, last_entry });
            break;
        }
    }
    state.ids = ids;
    state.roles = roles;
    Ok(state)
}

impl ContextState {
    /// Cost the message just pushed while it is at hand (what the turn
    /// commits), so no step reads the history again to cost it. Only in
    /// bytes, the unit of every provider without its own tokenizer; a
    /// tokenizer's ledger is filled by `extend`.
    fn cost_in_bytes(&mut self, m: &Message) {
        if self.ledger.unit() == &Unit::Bytes && self.ledger.len() + 1 == self.ids.len() {
            self.ledger.push(m, &|_| None);
        }
    }

    fn push(&mut self, id: String, role: Role) {
        self.ids.push(&id);
        self.roles.push(role);
    }

    /// Messages committed by the turn (in order, with their entry ids).
    pub(crate) fn append(&mut self, messages: Vec<Message>, ids: Vec<String>) {
        for (m, id) in messages.into_iter().zip(ids) {
            self.push(id, m.role);
            self.cost_in_bytes(&m);
        }
    }

    /// Message `i`, read from the store.
    fn message<S: Storage>(&self, store: &S, i: usize) -> Option<Message> {
        let mut message = None;
        store.visit_entry(self.ids.get(i)?, &mut |e| message = super::entry_message(e));
        message
    }

    /// Every message of the lane, read from the store.
    pub(crate) fn messages<S: Storage>(&self, store: &S) -> Vec<Message> {
        (0..self.ids.len()).filter_map(|i| self.message(store, i)).collect()
    }

    fn covered(&self) -> usize {
        self.active.as_ref().map_or(0, |a| a.covered)
    }

    /// Cost the messages not costed yet (all of them when the unit changed).
    fn extend<S: Storage>(&mut self, store: &S, provider: &dyn Provider) {
        let unit = match provider.count_tokens("") {
            Some(_) => Unit::Tokens(provider.name().to_owned(), provider.model().to_owned()),
            None => Unit::Bytes,
        };
        if self.ledger.unit() != &unit || self.ledger.len() > self.ids.len() {
            self.ledger.reset(&unit);
        }
        for i in self.ledger.len()..self.ids.len() {
            let m = self.message(store, i).unwrap_or_else(|| Message { role: self.roles[i], content: Vec::new() });
            self.ledger.push(&m, &|t| provider.count_tokens(t));
        }
    }
}

/// A request's messages and what the turn knows of its size.
#[derive(Debug)]
pub(crate) struct View {
    pub(crate) messages: Vec<Message>,
    pub(crate) max_output_tokens: Option<u32>,
    pub(crate) earlier_assistant_messages: usize,
    /// The estimate's input tokens.
    pub(crate) tokens: u64,
    /// Bytes counted (for calibration), when the ledger counts bytes.
    pub(crate) request_bytes: Option<u64>,
}

/// Window and output reserve of the provider at hand.
#[derive(Debug, Clone, Copy)]
struct Limits {
    window: u64,
    reserve: u64,
}

/// How much of the conversation counts, in the ledger's unit.
struct Sizes {
    /// System prompt, tool definitions, summary.
    fixed: u64,
    n: usize,
    covered: usize,
    /// The current turn's first message (the last user message).
    current: usize,
}

fn tools_text(tools: &[ToolSpec]) -> String {
    let mut out = String::new();
    for t in tools {
        out.push_str(&t.name);
        out.push_str(&t.description);
        out.push_str(&t.input_schema.to_string());
    }
    out
}

fn summary_message(active: &Active) -> Message {
    Message::text(
        Role::User,
        format!(
            "[Summary of the earlier conversation through entry {} (compaction {}); the full entries stay in the session log]\n{}",
            active.last_entry, active.entry_id, active.summary
        ),
    )
}

fn left_out_message(count: usize) -> Message {
    Message::text(
        Role::User,
        format!("[{count} earlier messages of this conversation are left out: they do not fit the context window]"),
    )
}

fn role_label(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool result",
    }
}

impl<S: Storage> Session<S> {
    /// Install the conversation of `head` (open, lane switch).
    pub(super) fn load_conversation(&mut self, head: Option<&str>) -> Result<(), TurnError> {
        let state = rebuild(&self.store, head)?;
        let calibrations = std::mem::take(&mut self.ctx.calibrations);
        self.ctx = ContextState { calibrations, ..state };
        Ok(())
    }

    fn limits(&self, provider: &dyn Provider) -> Option<Limits> {
        let window = u64::from(self.config.context_window.or_else(|| provider.context_window())?);
        let reserve = self.config.max_output_tokens.or_else(|| provider.max_output_tokens()).unwrap_or(4096);
        Some(Limits { window, reserve: u64::from(reserve).min(window / 2) })
    }

    /// The calibration of `provider`'s model: learnt in this process, or
    /// from the newest usage row of that model the log holds.
    fn calibration(&mut self, provider: &dyn Provider) -> Calibration {
        let key = (provider.name().to_owned(), provider.model().to_owned());
        if let Some(c) = self.ctx.calibrations.get(&key) {
            return *c;
        }
        let mut c = Calibration::default();
        // Newest first, without copying the ledger (a long session has a
        // row per provider call).
        let mut found = None;
        self.store.visit_usage_newest_first(&mut |row| match row.usage.parse::<crate::provider::AttemptUsage>() {
            Ok(a) if a.provider == key.0 && a.model == key.1 && a.error.is_none() && a.request_bytes.is_some() => {
                found = Some(a);
                false
            }
            _ => true,
        });
        if let Some(a) = found {
            c.observe(a.request_bytes.unwrap_or(0), a.input_tokens);
        }
        self.ctx.calibrations.insert(key, c);
        c
    }

    /// Learn from a settled call.
    pub(super) fn observe_usage(&mut self, provider: &dyn Provider, request_bytes: u64, input_tokens: u64) {
        let key = (provider.name().to_owned(), provider.model().to_owned());
        self.ctx.calibrations.entry(key).or_default().observe(request_bytes, input_tokens);
    }

    /// Ledger units to tokens.
    fn tokens_of(&self, units: u64, cal: Calibration) -> u64 {
        match self.ctx.ledger.unit() {
            Unit::Bytes => cal.tokens(units),
            Unit::Tokens(..) => units,
        }
    }

    /// Tokens to ledger units (rounded down: a budget).
    fn units_of(&self, tokens: u64, cal: Calibration) -> u64 {
        match self.ctx.ledger.unit() {
            Unit::Bytes => ((tokens as f64) * cal.bytes_per_token / 1.1).floor() as u64,
            Unit::Tokens(..) => tokens,
        }
    }

    fn text_units(&self, provider: &dyn Provider, text: &str) -> u64 {
        match self.ctx.ledger.unit() {
            Unit::Bytes => text.len() as u64 + 16,
            Unit::Tokens(..) => provider.count_tokens(text).unwrap_or(text.len() as u64) + 8,
        }
    }

    fn sizes(&mut self, provider: &dyn Provider, tools: &[ToolSpec]) -> Sizes {
        self.ctx.extend(&self.store, provider);
        let n = self.ctx.ids.len();
        let covered = self.ctx.covered().min(n);
        let current = self.ctx.roles[covered..].iter().rposition(|r| *r == Role::User).map_or(covered, |i| covered + i);
        let mut fixed = self.text_units(provider, self.config.system.as_deref().unwrap_or(""));
        fixed += self.text_units(provider, &tools_text(tools));
        if let Some(a) = &self.ctx.active {
            fixed += self.text_units(provider, &message_text(&summary_message(a)));
        } else {
            fixed += self.text_units(provider, &message_text(&left_out_message(n)));
        }
        Sizes { fixed, n, covered, current }
    }

    /// The request view for the next provider call, compacting first when
    /// the conversation passed the threshold, or when `rejected` holds the
    /// estimated tokens of a request the provider refused as too long: the
    /// window is then taken to be 60% of that request (the provider's real
    /// window is below what was sent). Finishes a compaction a crash
    /// interrupted.
    pub(super) fn request_view(&mut self, env: &mut TurnEnv<'_>, rejected: Option<u64>) -> Result<View, TurnError> {
        self.finish_compaction(env)?;
        let provider = env.provider;
        let tools = env.tools.specs();
        let limits = match (self.limits(provider), rejected) {
            (limits, None) => limits,
            (Some(l), Some(sent)) => Some(Limits { window: l.window.min(sent) * 6 / 10, ..l }),
            (None, Some(sent)) => Some(Limits { window: sent * 6 / 10, reserve: (sent / 10).min(4096) }),
        };
        let rejected = rejected.is_some();
        if let (Some(l), Some(threshold)) = (limits, self.config.compaction_threshold) {
            let cal = self.calibration(provider);
            let s = self.sizes(provider, tools);
            // The conversation against the room the window leaves after the
            // system prompt, tool definitions, summary and output reserve
            // (when those are small, this is the share of the window).
            let conversation = self.tokens_of(self.ctx.ledger.suffix(s.covered, s.current), cal);
            let room = l.window.saturating_sub(self.tokens_of(s.fixed, cal) + l.reserve + SLACK_TOKENS);
            if rejected || conversation.saturating_mul(100) > room.saturating_mul(u64::from(threshold)) {
                let reason = if rejected { CompactionReason::ProviderRejected } else { CompactionReason::Threshold };
                self.compact_with(env, reason, l)?;
            }
        }
        let cal = self.calibration(provider);
        let s = self.sizes(provider, tools);
        let mut start = s.covered;
        // When the cut falls inside the current turn, its user message is
        // kept (pinned) ahead of the newest steps, so the model keeps the task.
        let mut pinned = false;
        if let Some(l) = limits {
            let fixed = self.tokens_of(s.fixed, cal) + SLACK_TOKENS + l.reserve;
            let budget = self.units_of(l.window.saturating_sub(fixed), cal);
            start = self.ctx.ledger.fitting_start(s.covered, s.current, budget);
            let user_turn = s.current < s.n && self.ctx.roles[s.current] == Role::User;
            if start > s.current && user_turn {
                let rest = budget.saturating_sub(self.ctx.ledger.cost(s.current));
                start = self.ctx.ledger.fitting_start(s.current + 1, s.current, rest);
                pinned = true;
            }
            while start < s.n && self.ctx.roles[start] == Role::Tool {
                start += 1;
            }
            if start >= s.n && s.n > s.covered || l.window <= fixed {
                let newest = self.tokens_of(self.ctx.ledger.cost(s.n.saturating_sub(1)), cal);
                return Err(TurnError::ContextOverflow(format!(
                    "the request does not fit the context window of {} tokens: {} are reserved for output, the \
                     system prompt, tool definitions and summary take about {}, and the newest message about {}; \
                     raise `context_window` if the model allows more, or lower `max_output_tokens`",
                    l.window,
                    l.reserve,
                    self.tokens_of(s.fixed, cal),
                    newest
                )));
            }
        }
        let mut messages = Vec::with_capacity(s.n - start + 1);
        if let Some(a) = &self.ctx.active {
            messages.push(summary_message(a));
        } else if start > 0 {
            messages.push(left_out_message(start));
        }
        let indices = pinned.then_some(s.current).into_iter().chain(start..s.n);
        for i in indices {
            let m = self.ctx.message(&self.store, i).ok_or_else(|| {
                TurnError::Corrupt(format!(
                    "message entry {} of the lane is missing",
                    self.ctx.ids.get(i).unwrap_or_default()
                ))
            })?;
            match (i < s.current).then(|| elided(&m)).flatten() {
                Some(e) => messages.push(e),
                None => messages.push(m),
            }
        }
        let units = s.fixed
            + self.ctx.ledger.suffix(start, s.current)
            + if pinned { self.ctx.ledger.cost(s.current) } else { 0 };
        Ok(View {
            messages,
            max_output_tokens: limits
                .map(|l| u32::try_from(l.reserve).unwrap_or(u32::MAX))
                .or(self.config.max_output_tokens),
            // Counted per request (a byte a message) rather than kept as
            // prefix counts (a word a message for the session's life).
            earlier_assistant_messages: self.ctx.roles[..start.min(self.ctx.roles.len())]
                .iter()
                .filter(|r| **r == Role::Assistant)
                .count(),
            tokens: self.tokens_of(units, cal),
            request_bytes: matches!(self.ctx.ledger.unit(), Unit::Bytes).then_some(units),
        })
    }

    /// Refuse a prompt that cannot fit the window even alone (the request
    /// view would refuse every request of its turn once it was recorded,
    /// and the session would be stuck on it): nothing is written, and the
    /// error says how large it is and how much fits. The same estimate as
    /// [`Session::request_view`]'s, so what passes here fits there.
    pub(super) fn check_prompt_fits(
        &mut self,
        provider: &dyn Provider,
        tools: &[ToolSpec],
        user: &Message,
    ) -> Result<(), TurnError> {
        let Some(l) = self.limits(provider) else { return Ok(()) };
        let cal = self.calibration(provider);
        let s = self.sizes(provider, tools);
        let fixed = self.tokens_of(s.fixed, cal);
        let budget = self.units_of(l.window.saturating_sub(fixed + SLACK_TOKENS + l.reserve), cal);
        let cost = self.ctx.ledger.cost_of(user, &|t| provider.count_tokens(t));
        if cost <= budget {
            return Ok(());
        }
        Err(TurnError::PromptTooLarge(super::PromptTooLarge {
            bytes: user
                .content
                .iter()
                .map(|p| match p {
                    crate::message::ContentPart::Text { text } => text.len() as u64,
                    _ => 0,
                })
                .sum(),
            tokens: self.tokens_of(cost, cal),
            room: self.tokens_of(budget, cal),
            window: l.window,
            reserve: l.reserve,
            fixed,
        }))
    }

    /// Force a compaction of the current lane (`cairn compact`): every
    /// message before the last user message is summarised. Returns the
    /// `compaction` entry, or `None` when there was nothing to cover. A
    /// turn in progress must be resumed first.
    pub fn compact(&mut self, env: &mut TurnEnv<'_>) -> Result<Option<String>, TurnError> {
        if self.pc.in_progress() {
            return Err(TurnError::NeedsResume(self.pc.phase));
        }
        if self.finish_compaction(env)? {
            return Ok(self.ctx.active.as_ref().map(|a| a.entry_id.clone()));
        }
        let limits = self.limits(env.provider).unwrap_or(Limits { window: FALLBACK_WINDOW, reserve: 4096 });
        let before = self.ctx.active.as_ref().map(|a| a.entry_id.clone());
        self.compact_with(env, CompactionReason::Forced, limits)?;
        let after = self.ctx.active.as_ref().map(|a| a.entry_id.clone());
        Ok(if after != before { after } else { None })
    }

    /// Commit the intent of a compaction for `limits` and run it.
    fn compact_with(
        &mut self,
        env: &mut TurnEnv<'_>,
        reason: CompactionReason,
        limits: Limits,
    ) -> Result<bool, TurnError> {
        let provider = env.provider;
        let cal = self.calibration(provider);
        let s = self.sizes(provider, env.tools.specs());
        // Keep the newest messages in a quarter of what the window leaves;
        // a forced compaction keeps only the current turn.
        let room = limits.window.saturating_sub(self.tokens_of(s.fixed, cal) + limits.reserve + SLACK_TOKENS);
        let keep_budget = if reason == CompactionReason::Forced { 0 } else { self.units_of(room / 4, cal) };
        let mut keep = self.ctx.ledger.fitting_start(s.covered, s.current, keep_budget).min(s.current);
        // Start the kept part at a user message (a turn's start), at the
        // latest at the current turn's.
        match self.ctx.roles[keep..s.current.max(keep)].iter().position(|r| *r == Role::User) {
            Some(i) => keep += i,
            None => keep = s.current,
        }
        // Never into the current turn: its user message is the task (a
        // turn longer than the window is cut by the view, which keeps it).
        if keep <= s.covered {
            return Ok(false);
        }
        // A threshold compaction must be worth a summariser call: what it
        // covers is at least an eighth of what the window leaves (else the
        // fixed part — system prompt, tools, reserve — is what fills the
        // window, and summarising would repeat every step).
        if reason == CompactionReason::Threshold
            && self.tokens_of(self.ctx.ledger.elided_range(s.covered, keep), cal) < room / 8
        {
            return Ok(false);
        }
        let summariser = provider.compaction_provider().unwrap_or(provider);
        let s_window = summariser.context_window().map_or(limits.window, u64::from);
        let s_out = (s_window / 8).clamp(256, 2048);
        let prior = self.ctx.active.as_ref().map_or(0, |a| a.summary.len() as u64);
        let read_budget =
            s_window.saturating_sub(s_out + SLACK_TOKENS * 4 + cal.tokens(prior + SUMMARISE.len() as u64));
        let read_start = self.ctx.ledger.fitting_range_start(s.covered, keep, self.units_of(read_budget, cal));
        let op = CompactOp {
            first_entry: self.ctx.ids.get(s.covered).unwrap_or_default().to_owned(),
            last_entry: self.ctx.ids.get(keep - 1).unwrap_or_default().to_owned(),
            unread_through: (read_start > s.covered)
                .then(|| self.ctx.ids.get(read_start - 1).unwrap_or_default().to_owned()),
            reason,
        };
        if let Some(hooks) = env.tools.hooks() {
            hooks.pre_compact(&self.store.header().id, &self.cwd, reason);
        }
        let mut b = self.tx();
        b.set(OP_NS, COMPACT_OP, &op)?;
        let pc = self.pc.clone();
        self.commit(b, Some(pc), env.observer)?;
        self.run_compaction(env, &op)
    }

    /// Finish a compaction whose intent is committed but whose summary is
    /// not (a crash or a failed call in between). Returns whether one was
    /// committed now.
    fn finish_compaction(&mut self, env: &mut TurnEnv<'_>) -> Result<bool, TurnError> {
        let Some(raw) = self.store.register(OP_NS, COMPACT_OP) else {
            return Ok(false);
        };
        let op: CompactOp = raw.parse().map_err(|e| TurnError::Corrupt(format!("op/{COMPACT_OP}: {e}")))?;
        self.run_compaction(env, &op)
    }

    /// Ask the summariser for `op`'s range and settle the op: the entry,
    /// its usage rows and the end of the op in one line (or, when the call
    /// fails, the usage rows and the end of the op: the turn goes on with
    /// the bounded view).
    fn run_compaction(&mut self, env: &mut TurnEnv<'_>, op: &CompactOp) -> Result<bool, TurnError> {
        let covered = self.ctx.covered();
        let find = |id: &str| self.ctx.ids.rposition(usize::MAX, id);
        let keep = find(&op.last_entry).map(|i| i + 1);
        let read_start = match &op.unread_through {
            Some(id) => find(id).map(|i| i + 1),
            None => Some(covered),
        };
        let (Some(keep), Some(read_start)) = (keep, read_start) else {
            return self.settle_compaction(env, Vec::new(), "the range it names is not on this lane");
        };
        if keep <= covered || read_start > keep {
            return self.settle_compaction(env, Vec::new(), "its range is already covered");
        }
        let mut prompt = String::new();
        if let Some(a) = &self.ctx.active {
            prompt.push_str("The summary so far:\n");
            prompt.push_str(&a.summary);
            prompt.push_str("\n\n");
        }
        if read_start > covered {
            prompt.push_str(&format!(
                "({} older messages are not shown here; they stay in the session log.)\n\n",
                read_start - covered
            ));
        }
        prompt.push_str("The conversation to fold into the summary:\n");
        for i in read_start..keep {
            let Some(m) = self.ctx.message(&self.store, i) else { continue };
            let m = elided(&m).unwrap_or(m);
            prompt.push_str(&format!("\n[{}]\n{}", role_label(m.role), message_text(&m)));
        }
        let provider = env.provider;
        let summariser = provider.compaction_provider().unwrap_or(provider);
        let s_window = summariser.context_window().or(self.config.context_window).map_or(FALLBACK_WINDOW, u64::from);
        let s_out = u32::try_from((s_window / 8).clamp(256, 2048)).unwrap_or(2048);
        let user = [Message::text(Role::User, prompt)];
        let request = ModelRequest {
            system: Some(SUMMARISE),
            messages: &user,
            tools: &[],
            max_output_tokens: Some(s_out),
            earlier_assistant_messages: 0,
            purpose: RequestPurpose::Compaction,
        };
        let request_bytes = user.iter().map(crate::context::message_bytes).sum::<u64>() + SUMMARISE.len() as u64;
        let result = summariser.complete(&request, &mut |_| {}, env.cancel);
        let response = match result {
            Ok(r) if !r.message.joined_text().trim().is_empty() => r,
            Ok(r) => return self.settle_compaction(env, r.attempts, "the summariser answered with no text"),
            Err(e) => {
                let why = if e.kind == ProviderErrorKind::Cancelled { "cancelled" } else { "the summariser failed" };
                (env.observer)(&TurnEvent::ProviderFailed {
                    kind: "compaction".to_owned(),
                    message: e.message.clone(),
                });
                return self.settle_compaction(env, e.attempts, why);
            }
        };
        let summary = response.message.joined_text().trim().to_owned();
        let payload = CompactionPayload {
            summary: summary.clone(),
            first_entry: self.ctx.ids.get(covered).unwrap_or_default().to_owned(),
            last_entry: op.last_entry.clone(),
            messages: keep as u64,
            previous: self.ctx.active.as_ref().map(|a| a.entry_id.clone()),
            unread_through: op.unread_through.clone(),
            reason: op.reason,
            provider: summariser.name().to_owned(),
            model: summariser.model().to_owned(),
        };
        let mut b = self.tx();
        let id = b.entry(&payload)?;
        for mut attempt in response.attempts {
            attempt.request_bytes = Some(request_bytes);
            b.usage(Some(&id), &attempt)?;
            b.tell(TurnEvent::Usage { usage: attempt });
        }
        b.delete(OP_NS, COMPACT_OP);
        b.tell(TurnEvent::Compacted { entry_id: id.clone(), messages: keep as u64, reason: op.reason });
        let pc = self.pc.clone();
        self.commit(b, Some(pc), env.observer)?;
        self.ctx.active = Some(Active { entry_id: id, summary, covered: keep, last_entry: op.last_entry.clone() });
        Ok(true)
    }

    /// End a compaction op without a summary, keeping its usage rows.
    fn settle_compaction(
        &mut self,
        env: &mut TurnEnv<'_>,
        attempts: Vec<crate::provider::AttemptUsage>,
        why: &str,
    ) -> Result<bool, TurnError> {
        // Why is in the usage rows' `error` and the observer's events.
        let _ = why;
        let mut b = self.tx();
        for attempt in attempts {
            b.usage(None, &attempt)?;
            b.tell(TurnEvent::Usage { usage: attempt });
        }
        b.delete(OP_NS, COMPACT_OP);
        let pc = self.pc.clone();
        self.commit(b, Some(pc), env.observer)?;
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::IdList;

    fn list(ids: &[&str]) -> IdList {
        let mut l = IdList::default();
        for id in ids {
            l.push(id);
        }
        l
    }

    /// Turned around in place, the list holds the same ids as one built in
    /// the opposite order: empty ids, multi-byte characters, one id, none.
    #[test]
    fn an_id_list_reversed_in_place_is_the_list_built_backwards() {
        let cases: [&[&str]; 5] =
            [&[], &["only"], &["e1", "e22", "e333"], &["", "ç€🦀", "", "x", "long-id-".repeat(9).leak()], &["a", ""]];
        for ids in cases {
            let mut turned = list(ids);
            turned.reverse();
            let backwards: Vec<&str> = ids.iter().rev().copied().collect();
            let expected = list(&backwards);
            assert_eq!((turned.bytes.as_str(), &turned.ends), (expected.bytes.as_str(), &expected.ends), "{ids:?}");
            let got: Vec<&str> = (0..turned.len()).filter_map(|i| turned.get(i)).collect();
            assert_eq!(got, backwards);
        }
    }
}
