//! Tier C: a tool that streams 200 MB of output. Memory stays bounded (the
//! turn never buffers streamed output, the prompt gets the capped summary and
//! the log at most the stored-output cap). Its own test binary, so the
//! process's peak RSS belongs to this test alone.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use cairn_core::approval::{Allowlist, PolicyApprover};
use cairn_core::storage::{Durability, Header, JsonlStore, StoreOptions};
use cairn_core::{CancelToken, Session, SessionConfig, TurnEnv, TurnEvent, TurnStop};
use cairn_testtools::{ScriptProvider, registry};

fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[test]
fn giant_tool_output_keeps_memory_and_the_log_bounded() {
    const TOTAL: u64 = 200 * 1024 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::create(
        dir.path(),
        Header::new("giant", dir.path().to_str().unwrap()),
        StoreOptions::with_durability(Durability::None),
    )
    .unwrap();
    let path = store.path().to_owned();
    let script = format!(
        "{}\n{}\n",
        serde_json::json!({"text": "", "toolCalls": [{"id": "g", "name": "giant", "arguments": {"bytes": TOTAL}}]}),
        serde_json::json!({"text": "ok"})
    );
    let provider = ScriptProvider::from_jsonl(&script).unwrap();
    let tools = registry(false, None);
    let mut approver = PolicyApprover::new(Allowlist::new(), None);
    let before = peak_rss();
    let mut streamed = 0u64;
    let mut observer = |e: &TurnEvent| {
        if let TurnEvent::ToolOutput { chunk, .. } = e {
            streamed += chunk.len() as u64;
        }
    };
    let cancel = CancelToken::new();
    let mut env = TurnEnv {
        provider: &provider,
        tools: &tools,
        approver: &mut approver,
        observer: &mut observer,
        cancel: &cancel,
    };
    let mut session = Session::open(store, SessionConfig::default()).unwrap();
    let outcome = session.run_turn("go", &mut env).unwrap();
    assert_eq!(outcome.stop, TurnStop::Answered);
    drop(session);
    let grown = peak_rss().saturating_sub(before);
    assert_eq!(streamed, TOTAL);
    assert!(grown < 48 * 1024 * 1024, "peak RSS grew by {grown} bytes for {TOTAL} bytes of output");
    let file_len = std::fs::metadata(&path).unwrap().len();
    assert!(file_len < 2 * 1024 * 1024, "session file is {file_len} bytes");
}
