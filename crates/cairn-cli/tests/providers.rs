//! A named provider from the config file, as a user sets up a local
//! OpenAI-compatible server: `cairn` streams the answer from a loopback
//! server speaking the real Chat Completions wire format, sends the key from
//! the variable the config names, and never writes that key anywhere.

#![allow(clippy::unwrap_used)]

use crate::util;

use cairn_test_server::{Reply, TestServer, fixtures};
use util::Env;

#[test]
fn named_openai_compatible_provider_from_the_config_file() {
    let server = TestServer::start(vec![Reply::sse(fixtures::CHAT_TEXT)]).unwrap();
    let env = Env::new();
    let key = "sk-local-server-key-7777";
    std::fs::write(
        env.home.join("config.toml"),
        format!(
            "provider = \"myserver\"\n[providers.myserver]\nkind = \"openai\"\nbase_url = \"{}/v1\"\n\
             model = \"tiny-model\"\napi_key_env = \"MY_SERVER_KEY\"\n",
            server.url()
        ),
    )
    .unwrap();
    let out = env.cairn(&["run", "say hello"]).env("MY_SERVER_KEY", key).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("Hello! How can I help"), "{stdout}");

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(request.header("authorization"), Some(format!("Bearer {key}").as_str()));
    let body = request.json();
    assert_eq!(body["model"], "tiny-model");
    assert_eq!(body["stream"], true);
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.last().unwrap()["content"], "say hello");
    assert!(body["tools"].as_array().is_some_and(|t| t.iter().any(|t| t["function"]["name"] == "read_file")));

    assert!(!stdout.contains(key) && !stderr.contains(key));
    for file in env.session_files() {
        let text = std::fs::read_to_string(file).unwrap();
        assert!(!text.contains(key), "the key never reaches the session file");
        assert!(text.contains("Hello! How can I help"), "the settled answer is in the log");
    }
}

#[test]
fn missing_key_names_the_variable_to_set() {
    let env = Env::new();
    let out = env.cairn(&["--provider", "anthropic", "run", "hi"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ANTHROPIC_API_KEY"), "{stderr}");
}

#[test]
fn prices_in_the_table_cost_the_session_and_a_bad_one_is_refused() {
    let env = Env::new();
    let server = TestServer::start(vec![Reply::sse(fixtures::CHAT_TEXT)]).unwrap();
    let config = |prices: &str| {
        format!(
            "provider = \"myserver\"\n[providers.myserver]\nkind = \"openai\"\nbase_url = \"{}/v1\"\n\
             model = \"tiny-model\"\napi_key_env = \"MY_SERVER_KEY\"\n{prices}",
            server.url()
        )
    };
    // The recorded stream reports 19 tokens in and 10 out. At $100 in and
    // $1,000 out per million: 19 × 100 + 10 × 1,000 = 11,900 µ$ = $0.0119.
    std::fs::write(env.home.join("config.toml"), config("input_per_mtok = 100\noutput_per_mtok = 1000\n")).unwrap();
    let out = env.cairn(&["run", "say hello"]).env("MY_SERVER_KEY", "k").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("so far 29 tokens, $0.0119 · session"), "the status line prices the turn: {stderr}");

    for (prices, says) in [
        ("input_per_mtok = 3\noutput_per_mtok = -1\n", "`output_per_mtok` = -1 is not a price"),
        ("input_per_mtok = nan\noutput_per_mtok = 1\n", "`input_per_mtok` = NaN is not a price"),
        ("input_per_mtok = 3\noutput_per_mtok = 1e9\n", "`output_per_mtok` = 1000000000 is more than 10000"),
        ("input_per_mtok = 3\n", "`output_per_mtok` is not: set both"),
    ] {
        std::fs::write(env.home.join("config.toml"), config(prices)).unwrap();
        let out = env.cairn(&["run", "say hello"]).env("MY_SERVER_KEY", "k").output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{prices}: {stderr}");
        assert!(stderr.contains("invalid [providers.myserver] table") && stderr.contains(says), "{prices}: {stderr}");
    }
    assert_eq!(server.requests().len(), 1, "no request with a bad price");
}

/// Issue 49.3: a turn started with `--provider loop --model m-chosen` and
/// killed (SIGKILL while the model thinks) is resumed by `cairn resume
/// --last` on that provider and model, not on the configured default, and
/// cairn says so; `--provider` on a later resume chooses another, said too.
#[test]
fn resume_continues_on_the_provider_and_model_the_turn_ran_on() {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let gate = cairn_test_server::Gate::new();
    let chosen =
        TestServer::start(vec![Reply::sse(fixtures::CHAT_TEXT).hold(gate.clone()), Reply::sse(fixtures::CHAT_TEXT)])
            .unwrap();
    let default = TestServer::start(vec![Reply::sse(fixtures::CHAT_TEXT)]).unwrap();
    let env = Env::new();
    std::fs::write(
        env.home.join("config.toml"),
        format!(
            "provider = \"home\"\n\
             [providers.home]\nkind = \"openai\"\nbase_url = \"{}/v1\"\nmodel = \"m-home\"\napi_key_env = \"K\"\n\
             [providers.loop]\nkind = \"openai\"\nbase_url = \"{}/v1\"\nmodel = \"m-config\"\napi_key_env = \"K\"\n",
            default.url(),
            chosen.url()
        ),
    )
    .unwrap();
    let mut child = env
        .cairn(&["--provider", "loop", "--model", "m-chosen", "run", "say hello"])
        .env("K", "k")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while chosen.request_count() == 0 {
        assert!(start.elapsed() < Duration::from_secs(60), "the turn never reached the chosen provider");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL, mid-turn
    child.wait().unwrap();
    let out = env.cairn(&["resume", "--last"]).env("K", "k").stdin(Stdio::null()).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("Hello! How can I help"), "{stdout}\n{stderr}");
    assert!(stderr.contains("continuing on loop · m-chosen"), "says where it continues: {stderr}");
    assert_eq!(default.request_count(), 0, "the configured default was not asked");
    let requests = chosen.requests();
    assert_eq!(requests.len(), 2, "the resumed turn asked the same server again");
    assert_eq!(requests[1].json()["model"], "m-chosen");
    // Told otherwise: the next turn runs there, and cairn says so.
    let out = env
        .cairn(&["--provider", "home", "resume", "--last", "--prompt", "again"])
        .env("K", "k")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stderr.contains("ran on loop · m-chosen; from now on they run on home · m-home"), "{stderr}");
    assert_eq!(default.request_count(), 1);
    assert_eq!(default.requests()[0].json()["model"], "m-home");
    assert_eq!(chosen.request_count(), 2);
}
