//! Benchmark of the embedded local model (`cairn-local`): load time, prompt
//! and generation throughput and peak RSS for the default (f32) and the fast
//! (Q8_0) weights, and the cost of constrained decoding against free
//! generation of the same prompt (a ratio measured in the same run).
//!
//! Run: `CAIRN_LOCAL_MODEL=/path/SmolLM2-135M-Instruct.Q4_1.gguf cargo run
//! --release -p cairn-bench --bin local` (`--smoke`: one sample of a few
//! tokens, for `scripts/test`). Each precision runs in its own child process
//! so that its peak RSS is its own; children get `CANDLE_NUM_THREADS=1`
//! unless it is set (see `Precision::Q8_0`). Every figure is the median of 5
//! samples with its range (the load too: the model is loaded 5 times).
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use cairn_bench::{Table, describe, describe_values, peak_rss_bytes, size};
use cairn_core::CancelToken;
use cairn_core::message::{Message, Role};
use cairn_core::tool::{ReplayPolicy, Risk, ToolSpec};
use cairn_local::chat::{example_turns, fit_prompt, system_prompt, to_turns};
use cairn_local::{Grammar, LocalModel, LocalOptions, MODEL_ENV, Precision};
use serde_json::json;

/// Samples of every figure.
fn samples() -> usize {
    size(5, 1)
}
/// Most tokens generated per sample.
fn gen_tokens() -> usize {
    size(48, 4)
}

fn tools() -> Vec<ToolSpec> {
    let spec = |name: &str, description: &str, schema: serde_json::Value| ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema: schema,
        risk: Risk::ReadOnly,
        capabilities: Default::default(),
        replay: ReplayPolicy::Idempotent,
    };
    vec![
        spec(
            "read_file",
            "Read a text file.",
            json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
        ),
        spec("list_dir", "List a directory.", json!({"type": "object", "properties": {"path": {"type": "string"}}})),
        spec(
            "shell",
            "Run a shell command.",
            json!({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}),
        ),
    ]
}

fn run_mode(path: &std::path::Path, precision: Precision) -> Result<()> {
    let mut table = Table::new(&format!("local model, {precision:?}"));
    let mut loads = Vec::new();
    let mut model = None;
    for _ in 0..samples() {
        // The previous model is freed first, so the peak is one model's.
        drop(model.take());
        let t = Instant::now();
        model = Some(LocalModel::load(path, LocalOptions { precision, ..LocalOptions::default() })?);
        loads.push(t.elapsed());
    }
    let model = model.context("no sample")?;
    let gen_tokens = gen_tokens();
    let cancel = CancelToken::new();
    let tools = tools();
    let messages = vec![Message::text(Role::User, "Read the file src/main.rs and tell me what it does.")];
    let tok = model.tokenizer();
    let mut count = |s: &str| tok.encode(s).map_or(0, |v| v.len());
    let (prompt, _) = fit_prompt(
        &to_turns(&system_prompt(None, &tools), &example_turns(&tools, "example.txt"), &messages),
        1500,
        &mut count,
    );
    let grammar = Grammar::new(tools.iter().map(|t| (t.name.as_str(), &t.input_schema)));
    // A free-text prompt that generates many tokens.
    let story = vec![Message::text(Role::User, "Write a long story about a lighthouse keeper.")];
    let (story_prompt, _) = fit_prompt(&to_turns(&system_prompt(None, &[]), &[], &story), 1500, &mut count);

    let mut prompt_rates = Vec::new();
    let mut gen_rates = Vec::new();
    let mut free_per_tok = Vec::new();
    let mut constrained_per_tok = Vec::new();
    let mut prompt_tokens = 0;
    let mut cpu_prompt = Vec::new();
    let mut cpu_gen = Vec::new();
    let mut cached = Vec::new();
    let mut mask_share = Vec::new();
    let mut mask_per_tok = Vec::new();
    for _ in 0..samples() {
        model.clear_cache();
        let c0 = cpu_time();
        let g = model.generate(&story_prompt, gen_tokens, None, &cancel, &mut |_| {})?;
        let c1 = cpu_time();
        gen_rates.push(g.tokens.len() as f64 / g.generate_time.as_secs_f64());
        cpu_gen.push(g.tokens.len() as f64 / cpu_share(c1 - c0, g.generate_time, g.prompt_time).max(1e-9));
        model.clear_cache();
        let c0 = cpu_time();
        let free = model.generate(&prompt, gen_tokens, None, &cancel, &mut |_| {})?;
        let c1 = cpu_time();
        prompt_tokens = free.prompt_tokens;
        prompt_rates.push(free.prompt_tokens as f64 / free.prompt_time.as_secs_f64());
        cpu_prompt.push(free.prompt_tokens as f64 / cpu_share(c1 - c0, free.prompt_time, free.generate_time).max(1e-9));
        free_per_tok.push(free.generate_time / free.tokens.len().max(1) as u32);
        // The same prompt again, now from the prefix cache.
        let con = model.generate(&prompt, gen_tokens, Some(&grammar), &cancel, &mut |_| {})?;
        cached.push(con.cached_tokens);
        constrained_per_tok.push(con.generate_time / con.tokens.len().max(1) as u32);
        mask_share.push(con.mask_time.as_secs_f64() / con.generate_time.as_secs_f64().max(1e-9));
        mask_per_tok.push(con.mask_time / con.tokens.len().max(1) as u32);
        println!(
            "  sample: free {} tokens {:?}, constrained {} tokens ({:?}) {:?}",
            free.tokens.len(),
            free.stop,
            con.tokens.len(),
            con.mode,
            con.text()
        );
    }
    table.figure("load time", &describe(&loads));
    table.figure(&format!("prompt of {prompt_tokens} tokens, wall"), &describe_values(&prompt_rates, "tokens/s"));
    table.figure("prompt, per CPU-second", &describe_values(&cpu_prompt, "tokens/s"));
    table.figure(&format!("generation ({gen_tokens} tokens max), wall"), &describe_values(&gen_rates, "tokens/s"));
    table.figure("generation, per CPU-second", &describe_values(&cpu_gen, "tokens/s"));
    table.figure("prefix cache: prompt tokens reused on the repeat", &format!("{cached:?} of {prompt_tokens}"));
    table.compare(
        "per generated token, constrained (tools offered)",
        &constrained_per_tok,
        "free generation of the same prompt",
        &free_per_tok,
    );
    table.figure("grammar mask per constrained token", &describe(&mask_per_tok));
    let shares: Vec<f64> = mask_share.iter().map(|s| 100.0 * s).collect();
    table.figure("grammar masks, share of constrained generation time", &describe_values(&shares, "%"));
    table.figure("resident after the runs", &rss_now());
    let rss = peak_rss_bytes().map_or_else(|| "unknown".to_string(), |b| format!("{:.0} MiB", b as f64 / 1048576.0));
    table.figure("peak RSS", &rss);
    table.print();
    Ok(())
}

