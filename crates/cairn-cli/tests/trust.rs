//! Workspace trust through the real `cairn` binary: a tool shipped in a
//! working directory's `.cairn/tools/` is neither offered nor run until a
//! person runs `cairn trust`, stops loading when any of its files changes,
//! and a manifest that understates its risk never loads, trusted or not.

#![allow(clippy::unwrap_used)]

use crate::util;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Output, Stdio};

use serde_json::{Value, json};
use util::Env;

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Put tool `name` (an executable script and its manifest) in `dir`.
fn install(dir: &Path, name: &str, script: &str, manifest: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), script).unwrap();
    std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.join(format!("{name}.toml")), manifest).unwrap();
}

fn manifest(risk: &str, capabilities: &str) -> String {
    format!(
        "description = \"Probe\"\nrisk = \"{risk}\"\ncapabilities = [{capabilities}]\nreplay = \"idempotent\"\n\
         [parameters]\ntype = \"object\"\n"
    )
}

/// The tool names `cairn --json tools` lists, and its problems line.
fn listed(env: &Env) -> (Vec<String>, Vec<String>) {
    let out = env.cairn(&["--json", "tools"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<Value> = stdout(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let names = lines.iter().filter_map(|l| l["name"].as_str().map(str::to_owned)).collect();
    let problems = lines
        .iter()
        .find(|l| l.get("problems").is_some())
        .map(|l| l["problems"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_owned()).collect())
        .unwrap();
    (names, problems)
}

/// A headless `--json` run whose model calls `probe`; returns the output.
fn run_calling_probe(env: &Env, extra: &[&str]) -> Output {
    let script = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "probe", "arguments": {}}]}),
        json!({"text": "finished"}),
    ]);
    let mut args = vec!["--json", "--script", script.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["run", "probe it"]);
    env.cairn(&args).stdin(Stdio::null()).output().unwrap()
}

/// Whether the run's events show the probe's output.
fn probe_ran(out: &Output) -> bool {
    stdout(out).lines().any(|l| {
        let v: Value = serde_json::from_str(l).unwrap();
        v["type"] == "toolCompleted" && v["outputSummary"].as_str().unwrap_or("").contains("PROBE-RAN")
    })
}

