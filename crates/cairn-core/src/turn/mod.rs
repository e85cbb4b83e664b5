//! The agent turn: a [`Session`] drives the tole state machine over a
//! [`Storage`], committing every step of the loop as one line.
//!
//! One turn: `run_turn` commits the user message and the provider-call
//! intent (pc `Planning`); the provider's settled answer is committed with
//! its usage rows (pc `ToolCall` or `Final`); each tool call then goes
//! through the effect sandwich — intent (`toolRequested` + `pending`
//! register), verdict (`toolStarted` or `toolRejected`), effect, settlement
//! (`toolCompleted`/`toolFailed` + delete `pending` + pc advance) — and the
//! loop asks the provider again. Every pc move is a CAS on the state's seq
//! made in the same commit as the entries that justify it, so the log alone
//! says where a killed turn stood; [`Session::resume`] continues from there.
//!
//! Invariants:
//! - a `pending` key is live exactly while its invocation's pc is
//!   `AwaitingApproval` or `Executing` (or a cancelled pc that resumes
//!   there), and `op/provider` exactly while the pc is `Planning`; both are
//!   checked before every commit that moves the pc (`lifecycle`);
//! - each invocation gets exactly one settlement entry;
//! - observers are told of an entry only after the line holding it is
//!   committed (events travel in the [`TxBuilder`] with their entries);
//! - the in-memory conversation equals a rebuild from the lane's path.
//!
//! Layout: [`pc`] (phases and legal moves), `drive` (the loop and the
//! sandwich), `effect` (running a tool with limits), `conversation` (entries
//! to messages), `lifecycle` (the turn's half of the register lifecycles). This module must not print, spawn or talk HTTP: providers,
//! tools and approvers are injected through [`TurnEnv`].

mod asked;
mod context;
mod conversation;
mod drive;
mod effect;
mod lifecycle;
pub mod pc;
mod rewind;

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use conversation::{entry_message, entry_view_message};
pub use effect::{decide_bypass, review_staged_effect};
pub use pc::{Pc, Phase, TransitionError};

use crate::CancelToken;
use crate::approval::{AllowRule, AllowRuleError, Allowlist, Approver};
use crate::events::{EntryPayload, EntryType, TurnEvent};
use crate::hooks::{PROMPT_REFUSED_FACT, PromptRefused, UserPrompt};
use crate::message::{ContentPart, Message};
use crate::projection::{LifecycleError, ToolState};
use crate::provider::{Provider, ProviderError};
use crate::registry::ToolRegistry;
use crate::storage::{RawJson, Storage, StorageError, Transaction, registers, to_raw};

/// Register namespace of lane heads.
pub const LANE_NS: &str = registers::LANE;
/// Register namespace of in-flight operations (the provider-call intent).
pub const OP_NS: &str = registers::OP;
/// Register namespace of committed, unsettled tool intents.
pub const PENDING_NS: &str = registers::PENDING;
/// The `op` key of the outstanding provider call.
pub(crate) const PROVIDER_OP: &str = "provider";
/// The default lane.
pub const DEFAULT_LANE: &str = "main";

/// Limits and settings of a session's turns.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionConfig {
    /// Lane new turns run on (default "main").
    pub lane: String,
    /// System prompt sent with every provider call.
    pub system: Option<String>,
    /// Provider calls per turn before it stops (default 50).
    pub max_steps: u32,
    /// Bytes of a tool's output the model sees (default 16 KiB); more is
    /// cut with a marker and kept out of the prompt.
    pub output_cap: usize,
    /// Bytes of the full output kept in the log beyond the cap (default 1 MiB).
    pub stored_output_cap: usize,
    /// Wall-clock limit of one tool call (default 120 s).
    pub tool_timeout: Duration,
    /// Output token limit passed to the provider (and reserved out of the
    /// window); `None` takes the provider's.
    pub max_output_tokens: Option<u32>,
    /// The model's context window in tokens, overriding the provider's;
    /// `None` takes the provider's (none known: requests are not bounded).
    pub context_window: Option<u32>,
    /// Compact by summary when a request would use more than this percent
    /// of the window (default 75); `None` never compacts (requests are
    /// still bounded, oldest messages left out).
    pub compaction_threshold: Option<u8>,
    /// Working directory for tools (default: the session header's `cwd`).
    pub cwd: Option<PathBuf>,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            lane: DEFAULT_LANE.to_owned(),
            system: None,
            max_steps: 50,
            output_cap: 16 * 1024,
            stored_output_cap: 1024 * 1024,
            tool_timeout: Duration::from_secs(120),
            max_output_tokens: None,
            context_window: None,
            compaction_threshold: Some(75),
            cwd: None,
        }
    }
}

/// What a turn needs from its host.
pub struct TurnEnv<'a> {
    /// The model.
    pub provider: &'a dyn Provider,
    /// The tools offered.
    pub tools: &'a ToolRegistry,
    /// Who approves Write and Destructive calls.
    pub approver: &'a mut dyn Approver,
    /// Receives every [`TurnEvent`].
    pub observer: &'a mut dyn FnMut(&TurnEvent),
    /// Cancellation, checked at every checkpoint.
    pub cancel: &'a CancelToken,
}

impl std::fmt::Debug for TurnEnv<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnEnv")
            .field("provider", &self.provider.name())
            .field("tools", self.tools)
            .field("cancelled", &self.cancel.is_cancelled())
            .finish_non_exhaustive()
    }
}

/// How a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TurnStop {
    /// The model gave a final answer.
    Answered,
    /// The step limit was reached.
    StepLimit,
    /// Cancelled through the token (durably; `resume` continues it).
    Cancelled,
    /// A `pre_tool` hook stopped the turn (`continue: false`); the
    /// outcome's text is its reason.
    Stopped,
}

