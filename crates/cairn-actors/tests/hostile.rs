//! Issue 28: actors under a hostile guest. Each test is one attack, made
//! by a WAT or C actor (or by what an actor can send the broker) in a
//! real world; each asserts the host's resident memory (`VmRSS` of this
//! process, from `/proc/self/status`: the world runs in it), the disk
//! use, that the broker still answers `list` within a second, and the
//! exact answer the console (or the agent) sees.
// Helpers (not #[test] functions) unwrap too: a failure is the test's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cairn_actors::{Limits, WorldConfig};
use common::*;
use serde_json::{Value, json};

/// The tests of this file run one at a time: each world runs in the test
/// process, whose memory they measure (the harness runs tests on threads,
/// and a compile of another test would count).
static RSS: Mutex<()> = Mutex::new(());

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

fn du(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else { return 0 };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => du(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

/// The broker answers `list` within one second.
fn lists_within_a_second(t: &TestWorld) -> Value {
    let r = t.w().request(json!({"type": "list"}), Duration::from_secs(1));
    let r = r.unwrap_or_else(|e| panic!("the broker did not answer list within 1 s: {e:#}"));
    assert_eq!(r["type"], "list", "{r}");
    r
}

/// A p1 WAT actor that runs `body` when its first input arrives (once),
/// and echoes every input.
/// `$num` writes `{"body":{"<key>":<n>}}` (the key at offset 300, `klen`
/// bytes); `$write` writes bytes from memory.
fn wat(extra: &str, data: &str, body: &str) -> String {
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  {extra}
  (data (i32.const 200) "{{\"body\":{{\"")
  (data (i32.const 220) "\":")
  (data (i32.const 230) "}}}}\n")
  {data}
  (func $write (param $ptr i32) (param $len i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))))
  (func $num (param $key i32) (param $klen i32) (param $v i32) (local $p i32) (local $neg i32)
    (if (i32.lt_s (local.get $v) (i32.const 0)) (then
      (local.set $neg (i32.const 1))
      (local.set $v (i32.sub (i32.const 0) (local.get $v)))))
    (local.set $p (i32.const 400))
    (loop $d
      (local.set $p (i32.sub (local.get $p) (i32.const 1)))
      (i32.store8 (local.get $p) (i32.add (i32.const 48) (i32.rem_u (local.get $v) (i32.const 10))))
      (local.set $v (i32.div_u (local.get $v) (i32.const 10)))
      (br_if $d (local.get $v)))
    (if (local.get $neg) (then
      (local.set $p (i32.sub (local.get $p) (i32.const 1)))
      (i32.store8 (local.get $p) (i32.const 45))))
    (call $write (i32.const 200) (i32.const 10))
    (call $write (local.get $key) (local.get $klen))
    (call $write (i32.const 220) (i32.const 2))
    (call $write (local.get $p) (i32.sub (i32.const 400) (local.get $p)))
    (call $write (i32.const 230) (i32.const 3)))
  (func (export "_start") (local $n i32) (local $i i32) (local $r i32) (local $first i32)
    (local.set $first (i32.const 1))
    (block $done
      (loop $next
        (i32.store (i32.const 16) (i32.const 65536))
        (i32.store (i32.const 20) (i32.const 65536))
        (drop (call $fd_read (i32.const 0) (i32.const 16) (i32.const 1) (i32.const 24)))
        (local.set $n (i32.load (i32.const 24)))
        (br_if $done (i32.eqz (local.get $n)))
        (if (local.get $first) (then
          (local.set $first (i32.const 0))
          {body}))
        (call $write (i32.const 65536) (local.get $n))
        (br $next))))
)"#
    )
}

/// Four extra memories (of the eight a store may have), each grown by
/// 64 MiB and filled (so the pages are real), then a table grown by 100
/// million entries: reports how many memories grew (`grew`) and what
/// `table.grow` returned (`table`). A second actor declares twenty
/// memories.
#[test]
fn memories_and_tables_count_together_against_one_cap() {
    let _one = RSS.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    let grower = |n: usize| -> String {
        let mems: String = (1..=n).map(|i| format!("(memory $m{i} 0)\n")).collect();
        let grow: String = (1..=n)
            .map(|i| {
                format!(
                    "(if (i32.ne (memory.grow $m{i} (i32.const 1024)) (i32.const -1)) (then
                       (memory.fill $m{i} (i32.const 0) (i32.const 7) (i32.const 67108864))
                       (local.set $i (i32.add (local.get $i) (i32.const 1)))))\n"
                )
            })
            .collect();
        let body = format!(
            "{grow}
             (call $num (i32.const 300) (i32.const 4) (local.get $i))
             (local.set $r (table.grow $t (ref.null func) (i32.const 100000000)))
             (call $num (i32.const 310) (i32.const 5) (local.get $r))"
        );
        let data = r#"(data (i32.const 300) "grew") (data (i32.const 310) "table")"#;
        wat(&format!("{mems}(table $t 0 funcref)"), data, &body)
    };
    let before = rss_mib();
    assert_eq!(t.spawn("hog", &grower(4))["type"], "ok");
    t.subscribe_console("hog");
    t.w().send(Some("hog"), None, None, json!("go"));
    let (grew, _) = t.wait_for("grew", |m| m["from"] == "hog" && m["body"]["grew"].is_number());
    let (table, _) = t.wait_for("table", |m| m["from"] == "hog" && m["body"]["table"].is_number());
    t.wait_for("echo", |m| m["from"] == "hog" && m["body"] == "go");
    let after = rss_mib();
    lists_within_a_second(&t);
    eprintln!("memories/tables: RSS {before} → {after} MiB; {grew} {table}");
    // 64 MiB for all memories together: the guest's and the adapter's
    // hold some, so not one extra 64 MiB fits; the table's 100 million
    // entries pass the 100,000 cap.
    assert_eq!(grew["body"], json!({"grew": 0}), "{grew}");
    assert_eq!(table["body"], json!({"table": -1}), "{table}");
    assert!(after < before + 200, "host RSS grew from {before} to {after} MiB");
    // Twenty memories: more than a store may have; instantiation fails.
    assert_eq!(t.spawn("many", &grower(20))["type"], "ok");
    let s = t.wait_state("many", "a failed start", |_| !status_exit(&t, "many").is_empty());
    let exit = status_exit(&t, "many");
    eprintln!("twenty memories: {exit} {s}");
    assert!(exit.contains("instantiation failed") && exit.contains("memor"), "{exit}");
    lists_within_a_second(&t);
}

