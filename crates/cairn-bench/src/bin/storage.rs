//! Storage benchmarks: replay speed and memory of the JSONL session file,
//! durable commit latency and commit throughput, each against a baseline
//! measured in the same run.
//!
//! Run: `cargo run --release -p cairn-bench --bin storage [-- --skip-1gb]`
//! (`--smoke`: tiny sizes, for `scripts/test`).
//!
//! - replay of a generated ~100 MB, 100,000-entry session vs. parsing the
//!   same lines with `serde_json`, like with like: the store opened *and
//!   dropped* vs. a `Value` per line built and freed; the store opened with
//!   its drop outside the timing vs. every `Value` kept, freed outside the
//!   timing; and two floors, `IgnoredAny` (syntax check, no allocation) and
//!   a borrowed `&RawValue` per line. Samples interleaved, 7 of each;
//! - peak RSS of a process that only opens that session, vs. the file size
//!   (measured in a child process so the generator's memory does not count);
//! - the same for a ~1 GB session (streaming replay, bounded memory);
//! - durable commit latency (fdatasync every commit) vs. a raw `write` +
//!   `fdatasync` of the same bytes, interleaved, in 9 rounds of 200 commits:
//!   the claim (≤ 1.15×) is judged on the spread of the per-round ratios;
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
use cairn_bench::{Table, median, peak_rss_bytes, sample, size};
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

/// Run `parse` on every line of the file (1 MiB buffer, one reused line
/// buffer, as the store reads); returns how many lines it accepted.
fn each_line(path: &Path, mut parse: impl FnMut(&[u8]) -> Result<bool>) -> Result<u64> {
    let mut reader = BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
    let mut line = Vec::new();
    let mut count = 0;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        count += u64::from(parse(&line)?);
    }
    Ok(count)
}

/// Baseline: parse every line as a `serde_json::Value`, freed at once.
fn parse_values(path: &Path) -> Result<u64> {
    each_line(path, |line| Ok(!serde_json::from_slice::<serde_json::Value>(line)?.is_null()))
}

/// Floor: check every line's syntax with `IgnoredAny` (nothing allocated).
fn parse_ignored(path: &Path) -> Result<u64> {
    each_line(path, |line| {
        serde_json::from_slice::<serde::de::IgnoredAny>(line)?;
        Ok(true)
    })
}

