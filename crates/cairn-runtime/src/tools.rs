//! A turn's tools: where they come from and what they run under. The one
//! carrier inside the runtime is [`TurnTools`], what a turn of a session
//! may be offered, read once per turn by [`turn_tools`] from one source
//! (the tool service's when one is configured, `toolsrv.rs`; else the
//! in-process ones, [`in_process`]: built-ins, external tools, MCP
//! servers'), each tool with where it comes from. Discovery ranks from it,
//! `cairn tools` and the 9P `tools` file list it, and [`TurnTools::chosen`]
//! hands a face the tools discovery kept as `cairn_host::HostTools`, the
//! carrier every face puts in its registry (`HostTools::registry`, the one
//! "register each tool, note a refusal" loop). The settings every tool
//! runs under are here too ([`tools_config`]: the sandbox, staging,
//! pre-images, hidden paths, [`authority_rules`]), with a working
//! directory's own MCP servers and hooks ([`extensions`], [`hooks`]).
//!
//! Must not: choose among the tools (`discover.rs` does) or put them in a
//! registry (the face does, through `HostTools`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, Result};
use cairn_core::hooks::Hooks;
use cairn_host::HostTools;
use cairn_tools::{ToolEntry, ToolOrigin, ToolsConfig, TrustState, TrustStore};

use crate::setup::Setup;

/// The tools a turn of a session may be offered, and what to tell about
/// the ones left out.
#[derive(Debug, Default)]
pub struct TurnTools {
    /// Each tool and where it comes from: built-ins, then external tools,
    /// then MCP servers' (in-process); or a tool service's, in its order.
    pub entries: Vec<ToolEntry>,
    /// Tools left out: broken metadata, shadowed names, an unreadable
    /// service meta.
    pub notes: Vec<String>,
    /// Workspace tools and files not loaded because the directory is not
    /// trusted, and how to trust it: said even by a headless face.
    pub untrusted: Vec<String>,
    /// The hooks every call goes through (`[hooks]`; they run in this
    /// process, also for a tool service's tools).
    pub hooks: Option<Arc<dyn Hooks>>,
}

impl TurnTools {
    /// Whether `entry` is one of cairn's core tools (always offered;
    /// discovery chooses among the others): a built-in, or a tool service's
    /// tool of a built-in's name (the service's own built-in).
    pub fn is_core(entry: &ToolEntry) -> bool {
        match &entry.origin {
            ToolOrigin::Builtin => true,
            ToolOrigin::Service { .. } => {
                cairn_tools::builtin::BUILTIN_NAMES.contains(&entry.tool.spec().name.as_str())
            }
            _ => false,
        }
    }

    /// The core tools and, when `keep` is given (discovery's choice), only
    /// the other tools it names (`None`: every tool); with the hooks and
    /// the notes (the untrusted ones stay in [`TurnTools::untrusted`]).
    pub fn chosen(&self, keep: Option<&BTreeSet<String>>) -> HostTools {
        let tools = self
            .entries
            .iter()
            .filter(|e| Self::is_core(e) || keep.is_none_or(|k| k.contains(&e.tool.spec().name)))
            .map(|e| Arc::clone(&e.tool))
            .collect();
        HostTools { tools, notes: self.notes.clone(), hooks: self.hooks.clone() }
    }
}

/// Read the tools for a turn of a session in `cwd`: the tool service's
/// when one is configured (`toolsrv::address` — the one place that choice is
/// made), else the in-process ones ([`in_process`]). Discovery
/// ranks from it, the registry is filled from it (`equip::offer`) and
/// `cairn tools` and the 9P `tools` file list it, so a turn never reads its
/// tools twice nor decides twice where they come from, and a listing shows
/// what a turn gets.
pub fn turn_tools(ctx: &Setup, cwd: &Path) -> Result<TurnTools> {
    let Some(address) = crate::toolsrv::address(ctx) else {
        return in_process(ctx, cwd);
    };
    let mut notes = Vec::new();
    let (dial, specs) = crate::toolsrv::remote_specs(&address, &mut notes)?;
    let origin = ToolOrigin::Service { address: dial.to_string() };
    let entries = specs
        .into_iter()
        .map(|spec| ToolEntry {
            tool: Arc::new(crate::toolsrv::RemoteTool::new(spec, dial.clone())),
            origin: origin.clone(),
        })
        .collect();
    Ok(TurnTools { entries, notes, untrusted: Vec::new(), hooks: hooks(ctx, cwd) })
}