/// The result of a turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnOutcome {
    /// The turn's id.
    pub turn_id: String,
    /// How it ended.
    pub stop: TurnStop,
    /// The final answer's text (empty unless `Answered`); for `Stopped`,
    /// the hook's reason.
    pub text: String,
    /// The final answer's entry id.
    pub entry_id: Option<String>,
    /// Provider calls made.
    pub steps: u32,
}

/// Errors of the turn. Tool failures, rejections and denials are not
/// errors: they are settled in the log and the model replans.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TurnError {
    /// The session store failed (the turn stopped; the log is consistent).
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A turn is in progress; resume it before starting another.
    #[error("a turn is in progress (phase {0:?}); resume it first (`cairn resume`)")]
    NeedsResume(Phase),
    /// The state machine refused a move.
    #[error(transparent)]
    Transition(#[from] TransitionError),
    /// The provider call failed after its retries; the turn stays resumable.
    #[error("provider call failed: {0}; the turn is saved — resume it to ask again")]
    Provider(ProviderError),
    /// The log's turn data is not what cairn writes.
    #[error("session log is inconsistent: {0}")]
    Corrupt(String),
    /// No lane of that name.
    #[error("no lane named {0:?}; list lanes with `cairn show`")]
    NoSuchLane(String),
    /// The lane already exists.
    #[error("a lane named {0:?} already exists; pick another name")]
    LaneExists(String),
    /// The lane is the one this session is on (a turn may run on it).
    #[error("lane {0:?} is the current lane; switch to another lane before removing it")]
    LaneInUse(String),
    /// No entry of that id.
    #[error("no entry with id {0:?}")]
    NoSuchEntry(String),
    /// A stored allow rule does not parse.
    #[error(transparent)]
    AllowRule(#[from] AllowRuleError),
    /// Even the newest message does not fit the context window; nothing
    /// was sent.
    #[error("{0}")]
    ContextOverflow(String),
    /// An effect's precondition failed after its record was committed
    /// (the turn was cancelled, or the store may no longer act: a lease
    /// ending): the effect did not start, and the call stays unsettled for
    /// resume to settle by its replay policy.
    #[error(
        "no effect was started: {0}; the call stays unsettled — resuming the session settles it by its replay policy"
    )]
    NotStarted(String),
    /// The prompt cannot fit the context window even alone; nothing was
    /// recorded and no turn started.
    #[error("{0}")]
    PromptTooLarge(PromptTooLarge),
    /// An image given with the prompt was refused (its type, its data,
    /// the prompt's images too large together, or a provider that takes
    /// no images); nothing was recorded.
    #[error("{0}; nothing was recorded")]
    Image(String),
    /// A `user_prompt` hook refused the prompt; no turn started (the
    /// refusal is the session fact `promptRefused`).
    #[error("the prompt was refused by {by}: {reason}")]
    PromptRefused {
        /// Which hook.
        by: String,
        /// Why.
        reason: String,
    },
}

/// A prompt refused because it cannot fit the model's context window:
/// its size, and what the window leaves for a prompt (estimates, tokens).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptTooLarge {
    /// The prompt's bytes.
    pub bytes: u64,
    /// Its estimated tokens.
    pub tokens: u64,
    /// About how many tokens a prompt may have here.
    pub room: u64,
    /// The context window.
    pub window: u64,
    /// Tokens reserved for the answer.
    pub reserve: u64,
    /// The system prompt's, tool definitions' and summary's estimate.
    pub fixed: u64,
}

impl std::fmt::Display for PromptTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the prompt is {} bytes (about {} tokens) and cannot fit the model's context window of {} tokens: \
             after {} reserved for the answer and about {} for the system prompt and tool definitions, about {} \
             tokens are left for a prompt. Nothing was recorded; the session is as it was. Shorten the prompt, or \
             save the text to a file in the working directory and ask the model to read it (read_file reads a \
             file in parts), or raise `context_window` if the model allows more",
            self.bytes, self.tokens, self.window, self.reserve, self.fixed, self.room
        )
    }
}

impl From<LifecycleError> for TurnError {
    fn from(e: LifecycleError) -> Self {
        TurnError::Corrupt(e.to_string())
    }
}

/// The value of a `pending` register.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PendingValue {
    /// The `toolRequested` entry.
    pub(crate) request_entry: String,
    /// The turn.
    pub(crate) turn_id: String,
}

/// The value of the `op/provider` register: the outstanding provider call
/// (fields in the key order earlier versions wrote).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ProviderOp {
    /// The step (1-based provider call within the turn).
    pub(crate) step: u32,
    /// The turn.
    pub(crate) turn_id: String,
}

/// A transaction under construction: assigns entry ids from the seqs the
/// records will get, chains entries on the lane, and holds the events to
/// tell once (and only if) it is committed.
pub(crate) struct TxBuilder {
    tx: Transaction,
    next_seq: u64,
    head: Option<String>,
    lane: String,
    lane_moved: bool,
    new_messages: Vec<Message>,
    new_message_ids: Vec<String>,
    events: Vec<TurnEvent>,
}

impl TxBuilder {
    pub(crate) fn is_empty(&self) -> bool {
        self.tx.is_empty()
    }

    pub(crate) fn next_id(&self, prefix: &str) -> String {
        format!("{prefix}{}", self.next_seq)
    }

    /// Tell observers `event` once this transaction is committed.
    pub(crate) fn tell(&mut self, event: TurnEvent) {
        self.events.push(event);
    }

