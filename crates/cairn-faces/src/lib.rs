//! cairn's editor and agent faces: `cairn acp` (an Agent Client Protocol
//! agent for editors) and `cairn mcp` (a Model Context Protocol server of
//! cairn's tools), both JSON-RPC 2.0 over stdio, one message per line.
//!
//! Both are thin hosts over `cairn-core`, like the CLI: every tool call goes
//! through the core's turn (the effect sandwich, the approval gate, the
//! limits) and is committed to a session file. This crate owns the wire
//! protocols only; it must not build providers or tools itself — the
//! [`Host`] (the `cairn` binary) supplies them from its configuration.
//!
//! Layout: [`jsonrpc`] (bounded line framing, message classification,
//! error objects, the shared writer), [`mcp`] (the MCP server), [`acp`]
//! (the ACP agent and its permission approver).

pub mod acp;
pub mod jsonrpc;
pub mod mcp;

use std::path::Path;
use std::sync::Arc;

use cairn_core::SessionConfig;
use cairn_core::approval::{Approver, PolicyApprover, SharedApprover};
use cairn_core::provider::Provider;
use cairn_core::storage::JsonlStore;
use cairn_core::tool::Tool;

/// An MCP server an editor gives for one session (ACP `mcpServers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientMcpServer {
    /// Its name, as the editor gave it.
    pub name: String,
    /// How to reach it.
    pub transport: ClientMcpTransport,
}

/// How to reach a [`ClientMcpServer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientMcpTransport {
    /// A program speaking MCP on stdio.
    Stdio {
        /// The program (an absolute path, per ACP).
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Variables to set, with their values.
        env: Vec<(String, String)>,
    },
    /// A streamable-HTTP endpoint.
    Http {
        /// Its URL.
        url: String,
        /// Headers to send with every request (an editor's token, say).
        headers: Vec<(String, String)>,
    },
}

/// What a face needs from the program hosting it (configuration,
/// providers, tools, where sessions live).
pub trait Host: Sync {
    /// The configured provider for sessions working in `cwd`.
    fn provider(&self, cwd: &Path) -> anyhow::Result<Box<dyn Provider + Send>>;
    /// The tools offered in `cwd` (built-ins, then external tools, then
    /// the subagent family's) to a session whose calls `approver` answers
    /// (the registry will offer only what it can answer), asking `person`
    /// (if anyone): the same person answers for the children the session
    /// spawns.
    fn tools(
        &self,
        cwd: &Path,
        approver: &PolicyApprover,
        person: Option<&SharedApprover>,
    ) -> anyhow::Result<HostTools>;
    /// The tools and settings of one turn of the session in `store`
    /// working in `cwd`: `prompt` is the new turn's request, `None` when
    /// the interrupted turn is resumed. A host that chooses tools by the
    /// request (the CLI's discovery) records its choice in `store` before
    /// the turn's first entry and offers the recorded choice on resume.
    /// Default: every tool ([`Host::tools`]) and [`Host::session_config`].
    fn turn(
        &self,
        cwd: &Path,
        store: &mut JsonlStore,
        prompt: Option<&str>,
        approver: &PolicyApprover,
        person: Option<&SharedApprover>,
    ) -> anyhow::Result<(HostTools, SessionConfig)> {
        let _ = (store, prompt);
        Ok((self.tools(cwd, approver, person)?, self.session_config()))
    }
    /// The tools of MCP servers an editor gave for a session in `cwd`
    /// (names in `taken` are kept by the tools already offered). Default:
    /// none, said in the notes.
    fn client_mcp_tools(&self, cwd: &Path, servers: &[ClientMcpServer], taken: &[String]) -> anyhow::Result<HostTools> {
        let _ = (cwd, taken);
        let notes = servers.iter().map(|s| format!("MCP server {} not started: this host runs none", s.name)).collect();
        Ok(HostTools { tools: Vec::new(), notes, hooks: None })
    }
    /// The approval policy of a session whose calls no rule covers are
    /// asked of `person` (`None`: nobody): the allow rules from `--allow`
    /// and the configuration, and `--yes` (the host's standing approval of
    /// Write calls, never of Destructive ones).
    fn policy(&self, person: Option<Box<dyn Approver>>) -> anyhow::Result<PolicyApprover>;
    /// Create a new session file whose working directory is `cwd`.
    fn create_session(&self, cwd: &Path) -> anyhow::Result<JsonlStore>;
    /// Open an existing session of the sessions directory by its whole id
    /// (never a path outside it, never a prefix).
    fn open_session(&self, id: &str) -> anyhow::Result<JsonlStore>;
    /// Limits and settings of turns.
    fn session_config(&self) -> SessionConfig;
    /// `/undo [N]` or `/redo` typed in an editor: revert (or reapply) the
    /// file effects of `session`'s last turn (or turn N on), working in
    /// `cwd`, and move its lane; what happened for the person, a refusal
    /// included (with the paths and diffs). Default: this host keeps no
    /// pre-images and cannot.
    fn rewind(
        &self,
        session: &mut cairn_core::Session<JsonlStore>,
        cwd: &Path,
        request: Rewind,
    ) -> anyhow::Result<String> {
        let _ = (session, cwd, request);
        anyhow::bail!("this host keeps no pre-images, so it cannot undo or redo")
    }
    /// Before a turn of `session`: finish an undo that was killed after
    /// its plan was committed (what was done, for the person), so no turn
    /// runs on a half-reverted tree. Default: nothing to finish.
    fn finish_undo(&self, session: &mut cairn_core::Session<JsonlStore>, cwd: &Path) -> anyhow::Result<Option<String>> {
        let _ = (session, cwd);
        no_undo_to_finish()
    }
    /// The providers a session may switch to, each with what it runs (for
    /// an editor's model picker), and the configured one. Default: only
    /// the configured one.
    fn provider_choices(&self) -> ProviderChoices {
        ProviderChoices {
            current: "default".to_owned(),
            choices: vec![("default".to_owned(), "configured".to_owned())],
        }
    }
    /// Provider `name` (one of [`Host::provider_choices`]) for sessions
    /// working in `cwd`. Default: the configured one.
    fn provider_named(&self, name: &str, cwd: &Path) -> anyhow::Result<Box<dyn Provider + Send>> {
        let _ = name;
        self.provider(cwd)
    }
}

/// Default of [`Host::finish_undo`]: nothing to finish.
pub fn no_undo_to_finish() -> anyhow::Result<Option<String>> {
    Ok(None)
}

/// What `/undo [N]` and `/redo` ask of the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rewind {
    /// Undo the last turn (`None`) or turn N and every later one.
    Undo(Option<usize>),
    /// Reapply the undo the lane stands on.
    Redo,
}

/// The providers a session may use.
#[derive(Debug, Clone)]
pub struct ProviderChoices {
    /// The configured provider's name.
    pub current: String,
    /// (name, the model it runs), the configured one among them.
    pub choices: Vec<(String, String)>,
}

/// Tools a host offers in a directory.
pub struct HostTools {
    /// Built-ins, then external tools.
    pub tools: Vec<Arc<dyn Tool>>,
    /// Tools left out and why (broken metadata, untrusted workspace).
    pub notes: Vec<String>,
    /// The hooks every call goes through, set on the face's registry.
    pub hooks: Option<Arc<dyn cairn_core::hooks::Hooks>>,
}

impl std::fmt::Debug for HostTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostTools").field("tools", &self.tools.len()).field("notes", &self.notes).finish()
    }
}