/// 256 MiB written to stdout without a newline, 64 KiB at a time.
#[test]
fn a_stdout_line_past_the_message_limit_is_a_crash_not_a_buffer() {
    let _one = RSS.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    let body = "(memory.fill (i32.const 65536) (i32.const 120) (i32.const 65536))
        (block $end (loop $more
          (br_if $end (i32.ge_u (local.get $i) (i32.const 4096)))
          (call $write (i32.const 65536) (i32.const 65536))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br $more)))";
    let before = rss_mib();
    assert_eq!(t.spawn("flood", &wat("", "", body))["type"], "ok");
    t.w().send(Some("flood"), None, None, json!("go"));
    let s = t.wait_state("flood", "a crash", |s| s["state"] != "running" || status_exit(&t, "flood").contains("Trap"));
    let after = rss_mib();
    lists_within_a_second(&t);
    let exit = status_exit(&t, "flood");
    let log_path = t.root().join("actor/flood/stderr.log");
    let log = std::fs::read_to_string(&log_path).unwrap();
    let logs = du(&t.root().join("actor/flood"));
    eprintln!("stdout flood: RSS {before} → {after} MiB; log {} bytes; actor dir {logs} bytes; {s}", log.len());
    assert!(exit.contains("stdout line longer than 1048576 bytes"), "{exit}");
    assert!(log.contains("[host] stdout line longer than 1048576 bytes (the message limit): instance killed"), "{log}");
    assert!(log.len() < 64 << 10, "the line was copied into stderr.log: {} bytes", log.len());
    assert!(logs < 4 << 20, "the actor's directory holds {logs} bytes");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&log_path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "stderr.log is private to the world's owner");
    assert!(after < before + 150, "host RSS grew from {before} to {after} MiB");
}

fn status_exit(t: &TestWorld, id: &str) -> String {
    let s: Value = serde_json::from_str(&t.read(&format!("actor/{id}/status.json"))).unwrap_or(Value::Null);
    s["last_exit"].as_str().unwrap_or("").to_owned()
}

