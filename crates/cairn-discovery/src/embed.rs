//! all-MiniLM-L6-v2 sentence embeddings on the CPU with candle: BERT
//! (candle-transformers), mean pooling over the attention mask, L2
//! normalisation — the model card's pipeline (Transformer → Pooling(mean) →
//! Normalize), with its `max_seq_length` of 256 tokens.
//!
//! This module owns the embedding's shape and the [`Embedder`] type. The
//! embedder runs on candle only with the feature `minilm` (on by default,
//! `bert.rs`); without it (`absent.rs`) loading one fails with a message
//! saying so, and every caller falls back to BM25 as when the model is not
//! installed, so a build without candle still ranks. It must not rank or
//! write anything.

/// Width of an embedding.
pub const EMBEDDING_DIM: usize = 384;
/// Longest input in tokens (including `[CLS]` and `[SEP]`); longer text is
/// truncated, as sentence-transformers does for this model.
pub const MAX_TOKENS: usize = 256;

#[cfg(not(feature = "minilm"))]
mod absent;
#[cfg(feature = "minilm")]
mod bert;

#[cfg(not(feature = "minilm"))]
pub use absent::Embedder;
#[cfg(feature = "minilm")]
pub use bert::Embedder;

/// Cosine similarity of two unit vectors (their dot product).
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
