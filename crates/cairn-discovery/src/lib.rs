//! cairn's discovery: which installed tools and skills are relevant to a
//! request, ranked by BM25 over their metadata, by all-MiniLM-L6-v2 sentence
//! embeddings (candle, in process), or by both combined.
//!
//! This crate owns ranking, the embedding model's files and the on-disk
//! embedding cache. It must not run tools, talk to a provider or decide what a
//! turn does with the ranking beyond the [`Selection`] policy (core tools
//! plus at most N tools and M skills above a threshold); hosts record the
//! selection in the session.

mod bm25;
mod cache;
mod doc;
mod embed;
mod error;
pub mod eval;
mod install;
mod model;
mod rank;
pub mod skills;

pub use bm25::{Bm25, tokenize};
pub use cache::EmbeddingCache;
pub use doc::{DocKind, Document, ParamDoc};
pub use embed::{EMBEDDING_DIM, Embedder, MAX_TOKENS};
pub use error::DiscoveryError;
pub use install::install_model;
pub use model::{
    MODEL_DIR_NAME, MODEL_FILES, MODEL_PACKAGE, MODEL_PACKAGE_VERSION, WHEEL_SHA256, default_model_dir,
    model_dir_from_env, verify_model_dir,
};
pub use rank::{COMBINED_BM25_WEIGHT, Candidate, Index, Method, Ranking, SHIPPED_METHOD, Selection, SelectionPolicy};
