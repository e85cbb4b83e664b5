//! Benchmark of cairn-tools: the cost of the sandbox (the same short command
//! run sandboxed and unsandboxed through the same process runner, and raw
//! `std::process::Command` as the floor), and the `search` built-in against
//! `grep -rn` over the same generated tree.
#![allow(clippy::print_stdout)]

use std::ffi::OsString;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cairn_bench::{median, report, sample};
use cairn_core::CancelToken;
use cairn_tools::ToolsConfig;
use cairn_tools::builtin::files::Search;
use cairn_tools::process::{RunSpec, run};
use cairn_tools::sandbox::SandboxPolicy;

const SAMPLES: usize = 41;

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
    let raw = median(sample(SAMPLES, || {
        let ok = Command::new("/bin/true").stdout(Stdio::null()).status().map(|s| s.success());
        assert!(matches!(ok, Ok(true)));
    }));
    let unsb = median(sample(SAMPLES, || run_ok(&unsandboxed)));
    let sb_shell = median(sample(SAMPLES, || run_ok(&sandboxed_shell)));
    let sb_ro = median(sample(SAMPLES, || run_ok(&sandboxed_readonly)));
    println!("# /bin/true, {SAMPLES} samples each");
    report("unsandboxed runner vs raw std Command", unsb, raw);
    report("sandboxed (shell policy: rw cwd, spawn, no net) vs unsandboxed", sb_shell, unsb);
    report("sandboxed (read-only tool: no write, no spawn, no net) vs unsandboxed", sb_ro, unsb);

    // 2. search vs grep -rn over the same tree.
    let tree = tempfile::tempdir()?;
    let files = 2000;
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
    let search_t = median(sample(15, || {
        let r = search.search(tree.path(), pattern, None);
        assert!(matches!(r, Ok((ref m, _)) if m.len() == grep_lines));
    }));
    let grep_t = median(sample(15, || {
        let ok = Command::new("grep")
            .args(["-rnE", pattern, "."])
            .current_dir(tree.path())
            .stdout(Stdio::null())
            .status()
            .map(|s| s.success());
        assert!(matches!(ok, Ok(true)));
    }));
    println!("# search over {files} files x 200 lines, {} matches, 15 samples each", matches.len());
    report("search built-in vs grep -rnE", search_t, grep_t);
    Ok(())
}
