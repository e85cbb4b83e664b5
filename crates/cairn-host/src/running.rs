//! The one place a face's turn is put together and started: [`Equipment`]
//! is what a session's turns run with (the tools of the current turn and
//! who answers their calls), built from the host's choice for the turn
//! ([`Equipment::for_turn`], [`Equipment::reequip`]); [`Equipment::run`]
//! assembles core's `TurnEnv` with the face's model, observer and cancel
//! token and starts what the face asked for ([`Step`]), telling each event
//! to the face's observer and, when telemetry is on, to a
//! `cairn_telemetry::TurnTrace` (one implementation for every face). No
//! face builds a `TurnEnv` itself, so what a turn is given is decided here once.
//!
//! Must not: decide a verdict (the approver's gate does), choose tools
//! (the host does, [`SessionHost::turn`]) or present anything (the face's
//! observer does).

use std::path::Path;

use cairn_core::approval::{Approver, PolicyApprover, SharedApprover};
use cairn_core::provider::Provider;
use cairn_core::storage::registers::QueuedPrompt;
use cairn_core::storage::{JsonlStore, Storage};
use cairn_core::{CancelToken, Reopen, Session, ToolRegistry, TurnEnv, TurnError, TurnEvent, TurnOutcome};
use cairn_telemetry::TurnTrace;

use crate::SessionHost;

