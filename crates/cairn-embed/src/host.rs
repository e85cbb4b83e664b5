//! The agent's session host: the runtime's own (`RuntimeHost`, which equips
//! every face's turns), with the offer narrowed to the [`Builtins`] the
//! application chose and its own tools added.
//!
//! Must not: choose tools by itself or change how a turn is equipped: it
//! only filters what `RuntimeHost::turn` (or, for a database session,
//! `equip::turn`) equipped and appends ([`narrow`]).

use std::path::Path;

use anyhow::{Result, bail};
use cairn_core::Session;
use cairn_core::SessionConfig;
use cairn_core::approval::{PolicyApprover, SharedApprover};
use cairn_core::storage::JsonlStore;
use cairn_host::{HostTools, ProviderChoices, Rewind, Rewound, SessionHost};
use cairn_runtime::hosting::RuntimeHost;

use crate::{Builtins, ToolDef};

pub(crate) struct EmbedHost<'a> {
    pub(crate) inner: &'a RuntimeHost,
    pub(crate) tools: &'a [ToolDef],
    pub(crate) builtins: &'a Builtins,
}

impl SessionHost for EmbedHost<'_> {
    fn session_config(&self) -> SessionConfig {
        self.inner.session_config()
    }

    fn turn(
        &self,
        cwd: &Path,
        store: &mut JsonlStore,
        prompt: Option<&str>,
        approver: &PolicyApprover,
        person: Option<&SharedApprover>,
    ) -> Result<(HostTools, SessionConfig)> {
        let (mut host_tools, config) = self.inner.turn(cwd, store, prompt, approver, person)?;
        narrow(&mut host_tools, self.builtins, self.tools)?;
        Ok((host_tools, config))
    }

    fn rewind(&self, session: &mut Session<JsonlStore>, cwd: &Path, request: Rewind) -> Result<Rewound> {
        self.inner.rewind(session, cwd, request)
    }

    fn finish_undo(&self, session: &mut Session<JsonlStore>, cwd: &Path) -> Result<Option<String>> {
        self.inner.finish_undo(session, cwd)
    }

    fn providers(&self) -> ProviderChoices {
        self.inner.providers()
    }
}

/// What the runtime equipped a turn with (`host_tools`), narrowed to the
/// [`Builtins`] the application chose, with its own `tools` appended: the
/// one place an agent's offer is decided, for session files and databases.
pub(crate) fn narrow(host_tools: &mut HostTools, builtins: &Builtins, tools: &[ToolDef]) -> Result<()> {
    match builtins {
        Builtins::All => {}
        Builtins::None => host_tools.tools.clear(),
        Builtins::Only(names) => {
            for name in names {
                if !host_tools.tools.iter().any(|t| t.spec().name == *name) {
                    bail!("builtin tool {name:?} is not offered here (a typo, or a tool this directory lacks)");
                }
            }
            host_tools.tools.retain(|t| names.contains(&t.spec().name));
        }
    }
    host_tools.tools.extend(tools.iter().cloned().map(ToolDef::into_tool));
    Ok(())
}
