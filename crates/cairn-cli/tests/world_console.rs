//! `cairn world init|run` as a user scripts it: the real binary, a WAT
//! actor deployed, upgraded and rolled back through the console on stdin.
#![cfg(feature = "actors")]

mod util;

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

#[test]
fn console_deploys_upgrades_and_rolls_back() {
    let env = Env::new();
    std::fs::write(env.cwd.join("v1.wat"), echo("v1")).unwrap();
    std::fs::write(env.cwd.join("v2.wat"), echo("v2")).unwrap();
    let out = env.cairn(&["world", "init", "w"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let script = "\
/deploy hello v1.wat
@broker {\"type\":\"subscribe\",\"actor\":\"hello\"}
/await 30
@hello {\"n\":1}
/await 30
/await 30
/deploy hello v2.wat
@hello {\"n\":2}
/await 30
/await 30
@broker {\"type\":\"rollback\",\"id\":\"hello\"}
/await 30
/list
/bogus
/quit
";
    let mut child = env
        .cairn(&["world", "run", "--no-agent", "w"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let has = |pred: &dyn Fn(&serde_json::Value) -> bool| lines.iter().any(pred);
    assert!(has(&|v| v["type"] == "ok" && v["request"] == "spawn" && v["version"] == 1), "{text}");
    assert!(has(&|v| v["from"] == "hello" && v["body"] == "v1"), "{text}");
    assert!(has(&|v| v["from"] == "hello" && v["body"]["n"] == 1), "{text}");
    assert!(has(&|v| v["type"] == "ok" && v["request"] == "upgrade" && v["version"] == 2), "{text}");
    assert!(has(&|v| v["from"] == "hello" && v["body"] == "v2"), "{text}");
    assert!(has(&|v| v["from"] == "broker" && v["body"]["type"] == "rolled_back" && v["body"]["to"] == 1), "{text}");
    assert!(has(&|v| v["type"] == "list" && v["actors"][0]["version"] == 1), "{text}");
    assert!(text.contains("error: unknown command /bogus"), "{text}");
    // A second run while none holds the lock works; the registry kept the actor.
    assert!(env.cwd.join("w/broker/versions/hello/2/meta.json").exists());
}

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
    let console = "\
please spawn hello
/await 60
/list
/quit
";
    let mut child = env
        .cairn(&["--script", script.to_str().unwrap(), "--allow", "actor_spawn", "world", "run", "w"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(console.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let answer =
        lines.iter().find(|v| v["from"] == "agent").unwrap_or_else(|| panic!("no answer from the agent: {text}"));
    assert_eq!(answer["body"]["text"], "spawned hello", "{text}");
    assert!(answer["reply_to"].as_str().is_some_and(|r| r.starts_with("m-")), "{text}");
    let list = lines.iter().find(|v| v["type"] == "list").unwrap_or_else(|| panic!("no list: {text}"));
    assert_eq!(list["actors"][0]["id"], "hello", "{text}");
    assert_eq!(list["actors"][0]["spawner"], "agent", "{text}");
    // The agent's session is an ordinary cairn session, named in the world.
    let named = std::fs::read_to_string(env.cwd.join("w/broker/agent-session")).unwrap();
    assert!(std::path::Path::new(named.trim()).exists(), "{named}");
    assert!(std::fs::read_to_string(named.trim()).unwrap().contains("actor_spawn"));
}