#[test]
fn a_workspace_tool_runs_only_after_cairn_trust_and_until_it_changes() {
    let env = Env::new();
    let tools = env.cwd.join(".cairn/tools");
    install(&tools, "probe", "#!/bin/sh\necho PROBE-RAN\n", &manifest("readOnly", ""));

    // Untrusted: not offered, and a headless run says so on stderr.
    let (names, problems) = listed(&env);
    assert!(names.contains(&"read_file".to_owned()) && !names.contains(&"probe".to_owned()), "{names:?}");
    assert!(problems.iter().any(|p| p.contains("probe") && p.contains("cairn trust")), "{problems:?}");
    for extra in [&[][..], &["--yes"][..], &["--quiet"][..]] {
        let out = run_calling_probe(&env, extra);
        assert!(!probe_ran(&out), "{extra:?}: an untrusted tool ran: {}", stdout(&out));
        let err = stderr(&out);
        assert!(err.contains("not trusted") && err.contains("cairn trust"), "{extra:?}: {err}");
        assert!(stdout(&out).contains("unknown tool \\\"probe\\\""), "{extra:?}: {}", stdout(&out));
    }

    // A person trusts the directory once; it is recorded, and the tool runs.
    let out = env.cairn(&["trust"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("trusted") && stdout(&out).contains("probe"), "{}", stdout(&out));
    assert!(env.home.join("trust.json").exists());
    let (names, problems) = listed(&env);
    assert!(names.contains(&"probe".to_owned()), "{names:?} {problems:?}");
    let out = run_calling_probe(&env, &[]);
    assert!(probe_ran(&out), "{}\n{}", stdout(&out), stderr(&out));
    assert!(!stderr(&out).contains("cairn trust"), "{}", stderr(&out));

    // Any change to the tools directory needs a new trust.
    std::fs::write(tools.join("probe"), "#!/bin/sh\necho PROBE-RAN changed\n").unwrap();
    let out = run_calling_probe(&env, &["--yes"]);
    assert!(!probe_ran(&out), "a changed tool ran: {}", stdout(&out));
    assert!(stderr(&out).contains("changed since it was trusted"), "{}", stderr(&out));
    let list = env.cairn(&["trust", "--list"]).output().unwrap();
    assert!(stdout(&list).contains("changed since trusted"), "{}", stdout(&list));
    assert!(env.cairn(&["trust"]).output().unwrap().status.success());
    assert!(probe_ran(&run_calling_probe(&env, &[])));

    // Revoked: gone again.
    let out = env.cairn(&["trust", "--revoke"]).output().unwrap();
    assert!(out.status.success() && stdout(&out).contains("no longer trusted"), "{}", stdout(&out));
    assert!(!probe_ran(&run_calling_probe(&env, &[])));
    let list = env.cairn(&["trust", "--list"]).output().unwrap();
    assert!(stdout(&list).contains("no trusted workspaces"), "{}", stdout(&list));
}

#[test]
fn trust_takes_a_directory_and_refuses_one_without_tools() {
    let env = Env::new();
    let other = env.home.join("elsewhere");
    install(&other.join(".cairn/tools"), "probe", "#!/bin/sh\necho PROBE-RAN\n", &manifest("readOnly", ""));
    // Trusting the current directory (no tools) is a clear error, and
    // records nothing.
    let out = env.cairn(&["trust"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("has neither .cairn/tools/ nor .cairn/config.toml"), "{}", stderr(&out));
    assert!(!env.home.join("trust.json").exists());
    // A session started in the other directory with --cwd: untrusted.
    let cwd = other.to_str().unwrap();
    let out = run_calling_probe(&env, &["--cwd", cwd]);
    assert!(!probe_ran(&out));
    let out = env.cairn(&["trust", cwd]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run_calling_probe(&env, &["--cwd", cwd]);
    assert!(probe_ran(&out), "{}", stderr(&out));
}

#[test]
fn a_repository_tool_understating_its_risk_never_loads_even_when_trusted() {
    let env = Env::new();
    let tools = env.cwd.join(".cairn/tools");
    let caps = "\"fileRead\", \"fileWrite\", \"network\", \"shellExec\"";
    install(&tools, "probe", "#!/bin/sh\necho PROBE-RAN\n", &manifest("readOnly", caps));
    let mut escaping =
        manifest("readOnly", "").replace("[parameters]", "executable = \"../../../bin/sh\"\n[parameters]");
    escaping.push('\n');
    std::fs::write(tools.join("escape.toml"), escaping).unwrap();
    let out = env.cairn(&["trust"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("require at least risk = \"write\""), "{}", stdout(&out));
    let (names, problems) = listed(&env);
    assert!(!names.contains(&"probe".to_owned()) && !names.contains(&"escape".to_owned()), "{names:?}");
    assert!(
        problems.iter().any(|p| p.contains("probe.toml") && p.contains("at least risk = \"write\"")),
        "{problems:?}"
    );
    assert!(problems.iter().any(|p| p.contains("escape.toml") && p.contains("'..'")), "{problems:?}");
    let out = run_calling_probe(&env, &["--yes"]);
    assert!(!probe_ran(&out), "{}", stdout(&out));
}

#[test]
fn the_users_own_tools_need_no_trust() {
    let env = Env::new();
    install(&env.home.join("tools"), "probe", "#!/bin/sh\necho PROBE-RAN\n", &manifest("readOnly", ""));
    let (names, problems) = listed(&env);
    assert!(names.contains(&"probe".to_owned()), "{names:?}");
    assert!(problems.is_empty(), "{problems:?}");
    let out = run_calling_probe(&env, &[]);
    assert!(probe_ran(&out), "{}", stderr(&out));
}