/// Current resident set size (`VmRSS`), for a person to read.
fn rss_now() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .map_or("unknown".into(), |l| l.trim_start_matches("VmRSS:").trim().to_string())
}

/// CPU time (user + system) of this process so far, in seconds, from
/// `/proc/self/stat` (clock ticks of 10 ms). The machine is shared, so CPU
/// seconds are steadier than wall time.
fn cpu_time() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 of the file (utime, stime) are 11 and 12 after ')'.
    (ticks(11) + ticks(12)) / 100.0
}

/// The part of `cpu` spent in the `part` phase, split in proportion to wall time.
fn cpu_share(cpu: f64, part: std::time::Duration, other: std::time::Duration) -> f64 {
    let total = (part + other).as_secs_f64().max(1e-9);
    cpu * part.as_secs_f64() / total
}

fn main() -> Result<()> {
    let path = std::env::var_os(MODEL_ENV)
        .map(PathBuf::from)
        .context("set CAIRN_LOCAL_MODEL to the SmolLM2 .gguf (see `cairn model install`)")?;
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--smoke").collect();
    if let Some(mode) = args.first() {
        let precision: Precision = mode.parse()?;
        return run_mode(&path, precision);
    }
    // Baseline for the load time: reading the file's bytes.
    let read = cairn_bench::sample(samples().max(cairn_bench::MIN_SAMPLES), || {
        let _ = std::fs::read(&path).map(|b| b.len());
    });
    let mut table = Table::new("local model, baseline");
    table.figure(
        &format!(
            "reading the {} MB model file (baseline of the load time)",
            std::fs::metadata(&path)?.len() / 1_000_000
        ),
        &describe(&read),
    );
    table.print();
    for mode in ["f32", "q8_0"] {
        let mut child = std::process::Command::new(std::env::current_exe()?);
        child.arg(mode);
        // candle's quantized kernels size their own spinning pool from this
        // variable (default: all cores); match the one inference thread.
        if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
            child.env("CANDLE_NUM_THREADS", "1");
        }
        if cairn_bench::smoke() {
            child.env("CAIRN_BENCH_SMOKE", "1");
        }
        let status = child.status()?;
        if !status.success() {
            bail!("mode {mode} failed: {status}");
        }
    }
    Ok(())
}
