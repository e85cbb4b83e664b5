//! Integration tests: every adapter against the loopback test server that
//! speaks the real wire format (recorded streams in `tests/data/`, hostile
//! replies), with assertions on what cairn settled and on the requests it
//! sent. No network beyond 127.0.0.1; no timing assertions.
// Helpers outside #[test] functions unwrap too: this is test code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_core::CancelToken;
use cairn_core::message::{ContentPart, Message, Role, ToolCall};
use cairn_core::provider::{
    ModelRequest, ModelResponse, Provider, ProviderError, ProviderErrorKind, StopReason, StreamEvent,
};
use cairn_core::tool::{ReplayPolicy, Risk, ToolSpec};
use cairn_provider::{HttpProvider, ProviderConfig, ProviderKind, ScriptFileProvider, Secret, build};
use cairn_test_server::{Ending, Framing, Reply, Split, TestServer, fixtures, streams};
use serde_json::json;

const KEY: &str = "sk-test-0123456789abcdef-SECRET";

/// A recorded stream from the test-support crate's fixtures.
fn data(name: &str) -> String {
    fixtures::by_name(name).unwrap_or_else(|| panic!("no fixture {name}")).to_owned()
}

fn config(kind: ProviderKind) -> ProviderConfig {
    let mut c = ProviderConfig::new("test", kind);
    c.model = Some("test-model".into());
    c.retry.max_attempts = 3;
    c.retry.initial_backoff = Duration::from_millis(2);
    c.retry.max_backoff = Duration::from_millis(10);
    c.timeouts.connect = Duration::from_secs(5);
    c.timeouts.first_byte = Duration::from_secs(5);
    // Generous: a loaded CI machine must not turn a healthy stream into a timeout.
    c.timeouts.idle = Duration::from_secs(5);
    c.cancel_poll = Duration::from_millis(5);
    c
}

fn provider_with(config: &ProviderConfig, server: &TestServer) -> HttpProvider {
    let base = match config.kind {
        ProviderKind::Anthropic => server.url(),
        _ => format!("{}/v1", server.url()),
    };
    HttpProvider::new(config, base, Some(Secret::new(KEY))).unwrap()
}

fn provider(kind: ProviderKind, server: &TestServer) -> HttpProvider {
    provider_with(&config(kind), server)
}

fn tools() -> Vec<ToolSpec> {
    vec![ToolSpec {
        name: "shell".into(),
        description: "Run a command".into(),
        input_schema: json!({"type": "object", "properties": {"argv": {"type": "array", "items": {"type": "string"}}}}),
        risk: Risk::Write,
        capabilities: BTreeSet::new(),
        replay: ReplayPolicy::Never,
    }]
}

fn call(p: &dyn Provider, messages: &[Message]) -> (Result<ModelResponse, ProviderError>, Vec<StreamEvent>) {
    let tools = tools();
    let request = ModelRequest {
        system: Some("You are terse."),
        messages,
        tools: &tools,
        max_output_tokens: None,
        earlier_assistant_messages: 0,
        purpose: Default::default(),
    };
    let mut events = Vec::new();
    let result = p.complete(&request, &mut |e| events.push(e.clone()), &CancelToken::new());
    (result, events)
}

fn user(text: &str) -> Message {
    Message::text(Role::User, text)
}

fn tool_result(call_id: &str, content: &str) -> Message {
    Message {
        role: Role::Tool,
        content: vec![ContentPart::ToolResult { call_id: call_id.into(), content: content.into(), is_error: false }],
    }
}

fn text_deltas(events: &[StreamEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::TextDelta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

fn calls(message: &Message) -> Vec<ToolCall> {
    message.tool_calls().cloned().collect()
}

// ---------------------------------------------------------------- Chat Completions

#[test]
fn chat_text_stream_settles_and_request_has_the_wire_shape() {
    let server = TestServer::start(vec![Reply::sse(data("chat_text.sse"))]).unwrap();
    let p = provider(ProviderKind::OpenAiChat, &server);
    let (result, events) = call(&p, &[user("hi")]);
    let r = result.unwrap();
    assert_eq!(r.message.role, Role::Assistant);
    assert_eq!(r.message.joined_text(), "Hello! How can I help — café? ☕");
    assert_eq!(text_deltas(&events), r.message.joined_text());
    assert_eq!(events[0], StreamEvent::AttemptStarted { attempt: 1 });
    assert_eq!(r.stop, StopReason::EndTurn);
    assert_eq!(r.attempts.len(), 1);
    let row = &r.attempts[0];
    assert_eq!((row.input_tokens, row.output_tokens, row.status), (19, 10, Some(200)));
    assert_eq!((row.provider.as_str(), row.model.as_str(), row.attempt), ("test", "test-model", 1));

    let reqs = server.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].method, "POST");
    assert_eq!(reqs[0].path, "/v1/chat/completions");
    assert_eq!(reqs[0].header("authorization"), Some(format!("Bearer {KEY}").as_str()));
    let body = reqs[0].json();
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"]["include_usage"], true);
    assert_eq!(
        body["messages"],
        json!([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}])
    );
    assert_eq!(body["tools"][0]["type"], "function");
    assert_eq!(body["tools"][0]["function"]["name"], "shell");
    assert_eq!(body["tools"][0]["function"]["parameters"]["type"], "object");
}

