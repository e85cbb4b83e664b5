//! Workspace trust: whether the external tools a working directory ships in
//! `.cairn/tools/` may be loaded.
//!
//! A repository is not its reader: anyone who can commit to one can put a
//! tool in its `.cairn/tools/`, and a tool runs with the capabilities it
//! declares. So tools found in a working directory load only after a person
//! trusted that directory once, like direnv's `allow`: the record names the
//! canonical workspace path and a fingerprint of everything in its
//! `.cairn/tools/` (manifests, executables, helper files) and of its
//! `.cairn/config.toml` (MCP servers and hooks). When any of those
//! files changes, is added or removed, the fingerprint no longer matches and
//! the directory is untrusted again until a person looks and trusts it anew.
//! The user's own tools directories (cairn's data and config directories)
//! are always trusted; they never pass through here.
//!
//! This module owns the record (a JSON file whose location the host
//! chooses), the fingerprint and the check. It asks nobody, prints nothing,
//! and never trusts on its own: only [`TrustStore::trust`] adds a record.

use std::io::{self, Write as _};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The format version written to the trust file.
pub const TRUST_FILE_VERSION: u32 = 1;

/// Where a working directory keeps its own tools, relative to it.
pub const WORKSPACE_TOOLS_DIR: &str = ".cairn/tools";

/// A working directory's own configuration (its MCP servers and hooks),
/// relative to it: read only while trusted, like its tools, and part of
/// the same fingerprint.
pub const WORKSPACE_CONFIG: &str = ".cairn/config.toml";

