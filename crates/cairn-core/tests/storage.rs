//! Tier A and adversarial tests of the session store: one conformance suite
//! written once and run against every backend (MemStore, JsonlStore and,
//! with `--features sqlite`, SqliteStore), then the JSONL replay rules, the
//! writer lock, the tail API, compaction and `check_file`.

// Helpers outside #[test] fns unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};

use cairn_core::storage::{
    Durability, Header, JsonlStore, MemStore, RawJson, Record, Storage, StorageError, StoreOptions, Tail, Transaction,
    check_file, new_session_id, to_raw,
};
use serde_json::json;

use crate::conformance;
use conformance::{Backend, snapshot};

fn raw(v: serde_json::Value) -> RawJson {
    to_raw(&v).unwrap()
}

fn fast() -> StoreOptions {
    StoreOptions::with_durability(Durability::None)
}

struct Mem;
impl Backend for Mem {
    type S = MemStore;
    fn fresh(&mut self) -> MemStore {
        MemStore::new(Header::new("mem", "/"))
    }
    fn reopen(&mut self, store: MemStore) -> MemStore {
        store
    }
}

struct Jsonl(tempfile::TempDir);
impl Jsonl {
    fn new() -> Self {
        Jsonl(tempfile::tempdir().unwrap())
    }
}
impl Backend for Jsonl {
    type S = JsonlStore;
    fn fresh(&mut self) -> JsonlStore {
        JsonlStore::create(self.0.path(), Header::new(new_session_id(), "/"), StoreOptions::default()).unwrap()
    }
    fn reopen(&mut self, store: JsonlStore) -> JsonlStore {
        let path = store.path().to_owned();
        drop(store);
        let again = JsonlStore::open(&path, StoreOptions::default()).unwrap();
        // A read-only replay must see the same state as the writer.
        assert_eq!(snapshot(&JsonlStore::open_read_only(&path).unwrap()), snapshot(&again));
        again
    }
}

#[cfg(feature = "sqlite")]
struct Sqlite(tempfile::TempDir);
#[cfg(feature = "sqlite")]
impl Backend for Sqlite {
    type S = cairn_core::storage::SqliteStore;
    fn fresh(&mut self) -> Self::S {
        cairn_core::storage::SqliteStore::create(self.0.path(), Header::new(new_session_id(), "/")).unwrap()
    }
    fn reopen(&mut self, store: Self::S) -> Self::S {
        let path = store.path().to_owned();
        drop(store);
        cairn_core::storage::SqliteStore::open(&path).unwrap()
    }
}

conformance!(mem, Mem);
conformance!(jsonl, Jsonl::new());
#[cfg(feature = "sqlite")]
conformance!(sqlite, Sqlite(tempfile::tempdir().unwrap()));

// ---------------------------------------------------------------------------
// JSONL replay rules.

fn new_store(dir: &Path) -> JsonlStore {
    JsonlStore::create(dir, Header::new(new_session_id(), "/work"), fast()).unwrap()
}

fn append(path: &Path, bytes: &[u8]) {
    std::fs::OpenOptions::new().append(true).open(path).unwrap().write_all(bytes).unwrap();
}

/// A session with three commits; returns its path.
fn three_commits(dir: &Path) -> PathBuf {
    let mut s = new_store(dir);
    s.commit(Transaction::new().entry("a", None, "m", raw(json!(1)))).unwrap();
    s.commit(Transaction::new().entry("b", Some("a"), "m", raw(json!(2))).set("lane", "main", raw(json!("b"))))
        .unwrap();
    s.commit(Transaction::new().state(0, raw(json!("idle")))).unwrap();
    s.path().to_owned()
}

