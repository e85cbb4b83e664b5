//! The tree's `core.hooksPath` (issue 46): where the repository at the
//! root of a working tree tells git to find its hooks, so that the
//! authority rule (`cairn_core::authority`) treats files there as hooks.
//!
//! It owns reading that one setting from the tree's `.git/config`: through
//! [`Beneath`] (no link followed, regular files only) and at most
//! [`MAX_CONFIG_BYTES`], since a tool may have planted the file; what
//! cannot be read that way counts as no hooks path. It must not run git
//! (a planted configuration would run as cairn) nor follow `include`s.

use std::io::Read as _;
use std::path::{Component, Path, PathBuf};

use cairn_core::authority::AuthorityRules;

use crate::beneath::Beneath;

/// The most of `.git/config` read; a larger file is read this far.
pub const MAX_CONFIG_BYTES: u64 = 256 * 1024;

/// `rules` with the hooks path of the repository at the root of `tree`
/// (absolute) added, when its `.git/config` names one.
pub fn authority_here(rules: &AuthorityRules, tree: &Path) -> AuthorityRules {
    let mut here = rules.clone();
    if let Some(dir) = hooks_path(tree, rules.home.as_deref()) {
        here.hooks_dirs.push(dir);
    }
    here
}

/// The `core.hooksPath` of the repository whose work tree is `tree`, made
/// absolute (relative to the tree, `~/` to `home`), folded lexically.
pub fn hooks_path(tree: &Path, home: Option<&Path>) -> Option<PathBuf> {
    let dir = Beneath::open(tree).ok()?;
    let file = dir.open_file(".git/config").ok()?;
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES).read_to_string(&mut text).ok()?;
    let value = core_hooks_path(&text)?;
    let given = match value.strip_prefix("~/") {
        Some(rest) => home?.join(rest),
        None => tree.join(&value),
    };
    let mut out = PathBuf::new();
    for c in given.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

/// The last `hooksPath` of a `[core]` section in git configuration text
/// (names case-insensitive, a quoted value unquoted, a trailing comment
/// dropped).
fn core_hooks_path(text: &str) -> Option<String> {
    let mut in_core = false;
    let mut found = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix('[') {
            let name = rest.split([']', ' ', '"', '.']).next().unwrap_or("");
            in_core = name.eq_ignore_ascii_case("core") && !rest.contains('.') && !rest.contains('"');
            continue;
        }
        if !in_core {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else { continue };
        if !key.trim().eq_ignore_ascii_case("hookspath") {
            continue;
        }
        let value = value.trim();
        let value = match value.strip_prefix('"') {
            Some(quoted) => quoted.split('"').next().unwrap_or("").to_owned(),
            None => value.split(['#', ';']).next().unwrap_or("").trim().to_owned(),
        };
        if !value.is_empty() {
            found = Some(value);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_core_hooks_path_is_read() {
        let text = "[core]\n\tbare = false\n\thooksPath = one\n[remote \"core\"]\n\thooksPath = no\n[Core]\n\tHOOKSPATH = \"two dirs\" # c\n[user]\n\thooksPath = no\n";
        assert_eq!(core_hooks_path(text).as_deref(), Some("two dirs"));
        assert_eq!(core_hooks_path("[core]\nhooksPath = .githooks ; x\n").as_deref(), Some(".githooks"));
        assert_eq!(core_hooks_path("[core]\n\tbare = false\n"), None);
    }

    #[test]
    fn a_hooks_path_is_read_beneath_the_tree_only() {
        let tree = tempfile::tempdir().unwrap();
        std::fs::create_dir(tree.path().join(".git")).unwrap();
        std::fs::write(tree.path().join(".git/config"), "[core]\n\thooksPath = tools/../hooks\n").unwrap();
        assert_eq!(hooks_path(tree.path(), None), Some(tree.path().join("hooks")));
        // A link is not followed: no hooks path.
        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join("config"), "[core]\n\thooksPath = x\n").unwrap();
        std::fs::remove_file(tree.path().join(".git/config")).unwrap();
        std::os::unix::fs::symlink(other.path().join("config"), tree.path().join(".git/config")).unwrap();
        assert_eq!(hooks_path(tree.path(), None), None);
    }
}
