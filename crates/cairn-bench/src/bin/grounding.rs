//! Evaluation of the embedded model on simple file tasks: does it get them
//! right? Each task of `crates/cairn-bench/tasks/grounding.json` is a fresh
//! directory with one to five small files, a prompt and the expected value.
//! The task runs as the CLI runs a prompt: a session whose working directory
//! is that directory, the built-in tools of `cairn-tools`, the CLI's default
//! system prompt, writes denied (as headless `cairn run` without `--yes`),
//! and the `local` provider. A task is right when the final answer contains
//! the expected value as a whole word (case-insensitive; the value never
//! appears in the prompt or a file name, the task loader checks).
//!
//! Prints one line per task, then the success rate per kind (`named`: the
//! prompt names the file; `described`: it describes it; `find`: it must be
//! found with `list_dir`/`search`) and overall, with the seconds per task
//! (median and range).
//!
//! Run: `CAIRN_LOCAL_MODEL=/path/model.gguf cargo run --release -p
//! cairn-bench --bin grounding [-- --precision f32|q8_0] [--kind KIND]
//! [--tasks FILE] [--shard K/N]`; `--smoke` runs the first task of each
//! kind.
#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cairn_bench::{Table, describe};
use cairn_core::approval::{Allowlist, PolicyApprover};
use cairn_core::storage::{Durability, Header, JsonlStore, StoreOptions};
use cairn_core::{CancelToken, Session, SessionConfig, ToolRegistry, TurnEnv, TurnEvent};
use cairn_local::{LocalModel, LocalOptions, LocalProvider, MODEL_ENV, Precision};
use serde::Deserialize;

/// The CLI's default system prompt (`DEFAULT_SYSTEM` in
/// `crates/cairn-cli/src/turns.rs`), so the model sees what `cairn run` sends.
const CLI_SYSTEM: &str = "You are cairn, a careful agent working in the user's directory. \
Use the tools to look before you change anything, keep changes small, and answer concisely.";

/// Provider calls per task before it counts as failed (the CLI allows 24;
/// a task of this kind needs two or three).
const MAX_STEPS: u32 = 8;

/// One task of the set.
#[derive(Debug, Clone, Deserialize)]
struct Task {
    id: String,
    kind: String,
    /// Relative path → content.
    files: BTreeMap<String, String>,
    prompt: String,
    expect: String,
}

fn load_tasks(path: &Path) -> Result<Vec<Task>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read the task set {}", path.display()))?;
    let tasks: Vec<Task> =
        serde_json::from_str(&text).with_context(|| format!("{} is not a task list", path.display()))?;
    for t in &tasks {
        let expect = t.expect.to_lowercase();
        if t.prompt.to_lowercase().contains(&expect) || t.files.keys().any(|f| f.to_lowercase().contains(&expect)) {
            bail!("task {}: the expected value appears in the prompt or a file name", t.id);
        }
        if !t.files.values().any(|c| c.contains(&t.expect)) {
            bail!("task {}: no file holds the expected value", t.id);
        }
        if t.files.keys().any(|f| f.starts_with('/') || f.split('/').any(|c| c == ".." || c.is_empty())) {
            bail!("task {}: file names must be relative paths inside the task directory", t.id);
        }
    }
    Ok(tasks)
}

/// Whether `answer` contains `expect` with no letter or digit right before
/// or after it (so "7" is not found in "1776").
fn contains_word(answer: &str, expect: &str) -> bool {
    let answer = answer.to_lowercase();
    let expect = expect.to_lowercase();
    let mut from = 0;
    while let Some(i) = answer.get(from..).and_then(|a| a.find(&expect)) {
        let start = from + i;
        let end = start + expect.len();
        let before = answer.get(..start).and_then(|s| s.chars().next_back());
        let after = answer.get(end..).and_then(|s| s.chars().next());
        if !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric) {
            return true;
        }
        from = start + expect.len().max(1);
    }
    false
}

/// What one task did.
struct Outcome {
    ok: bool,
    time: Duration,
    calls: Vec<String>,
    answer: String,
}