#[test]
fn file_layout_is_the_seed_format() {
    let dir = tempfile::tempdir().unwrap();
    let path = three_commits(dir.path());
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4);
    let header: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(header["v"], 1);
    assert_eq!(header["kind"], "header");
    assert_eq!(header["storageVersion"], 1);
    assert_eq!(header["cwd"], "/work");
    assert!(header["createdAt"].is_i64());
    assert_eq!(path.file_name().unwrap().to_str().unwrap(), format!("{}.jsonl", header["id"].as_str().unwrap()));
    let one: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
    assert_eq!(one["kind"], "entry");
    assert_eq!(one["parentId"], serde_json::Value::Null);
    assert_eq!(one["type"], "m");
    let two: serde_json::Value = serde_json::from_str(lines[2]).unwrap();
    assert_eq!(two[0]["parentId"], "a");
    assert_eq!(two[1]["kind"], "register");
    assert_eq!(two[1]["op"], "set");
    assert_eq!(two[1]["namespace"], "lane");
    assert_eq!(two[1]["seq"], 3);
    let three: serde_json::Value = serde_json::from_str(lines[3]).unwrap();
    assert_eq!(three, json!({"kind": "state", "seq": 4, "pc": "idle"}));
    assert!(text.ends_with('\n'));
}

#[test]
fn torn_final_line_is_discarded_and_cut_before_the_next_append() {
    let dir = tempfile::tempdir().unwrap();
    let path = three_commits(dir.path());
    let good = std::fs::read(&path).unwrap();
    let expected = snapshot(&JsonlStore::open_read_only(&path).unwrap());
    append(&path, br#"[{"kind":"entry","seq":5,"id":"c","parentId":"b","timestamp":1,"type":"m","payload":{"#);
    // Read-only: skipped, reported, file untouched.
    let ro = JsonlStore::open_read_only(&path).unwrap();
    assert_eq!(snapshot(&ro), expected);
    assert!(ro.torn_tail_bytes() > 0);
    let report = check_file(&path);
    assert!(report.ok && report.torn_tail, "{report:?}");
    assert_ne!(std::fs::read(&path).unwrap(), good, "read-only open must not modify the file");
    // Writable: cut off, and the next commit starts on a fresh line.
    let mut s = JsonlStore::open(&path, fast()).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), good);
    s.commit(Transaction::new().entry("c", Some("b"), "m", raw(json!(3)))).unwrap();
    drop(s);
    let s = JsonlStore::open_read_only(&path).unwrap();
    assert_eq!(s.torn_tail_bytes(), 0);
    assert_eq!(s.entry("c").unwrap().seq, 5);
}

#[test]
fn final_line_with_newline_but_not_json_is_torn() {
    let dir = tempfile::tempdir().unwrap();
    let path = three_commits(dir.path());
    append(&path, b"\0\0\0\0\n");
    let s = JsonlStore::open_read_only(&path).unwrap();
    assert_eq!(s.last_seq(), 4);
    assert_eq!(s.torn_tail_bytes(), 5);
}

