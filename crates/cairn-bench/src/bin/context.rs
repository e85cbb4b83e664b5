//! Benchmark: long sessions against a model's window (issue 18).
//!
//! For histories of 0, 20k, 100k and 200k entries (generated with the
//! turn's record shapes, `cairn_testtools::history`), through the HTTP
//! provider and a loopback OpenAI-compatible server: the wall time of one
//! step (a provider call answered with text, committed) and the bytes of
//! each request, with a 32k-token window (bounded view, compaction at 75%)
//! against the same work without a window (what cairn did before: the whole
//! history every request), interleaved in the same run. The first request
//! after opening a long session compacts once; it is reported apart.
//! The same bounded steps are then timed in a row (no whole-history step in
//! between). Then resume (open + one step) in a child process per sample:
//! wall time and peak RSS against the file size, through the HTTP provider
//! and the scripted provider. `--http-steps N FILE`, `--steps N FILE` and
//! `--resume-self FILE http|scripted bounded|whole` time one history alone
//! (the last for heap profilers).
//!
//! Run: `cargo run --release -p cairn-bench --bin context` (`--smoke`: tiny
//! sizes, for `scripts/test`).
#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cairn_bench::{Table, peak_rss_bytes, size};
use cairn_core::approval::{Allowlist, PolicyApprover};
use cairn_core::provider::Provider;
use cairn_core::storage::{Durability, Header, JsonlStore, StoreOptions};
use cairn_core::{CancelToken, Session, SessionConfig, ToolRegistry, TurnEnv, TurnStop};
use cairn_provider::{ProviderConfig, ProviderKind};
use cairn_test_server::{Reply, TestServer, streams};
use cairn_testtools::{ScriptLine, ScriptProvider, history};

const WINDOW: u32 = 32_768;

/// History sizes in entries (`CAIRN_BENCH_CONTEXT_SIZES=20000,100000`
/// overrides them).
fn sizes() -> Vec<usize> {
    if let Ok(list) = std::env::var("CAIRN_BENCH_CONTEXT_SIZES") {
        return list.split(',').filter_map(|n| n.trim().parse().ok()).collect();
    }
    size(vec![0, 20_000, 100_000, 200_000], vec![0, 600, 1_200])
}
fn samples() -> usize {
    size(7, 3)
}

fn generate(dir: &Path, entries: usize) -> anyhow::Result<PathBuf> {
    let id = format!("bench-{entries}");
    let mut store = JsonlStore::create(dir, Header::new(&id, "/"), StoreOptions::with_durability(Durability::None))?;
    history::generate(&mut store, entries / history::ENTRIES_PER_TURN, 500)?;
    Ok(store.path().to_owned())
}

fn http(url: &str, window: Option<u32>) -> anyhow::Result<Box<dyn Provider + Send>> {
    let mut config = ProviderConfig::new("bench", ProviderKind::OpenAiChat);
    config.base_url = Some(format!("{url}/v1"));
    config.model = Some("bench-model".to_owned());
    config.context_window = window;
    config.default_max_output_tokens = 2048;
    Ok(cairn_provider::build(&config, &|_| None)?)
}

/// The scripted test provider answering every call with text (its window
/// comes from the session config).
fn scripted() -> anyhow::Result<Box<dyn Provider + Send>> {
    let line: ScriptLine = serde_json::from_value(serde_json::json!({"text": "ok"}))?;
    Ok(Box::new(ScriptProvider::new(vec![line]).cycling()))
}

fn config(bounded: bool) -> SessionConfig {
    SessionConfig {
        max_steps: 1,
        compaction_threshold: bounded.then_some(75),
        context_window: if bounded { Some(WINDOW) } else { Some(u32::MAX) },
        ..SessionConfig::default()
    }
}

fn open(path: &Path, bounded: bool) -> anyhow::Result<Session<JsonlStore>> {
    let store = JsonlStore::open(path, StoreOptions::with_durability(Durability::None))?;
    Ok(Session::open(store, config(bounded))?)
}

/// One one-step turn (a provider call answered with text, committed).
fn step(session: &mut Session<JsonlStore>, provider: &dyn Provider, i: usize) -> anyhow::Result<Duration> {
    let tools = ToolRegistry::new(&cairn_testtools::ScriptedApprover::new(false, []));
    let mut approver = PolicyApprover::new(Allowlist::new(), None);
    let mut observer = |_: &cairn_core::TurnEvent| {};
    let cancel = CancelToken::new();
    let mut env =
        TurnEnv { provider, tools: &tools, approver: &mut approver, observer: &mut observer, cancel: &cancel };
    let started = Instant::now();
    let outcome = session.run_turn(&format!("next question {i}"), &mut env)?;
    anyhow::ensure!(outcome.stop == TurnStop::Answered, "unexpected outcome {outcome:?}");
    Ok(started.elapsed())
}

