//! Benchmark of cairn-tools: the cost of the sandbox (the same short command
//! run sandboxed and unsandboxed through the same process runner, and raw
//! `std::process::Command` as the floor), and the `search` built-in against
//! `grep -rn` over the same generated tree. Every row: median of at least 5
//! samples (41 for the runner, 15 for search), interleaved with the
//! baseline's samples, with the spread of both and of the per-pair ratios.
//!
//! Run: `cargo run --release -p cairn-bench --bin tools` (`--smoke`: few
//! samples and a 20-file tree, for `scripts/test`).
#![allow(clippy::print_stdout)]

use std::ffi::OsString;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cairn_bench::{Table, sample_pairs, size};
use cairn_core::CancelToken;
use cairn_tools::ToolsConfig;
use cairn_tools::builtin::files::Search;
use cairn_tools::process::{RunSpec, run};
use cairn_tools::sandbox::SandboxPolicy;

fn spec(cwd: &std::path::Path, sandbox: Option<SandboxPolicy>) -> RunSpec {
    RunSpec {
        argv: vec![OsString::from("/bin/true")],
        cwd: cwd.to_path_buf(),
        stdin: Vec::new(),
        env: cairn_tools::env::scrubbed_env(&Default::default()),
        sandbox,
        timeout: Duration::from_secs(30),
        output_cap: 16 * 1024,
        max_processes: 256,
        pid_namespace: true,
        hidden: Vec::new(),
    }
}

fn run_ok(spec: &RunSpec) {
    let out = run(spec, &CancelToken::new(), &mut |_| {});
    assert!(matches!(out, Ok(ref o) if o.exit_code == 0), "run failed: {out:?}");
}

fn main() -> Result<()> {
    let status = cairn_tools::landlock_status();
    println!("sandbox: {}", status.describe());
    let dir = tempfile::tempdir()?;
    let cwd = dir.path();

    // 1. Sandbox overhead on a short command.
    let write_policy = SandboxPolicy {
        cwd: cwd.to_path_buf(),
        read_cwd: true,
        write_cwd: true,
        process_spawn: true,
        ..SandboxPolicy::default()
    };
    let read_policy = SandboxPolicy { cwd: cwd.to_path_buf(), read_cwd: true, ..SandboxPolicy::default() };
    let unsandboxed = spec(cwd, None);
    let sandboxed_shell = spec(cwd, Some(write_policy));
    let sandboxed_readonly = spec(cwd, Some(read_policy));
    for s in [&unsandboxed, &sandboxed_shell, &sandboxed_readonly] {
        run_ok(s); // warm up
    }
    let samples = size(41, 5);
    let mut table = Table::new("tools");
    println!("# /bin/true, {samples} samples each");
    let raw_true = || {
        let ok = Command::new("/bin/true").stdout(Stdio::null()).status().map(|s| s.success());
        assert!(matches!(ok, Ok(true)));
    };
    let (unsb, raw) = sample_pairs(samples, || run_ok(&unsandboxed), raw_true);
    table.compare("/bin/true through cairn's runner, unsandboxed", &unsb, "raw std::process::Command", &raw);
    let (sb_shell, unsb) = sample_pairs(samples, || run_ok(&sandboxed_shell), || run_ok(&unsandboxed));
    table.compare(
        "/bin/true sandboxed (shell policy: rw cwd, spawn, no net)",
        &sb_shell,
        "the same runner unsandboxed",
        &unsb,
    );
    let (sb_ro, unsb) = sample_pairs(samples, || run_ok(&sandboxed_readonly), || run_ok(&unsandboxed));
    table.compare(
        "/bin/true sandboxed (read-only tool: no write, no spawn, no net)",
        &sb_ro,
        "the same runner unsandboxed",
        &unsb,
    );

    // 2. search vs grep -rn over the same tree.
    let tree = tempfile::tempdir()?;
    let files = size(2000, 20);
    for i in 0..files {
        let sub = tree.path().join(format!("d{}", i % 40));
        std::fs::create_dir_all(&sub)?;
        let mut text = String::new();
        for line in 0..200 {
            if (i * 200 + line) % 97 == 0 {
                text.push_str(&format!("fn needle_{i}_{line}() -> usize {{ {line} }}\n"));
            } else {
                text.push_str(&format!("let value_{line} = compute({i}, {line}); // filler text here\n"));
            }
        }
        std::fs::write(sub.join(format!("f{i}.rs")), text)?;
    }
    let pattern = "fn needle_[0-9]+_[0-9]+";
    let search = Search::new(&ToolsConfig { search_max_matches: usize::MAX, ..ToolsConfig::default() });
    let (matches, truncated) = search.search(tree.path(), pattern, None).context("search")?;
    let grep_lines = Command::new("grep")
        .args(["-rnE", pattern, "."])
        .current_dir(tree.path())
        .output()
        .context("grep")?
        .stdout
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .count();
    if truncated || matches.len() != grep_lines {
        bail!("search found {} matches (truncated: {truncated}), grep {grep_lines}", matches.len());
    }
    let search_samples = size(15, 5);
    let (search_t, grep_t) = sample_pairs(
        search_samples,
        || {
            let r = search.search(tree.path(), pattern, None);
            assert!(matches!(r, Ok((ref m, _)) if m.len() == grep_lines));
        },
        || {
            let ok = Command::new("grep")
                .args(["-rnE", pattern, "."])
                .current_dir(tree.path())
                .stdout(Stdio::null())
                .status()
                .map(|s| s.success());
            assert!(matches!(ok, Ok(true)));
        },
    );
    table.compare(
        &format!("search built-in, {files} files × 200 lines, {} matches", matches.len()),
        &search_t,
        "grep -rnE, same matches",
        &grep_t,
    );
    table.print();
    Ok(())
}
