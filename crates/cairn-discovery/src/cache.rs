//! The on-disk embedding cache: one small file per embedded text, named by
//! the sha256 of the model's weights digest and the text, so a restart
//! re-embeds only what changed and a different model never reuses vectors.
//!
//! A file is written to a temporary name and renamed into place, so a crash
//! leaves either the whole vector or nothing; a file of the wrong size (torn
//! by something else, or from a bug) is treated as absent and rewritten.
//! This module must not decide what is embedded.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::doc::hex;
use crate::embed::EMBEDDING_DIM;
use crate::model::MODEL_FILES;
use crate::{DiscoveryError, Embedder};

/// Embeddings stored under a directory, keyed by content hash.
#[derive(Debug, Clone)]
pub struct EmbeddingCache {
    dir: PathBuf,
}

impl EmbeddingCache {
    /// Use (and create) `dir` for cached vectors.
    pub fn open(dir: &Path) -> Result<Self, DiscoveryError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| DiscoveryError::io(format!("cannot create the embedding cache {}", dir.display()), e))?;
        Ok(EmbeddingCache { dir: dir.to_path_buf() })
    }

    /// The cache key of `text`.
    pub fn key(text: &str) -> String {
        let mut h = Sha256::new();
        h.update(MODEL_FILES[0].1.as_bytes());
        h.update([0u8]);
        h.update(text.as_bytes());
        hex(&h.finalize())
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.f32"))
    }

    /// The cached vector of `text`, if present and whole.
    pub fn get(&self, text: &str) -> Option<Vec<f32>> {
        let bytes = std::fs::read(self.path(&Self::key(text))).ok()?;
        if bytes.len() != EMBEDDING_DIM * 4 {
            return None;
        }
        let v: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        v.iter().all(|x| x.is_finite()).then_some(v)
    }

    /// Store the vector of `text` (atomically).
    pub fn put(&self, text: &str, vector: &[f32]) -> Result<(), DiscoveryError> {
        let key = Self::key(text);
        let dest = self.path(&key);
        let tmp = self.dir.join(format!(".{key}.{}.tmp", std::process::id()));
        let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(&tmp, &bytes).map_err(|e| DiscoveryError::io(format!("cannot write {}", tmp.display()), e))?;
        std::fs::rename(&tmp, &dest).map_err(|e| DiscoveryError::io(format!("cannot rename to {}", dest.display()), e))
    }

    /// Vectors of `texts`, from the cache where present, else computed with
    /// `embedder` and stored. Returns the vectors and how many were computed.
    pub fn embed(&self, embedder: &Embedder, texts: &[String]) -> Result<(Vec<Vec<f32>>, usize), DiscoveryError> {
        let mut out: Vec<Option<Vec<f32>>> = texts.iter().map(|t| self.get(t)).collect();
        let missing: Vec<usize> = out.iter().enumerate().filter(|(_, v)| v.is_none()).map(|(i, _)| i).collect();
        let todo: Vec<&str> = missing.iter().map(|&i| texts[i].as_str()).collect();
        let computed = embedder.embed(&todo)?;
        for (&i, v) in missing.iter().zip(computed) {
            self.put(&texts[i], &v)?;
            out[i] = Some(v);
        }
        let vectors = out.into_iter().map(Option::unwrap_or_default).collect();
        Ok((vectors, missing.len()))
    }
}
