//! Crash test of a session family through the real `cairn` binary: a parent
//! fans out five children (`spawn_agent`, `wait: false`) and gathers them
//! (`wait_agents`); the parent process is SIGKILLed at random moments (at
//! least 50 kills over the rounds, up to three per family, while it or its
//! children run), then `cairn resume --last` finishes it. Checked from the
//! files: each child was created once and ran its turn once, its tool ran
//! at most once (each child's `shell` call appends a line to its own log),
//! every spawn and the gathering were settled once, and the parent's
//! gathering holds all five answers.

#![allow(clippy::unwrap_used)]

use crate::util;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use util::Env;

const CHILDREN: usize = 5;
const MIN_KILLS: usize = 50;
const MAX_ROUNDS: usize = 400;

fn entries(path: &Path) -> Vec<Value> {
    entries_of(path, false)
}

/// The entries of `path`; with `torn_tail_ok`, an unparsable final line is
/// dropped (a process killed mid-write leaves one, and cairn discards it
/// when it reopens the file), never a line before it.
fn entries_of(path: &Path, torn_tail_ok: bool) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().skip(1).collect();
    for (i, line) in lines.iter().enumerate() {
        if torn_tail_ok && i + 1 == lines.len() && serde_json::from_str::<Value>(line).is_err() {
            break;
        }
        // Without `torn_tail_ok`, every file checked was reopened for
        // writing or finished cleanly: a torn line is a failure.
        let value: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{}: {e}: {line}", path.display()));
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

fn scripts(env: &Env) -> PathBuf {
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    let calls: Vec<Value> = (1..=CHILDREN)
        .map(|i| {
            json!({"id": format!("s{i}"), "name": "spawn_agent", "arguments": {
                "prompt": format!("task {i}"), "wait": false, "script": format!("child{i}.jsonl")}})
        })
        .collect();
    for i in 1..=CHILDREN {
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
    write_script(
        &env.home,
        "parent.jsonl",
        &[
            json!({"text": "", "toolCalls": calls}),
            json!({"text": "", "toolCalls": [{"id": "w1", "name": "wait_agents", "arguments": {}}]}),
            json!({"text": "all children answered"}),
        ],
    )
}

/// xorshift64*, seeded from the clock (the seed is printed to reproduce).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn stem(path: &Path) -> String {
    path.file_stem().unwrap().to_str().unwrap().to_owned()
}

fn settled(log: &[Value], tool: &str) -> Vec<Value> {
    log.iter()
        .filter(|e| {
            ["toolCompleted", "toolFailed", "toolRejected"].contains(&e["type"].as_str().unwrap())
                && e["payload"]["tool"] == tool
        })
        .cloned()
        .collect()
}

/// What a person would run next: `run` when the killed run left no
/// session, `resume --last --prompt` when it left one without its prompt
/// (killed before the first commit), else `resume --last`.
fn next_command<'a>(env: &Env, script: &'a str) -> Vec<&'a str> {
    let parents: Vec<PathBuf> = env.session_files().into_iter().filter(|p| !stem(p).contains('+')).collect();
    match parents.first() {
        None => vec!["--script", script, "--yes", "run", "fan out"],
        // Right after a SIGKILL: the file may end in a torn line.
        Some(parent) if entries_of(parent, true).is_empty() => {
            vec!["--script", script, "--yes", "resume", "--last", "--prompt", "fan out"]
        }
        Some(_) => vec!["--script", script, "--yes", "resume", "--last"],
    }
}

