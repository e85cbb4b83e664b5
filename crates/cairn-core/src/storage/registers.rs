//! The lifecycle of each register namespace, checked at commit: every
//! transaction passes [`check`] (called from `SessionIndex::plan`) before
//! any of it is written, so a register can only live the way its namespace
//! says. It also holds the typed accessors of the `fact` namespace, so
//! hosts never spell its keys by hand.
//!
//! The namespaces (a namespace may carry a `.suffix`; the root decides):
//! - `lane`: branch heads. Created and moved by a set whose value is the id
//!   of an entry that exists or is appended earlier in the same
//!   transaction; deleted only when a person removes a lane: a delete of a
//!   live key, alone in its transaction (never a side effect of a turn's
//!   line). Its entries stay.
//! - `op`: in-flight operations of the state machine (the turn's provider
//!   call). Set and deleted only in a transaction that also moves the state
//!   (a CAS), so an operation starts and ends with a pc move; a delete names
//!   a live key.
//! - `pending`: committed, unsettled intents. Set only when absent, in a
//!   transaction that also appends the intent entry and moves the state;
//!   deleted only when live, in a transaction that appends the settlement
//!   entry.
//! - `fact`: durable session facts (the session's name, "approve for this
//!   session" rules, the prompt queue). Set, overwritten or deleted at will; nothing else
//!   ever clears them.
//!
//! Every key is non-empty. Which `op` and `pending` keys may be live for a
//! given pc is the turn's half of these lifecycles (`turn/lifecycle.rs`):
//! storage does not know what a pc means.
//!
//! It must not do I/O; replay does not re-run these checks (a file written
//! by an older cairn still opens).

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::record::{NamespaceRoot, Transaction, TxOp, to_raw};
use super::{Storage, StorageError};

/// The `lane` namespace.
pub const LANE: &str = "lane";
/// The `op` namespace.
pub const OP: &str = "op";
/// The `pending` namespace.
pub const PENDING: &str = "pending";
/// The `fact` namespace.
pub const FACT: &str = "fact";

/// The `fact` key of the session's name.
pub const NAME_FACT: &str = "name";
/// The `fact` key a child session (a subagent) records its parent and the
/// authority it was given under; its value's shape is the host's
/// (`cairn-cli`'s `subagents.rs`). A session holding it is driven only by
/// its parent.
pub const SUBAGENT_FACT: &str = "subagent";
/// The `fact` key of the session's prompt queue ([`PromptQueue`]).
pub const QUEUE_FACT: &str = "queue";
/// The `fact` key of the provider and model the session's turns run on
/// ([`ProviderFact`]): `cairn resume` continues there unless told
/// otherwise. Absent in sessions written before it existed.
pub const PROVIDER_FACT: &str = "provider";
/// The prefix of `fact` keys holding a session allow rule.
const ALLOW_FACT: &str = "allow:";

/// What [`check`] reads of the session before a transaction: which
/// registers are live and which entries exist. `SessionIndex` implements
/// it; the lifecycle rules do not depend on how the index stores them.
pub(super) trait Before {
    /// Whether register `namespace`/`key` is live.
    fn is_set(&self, namespace: &str, key: &str) -> bool;
    /// Whether an entry with `id` exists.
    fn has_entry(&self, id: &str) -> bool;
}