    /// Append an entry on the lane, under its payload's type; returns its id.
    pub(crate) fn entry<P: EntryPayload>(&mut self, payload: &P) -> Result<String, TurnError> {
        let id = self.next_id("e");
        let raw = to_raw(payload)?;
        let entry_type = P::TYPE.tag();
        let tx = std::mem::take(&mut self.tx);
        if let Some(message) = conversation::message_of(entry_type, raw.get()) {
            self.new_messages.push(message);
            self.new_message_ids.push(id.clone());
        }
        self.tx = tx.entry(id.clone(), self.head.as_deref(), entry_type, raw);
        self.next_seq = self.next_seq.wrapping_add(1);
        self.head = Some(id.clone());
        self.lane_moved = true;
        Ok(id)
    }

    pub(crate) fn set<T: Serialize>(&mut self, namespace: &str, key: &str, value: &T) -> Result<(), TurnError> {
        let raw = to_raw(value)?;
        self.tx = std::mem::take(&mut self.tx).set(namespace, key, raw);
        self.next_seq = self.next_seq.wrapping_add(1);
        Ok(())
    }

    /// Store a session allow rule (a `fact`).
    pub(crate) fn allow_fact(&mut self, rule: &str, fact: &registers::AllowFact) -> Result<(), TurnError> {
        self.tx = std::mem::take(&mut self.tx).set_session_allow_rule(rule, fact)?;
        self.next_seq += 1;
        Ok(())
    }

    pub(crate) fn delete(&mut self, namespace: &str, key: &str) {
        self.tx = std::mem::take(&mut self.tx).delete(namespace, key);
        self.next_seq = self.next_seq.wrapping_add(1);
    }

    pub(crate) fn usage<T: Serialize>(&mut self, entry_id: Option<&str>, usage: &T) -> Result<(), TurnError> {
        let id = self.next_id("u");
        let raw = to_raw(usage)?;
        self.tx = std::mem::take(&mut self.tx).usage(id, entry_id, raw);
        self.next_seq = self.next_seq.wrapping_add(1);
        Ok(())
    }
}

/// A session: the store plus the turn's view of it.
pub struct Session<S: Storage> {
    store: S,
    config: SessionConfig,
    pc: Pc,
    state_seq: u64,
    lane: String,
    head: Option<String>,
    /// The lane's conversation as entry ids, roles and costs; messages are
    /// read from the store when a request needs them (memory stays near
    /// the store's own).
    ctx: context::ContextState,
    session_allow: Allowlist,
    cwd: PathBuf,
    /// The invocation whose `toolStarted` this process committed (so its
    /// effect has not run yet); any other `Executing` pc is a resume.
    started_here: Option<String>,
    /// What the open's lifecycle check passed (for [`Session::reopen`]).
    checked: Checked,
}

/// Entries from which `Session::open` checks the tool lifecycle on a
/// second thread (below, a thread costs more than it saves).
const PARALLEL_OPEN: usize = 4096;

/// The prefix of a log the strict lifecycle check passed: its length and
/// its last entry's id (so another store of at least as many entries is
/// not taken for the one checked).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Checked {
    entries: usize,
    last_id: Option<String>,
}

impl Checked {
    /// Run the strict lifecycle check over every entry of `store`.
    fn run<S: Storage>(store: &S) -> Result<Self, LifecycleError> {
        let mut tools = crate::projection::LifecycleCheck::default();
        let mut checked = Checked::default();
        let total = store.entry_count();
        store.visit_entry_views(&mut |entry| {
            tools.apply(entry);
            checked.entries += 1;
            if checked.entries == total {
                checked.last_id = Some(entry.id.to_owned());
            }
        });
        tools.finish()?;
        Ok(checked)
    }

    /// Whether the check of `store` would still pass without running it:
    /// `store` holds the checked prefix (same length up to the same last
    /// id) and every entry after it is of a type the check does not look
    /// at (a host's facts, turn marks — not tool events). Reading only
    /// types and ids, this parses no payload.
    fn still_holds<S: Storage>(&self, store: &S) -> bool {
        if store.entry_count() < self.entries {
            return false;
        }
        // Only the checked last entry and those after it are read: a
        // reopen costs what was added, not the log.
        let first = self.entries.saturating_sub(1);
        let mut at = first;
        let mut holds = true;
        store.visit_entry_views_from(first, &mut |entry| {
            at += 1;
            if !holds {
                return;
            }
            if at == self.entries {
                holds = self.last_id.as_deref() == Some(entry.id);
            } else if at > self.entries && crate::projection::LifecycleCheck::looks_at(entry.entry_type) {
                holds = false;
            }
        });
        holds
    }
}

/// A session's store taken out of it ([`Session::into_reopen`]) so that a
/// host can change it between turns (record a fact, choose the turn's
/// tools) and open it again ([`Session::reopen`]) without the full
/// re-check of a long log: what the first open checked stays checked as
/// long as nothing the check looks at was added.
pub struct Reopen<S: Storage> {
    store: S,
    checked: Checked,
    kept: LaneContext,
}

/// The lane a session was on, its head then and the context bookkeeping
/// of that head's path: still true while the head is (entries never
/// change), so a reopen on the same lane and head does not walk it again.
struct LaneContext {
    lane: String,
    head: Option<String>,
    ctx: context::ContextState,
}

impl<S: Storage> std::fmt::Debug for Reopen<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reopen")
            .field("id", &self.store.header().id)
            .field("checked", &self.checked)
            .field("lane", &self.kept.lane)
            .field("head", &self.kept.head)
            .finish_non_exhaustive()
    }
}

impl<S: Storage> Reopen<S> {
    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The store, to commit to (a host's facts; anything the lifecycle
    /// check looks at is checked again by [`Session::reopen`]).
    pub fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }

    /// The store alone (its next open checks everything).
    pub fn into_store(self) -> S {
        self.store
    }
}

impl<S: Storage> std::fmt::Debug for Session<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.store.header().id)
            .field("pc", &self.pc)
            .field("lane", &self.lane)
            .field("head", &self.head)
            .finish_non_exhaustive()
    }
}

