//! Crash tests of the JSONL store with real processes and real SIGKILL.
//!
//! The test binary re-executes itself (`current_exe`) with `CAIRN_CRASH_DIR`
//! set: the `child` test then acts as a writer that appends deterministic
//! commits forever, printing `ACK n` after commit n returned. The parent
//! SIGKILLs it at random moments (at least 100 times, reopening and
//! continuing the same file each time), then checks that the file opens and
//! that its state equals the model after exactly n commits, with n at least
//! the last acknowledged commit and at most one more (the commit in flight).
//! Compaction is killed at each of its steps the same way, and a second
//! writer process is refused while the first holds the session.

// Helpers outside #[test] fns unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cairn_core::storage::{
    CompactStep, Durability, Header, JsonlStore, MemStore, Storage, StorageError, StoreOptions, Transaction, to_raw,
};
use serde_json::json;

const NAMESPACES: &[&str] = &["lane", "op", "pending", "fact"];

fn snapshot(s: &impl Storage) -> String {
    let entries: Vec<_> = s
        .entries()
        .into_iter()
        .map(|e| format!("{}<{:?}#{}:{}={}", e.id, e.parent_id, e.seq, e.entry_type, e.payload.get()))
        .collect();
    let registers: Vec<_> = NAMESPACES.iter().map(|ns| (ns, s.registers(ns))).collect();
    format!("entries={entries:?}\nregisters={registers:?}\nusage={:?}\nstate={:?}", s.usage(), s.state())
}

/// Commit number `i` (1-based) given the store's current state: an entry
/// chained to the previous one, register churn (so compaction has dead bytes
/// to drop), a CAS on the state, now and then a usage row.
fn commit_i(s: &mut impl Storage, i: u64) -> Result<(), StorageError> {
    let parent = (i > 1).then(|| format!("e{}", i - 1));
    let mut tx = Transaction::new()
        .entry(
            format!("e{i}"),
            parent.as_deref(),
            "message",
            to_raw(&json!({"i": i, "pad": "x".repeat((i % 97) as usize)}))?,
        )
        .set("fact", "counter", to_raw(&i)?)
        .set("op", format!("op{i}"), to_raw(&json!({"step": i}))?)
        .set("lane", "main", to_raw(&format!("e{i}"))?);
    if i > 1 {
        tx = tx.delete("op", format!("op{}", i - 1));
    }
    if i.is_multiple_of(7) {
        tx = tx.usage(format!("u{i}"), Some(&format!("e{i}")), to_raw(&json!({"in": i, "out": 2 * i}))?);
    }
    let expected = s.state().map_or(0, |st| st.seq);
    s.commit(tx.state(expected, to_raw(&json!({"pc": "planning", "i": i}))?))?;
    Ok(())
}

/// The model, advanced commit by commit (kills only ever move it forward).
struct Model {
    store: MemStore,
    n: u64,
}

impl Model {
    fn new() -> Self {
        Model { store: MemStore::new(Header::new("crash", "/")), n: 0 }
    }

    /// The snapshot after `n` commits (`n` never below the last call's).
    fn at(&mut self, n: u64) -> String {
        assert!(n >= self.n, "the file lost commits: held {} before, {n} now", self.n);
        while self.n < n {
            self.n += 1;
            commit_i(&mut self.store, self.n).unwrap();
        }
        snapshot(&self.store)
    }
}

fn child_options() -> StoreOptions {
    let durability = match std::env::var("CAIRN_CRASH_SYNC").as_deref() {
        Ok("1") => Durability::EveryCommit,
        _ => Durability::None,
    };
    StoreOptions {
        durability,
        // In compaction-kill mode the child compacts explicitly, once.
        compact_ratio: if std::env::var("CAIRN_CRASH_STEP").is_ok() { None } else { Some(0.4) },
        compact_min_bytes: 8 << 10,
        on_compact_step: Some(stop_at_step),
        ..StoreOptions::default()
    }
}

/// In compaction-kill mode, announce the step and wait to be killed.
fn stop_at_step(step: CompactStep) {
    if std::env::var("CAIRN_CRASH_STEP").ok().as_deref() == Some(&format!("{step:?}")) {
        say(&format!("STEP {step:?}"));
        loop {
            std::thread::sleep(Duration::from_secs(60));
        }
    }
}

/// Tell the parent something, unbuffered (print! may be captured by the
/// test harness; a direct write to stdout is not).
fn say(message: &str) {
    let mut out = std::io::stdout().lock();
    out.write_all(message.as_bytes()).unwrap();
    out.write_all(b"\n").unwrap();
    out.flush().unwrap();
}

