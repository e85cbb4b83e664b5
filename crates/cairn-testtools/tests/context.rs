//! The bounded request view and compaction, in process: requests fit the
//! window by an independent count (`cairn_test_server::tokens`), compaction
//! off still bounds them and says what is left out, a provider's own
//! tokenizer is used where it has one, and a lane forked before a summary
//! sees the full history while the originals stay in the log.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Mutex;

use cairn_core::approval::{Allowlist, PolicyApprover};
use cairn_core::message::{ContentPart, Message, Role, ToolCall};
use cairn_core::provider::{
    AttemptUsage, ModelRequest, ModelResponse, Provider, ProviderError, RequestPurpose, StopReason, StreamEvent,
};
use cairn_core::storage::{Header, MemStore, Storage};
use cairn_core::{CancelToken, Session, SessionConfig, ToolRegistry, TurnEnv};
use cairn_test_server::tokens::count_text;
use cairn_testtools::history;

/// A recorded request: purpose, output bound, messages.
type Recorded = (RequestPurpose, Option<u32>, Vec<Message>);

/// Answers "ok" (a summary for compaction requests) and records requests.
#[derive(Default)]
struct Recorder {
    requests: Mutex<Vec<Recorded>>,
    /// Count tokens as one per byte (a pessimistic tokenizer), when set.
    bytes_are_tokens: bool,
    /// Answer this many turn requests with an `echo` call of 3000 bytes.
    echo_calls: usize,
    /// Report one input token per two bytes of message text (a dense
    /// tokenizer), when set; else report 0.
    dense_usage: bool,
    /// The model's name (default "m").
    model: Option<&'static str>,
}

impl Provider for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }
    fn model(&self) -> &str {
        self.model.unwrap_or("m")
    }
    fn count_tokens(&self, text: &str) -> Option<u64> {
        self.bytes_are_tokens.then_some(text.len() as u64)
    }
    fn complete(
        &self,
        request: &ModelRequest<'_>,
        _observer: &mut dyn FnMut(&StreamEvent),
        _cancel: &CancelToken,
    ) -> Result<ModelResponse, ProviderError> {
        let mut requests = self.requests.lock().unwrap();
        requests.push((request.purpose, request.max_output_tokens, request.messages.to_vec()));
        let turn_requests = requests.iter().filter(|r| r.0 == RequestPurpose::Turn).count();
        if request.purpose == RequestPurpose::Turn && turn_requests <= self.echo_calls {
            let call = ToolCall {
                id: format!("c{turn_requests}"),
                name: "echo".into(),
                arguments: serde_json::json!({"text": format!("step {turn_requests} echoes ordinary words here. ").repeat(80)}),
            };
            return Ok(ModelResponse {
                message: Message { role: Role::Assistant, content: vec![ContentPart::ToolCall(call)] },
                stop: StopReason::ToolUse,
                attempts: vec![AttemptUsage::default()],
            });
        }
        let text = match request.purpose {
            RequestPurpose::Compaction => "SUMMARY-991 of everything before",
            RequestPurpose::Turn => "ok",
        };
        Ok(ModelResponse {
            message: Message::text(Role::Assistant, text),
            stop: StopReason::EndTurn,
            attempts: vec![AttemptUsage {
                provider: "recorder".into(),
                model: self.model().into(),
                attempt: 1,
                input_tokens: if self.dense_usage {
                    let bytes: usize =
                        request.messages.iter().map(|m| cairn_core::context::message_text(m).len()).sum();
                    bytes as u64 / 2
                } else {
                    0
                },
                ..Default::default()
            }],
        })
    }
}

fn session(turns: usize, config: SessionConfig) -> Session<MemStore> {
    let mut store = MemStore::new(Header::new("ctx", "/"));
    history::generate(&mut store, turns, 100).unwrap();
    Session::open(store, config).unwrap()
}