/// Refuse `tx` if it breaks a namespace's lifecycle against `index` (the
/// state before the transaction).
pub(super) fn check(index: &impl Before, tx: &Transaction) -> Result<(), StorageError> {
    let moves_state = tx.ops.iter().any(|op| matches!(op, TxOp::State { .. }));
    // Entries appended so far in this transaction, in order.
    let mut appended: HashSet<&str> = HashSet::new();
    // Live keys of `op`/`pending` as the transaction goes (None: not touched yet).
    let mut changed: Vec<(&str, &str, bool)> = Vec::new();
    let live = |changed: &[(&str, &str, bool)], ns: &str, key: &str| {
        changed
            .iter()
            .rev()
            .find(|(n, k, _)| *n == ns && *k == key)
            .map_or_else(|| index.is_set(ns, key), |(_, _, live)| *live)
    };
    let refuse = |what: String| Err(StorageError::Invalid(what));
    for op in &tx.ops {
        let (namespace, key, value) = match op {
            TxOp::Entry { id, .. } => {
                appended.insert(id);
                continue;
            }
            TxOp::Set { namespace, key, value } => (namespace.as_str(), key.as_str(), Some(value)),
            TxOp::Delete { namespace, key } => (namespace.as_str(), key.as_str(), None),
            TxOp::Usage { .. } | TxOp::State { .. } => continue,
        };
        if key.is_empty() {
            return refuse(format!("register key in {namespace:?} is empty"));
        }
        let Some(root) = NamespaceRoot::of(namespace) else {
            // Unknown namespaces are refused by the index with their own message.
            continue;
        };
        let is_live = live(&changed, namespace, key);
        match (root, value) {
            (NamespaceRoot::Lane, None) => {
                if !index.is_set(namespace, key) {
                    return refuse(format!("lane {key:?} is deleted but does not exist"));
                }
                if tx.ops.len() != 1 {
                    return refuse(format!(
                        "lane {key:?} is deleted with other changes: a lane is removed only alone in its line"
                    ));
                }
            }
            (NamespaceRoot::Lane, Some(value)) => {
                let head = value.parse::<String>().map_err(|_| {
                    StorageError::Invalid(format!("lane {key:?} must name an entry id (a JSON string)"))
                })?;
                if !index.has_entry(&head) && !appended.contains(head.as_str()) {
                    return refuse(format!("lane {key:?} names entry {head:?}, which does not exist"));
                }
            }
            (NamespaceRoot::Op, _) if !moves_state => {
                return refuse(format!(
                    "op {key:?} changes without a state move: operations start and end with a pc move"
                ));
            }
            (NamespaceRoot::Op, None) if !is_live => {
                return refuse(format!("op {key:?} is deleted but is not in flight"));
            }
            (NamespaceRoot::Op, _) => {}
            (NamespaceRoot::Pending, Some(_)) => {
                if is_live {
                    return refuse(format!("pending {key:?} is already set: an intent is committed once"));
                }
                if appended.is_empty() || !moves_state {
                    return refuse(format!(
                        "pending {key:?} must be set in the line that appends its intent entry and moves the state"
                    ));
                }
            }
            (NamespaceRoot::Pending, None) => {
                if !is_live {
                    return refuse(format!("pending {key:?} is deleted but is not pending"));
                }
                let settles = tx.ops.iter().any(|op| matches!(op, TxOp::Entry { .. }));
                if !settles {
                    return refuse(format!("pending {key:?} must be deleted in the line that appends its settlement"));
                }
            }
            (NamespaceRoot::Fact, _) => {}
        }
        if matches!(root, NamespaceRoot::Op | NamespaceRoot::Pending) {
            changed.push((namespace, key, value.is_some()));
        }
    }
    Ok(())
}

/// The session's name (`fact` `name`), if one was given.
pub fn session_name<S: Storage + ?Sized>(store: &S) -> Option<String> {
    store.register(FACT, NAME_FACT).and_then(|raw| raw.parse::<String>().ok())
}

/// The session allow rules stored by "approve for this session", as rule
/// text, sorted.
pub fn session_allow_rules<S: Storage + ?Sized>(store: &S) -> Vec<String> {
    store.registers(FACT).into_iter().filter_map(|(key, _)| key.strip_prefix(ALLOW_FACT).map(str::to_owned)).collect()
}

/// Who approved a session allow rule, and when (the value of its `fact`;
/// fields in the key order earlier versions wrote).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllowFact {
    /// When (ms since the Unix epoch).
    pub at: i64,
    /// Who approved it.
    pub by: String,
    /// The invocation whose approval stored it.
    pub invocation_id: String,
}

/// The provider and model a session's turns run on (`fact` `provider`),
/// set by the host when it starts a turn on another than the one recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderFact {
    /// The provider's name as configured (a built-in or a
    /// `[providers.NAME]` table).
    pub name: String,
    /// The model it was asked for.
    pub model: String,
}

/// The provider and model the session's turns run on, when recorded.
pub fn provider_fact<S: Storage + ?Sized>(store: &S) -> Option<ProviderFact> {
    store.register(FACT, PROVIDER_FACT).and_then(|raw| raw.parse::<ProviderFact>().ok())
}

/// A prompt waiting for its turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuedPrompt {
    /// Its number, increasing in the order prompts were queued; a host
    /// that keeps prompts elsewhere before they reach the log uses it to
    /// bring each in once.
    pub n: u64,
    /// The prompt.
    pub prompt: String,
}

/// The session's durable prompt queue (`fact` `queue`): prompts queued
/// while a turn ran, each started once, in order. A prompt leaves the
/// queue in the very line that commits it as the user's message of its
/// turn (`Session::run_queued`), so it is never run twice nor lost.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PromptQueue {
    /// The highest `n` ever brought into the queue (0: none).
    pub through: u64,
    /// Waiting prompts, oldest first.
    pub items: Vec<QueuedPrompt>,
}

