//! Tier A and C tests of the turn, in process: transitions, the lifecycle in
//! the log, rejections, approvals, CAS races, crash at every commit
//! boundary (in-memory snapshots), cancellation, limits, projection.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cairn_core::approval::{Allowlist, Answer, Approver, PolicyApprover};
use cairn_core::events::{ToolCompletedPayload, TurnEvent};
use cairn_core::message::{ContentPart, Message, Role};
use cairn_core::projection::{ToolInvocationStatus, ToolState};
use cairn_core::storage::{
    Committed, Durability, Entry, Header, JsonlStore, MemStore, RawJson, State, Storage, StorageError, StoreOptions,
    Transaction, UsageRow, to_raw,
};
use cairn_core::tool::ReplayPolicy;
use cairn_core::turn::Phase;
use cairn_core::{
    CancelToken, RegistryError, Session, SessionConfig, ToolRegistry, TurnEnv, TurnError, TurnOutcome, TurnStop,
};
use cairn_testtools::hooks::RecordingStore;
use cairn_testtools::provider::ScriptCall;
use cairn_testtools::{ErrApprover, RejectedTool, ScriptLine, ScriptProvider, ScriptedApprover, registry};
use serde_json::{Value, json};

fn call(id: &str, name: &str, arguments: Value) -> ScriptCall {
    ScriptCall { id: id.to_owned(), name: name.to_owned(), arguments }
}

fn line(text: &str, calls: Vec<ScriptCall>) -> ScriptLine {
    ScriptLine { text: text.to_owned(), tool_calls: calls }
}

fn mem(cwd: &str) -> MemStore {
    MemStore::new(Header::new("s1", cwd))
}

fn headless() -> PolicyApprover {
    PolicyApprover::new(Allowlist::new(), None)
}

/// Run (prompt = Some) or resume (None) one turn, collecting events.
fn drive<S: Storage>(
    session: &mut Session<S>,
    provider: &ScriptProvider,
    tools: &ToolRegistry,
    approver: &mut dyn Approver,
    events: &mut Vec<TurnEvent>,
    cancel: &CancelToken,
    prompt: Option<&str>,
) -> Result<Option<TurnOutcome>, TurnError> {
    let mut observer = |e: &TurnEvent| events.push(e.clone());
    let mut env = TurnEnv { provider, tools, approver, observer: &mut observer, cancel };
    match prompt {
        Some(p) => session.run_turn(p, &mut env).map(Some),
        None => session.resume(&mut env),
    }
}

fn run<S: Storage>(
    session: &mut Session<S>,
    provider: &ScriptProvider,
    tools: &ToolRegistry,
    approver: &mut dyn Approver,
) -> (TurnOutcome, Vec<TurnEvent>) {
    let mut events = Vec::new();
    let outcome =
        drive(session, provider, tools, approver, &mut events, &CancelToken::new(), Some("go")).unwrap().unwrap();
    (outcome, events)
}

fn types<S: Storage>(store: &S) -> Vec<String> {
    store.entries().into_iter().map(|e| e.entry_type).collect()
}

fn tool_results(messages: &[Message]) -> Vec<(String, bool)> {
    messages
        .iter()
        .flat_map(|m| m.content.iter())
        .filter_map(|p| match p {
            ContentPart::ToolResult { content, is_error, .. } => Some((content.clone(), *is_error)),
            _ => None,
        })
        .collect()
}

fn assert_healthy<S: Storage>(store: &S) -> ToolState {
    let state = ToolState::replay(store.entries());
    assert!(state.anomalies.is_empty(), "anomalies: {:?}", state.anomalies);
    for record in &state.invocations {
        assert_eq!(record.settlements, 1, "invocation {} settled {} times", record.invocation_id, record.settlements);
    }
    assert!(store.registers("pending").is_empty(), "pending left: {:?}", store.registers("pending"));
    state
}

#[test]
fn echo_turn_commits_the_lifecycle_and_answers() {
    let provider =
        ScriptProvider::new(vec![line("", vec![call("c1", "echo", json!({"text": "hi"}))]), line("done: hi", vec![])]);
    let tools = registry(false, None);
    let mut session = Session::open(mem("/tmp"), SessionConfig::default()).unwrap();
    let (outcome, events) = run(&mut session, &provider, &tools, &mut headless());
    assert_eq!(outcome.stop, TurnStop::Answered);
    assert_eq!(outcome.text, "done: hi");
    assert_eq!(outcome.steps, 2);
    assert_eq!(session.pc().phase, Phase::Final);
    assert!(!session.needs_resume());
    assert_eq!(
        types(session.store()),
        ["message", "message", "toolRequested", "toolStarted", "toolCompleted", "message"]
    );
    let messages = session.messages().to_vec();
    assert_eq!(
        messages.iter().map(|m| m.role).collect::<Vec<_>>(),
        [Role::User, Role::Assistant, Role::Tool, Role::Assistant]
    );
    assert_eq!(tool_results(&messages), [("hi".to_owned(), false)]);
    // The second request carried the tool result; the cache equals a rebuild.
    let requests = provider.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    assert_eq!(tool_results(&requests[1]), [("hi".to_owned(), false)]);
    assert_eq!(session.conversation("main").unwrap(), messages);
    let state = assert_healthy(session.store());
    assert_eq!(state.invocations.len(), 1);
    assert_eq!(state.invocations[0].status, ToolInvocationStatus::Completed);
    assert_eq!(state.invocations[0].verdict.as_ref().unwrap().by, "policy:readOnly");
    assert_eq!(session.store().usage().len(), 2);
    let kinds: Vec<String> = events
        .iter()
        .map(|e| serde_json::to_value(e).unwrap()["type"].as_str().unwrap().to_owned())
        .filter(|t| t != "delta")
        .collect();
    assert_eq!(
        kinds,
        [
            "turnStarted",
            "providerRequested",
            "usage",
            "providerSettled",
            "toolRequested",
            "approvalVerdict",
            "toolStarted",
            "toolOutput",
            "toolCompleted",
            "providerRequested",
            "usage",
            "providerSettled",
            "final"
        ]
    );
    // Streamed deltas reach the observer; only the settled message is in the log.
    assert!(events.iter().any(|e| matches!(
        e,
        TurnEvent::Delta { event: cairn_core::provider::StreamEvent::TextDelta { text } } if text == "done: hi"
    )));
    // Reopening gives the same view.
    let store = session.into_store();
    let reopened = Session::open(store, SessionConfig::default()).unwrap();
    assert_eq!(reopened.messages(), messages.as_slice());
}

#[test]
fn rejections_are_settled_and_the_model_sees_why() {
    let provider = ScriptProvider::new(vec![
        line(
            "",
            vec![
                call("c1", "no_such_tool", json!({})),
                call("c2", "echo", json!("{not json")),
                call("c3", "echo", json!({"text": 5})),
                call("c4", "echo", json!({"text": "x", "extra": true})),
                call("c5", "failing", json!({})),
                call("c6", "echo", json!(["array"])),
            ],
        ),
        line("ok", vec![]),
    ]);
    let tools = registry(false, None);
    let mut session = Session::open(mem("/tmp"), SessionConfig::default()).unwrap();
    let (outcome, _) = run(&mut session, &provider, &tools, &mut headless());
    assert_eq!(outcome.stop, TurnStop::Answered);
    let results = tool_results(&session.messages());
    assert_eq!(results.len(), 6);
    assert!(results.iter().all(|(_, is_error)| *is_error));
    assert!(results[0].0.contains("unknown tool \"no_such_tool\"") && results[0].0.contains("echo"));
    assert!(results[1].0.contains("not valid JSON"));
    assert!(results[2].0.contains("/text") && results[2].0.contains("expected string"));
    assert!(results[3].0.contains("/extra"));
    assert!(results[4].0.contains("simulated validation failure"));
    assert!(results[5].0.contains("must be a JSON object"));
    let state = assert_healthy(session.store());
    assert!(state.invocations.iter().all(|r| r.status == ToolInvocationStatus::Rejected));
    assert_eq!(tool_results(&provider.requests.lock().unwrap()[1]).len(), 6);
}

