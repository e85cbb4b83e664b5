//! The operators' side of a fleet of `cairn worker` processes against a
//! real PostgreSQL (issue 47): a worker's reads stay on its own
//! connections whatever the number of sessions it claims (47.3);
//! `cairn workers` shows each worker, its heartbeat and the leases it lost
//! with why; a session failed by a fault is put back with `cairn requeue`
//! once the fault is cleared, and a transient fault (a full disk) is retried
//! by itself with a backoff; `cairn cancel` stops a queued or a running
//! session; SIGTERM drains a worker: its running turn finishes, nothing new
//! is taken (47.6). A worker whose connections are reset, blackholed
//! (inside a transaction), delayed past its lease, or whose replies alone
//! come late (47.1's window) through a proxy
//! (`cairn_testtools::proxy`) loses its session to another worker, which
//! finishes it, with no effect of the cut-off worker after its lease was
//! lost; healed, it works again (47.5).
//!
//! Faults are planted with triggers on cairn's tables (a test may write SQL;
//! the product may not outside cairn-pg).

#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::util;
use util::stdout_ok as stdout;

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use cairn_pg::test_cluster::TestCluster;
use cairn_testtools::proxy::{Fault, Proxy};
use serde_json::{Value, json};
use util::Env;

fn lines_of(text: &str) -> Vec<Value> {
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn sessions(env: &Env, url: &str) -> Vec<Value> {
    lines_of(&stdout(&env.cairn(&["--database", url, "--json", "sessions"]).output().unwrap()))
}

fn session(env: &Env, url: &str, id: &str) -> Value {
    sessions(env, url).into_iter().find(|r| r["id"] == id).unwrap_or_else(|| panic!("no session {id}"))
}

fn submit(env: &Env, url: &str, prompt: &str) -> String {
    stdout(&env.cairn(&["--database", url, "submit", prompt]).output().unwrap()).trim().to_owned()
}

/// Wait (at most two minutes, polling) until `cond` holds; `what` and
/// `said` explain a failure.
fn wait_until(what: &str, said: &dyn Fn() -> String, cond: &mut dyn FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(120), "never: {what}\n{}", said());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Kills the worker if the test fails before stopping it.
struct Guard(Option<Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Start `cairn worker` on `url` with the scripted provider `script`, a
/// lease of `lease` seconds and `extra` options before the command (e.g.
/// `--allow shell`); its stderr goes to `stderr`. The guard kills it if the
/// test fails before stopping it.
fn start_worker(env: &Env, url: &str, script: &Path, extra: &[&str], lease: &str, stderr: Stdio) -> Guard {
    let mut args = vec!["--database", url, "--script", script.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["worker", "--lease", lease]);
    Guard(Some(env.cairn(&args).stdout(Stdio::null()).stderr(stderr).spawn().unwrap()))
}

/// Wait (at most two minutes) for the worker to leave by itself, then give
/// its output; a worker still there is killed and the test fails (a worker
/// that ignores its signal must not hang the suite).
fn wait_exit(guard: &mut Guard, what: &str) -> std::process::Output {
    let start = Instant::now();
    while guard.0.as_mut().unwrap().try_wait().unwrap().is_none() {
        assert!(start.elapsed() < Duration::from_secs(120), "the worker did not leave: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
    guard.0.take().unwrap().wait_with_output().unwrap()
}

fn signal(child: &Child, sig: &str) {
    let ok = std::process::Command::new("kill").args([sig, &child.id().to_string()]).status().unwrap();
    assert!(ok.success());
}

/// A database of its own in the shared cluster.
fn database(cluster: &TestCluster, name: &str) -> String {
    cluster.create_database(&format!("{name}_{}", std::process::id())).unwrap()
}

fn raw(url: &str) -> postgres::Client {
    postgres::Client::connect(url, postgres::NoTls).unwrap()
}

fn cluster() -> std::sync::Arc<TestCluster> {
    TestCluster::shared().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e:#}"))
}

/// 47.3: a worker keeps its connections for all its claims; the family
/// lookup made for every claimed session used to open a connection (and
/// check the schema) per session. The server's own log counts the
/// connections made while one worker drives 20 sessions.
#[test]
fn a_workers_connections_do_not_grow_with_the_sessions_it_drives() {
    let cluster = cluster();
    let url = database(&cluster, "fleet_conns");
    let dbname = url.rsplit("dbname=").next().unwrap().to_owned();
    let mut admin = raw(&url);
    admin.batch_execute("ALTER SYSTEM SET log_connections = on").unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    drop(admin);
    let env = Env::new();
    let script = env.script(&[json!({"text": "done", "toolCalls": []})]);
    let n = 20;
    let ids: Vec<String> = (0..n).map(|i| submit(&env, &url, &format!("task {i}"))).collect();
    let token = format!("database={dbname}");
    let connections = || {
        cluster
            .log()
            .lines()
            .filter(|l| l.contains("connection authorized") && l.split_whitespace().any(|w| w == token))
            .count()
    };
    let before = connections();
    let mut guard = start_worker(&env, &url, &script, &[], "5", Stdio::piped());
    // Count the releases on the worker's own output (polling the database
    // would add connections of its own).
    let mut err = BufReader::new(guard.0.as_mut().unwrap().stderr.take().unwrap());
    let (mut released, mut log) = (0, String::new());
    while released < n {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "the worker ended early:\n{log}");
        released += usize::from(line.contains("released "));
        log.push_str(&line);
    }
    signal(guard.0.as_ref().unwrap(), "-TERM");
    assert!(wait_exit(&mut guard, "after SIGTERM").status.success(), "{log}");
    let made = connections() - before;
    // The worker's own: its check at start, the registry, the renewals, its
    // thread's connection and the goodbye — none per session.
    assert!(made < 10, "the worker made {made} connections to drive {n} sessions (one per session?):\n{log}");
    for id in &ids {
        assert_eq!(session(&env, &url, id)["state"], "idle", "{id}");
    }
}

/// 47.6: `cairn workers` shows each worker (host, pid, heartbeat, sessions
/// held) and the leases it lost with the reason; a worker stopped by
/// SIGTERM shows as stopped.
#[test]
fn cairn_workers_shows_heartbeats_and_lease_losses() {
    let cluster = cluster();
    let url = database(&cluster, "fleet_workers");
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    let none = stdout(&env.cairn(&["--database", &url, "workers"]).output().unwrap());
    assert!(none.contains("no workers"), "{none}");
    let script = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell", "arguments": {"command": "sleep 20"}}]}),
        json!({"text": "slept", "toolCalls": []}),
    ]);
    let id = submit(&env, &url, "sleep");
    let mut guard = start_worker(&env, &url, &script, &["--allow", "shell"], "2", Stdio::null());
    let pid = i64::from(guard.0.as_ref().unwrap().id());
    let workers = || lines_of(&stdout(&env.cairn(&["--database", &url, "--json", "workers"]).output().unwrap()));
    wait_until("the worker holds the session", &|| format!("{:?}", workers()), &mut || {
        workers().iter().any(|w| w["pid"] == pid && w["held"] == 1)
    });
    let w = workers().into_iter().find(|w| w["pid"] == pid).unwrap();
    assert_eq!(w["state"], "alive", "{w}");
    assert!(
        !w["host"].as_str().unwrap().is_empty() || w["name"].as_str().unwrap().ends_with(&format!(":{pid}")),
        "{w}"
    );
    assert!(w["heartbeatAgeMs"].as_i64().unwrap() >= 0, "{w}");
    assert_eq!(w["leaseLosses"], 0, "{w}");
    // Another holder takes the lease over (as a worker whose claim came
    // after this one's lease ran out would): the worker's renewal is
    // refused, it stops its turn and records the loss.
    raw(&url)
        .execute("UPDATE cairn_sessions SET epoch = epoch + 1, lease_owner = 'elsewhere/0' WHERE id = $1", &[&id])
        .unwrap();
    wait_until("the loss is recorded", &|| format!("{:?}", workers()), &mut || {
        workers().iter().any(|w| w["pid"] == pid && w["leaseLosses"].as_i64() >= Some(1))
    });
    let w = workers().into_iter().find(|w| w["pid"] == pid).unwrap();
    let loss = &w["recentLosses"][0];
    assert_eq!(loss["sessionId"], id.as_str(), "{w}");
    assert!(loss["reason"].as_str().unwrap().contains("lease"), "{w}");
    let text = stdout(&env.cairn(&["--database", &url, "workers"]).output().unwrap());
    assert!(text.contains(&format!("lost {id}")), "{text}");
    signal(guard.0.as_ref().unwrap(), "-TERM");
    assert!(wait_exit(&mut guard, "after SIGTERM").status.success());
    let w = workers().into_iter().find(|w| w["pid"] == pid).unwrap();
    assert_eq!((w["state"].as_str(), w["held"].as_i64()), (Some("stopped"), Some(0)), "{w}");
}

/// Processes (not zombies) whose command line contains `marker`.
fn live_processes(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let dir = entry.path();
        let Ok(cmdline) = std::fs::read(dir.join("cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        let zombie = stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z'));
        if cmdline.contains(marker) && !zombie {
            found.push(format!("{}: {cmdline}", dir.display()));
        }
    }
    found
}

/// Plant a fault: every insert of a line fails with `sqlstate`, the first
/// `times` times (a sequence counts them: it is not rolled back with the
/// failed transaction).
fn plant_fault(url: &str, sqlstate: &str, times: i64) {
    raw(url)
        .batch_execute(&format!(
            "CREATE SEQUENCE planted_faults;
             CREATE FUNCTION planted_fault() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF nextval('planted_faults') <= {times} THEN
                     RAISE EXCEPTION 'planted fault' USING ERRCODE = '{sqlstate}';
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER planted_fault BEFORE INSERT ON cairn_lines FOR EACH ROW EXECUTE FUNCTION planted_fault();"
        ))
        .unwrap();
}

fn clear_fault(url: &str) {
    raw(url).batch_execute("DROP TRIGGER planted_fault ON cairn_lines").unwrap();
}

/// 47.6: a session failed by a fault that retrying does not fix (here a
/// refused privilege, SQLSTATE 42501) keeps its prompt; once the fault is
/// cleared, `cairn requeue` puts it back and a worker finishes it. A
/// requeue of a session with nothing to do is refused, saying why.
#[test]
fn a_failed_session_is_requeued_once_its_fault_is_cleared() {
    let cluster = cluster();
    let url = database(&cluster, "fleet_requeue");
    let env = Env::new();
    let script = env.script(&[json!({"text": "answered", "toolCalls": []})]);
    // The session exists before the fault (its row); its turn's lines fail.
    let id = submit(&env, &url, "answer me");
    plant_fault(&url, "42501", 1_000_000);
    let _guard = start_worker(&env, &url, &script, &[], "2", Stdio::null());
    wait_until("the session fails", &|| format!("{:?}", sessions(&env, &url)), &mut || {
        session(&env, &url, &id)["state"] == "failed"
    });
    let row = session(&env, &url, &id);
    assert!(row["note"].as_str().unwrap().contains("42501"), "{row}");
    assert_eq!(row["queued"], 1, "the prompt is kept: {row}");
    clear_fault(&url);
    let out = env.cairn(&["--database", &url, "requeue", &id[..8]]).output().unwrap();
    stdout(&out);
    wait_until("the requeued session is answered", &|| format!("{:?}", sessions(&env, &url)), &mut || {
        session(&env, &url, &id)["state"] == "idle"
    });
    let log = stdout(&env.cairn(&["--database", &url, "export", &id]).output().unwrap());
    assert!(log.contains("answered"), "{log}");
    let again = env.cairn(&["--database", &url, "requeue", &id]).output().unwrap();
    assert!(!again.status.success());
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(said.contains("idle with no prompt waiting"), "{said}");
}

/// 47.6: a transient fault of the database (a full disk, SQLSTATE 53100)
/// does not fail the session: it is tried again after a backoff and
/// finishes once the fault passes, with no operator.
#[test]
fn a_transient_fault_is_retried_with_a_backoff() {
    let cluster = cluster();
    let url = database(&cluster, "fleet_transient");
    let env = Env::new();
    let script = env.script(&[json!({"text": "answered", "toolCalls": []})]);
    let id = submit(&env, &url, "answer me");
    plant_fault(&url, "53100", 2);
    let _guard = start_worker(&env, &url, &script, &[], "2", Stdio::null());
    wait_until("the session is answered", &|| format!("{:?}", sessions(&env, &url)), &mut || {
        let row = session(&env, &url, &id);
        assert_ne!(row["state"], "failed", "a full disk failed the session: {row}");
        row["state"] == "idle"
    });
    let log = stdout(&env.cairn(&["--database", &url, "export", &id]).output().unwrap());
    assert!(log.contains("answered"), "{log}");
    let tried: i64 = raw(&url).query_one("SELECT nextval('planted_faults')", &[]).unwrap().get(0);
    assert!(tried > 3, "the fault was hit {} times, not twice then passed", tried - 1);
    // Tried three times (two faults, then the answer), each try after the
    // backoff of the failures before it (1 s, then 2 s; the release sets a
    // not-before the claim respects, by the server's clock, so the gaps
    // are lower bounds that load can only lengthen). A worker that handed
    // the session straight back would claim it again within milliseconds.
    let gaps: Vec<f64> = raw(&url)
        .query(
            "SELECT extract(epoch FROM claimed_at - lag(claimed_at) OVER (ORDER BY epoch))::float8
             FROM cairn_claims WHERE session_id = $1 ORDER BY epoch",
            &[&id],
        )
        .unwrap()
        .iter()
        .skip(1)
        .map(|r| r.get(0))
        .collect();
    assert_eq!(gaps.len(), 2, "claims after the first: {gaps:?}");
    assert!(gaps[0] >= 1.0 && gaps[1] >= 2.0, "tries not spaced by the backoff (1 s, 2 s): {gaps:?}");
}

/// 47.6: `cairn cancel` stops a session: a queued one drops its prompts
/// and is idle; a running one's turn is stopped through its worker (the
/// running tool told to stop), then it is idle with who cancelled it, and
/// the worker goes on.
#[test]
fn cairn_cancel_stops_a_queued_or_a_running_session() {
    let cluster = cluster();
    let url = database(&cluster, "fleet_cancel");
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    let queued = submit(&env, &url, "never run");
    let out = env.cairn(&["--database", &url, "cancel", &queued]).output().unwrap();
    stdout(&out);
    // Idle (shown `new`: nothing was ever committed), its prompt gone.
    let row = session(&env, &url, &queued);
    assert_eq!((row["state"].as_str(), row["queued"].as_i64()), (Some("new"), Some(0)), "{row}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 waiting prompt(s) dropped"));

    let script = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell", "arguments": {"command": "sleep 73.25 && touch slept"}}]}),
        json!({"text": "slept", "toolCalls": []}),
    ]);
    let running = submit(&env, &url, "sleep");
    let mut guard = start_worker(&env, &url, &script, &["--allow", "shell"], "2", Stdio::null());
    let tool_started =
        || stdout(&env.cairn(&["--database", &url, "export", &running]).output().unwrap()).contains("toolStarted");
    wait_until("the tool runs", &|| format!("{:?}", sessions(&env, &url)), &mut || tool_started());
    let out = env.cairn(&["--database", &url, "cancel", &running]).output().unwrap();
    stdout(&out);
    assert!(String::from_utf8_lossy(&out.stderr).contains("told to stop"), "{}", String::from_utf8_lossy(&out.stderr));
    wait_until("the cancelled session is idle", &|| format!("{:?}", sessions(&env, &url)), &mut || {
        let row = session(&env, &url, &running);
        assert_ne!(row["state"], "failed", "{row}");
        row["state"] == "idle" && row["holder"].is_null()
    });
    let row = session(&env, &url, &running);
    assert!(row["note"].as_str().unwrap_or("").contains("cancelled by"), "{row}");
    // The tool was stopped, not left to run out its 73 s: its process is
    // gone once the session is idle, and the log says the call failed by
    // the cancel (a cancel that only waited for the turn's end would find
    // the sleep still running, and the call not settled this way).
    assert!(live_processes("sleep 73.25").is_empty(), "the tool still runs: {:?}", live_processes("sleep 73.25"));
    let log = stdout(&env.cairn(&["--database", &url, "export", &running]).output().unwrap());
    assert!(log.contains(r#""type":"toolFailed""#) && log.contains("cancelled"), "{log}");
    assert!(!env.cwd.join("slept").exists(), "the tool ran to its end");
    // The worker goes on: a new session is driven.
    let next = submit(&env, &url, "after");
    let answer_of = |id: &str| stdout(&env.cairn(&["--database", &url, "export", id]).output().unwrap());
    wait_until("the next session is taken", &|| answer_of(&next), &mut || answer_of(&next).contains("toolStarted"));
    let worker = guard.0.as_mut().unwrap();
    assert!(worker.try_wait().unwrap().is_none(), "the worker left after a cancel");
}

/// 47.6: SIGTERM drains a worker: the running turn finishes and commits,
/// the session's next prompt is left queued for another worker, nothing new
/// is claimed, and the worker leaves cleanly.
#[test]
fn sigterm_finishes_the_running_turn_and_takes_nothing_more() {
    let cluster = cluster();
    let url = database(&cluster, "fleet_drain");
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    let script = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell", "arguments": {"command": "sleep 3"}}]}),
        json!({"text": "first done", "toolCalls": []}),
        json!({"text": "second done", "toolCalls": []}),
    ]);
    let id = submit(&env, &url, "first");
    stdout(&env.cairn(&["--database", &url, "submit", "--session", &id, "second"]).output().unwrap());
    let mut guard = start_worker(&env, &url, &script, &["--allow", "shell"], "2", Stdio::piped());
    let export = || stdout(&env.cairn(&["--database", &url, "export", &id]).output().unwrap());
    wait_until("the first turn's tool starts", &export, &mut || export().contains("toolStarted"));
    signal(guard.0.as_ref().unwrap(), "-TERM");
    let other = submit(&env, &url, "new work");
    let out = wait_exit(&mut guard, "a draining worker with one turn to finish");
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{:?}\n{log}", out.status);
    let text = export();
    assert!(text.contains("first done"), "the running turn was not finished:\n{text}\n{log}");
    assert!(!text.contains("second done"), "a draining worker took the next prompt:\n{log}");
    let row = session(&env, &url, &id);
    assert_eq!((row["state"].as_str(), row["queued"].as_i64()), (Some("queued"), Some(1)), "{row}");
    assert_eq!(session(&env, &url, &other)["state"], "queued", "a draining worker claimed new work:\n{log}");
}

