//! `shell` in the editor's terminal: when the client offers `terminal`
//! (`clientCapabilities.terminal`), the ACP agent wraps the built-in
//! `shell` so its command runs in a terminal the editor creates
//! (`terminal/create`, `terminal/wait_for_exit`, `terminal/output`,
//! `terminal/release`; `terminal/kill` on cancel or timeout), shown live
//! in the editor's tool call: once created, the terminal is embedded in
//! the call (`tool_call_update` content `terminal`), so the editor streams
//! its output as it comes and keeps it shown when the call completes.
//!
//! The editor's terminal runs outside cairn's sandbox (no Landlock, no
//! seccomp, no scrubbed environment), so the wrapper makes every call
//! Destructive: the turn's approval gate puts each one to the person,
//! never covered by an allow rule, `--yes` or "allow always", refused when
//! nobody can answer, and refused in plan mode. It keeps the built-in's
//! validation; it must not decide approvals itself (the call is approved
//! when `execute` runs).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use cairn_core::storage::now_millis;
use cairn_core::tool::{
    Preview, ReplayPolicy, Risk, Tool, ToolContext, ToolError, ToolReceipt, ToolRequest, ToolSpec, Validation,
};
use serde_json::{Value, json};

use super::{Reply, Shared};

/// `shell` through the editor's terminal.
pub(super) struct EditorTerminal {
    inner: Arc<dyn Tool>,
    spec: ToolSpec,
    shared: Arc<Shared>,
    session_id: String,
}

impl EditorTerminal {
    pub(super) fn new(inner: Arc<dyn Tool>, shared: Arc<Shared>, session_id: String) -> Self {
        let mut spec = inner.spec().clone();
        spec.description
            .push_str(" Runs in the editor's terminal, outside cairn's sandbox: each call is put to the person.");
        spec.risk = Risk::Destructive;
        spec.replay = ReplayPolicy::Never;
        Self { inner, spec, shared, session_id }
    }

    fn ask(&self, method: &str, params: Value, cancel: Option<&cairn_core::CancelToken>) -> Result<Value, ToolError> {
        match self.shared.ask_until(&self.session_id, method, params, cancel) {
            Ok(Reply::Result(v)) => Ok(v),
            Ok(Reply::Error(e)) => {
                let message = e.get("message").and_then(Value::as_str).unwrap_or("no message");
                Err(ToolError::Other(format!("the editor refused {method}: {message}")))
            }
            Ok(Reply::Cancelled) => Err(ToolError::Cancelled),
            Err(why) => Err(ToolError::Other(why)),
        }
    }

    /// Kill and release `terminal` (best effort: the call has already
    /// failed or been cancelled).
    fn abandon(&self, terminal: &str) {
        let params = json!({"sessionId": self.session_id, "terminalId": terminal});
        let _ = self.ask("terminal/kill", params.clone(), None);
        let _ = self.ask("terminal/release", params, None);
    }
}

fn command(request: &ToolRequest) -> Result<&str, ToolError> {
    request
        .arguments
        .get("command")
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::InvalidArguments("command must be a string".into()))
}

impl Tool for EditorTerminal {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn risk(&self, _arguments: &Value) -> Risk {
        Risk::Destructive
    }

    fn validate(&self, request: &ToolRequest) -> Validation {
        self.inner.validate(request)
    }

    fn preview(&self, request: &ToolRequest, _cwd: &Path) -> Option<Preview> {
        let command = command(request).ok()?;
        Some(Preview::Text { text: format!("in the editor's terminal, outside cairn's sandbox:\n$ {command}") })
    }

    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let start = Instant::now();
        let line = command(request)?;
        let create = json!({
            "sessionId": self.session_id,
            "command": "bash",
            "args": ["-c", line],
            "cwd": ctx.cwd,
            "outputByteLimit": ctx.limits.output_cap,
        });
        let created = self.ask("terminal/create", create, Some(ctx.cancel))?;
        let terminal = created
            .get("terminalId")
            .and_then(Value::as_str)
            .ok_or_else(|| ToolError::Other("the editor's terminal/create answer has no terminalId".into()))?
            .to_owned();
        // The tool call shows the terminal while the command runs (the
        // editor streams its output live), not only its output at the end.
        if let Ok(mut shown) = self.shared.in_terminal.lock() {
            shown.insert(request.invocation_id.clone());
        }
        self.shared.notify(
            &self.session_id,
            json!({
                "sessionUpdate": "tool_call_update",
                "toolCallId": request.invocation_id,
                "status": "in_progress",
                "content": [{"type": "terminal", "terminalId": terminal}],
            }),
        );
        let params = json!({"sessionId": self.session_id, "terminalId": terminal});
        // Until it exits, or the turn's cancel or the tool's time limit.
        let exit = match self.ask("terminal/wait_for_exit", params.clone(), Some(ctx.cancel)) {
            Ok(exit) => exit,
            Err(e) => {
                self.abandon(&terminal);
                return Err(e);
            }
        };
        let output = match self.ask("terminal/output", params.clone(), None) {
            Ok(output) => output,
            Err(e) => {
                self.abandon(&terminal);
                return Err(e);
            }
        };
        let _ = self.ask("terminal/release", params, None);
        let text = output.get("output").and_then(Value::as_str).unwrap_or_default().to_owned();
        let truncated = output.get("truncated").and_then(Value::as_bool).unwrap_or(false);
        let code = exit.get("exitCode").and_then(Value::as_i64);
        let signal = exit.get("signal").and_then(Value::as_str).map(str::to_owned);
        (ctx.output)(text.as_bytes());
        let mut summary = text;
        if let Some(signal) = &signal {
            summary.push_str(&format!("\n[ended by signal {signal}]"));
        }
        Ok(ToolReceipt {
            // A signal (no code) is a failure, as the built-in reports it.
            exit_code: code.map_or(-1, |c| i32::try_from(c).unwrap_or(-1)),
            output_summary: summary,
            structured_output: Some(json!({
                "exitCode": code,
                "signal": signal,
                "terminalId": terminal,
                "via": "editor terminal",
                "sandboxed": false,
            })),
            affected_entities: Vec::new(),
            duration_ms: u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX),
            tier: Risk::Destructive,
            timestamp: now_millis(),
            truncated,
        })
    }
}
