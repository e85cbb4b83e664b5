//! The session store through the real binary, with hostile session
//! directories: a FIFO and a `/dev/zero` symlink named like sessions, a
//! symlinked session, a header id that is not the file name, an exhausted
//! seq space, corrupt and newer files for `log`, the compaction default and
//! `--force`, and a broken tool lifecycle at open and in `check`. Every
//! command runs under a timeout so a hang fails the test instead of
//! blocking the suite.

#![allow(clippy::unwrap_used)]

use crate::util;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use util::Env;

/// Run `cmd` to completion, or kill it and fail after 60 s.
fn run(mut cmd: Command) -> Output {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!("{cmd:?} hung; stderr so far: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn sessions_dir(env: &Env) -> PathBuf {
    env.home.join("sessions")
}

/// A real session made by `cairn run`, named `name`; returns its file.
fn real_session(env: &Env, name: &str) -> PathBuf {
    let script = env.script(&[json!({"text": "an answer"})]);
    let out = run(env.cairn(&["--script", script.to_str().unwrap(), "--name", name, "run", "hello"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let files = env.session_files();
    files
        .into_iter()
        .find(|f| std::fs::read_to_string(f).is_ok_and(|t| t.contains(&format!("\"value\":\"{name}\""))))
        .unwrap()
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success(), "mkfifo failed");
}

fn id_of(path: &Path) -> String {
    path.file_stem().unwrap().to_string_lossy().into_owned()
}

#[test]
fn bad_files_in_the_sessions_directory_neither_hang_nor_abort_any_command() {
    let env = Env::new();
    let good = real_session(&env, "good");
    // Created after the good session, so they are the newest files.
    std::thread::sleep(Duration::from_millis(20));
    mkfifo(&sessions_dir(&env).join("x.jsonl"));
    std::os::unix::fs::symlink("/dev/zero", sessions_dir(&env).join("z.jsonl")).unwrap();

    let out = run(env.cairn(&["--json", "sessions"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let listed: Vec<Value> = stdout(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(listed.len(), 1, "only the good session is listed: {listed:?}");
    assert_eq!(listed[0]["id"], id_of(&good));
    assert_eq!(listed[0]["name"], "good");
    let err = stderr(&out);
    assert!(err.contains("x.jsonl") && err.contains("is a FIFO"), "warned about the FIFO: {err}");
    assert!(err.contains("z.jsonl") && err.contains("is a character device"), "warned about the device: {err}");

    for (target, what) in [("x", "is a FIFO"), ("z", "is a character device")] {
        for args in [vec!["check", target], vec!["show", target], vec!["log", target], vec!["resume", target]] {
            let out = run(env.cairn(&args));
            assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stdout(&out));
            let text = format!("{}{}", stdout(&out), stderr(&out));
            // A writable open refuses the symlink itself before looking further.
            let what = if args[0] == "resume" && target == "z" { "is a symlink" } else { what };
            assert!(text.contains(what), "{args:?} names the problem: {text}");
        }
    }

    // `resume --last` skips the newer bad files and resumes the good one.
    // The scripted provider answers by position in the session: line 2.
    let script = env.script(&[json!({"text": "an answer"}), json!({"text": "resumed fine"})]);
    let out = run(env.cairn(&["--script", script.to_str().unwrap(), "resume", "--last", "--prompt", "again"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("resumed fine"));
    assert!(stderr(&out).contains("skipping"), "{}", stderr(&out));
}

#[test]
fn resume_last_with_only_bad_files_is_a_clear_error() {
    let env = Env::new();
    std::fs::create_dir_all(sessions_dir(&env)).unwrap();
    mkfifo(&sessions_dir(&env).join("x.jsonl"));
    let out = run(env.cairn(&["resume", "--last"]));
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no sessions yet"), "{}", stderr(&out));
    assert!(stderr(&out).contains("is a FIFO"), "{}", stderr(&out));
}

#[test]
fn a_symlinked_session_is_refused_on_resume() {
    let env = Env::new();
    let good = real_session(&env, "target");
    let elsewhere = env.home.join("elsewhere.jsonl");
    std::fs::rename(&good, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &good).unwrap();
    let before = std::fs::read(&elsewhere).unwrap();
    let script = env.script(&[json!({"text": "must not be written"})]);
    let out = run(env.cairn(&["--script", script.to_str().unwrap(), "resume", &id_of(&good), "--prompt", "x"]));
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stderr(&out).contains("symlink"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&elsewhere).unwrap(), before, "nothing written through the link");
    // Reading through it still works.
    let out = run(env.cairn(&["check", &id_of(&good)]));
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}

#[test]
fn a_header_id_that_is_not_the_file_name_is_reported() {
    let env = Env::new();
    let good = real_session(&env, "orig");
    let renamed = sessions_dir(&env).join("renamed.jsonl");
    std::fs::rename(&good, &renamed).unwrap();
    let out = run(env.cairn(&["--json", "sessions"]));
    assert_eq!(out.status.code(), Some(0));
    let listed: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(listed["id"], "renamed", "listed under the id lookups use");
    assert_eq!(listed["headerId"], id_of(&good));
    assert!(stderr(&out).contains(&format!("the header says session id \"{}\"", id_of(&good))), "{}", stderr(&out));
    // The listed id can be looked up.
    let out = run(env.cairn(&["check", "renamed"]));
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("warning: ") && stdout(&out).contains("is named \"renamed\""), "{}", stdout(&out));
}

const HEADER: &str = r#"{"v":1,"kind":"header","id":"hand","storageVersion":1,"createdAt":0,"cwd":"/"}"#;

fn hand_session(env: &Env, name: &str, lines: &[&str]) -> PathBuf {
    std::fs::create_dir_all(sessions_dir(env)).unwrap();
    let path = sessions_dir(env).join(format!("{name}.jsonl"));
    std::fs::write(&path, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    path
}

#[test]
fn an_exhausted_seq_space_is_refused_and_the_file_stays_readable() {
    let env = Env::new();
    let last = format!(r#"{{"kind":"register","op":"set","seq":{},"namespace":"fact","key":"k","value":1}}"#, u64::MAX);
    let path = hand_session(&env, "hand", &[HEADER, &last]);
    let before = std::fs::read(&path).unwrap();
    let script = env.script(&[json!({"text": "never committed"})]);
    let out = run(env.cairn(&["--script", script.to_str().unwrap(), "resume", "hand", "--prompt", "go"]));
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stderr(&out).contains("seqs are exhausted"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&path).unwrap(), before, "nothing was written");
    let out = run(env.cairn(&["--json", "check", "hand"]));
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}

#[test]
fn log_exits_non_zero_on_a_corrupt_or_newer_file() {
    let env = Env::new();
    let good = real_session(&env, "fine");
    let out = run(env.cairn(&["log", &id_of(&good)]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let reg =
        |seq: u64| format!(r#"{{"kind":"register","op":"set","seq":{seq},"namespace":"fact","key":"k","value":1}}"#);
    let newer = r#"{"v":1,"kind":"header","id":"newer","storageVersion":9,"createdAt":0,"cwd":"/"}"#;
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        ("newer", vec![newer.to_owned(), reg(1)], "storage version 9 is newer"),
        ("garbage", vec![HEADER.to_owned(), "not json".to_owned(), reg(2)], "line 2"),
        ("backwards", vec![HEADER.to_owned(), reg(5), reg(3)], "seq 3 is not greater"),
        (
            "dangling",
            vec![
                HEADER.to_owned(),
                r#"{"kind":"entry","seq":1,"timestamp":0,"id":"e","parentId":"nope","type":"message","payload":{}}"#
                    .to_owned(),
            ],
            "unknown parent",
        ),
    ];
    for (name, lines, why) in cases {
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        hand_session(&env, name, &refs);
        for json in [false, true] {
            let args = if json { vec!["--json", "log", name] } else { vec!["log", name] };
            let out = run(env.cairn(&args));
            assert_eq!(out.status.code(), Some(1), "{name} {args:?}: {}", stdout(&out));
            assert!(stderr(&out).contains(why), "{name}: {}", stderr(&out));
        }
    }
}

#[test]
fn compact_honours_the_default_threshold_unless_forced() {
    let env = Env::new();
    let good = real_session(&env, "small");
    let before = std::fs::read(&good).unwrap();
    let out = run(env.cairn(&["--json", "compact", "small"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(report["compacted"], false, "{report}");
    assert_eq!(report["threshold"], 0.5);
    assert_eq!(std::fs::read(&good).unwrap(), before, "file untouched");
    let out = run(env.cairn(&["compact", "small"]));
    assert!(stdout(&out).contains("use --force"), "{}", stdout(&out));

    let out = run(env.cairn(&["--json", "compact", "--force", "small"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(report["compacted"], true, "{report}");
    assert!(report["after"].as_u64().unwrap() < report["before"].as_u64().unwrap());

    // The threshold is configurable and shown by `cairn config`.
    std::fs::write(env.home.join("config.toml"), "[storage]\ncompact_ratio = 0.25\n").unwrap();
    let out = run(env.cairn(&["config"]));
    assert!(stdout(&out).contains("storage.compact_ratio") && stdout(&out).contains("0.25"), "{}", stdout(&out));
    std::fs::write(env.home.join("config.toml"), "[storage]\ncompact_ratio = 3\n").unwrap();
    let out = run(env.cairn(&["config"]));
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("storage.compact_ratio = 3 is out of range"), "{}", stderr(&out));
}

/// A session with one completed `read_file` call, then its settlement line
/// appended a second time (new seq and id): the lifecycle is broken.
#[test]
fn a_broken_tool_lifecycle_is_refused_at_open_and_by_check() {
    let env = Env::new();
    std::fs::write(env.cwd.join("notes.txt"), "hi\n").unwrap();
    let script = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "read_file", "arguments": {"path": "notes.txt"}}]}),
        json!({"text": "done"}),
        json!({"text": "more"}),
    ]);
    let s = script.to_str().unwrap();
    let out = run(env.cairn(&["--script", s, "--name", "tools", "run", "read it"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = run(env.cairn(&["check", "tools"]));
    assert_eq!(out.status.code(), Some(0), "healthy before: {}", stdout(&out));

    let path = env.session_files().pop().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let mut last_seq = 0;
    let mut completed: Option<Value> = None;
    for line in text.lines().skip(1) {
        let value: Value = serde_json::from_str(line).unwrap();
        let records = if value.is_array() { value.as_array().unwrap().clone() } else { vec![value] };
        for record in records {
            last_seq = last_seq.max(record["seq"].as_u64().unwrap());
            if record["type"] == "toolCompleted" {
                completed = Some(record);
            }
        }
    }
    let mut dup = completed.expect("a toolCompleted entry");
    let invocation = dup["payload"]["invocationId"].as_str().unwrap().to_owned();
    let parent = dup["id"].clone();
    dup["seq"] = json!(last_seq + 1);
    dup["id"] = json!("dup1");
    dup["parentId"] = parent;
    std::fs::write(&path, format!("{text}{dup}\n")).unwrap();
    let before = std::fs::read(&path).unwrap();

    let out = run(env.cairn(&["check", "tools"]));
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let expected = format!("invocation {invocation} settled twice");
    assert!(stdout(&out).contains(&expected), "check names the invocation: {}", stdout(&out));

    let out = run(env.cairn(&["--script", s, "resume", "tools", "--prompt", "again"]));
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stderr(&out).contains(&expected), "open names the invocation: {}", stderr(&out));
    assert_eq!(std::fs::read(&path).unwrap(), before, "the refused open wrote nothing");
}

#[test]
fn an_over_long_line_is_reported_with_its_line_and_the_limit_is_configurable() {
    let env = Env::new();
    let long = format!(
        r#"{{"kind":"register","op":"set","seq":1,"namespace":"fact","key":"k","value":"{}"}}"#,
        "v".repeat(10_000)
    );
    hand_session(&env, "hand", &[HEADER, &long]);
    std::fs::write(env.home.join("config.toml"), "[storage]\nmax_line_bytes = 8192\n").unwrap();
    for args in [vec!["check", "hand"], vec!["log", "hand"], vec!["show", "hand"]] {
        let out = run(env.cairn(&args));
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let text = format!("{}{}", stdout(&out), stderr(&out));
        assert!(text.contains("line 2 (byte offset") && text.contains("limit of 8192 bytes"), "{args:?}: {text}");
    }
    let out = run(env.cairn(&["sessions"]));
    assert_eq!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("limit of 8192 bytes"), "{}", stderr(&out));
    std::fs::remove_file(env.home.join("config.toml")).unwrap();
    let out = run(env.cairn(&["check", "hand"]));
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}
