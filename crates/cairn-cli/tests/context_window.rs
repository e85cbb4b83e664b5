//! Long sessions against a real model's window, through the real `cairn`
//! binary and a loopback OpenAI-compatible server: a 100k-entry session
//! resumed with a 32k-token window sends only requests that fit (counted by
//! the server's own tokenizer, `cairn_test_server::tokens`, not cairn's
//! estimate), the model sees the compaction summary, and every original
//! entry stays in the file and in `cairn show --all`. The three real
//! "context length exceeded" bodies (OpenAI, Anthropic, llama.cpp) each
//! trigger one compaction and one retry.

#![allow(clippy::unwrap_used)]

use crate::util;

use std::path::PathBuf;

use cairn_core::storage::{Durability, Header, JsonlStore, StoreOptions};
use cairn_test_server::{Reply, TestServer, fixtures, streams};
use cairn_testtools::history;
use serde_json::Value;
use util::Env;

/// A session of `turns` generated turns in this env's sessions directory.
fn session(env: &Env, id: &str, turns: usize) -> PathBuf {
    let mut store = JsonlStore::create(
        &env.home.join("sessions"),
        Header::new(id, env.cwd.display().to_string()),
        StoreOptions::with_durability(Durability::None),
    )
    .unwrap();
    history::generate(&mut store, turns, 200).unwrap();
    store.path().to_owned()
}

fn config(env: &Env, kind: &str, url: &str, window: u32) {
    std::fs::write(
        env.home.join("config.toml"),
        format!(
            "provider = \"t\"\n[providers.t]\nkind = \"{kind}\"\nbase_url = \"{url}\"\nmodel = \"test-model\"\n\
             context_window = {window}\nmax_output_tokens = 2048\nmax_attempts = 1\n"
        ),
    )
    .unwrap();
}

/// Entries of each type in a session file, and every entry id (a line is
/// one record or an array of them; entries have `kind: "entry"`).
fn entries(path: &PathBuf) -> (Vec<String>, Vec<String>) {
    let text = std::fs::read_to_string(path).unwrap();
    let (mut types, mut ids) = (Vec::new(), Vec::new());
    for line in text.lines().skip(1) {
        let line: Value = serde_json::from_str(line).unwrap();
        let records = match line {
            Value::Array(records) => records,
            record => vec![record],
        };
        for record in records.iter().filter(|r| r["kind"] == "entry") {
            types.push(record["type"].as_str().unwrap().to_owned());
            ids.push(record["id"].as_str().unwrap().to_owned());
        }
    }
    (types, ids)
}

fn messages_text(body: &Value) -> String {
    body["messages"].to_string()
}

#[test]
fn a_100k_entry_session_resumes_within_a_32k_window_and_keeps_everything() {
    let turns = 100_000 / history::ENTRIES_PER_TURN + 1;
    let server = TestServer::start(vec![
        Reply::sse(streams::chat_text_with_usage(
            "SUMMARY-7731: the user asked about handle_N functions; all answered.",
        )),
        Reply::sse(streams::chat_text_with_usage("All questions are answered.")),
    ])
    .unwrap();
    server.limit_context(32_768);
    let env = Env::new();
    let path = session(&env, "long-session", turns);
    config(&env, "openai", &format!("{}/v1", server.url()), 32_768);

    let out = env.cairn(&["resume", "long-session", "--prompt", "next question, please"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("All questions are answered."), "{stdout}\n{stderr}");

    // Every request fitted the window by the server's count.
    let counts = server.token_counts();
    assert_eq!(server.over_limit(), 0, "requests over the window: {counts:?}");
    assert!(counts.iter().all(|&c| c <= 32_768), "{counts:?}");
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "one summary request, one turn request: {counts:?}");
    // The summariser was asked without tools; the turn's request carries
    // the summary and the new prompt, and only a window's worth of history.
    let summary_request = requests[0].json();
    assert!(summary_request.get("tools").is_none(), "{summary_request}");
    let turn_request = requests[1].json();
    let sent = messages_text(&turn_request);
    assert!(sent.contains("SUMMARY-7731"), "the model sees the summary");
    assert!(sent.contains("next question, please"));
    assert!(!sent.contains(&history::question(0)), "the oldest turn is not sent verbatim");
    let sent_messages = turn_request["messages"].as_array().unwrap().len();
    assert!(sent_messages < 2_000, "{sent_messages} messages sent");
    assert!(turn_request["max_tokens"].as_u64().is_some_and(|m| m > 0 && m <= 2048), "{turn_request}");

    // Nothing is deleted: every generated entry is in the file, plus one
    // compaction entry naming the range it covers.
    let (types, ids) = entries(&path);
    assert_eq!(types.iter().filter(|t| *t == "compaction").count(), 1, "one summary");
    for turn in [0, turns / 2, turns - 1] {
        for k in 0..history::ENTRIES_PER_TURN {
            assert!(ids.contains(&history::entry_id(turn, k)), "entry {} kept", history::entry_id(turn, k));
        }
    }
    let file = std::fs::read_to_string(&path).unwrap();
    let compaction = file.lines().find(|l| l.contains("\"compaction\"")).unwrap();
    assert!(compaction.contains("\"firstEntry\":\"h0.0\""), "{}", &compaction[..compaction.len().min(600)]);

    // show folds what the summary covers; show --all lists the originals.
    let shown = env.cairn(&["show", "long-session"]).output().unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("covered by compaction"), "{}", &shown[..shown.len().min(2000)]);
    assert!(!shown.contains(&history::question(0)[..30]));
    assert!(shown.contains("context "), "show prints the context used against the window");
    let all = env.cairn(&["show", "long-session", "--all"]).output().unwrap();
    assert_eq!(all.status.code(), Some(0));
    let all = String::from_utf8_lossy(&all.stdout);
    assert!(all.contains(&history::question(0)[..30]), "show --all lists the covered originals");
    assert!(all.contains("compaction: summary of"));

    // A fork from before the summary sees the full history: its lane's
    // path holds no compaction entry.
    let fork =
        env.cairn(&["fork", "long-session", &history::entry_id(turns - 1, 5), "--lane", "before"]).output().unwrap();
    assert_eq!(fork.status.code(), Some(0), "{}", String::from_utf8_lossy(&fork.stderr));
}

