//! Undo and redo for any host (`cairn undo`/`redo`, `/undo` in chat,
//! `ctl undo` over 9P): pick the effects to revert on the session's lane
//! ([`cairn_core::undo`]), refuse when a path changed after them (with
//! diffs) unless forced, keep the current contents (for redo), commit the
//! plan (`Session::begin_undo`), restore the tree ([`crate::undo`]) and
//! commit the completion with the lane move (`Session::finish_undo`). A
//! plan committed without its completion (a killed undo) is finished
//! first by every entry point ([`finish_interrupted`]).
//!
//! It returns what happened as text for a person; it must not print, and
//! it writes the session only through those two `Session` calls.

use std::path::Path;

use cairn_core::Session;
use cairn_core::events::{EntryType, payload_of};
use cairn_core::message::Role;
use cairn_core::staged::{EntryKind, shown};
use cairn_core::storage::{Entry, Storage};
use cairn_core::undo::{UndoAppliedPayload, UndoDirection, UndoPayload, UndoStep};

use crate::undo::{self as files, PreimageStore};

/// Where an undo goes back to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Before the last turn on the lane.
    LastTurn,
    /// Before turn `n` (1-based, counted along the lane).
    Turn(usize),
    /// Right after entry `id`.
    After(String),
}

/// What an undo or redo came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing to do (why).
    Nothing(String),
    /// Refused; nothing changed (why, with diffs).
    Refused(String),
    /// A dry run: what would change.
    DryRun(String),
    /// Done (a summary).
    Done(String),
}

/// Why an undo or redo failed (the text says what to do).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RewindError(String);

fn err(e: impl std::fmt::Display) -> RewindError {
    RewindError(e.to_string())
}

fn direction(d: UndoDirection) -> &'static str {
    if d == UndoDirection::Undo { "undo" } else { "redo" }
}

/// Finish an `undo` entry no `undoApplied` names (an undo or redo killed
/// after its plan was committed): what was done, or `None` when there was
/// none (or a turn is in progress, which cannot follow such a plan).
pub fn finish_interrupted<S: Storage>(
    store: &PreimageStore,
    session: &mut Session<S>,
    cwd: &Path,
    force: bool,
) -> Result<Option<String>, RewindError> {
    if session.needs_resume() {
        return Ok(None);
    }
    // Only the undo records are kept (a copy of the whole log here would
    // double the memory of every resume of a long session).
    let mut entries = Vec::new();
    // Lent views: only the few undo records are copied, not every entry.
    session.store().visit_entry_views(&mut |entry| {
        if entry.entry_type == EntryType::Undo.tag() || entry.entry_type == EntryType::UndoApplied.tag() {
            // Lent from the store, so valid JSON: `to_entry` cannot fail.
            entries.extend(entry.to_entry().ok());
        }
    });
    let found: Vec<(String, UndoPayload)> =
        cairn_core::undo::interrupted(entries.iter()).into_iter().map(|(e, p)| (e.id.clone(), p)).collect();
    let Some((id, plan)) = found.into_iter().last() else { return Ok(None) };
    let what = direction(plan.direction);
    // Restoring files is an effect: only while the store may act (a
    // worker's lease held with margin, its claim durable).
    session
        .store()
        .may_act()
        .map_err(|e| RewindError(format!("cannot finish the interrupted {what} {id} now: {}", e.0)))?;
    // Temporaries a killed apply left are removed first: they are not the
    // plan's, and a directory holding one could not be removed.
    files::remove_temporaries(cwd, &plan.steps);
    files::restore(store, cwd, &plan.steps, force).map_err(|e| {
        // A failed restore leaves none of its temporaries (issue 46.6).
        files::remove_temporaries(cwd, &plan.steps);
        RewindError(format!(
            "cannot finish the interrupted {what} {id}: {e}; fix that path (or {what} with --force) and {what} again"
        ))
    })?;
    files::remove_temporaries(cwd, &plan.steps);
    let applied = session.finish_undo(&id, &plan).map_err(err)?;
    Ok(Some(format!(
        "finished the interrupted {what} {id}: {} path(s) restored; the lane {} is at {applied}",
        plan.steps.len(),
        shown(&plan.lane)
    )))
}

