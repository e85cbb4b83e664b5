//! The embedded default model, from the host's side: where it is installed,
//! `cairn model install`, and building the `local` provider. The model
//! itself (candle inference, constrained decoding) lives in cairn-local,
//! behind the `local` feature so the rest builds without candle.

use anyhow::Result;
use cairn_core::provider::Provider;

use crate::cli::Context;

#[cfg(not(feature = "local"))]
const NOT_BUILT: &str = "this cairn was built without the embedded model (cargo feature `local`); \
rebuild with default features, or choose a provider with --provider (see `cairn --help`)";

/// Build the `local` provider.
#[cfg(not(feature = "local"))]
pub fn provider(_ctx: &Context) -> Result<Box<dyn Provider + Send>> {
    anyhow::bail!(NOT_BUILT)
}

/// `cairn model install`.
#[cfg(not(feature = "local"))]
pub fn install(_ctx: &Context, _from: Option<&std::path::Path>) -> Result<u8> {
    anyhow::bail!(NOT_BUILT)
}

/// `cairn model path`.
#[cfg(not(feature = "local"))]
pub fn path(_ctx: &Context) -> Result<u8> {
    anyhow::bail!(NOT_BUILT)
}
