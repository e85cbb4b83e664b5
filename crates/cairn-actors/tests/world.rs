//! A real world: wasmtime, WAT and C actors, the broker's routing, ids,
//! subscriptions, limits and lifecycle.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};

#[test]
fn routing_ids_undeliverable_and_non_json_stdout() {
    let t = TestWorld::new();
    let prefix = "not json at all\n[1,2]\n{\"to\":\"console\",\"id\":\"hello\",\"body\":\"hi\"}\n{\"to\":\"nobody\",\"body\":1}\n{\"to\":\"console\",\"from\":\"forged\",\"body\":\"who\"}\n";
    let r = t.spawn("a", &actor(prefix, "", ""));
    assert_eq!(r["type"], "ok", "{r}");
    t.subscribe_console("a");
    t.w().send(Some("a"), None, None, json!({"go": 1}));
    // Own id prefixed with the sender.
    let (m, _) = t.wait_for("hello", |m| m["body"] == "hi");
    assert_eq!(m["id"], "a/hello");
    assert_eq!(m["from"], "a");
    // `from` cannot be forged.
    let (m, _) = t.wait_for("who", |m| m["body"] == "who");
    assert_eq!(m["from"], "a");
    assert!(m["id"].as_str().unwrap().starts_with("m-"), "{m}");
    // The undeliverable reached `a` (from broker), which echoed it to us.
    let (m, _) = t.wait_for("undeliverable echo", |m| m["body"]["type"] == "undeliverable");
    assert_eq!(m["body"]["to"], "nobody");
    assert!(m["body"]["reason"].as_str().unwrap().contains("nobody"));
    // Our own message came back through the subscription: id a/m-<n>.
    let (m, _) = t.wait_for("echo of go", |m| m["body"] == json!({"go": 1}));
    assert!(m["id"].as_str().unwrap().starts_with("a/m-"), "{m}");
    // Non-JSON and body-less lines went to stderr.log with a note.
    let log = t.read("actor/a/stderr.log");
    assert!(log.contains("not json at all") && log.contains("not JSON"), "{log}");
    assert!(log.contains("[1,2]") && log.contains("not an object"), "{log}");
    // The console gets undeliverable for an unknown actor, as a reply.
    t.w().send(Some("ghost"), Some("q1"), None, json!(1));
    let (m, _) = t.wait_for("undeliverable", |m| m["body"]["type"] == "undeliverable");
    assert_eq!(m["from"], "broker");
    assert_eq!(m["reply_to"], "console/q1");
    assert_eq!(m["body"]["to"], "ghost");
}

#[test]
fn bad_requests_are_refused_with_reasons() {
    let t = TestWorld::new();
    let p = t.file("x.wat", &echo());
    for (req, needle) in [
        (json!({"type":"spawn","id":"Bad Id","wasm":p}), "may only contain"),
        (json!({"type":"spawn","id":&"a".repeat(65),"wasm":p}), "1 to 64"),
        (json!({"type":"spawn","id":"broker","wasm":p}), "reserved"),
        (json!({"type":"spawn","id":"x","wasm":"/nope/x.wasm"}), "reading"),
        (json!({"type":"spawn","id":"x","wasm":"/tmp/../etc/passwd"}), "'..'"),
        (json!({"type":"spawn","id":"x","wasm":t.file("x.txt", "hi")}), "only .wasm"),
        (json!({"type":"spawn","id":"x","wasm":t.file("bad.wat", "(module")}), "WAT"),
        (json!({"type":"upgrade","id":"nope","wasm":p}), "no actor"),
        (json!({"type":"frobnicate"}), "unknown request"),
    ] {
        let r = t.req(req.clone());
        assert_eq!(r["type"], "error", "{req} → {r}");
        assert!(r["reason"].as_str().unwrap().contains(needle), "{req} → {r}");
    }
    assert_eq!(t.spawn("x", &echo())["type"], "ok");
    let r = t.spawn("x", &echo());
    assert!(r["reason"].as_str().unwrap().contains("exists"), "{r}");
}

#[test]
fn subscriptions_and_registry_survive_a_world_restart() {
    let mut t = TestWorld::new();
    assert_eq!(t.spawn("b", &echo())["type"], "ok");
    t.subscribe_console("b");
    t.reopen();
    t.w().send(Some("b"), None, None, json!({"after": "restart"}));
    let (m, _) = t.wait_for("echo after restart", |m| m["body"] == json!({"after": "restart"}));
    assert_eq!(m["from"], "b");
    let s: Value = serde_json::from_str(&t.read("actor/b/status.json")).unwrap();
    assert_eq!(s["state"], "running");
    // Unsubscribe is persisted too.
    assert_eq!(t.req(json!({"type":"unsubscribe","actor":"b"}))["type"], "ok");
    let reg: Value = serde_json::from_str(&t.read("broker/registry.json")).unwrap();
    assert_eq!(reg["actors"]["b"]["subscribers"], json!([]));
}

