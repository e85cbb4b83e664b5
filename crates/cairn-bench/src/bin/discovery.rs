//! Benchmark of cairn-discovery: MiniLM index throughput (descriptions per
//! second, one thread) against building the BM25 index of the same texts,
//! query latency ranking 1,000 tool descriptions (embed the request + cosine
//! over the index) against BM25 over the same index, the process's peak RSS
//! after loading the model and indexing, and the prompt size of one call
//! with 200 tools installed, with discovery (core tools + the ≤ 5 chosen)
//! and without (every tool). Needs the model (`scripts/fetch-minilm`).
//!
//! Run: `cargo run --release -p cairn-bench --bin discovery` (`--smoke`:
//! 20 descriptions, few samples, for `scripts/test`; `--profile`: where
//! one request's embedding time goes, instead of the tables).
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cairn_bench::{Table, describe_values, peak_rss_bytes, sample_pairs, size};
use cairn_discovery::{Bm25, Document, Embedder, Index, Method, SHIPPED_METHOD, SelectionPolicy, default_model_dir};

const TOOLS: &str = include_str!("../../../cairn-discovery/eval/tools.tsv");
const QUERIES: &str = include_str!("../../../cairn-discovery/eval/queries.tsv");

fn rows(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains('\t'))
        .filter_map(|l| l.split_once('\t').map(|(a, b)| (a.to_owned(), b.to_owned())))
        .collect()
}

/// `n` distinct descriptions: the evaluation's, then copies marked with an
/// instance number (a realistic install has near-duplicates too).
fn documents(n: usize) -> Vec<Document> {
    let base = rows(TOOLS);
    (0..n)
        .map(|i| {
            let (name, desc) = &base[i % base.len()];
            let k = i / base.len();
            if k == 0 {
                Document::tool(name.clone(), desc.clone(), Vec::new())
            } else {
                Document::tool(format!("{name}_{k}"), format!("{desc} (instance {k})"), Vec::new())
            }
        })
        .collect()
}

/// Rough prompt tokens of tool definitions: JSON bytes / 4 (the usual
/// bytes-per-token of English and JSON for GPT-style tokenizers).
fn tool_tokens(docs: &[&Document]) -> usize {
    let bytes: usize = docs
        .iter()
        .map(|d| {
            serde_json::json!({"type": "function", "function": {"name": d.name, "description": d.description,
                "parameters": {"type": "object", "properties": {}}}})
            .to_string()
            .len()
        })
        .sum();
    bytes / 4
}

