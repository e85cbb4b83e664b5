//! Helpers for the CLI tests: a private `CAIRN_HOME` and a command builder
//! with a clean environment (no provider keys, no colours).
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// A private home and working directory for one test.
pub struct Env {
    _dir: tempfile::TempDir,
    pub home: PathBuf,
    pub cwd: PathBuf,
}

impl Env {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let cwd = dir.path().join("work");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&cwd).unwrap();
        Self { _dir: dir, home, cwd }
    }

    /// `cairn ARGS` with this env. `CAIRN_TEST_BIN` names another `cairn`
    /// binary to run (a private copy: the build directory may be shared
    /// with other checkouts, which overwrite `target/debug/cairn`).
    pub fn cairn(&self, args: &[&str]) -> Command {
        let bin = std::env::var_os("CAIRN_TEST_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| assert_cmd::cargo::cargo_bin("cairn"));
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .current_dir(&self.cwd)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.home.join("fakehome"))
            .env("CAIRN_HOME", &self.home)
            .env("NO_COLOR", "1");
        if let Some(model) = std::env::var_os("CAIRN_LOCAL_MODEL") {
            cmd.env("CAIRN_LOCAL_MODEL", model);
        }
        cmd
    }

    /// Write a scripted-provider file and return its path.
    pub fn script(&self, lines: &[serde_json::Value]) -> PathBuf {
        let path = self.home.join("script.jsonl");
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Whether a running staged `shell` call has written `name` (relative
    /// to the working tree) into its staging layer: staged, a command's
    /// writes reach the live tree only when its effect is applied.
    pub fn staged_file_exists(&self, name: &str) -> bool {
        std::fs::read_dir(self.home.join("staging"))
            .map(|rd| rd.flatten().any(|e| e.path().join("upper").join(name).exists()))
            .unwrap_or(false)
    }

    /// Session files under this home.
    /// A hook from `tests/hooks/` (Python, written to Claude Code's
    /// documented hook interface), installed outside cairn's home with the
    /// system's python as its interpreter (one a hook's sandbox can read:
    /// system directories, not a user's pyenv).
    pub fn python_hook(&self, name: &str) -> PathBuf {
        let python = ["/usr/bin/python3", "/usr/local/bin/python3"].into_iter().find(|p| Path::new(p).exists()).expect(
            "these tests need python3 in /usr/bin or /usr/local/bin (a hook's sandbox reads system directories)",
        );
        let source =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hooks").join(name)).unwrap();
        let body = source.strip_prefix("#!/usr/bin/env python3\n").expect("the hook starts with its shebang");
        let dir = self.home.parent().unwrap().join("hooks");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, format!("#!{python}\n{body}")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    pub fn session_files(&self) -> Vec<PathBuf> {
        let dir = self.home.join("sessions");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| is_jsonl(p)).collect())
            .unwrap_or_default();
        files.sort();
        files
    }
}

fn is_jsonl(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "jsonl")
}

/// A database of its own (`name` and a per-process counter) in the
/// PostgreSQL test server shared by the tests of this binary that run at
/// the same time (`TestCluster::shared`): a server costs an initdb and a
/// start, seconds per test; a database costs milliseconds and isolates as
/// well (cairn's tables, sessions and workers' claims live in a database).
/// Hold the handle for the test's length: the last holder stops the server.
#[cfg(feature = "postgres")]
pub fn pg_database(name: &str) -> (std::sync::Arc<cairn_pg::test_cluster::TestCluster>, String) {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let cluster = cairn_pg::test_cluster::TestCluster::shared()
        .unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e:#}"));
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let url = cluster
        .create_database(&format!("{name}_{}_{n}", std::process::id()))
        .unwrap_or_else(|e| panic!("cannot create the database {name}: {e:#}"));
    (cluster, url)
}

