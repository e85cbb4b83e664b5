//! The tool contract, in Correx's vocabulary: [`ToolSpec`] (name,
//! description, JSON-schema input, risk, capabilities, replay policy),
//! [`ToolRequest`], [`ToolReceipt`] and the [`Tool`] trait.
//!
//! The core declares the contract; it never executes a tool itself beyond
//! calling [`Tool::execute`] inside the effect sandwich. Concrete tools (files,
//! shell, external executables, sandboxing) live in `cairn-tools`.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::CancelToken;

pub use crate::risk::Risk;

/// What a tool may touch. Drives the sandbox: what is not declared is denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Capability {
    /// Read files in the working directory.
    FileRead,
    /// Create, change or delete files in the working directory.
    FileWrite,
    /// Open network connections.
    Network,
    /// Run shell command lines.
    ShellExec,
    /// Start new processes.
    ProcessSpawn,
}

impl Capability {
    /// The lowest risk tier a tool holding this capability may declare (the
    /// tier floor): a tool is never less risky than what it may do.
    ///
    /// - FileRead → ReadOnly: reading the working directory changes nothing.
    /// - FileWrite → Write: it changes files.
    /// - ShellExec, ProcessSpawn → Write: a shell or a started program can
    ///   do anything the rest of the sandbox allows, repeatedly, and a
    ///   process tree is an effect of its own (without a pids cgroup only
    ///   the timeout bounds it).
    /// - Network → Write: a call that can reach the network can leave an
    ///   effect outside this machine that cairn cannot see or undo, and can
    ///   carry away whatever it was given or can read (exfiltration), so it
    ///   must be approved like a write.
    pub fn min_risk(self) -> Risk {
        match self {
            Capability::FileRead => Risk::ReadOnly,
            Capability::FileWrite | Capability::Network | Capability::ShellExec | Capability::ProcessSpawn => {
                Risk::Write
            }
        }
    }

    /// The tier floor of a set of capabilities: the highest
    /// [`Capability::min_risk`] among them (ReadOnly for none).
    pub fn floor<'a>(capabilities: impl IntoIterator<Item = &'a Capability>) -> Risk {
        capabilities.into_iter().map(|c| c.min_risk()).max().unwrap_or(Risk::ReadOnly)
    }
}

/// What resuming after a crash may do with an invocation whose intent was
/// committed but whose settlement was not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ReplayPolicy {
    /// Safe to run again.
    Idempotent,
    /// [`Tool::guard`] tells whether the effect already happened.
    Guarded,
    /// Never re-run: settled as failed-interrupted (uncertain) and the model
    /// is told.
    Never,
}

/// A tool's static description, offered to the model and to approvers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolSpec {
    /// Unique name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub input_schema: Value,
    /// Default risk tier (a tool may raise it per call, see [`Tool::risk`]).
    pub risk: Risk,
    /// Declared capabilities.
    pub capabilities: BTreeSet<Capability>,
    /// Replay policy on resume.
    pub replay: ReplayPolicy,
}

/// One invocation of a tool (Correx `ToolRequest`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolRequest {
    /// cairn's invocation id (unique within the session).
    pub invocation_id: String,
    /// The model's call id.
    pub call_id: String,
    /// The session it belongs to.
    pub session_id: String,
    /// Tool name.
    pub tool: String,
    /// Arguments (a JSON object once validated).
    pub arguments: Value,
}

/// The settled result of a tool's execution (Correx `ToolReceipt`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolReceipt {
    /// Process-style exit code (0 for success).
    pub exit_code: i32,
    /// What the model sees (bounded; truncation is marked in the text).
    pub output_summary: String,
    /// Structured output, if the tool gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_output: Option<Value>,
    /// Paths or other entities the effect touched.
    #[serde(default)]
    pub affected_entities: Vec<String>,
    /// How long the effect took.
    pub duration_ms: u64,
    /// The risk tier the call ran at.
    pub tier: Risk,
    /// When it finished (ms since the Unix epoch).
    pub timestamp: i64,
    /// Whether `output_summary` was cut at the output cap.
    #[serde(default)]
    pub truncated: bool,
}

/// Outcome of [`Tool::validate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Validation {
    /// The request may run.
    Valid,
    /// The request is refused before running; the reason is shown to the
    /// model.
    Invalid(String),
}

impl Validation {
    /// Valid when `request`'s arguments are a JSON object (what every tool
    /// taking named arguments needs before it can look at them).
    pub fn object_arguments(spec: &ToolSpec, request: &ToolRequest) -> Self {
        if request.arguments.is_object() {
            Validation::Valid
        } else {
            Validation::Invalid(format!("{} takes a JSON object of arguments", spec.name))
        }
    }
}

/// Outcome of [`Tool::guard`] for a `Guarded` tool on resume.
#[derive(Debug, Clone, PartialEq)]
pub enum GuardVerdict {
    /// The effect already happened; settle with this receipt, do not re-run.
    AlreadyDone(ToolReceipt),
    /// The effect did not happen; run it.
    NotDone,
    /// Cannot tell; settle as uncertain and tell the model.
    Unknown,
    /// The effect certainly did not happen and must not be re-run (a staged
    /// call stopped before its change set was committed): settled as failed,
    /// not uncertain, with this reason.
    NotApplied(String),
}

