//! cairn as an MCP client: the servers a user configured
//! (`[mcp_servers.NAME]`) become cairn tools named `mcp__NAME__TOOL`, with
//! risk tiers, a sandbox for stdio servers, and exactly-once receipts,
//! through the official Rust SDK (`rmcp`).
//!
//! - `config`: the configuration and its checks.
//! - `connection`: one running server (start, handshake, list, call).
//! - `pool`: the process's servers, shared across sessions and turns.
//! - `tool`: a server's tool as a [`cairn_core::tool::Tool`].
//! - `extra`: its resources and prompts as read-only tools.
//!
//! - `login`: a person's OAuth login to an HTTP server (`cairn mcp login`)
//!   and the tokens it keeps.
//! - `bounded`: the limit on one message from a stdio server.
//! - `cache`: servers' tool lists kept between runs ([`load_lazily`]).
//!
//! Hosts call [`load`] once per turn (it reuses running servers) and add
//! the entries to the turn's tools; approvals, discovery and the session
//! log then treat them like any other tool. Heavy dependencies (tokio,
//! hyper) live here so that `cairn-tools` and `cairn-core` stay light.

mod bounded;
mod cache;
pub mod config;
mod connection;
mod extra;
mod login;
mod pool;
mod runtime;
pub mod tool;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use cairn_tools::{ToolEntry, ToolOrigin, ToolsConfig};

pub use config::{ConfigError, FileAccess, ServerConfig, ToolOverride, parse_servers};
pub use connection::ServerError;
pub use login::{LoginError, login, set_login_dir};
pub use tool::{McpTool, PREFIX, tool_name};

/// What a host's environment holds under a variable's name, for an OAuth
/// client secret (`[mcp_servers.NAME.oauth] client_secret_env`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// Its value.
    Value(String),
    /// Not set.
    Unset,
    /// The variable holds one of the host's provider keys, which never
    /// leave for an MCP server or its authorization server.
    ProviderKey,
}

type Lookup = Box<dyn Fn(&str) -> Credential + Send + Sync>;

static CREDENTIALS: std::sync::OnceLock<Lookup> = std::sync::OnceLock::new();

/// Where OAuth client secrets are read: a host that takes credentials out
/// of its environment at startup (the `cairn` binary keeps them aside)
/// says where they are and which are its provider keys. Set once; without
/// it, the process's environment is read as it is now.
pub fn set_credential_lookup(lookup: impl Fn(&str) -> Credential + Send + Sync + 'static) {
    let _ = CREDENTIALS.set(Box::new(lookup));
}

pub(crate) fn credential(name: &str) -> Credential {
    match CREDENTIALS.get() {
        Some(lookup) => lookup(name),
        None => std::env::var(name).map_or(Credential::Unset, Credential::Value),
    }
}

/// How one configured server stands after [`load`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerState {
    /// `enabled = false`.
    Disabled,
    /// Running, with this many tools offered (and how long it took to
    /// start, when it was started by this load).
    Running {
        /// Tools offered.
        tools: usize,
        /// Start time, if started now.
        started_in: Option<Duration>,
    },
    /// Not started: its tools are offered as it listed them before (it
    /// starts on its first call; [`load_lazily`]).
    NotStarted {
        /// Tools offered.
        tools: usize,
    },
    /// It could not be started; why.
    Failed(String),
}

/// One server's line for `cairn mcp list`.
#[derive(Debug, Clone)]
pub struct ServerStatus {
    /// Its name.
    pub name: String,
    /// `command args…` or the URL.
    pub endpoint: String,
    /// Its state.
    pub state: ServerState,
    /// The cairn names of its tools with their tiers.
    pub tools: Vec<(String, cairn_core::tool::Risk)>,
}

/// The MCP tools of a turn, and what to tell the user.
#[derive(Debug, Default)]
pub struct Loaded {
    /// One entry per offered tool.
    pub entries: Vec<ToolEntry>,
    /// Servers that failed, tools left out, restarts: say them.
    pub notes: Vec<String>,
    /// Every configured server.
    pub servers: Vec<ServerStatus>,
}

/// Start (or reuse) every enabled server for a session in `cwd` and turn
/// their tools into entries. Servers start in parallel; one that fails is
/// reported in `notes` and the others still load. `taken` are the names
/// already in use (built-in and external tools win a clash).
pub fn load(servers: &BTreeMap<String, ServerConfig>, cwd: &Path, tools: &ToolsConfig, taken: &[String]) -> Loaded {
    load_with(servers, cwd, tools, taken, None)
}

/// As [`load`], but a stdio server whose tools were listed before (kept in
/// `cache`, cairn's `cache/mcp/`) is not started: its tools are offered
/// from that listing, and it starts on its first call, which checks the
/// tool is still as listed before calling it. A run that calls no MCP tool
/// starts no server.
pub fn load_lazily(
    servers: &BTreeMap<String, ServerConfig>,
    cwd: &Path,
    tools: &ToolsConfig,
    taken: &[String],
    cache: &Path,
) -> Loaded {
    load_with(servers, cwd, tools, taken, Some(cache))
}

/// A server's tools: from its running (or just started) connection, or
/// from the listing kept in this file.
enum Listing {
    Live(pool::Found),
    Cached(Vec<rmcp::model::Tool>, connection::Offers, std::path::PathBuf),
}

