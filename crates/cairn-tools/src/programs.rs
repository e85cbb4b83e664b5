//! Finding a configured program (an MCP server, a hook) and what it needs
//! to read to start under the sandbox: `~/` expansion, `PATH` lookup, the
//! program file and its recognised install (and those of its `#!`
//! interpreter); and the developer configuration every sandboxed process
//! reads. It must not decide any other access (the callers' configurations
//! do), and never grants a directory only because a program lies in it.

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

/// Why a program's install cannot be granted as it lies.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InstallError {
    /// The install its layout names would grant `$HOME`, `/tmp` or `/`.
    #[error(
        "`{program}` is laid out as an install rooted at {root}, which would let it read all of {root}; move it \
         into a directory of its own (a venv, an npm prefix) or list what it needs in `read`"
    )]
    TooWide {
        /// The program (or its interpreter).
        program: String,
        /// The install root that was refused.
        root: String,
    },
}

/// What a program needs to read to run (read-only): the program file
/// itself, as named and as its links resolve, and the install it belongs
/// to, by layout — a `node_modules` tree: the outermost `node_modules`
/// above it (hoisted dependencies live there); a venv (`bin/` under a
/// directory holding `pyvenv.cfg`): its root; an interpreter's own install
/// (`PREFIX/bin/X`, a pyenv, nvm or `/opt` Python or Node,
/// `~/.local/bin`): `PREFIX/lib` and `PREFIX/lib64` — never the program's
/// directory as such, so a script in `$HOME` reads nothing next to it.
/// The same for a script's `#!` interpreter. System prefixes are readable
/// anyway. An install root that is or holds `$HOME`, `/tmp` or `/` is
/// refused ([`InstallError::TooWide`]).
pub fn install_reads(program: &Path) -> Result<Vec<PathBuf>, InstallError> {
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
    install_reads_in(program, home.as_deref())
}

fn install_reads_in(program: &Path, home: Option<&Path>) -> Result<Vec<PathBuf>, InstallError> {
    let mut reads = Vec::new();
    let mut programs = vec![program.to_path_buf()];
    if let Some(interpreter) = shebang(program) {
        programs.push(interpreter);
    }
    for program in programs {
        for p in [Some(program.clone()), program.canonicalize().ok()].into_iter().flatten() {
            for root in layout_roots(&p, home) {
                // Everything a wider root would grant is what this rule
                // exists to keep out.
                if Path::new("/tmp").starts_with(&root) || home.is_some_and(|h| h.starts_with(&root)) {
                    return Err(InstallError::TooWide {
                        program: p.display().to_string(),
                        root: root.display().to_string(),
                    });
                }
                reads.push(root);
            }
            reads.push(p);
        }
    }
    reads.sort();
    reads.dedup();
    Ok(reads)
}

/// The install roots `program`'s path belongs to, by layout (see
/// [`install_reads`]).
fn layout_roots(program: &Path, home: Option<&Path>) -> Vec<PathBuf> {
    if let Some(top) = program.ancestors().skip(1).filter(|a| a.file_name().is_some_and(|n| n == "node_modules")).last()
    {
        return vec![top.to_path_buf()];
    }
    let Some(prefix) = program.parent().filter(|d| d.file_name().is_some_and(|n| n == "bin")).and_then(Path::parent)
    else {
        return Vec::new();
    };
    if prefix.join("pyvenv.cfg").is_file() {
        return vec![prefix.to_path_buf()];
    }
    // `~/bin`, `/bin`, `/usr/bin` are not an interpreter's own install.
    if prefix == Path::new("/") || prefix == Path::new("/usr") || home.is_some_and(|h| h == prefix) {
        return Vec::new();
    }
    ["lib", "lib64"].into_iter().map(|l| prefix.join(l)).filter(|d| d.is_dir()).collect()
}

