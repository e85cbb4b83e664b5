//! The turn against providers that misbehave: a real HTTP provider talking
//! to the loopback test server that asks for 10,000 tool calls in one
//! message, and answers that reuse a tool-call id (from the HTTP provider
//! and from an in-process one, since the turn's rule holds for every
//! provider). The excess calls must not run and the model must see why; a
//! message with duplicate ids must never reach the log.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cairn_core::approval::{Allowlist, PolicyApprover};
use cairn_core::events::TurnEvent;
use cairn_core::projection::{ToolInvocationStatus, ToolState};
use cairn_core::provider::{Provider, ProviderErrorKind};
use cairn_core::storage::{Header, MemStore, Storage};
use cairn_core::turn::Phase;
use cairn_core::{CancelToken, Session, SessionConfig, ToolRegistry, TurnEnv, TurnError, TurnOutcome, TurnStop};
use cairn_provider::{HttpProvider, ProviderConfig, ProviderKind};
use cairn_test_server::{Reply, TestServer, fixtures, streams};
use cairn_testtools::hooks::RecordingStore;
use cairn_testtools::provider::ScriptCall;
use cairn_testtools::{EchoTool, ScriptLine, ScriptProvider};
use serde_json::{Value, json};

fn echo_registry() -> (ToolRegistry, Arc<EchoTool>) {
    let echo = Arc::new(EchoTool::new());
    let mut registry = ToolRegistry::new(&cairn_testtools::ScriptedApprover::new(false, []));
    registry.register(echo.clone()).unwrap();
    (registry, echo)
}

fn http(server: &TestServer, max_tool_calls: Option<usize>) -> HttpProvider {
    let mut c = ProviderConfig::new("hostile", ProviderKind::OpenAiChat);
    c.model = Some("m".into());
    c.retry.max_attempts = 1;
    c.timeouts.idle = Duration::from_secs(10);
    // 10,000 tool results in one turn are ~170k tokens by cairn's estimate:
    // a window that holds them, so these tests stay about the cap.
    c.context_window = Some(1 << 20);
    if let Some(n) = max_tool_calls {
        c.max_tool_calls = n;
    }
    HttpProvider::new(&c, format!("{}/v1", server.url()), None).unwrap()
}

fn turn<S: Storage>(
    session: &mut Session<S>,
    provider: &dyn Provider,
    tools: &ToolRegistry,
    prompt: Option<&str>,
) -> (Result<Option<TurnOutcome>, TurnError>, Vec<TurnEvent>) {
    let mut events = Vec::new();
    let mut approver = PolicyApprover::new(Allowlist::new(), None);
    let mut observer = |e: &TurnEvent| events.push(e.clone());
    let cancel = CancelToken::new();
    let mut env = TurnEnv { provider, tools, approver: &mut approver, observer: &mut observer, cancel: &cancel };
    let result = match prompt {
        Some(p) => session.run_turn(p, &mut env).map(Some),
        None => session.resume(&mut env),
    };
    (result, events)
}

fn count<S: Storage>(store: &S, entry_type: &str) -> usize {
    store.entries().iter().filter(|e| e.entry_type == entry_type).count()
}

fn healthy<S: Storage>(store: &S) -> ToolState {
    let state = ToolState::replay(store.entries());
    assert!(state.anomalies.is_empty(), "anomalies: {:?}", state.anomalies);
    assert!(state.invocations.iter().all(|r| r.settlements == 1));
    assert!(store.registers("pending").is_empty());
    state
}

/// The tool results the second request carried to the model.
fn results_sent(server: &TestServer, request: usize) -> Vec<(String, String)> {
    let body = server.requests()[request].json();
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| (m["tool_call_id"].as_str().unwrap().to_owned(), m["content"].as_str().unwrap().to_owned()))
        .collect()
}

