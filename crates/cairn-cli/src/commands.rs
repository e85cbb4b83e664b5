//! The commands that inspect or configure rather than run a turn.
//!
//! Everything they print from a session file (ids, names, paths, messages,
//! arguments, tool output) passes through cairn-runtime's
//! `escape::escape_controls` (or `escape_json` for JSON; `render` re-exports
//! both), like the live output of a turn.

use std::io::Write;
use std::path::Path;

use anyhow::Result;
use cairn_core::approval::Answer;
use cairn_core::projection::{LifecycleCheck, LifecycleReader, ToolInvocationRecord, ToolInvocationStatus, ToolState};
use cairn_core::storage::Storage;
use cairn_core::storage::{EntryView, JsonlStore, Tail, check_file_read, format_record};

use crate::invocation::{Invocation, exit};
use crate::render::{escape_controls as esc, escape_json};
use crate::sessions::{format_time, human_size};

/// `cairn config`: every setting of every section, its value and where it
/// came from (docs/config.md describes each key).
pub fn config(ctx: &Invocation) -> Result<u8> {
    let mut out = std::io::stdout().lock();
    let found = if ctx.settings.config_file_found { "" } else { " (not present)" };
    writeln!(out, "config file: {}{found}", ctx.settings.config_file.display())?;
    writeln!(out, "data directory: {}", ctx.paths.data.display())?;
    writeln!(out, "sessions: {}", ctx.paths.sessions().display())?;
    let rows = ctx.settings.rows();
    let width = rows.iter().map(|(k, _, _)| k.len()).max().unwrap_or(0);
    for (key, value, source) in rows {
        writeln!(out, "{key:width$}  {value}  {}", ctx.out_style.dim(&format!("({source})")))?;
    }
    Ok(exit::SUCCESS)
}