fn run_task(model: &Arc<LocalModel>, task: &Task, sessions: &Path) -> Result<Outcome> {
    let dir = tempfile::tempdir()?;
    for (name, content) in &task.files {
        let path = dir.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, content)?;
    }
    let cwd = dir.path().canonicalize()?;
    let store = JsonlStore::create(
        sessions,
        Header::new(format!("task-{}", task.id), cwd.display().to_string()),
        StoreOptions::with_durability(Durability::None),
    )?;
    let config = SessionConfig {
        system: Some(CLI_SYSTEM.to_owned()),
        max_steps: MAX_STEPS,
        cwd: Some(cwd.clone()),
        ..SessionConfig::default()
    };
    let mut session = Session::open(store, config)?;
    // As the CLI builds it (crates/cairn-runtime/src/local.rs): grounded in the session's cwd.
    let provider = LocalProvider::new(Arc::clone(model)).with_workdir(&cwd);
    let mut tools = ToolRegistry::new(&cairn_testtools::ScriptedApprover::new(false, []));
    for entry in cairn_tools::builtin_tools(&cairn_tools::ToolsConfig::default())? {
        tools.register(entry.tool)?;
    }
    let mut approver = PolicyApprover::new(Allowlist::new(), None);
    let mut calls = Vec::new();
    let mut observer = |ev: &TurnEvent| match ev {
        TurnEvent::ToolRequested { tool, arguments, .. } => calls.push(format!("{tool} {arguments}")),
        TurnEvent::ToolFailed { reason, .. } => {
            if let Some(last) = calls.last_mut() {
                last.push_str(&format!(" (failed: {})", reason.chars().take(60).collect::<String>()));
            }
        }
        _ => {}
    };
    let cancel = CancelToken::new();
    let mut env = TurnEnv {
        provider: &provider,
        tools: &tools,
        approver: &mut approver,
        observer: &mut observer,
        cancel: &cancel,
    };
    let started = Instant::now();
    let outcome = session.run_turn(&task.prompt, &mut env)?;
    let time = started.elapsed();
    Ok(Outcome { ok: contains_word(&outcome.text, &task.expect), time, calls, answer: outcome.text })
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--smoke").collect();
    let mut precision = Precision::F32;
    let mut kind_filter = None;
    // `--shard K/N`: every N-th task from the K-th, to split a run over processes.
    let mut shard: Option<(usize, usize)> = None;
    let mut tasks_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tasks/grounding.json");
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--precision" => precision = value()?.parse()?,
            "--kind" => kind_filter = Some(value()?.clone()),
            "--tasks" => tasks_path = PathBuf::from(value()?),
            "--shard" => {
                let v = value()?;
                let parsed = v.split_once('/').and_then(|(k, n)| Some((k.parse().ok()?, n.parse().ok()?)));
                match parsed {
                    Some((k, n)) if k < n => shard = Some((k, n)),
                    _ => bail!("--shard takes K/N with K < N (e.g. 0/2), not {v}"),
                }
            }
            other => bail!("unknown argument {other} (use --precision, --kind, --shard, --tasks, --smoke)"),
        }
    }
    let model_path = std::env::var_os(MODEL_ENV)
        .map(PathBuf::from)
        .context("set CAIRN_LOCAL_MODEL to the SmolLM2 .gguf (./scripts/fetch-model prints it)")?;
    let mut tasks = load_tasks(&tasks_path)?;
    if let Some(kind) = &kind_filter {
        tasks.retain(|t| &t.kind == kind);
    }
    if let Some((k, n)) = shard {
        tasks = tasks.into_iter().enumerate().filter(|(i, _)| i % n == k).map(|(_, t)| t).collect();
    }
    if cairn_bench::smoke() {
        // The first task of each kind.
        let mut seen = Vec::new();
        tasks.retain(|t| {
            let first = !seen.contains(&t.kind);
            seen.push(t.kind.clone());
            first
        });
    }
    let model = LocalModel::shared(&model_path, LocalOptions { precision, ..LocalOptions::default() })?;
    let sessions = tempfile::tempdir()?;
    let mut by_kind: BTreeMap<String, (usize, usize, Vec<Duration>)> = BTreeMap::new();
    let mut all_times = Vec::new();
    let mut right = 0;
    for task in &tasks {
        let out = run_task(&model, task, sessions.path())?;
        let entry = by_kind.entry(task.kind.clone()).or_default();
        entry.1 += 1;
        entry.2.push(out.time);
        all_times.push(out.time);
        if out.ok {
            entry.0 += 1;
            right += 1;
        }
        let answer: String = out.answer.replace('\n', " ").chars().take(100).collect();
        println!(
            "{:<14} {:<4} {:>6.1}s  calls: [{}]  answer: {answer:?}",
            task.id,
            if out.ok { "ok" } else { "FAIL" },
            out.time.as_secs_f64(),
            out.calls.join("; ")
        );
    }
    let mut table = Table::new(&format!("embedded model on {} file tasks, {precision:?}", tasks.len()));
    let pct = |r: usize, n: usize| if n == 0 { 0.0 } else { 100.0 * r as f64 / n as f64 };
    for (kind, (r, n, times)) in &by_kind {
        table.figure(&format!("{kind}: right"), &format!("{r} of {n} ({:.0}%)", pct(*r, *n)));
        table.figure(&format!("{kind}: seconds per task"), &describe(times));
    }
    table.figure("overall: right", &format!("{right} of {} ({:.0}%)", tasks.len(), pct(right, tasks.len())));
    table.figure("overall: seconds per task", &describe(&all_times));
    table.print();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::contains_word;

    #[test]
    fn whole_words_only() {
        assert!(contains_word("The code is 7731.", "7731"));
        assert!(!contains_word("The code is 17731.", "7731"));
        assert!(contains_word("Bob lives in OSLO", "Oslo"));
        assert!(!contains_word("1776", "7"));
        assert!(contains_word("1776 or 7", "7"));
    }
}
