//! The configuration as every face's host: one [`RuntimeHost`] implements
//! `cairn_host::SessionHost` (each turn's tools and settings from
//! `equip.rs`, undo and redo, the providers) for the 9P tree and its batch
//! queue (`ninep.rs` adds `cairn_9p::Host`) and for ACP and MCP
//! (`faces.rs` adds `cairn_faces::Host`), so a capability added to
//! sessions reaches every served face through this one implementation.
//!
//! Must not: speak a protocol, render or ask a person (the faces do).

use std::path::{Path, PathBuf};

use anyhow::Result;
use cairn_core::approval::{PolicyApprover, SharedApprover};
use cairn_core::storage::{JsonlStore, Storage as _};
use cairn_core::{Session, SessionConfig};
use cairn_host::{HostTools, ProviderChoices, Rewind, Rewound, SessionHost};

use crate::setup::Setup;

mod faces;
mod ninep;
#[cfg(feature = "postgres")]
mod worker;

pub use ninep::{BatchConfig, max_running};

/// The runtime as the faces' host: the resolved configuration, hosting
/// the sessions of every face (`cairn run`'s own turns, 9P, ACP, MCP,
/// PostgreSQL workers, the actors' agent, `cairn-embed`). "Host" names only
/// this side of cairn-host's contract.
#[derive(Debug)]
pub struct RuntimeHost {
    pub ctx: Setup,
}

/// The provider a served session was created with (its 9P `serve` fact),
/// if it names one: its children run on it, as `cairn run`'s run on the
/// flags'.
fn served_provider(store: &JsonlStore) -> Option<crate::subagents::ParentProvider> {
    let spec: cairn_9p::SessionSpec =
        store.register(cairn_core::storage::registers::FACT, cairn_9p::host::SPEC_FACT)?.parse().ok()?;
    let some = |s: String| Some(s).filter(|s| !s.is_empty());
    Some(crate::subagents::ParentProvider {
        name: some(spec.provider)?,
        model: some(spec.model),
        script: some(spec.script).map(PathBuf::from),
    })
}

impl SessionHost for RuntimeHost {
    fn session_config(&self) -> SessionConfig {
        crate::parts::session_config(&self.ctx)
    }

    fn turn(
        &self,
        cwd: &Path,
        store: &mut JsonlStore,
        prompt: Option<&str>,
        approver: &PolicyApprover,
        person: Option<&SharedApprover>,
    ) -> Result<(HostTools, SessionConfig)> {
        let mut inheritance = crate::subagents::Inheritance::of(approver, person.cloned());
        inheritance.provider = served_provider(store);
        let answerer = crate::equip::Answerer { approver, family: Some(&inheritance) };
        let equipped = crate::equip::turn(&self.ctx, cwd, store, prompt, answerer, self.session_config())?;
        let config = equipped.config.clone();
        Ok((equipped.into_host_tools(), config))
    }

    fn rewind(&self, session: &mut Session<JsonlStore>, cwd: &Path, request: Rewind) -> Result<Rewound> {
        use cairn_tools::rewind::{self, Outcome, Target};
        let kept = crate::undo::store(&self.ctx);
        let outcome = match request {
            Rewind::Undo(n) => {
                let target = n.map_or(Target::LastTurn, Target::Turn);
                rewind::undo(&kept, session, cwd, &target, crate::undo::DELEGATING, false, false)?
            }
            Rewind::Redo => rewind::redo(&kept, session, cwd, false, false)?,
        };
        Ok(match outcome {
            Outcome::Refused(why) => Rewound::Refused(why),
            Outcome::Nothing(text) | Outcome::DryRun(text) | Outcome::Done(text) => Rewound::Done(text),
        })
    }

    fn finish_undo(&self, session: &mut Session<JsonlStore>, cwd: &Path) -> Result<Option<String>> {
        crate::undo::finish_interrupted(&self.ctx, session, cwd)
    }

    fn providers(&self) -> ProviderChoices {
        let s = &self.ctx.settings;
        let current = s.provider.value.clone();
        let mut names: Vec<String> = cairn_provider::config::BUILTIN_NAMES.iter().map(|n| (*n).to_owned()).collect();
        names.extend(s.providers.keys().filter(|k| !names.contains(k)).cloned().collect::<Vec<_>>());
        let choices = names
            .into_iter()
            .map(|name| {
                let model = if name == current {
                    s.model.value.clone()
                } else {
                    cairn_provider::config::ProviderConfig::resolve(&name, s.providers.get(&name))
                        .ok()
                        .and_then(|c| c.model)
                };
                let label = match model {
                    Some(model) => format!("{name}: {model}"),
                    None => name.clone(),
                };
                (name, label)
            })
            .collect();
        ProviderChoices { current, choices }
    }
}