#[test]
fn chat_tool_call_deltas_are_assembled_by_index() {
    let server = TestServer::start(vec![Reply::sse(data("chat_tool_calls.sse"))]).unwrap();
    let (result, events) = call(&provider(ProviderKind::OpenAiChat, &server), &[user("look")]);
    let r = result.unwrap();
    assert_eq!(r.stop, StopReason::ToolUse);
    assert_eq!(r.message.joined_text(), "Let me look.");
    let c = calls(&r.message);
    assert_eq!(c.len(), 2);
    assert_eq!(c[0].id, "call_DdmO9pD3xa9XTPNJ32zg2hcA");
    assert_eq!(c[0].name, "read_file");
    assert_eq!(c[0].arguments, json!({"path": "src/main.rs"}));
    assert_eq!(c[1].name, "shell");
    assert_eq!(c[1].arguments, json!({"argv": ["ls", "-la"]}));
    assert_eq!(r.attempts[0].cached_input_tokens, 128);
    // Observers saw each call start, then its argument text in pieces.
    let started: Vec<_> = events.iter().filter(|e| matches!(e, StreamEvent::ToolCallStarted { .. })).collect();
    assert_eq!(started.len(), 2);
    let args0: String = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::ToolCallDelta { id, arguments } if id == &c[0].id => Some(arguments.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(args0, "{\"path\": \"src/main.rs\"}");
}

#[test]
fn chunks_split_at_every_byte_give_the_same_answer() {
    let whole = TestServer::start(vec![Reply::sse(data("chat_tool_calls.sse"))]).unwrap();
    let (a, _) = call(&provider(ProviderKind::OpenAiChat, &whole), &[user("x")]);
    let bytes = TestServer::start(vec![Reply::sse(data("chat_tool_calls.sse")).split(Split::EveryByte)]).unwrap();
    let (b, events) = call(&provider(ProviderKind::OpenAiChat, &bytes), &[user("x")]);
    assert_eq!(a.unwrap().message, b.unwrap().message);
    assert!(events.iter().any(|e| matches!(e, StreamEvent::ToolCallDelta { .. })));
    // CRLF line ends, split in odd places, too.
    let crlf = data("anthropic_thinking_tool.sse").replace('\n', "\r\n");
    let s1 = TestServer::start(vec![Reply::sse(crlf).split(Split::Every(7))]).unwrap();
    let s2 = TestServer::start(vec![Reply::sse(data("anthropic_thinking_tool.sse"))]).unwrap();
    let (x, _) = call(&provider(ProviderKind::Anthropic, &s1), &[user("x")]);
    let (y, _) = call(&provider(ProviderKind::Anthropic, &s2), &[user("x")]);
    assert_eq!(x.unwrap().message, y.unwrap().message);
}

#[test]
fn tool_calls_without_ids_from_local_servers_get_unique_ones() {
    // llama.cpp-style: the whole call in one chunk, no id.
    let chunk = r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"shell","arguments":"{\"argv\":[\"pwd\"]}"}}]},"finish_reason":null}]}"#;
    let body = format!(
        "{}{}{}",
        streams::event("", chunk),
        streams::event("", r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#),
        streams::event("", "[DONE]")
    );
    let server = TestServer::start(vec![Reply::sse(body.clone()), Reply::sse(body)]).unwrap();
    let p = provider(ProviderKind::OpenAiChat, &server);
    let (a, _) = call(&p, &[user("x")]);
    let (b, _) = call(&p, &[user("x")]);
    let (a, b) = (calls(&a.unwrap().message), calls(&b.unwrap().message));
    assert_eq!(a[0].arguments, json!({"argv": ["pwd"]}));
    assert!(a[0].id.starts_with("call_0_") && a[0].id.len() > 10, "{}", a[0].id);
    assert_ne!(a[0].id, b[0].id);
}

// ---------------------------------------------------------------- Responses

#[test]
fn responses_reasoning_is_requested_kept_and_passed_back() {
    let server = TestServer::start(vec![
        Reply::sse(data("responses_reasoning_tool.sse")),
        Reply::sse(data("responses_text.sse")),
    ])
    .unwrap();
    let p = provider(ProviderKind::OpenAiResponses, &server);
    let (result, events) = call(&p, &[user("Weather in Paris?")]);
    let r = result.unwrap();
    assert_eq!(r.stop, StopReason::ToolUse);
    assert_eq!(text_deltas(&events), "Checking Paris now.");
    assert!(events.contains(&StreamEvent::ReasoningDelta { text: "**Checking the weather**".into() }));
    assert!(events.contains(&StreamEvent::ToolCallStarted {
        id: "call_aGh0dHBzOi8vZXhhbXBsZQ".into(),
        name: "get_weather".into()
    }));
    match &r.message.content[0] {
        ContentPart::Reasoning { text, provider, opaque: Some(opaque) } => {
            assert_eq!(text, "**Checking the weather**");
            assert_eq!(provider, "openai-responses");
            assert_eq!(opaque["encrypted_content"], "gAAAAABor0AwEncRyPtEdReAsOnInG==");
            assert!(opaque.get("id").is_none());
        }
        other => panic!("expected reasoning first, got {other:?}"),
    }
    assert_eq!(r.message.joined_text(), "Checking Paris now.");
    let c = calls(&r.message);
    assert_eq!(c[0].id, "call_aGh0dHBzOi8vZXhhbXBsZQ");
    assert_eq!(c[0].arguments, json!({"location": "Paris, France"}));
    assert_eq!((r.attempts[0].input_tokens, r.attempts[0].output_tokens), (75, 140));

    // Second turn: the history goes back, reasoning included.
    let history = vec![user("Weather in Paris?"), r.message.clone(), tool_result(&c[0].id, "18°C, clear")];
    let (second, _) = call(&p, &history);
    let second = second.unwrap();
    assert_eq!(second.message.joined_text(), "It is 18°C in Paris.");
    assert_eq!(second.stop, StopReason::EndTurn);
    assert_eq!(second.attempts[0].cached_input_tokens, 256);

    let reqs = server.requests();
    assert_eq!(reqs[0].path, "/v1/responses");
    let first = reqs[0].json();
    assert_eq!(first["store"], false);
    assert_eq!(first["include"], json!(["reasoning.encrypted_content"]));
    assert_eq!(first["instructions"], "You are terse.");
    assert_eq!(
        first["tools"][0],
        json!({"type": "function", "name": "shell", "description": "Run a command",
        "parameters": tools()[0].input_schema, "strict": false})
    );
    let input = &reqs[1].json()["input"];
    assert_eq!(
        input[0],
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]})
    );
    assert_eq!(input[1]["type"], "reasoning");
    assert_eq!(input[1]["encrypted_content"], "gAAAAABor0AwEncRyPtEdReAsOnInG==");
    assert_eq!(input[2]["content"][0], json!({"type": "output_text", "text": "Checking Paris now."}));
    assert_eq!(
        input[3],
        json!({"type": "function_call", "call_id": "call_aGh0dHBzOi8vZXhhbXBsZQ",
        "name": "get_weather", "arguments": "{\"location\":\"Paris, France\"}"})
    );
    assert_eq!(
        input[4],
        json!({"type": "function_call_output", "call_id": "call_aGh0dHBzOi8vZXhhbXBsZQ", "output": "18°C, clear"})
    );
}

#[test]
fn responses_failed_and_error_events_surface_the_message() {
    let failed = streams::event(
        "response.failed",
        r#"{"type":"response.failed","sequence_number":1,"response":{"id":"resp_1","status":"failed","error":{"code":"invalid_prompt","message":"Your prompt was flagged."},"usage":null}}"#,
    );
    let server = TestServer::start(vec![Reply::sse(failed)]).unwrap();
    let (result, _) = call(&provider(ProviderKind::OpenAiResponses, &server), &[user("x")]);
    let e = result.unwrap_err();
    assert!(e.message.contains("Your prompt was flagged."), "{}", e.message);
    assert_eq!(server.requests().len(), 1, "not retryable");
}

