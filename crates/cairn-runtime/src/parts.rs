//! A session's parts from the resolved configuration: the provider, the
//! approval policy (`--yes`, allow rules), the session settings, creating
//! or opening the session file, and the database connection. Every face
//! builds through here; a turn's tools and what they run under are
//! `tools.rs`'s. It must not render, prompt, or choose tools for a turn.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result};
use cairn_core::SessionConfig;
use cairn_core::approval::{Allowlist, Approver, PolicyApprover};
use cairn_core::provider::Provider;
use cairn_core::storage::{Header, JsonlStore, Storage, Transaction, new_session_id};
use cairn_provider::{ProviderConfig, ProviderKind};

use crate::setup::Setup;

/// The system prompt when none is configured.
const DEFAULT_SYSTEM: &str = "You are cairn, a careful agent working in the user's directory. \
Use the tools to look before you change anything, keep changes small, and answer concisely.";

/// Build the configured provider (the `local` one grounds path arguments in
/// the session's `cwd`).
pub fn build_provider(ctx: &Setup, cwd: &Path) -> Result<Box<dyn Provider + Send>> {
    let s = &ctx.settings;
    provider_for(ctx, &s.provider.value, s.model.value.as_deref(), s.script.value.as_deref(), cwd)
}

/// Build the provider `name` (a built-in or a `[providers.NAME]` table),
/// with a model and script overriding its configuration (`cairn serve`
/// builds each session's provider from what `s/new` was given), for a
/// session working in `cwd`.
pub fn provider_for(
    ctx: &Setup,
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

/// The approval policy of a CLI session over `allow` and the person
/// `ask` (if any): `yes` (`--yes`) is the session's standing approval of Write
/// calls, which core's policy applies (never to Destructive calls).
pub fn policy(yes: bool, allow: Allowlist, ask: Option<Box<dyn Approver>>) -> PolicyApprover {
    let approver = PolicyApprover::new(allow, ask);
    if yes { approver.approve_writes("flag:--yes") } else { approver }
}

/// The session settings from configuration.
pub fn session_config(ctx: &Setup) -> SessionConfig {
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
pub fn new_session_cwd(ctx: &Setup) -> Result<PathBuf> {
    let cwd = match &ctx.common.cwd {
        Some(dir) => dir.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    cwd.canonicalize().with_context(|| format!("--cwd {}: no such directory", cwd.display()))
}

/// Create a new session file (named with `--name` if given).
pub fn create_session(ctx: &Setup) -> Result<(JsonlStore, PathBuf)> {
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
pub fn open_session(ctx: &Setup, path: &Path) -> Result<JsonlStore> {
    Ok(JsonlStore::open(path, ctx.settings.store_options())?)
}

/// The database URL from `--database` or the config, or a clear error.
pub fn database_url(ctx: &Setup) -> Result<String> {
    ctx.settings.database.value.clone().context(
        "no database: give --database postgres://USER@HOST/DB, or set database = \"postgres://…\" in cairn's config",
    )
}

/// What a command that needs PostgreSQL says in a build without it.
pub const NO_POSTGRES: &str = "this cairn was built without PostgreSQL support; rebuild with `--features postgres`";

/// A connection to the configured database (see [`connect_database`]).
#[cfg(feature = "postgres")]
pub fn database_client(ctx: &Setup) -> Result<postgres::Client> {
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
