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
//! Every figure is a median of at least 5 samples with its spread; the
//! step baselines are sampled as often as the turns.
//!
//! Run: `cargo run --release -p cairn-bench --bin turn` (`--smoke`: tiny
//! sizes, for `scripts/test`).
#![allow(clippy::print_stdout)]

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use cairn_bench::{Table, peak_rss_bytes, sample, sample_pairs, size};
use cairn_core::approval::{Allowlist, PolicyApprover};
use cairn_core::provider::{ModelRequest, Provider};
use cairn_core::storage::{Durability, Header, JsonlStore, StoreOptions};
use cairn_core::tool::{Tool, ToolContext, ToolLimits, ToolRequest};
use cairn_core::{CancelToken, Session, SessionConfig, ToolRegistry, TurnEnv, TurnStop};
use cairn_testtools::{EchoTool, ScriptLine, ScriptProvider};
use serde_json::json;

/// Turns of history (2 entries each: 10,000 entries).
fn history_turns() -> usize {
    size(5_000, 20)
}
/// Echo steps per measured turn.
fn steps() -> u32 {
    size(10, 2)
}
/// Measured turns.
fn samples() -> usize {
    size(25, 5)
}

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
    let tools = ToolRegistry::new(&cairn_testtools::ScriptedApprover::new(false, []));
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
    for i in 0..history_turns() {
        session.run_turn(&format!("question number {i} about the project"), &mut env)?;
    }
    Ok(path)
}

/// Time per step of turns that make `steps()` echo steps each, one sample a
/// turn.
fn turn_steps(path: &Path, durability: Durability) -> anyhow::Result<(Vec<Duration>, usize)> {
    let store = JsonlStore::open(path, StoreOptions::with_durability(durability))?;
    let entries_before = cairn_core::storage::Storage::entry_count(&store);
    let provider = ScriptProvider::new(vec![echo_line()]).cycling();
    let mut tools = ToolRegistry::new(&cairn_testtools::ScriptedApprover::new(false, []));
    tools.register(std::sync::Arc::new(EchoTool::new()))?;
    let mut approver = PolicyApprover::new(Allowlist::new(), None);
    let mut observer = |_: &cairn_core::TurnEvent| {};
    let cancel = CancelToken::new();
    let steps = steps();
    let config = SessionConfig { max_steps: steps, ..SessionConfig::default() };
    let mut session = Session::open(store, config)?;
    let mut env = TurnEnv {
        provider: &provider,
        tools: &tools,
        approver: &mut approver,
        observer: &mut observer,
        cancel: &cancel,
    };
    let mut failed = None;
    let samples = sample(samples(), || match session.run_turn("run echo", &mut env) {
        Ok(outcome) if outcome.stop == TurnStop::StepLimit && outcome.steps == steps => {}
        Ok(outcome) => failed = Some(format!("unexpected outcome {outcome:?}")),
        Err(e) => failed = Some(e.to_string()),
    });
    if let Some(f) = failed {
        anyhow::bail!(f);
    }
    Ok((samples.into_iter().map(|d| d / steps).collect(), entries_before))
}

/// The same provider call and tool execution, without the turn and the log:
/// one sample per `steps()` calls, divided back to one step.
fn raw_step(path: &Path) -> anyhow::Result<Vec<Duration>> {
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
    let steps = steps();
    let samples = sample(samples(), || {
        for _ in 0..steps {
            let model = ModelRequest {
                system: None,
                messages: &messages,
                tools: &specs,
                max_output_tokens: None,
                earlier_assistant_messages: 0,
                purpose: Default::default(),
            };
            let _ = provider.complete(&model, &mut |_| {}, &cancel);
            let mut output = |_: &[u8]| {};
            let mut bypass = |_: &str| false;
            let mut review = |_: &cairn_core::staged::StagedReview<'_>| cairn_core::staged::StagedDecision::Discard {
                reason: "benchmark".to_owned(),
            };
            let mut ctx = ToolContext {
                cwd: Path::new("."),
                cancel: &cancel,
                limits: ToolLimits::default(),
                output: &mut output,
                approve_bypass: &mut bypass,
                review_staged: &mut review,
                elicit: &mut |_, _| cairn_core::elicit::nobody(),
            };
            let _ = echo.execute(&request, &mut ctx);
        }
    });
    Ok(samples.into_iter().map(|d| d / steps).collect())
}

/// A raw append + fdatasync of `bytes`, done `commits` times: the floor of a
/// durable step (one sample per `steps()` such steps, divided back).
fn raw_durable(dir: &Path, bytes: usize, commits: usize) -> anyhow::Result<Vec<Duration>> {
    let path = dir.join("raw.bin");
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
    let line = vec![b'x'; bytes];
    let mut failed = None;
    let steps = steps();
    let samples = sample(samples(), || {
        for _ in 0..commits * steps as usize {
            if let Err(e) = file.write_all(&line).and_then(|()| file.sync_data()) {
                failed = Some(e);
            }
        }
    });
    if let Some(e) = failed {
        return Err(e).context("raw write");
    }
    Ok(samples.into_iter().map(|d| d / steps).collect())
}

fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut table = Table::new("turn");
    let (steps, samples) = (steps(), samples());
    println!("turn: {steps} echo steps per turn, {samples} turns, history of {} entries", history_turns() * 2);
    let off = history(dir.path(), Durability::None)?;
    let size_before = std::fs::metadata(&off)?.len();
    let raw = raw_step(&off)?;
    let (step_off, entries) = turn_steps(&off, Durability::None)?;
    println!("history: {entries} entries, {size_before} bytes");
    let ratio = table.compare(
        &format!("step, durability off, {entries} entries of history"),
        &step_off,
        "provider + tool called directly",
        &raw,
    );
    let overhead = |d: &[Duration]| cairn_bench::Spread::of_durations(d).median;
    table.figure(
        "overhead per step, durability off (target ≤ 1 ms)",
        &format!(
            "{} (difference of the medians; ratio {:.2})",
            cairn_bench::Secs(overhead(&step_off) - overhead(&raw)),
            ratio.of_medians
        ),
    );

    // Opening: the store's replay alone vs. replay + Session::open (pc
    // re-check, conversation rebuild of the lane), interleaved.
    let (session_open, store_open) = sample_pairs(
        9,
        || {
            if let Ok(store) = JsonlStore::open_read_only(&off) {
                let _ = Session::open(store, SessionConfig::default());
            }
        },
        || {
            let _ = JsonlStore::open_read_only(&off);
        },
    );
    table.compare("open: store + Session::open", &session_open, "the store's open alone", &store_open);

    // Bytes a step commits, from the file growth of the durability-off run.
    let grown = std::fs::metadata(&off)?.len() - size_before;
    let per_step_bytes = (grown as usize) / (samples * steps as usize);
    let durable_dir = tempfile::tempdir_in(dir.path())?;
    let on = history(durable_dir.path(), Durability::EveryCommit)?;
    let (step_on, _) = turn_steps(&on, Durability::EveryCommit)?;
    let floor = raw_durable(dir.path(), per_step_bytes / 3, 3)?;
    table.compare("step, fsync per commit", &step_on, "3 × raw write+fdatasync of the same bytes", &floor);
    if let Some(rss) = peak_rss_bytes() {
        table.figure("peak RSS", &format!("{:.1} MiB", rss as f64 / (1024.0 * 1024.0)));
    }
    table.print();
    Ok(())
}
