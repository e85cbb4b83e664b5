//! The same scripted session through every face that runs one — `cairn
//! run` with no terminal, a 9P session of `cairn serve`, a 9P batch job
//! (`cairn batch`), an editor's session over ACP (`cairn acp`), a
//! PostgreSQL worker — must leave the same entries in its session file
//! (ids and timestamps aside): an allowlisted Write call approved by the
//! same rule, a Destructive call refused (by the headless policy where
//! nobody can be asked; by the person, asked, in 9P and ACP), the same
//! answer. Every face is equipped in one place (`equip.rs`) and the
//! approval rule lives in core's gate and policy, so a face that decided
//! anything itself would show here (issue 26).
//!
//! A second session spawns a child (`spawn_agent`) whose Write call is
//! covered by the parent's allow rule: every face that offers the family
//! hands the child the parent's provider and authority, and leaves the
//! same parent and child files. (A PostgreSQL worker offers no family: a
//! child's file would live on one worker's disk; `a_worker_offers_no_family`
//! checks it says so rather than running a child another worker could not
//! find.) MCP has no model, so its tool calls are compared in `faces.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
#[cfg(feature = "postgres")]
use util::entries_of_text;
use util::{Env, entries};

/// Wait until `f` holds (a minute at most: a face that never gets there
/// fails the test, saying what it waited for).
fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running `cairn serve` on TCP loopback, killed when dropped.
struct Served {
    child: std::process::Child,
    conn: cairn_9p::client::Conn,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `cairn serve`, a connection, and a session of `spec` (after `cwd=`)
/// prompted with `prompt`; returns the server and the session's id.
fn served_session(env: &Env, spec: &str, prompt: &str) -> (Served, String) {
    let mut child = env.cairn(&["serve", "--listen", "tcp!127.0.0.1!0"]).stdout(Stdio::piped()).spawn().unwrap();
    let mut address = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut address).unwrap();
    let dial = cairn_9p::Dial::parse(address.trim()).unwrap();
    let conn = cairn_9p::client::Conn::dial(&dial).unwrap();
    let mut served = Served { child, conn };
    let id = served.conn.create_session(&format!("cwd={} {spec}", env.cwd.display())).unwrap();
    served.conn.write_file(&format!("s/{id}/prompt"), prompt.as_bytes()).unwrap();
    (served, id)
}

/// Wait until the served session `id` has answered `answer` and is idle,
/// answering each question in its `approvals/` with `verdict`.
fn settle_served(served: &mut Served, id: &str, answer: &str, verdict: &[u8]) {
    let approvals = format!("s/{id}/approvals");
    wait_for(answer, || {
        for pending in served.conn.list(&approvals).unwrap() {
            let _ = served.conn.write_file(&format!("{approvals}/{}", pending.name), verdict);
        }
        let chat = served.conn.read_text(&format!("s/{id}/chat")).unwrap();
        let state = served.conn.read_text(&format!("s/{id}/state")).unwrap();
        chat.contains(&format!("assistant: {answer}")) && state.trim() == "idle"
    });
}

/// An editor speaking ACP to `cairn acp ARGS` over its stdio: plain
/// JSON-RPC, every permission question answered with `option`.
struct Editor {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    option: &'static str,
}

impl Editor {
    fn start(env: &Env, args: &[&str], option: &'static str) -> Self {
        let mut child = env.cairn(args).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut editor = Self { child, stdin, lines, option };
        editor.call(1, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}));
        editor
    }

    /// Send a request; answer the agent's questions until its answer.
    fn call(&mut self, id: i64, method: &str, params: Value) -> Value {
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(self.stdin, "{line}").unwrap();
        loop {
            let text = self.lines.next().expect("the agent answers").unwrap();
            let message: Value = serde_json::from_str(&text).unwrap();
            if message["method"] == "session/request_permission" {
                let answer = json!({"jsonrpc": "2.0", "id": message["id"],
                    "result": {"outcome": {"outcome": "selected", "optionId": self.option}}});
                writeln!(self.stdin, "{answer}").unwrap();
            } else if message["id"] == id && message.get("method").is_none() {
                assert!(message.get("error").is_none(), "{method}: {message}");
                return message["result"].clone();
            }
        }
    }

    /// A new session in `env.cwd` prompted with `prompt`; its id.
    fn session(&mut self, env: &Env, prompt: &str) -> String {
        let session = self.call(2, "session/new", json!({"cwd": env.cwd.to_str().unwrap(), "mcpServers": []}));
        let id = session["sessionId"].as_str().unwrap().to_owned();
        let params = json!({"sessionId": id, "prompt": [{"type": "text", "text": prompt}]});
        assert_eq!(self.call(3, "session/prompt", params)["stopReason"], "end_turn");
        id
    }
}

impl Drop for Editor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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

/// A 9P session: the Destructive call is asked in its `approvals/` and
/// denied there.
fn served(env: &Env) -> Vec<Value> {
    let s = script(env);
    let (mut served, id) =
        served_session(env, &format!("provider=scripted script={} allow=write_file", s.display()), "go");
    settle_served(&mut served, &id, "all done", b"n");
    drop(served);
    entries(&env.home.join("sessions").join(format!("{id}.jsonl")))
}

