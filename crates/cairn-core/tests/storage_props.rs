//! Property tests of the JSONL store against the in-memory model
//! (`MemStore`): random transactions (valid and invalid) give the same
//! results on both; the file replays (read-only and writable) to the model's
//! state; and the file truncated at every byte offset inside its last line
//! opens and equals the state before that commit.

// Helpers outside #[test] fns unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use cairn_core::storage::{
    Durability, Header, JsonlStore, MemStore, Storage, StoreOptions, Transaction, TxOp, new_session_id, to_raw,
};
use proptest::prelude::*;

const NAMESPACES: &[&str] = &["lane", "op", "pending", "fact", "lane.leaf"];
const KEYS: &[&str] = &["main", "alt", "k", "t1", "\"quoted\"\n"];

fn snapshot(s: &impl Storage) -> String {
    let entries: Vec<_> = s
        .entries()
        .into_iter()
        .map(|e| format!("{}<{:?}#{}:{}={}", e.id, e.parent_id, e.seq, e.entry_type, e.payload.get()))
        .collect();
    let registers: Vec<_> = NAMESPACES.iter().map(|ns| (ns, s.registers(ns))).collect();
    format!(
        "entries={entries:?}\nregisters={registers:?}\nusage={:?}\nstate={:?}\nlast_seq={}",
        s.usage(),
        s.state(),
        s.last_seq()
    )
}

/// An operation before it is bound to the model's current state.
#[derive(Debug, Clone)]
enum Gen {
    /// A new entry; parent picked among existing ids (or a root); `dup`
    /// reuses an existing id (invalid).
    Entry {
        parent: Option<usize>,
        dup: bool,
        text: String,
    },
    Set {
        ns: usize,
        key: usize,
        value: i64,
    },
    Delete {
        ns: usize,
        key: usize,
    },
    Usage {
        n: u32,
    },
    /// A state move; `stale` expects the wrong seq (a CAS conflict).
    State {
        stale: bool,
    },
    /// A namespace that does not exist (invalid).
    BadNamespace,
}

fn gen_op() -> impl Strategy<Value = Gen> {
    prop_oneof![
        4 => (proptest::option::of(0usize..50), proptest::bool::weighted(0.05), "[a-z \"\\\\é]{0,12}")
            .prop_map(|(parent, dup, text)| Gen::Entry { parent, dup, text }),
        3 => (0..NAMESPACES.len(), 0..KEYS.len(), any::<i64>()).prop_map(|(ns, key, value)| Gen::Set { ns, key, value }),
        2 => (0..NAMESPACES.len(), 0..KEYS.len()).prop_map(|(ns, key)| Gen::Delete { ns, key }),
        1 => any::<u32>().prop_map(|n| Gen::Usage { n }),
        2 => proptest::bool::weighted(0.1).prop_map(|stale| Gen::State { stale }),
        1 => Just(Gen::BadNamespace),
    ]
}

/// Bind generated ops to the model: pick real parents, predict seqs for
/// state chains inside the transaction.
fn bind(ops: &[Gen], model: &MemStore, next_id: &mut u64) -> Transaction {
    let ids: Vec<String> = model.entries().into_iter().map(|e| e.id).collect();
    let mut tx = Transaction::new();
    let mut state_seq = model.state().map_or(0, |s| s.seq);
    let mut new_ids: Vec<String> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let seq = model.last_seq() + i as u64 + 1;
        let op = match op {
            Gen::Entry { parent, dup, text } => {
                let known: Vec<&String> = ids.iter().chain(new_ids.iter()).collect();
                let id = if *dup && !known.is_empty() {
                    known[0].clone()
                } else {
                    *next_id += 1;
                    format!("e{next_id}")
                };
                let parent_id = parent.and_then(|p| (!known.is_empty()).then(|| known[p % known.len()].clone()));
                new_ids.push(id.clone());
                TxOp::Entry {
                    id,
                    parent_id,
                    entry_type: "message".into(),
                    payload: to_raw(&serde_json::json!({"t": text})).unwrap(),
                }
            }
            Gen::Set { ns, key, value } => {
                TxOp::Set { namespace: NAMESPACES[*ns].into(), key: KEYS[*key].into(), value: to_raw(value).unwrap() }
            }
            Gen::Delete { ns, key } => TxOp::Delete { namespace: NAMESPACES[*ns].into(), key: KEYS[*key].into() },
            Gen::Usage { n } => TxOp::Usage { id: format!("u{seq}"), entry_id: None, usage: to_raw(n).unwrap() },
            Gen::State { stale } => {
                let expected = if *stale { state_seq + 1 } else { state_seq };
                state_seq = seq;
                TxOp::State { expected, pc: to_raw(&seq).unwrap() }
            }
            Gen::BadNamespace => TxOp::Set { namespace: "nope".into(), key: "k".into(), value: to_raw(&1).unwrap() },
        };
        tx.ops.push(op);
    }
    tx
}

