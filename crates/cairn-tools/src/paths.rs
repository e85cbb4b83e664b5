//! Path confinement: every path a built-in tool touches resolves inside the
//! session's working directory.
//!
//! This module owns the rule "no `..`, no absolute path outside the working
//! directory, no symlink that leads outside it", checked before anything
//! runs. It canonicalizes the longest existing ancestor (so symlinks are
//! followed to where they really lead, `/proc/self/root` included) and
//! appends the not-yet-existing rest, which therefore cannot contain a
//! symlink. It does not open files and cannot close the race between this
//! check and the later open; the Landlock sandbox is the second fence for
//! processes, and built-ins open with `O_NOFOLLOW` on the final component.

use std::path::{Component, Path, PathBuf};

/// Why a path was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum PathError {
    /// The path was empty.
    #[error("the path is empty: give a path relative to the working directory")]
    Empty,
    /// The path contains a `..` component.
    #[error("'{0}' contains '..': give a path inside the working directory without '..'")]
    ParentComponent(String),
    /// The path resolves outside the working directory.
    #[error(
        "'{path}' resolves to '{resolved}', outside the working directory '{cwd}': only paths inside it are allowed"
    )]
    Outside {
        /// The path as given.
        path: String,
        /// Where it really leads.
        resolved: String,
        /// The working directory.
        cwd: String,
    },
    /// A symlink along the path points nowhere.
    #[error("'{0}' is or passes through a dangling symlink: fix or remove the link")]
    Dangling(String),
    /// The working directory itself cannot be resolved.
    #[error("the working directory '{0}' cannot be resolved: {1}")]
    Cwd(String, String),
}

/// Canonical form of the working directory.
pub fn canonical_cwd(cwd: &Path) -> Result<PathBuf, PathError> {
    cwd.canonicalize().map_err(|e| PathError::Cwd(cwd.display().to_string(), e.to_string()))
}

/// Resolve `path` (relative to `cwd`, or absolute) to a canonical path inside
/// `cwd`. The file need not exist yet; its existing ancestors are resolved
/// through symlinks and the result must stay inside the canonical `cwd`.
pub fn resolve_in_cwd(cwd: &Path, path: &str) -> Result<PathBuf, PathError> {
    if path.is_empty() {
        return Err(PathError::Empty);
    }
    let given = Path::new(path);
    if given.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(PathError::ParentComponent(path.to_string()));
    }
    let root = canonical_cwd(cwd)?;
    let full = if given.is_absolute() { given.to_path_buf() } else { root.join(given) };

    // Walk up to the longest ancestor that exists (as a link or a file).
    let mut existing = full.as_path();
    let mut rest: Vec<&std::ffi::OsStr> = Vec::new();
    loop {
        if existing.symlink_metadata().is_ok() {
            break;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name);
                existing = parent;
            }
            _ => break,
        }
    }
    let mut resolved = existing.canonicalize().map_err(|_| PathError::Dangling(path.to_string()))?;
    for name in rest.iter().rev() {
        resolved.push(name);
    }
    if !resolved.starts_with(&root) {
        return Err(PathError::Outside {
            path: path.to_string(),
            resolved: resolved.display().to_string(),
            cwd: root.display().to_string(),
        });
    }
    Ok(resolved)
}

/// `path` shown relative to `cwd` when it is inside it.
pub fn display_rel(cwd: &Path, path: &Path) -> String {
    let root = cwd.canonicalize().unwrap_or_else(|_| cwd.to_path_buf());
    match path.strip_prefix(&root) {
        Ok(rel) if rel.as_os_str().is_empty() => ".".to_string(),
        Ok(rel) => rel.display().to_string(),
        Err(_) => path.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inside_paths_resolve_and_new_files_are_allowed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        let p = resolve_in_cwd(dir.path(), "a/new/file.txt").unwrap();
        assert!(p.ends_with("a/new/file.txt"));
        assert!(p.starts_with(dir.path().canonicalize().unwrap()));
        let abs = dir.path().join("a").display().to_string();
        assert!(resolve_in_cwd(dir.path(), &abs).is_ok());
    }

    #[test]
    fn dotdot_absolute_and_symlink_escapes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        assert!(matches!(resolve_in_cwd(dir.path(), "../x"), Err(PathError::ParentComponent(_))));
        assert!(matches!(resolve_in_cwd(dir.path(), "a/../../x"), Err(PathError::ParentComponent(_))));
        assert!(matches!(resolve_in_cwd(dir.path(), "/etc/passwd"), Err(PathError::Outside { .. })));
        assert!(matches!(resolve_in_cwd(dir.path(), "/proc/self/root/etc/passwd"), Err(PathError::Outside { .. })));
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
        assert!(matches!(resolve_in_cwd(dir.path(), "link/new.txt"), Err(PathError::Outside { .. })));
        std::os::unix::fs::symlink("/proc/self/root/tmp", dir.path().join("proc")).unwrap();
        assert!(matches!(resolve_in_cwd(dir.path(), "proc/x"), Err(PathError::Outside { .. })));
        std::os::unix::fs::symlink(dir.path().join("nowhere"), dir.path().join("dangling")).unwrap();
        assert!(matches!(resolve_in_cwd(dir.path(), "dangling"), Err(PathError::Dangling(_))));
        assert_eq!(resolve_in_cwd(dir.path(), ""), Err(PathError::Empty));
    }
}
