//! `cairn undo` and `cairn redo`: revert the file effects of a session's
//! last turn (or every turn after an entry) newest first, back to the
//! state before them, and move the lane head back with them; or reapply
//! an undo. Conflicts (a path changed after the turn) refuse the whole
//! undo, with diffs, unless `--force`. Durable: the plan is committed
//! (`undo` entry) before any file is touched, the apply is idempotent,
//! and running either command again finishes an interrupted one first.
//!
//! What to revert is `cairn_core::undo`'s; the file work is
//! `cairn_tools::undo`'s; this module wires them and prints. It writes
//! the session only through `Session::begin_undo`/`finish_undo`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use cairn_core::events::{EntryType, payload_of};
use cairn_core::message::Role;
use cairn_core::staged::{EntryKind, shown};
use cairn_core::storage::{Entry, JsonlStore, Storage};
use cairn_core::undo::{UndoAppliedPayload, UndoDirection, UndoPayload, UndoStep};
use cairn_core::{Session, SessionConfig};
use cairn_tools::undo::{self as files, PreimageStore};

use crate::context::{Context, exit};
use crate::render::escape_controls;

/// Where the target of an undo is.
#[derive(Debug, Clone)]
pub enum Target {
    /// The last turn on the lane.
    LastTurn,
    /// Turn `n` (1-based, counted along the lane) and every turn after it.
    Turn(usize),
    /// Everything after entry `id`.
    After(String),
}

/// The pre-image store of this cairn home.
pub fn store(ctx: &Context) -> PreimageStore {
    PreimageStore::new(ctx.paths.data.join("preimages"), u64::MAX)
}

fn open(ctx: &Context, path: &Path) -> Result<(Session<JsonlStore>, PathBuf)> {
    let store = crate::wiring::open_session(ctx, path)?;
    let cwd = PathBuf::from(&store.header().cwd);
    let session = Session::open(store, SessionConfig::default())?;
    if session.needs_resume() {
        bail!(
            "a turn of this session is in progress (phase {:?}); finish it first with `cairn resume`, then undo",
            session.pc().phase
        );
    }
    Ok((session, cwd))
}

