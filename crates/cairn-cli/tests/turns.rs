//! Turns through the real `cairn` binary with the scripted provider:
//! answers, tool calls, approvals without a terminal, `--json` events,
//! forks, sessions, and a SIGKILL in the middle of a tool call followed by
//! `cairn resume --last`.

#![allow(clippy::unwrap_used)]

use crate::util;
use util::stderr_text as stderr;
use util::stdout_text as stdout;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use util::Env;

fn json_lines(text: &str) -> Vec<Value> {
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}"))).collect()
}

/// Entry types of a session file, in order.
fn entry_types(path: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut types = Vec::new();
    for line in text.lines().skip(1) {
        let value: Value = serde_json::from_str(line).unwrap();
        let records = match value {
            Value::Array(items) => items,
            one => vec![one],
        };
        for r in records {
            if r["kind"] == "entry" {
                types.push(r["type"].as_str().unwrap().to_owned());
            }
        }
    }
    types
}

#[test]
fn run_answers_with_a_tool_call_and_records_everything() {
    let env = Env::new();
    std::fs::write(env.cwd.join("notes.txt"), "the secret word is cairn\n").unwrap();
    let script = env.script(&[
        json!({"text": "Reading.", "toolCalls": [{"id": "c1", "name": "read_file", "arguments": {"path": "notes.txt"}}]}),
        json!({"text": "The word is cairn."}),
    ]);
    let out = env.cairn(&["--script", script.to_str().unwrap(), "run", "what is the word?"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("The word is cairn."), "{}", stdout(&out));
    assert!(stderr(&out).contains("read_file"), "tool activity is shown: {}", stderr(&out));
    assert!(stderr(&out).contains("attempts"), "usage line: {}", stderr(&out));
    let files = env.session_files();
    assert_eq!(files.len(), 1);
    let types = entry_types(&files[0]);
    assert_eq!(
        types,
        ["message", "message", "toolRequested", "toolStarted", "toolCompleted", "message"],
        "the lifecycle of the invocation is in the log"
    );
    let check = env.cairn(&["--json", "check", files[0].to_str().unwrap()]).output().unwrap();
    let report: Value = serde_json::from_str(stdout(&check).trim()).unwrap();
    assert_eq!(report["ok"], true);
    assert_eq!(report["entries"], 6);
    assert_eq!(report["usage"], 2);
}

#[test]
fn json_output_is_one_event_per_line_in_order() {
    let env = Env::new();
    std::fs::write(env.cwd.join("a.txt"), "alpha\n").unwrap();
    let script = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "read_file", "arguments": {"path": "a.txt"}}]}),
        json!({"text": "done"}),
    ]);
    let out = env.cairn(&["--json", "--script", script.to_str().unwrap(), "run", "go"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let events = json_lines(&stdout(&out));
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types.first(), Some(&"session"));
    assert_eq!(types.last(), Some(&"turnEnd"));
    let position = |t: &str| types.iter().position(|x| *x == t).unwrap_or_else(|| panic!("no {t} in {types:?}"));
    assert!(position("turnStarted") < position("toolRequested"));
    assert!(position("toolRequested") < position("toolStarted"));
    assert!(position("toolStarted") < position("toolCompleted"));
    assert!(position("toolCompleted") < position("final"));
    assert_eq!(types.iter().filter(|t| **t == "usage").count(), 2, "a usage event per attempt");
    let final_event = &events[position("final")];
    assert_eq!(final_event["text"], "done");
    let end = events.last().unwrap();
    assert_eq!(end["exitCode"], 0);
    assert_eq!(end["stop"], "answered");
    let completed = &events[position("toolCompleted")];
    assert!(completed["outputSummary"].as_str().unwrap().contains("alpha"));
}