/// The tools settings from configuration and flags.
pub fn tools_config(ctx: &Setup) -> ToolsConfig {
    let mut config = ToolsConfig::default();
    config.destructive_patterns.extend(ctx.settings.destructive_patterns.value.iter().cloned());
    config.allow_unsandboxed = ctx.common.allow_unsandboxed;
    config.secrets = crate::secrets::values();
    // OAuth client secrets of MCP servers come from where cairn keeps the
    // credentials it took out of its environment; provider keys never go.
    let provider_keys = crate::secrets::provider_key_vars(&ctx.settings.providers);
    cairn_mcp::set_credential_lookup(move |name| {
        // A provider's variable, or another holding (a value containing) a
        // provider's key.
        let keys = provider_keys.iter().filter_map(|k| crate::secrets::var(k)).filter(|v| !v.trim().is_empty());
        let keys: Vec<String> = keys.collect();
        match crate::secrets::var(name) {
            _ if provider_keys.iter().any(|k| k == name) => cairn_mcp::Credential::ProviderKey,
            Some(v) if keys.iter().any(|k| v.contains(k.as_str())) => cairn_mcp::Credential::ProviderKey,
            Some(v) => cairn_mcp::Credential::Value(v),
            None => cairn_mcp::Credential::Unset,
        }
    });
    // A person's OAuth logins to MCP servers (`cairn mcp login`) live with
    // cairn's data, which tools never see.
    cairn_mcp::set_login_dir(ctx.paths.data.join("mcp-logins"));
    // Staging layers live with cairn's data (they must outlive a crash
    // until their change set is applied on resume).
    config.staging_dir = Some(ctx.paths.data.join("staging"));
    // Pre-images (prior contents of what an effect changes) live with
    // cairn's data too, out of every tool's sight, for `cairn undo`.
    config.preimage_dir = Some(ctx.paths.data.join("preimages"));
    config.undo_max_bytes = ctx.settings.undo_max_bytes.value;
    config.staged = ctx.settings.staged.value;
    config.staged_max_files = ctx.settings.staged_max_files.value;
    config.shell_network = ctx.settings.shell_network.value;
    config.hidden_paths = hidden_paths(&ctx.paths.data);
    // cairn's configuration directories (the one in use and the default
    // ones a later `cairn` would read) are hidden like its data (issue 46).
    for dir in ctx.paths.own_dirs() {
        if !config.hidden_paths.contains(&dir) {
            config.hidden_paths.push(dir);
        }
    }
    config.authority = authority_rules(&ctx.paths);
    config.sandbox_read_paths = sandbox_read_paths(ctx);
    config
}

/// Which paths carry authority here (`cairn_core::authority`): cairn's own
/// directories and the user's home, each resolved as the judge will see a
/// tree (through links, for the part that exists), since a tree is
/// compared canonically.
pub fn authority_rules(paths: &crate::paths::Paths) -> cairn_core::authority::AuthorityRules {
    cairn_core::authority::AuthorityRules {
        cairn_dirs: paths.own_dirs().iter().map(|d| resolved(d)).collect(),
        home: paths.user_home.as_deref().map(resolved),
        // Per tree: `cairn_tools::authority_here` reads its hooks path.
        hooks_dirs: Vec::new(),
    }
}

