//! The commands over a PostgreSQL database (`--database URL`, or
//! `database = "postgres://…"` in the config): `cairn worker`, `cairn
//! submit`, `cairn approvals`/`approve`, `cairn show/log`, `cairn export`
//! and `cairn import` (`cairn sessions` and `cairn undo`/`redo` are one
//! command each for every backend: the runtime's `sessions::listing` and
//! `undo::rewind`, printed by `state.rs`).
//!
//! It only wires: storage, leases and the worker loop are cairn-pg; the
//! turn is cairn-core's, with this host's provider and tools (as `cairn
//! run` builds them) and a headless approver — the allowlist from the
//! config and flags, then a durable question answered with `cairn approve`
//! from any host — so a Destructive call is never run by a worker. `show` and `log` export the session to a temporary JSONL file
//! and print it with the very same code as for a session file.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context as _, Result, bail};
use cairn_core::storage::{Header, Storage, new_session_id};
use cairn_pg::approvals;
use cairn_pg::worker::WorkerOptions;
use cairn_pg::{PgStore, lease};
use postgres::Client;

use crate::invocation::{Invocation, exit};
use crate::render::escape_controls;
use cairn_runtime::redact::redact;

use crate::parts::database_url as url;

fn client(ctx: &Invocation) -> Result<Client> {
    let url = url(ctx)?;
    connect_shown(&url)
}

use crate::parts::connect_database as connect_shown;

/// A session id from an exact id or a unique prefix (cairn-pg's
/// `catalog::resolve`, with core's prefix rule, as for session files).
fn resolve(client: &mut Client, target: &str) -> Result<String> {
    Ok(cairn_pg::catalog::resolve(client, target)?)
}

/// `--lease SECS` as `cairn worker` takes it (checked at argument parsing
/// by cairn-pg's rule, so an out-of-range lease is a usage error).
pub fn lease_secs(text: &str) -> Result<u64, String> {
    let secs: u64 = text.trim().parse().map_err(|e| format!("{e}; give a whole number of seconds"))?;
    cairn_pg::lease::lease_from_secs(secs).map(|_| secs).map_err(|e| e.to_string())
}

/// `cairn worker`.
pub fn worker(ctx: Invocation, concurrency: usize, lease_secs: u64) -> Result<u8> {
    let url = url(&ctx)?;
    // Fail early on a bad URL or a newer schema.
    drop(connect_shown(&url)?);
    let mut opts = WorkerOptions::new(url.clone());
    opts.concurrency = concurrency.max(1);
    opts.lease = cairn_pg::lease::lease_from_secs(lease_secs)?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        // Ctrl-C: finish the turns in hand, release their leases, leave.
        let _ = ctrlc::set_handler(move || {
            if stop.swap(true, Ordering::SeqCst) {
                std::process::exit(i32::from(exit::CANCELLED));
            }
            eprintln!("cairn worker: stopping after the running turns (Ctrl-C again to leave now)");
        });
    }
    eprintln!(
        "cairn worker {}: driving sessions from {} ({} at a time, {} s leases)",
        opts.name,
        redact(&url),
        opts.concurrency,
        opts.lease.as_secs()
    );
    cairn_pg::worker::run(&opts, Arc::new(crate::hosting::RuntimeHost { ctx: ctx.setup }), stop)?;
    Ok(exit::SUCCESS)
}

