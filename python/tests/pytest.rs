//! Runs the Python package's tests (`python/tests/test_*.py`, pytest)
//! against the extension built with this test binary: the same build,
//! profile and features as every other test of the workspace, so CI builds
//! no second copy of the runtime. The package is laid out in a temporary
//! directory (`cairn/*.py` and the built library as `cairn/_cairn.abi3.so`)
//! and pytest comes from the pinned venv `scripts/venv embed`. The sessions
//! are checked with the `cairn` binary the same `cargo test` built; the
//! tests of `database=` get a throwaway PostgreSQL server
//! (`CAIRN_TEST_DATABASE`). Beside them, the documented Rust API's own
//! checks: the example, and `database` with a real SIGKILL.
// Helpers (not #[test] functions) expect too: a failure is the test's.
#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_embed::{Agent, CallStatus, Replay, Risk, Stop, ToolDef};
use cairn_pg::test_cluster::TestCluster;
use serde_json::json;

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
    // The PostgreSQL server of `database=`'s tests (test_database.py).
    let cluster = TestCluster::shared().expect("a throwaway PostgreSQL server (run ./scripts/ensure-postgres)");

    let status = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(root.join("python/tests"))
        .env("PYTHONPATH", site.path())
        // `python -m` puts the working directory first on sys.path; cargo
        // runs this in python/, whose `cairn/` has no extension in a fresh
        // clone ("cannot import name '_cairn'"): run in the laid-out site.
        .current_dir(site.path())
        .env("CAIRN_BIN", &cairn)
        .env("CAIRN_TEST_DATABASE", cluster.url())
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

    // The same with `--database`: the session is in PostgreSQL.
    let cluster = TestCluster::shared().expect("a throwaway PostgreSQL server (run ./scripts/ensure-postgres)");
    let url = cluster.create_database("example").expect("a database");
    let child = Command::new(&example)
        .args(["--database", &url])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("cannot run the example");
    // The example's own directory (its home and working directory).
    let root = std::env::temp_dir().join(format!("cairn-embed-example-{}", child.id()));
    let out = child.wait_with_output().expect("the example's output");
    let _ = std::fs::remove_dir_all(root);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "the example failed: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("answer: Noted: buy milk."), "{stdout}");
    let id = stdout.lines().find_map(|l| l.split_once("' show ")).map(|(_, id)| id.to_owned()).expect("the show line");
    let shown = Command::new(built.join("cairn")).args(["--database", &url, "show", &id]).output().expect("cairn show");
    let text = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(shown.status.success(), "cairn show failed: {}", String::from_utf8_lossy(&shown.stderr));
    assert!(text.contains("tool completed: add_note"), "{text}");
}

/// The lease of the database tests' agents: short, so a killed process's
/// session is free soon, yet with a margin (a quarter of it) no stall of a
/// loaded machine eats.
const LEASE: Duration = Duration::from_secs(2);

