//! The embedder of a build without the feature `minilm`: a type with no
//! values, whose [`Embedder::load`] always fails saying why, so callers take
//! their BM25 fallback and a build without candle still ranks tools.
//!
//! This module must not pretend to embed: no vector ever comes out of it.

use std::convert::Infallible;
use std::path::Path;
use std::time::Duration;

use crate::DiscoveryError;

/// Never constructed in this build; see [`Embedder::load`].
#[derive(Debug)]
pub struct Embedder {
    never: Infallible,
}

impl Embedder {
    /// Always fails: this build has no embedding model runtime.
    pub fn load(_dir: &Path, _threads: usize) -> Result<Self, DiscoveryError> {
        Err(DiscoveryError::Load(
            "this cairn was built without the MiniLM embedder (cargo feature `minilm` of cairn-discovery, on by \
             default: rebuild without --no-default-features to rank with it)"
                .into(),
        ))
    }

    /// Threads the forward passes run on.
    pub fn threads(&self) -> usize {
        match self.never {}
    }

    /// The unit-length embedding of one request.
    pub fn embed_query(&self, _text: &str) -> Result<Vec<f32>, DiscoveryError> {
        match self.never {}
    }

    /// Token ids of `text` as the model sees them.
    pub fn token_ids(&self, _text: &str) -> Result<Vec<u32>, DiscoveryError> {
        match self.never {}
    }

    /// Unit-length embeddings of `texts`, in order.
    pub fn embed<S: AsRef<str>>(&self, _texts: &[S]) -> Result<Vec<Vec<f32>>, DiscoveryError> {
        match self.never {}
    }

    /// Where one request's time goes (the benchmark's `--profile`).
    pub fn profile_request(&self, _text: &str, _n: u32) -> Result<Vec<(String, Duration)>, DiscoveryError> {
        match self.never {}
    }
}