fn parse_register<T: for<'a> Deserialize<'a>>(raw: &RawJson, what: &str) -> Result<T, TurnError> {
    raw.parse().map_err(|e| TurnError::Corrupt(format!("{what}: {e}")))
}

impl<S: Storage> Session<S> {
    /// Open a session over `store`: read the pc, re-check the tool
    /// lifecycle and the pending registers against it, and rebuild the
    /// conversation of the lane.
    pub fn open(store: S, config: SessionConfig) -> Result<Self, TurnError> {
        Self::open_checked(store, config, None)
    }

    /// [`Session::open`] of a store taken out of a session with
    /// [`Session::into_reopen`]: the same checks and state, except that the
    /// strict lifecycle check is not run again when nothing it looks at was
    /// added since (on a long log it is most of an open's time).
    pub fn reopen(reopen: Reopen<S>, config: SessionConfig) -> Result<Self, TurnError> {
        let Reopen { store, checked, kept } = reopen;
        // A store that is not the one checked gets a full open.
        match checked.still_holds(&store) {
            true => Self::open_checked(store, config, Some((checked, kept))),
            false => Self::open_checked(store, config, None),
        }
    }

    /// Take the store out of this session to open it again with
    /// [`Session::reopen`].
    pub fn into_reopen(self) -> Reopen<S> {
        let kept = LaneContext { lane: self.lane, head: self.head, ctx: self.ctx };
        Reopen { store: self.store, checked: self.checked, kept }
    }

    /// An open; `known` is what a previous open of this store found and
    /// still holds (its lifecycle check, its lane's context).
    fn open_checked(store: S, config: SessionConfig, known: Option<(Checked, LaneContext)>) -> Result<Self, TurnError> {
        let (pc, state_seq) = match store.state() {
            None => (Pc::idle(&config.lane), 0),
            Some(state) => {
                (Pc::decode(&state.pc).map_err(|e| TurnError::Corrupt(format!("state pc: {e}")))?, state.seq)
            }
        };
        // The log's tool lifecycle must be what the turn writes (exactly one
        // settlement per invocation, none without a request) before the
        // turn acts on it.
        // (The check keeps statuses only: the full projection would hold
        // every request and receipt a second time while the session opens.)
        let (checked, (lane, head, ctx)) = match known {
            Some((checked, kept)) => (checked, Self::lane_context(&store, &config, &pc, Some(kept))?),
            None => Self::check_and_lane_context(&store, &config, &pc)?,
        };
        let mut session_allow = Allowlist::new();
        for rule in registers::session_allow_rules(&store) {
            session_allow.push(AllowRule::parse(&rule)?);
        }
        let cwd = config.cwd.clone().unwrap_or_else(|| PathBuf::from(&store.header().cwd));
        Ok(Self { store, config, pc, state_seq, lane, head, ctx, session_allow, cwd, started_here: None, checked })
    }

    /// The strict lifecycle check of the whole log, then
    /// [`lane_context`](Self::lane_context); an error of the check comes
    /// first. Past [`PARALLEL_OPEN`] entries, on a store whose index may be
    /// read from another thread, the lane's context is rebuilt on a second
    /// thread while this one runs the check (the two read the same entries
    /// and write nothing; each is about a fifth of an open's work); the
    /// answer is the same as one after the other. The check's own memory
    /// (every settled invocation's id) is taken and given back on this
    /// thread, so the turn that follows reuses it rather than growing the
    /// process; the context, which the session keeps, is what the other
    /// thread allocates.
    #[allow(clippy::type_complexity)]
    fn check_and_lane_context(
        store: &S,
        config: &SessionConfig,
        pc: &Pc,
    ) -> Result<(Checked, (String, Option<String>, context::ContextState)), TurnError> {
        if store.entry_count() >= PARALLEL_OPEN
            && let Some(index) = store.shared_index()
            && let Ok((lane, head)) = Self::opened_lane(store, config, pc)
        {
            let both = std::thread::scope(|scope| {
                let rebuilding = std::thread::Builder::new()
                    .name("cairn-open-context".to_owned())
                    .spawn_scoped(scope, || context::rebuild(index, head.as_deref()))
                    .ok()?;
                let checked = Checked::run(store);
                // A thread that stopped (it cannot panic, but were it to):
                // both run again below, one after the other.
                let ctx = rebuilding.join().ok()?;
                Some((checked, ctx))
            });
            if let Some((checked, ctx)) = both {
                let checked = checked?;
                return Ok((checked, (lane, head, ctx?)));
            }
        }
        let checked = Checked::run(store)?;
        Ok((checked, Self::lane_context(store, config, pc, None)?))
    }

    /// The stored pc checked against the store, the lane the session is
    /// on and its head.
    fn opened_lane(store: &S, config: &SessionConfig, pc: &Pc) -> Result<(String, Option<String>), TurnError> {
        check_pc(store, pc)?;
        let lane = if pc.in_progress() { pc.lane.clone() } else { config.lane.clone() };
        let head = match store.register(LANE_NS, &lane) {
            Some(raw) => Some(parse_register::<String>(&raw, "lane register")?),
            None if lane == DEFAULT_LANE => None,
            None => return Err(TurnError::NoSuchLane(lane)),
        };
        Ok((lane, head))
    }

    /// [`opened_lane`](Self::opened_lane) and the context of the head's path
    /// (`kept`'s, when it is of the same lane and head).
    #[allow(clippy::type_complexity)]
    fn lane_context(
        store: &S,
        config: &SessionConfig,
        pc: &Pc,
        kept: Option<LaneContext>,
    ) -> Result<(String, Option<String>, context::ContextState), TurnError> {
        let (lane, head) = Self::opened_lane(store, config, pc)?;
        let ctx = match kept {
            Some(kept) if kept.lane == lane && kept.head == head => kept.ctx,
            _ => context::rebuild(store, head.as_deref())?,
        };
        Ok((lane, head, ctx))
    }