/// `cairn submit`.
///
/// The worker that claims the session owns how it runs: its provider and
/// model (it holds the keys), its allow rules and `--yes`. A flag that
/// would say otherwise here is refused, never silently ignored.
pub fn submit(
    ctx: &Invocation,
    session: Option<&str>,
    prompt: Option<String>,
    prompt_file: Option<&Path>,
) -> Result<u8> {
    let c = &ctx.flags;
    let ignored: Vec<&str> = [
        ("--provider", c.provider.is_some()),
        ("--model", c.model.is_some()),
        ("--script", c.script.is_some()),
        ("--allow", !c.allow.is_empty()),
        ("--yes", c.yes),
    ]
    .into_iter()
    .filter_map(|(flag, given)| given.then_some(flag))
    .collect();
    if !ignored.is_empty() {
        bail!(
            "cairn submit does not take {}: the worker that runs the session decides its provider, model, allow rules and --yes \
             (it holds the keys); give them to `cairn worker` (or its config) instead, and submit only the prompt",
            ignored.join(", ")
        );
    }
    if session.is_some_and(|s| s.trim().is_empty()) {
        bail!(
            "--session is empty (an unset variable?); give a session id or prefix, or leave --session out to start a new session"
        );
    }
    // `-` alone is standard input, as for --prompt-file (a prompt of "-"
    // is never what was meant); a long prompt goes through a file or stdin
    // rather than the argument list.
    let (prompt, prompt_file) = match prompt.as_deref() {
        Some("-") => (None, Some(Path::new("-"))),
        _ => (prompt, prompt_file),
    };
    if prompt.is_none() && prompt_file.is_none() {
        bail!("no prompt: give one (`cairn submit \"…\"`), or --prompt-file FILE, or - for standard input");
    }
    let prompt = crate::turns::read_prompt(prompt, prompt_file)?;
    let prompt = prompt.as_str();
    let mut client = client(ctx)?;
    let id = match session {
        Some(target) => resolve(&mut client, target)?,
        None => {
            let cwd = match &ctx.common.cwd {
                Some(dir) => dir.clone(),
                None => std::env::current_dir().context("cannot read the current directory")?,
            };
            let cwd = cwd.canonicalize().with_context(|| format!("--cwd {}: no such directory", cwd.display()))?;
            let header = Header::new(new_session_id(), cwd.display().to_string());
            let id = header.id.clone();
            let mut store = PgStore::create(client, header)?;
            if let Some(name) = &ctx.common.name {
                store.commit(cairn_core::storage::Transaction::new().set_session_name(name)?)?;
            }
            client = store.into_client();
            id
        }
    };
    lease::submit(&mut client, &id, prompt)?;
    if ctx.flags.json {
        println!(
            "{}",
            crate::render::escape_json(&serde_json::json!({"type": "submitted", "sessionId": id}).to_string())
        );
    } else {
        println!("{}", escape_controls(&id));
    }
    Ok(exit::SUCCESS)
}

/// Export `target` into a temporary session file for the file commands.
fn exported(ctx: &Invocation, target: &str) -> Result<(tempfile::TempDir, PathBuf)> {
    let mut client = client(ctx)?;
    let id = resolve(&mut client, target)?;
    let bytes = cairn_pg::export(&mut client, &id)?;
    let dir = tempfile::tempdir().context("cannot create a temporary directory")?;
    // A fixed name: an id is data from the database, never a path.
    let path = dir.path().join("session.jsonl");
    std::fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    Ok((dir, path))
}

/// `cairn show --database` (and `--tools`, `--all`).
pub fn show(ctx: &Invocation, target: &str, tools: bool, all: bool) -> Result<u8> {
    let (_dir, path) = exported(ctx, target)?;
    if tools { crate::commands::show_tools(ctx, &path) } else { crate::commands::show(ctx, &path, all) }
}

/// `cairn log --database`.
pub fn log(ctx: &Invocation, target: &str, follow: bool) -> Result<u8> {
    if follow {
        bail!("cairn log --follow reads a session file; with --database, run it again to see new records");
    }
    let (_dir, path) = exported(ctx, target)?;
    crate::commands::log(ctx, &path, false)
}

/// `cairn export ID`: the session as a JSONL file on stdout, byte for byte
/// what the JSONL backend writes.
pub fn export(ctx: &Invocation, target: &str) -> Result<u8> {
    let mut client = client(ctx)?;
    let id = resolve(&mut client, target)?;
    let bytes = cairn_pg::export(&mut client, &id)?;
    let mut out = std::io::stdout().lock();
    out.write_all(&bytes)?;
    out.flush()?;
    Ok(exit::SUCCESS)
}

