//! Discovery through the real `cairn` binary: `cairn skills`, `cairn tools
//! --discover`, the BM25 fallback without the model, and a `cairn run` with
//! 20 installed tools that offers the model only the chosen ones and records
//! the choice in the session; the same through a `cairn toolsrv` and for a
//! session of `cairn serve`, where what the provider received is checked
//! on a loopback test server. Needs the MiniLM model (`scripts/fetch-minilm`
//! or CAIRN_MINILM_DIR); the tests that use it fail saying so without it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::util;
use util::stderr_text as stderr;
use util::stdout_text as stdout;

use std::os::unix::fs::PermissionsExt;

use serde_json::{Value, json};
use util::Env;

fn model_dir() -> std::path::PathBuf {
    let dir = cairn_discovery::default_model_dir();
    if let Err(e) = cairn_discovery::verify_model_dir(&dir) {
        panic!("this test needs the discovery model: {e}");
    }
    dir
}

/// Install `n` tools of the evaluation set into the home's tools directory.
fn install_tools(env: &Env, n: usize) -> Vec<String> {
    install_tools_into(&env.home.join("tools"), n)
}

/// Install `n` tools of the evaluation set into `dir`.
fn install_tools_into(dir: &std::path::Path, n: usize) -> Vec<String> {
    let text = include_str!("../../cairn-discovery/eval/tools.tsv");
    std::fs::create_dir_all(dir).unwrap();
    let mut names = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')).take(n) {
        let (name, desc) = line.split_once('\t').unwrap();
        std::fs::write(
            dir.join(format!("{name}.toml")),
            format!(
                "description = {desc:?}\nrisk = \"readOnly\"\ncapabilities = []\nreplay = \"idempotent\"\n\
                 [parameters]\ntype = \"object\"\n"
            ),
        )
        .unwrap();
        let exe = dir.join(name);
        std::fs::write(&exe, format!("#!/bin/sh\necho ran {name}\n")).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        names.push(name.to_owned());
    }
    names
}

fn install_skill(root: &std::path::Path, name: &str, description: &str, body: &str) {
    let dir = root.join("sk").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("SKILL.md"), format!("---\nname: {name}\ndescription: {description}\n---\n{body}\n"))
        .unwrap();
}