/// One line describing an entry for `cairn show`.
fn describe_entry(entry: EntryView<'_>) -> String {
    use cairn_core::events::{
        EntryPayload, EntryType, ToolFailedPayload, ToolRejectedPayload, ToolRequestedPayload, ToolStartedPayload,
    };
    // The payload read as `P` when the entry is of `P`'s type
    // (`events::payload_of` for a view).
    fn payload_of<P: EntryPayload>(entry: EntryView<'_>) -> Option<P> {
        (entry.entry_type == P::TYPE.tag()).then(|| serde_json::from_str::<P>(entry.payload).ok()).flatten()
    }
    let text = |t: &str| crate::render::short(t, 100);
    let Some(kind) = EntryType::of(entry.entry_type) else {
        // Written by a newer cairn: shown by its tag.
        return entry.entry_type.to_owned();
    };
    match kind {
        EntryType::Message => match cairn_core::turn::entry_view_message(entry) {
            Some(message) => {
                let role = format!("{:?}", message.role).to_lowercase();
                let calls: Vec<&str> = message.tool_calls().map(|c| c.name.as_str()).collect();
                let body = message.joined_text();
                let mut line = format!("{role}: {}", text(body.trim()));
                if !calls.is_empty() {
                    line.push_str(&format!(" [calls {}]", calls.join(", ")));
                }
                line
            }
            None => "message".to_owned(),
        },
        EntryType::Compaction => match payload_of::<cairn_core::events::CompactionPayload>(entry) {
            Some(p) => format!(
                "compaction: summary of {} messages through {} by {}/{}: {}",
                p.messages,
                p.last_entry,
                p.provider,
                p.model,
                text(p.summary.trim())
            ),
            None => "compaction".to_owned(),
        },
        EntryType::Undo => match payload_of::<cairn_core::undo::UndoPayload>(entry) {
            Some(p) => format!(
                "{} planned: {} effect(s), {} path(s), lane {} to {}{}",
                if p.direction == cairn_core::undo::UndoDirection::Undo { "undo" } else { "redo" },
                p.invocations.len(),
                p.steps.len(),
                p.lane,
                p.to_entry.as_deref().unwrap_or("its start"),
                if p.forced.is_empty() { String::new() } else { format!(" (forced over {} path(s))", p.forced.len()) }
            ),
            None => "undo".to_owned(),
        },
        EntryType::UndoApplied => match payload_of::<cairn_core::undo::UndoAppliedPayload>(entry) {
            Some(p) => format!(
                "{} {} applied: {} path(s)",
                if p.direction == cairn_core::undo::UndoDirection::Undo { "undo" } else { "redo" },
                p.undo,
                p.paths
            ),
            None => "undo applied".to_owned(),
        },
        EntryType::ToolRequested => match payload_of::<ToolRequestedPayload>(entry) {
            Some(p) => format!(
                "tool requested: {} {} ({})",
                p.request.tool,
                text(&p.request.arguments.to_string()),
                p.invocation_id
            ),
            None => "tool requested".to_owned(),
        },
        EntryType::ToolStarted => match payload_of::<ToolStartedPayload>(entry) {
            Some(p) => format!("tool started: {} (approved by {})", p.tool, p.verdict.by),
            None => "tool started".to_owned(),
        },
        // Read through a shape that accepts what `ToolCompletedPayload`
        // accepts and keeps only the output's start (not its copy).
        EntryType::ToolCompleted => match cairn_core::tool_completed_line(entry.payload) {
            Some(p) => format!("tool completed: {} exit {} — {}", p.tool, p.exit_code, text(&p.output_start)),
            None => "tool completed".to_owned(),
        },
        EntryType::ToolFailed => match payload_of::<ToolFailedPayload>(entry) {
            Some(p) => {
                format!("tool {}: {} — {}", if p.uncertain { "uncertain" } else { "failed" }, p.tool, text(&p.reason))
            }
            None => "tool failed".to_owned(),
        },
        EntryType::ToolRejected => match payload_of::<ToolRejectedPayload>(entry) {
            Some(p) => format!("tool rejected: {} — {}", p.tool, text(&p.reason)),
            None => "tool rejected".to_owned(),
        },
        EntryType::ToolBypass => match payload_of::<cairn_core::events::ToolBypassPayload>(entry) {
            Some(p) => format!("sandbox bypass asked: {} — {}", p.tool, text(&p.bypass.what)),
            None => "sandbox bypass".to_owned(),
        },
        EntryType::ToolStaged => match payload_of::<cairn_core::events::ToolStagedPayload>(entry) {
            Some(p) => {
                format!("staged effect: {} — {} (approved by {})", p.tool, text(&p.change_set.listing()), p.verdict.by)
            }
            None => "staged effect".to_owned(),
        },
        EntryType::TurnCancelled => "turn cancelled".to_owned(),
        EntryType::TurnEnded => "turn ended".to_owned(),
    }
}

