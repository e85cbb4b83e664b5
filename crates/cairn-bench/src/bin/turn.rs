//! Benchmark: the turn's runtime overhead per step.
//!
//! A step is one loop iteration: a provider call (the in-process scripted
//! provider), one `echo` tool call through the effect sandwich (assistant
//! commit, intent+start commit, settlement commit), on a JSONL session that
//! already holds 10,000 entries of history. Measured with durability off and
//! with an fsync per commit. Baselines, measured in the same run: the same
//! provider call and tool execution made directly (no turn, no log), and a
//! raw `write` + `fdatasync` of the same bytes the step commits.
//!
//! Run: `cargo run --release -p cairn-bench --bin turn`
#![allow(clippy::print_stdout)]

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use cairn_bench::{median, peak_rss_bytes, report, sample};
use cairn_core::approval::{Allowlist, PolicyApprover};
use cairn_core::provider::{ModelRequest, Provider};
use cairn_core::storage::{Durability, Header, JsonlStore, StoreOptions};
use cairn_core::tool::{Tool, ToolContext, ToolLimits, ToolRequest};
use cairn_core::{CancelToken, Session, SessionConfig, ToolRegistry, TurnEnv, TurnStop};
use cairn_testtools::{EchoTool, ScriptLine, ScriptProvider};
use serde_json::json;

const HISTORY_TURNS: usize = 5_000; // 2 entries each: 10,000 entries
const STEPS: u32 = 10;
const SAMPLES: usize = 25;

fn echo_line() -> ScriptLine {
    serde_json::from_value(
        json!({"text": "", "toolCalls": [{"id": "c", "name": "echo", "arguments": {"text": "hello"}}]}),
    )
    .unwrap_or_default()
}

/// A session file with 10,000 entries of history (user/assistant pairs).
fn history(dir: &Path, durability: Durability) -> anyhow::Result<std::path::PathBuf> {
    let store = JsonlStore::create(
        dir,
        Header::new(format!("bench-{durability:?}").replace(['{', '}', ' ', ':', ','], ""), dir.display().to_string()),
        StoreOptions::with_durability(Durability::None),
    )?;
    let path = store.path().to_owned();
    let answer: ScriptLine = serde_json::from_value(
        json!({"text": "an answer of ordinary length, some forty words or so, to make the history look like a real conversation rather than empty lines"}),
    )?;
    let provider = ScriptProvider::new(vec![answer]).cycling();
    let tools = ToolRegistry::new(false);
    let mut approver = PolicyApprover::new(Allowlist::new(), None);
    let mut observer = |_: &cairn_core::TurnEvent| {};
    let cancel = CancelToken::new();
    let mut session = Session::open(store, SessionConfig::default())?;
    let mut env = TurnEnv {
        provider: &provider,
        tools: &tools,
        approver: &mut approver,
        observer: &mut observer,
        cancel: &cancel,
    };
    for i in 0..HISTORY_TURNS {
        session.run_turn(&format!("question number {i} about the project"), &mut env)?;
    }
    Ok(path)
}

/// Median time per step of turns that make `STEPS` echo steps each.
fn turn_steps(path: &Path, durability: Durability) -> anyhow::Result<(Duration, usize)> {
    let store = JsonlStore::open(path, StoreOptions::with_durability(durability))?;
    let entries_before = cairn_core::storage::Storage::entry_count(&store);
    let provider = ScriptProvider::new(vec![echo_line()]).cycling();
    let mut tools = ToolRegistry::new(false);
    tools.register(std::sync::Arc::new(EchoTool::new()))?;
    let mut approver = PolicyApprover::new(Allowlist::new(), None);
    let mut observer = |_: &cairn_core::TurnEvent| {};
    let cancel = CancelToken::new();
    let config = SessionConfig { max_steps: STEPS, ..SessionConfig::default() };
    let mut session = Session::open(store, config)?;
    let mut env = TurnEnv {
        provider: &provider,
        tools: &tools,
        approver: &mut approver,
        observer: &mut observer,
        cancel: &cancel,
    };
    let mut failed = None;
    let samples = sample(SAMPLES, || match session.run_turn("run echo", &mut env) {
        Ok(outcome) if outcome.stop == TurnStop::StepLimit && outcome.steps == STEPS => {}
        Ok(outcome) => failed = Some(format!("unexpected outcome {outcome:?}")),
        Err(e) => failed = Some(e.to_string()),
    });
    if let Some(f) = failed {
        anyhow::bail!(f);
    }
    Ok((median(samples) / STEPS, entries_before))
}

