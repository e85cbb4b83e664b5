//! Batch jobs through the real `cairn` binary: `cairn batch SPEC...`, and
//! `b/` of `cairn serve` over 9P (cairn-9p's raw client): 20 jobs with
//! `parallel`, the server SIGKILLed midway and restarted, every job done
//! with each of its sessions run once; `rm -r b/JOB` cancelling a running
//! job durably (it is not resumed after a restart).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_debug_implementations, unreachable_pub)]

use crate::util;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use cairn_9p::Dial;
use cairn_9p::client::{Conn, mode};
use serde_json::{Value, json};
use util::Env;

struct Served {
    child: Child,
    address: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(env: &Env) -> Served {
    let mut child = env.cairn(&["serve"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    if out.read_line(&mut line).unwrap() == 0 {
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        panic!("cairn serve printed no address; stderr: {err}");
    }
    Served { child, address: line.trim().to_owned() }
}

fn connect(address: &str) -> Conn {
    Conn::dial(&Dial::parse(address).unwrap()).unwrap()
}

/// Wait for `f` (polling; a generous bound so a hang fails instead of
/// blocking the suite — not a timing claim).
fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(180);
    while !f() {
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn submit(conn: &mut Conn, spec: &str) -> String {
    let (fid, _) = conn.walk("b/new").unwrap();
    conn.open(fid, mode::RDWR).unwrap();
    conn.write_at(fid, 0, spec.as_bytes()).unwrap_or_else(|e| panic!("b/new refused {spec:?}: {e:#}"));
    let id = String::from_utf8(conn.read_at(fid, 0, 1024).unwrap()).unwrap().trim().to_owned();
    conn.clunk(fid).unwrap();
    id
}

fn status(conn: &mut Conn, job: &str) -> String {
    conn.read_text(&format!("b/{job}/status")).map(|s| s.trim().to_owned()).unwrap_or_else(|e| format!("error: {e:#}"))
}

fn write_script(path: &Path, lines: &[Value]) {
    std::fs::write(path, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
}

fn entries(path: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    for line in std::fs::read_to_string(path).unwrap().lines().skip(1) {
        let records = match serde_json::from_str::<Value>(line).unwrap() {
            Value::Array(items) => items,
            one => vec![one],
        };
        out.extend(records.into_iter().filter(|r| r["kind"] == "entry"));
    }
    out
}

fn count(log: &[Value], kind: &str) -> usize {
    log.iter().filter(|e| e["type"] == kind).count()
}

/// A script whose one tool call appends a line to `ran.log` in the job's
/// directory (unstaged `shell`: replay policy Never), then answers.
fn job_script(env: &Env, answer: &str, command: &str) -> PathBuf {
    let path = env.home.join(format!("{answer}.jsonl"));
    write_script(
        &path,
        &[
            json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell", "arguments": {"command": command}}]}),
            json!({"text": answer}),
        ],
    );
    path
}

#[test]
fn cairn_batch_runs_specs_and_prints_their_answers() {
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    let script = job_script(&env, "all-good", "echo ran | tee -a ran.log");
    let spec = format!(
        "cwd={}\nprovider=scripted\nscript={}\nparallel=3\nallow=shell\n---\ncount the files\n",
        env.cwd.display(),
        script.display()
    );
    std::fs::write(env.home.join("a.spec"), &spec).unwrap();
    let out = env.cairn(&["batch", env.home.join("a.spec").to_str().unwrap()]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(": done"), "{stdout}");
    assert_eq!(stdout.matches("all-good").count(), 3, "one answer per session: {stdout}");
    assert_eq!(std::fs::read_to_string(env.cwd.join("ran.log")).unwrap(), "ran\nran\nran\n");

    let mut bad =
        env.cairn(&["batch", "-"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    drop(bad.stdin.take());
    let out = bad.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("---"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn twenty_jobs_survive_a_sigkill_of_the_server_and_each_runs_once() {
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n\n[batch]\nmax_running = 3\n").unwrap();
    let mut server = serve(&env);
    let mut conn = connect(&server.address);
    assert!(conn.read_text("help").unwrap().contains("b/new"));
    for bad in
        ["no separator", "cwd=/nonexistent-dir\n---\nx", "cwd=/\nparallel=0\n---\nx", "cwd=/\ncolour=red\n---\nx"]
    {
        // The spec is taken whole: the error comes with the read that asks
        // for the job's id, and again at the clunk; no job is created.
        let (fid, _) = conn.walk("b/new").unwrap();
        conn.open(fid, mode::RDWR).unwrap();
        conn.write_at(fid, 0, bad.as_bytes()).unwrap();
        assert!(conn.read_at(fid, 0, 1024).is_err(), "b/new accepted {bad:?}");
        assert!(conn.clunk(fid).is_err(), "b/new's clunk accepted {bad:?}");
    }
    let mut jobs = Vec::new();
    for n in 0..20u32 {
        let dir = env.cwd.join(format!("job-{n}"));
        std::fs::create_dir(&dir).unwrap();
        let script = job_script(&env, &format!("answer-{n}"), "echo ran | tee -a ran.log; sleep 0.2");
        let parallel = 1 + n % 3;
        let spec = format!(
            "cwd={}\nprovider=scripted\nscript={}\nparallel={parallel}\nallow=shell\n---\njob {n}\n",
            dir.display(),
            script.display()
        );
        let job = submit(&mut conn, &spec);
        assert!(conn.read_text(&format!("b/{job}/spec")).unwrap().contains(&format!("parallel={parallel}")));
        jobs.push((job, dir, parallel, n));
    }
    // Kill the server once some jobs are done and others are not.
    wait_for("a first finished job", || jobs.iter().any(|(job, ..)| status(&mut conn, job) == "done"));
    let done_before = jobs.iter().filter(|(job, ..)| status(&mut conn, job) == "done").count();
    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();
    assert!(done_before < jobs.len(), "the kill came after every job ended; nothing was tested");
    drop(server);

    let server = serve(&env);
    let mut conn = connect(&server.address);
    wait_for("every job done", || {
        jobs.iter().all(|(job, ..)| {
            let s = status(&mut conn, job);
            assert!(!s.starts_with("failed"), "job {job}: {s}");
            s == "done"
        })
    });
    let mut sessions = 0;
    for (job, dir, parallel, n) in &jobs {
        let result = conn.read_text(&format!("b/{job}/result")).unwrap();
        assert_eq!(result.matches(&format!("answer-{n}")).count(), *parallel as usize, "{result}");
        let usage = conn.read_text(&format!("b/{job}/usage")).unwrap();
        assert!(usage.contains(&format!("sessions {parallel}")), "{usage}");
        for k in 0..*parallel {
            let path = env.home.join("sessions").join(format!("{job}-{k}.jsonl"));
            let log = entries(&path);
            let users = log.iter().filter(|e| e["type"] == "message" && e["payload"]["role"] == "user").count();
            assert_eq!(users, 1, "{job}-{k} ran one turn");
            assert!(count(&log, "toolStarted") <= 1, "{job}-{k} started its tool once");
            sessions += 1;
        }
        assert!(!env.home.join("sessions").join(format!("{job}-{parallel}.jsonl")).exists());
        let lines = std::fs::read_to_string(dir.join("ran.log")).unwrap_or_default().lines().count();
        assert!(lines <= *parallel as usize, "job {n}: {lines} runs for {parallel} sessions");
    }
    let all = std::fs::read_dir(env.home.join("sessions"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "jsonl"));
    assert_eq!(all.count(), sessions, "no session beyond the jobs' units");
}

#[test]
fn removing_a_running_job_cancels_it_durably() {
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n\n[batch]\nmax_running = 1\n").unwrap();
    let slow = job_script(&env, "slow", "echo started | tee -a started.log; sleep 30");
    let quick = job_script(&env, "quick", "echo quick | tee -a quick.log");
    let server = serve(&env);
    let mut conn = connect(&server.address);
    let spec = |script: &Path| {
        format!("cwd={}\nprovider=scripted\nscript={}\nallow=shell\n---\ngo\n", env.cwd.display(), script.display())
    };
    let job = submit(&mut conn, &spec(&slow));
    wait_for("the slow job running its tool", || env.cwd.join("started.log").exists());
    assert_eq!(status(&mut conn, &job), "running");
    conn.remove(&format!("b/{job}")).unwrap();
    assert!(conn.walk(&format!("b/{job}")).is_err(), "a cancelled job is gone from b/");
    let session = env.home.join("sessions").join(format!("{job}-0.jsonl"));
    wait_for("the cancelled turn settled", || {
        std::fs::read_to_string(&session).unwrap().contains("\"phase\":\"cancelled\"")
    });
    let settled = std::fs::read(&session).unwrap();
    drop(conn);
    drop(server);

    // After a restart the cancelled job stays cancelled: with one worker, a
    // resumed slow job would run before the next one.
    let server = serve(&env);
    let mut conn = connect(&server.address);
    let next = submit(&mut conn, &spec(&quick));
    wait_for("the next job", || status(&mut conn, &next) == "done");
    assert_eq!(std::fs::read(&session).unwrap(), settled, "the cancelled session was not resumed");
    assert_eq!(std::fs::read_to_string(env.cwd.join("started.log")).unwrap(), "started\n");
    let names: Vec<String> = conn.list("b").unwrap().iter().map(|s| s.name.clone()).collect();
    assert!(!names.contains(&job), "{names:?}");
}

#[test]
fn usage_over_9p_rolls_up_a_parents_children() {
    let env = Env::new();
    let child = env.home.join("child.jsonl");
    write_script(&child, &[json!({"text": "child answer"})]);
    let parent = env.home.join("parent.jsonl");
    write_script(
        &parent,
        &[
            json!({"text": "", "toolCalls": [{"id": "s1", "name": "spawn_agent", "arguments": {"prompt": "p", "script": "child.jsonl"}}]}),
            json!({"text": "done"}),
        ],
    );
    let out = env.cairn(&["--script", parent.to_str().unwrap(), "run", "go"]).stdin(Stdio::null()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = std::fs::read_dir(env.home.join("sessions"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".jsonl")).map(str::to_owned))
        .find(|n| !n.contains('+'))
        .unwrap();
    let server = serve(&env);
    let mut conn = connect(&server.address);
    let usage = conn.read_text(&format!("s/{id}/usage")).unwrap();
    let field = |name: &str| -> u64 {
        usage.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).unwrap().parse().unwrap()
    };
    assert_eq!(field("children"), 1, "{usage}");
    assert!(field("children_input") > 0 && field("children_output") > 0, "{usage}");
    let child_id = format!("{id}+");
    let listed: Vec<String> = conn.list("s").unwrap().iter().map(|s| s.name.clone()).collect();
    let child_usage = conn.read_text(&format!("s/{}/usage", listed.iter().find(|n| n.starts_with(&child_id)).unwrap()));
    assert!(child_usage.unwrap().contains("children 0"));
}

#[test]
fn a_unit_that_cannot_run_fails_the_job_with_its_reason() {
    let env = Env::new();
    let script = env.home.join("empty.jsonl");
    std::fs::write(&script, "").unwrap();
    let spec = format!("cwd={}\nprovider=scripted\nscript={}\n---\ngo\n", env.cwd.display(), script.display());
    std::fs::write(env.home.join("a.spec"), &spec).unwrap();
    let out = env.cairn(&["batch", env.home.join("a.spec").to_str().unwrap()]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(": failed: "), "{stdout}");
    // A failed unit is not retried by the next runner.
    let again = env.cairn(&["batch"]).output().unwrap();
    assert!(String::from_utf8_lossy(&again.stdout).contains(": failed: "));
}

/// Every session file under `dir`, as text.
fn session_texts(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "jsonl") && !path.starts_with(dir.join("scripts")) {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                if text.starts_with("{\"cairn\"") || text.contains("\"kind\":\"entry\"") {
                    out.push(text);
                }
            }
        }
    }
    out
}

/// `yes=1` in a spec is the session's standing approval of Write calls,
/// decided by core's policy (it used to be accepted by `s/new` only and
/// silently absent from batch specs); without it and without `allow`,
/// nobody can answer and the call is refused by the policy, not by a host.
#[test]
fn a_batch_spec_with_yes_approves_write_calls_and_without_it_they_are_refused() {
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    let script = job_script(&env, "yes-done", "echo ran | tee -a ran.log");
    for (yes, expect_ran) in [("yes=1\n", true), ("", false)] {
        let _ = std::fs::remove_file(env.cwd.join("ran.log"));
        let spec = format!("cwd={}\nprovider=scripted\nscript={}\n{yes}---\ngo\n", env.cwd.display(), script.display());
        std::fs::write(env.home.join("y.spec"), &spec).unwrap();
        let out = env.cairn(&["batch", env.home.join("y.spec").to_str().unwrap()]).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("yes-done"), "{yes:?}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(env.cwd.join("ran.log").exists(), expect_ran, "{yes:?}");
    }
    let texts = session_texts(&env.home);
    assert!(texts.iter().any(|t| t.contains("\"by\":\"9p:yes=1\"")), "a call approved by yes=1");
    assert!(texts.iter().any(|t| t.contains("\"by\":\"policy:headless\"")), "a call refused by the policy");
    let bad = "cwd=/\nyes=maybe\n---\ngo\n";
    std::fs::write(env.home.join("bad.spec"), bad).unwrap();
    let out = env.cairn(&["batch", env.home.join("bad.spec").to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("yes=\"maybe\""), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A spec written in several writes is taken whole (issue 29): a 6 KB batch
/// spec used to run as a job of its first 4,096 bytes, and `s/new` created
/// one session per write.
#[test]
fn a_spec_written_in_pieces_is_taken_whole() {
    let env = Env::new();
    let server = serve(&env);
    let mut conn = connect(&server.address);
    let script = env.home.join("whole.jsonl");
    write_script(&script, &[json!({"text": "done"})]);
    let long = format!("please do this: {}\nTHE END", "x".repeat(6000));
    let spec = format!("cwd={}\nprovider=scripted\nscript={}\n---\n{long}\n", env.cwd.display(), script.display());
    let (fid, _) = conn.walk("b/new").unwrap();
    conn.open(fid, mode::RDWR).unwrap();
    let mut at = 0u64;
    for piece in spec.as_bytes().chunks(4096) {
        conn.write_at(fid, at, piece).unwrap();
        at += piece.len() as u64;
    }
    let job = String::from_utf8(conn.read_at(fid, 0, 1024).unwrap()).unwrap().trim().to_owned();
    conn.clunk(fid).unwrap();
    let stored = conn.read_text(&format!("b/{job}/spec")).unwrap();
    assert!(stored.contains("THE END"), "the whole prompt is the job's: {} bytes", stored.len());
    assert_eq!(conn.list("b").unwrap().iter().filter(|e| e.name != "new").count(), 1, "one job");

    // Sessions not of the job (whose unit session may appear meanwhile).
    let own = |conn: &mut Conn| {
        conn.read_text("s/idx").unwrap().lines().filter(|l| !l.starts_with(&format!("{job}-"))).count()
    };
    let before = own(&mut conn);
    let (fid, _) = conn.walk("s/new").unwrap();
    conn.open(fid, mode::RDWR).unwrap();
    let first = format!("cwd={}\n", env.cwd.display());
    conn.write_at(fid, 0, first.as_bytes()).unwrap();
    conn.write_at(fid, first.len() as u64, b"name=two-writes\n").unwrap();
    let id = String::from_utf8(conn.read_at(fid, 0, 1024).unwrap()).unwrap().trim().to_owned();
    conn.clunk(fid).unwrap();
    let idx = conn.read_text("s/idx").unwrap();
    assert_eq!(own(&mut conn), before + 1, "one session for one spec: {idx}");
    let line = idx.lines().find(|l| l.starts_with(&id)).unwrap_or_else(|| panic!("{id} in {idx}"));
    assert!(line.ends_with("two-writes"), "both writes are the spec: {line}");
}
