//! The evaluation: tool descriptions and queries (the files under `eval/`),
//! and recall@k and MRR of a ranking method over them.
//!
//! `tools.tsv` lines are `name<TAB>description`; `queries.tsv` lines are
//! `expected_tool<TAB>query`. `#` starts a comment line. This module must not
//! load the model; callers pass rankings in.

use std::path::Path;

use crate::{DiscoveryError, Document, Ranking};

/// The evaluation set.
#[derive(Debug, Clone)]
pub struct EvalSet {
    /// Tool documents.
    pub tools: Vec<Document>,
    /// `(expected tool, query)`.
    pub queries: Vec<(String, String)>,
}

fn read_tsv(path: &Path) -> Result<Vec<(usize, String, String)>, DiscoveryError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| DiscoveryError::io(format!("cannot read {}", path.display()), e))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((a, b)) = line.split_once('\t') else {
            return Err(DiscoveryError::EvalData {
                path: path.to_path_buf(),
                line: i + 1,
                reason: "expected two fields separated by a tab".into(),
            });
        };
        rows.push((i + 1, a.trim().to_string(), b.trim().to_string()));
    }
    Ok(rows)
}

impl EvalSet {
    /// Load `dir/tools.tsv` and `dir/queries.tsv`, checking that every
    /// query names a known tool and tool names are unique.
    pub fn load(dir: &Path) -> Result<Self, DiscoveryError> {
        let tools_path = dir.join("tools.tsv");
        let mut tools: Vec<Document> = Vec::new();
        let mut names = std::collections::HashSet::new();
        for (line, name, desc) in read_tsv(&tools_path)? {
            if !names.insert(name.clone()) {
                return Err(DiscoveryError::EvalData {
                    path: tools_path,
                    line,
                    reason: format!("duplicate tool {name}"),
                });
            }
            tools.push(Document::tool(name, desc, Vec::new()));
        }
        let queries_path = dir.join("queries.tsv");
        let mut queries = Vec::new();
        for (line, tool, query) in read_tsv(&queries_path)? {
            if !names.contains(&tool) {
                return Err(DiscoveryError::EvalData {
                    path: queries_path,
                    line,
                    reason: format!("unknown tool {tool}"),
                });
            }
            queries.push((tool, query));
        }
        Ok(EvalSet { tools, queries })
    }
}

/// recall@k and MRR of a method.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct Metrics {
    /// Fraction of queries whose expected tool is in the top k.
    pub recall_at_k: f64,
    /// Mean reciprocal rank of the expected tool (0 if absent).
    pub mrr: f64,
    /// Number of queries.
    pub queries: usize,
}

/// Score rankings: `rankings[i]` answers `expected[i]`.
pub fn metrics(expected: &[String], rankings: &[Ranking], k: usize) -> Metrics {
    let mut hits = 0usize;
    let mut rr = 0.0f64;
    for (want, ranking) in expected.iter().zip(rankings) {
        if let Some(pos) = ranking.candidates.iter().position(|c| &c.name == want) {
            if pos < k {
                hits += 1;
            }
            rr += 1.0 / (pos as f64 + 1.0);
        }
    }
    let n = expected.len().min(rankings.len());
    if n == 0 {
        return Metrics::default();
    }
    Metrics { recall_at_k: hits as f64 / n as f64, mrr: rr / n as f64, queries: n }
}

/// Requests that need no tool: what selection should leave empty.
pub const OFF_TOPIC: &[&str] = &[
    "hi there, how are you today?",
    "tell me a joke about penguins",
    "thanks, that was helpful",
    "what is the meaning of life",
    "write a haiku about autumn",
    "explain recursion like I'm five",
    "who won the world cup in 1998",
    "good night",
];

/// One method's result on the evaluation set.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct MethodResult {
    /// The method.
    pub method: crate::Method,
    /// recall@5 and MRR.
    pub metrics: Metrics,
}

/// Selection quality at one threshold.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ThresholdRow {
    /// The threshold.
    pub threshold: f32,
    /// Fraction of queries whose expected tool is among the injected (≤ 5).
    pub selected_recall: f64,
    /// Mean number of tools injected per query.
    pub mean_injected: f64,
    /// Mean number of tools injected for [`OFF_TOPIC`] requests.
    pub off_topic_injected: f64,
}

/// Everything the evaluation reports.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// Tools in the set.
    pub tools: usize,
    /// Queries in the set.
    pub queries: usize,
    /// MiniLM, BM25 and combined (the shipped weight).
    pub methods: Vec<MethodResult>,
    /// Combined recall@5/MRR for other BM25 weights.
    pub weight_sweep: Vec<(f32, Metrics)>,
    /// The shipped ranking ([`crate::SHIPPED_METHOD`]) at several thresholds.
    pub thresholds: Vec<ThresholdRow>,
    /// The BM25 fallback at several thresholds (raw BM25 score).
    pub bm25_thresholds: Vec<ThresholdRow>,
}