/// The child: open (or create) the session and append commits until killed.
#[test]
fn child() {
    let Ok(dir) = std::env::var("CAIRN_CRASH_DIR") else { return };
    let dir = PathBuf::from(dir);
    let path = dir.join("crash.jsonl");
    let mut store = if path.exists() {
        JsonlStore::open(&path, child_options()).unwrap()
    } else {
        JsonlStore::create(&dir, Header::new("crash", "/"), child_options()).unwrap()
    };
    if std::env::var("CAIRN_CRASH_HOLD").is_ok() {
        say("HOLDING");
        loop {
            std::thread::sleep(Duration::from_secs(60));
        }
    }
    if std::env::var("CAIRN_CRASH_STEP").is_ok() {
        // Dead bytes enough to pass the ratio, then compact explicitly.
        for _ in 0..3 {
            let n = store.entry_count() as u64;
            commit_i(&mut store, n + 1).unwrap();
            say(&format!("ACK {}", n + 1));
        }
        store.compact().unwrap();
        say("COMPACTED");
        loop {
            std::thread::sleep(Duration::from_secs(60));
        }
    }
    let mut n = store.entry_count() as u64;
    loop {
        n += 1;
        commit_i(&mut store, n).unwrap();
        say(&format!("ACK {n}"));
    }
}

fn spawn(dir: &Path, envs: &[(&str, &str)]) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env("CAIRN_CRASH_DIR", dir)
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    (child, stdout)
}

/// Read lines until one contains `prefix`; the number after `ACK ` of
/// the last ack seen is tracked in `acked`.
fn read_until(out: &mut BufReader<std::process::ChildStdout>, prefix: &str, acked: &mut u64) -> bool {
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            return false;
        }
        // libtest prints "test child ... " before the child's first line.
        if let Some((_, n)) = line.trim().split_once("ACK ") {
            *acked = n.parse().unwrap();
        }
        if line.contains(prefix) {
            return true;
        }
    }
}

/// A tiny deterministic PRNG (xorshift): the kill moments vary, the test
/// stays reproducible from its seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

/// Verify the file after a kill: it opens read-only and writable, and its
/// state is the model after `n` commits with `acked <= n <= acked + 1`.
fn verify(path: &Path, acked: u64, model: &mut Model) -> u64 {
    let ro = JsonlStore::open_read_only(path).unwrap_or_else(|e| panic!("file does not open after a kill: {e}"));
    let n = ro.entry_count() as u64;
    assert!(n >= acked && n <= acked + 1, "acknowledged {acked} commits, file holds {n}");
    assert_eq!(snapshot(&ro), model.at(n), "state after {n} commits differs from the model");
    n
}

#[test]
fn sigkill_at_random_moments_leaves_a_committed_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.jsonl");
    let mut rng = Rng(0x5eed_cafe_f00d_d00d);
    let mut models = Model::new();
    let mut total = 0;
    let mut torn_seen = 0;
    let mut torn_expected = 0;
    for round in 0..120 {
        let sync = if round % 3 == 0 { "1" } else { "0" };
        let (mut child, mut out) = spawn(dir.path(), &[("CAIRN_CRASH_SYNC", sync)]);
        let mut acked = total;
        let wait_for = 1 + rng.next(25);
        for _ in 0..wait_for {
            assert!(read_until(&mut out, "ACK", &mut acked), "child died early");
        }
        std::thread::sleep(Duration::from_micros(rng.next(3000)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Acks printed before death count as acknowledged.
        read_until(&mut out, "\u{0}never", &mut acked);
        // Oracle, independent of the replay code: a kill can only leave a
        // prefix of one line, so the torn bytes are exactly those after the
        // file's last newline.
        let bytes = std::fs::read(&path).unwrap();
        let trailing = bytes.len() - bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let torn = JsonlStore::open_read_only(&path).unwrap().torn_tail_bytes();
        assert_eq!(
            torn, trailing as u64,
            "round {round}: replay's torn tail differs from the bytes after the last newline"
        );
        torn_expected += u64::from(trailing > 0);
        torn_seen += u64::from(torn > 0);
        total = verify(&path, acked, &mut models);
        // The next writer cuts the torn bytes off before appending.
        drop(JsonlStore::open(&path, StoreOptions::with_durability(Durability::None)).unwrap());
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(len, (bytes.len() - trailing) as u64, "round {round}: a writable open did not cut the torn tail");
    }
    assert!(total >= 120, "only {total} commits in 120 rounds");
    assert_eq!(torn_seen, torn_expected, "torn tails seen by replay differ from the oracle's count");
    eprintln!("120 kills, {total} commits, {torn_seen} torn tails seen ({torn_expected} expected)");
}

#[test]
fn sigkill_at_each_compaction_step_leaves_old_or_new_file() {
    for step in [CompactStep::TempWritten, CompactStep::TempSynced, CompactStep::Renamed, CompactStep::DirSynced] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crash.jsonl");
        let mut models = Model::new();
        // Build up some history with dead bytes first.
        {
            let mut s = JsonlStore::create(
                dir.path(),
                Header::new("crash", "/"),
                StoreOptions::with_durability(Durability::None),
            )
            .unwrap();
            for i in 1..=40 {
                commit_i(&mut s, i).unwrap();
            }
        }
        let len_before = std::fs::metadata(&path).unwrap().len();
        let step_name = format!("{step:?}");
        let (mut child, mut out) = spawn(dir.path(), &[("CAIRN_CRASH_STEP", &step_name), ("CAIRN_CRASH_SYNC", "1")]);
        let mut acked = 40;
        assert!(read_until(&mut out, "STEP", &mut acked), "child never reached {step_name}");
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(acked, 43);
        let n = verify(&path, acked, &mut models);
        assert_eq!(n, 43, "compaction must not lose or add commits");
        let len_after = std::fs::metadata(&path).unwrap().len();
        let compacted = len_after < len_before;
        let temp_left = dir.path().join("crash.jsonl.compact").exists();
        match step {
            CompactStep::TempWritten | CompactStep::TempSynced => {
                assert!(!compacted && temp_left, "{step_name}: the old file stays, the temp file is left")
            }
            CompactStep::Renamed | CompactStep::DirSynced => assert!(compacted && !temp_left, "{step_name}: new file"),
        }
        // A writer cleans up the leftover temp file and goes on.
        let mut s = JsonlStore::open(&path, StoreOptions::with_durability(Durability::None)).unwrap();
        assert!(!dir.path().join("crash.jsonl.compact").exists());
        commit_i(&mut s, 44).unwrap();
        drop(s);
        verify(&path, 44, &mut models);
    }
}

