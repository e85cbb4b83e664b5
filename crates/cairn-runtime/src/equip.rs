//! The one place a turn of a session is equipped, for every face that runs
//! sessions (`cairn run`, `chat`, `resume`, `ask`; 9P sessions and batch
//! units; ACP and MCP; PostgreSQL workers; the actors' agent): the tools of
//! the working directory, read once (the tool service's or the in-process
//! ones, `tools::turn_tools`), discovery's choice among them recorded in
//! the session before the turn's first entry (`discover::choose_for_turn`),
//! the subagent family with what the parent hands down, the hooks every call
//! goes through, and the turn's settings with the chosen skills. A
//! capability added here reaches every face at once.
//!
//! Must not: render, ask a person or run a turn. A face presents questions
//! and events (its approver, its observer); cairn-core's turn decides and
//! runs; the registry built here for a face's approver offers only what
//! that approver can answer (`ToolRegistry::new`).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use anyhow::Result;
use cairn_core::approval::Approver;
use cairn_core::storage::Storage;
use cairn_core::tool::Tool;
use cairn_core::{SessionConfig, ToolRegistry};
use cairn_host::HostTools;

use crate::setup::Setup;
use crate::subagents::Inheritance;
use crate::tools::TurnTools;

/// Who answers a session's calls, as equipping needs it.
#[derive(Clone, Copy)]
pub struct Answerer<'a> {
    /// The face's approver for the session (it decides which tools can be
    /// offered: `ToolRegistry::new`).
    pub approver: &'a dyn Approver,
    /// What the session hands down to the children it may spawn (`None`:
    /// this face offers no subagent family).
    pub family: Option<&'a Inheritance>,
}

impl std::fmt::Debug for Answerer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answerer").field("family", &self.family.is_some()).finish_non_exhaustive()
    }
}

/// What a turn is offered, before a face puts it in a registry: the turn's
/// tools in the one carrier every face takes (`HostTools`), with what
/// equipping decided beside them.
pub struct TurnOffer {
    /// The built-ins, the other tools discovery kept (all of them when it
    /// chose nothing), then the family's (`family` of them, last); the
    /// hooks every call goes through; tools skipped and why, discovery's
    /// fallbacks, broken skills.
    pub tools: HostTools,
    /// How many of `tools`, at the end, are the subagent family's.
    pub family: usize,
    /// The turn's settings: the configured ones, with the skills discovery
    /// chose appended to the system prompt.
    pub config: SessionConfig,
    /// Workspace tools and files not loaded because the directory is not
    /// trusted, and how to trust it: said even by a headless face.
    pub untrusted: Vec<String>,
}

impl std::fmt::Debug for TurnOffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.tools.tools.iter().map(|t| t.spec().name.clone()).collect();
        f.debug_struct("TurnOffer").field("tools", &names).field("notes", &self.tools.notes).finish_non_exhaustive()
    }
}

impl TurnOffer {
    /// A registry for `approver` holding the tools and hooks
    /// (`HostTools::registry`); a tool it refuses (a Destructive one where
    /// nobody can be asked) is noted and not offered.
    pub fn registry(&mut self, approver: &dyn Approver) -> ToolRegistry {
        let mut refused = Vec::new();
        let registry = self.tools.registry(approver, |note| refused.push(note.to_owned()));
        self.tools.notes.extend(refused);
        registry
    }

    /// The family's tools (the last `family` of `tools`).
    pub fn family_tools(&self) -> &[Arc<dyn Tool>] {
        let tools = &self.tools.tools;
        tools.get(tools.len().saturating_sub(self.family)..).unwrap_or(&[])
    }

    /// Every note, the untrusted ones last.
    pub fn all_notes(&self) -> impl Iterator<Item = &String> {
        self.tools.notes.iter().chain(&self.untrusted)
    }

    /// The tools, hooks and every note, for a served face to put in its
    /// own registry (`cairn_host::HostTools::into_registry`).
    pub fn into_host_tools(mut self) -> HostTools {
        self.tools.notes.append(&mut self.untrusted);
        self.tools
    }
}

/// Equip a turn of the session in `store` working in `cwd`: `prompt` is
/// the new turn's request (discovery ranks the tools and skills for it and
/// records its choice in `store`), `None` when the interrupted turn is
/// resumed (the recorded choice is offered again). `asker` is the face's
/// approver for the session, `family` what the session hands down to the
/// children it may spawn (`None`: this face offers no family); `config` is
/// the face's settings for the session.
pub fn turn<S: Storage>(
    ctx: &Setup,
    cwd: &Path,
    store: &mut S,
    prompt: Option<&str>,
    answerer: Answerer<'_>,
    config: SessionConfig,
) -> Result<TurnOffer> {
    let tools = crate::tools::turn_tools(ctx, cwd)?;
    let choice = crate::discover::choose_for_turn(ctx, cwd, store, prompt, &tools)?;
    let mut equipped = offer(ctx, cwd, &tools, choice.keep.as_ref(), answerer)?;
    equipped.tools.notes.extend(choice.notes.iter().cloned());
    equipped.config = crate::discover::skills_config(config, &choice);
    Ok(equipped)
}

/// The tools read for a turn (`tools`), only the built-ins and the ones in
/// `keep` when it is given (discovery's choice; `None`: every tool), then
/// the family's (see [`Answerer`]), with the configured settings. For a face
/// without turns of its own to choose for (MCP), or one that chose already.
pub fn offer(
    ctx: &Setup,
    cwd: &Path,
    tools: &TurnTools,
    keep: Option<&BTreeSet<String>>,
    answerer: Answerer<'_>,
) -> Result<TurnOffer> {
    let mut offered = tools.chosen(keep);
    // The embedded 135M model is not offered `plan` (as it is not offered
    // the family's tools): it cannot use it, and its prompt and decoding
    // grammar stay as they were.
    if crate::subagents::is_local(ctx, &ctx.settings.provider.value) {
        offered.tools.retain(|t| t.spec().name != cairn_tools::builtin::plan::NAME);
    }
    let mut family = 0;
    if let Some(inheritance) = answerer.family {
        // A child may be given only what its parent is offered: the tools
        // a registry for the parent's approver admits.
        let parent = offered.registry(answerer.approver, |_| {});
        let names = parent.specs().iter().map(|s| s.name.clone()).collect();
        let tools = crate::subagents::tools(ctx, cwd, names, inheritance.clone())?;
        family = tools.len();
        offered.tools.extend(tools);
    }
    Ok(TurnOffer {
        tools: offered,
        family,
        config: crate::parts::session_config(ctx),
        untrusted: tools.untrusted.clone(),
    })
}