fn reply() -> Reply {
    Reply::sse(streams::chat_text_with_usage("ok"))
}

/// The child of a resume sample: open, one step, print seconds and peak RSS.
fn resume_child(path: &Path, provider: &str, url: &str, bounded: bool) -> anyhow::Result<()> {
    let started = Instant::now();
    let window = bounded.then_some(WINDOW);
    let p = if provider == "http" { http(url, window)? } else { scripted()? };
    let mut session = open(path, bounded)?;
    step(&mut session, &*p, 0)?;
    println!("{} {}", started.elapsed().as_secs_f64(), peak_rss_bytes().unwrap_or(0));
    Ok(())
}

fn resume_sample(path: &Path, provider: &str, url: &str, bounded: bool) -> anyhow::Result<(Duration, u64)> {
    let copy = path.with_extension("resume.jsonl");
    std::fs::copy(path, &copy)?;
    let out = Command::new(std::env::current_exe()?)
        .args(["--resume-child", &copy.display().to_string(), provider, url, if bounded { "bounded" } else { "whole" }])
        .output()?;
    let _ = std::fs::remove_file(&copy);
    anyhow::ensure!(out.status.success(), "resume child: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text.split_whitespace();
    let secs: f64 = parts.next().unwrap_or("0").parse()?;
    let rss: u64 = parts.next().unwrap_or("0").parse()?;
    Ok((Duration::from_secs_f64(secs), rss))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--generate") {
        // `--generate ENTRIES DIR`: leave a generated session for manual runs.
        let path = generate(Path::new(&args[3]), args[2].parse()?)?;
        println!("{}", path.display());
        return Ok(());
    }
    if args.get(1).map(String::as_str) == Some("--steps") {
        // `--steps N PATH`: open once, N steps through the scripted
        // provider with the window, print each step's time (for profiling).
        let p = scripted()?;
        let mut session = open(Path::new(&args[3]), true)?;
        for i in 0..args[2].parse()? {
            println!("{:?}", step(&mut session, &*p, i)?);
        }
        return Ok(());
    }
    if args.get(1).map(String::as_str) == Some("--http-steps") {
        // `--http-steps N PATH`: open once with the window, then N one-step
        // turns through the HTTP provider and an in-process loopback server
        // with nothing else running (the open, the first step and each
        // later step timed apart).
        let server = TestServer::start(Vec::new())?;
        let p = http(&server.url(), Some(WINDOW))?;
        let started = Instant::now();
        let mut session = open(Path::new(&args[3]), true)?;
        println!("open: {:?}", started.elapsed());
        for i in 0..args[2].parse::<usize>()? + 1 {
            for _ in 0..3 {
                server.push(reply());
            }
            let t = step(&mut session, &*p, i)?;
            println!("{} {t:?}", if i == 0 { "first step" } else { "step" });
        }
        return Ok(());
    }
    if args.get(1).map(String::as_str) == Some("--resume-self") {
        // `--resume-self PATH http|scripted bounded|whole`: one resume with
        // the loopback server in this process (for heap profilers).
        let server = TestServer::start(Vec::new())?;
        for _ in 0..3 {
            server.push(reply());
        }
        return resume_child(Path::new(&args[2]), &args[3], &server.url(), args[4] == "bounded");
    }
    if args.get(1).map(String::as_str) == Some("--resume-child") {
        return resume_child(Path::new(&args[2]), &args[3], &args[4], args[5] == "bounded");
    }
    let dir = tempfile::tempdir()?;
    let server = TestServer::start(Vec::new())?;
    let mut table = Table::new("context");
    println!("context: one-step turns through the HTTP provider, window {WINDOW} tokens vs no window");
    let mut generated = PathBuf::new();
    for entries in sizes() {
        let path = generate(dir.path(), entries)?;
        generated = path.clone();
        let file = std::fs::metadata(&path)?.len();
        let (mut bounded, mut whole) = (Vec::new(), Vec::new());
        let (mut bytes_bounded, mut bytes_whole) = (Vec::new(), Vec::new());
        // The first request after opening compacts once (reported apart).
        let bounded_path = path.with_extension("bounded.jsonl");
        std::fs::copy(&path, &bounded_path)?;
        let (with_window, without) = (http(&server.url(), Some(WINDOW))?, http(&server.url(), None)?);
        let mut s_bounded = open(&bounded_path, true)?;
        let mut s_whole = open(&path, false)?;
        for _ in 0..3 {
            server.push(reply());
        }
        // The server's record is read without copying it, and the bodies it
        // holds are dropped after each step (a copy of the whole-history
        // bodies, tens of MB each, would be timed into the next step).
        let before = server.request_count();
        let first = step(&mut s_bounded, &*with_window, 0)?;
        let first_requests = server.request_count() - before;
        server.take_body_sizes(before);
        for i in 0..samples() {
            server.push(reply());
            server.push(reply());
            let n = server.request_count();
            bounded.push(step(&mut s_bounded, &*with_window, i + 1)?);
            bytes_bounded.extend(server.take_body_sizes(n).into_iter().map(|b| b as f64));
            let n = server.request_count();
            whole.push(step(&mut s_whole, &*without, i)?);
            bytes_whole.extend(server.take_body_sizes(n).into_iter().map(|b| b as f64));
        }
        // The same bounded steps in a row, with no whole-history step in
        // between (whose tens of MB, allocated and freed, the interleaved
        // steps above pay for): the per-step curve against history length.
        let mut in_a_row = Vec::new();
        for i in 0..samples() {
            server.push(reply());
            let n = server.request_count();
            in_a_row.push(step(&mut s_bounded, &*with_window, samples() + 1 + i)?);
            server.take_body_sizes(n);
        }
        drop((s_bounded, s_whole));
        // The same steps through the in-process scripted provider, with the
        // window and nothing else running between them: the turn's own cost.
        let scripted_steps = {
            let p = scripted()?;
            let mut session = open(&bounded_path, true)?;
            step(&mut session, &*p, 0)?;
            (1..=samples()).map(|i| step(&mut session, &*p, i)).collect::<anyhow::Result<Vec<_>>>()?
        };
        table.figure(
            &format!("{entries} entries ({file} bytes): first step after open, window {WINDOW}"),
            &format!(
                "{:.1} ms, {first_requests} requests (a compaction when the history is over the threshold)",
                first.as_secs_f64() * 1e3
            ),
        );
        table.compare(
            &format!("{entries} entries: one step, window {WINDOW}"),
            &bounded,
            "no window (whole history)",
            &whole,
        );
        table.figure(
            &format!("{entries} entries: one step, window {WINDOW}, steps in a row"),
            &cairn_bench::describe(&in_a_row),
        );
        let _ = std::fs::remove_file(&bounded_path);
        table.figure(
            &format!("{entries} entries: one step, scripted provider, window {WINDOW}"),
            &cairn_bench::describe(&scripted_steps),
        );
        table.figure(
            &format!("{entries} entries: bytes per request"),
            &format!(
                "window: {}; no window: {}",
                cairn_bench::describe_values(&bytes_bounded, "B"),
                cairn_bench::describe_values(&bytes_whole, "B")
            ),
        );
    }
    // Resume: wall time and peak RSS of a child process against the file
    // (a fresh copy of the largest generated history each sample).
    let entries = *sizes().last().unwrap_or(&0);
    let path = dir.path().join("resume-source.jsonl");
    std::fs::copy(&generated, &path)?;
    let file = std::fs::metadata(&path)?.len();
    for provider in ["http", "scripted"] {
        let (mut times, mut rss) = (Vec::new(), Vec::new());
        let (mut base_times, mut base_rss) = (Vec::new(), Vec::new());
        for _ in 0..samples().min(5) {
            for _ in 0..3 {
                server.push(reply());
            }
            let (t, r) = resume_sample(&path, provider, &server.url(), true)?;
            times.push(t);
            rss.push(r as f64 * 100.0 / file as f64);
            let (t, r) = resume_sample(&path, provider, &server.url(), false)?;
            base_times.push(t);
            base_rss.push(r as f64 * 100.0 / file as f64);
        }
        table.compare(
            &format!("resume {entries} entries ({file} bytes), {provider}, window {WINDOW}"),
            &times,
            "no window",
            &base_times,
        );
        table.figure(
            &format!("resume peak RSS, % of the file size, {provider} (target ≤ 150%)"),
            &format!(
                "window: {}; no window: {}",
                cairn_bench::describe_values(&rss, "%"),
                cairn_bench::describe_values(&base_rss, "%")
            ),
        );
    }
    table.print();
    Ok(())
}