#[test]
fn skills_are_listed_from_config_and_project_and_broken_ones_are_named() {
    let env = Env::new();
    let out = env.cairn(&["skills"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("no skills installed"), "{}", stdout(&out));
    install_skill(&env.home, "pdf-forms", "Fill in PDF forms", "Use the form fields.");
    install_skill(&env.cwd.join(".cairn"), "changelog", "Write a changelog entry", "Keep a Changelog style.");
    let broken = env.cwd.join(".cairn/sk/broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("SKILL.md"), "no front matter here").unwrap();
    let out = env.cairn(&["--json", "skills"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<Value> = stdout(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let names: Vec<&str> = lines.iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["changelog", "pdf-forms"]);
    assert!(stderr(&out).contains("broken/SKILL.md") && stderr(&out).contains("must start"), "{}", stderr(&out));
}

#[test]
fn discover_ranks_with_minilm_and_marks_what_a_turn_would_get() {
    let env = Env::new();
    install_tools(&env, 222);
    install_skill(&env.home, "photo-editing", "How to prepare photos for the web", "Prefer WebP.");
    let out = env
        .cairn(&["--json", "tools", "--discover", "shrink the picture so it fits in an email"])
        .env("CAIRN_MINILM_DIR", model_dir())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(v["method"], "minilm", "{v}");
    assert!(v["fallback"].is_null());
    let tools: Vec<&str> = v["selected"]["tools"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert!(!tools.is_empty() && tools.len() <= 5, "{tools:?}");
    assert!(tools.contains(&"image_resize") || tools.contains(&"image_compress"), "{tools:?}");
    assert!(v["core"].as_array().unwrap().iter().any(|c| c == "read_file"), "core tools always offered: {v}");
    let candidates = v["candidates"].as_array().unwrap();
    assert_eq!(candidates.len(), 223, "every tool and skill is ranked");
    // Scores are sorted and the injected ones are the top of their kind.
    let scores: Vec<f64> = candidates.iter().map(|c| c["score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]));
    // The second run reads document embeddings from the cache.
    let cached = std::fs::read_dir(env.home.join("cache/embeddings")).unwrap().count();
    assert!(cached >= 223, "{cached} cached vectors");

    // Human output says the method and marks injected rows.
    let out = env
        .cairn(&["tools", "--discover", "which author last changed each line of parser.c"])
        .env("CAIRN_MINILM_DIR", model_dir())
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(text.contains("MiniLM cosine") && text.contains("git_blame"), "{text}");
    assert!(text.lines().any(|l| l.starts_with('*') && l.contains("git_blame")), "{text}");
}

#[test]
fn without_the_model_discovery_says_so_and_falls_back_to_bm25() {
    let env = Env::new();
    install_tools(&env, 40);
    let out = env
        .cairn(&["--json", "tools", "--discover", "show the commit history"])
        .env("CAIRN_MINILM_DIR", env.home.join("no-model-here"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("not installed") && err.contains("scripts/fetch-minilm") && err.contains("BM25"), "{err}");
    let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(v["method"], "bm25");
    assert!(v["fallback"].as_str().unwrap().contains("BM25"));
    assert_eq!(v["selected"]["tools"][0], "git_log", "{v}");
}

#[test]
fn a_run_offers_only_the_chosen_tools_and_records_the_choice() {
    let env = Env::new();
    install_tools(&env, 222);
    install_skill(&env.home, "photo-editing", "How to resize and prepare photos and pictures", "Keep EXIF.");
    install_skill(&env.home, "sql-style", "House style for SQL queries", "Uppercase keywords.");
    let script = env.script(&[
        json!({"text": "", "toolCalls": [
            {"id": "c1", "name": "image_resize", "arguments": {"path": "a.png"}},
            {"id": "c2", "name": "git_log", "arguments": {}}
        ]}),
        json!({"text": "Done."}),
    ]);
    let out = env
        .cairn(&["--script", script.to_str().unwrap(), "--yes", "run", "make this photo smaller, 800 wide"])
        .env("CAIRN_MINILM_DIR", model_dir())
        .output()
        .unwrap();
    // 4: a call was refused (git_log was not offered).
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let files = env.session_files();
    assert_eq!(files.len(), 1);
    let log = std::fs::read_to_string(&files[0]).unwrap();
    // The choice is a session fact, committed before the turn's first entry.
    let fact_line = log.lines().position(|l| l.contains("\"discovery\"")).expect("discovery fact recorded");
    let first_entry = log.lines().position(|l| l.contains("\"message\"")).unwrap();
    assert!(fact_line < first_entry, "{log}");
    let fact: Value = serde_json::from_str(log.lines().nth(fact_line).unwrap()).unwrap();
    let text = fact.to_string();
    assert!(text.contains("image_resize") && !text.contains("git_log"), "{text}");
    assert!(text.contains("photo-editing") && !text.contains("sql-style"), "{text}");
    // The chosen tool ran; the other was not offered.
    assert!(log.contains("ran image_resize"), "{log}");
    assert!(!log.contains("ran git_log"), "{log}");
    assert!(log.contains("unknown tool \\\"git_log\\\""), "{log}");
}

#[test]
fn resuming_a_killed_turn_offers_the_tools_recorded_for_it() {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let env = Env::new();
    // Unstaged, so the tool's marker reaches the working tree at once.
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    install_tools(&env, 222);
    // image_resize blocks the first time (the agent is killed meanwhile).
    let marker = env.cwd.join("resize-started");
    let exe = env.home.join("tools/image_resize");
    std::fs::write(
        &exe,
        format!(
            "#!/bin/sh\nif [ ! -f '{0}' ]; then touch '{0}'; sleep 30; fi\necho ran image_resize\n",
            marker.display()
        ),
    )
    .unwrap();
    std::fs::write(
        env.home.join("tools/image_resize.toml"),
        "description = \"Resize or scale an image to given dimensions.\"\nrisk = \"write\"\n\
         capabilities = [\"fileWrite\", \"processSpawn\"]\nreplay = \"idempotent\"\n[parameters]\ntype = \"object\"\n",
    )
    .unwrap();
    let script = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "image_resize", "arguments": {}}]}),
        json!({"text": "", "toolCalls": [{"id": "c2", "name": "git_log", "arguments": {}}]}),
        json!({"text": "end"}),
    ]);
    let s = script.to_str().unwrap();
    let mut child = env
        .cairn(&["--script", s, "--yes", "run", "make this photo smaller, 800 wide"])
        .env("CAIRN_MINILM_DIR", model_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the tool never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let before = std::fs::read_to_string(&env.session_files()[0]).unwrap();
    assert!(before.contains("toolStarted") && !before.contains("toolCompleted"), "killed mid-call: {before}");
    // A fresh ranking of an empty resume would offer everything; the
    // recorded choice keeps git_log out.
    let out = env
        .cairn(&["--script", s, "--yes", "resume", "--last"])
        .env("CAIRN_MINILM_DIR", model_dir())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let log = std::fs::read_to_string(&env.session_files()[0]).unwrap();
    assert!(stdout(&out).contains("end"), "{}\n{}\n{log}", stdout(&out), stderr(&out));
    assert!(log.contains("unknown tool \\\"git_log\\\""), "{log}");
    assert!(!log.contains("ran git_log"), "{log}");
    assert_eq!(log.matches("\"discovery\"").count(), 1, "the choice is recorded once: {log}");
}

#[test]
fn few_tools_are_all_offered_and_nothing_is_recorded_and_bad_config_is_refused() {
    let env = Env::new();
    install_tools(&env, 5);
    let script = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "fs_write", "arguments": {}}]}),
        json!({"text": "Done."}),
    ]);
    // No model needed: with at most max_tools external tools nothing is ranked.
    let out = env
        .cairn(&["--script", script.to_str().unwrap(), "--yes", "run", "hello"])
        .env("CAIRN_MINILM_DIR", env.home.join("no-model-here"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let log = std::fs::read_to_string(&env.session_files()[0]).unwrap();
    assert!(log.contains("ran fs_write"), "{log}");
    assert!(!log.contains("\"discovery\""), "nothing recorded: {log}");
    assert!(!stderr(&out).contains("BM25"), "no ranking, no fallback notice: {}", stderr(&out));

    for bad in ["[discovery]\nthreshold = 7.0\n", "[discovery]\nmax_tools = -1\n", "[discovery]\nthresold = 0.3\n"] {
        std::fs::write(env.home.join("config.toml"), bad).unwrap();
        let out = env.cairn(&["tools", "--discover", "x"]).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{bad}");
        assert!(stderr(&out).contains("[discovery]") && stderr(&out).contains("max_tools"), "{}", stderr(&out));
    }
    std::fs::write(env.home.join("config.toml"), "[discovery]\nmax_tools = 2\nthreshold = 0.0\n").unwrap();
    let out = env
        .cairn(&["--json", "tools", "--discover", "write a file"])
        .env("CAIRN_MINILM_DIR", env.home.join("no-model-here"))
        .output()
        .unwrap();
    let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert!(v["selected"]["tools"].as_array().unwrap().len() <= 2, "{v}");
}

#[test]
fn chat_chooses_again_for_every_prompt_and_records_each_choice() {
    use std::io::Write as _;
    use std::process::Stdio;
    let env = Env::new();
    install_tools(&env, 222);
    let script = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "image_resize", "arguments": {}}]}),
        json!({"text": "first done"}),
        json!({"text": "", "toolCalls": [
            {"id": "c2", "name": "git_log", "arguments": {}},
            {"id": "c3", "name": "image_resize", "arguments": {}},
            {"id": "c4", "name": "wait_agents", "arguments": {"timeout": 0}}
        ]}),
        json!({"text": "second done"}),
    ]);
    let mut child = env
        .cairn(&["--script", script.to_str().unwrap(), "--yes", "chat"])
        .env("CAIRN_MINILM_DIR", model_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"make this photo smaller, 800 wide\nlist the last ten commits of the repository\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(stdout(&out).contains("second done"), "{}\n{}", stdout(&out), stderr(&out));
    let log = std::fs::read_to_string(&env.session_files()[0]).unwrap();
    // Turn 1 offered image_resize; turn 2 offered git_log and no longer image_resize.
    assert_eq!(log.matches("ran image_resize").count(), 1, "{log}");
    assert!(log.contains("ran git_log"), "{log}");
    assert!(log.contains("unknown tool \\\"image_resize\\\""), "{log}");
    // The family's tools stay offered whatever discovery chose.
    assert!(!log.contains("unknown tool \\\"wait_agents\\\""), "{log}");
    assert!(log.contains("\"c4\""), "{log}");
    assert_eq!(log.matches("\"discovery\"").count(), 2, "one recorded choice per prompt: {log}");
}