// ---------------------------------------------------------------- Anthropic

#[test]
fn anthropic_thinking_text_and_tool_use_with_signature_passed_back() {
    let server = TestServer::start(vec![
        Reply::sse(data("anthropic_thinking_tool.sse")),
        Reply::sse(data("anthropic_text.sse")),
    ])
    .unwrap();
    let p = provider(ProviderKind::Anthropic, &server);
    let (result, events) = call(&p, &[user("list it")]);
    let r = result.unwrap();
    assert_eq!(r.stop, StopReason::ToolUse);
    let reasoning: String = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::ReasoningDelta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(reasoning, "The user wants the file listed. I should call shell.");
    match &r.message.content[0] {
        ContentPart::Reasoning { provider, opaque: Some(o), .. } => {
            assert_eq!(provider, "anthropic");
            assert_eq!(o["signature"], "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds");
            assert_eq!(o["thinking"], "The user wants the file listed. I should call shell.");
        }
        other => panic!("expected thinking first, got {other:?}"),
    }
    assert_eq!(r.message.joined_text(), "I'll list the directory.");
    let c = calls(&r.message);
    assert_eq!((c[0].id.as_str(), c[0].name.as_str()), ("toolu_01T1x1fJ34qAmk2tNTrN7Up6", "shell"));
    assert_eq!(c[0].arguments, json!({"argv": ["ls"]}));
    let row = &r.attempts[0];
    assert_eq!((row.input_tokens, row.cached_input_tokens, row.output_tokens), (572, 100, 89));

    let history = vec![user("list it"), r.message.clone(), tool_result(&c[0].id, "a.txt\nb.txt")];
    let (second, _) = call(&p, &history);
    assert_eq!(second.unwrap().message.joined_text(), "The directory holds two files.");

    let reqs = server.requests();
    assert_eq!(reqs[0].path, "/v1/messages");
    assert_eq!(reqs[0].header("x-api-key"), Some(KEY));
    assert_eq!(reqs[0].header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(reqs[0].header("authorization"), None);
    let first = reqs[0].json();
    assert_eq!(first["system"], "You are terse.");
    assert_eq!(first["max_tokens"], 8192);
    assert_eq!(first["stream"], true);
    assert_eq!(first["tools"][0]["input_schema"]["type"], "object");
    let messages = &reqs[1].json()["messages"];
    assert_eq!(messages[1]["role"], "assistant");
    assert_eq!(
        messages[1]["content"][0],
        json!({"type": "thinking",
        "thinking": "The user wants the file listed. I should call shell.",
        "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"})
    );
    assert_eq!(messages[1]["content"][1], json!({"type": "text", "text": "I'll list the directory."}));
    assert_eq!(
        messages[1]["content"][2],
        json!({"type": "tool_use", "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
        "name": "shell", "input": {"argv": ["ls"]}})
    );
    assert_eq!(
        messages[2],
        json!({"role": "user", "content": [{"type": "tool_result",
        "tool_use_id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "content": "a.txt\nb.txt", "is_error": false}]})
    );
}

#[test]
fn anthropic_overloaded_529_then_success_and_error_event_retried() {
    let overloaded = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    let mid_stream_error = format!(
        "{}{}",
        streams::event(
            "message_start",
            r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":5,"output_tokens":1}}}"#
        ),
        streams::event("error", &overloaded.to_string())
    );
    let server = TestServer::start(vec![
        Reply::json(529, &overloaded),
        Reply::sse(mid_stream_error),
        Reply::sse(data("anthropic_text.sse")),
    ])
    .unwrap();
    let (result, events) = call(&provider(ProviderKind::Anthropic, &server), &[user("x")]);
    let r = result.unwrap();
    assert_eq!(r.message.joined_text(), "The directory holds two files.");
    assert_eq!(r.attempts.len(), 3);
    assert_eq!(r.attempts[0].status, Some(529));
    assert!(r.attempts[0].error.as_deref().unwrap().contains("Overloaded"));
    assert!(r.attempts[1].error.as_deref().unwrap().contains("overloaded_error"));
    assert_eq!(r.attempts[1].input_tokens, 5, "usage of a failed attempt is still accounted");
    assert_eq!(r.attempts[2].error, None);
    let starts: Vec<_> = events.iter().filter(|e| matches!(e, StreamEvent::AttemptStarted { .. })).collect();
    assert_eq!(starts.len(), 3);
}

#[test]
fn anthropic_tool_input_given_whole_in_block_start_is_kept() {
    let body = [
        streams::event("message_start", r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":3,"output_tokens":1}}}"#),
        streams::event(
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"shell","input":{"argv":["id"]}}}"#,
        ),
        streams::event("content_block_stop", r#"{"type":"content_block_stop","index":0}"#),
        streams::event("message_delta", r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":7}}"#),
        streams::event("message_stop", r#"{"type":"message_stop"}"#),
    ]
    .concat();
    let server = TestServer::start(vec![Reply::sse(body)]).unwrap();
    let (r, _) = call(&provider(ProviderKind::Anthropic, &server), &[user("x")]);
    let r = r.unwrap();
    assert_eq!(calls(&r.message)[0].arguments, json!({"argv": ["id"]}));
    assert_eq!(r.stop, StopReason::ToolUse);
}

// ---------------------------------------------------------------- switching provider

#[test]
fn session_moves_from_chat_completions_to_anthropic_with_tool_calls_carried_over() {
    let chat = TestServer::start(vec![Reply::sse(data("chat_tool_calls.sse"))]).unwrap();
    let anthropic = TestServer::start(vec![Reply::sse(data("anthropic_text.sse"))]).unwrap();
    let (first, _) = call(&provider(ProviderKind::OpenAiChat, &chat), &[user("look around")]);
    let first = first.unwrap();
    let c = calls(&first.message);
    let history = vec![
        user("look around"),
        first.message.clone(),
        tool_result(&c[0].id, "fn main() {}"),
        Message {
            role: Role::Tool,
            content: vec![ContentPart::ToolResult {
                call_id: c[1].id.clone(),
                content: "denied".into(),
                is_error: true,
            }],
        },
        user("and now?"),
    ];
    let (second, _) = call(&provider(ProviderKind::Anthropic, &anthropic), &history);
    assert_eq!(second.unwrap().message.joined_text(), "The directory holds two files.");

    let body = anthropic.requests()[0].json();
    assert_eq!(body["system"], "You are terse.");
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "look around"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "call_DdmO9pD3xa9XTPNJ32zg2hcA", "name": "read_file", "input": {"path": "src/main.rs"}},
                {"type": "tool_use", "id": "call_Kx2bq8Yd0Z1lLw8R3aT5mE7c", "name": "shell", "input": {"argv": ["ls", "-la"]}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_DdmO9pD3xa9XTPNJ32zg2hcA", "content": "fn main() {}", "is_error": false},
                {"type": "tool_result", "tool_use_id": "call_Kx2bq8Yd0Z1lLw8R3aT5mE7c", "content": "denied", "is_error": true},
                {"type": "text", "text": "and now?"}
            ]}
        ])
    );
}

#[test]
fn reasoning_of_one_provider_kind_never_reaches_another() {
    let anthropic = TestServer::start(vec![Reply::sse(data("anthropic_thinking_tool.sse"))]).unwrap();
    let (first, _) = call(&provider(ProviderKind::Anthropic, &anthropic), &[user("x")]);
    let first = first.unwrap();
    let id = calls(&first.message)[0].id.clone();
    let history = vec![user("x"), first.message, tool_result(&id, "ok")];
    for kind in [ProviderKind::OpenAiChat, ProviderKind::OpenAiResponses] {
        let fixture = if kind == ProviderKind::OpenAiChat { "chat_text.sse" } else { "responses_text.sse" };
        let server = TestServer::start(vec![Reply::sse(data(fixture))]).unwrap();
        let (r, _) = call(&provider(kind, &server), &history);
        r.unwrap();
        let sent = String::from_utf8(server.requests()[0].body.clone()).unwrap();
        assert!(!sent.contains("EqQBCgIYAhIM"), "{kind:?} got an Anthropic signature: {sent}");
        assert!(!sent.contains("thinking"), "{kind:?}: {sent}");
        assert!(sent.contains("toolu_01T1x1fJ34qAmk2tNTrN7Up6"), "the tool call itself is carried over");
    }
}

// ---------------------------------------------------------------- hostile servers

fn cut_reply(fixture: &str) -> Reply {
    let body = data(fixture);
    // Cut in the middle of the third event's JSON.
    let third = body.match_indices("data:").nth(2).unwrap().0;
    Reply::sse(body).ending(Ending::CutAt(third + 20))
}

#[test]
fn stream_cut_mid_event_is_retried_and_nothing_half_settled() {
    let server = TestServer::start(vec![cut_reply("chat_text.sse"), Reply::sse(data("chat_text.sse"))]).unwrap();
    let (result, events) = call(&provider(ProviderKind::OpenAiChat, &server), &[user("x")]);
    let r = result.unwrap();
    assert_eq!(r.message.joined_text(), "Hello! How can I help — café? ☕");
    assert_eq!(r.attempts.len(), 2);
    assert!(r.attempts[0].error.is_some());
    // The observer saw the restart and can drop the first attempt's deltas.
    let restart = events.iter().position(|e| e == &StreamEvent::AttemptStarted { attempt: 2 }).unwrap();
    assert_eq!(text_deltas(&events[restart..]), r.message.joined_text());
}

#[test]
fn stream_cut_every_time_gives_a_clear_error_with_every_attempt_accounted() {
    for (kind, fixture) in [
        (ProviderKind::OpenAiChat, "chat_text.sse"),
        (ProviderKind::OpenAiResponses, "responses_reasoning_tool.sse"),
        (ProviderKind::Anthropic, "anthropic_thinking_tool.sse"),
    ] {
        let server = TestServer::start(vec![cut_reply(fixture), cut_reply(fixture), cut_reply(fixture)]).unwrap();
        let (result, _) = call(&provider(kind, &server), &[user("x")]);
        let e = result.unwrap_err();
        assert_eq!(e.kind, ProviderErrorKind::Connection, "{kind:?}: {e}");
        assert!(e.message.contains("gave up after 3 attempts"), "{}", e.message);
        assert_eq!(e.attempts.len(), 3);
        assert!(e.attempts.iter().all(|a| a.error.is_some() && a.status == Some(200)));
        assert_eq!(server.requests().len(), 3);
    }
}

#[test]
fn clean_close_mid_event_is_a_cut_too() {
    let body = data("anthropic_text.sse");
    let cut = body.len() - 12;
    let reply = || Reply::sse(body.clone()).framing(Framing::CloseDelimited).ending(Ending::CutAt(cut));
    let server = TestServer::start(vec![reply(), reply(), reply()]).unwrap();
    let (result, _) = call(&provider(ProviderKind::Anthropic, &server), &[user("x")]);
    let e = result.unwrap_err();
    assert!(e.message.contains("middle of an event"), "{}", e.message);
}

#[test]
fn invalid_json_in_a_delta_is_a_protocol_error_without_retry() {
    let body = data("chat_text.sse").replacen("{\"content\":\"Hello\"}", "{\"content\":\"Hello\"", 1);
    let server = TestServer::start(vec![Reply::sse(body)]).unwrap();
    let (result, _) = call(&provider(ProviderKind::OpenAiChat, &server), &[user("x")]);
    let e = result.unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Protocol);
    assert!(e.message.contains("invalid JSON"), "{}", e.message);
    assert_eq!(e.attempts.len(), 1);
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn a_50_mb_delta_is_refused_with_a_clear_error() {
    let server =
        TestServer::start(vec![Reply::sse(streams::huge_chat_delta(50 << 20)).split(Split::Every(1 << 20))]).unwrap();
    let (result, _) = call(&provider(ProviderKind::OpenAiChat, &server), &[user("x")]);
    let e = result.unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Protocol);
    assert!(e.message.contains("grew past 16777216 bytes"), "{}", e.message);
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn a_large_delta_under_the_bound_is_accepted() {
    let server = TestServer::start(vec![Reply::sse(streams::huge_chat_delta(3 << 20))]).unwrap();
    let (result, _) = call(&provider(ProviderKind::OpenAiChat, &server), &[user("x")]);
    assert_eq!(result.unwrap().message.joined_text().len(), 3 << 20);
}

#[test]
fn missing_done_after_finish_reason_still_settles() {
    let body = data("chat_text.sse").replace("data: [DONE]\n\n", "");
    let server = TestServer::start(vec![Reply::sse(body)]).unwrap();
    let (result, _) = call(&provider(ProviderKind::OpenAiChat, &server), &[user("x")]);
    let r = result.unwrap();
    assert_eq!(r.stop, StopReason::EndTurn);
    assert_eq!(r.attempts[0].output_tokens, 10);
}

#[test]
fn missing_done_and_finish_reason_is_an_error() {
    let body = data("chat_text.sse");
    let end = body.find("data: {\"id\":\"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT\",\"object\":\"chat.completion.chunk\",\"created\":1741569952,\"model\":\"gpt-4.1-2025-04-14\",\"service_tier\":\"default\",\"system_fingerprint\":\"fp_3b3b3b3b3b\",\"choices\":[{\"index\":0,\"delta\":{},").unwrap();
    let truncated = body[..end].to_owned();
    let mut c = config(ProviderKind::OpenAiChat);
    c.retry.max_attempts = 2;
    let server = TestServer::start(vec![Reply::sse(truncated.clone()), Reply::sse(truncated)]).unwrap();
    let (result, _) = call(&provider_with(&c, &server), &[user("x")]);
    let e = result.unwrap_err();
    assert!(e.message.contains("no finish_reason and no [DONE]"), "{}", e.message);
    assert_eq!(e.attempts.len(), 2);
}

#[test]
fn a_server_that_stalls_after_the_headers_times_out() {
    let mut c = config(ProviderKind::Anthropic);
    c.retry.max_attempts = 2;
    c.timeouts.idle = Duration::from_millis(200);
    let stall = || Reply::sse("").ending(Ending::StallAfterHeaders(Duration::from_secs(30)));
    let server = TestServer::start(vec![stall(), stall()]).unwrap();
    let (result, _) = call(&provider_with(&c, &server), &[user("x")]);
    let e = result.unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Timeout);
    assert!(e.message.contains("idle timeout"), "{}", e.message);
    assert_eq!(e.attempts.len(), 2);
}

#[test]
fn a_stream_that_never_ends_after_its_last_event_times_out_unless_terminal() {
    // Anthropic: message_stop arrived, then silence: settled at message_stop.
    let server = TestServer::start(vec![
        Reply::sse(data("anthropic_text.sse")).ending(Ending::StallAtEnd(Duration::from_secs(30))),
    ])
    .unwrap();
    let (result, _) = call(&provider(ProviderKind::Anthropic, &server), &[user("x")]);
    assert_eq!(result.unwrap().message.joined_text(), "The directory holds two files.");
}

#[test]
fn rate_limit_429_with_retry_after_then_success() {
    let limited = json!({"error": {"message": "Rate limit reached for gpt-5-mini", "type": "requests", "code": "rate_limit_exceeded"}});
    let server = TestServer::start(vec![
        Reply::json(429, &limited).header("retry-after", "1"),
        Reply::json(429, &limited).header("retry-after-ms", "5"),
        Reply::sse(data("chat_text.sse")),
    ])
    .unwrap();
    let (result, _) = call(&provider(ProviderKind::OpenAiChat, &server), &[user("x")]);
    let r = result.unwrap();
    assert_eq!(r.attempts.len(), 3);
    assert_eq!(r.attempts[0].status, Some(429));
    assert!(r.attempts[0].error.as_deref().unwrap().contains("Rate limit reached"));
    assert_eq!(r.attempts[2].status, Some(200));
    assert_eq!(server.requests().len(), 3);
}

#[test]
fn retry_after_longer_than_the_limit_gives_up_at_once() {
    let mut c = config(ProviderKind::OpenAiChat);
    c.retry.max_retry_after = Duration::from_secs(2);
    let server = TestServer::start(vec![
        Reply::json(429, &json!({"error": {"message": "slow down"}})).header("retry-after", "3600"),
    ])
    .unwrap();
    let (result, _) = call(&provider_with(&c, &server), &[user("x")]);
    let e = result.unwrap_err();
    assert!(e.message.contains("retry after 3600s"), "{}", e.message);
    assert_eq!(e.status, Some(429));
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn html_error_page_is_described_and_retried() {
    let page = "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n";
    let server =
        TestServer::start(vec![Reply::html(502, page), Reply::html(502, page), Reply::html(502, page)]).unwrap();
    let (result, _) = call(&provider(ProviderKind::OpenAiResponses, &server), &[user("x")]);
    let e = result.unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Http);
    assert_eq!(e.status, Some(502));
    assert!(
        e.message.contains("HTTP 502") && e.message.contains("HTML page titled \"502 Bad Gateway\""),
        "{}",
        e.message
    );
    assert_eq!(e.attempts.len(), 3);
    // An HTML page with status 200 (a captive portal, a wrong base URL).
    let server = TestServer::start(vec![Reply::html(200, page)]).unwrap();
    let (result, _) = call(&provider(ProviderKind::OpenAiChat, &server), &[user("x")]);
    let e = result.unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Protocol);
    assert!(e.message.contains("check the base URL"), "{}", e.message);
}

