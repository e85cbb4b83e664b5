//! An application's own tool: a name, a JSON schema, a risk tier, a replay
//! policy and a callback ([`ToolDef`]), carried into a turn as a
//! `cairn_core::tool::Tool` like any other.
//!
//! Must not: decide whether a call may run (the turn's approval gate
//! does), cap its output (the turn does) or run anything but the callback.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use cairn_core::risk::Risk;
use cairn_core::tool::{ReplayPolicy, Tool, ToolContext, ToolError, ToolReceipt, ToolRequest, ToolSpec, Validation};
use serde_json::Value;

/// What resuming a session may do with a call of this tool that was
/// started but never settled (the process died while it ran).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Never run it again: the call is settled as failed and uncertain, and
    /// the model is told its effect is unknown.
    Never,
    /// Safe to run again: the call is run once more on resume.
    Idempotent,
}

impl Replay {
    fn policy(self) -> ReplayPolicy {
        match self {
            Replay::Never => ReplayPolicy::Never,
            Replay::Idempotent => ReplayPolicy::Idempotent,
        }
    }
}

/// What a tool's callback is given and returns: the call's arguments (a
/// JSON object that fits the schema) in, the text the model sees out, or a
/// failure the model sees as a failed call.
pub type ToolFn = dyn Fn(&Value) -> Result<String, String> + Send + Sync;

/// An application's tool, offered to the model beside (or instead of)
/// cairn's built-ins.
#[derive(Clone)]
pub struct ToolDef {
    spec: ToolSpec,
    run: Arc<ToolFn>,
}

impl std::fmt::Debug for ToolDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolDef").field("name", &self.spec.name).field("risk", &self.spec.risk).finish_non_exhaustive()
    }
}

impl ToolDef {
    /// A tool named `name` (what the model calls it by), described to the
    /// model by `description`, whose arguments follow the JSON Schema
    /// `input_schema` (an object schema; the turn validates each call
    /// against it before the callback sees it). `risk` says who must
    /// approve a call (ReadOnly: nobody; Write: the approver unless an
    /// allow rule covers it; Destructive: always the approver), `replay`
    /// what a resumed session does with a call cut short. `run` is called
    /// once per approved call; an `Err` is a failed call the model sees.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
        risk: Risk,
        replay: Replay,
        run: impl Fn(&Value) -> Result<String, String> + Send + Sync + 'static,
    ) -> Self {
        let spec = ToolSpec {
            name: name.into(),
            description: description.into(),
            input_schema,
            risk,
            // An in-process callback: cairn's sandbox does not apply to it,
            // so it declares nothing the sandbox would enforce.
            capabilities: BTreeSet::new(),
            replay: replay.policy(),
        };
        ToolDef { spec, run: Arc::new(run) }
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub(crate) fn into_tool(self) -> Arc<dyn Tool> {
        Arc::new(FnTool { spec: self.spec, run: self.run })
    }
}

/// A [`ToolDef`] as the turn sees it.
struct FnTool {
    spec: ToolSpec,
    run: Arc<ToolFn>,
}

impl Tool for FnTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn validate(&self, request: &ToolRequest) -> Validation {
        Validation::object_arguments(&self.spec, request)
    }

    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let started = Instant::now();
        let output = (self.run)(&request.arguments).map_err(ToolError::Other)?;
        (ctx.output)(output.as_bytes());
        Ok(ToolReceipt {
            exit_code: 0,
            output_summary: output,
            structured_output: None,
            affected_entities: Vec::new(),
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            tier: self.risk(&request.arguments),
            timestamp: now_ms(),
            truncated: false,
        })
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