#[test]
fn write_needs_a_rule_or_a_verdict_and_session_rules_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().to_str().unwrap();
    let append = |id: &str| call(id, "append_guarded", json!({"path": "a.txt", "text": id}));
    let tools = registry(false, None);

    // Headless, no rule: rejected with the policy's reason, nothing written.
    let provider = ScriptProvider::new(vec![line("", vec![append("c1")]), line("ok", vec![])]);
    let mut session = Session::open(mem(cwd), SessionConfig::default()).unwrap();
    run(&mut session, &provider, &tools, &mut headless());
    let state = assert_healthy(session.store());
    assert_eq!(state.invocations[0].status, ToolInvocationStatus::Rejected);
    assert_eq!(state.invocations[0].verdict.as_ref().unwrap().by, "policy:headless");
    assert!(!dir.path().join("a.txt").exists());

    // An allow rule: one line (intent + start), verdict names the rule.
    let provider = ScriptProvider::new(vec![line("", vec![append("c1")]), line("ok", vec![])]);
    let mut session = Session::open(mem(cwd), SessionConfig::default()).unwrap();
    let mut approver = PolicyApprover::new(Allowlist::parse(["append_guarded(path=*.txt)"]).unwrap(), None);
    run(&mut session, &provider, &tools, &mut approver);
    let state = assert_healthy(session.store());
    assert_eq!(state.invocations[0].status, ToolInvocationStatus::Completed);
    assert_eq!(state.invocations[0].verdict.as_ref().unwrap().by, "allowlist:append_guarded(path=*.txt)");

    // A person approves for the session: the rule is stored as a fact and
    // answers the next call (and the next process) without asking.
    let provider = ScriptProvider::new(vec![
        line("", vec![append("c1")]),
        line("", vec![append("c2")]),
        line("ok", vec![]),
        line("", vec![append("c3")]),
        line("ok", vec![]),
    ]);
    let mut session = Session::open(mem(cwd), SessionConfig::default()).unwrap();
    let mut person = ScriptedApprover::new(true, [Answer::ApproveForSession]);
    run(&mut session, &provider, &tools, &mut person);
    assert_eq!(person.asked, ["append_guarded"]);
    let state = assert_healthy(session.store());
    assert_eq!(state.invocations[1].verdict.as_ref().unwrap().by, "session:append_guarded");
    assert!(session.store().register("fact", "allow:append_guarded").is_some());
    let mut reopened = Session::open(session.into_store(), SessionConfig::default()).unwrap();
    assert_eq!(reopened.session_allow().rules().len(), 1);
    let mut nobody = ScriptedApprover::new(true, []);
    run(&mut reopened, &provider, &tools, &mut nobody);
    assert!(nobody.asked.is_empty());
    assert_eq!(std::fs::read_to_string(dir.path().join("a.txt")).unwrap().lines().count(), 4);
}

#[test]
fn destructive_needs_a_person_and_is_never_remembered() {
    let mut headless_registry = ToolRegistry::new(&cairn_testtools::ScriptedApprover::new(false, []));
    let refused = headless_registry.register(Arc::new(RejectedTool::new()));
    assert!(
        matches!(refused, Err(RegistryError::NeedsPerson { ref tool, ref reason }) if tool == "rejected" && reason.contains("Destructive")),
        "{refused:?}"
    );

    let rejected = Arc::new(RejectedTool::new());
    let mut tools = ToolRegistry::new(&cairn_testtools::ScriptedApprover::new(true, []));
    tools.register(rejected.clone()).unwrap();
    let script = || {
        ScriptProvider::new(vec![
            line("", vec![call("c1", "rejected", json!({}))]),
            line("", vec![call("c2", "rejected", json!({}))]),
            line("ok", vec![]),
        ])
    };
    // An allowlist naming it does not unlock it when nobody can answer.
    let mut session = Session::open(mem("/tmp"), SessionConfig::default()).unwrap();
    let mut approver = PolicyApprover::new(Allowlist::parse(["rejected"]).unwrap(), None);
    run(&mut session, &script(), &tools, &mut approver);
    let state = assert_healthy(session.store());
    assert!(state.invocations.iter().all(|r| r.status == ToolInvocationStatus::Rejected));
    assert_eq!(rejected.runs.load(Ordering::SeqCst), 0);

    // A person approving "for the session" approves once only.
    let mut session = Session::open(mem("/tmp"), SessionConfig::default()).unwrap();
    let mut person = ScriptedApprover::new(true, [Answer::ApproveForSession, Answer::Deny { reason: "no".into() }]);
    run(&mut session, &script(), &tools, &mut person);
    assert_eq!(person.asked.len(), 2);
    assert_eq!(rejected.runs.load(Ordering::SeqCst), 1);
    assert!(session.store().registers("fact").is_empty());
    let state = assert_healthy(session.store());
    assert_eq!(state.invocations[0].status, ToolInvocationStatus::Completed);
    assert_eq!(state.invocations[1].status, ToolInvocationStatus::Rejected);
    assert_eq!(tool_results(&session.messages())[1].0, "rejected: no");
}

#[test]
fn an_approver_that_errors_rejects_without_aborting() {
    let provider = ScriptProvider::new(vec![
        line("", vec![call("c1", "append_never", json!({"path": "x", "text": "t"}))]),
        line("ok", vec![]),
    ]);
    let tools = registry(false, None);
    let mut session = Session::open(mem("/tmp"), SessionConfig::default()).unwrap();
    let mut approver = ErrApprover { interactive: true, asked: 0 };
    let (outcome, _) = run(&mut session, &provider, &tools, &mut approver);
    assert_eq!(outcome.stop, TurnStop::Answered);
    assert_eq!(approver.asked, 1);
    let state = assert_healthy(session.store());
    assert_eq!(state.invocations[0].status, ToolInvocationStatus::Rejected);
    assert!(state.invocations[0].reason.as_ref().unwrap().contains("approval channel closed"));
    assert_eq!(state.invocations[0].verdict.as_ref().unwrap().by, "approver:error");
}

#[test]
fn approval_spam_settles_every_call_once() {
    let calls: Vec<ScriptCall> =
        (0..200).map(|i| call(&format!("c{i}"), "append_never", json!({"path": "x", "text": "t"}))).collect();
    let provider = ScriptProvider::new(vec![line("", calls), line("ok", vec![])]);
    let tools = registry(false, None);
    let mut session = Session::open(mem("/tmp"), SessionConfig::default()).unwrap();
    let mut person = ScriptedApprover::new(true, []);
    let (outcome, events) = run(&mut session, &provider, &tools, &mut person);
    assert_eq!(outcome.stop, TurnStop::Answered);
    // The person is asked up to the per-message cap; the rest are refused unasked.
    let cap = cairn_core::provider::DEFAULT_MAX_TOOL_CALLS;
    assert_eq!(person.asked.len(), cap);
    let state = assert_healthy(session.store());
    assert_eq!(state.invocations.len(), 200);
    assert!(state.invocations.iter().all(|r| r.status == ToolInvocationStatus::Rejected));
    let asked = events.iter().filter(|e| matches!(e, TurnEvent::ApprovalAsked { .. })).count();
    assert_eq!(asked, cap);
}