/// The steps of the busy session the network tests drive: each one a
/// shell call that stamps `stamps.txt` first thing with two lines, the
/// time (unix ms) and the worker (`$FLEET_WORKER`, set per worker
/// process; the shell's `$` expansion would need a person), then works a
/// little.
const STEPS: usize = 40;

/// 47.5 through the network: a `cairn worker` (the victim) driving a busy
/// session reaches the database through a proxy that `fault`s its
/// connections (when the victim next sends `armed`, or at once); another
/// worker, connected directly, takes the session over once the victim's
/// lease ends, and finishes it. Then the network heals and the victim
/// claims work again.
///
/// Oracles, from outside the workers: the session's claims
/// (`cairn_claims`: the takeover happened, by the healthy worker) and the
/// stamps its shell calls wrote: when a stamp was written, the latest claim
/// of the session was its writer's (no effect after a lost lease; a stamp
/// is written first thing in its call, and a worker starts a call only with
/// a quarter of its lease, 1 s, left, so a stamp would have to lag its
/// call's start by that margin to be misjudged). Every wait has a generous
/// deadline and fails saying what never happened; nothing is timed. The
/// failover time (fault → takeover, by the server's clock) is printed.
fn a_cut_off_worker_loses_its_session_to_another(name: &str, fault: Fault, armed: Option<&[u8]>) {
    let cluster = cluster();
    let url = database(&cluster, name);
    let dbname = url.rsplit("dbname=").next().unwrap().to_owned();
    let proxy = Proxy::to_unix_socket(&cluster.dir().join(".s.PGSQL.5432")).unwrap();
    let via_proxy = format!("host=127.0.0.1 port={} user=postgres dbname={dbname}", proxy.port());
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n[limits]\nmax_steps = 200\n").unwrap();
    let mut lines: Vec<Value> = (1..=STEPS)
        .map(|k| {
            let command = "date +%s%3N >> stamps.txt && printenv FLEET_WORKER >> stamps.txt && sleep 0.3";
            json!({"text": "", "toolCalls": [{"id": format!("c{k}"), "name": "shell", "arguments": {"command": command}}]})
        })
        .collect();
    lines.push(json!({"text": "all steps done", "toolCalls": []}));
    let script = env.script(&lines);
    let spawn = |who: &str, db: &str, log: &Path| {
        // `--yes`: the stamps are Write calls.
        let args = ["--database", db, "--script", script.to_str().unwrap(), "--yes", "worker", "--lease", "4"];
        let log = std::fs::File::create(log).unwrap();
        Guard(Some(env.cairn(&args).env("FLEET_WORKER", who).stdout(Stdio::null()).stderr(log).spawn().unwrap()))
    };
    let (victim_log, healthy_log) = (env.home.join("victim.log"), env.home.join("healthy.log"));
    let said = || {
        format!(
            "--- victim:\n{}\n--- healthy:\n{}\n--- stamps:\n{}",
            std::fs::read_to_string(&victim_log).unwrap_or_default(),
            std::fs::read_to_string(&healthy_log).unwrap_or_default(),
            std::fs::read_to_string(env.cwd.join("stamps.txt")).unwrap_or_default()
        )
    };
    let stamps = || std::fs::read_to_string(env.cwd.join("stamps.txt")).unwrap_or_default();
    let id = submit(&env, &url, "work through the steps");
    let mut db = raw(&url);
    let victim = spawn("victim", &via_proxy, &victim_log);
    let victim_pid = victim.0.as_ref().unwrap().id();
    wait_until("the victim's first steps", &said, &mut || stamps().lines().filter(|l| *l == "victim").count() >= 2);
    // The other worker starts now (nothing else to claim), and is
    // registered before the fault: its start-up is not the failover's.
    let mut healthy = spawn("healthy", &url, &healthy_log);
    let healthy_pid = i64::from(healthy.0.as_ref().unwrap().id());
    let workers = || lines_of(&stdout(&env.cairn(&["--database", &url, "--json", "workers"]).output().unwrap()));
    wait_until("the healthy worker registers", &said, &mut || {
        workers().iter().any(|w| w["pid"] == healthy_pid && w["state"] == "alive")
    });
    match armed {
        Some(pattern) => proxy.arm(pattern, fault),
        None => proxy.fault_now(fault),
    }
    let took = |db: &mut postgres::Client| -> Option<std::time::SystemTime> {
        db.query_opt(
            "SELECT claimed_at FROM cairn_claims WHERE session_id = $1 AND owner LIKE $2 ORDER BY epoch LIMIT 1",
            &[&id, &format!("%:{healthy_pid}/%")],
        )
        .unwrap()
        .map(|r| r.get(0))
    };
    wait_until("the healthy worker takes the session over", &said, &mut || {
        assert!(
            session(&env, &url, &id)["state"] != "idle" || took(&mut db).is_some(),
            "the session was finished by the victim before the fault landed (lengthen the script)\n{}",
            said()
        );
        took(&mut db).is_some()
    });
    let fault_at = proxy.last_started().expect("the armed fault never started");
    let taken_at = took(&mut db).unwrap();
    proxy.heal();
    let export = || stdout(&env.cairn(&["--database", &url, "export", &id]).output().unwrap());
    wait_until("the session is finished by its new holder", &|| format!("{}\n{}", export(), said()), &mut || {
        session(&env, &url, &id)["state"] == "idle"
    });
    assert!(export().contains("all steps done"), "{}\n{}", export(), said());
    assert_eq!(session(&env, &url, &id)["state"], "idle", "{}", said());
    if let Some(mut c) = healthy.0.take() {
        let _ = c.kill();
        let _ = c.wait();
    }

    // No effect after a lost lease: each stamp's writer held the latest
    // claim when it wrote it.
    let claims: Vec<(i64, String, std::time::SystemTime)> = db
        .query("SELECT epoch, owner, claimed_at FROM cairn_claims WHERE session_id = $1 ORDER BY epoch", &[&id])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let pid_of = |who: &str| if who == "victim" { i64::from(victim_pid) } else { healthy_pid };
    let (mut by_victim, mut by_healthy) = (0, 0);
    let text = stamps();
    let lines: Vec<&str> = text.lines().collect();
    for pair in lines.chunks(2) {
        // Two workers stamping at once would interleave their lines.
        let (Some(Ok(ms)), Some(who @ ("victim" | "healthy"))) =
            (pair.first().map(|t| t.parse()), pair.get(1).copied())
        else {
            panic!("stamps interleaved ({pair:?}): two workers ran a step at once\n{}", said());
        };
        let at = std::time::UNIX_EPOCH + Duration::from_millis(ms);
        let holder = claims.iter().filter(|c| c.2 <= at).max_by_key(|c| c.0);
        assert!(
            holder.is_some_and(|c| c.1.contains(&format!(":{}/", pid_of(who)))),
            "{who} stamped at {at:?} while the latest claim was {holder:?} (claims {claims:?})\n{}",
            said()
        );
        if who == "victim" {
            by_victim += 1;
        } else {
            by_healthy += 1;
        }
    }
    assert!(by_healthy > 0, "the healthy worker stamped nothing after its takeover\n{}", said());
    #[allow(clippy::print_stderr)]
    {
        eprintln!(
            "{name}: {fault:?}{} -> takeover in {:?} (lease 4 s); {by_victim} steps by the victim, {by_healthy} by the other worker; {} proxied connections",
            if armed.is_some() { " when armed" } else { "" },
            taken_at.duration_since(fault_at).unwrap_or_default(),
            proxy.accepted()
        );
    }

    // Healed, the victim claims work again.
    let next = submit(&env, &url, "more work");
    wait_until("the healed victim claims new work", &said, &mut || {
        db.query_one(
            "SELECT count(*) FROM cairn_claims WHERE session_id = $1 AND owner LIKE $2",
            &[&next, &format!("%:{victim_pid}/%")],
        )
        .unwrap()
        .get::<_, i64>(0)
            > 0
    });
    drop(victim);
}

