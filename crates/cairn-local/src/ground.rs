//! Grounded path arguments: the existing files and directories under the
//! session's working tree that a tool's path parameter may name.
//!
//! A tool marks a string parameter as a path with `"format": "path"`; with
//! `"x-exists"` (`"file"`, `"directory"`, or `true` for either) it must name
//! an existing entry. The grammar then lets the model write only one of the
//! [`PathCandidates`] found here, so it chooses among real paths instead of
//! inventing one (see the module doc of [`crate::grammar`]).
//!
//! The candidates are bounded whatever the tree holds:
//! - paths named in the conversation come first ([`mentioned_paths`]; at most
//!   [`MAX_MENTIONED`]) when they exist inside the tree;
//! - then a breadth-first walk, names sorted per directory, at most
//!   [`MAX_DEPTH`] levels deep, reading at most [`MAX_ENTRIES_PER_DIR`]
//!   entries of any one directory, until [`MAX_CANDIDATES`] paths are held.
//!
//! Hidden entries (`.name`) and the build directories `target` and
//! `node_modules` are not walked (a path named in the conversation is still
//! a candidate), and symbolic links are never candidates, so a candidate
//! cannot lead outside the tree. Paths are relative, `/`-separated, without
//! `.` or `..` components; the working directory itself is the directory
//! candidate `.`.
//!
//! This module reads directory listings only (never file contents) and must
//! not know about tokens or the model.

use std::collections::{HashSet, VecDeque};
use std::path::{Component, Path};

/// Deepest level walked (1 = the working directory's own entries).
pub const MAX_DEPTH: usize = 4;
/// Most candidates (files and directories together).
pub const MAX_CANDIDATES: usize = 512;
/// Most entries read from one directory (a huge directory is cut).
pub const MAX_ENTRIES_PER_DIR: usize = 4096;
/// Most paths taken from the conversation.
pub const MAX_MENTIONED: usize = 64;
/// Directories never walked into (unless named in the conversation).
const SKIPPED_DIRS: [&str; 2] = ["target", "node_modules"];

/// What kind of entry a grounded parameter names (`x-exists`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// Either.
    Any,
}

/// Existing paths under a working tree, in priority order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathCandidates {
    files: Vec<String>,
    dirs: Vec<String>,
    /// Whether the walk stopped at a bound (more entries exist).
    truncated: bool,
}

impl PathCandidates {
    /// Candidates from explicit lists (for tests and hosts that know them).
    pub fn from_lists(files: Vec<String>, dirs: Vec<String>) -> Self {
        Self { files, dirs, truncated: false }
    }

    /// Walk `root` within the bounds of this module, the paths in
    /// `mentioned` (relative to `root`) first. An unreadable root gives no
    /// candidates except `.`.
    pub fn scan(root: &Path, mentioned: &[String]) -> Self {
        let mut out = Self { files: Vec::new(), dirs: vec![".".to_string()], truncated: false };
        let mut seen: HashSet<String> = HashSet::new();
        for rel in mentioned.iter().take(MAX_MENTIONED) {
            let Some(rel) = normalise(rel) else { continue };
            if seen.contains(&rel) {
                continue;
            }
            // Not followed through symlinks: each component must be a real
            // directory, the last a file or directory.
            let Some(kind) = real_kind(root, &rel) else { continue };
            seen.insert(rel.clone());
            match kind {
                PathKind::Directory => out.dirs.push(rel),
                _ => out.files.push(rel),
            }
        }
        let mut queue: VecDeque<(String, usize)> = VecDeque::from([(String::new(), 1)]);
        'walk: while let Some((dir, depth)) = queue.pop_front() {
            let full = if dir.is_empty() { root.to_path_buf() } else { root.join(&dir) };
            let Ok(reader) = std::fs::read_dir(&full) else { continue };
            let mut entries: Vec<(String, bool)> = Vec::new();
            for entry in reader.flatten() {
                if entries.len() == MAX_ENTRIES_PER_DIR {
                    out.truncated = true;
                    break;
                }
                let Ok(name) = entry.file_name().into_string() else { continue };
                let Ok(ft) = entry.file_type() else { continue };
                if name.starts_with('.') || ft.is_symlink() || !(ft.is_dir() || ft.is_file()) {
                    continue;
                }
                entries.push((name, ft.is_dir()));
            }
            entries.sort();
            for (name, is_dir) in entries {
                if out.len() >= MAX_CANDIDATES {
                    out.truncated = true;
                    break 'walk;
                }
                let rel = if dir.is_empty() { name.clone() } else { format!("{dir}/{name}") };
                if !seen.insert(rel.clone()) {
                    continue;
                }
                if is_dir {
                    if depth < MAX_DEPTH && !SKIPPED_DIRS.contains(&name.as_str()) {
                        queue.push_back((rel.clone(), depth + 1));
                    }
                    out.dirs.push(rel);
                } else {
                    out.files.push(rel);
                }
            }
        }
        out
    }

    /// Number of candidates (files and directories, `.` included).
    pub fn len(&self) -> usize {
        self.files.len() + self.dirs.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a bound cut the walk short.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The files, in priority order.
    pub fn files(&self) -> &[String] {
        &self.files
    }

    /// The directories, in priority order (`.` first).
    pub fn dirs(&self) -> &[String] {
        &self.dirs
    }

    /// A short listing for the prompt: at most `n` candidates (`.` left
    /// out), shallow ones first, directories ending with `/`.
    pub fn listing(&self, n: usize) -> Vec<String> {
        let mut all: Vec<String> = self
            .files
            .iter()
            .cloned()
            .chain(self.dirs.iter().filter(|d| d.as_str() != ".").map(|d| format!("{d}/")))
            .collect();
        all.sort_by_key(|p| (p.trim_end_matches('/').matches('/').count(), p.clone()));
        all.truncate(n);
        all
    }

    /// The candidates a parameter of this kind may name.
    pub fn of_kind(&self, kind: PathKind) -> Vec<&str> {
        let files = self.files.iter().map(String::as_str);
        let dirs = self.dirs.iter().map(String::as_str);
        match kind {
            PathKind::File => files.collect(),
            PathKind::Directory => dirs.collect(),
            PathKind::Any => files.chain(dirs).collect(),
        }
    }
}

