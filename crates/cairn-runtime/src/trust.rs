//! `cairn trust`: a person trusts, revokes or lists the working directories
//! whose own tools (`.cairn/tools/`) cairn may load.
//!
//! The rule and the record live in `cairn_tools::trust`; this module only
//! resolves the directory, shows what is being trusted and saves the record
//! in the data directory (`Paths::trust_file`). Nothing else in the CLI ever
//! adds a record: sessions, `--yes` and `--json` only read it.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use cairn_tools::trust::WORKSPACE_TOOLS_DIR;
use cairn_tools::{ToolDir, ToolDirScan, TrustState, TrustStore};
use serde_json::json;

use crate::context::{Context, exit};
use crate::sessions::format_time;

/// What `cairn trust` was asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Record the directory as trusted with its current tools.
    Trust,
    /// Forget it.
    Revoke,
    /// Show every record.
    List,
}

/// The directory meant: the argument, else `--cwd`, else the current one.
fn target(ctx: &Context, dir: Option<PathBuf>) -> Result<PathBuf> {
    match dir.or_else(|| ctx.common.cwd.clone()) {
        Some(dir) => Ok(dir),
        None => std::env::current_dir().context("cannot read the current directory"),
    }
}

/// `cairn trust [DIR] [--revoke | --list]`.
pub fn run(ctx: &Context, dir: Option<PathBuf>, action: Action) -> Result<u8> {
    let file = ctx.paths.trust_file();
    let mut store = TrustStore::load(&file)?;
    match action {
        Action::Trust => trust(ctx, &mut store, &target(ctx, dir)?),
        Action::Revoke => revoke(ctx, &mut store, &target(ctx, dir)?),
        Action::List => list(ctx, &store),
    }
}

fn trust(ctx: &Context, store: &mut TrustStore, dir: &Path) -> Result<u8> {
    let record = store.trust(dir)?.clone();
    store.save()?;
    // What now loads there, read back through the same scan sessions use.
    let scan = ToolDirScan::scan(&[ToolDir::workspace(&record.workspace)], &crate::wiring::tools_config(ctx), store);
    let (tools, errors) = scan.load_all();
    let mut out = std::io::stdout().lock();
    if ctx.common.json {
        let tools: Vec<_> = tools
            .iter()
            .map(|t| {
                let spec = t.tool.spec();
                json!({"name": spec.name, "risk": spec.risk, "capabilities": spec.capabilities})
            })
            .collect();
        let problems: Vec<String> = errors.iter().map(ToString::to_string).collect();
        writeln!(
            out,
            "{}",
            json!({"trusted": record.workspace, "fingerprint": record.fingerprint, "tools": tools, "problems": problems})
        )?;
        return Ok(exit::SUCCESS);
    }
    let s = &ctx.out_style;
    writeln!(
        out,
        "trusted {}: its {WORKSPACE_TOOLS_DIR}/ tools{} now load in sessions there, until any of it changes",
        record.workspace.display(),
        if record.workspace.join(cairn_tools::trust::WORKSPACE_CONFIG).exists() {
            format!(" and the MCP servers and hooks of {}", cairn_tools::trust::WORKSPACE_CONFIG)
        } else {
            String::new()
        }
    )?;
    for tool in &tools {
        let spec = tool.tool.spec();
        let caps: Vec<String> = spec.capabilities.iter().map(|c| format!("{c:?}")).collect();
        writeln!(out, "  {:<20} {:<12} {}", spec.name, format!("{:?}", spec.risk), caps.join(","))?;
    }
    if tools.is_empty() {
        writeln!(out, "  (no tool loads there yet)")?;
    }
    for e in &errors {
        writeln!(out, "  {}", s.yellow(&format!("not loaded: {e}")))?;
    }
    writeln!(
        out,
        "{}",
        s.dim(&format!("revoke with `cairn trust --revoke {}`", crate::escape::quoted(&record.workspace)))
    )?;
    Ok(exit::SUCCESS)
}

fn revoke(ctx: &Context, store: &mut TrustStore, dir: &Path) -> Result<u8> {
    let removed = store.revoke(dir);
    if removed.is_some() {
        store.save()?;
    }
    let mut out = std::io::stdout().lock();
    match (&removed, ctx.common.json) {
        (Some(r), true) => writeln!(out, "{}", json!({"revoked": r.workspace}))?,
        (Some(r), false) => writeln!(out, "{} is no longer trusted: its tools will not load", r.workspace.display())?,
        (None, true) => writeln!(out, "{}", json!({"revoked": null}))?,
        (None, false) => writeln!(out, "{} was not trusted; nothing changed", dir.display())?,
    }
    Ok(exit::SUCCESS)
}

fn list(ctx: &Context, store: &TrustStore) -> Result<u8> {
    let mut out = std::io::stdout().lock();
    let state = |workspace: &Path| match store.check(workspace, &workspace.join(WORKSPACE_TOOLS_DIR)) {
        Ok(TrustState::Trusted) => "trusted",
        Ok(TrustState::Changed) => "changed since trusted (not loaded)",
        Ok(TrustState::Untrusted) | Err(_) => "missing (not loaded)",
    };
    for record in store.records() {
        if ctx.common.json {
            let line = json!({
                "workspace": record.workspace, "trustedAt": record.trusted_at, "tools": record.tools,
                "fingerprint": record.fingerprint, "state": state(&record.workspace),
            });
            writeln!(out, "{line}")?;
        } else {
            writeln!(
                out,
                "{}  {}  {}  [{}]",
                record.workspace.display(),
                format_time(record.trusted_at),
                state(&record.workspace),
                record.tools.join(", ")
            )?;
        }
    }
    if store.records().is_empty() && !ctx.common.json {
        writeln!(
            out,
            "no trusted workspaces; trust one with `cairn trust DIR` after reading its {WORKSPACE_TOOLS_DIR}/"
        )?;
    }
    Ok(exit::SUCCESS)
}
