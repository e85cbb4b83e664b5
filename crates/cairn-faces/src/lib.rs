//! cairn's editor and agent faces: `cairn acp` (an Agent Client Protocol
//! agent for editors) and `cairn mcp` (a Model Context Protocol server of
//! cairn's tools), both JSON-RPC 2.0 over stdio, one message per line.
//!
//! Both are thin faces over `cairn-core`, like the CLI: every tool call goes
//! through the core's turn (the effect sandwich, the approval gate, the
//! limits) and is committed to a session file. This crate owns the wire
//! protocols only; it must not build providers or tools itself — the
//! [`Host`] (the `cairn` binary) supplies them from its configuration.
//!
//! Layout: [`jsonrpc`] (bounded line framing, message classification,
//! error objects, the shared writer), [`mcp_server`] (`cairn mcp`, the MCP
//! server; cairn as an MCP client is the crate cairn-mcp), [`acp`] (the
//! ACP agent and its permission approver).

pub mod acp;
pub mod jsonrpc;
pub mod mcp_server;

use std::path::Path;

use cairn_core::approval::{Approver, PolicyApprover, SharedApprover};
use cairn_core::provider::Provider;
use cairn_core::storage::JsonlStore;
pub use cairn_host::{HostTools, ProviderChoices, Rewind, Rewound, SessionHost};

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

/// A session as `session/list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedSession {
    /// Its id (what `session/load` takes).
    pub id: String,
    /// Its working directory.
    pub cwd: String,
    /// Its file (read for its title, never opened for writing).
    pub path: std::path::PathBuf,
    /// The name a person gave it, if any.
    pub name: Option<String>,
    /// When it last changed.
    pub modified: std::time::SystemTime,
}

/// What the editor and agent faces need from the program hosting them,
/// beyond what every face needs ([`SessionHost`]: each turn's tools and
/// settings, undo, the providers).
pub trait Host: SessionHost {
    /// The configured provider for sessions working in `cwd`.
    fn provider(&self, cwd: &Path) -> anyhow::Result<Box<dyn Provider + Send>>;
    /// Every tool offered in `cwd` (built-ins, then external tools, then
    /// the subagent family's), unchosen: what MCP serves, and the names an
    /// editor's MCP servers may not take. `approver` answers the calls (the
    /// registry will offer only what it can answer), asking `person` (if
    /// anyone): the same person answers for the children a session spawns.
    fn tools(
        &self,
        cwd: &Path,
        approver: &PolicyApprover,
        person: Option<&SharedApprover>,
    ) -> anyhow::Result<HostTools>;
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
    /// The sessions an editor may load (`session/list`), most recently
    /// changed first; a subagent's child sessions are not among them.
    /// Default: refused (this host keeps no list).
    fn list_sessions(&self) -> anyhow::Result<Vec<ListedSession>> {
        anyhow::bail!("this host keeps no list of sessions")
    }
    /// Provider `name` (one of [`SessionHost::providers`]) for sessions
    /// working in `cwd`. Default: the configured one.
    fn provider_named(&self, name: &str, cwd: &Path) -> anyhow::Result<Box<dyn Provider + Send>> {
        let _ = name;
        self.provider(cwd)
    }
    /// Whether provider `name`'s model takes images (its configuration
    /// says so, without building it: no key is needed to answer), so an
    /// editor may be offered image prompts. Default: no.
    fn accepts_images(&self, name: &str) -> bool {
        let _ = name;
        false
    }
    /// Which paths carry authority here (`cairn_core::authority`, with the
    /// host's locations): an editor's writes are checked against them as
    /// the built-ins' own are. Default: the rules that hold in every tree.
    fn authority(&self) -> cairn_core::authority::AuthorityRules {
        cairn_core::authority::AuthorityRules::default()
    }
}
