//! The inspection and maintenance commands through the real binary:
//! `log` (and `--follow` on a live session), `compact`, `tools`, `model
//! path`, `resume` without sessions, `run --prompt-file`.

#![allow(clippy::unwrap_used)]

use crate::util;
use util::stderr_text as stderr;
use util::stdout_text as stdout;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use util::Env;

#[test]
fn log_prints_every_record_and_follow_sees_new_commits() {
    let env = Env::new();
    let script = env.script(&[json!({"text": "one"}), json!({"text": "two"})]);
    let s = script.to_str().unwrap();
    let out = env.cairn(&["--script", s, "--name", "followed", "run", "first"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    let log = env.cairn(&["--json", "log", "followed"]).output().unwrap();
    let records: Vec<Value> = stdout(&log).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let seqs: Vec<u64> = records.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "records in seq order: {seqs:?}");
    assert!(records.iter().any(|r| r["kind"] == "entry" && r["type"] == "message"));

    // A follower started now sees the records of a second turn as they land.
    let mut follower = env.cairn(&["--json", "log", "--follow", "followed"]).stdout(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(follower.stdout.take().unwrap()).lines();
    for _ in 0..records.len() {
        lines.next().unwrap().unwrap();
    }
    let out = env.cairn(&["--script", s, "resume", "followed", "--prompt", "second"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut saw_second = false;
    while !saw_second && Instant::now() < deadline {
        let line = lines.next().unwrap().unwrap();
        let record: Value = serde_json::from_str(&line).unwrap();
        saw_second = record["type"] == "message" && record["payload"]["content"][0]["text"] == "second";
    }
    follower.kill().unwrap();
    follower.wait().unwrap();
    assert!(saw_second, "the follower printed the new user message");
}

#[test]
fn compact_keeps_every_entry() {
    let env = Env::new();
    let script = env.script(&[json!({"text": "a"}), json!({"text": "b"}), json!({"text": "c"})]);
    let s = script.to_str().unwrap();
    env.cairn(&["--script", s, "--name", "c", "run", "1"]).output().unwrap();
    env.cairn(&["--script", s, "resume", "c", "--prompt", "2"]).output().unwrap();
    let before = env.cairn(&["--json", "check", "c"]).output().unwrap();
    let before: Value = serde_json::from_str(stdout(&before).trim()).unwrap();
    assert!(before["deadBytesRatio"].as_f64().unwrap() > 0.0);

    let out = env.cairn(&["--json", "compact", "--force", "c"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let sizes: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert!(sizes["after"].as_u64().unwrap() < sizes["before"].as_u64().unwrap(), "{sizes}");

    let after = env.cairn(&["--json", "check", "c"]).output().unwrap();
    let after: Value = serde_json::from_str(stdout(&after).trim()).unwrap();
    assert_eq!(after["ok"], true);
    assert_eq!(after["entries"], before["entries"], "no entry dropped");
    assert_eq!(after["usage"], before["usage"]);
    assert_eq!(after["deadBytesRatio"].as_f64().unwrap(), 0.0);
    // The session still continues after compaction.
    let out = env.cairn(&["--script", s, "resume", "c", "--prompt", "3"]).output().unwrap();
    assert!(stdout(&out).contains('c'), "{}", stderr(&out));
}

#[test]
fn tools_lists_builtins_externals_and_broken_metadata() {
    let env = Env::new();
    let dir = env.cwd.join(".cairn/tools");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("greet.toml"),
        "description = \"Say hello\"\nrisk = \"readOnly\"\ncapabilities = []\nreplay = \"idempotent\"\n\
         [parameters]\ntype = \"object\"\n",
    )
    .unwrap();
    let exe = dir.join("greet");
    std::fs::write(&exe, "#!/bin/sh\necho hello\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.join("broken.toml"), "this is = = not toml").unwrap();

    // The working directory's own tools load once it is trusted.
    let out = env.cairn(&["tools"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stdout(&out).contains("greet.toml"), "untrusted workspace tool listed: {}", stdout(&out));
    assert!(stdout(&out).contains("cairn trust"), "says how to trust: {}", stdout(&out));
    assert!(env.cairn(&["trust"]).output().unwrap().status.success());

    let out = env.cairn(&["tools"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for name in ["read_file", "list_dir", "search", "write_file", "edit_file", "shell", "greet"] {
        assert!(text.contains(name), "{name} listed: {text}");
    }
    assert!(text.contains("greet.toml"), "source of the external tool: {text}");
    assert!(text.contains("broken.toml"), "broken metadata reported with its file: {text}");
    assert!(text.contains("Landlock"), "sandbox reported: {text}");
}

#[test]
fn model_path_says_what_to_run_when_missing() {
    let env = Env::new();
    let out = env.cairn(&["model", "path"]).env_remove("CAIRN_LOCAL_MODEL").output().unwrap();
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(text.contains("cairn model install") || text.contains("built without the embedded model"), "{text}");
}

#[test]
fn resume_last_without_sessions_is_a_clear_error() {
    let env = Env::new();
    let out = env.cairn(&["resume", "--last"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no sessions yet"), "{}", stderr(&out));
    let out = env.cairn(&["show", "nope"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("cairn sessions"), "{}", stderr(&out));
}

#[test]
fn run_reads_the_prompt_from_a_file_or_stdin() {
    let env = Env::new();
    let script = env.script(&[json!({"text": "from file"}), json!({"text": "unused"})]);
    let s = script.to_str().unwrap();
    std::fs::write(env.cwd.join("prompt.txt"), "a prompt in a file").unwrap();
    let out = env.cairn(&["--script", s, "run", "--prompt-file", "prompt.txt"]).output().unwrap();
    assert!(stdout(&out).contains("from file"), "{}", stderr(&out));
    let log = env.cairn(&["--json", "log", env.session_files()[0].to_str().unwrap()]).output().unwrap();
    assert!(stdout(&log).contains("a prompt in a file"));

    let mut child = env
        .cairn(&["--script", s, "run", "--prompt-file", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"prompt on stdin").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(stdout(&out).contains("from file"));
    let empty = env.cairn(&["--script", s, "run", ""]).output().unwrap();
    assert_eq!(empty.status.code(), Some(1));
    assert!(stderr(&empty).contains("prompt is empty"));
}