/// What can go wrong reading, writing or checking trust.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// The trust file exists but cannot be read.
    #[error("cannot read the trust file {}: {source}", path.display())]
    Read {
        /// The trust file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The trust file is not what cairn writes.
    #[error(
        "the trust file {} is not valid ({reason}); fix or delete it, then trust your workspaces again",
        path.display()
    )]
    Invalid {
        /// The trust file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The trust file cannot be written.
    #[error("cannot write the trust file {}: {source}", path.display())]
    Write {
        /// The trust file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// This store has no file to save to (built with [`TrustStore::empty`]).
    #[error("this trust store has no file to save to")]
    NoFile,
    /// The workspace directory cannot be resolved.
    #[error("{}: cannot resolve the directory: {source}", path.display())]
    Workspace {
        /// The directory as given.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The workspace has no tools directory and no configuration, so there
    /// is nothing to trust.
    #[error(
        "{} has neither {WORKSPACE_TOOLS_DIR}/ nor {WORKSPACE_CONFIG}: there is nothing of the workspace to trust",
        path.display()
    )]
    NoTools {
        /// The workspace.
        path: PathBuf,
    },
    /// A file of the tools directory cannot be read for the fingerprint.
    #[error("cannot fingerprint the tools in {}: {source}", path.display())]
    Fingerprint {
        /// The path that could not be read.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// One trusted workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrustRecord {
    /// The canonical path of the working directory.
    pub workspace: PathBuf,
    /// [`fingerprint`] of its `.cairn/tools/` when it was trusted.
    pub fingerprint: String,
    /// When it was trusted (ms since the Unix epoch).
    pub trusted_at: i64,
    /// The tool names (`*.toml` stems) it held then, for listings.
    pub tools: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TrustFile {
    version: u32,
    workspaces: Vec<TrustRecord>,
}

/// Whether a workspace's tools may be loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrustState {
    /// Trusted, and its tools are byte for byte what was trusted.
    Trusted,
    /// Never trusted (or the trust was revoked).
    Untrusted,
    /// Trusted once, but its tools changed since: untrusted until trusted
    /// again.
    Changed,
}

/// The trusted workspaces, as read from (and saved to) one file.
#[derive(Debug, Clone, Default)]
pub struct TrustStore {
    path: Option<PathBuf>,
    records: Vec<TrustRecord>,
}

impl TrustStore {
    /// A store that trusts nothing and has no file (for embedders that never
    /// load workspace tools, and for tests).
    pub fn empty() -> Self {
        Self::default()
    }

    /// Read `path`; a missing file is an empty store that will be created
    /// on [`TrustStore::save`]. An unreadable or invalid file is an error,
    /// never silently replaced.
    pub fn load(path: &Path) -> Result<Self, TrustError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(Self { path: Some(path.to_path_buf()), records: Vec::new() });
            }
            Err(source) => return Err(TrustError::Read { path: path.to_path_buf(), source }),
        };
        let invalid = |reason: String| TrustError::Invalid { path: path.to_path_buf(), reason };
        let file: TrustFile = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        if file.version != TRUST_FILE_VERSION {
            return Err(invalid(format!(
                "version {} is not the version {TRUST_FILE_VERSION} this cairn understands",
                file.version
            )));
        }
        Ok(Self { path: Some(path.to_path_buf()), records: file.workspaces })
    }

    /// The file this store reads and saves, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Write the store atomically (temp file in the same directory, fsync,
    /// rename), creating the directory if needed. Two processes saving at
    /// once: the last one wins, and a lost record only means a workspace is
    /// untrusted again (fails closed).
    pub fn save(&self) -> Result<(), TrustError> {
        let path = self.path.as_deref().ok_or(TrustError::NoFile)?;
        let write = |source: io::Error| TrustError::Write { path: path.to_path_buf(), source };
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(write)?;
        let file = TrustFile { version: TRUST_FILE_VERSION, workspaces: self.records.clone() };
        let mut text = serde_json::to_string_pretty(&file).map_err(|e| write(io::Error::other(e)))?;
        text.push('\n');
        let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(write)?;
        tmp.write_all(text.as_bytes()).map_err(write)?;
        tmp.as_file().sync_all().map_err(write)?;
        tmp.persist(path).map_err(|e| write(e.error))?;
        Ok(())
    }

    /// Every trusted workspace, in the order they were trusted.
    pub fn records(&self) -> &[TrustRecord] {
        &self.records
    }

    /// Whether the tools in `tools_dir` of `workspace` may be loaded: the
    /// canonical workspace has a record and the directory's fingerprint is
    /// the recorded one. A workspace that cannot be resolved is untrusted.
    pub fn check(&self, workspace: &Path, tools_dir: &Path) -> Result<TrustState, TrustError> {
        let Ok(canonical) = workspace.canonicalize() else {
            return Ok(TrustState::Untrusted);
        };
        let Some(record) = self.records.iter().find(|r| r.workspace == canonical) else {
            return Ok(TrustState::Untrusted);
        };
        let _ = tools_dir;
        Ok(if workspace_fingerprint(&canonical)? == record.fingerprint {
            TrustState::Trusted
        } else {
            TrustState::Changed
        })
    }

    /// Trust the tools now in `workspace`'s `.cairn/tools/` (replacing an
    /// earlier record of the same directory). Call [`TrustStore::save`] to
    /// keep it.
    pub fn trust(&mut self, workspace: &Path) -> Result<&TrustRecord, TrustError> {
        let canonical = workspace
            .canonicalize()
            .map_err(|source| TrustError::Workspace { path: workspace.to_path_buf(), source })?;
        let tools_dir = canonical.join(WORKSPACE_TOOLS_DIR);
        let has_config = std::fs::symlink_metadata(canonical.join(WORKSPACE_CONFIG)).is_ok();
        if !tools_dir.is_dir() && !has_config {
            return Err(TrustError::NoTools { path: canonical });
        }
        let record = TrustRecord {
            fingerprint: workspace_fingerprint(&canonical)?,
            trusted_at: crate::now_ms(),
            tools: if tools_dir.is_dir() { tool_names(&tools_dir)? } else { Vec::new() },
            workspace: canonical,
        };
        self.records.retain(|r| r.workspace != record.workspace);
        self.records.push(record);
        Ok(&self.records[self.records.len() - 1])
    }

    /// Forget `workspace` (resolved if it still exists, else taken as
    /// given); returns the record it had, if any.
    pub fn revoke(&mut self, workspace: &Path) -> Option<TrustRecord> {
        let key = workspace.canonicalize().unwrap_or_else(|_| workspace.to_path_buf());
        let at = self.records.iter().position(|r| r.workspace == key)?;
        Some(self.records.remove(at))
    }
}

