//! The storage conformance suite, written once and run against every
//! backend: MemStore, JSONL and SQLite from cairn-core's `tests/storage.rs`,
//! PostgreSQL from cairn-pg's `tests/conformance_pg.rs` (which includes this
//! file by path). Each function checks one part of the logical model;
//! `conformance!(name, backend)` makes one `#[test]` per function.
//!
//! It uses only cairn-core's public API and serde_json, so any crate's test
//! can include it.

#![allow(dead_code)]

use cairn_core::storage::{RawJson, Storage, StorageError, Transaction, to_raw};
use serde_json::json;

pub(crate) fn raw(v: serde_json::Value) -> RawJson {
    to_raw(&v).unwrap()
}

/// Every namespace the tests use (the trait lists registers per namespace).
pub(crate) const NAMESPACES: &[&str] = &["lane", "op", "pending", "fact", "lane.leaf", "op.state"];

/// The observable state of a store, timestamps left out (each backend
/// stamps its own commits).
pub(crate) fn snapshot(s: &impl Storage) -> String {
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

/// A backend under test: makes fresh stores and reopens them from durable
/// storage.
pub(crate) trait Backend {
    type S: Storage;
    fn fresh(&mut self) -> Self::S;
    fn reopen(&mut self, store: Self::S) -> Self::S;
}

// The suite. Each function is run against every backend by `conformance!`.
pub(crate) mod suite {
    use super::*;

    pub(crate) fn entry_tree<B: Backend>(mut b: B) {
        let mut s = b.fresh();
        assert_eq!(s.last_seq(), 0);
        let c = s.commit(Transaction::new().entry("a", None, "message", raw(json!({"text": "hi"})))).unwrap();
        assert_eq!((c.first_seq, c.last_seq, c.state_seq), (1, 1, None));
        let c = s
            .commit(Transaction::new().entry("b", Some("a"), "message", raw(json!(1))).entry(
                "c",
                Some("b"),
                "message",
                raw(json!([1, 2])),
            ))
            .unwrap();
        assert_eq!((c.first_seq, c.last_seq), (2, 3));
        s.commit(Transaction::new().entry("d", Some("a"), "fork", raw(json!(null)))).unwrap();
        let ids = |v: Vec<cairn_core::storage::Entry>| v.into_iter().map(|e| e.id).collect::<Vec<_>>();
        assert_eq!(ids(s.children(Some("a"))), ["b", "d"]);
        assert_eq!(ids(s.children(None)), ["a"]);
        assert_eq!(ids(s.path_to("c").unwrap()), ["a", "b", "c"]);
        assert_eq!(ids(s.path_to("d").unwrap()), ["a", "d"]);
        assert!(matches!(s.path_to("zz"), Err(StorageError::NoSuchEntry(_))));
        assert_eq!(s.entry("c").unwrap().payload.get(), "[1,2]");
        assert_eq!(s.entry("c").unwrap().seq, 3);
        assert_eq!(s.entry_count(), 4);
        let before = snapshot(&s);
        let s = b.reopen(s);
        assert_eq!(snapshot(&s), before);
        assert_eq!(ids(s.path_to("c").unwrap()), ["a", "b", "c"]);
    }

    pub(crate) fn entries_are_write_once<B: Backend>(mut b: B) {
        let mut s = b.fresh();
        s.commit(Transaction::new().entry("a", None, "m", raw(json!(1)))).unwrap();
        let err = s.commit(Transaction::new().entry("a", None, "m", raw(json!(2)))).unwrap_err();
        assert!(err.to_string().contains("duplicate entry id"), "{err}");
        let err = s
            .commit(Transaction::new().entry("x", None, "m", raw(json!(1))).entry("x", None, "m", raw(json!(1))))
            .unwrap_err();
        assert!(matches!(err, StorageError::Invalid(_)));
        let err = s.commit(Transaction::new().entry("y", Some("nope"), "m", raw(json!(1)))).unwrap_err();
        assert!(err.to_string().contains("unknown parent"), "{err}");
        assert!(s.commit(Transaction::new()).is_err(), "an empty transaction is refused");
        assert_eq!(s.last_seq(), 1);
        assert_eq!(s.entry("a").unwrap().payload.get(), "1");
        let s = b.reopen(s);
        assert_eq!(s.entry_count(), 1);
        assert_eq!(s.last_seq(), 1);
    }

    pub(crate) fn transactions_are_atomic<B: Backend>(mut b: B) {
        let mut s = b.fresh();
        s.commit(Transaction::new().state(0, raw(json!("idle")))).unwrap();
        // A valid entry and register followed by a stale CAS: nothing lands.
        let err = s
            .commit(
                Transaction::new()
                    .entry("a", None, "m", raw(json!(1)))
                    .set("fact", "k", raw(json!(1)))
                    .state(0, raw(json!("planning"))),
            )
            .unwrap_err();
        assert!(matches!(err, StorageError::StateConflict { expected: 0, actual: 1 }), "{err}");
        let err = s
            .commit(Transaction::new().entry("a", None, "m", raw(json!(1))).set("nonsense", "k", raw(json!(1))))
            .unwrap_err();
        assert!(err.to_string().contains("unknown register namespace"), "{err}");
        assert_eq!(s.entry_count(), 0);
        assert_eq!(s.register("fact", "k"), None);
        assert_eq!(s.last_seq(), 1);
        let s = b.reopen(s);
        assert_eq!(s.entry_count(), 0);
        assert_eq!(s.last_seq(), 1);
    }

    pub(crate) fn registers_per_namespace<B: Backend>(mut b: B) {
        let mut s = b.fresh();
        s.commit(Transaction::new().entry("e1", None, "m", raw(json!(1))).set("lane", "main", raw(json!("e1"))))
            .unwrap();
        // A fork is a new lane pointing at an existing entry.
        s.commit(Transaction::new().set("lane", "alt", raw(json!("e1")))).unwrap();
        s.commit(Transaction::new().entry("e2", Some("e1"), "m", raw(json!(2))).set("lane", "main", raw(json!("e2"))))
            .unwrap();
        // An op and an intent start with a state move and an entry (the intent)…
        s.commit(
            Transaction::new()
                .entry("r1", Some("e2"), "m", raw(json!(3)))
                .set("op", "op_9", raw(json!({"step": 1})))
                .set("pending", "t1", raw(json!({})))
                .state(0, raw(json!("a"))),
        )
        .unwrap();
        // …and end with one (the settlement).
        s.commit(
            Transaction::new()
                .entry("s1", Some("r1"), "m", raw(json!(4)))
                .delete("pending", "t1")
                .delete("op", "op_9")
                .state(9, raw(json!("b"))),
        )
        .unwrap();
        s.commit(Transaction::new().set("fact", "name", raw(json!("x"))).set("fact", "model", raw(json!(null))))
            .unwrap();
        s.commit(Transaction::new().set("lane.leaf", "main", raw(json!("e2")))).unwrap();
        // Deleting an absent key is legal and changes nothing visible.
        s.commit(Transaction::new().delete("fact", "absent")).unwrap();
        let check = |s: &B::S| {
            assert_eq!(
                s.registers("lane"),
                vec![("alt".to_owned(), raw(json!("e1"))), ("main".to_owned(), raw(json!("e2")))]
            );
            assert!(s.registers("pending").is_empty());
            assert!(s.registers("op").is_empty());
            assert_eq!(s.register("fact", "model"), Some(raw(json!(null))));
            assert_eq!(s.register("fact", "name"), Some(raw(json!("x"))));
            assert_eq!(s.register("lane.leaf", "main"), Some(raw(json!("e2"))));
            assert_eq!(s.register("lane", "none"), None);
            assert_eq!(s.last_seq(), 17);
        };
        check(&s);
        let s = b.reopen(s);
        check(&s);
    }

    pub(crate) fn state_moves_by_cas<B: Backend>(mut b: B) {
        let mut s = b.fresh();
        assert_eq!(s.state(), None);
        let c = s.commit(Transaction::new().state(0, raw(json!("idle")))).unwrap();
        assert_eq!(c.state_seq, Some(1));
        let err = s.commit(Transaction::new().state(0, raw(json!("x")))).unwrap_err();
        assert!(matches!(err, StorageError::StateConflict { expected: 0, actual: 1 }));
        s.commit(Transaction::new().entry("a", None, "m", raw(json!(1)))).unwrap();
        // Two moves in one transaction chain: the second expects the first.
        let c =
            s.commit(Transaction::new().state(1, raw(json!("planning"))).state(3, raw(json!({"pc": "tool"})))).unwrap();
        assert_eq!(c.state_seq, Some(4));
        let s = b.reopen(s);
        let state = s.state().unwrap();
        assert_eq!((state.seq, state.pc.get()), (4, r#"{"pc":"tool"}"#));
    }

    pub(crate) fn usage_ledger<B: Backend>(mut b: B) {
        let mut s = b.fresh();
        s.commit(Transaction::new().entry("a", None, "m", raw(json!(1))).usage("u1", Some("a"), raw(json!({"in": 3}))))
            .unwrap();
        s.commit(Transaction::new().usage("u2", None, raw(json!({"out": 4})))).unwrap();
        let s = b.reopen(s);
        let usage = s.usage();
        assert_eq!(usage.len(), 2);
        assert_eq!((usage[0].id.as_str(), usage[0].entry_id.as_deref(), usage[0].seq), ("u1", Some("a"), 2));
        assert_eq!(
            (usage[1].id.as_str(), usage[1].entry_id.as_deref(), usage[1].usage.get()),
            ("u2", None, r#"{"out":4}"#)
        );
    }

    pub(crate) fn payloads_keep_their_text<B: Backend>(mut b: B) {
        let mut s = b.fresh();
        let text = "quote \" backslash \\ newline \n tab \t unicode é 🦀 nul \u{0}";
        let payload = raw(json!({"text": text, "n": 1.5e300, "deep": [[[{"k": null}]]]}));
        s.commit(Transaction::new().entry("a", None, "m", payload.clone()).set("fact", "t", raw(json!(text)))).unwrap();
        let s = b.reopen(s);
        assert_eq!(s.entry("a").unwrap().payload, payload);
        assert_eq!(s.register("fact", "t").unwrap().parse::<String>().unwrap(), text);
    }
}

#[allow(unused_macros)]
macro_rules! conformance {
    ($name:ident, $backend:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn entry_tree() {
                $crate::conformance::suite::entry_tree($backend)
            }
            #[test]
            fn entries_are_write_once() {
                $crate::conformance::suite::entries_are_write_once($backend)
            }
            #[test]
            fn transactions_are_atomic() {
                $crate::conformance::suite::transactions_are_atomic($backend)
            }
            #[test]
            fn registers_per_namespace() {
                $crate::conformance::suite::registers_per_namespace($backend)
            }
            #[test]
            fn state_moves_by_cas() {
                $crate::conformance::suite::state_moves_by_cas($backend)
            }
            #[test]
            fn usage_ledger() {
                $crate::conformance::suite::usage_ledger($backend)
            }
            #[test]
            fn payloads_keep_their_text() {
                $crate::conformance::suite::payloads_keep_their_text($backend)
            }
        }
    };
}
