//! An open session holds less memory than its file (issue 33): on a
//! generated 50,000-entry session with the turn's record shapes (a
//! question, then per tool call the assistant's call, its intent, start
//! and completion, then the answer; every tenth tool output 6 KiB), the
//! heap that `JsonlStore::open` keeps, and that `Session::open` keeps with
//! it, is at most the file's size.
//!
//! Measured with a counting global allocator in this test binary (bytes
//! allocated and not yet freed, as the allocator was asked for them), so
//! the figure is exact and independent of the machine's load; one test
//! only, so nothing else allocates while it measures. Nothing here
//! measures or asserts time.

#![allow(clippy::unwrap_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use cairn_core::approval::Answer;
use cairn_core::events::{ToolCompletedPayload, ToolRequestedPayload, ToolStartedPayload, VerdictRecord};
use cairn_core::message::{ContentPart, Message, Role, ToolCall};
use cairn_core::storage::{Durability, Header, JsonlStore, Storage, StoreOptions, Transaction, to_raw};
use cairn_core::tool::{ReplayPolicy, Risk, ToolReceipt, ToolRequest};
use cairn_core::{Session, SessionConfig};
use serde_json::json;

/// Counts the bytes live on the heap.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counter only observes the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is System's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is System's.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is System's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const TURNS: usize = 1_000;
const CALLS: usize = 12;

/// A session of `TURNS` turns of `CALLS` read_file calls each (50,000
/// entries), written as the turn writes them: one commit per step.
fn generate(dir: &std::path::Path) -> std::path::PathBuf {
    let opts = StoreOptions { compact_ratio: None, ..StoreOptions::with_durability(Durability::None) };
    let mut store = JsonlStore::create(dir, Header::new("long", "/"), opts).unwrap();
    let mut head: Option<String> = None;
    let mut n = 0usize;
    let mut next_id = || {
        n += 1;
        format!("e{n}")
    };
    let verdict = VerdictRecord { decision: Answer::Approve, by: "policy:readOnly".to_owned(), at: 1_700_000_000_000 };
    for turn in 0..TURNS {
        let user = next_id();
        let question = format!("question {turn}: what does handle_{turn} do with its arguments, and is it tested?");
        store
            .commit(
                Transaction::new()
                    .entry(&user, head.as_deref(), "message", to_raw(&Message::text(Role::User, question)).unwrap())
                    .set("lane", "main", to_raw(&user).unwrap()),
            )
            .unwrap();
        head = Some(user);
        for call in 0..CALLS {
            let request = ToolRequest {
                invocation_id: format!("i{turn}.{call}"),
                call_id: format!("call_{turn}_{call}"),
                session_id: "long".to_owned(),
                tool: "read_file".to_owned(),
                arguments: json!({"path": format!("src/module_{}.rs", call % 50)}),
            };
            let asking = Message {
                role: Role::Assistant,
                content: vec![
                    ContentPart::Text { text: "Let me read the next module.".to_owned() },
                    ContentPart::ToolCall(ToolCall {
                        id: request.call_id.clone(),
                        name: request.tool.clone(),
                        arguments: request.arguments.clone(),
                    }),
                ],
            };
            let line = format!("fn handle_{turn}_{call}(input: &str) -> Result<String, Error> {{ /* … */ }}\n");
            let output = line.repeat(if call % 10 == 9 { 6 * 1024 / line.len() } else { 4 });
            let receipt = ToolReceipt {
                exit_code: 0,
                output_summary: output,
                structured_output: None,
                affected_entities: Vec::new(),
                duration_ms: 3,
                tier: Risk::ReadOnly,
                timestamp: 1_700_000_000_000,
                truncated: false,
            };
            let requested = ToolRequestedPayload::new(
                format!("t{turn}"),
                request.clone(),
                Some(Risk::ReadOnly),
                Some(ReplayPolicy::Idempotent),
            );
            let mut tx = Transaction::new();
            for (entry_type, raw) in [
                ("message", to_raw(&asking).unwrap()),
                ("toolRequested", to_raw(&requested).unwrap()),
                ("toolStarted", to_raw(&ToolStartedPayload::new(&request, verdict.clone())).unwrap()),
                (
                    "toolCompleted",
                    to_raw(&ToolCompletedPayload::new(&request, receipt, None, None, Vec::new())).unwrap(),
                ),
            ] {
                let entry = next_id();
                tx = tx.entry(&entry, head.as_deref(), entry_type, raw);
                head = Some(entry);
            }
            store.commit(tx.set("lane", "main", to_raw(&head).unwrap())).unwrap();
        }
        let done = next_id();
        let answer =
            Message::text(Role::Assistant, format!("handle_{turn} trims its input; test_handle_{turn} covers it."));
        store
            .commit(Transaction::new().entry(&done, head.as_deref(), "message", to_raw(&answer).unwrap()).set(
                "lane",
                "main",
                to_raw(&done).unwrap(),
            ))
            .unwrap();
        head = Some(done);
    }
    store.path().to_owned()
}

#[test]
fn an_open_session_holds_less_heap_than_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = generate(dir.path());
    let size = std::fs::metadata(&path).unwrap().len() as usize;

    let before = LIVE.load(Ordering::Relaxed);
    let store = JsonlStore::open(&path, StoreOptions::with_durability(Durability::None)).unwrap();
    let kept = LIVE.load(Ordering::Relaxed) - before;
    assert_eq!(store.entry_count(), TURNS * (2 + 4 * CALLS));
    let ratio = kept as f64 / size as f64;
    eprintln!("JsonlStore::open keeps {kept} bytes of heap for a {size}-byte file ({ratio:.2}×)");
    assert!(ratio <= 1.0, "JsonlStore::open keeps {kept} bytes of heap for a {size}-byte file ({ratio:.2}×)");

    let session = Session::open(store, SessionConfig::default()).unwrap();
    let kept = LIVE.load(Ordering::Relaxed) - before;
    assert_eq!(session.head(), Some(format!("e{}", TURNS * (2 + 4 * CALLS)).as_str()));
    let ratio = kept as f64 / size as f64;
    eprintln!("Session::open keeps {kept} bytes of heap for a {size}-byte file ({ratio:.2}×)");
    assert!(ratio <= 1.0, "Session::open keeps {kept} bytes of heap for a {size}-byte file ({ratio:.2}×)");
}