#[test]
fn write_without_a_terminal_is_denied_unless_allowed() {
    let env = Env::new();
    let call = json!({"text": "", "toolCalls": [{"id": "c1", "name": "write_file", "arguments": {"path": "out.txt", "content": "hi\n"}}]});
    let script = env.script(&[call, json!({"text": "finished"})]);
    let s = script.to_str().unwrap();

    let denied = env.cairn(&["--script", s, "run", "write it"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(denied.status.code(), Some(4), "denied → exit 4: {}", stderr(&denied));
    assert!(!env.cwd.join("out.txt").exists());
    assert!(stderr(&denied).contains("--allow"), "says how to allow it: {}", stderr(&denied));

    let allowed = env.cairn(&["--script", s, "--allow", "write_file", "run", "write it"]).output().unwrap();
    assert_eq!(allowed.status.code(), Some(0), "{}", stderr(&allowed));
    assert_eq!(std::fs::read_to_string(env.cwd.join("out.txt")).unwrap(), "hi\n");

    std::fs::remove_file(env.cwd.join("out.txt")).unwrap();
    let yes = env.cairn(&["--script", s, "--yes", "run", "write it"]).output().unwrap();
    assert_eq!(yes.status.code(), Some(0), "{}", stderr(&yes));
    assert!(env.cwd.join("out.txt").exists());
}

#[test]
fn destructive_is_refused_headless_even_with_yes_and_allow() {
    let env = Env::new();
    std::fs::create_dir(env.cwd.join("precious")).unwrap();
    std::fs::write(env.cwd.join("precious/data"), "keep me").unwrap();
    let call =
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell", "arguments": {"command": "rm -rf precious"}}]});
    let script = env.script(&[call, json!({"text": "I could not delete it."})]);
    let out = env
        .cairn(&[
            "--script",
            script.to_str().unwrap(),
            "--yes",
            "--allow",
            "shell",
            "--allow",
            "shell(rm *)",
            "run",
            "clean",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(env.cwd.join("precious/data").exists(), "nothing was deleted");
    let types = entry_types(&env.session_files()[0]);
    assert!(types.contains(&"toolRejected".to_owned()), "{types:?}");
    // With overlay staging the command runs staged and its effect (the
    // deletion) is refused; without it, it never starts.
    let text = std::fs::read_to_string(&env.session_files()[0]).unwrap();
    assert!(!types.contains(&"toolStarted".to_owned()) || text.contains("Staged changes:"), "{types:?} {text}");
}

#[test]
fn fork_and_show_both_branches() {
    let env = Env::new();
    let script = env.script(&[json!({"text": "first answer"}), json!({"text": "second answer"})]);
    let s = script.to_str().unwrap();
    let out = env.cairn(&["--script", s, "--name", "tree", "run", "hello"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = env.cairn(&["--script", s, "resume", "tree", "--prompt", "and then?"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("second answer"));

    // Fork at the first user message and continue there.
    let log = env.cairn(&["--json", "log", "tree"]).output().unwrap();
    let first = json_lines(&stdout(&log)).into_iter().find(|r| r["kind"] == "entry").unwrap();
    let first_id = first["id"].as_str().unwrap().to_owned();
    let out = env.cairn(&["fork", "tree", &first_id, "--lane", "alt"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out =
        env.cairn(&["--script", s, "--lane", "alt", "resume", "tree", "--prompt", "other path"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let show = env.cairn(&["show", "tree"]).output().unwrap();
    let text = stdout(&show);
    assert!(text.contains("lane alt"), "{text}");
    assert!(text.contains("lane main"), "{text}");
    assert!(text.contains("and then?"), "main branch shown: {text}");
    assert!(text.contains("other path"), "fork branch shown: {text}");
    assert!(text.contains("◀ alt") && text.contains("◀ main"), "heads marked: {text}");
    assert!(text.matches("├─").count() >= 2, "a branch point: {text}");
    // No copy: one file, the first entry appears once.
    assert_eq!(env.session_files().len(), 1);
    assert_eq!(text.matches("user: hello").count(), 1, "{text}");
}

#[test]
fn sessions_lists_newest_first_and_a_closed_pipe_exits_quietly() {
    let env = Env::new();
    let script = env.script(&[json!({"text": "ok"})]);
    for name in ["one", "two"] {
        let out = env.cairn(&["--script", script.to_str().unwrap(), "--name", name, "run", "hi"]).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = env.cairn(&["sessions"]).output().unwrap();
    let text = stdout(&out);
    let one = text.find(" one ").unwrap();
    let two = text.find(" two ").unwrap();
    assert!(two < one, "newest first: {text}");
    assert!(text.contains("final"), "{text}");

    let mut child = env.cairn(&["sessions"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    drop(child.stdout.take());
    let status = child.wait().unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(status.success(), "closed pipe exits 0, stderr: {err}");
    assert!(err.is_empty(), "and quietly: {err}");
}

#[test]
fn check_reports_a_corrupt_file_with_exit_1() {
    let env = Env::new();
    let path = env.home.join("bad.jsonl");
    std::fs::write(&path, "{\"v\":1,\"kind\":\"header\",\"id\":\"x\",\"storageVersion\":1,\"createdAt\":0,\"cwd\":\"/\"}\nnot json\n{\"kind\":\"usage\",\"seq\":2,\"id\":\"u\",\"usage\":{}}\n").unwrap();
    let out = env.cairn(&["--json", "check", path.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(report["ok"], false);
    assert!(report["error"].as_str().unwrap().contains("line 2"), "{report}");
}

#[test]
fn provider_keys_never_reach_output_or_the_session_file() {
    let env = Env::new();
    let key = "sk-test-DO-NOT-LEAK-4242";
    let out = env
        .cairn(&["--provider", "openai", "--model", "m", "run", "hi"])
        .env("OPENAI_API_KEY", key)
        .env("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(!stderr(&out).contains(key) && !stdout(&out).contains(key), "{}", stderr(&out));
    for file in env.session_files() {
        assert!(!std::fs::read_to_string(file).unwrap().contains(key));
    }
}

/// SIGKILL while `shell` runs, then `cairn resume --last`: the call is
/// settled exactly once and the command never runs twice. Staged (the
/// default where overlays work), the command writes into its staging layer
/// and a killed call applies nothing; unstaged, it wrote the live tree once.
fn sigkill_during_a_tool_call(staged: bool) {
    let env = Env::new();
    if !staged {
        std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    } else {
        cairn_tools::staging::overlay_status()
            .unwrap_or_else(|why| panic!("staged shell needs overlay staging, unavailable here: {why}"));
    }
    let marker = env.cwd.join("ran.txt");
    // Unstaged, a redirection is unclassifiable and would need a person;
    // `tee -a` appends the same line with plain words.
    let command = if staged { "echo ran >> ran.txt; sleep 30" } else { "echo ran | tee -a ran.txt; sleep 30" };
    let call = json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell", "arguments": {"command": command}}]});
    let script = env.script(&[call, json!({"text": "after the interruption"})]);
    let s = script.to_str().unwrap();
    let mut child =
        env.cairn(&["--script", s, "--yes", "run", "go"]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(if staged { env.staged_file_exists("ran.txt") } else { marker.exists() }) {
        assert!(Instant::now() < deadline, "the tool never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let out = env.cairn(&["--script", s, "--yes", "resume", "--last"]).stdin(Stdio::null()).output().unwrap();
    assert!(stdout(&out).contains("after the interruption"), "{}\n{}", stdout(&out), stderr(&out));
    let types = entry_types(&env.session_files()[0]);
    let settlements =
        types.iter().filter(|t| ["toolCompleted", "toolFailed", "toolRejected"].contains(&t.as_str())).count();
    assert_eq!(settlements, 1, "settled exactly once: {types:?}");
    assert_eq!(types.iter().filter(|t| *t == "toolStarted").count(), 1, "started once: {types:?}");
    if staged {
        assert!(!marker.exists(), "a staged call killed before its commit applied its effect");
    } else {
        assert_eq!(std::fs::read_to_string(&marker).unwrap(), "ran\n", "the command was not run twice");
    }
    let check = env.cairn(&["--json", "check", "--", env.session_files()[0].to_str().unwrap()]).output().unwrap();
    assert!(stdout(&check).contains("\"ok\":true"), "{}", stdout(&check));
}

#[test]
fn sigkill_during_a_staged_tool_call_then_resume_settles_it_once() {
    sigkill_during_a_tool_call(true);
}

#[test]
fn sigkill_during_an_unstaged_tool_call_then_resume_settles_it_once() {
    sigkill_during_a_tool_call(false);
}

#[test]
fn check_reports_a_torn_tail_without_failing_and_never_changes_the_file() {
    let env = Env::new();
    let script = env.script(&[json!({"text": "fine"})]);
    let out = env.cairn(&["--script", script.to_str().unwrap(), "run", "hi"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let path = env.session_files()[0].clone();
    let before = env.cairn(&["--json", "check", path.to_str().unwrap()]).output().unwrap();
    let before: Value = serde_json::from_str(stdout(&before).trim()).unwrap();
    // A crash in the middle of an append leaves half a line at the end.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(b"{\"kind\":\"usage\",\"seq\":99999,\"id\":\"u_torn\",\"us");
    std::fs::write(&path, &bytes).unwrap();
    let out = env.cairn(&["--json", "check", path.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "a torn tail is reported, not an error");
    let report: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(report["tornTail"], true);
    assert_eq!(report["entries"], before["entries"]);
    assert_eq!(report["lastSeq"], before["lastSeq"]);
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "check never modifies the file");
    // The session still continues: the next append does not glue onto the torn bytes.
    let script = env.script(&[json!({"text": "fine"}), json!({"text": "still fine"})]);
    let out =
        env.cairn(&["--script", script.to_str().unwrap(), "resume", "--last", "--prompt", "again"]).output().unwrap();
    assert!(stdout(&out).contains("still fine"), "{}", stderr(&out));
    let after = env.cairn(&["--json", "check", path.to_str().unwrap()]).output().unwrap();
    let after: Value = serde_json::from_str(stdout(&after).trim()).unwrap();
    assert_eq!(after["ok"], true);
    assert_eq!(after["tornTail"], false);
}