#[test]
fn ten_thousand_tool_calls_run_only_up_to_the_cap_and_the_model_sees_why() {
    let flood = streams::chat_tool_calls(10_000, "echo", r#"{"text":"hi"}"#, |k| format!("call_{k}"));
    let server = TestServer::start(vec![Reply::sse(flood), Reply::sse(fixtures::CHAT_TEXT)]).unwrap();
    let provider = http(&server, None);
    let cap = provider.max_tool_calls();
    assert_eq!(cap, cairn_core::provider::DEFAULT_MAX_TOOL_CALLS);
    let (tools, echo) = echo_registry();
    let mut session = Session::open(MemStore::new(Header::new("s", "/tmp")), SessionConfig::default()).unwrap();
    let (result, events) = turn(&mut session, &provider, &tools, Some("go"));
    let outcome = result.unwrap().unwrap();
    assert_eq!(outcome.stop, TurnStop::Answered);
    assert_eq!(echo.runs.load(Ordering::SeqCst), cap, "only the first {cap} calls ran");
    let store = session.store();
    assert_eq!(count(store, "toolCompleted"), cap);
    assert_eq!(count(store, "toolRejected"), 10_000 - cap);
    let state = healthy(store);
    assert_eq!(state.invocations.len(), 10_000, "every call has an invocation and one settlement");
    assert!(state.invocations[cap..].iter().all(|r| r.status == ToolInvocationStatus::Rejected));
    let rejected = events.iter().filter(|e| matches!(e, TurnEvent::ToolRejected { .. })).count();
    assert_eq!(rejected, 10_000 - cap);
    // The model got a result for every call; the refused ones say why.
    let results = results_sent(&server, 1);
    assert_eq!(results.len(), 10_000);
    let why = format!("asked for 10000 tool calls and at most {cap} run per message");
    assert!(results[..cap].iter().all(|(_, text)| text == "hi"));
    assert!(results[cap..].iter().all(|(_, text)| text.contains(&why)), "{:?}", results[cap]);
    assert_eq!(results[cap].0, format!("call_{cap}"));
}

#[test]
fn a_configured_cap_refuses_the_rest_in_one_commit_and_the_turn_goes_on() {
    let calls = streams::chat_tool_calls(5, "echo", r#"{"text":"x"}"#, |k| format!("call_{k}"));
    let server = TestServer::start(vec![Reply::sse(calls), Reply::sse(fixtures::CHAT_TEXT)]).unwrap();
    let (tools, echo) = echo_registry();
    let store = RecordingStore::new(MemStore::new(Header::new("s", "/tmp")));
    let mut session = Session::open(store, SessionConfig::default()).unwrap();
    let (result, _) = turn(&mut session, &http(&server, Some(2)), &tools, Some("go"));
    assert_eq!(result.unwrap().unwrap().stop, TurnStop::Answered);
    assert_eq!(echo.runs.load(Ordering::SeqCst), 2);
    let store = session.store();
    let rejected: Vec<_> = store.entries().into_iter().filter(|e| e.entry_type == "toolRejected").collect();
    assert_eq!(rejected.len(), 3);
    let payloads: Vec<Value> = rejected.iter().map(|e| e.payload.parse().unwrap()).collect();
    let ids: Vec<&str> = payloads.iter().map(|p| p["callId"].as_str().unwrap()).collect();
    assert_eq!(ids, ["call_2", "call_3", "call_4"]);
    assert!(payloads.iter().all(|p| p["reason"].as_str().unwrap().contains("at most 2 run per message")));
    healthy(store);
    // The three refusals landed in one commit.
    let rejected_after: Vec<usize> = store.snapshots.iter().map(|s| count(s, "toolRejected")).collect();
    assert!(rejected_after.windows(2).any(|w| w == [0, 3]), "{rejected_after:?}");
    assert_eq!(results_sent(&server, 1).len(), 5);
}

fn call(id: &str) -> ScriptCall {
    ScriptCall { id: id.to_owned(), name: "echo".to_owned(), arguments: json!({"text": id}) }
}

#[test]
fn duplicate_ids_from_any_provider_never_reach_the_log() {
    let (tools, echo) = echo_registry();
    let mut session = Session::open(MemStore::new(Header::new("s", "/tmp")), SessionConfig::default()).unwrap();
    // In process: the turn's own rule, whatever the provider.
    let dup = ScriptProvider::new(vec![ScriptLine { text: String::new(), tool_calls: vec![call("c1"), call("c1")] }]);
    let (result, events) = turn(&mut session, &dup, &tools, Some("go"));
    let Err(TurnError::Provider(e)) = result else { panic!("expected a provider error, got {result:?}") };
    assert_eq!(e.kind, ProviderErrorKind::Protocol);
    assert!(e.message.contains("\"c1\" for more than one call"), "{}", e.message);
    assert!(events.iter().any(|e| matches!(e, TurnEvent::ProviderFailed { .. })));
    assert_eq!(echo.runs.load(Ordering::SeqCst), 0);
    assert_eq!(count(session.store(), "message"), 1, "only the user's message is in the log");
    assert_eq!(count(session.store(), "toolRequested"), 0);
    assert_eq!(session.store().usage().len(), 1, "the refused answer's attempt is still accounted");
    assert_eq!(session.pc().phase, Phase::Planning, "the turn stays resumable");

    // Over HTTP the provider asks again first; a proper answer then runs.
    let dup_stream = streams::chat_tool_calls(2, "echo", r#"{"text":"y"}"#, |_| "same".to_owned());
    let good = streams::chat_tool_calls(2, "echo", r#"{"text":"y"}"#, |k| format!("call_{k}"));
    let server =
        TestServer::start(vec![Reply::sse(dup_stream), Reply::sse(good), Reply::sse(fixtures::CHAT_TEXT)]).unwrap();
    let mut c = ProviderConfig::new("h", ProviderKind::OpenAiChat);
    c.retry.initial_backoff = Duration::from_millis(1);
    let provider = HttpProvider::new(&c, format!("{}/v1", server.url()), None).unwrap();
    let (result, _) = turn(&mut session, &provider, &tools, None);
    assert_eq!(result.unwrap().unwrap().stop, TurnStop::Answered);
    assert_eq!(echo.runs.load(Ordering::SeqCst), 2);
    assert_eq!(server.requests().len(), 3);
    healthy(session.store());
}