/// One real "context length exceeded" body: a provider that refuses the
/// first request gets one compaction and one retry, all recorded.
fn rejected_once(kind: &str, status: u16, body: Value, answer: &str, summary: Reply, final_reply: Reply) {
    let server = TestServer::start(vec![Reply::json(status, &body), summary, final_reply]).unwrap();
    let env = Env::new();
    let path = session(&env, "rejected", 20);
    let url = if kind == "anthropic" { server.url() } else { format!("{}/v1", server.url()) };
    config(&env, kind, &url, 200_000);
    let out = env.cairn(&["resume", "rejected", "--prompt", "and now?"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{kind}: {stdout}\n{stderr}");
    assert!(stdout.contains(answer), "{kind}: {stdout}");
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "{kind}: refused request, summary, one retry");
    let retry = requests[2].body.len();
    assert!(retry < requests[0].body.len(), "{kind}: the retry is smaller ({retry} vs {})", requests[0].body.len());
    let (types, _) = entries(&path);
    assert_eq!(types.iter().filter(|t| *t == "compaction").count(), 1, "{kind}: one summary");
    let file = std::fs::read_to_string(&path).unwrap();
    assert!(file.contains("\"reason\":\"providerRejected\""), "{kind}: the compaction says why");
    assert!(file.contains(&format!("\"status\":{status}")), "{kind}: the refused attempt is a usage row");
}

#[test]
fn openai_context_length_exceeded_triggers_one_compaction_and_one_retry() {
    let body = serde_json::json!({"error": {
        "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 131072 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}});
    let text = Reply::sse(fixtures::CHAT_TEXT);
    rejected_once("openai", 400, body, "Hello! How can I help", text.clone(), text);
}

#[test]
fn anthropic_prompt_too_long_triggers_one_compaction_and_one_retry() {
    let body = serde_json::json!({"type": "error", "error": {
        "type": "invalid_request_error", "message": "prompt is too long: 208317 tokens > 200000 maximum"}});
    let text = Reply::sse(fixtures::ANTHROPIC_TEXT);
    rejected_once("anthropic", 400, body, "The directory holds two files.", text.clone(), text);
}

#[test]
fn llama_cpp_exceed_context_size_triggers_one_compaction_and_one_retry() {
    let body = serde_json::json!({"error": {
        "code": 400, "message": "the request exceeds the available context size, try increasing it",
        "type": "exceed_context_size_error", "n_prompt_tokens": 40211, "n_ctx": 32768}});
    let text = Reply::sse(fixtures::CHAT_TEXT);
    rejected_once("openai", 400, body, "Hello! How can I help", text.clone(), text);
}

/// The user prompts of a session file.
fn user_prompts(path: &PathBuf) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let records = match serde_json::from_str::<Value>(line).unwrap() {
            Value::Array(records) => records,
            record => vec![record],
        };
        for r in records.iter().filter(|r| r["kind"] == "entry" && r["type"] == "message") {
            if r["payload"]["role"] == "user" {
                out.push(r["payload"]["content"][0]["text"].as_str().unwrap_or_default().to_owned());
            }
        }
    }
    out
}

/// Issue 49.2: a prompt that cannot fit the window (300 KB from a file to
/// `cairn run`, 120 KB to `cairn resume --prompt`) is refused before it is
/// recorded, saying how large it is and what fits; nothing reaches the
/// model, and the session stays usable: a small prompt on `resume --last`
/// is answered and `cairn undo` works.
#[test]
fn a_prompt_larger_than_the_window_is_refused_before_it_is_recorded() {
    let server = TestServer::start(vec![Reply::sse(streams::chat_text_with_usage("A small answer."))]).unwrap();
    let env = Env::new();
    config(&env, "openai", &format!("{}/v1", server.url()), 8_192);
    let big = "lorem ipsum dolor sit amet ".repeat(300 * 1024 / 27);
    std::fs::write(env.cwd.join("big.txt"), &big).unwrap();
    let out = env.cairn(&["run", "--prompt-file", "big.txt"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("the prompt is {} bytes", big.len())), "says how large: {stderr}");
    assert!(
        stderr.contains("context window of 8192 tokens") && stderr.contains("tokens are left for a prompt"),
        "{stderr}"
    );
    assert!(stderr.contains("Nothing was recorded"), "{stderr}");
    let files = env.session_files();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(user_prompts(&files[0]).is_empty(), "the prompt was not recorded");
    let medium = "x".repeat(120 * 1024);
    let out = env.cairn(&["resume", "--last", "--prompt", &medium]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("the prompt is {} bytes", medium.len())), "{stderr}");
    assert_eq!(server.request_count(), 0, "nothing was sent");
    let out = env.cairn(&["resume", "--last", "--prompt", "a small question"]).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("A small answer."), "{stdout}\n{stderr}");
    assert_eq!(user_prompts(&files[0]), ["a small question"]);
    let id = files[0].file_stem().unwrap().to_str().unwrap().to_owned();
    let out = env.cairn(&["undo", &id]).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "undo works: {stdout}\n{stderr}");
    assert_eq!(server.request_count(), 1);
}