fn run(session: &mut Session<MemStore>, provider: &Recorder, prompt: &str) {
    let mut tools = ToolRegistry::new(&cairn_testtools::ScriptedApprover::new(false, []));
    tools.register(std::sync::Arc::new(cairn_testtools::EchoTool::new())).unwrap();
    let mut approver = PolicyApprover::new(Allowlist::new(), None);
    let mut observer = |_: &cairn_core::TurnEvent| {};
    let cancel = CancelToken::new();
    let mut env =
        TurnEnv { provider, tools: &tools, approver: &mut approver, observer: &mut observer, cancel: &cancel };
    session.run_turn(prompt, &mut env).unwrap();
}

/// Tokens of a request by the independent count: texts + 4 a message +
/// the output bound.
fn oracle(messages: &[Message], max_output: Option<u32>) -> u64 {
    let text: u64 = messages.iter().map(|m| count_text(&cairn_core::context::message_text(m)) + 4).sum();
    text + u64::from(max_output.unwrap_or(0))
}

fn compactions(store: &MemStore) -> usize {
    store.entries().iter().filter(|e| e.entry_type == "compaction").count()
}

#[test]
fn without_compaction_requests_are_still_bounded_and_say_what_is_left_out() {
    let config = SessionConfig {
        context_window: Some(4096),
        max_output_tokens: Some(512),
        compaction_threshold: None,
        ..SessionConfig::default()
    };
    let mut s = session(300, config);
    let provider = Recorder::default();
    run(&mut s, &provider, "what next?");
    let requests = provider.requests.lock().unwrap();
    assert_eq!(requests.len(), 1, "no summariser call");
    let (purpose, max, messages) = &requests[0];
    assert_eq!(*purpose, RequestPurpose::Turn);
    assert_eq!(*max, Some(512), "the output bound is sent");
    assert!(oracle(messages, *max) <= 4096, "{}", oracle(messages, *max));
    let first = messages[0].joined_text();
    assert!(first.contains("earlier messages of this conversation are left out"), "{first}");
    assert_eq!(messages.last().unwrap().joined_text(), "what next?");
    assert_ne!(messages[1].role, Role::Tool, "the cut never starts at a tool result");
    assert_eq!(compactions(s.store()), 0);
    // Every message is still the session's (the view is computed).
    assert_eq!(s.messages().len(), 300 * 4 + 2);
}

#[test]
fn a_providers_own_tokenizer_bounds_the_request() {
    let config = SessionConfig {
        context_window: Some(4096),
        max_output_tokens: Some(512),
        compaction_threshold: None,
        ..SessionConfig::default()
    };
    let mut s = session(100, config);
    let provider = Recorder { bytes_are_tokens: true, ..Recorder::default() };
    run(&mut s, &provider, "and?");
    let requests = provider.requests.lock().unwrap();
    let (_, _, messages) = &requests[0];
    // One token a byte: the texts sent fit in the window's bytes.
    let bytes: usize = messages.iter().map(|m| cairn_core::context::message_text(m).len()).sum();
    assert!(bytes <= 4096 - 512, "{bytes} bytes sent for a 4096-token window counted by bytes");
}

#[test]
fn compaction_covers_the_old_part_and_a_fork_from_before_sees_everything() {
    let config = SessionConfig { context_window: Some(4096), max_output_tokens: Some(512), ..SessionConfig::default() };
    let mut s = session(300, config);
    let provider = Recorder::default();
    run(&mut s, &provider, "go on");
    {
        let requests = provider.requests.lock().unwrap();
        assert_eq!(requests.len(), 2, "summary, then the turn");
        assert_eq!(requests[0].0, RequestPurpose::Compaction);
        assert!(oracle(&requests[0].2, requests[0].1) <= 4096, "the summariser's request fits too");
        let turn = &requests[1].2;
        assert!(turn[0].joined_text().contains("SUMMARY-991"), "the model sees the summary");
        assert!(oracle(turn, requests[1].1) <= 4096);
    }
    assert_eq!(compactions(s.store()), 1);
    // A second turn fits without another summary.
    run(&mut s, &provider, "and again");
    assert_eq!(compactions(s.store()), 1);
    assert_eq!(provider.requests.lock().unwrap().len(), 3);

    // The originals stay: every message of the lane is still in the log.
    assert_eq!(s.messages().len(), 300 * 4 + 4);
    // A lane forked at the last generated entry (before the summary) sees
    // the full history and no summary.
    s.fork("before", &history::entry_id(299, 5)).unwrap();
    let before = s.conversation("before").unwrap();
    assert_eq!(before.len(), 300 * 4);
    assert!(before.iter().all(|m| !m.joined_text().contains("SUMMARY-991")));
    assert_eq!(before[0].joined_text(), history::question(0));
}

