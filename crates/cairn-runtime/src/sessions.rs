//! Finding sessions on disk: resolve what a user typed (a path, an id, a
//! unique id prefix, or a name given with `--name`) to a session file, and
//! summarise sessions for `cairn sessions` and `resume --last`.
//!
//! `cairn sessions` is one command whatever the backend: [`listing`] asks
//! the configured one (the session files, or PostgreSQL's catalog) and
//! returns what it keeps; the CLI prints it, as text or one
//! [`SessionRow`] a line with `--json`.
//!
//! A listing reads only what it shows (header, name, last state) through
//! `read_summary`'s backward scan, never a full replay. A file that is not a
//! readable session (a FIFO, a device, a bad header, an over-long line) is
//! skipped with a warning (a `Note` to the embedder) instead of failing or
//! hanging the listing; a header id that differs from the file name is
//! listed under the file name (the id lookups use) with a warning.
//! Everything here opens session files read-only; it never writes. Must
//! not print: it returns data.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context as _, Result, bail};
use cairn_core::storage::{StoreOptions, header_id_mismatch, read_summary, registers};
use cairn_core::turn::Pc;

use crate::paths::Paths;
use crate::setup::{Notes, Setup};

/// What `cairn sessions` shows of one session.
#[derive(Debug, Clone)]
pub struct SessionSummary {
    /// Session id as lookups know it: the file name without `.jsonl`.
    pub id: String,
    /// The id the header declares (normally equal to `id`).
    pub header_id: String,
    /// The session file.
    pub path: PathBuf,
    /// Name given with `--name`.
    pub name: Option<String>,
    /// Working directory.
    pub cwd: String,
    /// Creation time, ms since the epoch.
    pub created_at: i64,
    /// Last modification of the file.
    pub modified: SystemTime,
    /// How a person is shown where it stands ("new", "final",
    /// "interrupted (awaitingapproval)", …).
    pub state: String,
    /// The turn's phase (`None` before the first turn).
    pub phase: Option<String>,
    /// Where the session stands, as every backend says it.
    pub standing: Standing,
    /// Prompts waiting in the session's queue.
    pub queued: u64,
    /// File size in bytes.
    pub size: u64,
}

/// Where a session stands: the `state` of `cairn sessions --json`, the same
/// words for session files and PostgreSQL (docs/sessions-json.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
// Queued, Running and Failed are PostgreSQL's: a build without it never
// makes them, but the words stay one list for every backend.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub enum Standing {
    /// No turn yet.
    New,
    /// The last turn finished; a new prompt starts the next one.
    Idle,
    /// A turn stopped part-way (a crash, Ctrl-C, a lost worker) and nobody
    /// is running it: `cairn resume` (or a worker) continues it.
    Interrupted,
    /// Waiting for a worker to claim it (PostgreSQL).
    Queued,
    /// A worker holds it and is running a turn (PostgreSQL).
    Running,
    /// A worker gave up on it; `note` says why (PostgreSQL).
    Failed,
}

/// One line of `cairn sessions --json`: one shape for every backend. A
/// field a backend does not keep is `null`, never absent.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionRow {
    /// The id lookups use.
    pub id: String,
    /// `file` or `postgres`.
    pub backend: &'static str,
    /// Where it stands.
    pub state: Standing,
    /// The turn's phase where known (`final`, `awaitingApproval`, …).
    pub phase: Option<String>,
    /// Name given with `--name`.
    pub name: Option<String>,
    /// Working directory.
    pub cwd: String,
    /// Creation time, ms since the epoch.
    pub created_at: i64,
    /// Last change, ms since the epoch.
    pub last_activity: i64,
    /// Prompts waiting to run.
    pub queued: u64,
    /// The parent session of a subagent.
    pub parent: Option<String>,
    /// Why it failed (PostgreSQL).
    pub note: Option<String>,
    /// The session file (files).
    pub path: Option<PathBuf>,
    /// File size in bytes (files).
    pub size: Option<u64>,
    /// The id the header declares (files; normally equal to `id`).
    pub header_id: Option<String>,
    /// The highest committed seq (PostgreSQL).
    pub last_seq: Option<i64>,
    /// Claims so far (PostgreSQL).
    pub epoch: Option<i64>,
    /// The worker holding it (PostgreSQL).
    pub holder: Option<String>,
}

/// Every `*.jsonl` file in the sessions directory (not opened).
pub fn session_files(paths: &Paths) -> Result<Vec<PathBuf>> {
    let dir = paths.sessions();
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot list {}", dir.display())),
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.with_context(|| format!("cannot list {}", dir.display()))?.path();
        if path.extension().is_some_and(|e| e == "jsonl") {
            files.push(path);
        }
    }
    Ok(files)
}