/// Run the evaluation with `embedder` (every number is deterministic).
pub fn run(set: &EvalSet, embedder: &crate::Embedder) -> Result<Report, DiscoveryError> {
    use crate::{Index, Method, SelectionPolicy};
    let (index, _) = Index::with_embeddings(set.tools.clone(), embedder, None)?;
    let texts: Vec<&str> = set.queries.iter().map(|(_, q)| q.as_str()).collect();
    let vectors = embedder.embed(&texts)?;
    let expected: Vec<String> = set.queries.iter().map(|(t, _)| t.clone()).collect();
    let rank_all = |method: Method, weight: f32| -> Vec<Ranking> {
        texts.iter().zip(&vectors).map(|(q, v)| index.rank_weighted(q, Some(v), method, weight)).collect()
    };
    let mut methods = Vec::new();
    for method in [Method::Minilm, Method::Bm25, Method::Combined] {
        let rankings = if method == Method::Bm25 {
            texts.iter().map(|q| index.rank(q, None, Method::Bm25)).collect()
        } else {
            rank_all(method, crate::COMBINED_BM25_WEIGHT)
        };
        methods.push(MethodResult { method, metrics: metrics(&expected, &rankings, 5) });
    }
    let weight_sweep = [0.0f32, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5]
        .iter()
        .map(|&w| (w, metrics(&expected, &rank_all(Method::Combined, w), 5)))
        .collect();
    let shipped = rank_all(crate::SHIPPED_METHOD, crate::COMBINED_BM25_WEIGHT);
    let off_vectors = embedder.embed(OFF_TOPIC)?;
    let off: Vec<Ranking> =
        OFF_TOPIC.iter().zip(&off_vectors).map(|(q, v)| index.rank(q, Some(v), crate::SHIPPED_METHOD)).collect();
    let sweep = |policy_at: &dyn Fn(f32) -> SelectionPolicy, ts: &[f32], on: &[Ranking], off: &[Ranking]| {
        ts.iter()
            .map(|&t| {
                let policy = policy_at(t);
                let mut hit = 0usize;
                let mut injected = 0usize;
                for (want, r) in expected.iter().zip(on) {
                    let sel = policy.select(r);
                    injected += sel.tools.len();
                    hit += usize::from(sel.tools.contains(want));
                }
                let off_injected: usize = off.iter().map(|r| policy.select(r).tools.len()).sum();
                let n = expected.len().max(1) as f64;
                ThresholdRow {
                    threshold: t,
                    selected_recall: hit as f64 / n,
                    mean_injected: injected as f64 / n,
                    off_topic_injected: off_injected as f64 / OFF_TOPIC.len() as f64,
                }
            })
            .collect::<Vec<_>>()
    };
    let thresholds = sweep(
        &|t| SelectionPolicy { threshold: t, ..SelectionPolicy::default() },
        &[0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5],
        &shipped,
        &off,
    );
    let bm25_on: Vec<Ranking> = texts.iter().map(|q| index.rank(q, None, Method::Bm25)).collect();
    let bm25_off: Vec<Ranking> = OFF_TOPIC.iter().map(|q| index.rank(q, None, Method::Bm25)).collect();
    let bm25_thresholds = sweep(
        &|t| SelectionPolicy { bm25_threshold: t, ..SelectionPolicy::default() },
        &[0.5, 1.0, 2.0, 3.0, 4.0, 6.0],
        &bm25_on,
        &bm25_off,
    );
    Ok(Report {
        tools: set.tools.len(),
        queries: set.queries.len(),
        methods,
        weight_sweep,
        thresholds,
        bm25_thresholds,
    })
}

impl Report {
    /// The report as Markdown tables (what BENCHMARKS.md quotes).
    pub fn markdown(&self) -> String {
        let mut s =
            format!("{} tools, {} queries\n\n| method | recall@5 | MRR |\n|---|---|---|\n", self.tools, self.queries);
        for m in &self.methods {
            s.push_str(&format!("| {} | {:.3} | {:.3} |\n", m.method.as_str(), m.metrics.recall_at_k, m.metrics.mrr));
        }
        s.push_str("\n| BM25 weight in combined | recall@5 | MRR |\n|---|---|---|\n");
        for (w, m) in &self.weight_sweep {
            s.push_str(&format!("| {w:.2} | {:.3} | {:.3} |\n", m.recall_at_k, m.mrr));
        }
        s.push_str("\n| threshold | expected tool injected | tools injected per query | tools injected off-topic |\n|---|---|---|---|\n");
        for t in &self.thresholds {
            s.push_str(&format!(
                "| {:.2} | {:.3} | {:.2} | {:.2} |\n",
                t.threshold, t.selected_recall, t.mean_injected, t.off_topic_injected
            ));
        }
        s.push_str("\n| BM25 fallback threshold | expected tool injected | tools injected per query | tools injected off-topic |\n|---|---|---|---|\n");
        for t in &self.bm25_thresholds {
            s.push_str(&format!(
                "| {:.1} | {:.3} | {:.2} | {:.2} |\n",
                t.threshold, t.selected_recall, t.mean_injected, t.off_topic_injected
            ));
        }
        s
    }
}