/// Two sessions over one store: a store shared through `Rc<RefCell<…>>`.
#[derive(Clone)]
struct Shared(Rc<RefCell<MemStore>>);

impl Storage for Shared {
    fn header(&self) -> &Header {
        // The header never changes; leak a copy for the borrow's lifetime.
        Box::leak(Box::new(self.0.borrow().header().clone()))
    }
    fn commit(&mut self, tx: Transaction) -> Result<Committed, StorageError> {
        self.0.borrow_mut().commit(tx)
    }
    fn last_seq(&self) -> u64 {
        self.0.borrow().last_seq()
    }
    fn entry(&self, id: &str) -> Option<Entry> {
        self.0.borrow().entry(id)
    }
    fn children(&self, parent: Option<&str>) -> Vec<Entry> {
        self.0.borrow().children(parent)
    }
    fn path_to(&self, leaf: &str) -> Result<Vec<Entry>, StorageError> {
        self.0.borrow().path_to(leaf)
    }
    fn entries(&self) -> Vec<Entry> {
        self.0.borrow().entries()
    }
    fn entry_count(&self) -> usize {
        self.0.borrow().entry_count()
    }
    fn register(&self, namespace: &str, key: &str) -> Option<RawJson> {
        self.0.borrow().register(namespace, key)
    }
    fn registers(&self, namespace: &str) -> Vec<(String, RawJson)> {
        self.0.borrow().registers(namespace)
    }
    fn usage(&self) -> Vec<UsageRow> {
        self.0.borrow().usage()
    }
    fn state(&self) -> Option<State> {
        self.0.borrow().state()
    }
    fn sync(&mut self) -> Result<(), StorageError> {
        Ok(())
    }
}

#[test]
fn cas_race_one_driver_wins_the_other_gets_a_conflict() {
    let shared = Shared(Rc::new(RefCell::new(mem("/tmp"))));
    let provider = ScriptProvider::new(vec![line("one", vec![]), line("two", vec![])]);
    let tools = registry(false, None);
    let mut a = Session::open(shared.clone(), SessionConfig::default()).unwrap();
    let mut b = Session::open(shared.clone(), SessionConfig::default()).unwrap();
    run(&mut a, &provider, &tools, &mut headless());
    let mut events = Vec::new();
    let lost = drive(&mut b, &provider, &tools, &mut headless(), &mut events, &CancelToken::new(), Some("again"));
    assert!(
        matches!(lost, Err(TurnError::Storage(StorageError::StateConflict { .. }))),
        "second driver must lose the CAS: {lost:?}"
    );
    // The loser wrote nothing; the winner's turn is intact.
    assert_eq!(types(&shared), ["message", "message"]);
    let reopened = Session::open(shared.clone(), SessionConfig::default()).unwrap();
    assert_eq!(reopened.pc().phase, Phase::Final);
}

#[test]
fn a_crash_at_every_commit_boundary_resumes_to_final_with_one_settlement_each() {
    let lines = || {
        vec![
            line(
                "",
                vec![
                    call("c1", "echo", json!({"text": "a"})),
                    call("c2", "append_idempotent", json!({"path": "f", "text": "i"})),
                    call("c3", "append_guarded", json!({"path": "f", "text": "g"})),
                    call("c4", "append_never", json!({"path": "f", "text": "n"})),
                    call("c5", "nope", json!({})),
                    call("c6", "append_never", json!({"path": "f", "text": "asked"})),
                ],
            ),
            line("", vec![call("c7", "echo", json!({"text": "b"}))]),
            line("final", vec![]),
        ]
    };
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().to_str().unwrap().to_owned();
    let tools = registry(false, None);
    let allow = || Allowlist::parse(["append_idempotent", "append_guarded", "append_never(text=n)"]).unwrap();
    // The last append is not covered by a rule (text "asked"), so a person is asked.
    let mut approver = PolicyApprover::new(allow(), Some(Box::new(ScriptedApprover::new(true, [Answer::Approve]))));
    let mut session = Session::open(RecordingStore::new(mem(&cwd)), SessionConfig::default()).unwrap();
    let (outcome, _) = run(&mut session, &ScriptProvider::new(lines()), &tools, &mut approver);
    assert_eq!(outcome.stop, TurnStop::Answered);
    let full = session.into_store();
    assert_healthy(&full);
    let snapshots = full.snapshots;
    assert!(snapshots.len() >= 12, "only {} commits", snapshots.len());
    let mut phases = std::collections::BTreeSet::new();
    for (i, snapshot) in snapshots.into_iter().enumerate() {
        let mut session = Session::open(snapshot, SessionConfig::default()).unwrap();
        phases.insert(format!("{:?}", session.pc().phase));
        let mut approver = PolicyApprover::new(allow(), Some(Box::new(ScriptedApprover::new(true, [Answer::Approve]))));
        let mut events = Vec::new();
        let provider = ScriptProvider::new(lines());
        let resumed = drive(&mut session, &provider, &tools, &mut approver, &mut events, &CancelToken::new(), None)
            .unwrap_or_else(|e| panic!("resume after commit {}: {e}", i + 1));
        if let Some(outcome) = resumed {
            assert_eq!(outcome.stop, TurnStop::Answered, "after commit {}", i + 1);
        }
        assert_eq!(session.pc().phase, Phase::Final, "after commit {}", i + 1);
        let state = assert_healthy(session.store());
        assert_eq!(state.invocations.len(), 7, "after commit {}", i + 1);
        assert_eq!(session.messages().last().unwrap().joined_text(), "final");
    }
    for phase in ["Planning", "ToolCall", "AwaitingApproval", "Executing", "Final"] {
        assert!(phases.contains(phase), "no snapshot in {phase}: {phases:?}");
    }
}

