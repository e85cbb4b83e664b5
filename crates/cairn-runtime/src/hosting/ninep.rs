//! The 9P tree's and batch queue's host (`cairn_9p::Host`): where served
//! sessions and the batch queue live, the providers a served session may
//! name, `[batch] max_running`, and the `tools` file; everything else a
//! served session is built from is [`RuntimeHost`]'s `SessionHost`.
//!
//! Must not: speak 9P or listen (`cairn serve` does, in the binary).

use std::path::{Path, PathBuf};

use anyhow::Result;
use cairn_9p::{Host, SessionSpec};
use cairn_core::provider::Provider;
use cairn_core::storage::StoreOptions;
use cairn_provider::ProviderConfig;

use crate::hosting::RuntimeHost;
use crate::setup::Setup;

impl Host for RuntimeHost {
    fn sessions_dir(&self) -> PathBuf {
        self.ctx.paths.sessions()
    }

    fn archive_dir(&self) -> PathBuf {
        self.ctx.paths.data.join("archive")
    }

    fn store_options(&self) -> StoreOptions {
        self.ctx.settings.store_options()
    }

    fn check_provider(&self, name: &str) -> Result<()> {
        ProviderConfig::resolve(name, self.ctx.settings.providers.get(name))
            .map(|_| ())
            .map_err(|e| anyhow::anyhow!("provider={name:?}: {e} (read the providers file for the configured ones)"))
    }

    fn provider(&self, spec: &SessionSpec, cwd: &Path) -> Result<Box<dyn Provider + Send>> {
        fn opt(s: &str) -> Option<&str> {
            Some(s).filter(|s| !s.is_empty())
        }
        // A session on the server's own provider without a script of its
        // own keeps the server's `--script` (issue 49.9: `cairn --script F
        // serve` dropped it, and every prompt failed).
        let s = &self.ctx.settings;
        let script = opt(&spec.script)
            .map(Path::new)
            .or_else(|| (spec.provider == s.provider.value).then_some(s.script.value.as_deref()).flatten());
        crate::parts::provider_for(&self.ctx, &spec.provider, opt(&spec.model), script, cwd)
    }

    fn batch_max_running(&self) -> usize {
        max_running(&self.ctx)
    }

    fn tools_text(&self) -> String {
        // What a turn here gets: the tool service's tools with `--toolsrv`.
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        match crate::tools::turn_tools(&self.ctx, &cwd) {
            Ok(tools) => tools
                .entries
                .iter()
                .map(|e| {
                    let spec = e.tool.spec();
                    let caps: Vec<String> = spec.capabilities.iter().map(|c| format!("{c:?}")).collect();
                    format!("{} {:?} {} {}\n", spec.name, spec.risk, caps.join(","), e.origin)
                })
                .collect(),
            Err(e) => format!("error: {e:#}\n"),
        }
    }
}

pub use crate::config::BatchConfig;
use crate::config::default_max_running;

/// `[batch] max_running`: sessions of batch jobs run at once.
pub fn max_running(ctx: &Setup) -> usize {
    match ctx.settings.batch.clone().map(toml::Value::try_into::<BatchConfig>) {
        None => default_max_running(),
        Some(Ok(config)) => config.max_running.max(1),
        Some(Err(e)) => {
            ctx.notes.info(format!(
                "[batch] in {} is invalid ({e}); using max_running = 2",
                ctx.settings.config_file.display()
            ));
            default_max_running()
        }
    }
}