#[test]
fn non_retryable_error_surfaces_the_provider_message_and_status() {
    let body = json!({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: 999999 > 64000, which is the maximum allowed"}});
    let server = TestServer::start(vec![Reply::json(400, &body)]).unwrap();
    let (result, _) = call(&provider(ProviderKind::Anthropic, &server), &[user("x")]);
    let e = result.unwrap_err();
    assert_eq!(e.status, Some(400));
    assert_eq!(e.kind, ProviderErrorKind::Http);
    assert!(e.message.contains("HTTP 400 Bad Request: max_tokens: 999999 > 64000"), "{}", e.message);
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn secrets_never_appear_in_errors_rows_or_debug_output() {
    // A server that echoes the key back in its error.
    let echo = json!({"error": {"message": format!("Incorrect API key provided: {KEY}."), "type": "invalid_request_error", "code": "invalid_api_key"}});
    let server = TestServer::start(vec![Reply::json(401, &echo)]).unwrap();
    let p = provider(ProviderKind::OpenAiChat, &server);
    let (result, _) = call(&p, &[user("x")]);
    let e = result.unwrap_err();
    assert_eq!(e.status, Some(401));
    assert!(e.message.contains("Incorrect API key provided: [redacted]"), "{}", e.message);
    let everything = format!("{e} {e:?} {:?} {p:?}", e.attempts);
    assert!(!everything.contains(KEY), "{everything}");
    assert!(!everything.contains("0123456789abcdef"), "{everything}");
    // And the key did go to the server, in its header only.
    assert_eq!(server.requests()[0].header("authorization"), Some(format!("Bearer {KEY}").as_str()));
    assert!(!String::from_utf8_lossy(&server.requests()[0].body).contains(KEY));
}

#[test]
fn connection_refused_is_retried_then_reported() {
    // Bind then drop a listener: its port is (almost certainly) closed now.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut c = config(ProviderKind::OpenAiChat);
    c.retry.max_attempts = 2;
    let p = HttpProvider::new(&c, format!("http://127.0.0.1:{port}/v1"), None).unwrap();
    let (result, _) = call(&p, &[user("x")]);
    let e = result.unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Connection);
    assert_eq!(e.attempts.len(), 2);
    assert!(e.attempts.iter().all(|a| a.status.is_none()));
}

#[test]
fn cancellation_aborts_a_stalled_request() {
    let mut c = config(ProviderKind::OpenAiChat);
    c.timeouts.idle = Duration::from_secs(60);
    let server =
        TestServer::start(vec![Reply::sse("").ending(Ending::StallAfterHeaders(Duration::from_secs(60)))]).unwrap();
    let p = provider_with(&c, &server);
    let cancel = CancelToken::new();
    let canceller = {
        let cancel = cancel.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            cancel.cancel();
        })
    };
    let messages = [user("x")];
    let request = ModelRequest {
        system: None,
        messages: &messages,
        tools: &[],
        max_output_tokens: Some(5),
        earlier_assistant_messages: 0,
        purpose: Default::default(),
    };
    let e = p.complete(&request, &mut |_| {}, &cancel).unwrap_err();
    canceller.join().unwrap();
    assert_eq!(e.kind, ProviderErrorKind::Cancelled);
    assert_eq!(e.attempts.len(), 1);
    assert_eq!(server.requests()[0].json()["max_tokens"], 5, "a local server gets max_tokens");
}

