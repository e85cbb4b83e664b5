//! The same scripted session through every headless face — `cairn run`
//! with no terminal, a 9P batch job (`cairn batch`), a PostgreSQL worker —
//! must leave the same entries in its session file (ids and timestamps
//! aside): an allowlisted Write call approved by the same rule, a
//! Destructive call refused by the same policy with the same reason, the
//! same answer. The approval rule lives in core's gate and policy, so a
//! face that decided anything itself would show here (issue 26).
//!
//! Not covered yet (issue 26 is open): subagents and discovery are offered
//! by the CLI host only, and the interactive faces (9P sessions, ACP) ask a
//! person where these refuse.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use serde_json::{Value, json};
use util::{Env, entries, entries_of_text};

/// The script: one Write call (allowlisted), one Destructive call, then
/// an answer.
fn script(env: &Env) -> std::path::PathBuf {
    env.script(&[
        json!({"text": "", "toolCalls": [
            {"id": "c1", "name": "write_file", "arguments": {"path": "out.txt", "content": "hi\n"}},
            {"id": "c2", "name": "shell", "arguments": {"command": "rm -rf precious"}}
        ]}),
        json!({"text": "all done", "toolCalls": []}),
    ])
}

fn setup(env: &Env) {
    // Unstaged, so the Destructive line is judged by its words everywhere.
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    std::fs::create_dir_all(env.cwd.join("precious")).unwrap();
}

/// What must agree across faces, entry by entry: the type, the role of a
/// message and its text, the tool, who decided and what, the reason of a
/// refusal, and the tool calls' outcomes (ids and times left out).
fn summary(entries: &[Value]) -> Vec<Value> {
    entries
        .iter()
        .map(|e| {
            let p = &e["payload"];
            let text: String = p["content"]
                .as_array()
                .map(|parts| parts.iter().filter_map(|c| c["text"].as_str()).collect())
                .unwrap_or_default();
            json!({
                "type": e["type"],
                "role": p["role"],
                "text": text,
                "tool": p["tool"].as_str().or_else(|| p["request"]["tool"].as_str()),
                "by": p["verdict"]["by"],
                "decision": p["verdict"]["decision"],
                "reason": p["reason"],
                "exitCode": p["receipt"]["exitCode"],
            })
        })
        .collect()
}

fn check_effects(env: &Env, face: &str) {
    assert_eq!(std::fs::read_to_string(env.cwd.join("out.txt")).unwrap(), "hi\n", "{face}: the Write ran");
    assert!(env.cwd.join("precious").exists(), "{face}: the Destructive call never ran");
}

fn cli(env: &Env) -> Vec<Value> {
    let s = script(env);
    let out = env
        .cairn(&["--script", s.to_str().unwrap(), "--allow", "write_file", "run", "go"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    // Exit 4 (denied): the Destructive call was refused.
    assert_eq!(out.status.code(), Some(4), "{}", String::from_utf8_lossy(&out.stderr));
    let files = env.session_files();
    assert_eq!(files.len(), 1, "{files:?}");
    entries(&files[0])
}

fn batch(env: &Env) -> Vec<Value> {
    let s = script(env);
    let spec =
        format!("cwd={}\nprovider=scripted\nscript={}\nallow=write_file\n---\ngo\n", env.cwd.display(), s.display());
    std::fs::write(env.home.join("job.spec"), spec).unwrap();
    let out = env.cairn(&["batch", env.home.join("job.spec").to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let files = env.session_files();
    assert_eq!(files.len(), 1, "{files:?}");
    entries(&files[0])
}

#[cfg(feature = "postgres")]
fn worker(env: &Env) -> Vec<Value> {
    use std::time::{Duration, Instant};
    let cluster = cairn_pg::test_cluster::TestCluster::start()
        .unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e:#}"));
    let url = cluster.url();
    let s = script(env);
    let out = env.cairn(&["--database", url, "submit", "go"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let mut worker = env
        .cairn(&["--database", url, "--script", s.to_str().unwrap(), "--allow", "write_file", "worker", "--lease", "2"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let state = || -> String {
        let out = env.cairn(&["--database", url, "--json", "sessions"]).output().unwrap();
        let row: Value =
            serde_json::from_slice(String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("{}").as_bytes())
                .unwrap_or_default();
        row["state"].as_str().unwrap_or_default().to_owned()
    };
    while state() != "idle" {
        if start.elapsed() > Duration::from_secs(120) {
            let _ = worker.kill();
            panic!("the worker never finished the session");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = worker.kill();
    let _ = worker.wait();
    let out = env.cairn(&["--database", url, "export", &id]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    entries_of_text(&String::from_utf8(out.stdout).unwrap())
}

/// A face: its name and how to run the script through it.
type Face = (&'static str, fn(&Env) -> Vec<Value>);

#[test]
fn every_headless_face_records_the_same_session() {
    let mut faces: Vec<Face> = vec![("cairn run", cli), ("9P batch", batch)];
    #[cfg(feature = "postgres")]
    faces.push(("PostgreSQL worker", worker));
    let mut reference: Option<(&str, Vec<Value>)> = None;
    for (face, run) in faces {
        let env = Env::new();
        setup(&env);
        let got = summary(&run(&env));
        eprintln!("{face}: {} entries", got.len());
        check_effects(&env, face);
        // The rule's own words, not only agreement: the Write by the allow
        // rule, its change set (kept for undo) applied by the staged-write
        // policy, the Destructive call refused by the headless policy.
        let by: Vec<&str> = got.iter().filter_map(|e| e["by"].as_str()).collect();
        assert_eq!(by, ["allowlist:write_file", "policy:stagedWrite", "policy:headless"], "{face}: {got:#?}");
        let refused = got.iter().find(|e| e["type"] == "toolRejected").unwrap_or_else(|| panic!("{face}: {got:#?}"));
        assert_eq!(refused["tool"], "shell", "{face}");
        assert!(refused["reason"].as_str().unwrap_or_default().contains("Destructive"), "{face}: {refused}");
        match &reference {
            None => reference = Some((face, got)),
            Some((first, want)) => assert_eq!(&got, want, "{face} differs from {first}"),
        }
    }
}
