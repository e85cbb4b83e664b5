//! `cairn world init|run` as a user scripts it: the real binary, a WAT
//! actor deployed, upgraded and rolled back through the console on stdin.
#![cfg(feature = "actors")]
// Helpers (not #[test] functions) unwrap too: a failure is the test's.
#![allow(clippy::unwrap_used)]

#[path = "../../cairn-actors/tests/common/clang.rs"]
mod clang;
use crate::util;

use std::io::Write;
use std::process::Stdio;

use util::Env;

/// Echoes stdin to stdout; `tag` is written once, before the first echo.
fn echo(tag: &str) -> String {
    let line = format!("{{\"body\":\"{tag}\"}}\n");
    let esc: String = line.bytes().map(|b| format!("\\{b:02x}")).collect();
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "fd_read" (func $r (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (data (i32.const 4096) "{esc}")
  (func (export "_start") (local $n i32) (local $first i32)
    (local.set $first (i32.const 1))
    (block $done (loop $next
      (i32.store (i32.const 16) (i32.const 65536))
      (i32.store (i32.const 20) (i32.const 65536))
      (drop (call $r (i32.const 0) (i32.const 16) (i32.const 1) (i32.const 24)))
      (local.set $n (i32.load (i32.const 24)))
      (br_if $done (i32.eqz (local.get $n)))
      (if (local.get $first) (then
        (local.set $first (i32.const 0))
        (i32.store (i32.const 0) (i32.const 4096))
        (i32.store (i32.const 4) (i32.const {len}))
        (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))
      (i32.store (i32.const 0) (i32.const 65536))
      (i32.store (i32.const 4) (local.get $n))
      (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
      (br $next)))))"#,
        len = line.len()
    )
}

/// Waits for each message it needs by what it is, never by counting
/// messages: an upgrade's old version echoes its shutdown, and a count
/// taken by that echo let `/list` run before the rollback had finished
/// (flaky under load).
#[test]
fn console_deploys_upgrades_and_rolls_back() {
    let env = Env::new();
    std::fs::write(env.cwd.join("v1.wat"), echo("v1")).unwrap();
    std::fs::write(env.cwd.join("v2.wat"), echo("v2")).unwrap();
    let out = env.cairn(&["world", "init", "w"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut run = Running::start(env.cairn(&["world", "run", "--no-agent", "w"]));
    run.say("/deploy hello v1.wat");
    run.wait("the spawn", |v| v["type"] == "ok" && v["request"] == "spawn" && v["version"] == 1);
    run.say(r#"@broker {"type":"subscribe","actor":"hello"}"#);
    run.wait("the subscription", |v| v["from"] == "broker" && v["body"]["request"] == "subscribe");
    run.say(r#"@hello {"n":1}"#);
    run.wait("v1's tag", |v| v["from"] == "hello" && v["body"] == "v1");
    run.wait("v1's echo", |v| v["from"] == "hello" && v["body"]["n"] == 1);
    run.say("/deploy hello v2.wat");
    run.wait("the upgrade", |v| v["type"] == "ok" && v["request"] == "upgrade" && v["version"] == 2);
    run.say(r#"@hello {"n":2}"#);
    run.wait("v2's tag", |v| v["from"] == "hello" && v["body"] == "v2");
    run.wait("v2's echo", |v| v["from"] == "hello" && v["body"]["n"] == 2);
    run.say(r#"@broker {"type":"rollback","id":"hello"}"#);
    run.wait("the rollback", |v| v["from"] == "broker" && v["body"]["type"] == "rolled_back" && v["body"]["to"] == 1);
    run.say("/list");
    let list = run.wait("the list", |v| v["type"] == "list");
    assert_eq!(
        (list["actors"][0]["version"].as_u64(), list["actors"][0]["state"].as_str()),
        (Some(1), Some("running")),
        "{list}"
    );
    run.say("/bogus");
    run.wait_line("the error", |l| l.starts_with("error: unknown command /bogus"));
    run.quit();
    assert!(env.cwd.join("w/broker/versions/hello/2/meta.json").exists());
}

/// Issue 49.7: the README's world transcript runs as written with the
/// repository's examples/world/v1.wat and v2.wat: its console lines are
/// typed in order and every message it shows arrives (ids aside; in any
/// order, as the broker's and the actor's lines may interleave).
#[test]
fn the_readme_world_transcript_runs_with_the_repository_examples() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let start = readme.find("$ cairn world init w\n").expect("the README's world transcript");
    let transcript = &readme[start..readme[start..].find("```").unwrap() + start];
    let env = Env::new();
    std::os::unix::fs::symlink(std::fs::canonicalize(repo.join("examples")).unwrap(), env.cwd.join("examples"))
        .unwrap();
    let out = env.cairn(&["world", "init", "w"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Ids and reply ids number messages; the rest is what the README shows.
    let shape = |v: &serde_json::Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("id");
            o.remove("reply_to");
        }
        v
    };
    let mut run = Running::start(env.cairn(&["world", "run", "w"]));
    let mut unmatched: Vec<serde_json::Value> = Vec::new();
    let mut inputs = 0;
    for line in transcript.lines().skip(2) {
        if line.starts_with('/') || line.starts_with('@') {
            assert!(!line.contains(" #"), "a console line holds no comment: {line}");
            if line == "/quit" {
                continue;
            }
            run.say(line);
            inputs += 1;
            continue;
        }
        let want = shape(&serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}")));
        if let Some(i) = unmatched.iter().position(|v| *v == want) {
            unmatched.remove(i);
            continue;
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let Ok(l) = run.lines.recv_timeout(left) else {
                panic!("the README shows {line} but it never came; saw:\n{}", run.seen.join("\n"));
            };
            run.seen.push(l.clone());
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&l) else { continue };
            if shape(&v) == want {
                break;
            }
            unmatched.push(shape(&v));
        }
    }
    assert_eq!(inputs, 5, "the transcript's console lines: {transcript}");
    run.quit();
}

/// Issue 28: the crash-loop count survives a SIGKILL of the host. Version
/// 2 passes its smoke test (no input) but traps on every message; one
/// crash, SIGKILL, then two more in the next run: the third rolls back.
#[test]
fn a_crash_loop_counted_across_a_sigkill_still_rolls_back() {
    let env = Env::new();
    std::fs::write(env.cwd.join("v1.wat"), echo("v1")).unwrap();
    std::fs::write(env.cwd.join("v2.wat"), trap_on_input()).unwrap();
    let out = env.cairn(&["world", "init", "w"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut run = Running::start(env.cairn(&["world", "run", "--no-agent", "w"]));
    run.say("/deploy hello v1.wat");
    run.wait("the spawn", |v| v["type"] == "ok" && v["request"] == "spawn");
    run.say("/deploy hello v2.wat");
    run.wait("the upgrade", |v| v["type"] == "ok" && v["request"] == "upgrade" && v["version"] == 2);
    run.say(r#"@hello {"n":1}"#);
    // The crashes this run saw, from the actor's status file (the broker
    // writes it after each crash is counted).
    let status = env.cwd.join("w/actor/hello/status.json");
    let until_crashes = |n: u64| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let text = std::fs::read_to_string(&status).unwrap_or_default();
            let s: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            if s["crashes"].as_u64().is_some_and(|c| c >= n) {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "crash {n} not seen: {text}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    until_crashes(1);
    let _ = run.kill9();
    // The next run writes its own count (from 0); the old file must not
    // answer for it.
    std::fs::remove_file(&status).unwrap();

    let mut run = Running::start(env.cairn(&["world", "run", "--no-agent", "w"]));
    // One message per crash: two lines sent at once can reach the guest
    // in one read, and make one crash (the second line dies with it).
    run.say(r#"@hello {"n":2}"#);
    until_crashes(1);
    run.say(r#"@hello {"n":3}"#);
    let rolled = run.wait("the automatic rollback", |v| v["from"] == "broker" && v["body"]["type"] == "rolled_back");
    assert_eq!((rolled["body"]["from"].as_u64(), rolled["body"]["to"].as_u64()), (Some(2), Some(1)), "{rolled}");
    assert_eq!(rolled["body"]["reason"], "3 crashes within 30 s after the upgrade", "{rolled}");
    run.say("/list");
    let list = run.wait("the list", |v| v["type"] == "list");
    assert_eq!(list["actors"][0]["version"], 1, "{list}");
    run.quit();
}

/// Traps on every message (a p1 module: reads one line, then
/// `unreachable`).
fn trap_on_input() -> String {
    r#"(module
  (import "wasi_snapshot_preview1" "fd_read" (func $r (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (func (export "_start")
    (i32.store (i32.const 16) (i32.const 1024))
    (i32.store (i32.const 20) (i32.const 1024))
    (drop (call $r (i32.const 0) (i32.const 16) (i32.const 1) (i32.const 24)))
    (if (i32.load (i32.const 24)) (then unreachable))))"#
        .to_owned()
}

/// Waits for the agent's answer itself, never with `/await` (which waits
/// for the next message, whatever it is: a count, so a race).
#[test]
fn the_agent_is_an_actor_whose_turns_use_the_actor_tools() {
    let env = Env::new();
    std::fs::write(env.cwd.join("v1.wat"), echo("v1")).unwrap();
    // Turn 1: spawn through the tool, then answer. Turn 2: list, answer.
    let script = env.script(&[
        serde_json::json!({"toolCalls": [{"id": "c1", "name": "actor_spawn", "arguments": {"id": "hello", "wasm": "v1.wat"}}]}),
        serde_json::json!({"text": "spawned hello"}),
    ]);
    let out = env.cairn(&["world", "init", "w"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut run = Running::start(env.cairn(&[
        "--script",
        script.to_str().unwrap(),
        "--allow",
        "actor_spawn",
        "world",
        "run",
        "w",
    ]));
    run.say("please spawn hello");
    let answer = run.wait("the agent's answer", |v| v["from"] == "agent");
    assert_eq!(answer["body"]["text"], "spawned hello", "{answer}");
    assert!(answer["reply_to"].as_str().is_some_and(|r| r.starts_with("m-")), "{answer}");
    run.say("/list");
    let list = run.wait("the list", |v| v["type"] == "list");
    assert_eq!(list["actors"][0]["id"], "hello", "{list}");
    assert_eq!(list["actors"][0]["spawner"], "agent", "{list}");
    run.quit();
    // The agent's session is an ordinary cairn session, named in the world.
    let named = std::fs::read_to_string(env.cwd.join("w/broker/agent-session")).unwrap();
    assert!(std::path::Path::new(named.trim()).exists(), "{named}");
    assert!(std::fs::read_to_string(named.trim()).unwrap().contains("actor_spawn"));
}

/// A running `cairn world run`: its stdin kept open, its stdout read line
/// by line on a thread (so the test can wait for one line, then act).
struct Running {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    fn start(mut cmd: std::process::Command) -> Running {
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(stdout).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Running { child, stdin, lines, seen: Vec::new() }
    }

    fn say(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Waits (at most 180 s, then fails saying what was seen) for a stdout
    /// line that is JSON and satisfies `pred`.
    fn wait(&mut self, what: &str, pred: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let Ok(l) = self.lines.recv_timeout(left) else {
                panic!("no line {what} within 180 s; saw:\n{}", self.seen.join("\n"));
            };
            self.seen.push(l.clone());
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&l)
                && pred(&v)
            {
                return v;
            }
        }
    }

    /// Waits (at most 180 s) for a stdout line for which `pred` holds.
    fn wait_line(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let Ok(l) = self.lines.recv_timeout(left) else {
                panic!("no line {what} within 180 s; saw:\n{}", self.seen.join("\n"));
            };
            self.seen.push(l.clone());
            if pred(&l) {
                return l;
            }
        }
    }

    /// SIGKILL: no shutdown, no flush, no lock release but the kernel's.
    /// Returns every line seen.
    fn kill9(mut self) -> Vec<String> {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.seen.extend(self.lines.try_iter());
        self.seen
    }

    /// `/quit`, then the exit status must be success.
    fn quit(mut self) -> Vec<String> {
        self.say("/quit");
        drop(self.stdin);
        let status = self.child.wait().unwrap();
        self.seen.extend(self.lines.iter());
        assert!(status.success(), "{}", self.seen.join("\n"));
        self.seen
    }
}

/// Builds a C actor with clang (Debian's wasi-libc), as `cc` would.
fn clang(env: &Env, name: &str, source: &str) -> std::path::PathBuf {
    let src = env.cwd.join(format!("{name}.c"));
    let out = env.cwd.join(format!("{name}.wasm"));
    std::fs::write(&src, source).unwrap();
    clang::build_c_actor(&src, &out);
    out
}

/// A C actor answering every message not from the broker and not itself a
/// reply with `{"version": VERSION}` to its sender, as a reply.
fn versioned_c(version: u32) -> String {
    format!(
        r#"#include <stdio.h>
#include <string.h>
static void field(const char *line, const char *key, char *out, size_t n) {{
    const char *p = strstr(line, key);
    size_t i = 0;
    if (p) {{
        p += strlen(key);
        while (p[i] && p[i] != '"' && i + 1 < n) {{ out[i] = p[i]; i++; }}
    }}
    out[i] = 0;
}}
int main(void) {{
    static char line[65536];
    char id[256], from[256];
    while (fgets(line, sizeof line, stdin)) {{
        if (strstr(line, "\"from\":\"broker\"") || strstr(line, "\"reply_to\"")) continue;
        field(line, "\"id\":\"", id, sizeof id);
        field(line, "\"from\":\"", from, sizeof from);
        printf("{{\"to\":\"%s\",\"reply_to\":\"%s\",\"body\":{{\"version\":%d}}}}\n", from, id, {version});
        fflush(stdout);
    }}
    return 0;
}}
"#
    )
}

/// Every value anywhere in `v` (strings holding JSON included) for which
/// `f` returns something, in document order.
fn find_all<T>(v: &serde_json::Value, f: &dyn Fn(&serde_json::Value) -> Option<T>, out: &mut Vec<T>) {
    if let Some(t) = f(v) {
        out.push(t);
    }
    match v {
        serde_json::Value::Object(m) => m.values().for_each(|x| find_all(x, f, out)),
        serde_json::Value::Array(a) => a.iter().for_each(|x| find_all(x, f, out)),
        serde_json::Value::String(s) if s.starts_with('{') => {
            if let Ok(inner) = serde_json::from_str::<serde_json::Value>(s) {
                find_all(&inner, f, out);
            }
        }
        _ => {}
    }
}

#[test]
fn the_agent_builds_a_c_actor_through_cc_deploys_upgrades_and_rolls_it_back() {
    let env = Env::new();
    let out = env.cairn(&["world", "init", "w"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let wasm = "w/broker/builds/agent/hello/actor.wasm";
    let source = "w/broker/builds/agent/hello/source";
    let call = |id: &str, name: &str, args: serde_json::Value| serde_json::json!({"toolCalls": [{"id": id, "name": name, "arguments": args}]});
    let ask = |id: &str| call(id, "actor_send", serde_json::json!({"to": "hello", "body": {"q": id}, "wait_secs": 60}));
    let script = env.script(&[
        call("b1", "actor_build", serde_json::json!({"name": "hello", "files": {"main.c": versioned_c(1)}})),
        call("s1", "actor_spawn", serde_json::json!({"id": "hello", "wasm": wasm, "source": source, "built_by": "cc"})),
        ask("q1"),
        call(
            "b2",
            "actor_build",
            serde_json::json!({"name": "hello", "files": {"main.c": versioned_c(2),
                "tests/answers.jsonl": "{\"send\": {\"q\": \"t\"}}\n{\"expect\": {\"version\": 2}}\n"}}),
        ),
        call(
            "u2",
            "actor_upgrade",
            serde_json::json!({"id": "hello", "wasm": wasm, "source": source, "built_by": "cc"}),
        ),
        ask("q2"),
        call("r1", "actor_rollback", serde_json::json!({"id": "hello"})),
        ask("q3"),
        serde_json::json!({"text": "hello: built, deployed, upgraded to 2, rolled back to 1"}),
    ]);
    let mut args = vec!["--script", script.to_str().unwrap()];
    for t in ["actor_build", "actor_spawn", "actor_send", "actor_upgrade", "actor_rollback"] {
        args.extend(["--allow", t]);
    }
    args.extend(["world", "run", "w"]);
    let mut run = Running::start(env.cairn(&args));
    run.say("please write hello in C, deploy it, upgrade it and roll it back");
    let answer = run.wait("the agent's answer", |v| v["from"] == "agent");
    assert_eq!(answer["body"]["text"], "hello: built, deployed, upgraded to 2, rolled back to 1", "{answer}");
    run.say("/list");
    let list = run.wait("the list", |v| v["type"] == "list");
    let hello = &list["actors"][0];
    assert_eq!(
        (hello["id"].as_str(), hello["version"].as_u64(), hello["latest"].as_u64()),
        (Some("hello"), Some(1), Some(2)),
        "{list}"
    );
    run.quit();

    // The session's receipts: every tool call succeeded, and the three
    // answers came from versions 1, 2, then 1 again.
    let named = std::fs::read_to_string(env.cwd.join("w/broker/agent-session")).unwrap();
    let log: Vec<serde_json::Value> =
        std::fs::read_to_string(named.trim()).unwrap().lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let mut versions = Vec::new();
    for entry in &log {
        find_all(entry, &|v| v.get("reply")?.get("body")?.get("version")?.as_u64(), &mut versions);
    }
    assert_eq!(versions, vec![1, 2, 1], "answers in the session");
    let mut exits = Vec::new();
    for entry in &log {
        find_all(entry, &|v| Some((v.get("exitCode").or(v.get("exit_code"))?.as_i64()?, v.to_string())), &mut exits);
    }
    assert_eq!(exits.len(), 8, "one receipt per call: {exits:#?}");
    assert!(exits.iter().all(|(code, _)| *code == 0), "{exits:#?}");
    // cc's build went through the broker's version store, with its source
    // and transcript; the upgrade ran that transcript.
    assert!(env.cwd.join("w/broker/versions/hello/2/source/tests/answers.jsonl").is_file());
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(env.cwd.join("w/broker/versions/hello/2/meta.json")).unwrap())
            .unwrap();
    assert_eq!((meta["built_by"].as_str(), meta["requested_by"].as_str()), (Some("cc"), Some("agent")));
}

#[test]
fn queued_mailbox_messages_survive_a_sigkill_of_the_host() {
    let env = Env::new();
    std::fs::write(env.cwd.join("echo.wat"), echo("up")).unwrap();
    let out = env.cairn(&["world", "init", "w"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut run = Running::start(env.cairn(&["world", "run", "--no-agent", "w"]));
    run.say("/deploy hello echo.wat");
    run.wait("the spawn", |v| v["request"] == "spawn" && v["type"] == "ok");
    // Stopped, the actor reads nothing: what is sent to it waits in its
    // mailbox.
    run.say(r#"@broker {"type":"stop","id":"hello"}"#);
    run.wait("the stop", |v| v["body"]["request"] == "stop");
    for n in 1..=5 {
        run.say(&format!(r#"@hello {{"n":{n}}}"#));
    }
    // The broker handles events in order: once /list is answered the five
    // messages are in the mailbox (and its journal).
    run.say("/list");
    let list = run.wait("the list", |v| v["type"] == "list");
    assert_eq!(list["actors"][0]["state"], "stopped", "{list}");
    let before = run.kill9();

    let mut run = Running::start(env.cairn(&["world", "run", "--no-agent", "w"]));
    run.say(r#"@broker {"type":"subscribe","actor":"hello"}"#);
    run.wait("the subscription", |v| v["body"]["request"] == "subscribe");
    run.say(r#"@broker {"type":"start","id":"hello"}"#);
    let mut got = Vec::new();
    while got.len() < 5 {
        let v = run.wait("an echoed message", |v| v["from"] == "hello" && v["body"]["n"].is_u64());
        got.push(v["body"]["n"].as_u64().unwrap());
    }
    assert_eq!(got, vec![1, 2, 3, 4, 5], "every queued message, once, in order");
    let seen = run.quit();
    let dup = seen.iter().filter(|l| l.contains(r#""n":"#) && l.contains(r#""from":"hello""#)).count();
    assert_eq!(dup, 5, "no message twice: {seen:#?}");
    // Broker ids are never handed out twice, though the first run ended
    // without saving its registry: the journaled messages keep theirs.
    let journal = std::fs::read_to_string(env.cwd.join("w/broker/mailbox/hello.jsonl")).unwrap();
    let ids = |text: &str| -> Vec<String> {
        let mut out = Vec::new();
        for l in text.lines() {
            let json = l.trim_start_matches(|c: char| "+-^=#x0123456789 ".contains(c));
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(json) {
                find_all(&v, &|x| x.get("id")?.as_str().filter(|i| i.starts_with("m-")).map(str::to_owned), &mut out);
            }
        }
        out
    };
    let first: std::collections::BTreeSet<String> = ids(&before.join("\n")).into_iter().chain(ids(&journal)).collect();
    let again: Vec<String> = ids(&seen.join("\n")).into_iter().filter(|i| first.contains(i)).collect();
    assert!(again.is_empty(), "ids of the first run handed out again: {again:?}\n{before:#?}\n{seen:#?}");
}

#[test]
fn messages_to_the_agent_wait_in_its_journal_through_a_sigkill() {
    let env = Env::new();
    let out = env.cairn(&["world", "init", "w"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // No agent runs: the message waits for it.
    let mut run = Running::start(env.cairn(&["world", "run", "--no-agent", "w"]));
    run.say("are you there?");
    run.say("/list");
    run.wait("the list", |v| v["type"] == "list");
    let _ = run.kill9();
    let journal = std::fs::read_to_string(env.cwd.join("w/broker/mailbox/agent.jsonl")).unwrap();
    assert!(journal.contains("are you there?"), "{journal}");

    // The next run with an agent answers it.
    let script = env.script(&[serde_json::json!({"text": "yes, here"})]);
    let mut run = Running::start(env.cairn(&["--script", script.to_str().unwrap(), "world", "run", "w"]));
    let answer = run.wait("the agent's answer", |v| v["from"] == "agent");
    assert_eq!(answer["body"]["text"], "yes, here", "{answer}");
    assert!(answer["reply_to"].as_str().is_some_and(|r| r.starts_with("m-")), "{answer}");
    run.quit();
    let named = std::fs::read_to_string(env.cwd.join("w/broker/agent-session")).unwrap();
    assert!(std::fs::read_to_string(named.trim()).unwrap().contains("are you there?"));
    // Answered, it left the mailbox.
    let left = cairn_actors::mailbox::Mailbox::open(&env.cwd.join("w/broker/mailbox/agent.jsonl")).unwrap();
    assert_eq!(left.entries(), Vec::new());
}

#[test]
fn a_turn_cut_by_a_sigkill_resumes_and_answers_its_original_sender() {
    let env = Env::new();
    // `asker`: a message from the console makes it ask the agent; anything
    // else it receives (the agent's messages) is echoed to its subscribers.
    let asker = clang(
        &env,
        "asker",
        r#"#include <stdio.h>
#include <string.h>
int main(void) {
    static char line[65536];
    while (fgets(line, sizeof line, stdin)) {
        if (strstr(line, "\"from\":\"console\""))
            puts("{\"to\":\"agent\",\"body\":{\"type\":\"text\",\"text\":\"please think hard\"}}");
        else if (!strstr(line, "\"from\":\"broker\""))
            fputs(line, stdout);
        fflush(stdout);
    }
    return 0;
}
"#,
    );
    let out = env.cairn(&["world", "init", "w"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The turn's first step waits (600 s) for a reply asker never sends;
    // after the resume, the turn ends with its answer.
    let script = env.script(&[
        serde_json::json!({"toolCalls": [{"id": "w1", "name": "actor_send", "arguments":
            {"to": "asker", "body": {"hold": 1}, "wait_secs": 600}}]}),
        serde_json::json!({"text": "the resumed answer"}),
    ]);
    let args = ["--script", script.to_str().unwrap(), "--allow", "actor_send", "world", "run", "w"];
    let mut run = Running::start(env.cairn(&args));
    run.say(&format!("/deploy asker {}", asker.display()));
    run.wait("the spawn", |v| v["request"] == "spawn" && v["type"] == "ok");
    run.say(r#"@broker {"type":"subscribe","actor":"asker"}"#);
    run.wait("the subscription", |v| v["body"]["request"] == "subscribe");
    run.say(r#"@asker "go""#);
    // asker echoes the agent's {"hold":1}: the turn is inside its tool call.
    run.wait("the agent's tool call reaching asker", |v| v["from"] == "asker" && v["body"]["hold"] == 1);
    let _ = run.kill9();

    let mut run = Running::start(env.cairn(&args));
    let echoed = run.wait("the resumed answer, echoed by asker", |v| {
        v["from"] == "asker" && v["body"]["text"] == "the resumed answer"
    });
    assert_eq!(echoed["body"]["resumed"], true, "{echoed}");
    assert!(echoed["reply_to"].as_str().is_some_and(|r| r.starts_with("m-")), "{echoed}");
    let seen = run.quit();
    assert!(
        !seen.iter().any(|l| l.contains(r#""from":"agent""#)),
        "the answer went to asker, not the console: {seen:#?}"
    );
}

/// Issues 28 and 48.5: what a host crash loses between a mailbox and a
/// slow actor is at most two messages per actor (README, ARCHITECTURE):
/// the line in the stdin pipe (which holds one line at a time) and the one
/// the guest was handling. 300 small messages to an actor that takes each,
/// works on it for 20 ms, records it in a file of its own (committed at
/// close, so the record outlives the kill) and echoes it; the host is
/// killed -9 three times during the stream, each time once an echo past a
/// mark was seen, and a last run takes the rest. Every message missing
/// from the records is a loss; the losses of one kill are consecutive,
/// and each kill loses at most two. (The 4 KiB pipe filled with lines lost
/// 79 of them; a line taken from the journal before the pipe had room for
/// it made a third.)
#[test]
fn a_host_crash_loses_at_most_what_fits_in_the_stdin_pipe() {
    let env = Env::new();
    let slow = clang(
        &env,
        "slow",
        r#"#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(void) {
    static char line[65536];
    while (fgets(line, sizeof line, stdin)) {
        const char *n = strstr(line, "\"n\":");
        usleep(20000);
        if (n && n[4] != '"') {
            char path[64];
            snprintf(path, sizeof path, "/data/got-%d", atoi(n + 4));
            int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd < 0 || write(fd, "1", 1) != 1 || close(fd) != 0) return 1;
        }
        fputs(line, stdout);
        fflush(stdout);
    }
    return 0;
}
"#,
    );
    let out = env.cairn(&["world", "init", "w"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let args = ["world", "run", "--no-agent", "w"];
    // Small messages: the 4 KiB pipe held 79 of them (all lost at a kill
    // -9) before it was kept to one line at a time.
    let pad = "p".repeat(8);
    let mut run = Running::start(env.cairn(&args));
    run.say(&format!("/deploy slow {}", slow.display()));
    run.wait("the spawn", |v| v["request"] == "spawn" && v["type"] == "ok");
    run.say(r#"@broker {"type":"subscribe","actor":"slow"}"#);
    run.wait("the subscription", |v| v["body"]["request"] == "subscribe");
    for n in 0..300 {
        run.say(&format!(r#"@slow {{"n":{n},"pad":"{pad}"}}"#));
    }
    let kills = [20, 110, 200];
    for mark in &kills {
        run.wait("an echo past the mark", |v| {
            v["from"] == "slow" && v["body"]["n"].as_u64().is_some_and(|n| n >= *mark)
        });
        let _ = run.kill9();
        run = Running::start(env.cairn(&args));
        run.say(r#"@broker {"type":"subscribe","actor":"slow"}"#);
        run.wait("the subscription", |v| v["body"]["request"] == "subscribe");
    }
    run.say(r#"@slow {"n":"end"}"#);
    run.wait("the last echo", |v| v["from"] == "slow" && v["body"]["n"] == "end");
    run.quit();
    let got = env.cwd.join("w/data/slow");
    let lost: Vec<u64> = (0..300).filter(|n| !got.join(format!("got-{n}")).exists()).collect();
    // Consecutive runs of lost numbers: one per kill at most.
    let mut runs: Vec<Vec<u64>> = Vec::new();
    for n in &lost {
        match runs.last_mut() {
            Some(r) if r.last() == Some(&(n - 1)) => r.push(*n),
            _ => runs.push(vec![*n]),
        }
    }
    let bound = 2;
    eprintln!("{} kills, lost {} of 300 (bound {bound} per kill): {runs:?}", kills.len(), lost.len());
    assert!(runs.len() <= kills.len(), "losses in more places than kills: {runs:?}");
    for r in &runs {
        assert!(r.len() <= bound, "a kill lost {} messages (bound {bound}): {runs:?}", r.len());
    }
}

/// Issue 50.6: the agent's turns are equipped as every face's
/// (`equip::turn`), not once per world: discovery ranks the installed
/// skills and tools for each message and records its choice in the agent's
/// session before that turn's first entry, once per prompt.
#[test]
fn each_agent_turn_is_equipped_with_discovery_like_every_face() {
    let env = Env::new();
    let skill = env.home.join("sk").join("photo-editing");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: photo-editing\ndescription: How to resize and prepare photos\n---\nKeep EXIF.\n",
    )
    .unwrap();
    let script =
        env.script(&[serde_json::json!({"text": "first answer"}), serde_json::json!({"text": "second answer"})]);
    let out = env.cairn(&["world", "init", "w"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut cmd = env.cairn(&["--script", script.to_str().unwrap(), "world", "run", "w"]);
    // BM25: the ranking needs no model, and still records its choice.
    cmd.env("CAIRN_MINILM_DIR", env.home.join("no-model-here"));
    let mut run = Running::start(cmd);
    run.say("please resize this photo");
    let answer = run.wait("the first answer", |v| v["from"] == "agent");
    assert_eq!(answer["body"]["text"], "first answer", "{answer}");
    run.say("and prepare another photo");
    let answer = run.wait("the second answer", |v| v["from"] == "agent");
    assert_eq!(answer["body"]["text"], "second answer", "{answer}");
    run.quit();
    let named = std::fs::read_to_string(env.cwd.join("w/broker/agent-session")).unwrap();
    let log = std::fs::read_to_string(named.trim()).unwrap();
    assert_eq!(log.matches("\"discovery\"").count(), 2, "one recorded choice per message: {log}");
    let fact = log.lines().position(|l| l.contains("\"discovery\"")).unwrap();
    let first_entry = log.lines().position(|l| l.contains("\"message\"")).unwrap();
    assert!(fact < first_entry, "the choice is recorded before the turn: {log}");
}
