//! The agent's `actor_*` tools against a real world: each call goes to the
//! broker as `agent`, and the receipts say what happened.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use cairn_actors::tools::actor_tools;
use cairn_core::CancelToken;
use cairn_core::staged::{StagedDecision, StagedReview};
use cairn_core::tool::{Risk, Tool, ToolContext, ToolLimits, ToolReceipt, ToolRequest};
use common::*;
use serde_json::{Value, json};

fn call(tools: &[Arc<dyn Tool>], cwd: &std::path::Path, name: &str, args: Value) -> ToolReceipt {
    try_call(tools, cwd, name, args).unwrap_or_else(|e| panic!("{name} failed: {e}"))
}

fn try_call(tools: &[Arc<dyn Tool>], cwd: &std::path::Path, name: &str, args: Value) -> Result<ToolReceipt, String> {
    let tool = tools.iter().find(|t| t.spec().name == name).unwrap_or_else(|| panic!("no tool {name}"));
    let request = ToolRequest {
        invocation_id: "i".into(),
        call_id: "c".into(),
        session_id: "s".into(),
        tool: name.into(),
        arguments: args,
    };
    let cancel = CancelToken::new();
    let mut output = |_: &[u8]| {};
    let mut bypass = |_: &str| false;
    let mut review = |_: &StagedReview<'_>| StagedDecision::Apply { by: "test".into() };
    let mut ctx = ToolContext {
        cwd,
        cancel: &cancel,
        limits: ToolLimits { timeout: Duration::from_secs(600), output_cap: 16 * 1024 },
        output: &mut output,
        approve_bypass: &mut bypass,
        review_staged: &mut review,
        elicit: &mut |_, _| cairn_core::elicit::nobody(),
    };
    tool.execute(&request, &mut ctx).map_err(|e| e.to_string())
}

#[test]
fn tiers_are_as_the_issue_says() {
    let mut t = TestWorld::new();
    let tools = actor_tools(Arc::new(t.world.take().unwrap()));
    let tier = |n: &str| tools.iter().find(|t| t.spec().name == n).map(|t| t.spec().risk);
    assert_eq!(tier("actor_list"), Some(Risk::ReadOnly));
    assert_eq!(tier("actor_logs"), Some(Risk::ReadOnly));
    for n in ["actor_build", "actor_spawn", "actor_send", "actor_upgrade", "actor_rollback", "actor_stop"] {
        assert_eq!(tier(n), Some(Risk::Write), "{n}");
    }
    assert_eq!(tier("actor_remove"), Some(Risk::Destructive));
}

#[test]
fn the_agent_spawns_sends_upgrades_rolls_back_and_reads_logs() {
    let mut t = TestWorld::new();
    let cwd = t.dir.path().to_owned();
    t.file("v1.wat", &echo());
    t.file("v2/actor.wat", &actor("{\"to\":\"agent\",\"body\":\"v2 up\"}\n", "", ""));
    // The greeting is new behaviour: its transcript describes it, or the
    // live check (issue 48.7) would roll v2 back at its first answer.
    write_tests(
        &cwd.join("v2"),
        "echo.jsonl",
        &[json!({"send": {"q": 1}}), json!({"expect": "v2 up", "to": "agent"}), json!({"expect": {"q": 1}})],
    );
    let world = Arc::new(t.world.take().unwrap());
    let tools = actor_tools(world.clone());

    // Relative paths are taken from the session's cwd.
    let r = call(&tools, &cwd, "actor_spawn", json!({"id": "e", "wasm": "v1.wat"}));
    assert_eq!(r.exit_code, 0, "{}", r.output_summary);
    // The agent spawned it: the registry says so.
    let reg: Value =
        serde_json::from_str(&std::fs::read_to_string(t.root().join("broker/registry.json")).unwrap()).unwrap();
    assert_eq!(reg["actors"]["e"]["spawner"], "agent");

    // An echo answers nothing (its copy goes to subscribers, and has no
    // reply_to): waiting for a reply times out and says so.
    let r = call(&tools, &cwd, "actor_send", json!({"to": "e", "body": {"hi": 1}, "wait_secs": 0.5}));
    assert_eq!(r.exit_code, 1, "{}", r.output_summary);
    assert!(r.output_summary.contains("no reply"), "{}", r.output_summary);
    // Sending to nobody: the broker's undeliverable is the reply.
    let r = call(&tools, &cwd, "actor_send", json!({"to": "ghost", "body": 1, "wait_secs": 30}));
    assert_eq!(r.exit_code, 1, "{}", r.output_summary);
    assert_eq!(r.structured_output.as_ref().unwrap()["reply"]["body"]["type"], "undeliverable");

    // A refused upgrade (transcript fails) keeps v1 and says why.
    t.file("bad/actor.wat", &trap_on_input());
    write_tests(&cwd.join("bad"), "echo.jsonl", &[json!({"send": {"q": 1}}), json!({"expect": {"q": 1}})]);
    let r = call(&tools, &cwd, "actor_upgrade", json!({"id": "e", "wasm": "bad/actor.wat", "source": "bad"}));
    assert_eq!(r.exit_code, 1, "{}", r.output_summary);
    assert!(r.output_summary.contains("refused"), "{}", r.output_summary);

    let r = call(
        &tools,
        &cwd,
        "actor_upgrade",
        json!({"id": "e", "wasm": "v2/actor.wat", "source": "v2", "built_by": "agent"}),
    );
    assert_eq!(r.exit_code, 0, "{}", r.output_summary);
    assert_eq!(r.structured_output.as_ref().unwrap()["version"], 2);
    // v2 greets the agent on its first input.
    world.send(Some("e"), None, None, json!("poke"));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(std::time::Instant::now() < deadline, "v2 never wrote to the agent");
        if let Some(m) = world.recv_as("agent", Duration::from_millis(200))
            && m.body == "v2 up"
        {
            assert_eq!(m.from, "e");
            break;
        }
    }

    let r = call(&tools, &cwd, "actor_rollback", json!({"id": "e"}));
    assert_eq!(r.exit_code, 0, "{}", r.output_summary);
    assert_eq!(r.structured_output.as_ref().unwrap()["to"], 1);
    let r = call(&tools, &cwd, "actor_list", json!({}));
    let list = r.structured_output.unwrap();
    assert_eq!(list["actors"][0]["version"], 1, "{list}");

    let r = call(&tools, &cwd, "actor_logs", json!({"id": "e"}));
    assert_eq!(r.exit_code, 0, "{}", r.output_summary);
    assert_eq!(r.structured_output.as_ref().unwrap()["status"]["id"], "e");
    let e = try_call(&tools, &cwd, "actor_logs", json!({"id": "../etc"})).unwrap_err();
    assert!(e.contains("may only contain"), "{e}");
    let r = call(&tools, &cwd, "actor_logs", json!({"id": "nobody"}));
    assert!(r.exit_code != 0 && r.output_summary.contains("no actor"), "{}", r.output_summary);

    let r = call(&tools, &cwd, "actor_remove", json!({"id": "e"}));
    assert_eq!(r.exit_code, 0, "{}", r.output_summary);
    assert!(t.root().join("archive/e-1/versions/2").exists());
}

