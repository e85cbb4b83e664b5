//! The one contract between cairn's faces and the program that runs their
//! sessions (the `cairn` binary). A face (the 9P tree and its batch queue,
//! the ACP agent, the MCP server) owns its protocol: how it shows events
//! and how it asks a person. Everything a session is built from — its
//! settings, the tools and settings of each turn (discovery's choice
//! recorded once, the subagent family handed down), undo and redo, the
//! providers it may use — comes from one [`SessionHost`], implemented once
//! by the binary, so every face gets the same session.
//!
//! Each face's own trait extends [`SessionHost`] with what only its
//! protocol needs (`cairn_9p::Host`: where sessions and the batch queue
//! live, the `providers` and `tools` files; `cairn_faces::Host`: creating
//! and opening sessions by id, an editor's MCP servers).
//!
//! A face runs its turns through [`Equipment`] (`running.rs`), the one
//! place core's `TurnEnv` is put together for a face.
//!
//! This crate must not build providers or tools, start processes or touch
//! the terminal: it is types and a trait over `cairn-core`.

mod running;

use std::path::Path;
use std::sync::Arc;

use cairn_core::approval::{Approver, PolicyApprover, SharedApprover};
use cairn_core::hooks::Hooks;
use cairn_core::storage::JsonlStore;
use cairn_core::tool::{Tool, ToolSpec};
use cairn_core::{RegistryError, Session, SessionConfig, ToolRegistry};
pub use running::{Equipment, Step, Unequipped};

/// What every face needs from the program hosting its sessions.
pub trait SessionHost: Send + Sync {
    /// Limits and settings of turns.
    fn session_config(&self) -> SessionConfig;

    /// The tools and settings of one turn of the session in `store`
    /// working in `cwd`, for a registry whose calls `approver` answers
    /// (the registry offers only what it can answer: `ToolRegistry::new`);
    /// `person` (if any) is who `approver` asks, shared with the children
    /// the session spawns. `prompt` is the new turn's request, `None` when
    /// the interrupted turn is resumed. A host that chooses tools by the
    /// request (discovery) records its choice in `store` before the turn's
    /// first entry and offers the recorded choice on resume.
    fn turn(
        &self,
        cwd: &Path,
        store: &mut JsonlStore,
        prompt: Option<&str>,
        approver: &PolicyApprover,
        person: Option<&SharedApprover>,
    ) -> anyhow::Result<(HostTools, SessionConfig)>;

    /// Undo (or redo) the file effects of `session`'s turns, working in
    /// `cwd`, and move its lane (no turn runs). Default: this host keeps
    /// no pre-images and cannot.
    fn rewind(&self, session: &mut Session<JsonlStore>, cwd: &Path, request: Rewind) -> anyhow::Result<Rewound> {
        let _ = (session, cwd, request);
        anyhow::bail!("this host keeps no pre-images, so it cannot undo or redo")
    }

    /// Before a turn of `session`: finish an undo that was killed after
    /// its plan was committed (what was done, for the person), so no turn
    /// runs on a half-reverted tree. Default: nothing to finish.
    fn finish_undo(&self, session: &mut Session<JsonlStore>, cwd: &Path) -> anyhow::Result<Option<String>> {
        let _ = (session, cwd);
        Ok(None)
    }

    /// The providers a session may use, each with what it runs, and the
    /// configured one. Default: only the configured one.
    fn providers(&self) -> ProviderChoices {
        ProviderChoices {
            current: "default".to_owned(),
            choices: vec![("default".to_owned(), "configured".to_owned())],
        }
    }
}

/// What undo or redo is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rewind {
    /// Undo the last turn (`None`) or turn N and every later one.
    Undo(Option<usize>),
    /// Reapply the undo the lane stands on.
    Redo,
}

/// What an undo or redo did, for the person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rewound {
    /// Done, or nothing to do: what happened.
    Done(String),
    /// Refused (a call that cannot be reverted, a file changed since):
    /// why, with the paths and diffs.
    Refused(String),
}

impl Rewound {
    /// The text for the person, whichever it was.
    pub fn text(&self) -> &str {
        match self {
            Rewound::Done(text) | Rewound::Refused(text) => text,
        }
    }
}

/// The providers a session may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderChoices {
    /// The configured provider's name.
    pub current: String,
    /// (name, the model it runs), the configured one among them.
    pub choices: Vec<(String, String)>,
}

impl ProviderChoices {
    /// One provider a line, the configured one marked `default` (the 9P
    /// tree's `providers` file).
    pub fn lines(&self) -> String {
        self.choices
            .iter()
            .map(|(name, _)| if *name == self.current { format!("{name} default\n") } else { format!("{name}\n") })
            .collect()
    }
}

/// The tools of a turn, before a face puts them in its registry.
pub struct HostTools {
    /// Built-ins, then external tools, then the subagent family's.
    pub tools: Vec<Arc<dyn Tool>>,
    /// Tools left out and why (broken metadata, untrusted workspace).
    pub notes: Vec<String>,
    /// The hooks every call goes through, set on the face's registry.
    pub hooks: Option<Arc<dyn Hooks>>,
}

impl HostTools {
    /// A registry for `approver` holding these tools and hooks. Each
    /// note, and each tool the registry refuses (a name taken twice),
    /// goes to `note` for the face to show.
    pub fn into_registry(self, approver: &dyn Approver, mut note: impl FnMut(&str)) -> ToolRegistry {
        for text in &self.notes {
            note(text);
        }
        self.registry(approver, note)
    }

    /// A registry for `approver` holding these tools and hooks; each tool
    /// it refuses (a name taken twice, a Destructive tool where nobody can
    /// be asked) goes to `note` (the notes are not told).
    pub fn registry(&self, approver: &dyn Approver, mut note: impl FnMut(&str)) -> ToolRegistry {
        self.registry_where(approver, |_| None, |spec, why| note(&format!("tool {} not offered: {why}", spec.name)))
    }

    /// A registry for `approver` holding these tools, less the ones `hide`
    /// gives a reason for (a face that cannot serve some tools: MCP hides
    /// Write tools no rule names), and the hooks. Each tool left out, hidden
    /// or refused by the registry, goes to `left_out` with why. The one
    /// place a turn's tools are registered, for every face (a layout test,
    /// `the_register_loop_is_written_once`, holds it).
    pub fn registry_where(
        &self,
        approver: &dyn Approver,
        mut hide: impl FnMut(&ToolSpec) -> Option<String>,
        mut left_out: impl FnMut(&ToolSpec, LeftOut),
    ) -> ToolRegistry {
        let mut registry = ToolRegistry::new(approver);
        registry.set_hooks(self.hooks.clone());
        for tool in &self.tools {
            let spec = tool.spec();
            if let Some(reason) = hide(spec) {
                left_out(spec, LeftOut::Hidden(reason));
            } else if let Err(e) = registry.register(Arc::clone(tool)) {
                left_out(spec, LeftOut::Refused(e));
            }
        }
        registry
    }
}

/// Why a turn's tool is not in a face's registry
/// ([`HostTools::registry_where`]).
#[derive(Debug)]
pub enum LeftOut {
    /// The face hid it, for this reason.
    Hidden(String),
    /// The registry refused it (a name taken twice, a Destructive tool
    /// where nobody can be asked).
    Refused(RegistryError),
}

impl std::fmt::Display for LeftOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeftOut::Hidden(reason) => f.write_str(reason),
            LeftOut::Refused(e) => write!(f, "{e}"),
        }
    }
}

impl std::fmt::Debug for HostTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostTools").field("tools", &self.tools.len()).field("notes", &self.notes).finish()
    }
}