/// Finish an `undo` entry no `undoApplied` names (an undo or redo killed
/// after its plan was committed): what was done, for a person, or `None`
/// when there was none. Every command that continues a session (`undo`,
/// `redo`, `resume`, `chat`) calls this first, so no turn runs on a tree
/// half reverted.
pub fn finish_interrupted(
    ctx: &Context,
    session: &mut Session<JsonlStore>,
    cwd: &Path,
    force: bool,
) -> Result<Option<String>> {
    if session.needs_resume() {
        return Ok(None);
    }
    let found: Vec<(String, UndoPayload)> = cairn_core::undo::interrupted(session.store().entries().iter())
        .into_iter()
        .map(|(e, p)| (e.id.clone(), p))
        .collect();
    let Some((id, plan)) = found.into_iter().last() else { return Ok(None) };
    let what = if plan.direction == UndoDirection::Undo { "undo" } else { "redo" };
    // Temporaries a killed apply left are removed first: they are not
    // the plan's, and a directory holding one could not be removed.
    files::remove_temporaries(cwd, &plan.steps);
    files::restore(&store(ctx), cwd, &plan.steps, force).map_err(|e| {
        anyhow::anyhow!(
            "cannot finish the interrupted {what} {id}: {e}; fix that path (or run `cairn {what} --force`) and run \
             `cairn {what}` again"
        )
    })?;
    files::remove_temporaries(cwd, &plan.steps);
    let applied = session.finish_undo(&id, &plan)?;
    Ok(Some(format!(
        "finished the interrupted {what} {id}: {} path(s) restored; the lane {} is at {}",
        plan.steps.len(),
        escape_controls(&plan.lane),
        applied
    )))
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
    if session.needs_resume() {
        bail!("a turn of this session is in progress; finish it first with `cairn resume`, then undo");
    }
    if !dry_run && let Some(done) = finish_interrupted(ctx, session, cwd, force)? {
        println!("{done}");
        return Ok(exit::SUCCESS);
    }
    let lane = session.lane().to_owned();
    let Some(head) = session.head().map(str::to_owned) else {
        println!("nothing to undo: the lane {} is empty", escape_controls(&lane));
        return Ok(exit::SUCCESS);
    };
    let entries = session.store().path_to(&head)?;
    let users: Vec<usize> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| cairn_core::turn::entry_message(e).is_some_and(|m| m.role == Role::User))
        .map(|(i, _)| i)
        .collect();
    let start = match &target {
        Target::LastTurn => match users.last() {
            Some(i) => *i,
            None => {
                println!("nothing to undo: the lane {} has no turn", escape_controls(&lane));
                return Ok(exit::SUCCESS);
            }
        },
        Target::Turn(n) => match n.checked_sub(1).and_then(|k| users.get(k)) {
            Some(i) => *i,
            None => bail!(
                "there is no turn {n} on the lane {} (it has {} turn(s)); see them with `cairn show`",
                escape_controls(&lane),
                users.len()
            ),
        },
        Target::After(id) => match entries.iter().position(|e| &e.id == id) {
            Some(i) => i + 1,
            None => bail!(
                "entry {} is not on the lane {} (see the entries with `cairn show`)",
                escape_controls(id),
                escape_controls(&lane)
            ),
        },
    };
    let to_entry = start.checked_sub(1).map(|i| entries[i].id.clone());
    let range = &entries[start..];
    let undo_only = |e: &Entry| matches!(EntryType::of_entry(e), Some(EntryType::Undo | EntryType::UndoApplied));
    if range.iter().all(undo_only) {
        println!("nothing to undo: the lane {} is already there", escape_controls(&lane));
        return Ok(exit::SUCCESS);
    }
    let effects = cairn_core::undo::effects(range);
    if !effects.unrevertible.is_empty() && !force {
        let mut err = std::io::stderr().lock();
        writeln!(err, "undo refused: these effects cannot be undone, so the files would not match the conversation:")?;
        for u in &effects.unrevertible {
            writeln!(err, "  {} ({}): {}", escape_controls(&u.tool), u.invocation_id, escape_controls(&u.reason))?;
        }
        writeln!(err, "nothing was changed; use --force to revert the rest anyway")?;
        return Ok(exit::ERROR);
    }
    let steps = cairn_core::undo::plan(&effects.revertible);
    let invocations: Vec<String> = effects.revertible.iter().map(|r| r.staged.invocation_id.clone()).collect();
    let plan = UndoPayload {
        direction: UndoDirection::Undo,
        lane,
        from_entry: head,
        to_entry,
        steps,
        invocations,
        unrevertible: effects.unrevertible,
        forced: Vec::new(),
        redoes: None,
    };
    run(ctx, session, cwd, plan, dry_run, force)
}

/// `cairn redo`: reapply the undo the lane head stands on.
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
    if session.needs_resume() {
        bail!("a turn of this session is in progress; finish it first with `cairn resume`, then redo");
    }
    if !dry_run && let Some(done) = finish_interrupted(ctx, session, cwd, force)? {
        println!("{done}");
        return Ok(exit::SUCCESS);
    }
    let lane = session.lane().to_owned();
    let mut at = session.head().map(str::to_owned);
    let (undo_id, undone) = loop {
        let entry: Option<Entry> = at.as_deref().and_then(|id| session.store().entry(id));
        let Some(applied) = entry.as_ref().and_then(payload_of::<UndoAppliedPayload>) else {
            println!("nothing to redo: the lane {} does not stand on an undo", escape_controls(&lane));
            return Ok(exit::SUCCESS);
        };
        if applied.direction == UndoDirection::Undo {
            let intent = session.store().entry(&applied.undo).as_ref().and_then(payload_of::<UndoPayload>);
            match intent {
                Some(p) => break (applied.undo, p),
                None => bail!("the undo entry {} is missing or unreadable", escape_controls(&applied.undo)),
            }
        }
        at = entry.and_then(|e| e.parent_id);
    };
    let plan = UndoPayload {
        direction: UndoDirection::Redo,
        lane,
        from_entry: session.head().unwrap_or_default().to_owned(),
        to_entry: Some(undone.from_entry.clone()),
        steps: cairn_core::undo::reversed(&undone.steps),
        invocations: undone.invocations.clone(),
        unrevertible: Vec::new(),
        forced: Vec::new(),
        redoes: Some(undo_id),
    };
    run(ctx, session, cwd, plan, dry_run, force)
}

