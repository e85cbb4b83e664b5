//! Secrets planted in cairn's environment never reach a tool (its own test
//! binary: it changes the process environment before any thread reads it).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "suite/util.rs"]
mod util;

use cairn_tools::ToolsConfig;
use cairn_tools::builtin::shell::Shell;
use serde_json::json;

#[test]
fn secrets_in_the_environment_are_absent_inside_tools() {
    let planted = [
        ("OPENAI_API_KEY", "sk-planted-openai"),
        ("ANTHROPIC_API_KEY", "sk-ant-planted"),
        ("GITHUB_TOKEN", "ghp_planted"),
        ("MY_SERVICE_SECRET", "planted-secret"),
        ("DB_PASSWORD", "planted-password"),
        ("AWS_SECRET_ACCESS_KEY", "planted-aws"),
        ("SOME_CREDENTIALS", "planted-cred"),
    ];
    for (k, v) in planted {
        // SAFETY: this binary has a single test; no other thread reads the
        // environment while it is changed.
        unsafe { std::env::set_var(k, v) };
    }
    // SAFETY: as above.
    unsafe { std::env::set_var("CAIRN_TEST_HARMLESS", "visible") };

    let root = tempfile::tempdir().unwrap();
    let t = util::load(&util::install_tool(
        root.path(),
        "envdump",
        "#!/bin/bash\nexport -p\n",
        &util::metadata("readOnly", &[], ""),
    ));
    let r = util::run(&t, json!({}), root.path()).unwrap();
    let sh = Shell::new(&ToolsConfig::default()).unwrap();
    let s = util::run(&sh, json!({"command": "env"}), root.path()).unwrap();
    // Nor can a tool read them from cairn's own process: Landlock forbids
    // ptrace-class access (/proc/PID/environ, /proc/PID/mem) to processes
    // outside the sandbox.
    let proc = util::run(
        &sh,
        json!({"command": "for p in $PPID 1; do tr '\\0' '\\n' < /proc/$p/environ; done; echo END"}),
        root.path(),
    )
    .unwrap();
    assert!(proc.output_summary.contains("Permission denied"), "{}", proc.output_summary);
    for out in [&r.output_summary, &s.output_summary] {
        assert!(out.contains("CAIRN_TEST_HARMLESS"), "the environment is passed at all: {out}");
    }
    for out in [&r.output_summary, &s.output_summary, &proc.output_summary] {
        for (k, v) in planted {
            assert!(!out.contains(k) && !out.contains(v), "{k} leaked: {out}");
        }
    }
}