/// The tool names of an OpenAI-style request the test server recorded.
fn offered(request: &Value) -> Vec<String> {
    request["tools"].as_array().map_or_else(Vec::new, |tools| {
        tools.iter().map(|t| t["function"]["name"].as_str().unwrap_or_default().to_owned()).collect()
    })
}

/// A provider on the loopback test server, as the home's default.
fn test_server_provider(env: &Env, server: &cairn_test_server::TestServer) {
    std::fs::write(
        env.home.join("config.toml"),
        format!(
            "provider = \"loop\"\n[providers.loop]\nkind = \"openai\"\nbase_url = \"{}/v1\"\nmodel = \"m\"\n\
             api_key_env = \"LOOP_KEY\"\n",
            server.url()
        ),
    )
    .unwrap();
}

/// What discovery offered: the built-ins, at most five others, one
/// that can shrink an image among them, and nothing about commits.
fn assert_discovered(names: &[String]) {
    let builtins = ["read_file", "list_dir", "search", "write_file", "edit_file", "shell", "plan"];
    for b in builtins {
        assert!(names.iter().any(|n| n == b), "core tool {b} offered: {names:?}");
    }
    let others: Vec<&String> = names.iter().filter(|n| !builtins.contains(&n.as_str())).collect();
    // The family's tools (subagents, peers) are cairn's own, not installed ones.
    let family = ["spawn_agent", "wait_agents", "send_message", "wait_for_messages"];
    let installed: Vec<&&String> = others.iter().filter(|n| !family.contains(&n.as_str())).collect();
    assert!(!installed.is_empty() && installed.len() <= 5, "{installed:?} (all: {names:?})");
    assert!(installed.iter().any(|n| n.as_str() == "image_resize" || n.as_str() == "image_compress"), "{installed:?}");
    assert!(!names.iter().any(|n| n == "git_log"), "{names:?}");
}

