//! Storage benchmarks: replay speed and memory of the JSONL session file,
//! durable commit latency and commit throughput, each against a baseline
//! measured in the same run.
//!
//! Run: `cargo run --release -p cairn-bench --bin storage [-- --skip-1gb]`.
//!
//! - replay of a generated ~100 MB, 100,000-entry session vs. parsing the
//!   same lines with `serde_json::from_slice::<Value>` (ratio of medians);
//! - peak RSS of a process that only opens that session, vs. the file size
//!   (measured in a child process so the generator's memory does not count);
//! - the same for a ~1 GB session (streaming replay, bounded memory);
//! - durable commit latency (fdatasync every commit) vs. a raw `write` +
//!   `fdatasync` of the same bytes, interleaved;
//! - commit throughput with durability off;
//! - `--strict`: opening a session with tool calls for writing, alone vs.
//!   followed by the lifecycle check `Session::open` runs
//!   (`ToolState` strict replay), and `Session::open` itself;
//! - `--listing`: what `cairn sessions` reads per file (`read_summary`: the
//!   header, then a backward scan) vs. the old listing (a full read-only
//!   replay per file), over 2,000 small sessions and over one ~200 MB one.
//!
//! The rows measured before automatic compaction became the default keep
//! `compact_ratio: None`, so they measure the same work as before.
//! `--strict` or `--listing` run only those rows.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cairn_bench::{median, peak_rss_bytes, report, sample};
use cairn_core::storage::{
    DEFAULT_MAX_LINE_BYTES, Durability, Header, JsonlStore, RawJson, Storage, StoreOptions, Transaction, read_summary,
    to_raw,
};

/// Durability off, no automatic compaction (the rows' original setting).
fn bench_options(durability: Durability) -> StoreOptions {
    StoreOptions { compact_ratio: None, ..StoreOptions::with_durability(durability) }
}

const TEXT: &str = "The quick brown fox jumps over the lazy dog; tool output, code and prose of a long agent session. ";

/// A message-like payload of roughly `size` bytes.
fn payload(i: u64, size: usize) -> Result<RawJson> {
    let mut text = String::with_capacity(size);
    while text.len() < size {
        text.push_str(TEXT);
    }
    text.truncate(size);
    Ok(to_raw(&serde_json::json!({
        "role": if i.is_multiple_of(2) { "user" } else { "assistant" },
        "content": [{"type": "text", "text": text}],
        "model": "bench-model",
        "n": i,
    }))?)
}

/// Write a session of `entries` entries (each commit: an entry with a
/// ~`size`-byte payload chained to the previous one, and the lane head).
/// Returns the path and the time taken.
fn generate(dir: &Path, id: &str, entries: u64, size: usize) -> Result<(PathBuf, Duration)> {
    let opts = bench_options(Durability::None);
    let mut store = JsonlStore::create(dir, Header::new(id, "/bench"), opts)?;
    let start = Instant::now();
    for i in 1..=entries {
        let parent = (i > 1).then(|| format!("e{}", i - 1));
        store.commit(
            Transaction::new().entry(format!("e{i}"), parent.as_deref(), "message", payload(i, size)?).set(
                "lane",
                "main",
                to_raw(&format!("e{i}"))?,
            ),
        )?;
    }
    store.sync()?;
    Ok((store.path().to_owned(), start.elapsed()))
}

/// Baseline: parse every line of the file as a `serde_json::Value`.
fn parse_values(path: &Path) -> Result<u64> {
    let mut reader = BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
    let mut line = Vec::new();
    let mut count = 0;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        let value: serde_json::Value = serde_json::from_slice(&line)?;
        count += u64::from(!value.is_null());
    }
    Ok(count)
}

/// Second baseline: parse every line as a `Value` and keep them all.
fn keep_values(path: &Path) -> Result<Vec<serde_json::Value>> {
    let mut reader = BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
    let mut line = Vec::new();
    let mut values = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        values.push(serde_json::from_slice(&line)?);
    }
    Ok(values)
}

