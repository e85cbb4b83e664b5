//! `cairn undo` and `cairn redo` (and `/undo`, `/redo` in chat), one
//! command path whatever the backend ([`rewind`]): find the session (a
//! session file, or a PostgreSQL session whose working tree is on this
//! host), run `cairn_tools::rewind` with this home's pre-image store and
//! return what it came to (the CLI prints it and maps a refusal to exit
//! code 1). The protocol is `cairn_tools::rewind`'s (`docs/turn.md`, "Undo
//! and redo"); this module must not touch the tree or the session itself,
//! nor print. Also the store's garbage collection (`cairn undo --gc`, and
//! after a turn past `tools.undo_store_max_bytes`): it reads which
//! pre-images every session file of this home names and has
//! `PreimageStore::collect` remove only the others (past its grace).

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use cairn_core::storage::{JsonlStore, Storage};
use cairn_core::{Session, SessionConfig};
use cairn_tools::rewind;
use cairn_tools::undo::PreimageStore;

use crate::sessions::human_size;
use crate::setup::Setup;

pub use cairn_tools::rewind::{Outcome, Target};
pub use cairn_tools::undo::Collected;

/// What `cairn undo` or `cairn redo` is asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Undo the turns `Target` names.
    Undo(Target),
    /// Reapply the undo the lane stands on.
    Redo,
}

/// The CLI's tools whose effects happen in other sessions: a subagent's
/// calls are recorded (and undone) in the child's own session.
pub const DELEGATING: &[&str] = &[crate::subagents::SPAWN];

/// The pre-image store of this cairn home.
pub fn store(ctx: &Setup) -> PreimageStore {
    PreimageStore::new(ctx.paths.data.join("preimages"), u64::MAX)
}

/// Open the session at `path`; whether a turn in progress may be undone
/// is `rewind`'s to say (an interrupted turn at rest is ended by the undo).
fn open(ctx: &Setup, path: &Path) -> Result<(Session<JsonlStore>, PathBuf)> {
    let store = crate::parts::open_session(ctx, path)?;
    let cwd = PathBuf::from(&store.header().cwd);
    let session = Session::open(store, SessionConfig::default())?;
    Ok((session, cwd))
}

/// Finish an undo killed after its plan was committed, before a session
/// continues (`resume`, `chat`): what was done, if anything.
pub fn finish_interrupted(ctx: &Setup, session: &mut Session<JsonlStore>, cwd: &Path) -> Result<Option<String>> {
    Ok(rewind::finish_interrupted(&store(ctx), session, cwd, false)?)
}

impl Request {
    /// The span's name (`undo`, `redo`).
    fn name(&self) -> &'static str {
        match self {
            Request::Undo(_) => "undo",
            Request::Redo => "redo",
        }
    }
}

/// `cairn undo`/`cairn redo` of the session `target` names (an id, prefix,
/// name or path; `None`: the most recent session file), in whichever
/// backend keeps it: session files, or with `database` a PostgreSQL
/// session (by id or prefix; `target` is required there).
pub fn rewind(ctx: &Setup, target: Option<&str>, request: Request, dry_run: bool, force: bool) -> Result<Outcome> {
    if ctx.settings.database.value.is_some() {
        let Some(target) = target else { bail!("which session? give its id (with --database, there is no default)") };
        return database_rewind(ctx, target, request, dry_run, force);
    }
    let path = match target {
        Some(target) => crate::sessions::resolve(ctx, target)?,
        None => crate::sessions::last(ctx)?,
    };
    let (mut session, cwd) = open(ctx, &path)?;
    match request {
        Request::Undo(target) => undo_session(ctx, &mut session, &cwd, target, dry_run, force),
        Request::Redo => redo_session(ctx, &mut session, &cwd, dry_run, force),
    }
}

/// The span of an undo or redo of the session in `store`, under the
/// traceparent its turns ran under (kept in the session) when one was
/// handed in.
fn operation(store: &impl Storage, name: &str) -> cairn_telemetry::Operation {
    let (ns, key) = cairn_telemetry::PARENT_REGISTER;
    let kept = store.register(ns, key).and_then(|raw| raw.parse::<String>().ok());
    let id = &store.header().id;
    // Nothing is written here: a traceparent handed to this process is
    // this command's, the session keeps the one its turns ran under.
    let _ = cairn_telemetry::keep_parent(id, kept.as_deref());
    cairn_telemetry::Operation::start(id, name)
}

/// End an undo's or redo's span (a span of its own in the session's
/// trace, `cairn_telemetry::Operation`) with what came of it.
fn traced(span: cairn_telemetry::Operation, result: Result<Outcome>) -> Result<Outcome> {
    match &result {
        Ok(outcome) => span.finish(Ok(match outcome {
            Outcome::Nothing(_) => "nothing",
            Outcome::Refused(_) => "refused",
            Outcome::DryRun(_) => "dryRun",
            Outcome::Done(_) => "done",
        })),
        Err(e) => span.finish(Err(&format!("{e:#}"))),
    }
    result
}

