//! `cairn toolsrv` (the tool service over 9P) with real processes: the
//! service is the real `cairn toolsrv`, the agent the real `cairn run` /
//! `cairn resume --toolsrv`, and the tree is read with cairn-9p's raw
//! client. Crashes are real SIGKILLs of either process.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_debug_implementations, unreachable_pub)]

use crate::util;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use cairn_9p::Dial;
use cairn_9p::client::{Conn, mode};
use serde_json::{Value, json};
use util::Env;

/// A running `cairn toolsrv` and the address it printed.
struct Toolsrv {
    child: Child,
    address: String,
}

impl Drop for Toolsrv {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn toolsrv(env: &Env, listen: &str) -> Toolsrv {
    let mut child =
        env.cairn(&["toolsrv", "--listen", listen]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    if BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap() == 0 {
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        panic!("cairn toolsrv printed no address; stderr: {err}");
    }
    Toolsrv { child, address: line.trim().to_owned() }
}

/// A private directory for a socket (the server refuses one open to others).
fn socket(env: &Env) -> String {
    let dir = env.home.join("sock");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    format!("unix!{}", dir.join("toolsrv.sock").display())
}

/// Unstaged `shell`: the effect lands in the live tree (what the tests observe).
fn unstaged(env: &Env) {
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
}

fn entry_records(env: &Env) -> Vec<Value> {
    let files = env.session_files();
    assert_eq!(files.len(), 1, "one session: {files:?}");
    let text = std::fs::read_to_string(&files[0]).unwrap();
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        match serde_json::from_str::<Value>(line).unwrap() {
            Value::Array(items) => out.extend(items),
            one => out.push(one),
        }
    }
    out.retain(|r| r["kind"] == "entry");
    out
}

fn count(records: &[Value], ty: &str) -> usize {
    records.iter().filter(|r| r["type"] == ty).count()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn shell_call(command: &str) -> Value {
    json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell", "arguments": {"command": command}}]})
}

#[test]
fn lists_tools_and_serves_their_meta_read_only() {
    let env = Env::new();
    let srv = toolsrv(&env, &socket(&env));
    let mut conn = Conn::dial(&Dial::parse(&srv.address).unwrap()).unwrap();
    let root: Vec<String> = conn.list("").unwrap().into_iter().map(|s| s.name).collect();
    assert_eq!(root, ["t", "jobs"]);
    let tools: Vec<String> = conn.list("t").unwrap().into_iter().map(|s| s.name).collect();
    for expected in ["read_file", "shell"] {
        assert!(tools.iter().any(|t| t == expected), "{expected} missing from t/: {tools:?}");
    }
    let meta: Value = serde_json::from_slice(&conn.read_file("t/shell/meta").unwrap()).unwrap();
    assert_eq!(meta["name"], "shell");
    assert!(meta["inputSchema"].is_object(), "{meta}");
    for field in ["description", "risk", "capabilities", "replay"] {
        assert!(!meta[field].is_null(), "meta lacks {field}: {meta}");
    }
    // Hostile uses: writing meta, unknown tools, bad requests, a job that does not exist.
    assert!(conn.write_file("t/shell/meta", b"{}").is_err(), "meta is read-only");
    assert!(conn.walk("t/no_such_tool").is_err());
    assert!(conn.walk("jobs/inothere").is_err());
    assert!(conn.walk("t/../../jobs").is_ok(), "'..' of the root is the root");
    assert!(conn.walk("t/../../etc").is_err(), "'..' never leaves the tree");
    for bad in [&b"not json"[..], br#"{"tool":"nope","cwd":"/"}"#, br#"{"tool":"shell","cwd":"relative"}"#] {
        let (fid, _) = conn.walk("jobs/new").unwrap();
        conn.open(fid, mode::RDWR).unwrap();
        conn.write_at(fid, 0, bad).unwrap();
        assert!(conn.read_at(fid, 0, 64).is_err(), "{} accepted", String::from_utf8_lossy(bad));
        let _ = conn.clunk(fid);
    }
    let jobs: Vec<String> = conn.list("jobs").unwrap().into_iter().map(|s| s.name).collect();
    assert_eq!(jobs, ["new"], "refused requests left no job");
}

/// A job driven by hand: id on the same fid, streamed out, status, receipt;
/// the same invocation asked again answers the same job without re-running.
#[test]
fn a_job_by_hand_runs_once_per_invocation() {
    let env = Env::new();
    unstaged(&env);
    let srv = toolsrv(&env, &socket(&env));
    let mut conn = Conn::dial(&Dial::parse(&srv.address).unwrap()).unwrap();
    let request = json!({"tool": "shell", "arguments": {"command": "echo once | tee -a once.txt"},
        "invocation": "inv-1", "session": "s", "cwd": env.cwd.display().to_string()});
    let submit = |conn: &mut Conn| {
        let (fid, _) = conn.walk("jobs/new").unwrap();
        conn.open(fid, mode::RDWR).unwrap();
        conn.write_at(fid, 0, request.to_string().as_bytes()).unwrap();
        let id = String::from_utf8(conn.read_at(fid, 0, 64).unwrap()).unwrap().trim().to_owned();
        conn.clunk(fid).unwrap();
        id
    };
    let id = submit(&mut conn);
    assert_eq!(id, cairn_9p::toolsrv::job_id("s", "inv-1"));
    let out = conn.read_text(&format!("jobs/{id}/out")).unwrap();
    assert_eq!(out.trim(), "once");
    assert_eq!(conn.read_text(&format!("jobs/{id}/status")).unwrap().trim(), "done");
    let receipt: Value = serde_json::from_slice(&conn.read_file(&format!("jobs/{id}/receipt")).unwrap()).unwrap();
    assert_eq!(receipt["exitCode"], 0, "{receipt}");
    assert_eq!(submit(&mut conn), id);
    assert_eq!(std::fs::read_to_string(env.cwd.join("once.txt")).unwrap(), "once\n", "run once");
    // Durable: the files are under $CAIRN_HOME/toolsrv/jobs/ID.
    let dir = env.home.join("toolsrv/jobs").join(&id);
    assert_eq!(std::fs::read_to_string(dir.join("status")).unwrap().trim(), "done");
    assert!(dir.join("receipt.json").is_file());
}

fn run_through(listen: &str) {
    let env = Env::new();
    unstaged(&env);
    let listen = if listen == "unix" { socket(&env) } else { listen.to_owned() };
    let srv = toolsrv(&env, &listen);
    let script = env.script(&[shell_call("echo hello-from-toolsrv"), json!({"text": "all done"})]);
    let out = env
        .cairn(&["--script", script.to_str().unwrap(), "--yes", "--toolsrv", &srv.address, "run", "go"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (o, e) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{o}\n{e}");
    assert!(o.contains("all done"), "{o}\n{e}");
    let records = entry_records(&env);
    assert_eq!(count(&records, "toolCompleted"), 1, "{records:?}");
    let text = serde_json::to_string(&records).unwrap();
    assert!(text.contains("hello-from-toolsrv"), "the job's output reached the session: {text}");
    let jobs: Vec<PathBuf> =
        std::fs::read_dir(env.home.join("toolsrv/jobs")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(std::fs::read_to_string(jobs[0].join("status")).unwrap().trim(), "done");
}

#[test]
fn run_uses_the_service_over_a_unix_socket() {
    run_through("unix");
}

#[test]
fn run_uses_the_service_over_tcp_loopback() {
    run_through("tcp!127.0.0.1!0");
}

/// SIGKILL of the agent while its job runs; `cairn resume --last` settles
/// the call from the job's receipt: the command ran once, settled once.
#[test]
fn sigkill_of_the_agent_then_resume_settles_from_the_receipt() {
    let env = Env::new();
    unstaged(&env);
    let srv = toolsrv(&env, &socket(&env));
    let marker = env.cwd.join("ran.txt");
    let script = env.script(&[shell_call("echo ran | tee -a ran.txt; sleep 2"), json!({"text": "after the crash"})]);
    let s = script.to_str().unwrap();
    let mut agent = env
        .cairn(&["--script", s, "--yes", "--toolsrv", &srv.address, "run", "go"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the job to start", || marker.exists());
    agent.kill().unwrap(); // SIGKILL
    agent.wait().unwrap();
    let out = env
        .cairn(&["--script", s, "--yes", "--toolsrv", &srv.address, "resume", "--last"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (o, e) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(o.contains("after the crash"), "{o}\n{e}");
    let records = entry_records(&env);
    assert_eq!(count(&records, "toolStarted"), 1, "{records:?}");
    assert_eq!(count(&records, "toolCompleted"), 1, "settled from the receipt: {records:?}");
    let completed = records.iter().find(|r| r["type"] == "toolCompleted").unwrap().to_string();
    assert!(completed.contains("\"guard\""), "settled by the guard (the job's receipt), not a new run: {completed}");
    assert_eq!(count(&records, "toolFailed"), 0, "{records:?}");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "ran\n", "the command ran exactly once");
    let jobs = std::fs::read_dir(env.home.join("toolsrv/jobs")).unwrap().count();
    assert_eq!(jobs, 1, "one job for the invocation");
}

/// SIGKILL of the service while a job runs: the agent's call settles failed
/// with a reason naming the service, the next call (service gone) fails as
/// unreachable without running, and the turn goes on (no hang).
#[test]
fn sigkill_of_the_service_fails_the_call_with_a_reason() {
    let env = Env::new();
    unstaged(&env);
    let mut srv = toolsrv(&env, &socket(&env));
    let marker = env.cwd.join("started.txt");
    let second = json!({"text": "", "toolCalls": [{"id": "c2", "name": "shell", "arguments": {"command": "echo second | tee -a second.txt"}}]});
    let script =
        env.script(&[shell_call("echo started | tee -a started.txt; sleep 60"), second, json!({"text": "went on"})]);
    let agent = env
        .cairn(&["--script", script.to_str().unwrap(), "--yes", "--toolsrv", &srv.address, "run", "go"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the job to start", || marker.exists());
    srv.child.kill().unwrap(); // SIGKILL
    srv.child.wait().unwrap();
    let out = agent.wait_with_output().unwrap();
    let (o, e) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(o.contains("went on"), "the turn went on: {o}\n{e}");
    let records = entry_records(&env);
    let failed: Vec<String> = records.iter().filter(|r| r["type"] == "toolFailed").map(Value::to_string).collect();
    assert_eq!(failed.len(), 2, "{records:?}");
    assert!(failed[0].contains("tool service") && failed[0].contains("went away"), "{}", failed[0]);
    assert!(failed[1].contains("unreachable") && failed[1].contains("not run"), "{}", failed[1]);
    assert!(!env.cwd.join("second.txt").exists(), "the second call did not run");
}

/// The interpreter of the pinned venv `name` (`scripts/venv`); a missing
/// python or PyPI fails the test with the reason.
fn venv_python(name: &str) -> PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out =
        std::process::Command::new(root.join("scripts/venv")).arg(name).output().expect("cannot run scripts/venv");
    assert!(
        out.status.success(),
        "scripts/venv {name} failed (python3 with venv and PyPI are needed for this test): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// PyPI python-9p lists t/ and runs a job, over a Unix socket and TCP.
#[test]
fn pypi_python_9p_lists_tools_and_runs_a_job() {
    let python = venv_python("ninep");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/toolsrv_py9p.py");
    for listen in ["unix", "tcp!127.0.0.1!0"] {
        let env = Env::new();
        unstaged(&env);
        let listen = if listen == "unix" { socket(&env) } else { listen.to_owned() };
        let srv = toolsrv(&env, &listen);
        let out = std::process::Command::new(&python)
            .arg(&script)
            .args([srv.address.as_str(), env.cwd.to_str().unwrap()])
            .output()
            .unwrap();
        let (o, e) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && o.trim() == "OK", "{listen}: {o}\n{e}");
    }
}

/// A finished job outlives its service: a restarted `cairn toolsrv` serves
/// its receipt; a job the dead service left running reads as failed.
#[test]
fn jobs_outlive_a_restart_of_the_service() {
    let env = Env::new();
    unstaged(&env);
    let listen = socket(&env);
    let submit = |conn: &mut Conn, invocation: &str, command: &str| {
        let request = json!({"tool": "shell", "arguments": {"command": command},
            "invocation": invocation, "cwd": env.cwd.display().to_string()});
        let (fid, _) = conn.walk("jobs/new").unwrap();
        conn.open(fid, mode::RDWR).unwrap();
        conn.write_at(fid, 0, request.to_string().as_bytes()).unwrap();
        let id = String::from_utf8(conn.read_at(fid, 0, 64).unwrap()).unwrap().trim().to_owned();
        conn.clunk(fid).unwrap();
        id
    };
    let mut srv = toolsrv(&env, &listen);
    let mut conn = Conn::dial(&Dial::parse(&srv.address).unwrap()).unwrap();
    let done = submit(&mut conn, "a", "echo kept");
    assert_eq!(conn.read_text(&format!("jobs/{done}/out")).unwrap().trim(), "kept");
    let receipt = conn.read_file(&format!("jobs/{done}/receipt")).unwrap();
    let marker = env.cwd.join("long.txt");
    let long = submit(&mut conn, "b", "echo x | tee -a long.txt; sleep 60");
    wait_for("the long job to start", || marker.exists());
    assert_eq!(conn.read_text(&format!("jobs/{long}/status")).unwrap().trim(), "running");
    drop(conn);
    srv.child.kill().unwrap(); // SIGKILL
    srv.child.wait().unwrap();

    let srv = toolsrv(&env, &listen);
    let mut conn = Conn::dial(&Dial::parse(&srv.address).unwrap()).unwrap();
    assert_eq!(conn.read_file(&format!("jobs/{done}/receipt")).unwrap(), receipt);
    assert_eq!(conn.read_text(&format!("jobs/{done}/status")).unwrap().trim(), "done");
    let status = conn.read_text(&format!("jobs/{long}/status")).unwrap();
    assert!(status.starts_with("failed: ") && status.contains("stopped"), "{status}");
    assert!(conn.read_file(&format!("jobs/{long}/receipt")).is_err(), "no receipt for a job that never finished");
    // Asking again for a finished invocation answers the same job, not a new run.
    assert_eq!(submit(&mut conn, "a", "echo kept"), done);
    assert_eq!(std::fs::read_dir(env.home.join("toolsrv/jobs")).unwrap().count(), 2);
}

/// `ctl` kill ends a running job as `killed`; other ctl words are refused.
#[test]
fn ctl_kill_ends_a_job() {
    let env = Env::new();
    unstaged(&env);
    let srv = toolsrv(&env, &socket(&env));
    let mut conn = Conn::dial(&Dial::parse(&srv.address).unwrap()).unwrap();
    let request = json!({"tool": "shell", "arguments": {"command": "echo up | tee -a up.txt; sleep 60"},
        "invocation": "k", "cwd": env.cwd.display().to_string()});
    let (fid, _) = conn.walk("jobs/new").unwrap();
    conn.open(fid, mode::RDWR).unwrap();
    conn.write_at(fid, 0, request.to_string().as_bytes()).unwrap();
    let id = String::from_utf8(conn.read_at(fid, 0, 64).unwrap()).unwrap().trim().to_owned();
    conn.clunk(fid).unwrap();
    wait_for("the job to start", || env.cwd.join("up.txt").exists());
    assert!(conn.write_file(&format!("jobs/{id}/ctl"), b"explode").is_err());
    conn.write_file(&format!("jobs/{id}/ctl"), b"kill\n").unwrap();
    // out ends when the job does; then the status says how.
    let _ = conn.read_file(&format!("jobs/{id}/out")).unwrap();
    assert_eq!(conn.read_text(&format!("jobs/{id}/status")).unwrap().trim(), "killed");
    assert!(conn.write_file(&format!("jobs/{id}/ctl"), b"kill").is_err(), "a finished job cannot be killed");
}

/// Ctrl-C (SIGINT) of the agent during a remote call kills the job on the
/// service and cancels the turn, instead of waiting for the job to end.
#[test]
fn sigint_of_the_agent_kills_the_remote_job() {
    let env = Env::new();
    unstaged(&env);
    let srv = toolsrv(&env, &socket(&env));
    let marker = env.cwd.join("slow.txt");
    let script = env.script(&[shell_call("echo slow | tee -a slow.txt; sleep 600"), json!({"text": "unused"})]);
    let agent = env
        .cairn(&["--script", script.to_str().unwrap(), "--yes", "--toolsrv", &srv.address, "run", "go"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the job to start", || marker.exists());
    let status = std::process::Command::new("kill").arg("-INT").arg(agent.id().to_string()).status().unwrap();
    assert!(status.success());
    let out = agent.wait_with_output().unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{e}");
    let jobs: Vec<PathBuf> =
        std::fs::read_dir(env.home.join("toolsrv/jobs")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(jobs.len(), 1);
    assert_eq!(std::fs::read_to_string(jobs[0].join("status")).unwrap().trim(), "killed", "{e}");
}

/// `cairn serve --toolsrv`: a session of the 9P control plane runs its tool
/// calls as jobs of the tool service.
#[test]
fn serve_sessions_use_the_tool_service() {
    let env = Env::new();
    unstaged(&env);
    let srv = toolsrv(&env, &socket(&env));
    let mut serve = env
        .cairn(&["--toolsrv", &srv.address, "serve", "--listen", "tcp!127.0.0.1!0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(serve.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let served = Toolsrv { child: serve, address: line.trim().to_owned() };
    let script = env.script(&[shell_call("echo via-serve"), json!({"text": "served done"})]);
    let mut c = Conn::dial(&Dial::parse(&served.address).unwrap()).unwrap();
    let spec = format!("cwd={} provider=scripted script={} yes=true", env.cwd.display(), script.display());
    let id = c.create_session(&spec).unwrap();
    c.write_file(&format!("s/{id}/prompt"), b"go").unwrap();
    wait_for("the answer", || c.read_text(&format!("s/{id}/chat")).unwrap().contains("served done"));
    let jobs: Vec<PathBuf> =
        std::fs::read_dir(env.home.join("toolsrv/jobs")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(jobs.len(), 1, "the call was a job of the service: {jobs:?}");
    assert_eq!(std::fs::read_to_string(jobs[0].join("out")).unwrap().trim(), "via-serve");
}

/// Install an external tool `name` in `dir` that prints `says`.
fn install_tool(dir: &std::path::Path, name: &str, description: &str, says: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.toml")),
        format!(
            "description = {description:?}\nrisk = \"readOnly\"\ncapabilities = []\nreplay = \"idempotent\"\n\
             [parameters]\ntype = \"object\"\n"
        ),
    )
    .unwrap();
    let exe = dir.join(name);
    std::fs::write(&exe, format!("#!/bin/sh\necho {says}\n")).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Write a job request for `tool` on its own fid and read the answer.
fn submit(conn: &mut Conn, tool: &str, invocation: &str, cwd: &std::path::Path) -> anyhow::Result<String> {
    let request = json!({"tool": tool, "arguments": {}, "invocation": invocation, "session": "lazy",
        "cwd": cwd.display().to_string()});
    let (fid, _) = conn.walk("jobs/new")?;
    conn.open(fid, mode::RDWR)?;
    conn.write_at(fid, 0, request.to_string().as_bytes())?;
    let answer = conn.read_at(fid, 0, 64);
    let _ = conn.clunk(fid);
    Ok(String::from_utf8(answer?)?.trim().to_owned())
}

/// Metadata is per tool and lazy: `t/` lists every metadata file by name (a
/// broken one too, nothing is parsed), reading a broken tool's `meta` or
/// asking for a job of it fails naming its file while the other tools keep
/// working, and a changed file is parsed again on its next use.
#[test]
fn tool_metadata_is_parsed_per_tool_and_a_broken_one_is_named_by_path() {
    let env = Env::new();
    let tools = env.home.join("tools");
    install_tool(&tools, "greet", "Say hello to the user.", "hello-from-greet");
    install_tool(&tools, "broken", "placeholder", "never");
    let broken = tools.join("broken.toml");
    std::fs::write(&broken, "description = \"no closing quote\nrisk = \n").unwrap();
    let srv = toolsrv(&env, &socket(&env));
    let mut conn = Conn::dial(&Dial::parse(&srv.address).unwrap()).unwrap();
    let listed: Vec<String> = conn.list("t").unwrap().into_iter().map(|s| s.name).collect();
    for name in ["shell", "greet", "broken"] {
        assert!(listed.iter().any(|t| t == name), "{name} listed by its file name: {listed:?}");
    }
    // The broken tool: its meta read fails naming the file.
    let err = format!("{:#}", conn.read_file("t/broken/meta").unwrap_err());
    assert!(err.contains(&broken.display().to_string()) && err.contains("invalid metadata"), "{err}");
    // Its job is refused, naming the file; nothing was started.
    let err = format!("{:#}", submit(&mut conn, "broken", "b1", &env.cwd).unwrap_err());
    assert!(err.contains(&broken.display().to_string()), "{err}");
    // The others work, on the same connection.
    let meta: Value = serde_json::from_slice(&conn.read_file("t/greet/meta").unwrap()).unwrap();
    assert_eq!(meta["description"], "Say hello to the user.");
    let id = submit(&mut conn, "greet", "g1", &env.cwd).unwrap();
    assert_eq!(conn.read_text(&format!("jobs/{id}/out")).unwrap().trim(), "hello-from-greet");
    assert_eq!(conn.read_text(&format!("jobs/{id}/status")).unwrap().trim(), "done");
    // A changed file is parsed again (the old spec is not kept).
    install_tool(&tools, "greet", "Say hello to the user, twice over.", "hello-again");
    let meta: Value = serde_json::from_slice(&conn.read_file("t/greet/meta").unwrap()).unwrap();
    assert_eq!(meta["description"], "Say hello to the user, twice over.");
    // The repaired tool loads and runs; the service never went down.
    install_tool(&tools, "broken", "Now repaired.", "repaired-ran");
    let meta: Value = serde_json::from_slice(&conn.read_file("t/broken/meta").unwrap()).unwrap();
    assert_eq!(meta["description"], "Now repaired.");
    let id = submit(&mut conn, "broken", "b2", &env.cwd).unwrap();
    assert_eq!(conn.read_text(&format!("jobs/{id}/out")).unwrap().trim(), "repaired-ran");
    // A tool installed while the service runs is listed without a restart.
    install_tool(&tools, "later", "Installed later.", "later-ran");
    let listed: Vec<String> = conn.list("t").unwrap().into_iter().map(|s| s.name).collect();
    assert!(listed.iter().any(|t| t == "later"), "{listed:?}");
}

/// The agent side: a broken tool of the service is left out with a note
/// naming its file; the run uses the others.
#[test]
fn a_run_through_the_service_skips_a_broken_tool_and_uses_the_rest() {
    let env = Env::new();
    let tools = env.home.join("tools");
    install_tool(&tools, "greet", "Say hello to the user.", "hello-from-greet");
    std::fs::write(tools.join("broken.toml"), "this is not toml = = =\n").unwrap();
    let srv = toolsrv(&env, &socket(&env));
    let script = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "greet", "arguments": {}}]}),
        json!({"text": "greeted"}),
    ]);
    let out = env
        .cairn(&["--script", script.to_str().unwrap(), "--yes", "--toolsrv", &srv.address, "run", "say hi"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (o, e) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{o}\n{e}");
    assert!(o.contains("greeted"), "{o}\n{e}");
    assert!(e.contains("broken") && e.contains("broken.toml"), "the broken tool is named: {e}");
    let text = serde_json::to_string(&entry_records(&env)).unwrap();
    assert!(text.contains("hello-from-greet"), "{text}");
}

#[test]
fn toolsrv_makes_a_fresh_home_private_and_serves_in_it() {
    let env = Env::new();
    let fresh = env.home.join("fresh-home");
    let mut child = env
        .cairn(&["toolsrv"])
        .env("CAIRN_HOME", &fresh)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let printed = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let mut err = String::new();
    if printed == 0 {
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    }
    let _served = Toolsrv { child, address: line.trim().to_owned() };
    assert!(printed > 0, "cairn toolsrv refused its own fresh home: {err}");
    let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "the fresh home is mode {mode:o}");
}

/// Issue 50.3: with a tool service, `cairn tools` and the 9P `tools` file
/// of `cairn serve` list what a turn gets (the service's tools, read as a
/// turn reads them: `tools::turn_tools`), not this process's own tools.
#[test]
fn listings_with_a_tool_service_show_the_tools_a_turn_gets() {
    // The service's home has a tool this process does not, and the other
    // way round.
    let service = Env::new();
    install_tool(&service.home.join("tools"), "only_in_the_service", "a test tool", "ran");
    let srv = toolsrv(&service, &socket(&service));
    let env = Env::new();
    install_tool(&env.home.join("tools"), "only_here", "a test tool", "ran");

    let out = env.cairn(&["--json", "--toolsrv", &srv.address, "tools"]).output().unwrap();
    let text = util::stdout_ok(&out);
    let listed: Vec<Value> =
        text.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).filter(|v| v["name"].is_string()).collect();
    let names: Vec<&str> = listed.iter().filter_map(|v| v["name"].as_str()).collect();
    assert!(names.contains(&"only_in_the_service") && names.contains(&"shell"), "{text}");
    assert!(!names.contains(&"only_here"), "a turn with --toolsrv is not offered this process's tools: {text}");
    let source = listed.iter().find(|v| v["name"] == "only_in_the_service").unwrap()["source"].clone();
    assert_eq!(source, format!("tool service {}", srv.address), "{text}");

    // The 9P tree's `tools` file of a server using the service.
    let mut serve = env
        .cairn(&["--toolsrv", &srv.address, "serve", "--listen", "tcp!127.0.0.1!0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut address = String::new();
    BufReader::new(serve.stdout.take().unwrap()).read_line(&mut address).unwrap();
    let read = Conn::dial(&Dial::parse(address.trim()).unwrap()).and_then(|mut conn| conn.read_text("tools"));
    let _ = serve.kill();
    let _ = serve.wait();
    let file = read.unwrap();
    let names: Vec<&str> = file.lines().filter_map(|l| l.split(' ').next()).collect();
    assert!(names.contains(&"only_in_the_service") && names.contains(&"shell"), "{file}");
    assert!(!names.contains(&"only_here"), "{file}");
}