/// Peak RSS of a child process that opens `path` read-only (this binary
/// re-executed with `--open`).
fn child_peak_rss(path: &Path) -> Result<u64> {
    let out = std::process::Command::new(std::env::current_exe()?).arg("--open").arg(path).output()?;
    anyhow::ensure!(out.status.success(), "child failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout)?;
    let rss = text.trim().rsplit(' ').next().context("no rss")?;
    Ok(rss.parse()?)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn replay_bench(dir: &Path) -> Result<()> {
    let (path, write_time) = generate(dir, "replay", 100_000, 950)?;
    let size = std::fs::metadata(&path)?.len();
    println!(
        "generated {} entries, {:.1} MiB in {:?} (durability off: {:.0} commits/s, {:.0} MiB/s)",
        100_000,
        mib(size),
        write_time,
        100_000.0 / write_time.as_secs_f64(),
        mib(size) / write_time.as_secs_f64()
    );
    // Warm the page cache for both, then alternate.
    parse_values(&path)?;
    let mut ours = Vec::new();
    let mut base = Vec::new();
    let mut kept = Vec::new();
    for _ in 0..5 {
        // The opened store is dropped outside the timed region: opening is
        // what a host waits for; freeing happens at exit.
        let mut opened = None;
        ours.extend(sample(1, || {
            opened = JsonlStore::open_read_only(&path).ok();
        }));
        anyhow::ensure!(opened.as_ref().map(|s| s.entry_count()) == Some(100_000), "replay failed");
        drop(opened);
        base.extend(sample(1, || {
            assert!(parse_values(&path).is_ok());
        }));
        let mut values = None;
        kept.extend(sample(1, || {
            values = keep_values(&path).ok();
        }));
        drop(values);
    }
    let (ours, base, kept) = (median(ours), median(base), median(kept));
    let ratio = report("replay 100k entries (JsonlStore::open_read_only vs serde_json::Value per line)", ours, base);
    report("  same, baseline keeping every Value in memory (as a replay must keep its state)", ours, kept);
    println!(
        "  replay throughput {:.0} MiB/s vs Value parse {:.0} MiB/s; speedup {:.2}x",
        mib(size) / ours.as_secs_f64(),
        mib(size) / base.as_secs_f64(),
        1.0 / ratio
    );
    let rss = child_peak_rss(&path)?;
    println!(
        "  peak RSS opening it: {:.1} MiB for a {:.1} MiB file = {:.2}x file size (target <= 1.5x)",
        mib(rss),
        mib(size),
        rss as f64 / size as f64
    );
    std::fs::remove_file(&path)?;
    Ok(())
}

fn big_bench(dir: &Path) -> Result<()> {
    let (path, write_time) = generate(dir, "big", 1_000_000, 1000)?;
    let size = std::fs::metadata(&path)?.len();
    println!("generated 1,000,000 entries, {:.1} MiB in {:?}", mib(size), write_time);
    let start = Instant::now();
    let rss = child_peak_rss(&path)?;
    println!(
        "  1 GB session: opened in {:?}, peak RSS {:.1} MiB = {:.2}x file size (target <= 1.5x)",
        start.elapsed(),
        mib(rss),
        rss as f64 / size as f64
    );
    std::fs::remove_file(&path)?;
    Ok(())
}

fn commit_bench(dir: &Path) -> Result<()> {
    const N: usize = 200;
    let mut store = JsonlStore::create(dir, Header::new("latency", "/bench"), bench_options(Durability::EveryCommit))?;
    let raw_path = dir.join("raw.bin");
    let mut raw = std::fs::OpenOptions::new().create(true).append(true).open(&raw_path)?;
    let mut ours = Vec::with_capacity(N);
    let mut base = Vec::with_capacity(N);
    let mut parent: Option<String> = None;
    for i in 0..N {
        let id = format!("e{i}");
        let tx = Transaction::new().entry(id.clone(), parent.as_deref(), "message", payload(i as u64, 300)?).set(
            "lane",
            "main",
            to_raw(&id)?,
        );
        let before = store.len_bytes();
        let start = Instant::now();
        store.commit(tx)?;
        ours.push(start.elapsed());
        // The same bytes, raw.
        let bytes = {
            let len = store.len_bytes() - before;
            let data = std::fs::read(store.path())?;
            data[data.len() - len as usize..].to_vec()
        };
        let start = Instant::now();
        raw.write_all(&bytes)?;
        raw.sync_data()?;
        base.push(start.elapsed());
        parent = Some(id);
    }
    report("durable commit (fdatasync) vs raw write+fdatasync of the same bytes", median(ours), median(base));
    std::fs::remove_file(&raw_path)?;

    // Throughput with durability off, small commits.
    let mut store = JsonlStore::create(dir, Header::new("throughput", "/bench"), bench_options(Durability::None))?;
    let n = 50_000;
    let start = Instant::now();
    for i in 0..n {
        store.commit(Transaction::new().set("fact", "counter", to_raw(&i)?).usage(
            format!("u{i}"),
            None,
            to_raw(&i)?,
        ))?;
    }
    let elapsed = start.elapsed();
    println!(
        "commit throughput, durability off: {n} commits in {elapsed:?} = {:.0} commits/s",
        n as f64 / elapsed.as_secs_f64()
    );
    Ok(())
}

/// Median and spread (min..max) of some samples, as text.
fn spread(samples: &[Duration]) -> String {
    let min = samples.iter().min().copied().unwrap_or_default();
    let max = samples.iter().max().copied().unwrap_or_default();
    format!("median {:?} (min {min:?}, max {max:?}, n={})", median(samples.to_vec()), samples.len())
}

/// Print a measured row against its baseline: medians, spreads, ratio.
fn row(name: &str, ours: &[Duration], base: &[Duration]) {
    let ratio = median(ours.to_vec()).as_secs_f64() / median(base.to_vec()).as_secs_f64().max(f64::MIN_POSITIVE);
    println!("{name}:\n  new      {}\n  baseline {}\n  ratio of medians {ratio:.4}", spread(ours), spread(base));
}

/// A session written by the real turn: `turns` turns, each one `echo`
/// tool call (request, start, completion) and a final answer.
fn tool_session(dir: &Path, turns: usize) -> Result<PathBuf> {
    use cairn_core::approval::{Allowlist, PolicyApprover};
    use cairn_core::{CancelToken, Session, SessionConfig, ToolRegistry, TurnEnv};
    use cairn_testtools::{EchoTool, ScriptLine, ScriptProvider};
    let store = JsonlStore::create(dir, Header::new("tools", "/bench"), bench_options(Durability::None))?;
    let path = store.path().to_owned();
    let call: ScriptLine = serde_json::from_value(serde_json::json!({
        "text": "", "toolCalls": [{"id": "c", "name": "echo", "arguments": {"text": TEXT}}]
    }))?;
    let answer: ScriptLine = serde_json::from_value(serde_json::json!({"text": TEXT}))?;
    let provider = ScriptProvider::new(vec![call, answer]).cycling();
    let mut tools = ToolRegistry::new(false);
    tools.register(std::sync::Arc::new(EchoTool::new()))?;
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
    for i in 0..turns {
        session.run_turn(&format!("question {i}"), &mut env)?;
    }
    Ok(path)
}

/// `--strict`: the cost of the lifecycle check at a writable open.
fn strict_bench(dir: &Path) -> Result<()> {
    use cairn_core::projection::ToolState;
    let path = tool_session(dir, 5_000)?;
    let size = std::fs::metadata(&path)?.len();
    let opts = bench_options(Durability::None);
    let probe = JsonlStore::open(&path, opts)?;
    let entries = probe.entry_count();
    let invocations = ToolState::replay_strict(probe.index().entries())?.invocations.len();
    drop(probe);
    println!("session with tool calls: {entries} entries, {invocations} invocations, {:.1} MiB", mib(size));
    let (mut open, mut checked, mut check_only, mut session) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..7 {
        let mut kept = None;
        open.extend(sample(1, || kept = JsonlStore::open(&path, opts).ok()));
        anyhow::ensure!(kept.is_some(), "open failed");
        drop(kept.take());
        checked.extend(sample(1, || {
            kept = JsonlStore::open(&path, opts).ok().filter(|s| ToolState::replay_strict(s.index().entries()).is_ok());
        }));
        anyhow::ensure!(kept.is_some(), "open + check failed");
        let store = kept.take().context("store")?;
        check_only.extend(sample(1, || assert!(ToolState::replay_strict(store.index().entries()).is_ok())));
        drop(store);
        let mut opened = None;
        session.extend(sample(1, || {
            opened = JsonlStore::open(&path, opts)
                .ok()
                .and_then(|s| cairn_core::Session::open(s, cairn_core::SessionConfig::default()).ok());
        }));
        anyhow::ensure!(opened.is_some(), "Session::open failed");
    }
    row("open for writing + tool lifecycle check (strict ToolState replay) vs open alone", &checked, &open);
    println!("  the check alone: {}", spread(&check_only));
    row("Session::open (replay, lifecycle check, pc check, conversation) vs open alone", &session, &open);
    std::fs::remove_file(&path)?;
    Ok(())
}

/// A small session like the CLI writes: a name, then `commits` commits of
/// an entry, the lane head and the state.
fn small_session(dir: &Path, id: &str, commits: u64) -> Result<()> {
    let mut store = JsonlStore::create(dir, Header::new(id, "/bench"), bench_options(Durability::None))?;
    store.commit(Transaction::new().set("fact", "name", to_raw(&format!("name-{id}"))?))?;
    for i in 1..=commits {
        let parent = (i > 1).then(|| format!("e{}", i - 1));
        let expected = store.state().map_or(0, |s| s.seq);
        store.commit(
            Transaction::new()
                .entry(format!("e{i}"), parent.as_deref(), "message", payload(i, 600)?)
                .set("lane", "main", to_raw(&format!("e{i}"))?)
                .state(expected, to_raw(&serde_json::json!({"phase": "final", "i": i}))?),
        )?;
    }
    Ok(())
}

/// The old listing: a full read-only replay per file.
fn list_by_replay(files: &[PathBuf]) -> usize {
    files
        .iter()
        .filter_map(|p| JsonlStore::open_read_only(p).ok())
        .filter(|s| s.register("fact", "name").is_some() && s.state().is_some())
        .count()
}

/// The new listing: header + backward scan per file.
fn list_by_summary(files: &[PathBuf]) -> usize {
    files
        .iter()
        .filter_map(|p| read_summary(p, &[("fact", "name")], DEFAULT_MAX_LINE_BYTES).ok())
        .filter(|s| s.registers[0].is_some() && s.state.is_some())
        .count()
}

/// `--listing`: what a listing reads, 2,000 sessions and one ~200 MB one.
fn listing_bench(dir: &Path) -> Result<()> {
    let many = dir.join("many");
    std::fs::create_dir_all(&many)?;
    for i in 0..2_000 {
        small_session(&many, &format!("s{i:04}"), 20)?;
    }
    let files: Vec<PathBuf> = std::fs::read_dir(&many)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    let total: u64 = files.iter().map(|p| std::fs::metadata(p).map_or(0, |m| m.len())).sum();
    println!("{} sessions of 20 commits, {:.1} MiB in all", files.len(), mib(total));
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    list_by_replay(&files); // warm the page cache
    for _ in 0..7 {
        let mut n = 0;
        ours.extend(sample(1, || n = list_by_summary(&files)));
        anyhow::ensure!(n == files.len(), "summary listed {n}");
        base.extend(sample(1, || n = list_by_replay(&files)));
        anyhow::ensure!(n == files.len(), "replay listed {n}");
    }
    row("listing 2,000 sessions: read_summary vs full replay per file", &ours, &base);
    std::fs::remove_dir_all(&many)?;

    // One large session: the name set first (so the backward scan must
    // reach the top for it), the state moved by every commit.
    let big = dir.join("big");
    std::fs::create_dir_all(&big)?;
    small_session(&big, "big", 190_000)?;
    let files = vec![big.join("big.jsonl")];
    let size = std::fs::metadata(&files[0])?.len();
    println!("one session of 190,000 commits, {:.1} MiB", mib(size));
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    list_by_replay(&files);
    for _ in 0..5 {
        let mut n = 0;
        ours.extend(sample(1, || n = list_by_summary(&files)));
        anyhow::ensure!(n == 1, "summary failed");
        base.extend(sample(1, || n = list_by_replay(&files)));
        anyhow::ensure!(n == 1, "replay failed");
    }
    row("listing one ~200 MB session: read_summary vs full replay", &ours, &base);
    std::fs::remove_dir_all(&big)?;
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--open") {
        let path = PathBuf::from(args.get(2).context("--open PATH")?);
        let store = JsonlStore::open_read_only(&path)?;
        println!("entries {} peak_rss {}", store.entry_count(), peak_rss_bytes().unwrap_or(0));
        return Ok(());
    }
    let skip_big = args.iter().any(|a| a == "--skip-1gb");
    let dir = tempfile::tempdir()?;
    let strict = args.iter().any(|a| a == "--strict");
    let listing = args.iter().any(|a| a == "--listing");
    if strict || listing {
        if strict {
            strict_bench(dir.path())?;
        }
        if listing {
            listing_bench(dir.path())?;
        }
        return Ok(());
    }
    replay_bench(dir.path())?;
    commit_bench(dir.path())?;
    if skip_big {
        println!("1 GB replay skipped (--skip-1gb)");
    } else {
        big_bench(dir.path())?;
    }
    Ok(())
}
