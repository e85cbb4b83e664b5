//! Benchmark (issue 4, providers): SSE parsing throughput against the
//! baseline of splitting the same bytes into lines, measured in the same run.
//!
//! The corpus is a realistic Chat Completions stream (text deltas, tool-call
//! argument deltas, CRLF and LF line ends, keep-alive comments), repeated to
//! about 32 MiB. Rows: the parser fed the whole buffer, fed 16 KiB chunks
//! (what the HTTP worker hands it), fed 7-byte chunks (hostile splitting),
//! and parse + `serde_json` of every event (to show where the time goes in a
//! real call). Each row is a median of 9 samples, interleaved with 9 of the
//! line-split baseline (`memchr` line ends; std `split` shown too), with the
//! spread of both and of the per-pair ratios.
//!
//! Run: `cargo run --release -p cairn-bench --bin sse` (`--smoke`: a 64 KiB
//! corpus, for `scripts/test`).
#![allow(clippy::print_stdout)]

use std::hint::black_box;

use cairn_bench::{Secs, Spread, Table, sample_pairs, size};
use cairn_provider::sse::{SseEvent, SseParser};

fn corpus(target: usize) -> Vec<u8> {
    let events = [
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4.1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" the quick brown fox\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4.1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"path\\\": \\\"src/\"}}]},\"finish_reason\":null}]}\r\n\r\n",
        ": keep-alive\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\" jumps over\"}}\n\n",
    ];
    let mut out = Vec::with_capacity(target + 512);
    let mut i = 0;
    while out.len() < target {
        out.extend_from_slice(events[i % events.len()].as_bytes());
        i += 1;
    }
    out
}

fn parse(bytes: &[u8], chunk: usize) -> usize {
    let mut parser = SseParser::new(1 << 24);
    let mut events: Vec<SseEvent> = Vec::new();
    let mut total = 0;
    for piece in bytes.chunks(chunk) {
        if parser.feed(piece, &mut events).is_err() {
            return 0;
        }
        total += events.iter().map(|e| e.data.len()).sum::<usize>();
        events.clear();
    }
    total
}

fn parse_and_json(bytes: &[u8]) -> usize {
    let mut parser = SseParser::new(1 << 24);
    let mut events: Vec<SseEvent> = Vec::new();
    let mut n = 0;
    for piece in bytes.chunks(16 * 1024) {
        if parser.feed(piece, &mut events).is_err() {
            return 0;
        }
        for e in events.drain(..) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&e.data) {
                n += usize::from(v.is_object());
            }
        }
    }
    n
}

/// The baseline: find every line end with `memchr` (the least work any
/// line-based reader must do) and touch each line.
fn split_lines(bytes: &[u8]) -> usize {
    let mut total = 0;
    let mut start = 0;
    for end in memchr::memchr_iter(b'\n', bytes) {
        total += end - start;
        start = end + 1;
    }
    total + (bytes.len() - start)
}

fn split_lines_std(bytes: &[u8]) -> usize {
    bytes.split(|&b| b == b'\n').map(|line| line.len()).sum()
}

fn main() {
    let bytes = corpus(size(32 << 20, 64 << 10));
    let mib = bytes.len() as f64 / (1024.0 * 1024.0);
    let samples = 9;
    let mut table = Table::new("sse");
    println!("SSE corpus: {mib:.1} MiB, {samples} samples per row, each interleaved with one of the baseline");
    // Warm up caches and check every row sees the same stream.
    assert_eq!(parse(&bytes, bytes.len()), parse(&bytes, 7));

    type Row<'a> = (&'static str, Box<dyn Fn() -> usize + 'a>);
    let rows: [Row<'_>; 5] = [
        ("lines via std slice::split (for scale)", Box::new(|| split_lines_std(&bytes))),
        ("sse parse, whole buffer", Box::new(|| parse(&bytes, bytes.len()))),
        ("sse parse, 16 KiB chunks", Box::new(|| parse(&bytes, 16 * 1024))),
        ("sse parse, 7-byte chunks", Box::new(|| parse(&bytes, 7))),
        ("sse parse + serde_json per event", Box::new(|| parse_and_json(&bytes))),
    ];
    let throughput = |d: &[std::time::Duration]| mib / Spread::of_durations(d).median.max(f64::MIN_POSITIVE);
    for (name, f) in rows {
        let (ours, base) = sample_pairs(
            samples,
            || {
                black_box(f());
            },
            || {
                black_box(split_lines(black_box(&bytes)));
            },
        );
        table.compare(name, &ours, "line ends via memchr", &base);
        table.figure(
            &format!("  {name}, throughput"),
            &format!(
                "{:.0} MiB/s (baseline {:.0} MiB/s, {} per MiB)",
                throughput(&ours),
                throughput(&base),
                Secs(Spread::of_durations(&ours).median / mib)
            ),
        );
    }
    table.print();
}