#[test]
fn invalid_middle_line_is_an_error_with_line_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let path = three_commits(dir.path());
    let text = std::fs::read(&path).unwrap();
    let header_len = text.iter().position(|&b| b == b'\n').unwrap() + 1;
    let mut broken = text[..header_len].to_vec();
    broken.extend_from_slice(b"{garbage\n");
    broken.extend_from_slice(&text[header_len..]);
    std::fs::write(&path, &broken).unwrap();
    for result in [JsonlStore::open_read_only(&path).map(|_| ()), JsonlStore::open(&path, fast()).map(|_| ())] {
        match result {
            Err(StorageError::Corrupt { line, offset, .. }) => {
                assert_eq!(line, 2);
                assert_eq!(offset, header_len as u64);
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }
    assert_eq!(std::fs::read(&path).unwrap(), broken, "a failed open must not change the file");
    let report = check_file(&path);
    assert!(!report.ok);
    assert!(report.error.as_deref().unwrap().contains("line 2"), "{report:?}");
}

#[test]
fn non_utf8_middle_line_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = three_commits(dir.path());
    let mut text = std::fs::read(&path).unwrap();
    text.extend_from_slice(b"\xff\xfe\xfd\n");
    text.extend_from_slice(br#"{"kind":"usage","seq":9,"id":"u","usage":{}}"#);
    text.push(b'\n');
    std::fs::write(&path, &text).unwrap();
    let err = JsonlStore::open_read_only(&path).unwrap_err();
    assert!(matches!(err, StorageError::Corrupt { line: 5, .. }), "{err}");
}

#[test]
fn valid_json_that_breaks_an_invariant_is_an_error_even_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let path = three_commits(dir.path());
    // seq 4 again: a seq collision (two writers that both appended).
    append(&path, br#"{"kind":"usage","seq":4,"id":"u","usage":{}}"#);
    append(&path, b"\n");
    let err = JsonlStore::open_read_only(&path).unwrap_err();
    assert!(err.to_string().contains("seq 4 is not greater"), "{err}");
    assert!(matches!(err, StorageError::Corrupt { line: 5, .. }));
}

#[test]
fn duplicate_entry_id_in_the_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = three_commits(dir.path());
    append(&path, br#"{"kind":"entry","seq":9,"id":"a","parentId":null,"timestamp":1,"type":"m","payload":2}"#);
    append(&path, b"\n");
    let err = JsonlStore::open(&path, fast()).unwrap_err();
    assert!(err.to_string().contains("duplicate entry id \"a\""), "{err}");
}

#[test]
fn seq_gaps_are_legal() {
    let dir = tempfile::tempdir().unwrap();
    let path = three_commits(dir.path());
    append(&path, br#"{"kind":"usage","seq":100,"id":"u","usage":{}}"#);
    append(&path, b"\n");
    let mut s = JsonlStore::open(&path, fast()).unwrap();
    assert_eq!(s.last_seq(), 100);
    let c = s.commit(Transaction::new().usage("u2", None, raw(json!(1)))).unwrap();
    assert_eq!(c.first_seq, 101);
}

#[test]
fn newer_storage_version_is_refused_naming_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.jsonl");
    std::fs::write(
        &path,
        "{\"v\":1,\"kind\":\"header\",\"id\":\"s\",\"storageVersion\":7,\"createdAt\":0,\"cwd\":\"/\"}\n",
    )
    .unwrap();
    let before = std::fs::read(&path).unwrap();
    let err = JsonlStore::open(&path, fast()).unwrap_err();
    assert!(matches!(err, StorageError::NewerVersion { found: 7, supported: 1, .. }));
    let msg = err.to_string();
    assert!(msg.contains("storage version 7") && msg.contains("version 1"), "{msg}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert!(!check_file(&path).ok);
}

#[test]
fn empty_file_and_missing_header_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let err = JsonlStore::open_read_only(&empty).unwrap_err();
    assert!(matches!(err, StorageError::BadHeader { .. }) && err.to_string().contains("empty"), "{err}");
    let headless = dir.path().join("headless.jsonl");
    std::fs::write(&headless, "{\"kind\":\"usage\",\"seq\":1,\"id\":\"u\",\"usage\":{}}\n").unwrap();
    let err = JsonlStore::open(&headless, fast()).unwrap_err();
    assert!(matches!(err, StorageError::BadHeader { .. }), "{err}");
    let torn_header = dir.path().join("torn.jsonl");
    std::fs::write(&torn_header, "{\"v\":1,\"kind\":\"hea").unwrap();
    assert!(matches!(JsonlStore::open_read_only(&torn_header), Err(StorageError::BadHeader { .. })));
    let report = check_file(&headless);
    assert!(!report.ok && report.error.is_some());
}

#[test]
fn create_refuses_an_existing_session_and_bad_ids() {
    let dir = tempfile::tempdir().unwrap();
    let header = Header::new("same", "/");
    let s = JsonlStore::create(dir.path(), header.clone(), fast()).unwrap();
    drop(s);
    let err = JsonlStore::create(dir.path(), header, fast()).unwrap_err();
    assert!(matches!(err, StorageError::Exists { .. }), "{err}");
    for bad in ["", "../x", "a/b", ".hidden"] {
        assert!(JsonlStore::create(dir.path(), Header::new(bad, "/"), fast()).is_err(), "{bad:?}");
    }
    // No temp files left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(names.iter().all(|n| !n.to_string_lossy().ends_with(".new")), "{names:?}");
}

#[test]
fn session_ids_are_time_ordered_and_unique() {
    let ids: Vec<String> = (0..100).map(|_| new_session_id()).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 100);
    assert_eq!(ids[0].len(), 36);
    assert!(ids[0] <= ids[99]);
}