/// Undo back to `target` on the session's current lane. `delegating`
/// names the host's tools whose effects happen in other sessions (the
/// CLI's `spawn_agent`: a child session's calls are its own): a range
/// holding one of their calls cannot be fully undone here.
pub fn undo<S: Storage>(
    store: &PreimageStore,
    session: &mut Session<S>,
    cwd: &Path,
    target: &Target,
    delegating: &[&str],
    dry_run: bool,
    force: bool,
) -> Result<Outcome, RewindError> {
    // A turn interrupted where nothing of a tool is in flight (Ctrl-C, a
    // failed provider call, a kill between calls) is ended by the undo
    // itself, without a model call; one whose call was executing must be
    // settled by `resume` first (its effect may be half done).
    if session.needs_resume() && !session.interrupted_at_rest() {
        return Err(RewindError(format!(
            "a call of this session's last turn was executing when it stopped (phase {:?}); settle it first with \
             `cairn resume`, then undo",
            session.pc().phase
        )));
    }
    if !dry_run && let Some(done) = finish_interrupted(store, session, cwd, force)? {
        return Ok(Outcome::Done(done));
    }
    let lane = session.lane().to_owned();
    let Some(head) = session.head().map(str::to_owned) else {
        return Ok(Outcome::Nothing(format!("nothing to undo: the lane {} is empty", shown(&lane))));
    };
    let entries = session.store().path_to(&head).map_err(err)?;
    let users: Vec<usize> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| cairn_core::turn::entry_message(e).is_some_and(|m| m.role == Role::User))
        .map(|(i, _)| i)
        .collect();
    let start = match target {
        Target::LastTurn => match users.last() {
            Some(i) => *i,
            None => return Ok(Outcome::Nothing(format!("nothing to undo: the lane {} has no turn", shown(&lane)))),
        },
        Target::Turn(n) => match n.checked_sub(1).and_then(|k| users.get(k)) {
            Some(i) => *i,
            None => {
                return Err(RewindError(format!(
                    "there is no turn {n} on the lane {} (it has {} turn(s))",
                    shown(&lane),
                    users.len()
                )));
            }
        },
        Target::After(id) => match entries.iter().position(|e| &e.id == id) {
            Some(i) => i + 1,
            None => {
                return Err(RewindError(format!("entry {} is not on the lane {}", shown(id), shown(&lane))));
            }
        },
    };
    let to_entry = start.checked_sub(1).map(|i| entries[i].id.clone());
    let range = &entries[start..];
    let undo_only = |e: &Entry| matches!(EntryType::of_entry(e), Some(EntryType::Undo | EntryType::UndoApplied));
    if range.iter().all(undo_only) {
        return Ok(Outcome::Nothing(format!("nothing to undo: the lane {} is already there", shown(&lane))));
    }
    // The one rule `cairn show --tools` also marks calls by.
    let mut effects = cairn_core::undo::effects(range, delegating);
    for u in &mut effects.unrevertible {
        u.turn = turn_of(&entries, &users, &u.invocation_id);
    }
    if !effects.unrevertible.is_empty() && !force {
        let mut text = format!(
            "undo refused: these effects of {} cannot be undone, so the files would not match the conversation:\n",
            turns(&effects.unrevertible)
        );
        for u in &effects.unrevertible {
            text.push_str(&format!("  {}\n", not_undone(u)));
        }
        text.push_str("nothing was changed; use --force to revert the rest anyway\n");
        return Ok(Outcome::Refused(text));
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
    run(store, session, cwd, plan, dry_run, force)
}