/// `actor_spawn` takes `limits` like the console's spawn, under the same
/// rule: the agent may lower an actor's limits below the world's, never
/// raise them. The lowered limit reaches the actor (one core instance is
/// too few for an adapted p1 module, which has several: it fails to
/// instantiate).
#[test]
fn the_agent_spawns_with_lower_limits_and_never_higher() {
    let mut t = TestWorld::new();
    let cwd = t.dir.path().to_owned();
    t.file("e.wat", &echo());
    let world = Arc::new(t.world.take().unwrap());
    let tools = actor_tools(world.clone());
    let spec = tools.iter().find(|t| t.spec().name == "actor_spawn").unwrap().spec().input_schema.clone();
    assert_eq!(spec["properties"]["limits"]["properties"]["memories"]["type"], "integer", "{spec}");

    let limits = json!({"instances": 1, "disk_bytes": 4096});
    let r = call(&tools, &cwd, "actor_spawn", json!({"id": "tight", "wasm": "e.wat", "limits": limits}));
    assert_eq!(r.exit_code, 0, "{}", r.output_summary);
    let reg: Value =
        serde_json::from_str(&std::fs::read_to_string(t.root().join("broker/registry.json")).unwrap()).unwrap();
    assert_eq!(reg["actors"]["tight"]["limits"], limits);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let status = std::fs::read_to_string(t.root().join("actor/tight/status.json")).unwrap_or_default();
        if status.contains("instance count too high") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "tight never failed to instantiate: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let r = call(&tools, &cwd, "actor_stop", json!({"id": "tight"}));
    assert_eq!(r.exit_code, 0, "{}", r.output_summary);

    for (limits, reason) in [
        (json!({"memories": 9}), "limit \"memories\" of 9 is above the world's 8; a spawn may only lower a limit"),
        (
            json!({"disk_bytes": (256u64 << 20) + 1}),
            "limit \"disk_bytes\" of 268435457 is above the world's 268435456; a spawn may only lower a limit",
        ),
        (
            json!({"fuel": 10}),
            "limit \"fuel\" cannot be set: this world does not meter fuel (`cairn world run --fuel N` turns it on)",
        ),
        (
            json!({"stack": 1}),
            "unknown limit \"stack\"; one of memory_bytes, table_elements, instances, memories, tables, disk_bytes, disk_entries, fuel",
        ),
    ] {
        let r = call(&tools, &cwd, "actor_spawn", json!({"id": "more", "wasm": "e.wat", "limits": limits}));
        assert_eq!(r.exit_code, 1, "{limits}: {}", r.output_summary);
        assert_eq!(r.output_summary, format!("refused: {reason}"), "{limits}");
    }
    assert!(!t.root().join("actor/more").exists());
}