#[test]
fn graceful_shutdown_then_eof() {
    let t = TestWorld::new();
    t.spawn("e", &echo());
    t.subscribe_console("e");
    let r = t.req(json!({"type":"stop","id":"e"}));
    assert_eq!(r["type"], "ok", "{r}");
    // The echo saw {"type":"shutdown"} from broker before EOF.
    let (m, _) = t.wait_for("shutdown echo", |m| m["body"] == json!({"type":"shutdown"}));
    assert_eq!(m["from"], "e");
    let s = t.actor_state("e");
    assert_eq!(s["state"], "stopped", "{s}");
    // Messages sent while stopped wait in the mailbox, then arrive on start.
    t.w().send(Some("e"), None, None, json!("queued"));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(t.req(json!({"type":"start","id":"e"}))["type"], "ok");
    t.wait_for("queued message", |m| m["body"] == "queued");
}

#[test]
fn infinite_loop_is_killed_by_the_epoch_and_the_world_stays_up() {
    let t = TestWorld::new();
    t.spawn("spin", &spinner());
    t.spawn("e", &echo());
    t.subscribe_console("e");
    // Mailbox overflow: the spinner never reads; its pipe then its mailbox
    // fill up and senders get `undeliverable`.
    for i in 0..3000 {
        t.w().send(Some("spin"), None, None, json!({"n": i}));
    }
    let (m, _) = t.wait_for("mailbox full", |m| {
        m["body"]["type"] == "undeliverable" && m["body"]["reason"].as_str().is_some_and(|r| r.contains("mailbox full"))
    });
    assert_eq!(m["body"]["to"], "spin");
    // Stopping it needs the kill (it ignores shutdown and EOF).
    let r = t.req(json!({"type":"stop","id":"spin"}));
    assert_eq!(r["type"], "ok", "{r}");
    let reg = t.read("actor/spin/status.json");
    assert!(reg.contains("Killed"), "{reg}");
    t.w().send(Some("e"), None, None, json!("still up"));
    t.wait_for("echo", |m| m["body"] == "still up");
}

#[test]
fn memory_bomb_is_capped() {
    let t = TestWorld::with(cairn_actors::Limits { memory_bytes: 8 << 20, ..Default::default() });
    t.spawn("bomb", &memory_bomb());
    t.subscribe_console("bomb");
    t.w().send(Some("bomb"), None, None, json!("go"));
    let (m, _) = t.wait_for("page report", |m| m["body"]["pages"].is_number());
    let pages = m["body"]["pages"].as_u64().unwrap();
    // 8 MiB = 128 pages of 64 KiB; it started with 2 and grew by 16.
    assert!((112..=128).contains(&pages), "{pages}");
    t.wait_for("echo after bomb", |m| m["body"] == "go");
}

#[test]
fn c_actor_built_with_clang_runs() {
    let t = TestWorld::new();
    let src = t.file(
        "c/echo.c",
        r#"#include <stdio.h>
#include <string.h>
int main(void) {
    char line[4096];
    while (fgets(line, sizeof line, stdin)) {
        FILE *f = fopen("/data/last.txt", "w");
        if (f) { fputs(line, f); fclose(f); }
        fputs(line, stdout);
        fflush(stdout);
    }
    return 0;
}
"#,
    );
    let out = t.dir.path().join("c/echo.wasm");
    common::clang::build_c_actor(&src, &out);
    let r = t.req(json!({"type":"spawn","id":"c","wasm":out,"source":t.dir.path().join("c")}));
    assert_eq!(r["type"], "ok", "{r}");
    t.subscribe_console("c");
    t.w().send(Some("c"), None, None, json!({"from_c": true}));
    t.wait_for("C echo", |m| m["body"] == json!({"from_c": true}) && m["from"] == "c");
    assert!(t.read("data/c/last.txt").contains("from_c"));
    assert!(t.root().join("actor/c/source/echo.c").exists());
    let meta: Value = serde_json::from_str(&t.read("broker/versions/c/1/meta.json")).unwrap();
    assert_eq!(meta["requested_by"], "console");
}

#[test]
fn the_agents_mailbox_is_journaled_and_a_request_takes_only_its_reply() {
    let mut t = TestWorld::new();
    t.w().send(Some("agent"), None, None, json!({"type": "text", "text": "q1"}));
    // The broker handles events in order: after this answer, q1 is queued.
    t.req(json!({"type": "list"}));
    t.reopen();
    let waiting = t.w().agent_waiting();
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    assert_eq!(waiting[0].1.body["text"], "q1");
    // A request made as the agent takes its reply out of the mailbox and
    // leaves q1 where it is.
    let (r, _) = t.w().ask_as("agent", "cc", json!({"type": "compile"}), Duration::from_secs(60)).unwrap();
    assert_eq!(r.body["type"], "build_failed", "{r:?}");
    let (n, m) = t.w().agent_peek(Duration::ZERO).unwrap();
    assert_eq!((n, m.body["text"].as_str()), (waiting[0].0, Some("q1")));
    t.w().agent_done(n);
    assert!(t.w().agent_waiting().is_empty());
    t.reopen();
    assert!(t.w().agent_waiting().is_empty(), "handled messages stay handled");
    // Numbers are never handed out again, even past a reopen.
    t.w().agent_reserve(n + 10).unwrap();
    t.w().send(Some("agent"), None, None, json!({"type": "text", "text": "q2"}));
    t.req(json!({"type": "list"}));
    assert_eq!(t.w().agent_waiting().first().map(|(k, _)| *k), Some(n + 10));
}

