//! Finding a configured program (an MCP server, a hook) and what it needs
//! to read to start under the sandbox: `~/` expansion, `PATH` lookup, the
//! program's install directories and those of its `#!` interpreter. It
//! must not decide any other access (the callers' configurations do).

use std::io::Read;
use std::path::{Path, PathBuf};

/// What a configured program may do with the session's working directory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FileAccess {
    /// Nothing: the working directory is not visible.
    None,
    /// Read it (the default).
    #[default]
    Read,
    /// Read and write it.
    Write,
}

/// `~/x` → `$HOME/x`.
pub fn expand(path: &Path) -> PathBuf {
    match (path.strip_prefix("~"), std::env::var_os("HOME")) {
        (Ok(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => path.to_path_buf(),
    }
}

/// `program` on cairn's `PATH` (or as a path when it has a `/`).
pub fn resolve(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(expand(Path::new(program)));
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join(program)).find(|p| p.is_file())
}

/// What a program needs to read to run: its directory and, for a program
/// in a `bin/` directory (a venv, a Node or pyenv install), the prefix
/// above it, for the link and for what it points to; for a script, the
/// same for its `#!` interpreter (a venv's `python` links into the
/// interpreter's own install).
pub fn install_dirs(program: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut programs = vec![program.to_path_buf()];
    if let Some(interpreter) = shebang(program) {
        programs.push(interpreter);
    }
    for program in programs {
        for p in [Some(program.clone()), program.canonicalize().ok()].into_iter().flatten() {
            if let Some(dir) = p.parent() {
                dirs.push(dir.to_path_buf());
                if dir.file_name().is_some_and(|n| n == "bin")
                    && let Some(prefix) = dir.parent()
                    && prefix != Path::new("/")
                    && prefix != Path::new("/usr")
                {
                    dirs.push(prefix.to_path_buf());
                }
            }
        }
    }
    dirs.sort();
    dirs.dedup();
    dirs
}

/// The interpreter of a `#!` script (`#!/usr/bin/env X` names no path of
/// its own: `X` is looked up on `PATH`).
fn shebang(program: &Path) -> Option<PathBuf> {
    let mut head = [0u8; 256];
    let n = std::fs::File::open(program).and_then(|mut f| f.read(&mut head)).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = String::from_utf8_lossy(line.split(|b| *b == b'\n').next()?).into_owned();
    let mut words = line.split_whitespace();
    let first = words.next()?;
    if first.ends_with("/env") {
        return resolve(words.find(|w| !w.starts_with('-'))?);
    }
    Some(PathBuf::from(first))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_brings_its_interpreter_s_install() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let bin = dir.path().join("venv/bin");
        std::fs::create_dir_all(&bin).unwrap_or_else(|e| panic!("{e}"));
        let script = bin.join("server");
        std::fs::write(&script, "#!/opt/python3.11/bin/python3\nprint()\n").unwrap_or_else(|e| panic!("{e}"));
        let dirs = install_dirs(&script);
        for want in [
            bin.clone(),
            dir.path().join("venv"),
            PathBuf::from("/opt/python3.11/bin"),
            PathBuf::from("/opt/python3.11"),
        ] {
            assert!(dirs.contains(&want), "{want:?} in {dirs:?}");
        }
        assert!(!dirs.contains(&PathBuf::from("/usr")) && !dirs.contains(&PathBuf::from("/")));
    }
}