/// `path` with its longest existing ancestor canonicalized and the rest
/// appended (a directory that does not exist yet is still found).
fn resolved(path: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut at = path;
    loop {
        if let Ok(canonical) = at.canonicalize() {
            let mut out = canonical;
            out.extend(rest.iter().rev());
            return out;
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name);
                at = parent;
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// What every sandboxed process may read beyond its own rules: the
/// developer configuration (`cairn_tools::programs::developer_config`,
/// so git and cargo work with a normal home) unless it lies in cairn's
/// own directories, then `[tools] sandbox_read_paths`.
fn sandbox_read_paths(ctx: &Setup) -> Vec<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let mut paths = match var("HOME") {
        Some(home) => cairn_tools::programs::developer_config(&home, var("XDG_CONFIG_HOME").as_deref()),
        None => Vec::new(),
    };
    // Never what is hidden (cairn's own directories, issue 46).
    let own = ctx.paths.own_dirs();
    paths.retain(|p| !own.iter().any(|d| p.starts_with(d)));
    paths.extend(ctx.settings.sandbox_read_paths.value.iter().cloned());
    paths
}

/// What no tool may see: cairn's home (its control sockets `cairn.sock`
/// and `toolsrv.sock`, sessions, staging layers). Landlock before ABI 9
/// does not check `connect()` on a pathname unix socket, so only hiding the
/// home keeps a tool from driving `cairn serve` or `cairn toolsrv`.
///
/// The socket files are listed as well: when a call's working directory
/// *is* the home, the home cannot be covered without covering the tree the
/// tool works on, so the sandbox skips that cover and hides each socket
/// (a `/dev/null` mounted over it) instead. When the working directory is
/// inside the home, the cover keeps it visible and the sockets are gone
/// with the rest. A socket created after a call started in the home
/// itself is not covered for that call.
pub fn hidden_paths(home: &Path) -> Vec<PathBuf> {
    vec![home.to_path_buf(), home.join("cairn.sock"), home.join("toolsrv.sock")]
}

/// A working directory's own `.cairn/config.toml`: only these tables.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ProjectFile {
    #[serde(default)]
    mcp_servers: toml::Table,
    #[serde(default)]
    hooks: cairn_tools::hooks::HooksConfig,
}

/// The MCP servers and hooks of a session in `cwd`: the user's, then the
/// working directory's `.cairn/config.toml` while the directory is trusted
/// with exactly that file (`cairn trust`, the same record as its tools). A
/// project server never replaces a user's server of the same name; project
/// hooks run after the user's.
#[derive(Debug, Default)]
pub struct Extensions {
    /// `[mcp_servers]`, user's first.
    pub mcp_servers: std::collections::BTreeMap<String, cairn_mcp::ServerConfig>,
    /// `[hooks]`, user's first.
    pub hooks: cairn_tools::hooks::HooksConfig,
    /// What was left out of the project's file, and why.
    pub notes: Vec<String>,
    /// The project's file exists but is not trusted (as it is now): how to
    /// trust it.
    pub untrusted: Vec<String>,
}

/// See [`Extensions`].
pub fn extensions(ctx: &Setup, cwd: &Path, trust: &TrustStore) -> Extensions {
    let mut ext = Extensions {
        mcp_servers: ctx.settings.mcp_servers.clone(),
        hooks: ctx.settings.hooks.clone(),
        ..Extensions::default()
    };
    let file = cwd.join(cairn_tools::trust::WORKSPACE_CONFIG);
    let Ok(meta) = std::fs::symlink_metadata(&file) else {
        return ext;
    };
    let shown = crate::escape::quoted(&file);
    match trust.check(cwd, &cwd.join(cairn_tools::trust::WORKSPACE_TOOLS_DIR)) {
        Ok(TrustState::Trusted) => {}
        Ok(state) => {
            let again = if state == TrustState::Changed { " again (it changed since)" } else { "" };
            ext.untrusted.push(format!(
                "{shown} (MCP servers, hooks) not loaded: the directory is not trusted; review it, then run `cairn \
                 trust {}`{again}",
                crate::escape::quoted(cwd)
            ));
            return ext;
        }
        Err(e) => {
            ext.untrusted.push(format!("{shown} not loaded: {e}"));
            return ext;
        }
    }
    if !meta.is_file() {
        ext.notes.push(format!("{shown} not loaded: it is not a regular file (links are not followed)"));
        return ext;
    }
    let parsed = std::fs::read_to_string(&file)
        .map_err(|e| e.to_string())
        .and_then(|text| toml::from_str::<ProjectFile>(&text).map_err(|e| e.message().to_owned()))
        .and_then(|p| {
            p.hooks.check()?;
            Ok((cairn_mcp::parse_servers(&p.mcp_servers).map_err(|e| e.to_string())?, p.hooks))
        });
    let (servers, hooks) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            ext.notes.push(format!("{shown} not loaded: {e} (it may hold only [mcp_servers.NAME] and [[hooks.…]])"));
            return ext;
        }
    };
    for (name, server) in servers {
        match ext.mcp_servers.entry(name) {
            std::collections::btree_map::Entry::Occupied(mine) => ext
                .notes
                .push(format!("{shown}: MCP server {} is not used: your own server of that name wins", mine.key())),
            std::collections::btree_map::Entry::Vacant(slot) => {
                slot.insert(server);
            }
        }
    }
    ext.hooks.extend(hooks);
    ext
}

