//! Context compaction from the command line: `cairn compact --context ID`
//! (summarise the conversation now), and the lines `cairn show` prints
//! about context: how much the last request used against the window, and
//! the folding of entries a compaction summary covers.
//!
//! The compaction itself (intent, summary, settlement) is core's
//! (`Session::compact`); this module only wires it and prints. It must not
//! write to a session except through that call.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context as _, Result};
use cairn_core::events::{CompactionPayload, EntryType};
use cairn_core::provider::AttemptUsage;
use cairn_core::storage::{JsonlStore, SessionIndex, Storage};
use cairn_core::{CancelToken, Session};
use cairn_provider::ProviderConfig;

use crate::invocation::{Invocation, exit};
use crate::render::{Renderer, escape_controls};
use crate::turns;

/// `cairn compact --context ID`: one compaction of the session's lane now.
pub fn compact(ctx: &Invocation, path: &Path) -> Result<u8> {
    let mut renderer = Renderer::new(turns::mode(ctx));
    let store = crate::parts::open_session(ctx, path)?;
    let cwd = std::path::PathBuf::from(&store.header().cwd);
    let id = store.header().id.clone();
    let mut runner = turns::Runner::new(ctx, &cwd, true)?;
    runner.continue_provider(ctx, &store, &mut renderer);
    let session = Session::open(store, crate::parts::session_config(ctx))?;
    let mut session = runner.reequip(ctx, session, None, &mut renderer)?;
    let cancel = CancelToken::new();
    let made = runner
        .compact(&mut session, &mut |event| renderer.event(event), &cancel)
        .with_context(|| format!("session {id}"))?;
    match made {
        Some(entry) => println!("compacted session {id}: summary entry {}", escape_controls(&entry)),
        None => println!("nothing to compact in session {id}: no messages before the last user message"),
    }
    Ok(exit::SUCCESS)
}

/// The entries each compaction covers (entry id → compaction id), walking
/// from each summary's last covered entry back to the previous summary's.
pub fn covered(index: &SessionIndex) -> HashMap<String, String> {
    let mut out = HashMap::new();
    // Only compaction entries are materialised for the outer pass.
    index.visit_entries_of_type(EntryType::Compaction.tag(), |entry| {
        let Some(p) = cairn_core::events::payload_of::<CompactionPayload>(entry) else { return };
        let stop = p
            .previous
            .as_deref()
            .and_then(|prev| index.entry(prev))
            .and_then(|e| e.payload.parse::<CompactionPayload>().ok())
            .map(|prev| prev.last_entry);
        let mut at = index.entry(&p.last_entry);
        while let Some(e) = at {
            if Some(&e.id) == stop.as_ref() {
                break;
            }
            out.entry(e.id.clone()).or_insert_with(|| entry.id.clone());
            at = e.parent_id.as_deref().and_then(|parent| index.entry(parent));
        }
    });
    out
}

/// The context line of `cairn show`: the input tokens the API reported
/// for the session's last request, against the window of its model.
pub fn context_line(ctx: &Invocation, store: &JsonlStore) -> Option<String> {
    let rows = store.usage();
    let last = rows
        .iter()
        .rev()
        .filter_map(|r| r.usage.parse::<AttemptUsage>().ok())
        .find(|u| u.error.is_none() && u.input_tokens > 0)?;
    let configured = ProviderConfig::resolve(&last.provider, ctx.settings.providers.get(&last.provider)).ok();
    let window =
        configured.and_then(|c| c.context_window).or_else(|| cairn_provider::window::known_context_window(&last.model));
    let share = window.map_or_else(
        || " (window unknown: set [providers.NAME] context_window)".to_owned(),
        |w| format!(" of a {w}-token window ({}%)", last.input_tokens * 100 / u64::from(w).max(1)),
    );
    Some(format!(
        "context {} tokens in the last request to {}/{}{share}; compaction at {}%{}",
        last.input_tokens,
        last.provider,
        last.model,
        ctx.settings.compaction_threshold.value,
        if ctx.common.no_compaction { " (off: --no-compaction)" } else { "" }
    ))
}
