//! Benchmark of the judge of a staged call (issue 46): a staging layer
//! over a git repository of 5,000 files read into a change set (every
//! path stat'ed and hashed on both sides, the git facts read from
//! `.git`: loose objects and a pack index) and judged, as `shell` does
//! after every staged run. The fixture changes 100 committed files (50 back
//! to a version git stores, 50 to new text) and adds 20.
//!
//! Run: `cargo run --release --no-default-features -p cairn-bench --bin
//! judge` (`--smoke`: tiny sizes). To compare with another build of this
//! same file (the code before a change: check out the base commit, copy
//! this file in, build it): `judge --against OTHER_BINARY`; both measure
//! the same fixture in alternating rounds, and the table states whether
//! the ratio this/other ≤ 1.1 is shown. `judge --fixture DIR --samples N`
//! is what `--against` runs in the other binary: N samples on the fixture
//! at DIR, one `sample_ns` line each.
#![allow(clippy::print_stdout)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cairn_bench::{Table, sample, size};
use cairn_core::staged::StagedRules;

fn git(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("git")
        .args(["-c", "user.name=b", "-c", "user.email=b@b", "-c", "gc.auto=0"])
        .args(args)
        .current_dir(dir)
        .env("HOME", "/nonexistent")
        .output()
        .context("git")?;
    if !out.status.success() {
        bail!("git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// The fixture under `dir`: `repo` (a git repository of `files` files in
/// 50 directories, two commits, packed, then a third commit left loose)
/// and `upper` (the staging layer of an effect on it).
fn fixture(dir: &Path, files: usize) -> Result<()> {
    let repo = dir.join("repo");
    let path = |i: usize| format!("d{}/f{i}.txt", i % 50);
    let write = |root: &Path, i: usize, text: String| -> Result<()> {
        let p = root.join(path(i));
        std::fs::create_dir_all(p.parent().context("parent")?)?;
        std::fs::write(p, text)?;
        Ok(())
    };
    for i in 0..files {
        write(&repo, i, format!("file {i}\nversion one\n"))?;
    }
    git(&repo, &["init", "-q"])?;
    git(&repo, &["add", "-A"])?;
    git(&repo, &["commit", "-qm", "one"])?;
    for i in 0..files {
        write(&repo, i, format!("file {i}\nversion two\n"))?;
    }
    git(&repo, &["commit", "-qam", "two"])?;
    git(&repo, &["gc", "-q"])?;
    let changed = files.min(100);
    for i in 0..changed / 2 {
        write(&repo, i, format!("file {i}\nversion three\n"))?;
    }
    git(&repo, &["commit", "-qam", "three"])?;
    // Uncommitted work on the files the effect puts back.
    for i in 0..changed / 2 {
        write(&repo, i, format!("file {i}\nversion three\nuncommitted\n"))?;
    }
    let upper = dir.join("upper");
    for i in 0..changed {
        let text = if i < changed / 2 { format!("file {i}\nversion two\n") } else { format!("file {i}\nnew text\n") };
        write(&upper, i, text)?;
    }
    for i in 0..20 {
        std::fs::create_dir_all(upper.join("new"))?;
        std::fs::write(upper.join(format!("new/n{i}.txt")), format!("new {i}\n"))?;
    }
    Ok(())
}

/// One judgement of the fixture at `dir`; the number of changes.
fn judge(dir: &Path) -> usize {
    let set = cairn_tools::staging::read_layer(&dir.join("upper"), &dir.join("repo"))
        .unwrap_or_else(|e| panic!("reading the layer: {e}"));
    std::hint::black_box(set.judge(&StagedRules::default(), &dir.join("repo")));
    set.changes.len()
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn main() -> Result<()> {
    if let Some(dir) = arg("--fixture") {
        let n: usize = arg("--samples").as_deref().unwrap_or("5").parse()?;
        for d in sample(n, || {
            judge(Path::new(&dir));
        }) {
            println!("sample_ns {}", d.as_nanos());
        }
        return Ok(());
    }
    let base = tempfile::tempdir()?;
    let files = size(5000, 200);
    fixture(base.path(), files)?;
    let changes = judge(base.path());
    let discards = cairn_tools::staging::read_layer(&base.path().join("upper"), &base.path().join("repo"))?
        .changes
        .iter()
        .filter(|c| c.discards_uncommitted)
        .count();
    println!("{changes} changes, {discards} marked as discarding uncommitted work");
    let mut table = Table::new("judge");
    match arg("--against") {
        None => {
            let s = sample(size(31, 5), || {
                judge(base.path());
            });
            table.figure(
                &format!("judging a staged effect of {changes} changes on a git repository of {files} files"),
                &cairn_bench::describe(&s),
            );
        }
        Some(other) => {
            let per_round = size(5, 2);
            let mut rounds = Vec::new();
            for r in 0..size(9, 2) {
                let ours = || {
                    sample(per_round, || {
                        judge(base.path());
                    })
                };
                let theirs = || -> Result<Vec<Duration>> {
                    let out = Command::new(&other)
                        .args(["--fixture", &base.path().display().to_string(), "--samples", &per_round.to_string()])
                        .output()
                        .with_context(|| format!("running {other}"))?;
                    if !out.status.success() {
                        bail!("{other}: {}", String::from_utf8_lossy(&out.stderr));
                    }
                    let text = String::from_utf8_lossy(&out.stdout).into_owned();
                    Ok(text
                        .lines()
                        .filter_map(|l| l.strip_prefix("sample_ns "))
                        .filter_map(|n| n.parse::<u64>().ok())
                        .map(Duration::from_nanos)
                        .collect())
                };
                let (a, b) = if r % 2 == 0 {
                    let a = ours();
                    (a, theirs()?)
                } else {
                    let b = theirs()?;
                    (ours(), b)
                };
                rounds.push((a, b));
            }
            table.claim_rounds(
                &format!(
                    "judging a staged effect of {changes} changes on a git repository of {files} files, this build"
                ),
                &rounds,
                &format!("the build at {other}"),
                1.1,
            );
        }
    }
    table.print();
    Ok(())
}