/// Undo on an open session (`cairn undo`, `/undo` in chat).
pub fn undo_session(
    ctx: &Setup,
    session: &mut Session<JsonlStore>,
    cwd: &Path,
    target: Target,
    dry_run: bool,
    force: bool,
) -> Result<Outcome> {
    let span = operation(session.store(), "undo");
    traced(span, rewind::undo(&store(ctx), session, cwd, &target, DELEGATING, dry_run, force).map_err(Into::into))
}

/// Redo on an open session (`cairn redo`, `/redo` in chat).
pub fn redo_session(
    ctx: &Setup,
    session: &mut Session<JsonlStore>,
    cwd: &Path,
    dry_run: bool,
    force: bool,
) -> Result<Outcome> {
    let span = operation(session.store(), "redo");
    traced(span, rewind::redo(&store(ctx), session, cwd, dry_run, force).map_err(Into::into))
}

/// Undo or redo of a PostgreSQL session: the same protocol as for a
/// session file, committed to the database without a lease of its own (a
/// commit is refused while a worker holds the session), run on this
/// host's working tree and pre-image store. So it must run on the host
/// whose turn kept them: a working directory missing here is refused
/// naming it, and a missing pre-image is refused (nothing changed) by the
/// protocol itself.
#[cfg(feature = "postgres")]
fn database_rewind(ctx: &Setup, target: &str, request: Request, dry_run: bool, force: bool) -> Result<Outcome> {
    let mut client = crate::parts::database_client(ctx)?;
    let id = cairn_pg::catalog::resolve(&mut client, target)?;
    let opened = cairn_pg::PgStore::open(client, &id)?;
    let cwd = PathBuf::from(&opened.header().cwd);
    if !cwd.is_dir() {
        bail!(
            "session {id} ran in {}, which is not a directory on this host: undo it on the worker host that ran its \
             turns (the working tree and the pre-images are there); nothing was changed",
            crate::escape::escape_controls(&cwd.display().to_string())
        );
    }
    let mut session = Session::open(opened, SessionConfig::default())?;
    if session.needs_resume() {
        bail!(
            "a turn of session {id} is in progress (phase {:?}); let a worker finish it, then undo",
            session.pc().phase
        );
    }
    let kept = store(ctx);
    let span = operation(session.store(), request.name());
    let result = match request {
        Request::Undo(t) => rewind::undo(&kept, &mut session, &cwd, &t, DELEGATING, dry_run, force),
        Request::Redo => rewind::redo(&kept, &mut session, &cwd, dry_run, force),
    };
    traced(span, result.map_err(anyhow::Error::from))
}

#[cfg(not(feature = "postgres"))]
fn database_rewind(_: &Setup, _: &str, _: Request, _: bool, _: bool) -> Result<Outcome> {
    bail!(crate::parts::NO_POSTGRES)
}

/// Every pre-image a session file of this home names: the sessions
/// directory and the 9P server's archive (`data/archive`), each file read
/// whole. A file that cannot be read as a session fails the whole read
/// (a collection must not guess what it names).
fn named(ctx: &Setup) -> Result<std::collections::BTreeSet<String>> {
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
/// names and that were not written or reused in the last day; what was
/// (or would be) removed and kept.
pub fn gc(ctx: &Setup, dry_run: bool) -> Result<Collected> {
    if ctx.settings.database.value.is_some() {
        bail!(
            "a database is configured: the sessions there may name pre-images in this store, and a collection reads \
             only session files, so nothing was removed (run it without `database`, on a host whose sessions are files)"
        );
    }
    let kept = store(ctx);
    let named = named(ctx)?;
    Ok(kept.collect(&named, cairn_tools::undo::GC_GRACE, dry_run, &mut |_| {})?)
}

/// After a turn: when the store is over `tools.undo_store_max_bytes`,
/// collect what no session names (as `cairn undo --gc`), saying so in a
/// warning note. Never with a database configured; failures are a warning.
pub fn collect_past_budget(ctx: &Setup) {
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
        Ok(done) => ctx.notes.warn(format!(
            "the pre-image store is over its budget of {} (tools.undo_store_max_bytes): removed {} pre-image(s) ({}) \
             no session names; {} remain",
            human_size(budget),
            done.removed,
            human_size(done.removed_bytes),
            human_size(done.kept_bytes)
        )),
        Err(e) => ctx.notes.warn(format!(
            "the pre-image store is over its budget of {}, and collecting it failed: {e:#}",
            human_size(budget)
        )),
    }
}