#[test]
fn cancelling_mid_stream_closes_the_connection() {
    // A slow model: one event every 50 ms, many events to go.
    let body: String = (0..200)
        .map(|i| streams::event("", &format!("{{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i} \"}}}}]}}")))
        .collect();
    let server = TestServer::start(vec![Reply::sse(body).pace(Duration::from_millis(50))]).unwrap();
    let p = provider(ProviderKind::OpenAiChat, &server);
    let cancel = CancelToken::new();
    let messages = [user("x")];
    let request = ModelRequest {
        system: None,
        messages: &messages,
        tools: &[],
        max_output_tokens: None,
        earlier_assistant_messages: 0,
        purpose: Default::default(),
    };
    let mut seen = 0;
    // The observer cancels after the second delta: no clock involved.
    let e = p
        .complete(
            &request,
            &mut |e| {
                if matches!(e, StreamEvent::TextDelta { .. }) {
                    seen += 1;
                    if seen == 2 {
                        cancel.cancel();
                    }
                }
            },
            &cancel,
        )
        .unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Cancelled);
    assert_eq!(seen, 2);
    // The server notices the closed connection on its next writes (bounded wait).
    for _ in 0..200 {
        if server.client_aborts() == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert_eq!(server.client_aborts(), 1, "the connection was not closed after cancellation");
}