#[test]
fn a_turn_longer_than_the_window_keeps_its_task_and_its_newest_steps() {
    let config = SessionConfig {
        context_window: Some(4096),
        max_output_tokens: Some(512),
        output_cap: 64 * 1024,
        ..SessionConfig::default()
    };
    let mut s = session(5, config);
    let provider = Recorder { echo_calls: 12, ..Recorder::default() };
    run(&mut s, &provider, "TASK-77: echo a dozen times");
    let requests = provider.requests.lock().unwrap();
    let turns: Vec<_> = requests.iter().filter(|r| r.0 == RequestPurpose::Turn).collect();
    assert_eq!(turns.len(), 13, "twelve echo steps and the answer");
    for (purpose, max, messages) in requests.iter() {
        assert!(oracle(messages, *max) <= 4096, "{purpose:?}: {}", oracle(messages, *max));
    }
    for (_, _, messages) in &turns {
        assert!(messages.iter().any(|m| m.joined_text().contains("TASK-77")), "the task stays in every request");
        // Every tool result has its call in the same request.
        let calls: Vec<&str> = messages.iter().flat_map(|m| m.tool_calls().map(|c| c.id.as_str())).collect();
        for m in messages.iter() {
            for part in &m.content {
                if let ContentPart::ToolResult { call_id, .. } = part {
                    assert!(calls.contains(&call_id.as_str()), "result {call_id} without its call");
                }
            }
        }
    }
    // The last request holds the newest step.
    let last = &turns[12].2;
    assert!(last.iter().any(|m| m.tool_calls().any(|c| c.id == "c12")));
}

/// What identifies a message in a request whatever elision did to it: its
/// role, its text, and the ids of its calls and results.
fn signature(m: &Message) -> String {
    let mut s = format!("{:?}|{}", m.role, m.joined_text());
    for part in &m.content {
        match part {
            ContentPart::ToolCall(c) => s.push_str(&format!("|call {}", c.id)),
            ContentPart::ToolResult { call_id, .. } => s.push_str(&format!("|result {call_id}")),
            _ => {}
        }
    }
    s
}

/// The lane's message entry ids in order, and each compaction on the lane
/// with the number of messages before it.
fn lane(s: &Session<MemStore>) -> (Vec<String>, Vec<(usize, cairn_core::events::CompactionPayload)>) {
    let path = s.store().path_to(s.head().unwrap()).unwrap();
    let (mut ids, mut compactions) = (Vec::new(), Vec::new());
    for e in &path {
        if e.entry_type == "compaction" {
            compactions.push((ids.len(), e.payload.parse().unwrap()));
        } else if cairn_core::turn::entry_message(e).is_some() {
            ids.push(e.id.clone());
        }
    }
    (ids, compactions)
}