/// The tool names (`*.toml` stems) in `dir`, sorted.
pub(crate) fn tool_names(dir: &Path) -> Result<Vec<String>, TrustError> {
    let read = std::fs::read_dir(dir).map_err(|source| TrustError::Fingerprint { path: dir.to_path_buf(), source })?;
    let mut names: Vec<String> = read
        .flatten()
        .map(|e| PathBuf::from(e.file_name()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    names.sort();
    Ok(names)
}

/// A digest of everything in a tools directory, recursively: each entry's
/// path relative to it and its kind; a regular file's executable bit and
/// bytes; a symlink's target text (links are not followed: what they point
/// to inside the directory is hashed as its own entry, and a tool whose
/// manifest or executable leads outside is refused at load). Any added,
/// removed, renamed, changed or chmod-ed file changes it. The result is
/// `sha256:` and 64 hex digits.
pub fn fingerprint(tools_dir: &Path) -> Result<String, TrustError> {
    let mut hasher = Sha256::new();
    hasher.update(b"cairn-tools-fingerprint-v1\0");
    hash_dir(&mut hasher, tools_dir, Path::new(""))?;
    let digest = hasher.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("sha256:{hex}"))
}

/// What a trust record pins of `workspace`: with no `.cairn/config.toml`,
/// exactly [`fingerprint`] of its tools directory (so records made before
/// the configuration was fingerprinted stay valid); with one, a digest of
/// that fingerprint (or of the directory's absence) and the configuration
/// file (its bytes, or a link's target text: links are not followed).
pub fn workspace_fingerprint(workspace: &Path) -> Result<String, TrustError> {
    let tools_dir = workspace.join(WORKSPACE_TOOLS_DIR);
    let config = workspace.join(WORKSPACE_CONFIG);
    let fail = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TrustError::Fingerprint { path, source }
    };
    let meta = match std::fs::symlink_metadata(&config) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return fingerprint(&tools_dir),
        other => other.map_err(fail(&config))?,
    };
    let mut hasher = Sha256::new();
    hasher.update(b"cairn-workspace-fingerprint-v1\0");
    let tools = if tools_dir.is_dir() { fingerprint(&tools_dir)? } else { "no tools directory".to_owned() };
    field(&mut hasher, tools.as_bytes());
    if meta.file_type().is_symlink() {
        hasher.update(b"L");
        field(&mut hasher, std::fs::read_link(&config).map_err(fail(&config))?.as_os_str().as_bytes());
    } else {
        hasher.update(b"F");
        field(&mut hasher, &std::fs::read(&config).map_err(fail(&config))?);
    }
    let hex: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("sha256:{hex}"))
}

/// Length-prefixed so no two different trees encode to the same bytes.
fn field(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}

