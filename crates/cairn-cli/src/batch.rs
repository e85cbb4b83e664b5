//! `cairn batch SPEC...`: put batch specs (files, or `-` for stdin) in the
//! durable queue of this `$CAIRN_HOME` and run the queue until they end,
//! printing each job's status and answers. The queue itself (spec format,
//! job directories, exactly-once units) is cairn-9p's `batch.rs`, the same
//! one `cairn serve` exposes as `b/`; this module only wires it to the CLI.
//!
//! Owns: reading `[batch]` (`max_running`, default 2). Must not: run the
//! queue while `cairn serve` runs it (the serve lock is taken first).

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, Result, bail};
use cairn_9p::Host as _;
use cairn_9p::batch::Batch;

use crate::hosting::RuntimeHost;
use crate::invocation::{Invocation, exit};
use crate::render::escape_controls;
use crate::serve::ServeLock;

fn read_spec(path: &Path) -> Result<String> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("cannot read a spec from stdin")?;
        return Ok(text);
    }
    std::fs::read_to_string(path).with_context(|| format!("cannot read the spec {}", path.display()))
}

/// `cairn batch`.
pub fn run(ctx: Invocation, specs: &[PathBuf]) -> Result<u8> {
    let data = ctx.paths.data.clone();
    std::fs::create_dir_all(&data).with_context(|| format!("cannot create {}", data.display()))?;
    let _lock = ServeLock::take(&data)?;
    // Read every spec before queueing any, so a bad one queues nothing.
    let texts = specs.iter().map(|p| read_spec(p)).collect::<Result<Vec<_>>>()?;
    for (text, path) in texts.iter().zip(specs) {
        cairn_9p::batch::BatchSpec::parse(text).with_context(|| format!("spec {}", path.display()))?;
    }
    let host = Arc::new(RuntimeHost { ctx: ctx.setup });
    let (dir, max) = (host.batch_dir(), host.batch_max_running());
    let batch = Batch::open(host, dir, max)?;
    let mut jobs = Vec::new();
    for (text, path) in texts.iter().zip(specs) {
        let job = batch.submit(text).with_context(|| format!("spec {}", path.display()))?;
        eprintln!("cairn batch: {} queued as job {job}", path.display());
        jobs.push(job);
    }
    if jobs.is_empty() {
        // No spec: finish what an earlier run or server left queued.
        jobs = batch.jobs();
    }
    let mut code = exit::SUCCESS;
    let mut out = std::io::stdout().lock();
    for job in &jobs {
        let status = batch.wait(job)?;
        if status != "done" {
            code = exit::ERROR;
        }
        writeln!(out, "job {job}: {}", escape_controls(&status))?;
        write!(out, "{}", escape_controls(&batch.result(job)?))?;
        out.flush()?;
    }
    batch.shutdown();
    if jobs.is_empty() {
        bail!("nothing to run: give spec files (key=value lines, `---`, the prompt), or `-` for stdin");
    }
    Ok(code)
}
