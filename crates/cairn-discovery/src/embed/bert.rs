//! The MiniLM embedder itself, on candle: loading the model files, the
//! tokenizer, batched forward passes and mean pooling (feature `minilm`).
//!
//! This module must not rank or write anything; it maps sentences to unit
//! vectors. The only state it keeps is a bounded in-memory map of recent
//! requests' vectors ([`Embedder::embed_query`]), so asking the same thing
//! again (a chat's repeated prompt, a resumed turn) skips the forward pass.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::Tokenizer;

use super::MAX_TOKENS;
use crate::DiscoveryError;
use crate::model::verify_model_dir;

/// Sentences run through the model together.
const BATCH: usize = 16;
/// Requests whose vectors are kept in memory ([`Embedder::embed_query`]).
const QUERY_CACHE: usize = 256;

/// The loaded model and tokenizer.
pub struct Embedder {
    model: BertModel,
    tokenizer: Tokenizer,
    sep: u32,
    pool: rayon::ThreadPool,
    /// Recent requests' vectors by text; emptied when full.
    queries: Mutex<HashMap<String, Vec<f32>>>,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder").field("threads", &self.pool.current_num_threads()).finish_non_exhaustive()
    }
}

fn embed_err(e: candle_core::Error) -> DiscoveryError {
    DiscoveryError::Embed(e.to_string())
}

impl Embedder {
    /// Load the model from `dir` (checked against the expected sha256s
    /// first), running forward passes on `threads` threads.
    pub fn load(dir: &Path, threads: usize) -> Result<Self, DiscoveryError> {
        verify_model_dir(dir)?;
        let config_path = dir.join("config.json");
        let config_text = std::fs::read_to_string(&config_path)
            .map_err(|e| DiscoveryError::io(format!("cannot read {}", config_path.display()), e))?;
        let config: Config = serde_json::from_str(&config_text)
            .map_err(|e| DiscoveryError::Load(format!("{}: {e}", config_path.display())))?;
        let weights_path = dir.join("model.safetensors");
        let weights = std::fs::read(&weights_path)
            .map_err(|e| DiscoveryError::io(format!("cannot read {}", weights_path.display()), e))?;
        let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, &Device::Cpu)
            .map_err(|e| DiscoveryError::Load(format!("{}: {e}", weights_path.display())))?;
        let model = BertModel::load(vb, &config).map_err(|e| DiscoveryError::Load(e.to_string()))?;
        let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| DiscoveryError::Load(format!("tokenizer.json: {e}")))?;
        // The file pads and truncates to 128; pooling needs the real tokens
        // and sentence-transformers truncates at 256 (done below).
        tokenizer.with_padding(None);
        tokenizer.with_truncation(None).map_err(|e| DiscoveryError::Load(format!("tokenizer.json: {e}")))?;
        let sep = tokenizer
            .token_to_id("[SEP]")
            .ok_or_else(|| DiscoveryError::Load("tokenizer.json has no [SEP] token".into()))?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .build()
            .map_err(|e| DiscoveryError::Load(format!("cannot start the embedding threads: {e}")))?;
        Ok(Embedder { model, tokenizer, sep, pool, queries: Mutex::new(HashMap::new()) })
    }

    /// Threads the forward passes run on.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// The unit-length embedding of one request, from memory when the same
    /// text was embedded recently (the vector is the same either way: the
    /// forward pass is deterministic).
    pub fn embed_query(&self, text: &str) -> Result<Vec<f32>, DiscoveryError> {
        if let Some(v) = self.queries.lock().unwrap_or_else(PoisonError::into_inner).get(text) {
            return Ok(v.clone());
        }
        let ids = self.token_ids(text)?;
        let vector = self.pool.install(|| self.embed_batch(&[ids])).map_err(embed_err)?.pop().unwrap_or_default();
        let mut cache = self.queries.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= QUERY_CACHE {
            cache.clear();
        }
        cache.insert(text.to_owned(), vector.clone());
        Ok(vector)
    }

    /// Token ids of `text` as the model sees them (`[CLS] … [SEP]`, at most
    /// [`MAX_TOKENS`]).
    pub fn token_ids(&self, text: &str) -> Result<Vec<u32>, DiscoveryError> {
        let enc = self.tokenizer.encode(text, true).map_err(|e| DiscoveryError::Embed(format!("tokenizer: {e}")))?;
        let mut ids = enc.get_ids().to_vec();
        if ids.len() > MAX_TOKENS {
            ids.truncate(MAX_TOKENS - 1);
            ids.push(self.sep);
        }
        Ok(ids)
    }

    /// Unit-length embeddings of `texts`, in order.
    pub fn embed<S: AsRef<str>>(&self, texts: &[S]) -> Result<Vec<Vec<f32>>, DiscoveryError> {
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(BATCH) {
            let ids = chunk.iter().map(|t| self.token_ids(t.as_ref())).collect::<Result<Vec<_>, _>>()?;
            out.extend(self.pool.install(|| self.embed_batch(&ids)).map_err(embed_err)?);
        }
        Ok(out)
    }

    fn embed_batch(&self, ids: &[Vec<u32>]) -> candle_core::Result<Vec<Vec<f32>>> {
        let width = ids.iter().map(Vec::len).max().unwrap_or(0);
        if width == 0 {
            return Ok(Vec::new());
        }
        let mut flat_ids = Vec::with_capacity(ids.len() * width);
        let mut flat_mask = Vec::with_capacity(ids.len() * width);
        for row in ids {
            flat_ids.extend(row.iter().copied());
            flat_ids.extend(std::iter::repeat_n(0u32, width - row.len()));
            flat_mask.extend(std::iter::repeat_n(1u32, row.len()));
            flat_mask.extend(std::iter::repeat_n(0u32, width - row.len()));
        }
        let device = Device::Cpu;
        let input = Tensor::from_vec(flat_ids, (ids.len(), width), &device)?;
        let mask = Tensor::from_vec(flat_mask, (ids.len(), width), &device)?;
        let types = input.zeros_like()?;
        let hidden = self.model.forward(&input, &types, Some(&mask))?; // (n, width, 384)
        let maskf = mask.to_dtype(DType::F32)?.unsqueeze(2)?; // (n, width, 1)
        let summed = hidden.broadcast_mul(&maskf)?.sum(1)?; // (n, 384)
        let counts = maskf.sum(1)?; // (n, 1)
        let mean = summed.broadcast_div(&counts)?;
        let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12f32, f32::MAX)?;
        mean.broadcast_div(&norm)?.to_vec2::<f32>()
    }
}

