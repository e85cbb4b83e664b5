//! MCP servers as tools, with real servers from the registries, installed
//! by the project's own set-up: PyPI `mcp-server-time` and `mcp-server-git`
//! (`scripts/venv mcpservers`), npm `@modelcontextprotocol/server-everything`
//! and `server-filesystem` (`scripts/node-env mcpservers`). Each test runs
//! the `cairn` binary with a scripted provider and reads the session file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "mcp/oauth.rs"]
mod oauth;
#[path = "mcp/reads.rs"]
mod reads;
#[path = "mcp/resources.rs"]
mod resources;
use crate::util;
use util::stderr_text as stderr;
use util::stdout_text as stdout;

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

/// Within the budget a user sets (`[discovery] mcp_tools`), discovery
/// ranks MCP tools: with 27 of them configured and a budget of 5, a turn is
/// offered the few that fit the request, not all of them.
#[test]
fn discovery_offers_the_mcp_tools_that_fit_the_request_within_the_budget() {
    let minilm = std::env::var_os("CAIRN_MINILM_DIR")
        .expect("this test needs the discovery model: set CAIRN_MINILM_DIR (scripts/fetch-minilm prints it)");
    let env = Env::new();
    let (py, node) = (python_bin(), node_prefix());
    std::fs::write(
        env.home.join("config.toml"),
        format!(
            "[discovery]\nmcp_tools = 5\n\n[mcp_servers.time]\ncommand = \"{}\"\n\n[mcp_servers.git]\ncommand = \"{}\"\n\n\
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
    assert!(offered.len() <= 5, "at most mcp_tools are offered: {offered:?}");
}

/// A stdio server on the official Python SDK whose tool answers
/// `size` bytes (its answer line is about twice that: the SDK sends the
/// text as `content` and as `structuredContent`), configured with `extra`,
/// called once in a `cairn run`; the call's completion or failure.
fn call_big(env: &Env, size: usize, extra: &str) -> (std::process::Output, Value) {
    let cwd = env.cwd.canonicalize().unwrap();
    std::fs::copy(repo().join("crates/cairn-cli/tests/mcp/big_server.py"), cwd.join("big_server.py")).unwrap();
    // The tool timeout is long: an answer that is dropped (the SDK's
    // limit) would hold the call this long and fail it as a timeout.
    config(
        env,
        &format!(
            "[mcp_servers.big]\ncommand = \"{}\"\nargs = [\"{}\"]\ntool_timeout_ms = 120000\n{extra}",
            python_bin().join("python").display(),
            cwd.join("big_server.py").display()
        ),
    );
    let call = json!({"text": "", "toolCalls": [{"id": "c1", "name": "mcp__big__big", "arguments": {"size": size}}]});
    let script = env.script(&[call, json!({"text": "done"})]);
    let out = env
        .cairn(&["--script", script.to_str().unwrap(), "--allow", "mcp__big__*", "run", "go"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let files = env.session_files();
    assert_eq!(files.len(), 1, "one session: {}", stderr(&out));
    let log = std::fs::read_to_string(&files[0]).unwrap();
    let settled = util::entries(&files[0])
        .into_iter()
        .find(|e| e["type"] == "toolCompleted" || e["type"] == "toolFailed")
        .unwrap_or_else(|| panic!("the call was never settled: {}\n{log}", stderr(&out)));
    (out, settled)
}

/// 53.5: an answer of about 20 MB (over the SDK's 16 MiB line limit, which
/// drops the line and leaves the call waiting for the tool timeout) is
/// read, and the model sees it capped.
#[test]
fn a_20_mb_answer_is_read_and_capped_for_the_model() {
    let env = Env::new();
    let (out, settled) = call_big(&env, 10_000_000, "");
    assert_eq!(settled["type"], "toolCompleted", "{settled:#}\n{}", stderr(&out));
    let summary = settled["payload"]["receipt"]["outputSummary"].as_str().unwrap();
    assert!(
        summary.starts_with("xxxx") && summary.contains("output truncated"),
        "{}",
        &summary[summary.len().saturating_sub(200)..]
    );
    assert!(summary.len() < 1 << 20, "the model sees a capped text: {} bytes", summary.len());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// 53.5: an answer over the server's `max_answer_bytes` fails its call at
/// once, saying its size (not after the tool timeout).
#[test]
fn an_answer_over_the_limit_fails_the_call_at_once_with_its_size() {
    let env = Env::new();
    let (out, settled) = call_big(&env, 10_000_000, "max_answer_bytes = 1048576\n");
    assert_eq!(settled["type"], "toolFailed", "{settled:#}\n{}", stderr(&out));
    let error = settled["payload"].to_string();
    assert!(error.contains("answered too much") && error.contains("limit of 1048576 bytes"), "{error}");
    assert!(!error.contains("timed out"), "{error}");
    // The answer's size is said: about 20 MB (the text twice, as JSON).
    let bytes: u64 = error
        .split("answer was ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no size in {error}"));
    assert!((20_000_000..21_000_000).contains(&bytes), "{bytes}");
}

/// 53.6: the README's MCP example, as written (its `[mcp_servers]` block,
/// the servers on PATH), on a default install (no discovery model: BM25):
/// "what changed since yesterday?" is offered the git server's tools, and
/// the call the model makes runs.
#[test]
fn the_readme_mcp_example_offers_the_git_tools_on_a_default_install() {
    let env = Env::new();
    let cwd = env.cwd.canonicalize().unwrap();
    repo_with_a_staged_file(&cwd);
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let block = readme
        .split("```toml\n")
        .find(|b| b.starts_with("[mcp_servers.git]"))
        .and_then(|b| b.split("```").next())
        .expect("the README's [mcp_servers.git] example");
    // Nothing else: discovery's defaults, as a new user has them.
    std::fs::write(env.home.join("config.toml"), block).unwrap();
    let path = format!("{}:{}", python_bin().display(), std::env::var("PATH").unwrap_or_default());
    let log = json!({"text": "", "toolCalls": [{"id": "c1", "name": "mcp__git__git_log",
        "arguments": {"repo_path": cwd, "max_count": 5}}]});
    let script = env.script(&[log, json!({"text": "one commit: first"})]);
    let out = env
        .cairn(&[
            "--script",
            script.to_str().unwrap(),
            "run",
            "--allow",
            "mcp__git__*",
            "what changed since yesterday?",
        ])
        .env("PATH", &path)
        .env("CAIRN_MINILM_DIR", env.home.join("no-model-here"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let done = payloads(&env, "toolCompleted");
    let receipt = &by_tool(&done, "mcp__git__git_log")["receipt"];
    assert!(receipt["outputSummary"].as_str().unwrap().contains("first"), "{receipt:#}");
    // `cairn tools --discover` says the same: every MCP tool is offered.
    let ranked = env
        .cairn(&["--json", "tools", "--discover", "what changed since yesterday?"])
        .env("PATH", &path)
        .env("CAIRN_MINILM_DIR", env.home.join("no-model-here"))
        .output()
        .unwrap();
    assert_eq!(ranked.status.code(), Some(0), "{}", stderr(&ranked));
    let ranking: Value = serde_json::from_str(&stdout(&ranked)).unwrap();
    let candidates = ranking["candidates"].as_array().unwrap();
    let git: Vec<&Value> =
        candidates.iter().filter(|c| c["name"].as_str().unwrap().starts_with("mcp__git__")).collect();
    assert!(git.len() >= 10, "{ranking}");
    assert!(git.iter().all(|c| c["injected"] == true), "{ranking}");
}

/// 53.9: a relative `--cwd` is resolved against the current directory for
/// `cairn mcp list` and `cairn tools` (the server starts, sandboxed to that
/// directory); one that does not exist is named.
#[test]
fn a_relative_cwd_works_for_mcp_list_and_tools() {
    let env = Env::new();
    let cwd = env.cwd.canonicalize().unwrap();
    repo_with_a_staged_file(&cwd);
    config(&env, &format!("[mcp_servers.git]\ncommand = \"{}\"\n", python_bin().join("mcp-server-git").display()));
    let parent = cwd.parent().unwrap();
    let relative = cwd.file_name().unwrap().to_str().unwrap();
    let listed = env.cairn(&["--cwd", relative, "mcp", "list"]).current_dir(parent).output().unwrap();
    assert_eq!(listed.status.code(), Some(0), "{}\n{}", stdout(&listed), stderr(&listed));
    assert!(stdout(&listed).contains("mcp__git__git_status"), "{}", stdout(&listed));
    let tools = env.cairn(&["--cwd", relative, "tools"]).current_dir(parent).output().unwrap();
    assert_eq!(tools.status.code(), Some(0), "{}", stderr(&tools));
    assert!(stdout(&tools).contains("mcp__git__git_status"), "{}\n{}", stdout(&tools), stderr(&tools));
    assert!(!stderr(&tools).contains("did not start"), "{}", stderr(&tools));
    let missing = env.cairn(&["--cwd", "no-such-dir", "mcp", "list"]).current_dir(parent).output().unwrap();
    assert_ne!(missing.status.code(), Some(0));
    assert!(stderr(&missing).contains("--cwd no-such-dir: no such directory"), "{}", stderr(&missing));
}

/// 53.7: a server whose tools an earlier run listed is not started by a
/// run that calls none of them (its tools are still offered, from the
/// listing kept in cairn's data directory); a call starts it, and a tool no
/// longer as listed is not called (the listing is renewed for the next).
#[test]
fn a_listed_server_starts_only_when_a_run_calls_it() {
    let env = Env::new();
    let cwd = env.cwd.canonicalize().unwrap();
    repo_with_a_staged_file(&cwd);
    let py = python_bin();
    // mcp-server-git, behind a script of the venv's python that counts
    // its starts.
    let wrapper = cwd.join("git_server.py");
    std::fs::write(
        &wrapper,
        format!(
            "import sys\nwith open({:?}, 'a') as f:\n    f.write('started\\n')\nfrom mcp_server_git import main\n\
             sys.argv[0] = 'mcp-server-git'\nsys.exit(main())\n",
            cwd.join("starts.log").display().to_string()
        ),
    )
    .unwrap();
    config(
        &env,
        &format!(
            "[mcp_servers.git]\ncommand = \"{}\"\nargs = [\"{}\"]\nfiles = \"write\"\n",
            py.join("python").display(),
            wrapper.display()
        ),
    );
    let starts = || std::fs::read_to_string(cwd.join("starts.log")).unwrap_or_default().lines().count();
    let run = |calls: bool| {
        let first = if calls {
            json!({"text": "", "toolCalls": [{"id": "c1", "name": "mcp__git__git_status", "arguments": {"repo_path": cwd}}]})
        } else {
            json!({"text": "nothing to call"})
        };
        let script = env.script(&[first, json!({"text": "done"})]);
        let out = env
            .cairn(&["--script", script.to_str().unwrap(), "--allow", "mcp__git__*", "run", "status?"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let files = env.session_files();
        let log = files.iter().map(|f| std::fs::read_to_string(f).unwrap()).collect::<String>();
        for f in files {
            std::fs::remove_file(f).unwrap();
        }
        (out, log)
    };
    // The first run lists the tools (the server starts once).
    let (out, _) = run(false);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("did not start"), "{}", stderr(&out));
    assert_eq!(starts(), 1);
    // The next run calls nothing: nothing starts, and the tools are offered.
    let (out, _) = run(false);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(starts(), 1, "a run that calls no MCP tool started the server");
    let tools = env.cairn(&["tools"]).output().unwrap();
    assert!(stdout(&tools).contains("mcp__git__git_status"), "{}", stdout(&tools));
    assert_eq!(starts(), 1, "listing the tools started the server");
    // A call starts it.
    let (out, log) = run(true);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(log.contains("staged.txt") && log.contains("toolCompleted"), "{log}");
    assert_eq!(starts(), 2);
    // A listing that no longer matches what the server says (as after an
    // upgrade): the call is refused, not made, and the next run's is made.
    let cached: Vec<_> = std::fs::read_dir(env.home.join("cache/mcp")).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(cached.len(), 1, "{cached:?}");
    let text = std::fs::read_to_string(&cached[0]).unwrap();
    let mut listing: Value = serde_json::from_str(&text).unwrap();
    let status = listing["tools"].as_array_mut().unwrap().iter_mut().find(|t| t["name"] == "git_status").unwrap();
    status["description"] = json!("an older description");
    std::fs::write(&cached[0], listing.to_string()).unwrap();
    let (_, log) = run(true);
    assert!(log.contains("not as cairn listed it before"), "{log}");
    assert!(!log.contains("staged.txt"), "the call was made: {log}");
    let (out, log) = run(true);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(log.contains("staged.txt"), "{log}");
}

/// A `[mcp_servers.ask]` table running `tests/mcp/elicit_server.py` (the
/// official Python SDK; its tool asks the user's name).
fn elicit_server_config(cwd: &Path) -> String {
    std::fs::copy(repo().join("crates/cairn-cli/tests/mcp/elicit_server.py"), cwd.join("elicit_server.py")).unwrap();
    format!(
        "[mcp_servers.ask]\ncommand = \"{}\"\nargs = [\"{}\"]\n",
        python_bin().join("python").display(),
        cwd.join("elicit_server.py").display()
    )
}

/// 53.8: a server that asks the user for input (`elicitation/create`)
/// while cairn runs headless gets a clear decline at once (not a hang,
/// not a made-up answer), and the model is told why beside the result.
#[test]
fn a_servers_question_is_declined_headless_and_the_model_is_told_why() {
    let env = Env::new();
    let cwd = env.cwd.canonicalize().unwrap();
    config(&env, &elicit_server_config(&cwd));
    let call = json!({"text": "", "toolCalls": [{"id": "c1", "name": "mcp__ask__greet", "arguments": {}}]});
    let script = env.script(&[call, json!({"text": "done"})]);
    let out = env
        .cairn(&["--script", script.to_str().unwrap(), "--allow", "mcp__ask__*", "run", "greet me"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let done = payloads(&env, "toolCompleted");
    let summary = by_tool(&done, "mcp__ask__greet")["receipt"]["outputSummary"].as_str().unwrap().to_owned();
    assert!(summary.contains("no name: decline"), "the server was told 'decline': {summary}");
    assert!(
        summary.contains("the server asked \"What is your name?\"") && summary.contains("nobody can answer"),
        "{summary}"
    );
}

/// 53.8: a server asking the person to open a URL (URL mode) while cairn
/// runs headless is declined at once, and the model is told why: nobody is
/// there to consent (`--yes` does not consent for a person).
#[test]
fn a_servers_url_request_is_declined_headless_even_under_yes() {
    let env = Env::new();
    let cwd = env.cwd.canonicalize().unwrap();
    config(&env, &elicit_server_config(&cwd));
    let call = json!({"text": "", "toolCalls": [{"id": "c1", "name": "mcp__ask__connect", "arguments": {}}]});
    let script = env.script(&[call, json!({"text": "done"})]);
    let out = env
        .cairn(&["--script", script.to_str().unwrap(), "--yes", "--allow", "mcp__ask__*", "run", "connect me"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let done = payloads(&env, "toolCompleted");
    let summary = by_tool(&done, "mcp__ask__connect")["receipt"]["outputSummary"].as_str().unwrap().to_owned();
    assert!(summary.starts_with("url: decline"), "the server was told 'decline': {summary}");
    assert!(summary.contains("nobody can answer"), "{summary}");
}
