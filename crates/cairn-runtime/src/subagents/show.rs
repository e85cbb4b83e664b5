//! A family as `cairn show` tells it: a session's own and its
//! descendants' usage, and under a `spawn_agent` intent the child it names
//! with its children, state, tokens and answer.
//!
//! Must not: write a session (every store here is opened read-only).

use cairn_core::report::{FamilyUsage, UsageTotals};
use cairn_core::storage::{JsonlStore, Storage};

use super::{ChildResult, ChildStatus, SPAWN, status};
use crate::family::child_id;
use crate::setup::Setup;

/// `usage …` for `cairn show`: the session's own tokens and its
/// descendants' (the ledgers summed by `cairn_core::ledger`).
pub fn usage_line<S: Storage>(ctx: &Setup, store: &S) -> String {
    let own = UsageTotals::of(store);
    let family = FamilyUsage::of(&ctx.paths.sessions(), &store.header().id, ctx.settings.store_options());
    let children = &family.totals;
    let mut line = format!("usage: own {} in / {} out tokens ({} attempts)", own.input, own.output, own.attempts);
    if family.sessions > 0 {
        line.push_str(&format!(
            "; {} descendant sessions {} in / {} out ({} attempts); total {} in / {} out",
            family.sessions,
            children.input,
            children.output,
            children.attempts,
            own.input + children.input,
            own.output + children.output
        ));
    }
    line
}

/// For `cairn show`: under a `spawn_agent` intent of session `parent`, the
/// child it names (and, indented, that child's own children): state,
/// tokens and answer.
pub fn child_lines(ctx: &Setup, parent: &str, entry: cairn_core::storage::EntryView<'_>) -> Vec<String> {
    use cairn_core::events::{EntryPayload, ToolRequestedPayload};
    let mut lines = Vec::new();
    if entry.entry_type != ToolRequestedPayload::TYPE.tag() {
        return lines;
    }
    // Only a payload naming the tool (or with a `\u` escape, which could
    // spell it) can be a spawn: the others are not parsed a second time.
    if !entry.payload.contains(SPAWN) && !entry.payload.contains("\\u") {
        return lines;
    }
    let Ok(p) = entry.parse::<ToolRequestedPayload>() else {
        return lines;
    };
    if p.request.tool != SPAWN {
        return lines;
    }
    child_tree(ctx, &child_id(parent, &p.invocation_id), 0, &mut lines);
    lines
}

fn child_tree(ctx: &Setup, id: &str, depth: usize, lines: &mut Vec<String>) {
    let pad = "   ".repeat(depth);
    let path = ctx.paths.sessions().join(format!("{id}.jsonl"));
    let Ok(store) = JsonlStore::open_read_only_with(&path, ctx.settings.store_options()) else {
        lines.push(format!("{pad}└─ child {id}: not created"));
        return;
    };
    let tokens = UsageTotals::of(&store);
    let mut grandchildren = Vec::new();
    store.visit_entries(&mut |e| {
        if let Some(p) = cairn_core::events::payload_of::<cairn_core::events::ToolRequestedPayload>(e)
            && p.request.tool == SPAWN
        {
            grandchildren.push(child_id(id, &p.invocation_id));
        }
    });
    let state = match status(ctx, store) {
        Ok(ChildStatus::NotStarted) => "not started".to_owned(),
        Ok(ChildStatus::Unfinished) => "interrupted (resumed by its parent)".to_owned(),
        Ok(ChildStatus::Finished(ChildResult::Answered(a))) => {
            format!("answered: {}", crate::escape::short(a.trim(), 80))
        }
        Ok(ChildStatus::Finished(ChildResult::Failed(why))) => format!("failed: {why}"),
        Err(e) => format!("unreadable: {e:#}"),
    };
    lines.push(format!("{pad}└─ child {id} — {} in / {} out tokens — {state}", tokens.input, tokens.output));
    for grandchild in grandchildren {
        child_tree(ctx, &grandchild, depth + 1, lines);
    }
}
