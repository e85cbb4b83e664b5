//! The tool service's client: a session's tools from a tool service
//! (`cairn toolsrv`, whose tree is cairn-9p's `toolsrv.rs` and whose host
//! is the binary's `toolsrv.rs`). `--toolsrv ADDR` (or `[tools] toolsrv`,
//! [`address`]) offers the service's tools ([`remote_specs`], each a
//! [`RemoteTool`]) instead of in-process ones; `tools::turn_tools` is the
//! one place that choice is made.
//! A remote call's job id is derived from the session and invocation ids
//! (`cairn_9p::toolsrv::job_id`), both committed in the intent entry before
//! the job is asked for, so a resumed turn finds the job (`guard`): still
//! running → waits for it; finished → settled from its receipt, never run
//! again; absent → it never started and runs now.
//!
//! Must not: hang on a dead service (a closed connection ends every wait
//! with a failed settlement naming the service), or run a job twice for one
//! invocation.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, Result, anyhow, bail};
use cairn_9p::Dial;
use cairn_9p::client::{Conn, mode};
use cairn_9p::toolsrv::{JobRequest, job_id};
use cairn_core::CancelToken;
use cairn_core::tool::{GuardVerdict, ReplayPolicy, Tool, ToolContext, ToolError, ToolReceipt, ToolRequest, ToolSpec};

use crate::setup::Setup;

/// The address of the tool service to use, if any (flag over config).
pub fn address(ctx: &Setup) -> Option<String> {
    ctx.common.toolsrv.clone().or_else(|| ctx.settings.toolsrv.clone())
}

/// The tools of the service at `address`: each `t/NAME/meta` read and
/// parsed (the service parses a tool's metadata then). A tool whose meta
/// cannot be read (its metadata is broken; the service's error names the
/// file) is left out with a note; an unreachable service is an error.
pub fn remote_specs(address: &str, notes: &mut Vec<String>) -> Result<(Dial, Vec<ToolSpec>)> {
    let dial = Dial::parse(address).context("--toolsrv / [tools] toolsrv")?;
    let mut conn = Conn::dial(&dial)
        .with_context(|| format!("the tool service at {dial} is unreachable (start it with `cairn toolsrv`)"))?;
    let mut specs = Vec::new();
    for entry in conn.list("t").with_context(|| format!("cannot list t/ on the tool service at {dial}"))? {
        let meta = match conn.read_file(&format!("t/{}/meta", entry.name)) {
            Ok(meta) => meta,
            Err(e) => {
                notes.push(format!("tool {} of the tool service skipped: {e:#}", entry.name));
                continue;
            }
        };
        match serde_json::from_slice::<ToolSpec>(&meta) {
            Ok(spec) => specs.push(spec),
            Err(e) => notes
                .push(format!("tool {} of the tool service skipped: its meta is not a tool spec ({e})", entry.name)),
        }
    }
    Ok((dial, specs))
}

/// A tool of a tool service: each call is a job there.
#[derive(Debug)]
pub struct RemoteTool {
    /// The service's spec, with replay `Guarded`: on resume the job is
    /// looked up by its derived id instead of being re-run.
    spec: ToolSpec,
    dial: Dial,
}

impl RemoteTool {
    /// The tool `spec` served at `dial`.
    pub fn new(mut spec: ToolSpec, dial: Dial) -> Self {
        spec.replay = ReplayPolicy::Guarded;
        Self { spec, dial }
    }

    fn gone(&self, id: &str, e: &anyhow::Error) -> ToolError {
        ToolError::Other(format!(
            "the tool service at {} went away during job {id} ({e:#}); whether its effect happened is unknown — check before retrying",
            self.dial
        ))
    }

    /// Follow `jobs/<id>/out` to its end (the job's end), passing chunks
    /// on; then the job's status line.
    fn follow(
        &self,
        conn: &mut Conn,
        id: &str,
        output: &mut dyn FnMut(&[u8]),
        cancel: Option<&CancelToken>,
    ) -> Result<String> {
        let (fid, _) = conn.walk(&format!("jobs/{id}/out"))?;
        conn.open(fid, mode::READ)?;
        let mut offset = 0u64;
        let mut killed = false;
        loop {
            if !killed && cancel.is_some_and(CancelToken::is_cancelled) {
                killed = true;
                let _ = conn.write_file(&format!("jobs/{id}/ctl"), b"kill");
            }
            let chunk = conn.read_at(fid, offset, 64 * 1024)?;
            if chunk.is_empty() {
                break;
            }
            offset += chunk.len() as u64;
            output(&chunk);
        }
        let _ = conn.clunk(fid);
        Ok(conn.read_text(&format!("jobs/{id}/status"))?.trim().to_owned())
    }