/// The guest's own stderr is capped too: it rotates at 1 MiB, so 8 MiB of
/// stderr leaves at most 2 MiB (and a bit) on disk.
#[test]
fn stderr_log_rotates_and_is_private() {
    let _one = RSS.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    // 32 KiB of 'y' below the input buffer (which the echo still needs).
    let body = "(memory.fill (i32.const 1024) (i32.const 121) (i32.const 32768))
        (block $end (loop $more
          (br_if $end (i32.ge_u (local.get $i) (i32.const 256)))
          (i32.store (i32.const 0) (i32.const 1024))
          (i32.store (i32.const 4) (i32.const 32768))
          (drop (call $fd_write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 8)))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br $more)))
        (call $num (i32.const 300) (i32.const 4) (local.get $i))";
    assert_eq!(t.spawn("noisy", &wat("", r#"(data (i32.const 300) "sent")"#, body))["type"], "ok");
    t.subscribe_console("noisy");
    // The report can come before the subscription: ask for an echo after.
    t.w().send(Some("noisy"), None, None, json!("done?"));
    t.wait_for("echo", |m| m["from"] == "noisy" && m["body"] == "done?");
    let dir = t.root().join("actor/noisy");
    let deadline = Instant::now() + Duration::from_secs(30);
    while du(&dir) < 1 << 20 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let total = du(&dir);
    eprintln!("stderr flood of 8 MiB: actor dir holds {total} bytes");
    assert!(total <= (2 << 20) + (128 << 10), "stderr.log is not capped: {total} bytes");
    assert!(dir.join("stderr.log.1").exists(), "rotated");
    use std::os::unix::fs::PermissionsExt;
    for f in ["stderr.log", "stderr.log.1"] {
        let mode = std::fs::metadata(dir.join(f)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{f}");
    }
}

/// A 2 MiB message and twenty 1000 KiB messages to a stopped actor.
#[test]
fn mailboxes_are_capped_in_bytes_and_the_journal_stays_small() {
    let _one = RSS.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    assert_eq!(t.spawn("sink", &echo())["type"], "ok");
    assert_eq!(t.req(json!({"type": "stop", "id": "sink"}))["type"], "ok");
    let before = rss_mib();
    // The issue's attack: ten 16 MiB messages and one of 64 MiB.
    for (i, mib) in [16usize; 10].into_iter().chain([64]).enumerate() {
        t.w().send(Some("sink"), Some(&format!("huge{i}")), None, json!("x".repeat(mib << 20)));
        let (m, _) = t.wait_for("the refusal", |m| m["reply_to"] == format!("console/huge{i}"));
        assert_eq!(m["body"]["type"], "undeliverable", "{m}");
        let reason = m["body"]["reason"].as_str().unwrap();
        let size = (mib << 20) + r#"{"id":"console/hugeN","from":"console","body":""}"#.len() + usize::from(i >= 10);
        assert_eq!(reason, format!("message too large ({size} bytes; the limit is 1048576 bytes)"), "{m}");
    }
    let journal = std::fs::metadata(t.root().join("broker/mailbox/sink.jsonl")).unwrap().len();
    let mid = rss_mib();
    eprintln!("mailbox, 10 × 16 MiB + 64 MiB: RSS {before} → {mid} MiB, journal {journal} bytes");
    assert!(journal < 1 << 20, "journal {journal} bytes");
    assert!(mid < before + 150, "host RSS grew from {before} to {mid} MiB");
    lists_within_a_second(&t);
    for i in 0..20 {
        t.w().send(Some("sink"), Some(&format!("m{i}")), None, json!("y".repeat(1000 << 10)));
    }
    let (m, _) = t.wait_for("mailbox full", |m| m["body"]["type"] == "undeliverable");
    let after = rss_mib();
    lists_within_a_second(&t);
    let reason = m["body"]["reason"].as_str().unwrap();
    assert_eq!(m["reply_to"], "console/m16", "the 17th is the first refused: {m}");
    assert!(
        reason.starts_with("mailbox full (16") && reason.contains("a mailbox holds at most 16777216 bytes"),
        "{reason}"
    );
    let journal = std::fs::metadata(t.root().join("broker/mailbox/sink.jsonl")).unwrap().len();
    eprintln!("mailbox: RSS {before} → {after} MiB, journal {journal} bytes");
    assert!(journal < 17 << 20, "journal {journal} bytes");
    assert!(after < before + 150, "host RSS grew from {before} to {after} MiB");
    // Started, it gets the sixteen, and the journal is compacted as they go.
    t.subscribe_console("sink");
    assert_eq!(t.req(json!({"type": "start", "id": "sink"}))["type"], "ok");
    for i in 0..16 {
        let id = format!("console/m{i}");
        t.wait_for("a queued message", |m| m["from"] == "sink" && m["id"].as_str().is_some_and(|x| x.ends_with(&id)));
    }
    let journal = std::fs::metadata(t.root().join("broker/mailbox/sink.jsonl")).unwrap().len();
    assert!(journal < 5 << 20, "the journal is compacted while running: {journal} bytes");
}

/// A C actor writes 64 MiB to /data under an 8 MiB quota.
#[test]
fn disk_quota_is_enforced_at_commit() {
    let _one = RSS.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::with(cairn_actors::Limits { disk_bytes: 8 << 20, ..Default::default() });
    let src = t.file(
        "big/big.c",
        r#"#include <stdio.h>
#include <string.h>
static char buf[1 << 20];
int main(void) {
    char line[4096];
    memset(buf, 'z', sizeof buf);
    FILE *small = fopen("/data/small", "w");
    fputs("kept", small);
    fclose(small);
    while (fgets(line, sizeof line, stdin)) {
        FILE *f = fopen("/data/big", "w");
        for (int i = 0; i < 64; i++) fwrite(buf, 1, sizeof buf, f);
        int r = fclose(f);
        printf("{\"body\":{\"closed\":%d}}\n", r);
        fflush(stdout);
    }
    return 0;
}
"#,
    );
    let out = t.dir.path().join("big/big.wasm");
    common::clang::build_c_actor(&src, &out);
    let before = rss_mib();
    assert_eq!(t.req(json!({"type":"spawn","id":"big","wasm":out}))["type"], "ok");
    t.subscribe_console("big");
    t.w().send(Some("big"), None, None, json!("go"));
    let s = t.wait_state("big", "a crash", |_| status_exit(&t, "big").contains("quota"));
    lists_within_a_second(&t);
    let after = rss_mib();
    assert!(after < before + 150, "host RSS grew from {before} to {after} MiB");
    let exit = status_exit(&t, "big");
    let data = du(&t.root().join("data/big"));
    eprintln!("disk: data/big holds {data} bytes after the refused commit; {s}");
    assert!(exit.contains("over the actor's disk quota"), "{exit}");
    assert!(exit.contains("the quota is 8388608"), "{exit}");
    assert!(!t.root().join("data/big/big").exists(), "the 64 MiB file was committed");
    assert_eq!(t.read("data/big/small"), "kept");
    assert!(data < 1 << 20, "data/big holds {data} bytes");
}

/// A C actor writes 256 MiB to a file it never closes, under an 8 MiB
/// quota: no commit ever checks it, so the writes not yet committed are
/// checked as they grow.
#[test]
fn writes_never_committed_are_held_to_the_quota_too() {
    let _one = RSS.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::with(cairn_actors::Limits { disk_bytes: 8 << 20, ..Default::default() });
    let src = t.file(
        "hold/hold.c",
        r#"#include <stdio.h>
#include <string.h>
static char buf[1 << 20];
int main(void) {
    char line[4096];
    memset(buf, 'h', sizeof buf);
    FILE *f = fopen("/data/held", "w");
    if (!fgets(line, sizeof line, stdin)) return 0;
    for (int i = 0; i < 256; i++) fwrite(buf, 1, sizeof buf, f);
    fflush(f);
    puts("{\"body\":\"written\"}");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {}
    return 0;
}
"#,
    );
    let out = t.dir.path().join("hold/hold.wasm");
    common::clang::build_c_actor(&src, &out);
    let before = rss_mib();
    assert_eq!(t.req(json!({"type":"spawn","id":"hold","wasm":out}))["type"], "ok");
    t.subscribe_console("hold");
    t.w().send(Some("hold"), None, None, json!("go"));
    let s = t.wait_state("hold", "a crash", |_| status_exit(&t, "hold").contains("quota"));
    lists_within_a_second(&t);
    let after = rss_mib();
    let exit = status_exit(&t, "hold");
    let data = du(&t.root().join("data/hold"));
    eprintln!("pending writes: data/hold holds {data} bytes after the kill; RSS {before} → {after} MiB; {s}");
    assert!(
        exit.contains("over the actor's disk quota: writes not yet committed hold")
            && exit.contains("bytes, the quota is 8388608"),
        "{exit}"
    );
    // The temp file went with the instance; the guest never got to say it
    // had written it all.
    assert_eq!(data, 0, "data/hold holds {data} bytes");
    let log = t.read("actor/hold/stderr.log");
    assert!(log.contains("instance killed, its pending writes discarded"), "{log}");
    while let Some(m) = t.w().recv(Duration::ZERO) {
        assert_ne!((m.from.as_str(), &m.body), ("hold", &json!("written")), "the write was let through");
    }
    assert!(after < before + 150, "host RSS grew from {before} to {after} MiB");
}

fn big_wat(path: &Path, funcs: usize) {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    writeln!(f, "(module (memory (export \"memory\") 1)").unwrap();
    for i in 0..funcs {
        writeln!(
            f,
            "(func (export \"f{i}\") (param i32) (result i32) local.get 0 i32.const {i} i32.add i32.const 3 i32.mul)"
        )
        .unwrap();
    }
    writeln!(f, "(func (export \"_start\")))").unwrap();
}

/// Five spawns of an 80 MB module (sent by an actor), then a module
/// under the cap: the broker never stops answering.
#[test]
fn compiling_never_blocks_the_broker() {
    let _one = RSS.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    let big = t.dir.path().join("big.wat");
    big_wat(&big, 800_000);
    let size = std::fs::metadata(&big).unwrap().len();
    assert!(size > 80_000_000, "{size}");
    // From the console: five spawns, then `list` at once (the broker takes
    // events in order, so the list comes after the five).
    for i in 0..5 {
        t.w().send(
            Some("broker"),
            Some(&format!("c{i}")),
            None,
            json!({"type": "spawn", "id": format!("c{i}"), "wasm": big}),
        );
    }
    lists_within_a_second(&t);
    for i in 0..5 {
        let (m, _) = t.wait_for("a refusal", |m| m["reply_to"] == format!("console/c{i}"));
        let reason = m["body"]["reason"].as_str().unwrap();
        assert!(
            reason.ends_with(&format!("big.wat is {size} bytes; a module may have at most 8388608 bytes")),
            "{reason}"
        );
    }
    // From an actor, the same.
    let reqs: String = (0..5)
        .map(|i| format!("{{\"to\":\"broker\",\"id\":\"s{i}\",\"body\":{{\"type\":\"spawn\",\"id\":\"big{i}\",\"wasm\":\"/public/big.wat\"}}}}\n"))
        .collect();
    assert_eq!(t.spawn("spawner", &actor(&reqs, "", ""))["type"], "ok");
    std::fs::rename(&big, t.root().join("actor/spawner/public/big.wat")).unwrap();
    t.subscribe_console("spawner");
    t.w().send(Some("spawner"), None, None, json!("go"));
    let started = Instant::now();
    // The broker answers while the five are handled.
    lists_within_a_second(&t);
    for i in 0..5 {
        let (m, _) = t.wait_for("a refusal", |m| {
            m["from"] == "spawner" && m["body"]["type"] == "error" && m["reply_to"] == format!("spawner/s{i}")
        });
        let reason = m["body"]["reason"].as_str().unwrap();
        assert!(
            reason.ends_with(&format!("big.wat is {size} bytes; a module may have at most 8388608 bytes")),
            "{reason}"
        );
    }
    eprintln!("five refusals within {:?}", started.elapsed());
    lists_within_a_second(&t);
    // Under the cap, a module that takes a while to compile: `list` is
    // answered meanwhile, then the spawn.
    let ok = t.dir.path().join("ok.wat");
    big_wat(&ok, 20_000);
    t.w().send(Some("broker"), Some("sp"), None, json!({"type": "spawn", "id": "slow", "wasm": ok}));
    let l = lists_within_a_second(&t);
    eprintln!("list while compiling {} bytes: {}", std::fs::metadata(&ok).unwrap().len(), l["actors"]);
    let (m, _) = t.wait_for("the spawn", |m| m["reply_to"] == "console/sp");
    // `ok`, or, on a machine loaded enough for the compile to pass its
    // 60 s budget, refused for that (and then no actor is left behind).
    let spawned = m["body"] == json!({"type": "ok", "request": "spawn", "id": "slow", "version": 1});
    let over_budget =
        m["body"]["type"] == "error" && m["body"]["reason"].as_str().is_some_and(|r| r.contains("took longer than"));
    assert!(spawned || over_budget, "{m}");
    let ids: Vec<String> = lists_within_a_second(&t)["actors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap().into())
        .collect();
    let want: &[&str] = if spawned { &["slow", "spawner"] } else { &["spawner"] };
    assert_eq!(ids, want, "no big<n> left behind");
}

/// A C actor sleeps an hour inside a host call; the console stops it.
#[test]
fn stop_ends_a_guest_blocked_in_a_host_call() {
    let _one = RSS.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    let src = t.file(
        "sleeper/sleeper.c",
        r#"#include <stdio.h>
#include <unistd.h>
int main(void) {
    char line[4096];
    while (fgets(line, sizeof line, stdin)) {
        puts("{\"body\":\"sleeping\"}");
        fflush(stdout);
        sleep(3600);
    }
    return 0;
}
"#,
    );
    let out = t.dir.path().join("sleeper/sleeper.wasm");
    common::clang::build_c_actor(&src, &out);
    assert_eq!(t.req(json!({"type":"spawn","id":"sleeper","wasm":out}))["type"], "ok");
    t.subscribe_console("sleeper");
    t.w().send(Some("sleeper"), None, None, json!("nap"));
    t.wait_for("asleep", |m| m["from"] == "sleeper" && m["body"] == "sleeping");
    let asked = Instant::now();
    let r = t.w().request(json!({"type": "stop", "id": "sleeper"}), Duration::from_secs(20));
    let took = asked.elapsed();
    let r = r.unwrap_or_else(|e| panic!("stop never answered: {e:#}"));
    eprintln!("stop of a sleeping guest answered after {took:?}");
    assert_eq!(r, json!({"type": "ok", "request": "stop", "id": "sleeper"}));
    let s = lists_within_a_second(&t);
    let me = s["actors"].as_array().unwrap().iter().find(|a| a["id"] == "sleeper").unwrap().clone();
    assert_eq!(me["state"], "stopped", "{s}");
    // Given up at the kill itself (the seed's 5 s), not half a second
    // after it: the broker knew the guest was inside a host call.
    let log = t.read("actor/sleeper/stderr.log");
    assert!(
        log.contains(
            "instance was inside a host call at its kill (blocked there, where the epoch cannot reach it): abandoned at the kill"
        ),
        "{log}"
    );
    assert!(!log.contains("after its kill: abandoned"), "{log}");
    // And `start` starts it again.
    assert_eq!(t.req(json!({"type": "start", "id": "sleeper"}))["type"], "ok");
    t.w().send(Some("sleeper"), None, None, json!("again"));
    t.wait_for("asleep again", |m| m["from"] == "sleeper" && m["body"] == "sleeping");
    // Each abandoned instance keeps its memory until its host call
    // returns: after four of one spawner's lineage (this one is the
    // second), no new instance of it starts until one ends.
    for round in 2..=4 {
        let r = t.w().request(json!({"type": "stop", "id": "sleeper"}), Duration::from_secs(20)).unwrap();
        assert_eq!(r["type"], "ok", "round {round}: {r}");
        if round < 4 {
            assert_eq!(t.req(json!({"type": "start", "id": "sleeper"}))["type"], "ok");
            t.w().send(Some("sleeper"), None, None, json!(round));
            t.wait_for("asleep", |m| m["from"] == "sleeper" && m["body"] == "sleeping");
        }
    }
    assert_eq!(t.req(json!({"type": "start", "id": "sleeper"}))["type"], "ok");
    t.wait_state("sleeper", "a refused start", |_| status_exit(&t, "sleeper").contains("abandoned instances"));
    let exit = status_exit(&t, "sleeper");
    assert!(
        exit.contains(
            "4 abandoned instances of \\\"sleeper\\\" and the actors it spawned are still blocked in host calls (the world's budget: at most 4 per spawner)"
        ),
        "{exit}"
    );
    lists_within_a_second(&t);
}

/// An actor spawns `rec` with `"source": "/actor"`: the registry it would
/// copy into itself.
#[test]
fn a_source_that_contains_its_destination_is_refused_and_nothing_is_left() {
    let _one = RSS.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    let req = "{\"to\":\"broker\",\"id\":\"rec\",\"body\":{\"type\":\"spawn\",\"id\":\"rec\",\"wasm\":\"/public/x.wat\",\"source\":\"/actor\"}}\n";
    assert_eq!(t.spawn("copier", &actor(req, "", ""))["type"], "ok");
    std::fs::write(t.root().join("actor/copier/public/x.wat"), echo()).unwrap();
    std::fs::write(t.root().join("actor/copier/public/blob"), vec![7u8; 1 << 20]).unwrap();
    t.subscribe_console("copier");
    let (before, disk_before) = (rss_mib(), du(&t.root()));
    t.w().send(Some("copier"), None, None, json!("go"));
    let (m, _) = t.wait_for("the refusal", |m| m["from"] == "copier" && m["reply_to"] == "copier/rec");
    let (after, disk_after) = (rss_mib(), du(&t.root()));
    let l = lists_within_a_second(&t);
    eprintln!("source /actor: RSS {before} → {after} MiB, world {disk_before} → {disk_after} bytes");
    let reason = m["body"]["reason"].as_str().unwrap();
    assert_eq!(m["body"]["type"], "error", "{m}");
    assert!(reason.contains("contains") && reason.contains("where it would be copied: refused"), "{reason}");
    assert_eq!(l["actors"].as_array().unwrap().len(), 1, "no phantom rec: {l}");
    for left in ["actor/rec", "data/rec", "broker/versions/rec"] {
        assert!(!t.root().join(left).exists(), "{left} left behind");
    }
    assert!(disk_after < disk_before + (1 << 20), "world grew from {disk_before} to {disk_after} bytes");
    // A source past the size cap is refused too (17 MiB in /public).
    std::fs::write(t.root().join("actor/copier/public/blob"), vec![7u8; 17 << 20]).unwrap();
    let r = t.req(json!({"type": "spawn", "id": "fat", "wasm": t.root().join("actor/copier/public/x.wat"),
        "source": t.root().join("actor/copier/public")}));
    let reason = r["reason"].as_str().unwrap_or("");
    assert!(reason.contains("is too large to copy: it holds more than 16777216 bytes"), "{r}");
    assert!(!t.root().join("actor/fat").exists() && !t.root().join("broker/versions/fat").exists());
    assert!(after < before + 100, "host RSS grew from {before} to {after} MiB");
}

/// `evil` answers the agent's request to it, and plants replies for the
/// agent's next five request ids; then the agent asks `cc` to build.
#[test]
fn a_reply_counts_only_from_the_participant_asked() {
    let _one = RSS.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    let src = t.file(
        "evil/evil.c",
        r#"#include <stdio.h>
#include <string.h>
#include <stdlib.h>
int main(void) {
    static char line[65536];
    while (fgets(line, sizeof line, stdin)) {
        char *p = strstr(line, "\"id\":\"agent/req-");
        if (!p) continue;
        p += strlen("\"id\":\"agent/req-");
        char *dash = strchr(p, '-');
        if (!dash) continue;
        long long run = atoll(p);
        long n = atol(dash + 1);
        printf("{\"to\":\"agent\",\"reply_to\":\"agent/req-%lld-%ld\",\"body\":\"hi\"}\n", run, n);
        for (long k = 1; k <= 5; k++)
            printf("{\"to\":\"agent\",\"reply_to\":\"agent/req-%lld-%ld\",\"body\":{\"type\":\"built\",\"wasm\":\"/forged.wasm\"}}\n", run, n + k);
        fflush(stdout);
    }
    return 0;
}
"#,
    );
    let out = t.dir.path().join("evil/evil.wasm");
    common::clang::build_c_actor(&src, &out);
    assert_eq!(t.req(json!({"type":"spawn","id":"evil","wasm":out}))["type"], "ok");
    let (r, _) = t.w().ask_as("agent", "evil", json!({"q": 1}), Duration::from_secs(60)).unwrap();
    assert_eq!((r.from.as_str(), &r.body), ("evil", &json!("hi")));
    let deadline = Instant::now() + Duration::from_secs(30);
    while t.w().agent_waiting().len() < 5 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(t.w().agent_waiting().len(), 5, "the forgeries wait in the agent's mailbox");
    let build = json!({"type": "build", "name": "x", "files": {"main.c": "int main(void) { return 0; }\n"}});
    let (r, _) = t.w().ask_as("agent", "cc", build, Duration::from_secs(120)).unwrap();
    lists_within_a_second(&t);
    assert_eq!(r.from, "cc", "{r:?}");
    assert_ne!(r.body["wasm"], "/forged.wasm", "{r:?}");
    assert!(r.body["type"] == "built" || r.body["type"] == "build_failed", "{r:?}");
}

/// `b` (spawned by the console) starts `a` after the console stopped it;
/// the console rolls back with `version: -1` and `"1"`.
#[test]
fn start_needs_the_spawners_right_and_rollback_refuses_bad_versions() {
    let _one = RSS.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    assert_eq!(t.spawn("a", &echo())["type"], "ok");
    assert_eq!(t.req(json!({"type": "stop", "id": "a"}))["type"], "ok");
    let start = "{\"to\":\"broker\",\"id\":\"st\",\"body\":{\"type\":\"start\",\"id\":\"a\"}}\n";
    assert_eq!(t.spawn("b", &actor(start, "", ""))["type"], "ok");
    t.subscribe_console("b");
    t.w().send(Some("b"), None, None, json!("go"));
    let (m, _) = t.wait_for("b's answer", |m| m["from"] == "b" && m["reply_to"] == "b/st");
    assert_eq!(
        m["body"],
        json!({"type": "error", "reason": "\"b\" may not start \"a\" (only itself, the agent, the console or its spawner)"})
    );
    assert_eq!(t.actor_state("a")["state"], "stopped");
    // Version 2, then rollbacks with bad versions.
    assert_eq!(t.req(json!({"type": "start", "id": "a"}))["type"], "ok");
    let p = t.file("a2.wat", &echo());
    let r = t.req(json!({"type": "upgrade", "id": "a", "wasm": p}));
    assert_eq!(r["version"], 2, "{r}");
    assert!(!t.root().join("broker/candidates/a").exists(), "the candidates' copies are removed");
    for bad in [json!(-1), json!("1"), json!(1.5), json!(true)] {
        let r = t.req(json!({"type": "rollback", "id": "a", "version": bad}));
        assert_eq!(r["type"], "error", "{bad} → {r}");
        let want = format!("\"version\" must be a whole number ≥ 1 (or absent for the previous version), not {bad}");
        assert_eq!(r["reason"], want.as_str(), "{bad}");
    }
    lists_within_a_second(&t);
    assert_eq!(t.actor_state("a")["version"], 2);
}

/// Per-actor limits: a spawn may lower the world's (here memory to
/// 4 MiB), never raise them.
#[test]
fn a_spawn_lowers_an_actors_limits_and_never_raises_them() {
    let _one = RSS.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    let p = t.file("bomb.wat", &memory_bomb());
    let r = t.req(json!({"type": "spawn", "id": "bomb", "wasm": p, "limits": {"memory_bytes": 4 << 20}}));
    assert_eq!(r["type"], "ok", "{r}");
    t.subscribe_console("bomb");
    t.w().send(Some("bomb"), None, None, json!("go"));
    let (m, _) = t.wait_for("page report", |m| m["body"]["pages"].is_number());
    let pages = m["body"]["pages"].as_u64().unwrap();
    // 4 MiB = 64 pages of 64 KiB, for every memory of the instance.
    assert!((40..=64).contains(&pages), "{pages}");
    let reg: Value = serde_json::from_str(&t.read("broker/registry.json")).unwrap();
    assert_eq!(reg["actors"]["bomb"]["limits"], json!({"memory_bytes": 4 << 20}));
    for (limits, reason) in [
        (
            json!({"memory_bytes": 1u64 << 40}),
            "limit \"memory_bytes\" of 1099511627776 is above the world's 67108864; a spawn may only lower a limit",
        ),
        (
            json!({"cpu": 1}),
            "unknown limit \"cpu\"; one of memory_bytes, table_elements, instances, memories, tables, disk_bytes, disk_entries, fuel",
        ),
        (
            json!({"fuel": 5}),
            "limit \"fuel\" cannot be set: this world does not meter fuel (`cairn world run --fuel N` turns it on)",
        ),
        (json!({"disk_bytes": -1}), "limit \"disk_bytes\" must be a whole number, not -1"),
        (json!(5), "\"limits\" must be an object, not 5"),
    ] {
        let r = t.req(json!({"type": "spawn", "id": "more", "wasm": p, "limits": limits}));
        assert_eq!(r, json!({"type": "error", "reason": reason}), "{limits}");
    }
    lists_within_a_second(&t);
}

/// An upgrade's compile counts against `COMPILES_AT_ONCE` like a spawn's:
/// an upgrade and a spawn of a module that takes a while to compile, then
/// a second spawn, all sent at once.
#[test]
fn an_upgrades_compile_counts_with_the_spawns() {
    let _one = RSS.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    assert_eq!(t.spawn("e", &echo())["type"], "ok");
    let slow = t.dir.path().join("slow.wat");
    big_wat(&slow, 20_000);
    let before = rss_mib();
    // The broker takes events in order: the second spawn is handled while
    // the upgrade's and the first spawn's compiles run.
    t.w().send(Some("broker"), Some("up"), None, json!({"type": "upgrade", "id": "e", "wasm": slow}));
    t.w().send(Some("broker"), Some("s1"), None, json!({"type": "spawn", "id": "s1", "wasm": slow}));
    t.w().send(Some("broker"), Some("s2"), None, json!({"type": "spawn", "id": "s2", "wasm": slow}));
    let (m, _) = t.wait_for("the second spawn's refusal", |m| m["reply_to"] == "console/s2");
    assert_eq!(
        m["body"],
        json!({"type": "error", "reason": "2 modules are compiling already; try again when one is done"}),
        "{m}"
    );
    lists_within_a_second(&t);
    // The first spawn is answered (`ok`, or, on a machine loaded enough
    // for the compile to pass its 60 s budget, refused for that).
    let (m, _) = t.wait_for("the first spawn", |m| m["reply_to"] == "console/s1");
    assert_eq!(m["body"]["request"], "spawn", "{m}");
    let (m, _) = t.wait_for("the upgrade's answer", |m| m["reply_to"] == "console/up");
    eprintln!("the upgrade: {m}");
    assert_eq!(m["body"]["request"], "upgrade", "{m}");
    let after = rss_mib();
    lists_within_a_second(&t);
    assert!(after < before + 600, "host RSS grew from {before} to {after} MiB");
}

/// A world opens with three actors whose modules take a while to compile:
/// it answers at once (they are `starting`), and each starts once
/// compiled. (Before, the broker compiled them all on its own thread
/// before it took its first event.)
#[test]
fn a_world_opening_compiles_its_actors_off_the_broker_thread() {
    let _one = RSS.lock().unwrap_or_else(|p| p.into_inner());
    let mut t = TestWorld::new();
    // Spawned small, then their stored version replaced by the slow module
    // (every compile has a budget, 60 s by default, which a loaded machine
    // can pass: this world gets ten minutes).
    for id in ["b1", "b2", "b3"] {
        assert_eq!(t.spawn(id, &echo())["type"], "ok");
        big_wat(&t.root().join(format!("broker/versions/{id}/1/actor.wat")), 40_000);
    }
    t.reopen_with(WorldConfig { compile_budget: Duration::from_secs(600), ..Default::default() });
    let l = lists_within_a_second(&t);
    eprintln!("list right after the world opened: {}", l["actors"]);
    let states: Vec<(&str, &str)> = l["actors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["id"].as_str().unwrap(), a["state"].as_str().unwrap()))
        .collect();
    assert_eq!(states.len(), 3, "{l}");
    assert!(states.iter().any(|(_, s)| *s == "starting"), "none is compiling: {l}");
    // Each then runs (its `_start` returns at once: it ends normally),
    // two compiling at a time (5 minutes at most, for a loaded machine).
    let deadline = Instant::now() + Duration::from_secs(300);
    for id in ["b1", "b2", "b3"] {
        while status_exit(&t, id) != "Normal" {
            assert!(Instant::now() < deadline, "{id} never ran: {}", t.read(&format!("actor/{id}/status.json")));
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    lists_within_a_second(&t);
}

/// Every compile has the size cap and the world's time budget, a start's
/// too (a world opening, `start`, a restart and a rollback compile a
/// stored version not compiled in this run). First a stored module
/// replaced by one past the size cap (9 MiB: an echo and a comment) meets
/// the world opening; then, in a world whose compile budget is 1 ms (no
/// module compiles that fast: the WASI adapter alone takes longer), an
/// upgrade, a spawn and a start.
#[test]
fn every_compile_has_the_size_cap_and_the_budget() {
    let _one = RSS.lock().unwrap_or_else(|p| p.into_inner());
    let mut t = TestWorld::new();
    for id in ["big", "up", "st"] {
        assert_eq!(t.spawn(id, &echo())["type"], "ok");
    }
    for id in ["up", "st"] {
        assert_eq!(t.req(json!({"type": "stop", "id": id}))["type"], "ok");
    }
    let stored = t.root().join("broker/versions/big/1/actor.wat");
    let padded = format!("{}\n;; {}\n", echo(), "x".repeat(9 << 20));
    std::fs::write(&stored, &padded).unwrap();
    // Opening the world starts `big`: its compile refuses the module.
    t.reopen();
    t.wait_state("big", "a failed start", |_| status_exit(&t, "big").contains("start failed"));
    lists_within_a_second(&t);
    let want = format!(
        "start failed: compiling version 1 failed: {} is {} bytes; a module may have at most 8388608 bytes",
        stored.display(),
        padded.len()
    );
    assert_eq!(status_exit(&t, "big"), format!("Trap({want:?})"));
    assert!(t.read("actor/big/stderr.log").contains(&format!("[broker] {want}")));
    assert_eq!(t.req(json!({"type": "stop", "id": "big"}))["type"], "ok");

    t.reopen_with(WorldConfig { compile_budget: Duration::from_millis(1), ..Default::default() });
    let up2 = t.file("up2.wat", &echo());
    let r = t.req(json!({"type": "upgrade", "id": "up", "wasm": up2}));
    let reason =
        format!("upgrade refused, the old version keeps running: compiling {} took longer than 0.001 s", up2.display());
    assert_eq!(r, json!({"type": "error", "request": "upgrade", "id": "up", "reason": reason}));
    let l = lists_within_a_second(&t);
    let up = l["actors"].as_array().unwrap().iter().find(|a| a["id"] == "up").unwrap().clone();
    assert_eq!((up["version"].as_u64(), up["latest"].as_u64()), (Some(1), Some(1)), "{l}");

    let sp = t.file("sp.wat", &echo());
    let r = t.req(json!({"type": "spawn", "id": "sp", "wasm": sp}));
    let reason = format!("compiling {} took longer than 0.001 s; spawn of \"sp\" refused", sp.display());
    assert_eq!(r, json!({"type": "error", "request": "spawn", "reason": reason}));
    assert!(!t.root().join("actor/sp").exists() && !t.root().join("broker/versions/sp").exists());

    assert_eq!(t.req(json!({"type": "start", "id": "st"}))["type"], "ok");
    t.wait_state("st", "a failed start", |_| status_exit(&t, "st").contains("start failed"));
    lists_within_a_second(&t);
    let want = format!(
        "start failed: compiling version 1 failed: compiling {} took longer than 0.001 s",
        t.root().join("broker/versions/st/1/actor.wat").display()
    );
    assert_eq!(status_exit(&t, "st"), format!("Trap({want:?})"));
    assert!(t.read("actor/st/stderr.log").contains(&format!("[broker] {want}")));
    assert_eq!(t.req(json!({"type": "stop", "id": "st"}))["type"], "ok");
    lists_within_a_second(&t);
}

/// Entries (files, directories, anything) under `dir`, recursively.
fn entries(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else { return 0 };
    rd.flatten().map(|e| 1 + if e.file_type().is_ok_and(|t| t.is_dir()) { entries(&e.path()) } else { 0 }).sum()
}

/// A C actor makes directories until it is refused, removes six, holds
/// three files open for writing (their temp files are on the disk: they
/// count), creates and closes files until refused, then makes a hard
/// link: all under its own limit of 50 files and directories (its
/// spawn's `disk_entries`; the world's is 10,000).
#[test]
fn files_and_directories_are_capped_in_number() {
    let _one = RSS.lock().unwrap_or_else(|p| p.into_inner());
    let t = TestWorld::new();
    let src = t.file(
        "many/many.c",
        r#"#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
static const char *name(int e) { return e == EDQUOT ? "EDQUOT" : strerror(e); }
int main(void) {
    char line[4096], p[64];
    FILE *held[3];
    int dirs = 0, nheld = 0, files = 0, e_mkdir = 0, e_open = 0;
    if (!fgets(line, sizeof line, stdin)) return 0;
    while (dirs <= 100000) {
        snprintf(p, sizeof p, "/data/d%d", dirs);
        if (mkdir(p, 0755) != 0) { e_mkdir = errno; break; }
        dirs++;
    }
    for (int i = 0; i < 6; i++) {
        snprintf(p, sizeof p, "/data/d%d", i);
        rmdir(p);
    }
    for (; nheld < 3; nheld++) {
        snprintf(p, sizeof p, "/data/h%d", nheld);
        if (!(held[nheld] = fopen(p, "w"))) break;
    }
    while (files <= 100000) {
        snprintf(p, sizeof p, "/data/f%d", files);
        FILE *f = fopen(p, "w");
        if (!f) { e_open = errno; break; }
        fclose(f);
        files++;
    }
    int l = link("/data/f0", "/data/l0");
    const char *e_link = l == 0 ? "made" : name(errno);
    printf("{\"body\":{\"dirs\":%d,\"mkdir\":\"%s\",\"held\":%d,\"files\":%d,\"open\":\"%s\",\"link\":\"%s\"}}\n",
           dirs, name(e_mkdir), nheld, files, name(e_open), e_link);
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {}
    return 0;
}
"#,
    );
    let out = t.dir.path().join("many/many.wasm");
    common::clang::build_c_actor(&src, &out);
    let r = t.req(json!({"type": "spawn", "id": "many", "wasm": out, "limits": {"disk_entries": 50}}));
    assert_eq!(r["type"], "ok", "{r}");
    t.subscribe_console("many");
    t.w().send(Some("many"), None, None, json!("go"));
    let (m, _) = t.wait_for("the report", |m| m["from"] == "many" && m["body"]["dirs"].is_number());
    lists_within_a_second(&t);
    assert_eq!(
        m["body"],
        json!({"dirs": 50, "mkdir": "EDQUOT", "held": 3, "files": 3, "open": "EDQUOT", "link": "EDQUOT"}),
        "{m}"
    );
    // 44 directories, 3 files, 3 temp files of the held ones.
    let on_disk = entries(&t.root().join("data/many")) + entries(&t.root().join("actor/many/public"));
    assert_eq!(on_disk, 50);
    let log = t.read("actor/many/stderr.log");
    assert_eq!(log.matches("refused (quota)").count(), 1, "noted once: {log}");
    assert!(
        log.contains(
            "[host] creating \"d50\" refused (quota): /data and /public hold 50 files and directories, the limit is 50 (later refusals of this instance are not noted)"
        ),
        "{log}"
    );
    let reg: Value = serde_json::from_str(&t.read("broker/registry.json")).unwrap();
    assert_eq!(reg["actors"]["many"]["limits"], json!({"disk_entries": 50}));
    assert_eq!(Limits::default().disk_entries, 10_000, "the documented default");
}

/// The store's limits are per actor: a spawn lowers an actor's memories,
/// tables, core instances and fuel below the world's (never above), and
/// an actor's child never gets more than the actor. A module with three
/// extra memories and three extra tables runs under the world's limits and
/// fails to instantiate under its own lower ones; a spinning actor runs
/// out of its own fuel in a world that meters fuel (2^40 per instance).
#[test]
fn instance_memory_table_and_fuel_limits_are_per_actor() {
    let _one = RSS.lock().unwrap_or_else(|p| p.into_inner());
    let world_fuel: u64 = 1 << 40;
    let t = TestWorld::with(Limits { fuel: Some(world_fuel), ..Default::default() });
    let extra = "(memory $m1 0) (memory $m2 0) (memory $m3 0) (table $t1 0 funcref) (table $t2 0 funcref) (table $t3 0 funcref)";
    let wide = t.file("wide.wat", &wat(extra, "", ""));
    assert_eq!(t.req(json!({"type": "spawn", "id": "free", "wasm": wide}))["type"], "ok");
    t.subscribe_console("free");
    t.w().send(Some("free"), None, None, json!("hi"));
    t.wait_for("free's echo", |m| m["from"] == "free" && m["body"] == "hi");
    for (id, limits, what) in [
        ("mem", json!({"memories": 2}), "resource limit exceeded: memory count too high at"),
        ("tab", json!({"tables": 2}), "resource limit exceeded: table count too high at"),
        ("ins", json!({"instances": 1}), "resource limit exceeded: instance count too high at"),
    ] {
        let r = t.req(json!({"type": "spawn", "id": id, "wasm": wide, "limits": limits}));
        assert_eq!(r["type"], "ok", "{id}: {r}");
        t.wait_state(id, "a failed instantiation", |_| status_exit(&t, id).contains("instantiation failed"));
        let exit = status_exit(&t, id);
        assert!(exit.contains(what), "{id}: {exit}");
        assert_eq!(t.req(json!({"type": "stop", "id": id}))["type"], "ok");
        let reg: Value = serde_json::from_str(&t.read("broker/registry.json")).unwrap();
        assert_eq!(reg["actors"][id]["limits"], limits);
    }
    lists_within_a_second(&t);
    let spin = t.file("spin.wat", &spinner());
    let r = t.req(json!({"type": "spawn", "id": "spin", "wasm": spin, "limits": {"fuel": 1_000_000}}));
    assert_eq!(r["type"], "ok", "{r}");
    t.wait_state("spin", "out of fuel", |_| status_exit(&t, "spin").contains("all fuel consumed by WebAssembly"));
    assert_eq!(t.req(json!({"type": "stop", "id": "spin"}))["type"], "ok");
    lists_within_a_second(&t);
    for (limits, reason) in [
        (json!({"memories": 9}), "limit \"memories\" of 9 is above the world's 8; a spawn may only lower a limit"),
        (json!({"tables": 33}), "limit \"tables\" of 33 is above the world's 32; a spawn may only lower a limit"),
        (json!({"instances": 33}), "limit \"instances\" of 33 is above the world's 32; a spawn may only lower a limit"),
        (
            json!({"disk_entries": 10_001}),
            "limit \"disk_entries\" of 10001 is above the world's 10000; a spawn may only lower a limit",
        ),
        (
            json!({"fuel": world_fuel + 1}),
            "limit \"fuel\" of 1099511627777 is above the world's 1099511627776; a spawn may only lower a limit",
        ),
    ] {
        let r = t.req(json!({"type": "spawn", "id": "more", "wasm": wide, "limits": limits}));
        assert_eq!(r, json!({"type": "error", "reason": reason}), "{limits}");
    }
    // An actor with its own limits spawns two children: one asks for more
    // memories than the actor has (refused), one asks for nothing (it gets
    // the actor's).
    let reqs = concat!(
        "{\"to\":\"broker\",\"id\":\"c2\",\"body\":{\"type\":\"spawn\",\"id\":\"c2\",\"wasm\":\"/public/x.wat\",\"limits\":{\"memories\":5}}}\n",
        "{\"to\":\"broker\",\"id\":\"c1\",\"body\":{\"type\":\"spawn\",\"id\":\"c1\",\"wasm\":\"/public/x.wat\"}}\n",
    );
    let parent = t.file("parent.wat", &actor(reqs, "", ""));
    let r =
        t.req(json!({"type": "spawn", "id": "parent", "wasm": parent, "limits": {"memories": 4, "fuel": 1u64 << 30}}));
    assert_eq!(r["type"], "ok", "{r}");
    std::fs::write(t.root().join("actor/parent/public/x.wat"), echo()).unwrap();
    t.subscribe_console("parent");
    t.w().send(Some("parent"), None, None, json!("go"));
    let (m, _) = t.wait_for("c2's refusal", |m| m["from"] == "parent" && m["reply_to"] == "parent/c2");
    assert_eq!(
        m["body"],
        json!({"type": "error", "reason": "limit \"memories\" of 5 is above \"parent\"'s own 4; a spawn may only lower a limit"}),
        "{m}"
    );
    let (m, _) = t.wait_for("c1's spawn", |m| m["from"] == "parent" && m["reply_to"] == "parent/c1");
    assert_eq!(m["body"], json!({"type": "ok", "request": "spawn", "id": "c1", "version": 1}), "{m}");
    let reg: Value = serde_json::from_str(&t.read("broker/registry.json")).unwrap();
    assert_eq!(reg["actors"]["c1"]["limits"], json!({"memories": 4, "fuel": 1u64 << 30}));
    lists_within_a_second(&t);
}

/// The version numbers installed for `id` (numeric directories of
/// `broker/versions/<id>`), ascending, and whether anything else is there.
fn version_dirs(t: &TestWorld, id: &str) -> (Vec<u64>, Vec<String>) {
    let mut nums = Vec::new();
    let mut other = Vec::new();
    for e in std::fs::read_dir(t.root().join("broker/versions").join(id)).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        match name.parse() {
            Ok(n) => nums.push(n),
            Err(_) => other.push(name),
        }
    }
    nums.sort_unstable();
    (nums, other)
}

/// An actor upgrades itself again and again: each new version's first
/// input is the broker's answer to the last upgrade, and it asks for the
/// next one. Its `/data` holds 1 MiB, so every upgrade snapshots 1 MiB
/// into the old version's directory. After eight upgrades the actor
/// keeps its running version and the three newest others (the default
/// `versions_kept`), so the versions' disk use stays under four times a
/// version's size; a rollback goes to the newest older one kept, one to a
/// deleted version is refused and says which are kept. A deletion cut
/// short by a host crash (a `.pruned-<n>` left behind) is finished when
/// the world opens, which also applies a lower `versions_kept`.
#[test]
fn old_versions_are_deleted_past_the_bound() {
    let _one = RSS.lock().unwrap_or_else(|p| p.into_inner());
    let mut t = TestWorld::new();
    let again = "{\"to\":\"broker\",\"body\":{\"type\":\"upgrade\",\"id\":\"selfup\",\"wasm\":\"/public/v.wat\"}}\n";
    let module = actor(again, "", "");
    let p = t.file("selfup.wat", &module);
    assert_eq!(t.req(json!({"type": "spawn", "id": "selfup", "wasm": p}))["type"], "ok");
    std::fs::write(t.root().join("actor/selfup/public/v.wat"), &module).unwrap();
    std::fs::write(t.root().join("data/selfup/blob"), vec![7u8; 1 << 20]).unwrap();
    t.subscribe_console("selfup");
    let before = rss_mib();
    t.w().send(Some("selfup"), None, None, json!("go"));
    for v in 2..=9 {
        t.wait_for(&format!("the upgrade to version {v}"), |m| {
            m["from"] == "selfup" && m["body"]["type"] == "ok" && m["body"]["version"] == v
        });
    }
    // End the loop: the next upgrade (or the one after, if the broker
    // read the module already) finds no module.
    std::fs::remove_file(t.root().join("actor/selfup/public/v.wat")).unwrap();
    let (m, _) = t.wait_for("the refused upgrade", |m| m["from"] == "selfup" && m["body"]["type"] == "error");
    assert!(m["body"]["reason"].as_str().unwrap().contains("v.wat"), "{m}");
    let cur = t.actor_state("selfup")["version"].as_u64().unwrap();
    assert!(cur >= 9, "{cur}");
    let (kept, other) = version_dirs(&t, "selfup");
    assert_eq!(kept, ((cur - 3)..=cur).collect::<Vec<_>>(), "kept versions");
    assert!(other.is_empty(), "{other:?}");
    // A version: its module, a snapshot of /data (1 MiB) and /public.
    let per_version = module.len() as u64 + (1 << 20) + (64 << 10);
    let used = du(&t.root().join("broker/versions/selfup"));
    assert!(used <= 4 * per_version, "versions take {used} bytes; at most {}", 4 * per_version);
    eprintln!("versions of selfup after {} upgrades: {kept:?}, {used} bytes", cur - 1);
    lists_within_a_second(&t);

    // The newest older version kept, then one deleted.
    let r = t.req(json!({"type": "rollback", "id": "selfup"}));
    assert_eq!(r["type"], "rolled_back", "{r}");
    assert_eq!(r["to"].as_u64(), Some(cur - 1), "{r}");
    let r = t.req(json!({"type": "rollback", "id": "selfup", "version": 1}));
    let kept_list: Vec<String> = kept.iter().map(u64::to_string).collect();
    let reason = format!(
        "version 1 of \"selfup\" is no longer kept; kept: {} (the running version and up to 3 more)",
        kept_list.join(", ")
    );
    assert_eq!(r, json!({"type": "error", "reason": reason}));
    assert_eq!(t.actor_state("selfup")["version"].as_u64(), Some(cur - 1));
    assert_eq!(t.read("data/selfup/blob").len(), 1 << 20, "the snapshot came back");

    // A host killed while deleting version cur-3 left its renamed
    // directory half removed; the next world (keeping one other version)
    // opens, finishes it and deletes down to its own bound.
    t.world.take().unwrap().quit();
    let vdir = t.root().join("broker/versions/selfup");
    std::fs::rename(vdir.join((cur - 3).to_string()), vdir.join(format!(".pruned-{}", cur - 3))).unwrap();
    std::fs::remove_file(vdir.join(format!(".pruned-{}/meta.json", cur - 3))).unwrap();
    t.world =
        Some(cairn_actors::World::open(&t.root(), WorldConfig { versions_kept: 1, ..Default::default() }).unwrap());
    let (kept, other) = version_dirs(&t, "selfup");
    assert_eq!(kept, [cur - 1, cur], "the running version and the newest other");
    assert!(other.is_empty(), "{other:?}");
    t.wait_state("selfup", "running", |s| s["state"] == "running");
    let r = t.req(json!({"type": "rollback", "id": "selfup", "version": cur - 2}));
    assert_eq!(r["type"], "error", "{r}");
    let reason = format!(
        "version {} of \"selfup\" is no longer kept; kept: {}, {cur} (the running version and up to 1 more)",
        cur - 2,
        cur - 1
    );
    assert_eq!(r, json!({"type": "error", "reason": reason}));
    let after = rss_mib();
    assert!(after < before + 300, "host RSS grew from {before} to {after} MiB");
    lists_within_a_second(&t);
}