/// What the commit of a line recording a tool's start carries (since
/// 47.4 a holder's commit is one statement, not `BEGIN` … `COMMIT`).
const TOOL_STARTED: &[u8] = b"toolStarted";

/// 47.5: the victim's connections are reset (and new ones refused) while
/// it drives a session.
#[test]
fn a_worker_whose_connections_are_reset_is_taken_over() {
    a_cut_off_worker_loses_its_session_to_another("cut_reset", Fault::Reset, None);
}

/// 47.5, the hard case: a blackhole swallows the victim's commit of a
/// tool's start, mid-turn, so the victim hears nothing back and its lease
/// runs out while it waits; the other worker takes the session over and
/// nobody waits for the partition. (Before 47.4 that commit was an
/// explicit `COMMIT` and the server sat inside the transaction, the row
/// locked, until its idle-in-transaction timeout; a holder's commit is now
/// one statement, and a claim's transaction cut open is the partition
/// soak's claim phase, cairn-pg's `partition_pg_workers`.)
#[test]
fn a_worker_blackholed_mid_commit_is_taken_over() {
    a_cut_off_worker_loses_its_session_to_another("cut_blackhole", Fault::Blackhole, Some(TOOL_STARTED));
}

/// 47.1 through the network: what the victim sends lands at once, but
/// every reply reaches it 6 s late (longer than its 4 s lease): its
/// renewals and commits take effect, yet it hears of them after the lease
/// they extended may have ended, and another worker takes the session over
/// in a gap; a reply (say, to the commit recording `toolStarted`) arriving
/// after that claim must start nothing.
#[test]
fn a_worker_hearing_the_server_late_starts_nothing_after_its_lease() {
    a_cut_off_worker_loses_its_session_to_another(
        "cut_late_replies",
        Fault::DelayReplies(Duration::from_secs(6)),
        None,
    );
}

/// 47.5: every byte to and from the victim arrives 6 s late (longer than
/// its 4 s lease): its renewals come too late; what it sent still arrives.
#[test]
fn a_worker_whose_replies_arrive_after_its_lease_is_taken_over() {
    a_cut_off_worker_loses_its_session_to_another("cut_delay", Fault::Delay(Duration::from_secs(6)), None);
}
