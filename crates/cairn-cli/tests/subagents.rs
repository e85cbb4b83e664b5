//! `cairn ask` pipelines and subagents (`spawn_agent`, `wait_agents`)
//! through the real `cairn` binary with the scripted provider: a fan-out of
//! five children gathered with `wait_agents`, authority refusals, and a
//! child's Destructive call under a headless parent.

#![allow(clippy::unwrap_used)]

use crate::util;
use util::stderr_text as stderr;
use util::stdout_text as stdout;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use util::Env;

/// Every entry record of a session file (batched lines flattened).
fn entries(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let value: Value = serde_json::from_str(line).unwrap();
        let records = match value {
            Value::Array(items) => items,
            one => vec![one],
        };
        out.extend(records.into_iter().filter(|r| r["kind"] == "entry"));
    }
    out
}

fn write_script(dir: &Path, name: &str, lines: &[Value]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    path
}

fn stem(path: &Path) -> String {
    path.file_stem().unwrap().to_str().unwrap().to_owned()
}

/// (parent files, child files) of a home.
fn families(env: &Env) -> (Vec<PathBuf>, Vec<PathBuf>) {
    env.session_files().into_iter().partition(|p| !stem(p).contains('+'))
}

fn user_texts(path: &Path) -> Vec<String> {
    entries(path)
        .iter()
        .filter(|e| e["type"] == "message" && e["payload"]["role"] == "user")
        .map(|e| e["payload"].to_string())
        .collect()
}

#[test]
fn ask_pipeline_passes_each_answer_to_the_next_question() {
    let env = Env::new();
    let first = write_script(&env.home, "first.jsonl", &[json!({"text": "REVIEW: the loop never ends"})]);
    let second = write_script(&env.home, "second.jsonl", &[json!({"text": "1. the loop"})]);
    let cairn = assert_cmd::cargo::cargo_bin("cairn");
    let line = format!(
        "printf 'diff --git a/x b/x\\n+while true; do :; done\\n' | '{c}' --script '{a}' ask 'review this' | '{c}' --script '{b}' ask 'list the top three issues'",
        c = cairn.display(),
        a = first.display(),
        b = second.display()
    );
    let out = Command::new("sh")
        .arg("-c")
        .arg(&line)
        .current_dir(&env.cwd)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", env.home.join("fakehome"))
        .env("CAIRN_HOME", &env.home)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "1. the loop\n", "only the last answer reaches stdout");
    let files = env.session_files();
    assert_eq!(files.len(), 2, "one session per ask");
    let prompts: Vec<String> = files.iter().flat_map(|f| user_texts(f)).collect();
    assert!(
        prompts.iter().any(|p| p.contains("review this") && p.contains("while true; do :; done")),
        "the first ask got stdin as context: {prompts:?}"
    );
    assert!(
        prompts.iter().any(|p| p.contains("list the top three issues") && p.contains("REVIEW: the loop never ends")),
        "the second ask got the first answer as context: {prompts:?}"
    );
}