/// `cairn import FILE`: a session file into the database (replayed and
/// checked first; refused when the id exists).
pub fn import(ctx: &Invocation, file: &Path, cwd: Option<&Path>) -> Result<u8> {
    // The directory must exist here (turns run in it); stored absolute.
    let cwd = match cwd {
        None => None,
        Some(dir) => {
            let abs = std::fs::canonicalize(dir).with_context(|| {
                format!("--cwd {}: no such directory here", escape_controls(&dir.display().to_string()))
            })?;
            if !abs.is_dir() {
                bail!("--cwd {}: not a directory", escape_controls(&dir.display().to_string()));
            }
            let text = abs.to_str().map(str::to_owned);
            Some(text.with_context(|| format!("--cwd {}: the path is not UTF-8", abs.display()))?)
        }
    };
    let bytes = if file == Path::new("-") {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf).context("cannot read stdin")?;
        buf
    } else {
        std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?
    };
    let mut client = client(ctx)?;
    let max_line = ctx.settings.max_line_bytes.value;
    let imported = cairn_pg::import_with(&mut client, &bytes, max_line, cwd.as_deref())
        .with_context(|| format!("cannot import {}", escape_controls(&file.display().to_string())))?;
    if !imported.settled.is_empty() {
        eprintln!(
            "cairn import: the file left {} tool call(s) unsettled ({}); they were settled without running them (failed-uncertain, or rejected if not yet approved): an approval recorded elsewhere is not trusted",
            imported.settled.len(),
            escape_controls(&imported.settled.join(", "))
        );
    }
    // Escaped as the worker prints ids (a newline as `\n`), never raw.
    println!("{}", imported.id.escape_debug());
    let here = Path::new(&imported.cwd).is_dir();
    eprintln!(
        "cairn import: session {} works in {}{}",
        imported.id.escape_debug(),
        imported.cwd.escape_debug(),
        if here {
            "; import it with --cwd DIR to have it work elsewhere".to_owned()
        } else {
            " — no such directory here: its turns will fail until it exists; import it with --cwd DIR instead"
                .to_owned()
        }
    );
    Ok(exit::SUCCESS)
}

/// `cairn approvals`: the questions waiting for a person.
pub fn approvals(ctx: &Invocation) -> Result<u8> {
    let mut client = client(ctx)?;
    let all = approvals::pending(&mut client)?;
    let mut out = std::io::stdout().lock();
    if ctx.flags.json {
        for p in &all {
            let line = serde_json::json!({"sessionId": p.session, "invocationId": p.invocation, "tool": p.tool,
                "arguments": p.arguments, "askedAt": p.asked_at});
            writeln!(out, "{}", crate::render::escape_json(&line.to_string()))?;
        }
        return Ok(exit::SUCCESS);
    }
    if all.is_empty() {
        writeln!(out, "no approvals waiting")?;
    }
    for p in &all {
        writeln!(
            out,
            "{}  {}  {}  {}({})\n    answer: cairn approve {} {} [--deny REASON]",
            p.asked_at,
            escape_controls(&p.session),
            escape_controls(&p.invocation),
            escape_controls(&p.tool),
            escape_controls(&p.arguments),
            escape_controls(&p.session),
            escape_controls(&p.invocation)
        )?;
    }
    Ok(exit::SUCCESS)
}

