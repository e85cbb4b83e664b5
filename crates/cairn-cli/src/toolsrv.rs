//! `cairn toolsrv` and its client side.
//!
//! The service (`run`): the tools `cairn run` would load (`host::tool_entries`,
//! for the job's working directory, with the same sandbox, scrubbed
//! environment and limits) served as a 9P tree by `cairn_9p::toolsrv`, jobs
//! kept under `$CAIRN_HOME/toolsrv/jobs/`. The service has no person to ask:
//! a sandbox bypass is refused, a staged Destructive effect is discarded,
//! and a call whose arguments raise its risk above the tool's declared risk
//! is refused (the agent approved the declared risk only).
//!
//! The agent side (`offer`, [`RemoteTool`]): `--toolsrv ADDR` (or
//! `[tools] toolsrv`) offers the service's tools instead of in-process ones.
//! A remote call's job id is derived from the session and invocation ids
//! (`cairn_9p::toolsrv::job_id`), both committed in the intent entry before
//! the job is asked for, so a resumed turn finds the job (`guard`): still
//! running → waits for it; finished → settled from its receipt, never run
//! again; absent → it never started and runs now.
//!
//! Must not: hang on a dead service (a closed connection ends every wait
//! with a failed settlement naming the service), or run a job twice for one
//! invocation.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, Result, anyhow, bail};
use cairn_9p::client::{Conn, mode};
use cairn_9p::toolsrv::{JobRequest, Service, ToolHost, ToolServer, job_id};
use cairn_9p::{Dial, Limits};
use cairn_core::staged::{StagedDecision, StagedReview};
use cairn_core::tool::{
    GuardVerdict, ReplayPolicy, Risk, Tool, ToolContext, ToolError, ToolLimits, ToolReceipt, ToolRequest, ToolSpec,
    Validation,
};
use cairn_core::{CancelToken, ToolRegistry};

use crate::context::{Context, exit};

/// The address of the tool service to use, if any (flag over config).
pub fn address(ctx: &Context) -> Option<String> {
    ctx.common.toolsrv.clone().or_else(|| ctx.settings.toolsrv.clone())
}

/// The CLI's tool loading as the service's [`ToolHost`].
struct CliToolHost {
    ctx: Context,
    /// Where `t/` lists tools for (the service's working directory).
    here: PathBuf,
}

impl ToolHost for CliToolHost {
    fn specs(&self) -> Vec<ToolSpec> {
        match crate::host::tool_entries(&self.ctx, &self.here) {
            Ok(tools) => {
                for note in tools.notes.iter().chain(&tools.untrusted) {
                    eprintln!("cairn toolsrv: {}", crate::render::escape_controls(note));
                }
                tools.entries.iter().map(|e| e.tool.spec().clone()).collect()
            }
            Err(e) => {
                eprintln!("cairn toolsrv: no tools: {e:#}");
                Vec::new()
            }
        }
    }

    fn run(
        &self,
        request: &ToolRequest,
        cwd: &Path,
        cancel: &CancelToken,
        output: &mut dyn FnMut(&[u8]),
    ) -> std::result::Result<ToolReceipt, String> {
        let tools = crate::host::tool_entries(&self.ctx, cwd).map_err(|e| format!("{e:#}"))?;
        let entry = tools
            .entries
            .into_iter()
            .find(|e| e.tool.spec().name == request.tool)
            .ok_or_else(|| format!("no tool {:?} for {}", request.tool, cwd.display()))?;
        let tool = entry.tool;
        if let Validation::Invalid(why) = tool.validate(request) {
            return Err(format!("invalid arguments: {why}"));
        }
        let risk = tool.risk(&request.arguments);
        if risk > tool.spec().risk {
            return Err(format!(
                "this call is {risk:?} ({}), above the {:?} the agent approved for {}; the tool service runs no call \
                 a person has not approved — run it in-process (without --toolsrv) to be asked",
                risk.tier(),
                tool.spec().risk,
                request.tool
            ));
        }
        let config = crate::host::session_config(&self.ctx);
        let limits = ToolLimits { timeout: config.tool_timeout, output_cap: config.output_cap };
        let mut approve_bypass = |_: &str| false;
        let mut review_staged = |review: &StagedReview<'_>| {
            if review.judgement.risk >= Risk::Destructive {
                StagedDecision::Discard {
                    reason: format!(
                        "the staged effect is Destructive and the tool service has no one to ask: {}",
                        review.judgement.reasons.join("; ")
                    ),
                }
            } else {
                StagedDecision::Apply { by: "toolsrv".to_owned() }
            }
        };
        let mut ctx = ToolContext {
            cwd,
            cancel,
            limits,
            output,
            approve_bypass: &mut approve_bypass,
            review_staged: &mut review_staged,
        };
        tool.execute(request, &mut ctx).map_err(|e| e.to_string())
    }
}

/// `cairn toolsrv`.
pub fn run(ctx: Context, listen: &[String], insecure: bool) -> Result<u8> {
    let data = ctx.paths.data.clone();
    let mut dials = listen.iter().map(|d| Dial::parse(d)).collect::<Result<Vec<_>>>()?;
    if dials.is_empty() {
        std::fs::create_dir_all(&data).with_context(|| format!("cannot create {}", data.display()))?;
        dials.push(Dial::Unix(data.join("toolsrv.sock")));
    }
    let (listeners, addresses) = crate::serve::bind_all(&dials, insecure)?;
    let here = std::env::current_dir().context("cannot read the current directory")?;
    let host = Arc::new(CliToolHost { ctx, here });
    let service = Service::new(host, data.join("toolsrv").join("jobs"))?;
    let server = ToolServer::new(service, Limits::default());
    let stop = crate::serve::stop_signal()?;
    for listener in listeners {
        server.spawn(listener)?;
    }
    crate::serve::print_addresses(&addresses)?;
    let _ = stop.recv();
    crate::serve::remove_sockets(&addresses);
    Ok(exit::SUCCESS)
}

/// Register the tools of the service at `address` in `registry`.
pub fn offer(address: &str, registry: &mut ToolRegistry, notes: &mut Vec<String>) -> Result<()> {
    let dial = Dial::parse(address).context("--toolsrv / [tools] toolsrv")?;
    let mut conn = Conn::dial(&dial)
        .with_context(|| format!("the tool service at {dial} is unreachable (start it with `cairn toolsrv`)"))?;
    for entry in conn.list("t").with_context(|| format!("cannot list t/ on the tool service at {dial}"))? {
        let meta = conn.read_file(&format!("t/{}/meta", entry.name))?;
        let spec: ToolSpec = match serde_json::from_slice(&meta) {
            Ok(spec) => spec,
            Err(e) => {
                notes.push(format!(
                    "tool {} of the tool service skipped: its meta is not a tool spec ({e})",
                    entry.name
                ));
                continue;
            }
        };
        let name = spec.name.clone();
        if let Err(e) = registry.register(Arc::new(RemoteTool::new(spec, dial.clone()))) {
            notes.push(format!("tool {name} not offered: {e}"));
        }
    }
    Ok(())
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
