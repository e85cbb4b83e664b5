//! `cairn-crash-driver`: runs or resumes one turn on a JSONL session file, so
//! crash tests can SIGKILL a real process at a chosen point.
//!
//! Usage: `cairn-crash-driver SESSION_FILE CWD SCRIPT run PROMPT` or
//! `cairn-crash-driver SESSION_FILE CWD SCRIPT resume`.
//!
//! Environment:
//! - `CAIRN_CRASH_AT`: `after_intent`, `during_effect`, `before_settlement`
//!   or `commit:N` — where to stop; or `mark:` followed by one of these —
//!   where to create the signal file and go on (a test then kills at a
//!   random moment after that point);
//! - `CAIRN_CRASH_SIGNAL`: a file created when the point is reached (the
//!   process then sleeps until killed);
//! - `CAIRN_DURABILITY`: `every` (fsync each commit) or `none` (default);
//! - `CAIRN_APPROVER`: `allowlist` (default: a headless policy allowlisting
//!   the three append tools and the two writing built-ins) or `yes` (an
//!   interactive approver that always approves, so the intent and the start
//!   are separate commits).
//!
//! Tools: the cairn-testtools registry, plus cairn-tools' real `write_file`
//! and `edit_file` (Guarded) with the `during_effect` hook, and the real
//! `shell` (staged where overlays work; staging layers in
//! `SESSION_FILE.staging/`). Prints the outcome as JSON; exit 0 on
//! success, 3 when the session is busy, 1 on any other error.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use cairn_core::approval::{Allowlist, PolicyApprover};
use cairn_core::storage::{Durability, Header, JsonlStore, StorageError, StoreOptions};
use cairn_core::{CancelToken, Session, SessionConfig, TurnEnv, TurnError};
use cairn_testtools::hooks::{CrashPoint, HookStore};
use cairn_testtools::{HookedTool, ScriptProvider, YesApprover, registry};
use cairn_tools::builtin::edit::{EditFile, WriteFile};

fn signal_point(signal: Option<&Path>, point: &str) {
    if let Some(signal) = signal {
        let temp = signal.with_extension("tmp");
        if std::fs::write(&temp, point).is_ok() {
            let _ = std::fs::rename(&temp, signal);
        }
    }
}

fn pause_forever(signal: Option<&Path>, point: &str) {
    signal_point(signal, point);
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn run() -> anyhow::Result<i32> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [session, cwd, script, mode, rest @ ..] = args.as_slice() else {
        bail!("usage: cairn-crash-driver SESSION_FILE CWD SCRIPT run PROMPT | resume");
    };
    let at = std::env::var("CAIRN_CRASH_AT").unwrap_or_default();
    let (mark_only, point) = match at.strip_prefix("mark:") {
        Some(rest) => (true, CrashPoint::parse(rest)),
        None => (false, CrashPoint::parse(&at)),
    };
    let signal: Option<PathBuf> = std::env::var_os("CAIRN_CRASH_SIGNAL").map(PathBuf::from);
    let durability = match std::env::var("CAIRN_DURABILITY").as_deref() {
        Ok("every") => Durability::EveryCommit,
        _ => Durability::None,
    };
    let hook_signal = signal.clone();
    let hook: Arc<dyn Fn(&str) + Send + Sync> = Arc::new(move |name: &str| {
        if mark_only {
            signal_point(hook_signal.as_deref(), name);
        } else {
            pause_forever(hook_signal.as_deref(), name);
        }
    });
    let tool_hook: Option<cairn_testtools::tools::Hook> = match point {
        Some(CrashPoint::DuringEffect) => Some(hook.clone()),
        _ => None,
    };

    let path = PathBuf::from(session);
    let opts = StoreOptions::with_durability(durability);
    let store = if path.exists() {
        JsonlStore::open(&path, opts)
    } else {
        let id = path.file_stem().and_then(|s| s.to_str()).context("session file name")?.to_owned();
        let dir = path.parent().context("session directory")?;
        JsonlStore::create(dir, Header::new(id, cwd.clone()), opts)
    };
    let store = match store {
        Ok(store) => store,
        Err(e @ StorageError::Busy { .. }) => {
            eprintln!("{e}");
            return Ok(3);
        }
        Err(e) => return Err(e.into()),
    };
    let store = HookStore::new(store, point, hook);
    let config = SessionConfig { cwd: Some(PathBuf::from(cwd)), ..SessionConfig::default() };
    let mut session = Session::open(store, config)?;

    let provider = ScriptProvider::from_jsonl(&std::fs::read_to_string(script)?).map_err(anyhow::Error::msg)?;
    let mut tools = registry(false, tool_hook.clone());
    tools.register(Arc::new(HookedTool::new(Arc::new(WriteFile::new()), tool_hook.clone())))?;
    tools.register(Arc::new(HookedTool::new(Arc::new(EditFile::new()), tool_hook)))?;
    let shell_config = cairn_tools::ToolsConfig {
        staging_dir: Some(path.with_extension("staging")),
        ..cairn_tools::ToolsConfig::default()
    };
    tools.register(Arc::new(cairn_tools::builtin::shell::Shell::new(&shell_config)?))?;
    let mut approver = match std::env::var("CAIRN_APPROVER").as_deref() {
        Ok("yes") => PolicyApprover::new(Allowlist::new(), Some(Box::new(YesApprover::default()))),
        _ => PolicyApprover::new(
            Allowlist::parse(["append_idempotent", "append_guarded", "append_never", "write_file", "edit_file"])?,
            None,
        ),
    };
    let mut observer = |_: &cairn_core::TurnEvent| {};
    let cancel = CancelToken::new();
    let mut env = TurnEnv {
        provider: &provider,
        tools: &tools,
        approver: &mut approver,
        observer: &mut observer,
        cancel: &cancel,
    };
    let outcome = match mode.as_str() {
        "run" => {
            let prompt = rest.first().map(String::as_str).unwrap_or("go");
            Some(session.run_turn(prompt, &mut env))
        }
        "resume" => session.resume(&mut env).transpose(),
        other => bail!("unknown mode {other:?}: use run or resume"),
    };
    match outcome {
        None => println!("null"),
        Some(Ok(outcome)) => println!("{}", serde_json::to_string(&outcome)?),
        Some(Err(TurnError::Storage(e @ StorageError::Busy { .. }))) => {
            eprintln!("{e}");
            return Ok(3);
        }
        Some(Err(e)) => return Err(e.into()),
    }
    Ok(0)
}

fn main() {
    let code = match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cairn-crash-driver: {e:#}");
            1
        }
    };
    std::process::exit(code);
}
