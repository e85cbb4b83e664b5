//! The journal of prompts written to `s/<id>/enqueue` while a turn runs:
//! `<sessions>/.queue/<id>.jsonl`, one [`QueuedPrompt`] a line, appended
//! and synced before the write returns, so a queued prompt survives a
//! SIGKILL of the server.
//!
//! Owns only this file. The session's own prompt queue (the `fact`
//! `queue`, `cairn_core::storage::registers::PromptQueue`) is where a
//! prompt becomes part of the session: the turn that starts it brings the
//! journal in by number (`Session::run_queued`) and the journal's lines up
//! to that number are forgotten afterwards. A crash between the two only
//! leaves lines the queue skips by number. Must not decide when a prompt
//! runs (the runtime does) and must not touch the session file.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use cairn_core::storage::registers::QueuedPrompt;

/// The journal of session `id` under `sessions`.
pub fn journal_path(sessions: &Path, id: &str) -> PathBuf {
    sessions.join(".queue").join(format!("{id}.jsonl"))
}

/// The prompts in the journal at `path`, in file order (none when it does
/// not exist). A torn last line (a crash mid-append, before the write was
/// acknowledged) is ignored.
pub fn read(path: &Path) -> Result<Vec<QueuedPrompt>> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let mut out = Vec::new();
    for line in BufReader::new(file).lines() {
        let line = line.with_context(|| format!("cannot read {}", path.display()))?;
        if let Ok(q) = serde_json::from_str::<QueuedPrompt>(&line) {
            out.push(q);
        }
    }
    Ok(out)
}

/// Append `prompt` and sync it (and the directory, when the file is new).
pub fn append(path: &Path, prompt: &QueuedPrompt) -> Result<()> {
    let dir = path.parent().context("a journal path has a directory")?;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let existed = path.exists();
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let mut line = Vec::new();
    // A torn last line (a crash mid-append) must not swallow this one.
    if ends_torn(path)? {
        line.push(b'\n');
    }
    line.extend(serde_json::to_vec(prompt)?);
    line.push(b'\n');
    file.write_all(&line).and_then(|()| file.sync_all()).with_context(|| format!("cannot write {}", path.display()))?;
    if !existed {
        File::open(dir).and_then(|d| d.sync_all()).with_context(|| format!("cannot sync {}", dir.display()))?;
    }
    Ok(())
}

fn ends_torn(path: &Path) -> Result<bool> {
    use std::os::unix::fs::FileExt;
    let Ok(file) = File::open(path) else { return Ok(false) };
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(false);
    }
    let mut last = [0u8; 1];
    file.read_exact_at(&mut last, len - 1).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(last[0] != b'\n')
}

/// Forget the lines numbered `through` or below (the session's queue has
/// them): rewrite the journal with the rest, or remove it when none is left.
pub fn forget_through(path: &Path, through: u64) -> Result<()> {
    let all = read(path)?;
    if all.is_empty() && !path.exists() {
        return Ok(());
    }
    let rest: Vec<&QueuedPrompt> = all.iter().filter(|q| q.n > through).collect();
    if rest.len() == all.len() && !all.is_empty() {
        return Ok(());
    }
    if rest.is_empty() {
        return match fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("cannot remove {}", path.display()))
            }
            _ => Ok(()),
        };
    }
    let tmp = path.with_extension("jsonl.tmp");
    let mut text = Vec::new();
    for q in rest {
        text.extend(serde_json::to_vec(q)?);
        text.push(b'\n');
    }
    let mut file = File::create(&tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
    file.write_all(&text).and_then(|()| file.sync_all()).with_context(|| format!("cannot write {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("cannot replace {}", path.display()))
}

/// Session ids with a journal under `sessions`.
pub fn journaled(sessions: &Path) -> Vec<String> {
    let Ok(rd) = fs::read_dir(sessions.join(".queue")) else { return Vec::new() };
    rd.flatten()
        .filter_map(|e| {
            let path = e.path();
            (path.extension().is_some_and(|x| x == "jsonl")).then(|| path.file_stem()?.to_str().map(str::to_owned))?
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn append_read_forget_and_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = journal_path(dir.path(), "s1");
        assert!(read(&path).unwrap().is_empty());
        for n in 1..=3 {
            append(&path, &QueuedPrompt { n, prompt: format!("p{n}") }).unwrap();
        }
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"n":4,"pro"#).unwrap();
        assert_eq!(read(&path).unwrap().iter().map(|q| q.n).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(journaled(dir.path()), ["s1"]);
        append(&path, &QueuedPrompt { n: 5, prompt: "after the tear".to_owned() }).unwrap();
        assert_eq!(read(&path).unwrap().iter().map(|q| q.n).collect::<Vec<_>>(), [1, 2, 3, 5]);
        forget_through(&path, 2).unwrap();
        assert_eq!(read(&path).unwrap().iter().map(|q| q.n).collect::<Vec<_>>(), [3, 5]);
        forget_through(&path, 5).unwrap();
        assert!(!path.exists());
        forget_through(&path, 5).unwrap();
    }
}