#[test]
fn an_already_cancelled_token_sends_nothing() {
    let server = TestServer::start(vec![Reply::sse(data("chat_text.sse"))]).unwrap();
    let cancel = CancelToken::new();
    cancel.cancel();
    let messages = [user("x")];
    let request = ModelRequest {
        system: None,
        messages: &messages,
        tools: &[],
        max_output_tokens: None,
        earlier_assistant_messages: 0,
        purpose: Default::default(),
    };
    let e = provider(ProviderKind::OpenAiChat, &server).complete(&request, &mut |_| {}, &cancel).unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Cancelled);
    assert!(server.requests().is_empty());
}

#[test]
fn reasoning_options_reach_each_request_body() {
    let table: toml::Value = toml::from_str(
        "reasoning_effort = \"high\"\nthinking_budget_tokens = 10000\nmax_output_tokens = 4096\nencrypted_reasoning = false",
    )
    .unwrap();
    for (kind, fixture) in [
        (ProviderKind::OpenAiChat, "chat_text.sse"),
        (ProviderKind::OpenAiResponses, "responses_text.sse"),
        (ProviderKind::Anthropic, "anthropic_text.sse"),
    ] {
        let mut c = ProviderConfig::from_toml(
            "r",
            &toml::Value::Table({
                let mut t = table.as_table().unwrap().clone();
                let kind_name = match kind {
                    ProviderKind::OpenAiChat => "openai-chat",
                    ProviderKind::OpenAiResponses => "openai-responses",
                    _ => "anthropic",
                };
                t.insert("kind".into(), toml::Value::String(kind_name.into()));
                t
            }),
        )
        .unwrap();
        c.model = Some("m".into());
        let server = TestServer::start(vec![Reply::sse(data(fixture))]).unwrap();
        let (r, _) = call(&provider_with(&c, &server), &[user("x")]);
        r.unwrap();
        let body = server.requests()[0].json();
        match kind {
            ProviderKind::OpenAiChat => assert_eq!(body["reasoning_effort"], "high"),
            ProviderKind::OpenAiResponses => {
                assert_eq!(body["reasoning"], json!({"effort": "high", "summary": "auto"}));
                assert!(body.get("include").is_none(), "encrypted_reasoning = false drops the include");
            }
            _ => {
                assert_eq!(body["thinking"], json!({"type": "enabled", "budget_tokens": 10000}));
                assert_eq!(body["max_tokens"], 11024, "raised above the thinking budget");
            }
        }
    }
}

// ---------------------------------------------------------------- config → build → call

#[test]
fn a_config_table_builds_a_working_provider() {
    let server = TestServer::start(vec![Reply::sse(data("anthropic_text.sse"))]).unwrap();
    let table: toml::Value = toml::from_str(&format!(
        "kind = \"anthropic\"\nbase_url = \"{}\"\nmodel = \"claude-x\"\napi_key_env = \"MY_KEY\"\nmax_attempts = 1",
        server.url()
    ))
    .unwrap();
    let config = ProviderConfig::resolve("mine", Some(&table)).unwrap();
    let env = |k: &str| (k == "MY_KEY").then(|| KEY.to_owned());
    let p = build(&config, &env).unwrap();
    assert_eq!((p.name(), p.model()), ("mine", "claude-x"));
    let (result, _) = call(p.as_ref(), &[user("x")]);
    result.unwrap();
    let req = &server.requests()[0];
    assert_eq!(req.header("x-api-key"), Some(KEY));
    assert_eq!(req.json()["model"], "claude-x");
}

