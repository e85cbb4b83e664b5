//! The turn's half of the register lifecycles, checked before every commit
//! that moves the pc: after the commit, `op/provider` must be live exactly
//! while the pc is `Planning`, and the live `pending` keys must be exactly
//! the invocation the pc is at (`AwaitingApproval`, `Executing`, or a
//! cancelled pc that resumes there). Storage checks the half it can see
//! without knowing what a pc means (`storage/registers.rs`).
//!
//! A violation is a bug in the turn, reported before anything is written.
//! It must not write or decide anything.

use std::collections::BTreeSet;

use super::pc::{Pc, Phase};
use super::{OP_NS, PENDING_NS, PROVIDER_OP, TurnError};
use crate::storage::{Storage, Transaction, TxOp};

/// The live keys of `namespace` once `tx` is applied.
fn live_after<S: Storage>(store: &S, tx: &Transaction, namespace: &str) -> BTreeSet<String> {
    let mut live: BTreeSet<String> = store.registers(namespace).into_iter().map(|(k, _)| k).collect();
    for op in &tx.ops {
        match op {
            TxOp::Set { namespace: ns, key, .. } if ns == namespace => {
                live.insert(key.clone());
            }
            TxOp::Delete { namespace: ns, key } if ns == namespace => {
                live.remove(key);
            }
            _ => {}
        }
    }
    live
}

/// The invocation whose `pending` key may be live at `pc`.
fn pending_at(pc: &Pc) -> Option<&str> {
    let at = match pc.phase {
        Phase::Cancelled => pc.resume.as_deref()?,
        _ => pc,
    };
    match at.phase {
        Phase::AwaitingApproval | Phase::Executing => at.invocation.as_deref(),
        _ => None,
    }
}

/// Refuse moving the pc to `pc` with `tx` if the registers would be out of
/// step with it.
pub(super) fn check<S: Storage>(store: &S, tx: &Transaction, pc: &Pc) -> Result<(), TurnError> {
    let provider = live_after(store, tx, OP_NS).contains(PROVIDER_OP);
    let planning = pc.phase == Phase::Planning;
    if provider != planning {
        return Err(TurnError::Corrupt(format!(
            "refusing a commit that leaves op/{PROVIDER_OP} {} while the pc is {:?}",
            if provider { "live" } else { "absent" },
            pc.phase
        )));
    }
    let pending = live_after(store, tx, PENDING_NS);
    let expected: BTreeSet<String> = pending_at(pc).map(str::to_owned).into_iter().collect();
    if pending != expected {
        return Err(TurnError::Corrupt(format!(
            "refusing a commit that leaves pending {pending:?} while the pc ({:?}) is at {expected:?}",
            pc.phase
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::storage::{Header, MemStore, to_raw};

    fn pc(phase: Phase, invocation: Option<&str>) -> Pc {
        Pc { phase, invocation: invocation.map(str::to_owned), ..Pc::idle("main") }
    }

    fn cancelled(inner: Pc) -> Pc {
        Pc { phase: Phase::Cancelled, resume: Some(Box::new(inner)), ..Pc::idle("main") }
    }

    #[test]
    fn the_provider_op_lives_exactly_while_planning() {
        let store = MemStore::new(Header::new("s", "/"));
        let set = Transaction::new().set(OP_NS, PROVIDER_OP, to_raw(&json!({"turnId": "t1", "step": 1})).unwrap());
        assert!(check(&store, &set, &pc(Phase::Planning, None)).is_ok());
        assert!(check(&store, &Transaction::new(), &pc(Phase::Planning, None)).is_err());
        // A turn cancelled in Planning must end the op (it survived before).
        for phase in [Phase::Idle, Phase::ToolCall, Phase::Final] {
            assert!(check(&store, &set, &pc(phase, None)).is_err(), "{phase:?}");
        }
        assert!(check(&store, &set, &cancelled(pc(Phase::Planning, None))).is_err());
        // Set then deleted in the same line: absent after it.
        let both = set.clone().delete(OP_NS, PROVIDER_OP);
        assert!(check(&store, &both, &pc(Phase::ToolCall, None)).is_ok());
    }

    #[test]
    fn pending_keys_are_exactly_the_invocation_at_the_pc() {
        let mut store = MemStore::new(Header::new("s", "/"));
        let intent = |key: &str| {
            Transaction::new().entry(format!("r{key}"), None, "toolRequested", to_raw(&json!({})).unwrap()).set(
                PENDING_NS,
                key,
                to_raw(&json!({})).unwrap(),
            )
        };
        assert!(check(&store, &intent("i1"), &pc(Phase::Executing, Some("i1"))).is_ok());
        assert!(check(&store, &intent("i1"), &pc(Phase::AwaitingApproval, Some("i1"))).is_ok());
        assert!(check(&store, &intent("i1"), &cancelled(pc(Phase::AwaitingApproval, Some("i1")))).is_ok());
        assert!(check(&store, &intent("i1"), &pc(Phase::Executing, Some("i2"))).is_err());
        assert!(check(&store, &intent("i1"), &pc(Phase::ToolCall, None)).is_err());
        assert!(check(&store, &Transaction::new(), &pc(Phase::Executing, Some("i1"))).is_err());
        // An orphan left by another writer blocks every pc move until settled.
        store.commit(intent("i9").state(0, to_raw(&json!({})).unwrap())).unwrap();
        assert!(check(&store, &intent("i1"), &pc(Phase::Executing, Some("i1"))).is_err());
        let settled = intent("i1").delete(PENDING_NS, "i9");
        assert!(check(&store, &settled, &pc(Phase::Executing, Some("i1"))).is_ok());
    }
}