impl Embedder {
    /// Where one request's time goes (the benchmark's `--profile`): mean
    /// times over `n` runs of tokenizing `text`, of its forward pass and
    /// pooling on this embedder's threads and on candle's default threads,
    /// and of one of its feed-forward matmuls (`tokens × 384 · 384 × 1536`)
    /// with the weight as candle's `Linear` holds it (transposed view) and
    /// made contiguous.
    pub fn profile_request(&self, text: &str, n: u32) -> Result<Vec<(String, Duration)>, DiscoveryError> {
        let n = n.max(1);
        let mut out = Vec::new();
        let time = |f: &mut dyn FnMut() -> Result<(), DiscoveryError>| -> Result<Duration, DiscoveryError> {
            f()?;
            let start = Instant::now();
            for _ in 0..n {
                f()?;
            }
            Ok(start.elapsed() / n)
        };
        let ids = self.token_ids(text)?;
        out.push((format!("tokenize ({} tokens)", ids.len()), time(&mut || self.token_ids(text).map(drop))?));
        let one = std::slice::from_ref(&ids);
        let pooled = time(&mut || self.pool.install(|| self.embed_batch(one)).map(drop).map_err(embed_err))?;
        out.push((format!("forward + pooling, {} thread(s)", self.threads()), pooled));
        let global = time(&mut || self.embed_batch(one).map(drop).map_err(embed_err))?;
        out.push(("forward + pooling, candle's default threads".to_owned(), global));
        let dev = Device::Cpu;
        let x = Tensor::ones((ids.len(), 384), DType::F32, &dev).map_err(embed_err)?;
        let w = Tensor::ones((1536, 384), DType::F32, &dev).map_err(embed_err)?;
        let wt = w.t().and_then(|t| t.contiguous()).map_err(embed_err)?;
        let view = time(&mut || self.pool.install(|| w.t().and_then(|t| x.matmul(&t))).map(drop).map_err(embed_err))?;
        out.push(("matmul tokens×384 · 384×1536, transposed view".to_owned(), view));
        let contiguous = time(&mut || self.pool.install(|| x.matmul(&wt)).map(drop).map_err(embed_err))?;
        out.push(("matmul tokens×384 · 384×1536, contiguous".to_owned(), contiguous));
        Ok(out)
    }
}
