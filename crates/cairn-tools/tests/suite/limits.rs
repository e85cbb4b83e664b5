//! Limits, from the outside: timeouts and cancellation kill the whole group
//! (grandchildren included, even one that left the group), fork bombs and
//! runaway output are contained.

use std::ffi::OsString;
use std::time::Duration;

use cairn_core::CancelToken;
use cairn_core::tool::{ToolError, ToolLimits};
use cairn_tools::process::{End, RunSpec, run as run_process};
use cairn_tools::sandbox::SandboxPolicy;
use cairn_tools::{ToolsConfig, landlock_status};
use serde_json::json;

use super::util::{alive, install_tool, live_in_group, load, metadata, run, run_with};

fn pids_in(streamed: &[u8], key: &str) -> Vec<i32> {
    String::from_utf8_lossy(streamed)
        .lines()
        .filter_map(|l| l.strip_prefix(key))
        .filter_map(|p| p.trim().parse().ok())
        .collect()
}

#[test]
fn a_hanging_tool_is_killed_at_the_timeout_with_its_grandchildren() {
    let root = tempfile::tempdir().unwrap();
    let script = "#!/bin/bash\nsleep 1000 &\necho \"grandchild=$!\"\nsetsid sleep 1000 &\necho \"escaped=$!\"\nwait\n";
    let t = load(&install_tool(root.path(), "hang", script, &metadata("write", &["processSpawn"], "timeout = 1.5")));
    let (r, seen) = run_with(&t, json!({}), root.path(), super::util::limits(), false, &CancelToken::new());
    assert!(matches!(r, Err(ToolError::Timeout(_))), "{r:?}");
    let grandchildren = pids_in(&seen.streamed, "grandchild=");
    assert_eq!(grandchildren.len(), 1, "{}", String::from_utf8_lossy(&seen.streamed));
    assert!(!alive(grandchildren[0]), "grandchild {} survived the timeout", grandchildren[0]);
    // One that left the process group (setsid) is still in the call's pids
    // cgroup, when cairn can make one.
    if landlock_status().pids_cgroup {
        let escaped = pids_in(&seen.streamed, "escaped=");
        assert_eq!(escaped.len(), 1);
        assert!(!alive(escaped[0]), "setsid grandchild {} survived", escaped[0]);
    }
}

#[test]
fn cancellation_kills_the_group() {
    let cwd = tempfile::tempdir().unwrap();
    let shell = cairn_tools::builtin::shell::Shell::new(&ToolsConfig::default()).unwrap();
    let cancel = CancelToken::new();
    let trigger = cancel.clone();
    let flag = cwd.path().join("started");
    let watcher_flag = flag.clone();
    let watcher = std::thread::spawn(move || {
        while !watcher_flag.exists() {
            std::thread::sleep(Duration::from_millis(10));
        }
        trigger.cancel();
    });
    let (r, seen) = run_with(
        &shell,
        json!({"command": "sleep 1000 & echo \"grandchild=$!\"; touch started; wait"}),
        cwd.path(),
        super::util::limits(),
        false,
        &cancel,
    );
    watcher.join().unwrap();
    assert!(matches!(r, Err(ToolError::Cancelled)), "{r:?}");
    let pids = pids_in(&seen.streamed, "grandchild=");
    assert_eq!(pids.len(), 1);
    assert!(!alive(pids[0]));
}

#[test]
fn background_processes_do_not_outlive_the_call() {
    let cwd = tempfile::tempdir().unwrap();
    let shell = cairn_tools::builtin::shell::Shell::new(&ToolsConfig::default()).unwrap();
    let r = run(&shell, json!({"command": "sleep 1000 > /dev/null 2>&1 & echo \"bg=$!\""}), cwd.path()).unwrap();
    let pids = pids_in(r.output_summary.as_bytes(), "bg=");
    assert_eq!(pids.len(), 1, "{}", r.output_summary);
    assert!(!alive(pids[0]));
}

#[test]
fn a_fork_bomb_is_contained() {
    if !landlock_status().pids_cgroup {
        // Without a pids cgroup only the timeout bounds a bomb: do not set
        // one off on a machine that cannot cap it.
        eprintln!("skipped: cairn cannot create a pids cgroup here");
        return;
    }
    let cwd = tempfile::tempdir().unwrap();
    let spec = RunSpec {
        argv: ["bash", "-c", ":(){ :|:& };: ; sleep 2"].iter().map(OsString::from).collect(),
        cwd: cwd.path().to_path_buf(),
        stdin: Vec::new(),
        env: cairn_tools::env::scrubbed_env(),
        sandbox: Some(SandboxPolicy {
            cwd: cwd.path().to_path_buf(),
            read_cwd: true,
            write_cwd: true,
            process_spawn: true,
            ..SandboxPolicy::default()
        }),
        timeout: Duration::from_secs(3),
        output_cap: 4096,
        max_processes: 48,
    };
    let outcome = run_process(&spec, &CancelToken::new(), &mut |_| {}).unwrap();
    // bash keeps retrying the fork of `sleep` while the cgroup is full, so
    // the leader may be stopped by the timeout rather than exit by itself.
    assert!(matches!(outcome.end, End::Exited | End::TimedOut));
    assert!(live_in_group(outcome.pid as i32).is_empty(), "bomb processes survived");
    let err = String::from_utf8_lossy(&outcome.stderr.kept);
    assert!(err.contains("fork") || err.contains("Resource temporarily unavailable"), "{err}");
}

#[test]
fn a_tool_printing_100_mb_is_truncated_with_bounded_memory() {
    let root = tempfile::tempdir().unwrap();
    let script = "#!/bin/bash\nhead -c 104857600 /dev/zero | tr '\\0' 'x'\n";
    let t = load(&install_tool(root.path(), "flood", script, &metadata("write", &["processSpawn"], "")));
    let before = cairn_bench_free_rss();
    let cap = 64 * 1024;
    let (r, seen) = run_with(
        &t,
        json!({}),
        root.path(),
        ToolLimits { timeout: Duration::from_secs(120), output_cap: cap },
        false,
        &CancelToken::new(),
    );
    let r = r.unwrap();
    let after = cairn_bench_free_rss();
    assert!(r.truncated);
    assert!(r.output_summary.contains("output truncated: kept the first 65536 of 104857600 bytes"));
    assert!(r.output_summary.len() < cap + 1024);
    assert_eq!(r.structured_output.unwrap()["stdoutBytes"], 104857600);
    assert!(seen.streamed.len() <= cap, "streamed {} bytes", seen.streamed.len());
    if let (Some(b), Some(a)) = (before, after) {
        assert!(a.saturating_sub(b) < 48 * 1024 * 1024, "peak RSS grew by {} bytes", a - b);
    }
}

/// Peak RSS of this process (VmHWM).
fn cairn_bench_free_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}