#[test]
fn one_writer_per_session_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = new_store(dir.path());
    let path = a.path().to_owned();
    let err = JsonlStore::open(&path, fast()).unwrap_err();
    match &err {
        StorageError::Busy { pid, .. } => assert_eq!(*pid, Some(std::process::id())),
        other => panic!("expected Busy, got {other:?}"),
    }
    assert!(err.to_string().contains("session is busy"), "{err}");
    // Readers are welcome while the writer writes.
    let mut reader = JsonlStore::open_read_only(&path).unwrap();
    a.commit(Transaction::new().entry("x", None, "m", raw(json!(1)))).unwrap();
    assert!(matches!(
        reader.commit(Transaction::new().usage("u", None, raw(json!(1)))),
        Err(StorageError::ReadOnly { .. })
    ));
    drop(a);
    let b = JsonlStore::open(&path, fast()).unwrap();
    assert_eq!(b.entry_count(), 1);
}

#[test]
fn tail_returns_complete_lines_only_and_survives_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let path = three_commits(dir.path());
    let mut tail = Tail::open(&path).unwrap();
    let first = tail.poll().unwrap();
    assert_eq!(first.iter().map(Record::seq).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert!(tail.poll().unwrap().is_empty());
    // A half-written line is not returned until its newline arrives.
    let line = br#"{"kind":"usage","seq":5,"id":"u","usage":{"n":1}}"#;
    append(&path, &line[..20]);
    assert!(tail.poll().unwrap().is_empty());
    append(&path, &line[20..]);
    assert!(tail.poll().unwrap().is_empty());
    append(&path, b"\n");
    let got = tail.poll().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(cairn_core::storage::format_record(&got[0]), std::str::from_utf8(line).unwrap());
    // Compaction renames a new file over the path: nothing is returned twice.
    let mut s = JsonlStore::open(&path, fast()).unwrap();
    for i in 0..5 {
        s.commit(Transaction::new().set("fact", "k", raw(json!(i)))).unwrap();
    }
    s.compact().unwrap();
    s.commit(Transaction::new().entry("after", None, "m", raw(json!(0)))).unwrap();
    let got: Vec<u64> = tail.poll().unwrap().iter().map(Record::seq).collect();
    assert_eq!(got, [10, 11], "only the live register write after seq 5 and the new entry");
}

#[test]
fn compaction_keeps_entries_and_live_state_and_drops_dead_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = three_commits(dir.path());
    let mut s = JsonlStore::open(&path, fast()).unwrap();
    for i in 0..50 {
        s.commit(
            Transaction::new()
                .set("fact", "counter", raw(json!(i)))
                .set("op", format!("op{i}"), raw(json!({"i": i})))
                .state(s.state().unwrap().seq, raw(json!({"i": i}))),
        )
        .unwrap();
        s.commit(Transaction::new().delete("op", format!("op{i}")).state(s.state().unwrap().seq, raw(json!({"i": i}))))
            .unwrap();
    }
    s.commit(Transaction::new().delete("fact", "gone")).unwrap();
    let before = snapshot(&s);
    let ratio = s.dead_bytes_ratio();
    assert!(ratio > 0.5, "{ratio}");
    let len = std::fs::metadata(&path).unwrap().len();
    s.compact().unwrap();
    assert!(std::fs::metadata(&path).unwrap().len() < len / 3);
    assert!(s.dead_bytes_ratio() < 0.2, "{}", s.dead_bytes_ratio());
    assert_eq!(snapshot(&s), before);
    // Still writable after the rename, and the last seq survived.
    let c = s.commit(Transaction::new().entry("c", Some("b"), "m", raw(json!(3)))).unwrap();
    assert_eq!(c.first_seq, 256);
    let after = snapshot(&s);
    drop(s);
    let s = JsonlStore::open(&path, fast()).unwrap();
    assert_eq!(snapshot(&s), after);
    assert!(!dir.path().read_dir().unwrap().any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".compact")));
}