/// An editor's session: the Destructive call is asked of the editor,
/// which rejects it.
fn editor(env: &Env) -> Vec<Value> {
    let s = script(env);
    let args = ["--provider", "scripted", "--script", s.to_str().unwrap(), "--allow", "write_file", "acp"];
    let mut editor = Editor::start(env, &args, "reject-once");
    let id = editor.session(env, "go");
    drop(editor);
    entries(&env.home.join("sessions").join(format!("{id}.jsonl")))
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

/// A face: its name, how to run the script through it, and who refuses
/// the Destructive call there.
type Face = (&'static str, fn(&Env) -> Vec<Value>, &'static str);

#[test]
fn every_face_records_the_same_session() {
    #[cfg_attr(not(feature = "postgres"), allow(unused_mut))]
    let mut faces: Vec<Face> = vec![
        ("cairn run", cli, "policy:headless"),
        ("9P session", served, "user:9p"),
        ("9P batch", batch, "policy:headless"),
        ("ACP", editor, "user:acp"),
    ];
    #[cfg(feature = "postgres")]
    faces.push(("PostgreSQL worker", worker, "policy:headless"));
    let mut reference: Option<(&str, Vec<Value>)> = None;
    for (face, run, refuser) in faces {
        let env = Env::new();
        setup(&env);
        let mut got = summary(&run(&env));
        eprintln!("{face}: {} entries", got.len());
        check_effects(&env, face);
        // The rule's own words, not only agreement: the Write by the allow
        // rule, its change set (kept for undo) applied by the staged-write
        // policy, the Destructive call refused by the headless policy or
        // by the person it was asked of.
        let by: Vec<&str> = got.iter().filter_map(|e| e["by"].as_str()).collect();
        assert_eq!(by, ["allowlist:write_file", "policy:stagedWrite", refuser], "{face}: {got:#?}");
        let refused = got.iter().find(|e| e["type"] == "toolRejected").unwrap_or_else(|| panic!("{face}: {got:#?}"));
        assert_eq!(refused["tool"], "shell", "{face}");
        if refuser == "policy:headless" {
            assert!(refused["reason"].as_str().unwrap_or_default().contains("Destructive"), "{face}: {refused}");
        }
        // Who refused, and in whose words, is the face's; everything else
        // must be the same entry by entry.
        for e in &mut got {
            if e["by"] == refuser || e["type"] == "toolRejected" {
                e["by"] = json!("(the refuser)");
                e["reason"] = json!("(the refusal)");
            }
        }
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

fn family_served(env: &Env) {
    let s = family_script(env);
    let (mut served, id) =
        served_session(env, &format!("provider=scripted script={} allow=write_file", s.display()), "go");
    settle_served(&mut served, &id, "parent done", b"n");
}

fn family_editor(env: &Env) {
    let s = family_script(env);
    let args = ["--provider", "scripted", "--script", s.to_str().unwrap(), "--allow", "write_file", "acp"];
    let mut editor = Editor::start(env, &args, "reject-once");
    editor.session(env, "go");
}

/// A face: its name and how to run the family script through it.
type FamilyFace = (&'static str, fn(&Env));

#[test]
fn every_face_runs_a_subagent_the_same_way() {
    let faces: Vec<FamilyFace> = vec![
        ("cairn run", family_cli),
        ("9P session", family_served),
        ("9P batch", family_batch),
        ("ACP", family_editor),
    ];
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

/// A PostgreSQL worker offers no subagent family (a child's file would
/// live on this worker's disk, where another worker resuming the parent
/// could not find it): a `spawn_agent` call is refused as an unknown tool,
/// no child session exists, and the parent still answers.
#[cfg(feature = "postgres")]
#[test]
fn a_worker_offers_no_family() {
    let cluster = cairn_pg::test_cluster::TestCluster::start()
        .unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e:#}"));
    let url = cluster.url();
    let env = Env::new();
    setup(&env);
    let s = family_script(&env);
    let out = env.cairn(&["--database", url, "submit", "go"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let mut worker = env
        .cairn(&["--database", url, "--script", s.to_str().unwrap(), "--allow", "write_file", "worker", "--lease", "5"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut exported = String::new();
    wait_for("the parent's answer", || {
        let out = env.cairn(&["--database", url, "export", &id]).output().unwrap();
        exported = String::from_utf8_lossy(&out.stdout).into_owned();
        exported.contains("parent done")
    });
    let _ = worker.kill();
    let _ = worker.wait();
    let got = summary(&entries_of_text(&exported));
    let refused = got
        .iter()
        .find(|e| e["tool"] == "spawn_agent" && e["type"] == "toolRejected")
        .unwrap_or_else(|| panic!("{got:#?}"));
    assert!(refused["reason"].as_str().unwrap_or_default().contains("unknown tool"), "{refused}");
    let listed = env.cairn(&["--database", url, "--json", "sessions"]).output().unwrap();
    let rows = String::from_utf8_lossy(&listed.stdout).lines().count();
    assert_eq!(rows, 1, "no child session: {}", String::from_utf8_lossy(&listed.stdout));
    assert!(!env.cwd.join("note.txt").exists(), "no child ran");
    assert!(env.session_files().is_empty(), "no session file on the worker's disk");
}