/// Check, show or carry out `plan`.
fn run(
    ctx: &Context,
    session: &mut Session<JsonlStore>,
    cwd: &Path,
    mut plan: UndoPayload,
    dry_run: bool,
    force: bool,
) -> Result<u8> {
    let what = if plan.direction == UndoDirection::Undo { "undo" } else { "redo" };
    let store = store(ctx);
    for s in &plan.steps {
        if let Some(to) = &s.to
            && matches!(to.kind, EntryKind::File | EntryKind::Symlink)
            && !store.has(&to.sha256, to.size)
        {
            bail!(
                "cannot {what}: the kept content of {} (sha256 {}) is missing from {}; nothing was changed",
                shown(&s.path),
                to.sha256,
                store.dir().display()
            );
        }
    }
    let conflicts = files::conflicts(cwd, &plan.steps).map_err(anyhow::Error::msg)?;
    if !conflicts.is_empty() && !force {
        let mut err = std::io::stderr().lock();
        writeln!(err, "{what} refused: these paths changed after the turn, and {what} would overwrite them:")?;
        for c in &conflicts {
            writeln!(err, "  {}: {}", shown(&c.path), c.why)?;
        }
        for c in &conflicts {
            if let Some(step) = plan.steps.iter().find(|s| s.path == c.path) {
                write!(err, "{}", escape_controls(&files::conflict_diff(&store, cwd, step)))?;
            }
        }
        writeln!(
            err,
            "nothing was changed; use --force to {what} anyway (your changes to these paths are kept for redo)"
        )?;
        return Ok(exit::ERROR);
    }
    if dry_run {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "{what} would revert {} effect(s) and move the lane {} to {}:",
            plan.invocations.len(),
            escape_controls(&plan.lane),
            plan.to_entry.as_deref().unwrap_or("its start")
        )?;
        for s in &plan.steps {
            writeln!(
                out,
                "  {}: {} -> {}",
                shown(&s.path),
                files::describe(s.from.as_ref()),
                files::describe(s.to.as_ref())
            )?;
        }
        for u in &plan.unrevertible {
            writeln!(
                out,
                "  cannot undo {} ({}): {}",
                escape_controls(&u.tool),
                u.invocation_id,
                escape_controls(&u.reason)
            )?;
        }
        return Ok(exit::SUCCESS);
    }
    // What is there now is what a redo puts back: a forced path records
    // the state found (the person's), not the one the turn left.
    for c in &conflicts {
        if let Some(step) = plan.steps.iter_mut().find(|s| s.path == c.path) {
            step.from = c.now.clone();
            plan.forced.push(c.path.clone());
        }
    }
    let kept: Vec<UndoStep> = plan.steps.clone();
    files::keep_current(&store, cwd, &kept).map_err(|e| anyhow::anyhow!("cannot keep the current contents: {e}"))?;
    let id = session.begin_undo(&plan).context("cannot record the plan")?;
    files::restore(&store, cwd, &plan.steps, force)
        .map_err(|e| anyhow::anyhow!("{what} {id} stopped: {e}; run `cairn {what}` again to finish it"))?;
    files::remove_temporaries(cwd, &plan.steps);
    let applied = session.finish_undo(&id, &plan)?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{what} {id}: {} effect(s), {} path(s) restored; the lane {} is at {applied}{}",
        plan.invocations.len(),
        plan.steps.len(),
        escape_controls(&plan.lane),
        if plan.forced.is_empty() {
            String::new()
        } else {
            format!(" (overwrote {} changed path(s))", plan.forced.len())
        }
    )?;
    for u in &plan.unrevertible {
        writeln!(
            out,
            "  not undone: {} ({}): {}",
            escape_controls(&u.tool),
            u.invocation_id,
            escape_controls(&u.reason)
        )?;
    }
    Ok(exit::SUCCESS)
}