#[test]
fn builtin_openai_honours_openai_base_url() {
    let server = TestServer::start(vec![Reply::sse(data("chat_text.sse"))]).unwrap();
    let base = format!("{}/v1", server.url());
    let env = |k: &str| match k {
        "OPENAI_BASE_URL" => Some(base.clone()),
        "OPENAI_API_KEY" => Some(KEY.to_owned()),
        _ => None,
    };
    let p = build(&ProviderConfig::builtin("openai").unwrap(), &env).unwrap();
    let (result, _) = call(p.as_ref(), &[user("x")]);
    result.unwrap();
    assert_eq!(server.requests()[0].path, "/v1/chat/completions");
}

// ---------------------------------------------------------------- scripted

fn script_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/script.jsonl")
}

#[test]
fn scripted_answers_line_k_for_k_assistant_messages() {
    let p = ScriptFileProvider::from_file("scripted", &script_path()).unwrap();
    assert_eq!(p.len(), 3);
    let (r, events) = call(&p, &[user("go")]);
    let r = r.unwrap();
    assert_eq!(r.message.joined_text(), "I'll look at the files.");
    assert_eq!(text_deltas(&events), "I'll look at the files.");
    assert!(events.iter().filter(|e| matches!(e, StreamEvent::TextDelta { .. })).count() > 1, "streamed in pieces");
    assert_eq!(r.stop, StopReason::ToolUse);
    assert_eq!(calls(&r.message)[0].arguments, json!({"path": "."}));
    assert_eq!(r.attempts.len(), 1);

    // A resumed session with one settled assistant message gets line 2.
    let history = vec![user("go"), r.message.clone(), tool_result("call_1", "a.txt b.txt")];
    let (r2, _) = call(&p, &history);
    let r2 = r2.unwrap();
    assert_eq!(r2.message.joined_text(), "Two files: a.txt and b.txt.");
    assert_eq!(r2.stop, StopReason::EndTurn);

    let history = vec![user("go"), r.message.clone(), r2.message.clone(), user("read them")];
    let (r3, _) = call(&p, &history);
    let r3 = r3.unwrap();
    assert_eq!(calls(&r3.message).len(), 2);
    assert_eq!(r3.message.joined_text(), "");

    let mut longer = history.clone();
    longer.push(r3.message);
    let (r4, _) = call(&p, &longer);
    let e = r4.unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Exhausted);
    assert!(e.message.contains("script.jsonl") && e.message.contains("has 3 turn(s)"), "{}", e.message);
    assert_eq!(e.attempts.len(), 1);
}

#[test]
fn scripted_malformed_line_names_file_and_line() {
    let dir = std::env::temp_dir().join(format!("cairn-provider-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.jsonl");
    std::fs::write(&path, "{\"text\": \"ok\"}\n{\"text\": \"no end\"\n").unwrap();
    let mut c = ProviderConfig::builtin("scripted").unwrap();
    c.script = Some(path.clone());
    let e = build(&c, &|_| None).err().unwrap();
    let shown = e.to_string();
    assert!(shown.contains("bad.jsonl") && shown.contains("line 2"), "{shown}");
    std::fs::write(&path, "{\"txt\": \"typo\"}\n").unwrap();
    let e = build(&c, &|_| None).err().unwrap();
    assert!(e.to_string().contains("line 1"), "{e}");
    let missing = ScriptFileProvider::from_file("s", &dir.join("nope.jsonl")).unwrap_err();
    assert!(missing.to_string().contains("cannot read"), "{missing}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn scripted_is_built_from_its_config() {
    let mut c = ProviderConfig::builtin("scripted").unwrap();
    c.script = Some(script_path());
    let p = build(&c, &|_| None).unwrap();
    assert_eq!(p.name(), "scripted");
    let (r, _) = call(p.as_ref(), &[user("go")]);
    assert_eq!(r.unwrap().message.joined_text(), "I'll look at the files.");
}

// ---------------------------------------------------------------- limits on hostile servers

/// A config whose attempt timeouts are short, for servers that never answer.
fn hostile_config(kind: ProviderKind) -> ProviderConfig {
    let mut c = config(kind);
    c.retry.max_attempts = 2;
    c.timeouts.idle = Duration::from_millis(600);
    c
}

#[test]
fn keepalives_and_events_without_content_do_not_reset_the_idle_timeout() {
    // Each server sends something every 100 ms for a minute, never content.
    let paced = |body: String| Reply::sse(body).pace(Duration::from_millis(100));
    for (kind, body) in [
        (ProviderKind::OpenAiChat, streams::keepalives(600)),
        (ProviderKind::OpenAiChat, streams::chat_empty_chunks(600)),
        (ProviderKind::Anthropic, streams::anthropic_pings(600)),
    ] {
        let server = TestServer::start(vec![paced(body.clone()), paced(body)]).unwrap();
        let started = std::time::Instant::now();
        let (result, events) = call(&provider_with(&hostile_config(kind), &server), &[user("x")]);
        let e = result.unwrap_err();
        assert_eq!(e.kind, ProviderErrorKind::Timeout, "{kind:?}: {e}");
        assert!(e.message.contains("idle timeout") && e.message.contains("keepalives"), "{}", e.message);
        assert_eq!(e.attempts.len(), 2, "an idle timeout is retried");
        assert!(events.iter().all(|e| matches!(e, StreamEvent::AttemptStarted { .. })), "{events:?}");
        // Sanity only (the streams last a minute each): the keepalives did not keep the call open.
        assert!(started.elapsed() < Duration::from_secs(50), "{:?}", started.elapsed());
    }
}

#[test]
fn a_byte_every_two_seconds_is_cut_by_the_total_time_limit_and_not_retried() {
    let mut c = config(ProviderKind::OpenAiChat);
    c.timeouts.idle = Duration::from_secs(60);
    c.timeouts.total = Duration::from_secs(3);
    let trickle = || Reply::sse(data("chat_text.sse")).split(Split::EveryByte).pace(Duration::from_secs(2));
    let server = TestServer::start(vec![trickle(), trickle(), trickle()]).unwrap();
    let (result, _) = call(&provider_with(&c, &server), &[user("x")]);
    let e = result.unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Timeout);
    assert!(e.message.contains("total time limit of 3 s"), "{}", e.message);
    assert_eq!(e.attempts.len(), 1, "the total limit leaves nothing to retry with");
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn content_that_keeps_trickling_in_is_still_bounded_by_the_total_time_limit() {
    // A byte of text every 100 ms satisfies the idle timeout forever.
    let mut c = config(ProviderKind::OpenAiChat);
    c.timeouts.idle = Duration::from_secs(2);
    c.timeouts.total = Duration::from_millis(2500);
    let server =
        TestServer::start(vec![Reply::sse(streams::chat_text_deltas(100_000, 1)).pace(Duration::from_millis(100))])
            .unwrap();
    let (result, events) = call(&provider_with(&c, &server), &[user("x")]);
    let e = result.unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Timeout);
    assert!(e.message.contains("total time limit"), "{}", e.message);
    assert!(text_deltas(&events).len() > 2, "content was flowing: {}", text_deltas(&events).len());
}

#[test]
fn a_server_that_trickles_an_error_body_is_bounded_too() {
    let mut c = config(ProviderKind::OpenAiChat);
    c.timeouts.total = Duration::from_secs(2);
    let body = "x".repeat(50_000);
    let server = TestServer::start(vec![
        Reply::body(500, "text/plain", body).split(Split::EveryByte).pace(Duration::from_millis(50)),
    ])
    .unwrap();
    let (result, _) = call(&provider_with(&c, &server), &[user("x")]);
    let e = result.unwrap_err();
    assert_eq!(e.status, Some(500));
    assert!(e.message.contains("no time is left"), "{}", e.message);
}

#[test]
fn an_answer_past_max_response_bytes_is_refused_without_retry() {
    let mut c = config(ProviderKind::OpenAiChat);
    c.max_response_bytes = 64 * 1024;
    // 200 deltas of 1 KiB: each event is small, the answer is not.
    let body = streams::chat_text_deltas(200, 1024);
    let server = TestServer::start(vec![Reply::sse(body.clone()), Reply::sse(body)]).unwrap();
    let (result, events) = call(&provider_with(&c, &server), &[user("x")]);
    let e = result.unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Protocol);
    assert!(e.message.contains("max_response_bytes"), "{}", e.message);
    assert_eq!(server.requests().len(), 1, "not retried");
    let seen = text_deltas(&events).len();
    assert!(seen <= 64 * 1024 + 1024, "the observer got {seen} bytes");
}

