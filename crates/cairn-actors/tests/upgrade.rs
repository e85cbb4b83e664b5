//! Upgrades gated by transcript tests, the swap with the parked message,
//! crash-loop rollback and explicit rollback / roll-forward.

use crate::common;

use common::*;
use serde_json::json;

#[test]
fn failing_transcript_refuses_and_passing_one_swaps_with_the_parked_message() {
    let t = TestWorld::new();
    // v1 traps on every input: the message that killed it is parked.
    assert_eq!(t.spawn("u", &trap_on_input())["type"], "ok");
    t.subscribe_console("u");
    t.w().send(Some("u"), None, None, json!({"k": "parked"}));
    t.wait_state("u", "a crash", |s| s["state"] == "restarting" || t.read("actor/u/stderr.log").contains("crashed"));

    // A candidate that fails its transcript is refused; v1 stays.
    let bad = t.dir.path().join("bad");
    write_tests(&bad, "echo.jsonl", &[json!({"send": {"x": 1}}), json!({"expect": {"x": 1}})]);
    let badw = t.file("bad/actor.wat", &trap_on_input());
    let r = t.req(json!({"type":"upgrade","id":"u","wasm":badw,"source":bad}));
    assert_eq!(r["type"], "error", "{r}");
    assert!(r["reason"].as_str().unwrap().contains("refused"), "{r}");
    assert!(r["reason"].as_str().unwrap().contains("echo.jsonl:2"), "{r}");
    assert_eq!(t.actor_state("u")["version"], 1);
    assert!(!t.root().join("broker/versions/u/2").exists());

    // A passing candidate is swapped in and gets the parked message first.
    let good = t.dir.path().join("good");
    write_tests(&good, "echo.jsonl", &[json!({"send": {"x": 1}}), json!({"expect": {"x": 1}})]);
    let goodw = t.file("good/actor.wat", &echo());
    let r = t.req(json!({"type":"upgrade","id":"u","wasm":goodw,"source":good,"built_by":"test"}));
    assert_eq!(r["type"], "ok", "{r}");
    assert_eq!(r["version"], 2);
    assert_eq!(r["tests"], 1);
    t.wait_for("parked message redelivered", |m| m["body"] == json!({"k": "parked"}));
    assert!(t.root().join("actor/u/source/tests/echo.jsonl").exists());
    assert!(t.root().join("broker/versions/u/1/snapshot/data").exists());
}

#[test]
fn smoke_test_refuses_a_candidate_that_dies_at_once() {
    let t = TestWorld::new();
    t.spawn("s", &echo());
    let w = t.file("dies.wat", &actor("", "unreachable", ""));
    let r = t.req(json!({"type":"upgrade","id":"s","wasm":w}));
    assert_eq!(r["type"], "error", "{r}");
    assert!(r["reason"].as_str().unwrap().contains("smoke test"), "{r}");
}

#[test]
fn crash_loop_after_upgrade_rolls_back_and_tells_the_requester() {
    let t = TestWorld::new();
    t.spawn("c", &echo());
    t.subscribe_console("c");
    // v2 passes its transcript but traps on "boom".
    let src = t.dir.path().join("v2");
    write_tests(&src, "t.jsonl", &[json!({"send": "hi"}), json!({"expect": "hi"})]);
    let w = t.file("v2/actor.wat", &boom());
    let r = t.req(json!({"type":"upgrade","id":"c","wasm":w,"source":src}));
    assert_eq!(r["version"], 2, "{r}");
    // Keep sending "boom" until the broker gives up on v2.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let rolled = loop {
        assert!(std::time::Instant::now() < deadline, "no rollback within 60 s");
        t.w().send(Some("c"), None, None, json!("boom"));
        if let Some(m) = t.w().recv(std::time::Duration::from_millis(200)) {
            let v = serde_json::to_value(&m).unwrap();
            if v["body"]["type"] == "rolled_back" {
                break v;
            }
        }
    };
    assert_eq!(rolled["from"], "broker");
    assert_eq!(rolled["body"]["from"], 2);
    assert_eq!(rolled["body"]["to"], 1);
    let s = t.wait_state("c", "running v1", |s| s["state"] == "running");
    assert_eq!(s["version"], 1);
    // v1 echoes "boom" instead of trapping.
    t.w().send(Some("c"), Some("final"), None, json!("boom"));
    t.wait_for("v1 echo of boom", |m| m["body"] == "boom" && m["from"] == "c");
}

#[test]
fn explicit_rollback_and_roll_forward() {
    let t = TestWorld::new();
    t.spawn("r", &echo());
    t.subscribe_console("r");
    let v2 = t.file("v2.wat", &actor("{\"body\":\"v2\"}\n", "", ""));
    assert_eq!(t.req(json!({"type":"upgrade","id":"r","wasm":v2}))["version"], 2);
    std::fs::write(t.root().join("data/r/state"), "v2 data").unwrap();
    let r = t.req(json!({"type":"rollback","id":"r"}));
    assert_eq!(r["type"], "rolled_back", "{r}");
    assert_eq!(r["to"], 1);
    assert_eq!(t.actor_state("r")["version"], 1);
    // v1 had no data; v2's data was snapshotted first.
    assert!(!t.root().join("data/r/state").exists());
    assert_eq!(t.read("broker/versions/r/2/snapshot/data/state"), "v2 data");
    let r = t.req(json!({"type":"rollback","id":"r","version":2}));
    assert_eq!(r["to"], 2, "{r}");
    assert_eq!(t.read("data/r/state"), "v2 data");
    t.w().send(Some("r"), None, None, json!("x"));
    t.wait_for("v2 prefix", |m| m["body"] == "v2");
    let r = t.req(json!({"type":"rollback","id":"r","version":9}));
    assert_eq!(r["type"], "error", "{r}");
    // remove archives everything, deletes nothing.
    let r = t.req(json!({"type":"remove","id":"r"}));
    assert_eq!(r["type"], "ok", "{r}");
    assert!(t.root().join("archive/r-1/versions/2/actor.wat").exists());
    assert!(t.root().join("archive/r-1/data/state").exists());
    assert!(!t.root().join("actor/r").exists());
}