impl PromptQueue {
    /// Bring in `arrived` prompts not seen before (`n` above
    /// [`PromptQueue::through`]), in `n` order; returns how many came in.
    pub fn bring_in(&mut self, arrived: &[QueuedPrompt]) -> usize {
        let mut fresh: Vec<QueuedPrompt> = arrived.iter().filter(|q| q.n > self.through).cloned().collect();
        fresh.sort_by_key(|q| q.n);
        fresh.dedup_by_key(|q| q.n);
        if let Some(last) = fresh.last() {
            self.through = last.n;
        }
        let count = fresh.len();
        self.items.extend(fresh);
        count
    }
}

/// The session's prompt queue (empty when none was ever kept).
pub fn prompt_queue<S: Storage + ?Sized>(store: &S) -> PromptQueue {
    store.register(FACT, QUEUE_FACT).and_then(|raw| raw.parse::<PromptQueue>().ok()).unwrap_or_default()
}

impl Transaction {
    /// Record the provider and model the session's turns run on (`fact`
    /// `provider`).
    pub fn set_provider_fact(self, fact: &ProviderFact) -> Result<Self, StorageError> {
        Ok(self.set(FACT, PROVIDER_FACT, to_raw(fact)?))
    }

    /// Name the session (`fact` `name`).
    pub fn set_session_name(self, name: &str) -> Result<Self, StorageError> {
        Ok(self.set(FACT, NAME_FACT, to_raw(name)?))
    }

