//! The commands that inspect or configure rather than run a turn.

use std::io::Write;
use std::path::Path;

use anyhow::Result;
use cairn_core::storage::Storage;
use cairn_core::storage::{Entry, JsonlStore, Tail, check_file, format_record};

use crate::cli::{Context, exit};
use crate::sessions::format_time;

/// `cairn config`: every setting, its value and where it came from.
pub fn config(ctx: &Context) -> Result<u8> {
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
    for name in ctx.settings.providers.keys() {
        writeln!(out, "providers.{name}  {}", ctx.out_style.dim(&format!("({})", ctx.settings.config_file.display())))?;
    }
    Ok(exit::SUCCESS)
}

/// `cairn sessions`: newest first.
pub fn sessions(ctx: &Context) -> Result<u8> {
    let all = crate::sessions::list(&ctx.paths)?;
    let mut out = std::io::stdout().lock();
    if ctx.common.json {
        for s in &all {
            let modified = s.modified.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
            let line = serde_json::json!({
                "id": s.id, "name": s.name, "cwd": s.cwd, "createdAt": s.created_at,
                "lastActivity": modified, "state": s.state, "size": s.size, "path": s.path,
            });
            writeln!(out, "{line}")?;
        }
        return Ok(exit::SUCCESS);
    }
    if all.is_empty() {
        writeln!(out, "no sessions yet in {}; start one with `cairn run \"…\"`", ctx.paths.sessions().display())?;
        return Ok(exit::SUCCESS);
    }
    writeln!(
        out,
        "{}",
        ctx.out_style.bold(&format!(
            "{:<36}  {:<12}  {:<20}  {:<20}  {:<22}  {:>9}  {}",
            "ID", "NAME", "CREATED", "LAST ACTIVITY", "STATE", "SIZE", "CWD"
        ))
    )?;
    for s in &all {
        let modified = s.modified.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        writeln!(
            out,
            "{:<36}  {:<12}  {:<20}  {:<20}  {:<22}  {:>9}  {}",
            s.id,
            s.name.as_deref().unwrap_or("-"),
            format_time(s.created_at),
            format_time(modified),
            s.state,
            human_size(s.size),
            s.cwd
        )?;
    }
    Ok(exit::SUCCESS)
}

fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// One line describing an entry for `cairn show`.
fn describe_entry(entry: &Entry) -> String {
    use cairn_core::events::{ToolCompleted, ToolFailed, ToolRejected, ToolRequested, ToolStarted};
    let text = |t: &str| crate::render::short(t, 100);
    match entry.entry_type.as_str() {
        "message" => match cairn_core::turn::entry_message(entry) {
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
        "toolRequested" => match entry.payload.parse::<ToolRequested>() {
            Ok(p) => format!(
                "tool requested: {} {} ({})",
                p.request.tool,
                text(&p.request.arguments.to_string()),
                p.invocation_id
            ),
            Err(_) => "tool requested".to_owned(),
        },
        "toolStarted" => match entry.payload.parse::<ToolStarted>() {
            Ok(p) => format!("tool started: {} (approved by {})", p.tool, p.verdict.by),
            Err(_) => "tool started".to_owned(),
        },
        "toolCompleted" => match entry.payload.parse::<ToolCompleted>() {
            Ok(p) => {
                format!("tool completed: {} exit {} — {}", p.tool, p.receipt.exit_code, text(&p.receipt.output_summary))
            }
            Err(_) => "tool completed".to_owned(),
        },
        "toolFailed" => match entry.payload.parse::<ToolFailed>() {
            Ok(p) => {
                format!("tool {}: {} — {}", if p.uncertain { "uncertain" } else { "failed" }, p.tool, text(&p.reason))
            }
            Err(_) => "tool failed".to_owned(),
        },
        "toolRejected" => match entry.payload.parse::<ToolRejected>() {
            Ok(p) => format!("tool rejected: {} — {}", p.tool, text(&p.reason)),
            Err(_) => "tool rejected".to_owned(),
        },
        other => other.to_owned(),
    }
}

/// `cairn show`: the tree, its branches, and each lane's head.
pub fn show(ctx: &Context, path: &Path) -> Result<u8> {
    let store = JsonlStore::open_read_only(path)?;
    let header = store.header().clone();
    let index = store.index();
    let mut heads: std::collections::HashMap<String, Vec<String>> = std::collections::HashMap::new();
    for (lane, value) in index.registers("lane") {
        if let Ok(head) = value.parse::<String>() {
            heads.entry(head).or_default().push(lane.to_owned());
        }
    }
    let mut out = std::io::stdout().lock();
    let s = &ctx.out_style;
    writeln!(out, "{} {}", s.bold("session"), header.id)?;
    writeln!(out, "  cwd {}  created {}", header.cwd, format_time(header.created_at))?;
    let mut lanes: Vec<(String, String)> =
        index.registers("lane").map(|(k, v)| (k.to_owned(), v.parse::<String>().unwrap_or_default())).collect();
    lanes.sort();
    for (lane, head) in &lanes {
        writeln!(out, "  lane {} → {}", s.bold(lane), head)?;
    }
    writeln!(out)?;
    // Walk the tree depth-first; a chain continues at the same indent, and
    // only a branch point indents, so long linear sessions stay flat.
    let mut stack: Vec<(&Entry, String, bool)> =
        index.children(None).into_iter().rev().map(|e| (e, String::new(), false)).collect();
    while let Some((entry, indent, branch)) = stack.pop() {
        let marker = if branch { "├─ " } else { "" };
        let lanes_here =
            heads.get(&entry.id).map(|l| format!("  {}", s.green(&format!("◀ {}", l.join(", "))))).unwrap_or_default();
        writeln!(out, "{indent}{marker}{} {}{lanes_here}", s.dim(&entry.id), describe_entry(entry))?;
        let children = index.children(Some(&entry.id));
        let child_indent = if branch { format!("{indent}│  ") } else { indent.clone() };
        if children.len() == 1 {
            stack.push((children[0], child_indent, false));
        } else {
            for child in children.into_iter().rev() {
                stack.push((child, child_indent.clone(), true));
            }
        }
    }
    Ok(exit::SUCCESS)
}

/// `cairn log`: every record, one per line; `--follow` keeps printing.
pub fn log(ctx: &Context, path: &Path, follow: bool) -> Result<u8> {
    let mut tail = Tail::open(path)?;
    let mut out = std::io::stdout().lock();
    if !ctx.common.json {
        let h = tail.header().clone();
        writeln!(
            out,
            "{}",
            ctx.out_style.dim(&format!("# session {} cwd {} created {}", h.id, h.cwd, format_time(h.created_at)))
        )?;
    }
    loop {
        for record in tail.poll()? {
            if ctx.common.json {
                writeln!(out, "{}", serde_json::to_string(&record)?)?;
            } else {
                writeln!(out, "{}", format_record(&record))?;
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
pub fn fork(ctx: &Context, path: &Path, entry: &str, lane: Option<String>) -> Result<u8> {
    let store = crate::host::open_session(path)?;
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
    if ctx.common.json {
        writeln!(out, "{}", serde_json::json!({"session": id, "lane": lane, "at": entry}))?;
    } else {
        writeln!(out, "lane {lane} now starts at {entry} in session {id}")?;
    }
    Ok(exit::SUCCESS)
}

/// `cairn compact`.
pub fn compact(ctx: &Context, path: &Path) -> Result<u8> {
    let mut store = crate::host::open_session(path)?;
    let before = store.len_bytes();
    let ratio = store.dead_bytes_ratio();
    store.compact()?;
    let after = store.len_bytes();
    let mut out = std::io::stdout().lock();
    if ctx.common.json {
        writeln!(out, "{}", serde_json::json!({"before": before, "after": after, "deadBytesRatio": ratio}))?;
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

/// `cairn check`.
pub fn check(ctx: &Context, path: &Path) -> Result<u8> {
    let report = check_file(path);
    let mut out = std::io::stdout().lock();
    if ctx.common.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
    } else {
        writeln!(out, "{}: {report}", path.display())?;
    }
    Ok(if report.ok { exit::SUCCESS } else { exit::ERROR })
}

/// `cairn tools`.
pub fn tools(ctx: &Context) -> Result<u8> {
    let cwd = std::env::current_dir()?;
    let cwd = ctx.common.cwd.clone().unwrap_or(cwd);
    let crate::host::HostTools { entries, mut notes, untrusted } = crate::host::tool_entries(ctx, &cwd)?;
    notes.extend(untrusted);
    let status = cairn_tools::landlock_status();
    let mut out = std::io::stdout().lock();
    if ctx.common.json {
        for entry in &entries {
            let spec = entry.tool.spec();
            let line = serde_json::json!({
                "name": spec.name, "risk": spec.risk, "capabilities": spec.capabilities,
                "replay": spec.replay, "source": entry.origin.to_string(),
            });
            writeln!(out, "{line}")?;
        }
        writeln!(out, "{}", serde_json::json!({"sandbox": status.describe(), "problems": notes}))?;
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
        writeln!(
            out,
            "{:<14}  {:<12}  {:<40}  {}",
            spec.name,
            format!("{:?}", spec.risk),
            caps.join(","),
            entry.origin
        )?;
    }
    writeln!(out, "\nsandbox: {}", status.describe())?;
    for note in notes {
        writeln!(out, "{}", ctx.out_style.yellow(&note))?;
    }
    Ok(exit::SUCCESS)
}