/// Developer tools' read-only configuration every sandboxed process may
/// read (the defaults of `sandbox_read_paths`), under `home`: git's
/// (`~/.gitconfig`, `$XDG_CONFIG_HOME/git/{config,ignore,attributes}` —
/// not `credentials`) and cargo's (`~/.cargo/config.toml`, `config` —
/// not `credentials.toml`). Files, never their directories; nothing that
/// holds keys or tokens (`.ssh`, `.aws`, `.npmrc`, `.netrc`, `.pypirc`,
/// `.git-credentials`, `.docker/config.json` stay unreadable).
pub fn developer_config(home: &Path, xdg_config_home: Option<&Path>) -> Vec<PathBuf> {
    let xdg = xdg_config_home.filter(|p| p.is_absolute()).map_or_else(|| home.join(".config"), Path::to_path_buf);
    vec![
        home.join(".gitconfig"),
        xdg.join("git/config"),
        xdg.join("git/ignore"),
        xdg.join("git/attributes"),
        home.join(".cargo/config.toml"),
        home.join(".cargo/config"),
    ]
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

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap_or(Path::new("/"))).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(path, text).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn a_venv_script_brings_the_venv_and_its_interpreter_s_libraries() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let venv = dir.path().join("venv");
        write(&venv.join("pyvenv.cfg"), "home = /opt/python3.11/bin\n");
        let script = venv.join("bin/server");
        write(&script, "#!/opt/python3.11/bin/python3\nprint()\n");
        let reads = install_reads_in(&script, Some(Path::new("/home/u"))).unwrap_or_else(|e| panic!("{e}"));
        for want in [script.clone(), venv.clone(), PathBuf::from("/opt/python3.11/bin/python3")] {
            assert!(reads.contains(&want), "{want:?} in {reads:?}");
        }
        assert!(!reads.contains(&venv.join("bin")) && !reads.contains(&PathBuf::from("/opt/python3.11/bin")));
    }

    #[test]
    fn a_node_modules_program_brings_the_whole_tree_with_hoisted_dependencies() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let modules = dir.path().join("proj/node_modules");
        let main = modules.join("@scope/server/dist/index.js");
        write(&main, "#!/usr/bin/env node\n");
        write(&modules.join("hoisted-dep/index.js"), "\n");
        std::fs::create_dir_all(modules.join(".bin")).unwrap_or_else(|e| panic!("{e}"));
        let link = modules.join(".bin/server");
        std::os::unix::fs::symlink("../@scope/server/dist/index.js", &link).unwrap_or_else(|e| panic!("{e}"));
        let reads = install_reads_in(&link, None).unwrap_or_else(|e| panic!("{e}"));
        assert!(reads.contains(&modules), "{reads:?}");
        assert!(!reads.contains(&dir.path().join("proj")), "{reads:?}");
    }

    #[test]
    fn a_script_in_home_reads_only_itself_and_a_venv_at_home_is_refused() {
        let home = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let script = home.path().join("my_mcp.py");
        write(&script, "#!/bin/sh\n");
        write(&home.path().join(".ssh/id_ed25519"), "secret\n");
        let reads = install_reads_in(&script, Some(home.path())).unwrap_or_else(|e| panic!("{e}"));
        assert!(reads.iter().all(|r| !home.path().starts_with(r)), "{reads:?}");
        assert!(reads.contains(&script));
        let bin = home.path().join("bin/server");
        write(&bin, "#!/bin/sh\n");
        let reads = install_reads_in(&bin, Some(home.path())).unwrap_or_else(|e| panic!("{e}"));
        assert!(reads.iter().all(|r| !home.path().starts_with(r) && !r.ends_with("lib")), "{reads:?}");
        write(&home.path().join("pyvenv.cfg"), "home = /usr/bin\n");
        let refused = install_reads_in(&bin, Some(home.path()));
        assert!(matches!(refused, Err(InstallError::TooWide { .. })), "{refused:?}");
    }
}
