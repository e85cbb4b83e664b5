//! `cairn toolsrv`: the tools `cairn run` would load (`tools::in_process`,
//! for the job's working directory, with the same sandbox, scrubbed
//! environment and limits) served as a 9P tree by `cairn_9p::toolsrv`, jobs
//! kept under `$CAIRN_HOME/toolsrv/jobs/`. The service has no person to ask:
//! a sandbox bypass is refused and a staged Destructive effect discarded by
//! core's gate (`cairn_core::turn::{decide_bypass, review_staged_effect}`),
//! and a call whose arguments raise its risk above the tool's declared risk
//! is refused (the agent approved the declared risk only).
//!
//! The agent side (the session's tools read from a service) is the
//! runtime's `cairn_runtime::toolsrv`.
//!
//! Must not: ask a person, or run a tool outside the sandbox the agent's
//! own `cairn run` would use.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, Result};
use cairn_9p::toolsrv::{Service, ToolHost, ToolServer};
use cairn_9p::{Dial, Limits};
use cairn_core::CancelToken;
use cairn_core::approval::{Allowlist, Answer, PolicyApprover};
use cairn_core::staged::StagedReview;
use cairn_core::tool::{Tool, ToolContext, ToolLimits, ToolReceipt, ToolRequest, ToolSpec, Validation};
use cairn_tools::{ExternalTool, MetadataError, ToolDirScan, ToolEntry, ToolsConfig, TrustStore};

use crate::invocation::{Invocation, exit};

/// The CLI's tools as the service's [`ToolHost`]: the built-ins, and the
/// external tools of the tools directories (`cairn_tools::ToolDirScan`,
/// with `cairn run`'s directories, trust and configuration). Listing reads
/// file names only; a tool's metadata is parsed when its spec is asked for
/// or it runs, and kept until its file changes (size, mtime or inode).
struct CliToolHost {
    ctx: Invocation,
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
        let config = crate::parts::session_config(&self.ctx);
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
            elicit: &mut |_, _| cairn_core::elicit::nobody(),
        };
        tool.execute(request, &mut ctx).map_err(|e| e.to_string())
    }
}

/// `cairn toolsrv`.
pub fn run(ctx: Invocation, listen: &[String], insecure: bool) -> Result<u8> {
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
    let config = cairn_runtime::tools::tools_config(&ctx);
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
