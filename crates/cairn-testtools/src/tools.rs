//! Deterministic test tools. Each does one observable thing so a test can
//! check from the outside what ran and how often.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cairn_core::storage::now_millis;
use cairn_core::tool::{
    Capability, GuardVerdict, ReplayPolicy, Risk, Tool, ToolContext, ToolError, ToolReceipt, ToolRequest, ToolSpec,
    Validation,
};
use serde_json::{Value, json};

/// Called with a point name (`"during_effect"`) inside an effect.
pub type Hook = Arc<dyn Fn(&str) + Send + Sync>;

fn spec(
    name: &str,
    description: &str,
    schema: Value,
    risk: Risk,
    replay: ReplayPolicy,
    caps: &[Capability],
) -> ToolSpec {
    ToolSpec {
        name: name.to_owned(),
        description: description.to_owned(),
        input_schema: schema,
        risk,
        capabilities: caps.iter().copied().collect::<BTreeSet<_>>(),
        replay,
    }
}

fn receipt(summary: String, risk: Risk, started: Instant) -> ToolReceipt {
    ToolReceipt {
        exit_code: 0,
        output_summary: summary,
        structured_output: None,
        affected_entities: Vec::new(),
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        tier: risk,
        timestamp: now_millis(),
        truncated: false,
    }
}

/// `echo` (T0, Idempotent): answers its `text`.
#[derive(Debug)]
pub struct EchoTool {
    spec: ToolSpec,
    /// How many times it ran.
    pub runs: AtomicUsize,
}

impl EchoTool {
    /// The tool.
    pub fn new() -> Self {
        let schema = json!({
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
            "additionalProperties": false
        });
        Self {
            spec: spec("echo", "Echo the text back.", schema, Risk::ReadOnly, ReplayPolicy::Idempotent, &[]),
            runs: AtomicUsize::new(0),
        }
    }
}

impl Default for EchoTool {
    fn default() -> Self {
        Self::new()
    }
}

impl Tool for EchoTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let started = Instant::now();
        self.runs.fetch_add(1, Ordering::SeqCst);
        let text = request.arguments.get("text").and_then(Value::as_str).unwrap_or_default().to_owned();
        (ctx.output)(text.as_bytes());
        Ok(receipt(text, Risk::ReadOnly, started))
    }
}

/// `failing` (T2): always fails validation.
#[derive(Debug)]
pub struct FailingTool {
    spec: ToolSpec,
}

impl FailingTool {
    /// The tool.
    pub fn new() -> Self {
        Self {
            spec: spec(
                "failing",
                "Always refused by validation.",
                json!({"type": "object"}),
                Risk::Write,
                ReplayPolicy::Never,
                &[Capability::FileWrite],
            ),
        }
    }
}

impl Default for FailingTool {
    fn default() -> Self {
        Self::new()
    }
}

impl Tool for FailingTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn validate(&self, _request: &ToolRequest) -> Validation {
        Validation::Invalid("simulated validation failure".to_owned())
    }

    fn execute(&self, _request: &ToolRequest, _ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        Err(ToolError::Other("failing tool must never run".to_owned()))
    }
}

/// `rejected` (T4, Destructive, Never): the Correx tool an approver must
/// refuse; counts runs so a test can prove it never ran.
#[derive(Debug)]
pub struct RejectedTool {
    spec: ToolSpec,
    /// How many times it ran.
    pub runs: AtomicUsize,
}

impl RejectedTool {
    /// The tool.
    pub fn new() -> Self {
        Self {
            spec: spec(
                "rejected",
                "A destructive action.",
                json!({"type": "object"}),
                Risk::Destructive,
                ReplayPolicy::Never,
                &[Capability::FileWrite],
            ),
            runs: AtomicUsize::new(0),
        }
    }
}

impl Default for RejectedTool {
    fn default() -> Self {
        Self::new()
    }
}

impl Tool for RejectedTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn execute(&self, _request: &ToolRequest, _ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(receipt("destructive effect ran".to_owned(), Risk::Destructive, Instant::now()))
    }
}

/// `append_idempotent` / `append_guarded` / `append_never` (T2): append the
/// line `<invocation id> <text>` to `path` (relative to the cwd). The guard
/// of the Guarded one looks for its invocation id in the file.
pub struct AppendLineTool {
    spec: ToolSpec,
    hook: Option<Hook>,
}

impl std::fmt::Debug for AppendLineTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppendLineTool").field("name", &self.spec.name).finish()
    }
}

impl AppendLineTool {
    /// The tool for `policy`; `hook` is called with `"during_effect"` after
    /// the effect began and before the line is written.
    pub fn new(policy: ReplayPolicy, hook: Option<Hook>) -> Self {
        let name = match policy {
            ReplayPolicy::Idempotent => "append_idempotent",
            ReplayPolicy::Guarded => "append_guarded",
            ReplayPolicy::Never => "append_never",
        };
        let schema = json!({
            "type": "object",
            "properties": {"path": {"type": "string", "minLength": 1}, "text": {"type": "string"}},
            "required": ["path", "text"],
            "additionalProperties": false
        });
        Self {
            spec: spec(name, "Append a line to a file.", schema, Risk::Write, policy, &[Capability::FileWrite]),
            hook,
        }
    }

    fn path(request: &ToolRequest, cwd: &Path) -> PathBuf {
        cwd.join(request.arguments.get("path").and_then(Value::as_str).unwrap_or("out.txt"))
    }
}

