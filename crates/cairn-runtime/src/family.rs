//! A session's place in a family of subagents, as ids and its `subagent`
//! fact say it: who is a child, of whom, spawned by which call, with what
//! authority. Read by listings, peers, resume and the subagent tools; it
//! must not run or spawn anything (that is `subagents/`).

use std::path::PathBuf;

use cairn_core::storage::Storage;
use cairn_core::storage::registers::FACT;
use serde::{Deserialize, Serialize};

/// The tool that starts a child (named here, the family's leaf module, so
/// that what lists tool names needs nothing of `subagents/`).
pub const SPAWN: &str = "spawn_agent";
/// The tool that collects children's answers.
pub const WAIT: &str = "wait_agents";

/// The `fact` key describing a child session.
pub const FACT_KEY: &str = cairn_core::storage::registers::SUBAGENT_FACT;

/// Separates a parent's id from the spawning invocation in a child's id
/// (core's, the one spelling for every backend).
pub const SEP: char = cairn_core::storage::FAMILY_SEP;

/// The id of the child started by invocation `invocation` of `parent`.
pub fn child_id(parent: &str, invocation: &str) -> String {
    format!("{parent}{SEP}{invocation}")
}

/// Whether a session id names a child.
pub fn is_child_id(id: &str) -> bool {
    id.contains(SEP)
}

/// How deep a session is in its family (0: a top-level session).
pub fn depth_of(id: &str) -> u32 {
    u32::try_from(id.matches(SEP).count()).unwrap_or(u32::MAX)
}

/// How `cairn sessions` shows an id: a child is marked `↳`.
pub fn list_label(id: &str) -> String {
    if is_child_id(id) { format!("↳ {id}") } else { id.to_owned() }
}

/// The parent of a child id.
pub fn parent_of(id: &str) -> Option<&str> {
    id.rsplit_once(SEP).map(|(parent, _)| parent)
}

/// What a child was given, committed as its `fact` `subagent`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChildFact {
    /// The parent session's id.
    pub parent: String,
    /// The parent's `spawn_agent` invocation.
    pub invocation: String,
    /// 1 for a child of a top-level session.
    pub depth: u32,
    /// The child's prompt.
    pub prompt: String,
    /// The tools offered to the child.
    pub tools: Vec<String>,
    /// The child's allow patterns.
    pub allow: Vec<String>,
    /// Provider name, model and script (for the scripted provider).
    pub provider: String,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub script: Option<PathBuf>,
    /// Whether it may message its siblings that have `peers` too.
    #[serde(default)]
    pub peers: bool,
}

/// The `subagent` fact of a session, if it is a child.
pub fn child_fact<S: Storage>(store: &S) -> Option<ChildFact> {
    store.register(FACT, FACT_KEY).and_then(|raw| raw.parse().ok())
}
