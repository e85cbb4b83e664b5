//! One scripted session through every face that runs one — `cairn run`
//! with no terminal, a 9P session of `cairn serve`, a 9P batch job (`cairn
//! batch`), an editor's session over ACP (`cairn acp`), a PostgreSQL worker
//! — must leave the same entries (ids and timestamps aside), in the
//! session and in its child: a Write call approved by the same allow rule,
//! a Destructive call refused (by the headless policy where nobody can be
//! asked; by the person, asked, in 9P and ACP), a subagent spawned
//! (`spawn_agent`) whose own Write call is covered by the parent's allow
//! rule and whose answer is gathered, and a tool that discovery chose for
//! the prompt among more than it offers at once, called. MCP has no model:
//! a client makes the same four tool calls through `cairn mcp`, and its
//! session's tool entries (who decided what, how each call settled) and its
//! child's entries must be the same. Every face is equipped in one place
//! (`equip.rs`), runs its turns through one (`cairn_host::Equipment`), and
//! the approval rule lives in core's gate and policy, so a face that
//! decided anything itself would show here (issue 26).
//!
//! The worker's child is a session of the same database (never a file on
//! the worker's disk), committed within the parent's lease.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::util;

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use util::{Env, entries_of_text};

/// The prompt, the same in every face: discovery ranks the installed tools
/// for it.
const PROMPT: &str = "compute the sha-256 checksum of a file";

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