#[test]
fn sigkill_of_a_parent_never_runs_a_child_twice_nor_loses_an_answer() {
    let seed = std::env::var("KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64 | 1);
    println!("KILL_SEED={seed}");
    let mut rng = Rng(seed);
    let mut kills = 0;
    let mut rounds = 0;
    let mut tool_runs = 0;
    let mut busy_retries = 0;
    while kills < MIN_KILLS {
        assert!(rounds < MAX_ROUNDS, "only {kills} kills landed in {rounds} rounds");
        rounds += 1;
        let env = Env::new();
        let script = scripts(&env);
        let s = script.to_str().unwrap();
        for _ in 0..3 {
            let mut child = env
                .cairn(&next_command(&env, s))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_millis(rng.next() % 150));
            if child.try_wait().unwrap().is_some() {
                break; // finished before the kill
            }
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
            kills += 1;
        }
        // A process forked by the killed one between its fork and its exec
        // (or PR_SET_PDEATHSIG) may hold the writer lock a moment longer;
        // `cairn resume` then says the session is busy, and a person retries.
        let mut busy = 0;
        let out = loop {
            let out = env.cairn(&next_command(&env, s)).stdin(Stdio::null()).output().unwrap();
            if busy < 100 && String::from_utf8_lossy(&out.stderr).contains("session is busy") {
                busy += 1;
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            break out;
        };
        busy_retries += busy;
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "seed {seed} round {rounds}: resume failed: {err}");

        let files = env.session_files();
        let (parents, children): (Vec<PathBuf>, Vec<PathBuf>) =
            files.iter().cloned().partition(|p| !stem(p).contains('+'));
        assert_eq!(parents.len(), 1, "seed {seed}: {files:?}");
        let parent = entries(&parents[0]);
        let last = parent.iter().rev().find(|e| e["type"] == "message").unwrap();
        assert!(
            last["payload"].to_string().contains("all children answered"),
            "seed {seed}: the parent finished: {last}"
        );
        let spawns = settled(&parent, "spawn_agent");
        assert_eq!(spawns.len(), CHILDREN, "seed {seed}: each spawn settled once");
        let gathered = settled(&parent, "wait_agents");
        assert_eq!(gathered.len(), 1, "seed {seed}: the gathering settled once");
        let answers: Vec<&str> = gathered[0]["payload"]["receipt"]["structuredOutput"]["children"]
            .as_array()
            .unwrap_or_else(|| panic!("seed {seed}: {}", gathered[0]))
            .iter()
            .map(|c| c["answer"].as_str().unwrap())
            .collect();
        let expected: Vec<String> = (1..=CHILDREN).map(|i| format!("answer {i}")).collect();
        assert_eq!(answers, expected, "seed {seed}: no answer lost or doubled");

        assert_eq!(children.len(), CHILDREN, "seed {seed}: each child created once: {children:?}");
        for child in &children {
            let log = entries(child);
            let users = log.iter().filter(|e| e["type"] == "message" && e["payload"]["role"] == "user").count();
            assert_eq!(users, 1, "seed {seed}: {} ran one turn", stem(child));
            let started = log.iter().filter(|e| e["type"] == "toolStarted").count();
            assert!(started <= 1, "seed {seed}: {} started its tool {started} times", stem(child));
            assert_eq!(settled(&log, "shell").len(), 1, "seed {seed}: {} settled its tool once", stem(child));
            let check = env.cairn(&["--json", "check", child.to_str().unwrap()]).output().unwrap();
            assert!(String::from_utf8_lossy(&check.stdout).contains("\"ok\":true"), "seed {seed}: {}", stem(child));
        }
        for i in 1..=CHILDREN {
            let lines = std::fs::read_to_string(env.cwd.join(format!("child-{i}.log"))).unwrap_or_default();
            assert!(
                lines.is_empty() || lines == "ran\n",
                "seed {seed}: child {i}'s tool ran more than once: {lines:?}"
            );
            tool_runs += lines.lines().count();
        }
    }
    println!("{kills} kills over {rounds} rounds; {tool_runs} child tool runs recorded; {busy_retries} busy retries");
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
            json!({"text": "all children answered"}),
        ],
    )
}

fn messages(log: &[Value], tool: &str, key: &str) -> Vec<Value> {
    settled(log, tool)
        .iter()
        .filter(|e| e["type"] == "toolCompleted")
        .flat_map(|e| {
            let s = &e["payload"]["receipt"]["structuredOutput"];
            if key.is_empty() { vec![s.clone()] } else { s[key].as_array().cloned().unwrap_or_default() }
        })
        .collect()
}

#[test]
fn sigkill_during_a_message_exchange_never_loses_or_doubles_a_message() {
    let seed = std::env::var("KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64 | 1);
    println!("KILL_SEED={seed}");
    let mut rng = Rng(seed);
    let (mut kills, mut rounds) = (0, 0);
    while kills < 30 {
        assert!(rounds < MAX_ROUNDS, "only {kills} kills landed in {rounds} rounds");
        rounds += 1;
        let env = Env::new();
        let script = peer_scripts(&env);
        let s = script.to_str().unwrap();
        for _ in 0..3 {
            let mut child = env
                .cairn(&next_command(&env, s))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_millis(rng.next() % 150));
            if child.try_wait().unwrap().is_some() {
                break;
            }
            child.kill().unwrap();
            child.wait().unwrap();
            kills += 1;
        }
        let mut busy = 0;
        let out = loop {
            let out = env.cairn(&next_command(&env, s)).stdin(Stdio::null()).output().unwrap();
            if busy < 100 && String::from_utf8_lossy(&out.stderr).contains("session is busy") {
                busy += 1;
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            break out;
        };
        assert!(out.status.success(), "seed {seed}: {}", String::from_utf8_lossy(&out.stderr));
        let files = env.session_files();
        let (parents, children): (Vec<PathBuf>, Vec<PathBuf>) =
            files.iter().cloned().partition(|p| !stem(p).contains('+'));
        assert_eq!((parents.len(), children.len()), (1, 1), "seed {seed}: {files:?}");
        let (parent, child) = (entries(&parents[0]), entries(&children[0]));
        let up = messages(&child, "send_message", "");
        let down = messages(&parent, "send_message", "");
        assert_eq!((up.len(), down.len()), (1, 1), "seed {seed}: each message sent once");
        let got_up = messages(&parent, "wait_for_messages", "messages");
        let got_down = messages(&child, "wait_for_messages", "messages");
        assert_eq!(got_up.len(), 1, "seed {seed}: the parent received hello once: {got_up:?}");
        assert_eq!(got_down.len(), 1, "seed {seed}: the child received ack once: {got_down:?}");
        assert_eq!(got_up[0]["id"], up[0]["id"], "seed {seed}");
        assert_eq!(got_down[0]["id"], down[0]["id"], "seed {seed}");
        let gathered = settled(&parent, "wait_agents");
        assert_eq!(gathered.len(), 1, "seed {seed}");
        assert!(gathered[0].to_string().contains("child got ack"), "seed {seed}: {}", gathered[0]);
    }
    println!("{kills} kills over {rounds} rounds");
}