#[test]
fn a_second_writer_process_is_refused_with_the_holders_pid() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.jsonl");
    {
        let mut s = JsonlStore::create(dir.path(), Header::new("crash", "/"), StoreOptions::default()).unwrap();
        commit_i(&mut s, 1).unwrap();
    }
    let (mut child, mut out) = spawn(dir.path(), &[("CAIRN_CRASH_HOLD", "1")]);
    let mut acked = 0;
    assert!(read_until(&mut out, "HOLDING", &mut acked));
    match JsonlStore::open(&path, StoreOptions::default()) {
        Err(StorageError::Busy { pid, .. }) => assert_eq!(pid, Some(child.id())),
        other => panic!("expected Busy, got {other:?}"),
    }
    // Readers still work while it is held.
    assert_eq!(JsonlStore::open_read_only(&path).unwrap().entry_count(), 1);
    child.kill().unwrap();
    child.wait().unwrap();
    // The kernel released the lock with the process.
    let s = JsonlStore::open(&path, StoreOptions::default()).unwrap();
    assert_eq!(s.entry_count(), 1);
}

#[test]
fn tail_follows_a_live_writer_across_compactions_and_kills() {
    use cairn_core::storage::{Record, Tail};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.jsonl");
    {
        let mut s =
            JsonlStore::create(dir.path(), Header::new("crash", "/"), StoreOptions::with_durability(Durability::None))
                .unwrap();
        commit_i(&mut s, 1).unwrap();
    }
    let mut tail = Tail::open(&path).unwrap();
    let mut seen_entries: Vec<String> = Vec::new();
    let mut last_seq = 0;
    let mut collect = |records: Vec<Record>| {
        for record in records {
            assert!(record.seq() > last_seq, "seq {} after {last_seq}", record.seq());
            last_seq = record.seq();
            if let Record::Entry(e) = record {
                seen_entries.push(e.id);
            }
        }
    };
    for _ in 0..3 {
        // The child writes with automatic compaction on; we poll meanwhile.
        let (mut child, mut out) = spawn(dir.path(), &[("CAIRN_CRASH_SYNC", "0")]);
        let mut acked = 0;
        for _ in 0..200 {
            assert!(read_until(&mut out, "ACK", &mut acked));
            collect(tail.poll().unwrap());
        }
        child.kill().unwrap();
        child.wait().unwrap();
        read_until(&mut out, "\u{0}never", &mut acked);
        collect(tail.poll().unwrap());
    }
    // A writer reopening cuts nothing here (no torn tail), so the tail saw
    // every entry of the file, once, in order.
    let store = JsonlStore::open_read_only(&path).unwrap();
    let in_file: Vec<String> = store.entries().into_iter().map(|e| e.id).collect();
    assert_eq!(seen_entries, in_file);
    assert!(in_file.len() > 600);
}