/// The Rust API's tool of the database tests: records each run in
/// `marker`, and with `started` given, says it started and blocks (the
/// killed child's).
fn charge(replay: Replay, marker: PathBuf, started: Option<PathBuf>, runs: Arc<Mutex<u32>>) -> ToolDef {
    ToolDef::new(
        "charge",
        "Charge the card.",
        json!({"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]}),
        Risk::Write,
        replay,
        move |_| {
            let mut all = std::fs::read_to_string(&marker).unwrap_or_default();
            all.push_str("ran\n");
            std::fs::write(&marker, all).map_err(|e| e.to_string())?;
            *runs.lock().map_err(|e| e.to_string())? += 1;
            if let Some(started) = &started {
                std::fs::write(started, "1").map_err(|e| e.to_string())?;
                std::thread::sleep(Duration::from_secs(3600));
            }
            Ok("charged".to_owned())
        },
    )
}

fn replay_named(name: &str) -> Replay {
    if name == "idempotent" { Replay::Idempotent } else { Replay::Never }
}

/// The child [`the_rust_api_with_a_database_resumes_a_killed_processs_session_once`]
/// starts and kills: one turn in the database whose tool blocks.
#[test]
#[ignore = "the child process of the_rust_api_with_a_database_resumes_a_killed_processs_session_once, which runs it"]
fn database_child_killed_mid_tool() {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run by the parent test"));
    let dir = PathBuf::from(var("CAIRN_CHILD_DIR"));
    let replay = replay_named(&var("CAIRN_CHILD_REPLAY"));
    let tool = charge(replay, dir.join("marker"), Some(dir.join("started")), Arc::default());
    let agent = Agent::builder()
        .home(dir.join("home"))
        .cwd(dir.join("work"))
        .provider("scripted")
        .script(dir.join("script.jsonl"))
        .tool(tool)
        .approve(|_| true)
        .database(var("CAIRN_CHILD_DATABASE"))
        .lease(LEASE)
        .build()
        .expect("the child's agent");
    let outcome = agent.run("charge 5");
    panic!("the child's tool was to block until it was killed, but the run ended: {outcome:?}");
}

/// `database` from the documented Rust API, as from Python: a process
/// killed with SIGKILL while its `replay: never` tool runs leaves a session
/// no worker takes (a worker's claim passes over it once the dead lease has
/// ended), and a new agent's `resume` claims it by id and settles the call
/// once: uncertain and not re-run, or re-run for an idempotent tool.
#[test]
fn the_rust_api_with_a_database_resumes_a_killed_processs_session_once() {
    let cluster = TestCluster::shared().expect("a throwaway PostgreSQL server (run ./scripts/ensure-postgres)");
    for replay in ["never", "idempotent"] {
        let url = cluster.create_database(&format!("embed_{replay}")).expect("a database");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (home, work) = (dir.path().join("home"), dir.path().join("work"));
        std::fs::create_dir_all(&home).expect("home");
        std::fs::create_dir_all(&work).expect("work");
        let script = dir.path().join("script.jsonl");
        let turns = [
            json!({"toolCalls": [{"id": "c1", "name": "charge", "arguments": {"amount": 5}}]}),
            json!({"text": "Charged, or not."}),
        ];
        std::fs::write(&script, turns.iter().map(|t| format!("{t}\n")).collect::<String>()).expect("the script");

        let mut child = Command::new(std::env::current_exe().expect("this test binary"))
            .args(["--ignored", "--exact", "database_child_killed_mid_tool", "--nocapture"])
            .env("CAIRN_CHILD_DIR", dir.path())
            .env("CAIRN_CHILD_REPLAY", replay)
            .env("CAIRN_CHILD_DATABASE", &url)
            .spawn()
            .expect("the child");
        let started = dir.path().join("started");
        let deadline = Instant::now() + Duration::from_secs(120);
        while !started.exists() {
            if let Some(status) = child.try_wait().expect("the child's status") {
                panic!("the child exited ({status}) before its tool started");
            }
            assert!(Instant::now() < deadline, "the child's tool did not start within 120 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        child.kill().expect("SIGKILL the child");
        let status = child.wait().expect("the child's status");
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9), "{status}");

        let mut client = cairn_pg::connect(&url).expect("a connection");
        let listed = cairn_pg::catalog::list(&mut client).expect("the sessions");
        assert_eq!(listed.len(), 1, "{listed:?}");
        let id = listed[0].id.clone();
        // The dead process's last renewal came before the kill, so its
        // lease has surely ended now: a worker's claim would find the
        // session runnable, were it the workers'.
        std::thread::sleep(LEASE + Duration::from_millis(300));
        let taken = cairn_pg::lease::claim(&mut client, "some-worker/0", LEASE).expect("a worker's claim");
        assert_eq!(taken, None, "a worker claimed the application's session");

        let runs: Arc<Mutex<u32>> = Arc::default();
        let marker = dir.path().join("marker");
        let agent = Agent::builder()
            .home(&home)
            .cwd(&work)
            .provider("scripted")
            .script(&script)
            .tool(charge(replay_named(replay), marker.clone(), None, Arc::clone(&runs)))
            .approve(|_| true)
            .database(&url)
            .lease(LEASE)
            .build()
            .expect("the agent");
        let outcome = agent.resume(&id).expect("resume");
        assert_eq!(outcome.answer, "Charged, or not.");
        assert_eq!(outcome.tool_calls.len(), 1, "{:?}", outcome.tool_calls);
        let call = &outcome.tool_calls[0];
        let ran = std::fs::read_to_string(&marker).expect("the marker");
        if replay == "never" {
            assert_eq!((call.status, call.uncertain, ran.as_str()), (CallStatus::Failed, true, "ran\n"), "{call:?}");
            assert_eq!(*runs.lock().expect("runs"), 0);
        } else {
            assert_eq!((call.status, ran.as_str()), (CallStatus::Completed, "ran\nran\n"), "{call:?}");
            assert_eq!(*runs.lock().expect("runs"), 1);
        }
        let again = agent.resume(&id).expect("resume again");
        assert_eq!((again.stop, again.tool_calls.len()), (Stop::Nothing, 0));
        // Kept in the database, not in a file.
        assert!(std::fs::read_dir(home.join("sessions")).map_or(true, |mut d| d.next().is_none()));
    }
}
