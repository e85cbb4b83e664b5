//! `cairn trust`: a person trusts, revokes or lists the working directories
//! whose own tools (`.cairn/tools/`) cairn may load.
//!
//! The rule and the record live in `cairn_tools::trust`; this module only
//! resolves the directory, saves the record in the data directory
//! (`Paths::trust_file`) and returns what is now trusted (the CLI shows
//! it). Nothing else in the CLI ever
//! adds a record: sessions, `--yes` and `--json` only read it.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use cairn_core::tool::ToolSpec;
use cairn_tools::trust::WORKSPACE_TOOLS_DIR;
use cairn_tools::{ToolDir, ToolDirScan, TrustState, TrustStore};

use crate::setup::Setup;

pub use cairn_tools::trust::TrustRecord;

/// The directory meant: the argument, else `--cwd`, else the current one.
fn target(ctx: &Setup, dir: Option<PathBuf>) -> Result<PathBuf> {
    match dir.or_else(|| ctx.common.cwd.clone()) {
        Some(dir) => Ok(dir),
        None => std::env::current_dir().context("cannot read the current directory"),
    }
}

/// A directory just trusted, and what now loads there.
#[derive(Debug)]
pub struct Trusted {
    /// The record saved.
    pub record: TrustRecord,
    /// Whether the directory has a `.cairn/config.toml` (its MCP servers
    /// and hooks load too).
    pub has_config: bool,
    /// The tools that now load there, read back through the scan sessions
    /// use.
    pub tools: Vec<ToolSpec>,
    /// The tools there that do not load, and why.
    pub problems: Vec<String>,
}

/// `cairn trust [DIR]`: record `dir` (else `--cwd`, else the current
/// directory) as trusted with its current tools.
pub fn trust(ctx: &Setup, dir: Option<PathBuf>) -> Result<Trusted> {
    let dir = target(ctx, dir)?;
    let mut store = TrustStore::load(&ctx.paths.trust_file())?;
    let record = store.trust(&dir)?.clone();
    store.save()?;
    let scan = ToolDirScan::scan(&[ToolDir::workspace(&record.workspace)], &crate::tools::tools_config(ctx), &store);
    let (tools, errors) = scan.load_all();
    Ok(Trusted {
        has_config: record.workspace.join(cairn_tools::trust::WORKSPACE_CONFIG).exists(),
        tools: tools.iter().map(|t| t.tool.spec().clone()).collect(),
        problems: errors.iter().map(ToString::to_string).collect(),
        record,
    })
}

/// A revocation: the directory meant, and its record if it had one.
#[derive(Debug)]
pub struct Revoked {
    /// The directory meant.
    pub dir: PathBuf,
    /// The record removed (`None`: it was not trusted; nothing changed).
    pub removed: Option<TrustRecord>,
}

/// `cairn trust --revoke [DIR]`: forget the directory.
pub fn revoke(ctx: &Setup, dir: Option<PathBuf>) -> Result<Revoked> {
    let dir = target(ctx, dir)?;
    let mut store = TrustStore::load(&ctx.paths.trust_file())?;
    let removed = store.revoke(&dir);
    if removed.is_some() {
        store.save()?;
    }
    Ok(Revoked { dir, removed })
}

/// Where a trusted directory stands now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// As trusted: its tools load.
    Trusted,
    /// Its tools changed since: they do not load until trusted again.
    Changed,
    /// It is gone (or unreadable): nothing loads.
    Missing,
}

impl Standing {
    /// How a listing says it.
    pub fn as_str(self) -> &'static str {
        match self {
            Standing::Trusted => "trusted",
            Standing::Changed => "changed since trusted (not loaded)",
            Standing::Missing => "missing (not loaded)",
        }
    }
}

/// `cairn trust --list`: every record, with where its directory stands.
pub fn list(ctx: &Setup) -> Result<Vec<(TrustRecord, Standing)>> {
    let store = TrustStore::load(&ctx.paths.trust_file())?;
    let state = |workspace: &Path| match store.check(workspace, &workspace.join(WORKSPACE_TOOLS_DIR)) {
        Ok(TrustState::Trusted) => Standing::Trusted,
        Ok(TrustState::Changed) => Standing::Changed,
        Ok(TrustState::Untrusted) | Err(_) => Standing::Missing,
    };
    Ok(store.records().iter().map(|r| (r.clone(), state(&r.workspace))).collect())
}