/// `cairn show`: the tree, its branches, and each lane's head.
pub fn show(ctx: &Invocation, path: &Path, all: bool) -> Result<u8> {
    let store = JsonlStore::open_read_only_with(path, ctx.settings.store_options())?;
    let header = store.header().clone();
    let index = store.index();
    let mut heads: std::collections::HashMap<String, Vec<String>> = std::collections::HashMap::new();
    for (lane, value) in index.registers("lane") {
        if let Ok(head) = value.parse::<String>() {
            heads.entry(head).or_default().push(lane.to_owned());
        }
    }
    // One write per 64 KiB, not per line (a long session is 200k lines).
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, std::io::stdout().lock());
    let s = &ctx.out_style;
    writeln!(out, "{} {}", s.bold("session"), esc(&header.id))?;
    writeln!(out, "  cwd {}  created {}", esc(&header.cwd), format_time(header.created_at))?;
    let mut lanes: Vec<(String, String)> =
        index.registers("lane").map(|(k, v)| (k.to_owned(), v.parse::<String>().unwrap_or_default())).collect();
    lanes.sort();
    for (lane, head) in &lanes {
        writeln!(out, "  lane {} → {}", s.bold(&esc(lane)), esc(head))?;
    }
    if let Some(line) = crate::compaction::context_line(ctx, &store) {
        writeln!(out, "  {}", esc(&line))?;
    }
    writeln!(out, "  {}", esc(&crate::subagents::usage_line(ctx, &store)))?;
    writeln!(out)?;
    // Entries a compaction summary covers fold into one line unless --all.
    let covered = if all { Default::default() } else { crate::compaction::covered(index) };
    // Walk the tree depth-first; a chain continues at the same indent, and
    // only a branch point indents, so long linear sessions stay flat.
    let mut stack: Vec<(EntryView<'_>, String, bool)> =
        index.children_views(None).into_iter().rev().map(|e| (e, String::new(), false)).collect();
    while let Some((entry, indent, branch)) = stack.pop() {
        let marker = if branch { "├─ " } else { "" };
        if covered.contains_key(entry.id) {
            // Fold the covered chain, stopping at a branch point or a lane head.
            let (mut last, mut n) = (entry, 1usize);
            loop {
                let mut children = index.children_views(Some(last.id));
                match children.as_slice() {
                    [only] if covered.contains_key(only.id) && !heads.contains_key(last.id) => {
                        last = children.remove(0);
                        n += 1;
                    }
                    _ => break,
                }
            }
            let by = covered.get(last.id).map_or("", String::as_str);
            let line = format!(
                "… {n} entries ({} to {}) covered by compaction summaries (the latest: {by}) — `cairn show --all` lists them",
                entry.id, last.id
            );
            writeln!(out, "{indent}{marker}{}", s.dim(&esc(&line)))?;
            let mut children = index.children_views(Some(last.id));
            let child_indent = if branch { format!("{indent}│  ") } else { indent.clone() };
            if children.len() == 1 {
                stack.push((children.remove(0), child_indent, false));
            } else {
                for child in children.into_iter().rev() {
                    stack.push((child, child_indent.clone(), true));
                }
            }
            continue;
        }
        let lanes_here = heads
            .get(entry.id)
            .map(|l| format!("  {}", s.green(&format!("◀ {}", esc(&l.join(", "))))))
            .unwrap_or_default();
        writeln!(out, "{indent}{marker}{} {}{lanes_here}", s.dim(&esc(entry.id)), esc(&describe_entry(entry)))?;
        for line in crate::subagents::child_lines(ctx, &header.id, entry) {
            writeln!(out, "{indent}   {}", esc(&line))?;
        }
        let mut children = index.children_views(Some(entry.id));
        let child_indent = if branch { format!("{indent}│  ") } else { indent.clone() };
        if children.len() == 1 {
            stack.push((children.remove(0), child_indent, false));
        } else {
            for child in children.into_iter().rev() {
                stack.push((child, child_indent.clone(), true));
            }
        }
    }
    out.flush()?;
    Ok(exit::SUCCESS)
}

