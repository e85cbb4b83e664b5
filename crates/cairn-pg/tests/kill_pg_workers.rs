//! Tier B/C on PostgreSQL: real worker processes (this test binary re-run
//! as `worker_process`, driving sessions through `cairn_pg::worker` with the
//! scripted provider and the append-a-line tools) against a real server.
//!
//! - `sigstop_past_the_lease_then_sigcont_the_commit_is_refused`: a worker
//!   paused inside an effect past its lease (nobody takes over, so only the
//!   fence can refuse it); resumed, its next commit is refused, it backs
//!   off, claims the session again under a new epoch and finishes it.
//! - `chaos_sigkill_workers_and_restart_postgres`: three workers, many
//!   sessions with a multi-tool turn, at least 30 SIGKILLs of random
//!   workers while new ones start, and a `pg_ctl restart` mid-run; then
//!   every session is final, every effect's line count matches its replay
//!   policy, no invocation has two settlements, and the epochs prove that
//!   no commit was accepted from a worker after its lease was taken over.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod driver;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use cairn_core::approval::{Allowlist, PolicyApprover};
use cairn_core::projection::{ToolInvocationStatus, ToolState};
use cairn_core::storage::{Header, Storage, check_file, new_session_id};
use cairn_core::{CancelToken, Session, SessionConfig, TurnEnv};
use cairn_pg::test_cluster::TestCluster;
use cairn_pg::worker::{Driven, Driver, WorkerOptions};
use cairn_pg::{PgStore, connect, lease};
use cairn_testtools::{ScriptProvider, registry};
use postgres::Client;
use serde_json::json;

// ---------------------------------------------------------------------------
// The worker process.

/// Drives sessions like a host: the scripted provider, the test tools, a
/// headless approver allowlisting the append tools.
struct TestDriver {
    script: String,
    hook: Option<cairn_testtools::tools::Hook>,
}

own_tools_host!(TestDriver);

impl Driver for TestDriver {
    fn drive(&self, session: Session<PgStore>, prompt: Option<&str>, cancel: &CancelToken) -> Driven {
        let provider = ScriptProvider::from_jsonl(&self.script).unwrap();
        let tools = registry(false, self.hook.clone());
        let mut approver = PolicyApprover::new(
            Allowlist::parse(["append_idempotent", "append_guarded", "append_never", "echo"]).unwrap(),
            None,
        );
        let mut observer = |_: &cairn_core::TurnEvent| {};
        let mut env =
            TurnEnv { provider: &provider, tools: &tools, approver: &mut approver, observer: &mut observer, cancel };
        Driven::by(session, |session| match prompt {
            Some(text) => session.run_turn(text, &mut env).map(drop),
            None => session.resume(&mut env).map(drop),
        })
    }
}

