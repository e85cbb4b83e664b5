//! `cairn toolsrv` and its client side.
//!
//! The service (`run`): the tools `cairn run` would load (`crate::wiring::tool_entries`,
//! for the job's working directory, with the same sandbox, scrubbed
//! environment and limits) served as a 9P tree by `cairn_9p::toolsrv`, jobs
//! kept under `$CAIRN_HOME/toolsrv/jobs/`. The service has no person to ask:
//! a sandbox bypass is refused and a staged Destructive effect discarded by
//! core's gate (`cairn_core::turn::{decide_bypass, review_staged_effect}`),
//! and a call whose arguments raise its risk above the tool's declared risk
//! is refused (the agent approved the declared risk only).
//!
//! The agent side ([`turn_tools`], `offer`, [`RemoteTool`]): `--toolsrv
//! ADDR` (or `[tools] toolsrv`) offers the service's tools instead of
//! in-process ones; `turn_tools` is the one place that choice is made, and
//! reads a turn's tools once for discovery and the registry alike.
//! A remote call's job id is derived from the session and invocation ids
//! (`cairn_9p::toolsrv::job_id`), both committed in the intent entry before
//! the job is asked for, so a resumed turn finds the job (`guard`): still
//! running → waits for it; finished → settled from its receipt, never run
//! again; absent → it never started and runs now.
//!
//! Must not: hang on a dead service (a closed connection ends every wait
//! with a failed settlement naming the service), or run a job twice for one
//! invocation.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, Result, anyhow, bail};
use cairn_9p::client::{Conn, mode};
use cairn_9p::toolsrv::{JobRequest, Service, ToolHost, ToolServer, job_id};
use cairn_9p::{Dial, Limits};
use cairn_core::CancelToken;
use cairn_core::approval::{Allowlist, Answer, PolicyApprover};
use cairn_core::staged::StagedReview;
use cairn_core::tool::{
    GuardVerdict, ReplayPolicy, Tool, ToolContext, ToolError, ToolLimits, ToolReceipt, ToolRequest, ToolSpec,
    Validation,
};
use cairn_tools::{ExternalTool, MetadataError, ToolDirScan, ToolEntry, ToolsConfig, TrustStore};

use crate::context::{Context, exit};

/// The address of the tool service to use, if any (flag over config).
pub fn address(ctx: &Context) -> Option<String> {
    ctx.common.toolsrv.clone().or_else(|| ctx.settings.toolsrv.clone())
}

/// The CLI's tools as the service's [`ToolHost`]: the built-ins, and the
/// external tools of the tools directories (`cairn_tools::ToolDirScan`,
/// with `cairn run`'s directories, trust and configuration). Listing reads
/// file names only; a tool's metadata is parsed when its spec is asked for
/// or it runs, and kept until its file changes (size, mtime or inode).
struct CliToolHost {
    ctx: Context,
    /// Where `t/` lists tools for (the service's working directory).
    here: PathBuf,
    config: ToolsConfig,
    /// The built-ins, built once.
    builtins: Vec<ToolEntry>,
    /// Parsed external tools by metadata path.
    parsed: Mutex<HashMap<PathBuf, Parsed>>,
    /// Scan notes already told on stderr (each is told once).
    told: Mutex<HashSet<String>>,
}

/// One parsed metadata file and the file's state it was parsed from.
struct Parsed {
    stamp: Stamp,
    tool: Result<Arc<ExternalTool>, MetadataError>,
}

/// What says a file changed: size, modification time, inode.
type Stamp = (u64, Option<std::time::SystemTime>, u64);

/// Lock a mutex whatever a panicking holder left (caches only).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.len(), meta.modified().ok(), meta.ino()))
}