    fn receipt(conn: &mut Conn, id: &str) -> Result<ToolReceipt> {
        let bytes = conn.read_file(&format!("jobs/{id}/receipt"))?;
        serde_json::from_slice(&bytes).map_err(|e| anyhow!("job {id}: its receipt is not a tool receipt ({e})"))
    }
}

impl Tool for RemoteTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn guard(&self, request: &ToolRequest, cwd: &Path) -> GuardVerdict {
        let _ = cwd;
        let id = job_id(&request.session_id, &request.invocation_id);
        let Ok(mut conn) = Conn::dial(&self.dial) else { return GuardVerdict::Unknown };
        if conn.walk(&format!("jobs/{id}")).is_err() {
            // The service never got the request: nothing happened.
            return GuardVerdict::NotDone;
        }
        let status = match self.follow(&mut conn, &id, &mut |_| {}, None) {
            Ok(status) => status,
            Err(_) => return GuardVerdict::Unknown,
        };
        match status.as_str() {
            "done" => match Self::receipt(&mut conn, &id) {
                Ok(receipt) => GuardVerdict::AlreadyDone(receipt),
                Err(_) => GuardVerdict::Unknown,
            },
            other => GuardVerdict::NotApplied(format!("job {id} on the tool service at {}: {other}", self.dial)),
        }
    }

    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let job = JobRequest {
            tool: request.tool.clone(),
            arguments: request.arguments.clone(),
            invocation: request.invocation_id.clone(),
            session: request.session_id.clone(),
            cwd: ctx.cwd.display().to_string(),
        };
        let mut conn = Conn::dial(&self.dial).map_err(|e| {
            ToolError::Other(format!(
                "the tool service at {} is unreachable ({e:#}); the call was not run (start it with `cairn toolsrv`)",
                self.dial
            ))
        })?;
        let id = submit(&mut conn, &job)
            .map_err(|e| ToolError::Other(format!("the tool service at {} refused the job: {e:#}", self.dial)))?;
        let watcher = KillOnCancel::start(self.dial.clone(), id.clone(), ctx.cancel.clone());
        let followed = self.follow(&mut conn, &id, ctx.output, Some(ctx.cancel));
        drop(watcher);
        let status = followed.map_err(|e| self.gone(&id, &e))?;
        match status.as_str() {
            "done" => Self::receipt(&mut conn, &id).map_err(|e| self.gone(&id, &e)),
            "killed" => Err(ToolError::Cancelled),
            other => Err(ToolError::Other(other.strip_prefix("failed: ").unwrap_or(other).to_owned())),
        }
    }
}

/// While a call follows its job's output (a read that blocks until the job
/// writes or ends), a cancelled turn kills the job over a connection of its
/// own; the job then ends and the read returns.
struct KillOnCancel {
    finished: Arc<std::sync::atomic::AtomicBool>,
}

impl KillOnCancel {
    fn start(dial: Dial, id: String, cancel: CancelToken) -> Self {
        use std::sync::atomic::Ordering;
        let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = Arc::clone(&finished);
        // Without a thread the call is still correct, only not cancellable.
        let _ = std::thread::Builder::new().name("toolsrv-cancel".to_owned()).spawn(move || {
            while !done.load(Ordering::SeqCst) {
                if cancel.is_cancelled() {
                    if let Ok(mut conn) = Conn::dial(&dial) {
                        let _ = conn.write_file(&format!("jobs/{id}/ctl"), b"kill");
                    }
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        });
        Self { finished }
    }
}

impl Drop for KillOnCancel {
    fn drop(&mut self) {
        self.finished.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Write `job` to `jobs/new` and read its id on the same fid.
fn submit(conn: &mut Conn, job: &JobRequest) -> Result<String> {
    let (fid, _) = conn.walk("jobs/new")?;
    let result = (|| {
        conn.open(fid, mode::RDWR)?;
        conn.write_at(fid, 0, &serde_json::to_vec(job)?)?;
        let id = String::from_utf8(conn.read_at(fid, 0, 128)?)?.trim().to_owned();
        if id.is_empty() {
            bail!("jobs/new answered no job id");
        }
        Ok(id)
    })();
    let _ = conn.clunk(fid);
    result
}
