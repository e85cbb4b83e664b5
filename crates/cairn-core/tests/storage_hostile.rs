//! The session store against hostile files and edge values: FIFOs and
//! devices where a session should be, symlinks, over-long lines, an
//! exhausted seq space, the seed's byte format pinned by hand-written
//! golden lines, storage version 0 and its migration, the compaction
//! default, and the listing's backward scan checked against a full replay.

// Helpers outside #[test] fns unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use cairn_core::storage::{
    DEFAULT_COMPACT_RATIO, DEFAULT_MAX_LINE_BYTES, Durability, Entry, Header, JsonlStore, RawJson, Record, RegisterOp,
    RegisterRecord, STORAGE_VERSION, Storage, StorageError, StoreOptions, Tail, Transaction, UsageRow, check_file,
    check_file_with, decode_line, encode_header, encode_line, read_summary, to_raw,
};
use serde_json::json;

fn fast() -> StoreOptions {
    StoreOptions::with_durability(Durability::None)
}

/// Run `f` on another thread and fail (instead of hanging the suite) if it
/// does not return within a generous bound: the claim under test is that
/// it returns at all.
fn returns<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("{what} hung (no answer within 60 s)"))
}

const HEADER: &str = r#"{"v":1,"kind":"header","id":"s","storageVersion":1,"createdAt":0,"cwd":"/"}"#;

fn write_session(dir: &Path, name: &str, lines: &[&str]) -> PathBuf {
    let path = dir.join(name);
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&path, text).unwrap();
    path
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo failed");
}

/// Every way the store opens a file, each on its own thread.
fn every_open(path: &Path) -> Vec<(&'static str, Result<(), StorageError>)> {
    let mut results = Vec::new();
    let p = path.to_owned();
    results.push(("open_read_only", returns("open_read_only", move || JsonlStore::open_read_only(&p).map(drop))));
    let p = path.to_owned();
    results.push(("open", returns("open", move || JsonlStore::open(&p, fast()).map(drop))));
    let p = path.to_owned();
    results.push(("Tail::open", returns("Tail::open", move || Tail::open(&p).map(drop))));
    let p = path.to_owned();
    results.push((
        "read_summary",
        returns("read_summary", move || read_summary(&p, &[("fact", "name")], DEFAULT_MAX_LINE_BYTES).map(drop)),
    ));
    results
}

#[test]
fn a_fifo_named_like_a_session_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.jsonl");
    mkfifo(&path);
    for (what, result) in every_open(&path) {
        match result {
            Err(StorageError::NotRegular { what: kind, .. }) => assert_eq!(kind, "a FIFO", "{what}"),
            other => panic!("{what}: expected NotRegular, got {other:?}"),
        }
    }
    let p = path.clone();
    let report = returns("check_file", move || check_file(&p));
    assert!(!report.ok);
    assert!(report.error.unwrap().contains("is a FIFO, not a regular file"));
    // Nothing was created beside it (a refused open leaves no lock file).
    assert!(!dir.path().join("x.jsonl.lock").exists());
}

#[test]
fn a_symlink_to_a_device_is_refused_without_reading_it() {
    let dir = tempfile::tempdir().unwrap();
    for (name, target, kind) in [("zero.jsonl", "/dev/zero", "a character device"), ("dir.jsonl", "/", "a directory")] {
        let path = dir.path().join(name);
        std::os::unix::fs::symlink(target, &path).unwrap();
        for (what, result) in every_open(&path) {
            match result {
                Err(StorageError::NotRegular { what: got, .. }) => assert_eq!(got, kind, "{what} on {target}"),
                // A writable open refuses the link itself first.
                Err(StorageError::Symlink { .. }) if what == "open" => {}
                other => panic!("{what} on {target}: expected a refusal, got {other:?}"),
            }
        }
    }
}