fn load_with(
    servers: &BTreeMap<String, ServerConfig>,
    cwd: &Path,
    tools: &ToolsConfig,
    taken: &[String],
    cache: Option<&Path>,
) -> Loaded {
    let mut loaded = Loaded::default();
    let started: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = servers
            .iter()
            .filter(|(_, config)| config.enabled)
            .map(|(name, config)| {
                let slot = pool::slot(name, config, cwd, tools);
                let file = cache.and_then(|dir| cache::file(dir, name, config, cwd));
                (
                    name,
                    scope.spawn(move || {
                        // A server already running here is used as it is.
                        let listed = match &file {
                            Some(f) if !slot.is_running() => cache::read(f).map(|(t, o)| (t, o, f.clone())),
                            _ => None,
                        };
                        let got = match listed {
                            Some((tools, offers, f)) => Ok(Listing::Cached(tools, offers, f)),
                            None => slot.ensure(true).map(Listing::Live),
                        };
                        (got, slot, file)
                    }),
                )
            })
            .collect();
        handles.into_iter().map(|(name, h)| (name, h.join())).collect()
    });
    let mut results: BTreeMap<&String, _> = started.into_iter().collect();
    let mut seen: Vec<String> = taken.to_vec();
    for (name, config) in servers {
        let endpoint = match (&config.command, &config.url) {
            (Some(c), _) => {
                std::iter::once(c.as_str()).chain(config.args.iter().map(String::as_str)).collect::<Vec<_>>().join(" ")
            }
            (None, Some(u)) => u.clone(),
            (None, None) => String::new(),
        };
        let mut status = ServerStatus { name: name.clone(), endpoint, state: ServerState::Disabled, tools: Vec::new() };
        let Some(result) = results.remove(name) else {
            loaded.servers.push(status);
            continue;
        };
        let (got, slot, file) = match result {
            Ok(r) => r,
            Err(_) => {
                status.state = ServerState::Failed("its start panicked".into());
                loaded.notes.push(format!("MCP server {name} did not start; its tools are not offered"));
                loaded.servers.push(status);
                continue;
            }
        };
        let got = match got {
            Ok(got) => got,
            Err(e) => {
                loaded.notes.push(format!("{e}; its tools are not offered"));
                status.state = ServerState::Failed(e.to_string());
                loaded.servers.push(status);
                continue;
            }
        };
        let (listed, offers, started_in, from_cache) = match got {
            Listing::Cached(listed, offers, f) => (Ok(listed), offers, None, Some(f)),
            Listing::Live(found) => {
                let started_in = match &found {
                    pool::Found::Running(_) => None,
                    pool::Found::Started(c) => Some(c.started_in),
                    pool::Found::Restarted(c, why) => {
                        loaded.notes.push(format!("MCP server {name} had stopped ({why}); restarted it"));
                        Some(c.started_in)
                    }
                };
                let listed = found.connection().tools();
                let offers = found.connection().offers();
                if let (Ok(listed), Some(f)) = (&listed, &file) {
                    cache::write(f, listed, offers);
                }
                (listed, offers, started_in, None)
            }
        };
        let listed = match listed {
            Ok(listed) => listed,
            Err(e) => {
                loaded.notes.push(format!("{e}; its tools are not offered"));
                status.state = ServerState::Failed(e.to_string());
                loaded.servers.push(status);
                continue;
            }
        };
        let restart = Arc::new(AtomicBool::new(true));
        let mut offered = 0;
        for remote in &listed {
            if config.tools.get(remote.name.as_ref()).is_some_and(|o| !o.enabled) {
                continue;
            }
            let tool = McpTool::new(slot.clone(), remote, restart.clone(), from_cache.clone());
            let cairn_name = cairn_core::tool::Tool::spec(&tool).name.clone();
            if seen.contains(&cairn_name) {
                loaded.notes.push(format!(
                    "MCP server {name}: tool {} is not offered: its name {cairn_name} is already taken",
                    remote.name
                ));
                continue;
            }
            seen.push(cairn_name.clone());
            status.tools.push((cairn_name, cairn_core::tool::Tool::spec(&tool).risk));
            loaded.entries.push(ToolEntry { tool: Arc::new(tool), origin: ToolOrigin::Mcp { server: name.clone() } });
            offered += 1;
        }
        // Its resources and prompts, after its own tools (a tool of its own
        // by the same name keeps the name).
        for kind in extra::Kind::offered(offers) {
            if config.tools.get(kind.local()).is_some_and(|o| !o.enabled) {
                continue;
            }
            let tool = extra::ExtraTool::new(slot.clone(), kind, restart.clone(), from_cache.is_some());
            let cairn_name = cairn_core::tool::Tool::spec(&tool).name.clone();
            if seen.contains(&cairn_name) {
                loaded.notes.push(format!(
                    "MCP server {name}: its {} is not offered: the name {cairn_name} is already taken",
                    kind.local()
                ));
                continue;
            }
            seen.push(cairn_name.clone());
            status.tools.push((cairn_name, cairn_core::tool::Tool::spec(&tool).risk));
            loaded.entries.push(ToolEntry { tool: Arc::new(tool), origin: ToolOrigin::Mcp { server: name.clone() } });
            offered += 1;
        }
        let extra_names: Vec<&str> = extra::Kind::offered(offers).into_iter().map(extra::Kind::local).collect();
        for unknown in config
            .tools
            .keys()
            .filter(|t| !listed.iter().any(|r| r.name.as_ref() == t.as_str()) && !extra_names.contains(&t.as_str()))
        {
            loaded
                .notes
                .push(format!("MCP server {name}: [mcp_servers.{name}.tools.{unknown}] names no tool it offers"));
        }
        status.state = if from_cache.is_some() {
            ServerState::NotStarted { tools: offered }
        } else {
            ServerState::Running { tools: offered, started_in }
        };
        loaded.servers.push(status);
    }
    loaded
}