/// `cairn show --tools`: every tool invocation of the session with its
/// status, verdict, timings and receipt summary, and whether `cairn undo`
/// can revert it. The lifecycle comes from core's `ToolState` projection
/// of the log and the undoability from `cairn_core::undo::effects`, the
/// very rule undo acts on (with the same delegating tools); nothing is
/// re-derived here.
pub fn show_tools(ctx: &Invocation, path: &Path) -> Result<u8> {
    use cairn_core::undo::Undoability;
    let store = JsonlStore::open_read_only(path)?;
    let id = store.header().id.clone();
    let entries: Vec<_> = store.index().entries().collect();
    let state = ToolState::replay(entries.iter());
    // From the whole log: an effect's records are the same on every lane
    // that holds it.
    let effects = cairn_core::undo::effects(&entries, crate::undo::DELEGATING);
    let mut out = std::io::stdout().lock();
    if ctx.flags.json {
        for invocation in &state.invocations {
            let mut value = serde_json::to_value(invocation)?;
            if let (Some(map), Some(undo)) = (value.as_object_mut(), effects.undoability(&invocation.invocation_id)) {
                map.insert("undo".to_owned(), serde_json::to_value(undo)?);
            }
            writeln!(out, "{}", escape_json(&value.to_string()))?;
        }
        for anomaly in &state.anomalies {
            writeln!(out, "{}", escape_json(&serde_json::json!({ "anomaly": anomaly }).to_string()))?;
        }
        return Ok(exit::SUCCESS);
    }
    let s = &ctx.out_style;
    if state.invocations.is_empty() {
        writeln!(out, "no tool calls in session {}", esc(&id))?;
    }
    for (n, invocation) in state.invocations.iter().enumerate() {
        if n > 0 {
            writeln!(out)?;
        }
        let mut lines = describe_invocation(invocation);
        match effects.undoability(&invocation.invocation_id) {
            Some(Undoability::Undoable) => lines.push("undo      can be undone (its prior state is kept)".to_owned()),
            Some(Undoability::NotUndoable { reason }) => lines.push(format!("undo      cannot be undone: {reason}")),
            Some(Undoability::NoEffect) => lines.push("undo      nothing to undo (it changed no file)".to_owned()),
            None => {}
        }
        for (i, line) in lines.into_iter().enumerate() {
            let line = esc(&line);
            if i == 0 { writeln!(out, "{}", s.bold(&line))? } else { writeln!(out, "  {line}")? }
        }
    }
    for anomaly in &state.anomalies {
        writeln!(out, "{}", s.yellow(&format!("anomaly: {}", esc(anomaly))))?;
    }
    Ok(exit::SUCCESS)
}

/// The lines `show --tools` prints for one invocation (unescaped).
fn describe_invocation(r: &ToolInvocationRecord) -> Vec<String> {
    let text = |t: &str| crate::render::short(t, 100);
    let status = match r.status {
        ToolInvocationStatus::Requested => "requested, never started",
        ToolInvocationStatus::Started => "started, never settled",
        ToolInvocationStatus::Completed => "completed",
        ToolInvocationStatus::Failed if r.uncertain => "failed, uncertain whether its effect happened",
        ToolInvocationStatus::Failed => "failed",
        ToolInvocationStatus::Rejected => "rejected",
    };
    let tier = r.tier.map(|t| format!(" ({t:?})")).unwrap_or_default();
    let mut lines = vec![format!("{} {}{tier}: {status}", r.invocation_id, r.tool)];
    lines.push(format!("arguments {}", text(&r.request.arguments.to_string())));
    lines.push(format!("requested {}", format_time(r.requested_at)));
    if let Some(v) = &r.verdict {
        let decision = match &v.decision {
            Answer::Approve => "approved".to_owned(),
            Answer::ApproveForSession => "approved for the session".to_owned(),
            // The reason is the rejection's, printed below.
            Answer::Deny { .. } => "denied".to_owned(),
        };
        lines.push(format!("verdict   {decision} by {} after {} ms", v.by, v.at - r.requested_at));
    }
    if let Some(done) = r.completed_at {
        lines.push(format!("settled   after {} ms", done - r.requested_at));
    }
    if let Some(receipt) = &r.receipt {
        let cut = if receipt.truncated { ", output truncated" } else { "" };
        lines.push(format!(
            "receipt   exit {} in {} ms{cut}: {}",
            receipt.exit_code,
            receipt.duration_ms,
            text(receipt.output_summary.trim())
        ));
        if !receipt.affected_entities.is_empty() {
            lines.push(format!("affected  {}", text(&receipt.affected_entities.join(", "))));
        }
    }
    if let Some(reason) = &r.reason {
        lines.push(format!("reason    {}", crate::render::short(reason, 300)));
    }
    if r.settlements > 1 {
        lines.push(format!("settled {} times (the log is inconsistent)", r.settlements));
    }
    lines
}

