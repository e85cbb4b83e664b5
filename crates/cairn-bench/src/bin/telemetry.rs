//! Benchmark: the cost of OpenTelemetry export (issue 51) on a one-tool
//! turn, through the real `cairn` binary with the scripted provider: one
//! `cairn run` whose model calls `shell` once and answers, with telemetry
//! off (nothing configured) vs on against a live OTLP/HTTP receiver, in
//! alternating pairs. The whole process is timed, the exporter's start and
//! the bounded flush at exit included.
//!
//! The receiver is `$CAIRN_BENCH_OTLP_ENDPOINT` (e.g. Arize Phoenix) when
//! set, else a minimal one in this process that answers every POST with
//! 200 (what a healthy collector costs the sender: a local round trip).
//! Run: `scripts/bench telemetry` (`--smoke`: a few pairs;
//! `CAIRN_BENCH_PAIRS=N`: N pairs).
#![allow(clippy::print_stdout)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Result, bail};
use cairn_bench::{CairnHome, Table, sample_pairs, size};
use serde_json::json;

/// Answer each request on `stream` with an empty 200 (keep-alive).
fn serve(stream: TcpStream, posts: &AtomicU64) {
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let mut out = stream;
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        // Request line and headers.
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        posts.fetch_add(1, Ordering::Relaxed);
        let reply = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if out.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// A receiver in this process; its base URL and the POSTs it answered.
fn receiver() -> Result<(String, Arc<AtomicU64>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}", listener.local_addr()?);
    let posts = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&posts);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let counted = Arc::clone(&counted);
            std::thread::spawn(move || serve(stream, &counted));
        }
    });
    Ok((url, posts))
}

/// One `cairn run` of the one-tool turn; `endpoint`: telemetry on.
fn run(home: &CairnHome, bin: &Path, script: &Path, endpoint: Option<&str>) -> Result<()> {
    let mut cmd = home.command(bin, &["--script", script.to_str().unwrap_or_default(), "--yes", "run", "go"]);
    cmd.env("NO_COLOR", "1").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    if let Some(e) = endpoint {
        cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", e);
    }
    let out = cmd.output()?;
    // The turn's progress goes to stderr; a telemetry note means an export failed.
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || err.contains("telemetry") {
        bail!("cairn run failed or lost telemetry: {} {err}", out.status);
    }
    Ok(())
}

fn main() -> Result<()> {
    let bin = cairn_bench::cairn_bin()?;
    // More pairs for a loaded machine (`CAIRN_BENCH_PAIRS`): the per-pair
    // ratios spread widely there.
    let pairs = std::env::var("CAIRN_BENCH_PAIRS").ok().and_then(|n| n.parse().ok()).unwrap_or(size(15, 3));
    let home = CairnHome::new()?;
    std::fs::write(home.home.join("config.toml"), "[tools]\nstaged = false\n")?;
    let script = home.write_lines(
        "turn.jsonl",
        &[
            json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell", "arguments": {"command": "echo hi"}}]}),
            json!({"text": "done"}),
        ],
    )?;
    let (endpoint, posts) = match std::env::var("CAIRN_BENCH_OTLP_ENDPOINT") {
        Ok(e) if !e.is_empty() => (e, Arc::new(AtomicU64::new(0))),
        _ => receiver()?,
    };
    // Warm the file cache and the session directory.
    run(&home, &bin, &script, None)?;
    run(&home, &bin, &script, Some(&endpoint))?;
    let failed = std::cell::RefCell::new(None);
    let (on, off) = sample_pairs(
        pairs,
        || {
            if let Err(e) = run(&home, &bin, &script, Some(&endpoint)) {
                failed.borrow_mut().get_or_insert(e);
            }
        },
        || {
            if let Err(e) = run(&home, &bin, &script, None) {
                failed.borrow_mut().get_or_insert(e);
            }
        },
    );
    if let Some(e) = failed.into_inner() {
        return Err(e);
    }
    let mut table = Table::new("telemetry: a one-tool turn (`cairn run`, scripted), export on vs off");
    table.claim("telemetry on, live receiver", &on, "telemetry off", &off, 1.02);
    table.figure("OTLP requests the in-process receiver answered", &posts.load(Ordering::Relaxed).to_string());
    table.print();
    Ok(())
}