#[test]
fn automatic_compaction_past_the_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions { compact_ratio: Some(0.5), compact_min_bytes: 4096, ..fast() };
    let mut s = JsonlStore::create(dir.path(), Header::new("auto", "/"), opts).unwrap();
    s.commit(Transaction::new().entry("a", None, "m", raw(json!("x".repeat(100))))).unwrap();
    for i in 0..400 {
        s.commit(Transaction::new().set("fact", "k", raw(json!({"i": i, "pad": "y".repeat(50)})))).unwrap();
        assert!(s.dead_bytes_ratio() <= 0.5 + 1e-9 || s.len_bytes() < 4096);
    }
    assert!(std::fs::metadata(s.path()).unwrap().len() < 20_000);
    let expected = snapshot(&s);
    let path = s.path().to_owned();
    drop(s);
    assert_eq!(snapshot(&JsonlStore::open_read_only(&path).unwrap()), expected);
}

#[test]
fn check_report_json_shape() {
    let dir = tempfile::tempdir().unwrap();
    let path = three_commits(dir.path());
    let report = check_file(&path);
    let value = serde_json::to_value(&report).unwrap();
    assert_eq!(
        value,
        json!({"ok": true, "entries": 2, "registers": 1, "usage": 0, "lastSeq": 4, "tornTail": false,
               "deadBytesRatio": 0.0, "storageVersion": 1, "warnings": [], "error": null})
    );
    assert!(report.to_string().starts_with("ok: 2 entries"));
}

#[test]
fn durability_policies_all_commit_and_sync() {
    let dir = tempfile::tempdir().unwrap();
    for (i, durability) in [
        Durability::EveryCommit,
        Durability::Grouped { max_commits: 3, max_delay: std::time::Duration::from_secs(60) },
        Durability::None,
    ]
    .into_iter()
    .enumerate()
    {
        let mut s = JsonlStore::create(
            dir.path(),
            Header::new(format!("d{i}"), "/"),
            StoreOptions::with_durability(durability),
        )
        .unwrap();
        for j in 0..7 {
            s.commit(Transaction::new().usage(format!("u{j}"), None, raw(json!(j)))).unwrap();
        }
        s.sync().unwrap();
        let path = s.path().to_owned();
        drop(s);
        assert_eq!(JsonlStore::open_read_only(&path).unwrap().usage().len(), 7);
    }
}

