//! The real `cairn` binary against a real PostgreSQL server (started for the
//! test): `cairn submit` enqueues, `cairn worker` drives (an allowlisted
//! Write runs; a Destructive shell call is refused, never run, headless),
//! `cairn sessions/show/log --database` read the same data, `database = …`
//! in the config works like the flag, `cairn export` writes a session file
//! that `cairn check` accepts and `cairn import` copies back byte for byte.

#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::util;
use util::stdout_ok as stdout;

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use util::Env;

fn statuses(env: &Env, url: &str) -> Vec<Value> {
    let out = env.cairn(&["--database", url, "--json", "sessions"]).output().unwrap();
    stdout(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Kills the worker if the test fails before stopping it.
struct Guard(Option<std::process::Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A child's script (`child.jsonl` beside the parent's), for `spawn_agent`'s
/// `script` argument.
fn child_script(env: &Env, lines: &[Value]) -> String {
    let path = env.home.join("child.jsonl");
    std::fs::write(&path, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    path.to_str().unwrap().to_owned()
}

/// A parent's script: spawn one child on `prompt` with `child_script`,
/// then answer "parent done".
fn parent_spawning(env: &Env, prompt: &str, child_script: &str) -> std::path::PathBuf {
    env.script(&[
        json!({"text": "", "toolCalls": [{"id": "p1", "name": "spawn_agent",
            "arguments": {"prompt": prompt, "script": child_script}}]}),
        json!({"text": "parent done", "toolCalls": []}),
    ])
}

/// Wait until session `id` is idle with `text` in its log; `said` tells
/// what happened when it never is.
fn wait_for_answer(env: &Env, url: &str, id: &str, text: &str, said: &dyn Fn() -> String) {
    let start = Instant::now();
    loop {
        let idle = statuses(env, url).iter().any(|r| r["id"] == id && r["state"] == "idle");
        if idle && stdout(&env.cairn(&["--database", url, "export", id]).output().unwrap()).contains(text) {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(120), "{id} never answered {text:?}:\n{}", said());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn submit_worker_show_log_export_check_import() {
    let (_cluster, url) = util::pg_database("cli_submit");
    let url = url.as_str();
    let env = Env::new();
    // The headless worker refuses `rm -rf` before it runs only unstaged;
    // staged, the call would wait for a person as a Write call first.
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    std::fs::write(env.cwd.join("precious"), "keep me").unwrap();
    let script = env.script(&[
        json!({"text": "", "toolCalls": [
            {"id": "c1", "name": "write_file", "arguments": {"path": "out.txt", "content": "hi\n"}},
            {"id": "c2", "name": "shell", "arguments": {"command": "rm -rf precious"}}
        ]}),
        json!({"text": "all done", "toolCalls": []}),
    ]);
    let s = script.to_str().unwrap();

    // Nothing there yet, and a readable message says how to add work.
    let empty = stdout(&env.cairn(&["--database", url, "sessions"]).output().unwrap());
    assert!(empty.contains("no sessions in the database"), "{empty}");

    let id = stdout(&env.cairn(&["--database", url, "submit", "write it"]).output().unwrap()).trim().to_owned();
    assert_eq!(id.len(), 36, "{id}");
    let listed = statuses(&env, url);
    assert_eq!((listed[0]["id"].as_str(), listed[0]["state"].as_str()), (Some(id.as_str()), Some("queued")));

    let mut guard = Guard(None);
    let worker = env
        .cairn(&[
            "--database",
            url,
            "--script",
            s,
            "--allow",
            "write_file",
            "worker",
            "--concurrency",
            "2",
            "--lease",
            "2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = worker.id();
    guard.0 = Some(worker);
    let start = Instant::now();
    while statuses(&env, url)[0]["state"] != "idle" {
        assert!(start.elapsed() < Duration::from_secs(120), "the worker never finished the session");
        std::thread::sleep(Duration::from_millis(100));
    }
    // One JSON shape whatever the backend: the same keys, `state` in the
    // same words (a finished session is idle in both).
    let answer = env.script(&[json!({"text": "hello", "toolCalls": []})]);
    assert_eq!(
        env.cairn(&["--script", answer.to_str().unwrap(), "run", "hi"]).output().unwrap().status.code(),
        Some(0)
    );
    let files: Vec<Value> = stdout(&env.cairn(&["--json", "sessions"]).output().unwrap())
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    let row = &statuses(&env, url)[0];
    assert_eq!(keys(&files[0]), keys(row), "file: {}\npostgres: {row}", files[0]);
    assert_eq!((files[0]["state"].as_str(), files[0]["backend"].as_str()), (Some("idle"), Some("file")));
    assert_eq!((row["state"].as_str(), row["backend"].as_str()), (Some("idle"), Some("postgres")));
    for v in [&files[0], row] {
        assert!(v["lastActivity"].as_i64().unwrap() > 1_600_000_000_000, "{v}");
        assert!(v["createdAt"].as_i64().unwrap() > 1_600_000_000_000, "{v}");
    }
    // Released on finishing: no holder. Ctrl-C (SIGINT) stops an idle
    // worker cleanly.
    assert_eq!(statuses(&env, url)[0]["holder"], Value::Null);
    let int = std::process::Command::new("kill").args(["-INT", &pid.to_string()]).status().unwrap();
    assert!(int.success());
    let out = guard.0.take().unwrap().wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "the worker did not stop cleanly: {:?}\n{log}", out.status);
    assert!(log.contains(&format!("claimed {id}")) && log.contains(&format!("released {id}")), "{log}");

    assert_eq!(std::fs::read_to_string(env.cwd.join("out.txt")).unwrap(), "hi\n");
    assert_eq!(std::fs::read_to_string(env.cwd.join("precious")).unwrap(), "keep me", "Destructive ran headless");

    // show --tools reads the database: the write completed, the rm refused.
    let tools = stdout(&env.cairn(&["--database", url, "--json", "show", "--tools", &id[..8]]).output().unwrap());
    let calls: Vec<Value> = tools.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let status = |tool: &str| calls.iter().find(|c| c["tool"] == tool).map(|c| c["status"].clone()).unwrap();
    assert_eq!(status("write_file"), "completed", "{tools}");
    assert_eq!(status("shell"), "rejected", "{tools}");
    let log = stdout(&env.cairn(&["--database", url, "log", &id]).output().unwrap());
    assert!(log.contains("all done"), "{log}");

    // The same through `database = …` in the config file.
    std::fs::write(env.home.join("config.toml"), format!("database = {:?}\n", url)).unwrap();
    let again = stdout(&env.cairn(&["--json", "sessions"]).output().unwrap());
    assert!(again.contains(&id), "{again}");
    let config = stdout(&env.cairn(&["config"]).output().unwrap());
    assert!(config.contains("database"), "{config}");
    std::fs::remove_file(env.home.join("config.toml")).unwrap();

    // export → check passes → import into another database → identical export.
    let exported = env.cairn(&["--database", url, "export", &id]).output().unwrap();
    let bytes = exported.stdout.clone();
    stdout(&exported);
    let file = env.cwd.join(format!("{id}.jsonl"));
    std::fs::write(&file, &bytes).unwrap();
    let check = env.cairn(&["check", file.to_str().unwrap()]).output().unwrap();
    stdout(&check);
    let (_other_cluster, other) = util::pg_database("cli_imported");
    let imported = stdout(&env.cairn(&["--database", &other, "import", file.to_str().unwrap()]).output().unwrap());
    assert_eq!(imported.trim(), id);
    let back = env.cairn(&["--database", &other, "export", &id]).output().unwrap();
    assert_eq!(back.stdout, bytes, "export after import differs");
    // A second import of the same id is refused, nothing changed.
    let twice = env.cairn(&["--database", &other, "import", file.to_str().unwrap()]).output().unwrap();
    assert!(!twice.status.success());
    assert!(
        String::from_utf8_lossy(&twice.stderr).contains("already exists"),
        "{}",
        String::from_utf8_lossy(&twice.stderr)
    );

    // A follow-up prompt for the same session goes to the inbox.
    let queued = stdout(&env.cairn(&["--database", url, "submit", "--session", &id[..8], "more"]).output().unwrap());
    assert_eq!(queued.trim(), id);
    assert_eq!(statuses(&env, url)[0]["queued"], 1);
}

#[test]
fn a_bad_database_url_or_unknown_session_says_what_to_do() {
    let env = Env::new();
    let out = env.cairn(&["submit", "hello"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--database"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = env.cairn(&["--database", "postgres://nobody:secret@127.0.0.1:1/none", "sessions"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot use the database"), "{err}");
    assert!(!err.contains("secret"), "the password leaked: {err}");
    // The worker decides how a submitted session runs: flags that would say
    // otherwise are refused (they used to be accepted and ignored), before
    // anything is written to the database.
    for flags in
        [&["--provider", "openai"][..], &["--script", "s.jsonl"], &["--yes"], &["--allow", "shell"], &["--model", "m"]]
    {
        let mut args = vec!["--database", "postgres://nobody:secret@127.0.0.1:1/none"];
        args.extend_from_slice(flags);
        args.extend(["submit", "hello"]);
        let out = env.cairn(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{flags:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("does not take {}", flags[0])) && err.contains("cairn worker"),
            "{flags:?}: {err}"
        );
    }
}

/// `cairn worker --yes` is the worker's standing approval of Write calls
/// (it used to be ignored: the call waited for `cairn approve`).
#[test]
fn a_worker_started_with_yes_approves_write_calls() {
    let (_cluster, url) = util::pg_database("cli_yes");
    let url = url.as_str();
    let env = Env::new();
    let script = env.script(&[
        json!({"text": "", "toolCalls": [
            {"id": "c1", "name": "write_file", "arguments": {"path": "yes.txt", "content": "yes\n"}}
        ]}),
        json!({"text": "written", "toolCalls": []}),
    ]);
    let s = script.to_str().unwrap();
    let id = stdout(&env.cairn(&["--database", url, "submit", "write it"]).output().unwrap()).trim().to_owned();
    let mut guard = Guard(None);
    guard.0 = Some(
        env.cairn(&["--database", url, "--script", s, "--yes", "worker", "--lease", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let start = Instant::now();
    while statuses(&env, url)[0]["state"] != "idle" {
        assert!(start.elapsed() < Duration::from_secs(120), "timed out waiting for the session");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(guard);
    assert_eq!(std::fs::read_to_string(env.cwd.join("yes.txt")).unwrap(), "yes\n");
    let tools = stdout(&env.cairn(&["--database", url, "--json", "show", "--tools", &id]).output().unwrap());
    let call: Value = serde_json::from_str(tools.lines().next().unwrap()).unwrap();
    assert_eq!(call["verdict"]["by"], "flag:--yes", "{tools}");
    assert_eq!(call["status"], "completed", "{tools}");
}

#[test]
fn a_pending_approval_is_data_that_survives_the_worker() {
    let (_cluster, url) = util::pg_database("cli_approval");
    let url = url.as_str();
    let env = Env::new();
    let script = env.script(&[
        json!({"text": "", "toolCalls": [
            {"id": "c1", "name": "write_file", "arguments": {"path": "asked.txt", "content": "yes\n"}}
        ]}),
        json!({"text": "written", "toolCalls": []}),
    ]);
    let s = script.to_str().unwrap();
    let id = stdout(&env.cairn(&["--database", url, "submit", "write it"]).output().unwrap()).trim().to_owned();
    let worker = |g: &mut Guard| {
        g.0 = Some(
            env.cairn(&["--database", url, "--script", s, "worker", "--lease", "1"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
    };
    let pending = || -> Vec<Value> {
        let out = stdout(&env.cairn(&["--database", url, "--json", "approvals"]).output().unwrap());
        out.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let wait = |what: &str, cond: &dyn Fn() -> bool| {
        let start = Instant::now();
        while !cond() {
            assert!(start.elapsed() < Duration::from_secs(120), "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let mut first = Guard(None);
    worker(&mut first);
    wait("the question", &|| pending().len() == 1);
    let question = pending().remove(0);
    assert_eq!((question["sessionId"].as_str(), question["tool"].as_str()), (Some(id.as_str()), Some("write_file")));
    // The worker dies while the question waits; nothing ran.
    drop(first);
    assert!(!env.cwd.join("asked.txt").exists());
    let mut second = Guard(None);
    worker(&mut second);
    // Answer from another process (any host): the taken-over turn runs it.
    let inv = question["invocationId"].as_str().unwrap();
    stdout(&env.cairn(&["--database", url, "approve", &id, inv]).output().unwrap());
    wait("the session to finish", &|| statuses(&env, url)[0]["state"] == "idle");
    assert_eq!(std::fs::read_to_string(env.cwd.join("asked.txt")).unwrap(), "yes\n");
    assert!(pending().is_empty());
    // A second answer is refused: the first one stands.
    let again = env.cairn(&["--database", url, "approve", &id, inv, "--deny", "no"]).output().unwrap();
    assert!(!again.status.success());
    let tools = stdout(&env.cairn(&["--database", url, "--json", "show", "--tools", &id]).output().unwrap());
    let call: Value = serde_json::from_str(tools.lines().next().unwrap()).unwrap();
    assert_eq!(call["status"], "completed", "{tools}");
    assert_eq!(call["settlements"], 1, "{tools}");
    assert!(call["verdict"]["by"].as_str().unwrap().starts_with("user:cli:"), "{tools}");
}

/// Undo of a database session (issue 30) by a host that has its working
/// directory and pre-images (here the worker's own home): `cairn undo
/// --database URL ID` puts the tree back and `cairn redo` reapplies, both
/// committed to the database; where the working directory is missing, it
/// is refused naming it, and nothing changes.
#[test]
fn a_database_session_is_undone_and_redone_on_the_host_with_its_tree() {
    let (_cluster, url) = util::pg_database("cli_undo");
    let url = url.as_str();
    let env = Env::new();
    std::fs::write(env.cwd.join("old.txt"), "old\n").unwrap();
    let script = env.script(&[
        json!({"text": "", "toolCalls": [
            {"id": "c1", "name": "write_file", "arguments": {"path": "old.txt", "content": "new\n"}},
            {"id": "c2", "name": "write_file", "arguments": {"path": "made.txt", "content": "made\n"}}
        ]}),
        json!({"text": "written", "toolCalls": []}),
    ]);
    let s = script.to_str().unwrap();
    let id = stdout(&env.cairn(&["--database", url, "submit", "write them"]).output().unwrap()).trim().to_owned();
    let guard = Guard(Some(
        env.cairn(&["--database", url, "--script", s, "--yes", "worker", "--lease", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    ));
    let start = Instant::now();
    while statuses(&env, url)[0]["state"] != "idle" {
        assert!(start.elapsed() < Duration::from_secs(120), "timed out waiting for the session");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(guard);
    assert_eq!(std::fs::read_to_string(env.cwd.join("old.txt")).unwrap(), "new\n");
    assert!(env.cwd.join("made.txt").exists());

    // The working directory is not on this "host": refused, naming it.
    let moved = env.cwd.with_extension("elsewhere");
    std::fs::rename(&env.cwd, &moved).unwrap();
    let out = env.cairn(&["--database", url, "undo", &id]).current_dir(&moved).output().unwrap();
    std::fs::rename(&moved, &env.cwd).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("not a directory on this host"), "{err}");
    assert_eq!(std::fs::read_to_string(env.cwd.join("old.txt")).unwrap(), "new\n", "nothing changed");

    let undone = stdout(&env.cairn(&["--database", url, "undo", &id]).output().unwrap());
    assert!(undone.contains("2 effect(s)"), "{undone}");
    assert_eq!(std::fs::read_to_string(env.cwd.join("old.txt")).unwrap(), "old\n");
    assert!(!env.cwd.join("made.txt").exists());
    // Committed to the database: the log there holds the undo.
    let log = stdout(&env.cairn(&["--database", url, "log", &id]).output().unwrap());
    assert!(log.contains("undoApplied"), "{log}");
    let redone = stdout(&env.cairn(&["--database", url, "redo", &id]).output().unwrap());
    assert!(redone.contains("redo"), "{redone}");
    assert_eq!(std::fs::read_to_string(env.cwd.join("old.txt")).unwrap(), "new\n");
    assert_eq!(std::fs::read_to_string(env.cwd.join("made.txt")).unwrap(), "made\n");
}

/// A worker's session spawns a child (a session of the same database,
/// driven within the parent's lease); the worker is SIGKILLed while the
/// child's tool runs; another worker takes the parent over once the lease
/// expires, resumes the child where its rows say it stands (its killed
/// call settled once, uncertain, never run again) and gathers its answer
/// once.
#[test]
fn a_worker_killed_in_a_child_leaves_it_to_the_next_worker() {
    let (_cluster, url) = util::pg_database("cli_killed_child");
    let url = url.as_str();
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    let child_script = child_script(
        &env,
        &[
            json!({"text": "", "toolCalls": [{"id": "k1", "name": "shell",
                "arguments": {"command": "mkdir -p runs && mktemp -p runs && sleep 30"}}]}),
            json!({"text": "child done", "toolCalls": []}),
        ],
    );
    let script = parent_spawning(&env, "start the job", &child_script);
    let s = script.to_str().unwrap();
    let id = stdout(&env.cairn(&["--database", url, "submit", "delegate"]).output().unwrap()).trim().to_owned();
    // The workers' stderr, said when the test fails.
    let said = env.home.join("workers.log");
    let worker = || {
        let err = std::fs::OpenOptions::new().create(true).append(true).open(&said).unwrap();
        env.cairn(&["--database", url, "--script", s, "--yes", "worker", "--lease", "2"])
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap()
    };
    let said = || {
        let mut text = std::fs::read_to_string(env.home.join("workers.log")).unwrap_or_default();
        for row in statuses(&env, url) {
            let out = env.cairn(&["--database", url, "export", row["id"].as_str().unwrap()]).output().unwrap();
            text.push_str(&String::from_utf8_lossy(&out.stdout));
        }
        text
    };
    // Each run of the child's command leaves one file in `runs/`.
    let runs = || std::fs::read_dir(env.cwd.join("runs")).map(|d| d.count()).unwrap_or(0);
    let mut first = Guard(Some(worker()));
    let start = Instant::now();
    while runs() == 0 {
        assert!(start.elapsed() < Duration::from_secs(120), "the child's tool never started:\n{}", said());
        std::thread::sleep(Duration::from_millis(20));
    }
    // SIGKILL, mid-child: the parent waits in spawn_agent, the child in
    // its shell call.
    if let Some(mut w) = first.0.take() {
        w.kill().unwrap();
        w.wait().unwrap();
    }
    // Killed mid-turn, the child's row says so (as its parent's does).
    let child_row = statuses(&env, url).into_iter().find(|r| r["parent"] == id.as_str()).unwrap();
    assert_eq!(child_row["state"], "running", "{child_row}");
    let _second = Guard(Some(worker()));
    let export = |id: &str| stdout(&env.cairn(&["--database", url, "export", id]).output().unwrap());
    wait_for_answer(&env, url, &id, "parent done", &said);
    let rows = statuses(&env, url);
    let children: Vec<&Value> = rows.iter().filter(|r| r["parent"] == id.as_str()).collect();
    assert_eq!((rows.len(), children.len()), (2, 1), "one child, created once: {rows:#?}");
    assert_eq!(children[0]["state"], "idle", "the resumed child's turn ended: {rows:#?}");
    let child = children[0]["id"].as_str().unwrap().to_owned();
    let settled = |entries: &[Value], tool: &str| -> Vec<Value> {
        entries
            .iter()
            .filter(|e| {
                ["toolCompleted", "toolFailed", "toolRejected"].contains(&e["type"].as_str().unwrap())
                    && e["payload"]["tool"] == tool
            })
            .cloned()
            .collect()
    };
    let requested = |entries: &[Value], tool: &str| {
        entries.iter().filter(|e| e["type"] == "toolRequested" && e["payload"]["request"]["tool"] == tool).count()
    };
    // The child's killed call: asked once, settled once (failed, the
    // effect uncertain), never run again.
    let child_log = util::entries_of_text(&export(&child));
    assert_eq!(requested(&child_log, "shell"), 1, "{child_log:#?}");
    let shell = settled(&child_log, "shell");
    assert_eq!(shell.len(), 1, "{child_log:#?}");
    assert_eq!(shell[0]["type"], "toolFailed", "{shell:#?}");
    assert_eq!(runs(), 1, "the child's command ran once");
    // The parent's spawn: asked once, settled once, with the child's answer.
    let parent_log = util::entries_of_text(&export(&id));
    assert_eq!(requested(&parent_log, "spawn_agent"), 1, "{parent_log:#?}");
    let spawn = settled(&parent_log, "spawn_agent");
    assert_eq!(spawn.len(), 1, "{parent_log:#?}");
    assert_eq!(spawn[0]["type"], "toolCompleted", "{spawn:#?}");
    assert_eq!(spawn[0]["payload"]["receipt"]["structuredOutput"]["answer"], "child done", "{spawn:#?}");
    // Two holders of the parent's lease, and the child's lines written
    // under the one or the other (never under a lease of its own).
    let mut client = cairn_pg::connect(url).unwrap();
    let owners: i64 = client
        .query_one("SELECT count(DISTINCT owner) FROM cairn_claims WHERE session_id = $1", &[&id])
        .unwrap()
        .get(0);
    assert_eq!(owners, 2, "the parent was taken over");
    let stray: i64 = client
        .query_one(
            "SELECT count(*) FROM cairn_lines l WHERE l.session_id = $1 AND NOT EXISTS
                 (SELECT 1 FROM cairn_claims c WHERE c.session_id = $2 AND c.epoch = l.epoch AND c.owner = l.owner)",
            &[&child, &id],
        )
        .unwrap()
        .get(0);
    assert_eq!(stray, 0, "child lines written outside the parent's lease");
    let none: i64 =
        client.query_one("SELECT count(*) FROM cairn_claims WHERE session_id = $1", &[&child]).unwrap().get(0);
    assert_eq!(none, 0, "a child is never claimed by itself");
}

/// A worker's child asks its Write call (no allow rule covers it) as a
/// question of its parent, named `i5+i3` as the 9P face names it; answered
/// with `cairn approve PARENT i5+i3`, the child runs it and the parent
/// gathers its answer.
#[test]
fn a_childs_question_is_asked_as_its_parents() {
    let (_cluster, url) = util::pg_database("cli_child_question");
    let url = url.as_str();
    let env = Env::new();
    let child_script = child_script(
        &env,
        &[
            json!({"text": "", "toolCalls": [
                {"id": "k1", "name": "write_file", "arguments": {"path": "asked.txt", "content": "child\n"}}
            ]}),
            json!({"text": "child wrote", "toolCalls": []}),
        ],
    );
    let script = parent_spawning(&env, "write it", &child_script);
    let s = script.to_str().unwrap();
    let id = stdout(&env.cairn(&["--database", url, "submit", "delegate"]).output().unwrap()).trim().to_owned();
    let _worker = Guard(Some(
        env.cairn(&["--database", url, "--script", s, "worker", "--lease", "2"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    ));
    let pending = || -> Vec<Value> {
        let out = stdout(&env.cairn(&["--database", url, "--json", "approvals"]).output().unwrap());
        out.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let start = Instant::now();
    while pending().is_empty() {
        assert!(start.elapsed() < Duration::from_secs(120), "the child's question was never asked");
        std::thread::sleep(Duration::from_millis(100));
    }
    let question = pending().remove(0);
    assert_eq!(question["sessionId"], id.as_str(), "{question}");
    assert_eq!(question["tool"], "write_file", "{question}");
    let inv = question["invocationId"].as_str().unwrap().to_owned();
    let (spawn, call) = inv.split_once('+').unwrap_or_else(|| panic!("a child's question is named i5+i3: {inv}"));
    assert!(spawn.starts_with('i') && call.starts_with('i'), "{inv}");
    assert!(!env.cwd.join("asked.txt").exists(), "nothing ran before the answer");
    // The parent's full id names it, not also its child (`+` ids).
    stdout(&env.cairn(&["--database", url, "approve", &id, &inv]).output().unwrap());
    wait_for_answer(&env, url, &id, "parent done", &String::new);
    let out = stdout(&env.cairn(&["--database", url, "export", &id]).output().unwrap());
    assert!(out.contains("child wrote"), "the child's answer is gathered: {out}");
    assert_eq!(std::fs::read_to_string(env.cwd.join("asked.txt")).unwrap(), "child\n");
    assert!(pending().is_empty());
    // `cairn submit` refuses a child: it is driven through its parent.
    let child = format!("{id}+{spawn}");
    let refused = env.cairn(&["--database", url, "submit", "--session", &child, "more"]).output().unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("subagent"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

/// A worker's family talks as a files family does: the child sends to its
/// parent, the parent waits for it, answers every child, and the child
/// waits for that answer; each message is committed once in the sender's
/// database log and once in the receiver's, with the same id.
#[test]
fn a_workers_parent_and_child_exchange_messages_through_the_database() {
    let (_cluster, url) = util::pg_database("cli_messages");
    let url = url.as_str();
    let env = Env::new();
    let child_script = child_script(
        &env,
        &[
            json!({"text": "", "toolCalls": [{"id": "m1", "name": "send_message", "arguments": {"to": "parent", "text": "hello"}}]}),
            json!({"text": "", "toolCalls": [{"id": "m2", "name": "wait_for_messages", "arguments": {"timeout": 60}}]}),
            json!({"text": "child got ack", "toolCalls": []}),
        ],
    );
    let script = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "s1", "name": "spawn_agent",
            "arguments": {"prompt": "talk", "wait": false, "script": child_script}}]}),
        json!({"text": "", "toolCalls": [{"id": "r1", "name": "wait_for_messages", "arguments": {"timeout": 60}}]}),
        json!({"text": "", "toolCalls": [{"id": "m1", "name": "send_message", "arguments": {"to": "children", "text": "ack"}}]}),
        json!({"text": "", "toolCalls": [{"id": "w1", "name": "wait_agents", "arguments": {}}]}),
        json!({"text": "conversation over", "toolCalls": []}),
    ]);
    let s = script.to_str().unwrap();
    let id = stdout(&env.cairn(&["--database", url, "submit", "go"]).output().unwrap()).trim().to_owned();
    let said = env.home.join("worker.log");
    let _worker = Guard(Some(
        env.cairn(&["--database", url, "--script", s, "worker", "--lease", "5"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&said).unwrap())
            .spawn()
            .unwrap(),
    ));
    let export = |id: &str| stdout(&env.cairn(&["--database", url, "export", id]).output().unwrap());
    wait_for_answer(&env, url, &id, "conversation over", &|| std::fs::read_to_string(&said).unwrap_or_default());
    let rows = statuses(&env, url);
    let child = rows.iter().find(|r| r["parent"] == id.as_str()).unwrap_or_else(|| panic!("no child: {rows:#?}"));
    let child = child["id"].as_str().unwrap().to_owned();
    let (parent_log, child_log) = (util::entries_of_text(&export(&id)), util::entries_of_text(&export(&child)));
    let completed = |log: &[Value], tool: &str| -> Vec<Value> {
        log.iter()
            .filter(|e| e["type"] == "toolCompleted" && e["payload"]["tool"] == tool)
            .map(|e| e["payload"]["receipt"]["structuredOutput"].clone())
            .collect()
    };
    let received = |log: &[Value]| -> Vec<Value> {
        completed(log, "wait_for_messages")
            .iter()
            .flat_map(|s| s["messages"].as_array().cloned().unwrap_or_default())
            .collect()
    };
    let up = completed(&child_log, "send_message");
    assert_eq!(up.len(), 1, "{child_log:#?}");
    assert_eq!((up[0]["to"].as_str(), up[0]["text"].as_str()), (Some(id.as_str()), Some("hello")));
    let got = received(&parent_log);
    assert_eq!(got.len(), 1, "{parent_log:#?}");
    assert_eq!((&got[0]["id"], got[0]["from"].as_str()), (&up[0]["id"], Some(child.as_str())));
    let down = completed(&parent_log, "send_message");
    assert_eq!(down.len(), 1, "{parent_log:#?}");
    let got = received(&child_log);
    assert_eq!(got.len(), 1, "{child_log:#?}");
    assert_eq!((&got[0]["id"], got[0]["text"].as_str()), (&down[0]["id"], Some("ack")));
    let gathered = completed(&parent_log, "wait_agents");
    assert!(gathered.iter().any(|g| g.to_string().contains("child got ack")), "{gathered:#?}");
}
