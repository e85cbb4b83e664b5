//! Finding sessions on disk: resolve what a user typed (a path, an id, a
//! unique id prefix, or a name given with `--name`) to a session file, and
//! summarise sessions for `cairn sessions`.
//!
//! Everything here opens session files read-only; it never writes.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context, Result, bail};
use cairn_core::storage::JsonlStore;
use cairn_core::storage::Storage;
use cairn_core::turn::Pc;

use crate::paths::Paths;

/// What `cairn sessions` shows of one session.
#[derive(Debug, Clone)]
pub struct SessionSummary {
    /// Session id.
    pub id: String,
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
    /// The turn's phase, or the reason the file does not open.
    pub state: String,
    /// File size in bytes.
    pub size: u64,
}

/// Every `*.jsonl` file in the sessions directory.
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

/// Summarise one session file (read-only).
pub fn summarise(path: &Path) -> SessionSummary {
    let meta = std::fs::metadata(path).ok();
    let modified = meta.as_ref().and_then(|m| m.modified().ok()).unwrap_or(SystemTime::UNIX_EPOCH);
    let size = meta.map_or(0, |m| m.len());
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    match JsonlStore::open_read_only(path) {
        Ok(store) => {
            let header = store.header();
            let name = cairn_core::storage::registers::session_name(&store);
            let state = match store.state() {
                None => "new".to_owned(),
                Some(state) => match Pc::decode(&state.pc) {
                    Ok(pc) if pc.in_progress() => format!("interrupted ({:?})", pc.phase).to_lowercase(),
                    Ok(pc) => format!("{:?}", pc.phase).to_lowercase(),
                    Err(_) => "unknown".to_owned(),
                },
            };
            SessionSummary {
                id: header.id.clone(),
                path: path.to_path_buf(),
                name,
                cwd: header.cwd.clone(),
                created_at: header.created_at,
                modified,
                state,
                size,
            }
        }
        Err(e) => SessionSummary {
            id: stem,
            path: path.to_path_buf(),
            name: None,
            cwd: String::new(),
            created_at: 0,
            modified,
            state: format!("unreadable: {e}"),
            size,
        },
    }
}

/// All sessions, most recently active first.
pub fn list(paths: &Paths) -> Result<Vec<SessionSummary>> {
    let mut all: Vec<SessionSummary> = session_files(paths)?.iter().map(|p| summarise(p)).collect();
    all.sort_by(|a, b| b.modified.cmp(&a.modified).then_with(|| b.id.cmp(&a.id)));
    Ok(all)
}

/// Resolve a path, id, unique id prefix or name to a session file.
pub fn resolve(paths: &Paths, target: &str) -> Result<PathBuf> {
    let as_path = Path::new(target);
    if as_path.is_file() {
        return Ok(as_path.to_path_buf());
    }
    let files = session_files(paths)?;
    let stem = |p: &PathBuf| p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    if let Some(exact) = files.iter().find(|p| stem(p) == target) {
        return Ok(exact.clone());
    }
    let prefixed: Vec<&PathBuf> = files.iter().filter(|p| stem(p).starts_with(target)).collect();
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
        files.iter().map(|p| summarise(p)).filter(|s| s.name.as_deref() == Some(target)).collect();
    match named.as_slice() {
        [one] => Ok(one.path.clone()),
        [] => bail!("no session {target:?} in {}; list them with `cairn sessions`", paths.sessions().display()),
        many => bail!("{} sessions are named {target:?}; use an id ({})", many.len(), {
            many.iter().map(|s| s.id.as_str()).collect::<Vec<_>>().join(", ")
        }),
    }
}

/// The most recently active session.
pub fn last(paths: &Paths) -> Result<PathBuf> {
    list(paths)?
        .into_iter()
        .next()
        .map(|s| s.path)
        .with_context(|| format!("no sessions yet in {}; start one with `cairn run`", paths.sessions().display()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_times() {
        assert_eq!(format_time(0), "1970-01-01 00:00:00Z");
        assert_eq!(format_time(1_796_000_000_000), "2026-11-30 00:53:20Z");
    }
}