impl Tool for AppendLineTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn guard(&self, request: &ToolRequest, cwd: &Path) -> GuardVerdict {
        let path = Self::path(request, cwd);
        let content = match std::fs::read_to_string(&path) {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return GuardVerdict::NotDone,
            Err(_) => return GuardVerdict::Unknown,
        };
        let prefix = format!("{} ", request.invocation_id);
        if content.lines().any(|l| l.starts_with(&prefix)) {
            let mut r = receipt("appended 1 line (found by the guard)".to_owned(), Risk::Write, Instant::now());
            r.affected_entities = vec![path.display().to_string()];
            GuardVerdict::AlreadyDone(r)
        } else {
            GuardVerdict::NotDone
        }
    }

    fn execute(&self, request: &ToolRequest, _ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let started = Instant::now();
        if let Some(hook) = &self.hook {
            hook("during_effect");
        }
        let path = Self::path(request, _ctx.cwd);
        let text = request.arguments.get("text").and_then(Value::as_str).unwrap_or_default();
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|source| ToolError::Io { context: format!("open {}", path.display()), source })?;
        file.write_all(format!("{} {text}\n", request.invocation_id).as_bytes())
            .and_then(|()| file.sync_data())
            .map_err(|source| ToolError::Io { context: format!("append to {}", path.display()), source })?;
        let mut r = receipt("appended 1 line".to_owned(), Risk::Write, started);
        r.affected_entities = vec![path.display().to_string()];
        Ok(r)
    }
}

/// `giant` (T0): streams `bytes` bytes of output in 64 KiB chunks and
/// returns a summary of at most twice the output cap (bounded memory).
#[derive(Debug)]
pub struct GiantOutputTool {
    spec: ToolSpec,
}

impl GiantOutputTool {
    /// The tool.
    pub fn new() -> Self {
        let schema = json!({
            "type": "object",
            "properties": {"bytes": {"type": "integer", "minimum": 0}},
            "required": ["bytes"]
        });
        Self { spec: spec("giant", "Produce a lot of output.", schema, Risk::ReadOnly, ReplayPolicy::Idempotent, &[]) }
    }
}

impl Default for GiantOutputTool {
    fn default() -> Self {
        Self::new()
    }
}

impl Tool for GiantOutputTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let started = Instant::now();
        let total = request.arguments.get("bytes").and_then(Value::as_u64).unwrap_or(0) as usize;
        let chunk = vec![b'x'; 64 * 1024];
        let keep = ctx.limits.output_cap.saturating_mul(2);
        let mut summary = String::new();
        let mut sent = 0;
        while sent < total {
            if ctx.cancel.is_cancelled() {
                return Err(ToolError::Cancelled);
            }
            let n = chunk.len().min(total - sent);
            (ctx.output)(&chunk[..n]);
            if summary.len() < keep {
                summary.push_str(&"x".repeat(n.min(keep - summary.len())));
            }
            sent += n;
        }
        Ok(receipt(summary, Risk::ReadOnly, started))
    }
}

/// `sleep` (T0): waits `ms` milliseconds or until cancelled (then fails
/// with `Cancelled`, as a tool honouring its token must).
#[derive(Debug)]
pub struct SleepTool {
    spec: ToolSpec,
}

impl SleepTool {
    /// The tool.
    pub fn new() -> Self {
        let schema = json!({"type": "object", "properties": {"ms": {"type": "integer"}}, "required": ["ms"]});
        Self { spec: spec("sleep", "Wait.", schema, Risk::ReadOnly, ReplayPolicy::Idempotent, &[]) }
    }
}

impl Default for SleepTool {
    fn default() -> Self {
        Self::new()
    }
}

impl Tool for SleepTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let started = Instant::now();
        let ms = request.arguments.get("ms").and_then(Value::as_u64).unwrap_or(0);
        while started.elapsed() < Duration::from_millis(ms) {
            if ctx.cancel.is_cancelled() {
                return Err(ToolError::Cancelled);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(receipt(format!("slept {ms} ms"), Risk::ReadOnly, started))
    }
}

/// Any tool with a hook called as its effect begins (`"during_effect"`),
/// so a crash test can stop a real tool (a cairn-tools built-in) there;
/// everything else is the wrapped tool's own.
pub struct HookedTool {
    inner: Arc<dyn Tool>,
    hook: Option<Hook>,
}

impl std::fmt::Debug for HookedTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookedTool").field("name", &self.inner.spec().name).finish()
    }
}

impl HookedTool {
    /// Wrap `inner`.
    pub fn new(inner: Arc<dyn Tool>, hook: Option<Hook>) -> Self {
        Self { inner, hook }
    }
}

impl Tool for HookedTool {
    fn spec(&self) -> &ToolSpec {
        self.inner.spec()
    }
    fn risk(&self, arguments: &Value) -> Risk {
        self.inner.risk(arguments)
    }
    fn validate(&self, request: &ToolRequest) -> Validation {
        self.inner.validate(request)
    }
    fn preview(&self, request: &ToolRequest, cwd: &Path) -> Option<cairn_core::tool::Preview> {
        self.inner.preview(request, cwd)
    }
    fn guard(&self, request: &ToolRequest, cwd: &Path) -> GuardVerdict {
        self.inner.guard(request, cwd)
    }
    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        if let Some(hook) = &self.hook {
            hook("during_effect");
        }
        self.inner.execute(request, ctx)
    }
}