/// What an approver is shown so a person can judge a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Preview {
    /// A unified diff of a file edit.
    Diff {
        /// The file.
        path: String,
        /// Unified diff text.
        diff: String,
    },
    /// A command line and where it runs.
    Command {
        /// The exact command.
        command: String,
        /// The working directory.
        cwd: String,
    },
    /// Paths the call writes.
    Paths {
        /// The paths.
        paths: Vec<String>,
    },
    /// Anything else.
    Text {
        /// Free text.
        text: String,
    },
}

/// Limits a tool must respect while executing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolLimits {
    /// Wall-clock limit for the effect.
    pub timeout: Duration,
    /// Bytes of output kept for the model; more is truncated with a marker.
    pub output_cap: usize,
}

impl Default for ToolLimits {
    fn default() -> Self {
        Self { timeout: Duration::from_secs(120), output_cap: 16 * 1024 }
    }
}

/// Everything a tool gets from the turn while it runs.
pub struct ToolContext<'a> {
    /// The session's working directory; paths resolve inside it.
    pub cwd: &'a Path,
    /// Cancellation: a tool must stop (and kill its children) when set.
    pub cancel: &'a CancelToken,
    /// Limits for this call.
    pub limits: ToolLimits,
    /// Streams output chunks to observers while the tool runs.
    pub output: &'a mut dyn FnMut(&[u8]),
    /// Asks for an explicit, per-call approval of access outside the tool's
    /// sandbox rules (the bypass broker). Returns `true` only when a person
    /// approved it; the verdict is recorded in the log by the turn.
    pub approve_bypass: &'a mut dyn FnMut(&str) -> bool,
    /// Judges the change set of a staged run before it is applied (a
    /// Destructive effect needs a person, through the approval gate); the
    /// decision is recorded by the turn before the tool learns it.
    pub review_staged: &'a mut dyn FnMut(&crate::staged::StagedReview<'_>) -> crate::staged::StagedDecision,
    /// Asks the person for structured input or to visit a URL (message,
    /// what is asked) through the session's approver (`crate::elicit`); a
    /// face with nobody to ask declines.
    pub elicit: &'a mut dyn FnMut(&str, crate::elicit::Ask<'_>) -> crate::elicit::ElicitAnswer,
}

impl std::fmt::Debug for ToolContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolContext")
            .field("cwd", &self.cwd)
            .field("cancelled", &self.cancel.is_cancelled())
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// Why a tool's execution failed (a failure is settled as `Failed`, never an
/// abort of the turn).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// The arguments were wrong in a way only execution could see.
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    /// The path escapes the working directory or the sandbox rules.
    #[error("access denied: {0}")]
    AccessDenied(String),
    /// The effect timed out (the process group was killed).
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// Cancelled through the token.
    #[error("cancelled")]
    Cancelled,
    /// The sandbox could not be set up as required.
    #[error("sandbox: {0}")]
    Sandbox(String),
    /// An I/O failure.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Anything else, as a message for the model.
    #[error("{0}")]
    Other(String),
    /// The call's staged effect was discarded by the approval gate or a
    /// person: nothing was applied; settled as Rejected with this reason.
    #[error("{0}")]
    Rejected(String),
}

/// A tool the turn can call.
pub trait Tool: Send + Sync {
    /// The static description.
    fn spec(&self) -> &ToolSpec;

    /// The risk of this particular call (e.g. `shell` raises a recursive
    /// delete to Destructive). Never lower than `spec().risk`.
    fn risk(&self, arguments: &Value) -> Risk {
        let _ = arguments;
        self.spec().risk
    }

    /// Why [`Tool::risk`] raised this call above `spec().risk` (e.g. the
    /// destructive pattern a command matched), said to the person asked to
    /// approve it. `None`: the spec's risk, which needs no reason.
    fn risk_reason(&self, arguments: &Value) -> Option<String> {
        let _ = arguments;
        None
    }

    /// Whether this call runs staged: its file effect is held in a staging
    /// layer, judged by what it actually did (a Destructive effect asks a
    /// person, refused headless) and applied only then. A rule for the whole
    /// tool may then approve running a line no pattern can read.
    fn stages_effect(&self, arguments: &Value) -> bool {
        let _ = arguments;
        false
    }

    /// Tool-specific checks after schema validation, before approval.
    fn validate(&self, request: &ToolRequest) -> Validation {
        let _ = request;
        Validation::Valid
    }

    /// What an approver is shown for this call.
    fn preview(&self, request: &ToolRequest, cwd: &Path) -> Option<Preview> {
        let _ = (request, cwd);
        None
    }

    /// For `Guarded` tools: did the effect of `request` already happen?
    fn guard(&self, request: &ToolRequest, cwd: &Path) -> GuardVerdict {
        let _ = (request, cwd);
        GuardVerdict::Unknown
    }

    /// For staged tools on resume: the invocation's change set was
    /// committed (`staged`) but its settlement was not; finish applying it
    /// (idempotently) and return the receipt, or say it cannot.
    fn resume_staged(
        &self,
        request: &ToolRequest,
        cwd: &Path,
        staged: &crate::staged::StagedCommit<'_>,
    ) -> GuardVerdict {
        let _ = (request, cwd, staged);
        GuardVerdict::Unknown
    }

    /// Run the effect.
    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError>;
}