/// Floor: parse every line as a borrowed `&RawValue` (syntax and UTF-8
/// checked, nothing copied).
fn parse_raw(path: &Path) -> Result<u64> {
    each_line(path, |line| Ok(!serde_json::from_slice::<&serde_json::value::RawValue>(line)?.get().is_empty()))
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

fn replay_bench(dir: &Path, table: &mut Table) -> Result<()> {
    let entries = size(100_000, 300);
    let (path, write_time) = generate(dir, "replay", entries, 950)?;
    let size_bytes = std::fs::metadata(&path)?.len();
    table.figure(
        &format!("generating the {entries}-entry session, durability off"),
        &format!(
            "{:.0} commits/s, {:.0} MiB/s ({:.1} MiB in {write_time:?})",
            entries as f64 / write_time.as_secs_f64(),
            mib(size_bytes) / write_time.as_secs_f64(),
            mib(size_bytes)
        ),
    );
    // Warm the page cache, and check every side reads every line.
    let lines = parse_values(&path)?;
    anyhow::ensure!(parse_ignored(&path)? == lines && parse_raw(&path)? == lines, "baselines disagree");
    let samples = 7;
    // Six ways to read the file, run in turn within each sample (the first
    // one rotating) so that all of them see the same load.
    let mut times: [Vec<Duration>; 6] = Default::default();
    for i in 0..samples {
        for k in 0..6 {
            let which = (i + k) % 6;
            let mut failed = None;
            let t = match which {
                // The store opened and dropped inside the timing (a `Value`
                // per line is freed inside its timing too).
                0 => sample(1, || match JsonlStore::open_read_only(&path) {
                    Ok(store) if store.entry_count() == entries as usize => drop(store),
                    Ok(store) => failed = Some(format!("replayed {} entries", store.entry_count())),
                    Err(e) => failed = Some(e.to_string()),
                }),
                // The store opened; its drop outside the timing.
                1 => {
                    let mut opened = None;
                    let t = sample(1, || opened = JsonlStore::open_read_only(&path).ok());
                    if opened.as_ref().map(|s| s.entry_count()) != Some(entries as usize) {
                        failed = Some("replay failed".into());
                    }
                    drop(opened);
                    t
                }
                2 => sample(1, || {
                    if let Err(e) = parse_values(&path) {
                        failed = Some(e.to_string());
                    }
                }),
                // Every `Value` kept, freed outside the timing.
                3 => {
                    let mut values = None;
                    let t = sample(1, || values = keep_values(&path).ok());
                    if values.as_ref().map(Vec::len) != Some(lines as usize) {
                        failed = Some("keeping values failed".into());
                    }
                    drop(values);
                    t
                }
                4 => sample(1, || {
                    if let Err(e) = parse_ignored(&path) {
                        failed = Some(e.to_string());
                    }
                }),
                _ => sample(1, || {
                    if let Err(e) = parse_raw(&path) {
                        failed = Some(e.to_string());
                    }
                }),
            };
            if let Some(f) = failed {
                anyhow::bail!("replay sample {i}, reader {which}: {f}");
            }
            times[which].extend(t);
        }
    }
    let [open_drop, open_keep, value_drop, value_keep, ignored, raw] = &times;
    let name = format!("replay {entries} entries, {:.0} MiB", mib(size_bytes));
    table.claim(
        &format!("{name}: open incl. drop"),
        open_drop,
        "a serde_json Value per line, built and freed",
        value_drop,
        1.0,
    );
    table.compare(&format!("{name}: open, drop untimed"), open_keep, "every Value kept, freed untimed", value_keep);
    table.compare(&format!("{name}: open incl. drop"), open_drop, "floor: IgnoredAny per line", ignored);
    table.compare(&format!("{name}: open incl. drop"), open_drop, "floor: borrowed &RawValue per line", raw);
    let rss = child_peak_rss(&path)?;
    table.figure(
        &format!("peak RSS opening the {:.0} MiB session (target ≤ 1.5× file size)", mib(size_bytes)),
        &format!("{:.1} MiB = {:.2}× file size", mib(rss), rss as f64 / size_bytes as f64),
    );
    std::fs::remove_file(&path)?;
    Ok(())
}

fn big_bench(dir: &Path, table: &mut Table) -> Result<()> {
    let entries = size(1_000_000, 2_000);
    let (path, write_time) = generate(dir, "big", entries, 1000)?;
    let size = std::fs::metadata(&path)?.len();
    println!("generated {entries} entries, {:.1} MiB in {:?}", mib(size), write_time);
    let start = Instant::now();
    let rss = child_peak_rss(&path)?;
    table.figure(
        &format!("peak RSS opening a {:.0} MiB session of {entries} entries (streaming replay; one run)", mib(size)),
        &format!("{:.1} MiB = {:.2}× file size, opened in {:?}", mib(rss), rss as f64 / size as f64, start.elapsed()),
    );
    std::fs::remove_file(&path)?;
    Ok(())
}

fn commit_bench(dir: &Path, table: &mut Table) -> Result<()> {
    // The fdatasync cost on a shared VM swings by an order of magnitude
    // (0.1–4 ms): many rounds of many commits, so that the spread of the
    // per-round ratios can be held against the 15% margin.
    let (rounds, per_round) = (size(9, 5), size(200, 5));
    let mut store = JsonlStore::create(dir, Header::new("latency", "/bench"), bench_options(Durability::EveryCommit))?;
    let raw_path = dir.join("raw.bin");
    let mut raw = std::fs::OpenOptions::new().create(true).append(true).open(&raw_path)?;
    let mut parent: Option<String> = None;
    let mut results = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let mut ours = Vec::with_capacity(per_round);
        let mut base = Vec::with_capacity(per_round);
        for i in 0..per_round {
            let id = format!("e{round}_{i}");
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
        results.push((ours, base));
    }
    table.claim_rounds(
        &format!("durable commit (fdatasync), {rounds} rounds of {per_round}"),
        &results,
        "raw write+fdatasync of the same bytes",
        1.15,
    );
    std::fs::remove_file(&raw_path)?;

    // Throughput with durability off, small commits.
    let mut store = JsonlStore::create(dir, Header::new("throughput", "/bench"), bench_options(Durability::None))?;
    let n = size(50_000, 500);
    let start = Instant::now();
    for i in 0..n {
        store.commit(Transaction::new().set("fact", "counter", to_raw(&i)?).usage(
            format!("u{i}"),
            None,
            to_raw(&i)?,
        ))?;
    }
    let elapsed = start.elapsed();
    table.figure(
        &format!("commit throughput, durability off, {n} small commits (one run)"),
        &format!("{:.0} commits/s", n as f64 / elapsed.as_secs_f64()),
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
    let mut tools = ToolRegistry::new(&cairn_testtools::ScriptedApprover::new(false, []));
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
    let mut table = Table::new("storage");
    replay_bench(dir.path(), &mut table)?;
    commit_bench(dir.path(), &mut table)?;
    if skip_big {
        println!("1 GB replay skipped (--skip-1gb)");
    } else {
        big_bench(dir.path(), &mut table)?;
    }
    table.print();
    Ok(())
}