    /// Whether a turn was interrupted (crash, provider failure) or cancelled
    /// and can be continued with [`Session::resume`].
    pub fn needs_resume(&self) -> bool {
        self.pc.in_progress()
    }

    /// The program counter.
    pub fn pc(&self) -> &Pc {
        &self.pc
    }

    /// The current lane.
    pub fn lane(&self) -> &str {
        &self.lane
    }

    /// The head entry of the current lane.
    pub fn head(&self) -> Option<&str> {
        self.head.as_deref()
    }

    /// The conversation of the current lane, as providers see it.
    pub fn messages(&self) -> Vec<Message> {
        self.ctx.messages(&self.store)
    }

    /// The conversation of any lane, rebuilt from the log.
    pub fn conversation(&self, lane: &str) -> Result<Vec<Message>, TurnError> {
        let head = self.lane_head(lane)?;
        conversation::rebuild(&self.store, head.as_deref())
    }

    /// Every lane and its head entry, sorted by name.
    pub fn lanes(&self) -> Vec<(String, String)> {
        self.store
            .registers(LANE_NS)
            .into_iter()
            .filter_map(|(k, v)| v.parse::<String>().ok().map(|head| (k, head)))
            .collect()
    }

    /// What happened to every tool invocation, from the log alone.
    pub fn tool_state(&self) -> ToolState {
        // One entry at a time: no copy of the whole log.
        let mut state = ToolState::default();
        self.store.visit_entries(&mut |entry| state.apply(entry));
        state
    }

