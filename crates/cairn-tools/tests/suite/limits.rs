//! Limits, from the outside: timeouts and cancellation kill the whole group
//! (grandchildren included, even one that left the group), fork bombs and
//! runaway output are contained. Processes are found by a marker in their
//! command line, from the host's `/proc` (tools run in PID namespaces).

use std::ffi::OsString;
use std::time::Duration;

use cairn_core::CancelToken;
use cairn_core::tool::{ToolError, ToolLimits};
use cairn_tools::process::{End, RunSpec, run as run_process};
use cairn_tools::sandbox::{SandboxPolicy, pids_cgroup_root};
use cairn_tools::{ToolsConfig, landlock_status};
use serde_json::json;

use super::util::{Watcher, install_tool, live_in_group, load, marker, metadata, run, run_with, with_marker};

/// Why a call's escaped processes (`setsid`) may survive here, if they may:
/// they die with the call's PID namespace, or with its pids cgroup.
fn escape_containment() -> Result<(), String> {
    let s = landlock_status();
    if s.pid_namespace || s.pids_cgroup {
        Ok(())
    } else {
        Err(format!(
            "neither a PID namespace ({}) nor a pids cgroup ({}) is available: run as root or in a delegated cgroup v2",
            s.pid_namespace_note, s.pids_cgroup_note
        ))
    }
}

#[test]
fn a_hanging_tool_is_killed_at_the_timeout_with_its_grandchildren() {
    escape_containment().unwrap();
    let root = tempfile::tempdir().unwrap();
    let (child, escaped) = (marker("timeout-child"), marker("timeout-escaped"));
    let script = format!(
        "#!/bin/bash\n(exec -a {child} sleep 1000) &\nsetsid bash -c 'exec -a {escaped} sleep 1000' &\n\
         until [ -e seen ]; do sleep 0.05; done\necho started\nwait\n"
    );
    let t = load(&install_tool(
        &root.path().join("tools"),
        "hang",
        &script,
        &metadata("write", &["processSpawn", "fileRead"], "timeout = 3"),
    ));
    let watcher = Watcher::start(&[child.clone(), escaped.clone()], Some(root.path().join("seen")));
    let (r, _) = run_with(&t, json!({}), root.path(), super::util::limits(), false, &CancelToken::new());
    let seen = watcher.stop();
    assert_eq!(seen, [true, true], "both sleepers ran within the timeout (else this test proves nothing)");
    assert!(matches!(r, Err(ToolError::Timeout(_))), "{r:?}");
    assert!(with_marker(&child).is_empty(), "grandchild survived the timeout");
    assert!(with_marker(&escaped).is_empty(), "setsid grandchild survived the timeout");
}

#[test]
fn an_escaped_grandchild_dies_with_the_call_through_the_cgroup_alone() {
    if let Err(why) = pids_cgroup_root() {
        panic!("cairn cannot create a pids cgroup here: {why}");
    }
    let cwd = tempfile::tempdir().unwrap();
    let escaped = marker("cgroup-escaped");
    let spec = RunSpec {
        argv: [
            "bash",
            "-c",
            &format!(
                "setsid bash -c 'exec -a {escaped} sleep 1000' & until [ -e seen ]; do sleep 0.05; done; echo done"
            ),
        ]
        .iter()
        .map(OsString::from)
        .collect(),
        cwd: cwd.path().to_path_buf(),
        stdin: Vec::new(),
        env: cairn_tools::env::scrubbed_env(&Default::default()),
        sandbox: Some(SandboxPolicy {
            cwd: cwd.path().to_path_buf(),
            read_cwd: true,
            write_cwd: true,
            process_spawn: true,
            ..SandboxPolicy::default()
        }),
        timeout: Duration::from_secs(60),
        output_cap: 4096,
        max_processes: 48,
        // Not in a PID namespace: only the cgroup can find the escapee.
        pid_namespace: false,
        hidden: Vec::new(),
    };
    let watcher = Watcher::start(std::slice::from_ref(&escaped), Some(cwd.path().join("seen")));
    let outcome = run_process(&spec, &CancelToken::new(), &mut |_| {}).unwrap();
    assert_eq!(watcher.stop(), [true], "the escapee ran");
    assert_eq!(outcome.end, End::Exited);
    assert!(with_marker(&escaped).is_empty(), "the setsid grandchild outlived the call");
}

#[test]
fn cancellation_kills_the_group() {
    let cwd = tempfile::tempdir().unwrap();
    let shell = cairn_tools::builtin::shell::Shell::new(&ToolsConfig::default()).unwrap();
    let cancel = CancelToken::new();
    let child = marker("cancel-child");
    let seen = Watcher::start(std::slice::from_ref(&child), Some(cwd.path().join("seen")));
    // Cancel once the watcher has seen the child alive.
    let trigger = cancel.clone();
    let ack = cwd.path().join("seen");
    let canceller = std::thread::spawn(move || {
        while !ack.exists() {
            std::thread::sleep(Duration::from_millis(10));
        }
        trigger.cancel();
    });
    let (r, _) = run_with(
        &shell,
        json!({"command": format!("(exec -a {child} sleep 1000) & wait")}),
        cwd.path(),
        super::util::limits(),
        false,
        &cancel,
    );
    canceller.join().unwrap();
    assert_eq!(seen.stop(), [true]);
    assert!(matches!(r, Err(ToolError::Cancelled)), "{r:?}");
    assert!(with_marker(&child).is_empty());
}

#[test]
fn background_processes_do_not_outlive_the_call() {
    let cwd = tempfile::tempdir().unwrap();
    // Unstaged: the handshake file appears in the real tree while the call
    // runs, which a staged call (reading through its overlay) need not see.
    let shell =
        cairn_tools::builtin::shell::Shell::new(&ToolsConfig { staged: false, ..ToolsConfig::default() }).unwrap();
    let bg = marker("background");
    let seen = Watcher::start(std::slice::from_ref(&bg), Some(cwd.path().join("seen")));
    let r = run(
        &shell,
        json!({"command": format!(
            "(exec -a {bg} sleep 1000) > /dev/null 2>&1 & until [ -e seen ]; do sleep 0.05; done; echo \"started\""
        )}),
        cwd.path(),
    )
    .unwrap();
    assert_eq!(seen.stop(), [true]);
    assert!(r.output_summary.contains("started"), "{}", r.output_summary);
    assert!(with_marker(&bg).is_empty());
}

#[test]
fn a_fork_bomb_is_contained() {
    // Without a pids cgroup only the timeout bounds a bomb: do not set one
    // off on a machine that cannot cap it, and say so as a failure.
    if let Err(why) = pids_cgroup_root() {
        panic!("cairn cannot create a pids cgroup here, so a fork bomb would not be contained: {why}");
    }
    let cwd = tempfile::tempdir().unwrap();
    let spec = RunSpec {
        argv: ["bash", "-c", ":(){ :|:& };: ; sleep 2"].iter().map(OsString::from).collect(),
        cwd: cwd.path().to_path_buf(),
        stdin: Vec::new(),
        env: cairn_tools::env::scrubbed_env(&Default::default()),
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
        pid_namespace: true,
        hidden: Vec::new(),
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
