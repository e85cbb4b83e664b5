//! Subagents: the built-in tools `spawn_agent` and `wait_agents`, through
//! which a session (the parent) runs child sessions, and the host side of a
//! session family.
//!
//! A child is an ordinary durable session where its parent lives (a
//! [`Place`], handed down as a [`FamilyPlace`]): a session file beside the parent's, or — for a session a
//! PostgreSQL worker drives — a session of the same database, driven within
//! the parent's lease (`db.rs`). Its id is a function of the spawning call,
//! `<parent id>+<invocation id>` ([`child_id`]), so the parent's intent
//! entry (`toolRequested`, holding the session and invocation ids) names
//! the child before the child exists, and creating it twice is impossible:
//! the place refuses an existing id (`JsonlStore::create`,
//! `PgStore::create_within`). Its `fact` `subagent` ([`ChildFact`],
//! committed right after the header) names the parent, the invocation, the
//! depth, the prompt and the authority the child was given.
//!
//! Owns: the child id rule, creating a child once, re-attaching a child by
//! id (finished → its answer is read; unfinished → it is resumed, never run
//! anew), the authority checks (tools ⊆ parent's, allow patterns ⊆
//! parent's, cwd inside the parent's working directory) and the limits
//! (`[subagents]`: depth, children per session, children running at once).
//! Children run on host threads of this process, never in a slot a parent
//! may be waiting in; cairn-core only sees two more tools (`spawn_agent` is
//! `Guarded`, its guard being the child's stored state). The family's code
//! is one, generic over the [`Place`].
//! Must not: drive a child other than through `Session::run_turn` /
//! `Session::resume`, or give a child an approver other than the parent's.
//!
//! By concern: this file holds what a parent hands down ([`Inheritance`],
//! [`ParentProvider`], [`Limits`]), the rule a child is adopted by
//! (`own_child`) and `build`, the family's tools for one session;
//! `place.rs` where a family's sessions live ([`Place`], [`Files`],
//! [`FamilyPlace`]; `db.rs` the database); `tools.rs` the tools and the
//! authority checks of a spawn; `drive.rs` running children on this
//! process's threads and waiting for them; `show.rs` what `cairn show`
//! says of a family.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Result, anyhow};
use cairn_core::Session;
use cairn_core::approval::{Allowlist, Approver, PolicyApprover, SharedApprover};
use cairn_core::storage::Storage;
use cairn_core::tool::Tool;
use cairn_provider::{ProviderConfig, ProviderKind};

use crate::family::{ChildFact, child_fact, child_id};
use crate::setup::Setup;
use drive::Family;
use tools::{SpawnAgent, WaitAgents, spawn_spec, wait_spec};

#[cfg(feature = "postgres")]
pub mod db;
mod drive;
mod place;
mod show;
mod tools;

pub use crate::config::SubagentLimits as Limits;
pub use crate::family::{SPAWN, WAIT};
#[cfg(feature = "postgres")]
pub use drive::finish_children;
pub use drive::{finish_running, reattach_children};
pub use place::{FamilyPlace, Files, Place};
pub use show::{child_lines, usage_line};
pub(crate) use tools::is_local;
pub use tools::tools;

impl Limits {
    fn from_settings(ctx: &Setup) -> Result<Self> {
        match &ctx.settings.subagents {
            None => Ok(Self::default()),
            Some(table) => table
                .clone()
                .try_into()
                .map_err(|e| anyhow!("[subagents] in {} is invalid: {e}", ctx.settings.config_file.display())),
        }
    }
}

/// What a parent session hands down to its children: who answers their
/// calls that no allow rule covers (the person the parent asks, through
/// its face; `None`: nobody, a headless session), the parent's standing
/// approval of Write calls (`--yes`, `yes=1`), and the allow patterns a
/// child may be given. Never more than the parent has.
#[derive(Debug, Clone, Default)]
pub struct Inheritance {
    /// The parent's person, shared by every session of the family.
    pub person: Option<SharedApprover>,
    /// Who approves every Write call (core's `PolicyApprover::approve_writes`).
    pub approve_writes: Option<String>,
    /// The parent's allow patterns.
    pub allow: Vec<String>,
    /// The parent's provider, which its children run on (`None`: the
    /// configured one).
    pub provider: Option<ParentProvider>,
    /// Where the family's sessions live.
    pub place: FamilyPlace,
}

/// A provider a session was started on other than the configured one (a
/// served session's `provider=`, `model=`, `script=`).
#[derive(Debug, Clone, Default)]
pub struct ParentProvider {
    /// Its name.
    pub name: String,
    /// The model, if one was given.
    pub model: Option<String>,
    /// The scripted provider's script, if one was given.
    pub script: Option<PathBuf>,
}

impl Inheritance {
    /// What a session whose calls `policy` answers, asking `person`, hands
    /// down.
    pub fn of(policy: &PolicyApprover, person: Option<SharedApprover>) -> Self {
        Self {
            person,
            approve_writes: policy.writes_approved_by().map(str::to_owned),
            allow: policy.allowlist().rules().iter().map(|r| r.text().to_owned()).collect(),
            provider: None,
            place: FamilyPlace::Files,
        }
    }