#[test]
fn http_only_for_actors_that_declared_it() {
    let t = TestWorld::new();
    let (base, requests) = loopback_server();
    let ask = format!("{{\"to\":\"http\",\"body\":{{\"type\":\"request\",\"url\":\"{base}/from-actor\"}}}}\n");
    let p = t.file("net.wat", &actor(&ask, "", ""));
    let r = t.req(json!({"type":"spawn","id":"net","wasm":p,"http":true}));
    assert_eq!(r["type"], "ok", "{r}");
    let p = t.file("plain.wat", &actor(&ask, "", ""));
    assert_eq!(t.req(json!({"type":"spawn","id":"plain","wasm":p}))["type"], "ok");
    t.subscribe_console("net");
    t.subscribe_console("plain");
    // Each asks `http` when its first message comes, and echoes the answer.
    t.w().send(Some("net"), None, None, json!("go"));
    t.w().send(Some("plain"), None, None, json!("go"));
    let (m, _) = t.wait_for("net's response", |m| m["from"] == "net" && m["body"]["type"] == "response");
    assert_eq!((m["body"]["status"].as_u64(), m["body"]["body"].as_str()), (Some(200), Some("hello")), "{m}");
    assert_eq!(m["body"]["headers"]["x-test"], "yes", "{m}");
    assert_eq!(m["body"]["truncated"], false, "{m}");
    let (m, _) = t.wait_for("plain's refusal", |m| m["from"] == "plain" && m["body"]["type"] == "undeliverable");
    assert_eq!(m["body"]["to"], "http", "{m}");
    assert!(m["body"]["reason"].as_str().unwrap().contains("did not declare"), "{m}");
    // An actor without HTTP cannot grant it to one it spawns.
    let grant =
        "{\"to\":\"broker\",\"body\":{\"type\":\"spawn\",\"id\":\"child\",\"wasm\":\"/public/x.wat\",\"http\":true}}\n";
    let p = t.file("granter.wat", &actor(grant, "", ""));
    assert_eq!(t.req(json!({"type":"spawn","id":"granter","wasm":p}))["type"], "ok");
    t.subscribe_console("granter");
    t.w().send(Some("granter"), None, None, json!("go"));
    let (m, _) = t.wait_for("granter's refusal", |m| m["from"] == "granter" && m["body"]["type"] == "error");
    assert!(m["body"]["reason"].as_str().unwrap().contains("may not grant"), "{m}");
    // The console may ask too; a bad request is answered with the reason.
    t.w().send(Some("http"), Some("c1"), None, json!({"type": "request", "url": format!("{base}/from-console")}));
    let (m, _) = t.wait_for("the console's response", |m| m["reply_to"] == "console/c1");
    assert_eq!((m["from"].as_str(), m["body"]["body"].as_str()), (Some("http"), Some("hello")), "{m}");
    t.w().send(Some("http"), Some("c2"), None, json!({"type": "request", "url": "file:///etc/passwd"}));
    let (m, _) = t.wait_for("the refusal", |m| m["reply_to"] == "console/c2");
    assert_eq!(m["body"]["type"], "http_failed", "{m}");
    // Only the declared actor and the console reached the server.
    let got = requests.lock().unwrap().clone();
    assert_eq!(got, vec!["GET /from-actor HTTP/1.1".to_owned(), "GET /from-console HTTP/1.1".to_owned()]);
}

/// No actor receives the host's environment (where provider keys live):
/// a C actor counts its environment variables and lists its arguments.
#[test]
fn actors_see_no_host_environment() {
    assert!(std::env::vars_os().count() > 0, "the test process has an environment to leak");
    let t = TestWorld::new();
    let src = t.file(
        "env/env.c",
        r#"#include <stdio.h>
extern char **environ;
int main(int argc, char **argv) {
    char line[4096];
    int n = 0;
    while (environ && environ[n]) n++;
    if (fgets(line, sizeof line, stdin)) {
        printf("{\"body\":{\"env\":%d,\"args\":%d}}\n", n, argc);
        fflush(stdout);
    }
    return 0;
}
"#,
    );
    let out = t.dir.path().join("env/env.wasm");
    common::clang::build_c_actor(&src, &out);
    assert_eq!(t.req(json!({"type":"spawn","id":"env","wasm":out}))["type"], "ok");
    t.subscribe_console("env");
    t.w().send(Some("env"), None, None, json!("go"));
    let (m, _) = t.wait_for("the count", |m| m["from"] == "env" && m["body"]["env"].is_u64());
    assert_eq!(m["body"]["env"], 0, "{m}");
    assert!(m["body"]["args"].as_u64().unwrap() <= 1, "{m}");
}