#[test]
#[ignore = "the worker process of the tests below, started by them with --ignored"]
fn worker_process() {
    let url = std::env::var("CAIRN_PG_URL").expect("CAIRN_PG_URL");
    let script = std::fs::read_to_string(std::env::var("CAIRN_PG_SCRIPT").unwrap()).unwrap();
    // The pause hook: the first effect creates the signal file and waits for
    // the continue file (the test SIGSTOPs us in between).
    let hook: Option<cairn_testtools::tools::Hook> = std::env::var_os("CAIRN_PG_PAUSE").map(|dir| {
        let dir = PathBuf::from(dir);
        let once = Arc::new(AtomicBool::new(false));
        Arc::new(move |_: &str| {
            if once.swap(true, std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            std::fs::write(dir.join("paused"), "").unwrap();
            while !dir.join("continue").exists() {
                std::thread::sleep(Duration::from_millis(10));
            }
        }) as cairn_testtools::tools::Hook
    });
    let mut opts = WorkerOptions::new(url);
    opts.concurrency = std::env::var("CAIRN_PG_CONCURRENCY").map_or(1, |v| v.parse().unwrap());
    opts.lease = Duration::from_millis(std::env::var("CAIRN_PG_LEASE_MS").map_or(2000, |v| v.parse().unwrap()));
    cairn_pg::worker::run(&opts, Arc::new(TestDriver { script, hook }), Arc::new(AtomicBool::new(false))).unwrap();
}

// ---------------------------------------------------------------------------
// Test side.

struct Rig {
    cluster: TestCluster,
    dir: tempfile::TempDir,
    script: PathBuf,
}

impl Rig {
    fn new(script: &[serde_json::Value]) -> Self {
        let cluster = TestCluster::start().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e:#}"));
        let dir = tempfile::tempdir().unwrap();
        let script_path = dir.path().join("script.jsonl");
        std::fs::write(&script_path, script.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
        Self { cluster, dir, script: script_path }
    }

    fn client(&self) -> Client {
        connect(self.cluster.url()).unwrap()
    }

    /// A new session in its own directory, with "go" submitted.
    fn submit_new(&self, client: &mut Client, n: usize) -> (String, PathBuf) {
        let cwd = self.dir.path().join(format!("s{n}"));
        std::fs::create_dir_all(&cwd).unwrap();
        let id = new_session_id();
        let store =
            PgStore::create(connect(self.cluster.url()).unwrap(), Header::new(id.clone(), cwd.display().to_string()))
                .unwrap();
        drop(store);
        lease::submit(client, &id, "go").unwrap();
        (id, cwd)
    }

    fn worker(&self, name: &str, lease_ms: u64, concurrency: usize, pause: Option<&Path>) -> Worker {
        let log = std::fs::File::create(self.dir.path().join(format!("{name}.log"))).unwrap();
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "worker_process", "--ignored", "--nocapture", "--test-threads=1"])
            .env("CAIRN_PG_URL", self.cluster.url())
            .env("CAIRN_PG_SCRIPT", &self.script)
            .env("CAIRN_PG_LEASE_MS", lease_ms.to_string())
            .env("CAIRN_PG_CONCURRENCY", concurrency.to_string())
            .env_remove("CAIRN_PG_PAUSE")
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(p) = pause {
            cmd.env("CAIRN_PG_PAUSE", p);
        }
        Worker(cmd.spawn().unwrap())
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Wait until `cond` holds, failing with `what` (and the server log)
    /// after a generous bound: a hang is a failure, never a pass.
    fn wait(&self, what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(start.elapsed() < limit, "timed out waiting for {what}\nserver log:\n{}", self.cluster.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A worker process, SIGKILLed and reaped when dropped (also when a test
/// fails half-way), so no worker outlives its test.
struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    let rc = unsafe { libc::kill(i32::try_from(child.id()).unwrap(), sig) };
    assert_eq!(rc, 0, "kill({}, {sig}) failed", child.id());
}

use libc::{SIGCONT, SIGKILL, SIGSTOP};

fn status_of(client: &mut Client, id: &str) -> String {
    client.query_one("SELECT status FROM cairn_sessions WHERE id = $1", &[&id]).unwrap().get(0)
}

fn lines_in(path: &Path) -> usize {
    std::fs::read_to_string(path).map(|t| t.lines().count()).unwrap_or(0)
}

/// The epoch oracle, from the rows alone: every line was written by a
/// fenced owner under an epoch that was claimed by that owner; epochs never
/// go down along the log; and every line of epoch e was committed before
/// epoch e+1 (and any later one) was claimed.
fn check_epochs(client: &mut Client, id: &str) {
    let claims: HashMap<i64, (String, std::time::SystemTime)> = client
        .query("SELECT epoch, owner, claimed_at FROM cairn_claims WHERE session_id = $1", &[&id])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    let lines = client
        .query(
            "SELECT first_seq, epoch, owner, committed_at FROM cairn_lines WHERE session_id = $1 ORDER BY first_seq",
            &[&id],
        )
        .unwrap();
    let mut last_epoch = 0;
    for line in &lines {
        let (seq, epoch, owner, at): (i64, i64, Option<String>, std::time::SystemTime) =
            (line.get(0), line.get(1), line.get(2), line.get(3));
        let (claimer, _) =
            claims.get(&epoch).unwrap_or_else(|| panic!("{id}: line {seq} has epoch {epoch}, never claimed"));
        assert_eq!(owner.as_deref(), Some(claimer.as_str()), "{id}: line {seq} written by a non-holder");
        assert!(epoch >= last_epoch, "{id}: line {seq} has epoch {epoch} after epoch {last_epoch}");
        last_epoch = epoch;
        for (later, (_, claimed)) in &claims {
            if *later > epoch {
                assert!(at < *claimed, "{id}: line {seq} (epoch {epoch}) committed after epoch {later} was claimed");
            }
        }
    }
}

/// The tool oracle for one session: from the log (settlements) and from
/// the files the tools appended to.
fn check_tools(rig: &Rig, id: &str, cwd: &Path) -> ToolState {
    let store = PgStore::open(rig.client(), id).unwrap();
    let state = ToolState::replay(store.entries());
    assert!(state.anomalies.is_empty(), "{id}: {:?}", state.anomalies);
    for inv in &state.invocations {
        assert_eq!(inv.settlements, 1, "{id}: {} settled {} times", inv.invocation_id, inv.settlements);
        let file = cwd.join(inv.request.arguments["path"].as_str().unwrap());
        let prefix = format!("{} ", inv.invocation_id);
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let mine = text.lines().filter(|l| l.starts_with(&prefix)).count();
        match inv.tool.as_str() {
            "append_guarded" => {
                assert_eq!(inv.status, ToolInvocationStatus::Completed, "{id}: {inv:?}");
                assert_eq!(mine, 1, "{id}: Guarded ran {mine} times");
            }
            "append_idempotent" => {
                assert_eq!(inv.status, ToolInvocationStatus::Completed, "{id}: {inv:?}");
                assert!(mine >= 1, "{id}: Idempotent never ran");
            }
            "append_never" => {
                assert!(mine <= 1, "{id}: Never ran {mine} times");
                match inv.status {
                    ToolInvocationStatus::Completed => assert_eq!(mine, 1, "{id}: Never completed without its line"),
                    ToolInvocationStatus::Failed => assert!(inv.uncertain, "{id}: Never failed but not uncertain"),
                    other => panic!("{id}: Never ended {other:?}"),
                }
            }
            other => panic!("{id}: unexpected tool {other}"),
        }
    }
    let session = Session::open(store, SessionConfig::default()).unwrap();
    assert!(!session.needs_resume(), "{id}: the turn is not final");
    state
}

fn multi_tool_script() -> Vec<serde_json::Value> {
    vec![
        json!({"text": "", "toolCalls": [
            {"id": "c1", "name": "append_idempotent", "arguments": {"path": "idem.txt", "text": "a"}},
            {"id": "c2", "name": "append_guarded", "arguments": {"path": "guarded.txt", "text": "b"}}
        ]}),
        json!({"text": "", "toolCalls": [
            {"id": "c3", "name": "append_never", "arguments": {"path": "never.txt", "text": "c"}},
            {"id": "c4", "name": "append_guarded", "arguments": {"path": "guarded.txt", "text": "d"}}
        ]}),
        json!({"text": "done", "toolCalls": []}),
    ]
}

#[test]
fn sigstop_past_the_lease_then_sigcont_the_commit_is_refused() {
    let script = vec![
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "append_idempotent", "arguments": {"path": "out.txt", "text": "x"}}]}),
        json!({"text": "done", "toolCalls": []}),
    ];
    let rig = Rig::new(&script);
    let mut client = rig.client();
    let (id, cwd) = rig.submit_new(&mut client, 0);
    let pause = rig.dir.path().join("pause");
    std::fs::create_dir_all(&pause).unwrap();
    let a = rig.worker("a", 1000, 1, Some(&pause));
    rig.wait("the worker to reach the effect", Duration::from_secs(120), || pause.join("paused").exists());
    signal(&a.0, SIGSTOP);
    // Past the lease: the database says it expired (no sleeping on a guess).
    // Nobody takes over, so no other commit moves the seq: only the fence
    // can refuse the stale commit (the seq CAS alone would accept it).
    rig.wait("the paused worker's lease to expire", Duration::from_secs(60), || {
        client.query_one("SELECT lease_expires <= now() FROM cairn_sessions WHERE id = $1", &[&id]).unwrap().get(0)
    });
    let expired: std::time::SystemTime =
        client.query_one("SELECT lease_expires FROM cairn_sessions WHERE id = $1", &[&id]).unwrap().get(0);
    std::fs::write(pause.join("continue"), "").unwrap();
    signal(&a.0, SIGCONT);
    rig.wait("the worker to report the lost lease", Duration::from_secs(120), || rig.log("a").contains("backing off"));
    let log = rig.log("a");
    assert!(log.contains("lease lost on"), "{log}");
    // It backs off, claims the session again under a new epoch and finishes.
    rig.wait("the worker to finish the session", Duration::from_secs(120), || status_of(&mut client, &id) == "idle");
    let a_log = rig.log("a");
    drop(a);
    let lines = client
        .query("SELECT epoch, committed_at FROM cairn_lines WHERE session_id = $1 ORDER BY first_seq", &[&id])
        .unwrap();
    for line in &lines {
        let (epoch, at): (i64, std::time::SystemTime) = (line.get(0), line.get(1));
        if epoch == 1 {
            assert!(at < expired, "a commit of epoch 1 was accepted after its lease expired\n{a_log}");
        }
    }
    let epochs: Vec<i64> = lines.iter().map(|l| l.get(0)).collect();
    assert_eq!(epochs.first(), Some(&1));
    assert_eq!(epochs.last(), Some(&2), "{a_log}");
    assert!(a_log.contains("claimed") && a_log.matches("claimed").count() >= 2, "{a_log}");
    check_epochs(&mut client, &id);
    let state = check_tools(&rig, &id, &cwd);
    assert_eq!(state.invocations.len(), 1);
    // The Idempotent effect ran twice (its late first run, then the replay
    // under epoch 2), settled once.
    assert_eq!(lines_in(&cwd.join("out.txt")), 2);
}