#[test]
fn a_symlinked_session_reads_but_is_never_written_through() {
    let dir = tempfile::tempdir().unwrap();
    let real_dir = dir.path().join("real");
    let mut store = JsonlStore::create(&real_dir, Header::new("s1", "/"), fast()).unwrap();
    store.commit(Transaction::new().set("fact", "k", to_raw(&1).unwrap())).unwrap();
    let real = store.path().to_owned();
    drop(store);
    let link = dir.path().join("s1.jsonl");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let before = std::fs::read(&real).unwrap();

    assert_eq!(JsonlStore::open_read_only(&link).unwrap().last_seq(), 1, "reading follows the link");
    let err = JsonlStore::open(&link, fast()).unwrap_err();
    assert!(matches!(err, StorageError::Symlink { .. }), "{err:?}");
    assert!(err.to_string().contains("refuses to write a session through a symlink"), "{err}");
    assert_eq!(std::fs::read(&real).unwrap(), before, "the target is untouched");
    assert!(!dir.path().join("s1.jsonl.lock").exists(), "no lock taken through the link");
}

#[test]
fn an_over_long_line_is_an_error_naming_it_and_is_never_written() {
    let dir = tempfile::tempdir().unwrap();
    let limit = 4096;
    let opts = StoreOptions { max_line_bytes: limit, ..fast() };
    let long_value = "y".repeat(5000);
    let long =
        format!(r#"{{"kind":"register","op":"set","seq":2,"namespace":"fact","key":"k","value":"{long_value}"}}"#);
    let short = r#"{"kind":"register","op":"set","seq":1,"namespace":"fact","key":"k","value":1}"#;
    let path = write_session(dir.path(), "s.jsonl", &[HEADER, short, &long]);
    let offset = (HEADER.len() + 1 + short.len() + 1) as u64;

    let expect = |result: Result<(), StorageError>, what: &str, line: u64, offset: u64| match result {
        Err(StorageError::LineTooLong { line: l, offset: o, limit: m, .. }) => {
            assert_eq!((l, o, m), (line, offset, limit), "{what}");
        }
        other => panic!("{what}: expected LineTooLong, got {other:?}"),
    };
    expect(JsonlStore::open_read_only_with(&path, opts).map(drop), "open_read_only", 3, offset);
    expect(JsonlStore::open(&path, opts).map(drop), "open", 3, offset);
    expect(Tail::open_with(&path, limit).and_then(|mut t| t.poll()).map(drop), "tail", 3, offset);
    // Backwards the line number is unknown; the offset still names it.
    expect(read_summary(&path, &[("fact", "k")], limit).map(drop), "read_summary", 0, offset);
    let report = check_file_with(&path, opts, |_| Ok(()));
    assert!(report.error.unwrap().contains("line 3 (byte offset"), "check names the line");
    // The default limit reads it; the message says how to raise the limit.
    assert_eq!(JsonlStore::open_read_only(&path).unwrap().last_seq(), 2);
    let err = JsonlStore::open_read_only_with(&path, opts).unwrap_err().to_string();
    assert!(err.contains("max_line_bytes"), "{err}");

    // A header longer than the limit is refused too (never buffered whole).
    let long_header =
        format!(r#"{{"v":1,"kind":"header","id":"s","storageVersion":1,"createdAt":0,"cwd":"{long_value}"}}"#);
    let path2 = write_session(dir.path(), "h.jsonl", &[&long_header]);
    expect(JsonlStore::open_read_only_with(&path2, opts).map(drop), "header", 1, 0);
    expect(read_summary(&path2, &[], limit).map(drop), "header backwards", 1, 0);

    // A commit that would make a longer line is refused and writes nothing.
    let mut store = JsonlStore::create(dir.path(), Header::new("w", "/"), opts).unwrap();
    let before = std::fs::read(store.path()).unwrap();
    let err = store.commit(Transaction::new().set("fact", "k", to_raw(&long_value).unwrap())).unwrap_err();
    assert!(err.to_string().contains("longer than the limit of 4096 bytes"), "{err}");
    assert_eq!(std::fs::read(store.path()).unwrap(), before);
    store.commit(Transaction::new().set("fact", "k", to_raw(&"small").unwrap())).unwrap();
    assert_eq!(store.last_seq(), 1, "the store still works");
}

#[test]
fn an_exhausted_seq_space_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let last = format!(r#"{{"kind":"register","op":"set","seq":{},"namespace":"fact","key":"k","value":1}}"#, u64::MAX);
    let path = write_session(dir.path(), "s.jsonl", &[HEADER, &last]);
    let before = std::fs::read(&path).unwrap();
    let mut store = JsonlStore::open(&path, fast()).unwrap();
    assert_eq!(store.last_seq(), u64::MAX);
    for tx in [
        Transaction::new().set("fact", "k", to_raw(&2).unwrap()),
        Transaction::new().entry("e", None, "message", to_raw(&json!({})).unwrap()),
        Transaction::new().state(0, to_raw(&"x").unwrap()),
    ] {
        let err = store.commit(tx).unwrap_err();
        assert!(matches!(err, StorageError::Invalid(_)), "{err:?}");
        assert!(err.to_string().contains("seqs are exhausted"), "{err}");
    }
    drop(store);
    assert_eq!(std::fs::read(&path).unwrap(), before, "nothing was written");
    assert!(check_file(&path).ok, "the file stays readable");

    // One below the maximum: exactly one more record fits, not two.
    let near =
        format!(r#"{{"kind":"register","op":"set","seq":{},"namespace":"fact","key":"k","value":1}}"#, u64::MAX - 1);
    let path = write_session(dir.path(), "n.jsonl", &[HEADER, &near]);
    let mut store = JsonlStore::open(&path, fast()).unwrap();
    let two = Transaction::new().set("fact", "a", to_raw(&1).unwrap()).set("fact", "b", to_raw(&2).unwrap());
    assert!(store.commit(two).is_err(), "a two-record commit does not fit");
    store.commit(Transaction::new().set("fact", "a", to_raw(&1).unwrap())).unwrap();
    assert_eq!(store.last_seq(), u64::MAX);
    drop(store);
    assert_eq!(JsonlStore::open_read_only(&path).unwrap().last_seq(), u64::MAX);
}

fn raw(text: &str) -> RawJson {
    RawJson::from_json(text).unwrap()
}

fn entry(seq: u64, id: &str, parent: Option<&str>, payload: &str) -> Record {
    Record::Entry(Entry {
        seq,
        timestamp: 1_764_480_000_123,
        id: id.to_owned(),
        parent_id: parent.map(str::to_owned),
        entry_type: "message".to_owned(),
        payload: raw(payload),
    })
}

/// The seed's example lines, typed by hand (key order from the seed's
/// format; concrete values where the seed writes `...`).
#[test]
fn lines_are_the_seeds_bytes() {
    let e = entry(101, "e_50", Some("e_41"), r#"{"text":"hi"}"#);
    let set = |seq, namespace: &str, key: &str, value: &str| {
        Record::Register(RegisterRecord {
            op: RegisterOp::Set,
            seq,
            namespace: namespace.to_owned(),
            key: key.to_owned(),
            value: Some(raw(value)),
        })
    };
    let golden_array = concat!(
        r#"[{"kind":"entry","seq":101,"timestamp":1764480000123,"id":"e_50","parentId":"e_41","type":"message","payload":{"text":"hi"}},"#,
        r#"{"kind":"register","op":"set","seq":102,"namespace":"op.state","key":"op_9","value":{"step":1}},"#,
        r#"{"kind":"register","op":"set","seq":103,"namespace":"lane.leaf","key":"main","value":"e_50"}]"#,
        "\n"
    );
    let array =
        vec![e.clone(), set(102, "op.state", "op_9", r#"{"step":1}"#), set(103, "lane.leaf", "main", r#""e_50""#)];
    assert_eq!(String::from_utf8(encode_line(&array).unwrap()).unwrap(), golden_array);

    let golden_usage =
        "{\"kind\":\"usage\",\"seq\":110,\"id\":\"u_7\",\"entryId\":\"e_51\",\"usage\":{\"input\":812}}\n";
    let usage = Record::Usage(UsageRow {
        seq: 110,
        id: "u_7".to_owned(),
        entry_id: Some("e_51".to_owned()),
        usage: raw(r#"{"input":812}"#),
    });
    assert_eq!(String::from_utf8(encode_line(&[usage]).unwrap()).unwrap(), golden_usage);

    let golden_delete =
        "{\"kind\":\"register\",\"op\":\"delete\",\"seq\":131,\"namespace\":\"op.state\",\"key\":\"op_9\"}\n";
    let delete = Record::Register(RegisterRecord {
        op: RegisterOp::Delete,
        seq: 131,
        namespace: "op.state".to_owned(),
        key: "op_9".to_owned(),
        value: None,
    });
    assert_eq!(String::from_utf8(encode_line(&[delete]).unwrap()).unwrap(), golden_delete);

    let golden_root = "{\"kind\":\"entry\",\"seq\":1,\"timestamp\":1764480000123,\"id\":\"e1\",\"parentId\":null,\"type\":\"message\",\"payload\":[]}\n";
    assert_eq!(String::from_utf8(encode_line(&[entry(1, "e1", None, "[]")]).unwrap()).unwrap(), golden_root);

    let golden_header = "{\"v\":1,\"kind\":\"header\",\"id\":\"s\",\"storageVersion\":1,\"createdAt\":1764480000000,\"cwd\":\"/home/me\"}\n";
    let header = Header {
        v: 1,
        kind: "header".to_owned(),
        id: "s".to_owned(),
        storage_version: 1,
        created_at: 1_764_480_000_000,
        cwd: "/home/me".to_owned(),
    };
    assert_eq!(String::from_utf8(encode_header(&header).unwrap()).unwrap(), golden_header);

    // Any key order still reads, to the same record.
    let shuffled = br#"{"payload":{"text":"hi"},"type":"message","parentId":"e_41","id":"e_50","timestamp":1764480000123,"seq":101,"kind":"entry"}"#;
    assert_eq!(decode_line(shuffled).unwrap(), vec![e.clone()]);
    let old_order = br#"{"kind":"entry","id":"e_50","parentId":"e_41","seq":101,"timestamp":1764480000123,"type":"message","payload":{"text":"hi"}}"#;
    assert_eq!(decode_line(old_order).unwrap(), vec![e]);
}

/// What the store itself writes to the file, byte for byte (the timestamp
/// is read back, every other byte is typed here).
#[test]
fn the_store_writes_the_seeds_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = JsonlStore::create(dir.path(), Header::new("g", "/w"), fast()).unwrap();
    store
        .commit(Transaction::new().entry("e1", None, "message", raw(r#"{"a":1}"#)).set("lane", "main", raw(r#""e1""#)))
        .unwrap();
    let ts = store.entry("e1").unwrap().timestamp;
    let created = store.header().created_at;
    let text = std::fs::read_to_string(store.path()).unwrap();
    let golden = format!(
        "{{\"v\":1,\"kind\":\"header\",\"id\":\"g\",\"storageVersion\":1,\"createdAt\":{created},\"cwd\":\"/w\"}}\n\
         [{{\"kind\":\"entry\",\"seq\":1,\"timestamp\":{ts},\"id\":\"e1\",\"parentId\":null,\"type\":\"message\",\"payload\":{{\"a\":1}}}},\
         {{\"kind\":\"register\",\"op\":\"set\",\"seq\":2,\"namespace\":\"lane\",\"key\":\"main\",\"value\":\"e1\"}}]\n"
    );
    assert_eq!(text, golden);
}

const V0_HEADER: &str = r#"{"v":1,"kind":"header","id":"old","createdAt":5,"cwd":"/old"}"#;

#[test]
fn storage_version_0_migrates_in_memory_and_only_compaction_rewrites_it() {
    let dir = tempfile::tempdir().unwrap();
    let lines = [
        V0_HEADER,
        r#"{"kind":"entry","id":"e1","parentId":null,"seq":1,"timestamp":9,"type":"message","payload":{"t":"x"}}"#,
        r#"{"kind":"register","op":"set","seq":2,"namespace":"fact","key":"name","value":"n"}"#,
        r#"{"kind":"state","seq":3,"pc":"idle"}"#,
    ];
    let path = write_session(dir.path(), "old.jsonl", &lines);
    let original = std::fs::read(&path).unwrap();

    let ro = JsonlStore::open_read_only(&path).unwrap();
    assert_eq!(ro.file_storage_version(), 0);
    assert_eq!(ro.header().storage_version, STORAGE_VERSION, "in memory the session is current");
    assert_eq!((ro.entry_count(), ro.last_seq()), (1, 3));
    let report = check_file(&path);
    assert!(report.ok, "{report:?}");
    assert_eq!(report.storage_version, 0);
    assert!(report.to_string().contains("storage version 0 is read through a migration"), "{report}");
    let summary = read_summary(&path, &[("fact", "name")], DEFAULT_MAX_LINE_BYTES).unwrap();
    assert_eq!((summary.file_version, summary.header.storage_version), (0, STORAGE_VERSION));
    let mut tail = Tail::open(&path).unwrap();
    assert_eq!(tail.poll().unwrap().len(), 3);
    assert_eq!(std::fs::read(&path).unwrap(), original, "reading never rewrites");

    // A writer appends current records after the old header, untouched.
    let mut store = JsonlStore::open(&path, fast()).unwrap();
    store.commit(Transaction::new().set("fact", "k", raw("1"))).unwrap();
    drop(store);
    let now = std::fs::read(&path).unwrap();
    assert_eq!(&now[..original.len()], &original[..], "the old lines stay as they were");
    let reopened = JsonlStore::open_read_only(&path).unwrap();
    assert_eq!((reopened.file_storage_version(), reopened.last_seq()), (0, 4));

    // Compaction rewrites it as the current version, same logical state.
    let mut store = JsonlStore::open(&path, fast()).unwrap();
    store.compact().unwrap();
    assert_eq!(store.file_storage_version(), STORAGE_VERSION);
    drop(store);
    let first = std::fs::read_to_string(&path).unwrap().lines().next().unwrap().to_owned();
    assert_eq!(first, r#"{"v":1,"kind":"header","id":"old","storageVersion":1,"createdAt":5,"cwd":"/old"}"#);
    let compacted = JsonlStore::open_read_only(&path).unwrap();
    assert_eq!(compacted.file_storage_version(), STORAGE_VERSION);
    assert_eq!(compacted.entries(), reopened.entries());
    assert_eq!(compacted.registers("fact"), reopened.registers("fact"));
}

#[test]
fn a_newer_version_is_refused_by_every_reader() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_session(
        dir.path(),
        "new.jsonl",
        &[r#"{"v":1,"kind":"header","id":"new","storageVersion":2,"createdAt":0,"cwd":"/"}"#],
    );
    for (what, result) in every_open(&path) {
        assert!(matches!(result, Err(StorageError::NewerVersion { found: 2, .. })), "{what}: {result:?}");
    }
}

#[test]
fn the_default_options_compact_automatically() {
    let opts = StoreOptions::default();
    assert_eq!(opts.compact_ratio, Some(DEFAULT_COMPACT_RATIO));
    assert_eq!(DEFAULT_COMPACT_RATIO, 0.5);
    assert!(!opts.compaction_due(opts.compact_min_bytes - 1, 0.99), "small files are left alone");
    assert!(!opts.compaction_due(opts.compact_min_bytes, 0.5));
    assert!(opts.compaction_due(opts.compact_min_bytes, 0.51));

    // Overwrite one register with ~10 KiB values: without compaction the
    // file would pass 2 MiB; with the default it stays near its live size.
    let dir = tempfile::tempdir().unwrap();
    let mut store = JsonlStore::create(dir.path(), Header::new("c", "/"), fast()).unwrap();
    let big = "z".repeat(10_000);
    for i in 0..220 {
        store.commit(Transaction::new().set("fact", "k", to_raw(&format!("{i}{big}")).unwrap())).unwrap();
    }
    let len = std::fs::metadata(store.path()).unwrap().len();
    assert!(len < 1 << 21, "compacted automatically: {len} bytes");
    assert_eq!(store.last_seq(), 220);
    let value: String = store.register("fact", "k").unwrap().parse().unwrap();
    assert!(value.starts_with("219"));
}

/// The listing's backward scan answers what a full replay answers.
#[test]
fn read_summary_agrees_with_a_full_replay() {
    let dir = tempfile::tempdir().unwrap();
    let e = |seq: u64, id: &str, parent: &str| {
        format!(
            r#"{{"kind":"entry","seq":{seq},"timestamp":0,"id":"{id}","parentId":{parent},"type":"message","payload":{{"text":"a state of the name fact\n"}}}}"#
        )
    };
    let name = |seq: u64, value: &str| {
        format!(r#"{{"kind":"register","op":"set","seq":{seq},"namespace":"fact","key":"name","value":{value}}}"#)
    };
    let state = |seq: u64, pc: &str| format!(r#"{{"kind":"state","seq":{seq},"pc":{pc}}}"#);
    let cases: Vec<(&str, Vec<String>)> = vec![
        ("empty", vec![]),
        ("name early, many lines after", {
            let mut l = vec![name(1, r#""first""#), state(2, r#""a""#)];
            l.extend((3..500).map(|s| e(s, &format!("e{s}"), "null")));
            l
        }),
        (
            "renamed, state in an array line",
            vec![
                name(1, r#""first""#),
                format!("[{},{},{}]", state(2, r#""a""#), name(3, r#""second""#), state(4, r#""b""#)),
                e(5, "e5", "null"),
            ],
        ),
        (
            "name deleted",
            vec![
                name(1, r#""gone""#),
                r#"{"kind":"register","op":"delete","seq":2,"namespace":"fact","key":"name"}"#.to_owned(),
            ],
        ),
        (
            "other namespace with the same key",
            vec![
                name(1, r#""real""#),
                r#"{"kind":"register","op":"set","seq":2,"namespace":"fact.x","key":"name","value":"decoy"}"#
                    .to_owned(),
                r#"{"kind":"register","op":"set","seq":3,"namespace":"op","key":"name","value":"decoy"}"#.to_owned(),
            ],
        ),
        (
            "kinds and names spelled with escapes",
            vec![
                name(1, r#""plain""#),
                r#"{"kind":"st\u0061te","seq":2,"pc":"escaped"}"#.to_owned(),
                r#"{"kind":"register","op":"set","seq":3,"namespace":"f\u0061ct","key":"n\u0061me","value":"escaped"}"#
                    .to_owned(),
            ],
        ),
        (
            "torn tail without newline",
            vec![name(1, r#""kept""#), state(2, r#""kept""#), r#"{"kind":"state","seq":3,"pc":"to"#.to_owned()],
        ),
        (
            "torn tail that is a complete line of garbage",
            vec![name(1, r#""kept""#), state(2, r#""kept""#), "\u{0}\u{0}garbage state".to_owned()],
        ),
    ];
    for (case, lines) in cases {
        let mut all = vec![HEADER.to_owned()];
        all.extend(lines);
        let mut text: String = all.iter().map(|l| format!("{l}\n")).collect();
        if case == "torn tail without newline" {
            text.pop();
        }
        let path = dir.path().join("s.jsonl");
        std::fs::write(&path, text).unwrap();
        let replayed = JsonlStore::open_read_only(&path).unwrap_or_else(|e| panic!("{case}: {e}"));
        for block_limit in [DEFAULT_MAX_LINE_BYTES, 1 << 12] {
            let summary =
                read_summary(&path, &[("fact", "name")], block_limit).unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!(summary.state, replayed.state(), "{case}: state");
            assert_eq!(summary.registers, vec![replayed.register("fact", "name")], "{case}: name");
            assert_eq!(&summary.header, replayed.header(), "{case}: header");
        }
    }
    let _ = e(0, "", "null");
}

#[test]
fn read_summary_of_a_large_file_stops_early_and_matches_replay() {
    // Lines far longer than one block of the backward scan.
    let dir = tempfile::tempdir().unwrap();
    let mut store = JsonlStore::create(dir.path(), Header::new("big", "/"), fast()).unwrap();
    let text = "w".repeat(200_000);
    store.commit(Transaction::new().set("fact", "name", to_raw(&"big one").unwrap())).unwrap();
    let mut parent: Option<String> = None;
    for i in 0..30 {
        let id = format!("e{i}");
        let tx =
            Transaction::new().entry(id.clone(), parent.as_deref(), "message", to_raw(&json!({"t": text})).unwrap());
        let expected = store.state().map_or(0, |s| s.seq);
        store.commit(tx.state(expected, to_raw(&json!({"i": i})).unwrap())).unwrap();
        parent = Some(id);
    }
    let path = store.path().to_owned();
    drop(store);
    let replayed = JsonlStore::open_read_only(&path).unwrap();
    let summary = read_summary(&path, &[("fact", "name"), ("fact", "absent")], DEFAULT_MAX_LINE_BYTES).unwrap();
    assert_eq!(summary.state, replayed.state());
    assert_eq!(summary.registers, vec![replayed.register("fact", "name"), None]);
}
