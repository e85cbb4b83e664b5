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
