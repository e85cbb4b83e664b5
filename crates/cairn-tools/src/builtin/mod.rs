//! The built-in tools and what they share: argument parsing, receipts
//! and the list the CLI registers.
//!
//! In-process built-ins (`read_file`, `list_dir`, `search`, `write_file`,
//! `edit_file`) confine every path with [`crate::paths`]; `shell` starts a
//! process and therefore runs under the sandbox; `plan` only records the
//! model's plan in the session. This module does not know about external
//! tools.

pub mod edit;
pub mod files;
pub mod plan;
pub mod shell;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use cairn_core::tool::{Capability, Risk, ToolError, ToolReceipt, ToolRequest};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{ToolEntry, ToolOrigin, ToolsConfig};

/// Every built-in tool, ready for the turn. Fails only when a configured
/// destructive pattern is not a valid regex.
pub fn builtin_tools(config: &ToolsConfig) -> Result<Vec<ToolEntry>, shell::PatternError> {
    let tools: Vec<Arc<dyn cairn_core::tool::Tool>> = vec![
        Arc::new(files::ReadFile::new(config)),
        Arc::new(files::ListDir::new(config)),
        Arc::new(files::Search::new(config)),
        Arc::new(
            edit::WriteFile::with_preimages(crate::undo::PreimageStore::from_config(config))
                .with_authority(config.authority.clone()),
        ),
        Arc::new(
            edit::EditFile::with_preimages(crate::undo::PreimageStore::from_config(config))
                .with_authority(config.authority.clone()),
        ),
        Arc::new(shell::Shell::new(config)?),
        Arc::new(plan::PlanTool::new()),
    ];
    Ok(tools.into_iter().map(|tool| ToolEntry { tool, origin: ToolOrigin::Builtin }).collect())
}

/// Names of the built-ins (external tools may not take them).
pub const BUILTIN_NAMES: &[&str] = &["read_file", "list_dir", "search", "write_file", "edit_file", "shell", "plan"];

/// Parse a request's arguments into `T`, with a message the model can act on.
pub(crate) fn parse_args<T: DeserializeOwned>(request: &ToolRequest) -> Result<T, String> {
    serde_json::from_value(request.arguments.clone())
        .map_err(|e| format!("invalid arguments for {}: {e}; check the tool's parameter schema", request.tool))
}

pub(crate) fn caps(list: &[Capability]) -> BTreeSet<Capability> {
    list.iter().copied().collect()
}

/// A successful receipt.
pub(crate) fn receipt(
    start: Instant,
    tier: Risk,
    summary: String,
    cap: usize,
    structured: Option<Value>,
    affected: Vec<String>,
) -> ToolReceipt {
    let (output_summary, truncated) = crate::cap_text(summary, cap);
    ToolReceipt {
        exit_code: 0,
        output_summary,
        structured_output: structured,
        affected_entities: affected,
        duration_ms: start.elapsed().as_millis() as u64,
        tier,
        timestamp: crate::now_ms(),
        truncated,
    }
}

pub(crate) fn denied(e: crate::paths::PathError) -> ToolError {
    ToolError::AccessDenied(e.to_string())
}

pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> ToolError {
    let context = context.into();
    move |source| ToolError::Io { context, source }
}
