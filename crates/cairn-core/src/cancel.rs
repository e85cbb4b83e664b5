//! Cooperative cancellation shared between a host and a running turn.
//!
//! The token is checked at every checkpoint of the turn (before a provider
//! call, between streamed chunks, before and after each tool effect). It never
//! interrupts anything by itself: whoever holds it decides how to stop.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A clonable flag: cancel once, observed by every clone.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A fresh, not-cancelled token.
    pub fn new() -> Self {
        Self::default()
    }

    /// Request cancellation. Idempotent.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether cancellation was requested.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}