#[test]
fn a_100_mb_register_value_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    // Above the default line limit (64 MiB): refused unless the limit is raised.
    let opts = StoreOptions { max_line_bytes: 128 << 20, ..fast() };
    let mut s = JsonlStore::create(dir.path(), Header::new(new_session_id(), "/"), opts).unwrap();
    let big = "z".repeat(100 << 20);
    let mut default = JsonlStore::create(dir.path(), Header::new("default", "/"), fast()).unwrap();
    let err = default.commit(Transaction::new().set("fact", "big", raw(json!(big)))).unwrap_err();
    assert!(err.to_string().contains("longer than the limit of 67108864 bytes"), "{err}");
    s.commit(Transaction::new().set("fact", "big", raw(json!(big)))).unwrap();
    s.commit(Transaction::new().set("fact", "small", raw(json!(1)))).unwrap();
    let path = s.path().to_owned();
    drop(s);
    assert!(matches!(JsonlStore::open(&path, fast()), Err(StorageError::LineTooLong { line: 2, .. })));
    let s = JsonlStore::open(&path, opts).unwrap();
    let value = s.register("fact", "big").unwrap();
    assert_eq!(value.get().len(), big.len() + 2);
    assert!(value.get()[1..].starts_with("zzzz"));
    assert_eq!(s.register("fact", "small"), Some(raw(json!(1))));
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite_second_writer_is_busy() {
    use cairn_core::storage::SqliteStore;
    let dir = tempfile::tempdir().unwrap();
    let mut a = SqliteStore::create(dir.path(), Header::new("s", "/")).unwrap();
    a.commit(Transaction::new().entry("x", None, "m", raw(json!(1)))).unwrap();
    let path = a.path().to_owned();
    match SqliteStore::open(&path) {
        Err(StorageError::Busy { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
        other => panic!("expected Busy, got {other:?}"),
    }
    a.commit(Transaction::new().state(0, raw(json!("a")))).unwrap();
    drop(a);
    let s = SqliteStore::open(&path).unwrap();
    assert_eq!(s.state().unwrap().pc, raw(json!("a")));
    assert_eq!(s.last_seq(), 2);
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite_seq_collision_when_the_lock_is_bypassed_is_refused() {
    use cairn_core::storage::{SqliteStore, lock_path};
    let dir = tempfile::tempdir().unwrap();
    let mut a = SqliteStore::create(dir.path(), Header::new("s", "/")).unwrap();
    a.commit(Transaction::new().entry("x", None, "m", raw(json!(1)))).unwrap();
    let path = a.path().to_owned();
    // Someone deletes the lock file: a second handle gets in.
    std::fs::remove_file(lock_path(&path)).unwrap();
    let mut b = SqliteStore::open(&path).unwrap();
    a.commit(Transaction::new().state(0, raw(json!("a")))).unwrap();
    // b still believes seq 1 is the last: its commit would reuse seq 2.
    let err = b.commit(Transaction::new().state(0, raw(json!("b")))).unwrap_err();
    assert!(err.to_string().contains("another writer committed"), "{err}");
    drop((a, b));
    let s = SqliteStore::open(&path).unwrap();
    assert_eq!(s.state().unwrap().pc, raw(json!("a")));
}

#[test]
fn jsonl_seq_collision_between_two_handles_cannot_happen() {
    // Two writable handles on one file would both append seq N+1; the lock
    // refuses the second, and a file that has such a collision anyway (two
    // writers bypassing cairn) is refused at open with the line number.
    let dir = tempfile::tempdir().unwrap();
    let mut a = new_store(dir.path());
    a.commit(Transaction::new().entry("x", None, "m", raw(json!(1)))).unwrap();
    assert!(matches!(JsonlStore::open(a.path(), fast()), Err(StorageError::Busy { .. })));
    let path = a.path().to_owned();
    drop(a);
    let line = std::fs::read_to_string(&path).unwrap().lines().nth(1).unwrap().replace("\"x\"", "\"y\"");
    append(&path, format!("{line}\n").as_bytes());
    let err = JsonlStore::open_read_only(&path).unwrap_err();
    assert!(matches!(err, StorageError::Corrupt { line: 3, .. }), "{err}");
}

#[test]
fn garbage_lines_of_every_kind_are_refused_in_the_middle() {
    let dir = tempfile::tempdir().unwrap();
    let path = three_commits(dir.path());
    let good = std::fs::read(&path).unwrap();
    for garbage in [
        &b"[]"[..],
        b"null",
        b"42",
        b"\"text\"",
        b"{}",
        b"{\"kind\":\"entry\",\"seq\":9}",
        b"{\"kind\":\"header\",\"seq\":9}",
        b"{\"kind\":\"register\",\"op\":\"set\",\"seq\":9,\"namespace\":\"lane\",\"key\":\"k\"}",
        b"{\"kind\":\"register\",\"op\":\"set\",\"seq\":9,\"namespace\":\"bogus\",\"key\":\"k\",\"value\":1}",
        b"{\"kind\":\"usage\",\"seq\":9,\"id\":\"u\",\"usage\":{}} trailing",
        b"\x00\x00\x00",
        b"\xc3\x28",
    ] {
        let mut bytes = good.clone();
        bytes.extend_from_slice(garbage);
        bytes.push(b'\n');
        bytes.extend_from_slice(b"{\"kind\":\"usage\",\"seq\":100,\"id\":\"u\",\"usage\":{}}\n");
        std::fs::write(&path, &bytes).unwrap();
        match JsonlStore::open_read_only(&path) {
            Err(StorageError::Corrupt { line: 5, offset, .. }) => assert_eq!(offset, good.len() as u64),
            other => panic!("{:?}: expected Corrupt at line 5, got {other:?}", String::from_utf8_lossy(garbage)),
        }
    }
}

#[test]
fn opening_a_missing_session_is_an_io_error_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope.jsonl");
    assert!(matches!(JsonlStore::open(&path, fast()), Err(StorageError::Io { .. })));
    assert!(matches!(JsonlStore::open_read_only(&path), Err(StorageError::Io { .. })));
    assert!(!check_file(&path).ok);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