impl CliToolHost {
    /// The tools directories of `cwd`, scanned (names only).
    fn scan(&self, cwd: &Path) -> ToolDirScan {
        let mut notes = Vec::new();
        // An unreadable trust file trusts nothing (fails closed).
        let trust = TrustStore::load(&self.ctx.paths.trust_file()).unwrap_or_else(|e| {
            notes.push(format!("no workspace tools loaded: {e}"));
            TrustStore::empty()
        });
        let scan = ToolDirScan::scan(&self.ctx.paths.tool_dirs(cwd), &self.config, &trust);
        notes.extend(scan.scan_errors().iter().map(|e| format!("tool skipped: {e}")));
        notes.extend(scan.untrusted().iter().map(ToString::to_string));
        let mut told = lock(&self.told);
        for note in notes {
            if told.insert(note.clone()) {
                eprintln!("cairn toolsrv: {}", crate::render::escape_controls(&note));
            }
        }
        scan
    }

    /// The tool `name` for a job in `cwd` (or the listing's directory):
    /// a built-in, or the external tool parsed now unless its file is
    /// unchanged since it was last parsed.
    fn tool(&self, name: &str, cwd: &Path) -> Result<Option<Arc<dyn Tool>>, MetadataError> {
        if let Some(entry) = self.builtins.iter().find(|e| e.tool.spec().name == name) {
            return Ok(Some(Arc::clone(&entry.tool)));
        }
        let scan = self.scan(cwd);
        let Some(path) = scan.metadata_path(name) else { return Ok(None) };
        let now = stamp(path);
        let mut parsed = lock(&self.parsed);
        if let Some(p) = parsed.get(path).filter(|p| now.is_some() && Some(p.stamp) == now) {
            return p.tool.clone().map(|t| Some(t as Arc<dyn Tool>));
        }
        let tool = ExternalTool::load(path, &self.config).map(Arc::new);
        if let Some(stamp) = now {
            parsed.insert(path.to_path_buf(), Parsed { stamp, tool: tool.clone() });
        }
        tool.map(|t| Some(t as Arc<dyn Tool>))
    }
}

impl ToolHost for CliToolHost {
    fn names(&self) -> Vec<String> {
        let scan = self.scan(&self.here);
        let builtins = self.builtins.iter().map(|e| e.tool.spec().name.clone());
        builtins.chain(scan.names().into_iter().map(str::to_owned)).collect()
    }

    fn spec(&self, name: &str) -> std::result::Result<Option<ToolSpec>, String> {
        self.tool(name, &self.here).map(|t| t.map(|t| t.spec().clone())).map_err(|e| e.to_string())
    }

    fn run(
        &self,
        request: &ToolRequest,
        cwd: &Path,
        cancel: &CancelToken,
        output: &mut dyn FnMut(&[u8]),
    ) -> std::result::Result<ToolReceipt, String> {
        let tool = self
            .tool(&request.tool, cwd)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no tool {:?} for {}", request.tool, cwd.display()))?;
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
        let config = crate::wiring::session_config(&self.ctx);
        let limits = ToolLimits { timeout: config.tool_timeout, output_cap: config.output_cap };
        // Nobody answers here: core's gate refuses a bypass and a staged
        // Destructive effect (discarded, nothing applied) as in any
        // headless session; a staged Write effect is applied by policy.
        let mut nobody = PolicyApprover::new(Allowlist::new(), None);
        let approver = std::cell::RefCell::new(&mut nobody);
        let mut approve_bypass = |what: &str| {
            let verdict = cairn_core::turn::decide_bypass(request, cwd, risk, what, &mut **approver.borrow_mut());
            !matches!(verdict.decision, Answer::Deny { .. })
        };
        let mut review_staged = |review: &StagedReview<'_>| {
            cairn_core::turn::review_staged_effect(request, cwd, &mut **approver.borrow_mut(), review).0
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
        // A fresh home is made private (as `cairn serve` makes it): the
        // socket must live in a directory only its owner can enter.
        if !data.exists() {
            use std::os::unix::fs::DirBuilderExt as _;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&data)
                .with_context(|| format!("cannot create {}", data.display()))?;
        }
        dials.push(Dial::Unix(data.join("toolsrv.sock")));
    }
    let (listeners, addresses) = crate::listen::bind_all(&dials, insecure)?;
    let here = std::env::current_dir().context("cannot read the current directory")?;
    let config = crate::wiring::tools_config(&ctx);
    let builtins = cairn_tools::builtin_tools(&config).context("invalid [tools] destructive_patterns")?;
    let host = Arc::new(CliToolHost {
        ctx,
        here,
        config,
        builtins,
        parsed: Mutex::new(HashMap::new()),
        told: Mutex::new(HashSet::new()),
    });
    let service = Service::new(host, data.join("toolsrv").join("jobs"))?;
    let server = ToolServer::new(service, Limits::default());
    let stop = crate::listen::stop_signal()?;
    for listener in listeners {
        server.spawn(listener)?;
    }
    crate::listen::print_addresses(&addresses)?;
    let _ = stop.recv();
    crate::listen::remove_sockets(&addresses);
    Ok(exit::SUCCESS)
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

