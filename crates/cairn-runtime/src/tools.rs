//! The one carrier of a turn's tools inside the runtime: [`TurnTools`],
//! what a turn of a session may be offered, read once per turn from one
//! source (the in-process tools, `wiring::tool_entries`, or a tool
//! service's, `toolsrv::turn_tools`, which makes that choice), each tool
//! with where it comes from. Discovery ranks from it, `cairn tools` and the
//! 9P `tools` file list it, and [`TurnTools::chosen`] hands a face the
//! tools discovery kept as `cairn_host::HostTools`, the carrier every face
//! puts in its registry (`HostTools::registry`, the one "register each
//! tool, note a refusal" loop).
//!
//! Must not: read tools or choose where they come from (`toolsrv.rs` does,
//! once per turn), nor choose among them (`discover.rs` does).

use std::collections::BTreeSet;
use std::sync::Arc;

use cairn_core::hooks::Hooks;
use cairn_host::HostTools;
use cairn_tools::{ToolEntry, ToolOrigin};

/// The tools a turn of a session may be offered, and what to tell about
/// the ones left out.
#[derive(Debug, Default)]
pub struct TurnTools {
    /// Each tool and where it comes from: built-ins, then external tools,
    /// then MCP servers' (in-process); or a tool service's, in its order.
    pub entries: Vec<ToolEntry>,
    /// Tools left out: broken metadata, shadowed names, an unreadable
    /// service meta.
    pub notes: Vec<String>,
    /// Workspace tools and files not loaded because the directory is not
    /// trusted, and how to trust it: said even by a headless face.
    pub untrusted: Vec<String>,
    /// The hooks every call goes through (`[hooks]`; they run in this
    /// process, also for a tool service's tools).
    pub hooks: Option<Arc<dyn Hooks>>,
}

impl TurnTools {
    /// Whether `entry` is one of cairn's core tools (always offered;
    /// discovery chooses among the others): a built-in, or a tool service's
    /// tool of a built-in's name (the service's own built-in).
    pub fn is_core(entry: &ToolEntry) -> bool {
        match &entry.origin {
            ToolOrigin::Builtin => true,
            ToolOrigin::Service { .. } => {
                cairn_tools::builtin::BUILTIN_NAMES.contains(&entry.tool.spec().name.as_str())
            }
            _ => false,
        }
    }

    /// The core tools and, when `keep` is given (discovery's choice), only
    /// the other tools it names (`None`: every tool); with the hooks and
    /// the notes (the untrusted ones stay in [`TurnTools::untrusted`]).
    pub fn chosen(&self, keep: Option<&BTreeSet<String>>) -> HostTools {
        let tools = self
            .entries
            .iter()
            .filter(|e| Self::is_core(e) || keep.is_none_or(|k| k.contains(&e.tool.spec().name)))
            .map(|e| Arc::clone(&e.tool))
            .collect();
        HostTools { tools, notes: self.notes.clone(), hooks: self.hooks.clone() }
    }
}