/// The tools discovery chooses among: more than it offers at once
/// (`[discovery] max_tools`, 5), each a ReadOnly executable that prints
/// its name. With no embedding model here, discovery ranks them by BM25.
fn install_tools(env: &Env) {
    use std::os::unix::fs::PermissionsExt;
    let text = include_str!("../../cairn-discovery/eval/tools.tsv");
    let dir = env.home.join("tools");
    std::fs::create_dir_all(&dir).unwrap();
    for line in text.lines().filter(|l| !l.starts_with('#')).take(20) {
        let (name, desc) = line.split_once('\t').unwrap();
        std::fs::write(
            dir.join(format!("{name}.toml")),
            format!(
                "description = {desc:?}\nrisk = \"readOnly\"\ncapabilities = []\nreplay = \"idempotent\"\n\
                 [parameters]\ntype = \"object\"\n"
            ),
        )
        .unwrap();
        let exe = dir.join(name);
        std::fs::write(&exe, format!("#!/bin/sh\necho ran {name}\n")).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

fn setup(env: &Env) {
    // Unstaged, so the Destructive line is judged by its words everywhere.
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    std::fs::create_dir_all(env.cwd.join("precious")).unwrap();
    install_tools(env);
}

/// The four calls, as the model asks for them and as an MCP client makes
/// them: a Write call (allowlisted), a Destructive call, a child spawned
/// (its own script, absolute so every face resolves it alike) and
/// waited for, the discovered tool.
fn calls(env: &Env) -> Vec<Value> {
    let child = env.home.join("child.jsonl");
    let lines = [
        json!({"text": "", "toolCalls": [
            {"id": "k1", "name": "write_file", "arguments": {"path": "note.txt", "content": "from the child\n"}}
        ]}),
        json!({"text": "child done", "toolCalls": []}),
    ];
    std::fs::write(&child, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    vec![
        json!({"id": "c1", "name": "write_file", "arguments": {"path": "out.txt", "content": "hi\n"}}),
        json!({"id": "c2", "name": "shell", "arguments": {"command": "rm -rf precious"}}),
        json!({"id": "c3", "name": "spawn_agent", "arguments": {"prompt": "write the note", "script": child.to_str().unwrap()}}),
        json!({"id": "c4", "name": "fs_checksum", "arguments": {}}),
    ]
}

/// The parent's script: the four calls in one message, then an answer.
fn script(env: &Env) -> std::path::PathBuf {
    env.script(&[json!({"text": "", "toolCalls": calls(env)}), json!({"text": "all done", "toolCalls": []})])
}

/// A face's session and its child, as session files (the database's
/// exported).
type Family = (String, String);

/// The session file and its child's in the sessions directory.
fn on_disk(env: &Env) -> Family {
    let files = env.session_files();
    let (children, parents): (Vec<_>, Vec<_>) =
        files.iter().partition(|p| p.file_stem().unwrap().to_str().unwrap().contains('+'));
    assert_eq!((parents.len(), children.len()), (1, 1), "one session and its child: {files:?}");
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap();
    (read(parents[0]), read(children[0]))
}

/// The value of the session's `fact` register `key`, as last set.
fn fact(text: &str, key: &str) -> Option<Value> {
    let mut found = None;
    for line in text.lines().skip(1) {
        let records = match serde_json::from_str::<Value>(line).unwrap() {
            Value::Array(items) => items,
            one => vec![one],
        };
        for r in records {
            if r["kind"] == "register" && r["namespace"] == "fact" && r["key"] == key {
                found = Some(r["value"].clone());
            }
        }
    }
    found
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

/// The tool entries of a summary: what an MCP client's calls leave.
fn tool_calls(summary: &[Value]) -> Vec<Value> {
    summary.iter().filter(|e| e["type"].as_str().is_some_and(|t| t.starts_with("tool"))).cloned().collect()
}

fn check_effects(env: &Env, face: &str) {
    assert_eq!(std::fs::read_to_string(env.cwd.join("out.txt")).unwrap(), "hi\n", "{face}: the Write ran");
    assert!(env.cwd.join("precious").exists(), "{face}: the Destructive call never ran");
    assert_eq!(
        std::fs::read_to_string(env.cwd.join("note.txt")).unwrap(),
        "from the child\n",
        "{face}: the child's Write ran"
    );
}

fn cli(env: &Env) -> Family {
    let s = script(env);
    let out = env
        .cairn(&["--script", s.to_str().unwrap(), "--allow", "write_file", "run", PROMPT])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    // Exit 4 (denied): the Destructive call was refused.
    assert_eq!(out.status.code(), Some(4), "{}", String::from_utf8_lossy(&out.stderr));
    on_disk(env)
}

fn batch(env: &Env) -> Family {
    let s = script(env);
    let spec = format!(
        "cwd={}\nprovider=scripted\nscript={}\nallow=write_file\n---\n{PROMPT}\n",
        env.cwd.display(),
        s.display()
    );
    std::fs::write(env.home.join("job.spec"), spec).unwrap();
    let out = env.cairn(&["batch", env.home.join("job.spec").to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    on_disk(env)
}

/// A 9P session: the Destructive call is asked in its `approvals/` and
/// denied there.
fn served(env: &Env) -> Family {
    let s = script(env);
    let (mut served, id) =
        served_session(env, &format!("provider=scripted script={} allow=write_file", s.display()), PROMPT);
    settle_served(&mut served, &id, "all done", b"n");
    drop(served);
    on_disk(env)
}

/// An editor's session: the Destructive call is asked of the editor,
/// which rejects it.
fn editor(env: &Env) -> Family {
    let s = script(env);
    let args = ["--provider", "scripted", "--script", s.to_str().unwrap(), "--allow", "write_file", "acp"];
    let mut editor = Editor::start(env, &args, "reject-once");
    editor.session(env, PROMPT);
    drop(editor);
    on_disk(env)
}

/// A session submitted to a PostgreSQL database and driven by a worker:
/// its child is a session of the same database, written within the
/// parent's lease, and nothing is left on the worker's disk.
#[cfg(feature = "postgres")]
fn worker(env: &Env) -> Family {
    let cluster = cairn_pg::test_cluster::TestCluster::start()
        .unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e:#}"));
    let url = cluster.url();
    let s = script(env);
    let out = env.cairn(&["--database", url, "submit", PROMPT]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let mut worker = env
        .cairn(&["--database", url, "--script", s.to_str().unwrap(), "--allow", "write_file", "worker", "--lease", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let rows = || -> Vec<Value> {
        let out = env.cairn(&["--database", url, "--json", "sessions"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let export = |id: &str| -> String {
        let out = env.cairn(&["--database", url, "export", id]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    wait_for("the worker's answer", || {
        let idle = rows().iter().any(|r| r["id"] == id.as_str() && r["state"] == "idle");
        idle && export(&id).contains("all done")
    });
    let _ = worker.kill();
    let _ = worker.wait();
    let rows = rows();
    let children: Vec<&Value> = rows.iter().filter(|r| r["parent"] == id.as_str()).collect();
    assert_eq!((rows.len(), children.len()), (2, 1), "the session and its child, in the database: {rows:#?}");
    let child = children[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(children[0]["state"], "idle", "the child's turn ended: {rows:#?}");
    assert!(env.session_files().is_empty(), "no session file on the worker's disk");
    // Every line of the child was written within a lease the worker
    // claimed on the parent (its epoch and owner), none under its own.
    let mut client = cairn_pg::connect(url).unwrap();
    let stray = client
        .query(
            "SELECT l.first_seq FROM cairn_lines l WHERE l.session_id = $1 AND NOT EXISTS
                 (SELECT 1 FROM cairn_claims c WHERE c.session_id = $2 AND c.epoch = l.epoch AND c.owner = l.owner)",
            &[&child, &id],
        )
        .unwrap();
    assert!(stray.is_empty(), "child lines written outside the parent's lease: {}", stray.len());
    (export(&id), export(&child))
}

/// An MCP client (plain JSON-RPC over `cairn mcp`'s stdio) making the
/// script's four calls; the Destructive one is refused by the gate (the
/// client names `shell` in an allow rule so that the server offers it).
fn mcp(env: &Env) -> Family {
    let s = script(env);
    let args = [
        "--provider",
        "scripted",
        "--script",
        s.to_str().unwrap(),
        "--allow",
        "write_file",
        "--allow",
        "shell(echo *)",
        "mcp",
    ];
    let mut child = env.cairn(&args).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut call = |id: i64, method: &str, params: Value| -> Value {
        writeln!(stdin, "{}", json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).unwrap();
        loop {
            let message: Value = serde_json::from_str(&lines.next().expect("the server answers").unwrap()).unwrap();
            if message["id"] == id {
                assert!(message.get("error").is_none(), "{method}: {message}");
                return message["result"].clone();
            }
        }
    };
    let init = json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "faces_agree"}});
    call(1, "initialize", init);
    let mut answers = Vec::new();
    for (n, c) in calls(env).into_iter().enumerate() {
        let params = json!({"name": c["name"], "arguments": c["arguments"]});
        answers.push(call(10 + n as i64, "tools/call", params));
    }
    drop(stdin);
    let _ = child.wait();
    assert_eq!(answers[0]["isError"], false, "{answers:#?}");
    assert_eq!(answers[1]["isError"], true, "the Destructive call is refused: {answers:#?}");
    assert_eq!(answers[2]["content"][0]["text"], "child done", "{answers:#?}");
    assert_eq!(answers[3]["content"][0]["text"].as_str().unwrap().trim(), "ran fs_checksum", "{answers:#?}");
    on_disk(env)
}

/// A face: its name, how to run the session through it, and who refuses
/// the Destructive call there.
type Face = (&'static str, fn(&Env) -> Family, &'static str);

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
    faces.push(("MCP", mcp, "policy:headless"));
    let mut reference: Option<(&str, Vec<Value>, Vec<Value>)> = None;
    for (face, run, refuser) in faces {
        let env = Env::new();
        setup(&env);
        let (parent_text, child_text) = run(&env);
        let (mut parent, child) = (summary(&entries_of_text(&parent_text)), summary(&entries_of_text(&child_text)));
        // Discovery chose among the installed tools for the prompt, and its
        // choice (recorded before the turn) holds the tool called. MCP
        // offers every tool: an MCP client chooses its calls itself.
        if face != "MCP" {
            let chosen = fact(&parent_text, "discovery").unwrap_or_else(|| panic!("{face}: no discovery choice"));
            assert_eq!(chosen["filtered"], true, "{face}: {chosen}");
            assert!(chosen.to_string().contains("fs_checksum"), "{face}: {chosen}");
        }
        eprintln!("{face}: parent {} entries, child {}", parent.len(), child.len());
        check_effects(&env, face);
        // The rule's own words, not only agreement: the Write by the allow
        // rule, its change set (kept for undo) applied by the staged-write
        // policy, the Destructive call refused by the headless policy or
        // by the person it was asked of; the child's Write by the parent's
        // rule, and its answer gathered; the discovered tool run.
        let by: Vec<&str> = parent.iter().filter_map(|e| e["by"].as_str()).collect();
        assert_eq!(by[..3], ["allowlist:write_file", "policy:stagedWrite", refuser], "{face}: {parent:#?}");
        let refused =
            parent.iter().find(|e| e["type"] == "toolRejected").unwrap_or_else(|| panic!("{face}: {parent:#?}"));
        assert_eq!(refused["tool"], "shell", "{face}");
        if refuser == "policy:headless" {
            assert!(refused["reason"].as_str().unwrap_or_default().contains("Destructive"), "{face}: {refused}");
        }
        let settled = |tool: &str| {
            parent
                .iter()
                .filter(|e| {
                    e["tool"] == tool
                        && ["toolCompleted", "toolFailed", "toolRejected"].contains(&e["type"].as_str().unwrap())
                })
                .cloned()
                .collect::<Vec<_>>()
        };
        for tool in ["spawn_agent", "fs_checksum"] {
            let once = settled(tool);
            assert_eq!(once.len(), 1, "{face}: {tool} settled once: {parent:#?}");
            assert_eq!(once[0]["type"], "toolCompleted", "{face}: {tool}: {parent:#?}");
            assert_eq!(once[0]["exitCode"], 0, "{face}: {tool}: {parent:#?}");
        }
        let child_by: Vec<&str> = child.iter().filter_map(|e| e["by"].as_str()).collect();
        assert_eq!(child_by.first(), Some(&"allowlist:write_file"), "{face}: {child:#?}");
        assert_eq!(child.last().unwrap()["text"], "child done", "{face}: {child:#?}");
        // Who refused, and in whose words, is the face's; everything else
        // must be the same entry by entry.
        for e in &mut parent {
            if e["by"] == refuser || e["type"] == "toolRejected" {
                e["by"] = json!("(the refuser)");
                e["reason"] = json!("(the refusal)");
            }
        }
        match &reference {
            None => {
                assert_eq!(parent.last().unwrap()["text"], "all done", "{face}: {parent:#?}");
                reference = Some((face, parent, child));
            }
            // MCP has no model: its turns are the client's calls, so only
            // the tool entries are compared (and its child, which has one).
            Some((first, want_parent, want_child)) if face == "MCP" => {
                assert_eq!(tool_calls(&parent), tool_calls(want_parent), "{face}'s tool calls differ from {first}'s");
                assert_eq!(&child, want_child, "{face}'s child differs from {first}'s");
            }
            Some((first, want_parent, want_child)) => {
                assert_eq!(&parent, want_parent, "{face}'s session differs from {first}'s");
                assert_eq!(&child, want_child, "{face}'s child differs from {first}'s");
            }
        }
    }
}
