//! MCP servers as tools, with real servers from the registries, installed
//! by the project's own set-up: PyPI `mcp-server-time` and `mcp-server-git`
//! (`scripts/venv mcpservers`), npm `@modelcontextprotocol/server-everything`
//! and `server-filesystem` (`scripts/node-env mcpservers`). Each test runs
//! the `cairn` binary with a scripted provider and reads the session file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "mcp/reads.rs"]
mod reads;
use crate::util;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use util::Env;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Run one of the project's set-up scripts and return what it printed.
fn setup(script: &str, name: &str) -> PathBuf {
    let out = Command::new(repo().join("scripts").join(script)).arg(name).output().unwrap();
    assert!(
        out.status.success(),
        "scripts/{script} {name} failed (these tests need the registry packages it installs): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// The venv's `bin/` with mcp-server-time and mcp-server-git.
fn python_bin() -> PathBuf {
    setup("venv", "mcpservers").parent().unwrap().to_path_buf()
}

/// The npm prefix holding server-everything and server-filesystem.
fn node_prefix() -> PathBuf {
    setup("node-env", "mcpservers")
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Every entry's payload of `kind` (`toolStarted`, `toolCompleted`, …).
fn payloads(env: &Env, kind: &str) -> Vec<Value> {
    let files = env.session_files();
    assert_eq!(files.len(), 1, "one session: {files:?}");
    util::entries(&files[0]).into_iter().filter(|e| e["type"] == kind).map(|e| e["payload"].clone()).collect()
}

fn by_tool<'a>(payloads: &'a [Value], tool: &str) -> &'a Value {
    payloads
        .iter()
        .find(|p| p["tool"] == tool || p["request"]["tool"] == tool)
        .unwrap_or_else(|| panic!("no {tool} in {payloads:#?}"))
}

fn config(env: &Env, text: &str) {
    // Every server's tools are offered (discovery's ranking is tested elsewhere).
    std::fs::write(env.home.join("config.toml"), format!("[discovery]\nmax_tools = 64\n\n{text}")).unwrap();
}

#[test]
fn a_scripted_turn_calls_real_servers_and_records_their_receipts() {
    let env = Env::new();
    let (py, node) = (python_bin(), node_prefix());
    std::fs::write(env.cwd.join("notes.txt"), "the launch code is 7-4-1\n").unwrap();
    config(
        &env,
        &format!(
            r#"
[mcp_servers.time]
command = "{time}"
args = ["--local-timezone", "UTC"]
trust_annotations = true
processes = false

[mcp_servers.every]
command = "{node}/node_modules/.bin/mcp-server-everything"
read = ["{node}"]

[mcp_servers.fs]
command = "{node}/node_modules/.bin/mcp-server-filesystem"
args = ["{cwd}"]
read = ["{node}"]
"#,
            time = py.join("mcp-server-time").display(),
            node = node.display(),
            cwd = env.cwd.canonicalize().unwrap().display(),
        ),
    );
    let notes = env.cwd.canonicalize().unwrap().join("notes.txt");
    let script = env.script(&[
        json!({"text": "", "toolCalls": [
            {"id": "c1", "name": "mcp__time__get_current_time", "arguments": {"timezone": "UTC"}},
            {"id": "c2", "name": "mcp__every__echo", "arguments": {"message": "hello from cairn"}},
            {"id": "c3", "name": "mcp__fs__read_text_file", "arguments": {"path": notes}},
            {"id": "c4", "name": "mcp__every__get-sum", "arguments": {"a": 2, "b": 40}},
        ]}),
        json!({"text": "done"}),
    ]);
    let out = env
        .cairn(&[
            "--script",
            script.to_str().unwrap(),
            "--allow",
            "mcp__every__*",
            "--allow",
            "mcp__fs__*",
            "run",
            "go",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let done = payloads(&env, "toolCompleted");
    let receipt = |tool: &str| by_tool(&done, tool)["receipt"].clone();
    let time = receipt("mcp__time__get_current_time");
    assert_eq!(time["exitCode"], 0, "{time:#}");
    assert!(time["outputSummary"].as_str().unwrap().contains("UTC"), "{time:#}");
    assert_eq!(time["tier"], "readOnly", "a trusted, contained server's readOnlyHint is believed");
    let echo = receipt("mcp__every__echo");
    assert!(echo["outputSummary"].as_str().unwrap().contains("hello from cairn"), "{echo:#}");
    assert_eq!(echo["tier"], "write", "an untrusted readOnlyHint does not lower the tier");
    assert_eq!(echo["structuredOutput"]["isError"], false);
    assert!(echo["structuredOutput"]["content"][0]["text"].as_str().unwrap().contains("hello from cairn"));
    let read = receipt("mcp__fs__read_text_file");
    assert!(read["outputSummary"].as_str().unwrap().contains("7-4-1"), "{read:#}");
    assert!(receipt("mcp__every__get-sum")["outputSummary"].as_str().unwrap().contains("42"));
    // Who approved each call is recorded before it ran.
    let started = payloads(&env, "toolStarted");
    assert_eq!(by_tool(&started, "mcp__every__echo")["verdict"]["by"], "allowlist:mcp__every__*");
    assert_eq!(by_tool(&started, "mcp__time__get_current_time")["verdict"]["decision"], "approve");
    let listed = env.cairn(&["mcp", "list"]).output().unwrap();
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    for line in ["mcp__time__get_current_time", "ReadOnly", "mcp__every__echo", "mcp__fs__read_text_file"] {
        assert!(stdout(&listed).contains(line), "cairn mcp list shows {line}: {}", stdout(&listed));
    }
}

/// A git repository in `dir` with `staged.txt` added to the index.
fn repo_with_a_staged_file(dir: &Path) {
    let git = |args: &[&str]| {
        let ok = Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
            .status()
            .unwrap();
        assert!(ok.success(), "git {args:?}");
    };
    git(&["init", "-q", "."]);
    std::fs::write(dir.join("first.txt"), "1\n").unwrap();
    git(&["add", "first.txt"]);
    git(&["commit", "-qm", "first"]);
    std::fs::write(dir.join("staged.txt"), "2\n").unwrap();
    git(&["add", "staged.txt"]);
}

fn staged_names(dir: &Path) -> String {
    let out = Command::new("git").args(["diff", "--cached", "--name-only"]).current_dir(dir).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_write_tier_call_asks_and_a_destructive_hint_is_refused_headless() {
    let env = Env::new();
    let cwd = env.cwd.canonicalize().unwrap();
    repo_with_a_staged_file(&cwd);
    config(
        &env,
        &format!(
            "[mcp_servers.git]\ncommand = \"{}\"\nfiles = \"write\"\n",
            python_bin().join("mcp-server-git").display()
        ),
    );
    let status = json!({"text": "", "toolCalls": [{"id": "c1", "name": "mcp__git__git_status", "arguments": {"repo_path": cwd}}]});
    let script = env.script(&[status, json!({"text": "done"})]);
    let s = script.to_str().unwrap();
    // Headless without a rule: the Write-tier call is denied, and that is recorded.
    let denied = env.cairn(&["--script", s, "run", "status?"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(denied.status.code(), Some(4), "denied → exit 4: {}", stderr(&denied));
    let log = std::fs::read_to_string(&env.session_files()[0]).unwrap();
    assert!(log.contains("mcp__git__git_status") && log.contains("\"deny\""), "the denial is in the log");
    assert!(payloads(&env, "toolStarted").is_empty(), "nothing ran");
    std::fs::remove_file(&env.session_files()[0]).unwrap();

    // With a rule for the server's tools it runs, sandboxed to the repository.
    let allowed = env.cairn(&["--script", s, "--allow", "mcp__git__*", "run", "status?"]).output().unwrap();
    assert_eq!(allowed.status.code(), Some(0), "{}", stderr(&allowed));
    let done = payloads(&env, "toolCompleted");
    let receipt = &by_tool(&done, "mcp__git__git_status")["receipt"];
    assert!(receipt["outputSummary"].as_str().unwrap().contains("staged.txt"), "{receipt:#}");
    std::fs::remove_file(&env.session_files()[0]).unwrap();

    // git_reset says destructiveHint: never offered headless, whatever the flags.
    let reset = json!({"text": "", "toolCalls": [{"id": "c1", "name": "mcp__git__git_reset", "arguments": {"repo_path": cwd}}]});
    let script = env.script(&[reset, json!({"text": "done"})]);
    let out = env
        .cairn(&["--script", script.to_str().unwrap(), "--yes", "--allow", "mcp__git__*", "run", "unstage"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(stderr(&out).contains("mcp__git__git_reset") && stderr(&out).contains("Destructive"), "{}", stderr(&out));
    assert!(payloads(&env, "toolStarted").is_empty(), "the reset never started");
    assert_eq!(staged_names(&cwd).trim(), "staged.txt", "the index is untouched");
}

/// Pids of processes whose environment holds `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if pid.chars().all(|c| c.is_ascii_digit())
            && let Ok(environ) = std::fs::read(entry.path().join("environ"))
            && String::from_utf8_lossy(&environ).contains(marker)
        {
            found.push(pid);
        }
    }
    found
}

#[test]
fn sigkill_during_a_long_mcp_call_leaves_it_uncertain_and_never_runs_it_again() {
    let env = Env::new();
    let node = node_prefix();
    let marker = format!("cairn-mcp-test-{}", std::process::id());
    config(
        &env,
        &format!(
            "[mcp_servers.every]\ncommand = \"{node}/node_modules/.bin/mcp-server-everything\"\nread = [\"{node}\"]\n\
             env = [\"CAIRN_TEST_MARKER\"]\n",
            node = node.display()
        ),
    );
    let call = json!({"text": "", "toolCalls": [{"id": "c1", "name": "mcp__every__trigger-long-running-operation",
        "arguments": {"duration": 60, "steps": 60}}]});
    let script = env.script(&[call, json!({"text": "after the interruption"})]);
    let s = script.to_str().unwrap();
    let mut child = env
        .cairn(&["--script", s, "--allow", "mcp__every__*", "run", "go"])
        .env("CAIRN_TEST_MARKER", &marker)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the call to be under way: started in the log, and the
    // server reporting progress on cairn's stderr.
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 256];
        while let Ok(n) = std::io::Read::read(&mut err, &mut buf) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
            if String::from_utf8_lossy(&seen).contains("progress 2/60") {
                return true;
            }
        }
        false
    });
    assert!(reader.join().unwrap(), "the long call never reported progress");
    assert_eq!(payloads(&env, "toolStarted").len(), 1);
    assert!(!processes_with(&marker).is_empty(), "the server got the variable its config names");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // The server dies with cairn (PR_SET_PDEATHSIG on the thread that spawned it).
    let deadline = Instant::now() + Duration::from_secs(30);
    while !processes_with(&marker).is_empty() {
        assert!(Instant::now() < deadline, "the MCP server outlived cairn: {:?}", processes_with(&marker));
        std::thread::sleep(Duration::from_millis(50));
    }

    let out = env.cairn(&["--script", s, "resume", "--last"]).stdin(Stdio::null()).output().unwrap();
    assert!(stdout(&out).contains("after the interruption"), "{}\n{}", stdout(&out), stderr(&out));
    assert_eq!(payloads(&env, "toolStarted").len(), 1, "the call was not run again");
    let failed = payloads(&env, "toolFailed");
    assert_eq!(failed.len(), 1, "settled once, as failed: {failed:#?}");
    let text = failed[0].to_string();
    assert!(text.contains("uncertain") || text.contains("interrupted"), "settled uncertain: {text}");
    let check = env.cairn(&["--json", "check", "--", env.session_files()[0].to_str().unwrap()]).output().unwrap();
    assert!(stdout(&check).contains("\"ok\":true"), "{}", stdout(&check));
}

#[test]
fn a_server_that_cannot_start_is_reported_and_the_others_still_load() {
    let env = Env::new();
    config(
        &env,
        &format!(
            "[mcp_servers.broken]\ncommand = \"/nonexistent/mcp-server\"\n\n[mcp_servers.time]\ncommand = \"{}\"\n",
            python_bin().join("mcp-server-time").display()
        ),
    );
    let out = env.cairn(&["mcp", "list"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "a failed server fails the listing");
    let text = stdout(&out);
    assert!(text.contains("broken") && text.contains("failed"), "{text}");
    assert!(text.contains("mcp__time__get_current_time"), "{text}");
    // A bad description is refused with the reason, before anything starts.
    std::fs::write(env.home.join("config.toml"), "[mcp_servers.x]\ncommand = \"a\"\nenv = [\"TOKEN=abc\"]\n").unwrap();
    let out = env.cairn(&["mcp", "list"]).output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("never in this file"), "{}", stderr(&out));
}

#[test]
fn a_stdio_server_runs_in_the_sandbox_its_config_declares() {
    let env = Env::new();
    let cwd = env.cwd.canonicalize().unwrap();
    repo_with_a_staged_file(&cwd);
    std::fs::write(cwd.join("new.txt"), "3\n").unwrap();
    let git = python_bin().join("mcp-server-git");
    let add = json!({"text": "", "toolCalls": [{"id": "c1", "name": "mcp__git__git_add",
        "arguments": {"repo_path": cwd, "files": ["new.txt"]}}]});
    let script = env.script(&[add, json!({"text": "done"})]);
    let s = script.to_str().unwrap();
    // `files = "read"`: the server sees the repository but cannot change it.
    config(&env, &format!("[mcp_servers.git]\ncommand = \"{}\"\nfiles = \"read\"\n", git.display()));
    let out = env.cairn(&["--script", s, "--allow", "mcp__git__*", "run", "add it"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let done = payloads(&env, "toolCompleted");
    let receipt = &by_tool(&done, "mcp__git__git_add")["receipt"];
    assert_eq!(receipt["structuredOutput"]["isError"], true, "{receipt:#}");
    assert_eq!(staged_names(&cwd).trim(), "staged.txt", "the index is untouched");
    std::fs::remove_file(&env.session_files()[0]).unwrap();
    // `files = "write"`: the same call changes the index.
    config(&env, &format!("[mcp_servers.git]\ncommand = \"{}\"\nfiles = \"write\"\n", git.display()));
    let out = env.cairn(&["--script", s, "--allow", "mcp__git__*", "run", "add it"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(staged_names(&cwd).contains("new.txt"), "{}", staged_names(&cwd));
}

/// A child process killed when the test ends, pass or fail.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_streamable_http_server_on_loopback_is_called_like_a_stdio_one() {
    let env = Env::new();
    let node = node_prefix();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut server = Command::new(node.join("node_modules/.bin/mcp-server-everything"))
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = server.stderr.take().unwrap();
    let _server = Killed(server);
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(err));
    assert!(
        lines.by_ref().map_while(Result::ok).any(|l| l.contains("listening")),
        "server-everything did not start listening on port {port}"
    );
    std::thread::spawn(move || lines.for_each(drop));
    config(&env, &format!("[mcp_servers.web]\nurl = \"http://127.0.0.1:{port}/mcp\"\ntrust_annotations = true\n"));
    let call = json!({"text": "", "toolCalls": [{"id": "c1", "name": "mcp__web__echo", "arguments": {"message": "over http"}}]});
    let script = env.script(&[call, json!({"text": "done"})]);
    let out =
        env.cairn(&["--script", script.to_str().unwrap(), "--allow", "mcp__web__*", "run", "go"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let done = payloads(&env, "toolCompleted");
    let receipt = &by_tool(&done, "mcp__web__echo")["receipt"];
    assert!(receipt["outputSummary"].as_str().unwrap().contains("over http"), "{receipt:#}");
    // A remote server reaches the network by definition: never ReadOnly,
    // even trusted and annotated read-only.
    assert_eq!(receipt["tier"], "write");
}

/// Headers for a streamable-HTTP server: `http_headers` with their values,
/// `env_http_headers` from cairn's environment. The server (the official
/// Python SDK behind a check) refuses requests without both; an unset
/// variable keeps the server from starting, named.
#[test]
fn a_streamable_http_server_gets_the_configured_headers() {
    let env = Env::new();
    let py = python_bin();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut server = Command::new(py.join("python"))
        .arg(repo().join("crates/cairn-cli/tests/mcp/headers_server.py"))
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = server.stderr.take().unwrap();
    let _server = Killed(server);
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(err));
    assert!(lines.by_ref().map_while(Result::ok).any(|l| l.contains("listening")), "the header server did not start");
    let refused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&refused);
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if line.contains("refused a request") {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    config(
        &env,
        &format!(
            "[mcp_servers.web]\nurl = \"http://127.0.0.1:{port}/mcp\"\nhttp_headers = {{ X-Tenant = \"acme\" }}\nenv_http_headers = {{ Authorization = \"WEB_MCP_AUTH\" }}\n"
        ),
    );
    let call =
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "mcp__web__hello", "arguments": {"name": "cairn"}}]});
    let script = env.script(&[call, json!({"text": "done"})]);
    let s = script.to_str().unwrap();

    // One run of the turn with the variable set to `token` (unset: None).
    let run = |token: Option<&str>| {
        let mut cmd = env.cairn(&["--script", s, "--allow", "mcp__web__*", "run", "go"]);
        match token {
            Some(t) => cmd.env("WEB_MCP_AUTH", t),
            None => cmd.env_remove("WEB_MCP_AUTH"),
        };
        cmd.output().unwrap()
    };

    // The variable unset: the server is not started, and the note names it.
    let out = run(None);
    assert!(stderr(&out).contains("WEB_MCP_AUTH"), "{}", stderr(&out));
    assert_eq!(refused.load(std::sync::atomic::Ordering::SeqCst), 0, "nothing was sent without the token");
    std::fs::remove_file(&env.session_files()[0]).unwrap();

    // A wrong token: the server refuses, and so the call cannot happen.
    let out = run(Some("Bearer wrong"));
    assert!(refused.load(std::sync::atomic::Ordering::SeqCst) > 0, "{}", stderr(&out));
    assert!(payloads(&env, "toolCompleted").is_empty(), "{}", stderr(&out));
    std::fs::remove_file(&env.session_files()[0]).unwrap();

    let out = run(Some("Bearer s3cret"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let done = payloads(&env, "toolCompleted");
    let receipt = &by_tool(&done, "mcp__web__hello")["receipt"];
    assert!(receipt["outputSummary"].as_str().unwrap().contains("you were let in"), "{receipt:#}");
}

/// Discovery ranks MCP tools like any other: with 27 of them configured, a
/// turn is offered the few that fit the request, not all of them.
#[test]
fn discovery_offers_the_mcp_tools_that_fit_the_request_not_all_of_them() {
    let minilm = std::env::var_os("CAIRN_MINILM_DIR")
        .expect("this test needs the discovery model: set CAIRN_MINILM_DIR (scripts/fetch-minilm prints it)");
    let env = Env::new();
    let (py, node) = (python_bin(), node_prefix());
    std::fs::write(
        env.home.join("config.toml"),
        format!(
            "[mcp_servers.time]\ncommand = \"{}\"\n\n[mcp_servers.git]\ncommand = \"{}\"\n\n\
             [mcp_servers.every]\ncommand = \"{node}/node_modules/.bin/mcp-server-everything\"\nread = [\"{node}\"]\n",
            py.join("mcp-server-time").display(),
            py.join("mcp-server-git").display(),
            node = node.display()
        ),
    )
    .unwrap();
    let out = env
        .cairn(&["--json", "tools", "--discover", "echo a message back to me"])
        .env("CAIRN_MINILM_DIR", minilm)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let ranking: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let candidates = ranking["candidates"].as_array().unwrap();
    let mcp = candidates.iter().filter(|c| c["name"].as_str().unwrap().starts_with("mcp__")).count();
    assert!(mcp >= 25, "every server's tools are ranked: {mcp}");
    let offered: Vec<&str> =
        candidates.iter().filter(|c| c["injected"] == true).map(|c| c["name"].as_str().unwrap()).collect();
    assert!(offered.contains(&"mcp__every__echo"), "{offered:?}");
    assert!(offered.len() <= 5, "at most max_tools are offered: {offered:?}");
}