#[test]
fn cancellation_is_durable_and_resumable_and_a_new_turn_settles_what_was_left() {
    let lines = || {
        vec![
            line("", vec![call("c1", "echo", json!({"text": "a"})), call("c2", "echo", json!({"text": "b"}))]),
            line("final", vec![]),
            line("second", vec![]),
        ]
    };
    let tools = registry(false, None);
    // Cancel as soon as the first call completes.
    for resume in [true, false] {
        let provider = ScriptProvider::new(lines());
        let cancel = CancelToken::new();
        let mut events = Vec::new();
        let mut session = Session::open(mem("/tmp"), SessionConfig::default()).unwrap();
        {
            let token = cancel.clone();
            let mut observer = |e: &TurnEvent| {
                if matches!(e, TurnEvent::ToolCompleted { .. }) {
                    token.cancel();
                }
                events.push(e.clone());
            };
            let mut approver = headless();
            let mut env = TurnEnv {
                provider: &provider,
                tools: &tools,
                approver: &mut approver,
                observer: &mut observer,
                cancel: &cancel,
            };
            let outcome = session.run_turn("go", &mut env).unwrap();
            assert_eq!(outcome.stop, TurnStop::Cancelled);
        }
        assert!(events.iter().any(|e| matches!(e, TurnEvent::TurnCancelled { .. })));
        assert_eq!(session.pc().phase, Phase::Cancelled);
        assert!(session.needs_resume());
        // Durable: a reopened session is still cancelled.
        let mut session = Session::open(session.into_store(), SessionConfig::default()).unwrap();
        assert_eq!(session.pc().phase, Phase::Cancelled);
        let mut events = Vec::new();
        let fresh = CancelToken::new();
        let outcome = if resume {
            drive(&mut session, &provider, &tools, &mut headless(), &mut events, &fresh, None).unwrap().unwrap()
        } else {
            drive(&mut session, &provider, &tools, &mut headless(), &mut events, &fresh, Some("next")).unwrap().unwrap()
        };
        assert_eq!(outcome.stop, TurnStop::Answered);
        let state = assert_healthy(session.store());
        assert_eq!(state.invocations.len(), 2);
        let second = &state.invocations[1];
        if resume {
            assert_eq!(second.status, ToolInvocationStatus::Completed);
            assert_eq!(outcome.text, "final");
        } else {
            assert_eq!(second.status, ToolInvocationStatus::Rejected);
            assert!(second.reason.as_ref().unwrap().contains("cancelled"));
            // Every call of the cancelled turn has a result before the new user message.
            assert_eq!(tool_results(&session.messages()).len(), 2);
        }
    }
}

#[test]
fn the_step_limit_ends_the_turn() {
    let provider = ScriptProvider::new(vec![line("", vec![call("c", "echo", json!({"text": "again"}))])]).cycling();
    let tools = registry(false, None);
    let config = SessionConfig { max_steps: 3, ..SessionConfig::default() };
    let mut session = Session::open(mem("/tmp"), config).unwrap();
    let (outcome, events) = run(&mut session, &provider, &tools, &mut headless());
    assert_eq!(outcome.stop, TurnStop::StepLimit);
    assert_eq!(outcome.steps, 3);
    assert!(events.iter().any(|e| matches!(e, TurnEvent::StepLimit { max_steps: 3, .. })));
    assert!(types(session.store()).contains(&"turnEnded".to_owned()));
    assert_eq!(assert_healthy(session.store()).invocations.len(), 3);
}

