//! The events a session's log re-tells: what observers of its turns were
//! told, rebuilt from the committed entries and usage rows alone, so a
//! reader that arrives late (the 9P `event` file read from the start, a
//! client that reconnects) sees the same schema as one that watched live.
//!
//! Owns the mapping from committed records to [`TurnEvent`]s. Only what the
//! log keeps can be re-told: streamed deltas, tool output chunks and the
//! approval questions themselves are not in it. Turn ids are rebuilt the
//! way the turn makes them (`t` and the seq of the commit that holds the
//! user's message). Must not write, decide, or read anything but the
//! records it is given.

use std::collections::HashMap;

use crate::events::{
    CompactionPayload, EntryType, ToolCompletedPayload, ToolFailedPayload, ToolRejectedPayload, ToolRequestedPayload,
    ToolStagedPayload, ToolStartedPayload, TurnCancelledPayload, TurnEvent, payload_of,
};
use crate::message::{Message, Role};
use crate::provider::{AttemptUsage, StopReason};
use crate::storage::{Entry, UsageRow};
use crate::tool::Risk;

/// Re-tells records in commit order. Feed it entries and usage rows with
/// [`Retell::records`]; it keeps what it needs across calls (the current
/// turn, the risk of each requested call), so a log can be re-told in
/// pieces as it grows.
#[derive(Debug, Default)]
pub struct Retell {
    turn: String,
    risks: HashMap<String, Option<Risk>>,
    last_seq: u64,
}

impl Retell {
    /// A re-teller that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The highest seq re-told so far (0 before any).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Treat everything through `seq` as told (a live observer told it).
    pub fn skip_through(&mut self, seq: u64) {
        self.last_seq = self.last_seq.max(seq);
    }

    /// The events of every entry and usage row with a seq above
    /// [`Retell::last_seq`], in seq order, except that a usage row is told
    /// just before the answer it paid for (as the turn tells it). `lane` is
    /// what `turnStarted` names.
    pub fn records(&mut self, entries: &[Entry], usage: &[UsageRow], lane: &str) -> Vec<TurnEvent> {
        let from = self.last_seq;
        let fresh: Vec<&Entry> = entries.iter().filter(|e| e.seq > from).collect();
        let seq_of: HashMap<&str, u64> = fresh.iter().map(|e| (e.id.as_str(), e.seq)).collect();
        // (the seq it is told at, usage before entries, its own seq, index)
        let mut items: Vec<(u64, u8, u64, usize)> = Vec::new();
        for (i, u) in usage.iter().enumerate().filter(|(_, u)| u.seq > from) {
            let at = u.entry_id.as_deref().and_then(|id| seq_of.get(id)).copied().unwrap_or(u.seq);
            items.push((at, 0, u.seq, i));
        }
        items.extend(entries.iter().enumerate().filter(|(_, e)| e.seq > from).map(|(i, e)| (e.seq, 1, e.seq, i)));
        items.sort_unstable();
        let mut out = Vec::new();
        for (_, kind, seq, i) in items {
            self.last_seq = self.last_seq.max(seq);
            if kind == 0 {
                if let Ok(usage) = usage[i].usage.parse::<AttemptUsage>() {
                    out.push(TurnEvent::Usage { usage });
                }
            } else {
                self.entry(&entries[i], lane, &mut out);
            }
        }
        out
    }

