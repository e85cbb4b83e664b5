//! Test helpers: a session directory, a request builder, a runner that
//! records streamed output and bypass questions, an installer for external
//! tools and a look at which processes of a group are still alive.

#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_core::CancelToken;
use cairn_core::tool::{Tool, ToolContext, ToolError, ToolLimits, ToolReceipt, ToolRequest};
use serde_json::Value;

pub(crate) fn request(tool: &str, arguments: Value) -> ToolRequest {
    ToolRequest {
        invocation_id: "inv-1".into(),
        call_id: "call-1".into(),
        session_id: "s-1".into(),
        tool: tool.into(),
        arguments,
    }
}

/// What a run produced besides the result.
#[derive(Debug, Default)]
pub(crate) struct Observed {
    pub(crate) streamed: Vec<u8>,
    pub(crate) bypass_questions: Vec<String>,
}

/// Run `tool` with `arguments` in `cwd`, answering bypass questions with
/// `approve`.
pub(crate) fn run_with(
    tool: &dyn Tool,
    arguments: Value,
    cwd: &Path,
    limits: ToolLimits,
    approve: bool,
    cancel: &CancelToken,
) -> (Result<ToolReceipt, ToolError>, Observed) {
    let mut observed = Observed::default();
    let mut streamed = Vec::new();
    let mut questions = Vec::new();
    let req = request(&tool.spec().name, arguments);
    let result = {
        let mut output = |b: &[u8]| streamed.extend_from_slice(b);
        let mut approve_bypass = |q: &str| {
            questions.push(q.to_string());
            approve
        };
        // Staged effects: a Write effect applies, a Destructive one is
        // discarded (what a headless session does).
        let mut review_staged = |review: &cairn_core::staged::StagedReview<'_>| {
            if review.judgement.risk == cairn_core::tool::Risk::Destructive {
                cairn_core::staged::StagedDecision::Discard { reason: format!("test: {}", review.changes.listing()) }
            } else {
                cairn_core::staged::StagedDecision::Apply { by: "test".to_owned() }
            }
        };
        let mut ctx = ToolContext {
            cwd,
            cancel,
            limits,
            output: &mut output,
            approve_bypass: &mut approve_bypass,
            review_staged: &mut review_staged,
            elicit: &mut |_, _| cairn_core::elicit::nobody(),
        };
        tool.execute(&req, &mut ctx)
    };
    observed.streamed = streamed;
    observed.bypass_questions = questions;
    (result, observed)
}

pub(crate) fn limits() -> ToolLimits {
    ToolLimits { timeout: Duration::from_secs(60), output_cap: 16 * 1024 }
}

pub(crate) fn run(tool: &dyn Tool, arguments: Value, cwd: &Path) -> Result<ToolReceipt, ToolError> {
    run_with(tool, arguments, cwd, limits(), false, &CancelToken::new()).0
}

/// Install an external tool `name` (a script and its metadata) in `dir`.
pub(crate) fn install_tool(dir: &Path, name: &str, script: &str, metadata: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let exe = dir.join(name);
    std::fs::write(&exe, script).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let meta = dir.join(format!("{name}.toml"));
    std::fs::write(&meta, metadata).unwrap();
    meta
}

/// Metadata with the given capabilities and extra lines.
pub(crate) fn metadata(risk: &str, capabilities: &[&str], extra: &str) -> String {
    let caps = capabilities.iter().map(|c| format!("\"{c}\"")).collect::<Vec<_>>().join(", ");
    format!(
        "description = \"a test tool\"\nrisk = \"{risk}\"\ncapabilities = [{caps}]\nreplay = \"never\"\n{extra}\n[parameters]\ntype = \"object\"\n"
    )
}

/// Load one external tool from a metadata file.
pub(crate) fn load(meta: &Path) -> cairn_tools::ExternalTool {
    cairn_tools::ExternalTool::load(meta, &cairn_tools::ToolsConfig::default()).unwrap()
}

/// Whether `pid` is a live (non-zombie) process.
pub(crate) fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().and_then(|s| s.split_whitespace().next()).unwrap_or("X");
            state != "Z" && state != "X"
        }
        Err(_) => false,
    }
}

/// Live processes whose process group is `pgid`.
pub(crate) fn live_in_group(pgid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let rest: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
        // rest[0] = state, rest[1] = ppid, rest[2] = pgrp
        if rest.len() > 2 && rest[2].parse::<i32>().ok() == Some(pgid) && rest[0] != "Z" {
            out.push(pid);
        }
    }
    out
}

/// Live (non-zombie) processes whose command line contains `marker`, seen
/// from the host's `/proc` (a tool's own `$!` is a pid of its PID namespace,
/// meaningless here; scripts name their children with `exec -a MARKER`).
pub(crate) fn with_marker(marker: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        if String::from_utf8_lossy(&cmdline).contains(marker) && alive(pid) {
            out.push(pid);
        }
    }
    out
}

/// A marker no other test or process uses.
pub(crate) fn marker(name: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("cairn-test-{name}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Watches, from another thread, for live processes carrying each marker
/// while a tool runs; `stop` says which markers were ever seen alive. Once
/// all were seen it creates `ack` (when given), so a tool can wait for the
/// watcher instead of for a length of time.
pub(crate) struct Watcher {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<Vec<bool>>,
}

impl Watcher {
    pub(crate) fn start(markers: &[String], ack: Option<PathBuf>) -> Self {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let markers = markers.to_vec();
        let handle = std::thread::spawn(move || {
            let mut seen = vec![false; markers.len()];
            while !flag.load(Ordering::Relaxed) {
                for (i, m) in markers.iter().enumerate() {
                    seen[i] |= !with_marker(m).is_empty();
                }
                if let Some(ack) = ack.as_ref().filter(|_| seen.iter().all(|s| *s)) {
                    let _ = std::fs::write(ack, "seen");
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            seen
        });
        Self { stop, handle }
    }

    pub(crate) fn stop(self) -> Vec<bool> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.join().unwrap()
    }
}

/// Text of a receipt or error, for assertions.
pub(crate) fn text(r: &Result<ToolReceipt, ToolError>) -> String {
    match r {
        Ok(rec) => rec.output_summary.clone(),
        Err(e) => e.to_string(),
    }
}