#[test]
fn ask_exits_non_zero_when_an_approval_could_not_be_had() {
    let env = Env::new();
    let call = json!({"text": "", "toolCalls": [{"id": "c1", "name": "write_file", "arguments": {"path": "out.txt", "content": "hi\n"}}]});
    let script = env.script(&[call, json!({"text": "wrote it"})]);
    let s = script.to_str().unwrap();
    let denied = env.cairn(&["--script", s, "ask", "write it"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(denied.status.code(), Some(4), "{}", stderr(&denied));
    assert_eq!(stdout(&denied), "", "no answer is printed");
    assert!(stderr(&denied).contains("approval it could not get"), "{}", stderr(&denied));
    assert!(stderr(&denied).contains("write_file"), "{}", stderr(&denied));
    assert!(!env.cwd.join("out.txt").exists());

    let allowed = env.cairn(&["--script", s, "--allow", "write_file", "ask", "write it"]).output().unwrap();
    assert_eq!(allowed.status.code(), Some(0), "{}", stderr(&allowed));
    assert_eq!(stdout(&allowed), "wrote it\n");
    assert!(env.cwd.join("out.txt").exists());
}

#[test]
fn ask_refuses_an_empty_question() {
    let env = Env::new();
    let out = env.cairn(&["ask", "  "]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("question is empty"), "{}", stderr(&out));
    assert!(env.session_files().is_empty());
}

/// The scripts of a parent fanning out `n` children (`wait: false`), then
/// gathering them with `wait_agents`; child i runs `shell` appending a line
/// to `child-i.log`, then answers `answer i`.
fn fan_out_scripts(env: &Env, n: usize) {
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    let calls: Vec<Value> = (1..=n)
        .map(|i| {
            json!({"id": format!("s{i}"), "name": "spawn_agent", "arguments": {
                "prompt": format!("task {i}"), "wait": false, "script": format!("child{i}.jsonl")}})
        })
        .collect();
    write_script(
        &env.home,
        "parent.jsonl",
        &[
            json!({"text": "", "toolCalls": calls}),
            json!({"text": "", "toolCalls": [{"id": "w1", "name": "wait_agents", "arguments": {}}]}),
            json!({"text": "all children answered"}),
        ],
    );
    for i in 1..=n {
        let command = format!("echo ran | tee -a child-{i}.log");
        write_script(
            &env.home,
            &format!("child{i}.jsonl"),
            &[
                json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell", "arguments": {"command": command}}]}),
                json!({"text": format!("answer {i}")}),
            ],
        );
    }
}

/// The children's answers in the last `wait_agents` settlement of a parent
/// (its structured output), and how many `wait_agents` settlements there are.
fn gathered(parent: &Path) -> (Vec<String>, usize) {
    let settled: Vec<Value> = entries(parent)
        .into_iter()
        .filter(|e| {
            ["toolCompleted", "toolFailed", "toolRejected"].contains(&e["type"].as_str().unwrap())
                && e["payload"]["tool"] == "wait_agents"
        })
        .collect();
    let answers = settled
        .last()
        .and_then(|e| e["payload"]["receipt"]["structuredOutput"]["children"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .map(|c| c["answer"].as_str().unwrap_or_default().to_owned())
        .collect();
    (answers, settled.len())
}

#[test]
fn a_parent_fans_out_five_children_and_gathers_their_answers() {
    let env = Env::new();
    fan_out_scripts(&env, 5);
    let script = env.home.join("parent.jsonl");
    let out = env.cairn(&["--script", script.to_str().unwrap(), "--yes", "run", "fan out"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("all children answered"), "{}", stdout(&out));
    let (parents, children) = families(&env);
    assert_eq!(parents.len(), 1);
    assert_eq!(children.len(), 5, "{children:?}");
    let parent_id = stem(&parents[0]);
    let (answers, settlements) = gathered(&parents[0]);
    assert_eq!(settlements, 1);
    assert_eq!(answers, (1..=5).map(|i| format!("answer {i}")).collect::<Vec<_>>());
    for i in 1..=5 {
        assert_eq!(std::fs::read_to_string(env.cwd.join(format!("child-{i}.log"))).unwrap(), "ran\n");
    }
    for child in &children {
        let id = stem(child);
        assert!(id.starts_with(&format!("{parent_id}+i")), "{id}");
        let facts = std::fs::read_to_string(child).unwrap();
        assert!(facts.contains("\"subagent\"") && facts.contains(&parent_id), "the child names its parent");
        assert_eq!(user_texts(child).len(), 1, "one turn per child");
        let check = env.cairn(&["--json", "check", child.to_str().unwrap()]).output().unwrap();
        assert!(stdout(&check).contains("\"ok\":true"), "{}", stdout(&check));
    }
    // The parent's spawn intents name the children: each child id is the
    // parent id plus the invocation of a toolRequested spawn_agent entry.
    let invocations: Vec<String> = entries(&parents[0])
        .iter()
        .filter(|e| e["type"] == "toolRequested" && e["payload"]["request"]["tool"] == "spawn_agent")
        .map(|e| e["payload"]["invocationId"].as_str().unwrap().to_owned())
        .collect();
    let mut expected: Vec<String> = invocations.iter().map(|i| format!("{parent_id}+{i}")).collect();
    let mut found: Vec<String> = children.iter().map(|c| stem(c)).collect();
    expected.sort();
    found.sort();
    assert_eq!(expected, found);
    // `cairn show` draws each child under the call that spawned it and
    // rolls the children's usage up; `cairn sessions` marks children.
    let show = env.cairn(&["show", &parent_id]).output().unwrap();
    let shown = stdout(&show);
    assert!(show.status.success(), "{}", stderr(&show));
    let lines: Vec<&str> = shown.lines().collect();
    for (invocation, i) in invocations.iter().zip(1..) {
        let at = lines
            .iter()
            .position(|l| l.contains("tool requested: spawn_agent") && l.contains(&format!("({invocation})")))
            .unwrap_or_else(|| panic!("no intent {invocation} in {shown}"));
        assert!(
            lines[at + 1].contains(&format!("└─ child {parent_id}+{invocation}"))
                && lines[at + 1].contains(&format!("answered: answer {i}")),
            "child under its call: {shown}"
        );
    }
    let usage = lines.iter().find(|l| l.contains("usage: own")).unwrap();
    assert!(usage.contains("5 descendant sessions"), "{usage}");
    let own: u64 = usage.split("own ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    let total: u64 = usage.split("total ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(total > own, "children's tokens are added: {usage}");
    let listed = stdout(&env.cairn(&["sessions"]).output().unwrap());
    assert_eq!(listed.lines().filter(|l| l.starts_with("↳ ")).count(), 5, "{listed}");
    let json = stdout(&env.cairn(&["--json", "sessions"]).output().unwrap());
    let with_parent = json.lines().filter(|l| l.contains(&format!("\"parent\":\"{parent_id}\""))).count();
    assert_eq!(with_parent, 5, "{json}");
    // A child is never resumed on its own (flags could exceed the
    // authority its parent gave it): the error names the parent.
    let direct = env
        .cairn(&[
            "--script",
            script.to_str().unwrap(),
            "--yes",
            "--allow",
            "shell(*)",
            "resume",
            &found[0],
            "--prompt",
            "x",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_ne!(direct.status.code(), Some(0));
    assert!(
        stderr(&direct).contains(&format!("resume the parent with `cairn resume {parent_id}`")),
        "{}",
        stderr(&direct)
    );
    assert_eq!(user_texts(&children[0]).len(), 1, "nothing ran in the child");
    // `cairn resume --last` names the parent, never a child.
    let last = env.cairn(&["--script", script.to_str().unwrap(), "resume", "--last"]).stdin(Stdio::null()).output();
    assert!(stderr(&last.unwrap()).contains(&parent_id));
}

fn spawn_once(env: &Env, arguments: Value) -> (std::process::Output, Vec<Value>) {
    write_script(&env.home, "child.jsonl", &[json!({"text": "child answer"})]);
    let script = write_script(
        &env.home,
        "parent.jsonl",
        &[
            json!({"text": "", "toolCalls": [{"id": "s1", "name": "spawn_agent", "arguments": arguments}]}),
            json!({"text": "parent done"}),
        ],
    );
    let out = env
        .cairn(&["--script", script.to_str().unwrap(), "--allow", "write_file", "run", "go"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (parents, _) = families(env);
    let log = entries(&parents[0]);
    (out, log)
}

fn refusal(log: &[Value]) -> String {
    log.iter()
        .find(|e| e["type"] == "toolRejected" || e["type"] == "toolFailed")
        .map(|e| e["payload"].to_string())
        .unwrap_or_else(|| panic!("no refusal in {log:?}"))
}

#[test]
fn a_child_cannot_have_a_tool_its_parent_lacks() {
    let env = Env::new();
    let (out, log) =
        spawn_once(&env, json!({"prompt": "p", "script": "child.jsonl", "tools": ["read_file", "launch_missiles"]}));
    assert_eq!(out.status.code(), Some(4), "a refused call: {}", stderr(&out));
    assert!(refusal(&log).contains("launch_missiles"), "{}", refusal(&log));
    assert!(refusal(&log).contains("subset"), "{}", refusal(&log));
    assert_eq!(families(&env).1.len(), 0, "no child was created");
}

#[test]
fn a_child_cannot_have_an_allow_pattern_its_parent_lacks() {
    let env = Env::new();
    let (out, log) =
        spawn_once(&env, json!({"prompt": "p", "script": "child.jsonl", "allow": ["write_file", "shell"]}));
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(refusal(&log).contains("\\\"shell\\\""), "{}", refusal(&log));
    assert_eq!(families(&env).1.len(), 0);

    // The parent's own pattern may be handed down.
    let env = Env::new();
    let (out, _) = spawn_once(&env, json!({"prompt": "p", "script": "child.jsonl", "allow": ["write_file"]}));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(families(&env).1.len(), 1);
}

#[test]
fn a_child_stays_inside_its_parents_working_directory() {
    let env = Env::new();
    std::fs::create_dir(env.cwd.join("sub")).unwrap();
    for outside in ["..", "/", "sub/../..", "missing"] {
        let env2 = Env::new();
        let (out, log) = spawn_once(&env2, json!({"prompt": "p", "script": "child.jsonl", "cwd": outside}));
        assert_eq!(out.status.code(), Some(4), "{outside}: {}", stderr(&out));
        assert!(refusal(&log).contains("cwd"), "{outside}: {}", refusal(&log));
        assert_eq!(families(&env2).1.len(), 0);
    }
    let (out, _) = spawn_once(&env, json!({"prompt": "p", "script": "child.jsonl", "cwd": "sub"}));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let child = families(&env).1.remove(0);
    let header: Value = serde_json::from_str(std::fs::read_to_string(&child).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(header["cwd"], env.cwd.join("sub").canonicalize().unwrap().display().to_string());
}

#[test]
fn a_childs_destructive_call_under_a_headless_parent_is_rejected_and_recorded() {
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    std::fs::create_dir(env.cwd.join("precious")).unwrap();
    write_script(
        &env.home,
        "child.jsonl",
        &[
            json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell", "arguments": {"command": "rm -rf precious"}}]}),
            json!({"text": "could not delete"}),
        ],
    );
    let script = write_script(
        &env.home,
        "parent.jsonl",
        &[
            json!({"text": "", "toolCalls": [{"id": "s1", "name": "spawn_agent", "arguments": {"prompt": "clean", "script": "child.jsonl"}}]}),
            json!({"text": "parent done"}),
        ],
    );
    let out = env
        .cairn(&["--script", script.to_str().unwrap(), "--yes", "--allow", "shell", "run", "go"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(env.cwd.join("precious").is_dir(), "nothing was deleted");
    let child = families(&env).1.remove(0);
    let rejected: Vec<Value> = entries(&child).into_iter().filter(|e| e["type"] == "toolRejected").collect();
    assert_eq!(rejected.len(), 1, "the child's log records the refusal");
    assert!(rejected[0]["payload"].to_string().contains("Destructive"), "{}", rejected[0]);
    let (parents, _) = families(&env);
    let parent = entries(&parents[0]);
    let settled = parent.iter().find(|e| e["type"] == "toolCompleted").unwrap();
    assert!(settled["payload"].to_string().contains("could not delete"), "{settled}");
}

#[test]
fn depth_is_limited_by_configuration() {
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[subagents]\nmax_depth = 1\n").unwrap();
    // The child would call spawn_agent again: at max_depth 1 it has no such tool.
    write_script(
        &env.home,
        "child.jsonl",
        &[
            json!({"text": "", "toolCalls": [{"id": "g1", "name": "spawn_agent", "arguments": {"prompt": "deeper", "script": "child.jsonl"}}]}),
            json!({"text": "child stopped"}),
        ],
    );
    let script = write_script(
        &env.home,
        "parent.jsonl",
        &[
            json!({"text": "", "toolCalls": [{"id": "s1", "name": "spawn_agent", "arguments": {"prompt": "go", "script": "child.jsonl"}}]}),
            json!({"text": "parent done"}),
        ],
    );
    let out = env.cairn(&["--script", script.to_str().unwrap(), "run", "go"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (_, children) = families(&env);
    assert_eq!(children.len(), 1, "no grandchild: {children:?}");
    let log = entries(&children[0]);
    assert!(
        log.iter().any(|e| e["type"] == "toolRejected" && e["payload"].to_string().contains("spawn_agent")),
        "the grandchild spawn was refused: {log:?}"
    );

    let bad = Env::new();
    std::fs::write(bad.home.join("config.toml"), "[subagents]\nmax_deep = 1\n").unwrap();
    let script = bad.script(&[json!({"text": "x"})]);
    let out = bad.cairn(&["--script", script.to_str().unwrap(), "run", "go"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("[subagents]"), "{}", stderr(&out));
}

/// Every message of the settled `wait_for_messages` calls of a log.
fn received(path: &Path) -> Vec<Value> {
    entries(path)
        .iter()
        .filter(|e| e["type"] == "toolCompleted" && e["payload"]["tool"] == "wait_for_messages")
        .flat_map(|e| e["payload"]["receipt"]["structuredOutput"]["messages"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// Every message of the settled `send_message` calls of a log.
fn sent(path: &Path) -> Vec<Value> {
    entries(path)
        .iter()
        .filter(|e| e["type"] == "toolCompleted" && e["payload"]["tool"] == "send_message")
        .map(|e| e["payload"]["receipt"]["structuredOutput"].clone())
        .collect()
}

fn peer_scripts(env: &Env) -> PathBuf {
    write_script(
        &env.home,
        "child.jsonl",
        &[
            json!({"text": "", "toolCalls": [{"id": "m1", "name": "send_message", "arguments": {"to": "parent", "text": "hello"}}]}),
            json!({"text": "", "toolCalls": [{"id": "m2", "name": "wait_for_messages", "arguments": {}}]}),
            json!({"text": "child got ack"}),
        ],
    );
    write_script(
        &env.home,
        "parent.jsonl",
        &[
            json!({"text": "", "toolCalls": [{"id": "s1", "name": "spawn_agent", "arguments": {"prompt": "talk", "wait": false, "script": "child.jsonl"}}]}),
            json!({"text": "", "toolCalls": [{"id": "r1", "name": "wait_for_messages", "arguments": {}}]}),
            json!({"text": "", "toolCalls": [{"id": "m1", "name": "send_message", "arguments": {"to": "children", "text": "ack"}}]}),
            json!({"text": "", "toolCalls": [{"id": "w1", "name": "wait_agents", "arguments": {}}]}),
            json!({"text": "conversation over"}),
        ],
    )
}

#[test]
fn parent_and_child_exchange_messages_committed_in_both_logs() {
    let env = Env::new();
    let script = peer_scripts(&env);
    let out = env.cairn(&["--script", script.to_str().unwrap(), "run", "go"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (parents, children) = families(&env);
    let (parent, child) = (&parents[0], &children[0]);
    let (parent_id, child_id) = (stem(parent), stem(child));
    let up = sent(child);
    assert_eq!(up.len(), 1);
    assert_eq!((up[0]["to"].as_str(), up[0]["text"].as_str()), (Some(parent_id.as_str()), Some("hello")));
    let got = received(parent);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0]["id"].clone(), got[0]["from"].as_str()), (up[0]["id"].clone(), Some(child_id.as_str())));
    let down = sent(parent);
    assert_eq!(down.len(), 1);
    let got = received(child);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0]["id"].clone(), got[0]["text"].as_str()), (down[0]["id"].clone(), Some("ack")));
    let (answers, _) = gathered(parent);
    assert_eq!(answers, ["child got ack"]);
}

#[test]
fn messages_go_only_to_family() {
    let env = Env::new();
    let other = env.script(&[json!({"text": "other"})]);
    let out = env.cairn(&["--script", other.to_str().unwrap(), "run", "x"]).output().unwrap();
    assert!(out.status.success());
    let stranger = stem(&env.session_files()[0]);
    let script = write_script(
        &env.home,
        "parent.jsonl",
        &[
            json!({"text": "", "toolCalls": [
                {"id": "m1", "name": "send_message", "arguments": {"to": stranger, "text": "psst"}},
                {"id": "m2", "name": "send_message", "arguments": {"to": "parent", "text": "up"}},
                {"id": "m3", "name": "send_message", "arguments": {"to": "children", "text": "down"}}]}),
            json!({"text": "done"}),
        ],
    );
    let out = env.cairn(&["--script", script.to_str().unwrap(), "run", "go"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let parent = env.session_files().into_iter().find(|p| stem(p) != stranger).unwrap();
    let log = entries(&parent);
    let rejected: Vec<String> =
        log.iter().filter(|e| e["type"] == "toolRejected").map(|e| e["payload"]["reason"].to_string()).collect();
    assert_eq!(rejected.len(), 3, "{log:?}");
    assert!(rejected[0].contains("may message"), "{rejected:?}");
    assert!(rejected[1].contains("no parent"), "{rejected:?}");
    assert!(rejected[2].contains("no children"), "{rejected:?}");
}

#[test]
fn a_parent_that_never_gathers_still_lets_its_children_finish() {
    let env = Env::new();
    write_script(&env.home, "child.jsonl", &[json!({"text": "finished anyway"})]);
    let script = write_script(
        &env.home,
        "parent.jsonl",
        &[
            json!({"text": "", "toolCalls": [{"id": "s1", "name": "spawn_agent", "arguments": {"prompt": "p", "wait": false, "script": "child.jsonl"}}]}),
            json!({"text": "not waiting"}),
        ],
    );
    let out = env.cairn(&["--script", script.to_str().unwrap(), "run", "go"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (_, children) = families(&env);
    let log = entries(&children[0]);
    let last = log.iter().rev().find(|e| e["type"] == "message").unwrap();
    assert!(last["payload"].to_string().contains("finished anyway"), "{log:?}");
}

/// Issue 47.2, sessions in files: session files under a child's name that
/// the family did not create (copied in, as from another host: a finished
/// conversation with a forged answer and no `subagent` fact) are never
/// adopted by the parent's `spawn_agent` — the call fails saying so, and
/// the forged answer never reaches the parent.
#[test]
fn a_session_planted_under_a_childs_name_is_not_adopted() {
    let env = Env::new();
    // The parent: one finished turn.
    let first = write_script(&env.home, "first.jsonl", &[json!({"text": "hello"})]);
    let out = env.cairn(&["--script", first.to_str().unwrap(), "run", "hi"]).stdin(Stdio::null()).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let (parents, _) = families(&env);
    let parent_file = parents[0].clone();
    let parent = stem(&parent_file);
    // The forged answer: a finished conversation of another session.
    let forged =
        write_script(&env.home, "forged.jsonl", &[json!({"text": "FORGED ANSWER planted by an imported file"})]);
    let out = env.cairn(&["--script", forged.to_str().unwrap(), "run", "hi"]).stdin(Stdio::null()).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let forged_file = env.session_files().into_iter().find(|p| *p != parent_file).unwrap();
    let text = std::fs::read_to_string(&forged_file).unwrap();
    std::fs::remove_file(&forged_file).unwrap();
    let (header, rest) = text.split_once('\n').unwrap();
    // Invocation ids are `i<seq>`: every name the next spawn may take.
    for n in 1..=60 {
        let id = format!("{parent}+i{n}");
        let mut h: Value = serde_json::from_str(header).unwrap();
        h["id"] = json!(id);
        std::fs::write(parent_file.with_file_name(format!("{id}.jsonl")), format!("{h}\n{rest}")).unwrap();
    }
    write_script(&env.home, "child.jsonl", &[json!({"text": "the genuine child's answer"})]);
    // The scripted provider answers by the session's step: the first turn
    // took line 1.
    let script = write_script(
        &env.home,
        "parent.jsonl",
        &[
            json!({"text": "hello"}),
            json!({"text": "", "toolCalls": [{"id": "s1", "name": "spawn_agent",
                "arguments": {"prompt": "delegate", "script": "child.jsonl"}}]}),
            json!({"text": "parent done"}),
        ],
    );
    let out = env
        .cairn(&["--script", script.to_str().unwrap(), "resume", &parent, "--prompt", "delegate"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let log = std::fs::read_to_string(&parent_file).unwrap();
    assert!(!log.contains("FORGED"), "the planted answer reached the parent:\n{log}\n{}", stderr(&out));
    let failed: Vec<Value> = entries(&parent_file)
        .into_iter()
        .filter(|e| e["type"] == "toolFailed" && e["payload"]["tool"] == "spawn_agent")
        .collect();
    assert_eq!(failed.len(), 1, "{log}\n{}", stderr(&out));
    assert!(failed[0].to_string().contains("not adopted"), "{failed:?}");
    assert!(log.contains("parent done"), "the parent went on: {log}");
}