/// What a face asks a session to do next.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step<'a> {
    /// A new turn with this prompt (an unfinished turn must be resumed
    /// first).
    Prompt(&'a str),
    /// A new turn with this prompt and images after its text (parts made
    /// by `cairn_core::message::image`; refused unless the provider takes
    /// images).
    PromptWithImages(&'a str, &'a [cairn_core::message::ContentPart]),
    /// Continue the interrupted or cancelled turn; nothing when there is
    /// none.
    Resume,
    /// A session created for one prompt (a batch unit, a child): run it
    /// when nothing was written yet, else resume what a killed run left.
    Once(&'a str),
    /// The oldest of the session's queued prompts (with these arrived
    /// since); nothing when the queue is empty.
    Queued(&'a [QueuedPrompt]),
}

/// What a session's turns run with: the tools of the current turn, in a
/// registry built for `approver` (it offers only what that approver can
/// answer), and the approver itself.
pub struct Equipment<A = PolicyApprover> {
    /// The tools of the current turn.
    pub tools: ToolRegistry,
    /// Who approves the turn's Write and Destructive calls.
    pub approver: A,
}

impl<A: Approver> Equipment<A> {
    /// Run `step` on `session` with `provider`, telling each event to
    /// `observer`, until it ends or `cancel` is cancelled.
    pub fn run<S: Storage>(
        &mut self,
        session: &mut Session<S>,
        provider: &dyn Provider,
        step: Step<'_>,
        observer: &mut dyn FnMut(&TurnEvent),
        cancel: &CancelToken,
    ) -> Result<Option<TurnOutcome>, TurnError> {
        // Telemetry hears the same events as the face (`cairn-telemetry`);
        // off, this is one check and the face's observer runs alone.
        let Some(trace) = TurnTrace::start(&session.store().header().id, provider.name(), provider.model()) else {
            return self.step(session, provider, step, observer, cancel);
        };
        let mut trace = trace.with_tools(self.tools.specs());
        keep_parent(session);
        let result = self.step(
            session,
            provider,
            step,
            &mut |event| {
                observer(event);
                trace.observe(event);
            },
            cancel,
        );
        trace.finish(result.as_ref().map(Option::as_ref));
        result
    }

    fn step<S: Storage>(
        &mut self,
        session: &mut Session<S>,
        provider: &dyn Provider,
        step: Step<'_>,
        observer: &mut dyn FnMut(&TurnEvent),
        cancel: &CancelToken,
    ) -> Result<Option<TurnOutcome>, TurnError> {
        let mut env = TurnEnv { provider, tools: &self.tools, approver: &mut self.approver, observer, cancel };
        match step {
            Step::Prompt(text) => session.run_turn(text, &mut env).map(Some),
            Step::PromptWithImages(text, images) => session.run_turn_with_images(text, images, &mut env).map(Some),
            Step::Resume => session.resume(&mut env),
            Step::Once(text) if session.store().entry_count() == 0 => session.run_turn(text, &mut env).map(Some),
            Step::Once(_) => session.resume(&mut env),
            Step::Queued(arrived) => session.run_queued(arrived, &mut env),
        }
    }

    /// Summarise `session`'s conversation now (core's `Session::compact`):
    /// the summary's entry id, `None` when there is nothing to compact.
    pub fn compact<S: Storage>(
        &mut self,
        session: &mut Session<S>,
        provider: &dyn Provider,
        observer: &mut dyn FnMut(&TurnEvent),
        cancel: &CancelToken,
    ) -> Result<Option<String>, TurnError> {
        let mut env = TurnEnv { provider, tools: &self.tools, approver: &mut self.approver, observer, cancel };
        session.compact(&mut env)
    }
}

/// Keep the traceparent a session's turns run under in its log, so a
/// resume in another process or on another worker continues under it
/// (`cairn_telemetry::keep_parent`); with none handed in, the kept one is
/// used. Best effort: telemetry never fails a turn, so a commit refused
/// here (a lost lease) is left to the turn's own commit to report.
fn keep_parent<S: Storage>(session: &mut Session<S>) {
    let (ns, key) = cairn_telemetry::PARENT_REGISTER;
    let kept = session.store().register(ns, key).and_then(|raw| raw.parse::<String>().ok());
    let id = session.store().header().id.clone();
    if let Some(given) = cairn_telemetry::keep_parent(&id, kept.as_deref())
        // Hex digits and dashes only (`cairn_telemetry::traceparent`).
        && let Ok(raw) = cairn_core::storage::RawJson::from_json(format!("\"{given}\""))
    {
        let _ = session.keep_fact(ns, key, raw);
    }
}

impl Equipment<PolicyApprover> {
    /// Open the session in `store` (working in `cwd`) equipped by `host`
    /// for `prompt` (`None`: the interrupted turn, with the choice recorded
    /// for it), its calls answered by `approver`; `person` is who the
    /// approver asks, handed down to the children the session spawns.
    /// Each note on the tools goes to `note`.
    pub fn for_turn(
        host: &dyn SessionHost,
        mut store: JsonlStore,
        cwd: &Path,
        prompt: Option<&str>,
        approver: PolicyApprover,
        person: Option<&SharedApprover>,
        note: impl FnMut(&str),
    ) -> anyhow::Result<(Session<JsonlStore>, Self)> {
        let (tools, config) = host.turn(cwd, &mut store, prompt, &approver, person)?;
        let tools = tools.into_registry(&approver, note);
        Ok((Session::open(store, config)?, Equipment { tools, approver }))
    }

    /// Equip the next turn of `session` for `prompt`, as
    /// [`Equipment::for_turn`] does, reopening it without checking the
    /// whole log again when only the host's choice was recorded since
    /// (`Session::reopen`). On failure the session is gone (`None`) only
    /// when it cannot be reopened at all.
    pub fn reequip(
        &mut self,
        host: &dyn SessionHost,
        session: Session<JsonlStore>,
        cwd: &Path,
        prompt: Option<&str>,
        person: Option<&SharedApprover>,
        note: impl FnMut(&str),
    ) -> Result<Session<JsonlStore>, Unequipped> {
        let mut reopen: Reopen<JsonlStore> = session.into_reopen();
        match host.turn(cwd, reopen.store_mut(), prompt, &self.approver, person) {
            Ok((tools, config)) => {
                self.tools = tools.into_registry(&self.approver, note);
                Session::reopen(reopen, config).map_err(|e| Unequipped { error: e.into(), session: None })
            }
            Err(error) => {
                let session = Session::reopen(reopen, host.session_config()).ok().map(Box::new);
                Err(Unequipped { error, session })
            }
        }
    }
}

/// Why a session could not be equipped for its next turn, and the session
/// when it is still open (with the tools it had).
#[derive(Debug)]
pub struct Unequipped {
    /// What failed.
    pub error: anyhow::Error,
    /// The session, still open with its previous tools; `None` when it
    /// could not be reopened.
    pub session: Option<Box<Session<JsonlStore>>>,
}

impl<A> std::fmt::Debug for Equipment<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Equipment").field("tools", &self.tools).finish_non_exhaustive()
    }
}