#[test]
fn giant_output_is_capped_for_the_model_and_kept_outside_the_prompt() {
    let provider = ScriptProvider::new(vec![
        line("", vec![call("c1", "giant", json!({"bytes": 10_000_000}))]),
        line("ok", vec![]),
    ]);
    let tools = registry(false, None);
    let config = SessionConfig { output_cap: 1000, stored_output_cap: 1500, ..SessionConfig::default() };
    let mut session = Session::open(mem("/tmp"), config).unwrap();
    let (_, events) = run(&mut session, &provider, &tools, &mut headless());
    let streamed: usize = events
        .iter()
        .map(|e| match e {
            TurnEvent::ToolOutput { chunk, .. } => chunk.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(streamed, 10_000_000);
    let (summary, _) = &tool_results(&session.messages())[0];
    assert!(summary.len() < 1300 && summary.contains("[output truncated: 1000 of 2000 bytes shown"));
    let completed = session.store().entries().into_iter().find(|e| e.entry_type == "toolCompleted").unwrap();
    let payload: ToolCompletedPayload = completed.payload.parse().unwrap();
    assert!(payload.receipt.truncated);
    assert!(payload.full_output.unwrap().starts_with(&"x".repeat(1500)));
}

#[test]
fn a_tool_past_its_time_limit_fails_and_the_turn_goes_on() {
    let provider =
        ScriptProvider::new(vec![line("", vec![call("c1", "sleep", json!({"ms": 60_000}))]), line("ok", vec![])]);
    let tools = registry(false, None);
    let config = SessionConfig { tool_timeout: Duration::from_millis(50), ..SessionConfig::default() };
    let mut session = Session::open(mem("/tmp"), config).unwrap();
    let (outcome, _) = run(&mut session, &provider, &tools, &mut headless());
    assert_eq!(outcome.stop, TurnStop::Answered);
    let state = assert_healthy(session.store());
    assert_eq!(state.invocations[0].status, ToolInvocationStatus::Failed);
    assert!(state.invocations[0].reason.as_ref().unwrap().contains("timed out"));
    assert!(!state.invocations[0].uncertain);
}

#[test]
fn a_failed_provider_call_records_its_usage_and_the_turn_resumes() {
    let provider = ScriptProvider::new(vec![line("answer", vec![])]).failing_first(1);
    let tools = registry(false, None);
    let mut session = Session::open(mem("/tmp"), SessionConfig::default()).unwrap();
    let mut events = Vec::new();
    let failed = drive(&mut session, &provider, &tools, &mut headless(), &mut events, &CancelToken::new(), Some("q"));
    assert!(matches!(failed, Err(TurnError::Provider(_))));
    assert!(events.iter().any(|e| matches!(e, TurnEvent::ProviderFailed { .. })));
    assert!(session.needs_resume());
    assert_eq!(session.store().usage().len(), 1);
    // A new turn is refused until the interrupted one is resumed.
    let refused = drive(&mut session, &provider, &tools, &mut headless(), &mut events, &CancelToken::new(), Some("x"));
    assert!(matches!(refused, Err(TurnError::NeedsResume(Phase::Planning))));
    let mut session = Session::open(session.into_store(), SessionConfig::default()).unwrap();
    let outcome = drive(&mut session, &provider, &tools, &mut headless(), &mut events, &CancelToken::new(), None)
        .unwrap()
        .unwrap();
    assert_eq!(outcome.text, "answer");
    let usage = session.store().usage();
    assert_eq!(usage.len(), 2);
    assert!(usage[0].entry_id.is_none() && usage[0].usage.get().contains("HTTP 500"));
    assert!(usage[1].entry_id.is_some());
    let mut nothing = Vec::new();
    assert!(
        drive(&mut session, &provider, &tools, &mut headless(), &mut nothing, &CancelToken::new(), None)
            .unwrap()
            .is_none()
    );
}

#[test]
fn the_projection_reads_a_recorded_jsonl_log_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::create(
        dir.path(),
        Header::new("rec", dir.path().to_str().unwrap()),
        StoreOptions::with_durability(Durability::None),
    )
    .unwrap();
    let path = store.path().to_owned();
    let provider = ScriptProvider::new(vec![
        line(
            "",
            vec![
                call("c1", "echo", json!({"text": "a"})),
                call("c2", "append_never", json!({"path": "f", "text": "x"})),
                call("c3", "failing", json!({})),
            ],
        ),
        line("ok", vec![]),
    ]);
    let mut session = Session::open(store, SessionConfig::default()).unwrap();
    run(&mut session, &provider, &registry(false, None), &mut headless());
    drop(session);
    let text = std::fs::read_to_string(&path).unwrap();
    for kind in ["\"toolRequested\"", "\"toolStarted\"", "\"toolCompleted\"", "\"toolRejected\"", "\"pending\""] {
        assert!(text.contains(kind), "log lacks {kind}");
    }
    // Following the file record by record gives the same projection.
    let mut tail = cairn_core::storage::Tail::open(&path).unwrap();
    let mut followed = ToolState::default();
    for record in tail.poll().unwrap() {
        followed.apply_record(&record);
    }
    let reader = JsonlStore::open_read_only(&path).unwrap();
    let state = ToolState::replay_strict(reader.entries()).unwrap();
    let statuses: Vec<_> = state.invocations.iter().map(|r| (r.tool.as_str(), r.status)).collect();
    assert_eq!(
        statuses,
        [
            ("echo", ToolInvocationStatus::Completed),
            ("append_never", ToolInvocationStatus::Rejected),
            ("failing", ToolInvocationStatus::Rejected),
        ]
    );
    assert_eq!(state.invocations[0].receipt.as_ref().unwrap().output_summary, "a");
    assert_eq!(followed.invocations, state.invocations);
    assert_eq!(state.invocations[0].request.arguments, json!({"text": "a"}));

    // A hand-written log with a second settlement: the strict replay refuses it.
    let mut bad = mem("/tmp");
    let request = json!({"invocationId": "i1", "turnId": "t1", "request": {"invocationId": "i1", "callId": "c", "sessionId": "s", "tool": "echo", "arguments": {}}});
    let failed = json!({"invocationId": "i1", "callId": "c", "tool": "echo", "reason": "x"});
    bad.commit(Transaction::new().entry("e1", None, "toolRequested", to_raw(&request).unwrap())).unwrap();
    bad.commit(Transaction::new().entry("e2", Some("e1"), "toolRejected", to_raw(&failed).unwrap())).unwrap();
    bad.commit(Transaction::new().entry("e3", Some("e2"), "toolFailed", to_raw(&failed).unwrap())).unwrap();
    let err = ToolState::replay_strict(bad.entries()).unwrap_err();
    assert!(err.to_string().contains("settled twice"), "{err}");
}

#[test]
fn open_rechecks_the_stored_pc_against_the_log() {
    // Record a session whose single call is in flight (pc Executing).
    let provider = ScriptProvider::new(vec![
        line("", vec![call("c1", "append_never", json!({"path": "f", "text": "x"}))]),
        line("ok", vec![]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let mut session =
        Session::open(RecordingStore::new(mem(dir.path().to_str().unwrap())), SessionConfig::default()).unwrap();
    let mut approver = PolicyApprover::new(Allowlist::parse(["append_never"]).unwrap(), None);
    run(&mut session, &provider, &registry(false, None), &mut approver);
    let executing = session
        .into_store()
        .snapshots
        .into_iter()
        .find(|s| Session::open(s.clone(), SessionConfig::default()).unwrap().pc().phase == Phase::Executing)
        .unwrap();
    let state = executing.state().unwrap();
    let pc: serde_json::Value = state.pc.parse().unwrap();
    let inv = pc["invocation"].as_str().unwrap().to_owned();
    let head = executing.entries().last().unwrap().id.clone();
    let corrupt = |store: MemStore, what: &str| match Session::open(store, SessionConfig::default()) {
        Err(e @ (TurnError::Corrupt(_) | TurnError::Transition(_))) => {
            assert!(e.to_string().contains(what), "{what}: {e}")
        }
        other => panic!("{what}: expected an error, got {other:?}"),
    };

    // (A foreign writer: storage lets a pending key go only with an entry.)
    let mut no_pending = executing.clone();
    no_pending
        .commit(Transaction::new().entry("yy", Some(&head), "note", to_raw(&1).unwrap()).delete("pending", inv.clone()))
        .unwrap();
    corrupt(no_pending, "no pending register");

    let mut settled = executing.clone();
    let failed = json!({"invocationId": inv, "callId": "c1", "tool": "append_never", "reason": "x"});
    settled.commit(Transaction::new().entry("zz", Some(&head), "toolFailed", to_raw(&failed).unwrap())).unwrap();
    corrupt(settled, "already settled");

    let mut settling = executing.clone();
    let mut bad_pc = pc.clone();
    bad_pc["phase"] = json!("settling");
    settling.commit(Transaction::new().state(state.seq, to_raw(&bad_pc).unwrap())).unwrap();
    corrupt(settling, "Settling");

    let mut cancelled = executing.clone();
    let cancelled_pc = json!({"phase": "cancelled", "lane": "main", "turn": pc["turn"], "resume": pc});
    cancelled.commit(Transaction::new().state(state.seq, to_raw(&cancelled_pc).unwrap())).unwrap();
    corrupt(cancelled, "illegal turn transition Cancelled → Executing");

    // The untouched log opens and resumes (Never: settled as uncertain).
    let mut session = Session::open(executing, SessionConfig::default()).unwrap();
    let mut events = Vec::new();
    let outcome =
        drive(&mut session, &provider, &registry(false, None), &mut approver, &mut events, &CancelToken::new(), None)
            .unwrap()
            .unwrap();
    assert_eq!(outcome.text, "ok");
    assert!(assert_healthy(session.store()).invocations[0].uncertain);
}

#[test]
fn forks_are_lanes_pointing_at_existing_entries() {
    let provider = ScriptProvider::new(vec![line("first answer", vec![]), line("second answer", vec![])]);
    let tools = registry(false, None);
    let mut session = Session::open(mem("/tmp"), SessionConfig::default()).unwrap();
    run(&mut session, &provider, &tools, &mut headless());
    let first_user = session.store().entries()[0].id.clone();
    session.fork("alt", &first_user).unwrap();
    assert!(matches!(session.fork("alt", &first_user), Err(TurnError::LaneExists(_))));
    assert!(matches!(session.fork("x", "nope"), Err(TurnError::NoSuchEntry(_))));
    session.switch_lane("alt").unwrap();
    assert_eq!(session.messages().len(), 1);
    run(&mut session, &provider, &tools, &mut headless());
    let alt = session.conversation("alt").unwrap();
    let main = session.conversation("main").unwrap();
    assert_eq!(alt.len(), 3);
    assert_eq!(main.len(), 2);
    assert_eq!(alt[0], main[0]);
    // Request k gets script line k, k = assistant messages in the request:
    // the fork has none, so it gets line 0 again.
    assert_eq!(alt[2].joined_text(), "first answer");
    assert_eq!(main[1].joined_text(), "first answer");
    assert_eq!(session.lanes().len(), 2);
    let reopened =
        Session::open(session.into_store(), SessionConfig { lane: "alt".into(), ..SessionConfig::default() }).unwrap();
    assert_eq!(reopened.messages(), alt.as_slice());
    // A person removes a lane: never the current one; the entries stay.
    let mut session = reopened;
    let entries = session.store().entry_count();
    assert!(matches!(session.remove_lane("alt"), Err(TurnError::LaneInUse(_))));
    assert!(matches!(session.remove_lane("ghost"), Err(TurnError::NoSuchLane(_))));
    session.switch_lane("main").unwrap();
    session.remove_lane("alt").unwrap();
    assert_eq!(session.lanes().into_iter().map(|(l, _)| l).collect::<Vec<_>>(), ["main"]);
    assert_eq!(session.store().entry_count(), entries);
    assert!(matches!(session.switch_lane("alt"), Err(TurnError::NoSuchLane(_))));
    assert!(matches!(
        Session::open(mem("/tmp"), SessionConfig { lane: "ghost".into(), ..SessionConfig::default() }),
        Err(TurnError::NoSuchLane(_))
    ));
}

#[test]
fn turn_events_are_tagged_camel_case_json() {
    let event =
        TurnEvent::ToolRejected { invocation_id: "i1".into(), tool: "echo".into(), risk: None, reason: "r".into() };
    assert_eq!(
        serde_json::to_value(&event).unwrap(),
        json!({"type": "toolRejected", "invocationId": "i1", "tool": "echo", "risk": null, "reason": "r"})
    );
    let replay = serde_json::to_value(ReplayPolicy::Guarded).unwrap();
    assert_eq!(replay, json!("guarded"));
}

/// A tool that panics inside its effect.
struct PanicTool(cairn_core::tool::ToolSpec);

impl cairn_core::tool::Tool for PanicTool {
    fn spec(&self) -> &cairn_core::tool::ToolSpec {
        &self.0
    }
    fn execute(
        &self,
        _request: &cairn_core::tool::ToolRequest,
        _ctx: &mut cairn_core::tool::ToolContext<'_>,
    ) -> Result<cairn_core::tool::ToolReceipt, cairn_core::tool::ToolError> {
        panic!("boom");
    }
}

#[test]
fn a_panicking_tool_is_settled_as_failed() {
    let spec = cairn_core::tool::ToolSpec {
        name: "panics".into(),
        description: "d".into(),
        input_schema: json!({"type": "object"}),
        risk: cairn_core::tool::Risk::ReadOnly,
        capabilities: Default::default(),
        replay: ReplayPolicy::Idempotent,
    };
    let mut tools = ToolRegistry::new(&cairn_testtools::ScriptedApprover::new(false, []));
    tools.register(Arc::new(PanicTool(spec))).unwrap();
    let provider = ScriptProvider::new(vec![line("", vec![call("c1", "panics", json!({}))]), line("ok", vec![])]);
    let mut session = Session::open(mem("/tmp"), SessionConfig::default()).unwrap();
    let (outcome, _) = run(&mut session, &provider, &tools, &mut headless());
    assert_eq!(outcome.text, "ok");
    let state = assert_healthy(session.store());
    assert_eq!(state.invocations[0].status, ToolInvocationStatus::Failed);
    assert!(state.invocations[0].reason.as_ref().unwrap().contains("panicked: boom"));
}

/// The entry types of the shared store's log that name `invocation`.
fn entries_of(store: &Shared, invocation: &str) -> Vec<String> {
    store
        .entries()
        .into_iter()
        .filter(|e| {
            e.payload.parse::<Value>().ok().and_then(|v| v["invocationId"].as_str().map(str::to_owned)).as_deref()
                == Some(invocation)
        })
        .map(|e| e.entry_type)
        .collect()
}

/// Every event about an entry must find that entry already committed.
fn assert_committed_before_told(shared: &Shared, event: &TurnEvent) {
    let (invocation, wanted) = match event {
        TurnEvent::ToolRequested { invocation_id, .. } => (invocation_id, "toolRequested"),
        TurnEvent::ToolStarted { invocation_id, .. } => (invocation_id, "toolStarted"),
        TurnEvent::ToolCompleted { invocation_id, .. } => (invocation_id, "toolCompleted"),
        TurnEvent::ToolFailed { invocation_id, .. } => (invocation_id, "toolFailed"),
        TurnEvent::ToolRejected { invocation_id, .. } => (invocation_id, "toolRejected"),
        TurnEvent::ApprovalVerdict { invocation_id, verdict } => {
            let found = entries_of(shared, invocation_id);
            let kind = if matches!(verdict.decision, Answer::Deny { .. }) { "toolRejected" } else { "toolStarted" };
            assert!(found.iter().any(|t| t == kind), "verdict on {invocation_id} told before its {kind}: {found:?}");
            return;
        }
        TurnEvent::TurnCancelled { .. } => {
            assert!(types(shared).iter().any(|t| t == "turnCancelled"), "cancel told before it was committed");
            return;
        }
        _ => return,
    };
    let found = entries_of(shared, invocation);
    assert!(found.iter().any(|t| t == wanted), "{wanted} of {invocation} told before commit: {found:?}");
}

#[test]
fn observers_hear_of_each_entry_only_after_its_commit() {
    // Rejections (unknown tool, a person's denial), runs, a cancel, and the
    // new turn that abandons the cancelled one's calls.
    let provider = ScriptProvider::new(vec![
        line(
            "",
            vec![
                call("c1", "nope", json!({})),
                call("c2", "append_idempotent", json!({"path": "f", "text": "x"})),
                call("c3", "echo", json!({"text": "e"})),
                call("c4", "echo", json!({"text": "never run"})),
            ],
        ),
        // Asked once more, by the second turn (the cancelled one never was).
        line("after", vec![]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let shared = Shared(Rc::new(RefCell::new(mem(dir.path().to_str().unwrap()))));
    let tools = registry(false, None);
    let mut session = Session::open(shared.clone(), SessionConfig::default()).unwrap();
    let cancel = CancelToken::new();
    let mut told = Vec::new();
    {
        let token = cancel.clone();
        let watcher = shared.clone();
        let mut observer = |e: &TurnEvent| {
            assert_committed_before_told(&watcher, e);
            // Cancel once the echo ran, so c4 is left for the next turn.
            if matches!(e, TurnEvent::ToolCompleted { tool, .. } if tool == "echo") {
                token.cancel();
            }
            told.push(e.clone());
        };
        let mut person = ScriptedApprover::new(true, [Answer::Deny { reason: "not now".into() }]);
        let mut env = TurnEnv {
            provider: &provider,
            tools: &tools,
            approver: &mut person,
            observer: &mut observer,
            cancel: &cancel,
        };
        assert_eq!(session.run_turn("go", &mut env).unwrap().stop, TurnStop::Cancelled);
    }
    let fresh = CancelToken::new();
    {
        let watcher = shared.clone();
        let mut observer = |e: &TurnEvent| {
            assert_committed_before_told(&watcher, e);
            told.push(e.clone());
        };
        let mut approver = headless();
        let mut env = TurnEnv {
            provider: &provider,
            tools: &tools,
            approver: &mut approver,
            observer: &mut observer,
            cancel: &fresh,
        };
        assert_eq!(session.run_turn("next", &mut env).unwrap().text, "after");
    }
    let state = assert_healthy(&shared);
    let statuses: Vec<_> = state.invocations.iter().map(|r| r.status).collect();
    use ToolInvocationStatus::{Completed, Rejected};
    assert_eq!(statuses, [Rejected, Rejected, Completed, Rejected]);
    // Each settlement was told exactly once.
    let settled = told
        .iter()
        .filter(|e| {
            matches!(e, TurnEvent::ToolCompleted { .. } | TurnEvent::ToolFailed { .. } | TurnEvent::ToolRejected { .. })
        })
        .count();
    assert_eq!(settled, 4);
}

#[test]
fn a_turn_cancelled_while_planning_ends_its_provider_op_and_resume_starts_it_again() {
    let shared = Shared(Rc::new(RefCell::new(mem("/tmp"))));
    let provider = ScriptProvider::new(vec![line("answer", vec![])]);
    let tools = registry(false, None);
    let mut session = Session::open(shared.clone(), SessionConfig::default()).unwrap();
    let cancelled = CancelToken::new();
    cancelled.cancel();
    let mut events = Vec::new();
    let outcome =
        drive(&mut session, &provider, &tools, &mut headless(), &mut events, &cancelled, Some("go")).unwrap().unwrap();
    assert_eq!(outcome.stop, TurnStop::Cancelled);
    assert_eq!(session.pc().resume.as_ref().unwrap().phase, Phase::Planning);
    assert!(shared.registers("op").is_empty(), "op/provider survived the cancel: {:?}", shared.registers("op"));
    // On resume the provider call is in flight again while it is asked.
    let watcher = shared.clone();
    let mut seen_op = 0;
    let mut observer = |e: &TurnEvent| {
        if matches!(e, TurnEvent::ProviderRequested { .. }) {
            let op = watcher.register("op", "provider").expect("op/provider while the provider is asked");
            assert_eq!(op.parse::<Value>().unwrap()["step"], 1);
            seen_op += 1;
        }
    };
    let fresh = CancelToken::new();
    let mut approver = headless();
    let mut env = TurnEnv {
        provider: &provider,
        tools: &tools,
        approver: &mut approver,
        observer: &mut observer,
        cancel: &fresh,
    };
    assert_eq!(session.resume(&mut env).unwrap().unwrap().text, "answer");
    assert_eq!(seen_op, 1);
    assert!(shared.registers("op").is_empty());
}

#[test]
fn orphaned_pending_keys_are_settled_before_a_new_turn_too() {
    let provider = ScriptProvider::new(vec![line("one", vec![]), line("two", vec![])]);
    let tools = registry(false, None);
    let mut session = Session::open(mem("/tmp"), SessionConfig::default()).unwrap();
    run(&mut session, &provider, &tools, &mut headless());
    // Another writer leaves an intent the pc does not point at.
    let mut store = session.into_store();
    let head = store.entries().last().unwrap().id.clone();
    let state = store.state().unwrap();
    let request = cairn_core::tool::ToolRequest {
        invocation_id: "i999".into(),
        call_id: "cx".into(),
        session_id: "s1".into(),
        tool: "append_never".into(),
        arguments: json!({"path": "f", "text": "x"}),
    };
    let verdict = cairn_core::events::VerdictRecord { decision: Answer::Approve, by: "other".into(), at: 1 };
    let started = cairn_core::events::ToolStartedPayload::new(&request, verdict);
    let intent = cairn_core::events::ToolRequestedPayload::new("t0".into(), request, None, None);
    store
        .commit(
            Transaction::new()
                .entry("orphan", Some(&head), "toolRequested", to_raw(&intent).unwrap())
                .entry("orphan-start", Some("orphan"), "toolStarted", to_raw(&started).unwrap())
                .set("pending", "i999", to_raw(&json!({"requestEntry": "orphan", "turnId": "t0"})).unwrap())
                .set("lane", "main", to_raw("orphan-start").unwrap())
                .state(state.seq, state.pc.clone()),
        )
        .unwrap();
    let mut session = Session::open(store, SessionConfig::default()).unwrap();
    let (outcome, events) = run(&mut session, &provider, &tools, &mut headless());
    assert_eq!(outcome.text, "two");
    let state = assert_healthy(session.store());
    let orphan = state.get("i999").unwrap();
    assert_eq!((orphan.status, orphan.uncertain), (ToolInvocationStatus::Failed, true));
    assert!(events.iter().any(|e| matches!(e, TurnEvent::ToolFailed { invocation_id, .. } if invocation_id == "i999")));
}

/// A Write tool (never replayed) that asks for a sandbox bypass and runs
/// only when it is granted.
struct BypassTool(cairn_core::tool::ToolSpec);

impl BypassTool {
    fn new() -> Self {
        Self(cairn_core::tool::ToolSpec {
            name: "bypass".into(),
            description: "asks to write outside the sandbox".into(),
            input_schema: json!({"type": "object"}),
            risk: cairn_core::tool::Risk::Write,
            capabilities: Default::default(),
            replay: ReplayPolicy::Never,
        })
    }
}

impl cairn_core::tool::Tool for BypassTool {
    fn spec(&self) -> &cairn_core::tool::ToolSpec {
        &self.0
    }
    fn execute(
        &self,
        _request: &cairn_core::tool::ToolRequest,
        ctx: &mut cairn_core::tool::ToolContext<'_>,
    ) -> Result<cairn_core::tool::ToolReceipt, cairn_core::tool::ToolError> {
        if !(ctx.approve_bypass)("write /etc/cairn-test") {
            return Err(cairn_core::tool::ToolError::Sandbox("the bypass was not granted".into()));
        }
        Ok(cairn_core::tool::ToolReceipt {
            exit_code: 0,
            output_summary: "wrote outside".into(),
            structured_output: None,
            affected_entities: vec![],
            duration_ms: 0,
            tier: cairn_core::tool::Risk::Write,
            timestamp: 0,
            truncated: false,
        })
    }
}

#[test]
fn a_bypass_verdict_is_committed_when_given_and_survives_a_crash_before_the_settlement() {
    let lines = || vec![line("", vec![call("c1", "bypass", json!({}))]), line("ok", vec![])];
    let mut tools = ToolRegistry::new(&cairn_testtools::ScriptedApprover::new(true, []));
    tools.register(Arc::new(BypassTool::new())).unwrap();
    // A person approves the call and then the bypass ("for the session",
    // which a bypass never keeps).
    let mut person = ScriptedApprover::new(true, [Answer::Approve, Answer::ApproveForSession]);
    let mut session = Session::open(RecordingStore::new(mem("/tmp")), SessionConfig::default()).unwrap();
    let (outcome, _) = run(&mut session, &ScriptProvider::new(lines()), &tools, &mut person);
    assert_eq!(outcome.text, "ok");
    let recorded = session.into_store();
    let state = assert_healthy(&recorded);
    let bypasses = &state.invocations[0].bypasses;
    assert_eq!(bypasses.len(), 1);
    assert_eq!(bypasses[0].what, "write /etc/cairn-test");
    assert_eq!(bypasses[0].verdict.decision, Answer::Approve);
    assert!(recorded.registers("fact").is_empty(), "a bypass approval was remembered");
    // The commit right after the bypass verdict: the effect had been granted
    // but not settled. A crash there keeps the verdict in the log.
    let crashed = recorded
        .snapshots
        .iter()
        .find(|s| s.entries().last().is_some_and(|e| e.entry_type == "toolBypass"))
        .expect("a commit ending with the toolBypass entry")
        .clone();
    let mut session = Session::open(crashed, SessionConfig::default()).unwrap();
    assert_eq!(session.pc().phase, Phase::Executing);
    let before = session.tool_state();
    assert_eq!(before.invocations[0].bypasses[0].verdict.by, "user:test");
    let mut events = Vec::new();
    let provider = ScriptProvider::new(lines());
    let mut nobody = ScriptedApprover::new(true, []);
    drive(&mut session, &provider, &tools, &mut nobody, &mut events, &CancelToken::new(), None).unwrap();
    let state = assert_healthy(session.store());
    let record = &state.invocations[0];
    assert_eq!((record.status, record.uncertain), (ToolInvocationStatus::Failed, true));
    assert_eq!(record.bypasses.len(), 1, "the verdict given before the crash is kept");
    assert!(nobody.asked.is_empty(), "resume asked again: {:?}", nobody.asked);
}

#[test]
fn headless_a_bypass_is_refused_by_the_gate_and_the_refusal_recorded() {
    let mut tools = ToolRegistry::new(&cairn_testtools::ScriptedApprover::new(false, []));
    tools.register(Arc::new(BypassTool::new())).unwrap();
    let provider = ScriptProvider::new(vec![line("", vec![call("c1", "bypass", json!({}))]), line("ok", vec![])]);
    let mut approver = PolicyApprover::new(Allowlist::parse(["bypass"]).unwrap(), None);
    let mut session = Session::open(mem("/tmp"), SessionConfig::default()).unwrap();
    run(&mut session, &provider, &tools, &mut approver);
    let state = assert_healthy(session.store());
    let record = &state.invocations[0];
    assert_eq!(record.status, ToolInvocationStatus::Failed);
    assert_eq!(record.bypasses[0].verdict.by, "policy:headless");
    assert!(matches!(record.bypasses[0].verdict.decision, Answer::Deny { .. }));
    assert_eq!(types(session.store()).iter().filter(|t| *t == "toolBypass").count(), 1);
}

/// The prompt queue: prompts brought in once by their number, run in
/// order, each leaving the queue in the very line that commits it as the
/// user's message (so a crash can neither lose nor repeat one).
#[test]
fn queued_prompts_run_once_in_order_and_leave_the_queue_with_their_message() {
    use cairn_core::storage::registers::{QueuedPrompt, prompt_queue};
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::create(dir.path(), Header::new("s1", "/tmp"), StoreOptions::default()).unwrap();
    let path = store.path().to_path_buf();
    let provider = ScriptProvider::new(vec![line("first done", vec![]), line("second done", vec![])]);
    let tools = registry(false, None);
    let mut session = Session::open(store, SessionConfig::default()).unwrap();
    let q = |n: u64, p: &str| QueuedPrompt { n, prompt: p.to_owned() };
    let mut approver = headless();
    let mut observer = |_: &TurnEvent| {};
    let cancel = CancelToken::new();
    let mut env = TurnEnv {
        provider: &provider,
        tools: &tools,
        approver: &mut approver,
        observer: &mut observer,
        cancel: &cancel,
    };
    // 2 arrives before 1 (a host's journal in any order); both come in.
    let first = session.run_queued(&[q(2, "second"), q(1, "first")], &mut env).unwrap().unwrap();
    assert_eq!(first.text, "first done");
    let queue = prompt_queue(session.store());
    assert_eq!((queue.through, queue.items), (2, vec![q(2, "second")]));
    // The same journal again (a host that crashed before clearing it):
    // nothing comes in twice.
    let second = session.run_queued(&[q(1, "first"), q(2, "second")], &mut env).unwrap().unwrap();
    assert_eq!(second.text, "second done");
    assert!(session.run_queued(&[q(2, "second")], &mut env).unwrap().is_none(), "an empty queue runs nothing");
    assert_eq!(prompt_queue(session.store()).items, vec![]);
    let users: Vec<String> =
        session.messages().iter().filter(|m| m.role == Role::User).map(Message::joined_text).collect();
    assert_eq!(users, ["first", "second"]);
    drop(session);
    // Read from the file itself: each user message shares its line with
    // the queue it left behind.
    let text = std::fs::read_to_string(&path).unwrap();
    let mut seen = 0;
    for l in text.lines().skip(1) {
        let records: Vec<Value> = match serde_json::from_str(l).unwrap() {
            Value::Array(items) => items,
            one => vec![one],
        };
        let user = records.iter().find(|r| r["type"] == "message" && r["payload"]["role"] == "user");
        if let Some(user) = user {
            let prompt = user["payload"]["content"][0]["text"].as_str().unwrap();
            let queue = records
                .iter()
                .find(|r| r["kind"] == "register" && r["namespace"] == "fact" && r["key"] == "queue")
                .unwrap_or_else(|| panic!("the line of {prompt:?} does not update the queue: {l}"));
            let left: Vec<&str> =
                queue["value"]["items"].as_array().unwrap().iter().map(|i| i["prompt"].as_str().unwrap()).collect();
            assert!(!left.contains(&prompt), "{prompt:?} still queued in its own line: {l}");
            seen += 1;
        }
    }
    assert_eq!(seen, 2);
}

#[test]
fn a_reopened_session_is_checked_again_when_tool_events_were_added() {
    // A healthy session with one settled call.
    let provider =
        ScriptProvider::new(vec![line("", vec![call("c1", "echo", json!({"text": "hi"}))]), line("done: hi", vec![])]);
    let mut session = Session::open(mem("/tmp"), SessionConfig::default()).unwrap();
    run(&mut session, &provider, &registry(false, None), &mut headless());
    let invocation = ToolState::replay(session.store().entries()).invocations[0].invocation_id.clone();
    let head = session.head().unwrap().to_owned();

    // A host's fact and a plain message added: reopened as it was.
    let mut reopen = session.into_reopen();
    let fact = to_raw(&json!({"chosen": []})).unwrap();
    reopen.store_mut().commit(Transaction::new().set("fact", "discovery", fact)).unwrap();
    let note = to_raw(&Message::text(Role::User, "a note")).unwrap();
    reopen.store_mut().commit(Transaction::new().entry("note", Some(&head), "message", note)).unwrap();
    let session = Session::reopen(reopen, SessionConfig::default()).unwrap();
    assert_eq!(session.head(), Some(head.as_str()));
    // The context it kept is what an open of the same store builds.
    let fresh = Session::open(session.store().clone(), SessionConfig::default()).unwrap();
    assert_eq!(session.messages(), fresh.messages());
    assert_eq!(session.messages().len(), 4);

    // A second settlement of the settled call added: the reopen checks the
    // whole log again and refuses it, as an open does.
    let mut reopen = session.into_reopen();
    let failed = json!({"invocationId": invocation, "callId": "c1", "tool": "echo", "reason": "again"});
    reopen
        .store_mut()
        .commit(Transaction::new().entry("again", Some(&head), "toolFailed", to_raw(&failed).unwrap()))
        .unwrap();
    let err = Session::reopen(reopen, SessionConfig::default()).unwrap_err();
    assert!(err.to_string().contains("settled twice"), "{err}");

    // Another store put in its place (as many entries, a broken log): not
    // taken for the one checked.
    let mut session = Session::open(mem("/tmp"), SessionConfig::default()).unwrap();
    run(
        &mut session,
        &ScriptProvider::new(vec![line("", vec![call("c1", "echo", json!({"text": "hi"}))]), line("ok", vec![])]),
        &registry(false, None),
        &mut headless(),
    );
    let count = session.store().entry_count();
    let mut reopen = session.into_reopen();
    let mut other = mem("/tmp");
    let request = json!({"invocationId": "i1", "turnId": "t1", "request": {"invocationId": "i1", "callId": "c", "sessionId": "s", "tool": "echo", "arguments": {}}});
    let failed = json!({"invocationId": "i1", "callId": "c", "tool": "echo", "reason": "x"});
    other.commit(Transaction::new().entry("e1", None, "toolRequested", to_raw(&request).unwrap())).unwrap();
    other.commit(Transaction::new().entry("e2", Some("e1"), "toolRejected", to_raw(&failed).unwrap())).unwrap();
    other.commit(Transaction::new().entry("e3", Some("e2"), "toolFailed", to_raw(&failed).unwrap())).unwrap();
    for i in 3..count {
        let note = to_raw(&Message::text(Role::User, "n")).unwrap();
        other.commit(Transaction::new().entry(format!("n{i}"), None, "message", note)).unwrap();
    }
    assert_eq!(other.entry_count(), count);
    *reopen.store_mut() = other;
    let err = Session::reopen(reopen, SessionConfig::default()).unwrap_err();
    assert!(err.to_string().contains("settled twice"), "{err}");
}
