//! Okapi BM25 over document text: the lexical baseline (what Codex ranks
//! with) and the fallback when the embedding model is not installed.
//!
//! Terms are lowercase ASCII-alphanumeric runs (any other character
//! separates), with a small English stop-word list removed and a trailing
//! plural `s` dropped so `files` meets `file`. This module must not know
//! about embeddings or selection.

use std::collections::HashMap;

/// BM25 term-frequency saturation.
const K1: f32 = 1.2;
/// BM25 length normalisation.
const B: f32 = 0.75;

const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "for", "from", "how", "i", "in", "into", "is", "it",
    "its", "me", "my", "of", "on", "or", "so", "that", "the", "this", "to", "what", "which", "with", "you", "your",
    "we", "our", "all", "any", "some", "please", "want", "need",
];

/// Split text into BM25 terms.
pub fn tokenize(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.to_lowercase())
        .filter(|w| !STOP_WORDS.contains(&w.as_str()))
        .map(|w| if w.len() > 3 && w.ends_with('s') && !w.ends_with("ss") { w[..w.len() - 1].to_string() } else { w })
        .collect()
}

/// A BM25 index over a fixed list of documents.
#[derive(Debug, Clone, Default)]
pub struct Bm25 {
    /// Per document: term → count.
    docs: Vec<HashMap<String, u32>>,
    /// Per document: number of terms.
    lengths: Vec<u32>,
    /// term → number of documents containing it.
    df: HashMap<String, u32>,
    avg_len: f32,
}

impl Bm25 {
    /// Index `texts` (one per document, in order).
    pub fn new<S: AsRef<str>>(texts: &[S]) -> Self {
        let mut docs = Vec::with_capacity(texts.len());
        let mut lengths = Vec::with_capacity(texts.len());
        let mut df: HashMap<String, u32> = HashMap::new();
        for text in texts {
            let terms = tokenize(text.as_ref());
            lengths.push(u32::try_from(terms.len()).unwrap_or(u32::MAX));
            let mut tf: HashMap<String, u32> = HashMap::new();
            for t in terms {
                *tf.entry(t).or_default() += 1;
            }
            for t in tf.keys() {
                *df.entry(t.clone()).or_default() += 1;
            }
            docs.push(tf);
        }
        let total: f64 = lengths.iter().map(|&l| f64::from(l)).sum();
        let avg_len = if lengths.is_empty() { 0.0 } else { (total / lengths.len() as f64) as f32 };
        Bm25 { docs, lengths, df, avg_len }
    }

    /// Number of indexed documents.
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    /// Whether nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    /// The BM25 score of every document for `query`, in document order
    /// (0 for a document sharing no term with the query).
    pub fn scores(&self, query: &str) -> Vec<f32> {
        let n = self.docs.len() as f32;
        let mut terms = tokenize(query);
        terms.sort();
        terms.dedup();
        let avg = if self.avg_len > 0.0 { self.avg_len } else { 1.0 };
        self.docs
            .iter()
            .zip(&self.lengths)
            .map(|(tf, &len)| {
                terms
                    .iter()
                    .map(|t| {
                        let Some(&f) = tf.get(t) else { return 0.0 };
                        let df = self.df.get(t).copied().unwrap_or(0) as f32;
                        let idf = ((n - df + 0.5) / (df + 0.5) + 1.0).ln();
                        let f = f as f32;
                        idf * f * (K1 + 1.0) / (f + K1 * (1.0 - B + B * len as f32 / avg))
                    })
                    .sum()
            })
            .collect()
    }
}
