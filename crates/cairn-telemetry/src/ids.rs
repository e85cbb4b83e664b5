//! Trace and span ids that are functions of the session, so that another
//! process (a worker taking a session over, a child's thread, a process
//! resuming it later) finds the same trace without asking anyone: a root
//! session's trace id is a hash of its id, and the `execute_tool` span of a
//! call is a hash of (session id, invocation id) — the child spawned by
//! that call is `<parent id>+<invocation id>` (cairn-runtime's
//! `family.rs`), so its turns name their parent span from their own id.
//!
//! Must not: be used for anything but ids (FNV-1a is not a secure hash;
//! ids only need to be stable and spread).

use std::cell::Cell;

use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv(seed: u64, parts: &[&str]) -> u64 {
    let mut h = FNV_OFFSET ^ seed;
    for part in parts {
        for b in part.bytes().chain(std::iter::once(0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(FNV_PRIME);
        }
    }
    h
}

/// The trace id of a root session (never zero).
pub fn session_trace(root_session: &str) -> TraceId {
    let hi = fnv(1, &[root_session]);
    let lo = fnv(2, &[root_session]);
    let id = (u128::from(hi) << 64) | u128::from(lo);
    TraceId::from(if id == 0 { 1 } else { id })
}

/// The span id of the `execute_tool` span of `invocation` in `session`
/// (never zero).
pub fn call_span(session: &str, invocation: &str) -> SpanId {
    let id = fnv(3, &[session, invocation]);
    SpanId::from(if id == 0 { 1 } else { id })
}

/// The span id of the `create_agent` span of the child that `invocation`
/// (a `spawn_agent` call) in `session` spawned (never zero): the child's
/// turns name it as their parent from their own id.
pub fn spawn_span(session: &str, invocation: &str) -> SpanId {
    let id = fnv(4, &[session, invocation]);
    SpanId::from(if id == 0 { 1 } else { id })
}

/// The parent session and the spawning invocation of a child session id
/// (`<parent>+<invocation>`), `None` for a root session.
pub(crate) fn split_child(session: &str) -> Option<(&str, &str)> {
    session.rsplit_once('+').filter(|(p, i)| !p.is_empty() && !i.is_empty())
}

thread_local! {
    static NEXT_TRACE: Cell<Option<TraceId>> = const { Cell::new(None) };
    static NEXT_SPAN: Cell<Option<SpanId>> = const { Cell::new(None) };
}

/// Random ids, unless [`with_ids`] asked for given ones on this thread.
#[derive(Debug, Default)]
pub(crate) struct Ids(RandomIdGenerator);

impl IdGenerator for Ids {
    fn new_trace_id(&self) -> TraceId {
        NEXT_TRACE.with(Cell::take).unwrap_or_else(|| self.0.new_trace_id())
    }
    fn new_span_id(&self) -> SpanId {
        NEXT_SPAN.with(Cell::take).unwrap_or_else(|| self.0.new_span_id())
    }
}

/// Run `start` (which starts one span) with its trace id (used only when
/// it has no parent) and span id given.
pub(crate) fn with_ids<T>(trace: Option<TraceId>, span: Option<SpanId>, start: impl FnOnce() -> T) -> T {
    NEXT_TRACE.with(|c| c.set(trace));
    NEXT_SPAN.with(|c| c.set(span));
    let out = start();
    NEXT_TRACE.with(|c| c.set(None));
    NEXT_SPAN.with(|c| c.set(None));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_functions_of_the_session() {
        assert_eq!(session_trace("s1"), session_trace("s1"));
        assert_ne!(session_trace("s1"), session_trace("s2"));
        assert_ne!(call_span("s", "i1"), call_span("s", "i2"));
        assert_ne!(call_span("ab", "c"), call_span("a", "bc"));
        assert_ne!(call_span("s", "i1"), spawn_span("s", "i1"));
        assert_eq!(split_child("p+i3"), Some(("p", "i3")));
        assert_eq!(split_child("p+i3+i9"), Some(("p+i3", "i9")));
        assert_eq!(split_child("p"), None);
    }
}
