//! `cairn undo` and `cairn redo` (and `/undo`, `/redo` in chat): open the
//! session, run `cairn_tools::rewind` with this home's pre-image store,
//! print what it came to and map it to an exit code (a refusal is 1,
//! nothing changed). The protocol is `cairn_tools::rewind`'s
//! (`docs/turn.md`, "Undo and redo"); this module must not touch the tree
//! or the session itself. Also the store's garbage collection (`cairn undo
//! --gc`, and after a turn past `tools.undo_store_max_bytes`): it reads
//! which pre-images every session file of this home names and has
//! `PreimageStore::collect` remove only the others (past its grace).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use cairn_core::storage::{JsonlStore, Storage};
use cairn_core::{Session, SessionConfig};
use cairn_tools::rewind::{self, Outcome};
use cairn_tools::undo::PreimageStore;

use crate::context::{Context, exit};
use crate::escape::escape_controls;
use crate::sessions::human_size;

pub use cairn_tools::rewind::Target;

/// The CLI's tools whose effects happen in other sessions: a subagent's
/// calls are recorded (and undone) in the child's own session.
pub const DELEGATING: &[&str] = &[crate::subagents::SPAWN];

/// The pre-image store of this cairn home.
pub fn store(ctx: &Context) -> PreimageStore {
    PreimageStore::new(ctx.paths.data.join("preimages"), u64::MAX)
}

/// Open the session at `path`; whether a turn in progress may be undone
/// is `rewind`'s to say (an interrupted turn at rest is ended by the undo).
fn open(ctx: &Context, path: &Path) -> Result<(Session<JsonlStore>, PathBuf)> {
    let store = crate::wiring::open_session(ctx, path)?;
    let cwd = PathBuf::from(&store.header().cwd);
    let session = Session::open(store, SessionConfig::default())?;
    Ok((session, cwd))
}

/// Finish an undo killed after its plan was committed, before a session
/// continues (`resume`, `chat`): what was done, if anything.
pub fn finish_interrupted(ctx: &Context, session: &mut Session<JsonlStore>, cwd: &Path) -> Result<Option<String>> {
    Ok(rewind::finish_interrupted(&store(ctx), session, cwd, false)?)
}

/// Print `outcome` (escaped: it quotes file contents and names) and say
/// what it exits with.
pub fn report(outcome: Outcome) -> Result<u8> {
    match outcome {
        Outcome::Nothing(text) | Outcome::DryRun(text) | Outcome::Done(text) => {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{}", escape_controls(text.trim_end()))?;
            Ok(exit::SUCCESS)
        }
        Outcome::Refused(text) => {
            let mut err = std::io::stderr().lock();
            writeln!(err, "{}", escape_controls(text.trim_end()))?;
            Ok(exit::ERROR)
        }
    }
}

/// `cairn undo`.
pub fn undo(ctx: &Context, path: &Path, target: Target, dry_run: bool, force: bool) -> Result<u8> {
    let (mut session, cwd) = open(ctx, path)?;
    undo_session(ctx, &mut session, &cwd, target, dry_run, force)
}

/// Undo on an open session (`cairn undo`, `/undo` in chat).
pub fn undo_session(
    ctx: &Context,
    session: &mut Session<JsonlStore>,
    cwd: &Path,
    target: Target,
    dry_run: bool,
    force: bool,
) -> Result<u8> {
    report(rewind::undo(&store(ctx), session, cwd, &target, DELEGATING, dry_run, force)?)
}

/// `cairn redo`.
pub fn redo(ctx: &Context, path: &Path, dry_run: bool, force: bool) -> Result<u8> {
    let (mut session, cwd) = open(ctx, path)?;
    redo_session(ctx, &mut session, &cwd, dry_run, force)
}

/// Redo on an open session (`cairn redo`, `/redo` in chat).
pub fn redo_session(
    ctx: &Context,
    session: &mut Session<JsonlStore>,
    cwd: &Path,
    dry_run: bool,
    force: bool,
) -> Result<u8> {
    report(rewind::redo(&store(ctx), session, cwd, dry_run, force)?)
}

/// Every pre-image a session file of this home names: the sessions
/// directory and the 9P server's archive (`data/archive`), each file read
/// whole. A file that cannot be read as a session fails the whole read
/// (a collection must not guess what it names).
fn named(ctx: &Context) -> Result<std::collections::BTreeSet<String>> {
    let mut files = crate::sessions::session_files(&ctx.paths)?;
    if let Ok(archived) = std::fs::read_dir(ctx.paths.data.join("archive")) {
        for entry in archived {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "jsonl") {
                files.push(path);
            }
        }
    }
    let mut named = std::collections::BTreeSet::new();
    for file in files {
        let store = JsonlStore::open_read_only_with(&file, ctx.settings.store_options()).map_err(|e| {
            anyhow::anyhow!(
                "cannot read {} as a session ({e}), so which pre-images it needs is not known; nothing was removed",
                file.display()
            )
        })?;
        named.extend(cairn_core::undo::named_preimages(store.index().entries()));
    }
    Ok(named)
}

/// `cairn undo --gc [--dry-run]`: remove the pre-images no session file
/// names and that were not written or reused in the last day.
pub fn gc(ctx: &Context, dry_run: bool) -> Result<u8> {
    if ctx.settings.database.value.is_some() {
        bail!(
            "a database is configured: the sessions there may name pre-images in this store, and a collection reads \
             only session files, so nothing was removed (run it without `database`, on a host whose sessions are files)"
        );
    }
    let kept = store(ctx);
    let named = named(ctx)?;
    let done = kept.collect(&named, cairn_tools::undo::GC_GRACE, dry_run, &mut |_| {})?;
    let verb = if dry_run { "would remove" } else { "removed" };
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{verb} {} pre-image(s) ({}) no session names; kept {} a session names and {} written in the last day ({} \
         in all) in {}",
        done.removed,
        human_size(done.removed_bytes),
        done.named,
        done.young,
        human_size(done.kept_bytes),
        escape_controls(&kept.dir().display().to_string())
    )?;
    Ok(exit::SUCCESS)
}

/// After a turn: when the store is over `tools.undo_store_max_bytes`,
/// collect what no session names (as `cairn undo --gc`), saying so on
/// stderr. Never with a database configured; failures are a warning.
pub fn collect_past_budget(ctx: &Context) {
    if ctx.settings.database.value.is_some() {
        return;
    }
    let kept = store(ctx);
    let budget = ctx.settings.undo_store_max_bytes.value;
    let over = match kept.size() {
        Ok(size) => size > budget,
        Err(_) => false,
    };
    if !over {
        return;
    }
    let done =
        named(ctx).and_then(|named| Ok(kept.collect(&named, cairn_tools::undo::GC_GRACE, false, &mut |_| {})?));
    match done {
        Ok(done) => crate::sessions::warn(&format!(
            "the pre-image store is over its budget of {} (tools.undo_store_max_bytes): removed {} pre-image(s) ({}) \
             no session names; {} remain",
            human_size(budget),
            done.removed,
            human_size(done.removed_bytes),
            human_size(done.kept_bytes)
        )),
        Err(e) => crate::sessions::warn(&format!(
            "the pre-image store is over its budget of {}, and collecting it failed: {e:#}",
            human_size(budget)
        )),
    }
}
