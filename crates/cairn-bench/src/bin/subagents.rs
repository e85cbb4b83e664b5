//! Benchmark: subagent fan-out (issue 12) through the real `cairn` binary
//! with the scripted provider.
//!
//! - spawn + settle: one `cairn run` whose parent spawns N children
//!   (`spawn_agent`, `wait: false`) and gathers them (`wait_agents`), vs N
//!   independent `cairn run` processes doing the children's work (one
//!   answer each), all N started at once (the family runs its N children
//!   at once too: `[subagents] max_running = N`).
//! - parent replay: `Session::open` of the finished parent (N children
//!   attached) vs of one of its children. Children are separate files
//!   re-attached only when a call is pending, so replay should not grow
//!   with them.
//!
//! The `cairn` binary is `$CAIRN_BIN`, else the one next to this binary
//! (`scripts/bench subagents` builds both). Run: `cargo run --release -p
//! cairn-bench --bin subagents` (`--smoke`: tiny sizes).
#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use cairn_bench::{Table, sample_pairs, size};
use cairn_core::storage::JsonlStore;
use cairn_core::{Session, SessionConfig};
use serde_json::json;

type Home = cairn_bench::CairnHome;

/// A home whose `[subagents]` limits let `children` children run at once.
fn home_for(children: usize) -> Result<Home> {
    let home = Home::new()?;
    std::fs::write(
        home.home.join("config.toml"),
        format!("[subagents]\nmax_children = {children}\nmax_running = {children}\n"),
    )?;
    Ok(home)
}

/// `cairn ARGS` in `home`, uncoloured and silent.
fn cairn(home: &Home, bin: &Path, args: &[&str]) -> Command {
    let mut cmd = home.command(bin, args);
    cmd.env("NO_COLOR", "1").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    cmd
}

/// One family run: the parent spawns `n` children and gathers them (the
/// sample times the whole call, as `independent`'s does).
fn family(bin: &Path, n: usize) -> Result<(Duration, Home)> {
    let home = home_for(n)?;
    home.write_lines("child.jsonl", &[json!({"text": "child answer"})])?;
    let calls: Vec<_> = (0..n)
        .map(|i| json!({"id": format!("s{i}"), "name": "spawn_agent", "arguments": {"prompt": format!("task {i}"), "wait": false, "script": "child.jsonl"}}))
        .collect();
    let script = home.write_lines(
        "parent.jsonl",
        &[
            json!({"text": "", "toolCalls": calls}),
            json!({"text": "", "toolCalls": [{"id": "w", "name": "wait_agents", "arguments": {}}]}),
            json!({"text": "gathered"}),
        ],
    )?;
    let start = Instant::now();
    let status = cairn(&home, bin, &["--script", script.to_str().unwrap_or_default(), "run", "fan out"]).status()?;
    let took = start.elapsed();
    if !status.success() {
        bail!("the family run failed: {status}");
    }
    Ok((took, home))
}

/// `n` independent `cairn run` processes, all started at once.
fn independent(bin: &Path, n: usize) -> Result<Duration> {
    let home = home_for(n)?;
    let script = home.write_lines("child.jsonl", &[json!({"text": "child answer"})])?;
    let start = Instant::now();
    let children = (0..n)
        .map(|i| {
            cairn(&home, bin, &["--script", script.to_str().unwrap_or_default(), "run", &format!("task {i}")]).spawn()
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    for mut child in children {
        let status = child.wait()?;
        if !status.success() {
            bail!("an independent run failed: {status}");
        }
    }
    Ok(start.elapsed())
}

fn replay(path: &Path) -> Result<Duration> {
    let start = Instant::now();
    let session = Session::open(JsonlStore::open_read_only(path)?, SessionConfig::default())?;
    let took = start.elapsed();
    drop(session);
    Ok(took)
}

fn main() -> Result<()> {
    let bin = cairn_bench::cairn_bin()?;
    let n = size(100, 3);
    let samples = size(5, 1);
    let mut table = Table::new(&format!("subagents: fan-out of {n} children"));
    let failure = std::cell::RefCell::new(None);
    let mut last_home = None;
    let (fam, ind) = sample_pairs(
        samples,
        || match family(&bin, n) {
            Ok((_, home)) => last_home = Some(home),
            Err(e) => *failure.borrow_mut() = Some(e),
        },
        || {
            if let Err(e) = independent(&bin, n) {
                *failure.borrow_mut() = Some(e);
            }
        },
    );
    if let Some(e) = failure.into_inner() {
        return Err(e);
    }
    table.compare(
        &format!("one parent spawning and settling {n} children (one process)"),
        &fam,
        &format!("{n} independent cairn run processes at once"),
        &ind,
    );
    let home = last_home.context("no family run")?;
    let files: Vec<PathBuf> = std::fs::read_dir(home.home.join("sessions"))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    let parent = files
        .iter()
        .find(|p| !p.file_stem().and_then(|s| s.to_str()).is_some_and(|s| s.contains('+')))
        .context("no parent session")?
        .clone();
    let child = files.iter().find(|p| **p != parent).context("no child session")?.clone();
    let replays = size(50, 5);
    let (parent_times, child_times) = sample_pairs(
        replays,
        || {
            let _ = replay(&parent);
        },
        || {
            let _ = replay(&child);
        },
    );
    replay(&parent)?;
    table.compare(
        &format!("replay of the parent with {n} children attached"),
        &parent_times,
        "replay of one child",
        &child_times,
    );
    table.print();
    Ok(())
}
