//! The tool lists of stdio servers, kept between runs in cairn's data
//! directory (`cache/mcp/`), so a turn can offer a server's tools without
//! starting it: the server starts on its first call (`pool.rs`), and that
//! call first checks that the tool is still as listed (`tool.rs`).
//!
//! A listing is found by a digest of the server's name and configuration,
//! the program it runs (path, size, modification time) and the files its
//! arguments name (a script), so reinstalling or editing the server makes
//! a new listing. A missing, unreadable or stale entry only means the
//! server is started to list its tools, as without a cache.
//!
//! It must not decide tiers (`tool.rs`) or start anything.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use sha2::Digest as _;

use crate::config::ServerConfig;
use crate::connection::Offers;

/// What a file is now, for the digest (None: absent).
fn stamp(path: &Path) -> Option<(String, u64, u128)> {
    let meta = std::fs::metadata(path).ok()?;
    let mtime = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?.as_nanos();
    Some((path.display().to_string(), meta.len(), mtime))
}

/// The cache file for `name` with `config` in `cwd`, or None when the
/// server is not one whose listing is kept (not stdio, its program not
/// found, or values a client gave that must not be written down).
pub(crate) fn file(dir: &Path, name: &str, config: &ServerConfig, cwd: &Path) -> Option<PathBuf> {
    let command = config.command.as_deref()?;
    if !config.env_values.is_empty() {
        return None;
    }
    let program = cairn_tools::programs::resolve(command)?;
    let program = std::fs::canonicalize(&program).unwrap_or(program);
    let base = config.cwd.as_deref().map_or_else(|| cwd.to_path_buf(), cairn_tools::programs::expand);
    let named: Vec<_> =
        config.args.iter().map(|a| base.join(a)).filter(|p| p.is_file()).filter_map(|p| stamp(&p)).collect();
    let key = serde_json::json!({
        "cairn": env!("CARGO_PKG_VERSION"),
        "name": name,
        "config": config,
        "program": stamp(&program)?,
        "named": named,
    });
    let digest = sha2::Sha256::digest(key.to_string().as_bytes());
    Some(dir.join(format!("{name}-{digest:x}.json")))
}

/// What is kept of a server: its tools and whether it offers resources
/// and prompts (`extra.rs`).
#[derive(serde::Serialize, serde::Deserialize)]
struct Kept {
    tools: Vec<rmcp::model::Tool>,
    #[serde(default)]
    offers: Offers,
}

/// The tools listed in `file` and what else the server offers, if it
/// holds a readable listing (a listing of tools alone, as kept before
/// resources and prompts were offered, is read again from the server).
pub(crate) fn read(file: &Path) -> Option<(Vec<rmcp::model::Tool>, Offers)> {
    let text = std::fs::read(file).ok()?;
    let kept: Kept = serde_json::from_slice(&text).ok()?;
    Some((kept.tools, kept.offers))
}

/// Keep `tools` and `offers` in `file` (written whole, then renamed into
/// place; a failure only means the next run lists them again).
pub(crate) fn write(file: &Path, tools: &[rmcp::model::Tool], offers: Offers) {
    let Some(dir) = file.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let Ok(bytes) = serde_json::to_vec(&Kept { tools: tools.to_vec(), offers }) else { return };
    let tmp = file.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, file).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}
