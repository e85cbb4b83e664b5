//! Shared helpers for cairn's benchmarks: timing samples, medians and the
//! ratio against a baseline measured in the same run. Machines here are
//! shared and noisy, so every figure is a median of several samples and every
//! claim is a ratio, never an absolute time compared with a constant.
#![deny(missing_docs)]
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

/// Time `f` `samples` times and return the durations.
pub fn sample<F: FnMut()>(samples: usize, mut f: F) -> Vec<Duration> {
    (0..samples)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect()
}

/// The median of some durations (zero for none).
pub fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

/// Print one comparison line: `name: median X (baseline Y) ratio R`.
pub fn report(name: &str, measured: Duration, baseline: Duration) -> f64 {
    let ratio = measured.as_secs_f64() / baseline.as_secs_f64().max(f64::MIN_POSITIVE);
    println!("{name}: median {measured:?} (baseline {baseline:?}) ratio {ratio:.3}");
    ratio
}

/// Peak resident set size of this process in bytes (Linux `VmHWM`), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