/// `cairn workers`: each registered worker's host and pid, heartbeat age,
/// sessions held, and the leases it lost with why (`--json`: one object a
/// line).
pub fn workers(ctx: &Invocation) -> Result<u8> {
    let mut client = client(ctx)?;
    let all = cairn_pg::fleet::workers(&mut client)?;
    let mut out = std::io::stdout().lock();
    let state = |w: &cairn_pg::fleet::Worker| {
        if w.stopped {
            "stopped"
        } else if w.heartbeat_age_ms > w.lease_ms.max(1000) * 3 {
            // No heartbeat for three leases: killed, or cut off.
            "silent"
        } else if w.draining {
            "draining"
        } else {
            "alive"
        }
    };
    if ctx.flags.json {
        for w in &all {
            let losses: Vec<serde_json::Value> = w
                .recent_losses
                .iter()
                .map(|l| serde_json::json!({"sessionId": l.session, "epoch": l.epoch, "reason": l.reason, "at": l.at}))
                .collect();
            let line = serde_json::json!({"type": "worker", "name": w.name, "host": w.host, "pid": w.pid,
                "state": state(w), "concurrency": w.concurrency, "leaseMs": w.lease_ms, "startedAt": w.started,
                "heartbeatAgeMs": w.heartbeat_age_ms, "held": w.held, "draining": w.draining,
                "leaseLosses": w.losses, "recentLosses": losses});
            writeln!(out, "{}", crate::render::escape_json(&line.to_string()))?;
        }
        return Ok(exit::SUCCESS);
    }
    if all.is_empty() {
        writeln!(out, "no workers have registered in this database; start one with `cairn worker --database URL`")?;
        return Ok(exit::SUCCESS);
    }
    writeln!(
        out,
        "{}",
        ctx.out_style.bold(&format!(
            "{:<32}  {:>8}  {:<8}  {:>10}  {:>4}  {:>6}  STARTED",
            "WORKER", "PID", "STATE", "HEARTBEAT", "HELD", "LOSSES"
        ))
    )?;
    for w in &all {
        writeln!(
            out,
            "{:<32}  {:>8}  {:<8}  {:>8.1} s  {:>4}  {:>6}  {}",
            escape_controls(&w.name),
            w.pid,
            state(w),
            w.heartbeat_age_ms as f64 / 1000.0,
            w.held,
            w.losses,
            w.started
        )?;
        for l in &w.recent_losses {
            writeln!(
                out,
                "    lost {} (epoch {}) at {}: {}",
                escape_controls(&l.session),
                l.epoch,
                l.at,
                escape_controls(&l.reason)
            )?;
        }
    }
    Ok(exit::SUCCESS)
}

/// `cairn requeue ID`: a failed session back in the queue.
pub fn requeue(ctx: &Invocation, target: &str) -> Result<u8> {
    let mut client = client(ctx)?;
    let id = resolve(&mut client, target)?;
    let done = cairn_pg::fleet::requeue(&mut client, &id)?;
    eprintln!(
        "cairn requeue: session {} is queued ({} prompt(s) waiting); a worker resumes it",
        escape_controls(&id),
        done.waiting
    );
    Ok(exit::SUCCESS)
}

/// `cairn cancel ID`: stop a session (its prompts dropped, a running turn
/// told to stop).
pub fn cancel(ctx: &Invocation, target: &str) -> Result<u8> {
    let mut client = client(ctx)?;
    let id = resolve(&mut client, target)?;
    let by = format!("cli:{}", std::env::var("USER").unwrap_or_else(|_| "cli".to_owned()));
    match cairn_pg::fleet::cancel(&mut client, &id, &by)? {
        cairn_pg::fleet::Cancelled::Stopped { dropped } => {
            eprintln!("cairn cancel: session {} is idle; {dropped} waiting prompt(s) dropped", escape_controls(&id))
        }
        cairn_pg::fleet::Cancelled::Asked { holder } => eprintln!(
            "cairn cancel: worker {} is told to stop the turn of session {} at its next renewal; its waiting prompts are dropped then",
            escape_controls(&holder),
            escape_controls(&id)
        ),
    }
    Ok(exit::SUCCESS)
}

/// `cairn approve SESSION INVOCATION [--deny REASON]`.
pub fn approve(ctx: &Invocation, session: &str, invocation: &str, deny: Option<&str>) -> Result<u8> {
    let mut client = client(ctx)?;
    let id = resolve(&mut client, session)?;
    let by = std::env::var("USER").unwrap_or_else(|_| "cli".to_owned());
    if !approvals::answer(&mut client, &id, invocation, deny.is_none(), deny, &format!("cli:{by}"))? {
        bail!(
            "no approval of {invocation:?} is waiting in session {id} (unknown, or answered already); list them with `cairn approvals`"
        );
    }
    Ok(exit::SUCCESS)
}