/// Whether a tool of the service is one of cairn's core tools (the
/// built-ins, always offered; discovery chooses among the others).
pub fn is_core(spec: &ToolSpec) -> bool {
    cairn_tools::builtin::BUILTIN_NAMES.contains(&spec.name.as_str())
}

/// The tools a session's turn may be offered, read once per turn: the tool
/// service's when one is configured ([`address`] — the one place that
/// choice is made), else the in-process ones. Discovery ranks from it and
/// the registry is filled from it (`equip::offer`), so a turn never
/// reads its tools twice nor decides twice where they come from.
#[derive(Debug)]
pub enum TurnTools {
    /// A tool service's tools.
    Service {
        /// Where the service is.
        dial: Dial,
        /// Its tools' specs.
        specs: Vec<ToolSpec>,
        /// Tools of the service skipped (unreadable meta).
        notes: Vec<String>,
        /// The session's hooks (they run here, not in the service).
        hooks: Option<std::sync::Arc<dyn cairn_core::hooks::Hooks>>,
    },
    /// The built-ins and external tools of the working directory.
    Local(crate::wiring::HostTools),
}

/// [`TurnTools::chosen`]: the tools, the hooks, the notes and the
/// untrusted-workspace notes.
pub type Chosen = (Vec<Arc<dyn Tool>>, Option<Arc<dyn cairn_core::hooks::Hooks>>, Vec<String>, Vec<String>);

impl TurnTools {
    /// The built-ins and, when `keep` is given (discovery's choice), only
    /// the other tools it names; with the hooks, the notes and the
    /// untrusted-workspace notes.
    pub fn chosen(&self, keep: Option<&BTreeSet<String>>) -> Chosen {
        match self {
            TurnTools::Service { dial, specs, notes, hooks } => {
                (remote_tools(dial, specs, keep), hooks.clone(), notes.clone(), Vec::new())
            }
            TurnTools::Local(local) => {
                let kept = local
                    .entries
                    .iter()
                    .filter(|e| {
                        e.origin == cairn_tools::ToolOrigin::Builtin
                            || keep.is_none_or(|k| k.contains(&e.tool.spec().name))
                    })
                    .map(|e| Arc::clone(&e.tool))
                    .collect();
                (kept, local.hooks.clone(), local.notes.clone(), local.untrusted.clone())
            }
        }
    }
}

/// Read the tools for a turn of a session in `cwd` (see [`TurnTools`]).
pub fn turn_tools(ctx: &Context, cwd: &Path) -> Result<TurnTools> {
    match address(ctx) {
        Some(address) => {
            let mut notes = Vec::new();
            let (dial, specs) = remote_specs(&address, &mut notes)?;
            Ok(TurnTools::Service { dial, specs, notes, hooks: crate::wiring::hooks(ctx, cwd) })
        }
        None => Ok(TurnTools::Local(crate::wiring::tool_entries(ctx, cwd)?)),
    }
}

/// A tool service's tools: the core ones and, when `keep` is given
/// (discovery's choice for the turn), only the others it names.
pub fn remote_tools(dial: &Dial, specs: &[ToolSpec], keep: Option<&BTreeSet<String>>) -> Vec<Arc<dyn Tool>> {
    specs
        .iter()
        .filter(|spec| keep.is_none_or(|k| is_core(spec) || k.contains(&spec.name)))
        .map(|spec| Arc::new(RemoteTool::new(spec.clone(), dial.clone())) as Arc<dyn Tool>)
        .collect()
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