fn stem(path: &Path) -> String {
    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Summarise one session file (read-only, header + backward scan). The
/// second value is a warning to show (a header id that is not the file name).
pub fn summarise(path: &Path, opts: &StoreOptions) -> Result<(SessionSummary, Option<String>)> {
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
    let wanted = [(registers::FACT, registers::NAME_FACT), (registers::FACT, registers::QUEUE_FACT)];
    let summary = read_summary(path, &wanted, opts.max_line_bytes)?;
    let name = summary.registers.first().cloned().flatten().and_then(|raw| raw.parse::<String>().ok());
    let queued = summary
        .registers
        .get(1)
        .cloned()
        .flatten()
        .and_then(|raw| raw.parse::<registers::PromptQueue>().ok())
        .map_or(0, |q| q.items.len() as u64);
    // The turn's phase (`None` before the first turn; "unknown" for a state
    // this cairn cannot read, which is not idle: resume says why).
    let (phase, standing) = match &summary.state {
        None => (None, Standing::New),
        Some(state) => match Pc::decode(&state.pc) {
            Ok(pc) => (
                Some(format!("{:?}", pc.phase).to_lowercase()),
                if pc.in_progress() { Standing::Interrupted } else { Standing::Idle },
            ),
            Err(_) => (Some("unknown".to_owned()), Standing::Interrupted),
        },
    };
    let state = match (&phase, standing) {
        (None, _) => "new".to_owned(),
        (Some(p), Standing::Interrupted) if p != "unknown" => format!("interrupted ({p})"),
        (Some(p), _) => p.clone(),
    };
    let warning = header_id_mismatch(path, &summary.header.id);
    let header = summary.header;
    Ok((
        SessionSummary {
            id: stem(path),
            header_id: header.id,
            path: path.to_path_buf(),
            name,
            cwd: header.cwd,
            created_at: header.created_at,
            modified,
            state,
            phase,
            standing,
            queued,
            size: meta.len(),
        },
        warning,
    ))
}

/// Summarise `files`, skipping (with a warning) those that are not
/// readable sessions.
fn summarise_all(files: &[PathBuf], opts: &StoreOptions, notes: &Notes) -> Vec<SessionSummary> {
    let mut all = Vec::with_capacity(files.len());
    for path in files {
        match summarise(path, opts) {
            Ok((summary, warning)) => {
                if let Some(warning) = warning {
                    notes.warn(warning);
                }
                all.push(summary);
            }
            Err(e) => notes.warn(format!("skipping {}: {e:#}", path.display())),
        }
    }
    all
}

/// All readable session files, most recently active first; unreadable
/// files are skipped with a warning.
pub fn list(ctx: &Setup) -> Result<Vec<SessionSummary>> {
    let mut all = summarise_all(&session_files(&ctx.paths)?, &ctx.settings.store_options(), &ctx.notes);
    all.sort_by(|a, b| b.modified.cmp(&a.modified).then_with(|| b.id.cmp(&a.id)));
    Ok(all)
}

/// What `cairn sessions` shows, from the backend that keeps the sessions.
#[derive(Debug)]
pub enum Listing {
    /// Session files, most recently active first.
    Files(Vec<SessionSummary>),
    /// Sessions in PostgreSQL, as its catalog lists them.
    #[cfg(feature = "postgres")]
    Database(Vec<cairn_pg::catalog::Listed>),
}

/// The sessions of the configured backend (`database`: PostgreSQL, else
/// the session files).
pub fn listing(ctx: &Setup) -> Result<Listing> {
    if ctx.settings.database.value.is_none() {
        return Ok(Listing::Files(list(ctx)?));
    }
    #[cfg(feature = "postgres")]
    {
        let mut client = crate::parts::database_client(ctx)?;
        Ok(Listing::Database(cairn_pg::catalog::list(&mut client)?))
    }
    #[cfg(not(feature = "postgres"))]
    bail!(crate::parts::NO_POSTGRES)
}

impl Listing {
    /// One [`SessionRow`] a session, the same shape for every backend.
    pub fn rows(&self) -> Vec<SessionRow> {
        match self {
            Listing::Files(all) => all
                .iter()
                .map(|s| SessionRow {
                    id: s.id.clone(),
                    backend: "file",
                    state: s.standing,
                    phase: s.phase.clone(),
                    name: s.name.clone(),
                    cwd: s.cwd.clone(),
                    created_at: s.created_at,
                    last_activity: millis(s.modified),
                    queued: s.queued,
                    parent: crate::family::parent_of(&s.id).map(str::to_owned),
                    note: None,
                    path: Some(s.path.clone()),
                    size: Some(s.size),
                    header_id: Some(s.header_id.clone()),
                    last_seq: None,
                    epoch: None,
                    holder: None,
                })
                .collect(),
            #[cfg(feature = "postgres")]
            Listing::Database(rows) => rows.iter().map(database_row).collect(),
        }
    }
}

/// A time as ms since the epoch (0 before it).
pub fn millis(time: SystemTime) -> i64 {
    time.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// A session of PostgreSQL's catalog as a [`SessionRow`].
#[cfg(feature = "postgres")]
fn database_row(listed: &cairn_pg::catalog::Listed) -> SessionRow {
    use cairn_pg::catalog::Status;
    let state = match listed.status {
        Status::Queued => Standing::Queued,
        Status::Running => Standing::Running,
        Status::Failed => Standing::Failed,
        Status::Idle if listed.last_seq == 0 => Standing::New,
        Status::Idle => Standing::Idle,
    };
    SessionRow {
        id: listed.id.clone(),
        backend: "postgres",
        state,
        phase: None,
        name: None,
        cwd: listed.header.as_ref().map(|h| h.cwd.clone()).unwrap_or_default(),
        created_at: listed.header.as_ref().map_or(0, |h| h.created_at),
        last_activity: listed.updated_ms,
        queued: u64::try_from(listed.queued).unwrap_or(0),
        parent: crate::family::parent_of(&listed.id).map(str::to_owned),
        note: listed.note.clone(),
        path: None,
        size: None,
        header_id: None,
        last_seq: Some(listed.last_seq),
        epoch: Some(listed.epoch),
        holder: listed.holder.clone(),
    }
}

/// Resolve a path, id, unique id prefix or name to a session file.
pub fn resolve(ctx: &Setup, target: &str) -> Result<PathBuf> {
    let (paths, opts) = (&ctx.paths, &ctx.settings.store_options());
    let as_path = Path::new(target);
    if as_path.is_file() {
        return Ok(as_path.to_path_buf());
    }
    let files = session_files(paths)?;
    if let Some(exact) = files.iter().find(|p| stem(p) == target) {
        return Ok(exact.clone());
    }
    // A parent's id prefix names the parent, not its children (core's
    // rule, the database resolver's too).
    let prefixed: Vec<&PathBuf> =
        files.iter().filter(|p| cairn_core::storage::prefix_names(target, &stem(p))).collect();
    match prefixed.as_slice() {
        [one] => return Ok((*one).clone()),
        [] => {}
        many => bail!(
            "{target:?} matches {} sessions ({}); give more of the id",
            many.len(),
            many.iter().map(|p| stem(p)).collect::<Vec<_>>().join(", ")
        ),
    }
    let named: Vec<SessionSummary> =
        summarise_all(&files, opts, &ctx.notes).into_iter().filter(|s| s.name.as_deref() == Some(target)).collect();
    match named.as_slice() {
        [one] => Ok(one.path.clone()),
        [] => bail!("no session {target:?} in {}; list them with `cairn sessions`", paths.sessions().display()),
        many => bail!("{} sessions are named {target:?}; use an id ({})", many.len(), {
            many.iter().map(|s| s.id.as_str()).collect::<Vec<_>>().join(", ")
        }),
    }
}

/// The most recently active readable session: files are tried newest
/// first, and only until one reads (unreadable ones are skipped with a
/// warning).
pub fn last(ctx: &Setup) -> Result<PathBuf> {
    let (paths, opts) = (&ctx.paths, &ctx.settings.store_options());
    let mut files: Vec<(SystemTime, PathBuf)> = session_files(paths)?
        .into_iter()
        // Children are resumed through their parent (`subagents/`).
        .filter(|p| !crate::family::is_child_id(&stem(p)))
        .map(|p| (std::fs::metadata(&p).and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH), p))
        .collect();
    files.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| stem(&b.1).cmp(&stem(&a.1))));
    for (_, path) in files {
        match summarise(&path, opts) {
            Ok((summary, warning)) => {
                if let Some(warning) = warning {
                    ctx.notes.warn(warning);
                }
                return Ok(summary.path);
            }
            Err(e) => ctx.notes.warn(format!("skipping {}: {e:#}", path.display())),
        }
    }
    bail!("no sessions yet in {}; start one with `cairn run`", paths.sessions().display())
}

/// A short local-time-free rendering of a ms timestamp (UTC).
pub fn format_time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}Z", rem / 3600, (rem % 3600) / 60, rem % 60)
}

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A byte count for people (`12.3 MiB`).
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_times() {
        assert_eq!(format_time(0), "1970-01-01 00:00:00Z");
        assert_eq!(format_time(1_796_000_000_000), "2026-11-30 00:53:20Z");
    }
}