/// After the two prompts of [`TWO_PROMPTS`]: the first was offered what
/// [`assert_discovered`] wants, the second the tools for its own request,
/// and the session recorded one choice per prompt.
fn assert_two_choices(env: &Env, server: &cairn_test_server::TestServer) {
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_discovered(&offered(&requests[0].json()));
    let second = offered(&requests[1].json());
    assert!(second.iter().any(|n| n == "git_blame"), "{second:?}");
    assert!(!second.iter().any(|n| n == "image_resize"), "{second:?}");
    let log = std::fs::read_to_string(&env.session_files()[0]).unwrap();
    assert_eq!(log.matches("\"discovery\"").count(), 2, "one recorded choice per prompt: {log}");
}

/// Two requests needing different tools (an image, then a blame).
const TWO_PROMPTS: [&str; 2] = ["make this photo smaller, 800 wide", "which author last changed each line of parser.c"];

/// 222 tools behind a separate `cairn toolsrv` (its own home: the agent has
/// none installed): a `cairn run --toolsrv` ranks the service's metadata and
/// offers the provider only the built-ins and the chosen ones, and records
/// the choice.
#[test]
fn a_run_through_a_tool_service_offers_the_provider_only_the_discovered_tools() {
    use std::io::{BufRead as _, BufReader};
    use std::process::Stdio;
    let env = Env::new();
    let srv_home = env.home.join("srv");
    install_tools_into(&srv_home.join("tools"), 222);
    let sock_dir = env.home.join("sock");
    std::fs::create_dir_all(&sock_dir).unwrap();
    std::fs::set_permissions(&sock_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let listen = format!("unix!{}", sock_dir.join("toolsrv.sock").display());
    let mut srv = env
        .cairn(&["toolsrv", "--listen", &listen])
        .env("CAIRN_HOME", &srv_home)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut address = String::new();
    BufReader::new(srv.stdout.take().unwrap()).read_line(&mut address).unwrap();
    let server = cairn_test_server::TestServer::start(vec![cairn_test_server::Reply::sse(
        cairn_test_server::fixtures::CHAT_TEXT,
    )])
    .unwrap();
    test_server_provider(&env, &server);
    let out = env
        .cairn(&["--toolsrv", address.trim(), "run", "make this photo smaller, 800 wide"])
        .env("CAIRN_MINILM_DIR", model_dir())
        .env("LOOP_KEY", "k")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = srv.kill();
    let _ = srv.wait();
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_discovered(&offered(&requests[0].json()));
    let log = std::fs::read_to_string(&env.session_files()[0]).unwrap();
    let fact = log.lines().find(|l| l.contains("\"discovery\"")).expect("the choice is recorded");
    assert!(fact.contains("image_") && fact.contains("filtered"), "{fact}");
    assert!(!env.home.join("tools").exists(), "the agent has no tools of its own");
}

/// A session of `cairn serve` with 222 tools installed: each prompt's turn
/// is offered the built-ins and the tools discovery chose for it, recorded
/// in the session as for `cairn run`.
#[test]
fn a_served_session_offers_the_provider_only_the_discovered_tools() {
    use std::io::{BufRead as _, BufReader};
    use std::process::Stdio;
    let env = Env::new();
    install_tools(&env, 222);
    let server = cairn_test_server::TestServer::start(vec![
        cairn_test_server::Reply::sse(cairn_test_server::fixtures::CHAT_TEXT),
        cairn_test_server::Reply::sse(cairn_test_server::fixtures::CHAT_TEXT),
    ])
    .unwrap();
    test_server_provider(&env, &server);
    let mut serve = env
        .cairn(&["serve", "--listen", "tcp!127.0.0.1!0"])
        .env("CAIRN_MINILM_DIR", model_dir())
        .env("LOOP_KEY", "k")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut address = String::new();
    BufReader::new(serve.stdout.take().unwrap()).read_line(&mut address).unwrap();
    let mut conn = cairn_9p::client::Conn::dial(&cairn_9p::Dial::parse(address.trim()).unwrap()).unwrap();
    let id = conn.create_session(&format!("cwd={}", env.cwd.display())).unwrap();
    let wait_idle = |conn: &mut cairn_9p::client::Conn, n: usize| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        loop {
            let state = conn.read_text(&format!("s/{id}/state")).unwrap();
            if server.request_count() >= n && state.trim() == "idle" {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the turn never ended: {state}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    conn.write_file(&format!("s/{id}/prompt"), TWO_PROMPTS[0].as_bytes()).unwrap();
    wait_idle(&mut conn, 1);
    // The next prompt gets its own choice.
    conn.write_file(&format!("s/{id}/prompt"), TWO_PROMPTS[1].as_bytes()).unwrap();
    wait_idle(&mut conn, 2);
    let _ = serve.kill();
    let _ = serve.wait();
    assert_two_choices(&env, &server);
}

/// A session of `cairn acp` (an editor's) with 222 tools installed: each
/// prompt's turn is offered the built-ins and the tools discovery chose for
/// it, recorded in the session, as in every face (`equip.rs`). The client
/// is a plain JSON-RPC exchange over the agent's stdio.
#[test]
fn an_editor_session_offers_the_provider_only_the_discovered_tools() {
    use std::io::{BufRead as _, BufReader, Write as _};
    use std::process::Stdio;
    let env = Env::new();
    install_tools(&env, 222);
    let server = cairn_test_server::TestServer::start(vec![
        cairn_test_server::Reply::sse(cairn_test_server::fixtures::CHAT_TEXT),
        cairn_test_server::Reply::sse(cairn_test_server::fixtures::CHAT_TEXT),
    ])
    .unwrap();
    test_server_provider(&env, &server);
    let mut acp = env
        .cairn(&["acp"])
        .env("CAIRN_MINILM_DIR", model_dir())
        .env("LOOP_KEY", "k")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = acp.stdin.take().unwrap();
    let mut lines = BufReader::new(acp.stdout.take().unwrap()).lines();
    // Send a request and read until its answer (notifications skipped).
    let mut call = |id: i64, method: &str, params: Value| -> Value {
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(stdin, "{line}").unwrap();
        loop {
            let text = lines.next().expect("the agent answers").unwrap();
            let message: Value = serde_json::from_str(&text).unwrap();
            if message["id"] == id && message.get("method").is_none() {
                assert!(message.get("error").is_none(), "{method}: {message}");
                return message["result"].clone();
            }
        }
    };
    call(1, "initialize", json!({"protocolVersion": 1, "clientCapabilities": {}}));
    let session = call(2, "session/new", json!({"cwd": env.cwd.to_str().unwrap(), "mcpServers": []}));
    let id = session["sessionId"].as_str().unwrap().to_owned();
    let prompt = |text: &str| json!({"sessionId": id, "prompt": [{"type": "text", "text": text}]});
    assert_eq!(call(3, "session/prompt", prompt(TWO_PROMPTS[0]))["stopReason"], "end_turn");
    // The next prompt gets its own choice.
    assert_eq!(call(4, "session/prompt", prompt(TWO_PROMPTS[1]))["stopReason"], "end_turn");
    let _ = acp.kill();
    let _ = acp.wait();
    assert_two_choices(&env, &server);
}

/// A session run by a PostgreSQL worker with 222 tools installed: its turn
/// is offered the built-ins and the tools discovery chose for it, and the
/// choice is recorded in the session in the database.
#[cfg(feature = "postgres")]
#[test]
fn a_database_session_offers_the_provider_only_the_discovered_tools() {
    use std::process::Stdio;
    let cluster = cairn_pg::test_cluster::TestCluster::start()
        .unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e:#}"));
    let url = cluster.url();
    let env = Env::new();
    install_tools(&env, 222);
    let server = cairn_test_server::TestServer::start(vec![cairn_test_server::Reply::sse(
        cairn_test_server::fixtures::CHAT_TEXT,
    )])
    .unwrap();
    test_server_provider(&env, &server);
    let out = env.cairn(&["--database", url, "submit", "make this photo smaller, 800 wide"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_owned();
    let mut worker = env
        .cairn(&["--database", url, "worker", "--lease", "5"])
        .env("CAIRN_MINILM_DIR", model_dir())
        .env("LOOP_KEY", "k")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let exported = loop {
        let out = env.cairn(&["--database", url, "export", &id]).output().unwrap();
        let text = stdout(&out);
        if server.request_count() >= 1 && text.contains("\"assistant\"") {
            break text;
        }
        assert!(std::time::Instant::now() < deadline, "the worker never answered: {}", stderr(&out));
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let _ = worker.kill();
    let _ = worker.wait();
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_discovered(&offered(&requests[0].json()));
    let fact = exported.lines().find(|l| l.contains("\"discovery\"")).expect("the choice is recorded");
    assert!(fact.contains("image_") && fact.contains("filtered"), "{fact}");
}