fn opts() -> StoreOptions {
    StoreOptions::with_durability(Durability::None)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn jsonl_replay_equals_the_model(txs in proptest::collection::vec(proptest::collection::vec(gen_op(), 1..5), 1..25)) {
        let dir = tempfile::tempdir().unwrap();
        let header = Header::new(new_session_id(), "/");
        let mut model = MemStore::new(header.clone());
        let mut store = JsonlStore::create(dir.path(), header, opts()).unwrap();
        let path = store.path().to_owned();
        let mut next_id = 0;
        for ops in &txs {
            let tx = bind(ops, &model, &mut next_id);
            let expected = model.commit(tx.clone());
            let got = store.commit(tx);
            match (&expected, &got) {
                (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
                (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
                _ => prop_assert!(false, "model {:?} vs store {:?}", expected, got),
            }
            prop_assert_eq!(snapshot(&store), snapshot(&model));
        }
        // One last valid commit, then check replay and every truncation of it.
        let before = snapshot(&model);
        let len_before = std::fs::metadata(&path).unwrap().len() as usize;
        let last = Transaction::new()
            .entry("last", None, "message", to_raw(&serde_json::json!({"text": "the end é"})).unwrap())
            .set("lane", "main", to_raw("last").unwrap())
            .usage("u-last", Some("last"), to_raw(&serde_json::json!({"in": 1})).unwrap());
        model.commit(last.clone()).unwrap();
        store.commit(last).unwrap();
        drop(store);
        let after = snapshot(&model);
        prop_assert_eq!(snapshot(&JsonlStore::open_read_only(&path).unwrap()), after.clone());
        prop_assert_eq!(snapshot(&JsonlStore::open(&path, opts()).unwrap()), after);

        let bytes = std::fs::read(&path).unwrap();
        let cut = dir.path().join("cut.jsonl");
        for offset in len_before..bytes.len() {
            std::fs::write(&cut, &bytes[..offset]).unwrap();
            let reopened = JsonlStore::open_read_only(&cut).unwrap();
            prop_assert_eq!(snapshot(&reopened), before.clone(), "truncated at {}", offset);
            prop_assert_eq!(reopened.torn_tail_bytes() > 0, offset > len_before);
            prop_assert_eq!(std::fs::read(&cut).unwrap().len(), offset, "read-only open changed the file");
        }
        // A writer on a torn file cuts the tail and appends cleanly.
        let offset = len_before + (bytes.len() - len_before) / 2;
        std::fs::write(&cut, &bytes[..offset]).unwrap();
        let mut writer = JsonlStore::open(&cut, opts()).unwrap();
        writer.commit(Transaction::new().usage("after-cut", None, to_raw(&1).unwrap())).unwrap();
        drop(writer);
        let reopened = JsonlStore::open_read_only(&cut).unwrap();
        prop_assert_eq!(reopened.torn_tail_bytes(), 0);
        prop_assert_eq!(reopened.usage().last().map(|u| u.id.clone()), Some("after-cut".to_owned()));
    }
}

/// Power loss under grouped durability, simulated: the disk keeps what was
/// synced, plus any prefix of the unsynced appends, possibly followed by a
/// zero-filled block (a size extended before its data). Every such file
/// opens, holds at least every synced commit, and is a prefix of the log.
#[test]
fn simulated_power_loss_under_grouped_durability_keeps_every_synced_commit() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions::with_durability(Durability::Grouped {
        max_commits: 4,
        max_delay: std::time::Duration::from_secs(3600),
    });
    let mut store = JsonlStore::create(dir.path(), Header::new("power", "/"), opts).unwrap();
    let path = store.path().to_owned();
    // File length after each commit; commits 4, 8, … were followed by a sync.
    let mut lens = vec![std::fs::metadata(&path).unwrap().len() as usize];
    let mut snapshots = vec![snapshot(&store)];
    for i in 1..=30u64 {
        let parent = (i > 1).then(|| format!("e{}", i - 1));
        store
            .commit(
                Transaction::new()
                    .entry(format!("e{i}"), parent.as_deref(), "message", to_raw(&serde_json::json!({"i": i})).unwrap())
                    .set("lane", "main", to_raw(&format!("e{i}")).unwrap()),
            )
            .unwrap();
        lens.push(std::fs::metadata(&path).unwrap().len() as usize);
        snapshots.push(snapshot(&store));
    }
    drop(store);
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut.jsonl");
    let mut checked = 0;
    for synced in (0..=30).step_by(4) {
        let durable = lens[synced];
        for extra in (0..=bytes.len() - durable).step_by(7) {
            for zeros in [0usize, 1, 4096] {
                let mut disk = bytes[..durable + extra].to_vec();
                disk.extend(std::iter::repeat_n(0u8, zeros));
                std::fs::write(&cut, &disk).unwrap();
                let s = JsonlStore::open_read_only(&cut)
                    .unwrap_or_else(|e| panic!("synced {synced}, +{extra}, zeros {zeros}: {e}"));
                let n = s.entry_count();
                assert!(n >= synced, "lost a synced commit: {n} < {synced}");
                assert_eq!(snapshot(&s), snapshots[n]);
                checked += 1;
            }
        }
    }
    assert!(checked > 100);
}
