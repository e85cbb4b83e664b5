//! Benchmark of staged execution (issue 16): the built-in `shell` run
//! staged (overlay, change set read, judged and applied) against the same
//! tool unstaged (`staged = false`: sandboxed, directly on the tree), on
//! the same commands, interleaved: a no-op, a "build" that writes 1,000
//! files, and `git status` on a repository of 5,000 files. Also the cost of
//! computing a change set alone (reading an upper layer of 1,000 files:
//! stat, hash, compare) against reading the same files, and of applying
//! it alone against writing the same files directly.
//!
//! Run: `cargo run --release -p cairn-bench --bin staged` (`--smoke`: tiny
//! sizes, for `scripts/test`); as another user, copy the binary where that
//! user may run it and run it with `setpriv --reuid UID --regid GID
//! --clear-groups` (staging then goes through a user namespace). Needs
//! overlay staging; where it is unavailable it says so and exits with an
//! error.
#![allow(clippy::print_stdout)]

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use cairn_bench::{Table, sample, sample_pairs, size};
use cairn_core::CancelToken;
use cairn_core::staged::{StagedDecision, StagedReview};
use cairn_core::tool::{Tool, ToolContext, ToolLimits, ToolRequest};
use cairn_tools::ToolsConfig;
use cairn_tools::builtin::shell::Shell;
use serde_json::json;

/// Run `command` through `shell` in `cwd`; every staged effect applies.
fn run(shell: &Shell, cwd: &Path, command: &str) {
    let request = ToolRequest {
        invocation_id: "bench".into(),
        call_id: "c1".into(),
        session_id: "s".into(),
        tool: "shell".into(),
        arguments: json!({ "command": command }),
    };
    let cancel = CancelToken::new();
    let mut output = |_: &[u8]| {};
    let mut bypass = |_: &str| false;
    let mut review = |_: &StagedReview<'_>| StagedDecision::Apply { by: "bench".into() };
    let mut ctx = ToolContext {
        cwd,
        cancel: &cancel,
        limits: ToolLimits { timeout: std::time::Duration::from_secs(600), output_cap: 16 * 1024 },
        output: &mut output,
        approve_bypass: &mut bypass,
        review_staged: &mut review,
        elicit: &mut |_, _| cairn_core::elicit::nobody(),
    };
    match shell.execute(&request, &mut ctx) {
        Ok(r) if r.exit_code == 0 => {}
        other => panic!("{command:?} failed: {other:?}"),
    }
}