    /// Store a session allow rule (`fact` `allow:<rule>`).
    pub fn set_session_allow_rule(self, rule: &str, fact: &AllowFact) -> Result<Self, StorageError> {
        Ok(self.set(FACT, format!("{ALLOW_FACT}{rule}"), to_raw(fact)?))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::storage::MemStore;
    use crate::storage::record::{Header, RawJson};

    fn raw(value: serde_json::Value) -> RawJson {
        to_raw(&value).unwrap()
    }

    fn store() -> MemStore {
        let mut s = MemStore::new(Header::new("s".to_owned(), "/".to_owned()));
        s.commit(Transaction::new().entry("e1", None, "m", raw(json!(1))).state(0, raw(json!("a")))).unwrap();
        s
    }

    fn refused(s: &mut MemStore, tx: Transaction, why: &str) {
        let before = (s.last_seq(), s.entry_count());
        let err = s.commit(tx).expect_err(why);
        assert!(err.to_string().contains(why), "{err} does not say {why:?}");
        assert_eq!((s.last_seq(), s.entry_count()), before, "a refused transaction wrote nothing");
    }

    fn state_seq(s: &MemStore) -> u64 {
        s.state().map_or(0, |st| st.seq)
    }

    #[test]
    fn lane_heads_name_existing_entries_and_are_removed_only_alone() {
        let mut s = store();
        s.commit(Transaction::new().set(LANE, "main", raw(json!("e1")))).unwrap();
        // A head appended in the same line is fine; one appended later is not.
        s.commit(Transaction::new().entry("e2", Some("e1"), "m", raw(json!(2))).set(LANE, "main", raw(json!("e2"))))
            .unwrap();
        refused(
            &mut s,
            Transaction::new().set(LANE, "alt", raw(json!("e3"))).entry("e3", None, "m", raw(json!(3))),
            "does not exist",
        );
        refused(&mut s, Transaction::new().set(LANE, "alt", raw(json!("nope"))), "does not exist");
        refused(&mut s, Transaction::new().set("lane.leaf", "alt", raw(json!({"id": "e1"}))), "JSON string");
        refused(&mut s, Transaction::new().set(LANE, "alt", raw(json!(null))), "JSON string");
        refused(&mut s, Transaction::new().delete("lane.leaf", "absent"), "does not exist");
        refused(&mut s, Transaction::new().delete(LANE, "absent"), "does not exist");
        refused(&mut s, Transaction::new().set(LANE, "", raw(json!("e1"))), "empty");
        // Removed only alone: never with an entry, another lane or a state move.
        s.commit(Transaction::new().set(LANE, "alt", raw(json!("e1")))).unwrap();
        refused(&mut s, Transaction::new().entry("e9", Some("e2"), "m", raw(json!(9))).delete(LANE, "alt"), "alone");
        refused(&mut s, Transaction::new().delete(LANE, "alt").set(LANE, "main", raw(json!("e1"))), "alone");
        let seq = state_seq(&s);
        refused(&mut s, Transaction::new().delete(LANE, "alt").state(seq, raw(json!("x"))), "alone");
        refused(&mut s, Transaction::new().delete(LANE, "alt").delete(LANE, "alt"), "alone");
        s.commit(Transaction::new().delete(LANE, "alt")).unwrap();
        assert_eq!(s.register(LANE, "main"), Some(raw(json!("e2"))));
        assert_eq!(s.registers(LANE).len(), 1);
        assert_eq!(s.entry_count(), 2, "a removed lane's entries stay");
    }

    #[test]
    fn ops_start_and_end_with_a_state_move() {
        let mut s = store();
        refused(&mut s, Transaction::new().set(OP, "provider", raw(json!({"step": 1}))), "state move");
        let seq = state_seq(&s);
        s.commit(Transaction::new().set(OP, "provider", raw(json!({"step": 1}))).state(seq, raw(json!("planning"))))
            .unwrap();
        refused(&mut s, Transaction::new().delete(OP, "provider"), "state move");
        refused(&mut s, Transaction::new().entry("x", None, "m", raw(json!(1))).delete(OP, "provider"), "state move");
        let seq = state_seq(&s);
        refused(&mut s, Transaction::new().delete(OP, "other").state(seq, raw(json!("b"))), "not in flight");
        s.commit(Transaction::new().delete(OP, "provider").state(seq, raw(json!("toolCall")))).unwrap();
        assert!(s.registers(OP).is_empty());
        // Deleted twice in one line: the second is not in flight any more.
        let seq = state_seq(&s);
        s.commit(Transaction::new().set("op.x", "k", raw(json!(1))).state(seq, raw(json!("c")))).unwrap();
        let seq = state_seq(&s);
        refused(
            &mut s,
            Transaction::new().delete("op.x", "k").delete("op.x", "k").state(seq, raw(json!("d"))),
            "not in flight",
        );
    }

    #[test]
    fn pending_lives_from_its_intent_line_to_its_settlement_line() {
        let mut s = store();
        let seq = state_seq(&s);
        let intent = |id: &str, seq: u64| {
            Transaction::new()
                .entry(id, Some("e1"), "toolRequested", raw(json!({})))
                .set(PENDING, "i1", raw(json!({"requestEntry": id})))
                .state(seq, raw(json!("executing")))
        };
        refused(&mut s, Transaction::new().set(PENDING, "i1", raw(json!({}))).state(seq, raw(json!("x"))), "intent");
        refused(
            &mut s,
            Transaction::new().entry("r0", Some("e1"), "toolRequested", raw(json!({}))).set(
                PENDING,
                "i1",
                raw(json!({})),
            ),
            "intent",
        );
        s.commit(intent("r1", seq)).unwrap();
        let seq = state_seq(&s);
        refused(&mut s, intent("r2", seq), "already set");
        refused(&mut s, Transaction::new().delete(PENDING, "i1"), "settlement");
        refused(&mut s, Transaction::new().delete(PENDING, "i2").entry("x", None, "m", raw(json!(1))), "not pending");
        s.commit(Transaction::new().entry("done", Some("r1"), "toolCompleted", raw(json!({}))).delete(PENDING, "i1"))
            .unwrap();
        assert!(s.registers(PENDING).is_empty());
        // Set and settled in one line (a rejected call): live in between.
        let seq = state_seq(&s);
        s.commit(intent("r3", seq).delete(PENDING, "i1")).unwrap();
        assert!(s.registers(PENDING).is_empty());
    }

    #[test]
    fn facts_are_free_and_typed() {
        let mut s = store();
        assert_eq!(session_name(&s), None);
        s.commit(Transaction::new().set_session_name("my \"session\"").unwrap()).unwrap();
        assert_eq!(session_name(&s).as_deref(), Some("my \"session\""));
        assert_eq!(s.register(FACT, "name"), Some(raw(json!("my \"session\""))));
        let fact = AllowFact { by: "user:tty".into(), at: 5, invocation_id: "i9".into() };
        s.commit(Transaction::new().set_session_allow_rule("shell(ls *)", &fact).unwrap()).unwrap();
        s.commit(Transaction::new().set_session_allow_rule("write_file", &fact).unwrap()).unwrap();
        assert_eq!(session_allow_rules(&s), vec!["shell(ls *)".to_owned(), "write_file".to_owned()]);
        assert_eq!(s.register(FACT, "allow:write_file").unwrap().parse::<AllowFact>().unwrap(), fact);
        // Overwritten and deleted at will, with or without a state move.
        s.commit(Transaction::new().set_session_name("other").unwrap()).unwrap();
        assert_eq!(session_name(&s).as_deref(), Some("other"));
        s.commit(Transaction::new().delete(FACT, "name")).unwrap();
        s.commit(Transaction::new().delete(FACT, "absent")).unwrap();
        assert_eq!(session_name(&s), None);
        refused(&mut s, Transaction::new().set(FACT, "", raw(json!(1))), "empty");
        // A name that is not a string is not a name.
        s.commit(Transaction::new().set(FACT, "name", raw(json!(7)))).unwrap();
        assert_eq!(session_name(&s), None);
    }
}