/// `cairn log`: every record, one per line; `--follow` keeps printing.
/// The file is validated by a full read-only replay first, so a corrupt
/// file or one of a newer storage version is an error (exit 1), not a
/// partial listing.
pub fn log(ctx: &Invocation, path: &Path, follow: bool) -> Result<u8> {
    let opts = ctx.settings.store_options();
    drop(JsonlStore::open_read_only_with(path, opts)?);
    let mut tail = Tail::open_with(path, opts.max_line_bytes)?;
    let mut out = std::io::stdout().lock();
    if !ctx.flags.json {
        let h = tail.header().clone();
        let line = format!("# session {} cwd {} created {}", h.id, h.cwd, format_time(h.created_at));
        writeln!(out, "{}", ctx.out_style.dim(&esc(&line)))?;
    }
    loop {
        for record in tail.poll()? {
            // Both forms are JSON text; escaping keeps their value and keeps
            // what a hand-edited file holds away from the terminal.
            if ctx.flags.json {
                writeln!(out, "{}", escape_json(&serde_json::to_string(&record)?))?;
            } else {
                writeln!(out, "{}", escape_json(&format_record(&record)))?;
            }
        }
        out.flush()?;
        if !follow {
            return Ok(exit::SUCCESS);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// `cairn fork`: a new lane at an entry.
pub fn fork(ctx: &Invocation, path: &Path, entry: &str, lane: Option<String>) -> Result<u8> {
    let store = crate::parts::open_session(ctx, path)?;
    let mut session = cairn_core::Session::open(store, cairn_core::SessionConfig::default())?;
    let lane = match lane {
        Some(lane) => lane,
        None => {
            let taken: Vec<String> = session.lanes().into_iter().map(|(name, _)| name).collect();
            (1..).map(|n| format!("fork-{n}")).find(|name| !taken.contains(name)).unwrap_or_else(|| "fork".to_owned())
        }
    };
    session.fork(&lane, entry)?;
    let id = session.store().header().id.clone();
    let mut out = std::io::stdout().lock();
    if ctx.flags.json {
        writeln!(out, "{}", serde_json::json!({"session": id, "lane": lane, "at": entry}))?;
    } else {
        writeln!(out, "lane {lane} now starts at {entry} in session {id}")?;
    }
    Ok(exit::SUCCESS)
}

/// `cairn compact`: compacts when the automatic rule would
/// (`storage.compact_ratio`, files of at least 1 MiB), or always with `--force`.
pub fn compact(ctx: &Invocation, path: &Path, force: bool) -> Result<u8> {
    let mut store = crate::parts::open_session(ctx, path)?;
    let before = store.len_bytes();
    let ratio = store.dead_bytes_ratio();
    let opts = *store.options();
    if !force && !opts.compaction_due(before, ratio) {
        let threshold = opts.compact_ratio.unwrap_or(cairn_core::storage::DEFAULT_COMPACT_RATIO);
        let mut out = std::io::stdout().lock();
        if ctx.flags.json {
            let line = serde_json::json!({
                "compacted": false, "before": before, "after": before, "deadBytesRatio": ratio,
                "threshold": threshold, "minBytes": opts.compact_min_bytes,
            });
            writeln!(out, "{line}")?;
        } else {
            writeln!(
                out,
                "{}: not compacted: dead bytes ratio {ratio:.3} (size {}) is not over the threshold {threshold} for files of at least {}; use --force to compact anyway",
                path.display(),
                human_size(before),
                human_size(opts.compact_min_bytes)
            )?;
        }
        return Ok(exit::SUCCESS);
    }
    store.compact()?;
    let after = store.len_bytes();
    let mut out = std::io::stdout().lock();
    if ctx.flags.json {
        writeln!(
            out,
            "{}",
            serde_json::json!({"compacted": true, "before": before, "after": after, "deadBytesRatio": ratio})
        )?;
    } else {
        writeln!(
            out,
            "{}: {} → {} (dead bytes ratio was {ratio:.3})",
            path.display(),
            human_size(before),
            human_size(after)
        )?;
    }
    Ok(exit::SUCCESS)
}

/// `cairn check`. With `--json`, the report also carries what the check
/// cost: `fileBytes`, `seconds`, `bytesPerSec`, `entriesPerSec` and
/// `peakRssBytes` (the process's peak resident memory, so a regression in
/// the check's memory shows in benchmarks and tests).
pub fn check(ctx: &Invocation, path: &Path) -> Result<u8> {
    let started = std::time::Instant::now();
    // Beside the storage invariants, the tool lifecycle the turn relies on:
    // exactly one settlement per invocation, none without a request. The
    // check streams the file and keeps only what open invocations need;
    // the lines and the tool payloads are read on a second thread, the
    // lifecycle folded here in file order (the hot tool payloads parsed
    // once, as their lines are).
    let mut tools = LifecycleCheck::default();
    let report = check_file_read(path, ctx.settings.store_options(), LifecycleReader, |entry, read| {
        tools.check_read(entry.id, read).map_err(|e| e.to_string())
    });
    let seconds = started.elapsed().as_secs_f64();
    let mut out = std::io::stdout().lock();
    if ctx.flags.json {
        let mut value = serde_json::to_value(&report)?;
        if let Some(fields) = value.as_object_mut() {
            let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            let per_sec = |n: f64| if seconds > 0.0 { (n / seconds).round() } else { 0.0 };
            fields.insert("fileBytes".into(), bytes.into());
            fields.insert("seconds".into(), seconds.into());
            fields.insert("bytesPerSec".into(), per_sec(bytes as f64).into());
            fields.insert("entriesPerSec".into(), per_sec(report.entries as f64).into());
            fields.insert("peakRssBytes".into(), peak_rss_bytes().into());
        }
        writeln!(out, "{}", escape_json(&serde_json::to_string(&value)?))?;
    } else {
        writeln!(out, "{}", esc(&format!("{}: {report}", path.display())))?;
    }
    Ok(if report.ok { exit::SUCCESS } else { exit::ERROR })
}

/// This process's peak resident memory in bytes (`VmHWM` in
/// `/proc/self/status`); `None` where there is no such file.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.trim_start_matches("VmHWM:").trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// Whether tools can be kept from cairn's home (and its control sockets)
/// and its configuration directories.
fn home_note(ctx: &Invocation) -> String {
    let dirs: Vec<String> = ctx.paths.own_dirs().iter().map(|d| d.display().to_string()).collect();
    let dirs = dirs.join(", ");
    match cairn_tools::sandbox::isolation_status() {
        Ok(()) => format!(
            "hidden from tools ({dirs} covered in each call's mount namespace; the built-in file tools refuse them); \
             any change under them is refused"
        ),
        Err(why) => format!(
            "CANNOT be hidden from tools: there is no mount namespace for them here ({why}); a tool can reach \
             {dirs} and the control sockets in the first (the built-in file tools still refuse them, and any \
             staged change under them is refused)"
        ),
    }
}

/// The protected path classes (`cairn_core::authority`), one line each:
/// how a change is protected, what the paths are, where (cairn's own
/// directories by name).
fn protections(ctx: &Invocation) -> Vec<(cairn_core::authority::AuthorityClass, String)> {
    use cairn_core::authority::{AuthorityClass, Protection};
    let own: Vec<String> = ctx.paths.own_dirs().iter().map(|d| d.display().to_string()).collect();
    AuthorityClass::ALL
        .iter()
        .map(|&class| {
            let how = match class.protection() {
                Protection::Refused => "refused",
                Protection::Destructive => "Destructive",
            };
            let paths = match class {
                AuthorityClass::CairnHome => own.join(", "),
                _ => class.paths().to_owned(),
            };
            (class, format!("{how:<11}  {}: {paths}", class.what()))
        })
        .collect()
}

/// `cairn mcp list`.
pub fn mcp_list(ctx: &Invocation) -> Result<u8> {
    let cwd = crate::parts::new_session_cwd(ctx)?;
    let trust =
        cairn_tools::TrustStore::load(&ctx.paths.trust_file()).unwrap_or_else(|_| cairn_tools::TrustStore::empty());
    let ext = cairn_runtime::tools::extensions(ctx, &cwd, &trust);
    let servers = &ext.mcp_servers;
    let mut out = std::io::stdout().lock();
    for note in ext.notes.iter().chain(&ext.untrusted) {
        eprintln!("cairn: {}", esc(note));
    }
    if servers.is_empty() && !ctx.flags.json {
        writeln!(
            out,
            "no MCP servers are configured; add [mcp_servers.NAME] with `command` (or `url`) to {}",
            esc(&ctx.settings.config_file.display().to_string())
        )?;
        return Ok(exit::SUCCESS);
    }
    let config = cairn_runtime::tools::tools_config(ctx);
    let builtin: Vec<String> = cairn_tools::builtin_tools(&config)
        .map(|tools| tools.iter().map(|e| e.tool.spec().name.clone()).collect())
        .unwrap_or_default();
    let loaded = cairn_mcp::load(servers, &cwd, &config, &builtin);
    let mut failed = false;
    for server in &loaded.servers {
        let state = match &server.state {
            cairn_mcp::ServerState::Disabled => "disabled".to_owned(),
            cairn_mcp::ServerState::Running { tools, started_in: Some(t) } => {
                format!("running, {tools} tools, started in {} ms", t.as_millis())
            }
            cairn_mcp::ServerState::Running { tools, started_in: None } => format!("running, {tools} tools"),
            cairn_mcp::ServerState::NotStarted { tools } => format!("not started, {tools} tools as listed before"),
            cairn_mcp::ServerState::Failed(why) => {
                failed = true;
                format!("failed: {why}")
            }
        };
        if ctx.flags.json {
            let tools: Vec<_> =
                server.tools.iter().map(|(name, risk)| serde_json::json!({"name": name, "risk": risk})).collect();
            let line = serde_json::json!({
                "name": server.name, "endpoint": server.endpoint, "state": state, "tools": tools,
            });
            writeln!(out, "{}", escape_json(&line.to_string()))?;
            continue;
        }
        writeln!(out, "{}  {}", ctx.out_style.bold(&esc(&server.name)), esc(&server.endpoint))?;
        writeln!(out, "  {}", esc(&state))?;
        for (name, risk) in &server.tools {
            writeln!(out, "  {:<48}  {risk:?}", esc(name))?;
        }
    }
    for note in loaded.notes.iter().filter(|n| !n.contains("did not start")) {
        writeln!(out, "{}", ctx.out_style.yellow(&esc(note)))?;
    }
    Ok(if failed { exit::ERROR } else { exit::SUCCESS })
}

/// `cairn mcp login NAME`: the OAuth authorization-code flow for an HTTP
/// server (cairn-mcp's `login`); the URL goes to stdout alone on its line,
/// what to do with it to stderr.
pub fn mcp_login(ctx: &Invocation, name: &str) -> Result<u8> {
    let cwd = crate::parts::new_session_cwd(ctx)?;
    let trust =
        cairn_tools::TrustStore::load(&ctx.paths.trust_file()).unwrap_or_else(|_| cairn_tools::TrustStore::empty());
    let ext = cairn_runtime::tools::extensions(ctx, &cwd, &trust);
    // Sets where logins are kept (as for every run).
    let _ = cairn_runtime::tools::tools_config(ctx);
    let Some(server) = ext.mcp_servers.get(name) else {
        let known: Vec<&str> = ext.mcp_servers.keys().map(String::as_str).collect();
        anyhow::bail!(
            "no MCP server is named {:?} (configured: {}); add [mcp_servers.{}] with its `url` to {}",
            esc(name),
            if known.is_empty() { "none".to_owned() } else { known.join(", ") },
            esc(name),
            esc(&ctx.settings.config_file.display().to_string())
        );
    };
    let Some(url) = &server.url else {
        anyhow::bail!("{} is a stdio server (`command`): only an HTTP server (`url`) is logged in to", esc(name));
    };
    if server.oauth.is_some() {
        anyhow::bail!(
            "[mcp_servers.{}.oauth] gives client credentials: cairn gets its tokens itself, no login is needed",
            esc(name)
        );
    }
    let mut show = |address: &str| {
        eprintln!("cairn: open this URL in a browser to log in to {} ({}):", esc(name), esc(url));
        println!("{address}");
        // A browser the person configured opens it; without one the URL
        // printed above is enough.
        if let Err(e) = crate::approver::open_in_browser(address) {
            eprintln!("cairn: {e}; open the URL yourself");
        }
        eprintln!("cairn: waiting for the browser to come back (Ctrl-C gives up)…");
    };
    match cairn_mcp::login(name, url, &mut show) {
        Ok(kept) => {
            println!("logged in to {}; the login is kept in {}", esc(name), esc(&kept.display().to_string()));
            Ok(exit::SUCCESS)
        }
        Err(e) => anyhow::bail!("cannot log in to {}: {}", esc(name), esc(&e.to_string())),
    }
}

/// `cairn tools`.
pub fn tools(ctx: &Invocation) -> Result<u8> {
    let cwd = crate::parts::new_session_cwd(ctx)?;
    // What a turn here gets: the tool service's tools with `--toolsrv`.
    let cairn_runtime::tools::TurnTools { entries, mut notes, untrusted, .. } =
        cairn_runtime::tools::turn_tools(ctx, &cwd)?;
    notes.extend(untrusted);
    let status = cairn_tools::landlock_status();
    // What every sandboxed process reads beyond its own rules (those that exist).
    let reads: Vec<String> = cairn_runtime::tools::tools_config(ctx)
        .sandbox_read_paths
        .iter()
        .filter(|p| p.exists())
        .map(|p| p.display().to_string())
        .collect();
    let mut out = std::io::stdout().lock();
    if ctx.flags.json {
        for entry in &entries {
            let spec = entry.tool.spec();
            let line = serde_json::json!({
                "name": spec.name, "risk": spec.risk, "capabilities": spec.capabilities,
                "replay": spec.replay, "source": entry.origin.to_string(),
            });
            writeln!(out, "{}", escape_json(&line.to_string()))?;
        }
        let summary = serde_json::json!({
            "sandbox": status.describe(), "staging": cairn_tools::staging::describe(ctx.settings.staged.value),
            "home": home_note(ctx), "reads": reads, "problems": notes,
            "hidden": ctx.paths.own_dirs(),
            "protectedPaths": protections(ctx).iter().map(|(class, _)| serde_json::json!({
                "class": class, "protection": class.protection(), "what": class.what(), "paths": class.paths(),
                "why": class.why(),
            })).collect::<Vec<_>>(),
        });
        writeln!(out, "{}", escape_json(&summary.to_string()))?;
        return Ok(exit::SUCCESS);
    }
    writeln!(
        out,
        "{}",
        ctx.out_style.bold(&format!("{:<14}  {:<12}  {:<40}  {}", "NAME", "RISK", "CAPABILITIES", "SOURCE"))
    )?;
    for entry in &entries {
        let spec = entry.tool.spec();
        let caps: Vec<String> = spec.capabilities.iter().map(|c| format!("{c:?}")).collect();
        let row =
            format!("{:<14}  {:<12}  {:<40}  {}", spec.name, format!("{:?}", spec.risk), caps.join(","), entry.origin);
        writeln!(out, "{}", esc(&row))?;
    }
    writeln!(out, "\nsandbox: {}", status.describe())?;
    writeln!(out, "staging: {}", esc(&cairn_tools::staging::describe(ctx.settings.staged.value)))?;
    writeln!(out, "cairn's home: {}", esc(&home_note(ctx)))?;
    writeln!(
        out,
        "protected paths (a change is Destructive: a person sees it and decides, never --yes or an allow rule, \
         refused headless; or refused outright), staged or not:"
    )?;
    for (_, line) in protections(ctx) {
        writeln!(out, "  {}", esc(&line))?;
    }
    if !reads.is_empty() {
        writeln!(out, "tools also read: {}", esc(&reads.join(", ")))?;
    }
    for note in notes {
        writeln!(out, "{}", ctx.out_style.yellow(&esc(&note)))?;
    }
    Ok(exit::SUCCESS)
}