#[test]
fn content_held_but_not_streamed_counts_too() {
    // Responses: whole output items without deltas.
    let item = |i: usize| {
        streams::event(
            "response.output_item.done",
            &json!({"type": "response.output_item.done", "output_index": i,
                "item": {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "b".repeat(1000)}]}})
            .to_string(),
        )
    };
    let body: String = (0..100).map(item).collect();
    let mut c = config(ProviderKind::OpenAiResponses);
    c.max_response_bytes = 16 * 1024;
    let server = TestServer::start(vec![Reply::sse(body)]).unwrap();
    let (result, _) = call(&provider_with(&c, &server), &[user("x")]);
    let e = result.unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Protocol);
    assert!(e.message.contains("max_response_bytes"), "{}", e.message);
    // Anthropic: signature deltas are kept, never streamed.
    let mut body = streams::event(
        "content_block_start",
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}"#,
    );
    for _ in 0..100 {
        let delta = json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "s".repeat(1000)}});
        body.push_str(&streams::event("content_block_delta", &delta.to_string()));
    }
    let mut c = config(ProviderKind::Anthropic);
    c.max_response_bytes = 16 * 1024;
    let server = TestServer::start(vec![Reply::sse(body)]).unwrap();
    let (result, _) = call(&provider_with(&c, &server), &[user("x")]);
    assert!(result.unwrap_err().message.contains("max_response_bytes"));
}

#[test]
fn one_huge_delta_is_refused_by_the_event_cap() {
    let mut c = config(ProviderKind::OpenAiChat);
    c.max_event_bytes = 1 << 20;
    let server =
        TestServer::start(vec![Reply::sse(streams::huge_chat_delta(4 << 20)).split(Split::Every(64 * 1024))]).unwrap();
    let (result, events) = call(&provider_with(&c, &server), &[user("x")]);
    let e = result.unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Protocol);
    assert!(e.message.contains("max_event_bytes"), "{}", e.message);
    assert_eq!(text_deltas(&events), "");
}

#[test]
fn ten_thousand_tool_calls_settle_and_the_cap_is_reported_to_the_turn() {
    let body = streams::chat_tool_calls(10_000, "shell", r#"{"argv":["true"]}"#, |k| format!("call_{k}"));
    let server = TestServer::start(vec![Reply::sse(body)]).unwrap();
    let mut c = config(ProviderKind::OpenAiChat);
    c.max_tool_calls = 5;
    let p = provider_with(&c, &server);
    assert_eq!(p.max_tool_calls(), 5);
    let (result, _) = call(&p, &[user("x")]);
    let r = result.unwrap();
    // The provider settles what the model said; the turn runs at most 5 (see
    // cairn-testtools' hostile_provider tests).
    assert_eq!(calls(&r.message).len(), 10_000);
    assert_eq!(r.stop, StopReason::ToolUse);
}

#[test]
fn duplicate_tool_call_ids_are_asked_again_then_refused() {
    let dup = || Reply::sse(streams::chat_tool_calls(3, "shell", "{}", |k| format!("call_{}", k.min(1))));
    let good = Reply::sse(streams::chat_tool_calls(3, "shell", "{}", |k| format!("call_{k}")));
    let server = TestServer::start(vec![dup(), good]).unwrap();
    let (result, _) = call(&provider(ProviderKind::OpenAiChat, &server), &[user("x")]);
    let r = result.unwrap();
    assert_eq!(r.attempts.len(), 2);
    assert!(r.attempts[0].error.as_deref().unwrap().contains("\"call_1\" for more than one call"));
    assert_eq!(calls(&r.message).len(), 3);

    let server = TestServer::start(vec![dup(), dup(), dup()]).unwrap();
    let (result, _) = call(&provider(ProviderKind::OpenAiChat, &server), &[user("x")]);
    let e = result.unwrap_err();
    assert_eq!(e.kind, ProviderErrorKind::Protocol);
    assert!(e.message.contains("for more than one call") && e.message.contains("gave up after 3"), "{}", e.message);
}

#[test]
fn limits_too_large_for_the_clock_mean_no_limit_not_a_panic() {
    let table: toml::Value = toml::from_str(&format!(
        "kind = \"openai-chat\"\nmodel = \"m\"\ntotal_timeout_ms = {max}\nidle_timeout_ms = {max}\nfirst_byte_timeout_ms = {max}\nconnect_timeout_ms = {max}\nmax_backoff_ms = {max}",
        max = i64::MAX
    ))
    .unwrap();
    let c = ProviderConfig::from_toml("big", &table).unwrap();
    let server = TestServer::start(vec![cut_reply("chat_text.sse"), Reply::sse(data("chat_text.sse"))]).unwrap();
    let (result, _) = call(&provider_with(&c, &server), &[user("x")]);
    let r = result.unwrap();
    assert_eq!(r.attempts.len(), 2, "the cut attempt was retried");
}
