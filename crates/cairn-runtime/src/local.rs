//! The embedded default model, from the host's side: where it is installed,
//! `cairn model install`, and building the `local` provider. It returns
//! what it did (the CLI says it); it must not print. The model
//! itself (candle inference, constrained decoding) lives in cairn-local,
//! behind the `local` feature so the rest builds without candle.

#[cfg(not(feature = "local"))]
use anyhow::Result;
#[cfg(not(feature = "local"))]
use cairn_core::provider::Provider;

#[cfg(not(feature = "local"))]
use crate::setup::Setup;

#[cfg(feature = "local")]
mod embedded {
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    use anyhow::{Context as _, Result};
    use cairn_core::provider::Provider;
    use cairn_local::{LocalModel, LocalOptions, LocalProvider, Precision};

    use crate::setup::Setup;

    /// Where the model file is: the configured path, else the data directory.
    fn model_path(ctx: &Setup) -> PathBuf {
        ctx.settings.local_model_path.value.clone().unwrap_or_else(|| cairn_local::default_model_path(&ctx.paths.data))
    }

    /// Build the `local` provider (loads the model once per process) for a
    /// session in `cwd`.
    pub fn provider(ctx: &Setup, cwd: &Path) -> Result<Box<dyn Provider + Send>> {
        let path = model_path(ctx);
        if !path.is_file() {
            anyhow::bail!(
                "the embedded model is not installed (expected {}); run `cairn model install` \
                 (or ./scripts/quickstart), or choose another provider with --provider",
                path.display()
            );
        }
        let options = LocalOptions {
            precision: if ctx.settings.local_fast.value { Precision::Q8_0 } else { Precision::F32 },
            threads: ctx.settings.local_threads.value.max(1),
            ..LocalOptions::default()
        };
        let model: Arc<LocalModel> = LocalModel::shared(&path, options)
            .with_context(|| format!("cannot load the embedded model from {}", path.display()))?;
        // Path arguments are grounded in the session's working directory.
        Ok(Box::new(LocalProvider::new(model).with_workdir(cwd)))
    }

    /// `cairn model path`: where the model file is expected.
    pub fn path(ctx: &Setup) -> Result<PathBuf> {
        Ok(model_path(ctx))
    }

    /// `cairn model install [--from PATH]`: the installed file. Each step
    /// is told to `say` as it starts (a 98 MB download must not look like
    /// a hang).
    pub fn install(ctx: &Setup, from: Option<&Path>, say: &dyn Fn(&str)) -> Result<PathBuf> {
        Ok(cairn_local::install_model_reporting(&ctx.paths.data, from, say)?)
    }
}

#[cfg(feature = "local")]
pub use embedded::{install, path, provider};

#[cfg(not(feature = "local"))]
const NOT_BUILT: &str = "this cairn was built without the embedded model (cargo feature `local`); \
rebuild with default features, or choose a provider with --provider (see `cairn --help`)";

/// Build the `local` provider.
#[cfg(not(feature = "local"))]
pub fn provider(_ctx: &Setup, _cwd: &std::path::Path) -> Result<Box<dyn Provider + Send>> {
    anyhow::bail!(NOT_BUILT)
}

/// `cairn model install`.
#[cfg(not(feature = "local"))]
pub fn install(_ctx: &Setup, _from: Option<&std::path::Path>, _say: &dyn Fn(&str)) -> Result<std::path::PathBuf> {
    anyhow::bail!(NOT_BUILT)
}

/// `cairn model path`.
#[cfg(not(feature = "local"))]
pub fn path(_ctx: &Setup) -> Result<std::path::PathBuf> {
    anyhow::bail!(NOT_BUILT)
}