/// Reapply the undo the session's lane head stands on.
pub fn redo<S: Storage>(
    store: &PreimageStore,
    session: &mut Session<S>,
    cwd: &Path,
    dry_run: bool,
    force: bool,
) -> Result<Outcome, RewindError> {
    if session.needs_resume() {
        return Err(RewindError(format!(
            "a turn of this session is in progress (phase {:?}); finish it first (resume it), then redo",
            session.pc().phase
        )));
    }
    if !dry_run && let Some(done) = finish_interrupted(store, session, cwd, force)? {
        return Ok(Outcome::Done(done));
    }
    let lane = session.lane().to_owned();
    let mut at = session.head().map(str::to_owned);
    // Down from the head past redo completions, to an undo's completion.
    let (undo_id, undone) = loop {
        let entry: Option<Entry> = at.as_deref().and_then(|id| session.store().entry(id));
        let Some(applied) = entry.as_ref().and_then(payload_of::<UndoAppliedPayload>) else {
            return Ok(Outcome::Nothing(format!(
                "nothing to redo: the lane {} does not stand on an undo",
                shown(&lane)
            )));
        };
        if applied.direction == UndoDirection::Undo {
            match session.store().entry(&applied.undo).as_ref().and_then(payload_of::<UndoPayload>) {
                Some(p) => break (applied.undo, p),
                None => return Err(RewindError(format!("the undo entry {} is missing or unreadable", applied.undo))),
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
    run(store, session, cwd, plan, dry_run, force)
}

/// Check, show or carry out `plan`.
fn run<S: Storage>(
    store: &PreimageStore,
    session: &mut Session<S>,
    cwd: &Path,
    mut plan: UndoPayload,
    dry_run: bool,
    force: bool,
) -> Result<Outcome, RewindError> {
    let what = direction(plan.direction);
    for s in &plan.steps {
        if let Some(to) = &s.to
            && matches!(to.kind, EntryKind::File | EntryKind::Symlink)
            && !store.has(&to.sha256, to.size)
        {
            return Err(RewindError(format!(
                "cannot {what}: the kept content of {} (sha256 {}) is missing from {}; nothing was changed",
                shown(&s.path),
                to.sha256,
                store.dir().display()
            )));
        }
    }
    let conflicts = files::conflicts(cwd, &plan.steps).map_err(RewindError)?;
    if !conflicts.is_empty() && !force {
        let mut text =
            format!("{what} refused: these paths changed after the turn, and {what} would overwrite them:\n");
        for c in &conflicts {
            text.push_str(&format!("  {}: {}\n", shown(&c.path), c.why));
        }
        for c in &conflicts {
            if let Some(step) = plan.steps.iter().find(|s| s.path == c.path) {
                text.push_str(&files::conflict_diff(store, cwd, step));
            }
        }
        text.push_str(&format!(
            "nothing was changed; use --force to {what} anyway (your versions of these paths are kept for redo)\n"
        ));
        return Ok(Outcome::Refused(text));
    }
    if dry_run {
        let mut text = format!(
            "{what} would revert {} effect(s) and move the lane {} to {}:\n",
            plan.invocations.len(),
            shown(&plan.lane),
            plan.to_entry.as_deref().unwrap_or("its start")
        );
        for s in &plan.steps {
            text.push_str(&format!(
                "  {}: {} -> {}\n",
                shown(&s.path),
                files::describe(s.from.as_ref()),
                files::describe(s.to.as_ref())
            ));
        }
        if !plan.unrevertible.is_empty() {
            text.push_str(&format!("  not fully reverted ({}):\n", turns(&plan.unrevertible)));
        }
        for u in &plan.unrevertible {
            text.push_str(&format!("  cannot undo {}\n", not_undone(u)));
        }
        return Ok(Outcome::DryRun(text));
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
    files::keep_current(store, cwd, &kept)
        .map_err(|e| RewindError(format!("cannot keep the current contents: {e}; nothing was changed")))?;
    if session.needs_resume() {
        // An interrupted turn at rest (`undo` checked) is ended here, once
        // nothing can refuse: the unrun calls it settles change nothing,
        // so the plan stands, from the new head.
        session.end_interrupted("ended by an undo of it; nothing more of it runs").map_err(err)?;
        if let Some(head) = session.head() {
            plan.from_entry = head.to_owned();
        }
    }
    let id = session.begin_undo(&plan).map_err(|e| RewindError(format!("cannot record the plan: {e}")))?;
    files::restore(store, cwd, &plan.steps, force).map_err(|e| {
        // A failed restore leaves none of its temporaries (issue 46.6).
        files::remove_temporaries(cwd, &plan.steps);
        RewindError(format!("{what} {id} stopped: {e}; {what} again to finish it"))
    })?;
    files::remove_temporaries(cwd, &plan.steps);
    let applied = session.finish_undo(&id, &plan).map_err(err)?;
    let mut text = format!(
        "{what} {id}: {} effect(s), {} path(s) restored; the lane {} is at {applied}{}\n",
        plan.invocations.len(),
        plan.steps.len(),
        shown(&plan.lane),
        if plan.forced.is_empty() {
            String::new()
        } else {
            format!(" (overwrote {} changed path(s))", plan.forced.len())
        }
    );
    if !plan.unrevertible.is_empty() {
        text.push_str(&format!("not fully reverted ({}):\n", turns(&plan.unrevertible)));
    }
    for u in &plan.unrevertible {
        text.push_str(&format!("  not undone: {}\n", not_undone(u)));
    }
    Ok(Outcome::Done(text))
}

/// The turn (1-based along the lane `entries`, whose user messages are at
/// `users`) in which `invocation` started.
fn turn_of(entries: &[Entry], users: &[usize], invocation: &str) -> Option<usize> {
    let at = entries.iter().position(|e| {
        payload_of::<cairn_core::events::ToolStartedPayload>(e).is_some_and(|p| p.invocation_id == invocation)
    })?;
    Some(users.iter().filter(|u| **u < at).count()).filter(|n| *n > 0)
}

/// "turn 2" or "turns 1, 3" (the turns holding `unrevertible`), or "the
/// range" when none was counted.
fn turns(unrevertible: &[cairn_core::undo::Unrevertible]) -> String {
    let mut n: Vec<usize> = unrevertible.iter().filter_map(|u| u.turn).collect();
    n.sort_unstable();
    n.dedup();
    match n.as_slice() {
        [] => "the range".to_owned(),
        [one] => format!("turn {one}"),
        many => format!("turns {}", many.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")),
    }
}

/// One not-undoable effect for a person: "shell (i4, turn 2): why".
fn not_undone(u: &cairn_core::undo::Unrevertible) -> String {
    let turn = u.turn.map(|t| format!(", turn {t}")).unwrap_or_default();
    format!("{} ({}{turn}): {}", u.tool, u.invocation_id, u.reason)
}