    /// The session's allow rules stored by "approve for this session".
    pub fn session_allow(&self) -> &Allowlist {
        &self.session_allow
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Give the store back.
    pub fn into_store(self) -> S {
        self.store
    }

    fn lane_head(&self, lane: &str) -> Result<Option<String>, TurnError> {
        match self.store.register(LANE_NS, lane) {
            Some(raw) => Ok(Some(parse_register(&raw, "lane register")?)),
            None if lane == DEFAULT_LANE => Ok(None),
            None => Err(TurnError::NoSuchLane(lane.to_owned())),
        }
    }

    /// Allow Write calls matching `rule` for the rest of this session (a
    /// person's standing approval, recorded like "approve for this
    /// session" and kept across resumes). Like every allow rule it never
    /// covers a Destructive call.
    pub fn allow(&mut self, rule: &str, by: &str) -> Result<AllowRule, TurnError> {
        let parsed = AllowRule::parse(rule)?;
        let fact =
            registers::AllowFact { at: crate::storage::now_millis(), by: by.to_owned(), invocation_id: String::new() };
        self.store.commit(Transaction::new().set_session_allow_rule(parsed.text(), &fact)?)?;
        self.session_allow.push(parsed.clone());
        Ok(parsed)
    }

    /// Keep a host's fact about this session (the traceparent its turns
    /// run under) in `namespace`, a `fact.<suffix>` register namespace of
    /// the host's own that no turn reads: committed on its own, between
    /// turns.
    pub fn keep_fact(&mut self, namespace: &str, key: &str, value: crate::storage::RawJson) -> Result<(), TurnError> {
        self.store.commit(Transaction::new().set(namespace, key, value))?;
        Ok(())
    }

    /// A new lane `lane` whose head is the existing entry `at_entry` (no
    /// copy). Does not switch to it.
    pub fn fork(&mut self, lane: &str, at_entry: &str) -> Result<(), TurnError> {
        if lane.is_empty() || lane.contains(char::is_whitespace) {
            return Err(TurnError::Corrupt(format!("lane name {lane:?} must be a non-empty word")));
        }
        if self.store.register(LANE_NS, lane).is_some() {
            return Err(TurnError::LaneExists(lane.to_owned()));
        }
        if self.store.entry(at_entry).is_none() {
            return Err(TurnError::NoSuchEntry(at_entry.to_owned()));
        }
        self.store.commit(Transaction::new().set(LANE_NS, lane, to_raw(at_entry)?))?;
        Ok(())
    }

    /// Remove the lane `lane` (a person's decision): its head register goes,
    /// its entries stay in the log (other lanes may share them). Refuses the
    /// current lane, on which a turn may be in progress.
    pub fn remove_lane(&mut self, lane: &str) -> Result<(), TurnError> {
        if lane == self.lane || (self.pc.in_progress() && lane == self.pc.lane) {
            return Err(TurnError::LaneInUse(lane.to_owned()));
        }
        if self.store.register(LANE_NS, lane).is_none() {
            return Err(TurnError::NoSuchLane(lane.to_owned()));
        }
        self.store.commit(Transaction::new().delete(LANE_NS, lane))?;
        Ok(())
    }

    /// Make `lane` the one new turns run on.
    pub fn switch_lane(&mut self, lane: &str) -> Result<(), TurnError> {
        if self.pc.in_progress() {
            return Err(TurnError::NeedsResume(self.pc.phase));
        }
        let head = self.lane_head(lane)?;
        self.load_conversation(head.as_deref())?;
        self.head = head;
        self.lane = lane.to_owned();
        self.config.lane = lane.to_owned();
        Ok(())
    }

    pub(crate) fn tx(&self) -> TxBuilder {
        TxBuilder {
            tx: Transaction::new(),
            // Wrapping: ids only; the store refuses an exhausted seq space.
            next_seq: self.store.last_seq().wrapping_add(1),
            head: self.head.clone(),
            lane: self.lane.clone(),
            lane_moved: false,
            new_messages: Vec::new(),
            new_message_ids: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Commit `b`, moving the pc to `pc` by CAS on the state's seq, then
    /// tell `observer` the events `b` holds. A move of the pc is refused
    /// before anything is written if it would leave the `op` or `pending`
    /// registers out of step with it.
    pub(crate) fn commit(
        &mut self,
        b: TxBuilder,
        pc: Option<Pc>,
        observer: &mut dyn FnMut(&TurnEvent),
    ) -> Result<(), TurnError> {
        let mut tx = b.tx;
        if b.lane_moved
            && let Some(head) = &b.head
        {
            tx = tx.set(LANE_NS, b.lane.clone(), to_raw(head)?);
        }
        if let Some(pc) = &pc {
            lifecycle::check(&self.store, &tx, pc)?;
            tx = tx.state(self.state_seq, to_raw(pc)?);
        }
        let committed = self.store.commit(tx)?;
        if let Some(pc) = pc {
            self.state_seq = committed.state_seq.unwrap_or(self.state_seq);
            self.pc = pc;
        }
        self.head = b.head;
        self.ctx.append(b.new_messages, b.new_message_ids);
        for event in &b.events {
            observer(event);
        }
        Ok(())
    }

    /// Start a turn with `user_text` on the current lane and drive it to
    /// Final (or Cancelled). A cancelled earlier turn is abandoned (its
    /// unrun calls are settled as rejected); any other unfinished turn must
    /// be resumed first. `pending` keys the pc does not point at (a log
    /// written by something else) are settled first, as on resume.
    pub fn run_turn(&mut self, user_text: &str, env: &mut TurnEnv<'_>) -> Result<TurnOutcome, TurnError> {
        self.start_turn(user_text, &[], None, env)
    }

    /// [`Session::run_turn`] with images after the text, in the user's
    /// message (each an image part made by [`crate::message::image`]). They
    /// are refused, with nothing recorded, unless the provider takes images
    /// (`Provider::accepts_images`), and checked again here: only images,
    /// of a known type, valid, within the prompt's size limit.
    pub fn run_turn_with_images(
        &mut self,
        user_text: &str,
        images: &[ContentPart],
        env: &mut TurnEnv<'_>,
    ) -> Result<TurnOutcome, TurnError> {
        if !images.is_empty() && !env.provider.accepts_images() {
            return Err(TurnError::Image(format!(
                "{} ({}) takes no images: choose a provider and model that take them, or describe the image in text",
                env.provider.name(),
                env.provider.model()
            )));
        }
        let mut so_far = 0;
        for part in images {
            let ContentPart::Image { mime_type, data } = part else {
                return Err(TurnError::Image("only images may be given beside the prompt's text".to_owned()));
            };
            crate::message::image(mime_type, data, so_far).map_err(|e| TurnError::Image(e.to_string()))?;
            so_far += data.len();
        }
        self.start_turn(user_text, images, None, env)
    }

    /// Bring `arrived` prompts into the session's prompt queue (those not
    /// brought in before, by their `n`) and run a turn with the oldest
    /// queued prompt, which leaves the queue in the line that commits it as
    /// the user's message. `None` when the queue is empty (nothing is
    /// written). Like [`Session::run_turn`], an unfinished turn must be
    /// resumed first.
    pub fn run_queued(
        &mut self,
        arrived: &[registers::QueuedPrompt],
        env: &mut TurnEnv<'_>,
    ) -> Result<Option<TurnOutcome>, TurnError> {
        let mut queue = registers::prompt_queue(&self.store);
        queue.bring_in(arrived);
        if queue.items.is_empty() {
            return Ok(None);
        }
        let next = queue.items.remove(0);
        self.start_turn(&next.prompt, &[], Some(&queue), env).map(Some)
    }

    /// Start a turn with `user_text`; `queue`, when given, is the prompt
    /// queue as it stands once this turn's prompt has left it, set in the
    /// same line as the user's message.
    fn start_turn(
        &mut self,
        user_text: &str,
        images: &[ContentPart],
        queue: Option<&registers::PromptQueue>,
        env: &mut TurnEnv<'_>,
    ) -> Result<TurnOutcome, TurnError> {
        self.started_here = None;
        match self.pc.phase {
            Phase::Idle | Phase::Final | Phase::Cancelled => {}
            phase => return Err(TurnError::NeedsResume(phase)),
        }
        self.settle_orphans(env)?;
        let session_id = self.store.header().id.clone();
        if let Some(hooks) = env.tools.hooks() {
            hooks.session_start(&session_id, &self.cwd, self.store.entry_count() > 0);
        }
        let context = match env.tools.hooks().map(|h| h.user_prompt(&session_id, &self.cwd, user_text)) {
            None | Some(UserPrompt::Continue) => None,
            Some(UserPrompt::AddContext { by, text }) => Some((by, text)),
            Some(UserPrompt::Block { by, reason }) => {
                // Recorded before it takes effect; a queued prompt leaves
                // the queue in the same line, so it is not tried forever.
                let mut b = self.tx();
                b.set(
                    registers::FACT,
                    PROMPT_REFUSED_FACT,
                    &PromptRefused { by: by.clone(), reason: reason.clone(), at: crate::storage::now_millis() },
                )?;
                if let Some(queue) = queue {
                    b.set(registers::FACT, registers::QUEUE_FACT, queue)?;
                }
                self.commit(b, None, env.observer)?;
                return Err(TurnError::PromptRefused { by, reason });
            }
        };
        let mut user = Message::text(crate::message::Role::User, user_text);
        user.content.extend(images.iter().cloned());
        if let Some((by, text)) = context {
            user.content.push(crate::message::ContentPart::Text { text: format!("\n\n[context from {by}]\n{text}") });
        }
        if let Err(refused) = self.check_prompt_fits(env.provider, env.tools.specs(), &user) {
            // A queued prompt leaves the queue all the same, so it is not
            // tried forever; nothing else is written.
            if let Some(queue) = queue {
                let mut b = self.tx();
                b.set(registers::FACT, registers::QUEUE_FACT, queue)?;
                self.commit(b, None, env.observer)?;
            }
            return Err(refused);
        }
        let mut b = self.tx();
        if self.pc.phase == Phase::Cancelled {
            self.abandon_cancelled(&mut b)?;
        }
        let turn_id = b.next_id("t");
        b.entry(&user)?;
        if let Some(queue) = queue {
            b.set(registers::FACT, registers::QUEUE_FACT, queue)?;
        }
        b.set(OP_NS, PROVIDER_OP, &ProviderOp { turn_id: turn_id.clone(), step: 1 })?;
        let mut pc = self.pc.to(Phase::Planning)?;
        pc.turn = Some(turn_id.clone());
        pc.lane = self.lane.clone();
        pc.step = 1;
        pc.assistant = None;
        pc.call = 0;
        pc.invocation = None;
        b.tell(TurnEvent::TurnStarted {
            turn_id,
            lane: self.lane.clone(),
            resumed: false,
            prompt: Some(user_text.to_owned()),
        });
        self.commit(b, Some(pc), env.observer)?;
        self.drive(env)
    }

    /// Continue an interrupted or cancelled turn: settle the pending intent
    /// per its replay policy, re-ask an unsettled provider call, and drive
    /// the turn to Final. `None` when there is nothing to resume.
    pub fn resume(&mut self, env: &mut TurnEnv<'_>) -> Result<Option<TurnOutcome>, TurnError> {
        self.started_here = None;
        self.settle_orphans(env)?;
        if !self.pc.in_progress() {
            return Ok(None);
        }
        if let Some(hooks) = env.tools.hooks() {
            hooks.session_start(&self.store.header().id, &self.cwd, true);
        }
        let turn_id = self.pc.turn.clone().unwrap_or_default();
        let started =
            TurnEvent::TurnStarted { turn_id: turn_id.clone(), lane: self.lane.clone(), resumed: true, prompt: None };
        if self.pc.phase == Phase::Cancelled {
            let inner = match &self.pc.resume {
                Some(inner) => (**inner).clone(),
                None => return Err(TurnError::Corrupt("cancelled pc without a resume point".to_owned())),
            };
            let next = self.pc.to(inner.phase)?;
            let next = Pc { phase: next.phase, resume: None, ..inner };
            let mut b = self.tx();
            if next.phase == Phase::Planning {
                // The provider call is in flight again (a cancel ended it).
                b.set(OP_NS, PROVIDER_OP, &ProviderOp { turn_id, step: next.step })?;
            }
            b.tell(started);
            self.commit(b, Some(next), env.observer)?;
        } else {
            (env.observer)(&started);
        }
        self.drive(env).map(Some)
    }

    pub(crate) fn pending_request(&self, invocation: &str) -> Result<crate::events::ToolRequestedPayload, TurnError> {
        let raw = self
            .store
            .register(PENDING_NS, invocation)
            .ok_or_else(|| TurnError::Corrupt(format!("pc names invocation {invocation} but no pending register")))?;
        let pending: PendingValue = parse_register(&raw, "pending register")?;
        let entry = self
            .store
            .entry(&pending.request_entry)
            .ok_or_else(|| TurnError::Corrupt(format!("pending {invocation}: no entry {}", pending.request_entry)))?;
        entry.payload.parse().map_err(|e| TurnError::Corrupt(format!("toolRequested {}: {e}", entry.id)))
    }

    pub(crate) fn assistant_calls(&self, entry_id: &str) -> Result<Vec<crate::message::ToolCall>, TurnError> {
        let entry = self.store.entry(entry_id).ok_or_else(|| TurnError::NoSuchEntry(entry_id.to_owned()))?;
        let message: Message =
            entry.payload.parse().map_err(|e| TurnError::Corrupt(format!("assistant message {entry_id}: {e}")))?;
        Ok(message.tool_calls().cloned().collect())
    }
}

/// Re-check the stored pc against the log at open: its phase must be one
/// the machine stores, a cancelled pc must resume to a legal phase, the
/// message and invocation it names must exist, and an invocation in flight
/// must have its `pending` register and no settlement yet. Reads only the
/// entries the pc names (open stays cheap on long sessions).
fn check_pc<S: Storage>(store: &S, pc: &Pc) -> Result<(), TurnError> {
    let corrupt = |what: String| Err(TurnError::Corrupt(what));
    let at = match pc.phase {
        Phase::Settling => return corrupt("the stored pc is Settling, which is never stored".to_owned()),
        Phase::Cancelled => match pc.resume.as_deref() {
            None => return corrupt("a cancelled pc without a resume point".to_owned()),
            Some(inner) if !pc::legal(Phase::Cancelled, inner.phase) => {
                return Err(TransitionError { from: Phase::Cancelled, to: inner.phase }.into());
            }
            Some(inner) => inner,
        },
        _ => pc,
    };
    if matches!(at.phase, Phase::Planning | Phase::ToolCall | Phase::AwaitingApproval | Phase::Executing)
        && at.turn.is_none()
    {
        return corrupt(format!("a {:?} pc without a turn id", at.phase));
    }
    if matches!(at.phase, Phase::ToolCall | Phase::AwaitingApproval | Phase::Executing) {
        let Some(assistant) = &at.assistant else {
            return corrupt(format!("a {:?} pc without an assistant message", at.phase));
        };
        let entry = store.entry(assistant).ok_or_else(|| TurnError::NoSuchEntry(assistant.clone()))?;
        let message: Message =
            entry.payload.parse().map_err(|e| TurnError::Corrupt(format!("assistant message {assistant}: {e}")))?;
        let calls = message.tool_calls().count();
        if at.call > calls || (at.phase != Phase::ToolCall && at.call >= calls) {
            return corrupt(format!("the pc is at call {} of a message with {calls} tool calls", at.call));
        }
    }
    if !matches!(at.phase, Phase::AwaitingApproval | Phase::Executing) {
        return Ok(());
    }
    let Some(inv) = at.invocation.as_deref() else {
        return corrupt(format!("a {:?} pc without an invocation", at.phase));
    };
    let Some(raw) = store.register(PENDING_NS, inv) else {
        return corrupt(format!("the pc is at invocation {inv} but it has no pending register"));
    };
    let pending: PendingValue = parse_register(&raw, "pending register")?;
    let Some(request) = store.entry(&pending.request_entry) else {
        return corrupt(format!("pending {inv} names a missing entry {}", pending.request_entry));
    };
    if request.entry_type != EntryType::ToolRequested.tag() {
        return corrupt(format!("pending {inv} names entry {} of type {}", request.id, request.entry_type));
    }
    // The lifecycle entries of one invocation follow each other on the lane:
    // intent, start, bypasses, settlement.
    let mut frontier = store.children(Some(&request.id));
    while !frontier.is_empty() {
        let mut next = Vec::new();
        for entry in frontier {
            let same = || {
                entry.payload.parse::<Value>().ok().and_then(|v| v.get("invocationId").cloned())
                    == Some(Value::String(inv.to_owned()))
            };
            match EntryType::of(&entry.entry_type) {
                Some(t) if t.is_settlement() && same() => {
                    return corrupt(format!(
                        "the pc is at invocation {inv}, which is already settled (entry {})",
                        entry.id
                    ));
                }
                Some(EntryType::ToolStarted | EntryType::ToolBypass | EntryType::ToolStaged) if same() => {
                    next.extend(store.children(Some(&entry.id)));
                }
                _ => {}
            }
        }
        frontier = next;
    }
    Ok(())
}

#[cfg(test)]
mod reopen_tests {
    use super::*;
    use crate::storage::{Header, MemStore};

    /// The open of a long log (the lane's context rebuilt on a second
    /// thread, from the store's index) answers what the check then the
    /// lane's context, one after the other, answer: the same checked
    /// prefix and context, and the check's error first when both fail.
    #[test]
    fn a_long_log_opens_as_it_would_one_step_after_the_other() {
        let message = to_raw(&Message::text(crate::message::Role::User, "hello")).unwrap();
        let mut store = MemStore::new(Header::new("s", "/"));
        let mut parent: Option<String> = None;
        for n in 0..PARALLEL_OPEN + 10 {
            let id = format!("e{n}");
            store
                .commit(Transaction::new().entry(&id, parent.as_deref(), "message", message.clone()).set(
                    LANE_NS,
                    DEFAULT_LANE,
                    to_raw(&id).unwrap(),
                ))
                .unwrap();
            parent = Some(id);
        }
        let mut broken = store.clone();
        add(&mut broken, "bad", "toolStarted"); // started, never requested
        assert!(store.shared_index().is_some() && store.entry_count() >= PARALLEL_OPEN);
        for (store, name) in [(&store, "healthy"), (&broken, "a lifecycle anomaly")] {
            for lane in [DEFAULT_LANE, "nowhere"] {
                let config = SessionConfig { lane: lane.to_owned(), ..SessionConfig::default() };
                let pc = Pc::idle(lane);
                let both = Session::<MemStore>::check_and_lane_context(store, &config, &pc);
                let one_then_other = Checked::run(store)
                    .map_err(TurnError::from)
                    .and_then(|checked| Ok((checked, Session::<MemStore>::lane_context(store, &config, &pc, None)?)));
                assert_eq!(format!("{both:?}"), format!("{one_then_other:?}"), "{name}, lane {lane}");
                assert_eq!(both.is_ok(), name == "healthy" && lane == DEFAULT_LANE, "{name}, lane {lane}: {both:?}");
            }
        }
    }

    fn add(store: &mut MemStore, id: &str, entry_type: &str) {
        let payload = to_raw(&serde_json::json!({"invocationId": "i1"})).unwrap();
        store.commit(Transaction::new().entry(id, None, entry_type, payload)).unwrap();
    }

    #[test]
    fn what_was_checked_holds_until_a_tool_event_is_added_or_the_log_is_another() {
        let mut store = MemStore::new(Header::new("s", "/"));
        add(&mut store, "e1", "message");
        add(&mut store, "e2", "turnEnded");
        let checked = Checked::run(&store).unwrap();
        assert_eq!(checked, Checked { entries: 2, last_id: Some("e2".to_owned()) });
        assert!(checked.still_holds(&store));
        // Entries the check does not look at: still holds, nothing parsed.
        add(&mut store, "e3", "message");
        add(&mut store, "e4", "turnEnded");
        add(&mut store, "e5", "somethingNew");
        store.commit(Transaction::new().set("lane", "main", to_raw(&"e4").unwrap())).unwrap();
        assert!(checked.still_holds(&store));
        // A tool event: checked again.
        let mut with_tool = store.clone();
        add(&mut with_tool, "e6", "toolCompleted");
        assert!(!checked.still_holds(&with_tool));
        // Another log: shorter, or its entry at the checked length differs.
        let mut other = MemStore::new(Header::new("s", "/"));
        add(&mut other, "e1", "message");
        assert!(!checked.still_holds(&other));
        add(&mut other, "x2", "message");
        add(&mut other, "e3", "message");
        assert!(!checked.still_holds(&other));
        // The empty prefix holds for any log without tool events.
        assert!(Checked::default().still_holds(&other));
        assert!(!Checked::default().still_holds(&with_tool));
    }
}