fn main() -> Result<()> {
    let mut table = Table::new("Discovery (issue 11)");
    let rss_before = peak_rss_bytes().unwrap_or(0);
    let start = Instant::now();
    let embedder = Embedder::load(&default_model_dir(), 1).context("the discovery benchmark needs the model")?;
    table.figure("model load (sha256 check + read + build)", &format!("{:.2} s", start.elapsed().as_secs_f64()));
    if std::env::args().any(|a| a == "--profile") {
        // Where one request's time goes, on one thread and on every core.
        let request = "compress every png in this folder so the site loads faster";
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        for threads in [1, cores] {
            let e = Embedder::load(&default_model_dir(), threads)?;
            for (what, took) in e.profile_request(request, 50)? {
                println!("{threads} thread(s): {what}: {:.3} ms", took.as_secs_f64() * 1e3);
            }
        }
        return Ok(());
    }

    // Index throughput: the same texts embedded (MiniLM) and indexed (BM25).
    let n_index = size(200, 20);
    let docs = documents(n_index);
    let texts: Vec<String> = docs.iter().map(Document::text).collect();
    let (minilm, bm25) = sample_pairs(
        size(5, 2),
        || {
            let _ = embedder.embed(&texts).map(|v| assert_eq!(v.len(), texts.len()));
        },
        || assert_eq!(Bm25::new(&texts).len(), texts.len()),
    );
    table.compare(&format!("index {n_index} descriptions, MiniLM, 1 thread"), &minilm, "BM25 index", &bm25);
    let per_sec: Vec<f64> = minilm.iter().map(|d| n_index as f64 / d.as_secs_f64()).collect();
    table.figure("index throughput, MiniLM, 1 thread", &describe_values(&per_sec, "descriptions/s"));

    // Query latency over 1,000 descriptions.
    let n_query = size(1000, 20);
    let (index, _) = Index::with_embeddings(documents(n_query), &embedder, None)?;
    let queries = rows(QUERIES);
    let samples = size(101, 5);
    let mut qi = 0usize;
    let mut qj = 0usize;
    let (ours, base) = sample_pairs(
        samples,
        || {
            let q = &queries[qi % queries.len()].1;
            qi += 1;
            let v = embedder.embed_query(q).ok();
            assert!(!index.rank(q, v.as_deref(), Method::Minilm).candidates.is_empty());
        },
        || {
            let q = &queries[qj % queries.len()].1;
            qj += 1;
            assert!(!index.rank(q, None, Method::Bm25).candidates.is_empty());
        },
    );
    table.compare(&format!("query over {n_query} descriptions (embed + rank)"), &ours, "BM25 rank", &base);
    // The ranking alone (the request already embedded): cosine over the index.
    let vectors: Vec<Vec<f32>> = queries
        .iter()
        .take(samples)
        .map(|(_, q)| embedder.embed(&[q.as_str()]).map(|mut v| v.pop().unwrap_or_default()))
        .collect::<Result<_, _>>()?;
    let (mut ri, mut rj) = (0usize, 0usize);
    let (rank_only, rank_base) = sample_pairs(
        samples,
        || {
            let q = &queries[ri % vectors.len()].1;
            assert!(!index.rank(q, Some(&vectors[ri % vectors.len()]), Method::Minilm).candidates.is_empty());
            ri += 1;
        },
        || {
            let q = &queries[rj % vectors.len()].1;
            assert!(!index.rank(q, None, Method::Bm25).candidates.is_empty());
            rj += 1;
        },
    );
    table.compare(&format!("rank {n_query} descriptions, request embedded"), &rank_only, "BM25 rank", &rank_base);
    let mut sorted = ours.clone();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    let target = Duration::from_millis(5);
    table.figure(
        "query latency target ≤ 5 ms median",
        &format!("{} (median {:.2} ms)", if median <= target { "met" } else { "not met" }, median.as_secs_f64() * 1e3),
    );

    let rss_after = peak_rss_bytes().unwrap_or(0);
    table.figure(
        "peak RSS after model load and indexing",
        &format!("{:.0} MiB (before load {:.0} MiB)", rss_after as f64 / 1048576.0, rss_before as f64 / 1048576.0),
    );

    // A request asked again (chat, resume): its vector is remembered.
    let (mut ci, mut cj) = (0usize, 0usize);
    let (cached, cached_base) = sample_pairs(
        samples,
        || {
            let q = &queries[ci % 8].1;
            ci += 1;
            let v = embedder.embed_query(q).ok();
            assert!(!index.rank(q, v.as_deref(), Method::Minilm).candidates.is_empty());
        },
        || {
            let q = &queries[cj % 8].1;
            cj += 1;
            assert!(!index.rank(q, None, Method::Bm25).candidates.is_empty());
        },
    );
    table.compare(
        &format!("repeated request over {n_query} (vector remembered) + rank"),
        &cached,
        "BM25 rank",
        &cached_base,
    );

    // The request's forward pass on every core, against one thread, in
    // the same run (distinct requests, so nothing is remembered).
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    if cores > 1 {
        let wide = Embedder::load(&default_model_dir(), cores)?;
        let offset = samples;
        let (mut ti, mut tj) = (offset, offset * 2);
        let (many, one) = sample_pairs(
            samples,
            || {
                let q = &queries[ti % queries.len()].1;
                ti += 1;
                let v = wide.embed_query(q).ok();
                assert!(!index.rank(q, v.as_deref(), Method::Minilm).candidates.is_empty());
            },
            || {
                let q = &queries[tj % queries.len()].1;
                tj += 1;
                let v = embedder.embed_query(q).ok();
                assert!(!index.rank(q, v.as_deref(), Method::Minilm).candidates.is_empty());
            },
        );
        table.compare(&format!("query over {n_query} (embed + rank), {cores} threads"), &many, "1 thread", &one);
    }

    // Prompt tokens of one call with 200 tools installed.
    let installed = documents(size(200, 20));
    let (index, _) = Index::with_embeddings(installed.clone(), &embedder, None)?;
    let core: Vec<Document> = ["read_file", "list_dir", "search", "write_file", "edit_file", "shell"]
        .iter()
        .map(|n| {
            Document::tool(*n, "A built-in file or shell tool of cairn with a one-paragraph description.", Vec::new())
        })
        .collect();
    let all: Vec<&Document> = core.iter().chain(&installed).collect();
    let without = tool_tokens(&all);
    let policy = SelectionPolicy::default();
    let mut with = Vec::new();
    for (_, q) in queries.iter().take(size(100, 5)) {
        let v = embedder.embed(&[q.as_str()])?.pop();
        let sel = policy.select(&index.rank(q, v.as_deref(), SHIPPED_METHOD));
        let chosen: Vec<&Document> =
            core.iter().chain(installed.iter().filter(|d| sel.tools.contains(&d.name))).collect();
        with.push(tool_tokens(&chosen) as f64);
    }
    with.sort_by(f64::total_cmp);
    let with_median = with[with.len() / 2];
    table.figure(
        &format!("prompt tokens of tool definitions per call, {} tools installed", installed.len()),
        &format!(
            "with discovery {} (median over requests) vs without {without}: ratio {:.3}",
            describe_values(&with, "tokens"),
            with_median / without as f64
        ),
    );
    table.print();
    Ok(())
}