#[test]
fn chaos_sigkill_workers_and_restart_postgres() {
    let sessions: usize = std::env::var("CAIRN_PG_CHAOS_SESSIONS").map_or(600, |v| v.parse().unwrap());
    let kills_wanted: usize = 30;
    let rig = Rig::new(&multi_tool_script());
    let mut client = rig.client();
    let all: Vec<(String, PathBuf)> = (0..sessions).map(|n| rig.submit_new(&mut client, n)).collect();
    let lease_ms = 1500;
    let mut workers: Vec<Worker> = (0..3).map(|n| rig.worker(&format!("w{n}"), lease_ms, 4, None)).collect();
    let mut started = 3;
    let mut kills = 0;
    let mut restarted = false;
    let mut rng = 0x9e37_79b9_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let busy = |client: &mut Client| -> i64 {
        client.query_one("SELECT count(*) FROM cairn_sessions WHERE status <> 'idle'", &[]).unwrap().get(0)
    };
    let start = Instant::now();
    // Kill while work is left (and at least 30 times: once the work is done,
    // new sessions keep the workers busy so the kills land mid-turn).
    let mut extra = sessions;
    let mut extra_ids = Vec::new();
    while kills < kills_wanted {
        assert!(start.elapsed() < Duration::from_secs(900), "the chaos run took too long\n{}", rig.cluster.log());
        std::thread::sleep(Duration::from_millis(100 + next() % 400));
        if busy(&mut client) < 20 {
            for _ in 0..20 {
                extra_ids.push(rig.submit_new(&mut client, extra));
                extra += 1;
            }
        }
        let victim = usize::try_from(next() % workers.len() as u64).unwrap();
        let mut child = workers.swap_remove(victim);
        signal(&child.0, SIGKILL);
        child.0.wait().unwrap();
        kills += 1;
        workers.push(rig.worker(&format!("w{started}"), lease_ms, 4, None));
        started += 1;
        if kills == kills_wanted / 2 && !restarted {
            rig.cluster.restart().unwrap();
            client = rig.client();
            restarted = true;
        }
    }
    rig.wait("every session to become final", Duration::from_secs(900), || busy(&mut client) == 0);
    drop(workers);
    let failed: i64 =
        client.query_one("SELECT count(*) FROM cairn_sessions WHERE status = 'failed'", &[]).unwrap().get(0);
    assert_eq!(failed, 0);
    let waiting: i64 = client.query_one("SELECT count(*) FROM cairn_inbox", &[]).unwrap().get(0);
    assert_eq!(waiting, 0, "prompts left in the inbox");
    let mut takeovers = 0;
    for (id, cwd) in all.iter().chain(&extra_ids) {
        check_epochs(&mut client, id);
        let state = check_tools(&rig, id, cwd);
        assert_eq!(state.invocations.len(), 4, "{id}: every call of the script ran");
        let epochs: i64 = client
            .query_one("SELECT count(DISTINCT epoch) FROM cairn_lines WHERE session_id = $1", &[id])
            .unwrap()
            .get(0);
        takeovers += usize::from(epochs > 1);
    }
    // Export a sample and check it as a JSONL file.
    for (id, _) in all.iter().take(20) {
        let bytes = cairn_pg::export(&mut client, id).unwrap();
        let path = rig.dir.path().join(format!("{id}.jsonl"));
        std::fs::write(&path, &bytes).unwrap();
        let report = check_file(&path);
        assert!(report.ok && !report.torn_tail, "{id}: {report:?}");
    }
    eprintln!(
        "chaos: {} sessions, {kills} SIGKILLs, {started} workers started, postgres restarted: {restarted}, sessions taken over mid-turn: {takeovers}, {:.1}s",
        all.len() + extra_ids.len(),
        start.elapsed().as_secs_f64()
    );
    assert!(takeovers > 0, "no session was taken over: the kills never landed mid-turn");
}

#[test]
fn a_session_that_cannot_open_is_marked_failed_and_the_worker_goes_on() {
    let rig = Rig::new(&multi_tool_script());
    let mut client = rig.client();
    let (bad, _) = rig.submit_new(&mut client, 0);
    let (good, good_cwd) = rig.submit_new(&mut client, 1);
    client.execute("UPDATE cairn_sessions SET header = '{\"kind\":\"nope\"}' WHERE id = $1", &[&bad]).unwrap();
    let _w = rig.worker("w", 2000, 1, None);
    rig.wait("both sessions to be settled", Duration::from_secs(120), || {
        status_of(&mut client, &bad) == "failed" && status_of(&mut client, &good) == "idle"
    });
    let note: Option<String> =
        client.query_one("SELECT note FROM cairn_sessions WHERE id = $1", &[&bad]).unwrap().get(0);
    assert!(note.as_deref().is_some_and(|n| n.contains("header")), "{note:?}");
    let state = check_tools(&rig, &good, &good_cwd);
    assert_eq!(state.invocations.len(), 4);
}
