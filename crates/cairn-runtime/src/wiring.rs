//! Building the parts of a session from the resolved configuration: the
//! provider, the tools settings and tool entries, the approval policy
//! (`--yes`, allow rules), session settings, and creating or opening the
//! session file. Every face of the CLI builds through here. It must not
//! render, prompt, or choose tools for a turn (discovery, the tool service
//! and subagents build on it, not the other way round).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result};
use cairn_core::SessionConfig;
use std::sync::Arc;

use cairn_core::approval::{Allowlist, Approver, PolicyApprover};
use cairn_core::hooks::Hooks;
use cairn_core::provider::Provider;
use cairn_core::storage::{Header, JsonlStore, Storage, Transaction, new_session_id};
use cairn_provider::{ProviderConfig, ProviderKind};
use cairn_tools::{ToolsConfig, TrustState, TrustStore};

use crate::context::Context;
use crate::tools::TurnTools;

/// The system prompt when none is configured.
const DEFAULT_SYSTEM: &str = "You are cairn, a careful agent working in the user's directory. \
Use the tools to look before you change anything, keep changes small, and answer concisely.";

/// Build the configured provider (the `local` one grounds path arguments in
/// the session's `cwd`).
pub fn build_provider(ctx: &Context, cwd: &Path) -> Result<Box<dyn Provider + Send>> {
    let s = &ctx.settings;
    provider_for(ctx, &s.provider.value, s.model.value.as_deref(), s.script.value.as_deref(), cwd)
}

/// Build the provider `name` (a built-in or a `[providers.NAME]` table),
/// with a model and script overriding its configuration (`cairn serve`
/// builds each session's provider from what `s/new` was given), for a
/// session working in `cwd`.
pub fn provider_for(
    ctx: &Context,
    name: &str,
    model: Option<&str>,
    script: Option<&Path>,
    cwd: &Path,
) -> Result<Box<dyn Provider + Send>> {
    let mut config = ProviderConfig::resolve(name, ctx.settings.providers.get(name))?;
    if let Some(model) = model {
        config.model = Some(model.to_owned());
    }
    if let Some(script) = script {
        config.script = Some(script.to_path_buf());
    }
    if config.kind == ProviderKind::Local {
        return crate::local::provider(ctx, cwd);
    }
    Ok(cairn_provider::build(&config, &|k| crate::secrets::var(k))?)
}

