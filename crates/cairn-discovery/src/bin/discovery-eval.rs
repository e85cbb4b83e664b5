//! `discovery-eval [--data DIR] [--json]`: recall@5 and MRR of MiniLM, BM25
//! and the combined ranking over the evaluation set (`eval/` of this crate by
//! default), plus the BM25-weight and threshold sweeps the shipped defaults
//! were chosen from. Deterministic: a debug build prints the same figures.

use std::path::PathBuf;
use std::process::ExitCode;

use cairn_discovery::eval::{EvalSet, run};
use cairn_discovery::{Embedder, default_model_dir};

fn main() -> ExitCode {
    let mut data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("eval");
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--data" => match args.next() {
                Some(d) => data = PathBuf::from(d),
                None => {
                    eprintln!("error: --data needs a directory holding tools.tsv and queries.tsv");
                    return ExitCode::from(2);
                }
            },
            "--json" => json = true,
            other => {
                eprintln!("error: unknown argument {other:?}; usage: discovery-eval [--data DIR] [--json]");
                return ExitCode::from(2);
            }
        }
    }
    let result = EvalSet::load(&data)
        .and_then(|set| Embedder::load(&default_model_dir(), 1).map(|e| (set, e)))
        .and_then(|(set, e)| run(&set, &e));
    match result {
        Ok(report) if json => match serde_json::to_string_pretty(&report) {
            Ok(s) => {
                println!("{s}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Ok(report) => {
            print!("{}", report.markdown());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
