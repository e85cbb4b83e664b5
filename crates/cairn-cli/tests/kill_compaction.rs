//! Kill tests around compaction, with the real `cairn` binary, SIGKILL and
//! a loopback server: killed while the summariser is being asked (the
//! intent is committed, the summary is not — and since the `compaction`
//! entry and the lane move are one line, this is also "before the lane
//! moves"), and killed after the summary is committed while the turn's own
//! request is in flight. Each time the session opens, continues, and holds
//! exactly one summary, never two.

#![allow(clippy::unwrap_used)]

use crate::util;

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use cairn_core::storage::{Durability, Header, JsonlStore, StoreOptions};
use cairn_test_server::{Ending, Reply, TestServer, streams};
use cairn_testtools::history;
use serde_json::Value;
use util::Env;

const ID: &str = "killed";

fn setup(server: &TestServer) -> (Env, PathBuf) {
    server.limit_context(16_384);
    let env = Env::new();
    let mut store = JsonlStore::create(
        &env.home.join("sessions"),
        Header::new(ID, env.cwd.display().to_string()),
        StoreOptions::with_durability(Durability::None),
    )
    .unwrap();
    history::generate(&mut store, 400, 100).unwrap();
    let path = store.path().to_owned();
    drop(store);
    std::fs::write(
        env.home.join("config.toml"),
        format!(
            "provider = \"t\"\n[providers.t]\nkind = \"openai\"\nbase_url = \"{}/v1\"\nmodel = \"test-model\"\n\
             context_window = 16384\nmax_output_tokens = 1024\nmax_attempts = 1\n",
            server.url()
        ),
    )
    .unwrap();
    (env, path)
}

/// Wait until the server has received `n` requests (the child is then
/// blocked on the n-th), then SIGKILL it.
fn kill_at_request(server: &TestServer, mut child: Child, n: usize) {
    let give_up = Instant::now() + Duration::from_secs(300);
    while server.requests().len() < n {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("cairn exited ({status}) before request {n}; got {}", server.requests().len());
        }
        assert!(Instant::now() < give_up, "request {n} never came");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// (compaction entries, whether `op/compact` is live) from the file alone.
fn compactions(path: &PathBuf) -> (usize, bool) {
    let text = std::fs::read_to_string(path).unwrap();
    let (mut entries, mut live) = (0, false);
    for line in text.lines().skip(1) {
        let line: Value = serde_json::from_str(line).unwrap();
        let records = match line {
            Value::Array(r) => r,
            r => vec![r],
        };
        for r in records {
            if r["kind"] == "entry" && r["type"] == "compaction" {
                entries += 1;
            }
            if r["kind"] == "register" && r["namespace"] == "op" && r["key"] == "compact" {
                live = r["op"] == "set";
            }
        }
    }
    (entries, live)
}

fn stalled() -> Reply {
    Reply::sse("").ending(Ending::StallAfterHeaders(Duration::from_secs(600)))
}

fn summary() -> Reply {
    Reply::sse(streams::chat_text_with_usage("SUMMARY-4242 of the earlier questions."))
}

fn answer() -> Reply {
    Reply::sse(streams::chat_text_with_usage("Finished after the kill."))
}

fn resume_to_the_end(env: &Env) {
    let out = env.cairn(&["resume", ID]).stdin(Stdio::null()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("Finished after the kill."), "{stdout}");
}

#[test]
fn killed_while_the_summariser_runs_resumes_with_one_summary() {
    let server = TestServer::start(vec![stalled()]).unwrap();
    let (env, path) = setup(&server);
    let child = env
        .cairn(&["resume", ID, "--prompt", "go on"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    kill_at_request(&server, child, 1);
    assert!(server.requests()[0].json().get("tools").is_none(), "the stalled request is the summariser's");
    assert_eq!(compactions(&path), (0, true), "intent committed, no summary yet");

    server.push(summary());
    server.push(answer());
    resume_to_the_end(&env);
    assert_eq!(compactions(&path), (1, false), "one summary, the op settled");
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "the summariser asked again once, then the turn");
    assert!(requests[2].json()["messages"].to_string().contains("SUMMARY-4242"));
    // And the session goes on: nothing is left to resume.
    let again = env.cairn(&["resume", ID]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(again.status.code(), Some(0));
    assert_eq!(compactions(&path), (1, false));
}

#[test]
fn killed_after_the_summary_is_committed_never_writes_a_second() {
    let server = TestServer::start(vec![summary(), stalled()]).unwrap();
    let (env, path) = setup(&server);
    let child = env
        .cairn(&["resume", ID, "--prompt", "go on"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    kill_at_request(&server, child, 2);
    assert_eq!(compactions(&path), (1, false), "the summary line is whole; the op ended with it");

    server.push(answer());
    resume_to_the_end(&env);
    assert_eq!(compactions(&path), (1, false), "never two");
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "no second summariser call");
    assert!(requests[2].json()["messages"].to_string().contains("SUMMARY-4242"));
}