    /// A child's approval policy: its own allow patterns (a subset of
    /// these), its parent's person and standing approval.
    fn policy(&self, allow: Allowlist) -> PolicyApprover {
        let person = self.person.clone().map(|p| Box::new(p) as Box<dyn Approver>);
        let policy = PolicyApprover::new(allow, person);
        match &self.approve_writes {
            Some(by) => policy.approve_writes(by.clone()),
            None => policy,
        }
    }
}

/// How a child ended, as the parent sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum ChildResult {
    /// Its final answer.
    Answered(String),
    /// It could not finish (the reason).
    Failed(String),
}

/// A child's state read from its file.
#[derive(Debug, Clone, PartialEq)]
enum ChildStatus {
    NotStarted,
    Unfinished,
    Finished(ChildResult),
}

fn last_answer<S: Storage>(session: &Session<S>) -> String {
    cairn_core::report::last_answer(&session.messages())
}

/// Whether the existing session `id` is its family's own child — the one
/// invariant that keeps a session under a child's name (imported, copied
/// in) from answering for the parent's call or being driven as its child.
/// A child is created only by [`Family::attach`], whose first record is the
/// child's `subagent` fact, made from the parent's record of the spawn (its
/// `spawn_agent` request: parent, invocation, depth, prompt, peers). So a
/// session is the family's own only when it holds that fact naming the
/// parent and call its id names, equal in those fields to `expected` (the
/// fact the call's request makes, when the caller has it), or — cut off
/// between the header and the fact — holds nothing at all; and, in a
/// database, when every line of it was written under a family's lease
/// ([`Place::written_by_a_family`]). `Err` says why not, and what to do.
fn own_child<P: Place + ?Sized>(
    place: &P,
    ctx: &Setup,
    id: &str,
    store: &P::Store,
    expected: Option<&ChildFact>,
) -> Result<()> {
    let refuse = |why: String| {
        anyhow!(
            "session {} has a subagent's name but was not created by this call of its parent ({why}); it is not adopted — it was imported or copied in: remove it, then run the call again",
            id.escape_debug()
        )
    };
    match child_fact(store) {
        None if store.entry_count() == 0 && store.last_seq() == 0 => {}
        None => return Err(refuse("it holds records but no `subagent` fact".to_owned())),
        Some(fact) => {
            if child_id(&fact.parent, &fact.invocation) != id {
                return Err(refuse(format!(
                    "its `subagent` fact names call {} of {}",
                    fact.invocation.escape_debug(),
                    fact.parent.escape_debug()
                )));
            }
            if let Some(want) = expected {
                let same = fact.parent == want.parent
                    && fact.invocation == want.invocation
                    && fact.depth == want.depth
                    && fact.prompt == want.prompt
                    && fact.peers == want.peers;
                if !same {
                    return Err(refuse("its `subagent` fact is not the one the parent's request makes".to_owned()));
                }
            }
        }
    }
    if !place.written_by_a_family(ctx, id)? {
        return Err(refuse("some of its lines were not written under its family's lease".to_owned()));
    }
    Ok(())
}

/// A child's state as its store says (read, never written).
fn status<S: Storage>(ctx: &Setup, store: S) -> Result<ChildStatus> {
    if store.entry_count() == 0 {
        return Ok(ChildStatus::NotStarted);
    }
    let mut config = crate::parts::session_config(ctx);
    config.lane = cairn_core::turn::DEFAULT_LANE.to_owned();
    let session = Session::open(store, config)?;
    if session.needs_resume() {
        return Ok(ChildStatus::Unfinished);
    }
    Ok(ChildStatus::Finished(ChildResult::Answered(last_answer(&session))))
}

/// What one session may hand down to its children.
#[derive(Debug, Clone)]
struct Scope {
    cwd: PathBuf,
    tools: Vec<String>,
    allow: Vec<String>,
    provider: String,
    model: Option<String>,
    script: Option<PathBuf>,
    scripted: bool,
    /// Who answers for the session and its children.
    inheritance: Inheritance,
}

fn is_scripted(ctx: &Setup, provider: &str) -> bool {
    ProviderConfig::resolve(provider, ctx.settings.providers.get(provider))
        .is_ok_and(|c| c.kind == ProviderKind::Scripted)
}

/// What `scope.tools` names of the family's tools: `spawn_agent` and
/// `wait_agents` only when `may_spawn` (below the depth limit), the peer
/// tools (`peers.rs`) when named.
fn build<P: Place>(family: &'static Family, scope: Scope, place: Arc<P>, may_spawn: bool) -> Vec<Arc<dyn Tool>> {
    let scope = Arc::new(scope);
    let spawn =
        SpawnAgent { spec: spawn_spec(scope.scripted), scope: Arc::clone(&scope), place: Arc::clone(&place), family };
    let logs = Arc::new(place::FamilyLogs { place: Arc::clone(&place), ctx: &family.ctx });
    let wait = WaitAgents { spec: wait_spec(), inheritance: scope.inheritance.clone(), place, family };
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    if may_spawn {
        tools.extend([Arc::new(spawn) as Arc<dyn Tool>, Arc::new(wait)]);
    }
    let peers = crate::peers::tools(logs);
    tools.extend(peers.into_iter().filter(|t| scope.tools.contains(&t.spec().name)));
    tools
}