/// A relative path as a candidate: `/`-separated normal components only
/// (`./a` becomes `a`), `None` for an absolute path, `..`, or nothing left.
fn normalise(path: &str) -> Option<String> {
    let p = Path::new(path);
    let mut parts = Vec::new();
    for c in p.components() {
        match c {
            Component::Normal(s) => parts.push(s.to_str()?),
            Component::CurDir => {}
            _ => return None,
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// The kind of `rel` under `root` when every component is a real (not
/// symlinked) directory and the last a regular file or directory.
fn real_kind(root: &Path, rel: &str) -> Option<PathKind> {
    let mut at = root.to_path_buf();
    let parts: Vec<&str> = rel.split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        at.push(part);
        let meta = std::fs::symlink_metadata(&at).ok()?;
        let last = i + 1 == parts.len();
        if meta.file_type().is_symlink() || (!last && !meta.is_dir()) {
            return None;
        }
        if last {
            return if meta.is_dir() {
                Some(PathKind::Directory)
            } else if meta.is_file() {
                Some(PathKind::File)
            } else {
                None
            };
        }
    }
    None
}

/// Words of `text` that look like paths (contain `.` or `/` between other
/// characters), stripped of surrounding quotes and punctuation, in order of
/// appearance, at most [`MAX_MENTIONED`]. Whether they exist is checked by
/// [`PathCandidates::scan`].
pub fn mentioned_paths(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    // `:` too: search results read `path:line:text`.
    let separators =
        |c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | ',' | ';' | ':' | '(' | ')' | '<' | '>');
    for word in text.split(separators) {
        let word = word.trim_start_matches(['[', '{', '*']).trim_end_matches(['.', '!', '?', ']', '}', '*']);
        let looks_like_path = word.len() > 2 && (word.contains('.') || word.contains('/'));
        if looks_like_path && !out.iter().any(|w| w == word) {
            out.push(word.to_string());
            if out.len() == MAX_MENTIONED {
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_paths_in_prose() {
        let found = mentioned_paths(
            "Read notes.txt and `src/main.rs`, then (docs/a.md). Also \"x y\" and 3.5? v1.2.\nlib/x.rs:3:fn notes.txt",
        );
        assert_eq!(found, ["notes.txt", "src/main.rs", "docs/a.md", "3.5", "v1.2", "lib/x.rs"]);
    }

    #[test]
    fn scan_orders_named_first_and_stays_inside() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/deep.txt"), "x").unwrap();
        std::fs::write(root.join("top.txt"), "x").unwrap();
        std::fs::write(root.join(".hidden"), "x").unwrap();
        std::os::unix::fs::symlink("/etc", root.join("link")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("pw")).unwrap();
        let named = vec!["a/b/deep.txt".to_string(), "../x".to_string(), "/etc/passwd".to_string(), "pw".into()];
        let c = PathCandidates::scan(root, &named);
        assert_eq!(c.files(), ["a/b/deep.txt", "top.txt"]);
        assert_eq!(c.dirs(), [".", "a", "a/b"]);
        let named_hidden = vec![".hidden".to_string(), "./top.txt".into()];
        let c = PathCandidates::scan(root, &named_hidden);
        assert_eq!(c.files(), [".hidden", "top.txt", "a/b/deep.txt"]);
    }
}