    fn entry(&mut self, entry: &Entry, lane: &str, out: &mut Vec<TurnEvent>) {
        // An entry whose payload does not parse as its type is skipped: the
        // log's own check reports it; a view must not fail on it.
        let Some(kind) = EntryType::of_entry(entry) else {
            // A type a newer cairn writes: nothing this view can tell.
            return;
        };
        match kind {
            EntryType::Message => {
                let Some(message) = payload_of::<Message>(entry) else { return };
                match message.role {
                    Role::User => {
                        self.turn = format!("t{}", entry.seq);
                        out.push(TurnEvent::TurnStarted {
                            turn_id: self.turn.clone(),
                            lane: lane.to_owned(),
                            resumed: false,
                            prompt: Some(message.joined_text()),
                        });
                    }
                    Role::Assistant => {
                        let calls = message.tool_calls().count();
                        let stop = if calls > 0 { StopReason::ToolUse } else { StopReason::EndTurn };
                        out.push(TurnEvent::ProviderSettled { entry_id: entry.id.clone(), stop, tool_calls: calls });
                        if calls == 0 {
                            out.push(TurnEvent::Final {
                                turn_id: self.turn.clone(),
                                text: message.joined_text(),
                                entry_id: entry.id.clone(),
                            });
                        }
                    }
                    Role::System | Role::Tool => {}
                }
            }
            EntryType::ToolRequested => {
                let Some(p) = payload_of::<ToolRequestedPayload>(entry) else { return };
                self.turn.clone_from(&p.turn_id);
                self.risks.insert(p.invocation_id.clone(), p.tier);
                out.push(p.event());
            }
            EntryType::ToolStarted => {
                let Some(p) = payload_of::<ToolStartedPayload>(entry) else { return };
                out.push(TurnEvent::ApprovalVerdict { invocation_id: p.invocation_id.clone(), verdict: p.verdict });
                if let Some(risk) = self.risks.get(&p.invocation_id).copied().flatten() {
                    out.push(TurnEvent::ToolStarted { invocation_id: p.invocation_id, tool: p.tool, risk });
                }
            }
            EntryType::ToolStaged => {
                if let Some(p) = payload_of::<ToolStagedPayload>(entry) {
                    out.push(p.event());
                }
            }
            EntryType::ToolCompleted => {
                if let Some(p) = payload_of::<ToolCompletedPayload>(entry) {
                    out.push(p.event());
                }
            }
            EntryType::ToolFailed => {
                if let Some(p) = payload_of::<ToolFailedPayload>(entry) {
                    out.push(p.event());
                }
            }
            EntryType::ToolRejected => {
                if let Some(p) = payload_of::<ToolRejectedPayload>(entry) {
                    out.push(p.event());
                }
            }
            EntryType::TurnCancelled => {
                if let Some(p) = payload_of::<TurnCancelledPayload>(entry) {
                    out.push(TurnEvent::TurnCancelled { turn_id: p.turn_id });
                }
            }
            EntryType::Compaction => {
                if let Some(p) = payload_of::<CompactionPayload>(entry) {
                    out.push(TurnEvent::Compacted {
                        entry_id: entry.id.clone(),
                        messages: p.messages,
                        reason: p.reason,
                    });
                }
            }
            // No event of their own; their verdicts and reasons are in the log.
            EntryType::ToolBypass | EntryType::TurnEnded | EntryType::Undo | EntryType::UndoApplied => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::storage::RawJson;

    fn entry(seq: u64, id: &str, entry_type: &str, payload: &str) -> Entry {
        Entry {
            seq,
            timestamp: 0,
            id: id.to_owned(),
            parent_id: None,
            entry_type: entry_type.to_owned(),
            payload: RawJson::from_json(payload).unwrap(),
        }
    }

    fn types(events: &[TurnEvent]) -> Vec<String> {
        events.iter().map(|e| serde_json::to_value(e).unwrap()["type"].as_str().unwrap().to_owned()).collect()
    }

    /// Records copied from a real session file (`cairn run` with the
    /// scripted provider and one `read_file` call): the oracle is the log's
    /// own spelling, not the turn's code.
    const LOG: [(u64, &str, &str, &str); 5] = [
        (1, "e1", "message", r#"{"role":"user","content":[{"type":"text","text":"go"}]}"#),
        (
            5,
            "e5",
            "message",
            r#"{"role":"assistant","content":[{"type":"toolCall","id":"c1","name":"read_file","arguments":{"path":"a.txt"}}]}"#,
        ),
        (
            10,
            "e10",
            "toolRequested",
            r#"{"invocationId":"i10","turnId":"t1","request":{"invocationId":"i10","callId":"c1","sessionId":"01a23045-7693-7231-a6e8-da989580abe0","tool":"read_file","arguments":{"path":"a.txt"}},"tier":"readOnly","replay":"idempotent"}"#,
        ),
        (
            11,
            "e11",
            "toolStarted",
            r#"{"invocationId":"i10","callId":"c1","tool":"read_file","verdict":{"decision":"approve","by":"policy:readOnly","at":1796106188458}}"#,
        ),
        (
            15,
            "e15",
            "toolCompleted",
            r#"{"invocationId":"i10","callId":"c1","tool":"read_file","receipt":{"exitCode":0,"outputSummary":"     1\thi\n","structuredOutput":{"firstLine":1,"linesShown":1,"path":"a.txt","totalLines":1},"affectedEntities":["a.txt"],"durationMs":0,"tier":"readOnly","timestamp":1796106188459,"truncated":false}}"#,
        ),
    ];

    fn usage(seq: u64, entry_id: &str) -> UsageRow {
        UsageRow {
            seq,
            id: format!("u{seq}"),
            entry_id: Some(entry_id.to_owned()),
            usage: RawJson::from_json(r#"{"provider":"scripted","model":"s.jsonl","attempt":1,"inputTokens":1,"outputTokens":20,"cachedInputTokens":0,"durationMs":0,"requestBytes":3235}"#).unwrap(),
        }
    }

    #[test]
    fn a_turn_with_a_call_is_retold_in_order_and_in_pieces() {
        let mut entries: Vec<Entry> = LOG[..3].iter().map(|(s, i, t, p)| entry(*s, i, t, p)).collect();
        let mut rows = vec![usage(6, "e5")];
        let mut retell = Retell::new();
        let first = retell.records(&entries, &rows, "main");
        assert_eq!(types(&first), ["turnStarted", "usage", "providerSettled", "toolRequested"]);
        let started = serde_json::to_value(&first[0]).unwrap();
        assert_eq!((started["turnId"].as_str(), started["prompt"].as_str()), (Some("t1"), Some("go")));
        let requested = serde_json::to_value(&first[3]).unwrap();
        assert_eq!((requested["tool"].as_str(), requested["risk"].as_str()), (Some("read_file"), Some("readOnly")));
        assert_eq!(retell.last_seq(), 10);

        entries.extend(LOG[3..].iter().map(|(s, i, t, p)| entry(*s, i, t, p)));
        entries.push(entry(20, "e20", "message", r#"{"role":"assistant","content":[{"type":"text","text":"done"}]}"#));
        rows.push(usage(21, "e20"));
        let second = retell.records(&entries, &rows, "main");
        assert_eq!(
            types(&second),
            ["approvalVerdict", "toolStarted", "toolCompleted", "usage", "providerSettled", "final"]
        );
        let last = serde_json::to_value(&second[5]).unwrap();
        assert_eq!((last["turnId"].as_str(), last["text"].as_str()), (Some("t1"), Some("done")));
        assert!(retell.records(&entries, &rows, "main").is_empty(), "nothing is told twice");
    }

    #[test]
    fn an_unparsable_payload_is_skipped_not_fatal() {
        let entries = vec![entry(2, "e2", "toolStarted", r#"{"nonsense":true}"#)];
        assert!(Retell::new().records(&entries, &[], "main").is_empty());
    }
}
