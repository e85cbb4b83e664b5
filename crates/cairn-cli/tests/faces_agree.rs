//! The same scripted session through every headless face — `cairn run`
//! with no terminal, a 9P batch job (`cairn batch`), a PostgreSQL worker —
//! must leave the same entries in its session file (ids and timestamps
//! aside): an allowlisted Write call approved by the same rule, a
//! Destructive call refused by the same policy with the same reason, the
//! same answer. The approval rule lives in core's gate and policy, so a
//! face that decided anything itself would show here (issue 26).
//!
//! A second session spawns a child (`spawn_agent`) whose Write call is
//! covered by the parent's allow rule: every face offers the family's
//! tools, hands the child the parent's provider and authority, and leaves
//! the same parent and child files. (The interactive faces, 9P sessions
//! and ACP, ask a person where these refuse; their subagent tests are in
//! `serve_9p.rs` and `faces.rs`.)

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

/// The parent's script: spawn a child (its own script, absolute so every
/// face resolves it alike) and wait for it, then answer.
fn family_script(env: &Env) -> std::path::PathBuf {
    let child = env.home.join("child.jsonl");
    let lines = [
        json!({"text": "", "toolCalls": [
            {"id": "k1", "name": "write_file", "arguments": {"path": "note.txt", "content": "from the child\n"}}
        ]}),
        json!({"text": "child done", "toolCalls": []}),
    ];
    std::fs::write(&child, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    env.script(&[
        json!({"text": "", "toolCalls": [
            {"id": "p1", "name": "spawn_agent", "arguments": {"prompt": "write the note", "script": child.to_str().unwrap()}}
        ]}),
        json!({"text": "parent done", "toolCalls": []}),
    ])
}

fn family_cli(env: &Env) {
    let s = family_script(env);
    let out = env
        .cairn(&["--script", s.to_str().unwrap(), "--allow", "write_file", "run", "go"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

fn family_batch(env: &Env) {
    let s = family_script(env);
    let spec =
        format!("cwd={}\nprovider=scripted\nscript={}\nallow=write_file\n---\ngo\n", env.cwd.display(), s.display());
    std::fs::write(env.home.join("job.spec"), spec).unwrap();
    let out = env.cairn(&["batch", env.home.join("job.spec").to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A face: its name and how to run the family script through it.
type FamilyFace = (&'static str, fn(&Env));

#[test]
fn every_headless_face_runs_a_subagent_the_same_way() {
    let faces: Vec<FamilyFace> = vec![("cairn run", family_cli), ("9P batch", family_batch)];
    let mut reference: Option<(&str, Vec<Value>, Vec<Value>)> = None;
    for (face, run) in faces {
        let env = Env::new();
        setup(&env);
        run(&env);
        let files = env.session_files();
        let (children, parents): (Vec<_>, Vec<_>) =
            files.iter().partition(|p| p.file_stem().unwrap().to_str().unwrap().contains('+'));
        assert_eq!((parents.len(), children.len()), (1, 1), "{face}: {files:?}");
        let parent = summary(&entries(parents[0]));
        let child = summary(&entries(children[0]));
        eprintln!("{face}: parent {} entries, child {}", parent.len(), child.len());
        // The child ran its Write under the parent's allow rule, and its
        // answer came back to the parent as the spawn_agent result.
        assert_eq!(std::fs::read_to_string(env.cwd.join("note.txt")).unwrap(), "from the child\n", "{face}");
        let by: Vec<&str> = child.iter().filter_map(|e| e["by"].as_str()).collect();
        assert_eq!(by.first(), Some(&"allowlist:write_file"), "{face}: {child:#?}");
        let text = std::fs::read_to_string(parents[0]).unwrap();
        assert!(text.contains("child done"), "{face}: the child's answer is not in the parent's file");
        assert_eq!(parent.last().unwrap()["text"], "parent done", "{face}: {parent:#?}");
        match &reference {
            None => reference = Some((face, parent, child)),
            Some((first, want_parent, want_child)) => {
                assert_eq!(&parent, want_parent, "{face}'s parent differs from {first}'s");
                assert_eq!(&child, want_child, "{face}'s child differs from {first}'s");
            }
        }
    }
}