/// The tools settings from configuration and flags.
pub fn tools_config(ctx: &Context) -> ToolsConfig {
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
fn sandbox_read_paths(ctx: &Context) -> Vec<PathBuf> {
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
pub fn extensions(ctx: &Context, cwd: &Path, trust: &TrustStore) -> Extensions {
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
fn trust_store(ctx: &Context, untrusted: &mut Vec<String>) -> TrustStore {
    TrustStore::load(&ctx.paths.trust_file()).unwrap_or_else(|e| {
        untrusted.push(format!("no workspace tools loaded: {e}"));
        TrustStore::empty()
    })
}

/// Hook programs from `config`, if any.
fn hooks_of(ctx: &Context, config: cairn_tools::hooks::HooksConfig) -> Option<Arc<dyn Hooks>> {
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
pub fn hooks(ctx: &Context, cwd: &Path) -> Option<Arc<dyn Hooks>> {
    let mut ignored = Vec::new();
    let trust = trust_store(ctx, &mut ignored);
    hooks_of(ctx, extensions(ctx, cwd, &trust).hooks)
}

/// The in-process tools for `cwd`: built-in and external tools
/// (directories, precedence and trust as `cairn_tools::tool_dirs` and
/// `load_tools` define them), then the tools of the MCP servers of
/// [`extensions`] (`cairn_mcp::load`). A turn reads its tools through
/// `toolsrv::turn_tools`, which calls this unless a tool service is
/// configured.
pub fn tool_entries(ctx: &Context, cwd: &Path) -> Result<TurnTools> {
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

/// The approval policy of a CLI session over `allow` and the person
/// `ask` (if any): `yes` (`--yes`) is the session's standing approval of Write
/// calls, which core's policy applies (never to Destructive calls).
pub fn policy(yes: bool, allow: Allowlist, ask: Option<Box<dyn Approver>>) -> PolicyApprover {
    let approver = PolicyApprover::new(allow, ask);
    if yes { approver.approve_writes("flag:--yes") } else { approver }
}

/// The session settings from configuration.
pub fn session_config(ctx: &Context) -> SessionConfig {
    SessionConfig {
        system: Some(ctx.settings.system_prompt.value.clone().unwrap_or_else(|| DEFAULT_SYSTEM.to_owned())),
        max_steps: ctx.settings.max_steps.value,
        output_cap: ctx.settings.tool_output_cap.value,
        tool_timeout: Duration::from_secs(ctx.settings.tool_timeout_secs.value),
        lane: ctx.common.lane.clone().unwrap_or_else(|| cairn_core::turn::DEFAULT_LANE.to_owned()),
        compaction_threshold: (!ctx.common.no_compaction).then_some(ctx.settings.compaction_threshold.value),
        ..SessionConfig::default()
    }
}

/// The working directory for a new session, or for a command about one
/// (`cairn tools`, `cairn mcp list`): `--cwd` (resolved against the
/// current directory, so a relative one works) else the current one.
pub fn new_session_cwd(ctx: &Context) -> Result<PathBuf> {
    let cwd = match &ctx.common.cwd {
        Some(dir) => dir.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    cwd.canonicalize().with_context(|| format!("--cwd {}: no such directory", cwd.display()))
}

/// Create a new session file (named with `--name` if given).
pub fn create_session(ctx: &Context) -> Result<(JsonlStore, PathBuf)> {
    let cwd = new_session_cwd(ctx)?;
    let header = Header::new(new_session_id(), cwd.display().to_string());
    let mut store = JsonlStore::create(&ctx.paths.sessions(), header, ctx.settings.store_options())
        .with_context(|| format!("cannot create a session in {}", ctx.paths.sessions().display()))?;
    if let Some(name) = &ctx.common.name {
        store.commit(Transaction::new().set_session_name(name)?)?;
    }
    Ok((store, cwd))
}

/// Give the allocator's free pages back to the system: after a long
/// session's open, whose replay, lifecycle check and context rebuild free
/// several MiB of working memory (some of it in a second thread's arena,
/// which this thread's allocations would never reuse), so the turn that
/// follows starts from what the session keeps. glibc only; elsewhere a
/// no-op.
pub fn give_back_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's free lists and
    // returns free pages to the system; it frees nothing that is in use.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Open an existing session for writing, with the configured store
/// options (automatic compaction, line limit).
pub fn open_session(ctx: &Context, path: &Path) -> Result<JsonlStore> {
    Ok(JsonlStore::open(path, ctx.settings.store_options())?)
}

/// The database URL from `--database` or the config, or a clear error.
pub fn database_url(ctx: &Context) -> Result<String> {
    ctx.settings.database.value.clone().context(
        "no database: give --database postgres://USER@HOST/DB, or set database = \"postgres://…\" in cairn's config",
    )
}

/// What a command that needs PostgreSQL says in a build without it.
pub const NO_POSTGRES: &str = "this cairn was built without PostgreSQL support; rebuild with `--features postgres`";

/// A connection to the configured database (see [`connect_database`]).
#[cfg(feature = "postgres")]
pub fn database_client(ctx: &Context) -> Result<postgres::Client> {
    connect_database(&database_url(ctx)?)
}

/// Connect to the database at `url`, with an error that names it without
/// its password and carries PostgreSQL's own message and code.
#[cfg(feature = "postgres")]
pub fn connect_database(url: &str) -> Result<postgres::Client> {
    cairn_pg::connect(url).map_err(|e| {
        anyhow::anyhow!(
            "cannot use the database {}: {}",
            crate::redact::redact(url),
            crate::redact::scrub(&e.to_string(), url)
        )
    })
}