/// A command's standard output, after asserting it succeeded (its
/// output and error shown when it did not).
pub fn stdout_ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// A command's standard output as text (invalid UTF-8 replaced).
pub fn stdout_text(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A command's standard error as text (invalid UTF-8 replaced).
pub fn stderr_text(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// path → (kind, mode, content) of every entry under `root` (kind `f`
/// file, `d` directory, `l` link with its target as content, `s` special).
pub fn snapshot(root: &Path) -> BTreeMap<String, (char, u32, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, (char, u32, Vec<u8>)>) {
        // Not root (the non-root reruns), an oracle's `chmod 000` makes a
        // directory unreadable: its mode is already in the snapshot.
        let Ok(listing) = std::fs::read_dir(dir) else { return };
        let mut entries: Vec<_> = listing.map(|e| e.unwrap().path()).collect();
        entries.sort();
        for path in entries {
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let mode = meta.permissions().mode() & 0o7777;
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.insert(rel, ('l', mode, target.to_string_lossy().as_bytes().to_vec()));
            } else if meta.is_dir() {
                out.insert(rel, ('d', mode, Vec::new()));
                walk(root, &path, out);
            } else if meta.is_file() {
                // Unreadable (mode 000, not root): the mode tells it apart.
                out.insert(rel, ('f', mode, std::fs::read(&path).unwrap_or_else(|_| b"<unreadable>".to_vec())));
            } else {
                // A FIFO, socket or device: never opened (a FIFO would block).
                out.insert(rel, ('s', mode, Vec::new()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The record list of a session file (array lines flattened).
pub fn entries(path: &Path) -> Vec<Value> {
    entries_of_text(&std::fs::read_to_string(path).unwrap())
}

/// The entry records of a session file's text (`cairn export` prints one).
pub fn entries_of_text(text: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        match serde_json::from_str(line).unwrap() {
            Value::Array(items) => out.extend(items),
            one => out.push(one),
        }
    }
    out.into_iter().filter(|r| r["kind"] == "entry").collect()
}

/// Fail (with what `cairn tools` says) where overlay staging is unavailable.
pub fn require_staging(env: &Env) {
    let out = env.cairn(&["tools"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("staging: overlay"),
        "overlay staging is not available here, so this test cannot run:\n{text}"
    );
}

/// Set in a rerun as a non-root user (no recursion).
pub const AS_NON_ROOT: &str = "CAIRN_TEST_AS_NON_ROOT";

/// Rerun the calling test binary's tests (all but `skip`, the test calling
/// this) as uid 65534 with `setpriv`, against a copy of `cairn`; both
/// copied where any user may execute them (/root is 0700). Fails with the
/// rerun's output unless every test passed; the number that passed.
#[track_caller]
pub fn rerun_as_non_root(skip: &str) -> usize {
    rerun_as_non_root_skipping(&[skip])
}

/// [`rerun_as_non_root`], skipping every test whose name contains one of
/// `skip` (the caller, and tests that need root to set up, e.g. a mount).
#[track_caller]
pub fn rerun_as_non_root_skipping(skip: &[&str]) -> usize {
    // One test binary holds every file as a module: rerun only the caller's
    // module (its file's name), not every test of the binary.
    let caller = Path::new(std::panic::Location::caller().file());
    let module = format!("{}::", caller.file_stem().and_then(|s| s.to_str()).unwrap());
    use std::os::unix::fs::PermissionsExt as _;
    assert!(std::env::var_os(AS_NON_ROOT).is_none(), "the non-root rerun must not rerun itself");
    let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap();
    assert_eq!(uid, 0, "switching to uid 65534 needs root (these tests run as uid {uid})");
    let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"].into_iter().find(|p| Path::new(p).exists());
    let setpriv = setpriv.expect("setpriv (util-linux) is needed to rerun the tests as another user");
    let dir = tempfile::Builder::new().prefix("cairn-nonroot-").tempdir_in("/var/tmp").unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (exe, cairn) = (dir.path().join("tests"), dir.path().join("cairn"));
    let bin =
        std::env::var_os("CAIRN_TEST_BIN").map(PathBuf::from).unwrap_or_else(|| assert_cmd::cargo::cargo_bin("cairn"));
    for (from, to) in [(std::env::current_exe().unwrap(), &exe), (bin, &cairn)] {
        std::fs::copy(from, to).unwrap();
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(65534), Some(65534)).unwrap();
    let rerun = || {
        Command::new(setpriv)
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "--"])
            .arg(&exe)
            .arg(&module)
            .args(skip.iter().flat_map(|s| ["--skip", *s]))
            .arg("--test-threads=2")
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &home)
            .env("TMPDIR", &home)
            .env("CAIRN_TEST_BIN", &cairn)
            .env(AS_NON_ROOT, "1")
            .current_dir(&home)
            .output()
            .unwrap()
    };
    // "Text file busy": another test thread forked while a copy was open
    // for writing; that child holds it until its exec. Try again.
    let mut out = rerun();
    for _ in 0..50 {
        if !String::from_utf8_lossy(&out.stderr).contains("Text file busy") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        out = rerun();
    }
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the tests failed as uid 65534:\n{text}");
    let passed: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("test result: ok. "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(passed > 0, "as uid 65534, no test ran:\n{text}");
    println!("as uid 65534: {passed} tests passed");
    passed
}
