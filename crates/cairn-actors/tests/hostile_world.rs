//! Issue 48: attacks from inside one world, each made by a C actor
//! (`actors/puppet.c`, driven by the console's messages) or a WAT actor in
//! a real world, as `hostile.rs` does: world budgets, descriptors,
//! abandoned instances per spawner, bounded queues (with the host's peak
//! resident memory under each flood), fair delivery, the sender told of a
//! dropped message, and the world lock. No assertion on wall time:
//! fairness is asserted on counts (how many storm messages the target saw
//! between two of the neighbour's), latencies are printed as figures.
// Helpers (not #[test] functions) unwrap too: a failure is the test's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cairn_actors::broker::WorldBudget;
use cairn_actors::{Limits, WorldConfig};
use common::*;
use serde_json::{Value, json};

/// One test at a time: each measures this process's memory.
static ONE: Mutex<()> = Mutex::new(());

/// This process's resident memory, in MiB.
fn rss_mib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status (Linux) is needed");
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kb / 1024
}

/// Builds the puppet actor into the test's directory.
fn puppet(t: &TestWorld) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/actors/puppet.c");
    let out = t.dir.path().join("puppet.wasm");
    if !out.exists() {
        common::clang::build_c_actor(&src, &out);
    }
    out
}

fn spawn_puppet(t: &TestWorld, id: &str) {
    let p = puppet(t);
    let r = t.req(json!({"type": "spawn", "id": id, "wasm": p}));
    assert_eq!(r["type"], "ok", "{r}");
}

/// Sends a command to a puppet (from the console).
fn tell(t: &TestWorld, id: &str, cmd: &str) {
    t.w().send(Some(id), None, None, json!(cmd));
}

fn status_exit(t: &TestWorld, id: &str) -> String {
    let s: Value = serde_json::from_str(&t.read(&format!("actor/{id}/status.json"))).unwrap_or(Value::Null);
    s["last_exit"].as_str().unwrap_or("").to_owned()
}

