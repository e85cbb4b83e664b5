//! `cairn undo` and `cairn redo` (and `/undo`, `/redo` in chat): open the
//! session, run `cairn_tools::rewind` with this home's pre-image store,
//! print what it came to and map it to an exit code (a refusal is 1,
//! nothing changed). The protocol is `cairn_tools::rewind`'s
//! (`docs/turn.md`, "Undo and redo"); this module must not touch the tree
//! or the session itself.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use cairn_core::storage::{JsonlStore, Storage};
use cairn_core::{Session, SessionConfig};
use cairn_tools::rewind::{self, Outcome};
use cairn_tools::undo::PreimageStore;

use crate::context::{Context, exit};
use crate::render::escape_controls;

pub use cairn_tools::rewind::Target;

/// The CLI's tools whose effects happen in other sessions: a subagent's
/// calls are recorded (and undone) in the child's own session.
pub const DELEGATING: &[&str] = &[crate::subagents::SPAWN];

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

/// Finish an undo killed after its plan was committed, before a session
/// continues (`resume`, `chat`): what was done, if anything.
pub fn finish_interrupted(ctx: &Context, session: &mut Session<JsonlStore>, cwd: &Path) -> Result<Option<String>> {
    Ok(rewind::finish_interrupted(&store(ctx), session, cwd, false)?)
}

/// Print `outcome` (escaped: it quotes file contents and names) and say
/// what it exits with.
fn report(outcome: Outcome) -> Result<u8> {
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
