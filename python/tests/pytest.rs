//! Runs the Python package's tests (`python/tests/test_*.py`, pytest)
//! against the extension built with this test binary: the same build,
//! profile and features as every other test of the workspace, so CI builds
//! no second copy of the runtime. The package is laid out in a temporary
//! directory (`cairn/*.py` and the built library as `cairn/_cairn.abi3.so`)
//! and pytest comes from the pinned venv `scripts/venv embed`. The sessions
//! are checked with the `cairn` binary the same `cargo test` built.
// Helpers (not #[test] functions) expect too: a failure is the test's.
#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/<profile>`, where cargo puts the library and the binaries.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/pytest-HASH
    exe.parent().and_then(Path::parent).expect("the test binary is in target/<profile>/deps").to_path_buf()
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn the_python_package_passes_its_pytest_suite() {
    let root = repo_root();
    let built = profile_dir();
    // Built for this test it stays in deps/ (cargo uplifts it to the
    // profile directory only when it is built as a target of its own).
    let library = [built.join("deps/lib_cairn.so"), built.join("lib_cairn.so")]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("the extension lib_cairn.so was not built in {}", built.display()));
    let cairn = built.join("cairn");
    assert!(
        cairn.is_file(),
        "no cairn binary at {}: run this with the workspace (cargo test --workspace --all-features), which builds it",
        cairn.display()
    );

    let site = tempfile::tempdir().expect("a temporary directory");
    let package = site.path().join("cairn");
    std::fs::create_dir(&package).expect("the package directory");
    for entry in std::fs::read_dir(root.join("python/cairn")).expect("python/cairn") {
        let path = entry.expect("an entry of python/cairn").path();
        if path.is_file() {
            std::fs::copy(&path, package.join(path.file_name().expect("a file name"))).expect("copy a package file");
        }
    }
    std::fs::copy(&library, package.join("_cairn.abi3.so")).expect("copy the extension");

    let venv = Command::new(root.join("scripts/venv")).arg("embed").output().expect("cannot run scripts/venv");
    assert!(
        venv.status.success(),
        "scripts/venv embed failed (python3 with venv and PyPI are needed for this test): {}",
        String::from_utf8_lossy(&venv.stderr)
    );
    let python = String::from_utf8(venv.stdout).expect("a path").trim().to_owned();

    let status = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(root.join("python/tests"))
        .env("PYTHONPATH", site.path())
        // `python -m` puts the working directory first on sys.path; cargo
        // runs this in python/, whose `cairn/` has no extension in a fresh
        // clone ("cannot import name '_cairn'"): run in the laid-out site.
        .current_dir(site.path())
        .env("CAIRN_BIN", &cairn)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        // Nothing of the developer's own cairn: each test names its home.
        .env_remove("CAIRN_HOME")
        .env_remove("CAIRN_PROVIDER")
        .env_remove("CAIRN_MODEL")
        .status()
        .expect("cannot run pytest");
    assert!(status.success(), "the Python package's tests failed (pytest's report is above)");
}

/// `cargo run --example embed` (built by the same `cargo test`): a Rust
/// tool and an approver on the scripted provider; the session it prints
/// opens with the `cairn` command.
#[test]
fn the_rust_embedding_example_runs_and_the_cli_reads_its_session() {
    let built = profile_dir();
    let example = built.join("examples/embed");
    assert!(
        example.is_file(),
        "no example at {}: run this with the workspace (cargo test --workspace --all-features), which builds it",
        example.display()
    );
    let out = Command::new(&example).output().expect("cannot run the example");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "the example failed: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("approve? add_note"), "the approver was not asked: {stdout}");
    assert!(stdout.contains("answer: Noted: buy milk."), "{stdout}");
    // "see it with: CAIRN_HOME=<home> cairn show <id>"
    let line = stdout.lines().find_map(|l| l.strip_prefix("see it with: CAIRN_HOME=")).expect("the show line");
    let (home, id) = line.split_once(" cairn show ").expect("home and id");
    let shown =
        Command::new(built.join("cairn")).args(["show", id]).env("CAIRN_HOME", home).output().expect("cairn show");
    let text = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(shown.status.success(), "cairn show failed: {}", String::from_utf8_lossy(&shown.stderr));
    assert!(text.contains("tool completed: add_note"), "{text}");
    let _ = std::fs::remove_dir_all(Path::new(home).parent().expect("the example's directory"));
}