/// The trust record, or none (said in `untrusted`): an unreadable trust
/// file trusts nothing (fails closed).
fn trust_store(ctx: &Setup, untrusted: &mut Vec<String>) -> TrustStore {
    TrustStore::load(&ctx.paths.trust_file()).unwrap_or_else(|e| {
        untrusted.push(format!("no workspace tools loaded: {e}"));
        TrustStore::empty()
    })
}

/// Hook programs from `config`, if any.
fn hooks_of(ctx: &Setup, config: cairn_tools::hooks::HooksConfig) -> Option<Arc<dyn Hooks>> {
    if config.is_empty() {
        return None;
    }
    let notes = ctx.notes.clone();
    let report = Box::new(move |note: &str| notes.info(note));
    Some(Arc::new(
        cairn_tools::hooks::CommandHooks::new(config, tools_config(ctx), report).with_sessions(ctx.paths.sessions()),
    ))
}

/// The hook programs of a session in `cwd` (the user's, then a trusted
/// project's), if any.
pub fn hooks(ctx: &Setup, cwd: &Path) -> Option<Arc<dyn Hooks>> {
    let mut ignored = Vec::new();
    let trust = trust_store(ctx, &mut ignored);
    hooks_of(ctx, extensions(ctx, cwd, &trust).hooks)
}

/// The in-process tools for `cwd`: built-in and external tools
/// (directories, precedence and trust as `cairn_tools::tool_dirs` and
/// `load_tools` define them), then the tools of the MCP servers of
/// [`extensions`] (`cairn_mcp::load`). A turn reads its tools through
/// [`turn_tools`], which calls this unless a tool service is
/// configured.
pub fn in_process(ctx: &Setup, cwd: &Path) -> Result<TurnTools> {
    let config = tools_config(ctx);
    let mut untrusted = Vec::new();
    let trust = trust_store(ctx, &mut untrusted);
    let loaded = cairn_tools::load_tools(&config, &ctx.paths.tool_dirs(cwd), &trust)
        .context("invalid [tools] destructive_patterns")?;
    let mut notes: Vec<String> = loaded.errors.iter().map(|e| format!("tool skipped: {e}")).collect();
    untrusted.extend(loaded.untrusted.iter().map(|u| {
        let again = if u.state == TrustState::Changed { " again" } else { "" };
        format!("{u}; review them, then run `cairn trust {}`{again} to load them", crate::escape::quoted(&u.workspace))
    }));
    let mut entries = loaded.tools;
    let ext = extensions(ctx, cwd, &trust);
    notes.extend(ext.notes);
    untrusted.extend(ext.untrusted);
    // The MCP servers' tools: a stdio server whose tools were listed by an
    // earlier run is offered from that listing and starts at its first
    // call (a run that calls none starts none); others start now, once
    // per process. A server that fails is said, the rest load.
    if !ext.mcp_servers.is_empty() {
        let taken: Vec<String> = entries.iter().map(|e| e.tool.spec().name.clone()).collect();
        let cache = ctx.paths.data.join("cache").join("mcp");
        let mcp = cairn_mcp::load_lazily(&ext.mcp_servers, cwd, &config, &taken, &cache);
        notes.extend(mcp.notes);
        entries.extend(mcp.entries);
    }
    // A hook whose matcher names no tool here would silently never run.
    let mut known: Vec<String> = entries.iter().map(|e| e.tool.spec().name.clone()).collect();
    known.extend([crate::family::SPAWN, crate::family::WAIT].map(str::to_owned));
    known.extend([crate::peers::SEND, crate::peers::RECEIVE, crate::peers::CHILDREN].map(str::to_owned));
    let servers: Vec<String> = ext.mcp_servers.keys().cloned().collect();
    notes.extend(ext.hooks.matcher_warnings(&known, &servers));
    Ok(TurnTools { entries, notes, untrusted, hooks: hooks_of(ctx, ext.hooks) })
}
