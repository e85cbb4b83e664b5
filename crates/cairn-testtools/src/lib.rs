//! cairn-testtools: deterministic pieces for testing the turn from the
//! outside, in the manner of Correx's test fixtures.
//!
//! # Layout
//! - [`tools`]: echo (ReadOnly), failing validation (Write), rejected
//!   (Destructive), append-a-line tools with each replay policy (so
//!   exactly-once is checked on a real file), giant output and sleep, and
//!   [`HookedTool`], which stops any real tool as its effect begins.
//! - [`provider`]: [`ScriptProvider`], an in-process provider that answers
//!   request k with script line k, k = assistant messages already in the
//!   request (the rule of cairn-provider's scripted provider).
//! - [`approvers`]: scripted, erroring and counting approvers.
//! - [`proxy`]: a loopback TCP proxy to a server's Unix socket that resets,
//!   blackholes or delays the connections through it (network faults).
//! - [`hooks`]: a [`hooks::HookStore`] that pauses a process at a chosen
//!   point of the effect sandwich so a test can SIGKILL it there; used by
//!   the `cairn-crash-driver` binary.
//!
//! Nothing here is for production use: it exists so tests can assert
//! exactly what happened.
#![deny(missing_docs)]

pub mod approvers;
pub mod history;
pub mod hooks;
pub mod provider;
pub mod proxy;
pub mod tools;

pub use approvers::{ErrApprover, ScriptedApprover, YesApprover};
pub use provider::{ScriptLine, ScriptProvider};
pub use tools::{AppendLineTool, EchoTool, FailingTool, GiantOutputTool, HookedTool, RejectedTool, SleepTool};

use std::sync::Arc;

use cairn_core::ToolRegistry;
use cairn_core::tool::ReplayPolicy;

/// A registry with every test tool (the Destructive one only when
/// `interactive`), append tools wired to `hook`.
pub fn registry(interactive: bool, hook: Option<tools::Hook>) -> ToolRegistry {
    let mut registry = ToolRegistry::new(&ScriptedApprover::new(interactive, []));
    let mut add = |tool: Arc<dyn cairn_core::tool::Tool>| {
        // Names are distinct and Destructive is only added when allowed.
        let _ = registry.register(tool);
    };
    add(Arc::new(EchoTool::new()));
    add(Arc::new(FailingTool::new()));
    for policy in [ReplayPolicy::Idempotent, ReplayPolicy::Guarded, ReplayPolicy::Never] {
        add(Arc::new(AppendLineTool::new(policy, hook.clone())));
    }
    add(Arc::new(GiantOutputTool::new()));
    add(Arc::new(SleepTool::new()));
    if interactive {
        add(Arc::new(RejectedTool::new()));
    }
    registry
}
