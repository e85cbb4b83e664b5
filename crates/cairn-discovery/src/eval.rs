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