#[test]
fn repeated_compactions_lose_no_message_and_a_reopened_session_sends_the_same_request() {
    let config = SessionConfig {
        context_window: Some(4096),
        max_output_tokens: Some(512),
        output_cap: 64 * 1024,
        ..SessionConfig::default()
    };
    let mut s = session(40, config.clone());
    let logged: Vec<(String, String)> =
        s.store().entries().iter().map(|e| (e.id.clone(), e.payload.get().to_owned())).collect();
    for round in 0..6 {
        // Turns of several long steps: the window fills again and again.
        let provider = Recorder { echo_calls: 3, ..Recorder::default() };
        run(&mut s, &provider, &format!("round {round}: echo three times"));
        for (purpose, max, messages) in provider.requests.lock().unwrap().iter() {
            assert!(oracle(messages, *max) <= 4096, "round {round} {purpose:?}: {}", oracle(messages, *max));
        }
        // The session as it is now, reopened from its log alone, builds the
        // same next request as the one that ran every step (the costs kept
        // up to date step by step equal the costs of a fresh open).
        let mut reopened = Session::open(s.store().clone(), config.clone()).unwrap();
        let (live, fresh) = (Recorder::default(), Recorder::default());
        run(&mut s, &live, &format!("probe {round}"));
        run(&mut reopened, &fresh, &format!("probe {round}"));
        assert_eq!(*live.requests.lock().unwrap(), *fresh.requests.lock().unwrap(), "round {round}");
    }
    // Nothing left the log: every generated entry is there, byte for byte.
    let now: std::collections::HashMap<String, String> =
        s.store().entries().iter().map(|e| (e.id.clone(), e.payload.get().to_owned())).collect();
    for (id, payload) in &logged {
        assert_eq!(now.get(id), Some(payload), "entry {id}");
    }
    // Each summary starts where the one before it ended (no message falls
    // between two summaries) and covers only messages before it.
    let (ids, compactions) = lane(&s);
    assert!(compactions.len() >= 3, "{} compactions", compactions.len());
    let mut next = 0;
    for (before, p) in &compactions {
        let first = ids.iter().position(|x| *x == p.first_entry).unwrap();
        let last = ids.iter().position(|x| *x == p.last_entry).unwrap();
        assert_eq!(first, next, "a summary starts at message {first}, the one before ended at {next}");
        assert!(first <= last && last < *before, "{first}..={last} before {before}");
        assert_eq!(p.messages as usize, last + 1);
        next = last + 1;
    }
    // The last request: the summary, then every message after what it
    // covers (none skipped), ending with the prompt.
    let provider = Recorder::default();
    run(&mut s, &provider, "last");
    let (ids, compactions) = lane(&s);
    let covered = compactions.last().map_or(0, |(_, p)| ids.iter().position(|x| *x == p.last_entry).unwrap() + 1);
    let requests = provider.requests.lock().unwrap();
    let (_, _, sent) = requests.iter().rfind(|r| r.0 == RequestPurpose::Turn).unwrap();
    assert!(sent[0].joined_text().contains("SUMMARY-991"), "{}", sent[0].joined_text());
    let all = s.messages();
    let expected: Vec<String> = all[covered..all.len() - 1].iter().map(signature).collect();
    let got: Vec<String> = sent[1..].iter().map(signature).collect();
    assert_eq!(got, expected);
}

#[test]
fn the_calibration_learnt_from_reported_usage_is_read_back_from_the_log() {
    let config = SessionConfig {
        context_window: Some(4096),
        max_output_tokens: Some(512),
        compaction_threshold: None,
        ..SessionConfig::default()
    };
    let mut s = session(300, config.clone());
    // The server reports about one token per two bytes: denser than the
    // default estimate, so fewer messages fit once it is learnt.
    run(&mut s, &Recorder { dense_usage: true, ..Recorder::default() }, "first");
    let sent = |s: &mut Session<MemStore>, model: Option<&'static str>| {
        let provider = Recorder { model, ..Recorder::default() };
        run(s, &provider, "next");
        let requests = provider.requests.lock().unwrap();
        requests[0].2.len()
    };
    // Reopened from the log alone: the usage row is read back. Against
    // another model of the same provider (nothing learnt: the default),
    // and against the session that learnt it in memory.
    let learnt = sent(&mut Session::open(s.store().clone(), config.clone()).unwrap(), None);
    let default = sent(&mut Session::open(s.store().clone(), config.clone()).unwrap(), Some("other"));
    let live = sent(&mut s, None);
    assert!(learnt < default, "learnt {learnt} messages, default {default}");
    assert_eq!(learnt, live);
}
