//! Ranking documents against a request and choosing what a turn offers.
//!
//! [`Index`] holds the documents, their BM25 index and (when the model is
//! installed) their embeddings. [`Index::rank`] scores every document by
//! one [`Method`]; [`SelectionPolicy::select`] keeps at most `max_tools`
//! tools and `max_skills` skills whose score passes the threshold. The
//! combined score is the cosine plus a small weight times the BM25 score
//! scaled to the best match of the query (so an exact name or rare word
//! still counts); its weight and the thresholds come from the evaluation in
//! `eval/` (see BENCHMARKS.md). This module must not load files or talk to
//! the model beyond the vectors it is given.

use crate::bm25::Bm25;
use crate::cache::EmbeddingCache;
use crate::doc::{DocKind, Document};
use crate::embed::dot;
use crate::{DiscoveryError, Embedder};

/// Weight of the scaled BM25 score in [`Method::Combined`]. The evaluation
/// (BENCHMARKS.md) found every positive weight worse than MiniLM alone on
/// requests phrased without the tools' words, so cairn ships
/// [`SHIPPED_METHOD`] = MiniLM and keeps the combination for comparison.
pub const COMBINED_BM25_WEIGHT: f32 = 0.05;

/// The method hosts use when the model is installed (BM25 otherwise).
pub const SHIPPED_METHOD: Method = Method::Minilm;

/// How documents are scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Cosine of MiniLM embeddings (what cairn ships).
    Minilm,
    /// BM25 over the same text.
    Bm25,
    /// Cosine plus weighted, per-query-scaled BM25.
    Combined,
}

impl Method {
    /// The name used in output and in the session.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Minilm => "minilm",
            Method::Bm25 => "bm25",
            Method::Combined => "combined",
        }
    }
}

/// One scored document.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Candidate {
    /// Tool or skill name.
    pub name: String,
    /// Tool or skill.
    pub kind: DocKind,
    /// The score the ranking used (its method's).
    pub score: f32,
    /// Cosine similarity, when embeddings were available.
    pub cosine: Option<f32>,
    /// Raw BM25 score.
    pub bm25: f32,
}

/// Every document scored by one method, best first.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Ranking {
    /// The method actually used (BM25 when embeddings were unavailable).
    pub method: Method,
    /// Candidates, best first (ties by name).
    pub candidates: Vec<Candidate>,
}

/// Documents prepared for ranking.
#[derive(Debug, Clone)]
pub struct Index {
    docs: Vec<Document>,
    bm25: Bm25,
    vectors: Option<Vec<Vec<f32>>>,
}

impl Index {
    /// An index without embeddings (BM25 only).
    pub fn bm25_only(docs: Vec<Document>) -> Self {
        let texts: Vec<String> = docs.iter().map(Document::text).collect();
        Index { bm25: Bm25::new(&texts), docs, vectors: None }
    }

    /// An index with embeddings of every document, read from `cache` where
    /// present. Returns the index and how many documents were embedded now.
    pub fn with_embeddings(
        docs: Vec<Document>,
        embedder: &Embedder,
        cache: Option<&EmbeddingCache>,
    ) -> Result<(Self, usize), DiscoveryError> {
        let texts: Vec<String> = docs.iter().map(Document::text).collect();
        let (vectors, computed) = match cache {
            Some(cache) => cache.embed(embedder, &texts)?,
            None => (embedder.embed(&texts)?, texts.len()),
        };
        Ok((Index { bm25: Bm25::new(&texts), docs, vectors: Some(vectors) }, computed))
    }

    /// The indexed documents.
    pub fn docs(&self) -> &[Document] {
        &self.docs
    }

    /// Score every document against a request. `query_vector` is the
    /// request's embedding; without it (or without document embeddings) the
    /// ranking is BM25 whatever `method` asked for, and says so.
    pub fn rank(&self, query: &str, query_vector: Option<&[f32]>, method: Method) -> Ranking {
        self.rank_weighted(query, query_vector, method, COMBINED_BM25_WEIGHT)
    }

    /// [`Index::rank`] with another weight of BM25 in [`Method::Combined`]
    /// (the evaluation sweeps it).
    pub fn rank_weighted(
        &self,
        query: &str,
        query_vector: Option<&[f32]>,
        method: Method,
        bm25_weight: f32,
    ) -> Ranking {
        let bm25 = self.bm25.scores(query);
        let best = bm25.iter().copied().fold(0.0f32, f32::max);
        let cosines: Option<Vec<f32>> = match (&self.vectors, query_vector) {
            (Some(vs), Some(q)) => Some(vs.iter().map(|v| dot(v, q)).collect()),
            _ => None,
        };
        let method = if cosines.is_none() { Method::Bm25 } else { method };
        let mut candidates: Vec<Candidate> = self
            .docs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let cosine = cosines.as_ref().map(|c| c[i]);
                let scaled = if best > 0.0 { bm25[i] / best } else { 0.0 };
                let score = match (method, cosine) {
                    (Method::Minilm, Some(c)) => c,
                    (Method::Combined, Some(c)) => c + bm25_weight * scaled,
                    _ => bm25[i],
                };
                Candidate { name: d.name.clone(), kind: d.kind, score, cosine, bm25: bm25[i] }
            })
            .collect();
        candidates.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.name.cmp(&b.name)));
        Ranking { method, candidates }
    }
}

/// How many tools and skills a turn may be offered, and the bar they pass.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SelectionPolicy {
    /// At most this many discovered tools (besides the core tools).
    pub max_tools: usize,
    /// At most this many skills.
    pub max_skills: usize,
    /// Minimum score for embedding-based rankings (cosine or combined).
    pub threshold: f32,
    /// Minimum raw BM25 score when ranking fell back to BM25.
    pub bm25_threshold: f32,
}

impl Default for SelectionPolicy {
    /// 5 tools, 3 skills; thresholds from the evaluation (BENCHMARKS.md).
    fn default() -> Self {
        SelectionPolicy { max_tools: 5, max_skills: 3, threshold: 0.25, bm25_threshold: 3.0 }
    }
}

/// What a turn is offered: recorded in the session so resume and replay
/// offer the same.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Selection {
    /// The ranking method used.
    pub method: Method,
    /// Selected tool names, best first.
    pub tools: Vec<String>,
    /// Selected skill names, best first.
    pub skills: Vec<String>,
}

impl SelectionPolicy {
    /// The threshold that applies to `method`.
    pub fn threshold_for(&self, method: Method) -> f32 {
        if method == Method::Bm25 { self.bm25_threshold } else { self.threshold }
    }

    /// Keep the best candidates of each kind that pass the threshold.
    pub fn select(&self, ranking: &Ranking) -> Selection {
        let bar = self.threshold_for(ranking.method);
        let pick = |kind: DocKind, max: usize| -> Vec<String> {
            ranking
                .candidates
                .iter()
                .filter(|c| c.kind == kind && c.score >= bar)
                .take(max)
                .map(|c| c.name.clone())
                .collect()
        };
        Selection {
            method: ranking.method,
            tools: pick(DocKind::Tool, self.max_tools),
            skills: pick(DocKind::Skill, self.max_skills),
        }
    }
}