/// The same provider call and tool execution, without the turn and the log.
fn raw_step(path: &Path) -> anyhow::Result<Duration> {
    let store = JsonlStore::open_read_only(path)?;
    let session = Session::open(store, SessionConfig::default())?;
    let messages = session.messages().to_vec();
    let provider = ScriptProvider::new(vec![echo_line()]).cycling();
    let echo = EchoTool::new();
    let specs = vec![echo.spec().clone()];
    let cancel = CancelToken::new();
    let request = ToolRequest {
        invocation_id: "i".into(),
        call_id: "c".into(),
        session_id: "s".into(),
        tool: "echo".into(),
        arguments: json!({"text": "hello"}),
    };
    let samples = sample(SAMPLES * STEPS as usize, || {
        let model = ModelRequest { system: None, messages: &messages, tools: &specs, max_output_tokens: None };
        let _ = provider.complete(&model, &mut |_| {}, &cancel);
        let mut output = |_: &[u8]| {};
        let mut bypass = |_: &str| false;
        let mut ctx = ToolContext {
            cwd: Path::new("."),
            cancel: &cancel,
            limits: ToolLimits::default(),
            output: &mut output,
            approve_bypass: &mut bypass,
        };
        let _ = echo.execute(&request, &mut ctx);
    });
    Ok(median(samples))
}

/// A raw append + fdatasync of `bytes`, done `commits` times: the floor of a
/// durable step.
fn raw_durable(dir: &Path, bytes: usize, commits: usize) -> anyhow::Result<Duration> {
    let path = dir.join("raw.bin");
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
    let line = vec![b'x'; bytes];
    let mut failed = None;
    let samples = sample(SAMPLES * STEPS as usize, || {
        for _ in 0..commits {
            if let Err(e) = file.write_all(&line).and_then(|()| file.sync_data()) {
                failed = Some(e);
            }
        }
    });
    if let Some(e) = failed {
        return Err(e).context("raw write");
    }
    Ok(median(samples))
}

fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    println!("turn: {STEPS} echo steps per turn, {SAMPLES} turns, history of {} entries", HISTORY_TURNS * 2);
    let off = history(dir.path(), Durability::None)?;
    let size_before = std::fs::metadata(&off)?.len();
    let raw = raw_step(&off)?;
    let (step_off, entries) = turn_steps(&off, Durability::None)?;
    println!("history: {entries} entries, {size_before} bytes");
    report("step, durability off (vs. provider+tool called directly)", step_off, raw);
    println!("  overhead per step (durability off): {:?} (target ≤ 1 ms)", step_off.saturating_sub(raw));

    // Opening: the store's replay alone vs. replay + Session::open (pc
    // re-check, conversation rebuild of the 10,000-entry lane).
    let store_open = median(sample(9, || {
        let _ = JsonlStore::open_read_only(&off);
    }));
    let session_open = median(sample(9, || {
        if let Ok(store) = JsonlStore::open_read_only(&off) {
            let _ = Session::open(store, SessionConfig::default());
        }
    }));
    report("open, store + Session::open (vs. store open alone)", session_open, store_open);

    // Bytes a step commits, from the file growth of the durability-off run.
    let grown = std::fs::metadata(&off)?.len() - size_before;
    let per_step_bytes = (grown as usize) / (SAMPLES * STEPS as usize);
    let durable_dir = tempfile::tempdir_in(dir.path())?;
    let on = history(durable_dir.path(), Durability::EveryCommit)?;
    let (step_on, _) = turn_steps(&on, Durability::EveryCommit)?;
    let floor = raw_durable(dir.path(), per_step_bytes / 3, 3)?;
    report("step, fsync per commit (vs. 3 × raw write+fdatasync of the same bytes)", step_on, floor);
    if let Some(rss) = peak_rss_bytes() {
        println!("peak RSS: {:.1} MiB", rss as f64 / (1024.0 * 1024.0));
    }
    Ok(())
}