fn waits_for_file(p: &Path, what: &str, mut each: impl FnMut()) {
    // Not a timing assertion: a deadline for a flood that never ends.
    let deadline = Instant::now() + Duration::from_secs(300);
    while !p.exists() {
        if Instant::now() >= deadline {
            let w = p.ancestors().nth(3).unwrap();
            let logs: Vec<String> = ["flood", "sink"]
                .iter()
                .map(|a| {
                    let d = w.join("actor").join(a);
                    let log = std::fs::read_to_string(d.join("stderr.log")).unwrap_or_default();
                    let tail = &log[log.len().saturating_sub(2000)..];
                    format!("{a}: {} {tail}", std::fs::read_to_string(d.join("status.json")).unwrap_or_default())
                })
                .collect();
            panic!("{what} never appeared: {}; {logs:#?}", p.display());
        }
        each();
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// 48.1: an actor spawning children until refused (a self-copying actor
/// reached 55 descendants and 3.15 GB before), its grandchild, the
/// console past the actors' budget, and spawns past the memory and disk
/// budgets: each refused with a message naming the budget.
#[test]
fn a_spawn_past_a_world_budget_is_refused_naming_it() {
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let budget = WorldBudget { actors: 6, descendants: 3, ..Default::default() };
    let t = TestWorld::with_config(WorldConfig {
        limits: Limits { memory_bytes: 16 << 20, ..Default::default() },
        budget,
        ..Default::default()
    });
    let before = rss_mib();
    spawn_puppet(&t, "mom");
    t.subscribe_console("mom");
    std::fs::copy(puppet(&t), t.root().join("actor/mom/public/p.wasm")).unwrap();
    tell(&t, "mom", "spawn 10 kid /public/p.wasm");
    let (r, _) = t.wait_for("mom's spawns", |m| m["from"] == "mom" && m["body"]["spawned"].is_number());
    eprintln!("mom: {r}; RSS {before} → {} MiB", rss_mib());
    assert_eq!(r["body"]["spawned"], 3, "{r}");
    let why = r["body"]["refused"].as_str().unwrap();
    assert!(why.contains("'mom' has 3 descendants already; the world's budget is 3 descendants per spawner"), "{why}");
    // A grandchild counts against its grandparent too.
    t.subscribe_console("kid0");
    tell(&t, "kid0", "spawn 1 grand /actor/mom/public/p.wasm");
    let (r, _) = t.wait_for("kid0's spawn", |m| m["from"] == "kid0" && m["body"]["spawned"].is_number());
    assert_eq!(r["body"]["spawned"], 0, "{r}");
    assert!(r["body"]["refused"].as_str().unwrap().contains("'mom' has 3 descendants already"), "{r}");
    // The world holds 4 actors: 2 more fit, the third is refused.
    let echo = t.file("echo.wat", &common::echo());
    for id in ["x1", "x2"] {
        assert_eq!(t.req(json!({"type": "spawn", "id": id, "wasm": echo}))["type"], "ok");
    }
    let r = t.req(json!({"type": "spawn", "id": "x3", "wasm": echo}));
    assert_eq!(r["type"], "error", "{r}");
    assert!(r["reason"].as_str().unwrap().contains("the world holds 6 actors"), "{r}");
    assert!(r["reason"].as_str().unwrap().contains("its budget is 6 actors"), "{r}");
    assert!(!t.root().join("actor/x3").exists());

    // Memory and disk, counted as the limits given (a spawn asking for
    // less fits where the default does not).
    let budget = WorldBudget { memory_bytes: 20 << 20, disk_bytes: 24 << 20, ..Default::default() };
    let t = TestWorld::with_config(WorldConfig {
        limits: Limits { memory_bytes: 8 << 20, disk_bytes: 8 << 20, ..Default::default() },
        budget,
        ..Default::default()
    });
    let echo = t.file("echo.wat", &common::echo());
    for id in ["e1", "e2"] {
        assert_eq!(t.req(json!({"type": "spawn", "id": id, "wasm": echo}))["type"], "ok");
    }
    let r = t.req(json!({"type": "spawn", "id": "e3", "wasm": echo}));
    let why = r["reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("add up to 16777216 bytes and this one's is 8388608; the world's memory budget is 20971520 bytes"),
        "{r}"
    );
    let r = t.req(json!({"type": "spawn", "id": "e3", "wasm": echo, "limits": {"memory_bytes": 4 << 20}}));
    assert_eq!(r["type"], "ok", "{r}");
    let r = t.req(json!({"type": "spawn", "id": "e4", "wasm": echo, "limits": {"memory_bytes": 0}}));
    let why = r["reason"].as_str().unwrap_or_default();
    assert!(why.contains("disk quotas add up to 25165824 bytes"), "{r}");
    assert!(why.contains("the world's disk budget is 25165824 bytes"), "{r}");
}

/// 48.1/48.7: an upgrade's candidate runs beside its live version with
/// the actor's memory limit and copies of its files, so it counts in the
/// world's memory and disk budgets from its request to its verdict (it
/// was not counted: upgrades of every actor at once held twice the
/// budget).
#[test]
fn an_upgrade_candidate_counts_in_the_world_budget() {
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let budget = WorldBudget { memory_bytes: 20 << 20, ..Default::default() };
    let t = TestWorld::with_config(WorldConfig {
        limits: Limits { memory_bytes: 8 << 20, ..Default::default() },
        budget,
        ..Default::default()
    });
    let echo = t.file("echo.wat", &common::echo());
    for id in ["u1", "u2"] {
        assert_eq!(t.req(json!({"type": "spawn", "id": id, "wasm": echo}))["type"], "ok");
    }
    let r = t.req(json!({"type": "upgrade", "id": "u1", "wasm": echo}));
    eprintln!("upgrade past the memory budget: {r}");
    assert_eq!(r["type"], "error", "the candidate was not counted: {r}");
    let why = r["reason"].as_str().unwrap_or_default();
    assert!(why.contains("upgrade of \"u1\" refused: its candidate runs beside the live version"), "{r}");
    assert!(why.contains("the world's memory budget is 20971520 bytes"), "{r}");
    // An actor with a lower limit leaves room for its own candidate.
    let r = t.req(json!({"type": "spawn", "id": "small", "wasm": echo, "limits": {"memory_bytes": 2 << 20}}));
    assert_eq!(r["type"], "ok", "{r}");
    let r = t.req(json!({"type": "upgrade", "id": "small", "wasm": echo}));
    assert_eq!(r["type"], "ok", "{r}");

    // Disk: the candidate's copies count up to the actor's quota.
    let budget = WorldBudget { disk_bytes: 20 << 20, ..Default::default() };
    let t = TestWorld::with_config(WorldConfig {
        limits: Limits { disk_bytes: 8 << 20, ..Default::default() },
        budget,
        ..Default::default()
    });
    let echo = t.file("echo.wat", &common::echo());
    for id in ["d1", "d2"] {
        assert_eq!(t.req(json!({"type": "spawn", "id": id, "wasm": echo}))["type"], "ok");
    }
    let r = t.req(json!({"type": "upgrade", "id": "d1", "wasm": echo}));
    assert_eq!(r["type"], "error", "the candidate's copies were not counted: {r}");
    assert!(r["reason"].as_str().unwrap_or_default().contains("the world's disk budget is 20971520 bytes"), "{r}");
}

/// 48.3: a guest opening descriptors until refused (19,970 before, near
/// the process's limit, and every other actor's writes and spawns then
/// failed "Too many open files").
#[test]
fn an_instance_holds_at_most_its_descriptors_and_the_world_goes_on() {
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    spawn_puppet(&t, "hog");
    spawn_puppet(&t, "other");
    t.subscribe_console("hog");
    t.subscribe_console("other");
    tell(&t, "hog", "write /data/f x");
    tell(&t, "hog", "fds /data/f");
    let (r, _) = t.wait_for("the hog's count", |m| m["from"] == "hog" && m["body"]["fds"].is_number());
    eprintln!("descriptors: {r}");
    let n = r["body"]["fds"].as_u64().unwrap();
    assert!((60..=64).contains(&n), "the hog opened {n} descriptors (cap 64): {r}");
    let log = t.read("actor/hog/stderr.log");
    assert!(log.contains("descriptors are open, an instance may hold at most 64"), "{log}");
    // The others' files and spawns still work.
    tell(&t, "other", "write /data/x hello");
    let (r, _) = t.wait_for("the other's write", |m| m["from"] == "other" && m["body"]["wrote"].is_number());
    assert_eq!(r["body"]["wrote"], 0, "{r}");
    assert_eq!(t.read("data/other/x"), "hello");
    let echo = t.file("echo.wat", &common::echo());
    assert_eq!(t.req(json!({"type": "spawn", "id": "third", "wasm": echo}))["type"], "ok");
}

/// 48.6: an actor stops its nine sleeping children (each abandoned in
/// its host call). Before, eight abandoned instances anywhere stopped
/// every start in the world; now they count against their spawner only.
#[test]
fn abandoned_instances_count_against_their_spawner_not_the_world() {
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    spawn_puppet(&t, "mom");
    t.subscribe_console("mom");
    std::fs::copy(puppet(&t), t.root().join("actor/mom/public/p.wasm")).unwrap();
    tell(&t, "mom", "spawn 9 kid /public/p.wasm");
    let (r, _) = t.wait_for("mom's spawns", |m| m["from"] == "mom" && m["body"]["spawned"].is_number());
    assert_eq!(r["body"]["spawned"], 9, "{r}");
    for i in 0..9 {
        let kid = format!("kid{i}");
        t.subscribe_console(&kid);
        tell(&t, &kid, "sleep 120");
        t.wait_for("a kid asleep", |m| m["from"] == kid.as_str() && m["body"]["sleeping"] == 120);
    }
    tell(&t, "mom", r#"repeat 9 {"to":"broker","body":{"type":"stop","id":"kid%d"}}"#);
    for i in 0..9 {
        t.wait_state(&format!("kid{i}"), "stopped", |s| s["state"] == "stopped");
    }
    for i in 0..9 {
        let log = t.read(&format!("actor/kid{i}/stderr.log"));
        assert!(log.contains("abandoned at the kill"), "kid{i}: {log}");
    }
    // Another actor still starts.
    let echo = t.file("echo.wat", &common::echo());
    assert_eq!(t.req(json!({"type": "spawn", "id": "other", "wasm": echo}))["type"], "ok");
    t.subscribe_console("other");
    t.w().send(Some("other"), None, None, json!("hi"));
    t.wait_for("the other's echo", |m| m["from"] == "other" && m["body"] == "hi");
    // Mom's own lineage does not.
    assert_eq!(t.req(json!({"type": "start", "id": "kid0"}))["type"], "ok");
    t.wait_state("kid0", "a refused start", |_| status_exit(&t, "kid0").contains("per spawner"));
    let exit = status_exit(&t, "kid0");
    assert!(
        exit.contains("9 abandoned instances of \\\"mom\\\" and the actors it spawned")
            || exit.contains("9 abandoned instances of \"mom\" and the actors it spawned"),
        "{exit}"
    );
}

/// Reads the console until a message from `from` with an object body
/// holding `key` arrives (returned), counting `from`'s string bodies (the
/// flood) on the way into `shown`.
fn read_until(t: &TestWorld, from: &str, key: &str, shown: &mut usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "no {key} from {from} within 120 s");
        let Some(m) = t.w().recv(Duration::from_millis(200)) else { continue };
        if m.from != from {
            continue;
        }
        if m.body.is_string() {
            *shown += 1;
        } else if m.body.get(key).is_some() {
            return m.body;
        }
    }
}

/// 48.2: an actor floods the console while nobody reads it (634 MB of
/// host memory before). The console's inbox is bounded: what does not
/// fit comes back to the sender as `undeliverable`, and every message is
/// either shown or told back.
#[test]
fn a_flood_to_an_unread_console_is_refused_not_buffered() {
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    spawn_puppet(&t, "flood");
    let before = rss_mib();
    let mut peak = before;
    tell(&t, "flood", "big 800 262144 console");
    tell(&t, "flood", "write /data/done 1");
    waits_for_file(&t.root().join("data/flood/done"), "the flood's end", || peak = peak.max(rss_mib()));
    peak = peak.max(rss_mib());
    eprintln!("console flood (800 × 256 KiB, unread): host RSS {before} → peak {peak} MiB");
    // Now read: what was kept, and what the flood was told.
    t.subscribe_console("flood");
    let mut shown = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    let told = loop {
        tell(&t, "flood", "count");
        let c = read_until(&t, "flood", "undeliverable", &mut shown);
        let told = c["undeliverable"].as_u64().unwrap() as usize;
        if shown + told >= 800 || Instant::now() > deadline {
            break told;
        }
    };
    eprintln!("console flood: {shown} shown, {told} told undeliverable");
    assert_eq!(shown + told, 800, "every message is shown or told back");
    assert!(told >= 700, "the console's inbox held {shown} messages of 256 KiB");
    assert!(peak < before + 150, "host RSS grew from {before} to {peak} MiB");
}

/// 48.2: 1,500 lines of 1 MB to an actor whose mailbox is full (the
/// host grew from 45 to 700 MB before: the broker's event queue had no
/// bound). The flood's writes now wait for the broker.
#[test]
fn a_flood_of_large_lines_is_slowed_not_buffered() {
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    spawn_puppet(&t, "flood");
    spawn_puppet(&t, "sink");
    t.subscribe_console("sink");
    tell(&t, "sink", "sleep 300");
    t.wait_for("the sink asleep", |m| m["from"] == "sink" && m["body"]["sleeping"] == 300);
    let before = rss_mib();
    let mut peak = before;
    tell(&t, "flood", "big 1500 1000000 sink");
    tell(&t, "flood", "write /data/done 1");
    waits_for_file(&t.root().join("data/flood/done"), "the flood's end", || peak = peak.max(rss_mib()));
    peak = peak.max(rss_mib());
    eprintln!("1,500 × 1 MB lines to a full mailbox: host RSS {before} → peak {peak} MiB");
    assert!(peak < before + 150, "host RSS grew from {before} to {peak} MiB");
    let r = t.w().request(json!({"type": "list"}), Duration::from_secs(5)).unwrap();
    assert_eq!(r["type"], "list");
}

/// 48.4: one actor storms a slow reader with messages while a neighbour
/// pings it. Delivery is round-robin across senders and one sender holds
/// at most half a mailbox: each ping reaches the target after at most a
/// few storm messages (it waited behind the whole mailbox, 1,000, or was
/// refused "mailbox full", before).
#[test]
fn a_neighbours_message_is_not_queued_behind_a_storm() {
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    for id in ["target", "storm", "neighbour"] {
        spawn_puppet(&t, id);
    }
    t.subscribe_console("target");
    let before = rss_mib();
    tell(&t, "storm", r#"repeat 100000 {"to":"target","body":"nap"}"#);
    // The storm is under way: the target has seen some of it.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        tell(&t, "target", "count");
        let (c, _) = t.wait_for("a count", |m| m["from"] == "target" && m["body"]["seen"].is_number());
        if c["body"]["seen"].as_u64().unwrap() >= 5 {
            break;
        }
        assert!(Instant::now() < deadline, "the storm never reached the target");
    }
    let mut gaps = Vec::new();
    let mut took = Vec::new();
    for i in 0..5 {
        tell(&t, "target", "count");
        let (c, _) = t.wait_for("a count", |m| m["from"] == "target" && m["body"]["seen"].is_number());
        let at = c["body"]["seen"].as_u64().unwrap();
        let sent = Instant::now();
        tell(&t, "neighbour", &format!(r#"say {{"to":"target","body":"ping n{i}"}}"#));
        let tag = format!("n{i}");
        let (p, _) = t.wait_for("a pong", |m| m["from"] == "target" && m["body"]["pong"] == tag.as_str());
        took.push(sent.elapsed());
        gaps.push(p["body"]["seen"].as_u64().unwrap() - at);
    }
    took.sort();
    eprintln!(
        "storm: storm messages the target saw between a count and the neighbour's ping: {gaps:?}; ping round trips {took:?} (median {:?}); RSS {before} → {} MiB",
        took[2],
        rss_mib()
    );
    for g in &gaps {
        assert!(*g < 50, "a ping waited behind {g} storm messages: {gaps:?}");
    }
}

/// 48.5: a message that waited too long for room in a deaf actor's stdin
/// is dropped, and its sender is told (it was only noted in the log).
#[test]
fn a_message_dropped_at_the_stdin_wait_is_told_to_its_sender() {
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::with_config(WorldConfig { stdin_wait: Duration::from_millis(500), ..Default::default() });
    spawn_puppet(&t, "deaf");
    t.subscribe_console("deaf");
    tell(&t, "deaf", "sleep 300");
    t.wait_for("deaf asleep", |m| m["from"] == "deaf" && m["body"]["sleeping"] == 300);
    // 3 KB each: the first fills the 4 KiB pipe, the second waits.
    let pad = "z".repeat(3000);
    for i in 0..3 {
        t.w().send(Some("deaf"), Some(&format!("d{i}")), None, json!(format!("{i}{pad}")));
    }
    let (m, _) = t.wait_for("the drop told", |m| m["body"]["type"] == "undeliverable");
    eprintln!("told: {m}");
    assert_eq!(m["from"], "broker");
    assert!(m["reply_to"].as_str().unwrap().starts_with("console/d"), "{m}");
    let why = m["body"]["reason"].as_str().unwrap();
    assert!(why.contains("did not read its stdin for 0.5 s"), "{m}");
    assert!(t.read("actor/deaf/stderr.log").contains("message dropped"));
}

/// 48.8: deleting `DIR/.lock` no longer lets a second run open the world.
#[test]
fn the_world_lock_is_held_not_a_file() {
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    let again = cairn_actors::World::open(&t.root(), WorldConfig::default());
    assert!(again.is_err(), "a second run opened the world");
    let _ = std::fs::remove_file(t.root().join(".lock"));
    let again = cairn_actors::World::open(&t.root(), WorldConfig::default());
    let e = format!("{:#}", again.expect_err("a second run opened the world once .lock was deleted"));
    assert!(e.contains("another process is running this world"), "{e}");
}

/// 48.8: an actor queues twelve builds, then the console asks for one
/// (21.8 s behind them before: `cc` served first come, first served).
/// The console's comes next; an actor keeps at most four waiting.
#[test]
fn the_consoles_build_is_not_queued_behind_an_actors_many() {
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    spawn_puppet(&t, "builder");
    tell(
        &t,
        "builder",
        r#"repeat 12 {"to":"cc","body":{"type":"build","name":"b%d","files":{"main.c":"int main(void){return 0;}"}}}"#,
    );
    let out = |i: usize| t.root().join(format!("actor/builder/public/cc/b{i}/actor.wasm"));
    waits_for_file(&out(0), "the builder's first build", || {});
    let asked = Instant::now();
    let (r, _) = t
        .w()
        .ask_as(
            "console",
            "cc",
            json!({"type": "build", "name": "mine", "files": {"main.c": "int main(void){return 0;}"}}),
            Duration::from_secs(600),
        )
        .unwrap();
    let took = asked.elapsed();
    let done = (0..12).filter(|i| out(*i).exists()).count();
    eprintln!("the console's build answered after {took:?}, {done} of the builder's 12 built by then");
    assert_eq!(r.body["type"], "built", "{:?}", r.body);
    assert!(done <= 3, "the console's build waited behind {done} of the builder's");
}

/// 48.7: a candidate that behaves only while it sees test traffic
/// (`from:"test"`, ids `t-N` before) and misbehaves live. Its transcript's
/// messages now look like live ones, so it fails its own gate.
#[test]
fn a_candidate_cannot_tell_its_gate_from_live_traffic() {
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    assert_eq!(t.spawn("u", &echo())["type"], "ok");
    let src = t.file(
        "evil/main.c",
        r#"#include <stdio.h>
#include <string.h>
int main(void) {
    static char l[65536];
    while (fgets(l, sizeof l, stdin)) {
        if (strstr(l, "\"from\":\"test\"") || strstr(l, "\"id\":\"t-"))
            puts("{\"body\":{\"q\":1}}");
        else
            puts("{\"body\":\"EVIL version 2 (live)\"}");
        fflush(stdout);
    }
    return 0;
}
"#,
    );
    let dir = src.parent().unwrap().to_owned();
    let wasm = dir.join("evil.wasm");
    common::clang::build_c_actor(&src, &wasm);
    write_tests(&dir, "q.jsonl", &[json!({"send": {"q": 1}}), json!({"expect": {"q": 1}})]);
    let r = t.req(json!({"type": "upgrade", "id": "u", "wasm": wasm, "source": dir}));
    eprintln!("evil upgrade: {r}");
    assert_eq!(r["type"], "error", "the candidate passed its gate: {r}");
    assert!(r["reason"].as_str().unwrap().contains("upgrade refused, the old version keeps running"), "{r}");
    assert!(r["reason"].as_str().unwrap().contains("expected {\"q\":1} not seen"), "{r}");
}

/// 48.7, second half: a candidate that passes its transcript (it answers
/// the transcript's message as the old version does) and answers "EVIL
/// version 2 (live)" to everything else. It goes live, and its first live
/// answer is held for the live check: the old version, run in shadow on
/// the same messages, answered otherwise and no `expect` describes the
/// evil answer, so it is dropped, the upgrade is rolled back, the world's
/// journal records it and the console is told. No EVIL answer reaches a
/// live requester (the check lets none through: an answer is routed only
/// once judged). Before this check the evil answers were routed at once.
#[test]
fn a_version_that_misbehaves_live_after_its_gate_is_rolled_back_before_any_evil_answer_leaves() {
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    assert_eq!(t.spawn("u", &echo())["type"], "ok");
    t.subscribe_console("u");
    let src = t.file(
        "evil2/main.c",
        r#"#include <stdio.h>
#include <string.h>
int main(void) {
    static char l[65536];
    while (fgets(l, sizeof l, stdin)) {
        if (strstr(l, "\"body\":{\"q\":1}"))
            fputs(l, stdout);
        else
            puts("{\"body\":\"EVIL version 2 (live)\"}");
        fflush(stdout);
    }
    return 0;
}
"#,
    );
    let dir = src.parent().unwrap().to_owned();
    let wasm = dir.join("evil.wasm");
    common::clang::build_c_actor(&src, &wasm);
    write_tests(&dir, "q.jsonl", &[json!({"send": {"q": 1}}), json!({"expect": {"q": 1}})]);
    let r = t.req(json!({"type": "upgrade", "id": "u", "wasm": wasm, "source": dir}));
    assert_eq!(r["type"], "ok", "the candidate should pass its gate: {r}");
    assert_eq!(r["version"], 2, "{r}");
    // Live traffic the transcript did not show.
    for q in 2..5 {
        t.w().send(Some("u"), None, None, json!({"q": q}));
    }
    let (rolled, mut seen) = t.wait_for("the rollback told to the console", |m| m["body"]["type"] == "rolled_back");
    eprintln!("rolled back: {rolled}");
    assert_eq!(rolled["from"], "broker", "{rolled}");
    assert_eq!((rolled["body"]["from"].as_u64(), rolled["body"]["to"].as_u64()), (Some(2), Some(1)), "{rolled}");
    let why = rolled["body"]["reason"].as_str().unwrap();
    assert!(why.contains("live check of version 2: answer 1 answered \"EVIL version 2 (live)\""), "{why}");
    let s = t.wait_state("u", "version 1 running", |s| s["state"] == "running" && s["version"] == 1);
    assert_eq!(s["version"], 1, "{s}");
    // The old version answers again; by then every line of the refused
    // instance was handled (it ended before version 1 started).
    t.w().send(Some("u"), None, None, json!({"q": 9}));
    let (_, more) = t.wait_for("version 1's echo", |m| m["from"] == "u" && m["body"] == json!({"q": 9}));
    seen.extend(more);
    let evil: Vec<&Value> = seen.iter().filter(|m| m.to_string().contains("EVIL")).collect();
    assert!(evil.is_empty(), "EVIL answers reached the console: {evil:#?}");
    // The world's journal says what happened.
    let journal = t.read("broker/journal.jsonl");
    let entry: Value = journal
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["type"] == "live_check")
        .unwrap_or_else(|| panic!("no live_check entry in the journal: {journal:?}"));
    assert_eq!(entry["result"], "refused", "{entry}");
    assert_eq!(
        (entry["id"].as_str(), entry["version"].as_u64(), entry["rollback_to"].as_u64()),
        (Some("u"), Some(2), Some(1))
    );
    assert_eq!(entry["answers_checked"], 0, "{entry}");
    assert!(t.read("actor/u/stderr.log").contains("dropped, not routed"));
}

/// 48.7: the live check lets a version whose transcripts describe its
/// changed answers through, and answers it shares with the old version
/// need no description.
#[test]
fn a_version_whose_transcript_describes_its_changes_passes_its_live_check() {
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    assert_eq!(t.spawn("g", &echo())["type"], "ok");
    t.subscribe_console("g");
    // v2 greets its subscribers once (described by its transcript), then
    // echoes as v1 does.
    let dir = t.dir.path().join("v2");
    let wasm = t.file("v2/actor.wat", &actor("{\"body\":{\"hello\":2}}\n", "", ""));
    write_tests(
        &dir,
        "t.jsonl",
        &[json!({"send": {"q": 1}}), json!({"expect": {"hello": 2}}), json!({"expect": {"q": 1}})],
    );
    let r = t.req(json!({"type": "upgrade", "id": "g", "wasm": wasm, "source": dir}));
    assert_eq!(r["type"], "ok", "{r}");
    for q in 2..5 {
        t.w().send(Some("g"), None, None, json!({"q": q}));
    }
    for q in 2..5 {
        t.wait_for("v2's echo", |m| m["from"] == "g" && m["body"] == json!({"q": q}));
    }
    let journal = t.read("broker/journal.jsonl");
    assert!(journal.contains("\"result\":\"passed\""), "{journal}");
    assert!(journal.contains("\"answers_checked\":3"), "{journal}");
    assert_eq!(t.actor_state("g")["version"], 2);
}
