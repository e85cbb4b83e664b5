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
use cairn_core::provider::Provider;
use cairn_core::storage::StoreOptions;
pub use cairn_host::{HostTools, ProviderChoices, Rewind, Rewound, SessionHost};
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

/// The binary's side of the tree, beyond what every face needs
/// ([`SessionHost`]: each turn's tools and settings, undo, the providers).
pub trait Host: SessionHost + 'static {
    /// The directory holding session files.
    fn sessions_dir(&self) -> PathBuf;
    /// Where removed sessions are moved (never deleted).
    fn archive_dir(&self) -> PathBuf;
    /// Options for opening session files.
    fn store_options(&self) -> StoreOptions;
    /// Whether `name` is a provider this host can build (an error naming
    /// the known ones otherwise).
    fn check_provider(&self, name: &str) -> Result<()>;
    /// Build the provider for a session working in `cwd` (the embedded
    /// model grounds path arguments in that tree).
    fn provider(&self, spec: &SessionSpec, cwd: &Path) -> Result<Box<dyn Provider + Send>>;
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
