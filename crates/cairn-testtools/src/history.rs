//! Generated session histories with the record shapes the turn writes, for
//! tests and benchmarks of long sessions: each turn is a user message, an
//! assistant message calling `read_file`, the call's intent, start and
//! completion (built by the payloads' own constructors), and a final
//! assistant answer — six entries on lane `main`. Every tenth tool output
//! is large (6 KiB), as a real file read is.
//!
//! It writes whole turns in a few large transactions (fast), never a
//! `pending` register or a pc: the session is idle, as after a finished
//! turn.

use cairn_core::approval::Answer;
use cairn_core::events::{ToolCompletedPayload, ToolRequestedPayload, ToolStartedPayload, VerdictRecord};
use cairn_core::message::{ContentPart, Message, Role, ToolCall};
use cairn_core::storage::{Storage, StorageError, Transaction, to_raw};
use cairn_core::tool::{ReplayPolicy, Risk, ToolReceipt, ToolRequest};
use serde_json::json;

/// Entries one generated turn writes.
pub const ENTRIES_PER_TURN: usize = 6;

/// The id of entry `k` (0–5) of generated turn `turn`.
pub fn entry_id(turn: usize, k: usize) -> String {
    format!("h{turn}.{k}")
}

/// The user's text of generated turn `turn` (tests look for it).
pub fn question(turn: usize) -> String {
    format!(
        "question {turn}: please read src/module_{m}.rs and explain what handle_{turn} does with its arguments and \
         whether the error path is covered by a test",
        m = turn % 50
    )
}

fn output(turn: usize) -> String {
    let line =
        format!("fn handle_{turn}(input: &str, limit: usize) -> Result<String, Error> {{ /* checks the input */ }}\n");
    let lines = if turn % 10 == 9 { 6 * 1024 / line.len() } else { 4 };
    line.repeat(lines.max(1))
}

/// Append `turns` generated turns to `store` on lane `main` (continuing
/// from its head), `batch` turns per commit. Returns the new head.
pub fn generate<S: Storage>(store: &mut S, turns: usize, batch: usize) -> Result<Option<String>, StorageError> {
    let session_id = store.header().id.clone();
    let mut head: Option<String> = store.register("lane", "main").and_then(|raw| raw.parse::<String>().ok());
    let mut tx = Transaction::new();
    let mut in_tx = 0;
    for turn in 0..turns {
        let ids: Vec<String> = (0..ENTRIES_PER_TURN).map(|k| entry_id(turn, k)).collect();
        let request = ToolRequest {
            invocation_id: format!("hi{turn}"),
            call_id: format!("call_{turn}"),
            session_id: session_id.clone(),
            tool: "read_file".to_owned(),
            arguments: json!({"path": format!("src/module_{}.rs", turn % 50)}),
        };
        let user = Message::text(Role::User, question(turn));
        let asking = Message {
            role: Role::Assistant,
            content: vec![
                ContentPart::Text { text: "Let me read the file first.".to_owned() },
                ContentPart::ToolCall(ToolCall {
                    id: request.call_id.clone(),
                    name: request.tool.clone(),
                    arguments: request.arguments.clone(),
                }),
            ],
        };
        let requested = ToolRequestedPayload::new(
            format!("ht{turn}"),
            request.clone(),
            Some(Risk::ReadOnly),
            Some(ReplayPolicy::Idempotent),
        );
        let verdict =
            VerdictRecord { decision: Answer::Approve, by: "policy:readOnly".to_owned(), at: 1_700_000_000_000 };
        let started = ToolStartedPayload::new(&request, verdict);
        let receipt = ToolReceipt {
            exit_code: 0,
            output_summary: output(turn),
            structured_output: None,
            affected_entities: Vec::new(),
            duration_ms: 3,
            tier: Risk::ReadOnly,
            timestamp: 1_700_000_000_000,
            truncated: false,
        };
        let completed = ToolCompletedPayload::new(&request, receipt, None, None, Vec::new());
        let answer = Message::text(
            Role::Assistant,
            format!(
                "handle_{turn} validates its input, trims it to the limit and returns the rest; the error path is \
                 covered by test_handle_{turn}_rejects_empty_input."
            ),
        );
        let payloads = [
            ("message", to_raw(&user)?),
            ("message", to_raw(&asking)?),
            ("toolRequested", to_raw(&requested)?),
            ("toolStarted", to_raw(&started)?),
            ("toolCompleted", to_raw(&completed)?),
            ("message", to_raw(&answer)?),
        ];
        for (id, (entry_type, raw)) in ids.iter().zip(payloads) {
            tx = tx.entry(id.clone(), head.as_deref(), entry_type, raw);
            head = Some(id.clone());
        }
        in_tx += 1;
        if in_tx == batch.max(1) || turn + 1 == turns {
            tx = tx.set("lane", "main", to_raw(&head)?);
            store.commit(std::mem::take(&mut tx))?;
            in_tx = 0;
        }
    }
    Ok(head)
}