fn git(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("git")
        .args(["-c", "user.name=b", "-c", "user.email=b@b"])
        .args(args)
        .current_dir(dir)
        .output()
        .context("git")?;
    if !out.status.success() {
        bail!("git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn main() -> Result<()> {
    if let Err(why) = cairn_tools::staging::overlay_status() {
        bail!("overlay staging is not available here: {why}");
    }
    // Root stages through plain namespaces, any other user through a user
    // namespace (issue 25): say which this run measures.
    let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap_or(u32::MAX);
    println!("running as uid {uid}: namespaces {:?}", cairn_tools::sandbox::namespace_mode());
    let base = tempfile::tempdir()?;
    let staging_dir = base.path().join("staging");
    let staged = Shell::new(&ToolsConfig {
        staged: true,
        staging_dir: Some(staging_dir.clone()),
        staged_max_files: usize::MAX,
        ..ToolsConfig::default()
    })?;
    let unstaged = Shell::new(&ToolsConfig { staged: false, ..ToolsConfig::default() })?;
    let samples = size(11, 5);
    let mut table = Table::new("staged");

    // 1. A no-op.
    let a = base.path().join("noop-a");
    let b = base.path().join("noop-b");
    std::fs::create_dir_all(&a)?;
    std::fs::create_dir_all(&b)?;
    std::fs::write(a.join("x"), "x")?;
    std::fs::write(b.join("x"), "x")?;
    let (s, u) = sample_pairs(samples, || run(&staged, &a, "true"), || run(&unstaged, &b, "true"));
    table.compare("no-op (`true`), staged", &s, "unstaged", &u);

    // 2. A build that writes N files (the tree is reset between samples,
    // outside the timing).
    let files = size(1000, 20);
    let build = format!("mkdir -p out && for i in $(seq 1 {files}); do echo \"object $i\" > out/f$i.o; done");
    let (mut s, mut u) = (Vec::new(), Vec::new());
    for i in 0..samples {
        for dir in [&a, &b] {
            let _ = std::fs::remove_dir_all(dir.join("out"));
        }
        let one = |shell: &Shell, dir: &Path| sample(1, || run(shell, dir, &build));
        if i % 2 == 0 {
            s.extend(one(&staged, &a));
            u.extend(one(&unstaged, &b));
        } else {
            u.extend(one(&unstaged, &b));
            s.extend(one(&staged, &a));
        }
        if std::fs::read_dir(a.join("out"))?.count() != files {
            bail!("the staged build did not apply all {files} files");
        }
    }
    table.compare(&format!("build writing {files} files, staged (apply included)"), &s, "unstaged", &u);

    // 3. git status on a large repository.
    let repo_files = size(5000, 50);
    let repo = base.path().join("repo");
    for i in 0..repo_files {
        let dir = repo.join(format!("d{}", i % 50));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(format!("f{i}.txt")), format!("file {i}\n"))?;
    }
    git(&repo, &["init", "-q"])?;
    git(&repo, &["add", "-A"])?;
    git(&repo, &["commit", "-qm", "base"])?;
    let (s, u) = sample_pairs(
        samples,
        || run(&staged, &repo, "HOME=/nonexistent git status --short"),
        || run(&unstaged, &repo, "HOME=/nonexistent git status --short"),
    );
    table.compare(&format!("git status on {repo_files} files, staged"), &s, "unstaged", &u);

    // 4. The change set alone: reading an upper layer of N files against
    // reading the same files.
    let lower = base.path().join("lower");
    let upper = base.path().join("upper");
    std::fs::create_dir_all(&lower)?;
    std::fs::create_dir_all(upper.join("out"))?;
    for i in 0..files {
        std::fs::write(upper.join(format!("out/f{i}.o")), format!("object {i}\n"))?;
    }
    let (read, plain) = sample_pairs(
        size(21, 5),
        || {
            let set = cairn_tools::staging::read_layer(&upper, &lower).unwrap_or_default();
            assert_eq!(set.changes.len(), files + 1);
        },
        || {
            let mut n = 0;
            for e in std::fs::read_dir(upper.join("out")).into_iter().flatten().flatten() {
                n += std::fs::read(e.path()).map(|b| b.len()).unwrap_or(0);
            }
            assert!(n > 0);
        },
    );
    table.compare(&format!("computing the change set of {files} new files"), &read, "reading the same files", &plain);

    // 5. The apply alone: the change set of N new files applied to an
    // empty tree (beneath a directory fd; each created file hashed and
    // moved from the layer, its inode checked; the directories fsynced)
    // against writing the same files there directly and one syncfs: what
    // the safe apply costs over the writes.
    let set = cairn_tools::staging::read_layer(&upper, &lower)?;
    let (mut applied, mut written) = (Vec::new(), Vec::new());
    for i in 0..size(11, 3) {
        let fresh = |tag: &str| -> Result<std::path::PathBuf> {
            let dir = base.path().join(format!("{tag}{i}"));
            std::fs::create_dir_all(&dir)?;
            Ok(dir)
        };
        let (tree, plain_tree, layer) = (fresh("apply")?, fresh("write")?, fresh("layer")?);
        // A layer of its own per sample (written outside the timing): the
        // apply moves created files out of the layer it applies.
        std::fs::create_dir_all(layer.join("out"))?;
        for k in 0..files {
            std::fs::write(layer.join(format!("out/f{k}.o")), format!("object {k}\n"))?;
        }
        let apply = || {
            cairn_tools::staging::apply(&set, &layer, &tree, cairn_tools::staging::Writers::Gone)
                .unwrap_or_else(|e| panic!("apply: {e}"));
        };
        let write = || {
            let fail = |e: std::io::Error| panic!("writing the baseline: {e}");
            std::fs::create_dir_all(plain_tree.join("out")).unwrap_or_else(fail);
            for k in 0..files {
                std::fs::write(plain_tree.join(format!("out/f{k}.o")), format!("object {k}\n")).unwrap_or_else(fail);
            }
            cairn_tools::beneath::sync_dir(&plain_tree).unwrap_or_else(fail);
        };
        if i % 2 == 0 {
            applied.extend(sample(1, apply));
            written.extend(sample(1, write));
        } else {
            written.extend(sample(1, write));
            applied.extend(sample(1, apply));
        }
    }
    table.compare(
        &format!("applying the change set of {files} new files"),
        &applied,
        "writing the same files directly + one syncfs",
        &written,
    );
    table.print();
    Ok(())
}