fn hash_dir(hasher: &mut Sha256, dir: &Path, rel: &Path) -> Result<(), TrustError> {
    let fail = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TrustError::Fingerprint { path, source }
    };
    let mut entries: Vec<std::fs::DirEntry> =
        std::fs::read_dir(dir).map_err(fail(dir))?.collect::<Result<_, _>>().map_err(fail(dir))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let rel = rel.join(entry.file_name());
        let meta = std::fs::symlink_metadata(&path).map_err(fail(&path))?;
        let kind = meta.file_type();
        if kind.is_symlink() {
            hasher.update(b"L");
            field(hasher, rel.as_os_str().as_bytes());
            let target = std::fs::read_link(&path).map_err(fail(&path))?;
            field(hasher, target.as_os_str().as_bytes());
        } else if kind.is_dir() {
            hasher.update(b"D");
            field(hasher, rel.as_os_str().as_bytes());
            hash_dir(hasher, &path, &rel)?;
            hasher.update(b"d");
        } else if kind.is_file() {
            hasher.update(b"F");
            field(hasher, rel.as_os_str().as_bytes());
            hasher.update([u8::from(meta.permissions().mode() & 0o111 != 0)]);
            let mut file = std::fs::File::open(&path).map_err(fail(&path))?;
            let mut len = 0u64;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = io::Read::read(&mut file, &mut buf).map_err(fail(&path))?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                len += n as u64;
            }
            // The length after the bytes keeps a file's end unambiguous.
            hasher.update(len.to_le_bytes());
        } else {
            // FIFOs, sockets, devices: named, never opened (opening a FIFO
            // would block).
            hasher.update(b"O");
            field(hasher, rel.as_os_str().as_bytes());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let tools = dir.path().join(WORKSPACE_TOOLS_DIR);
        std::fs::create_dir_all(&tools).unwrap();
        std::fs::write(tools.join("t.toml"), "description = \"x\"\n").unwrap();
        std::fs::write(tools.join("t"), "#!/bin/sh\necho hi\n").unwrap();
        (dir, tools)
    }

    #[test]
    fn every_kind_of_change_changes_the_fingerprint() {
        let (_dir, tools) = workspace();
        let mut seen = std::collections::HashSet::new();
        let mut step = |what: &str| {
            let f = fingerprint(&tools).unwrap();
            assert!(f.starts_with("sha256:") && f.len() == 7 + 64, "{f}");
            assert!(seen.insert(f), "the fingerprint did not change after: {what}");
        };
        step("start");
        std::fs::write(tools.join("t"), "#!/bin/sh\necho HI\n").unwrap();
        step("an executable's bytes");
        std::fs::set_permissions(tools.join("t"), std::fs::Permissions::from_mode(0o755)).unwrap();
        step("chmod +x");
        std::fs::write(tools.join("lib.sh"), "").unwrap();
        step("an empty helper file added");
        std::fs::create_dir(tools.join("sub")).unwrap();
        step("an empty directory added");
        std::fs::rename(tools.join("lib.sh"), tools.join("sub/lib.sh")).unwrap();
        step("a file moved into a subdirectory");
        std::os::unix::fs::symlink("t", tools.join("alias")).unwrap();
        step("a symlink added");
        std::fs::remove_file(tools.join("alias")).unwrap();
        std::os::unix::fs::symlink("sub/lib.sh", tools.join("alias")).unwrap();
        step("a symlink retargeted");
        std::fs::write(tools.join("t.toml"), "description = \"y\"\n").unwrap();
        step("a manifest's bytes");
    }

    #[test]
    fn the_workspace_configuration_is_pinned_and_old_records_stay_valid() {
        let dir = tempfile::tempdir().unwrap();
        let tools = dir.path().join(WORKSPACE_TOOLS_DIR);
        std::fs::create_dir_all(&tools).unwrap();
        std::fs::write(tools.join("t.toml"), "x").unwrap();
        // No configuration: exactly the tools' fingerprint, as records made
        // before hold.
        assert_eq!(workspace_fingerprint(dir.path()).unwrap(), fingerprint(&tools).unwrap());
        let config = dir.path().join(WORKSPACE_CONFIG);
        std::fs::write(&config, "[hooks]\n").unwrap();
        let with = workspace_fingerprint(dir.path()).unwrap();
        assert_ne!(with, fingerprint(&tools).unwrap());
        std::fs::write(&config, "[hooks]\n\n").unwrap();
        assert_ne!(workspace_fingerprint(dir.path()).unwrap(), with, "a changed configuration is untrusted");
        // A configuration alone can be trusted.
        std::fs::remove_dir_all(&tools).unwrap();
        let mut store = TrustStore::empty();
        assert!(store.trust(dir.path()).is_ok());
        assert_eq!(store.check(dir.path(), &tools).unwrap(), TrustState::Trusted);
    }

    #[test]
    fn file_boundaries_are_part_of_the_fingerprint() {
        let (_a, one) = workspace();
        let (_b, two) = workspace();
        std::fs::write(one.join("a"), "xy").unwrap();
        std::fs::write(one.join("b"), "").unwrap();
        std::fs::write(two.join("a"), "x").unwrap();
        std::fs::write(two.join("b"), "y").unwrap();
        assert_ne!(fingerprint(&one).unwrap(), fingerprint(&two).unwrap());
    }

    #[test]
    fn trust_check_change_revoke_and_persist() {
        let (dir, tools) = workspace();
        let home = tempfile::tempdir().unwrap();
        let file = home.path().join("state/trust.json");
        let mut store = TrustStore::load(&file).unwrap();
        assert_eq!(store.check(dir.path(), &tools).unwrap(), TrustState::Untrusted);
        let record = store.trust(dir.path()).unwrap().clone();
        assert_eq!(record.tools, ["t"]);
        assert_eq!(record.workspace, dir.path().canonicalize().unwrap());
        store.save().unwrap();

        let mut again = TrustStore::load(&file).unwrap();
        assert_eq!(again.records(), std::slice::from_ref(&record));
        // Reached through a symlink: the same canonical workspace.
        let link = home.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        assert_eq!(again.check(&link, &link.join(WORKSPACE_TOOLS_DIR)).unwrap(), TrustState::Trusted);

        std::fs::write(tools.join("t"), "#!/bin/sh\nrm -rf ~\n").unwrap();
        assert_eq!(again.check(dir.path(), &tools).unwrap(), TrustState::Changed);
        again.trust(dir.path()).unwrap();
        assert_eq!(again.records().len(), 1, "re-trusting replaces the record");
        assert_eq!(again.check(dir.path(), &tools).unwrap(), TrustState::Trusted);

        assert!(again.revoke(&link).is_some());
        assert!(again.revoke(dir.path()).is_none());
        assert_eq!(again.check(dir.path(), &tools).unwrap(), TrustState::Untrusted);
        again.save().unwrap();
        assert!(TrustStore::load(&file).unwrap().records().is_empty());
    }

    #[test]
    fn a_workspace_without_tools_or_a_broken_file_is_a_clear_error() {
        let empty = tempfile::tempdir().unwrap();
        let err = TrustStore::empty().trust(empty.path()).unwrap_err();
        assert!(matches!(err, TrustError::NoTools { .. }), "{err}");
        assert!(TrustStore::empty().trust(&empty.path().join("nope")).is_err());
        assert!(matches!(TrustStore::empty().save(), Err(TrustError::NoFile)));

        let file = empty.path().join("trust.json");
        for bad in ["{", "{\"version\": 2, \"workspaces\": []}", "{\"version\": 1}", "[]"] {
            std::fs::write(&file, bad).unwrap();
            let err = TrustStore::load(&file).unwrap_err();
            assert!(matches!(err, TrustError::Invalid { .. }), "{bad}: {err}");
            assert!(err.to_string().contains("trust.json"), "{err}");
        }
        // Never overwritten by a failed load.
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "[]");
    }
}
