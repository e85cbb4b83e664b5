//! What the tree needs from the binary that embeds it: where sessions live,
//! and how to build a provider and the tools for a session. The CLI
//! implements [`Host`] over its own configuration (`cairn serve`), so
//! providers and tools are wired exactly as `cairn run` wires them.
//!
//! [`SessionSpec`] is what `s/new` accepts; it is stored in the session
//! file (a `fact` register) so a restarted server drives the session the
//! same way.

use std::path::{Path, PathBuf};

use anyhow::Result;
use cairn_core::approval::{PolicyApprover, SharedApprover};
use cairn_core::provider::Provider;
use cairn_core::storage::{JsonlStore, StoreOptions};
use cairn_core::{SessionConfig, ToolRegistry};
use serde::{Deserialize, Serialize};

/// The `fact` register holding a session's [`SessionSpec`].
pub const SPEC_FACT: &str = "serve";

/// How a session is driven: what `s/new` accepted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionSpec {
    /// Provider name (empty: the configured default).
    #[serde(default)]
    pub provider: String,
    /// Model (empty: the provider's default).
    #[serde(default)]
    pub model: String,
    /// Script file for the `scripted` provider.
    #[serde(default)]
    pub script: String,
    /// Allow patterns for Write calls (never Destructive).
    #[serde(default)]
    pub allow: Vec<String>,
    /// Approve every Write call without asking (core's
    /// `PolicyApprover::approve_writes`; Destructive still waits in
    /// `approvals/`).
    #[serde(default)]
    pub yes: bool,
}

/// The value of a spec's `yes=` key (`s/new`, `b/new`).
pub fn parse_yes(value: &str) -> Result<bool> {
    match value {
        "1" | "true" | "yes" => Ok(true),
        "" | "0" | "false" | "no" => Ok(false),
        other => anyhow::bail!("yes={other:?}: use yes=1 (approve every Write call; never Destructive) or yes=0"),
    }
}

/// What `ctl undo [N]` and `ctl redo` ask of the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rewind {
    /// Undo the last turn (`None`) or turn N and every later one.
    Undo(Option<usize>),
    /// Reapply the undo the lane stands on.
    Redo,
}

/// The binary's side of the tree.
pub trait Host: Send + Sync + 'static {
    /// The directory holding session files.
    fn sessions_dir(&self) -> PathBuf;
    /// Where removed sessions are moved (never deleted).
    fn archive_dir(&self) -> PathBuf;
    /// Options for opening session files.
    fn store_options(&self) -> StoreOptions;
    /// Settings of a session's turns (system prompt, limits).
    fn session_config(&self) -> SessionConfig;
    /// The provider name used when a spec names none.
    fn default_provider(&self) -> String;
    /// Whether `name` is a provider this host can build (an error naming
    /// the known ones otherwise).
    fn check_provider(&self, name: &str) -> Result<()>;
    /// Build the provider for a session working in `cwd` (the embedded
    /// model grounds path arguments in that tree).
    fn provider(&self, spec: &SessionSpec, cwd: &Path) -> Result<Box<dyn Provider + Send>>;
    /// The tools and settings of one turn of the session in `store`
    /// working in `cwd`, in a registry for `approver` (the one its turns
    /// ask: `ToolRegistry::new`); `person` (if any) is who `approver` asks,
    /// shared with the children the session spawns. `prompt` is the new
    /// turn's request, `None` when the interrupted turn is resumed. A host
    /// that chooses tools by the request (the CLI's discovery) records its
    /// choice in `store` before the turn's first entry and offers the
    /// recorded choice on resume.
    fn turn(
        &self,
        cwd: &Path,
        store: &mut JsonlStore,
        prompt: Option<&str>,
        approver: &PolicyApprover,
        person: Option<&SharedApprover>,
    ) -> Result<(ToolRegistry, SessionConfig)>;
    /// `ctl undo [N]` / `ctl redo` on the session in `store` (no turn
    /// runs): revert (or reapply) its file effects and move its lane; what
    /// was done, or an error saying why not (a refusal, with the paths and
    /// diffs, included). Default: this host keeps no pre-images and
    /// cannot.
    fn rewind(&self, store: JsonlStore, request: Rewind) -> Result<String> {
        let _ = (store, request);
        anyhow::bail!("this server keeps no pre-images, so it cannot undo or redo")
    }
    /// Before a turn of the session in `store`: finish an undo that was
    /// killed after its plan was committed, so no turn runs on a half
    /// reverted tree. Default: nothing (a host without pre-images has no
    /// undo to finish).
    fn finish_undo(&self, store: JsonlStore) -> Result<JsonlStore> {
        Ok(store)
    }
    /// The `providers` file: one configured provider a line.
    fn providers_text(&self) -> String;
    /// The `tools` file: what `cairn tools` lists for the server's
    /// working directory, one tool a line.
    fn tools_text(&self) -> String;
    /// The batch queue's directory (`batch.rs`).
    fn batch_dir(&self) -> PathBuf {
        self.sessions_dir().with_file_name("batch")
    }
    /// Batch sessions run at once.
    fn batch_max_running(&self) -> usize {
        2
    }
}
