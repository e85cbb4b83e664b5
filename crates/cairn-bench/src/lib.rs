//! Shared helpers for cairn's benchmarks: timing samples, medians with their
//! spread, ratios against a baseline measured in the same run, the summary
//! table each binary prints last, and the smoke mode `scripts/test` uses.
//!
//! Machines here are shared and noisy, so every figure is the median of at
//! least [`MIN_SAMPLES`] samples shown with its spread, and every claim is a
//! ratio against a baseline measured in the same run (samples interleaved
//! where the code allows, so both sides see the same load), never an
//! absolute time compared with a constant. A claim whose margin is smaller
//! than the spread of the ratio is reported as not shown, not as met.
//!
//! This crate must not assert anything about timings: in smoke mode
//! ([`smoke`]) the binaries run every code path on tiny inputs so that they
//! keep building and working, and their figures mean nothing.
#![deny(missing_docs)]
#![allow(clippy::print_stdout)]

use std::fmt;
use std::time::{Duration, Instant};

/// The fewest samples a reported median may rest on.
pub const MIN_SAMPLES: usize = 5;

/// Whether this run is a smoke run (`--smoke` argument or
/// `CAIRN_BENCH_SMOKE=1`): tiny sizes, every code path, figures meaningless.
pub fn smoke() -> bool {
    std::env::var_os("CAIRN_BENCH_SMOKE").is_some_and(|v| v != "0" && !v.is_empty())
        || std::env::args().any(|a| a == "--smoke")
}

/// `full` in a measuring run, `tiny` in a smoke run.
pub fn size<T>(full: T, tiny: T) -> T {
    if smoke() { tiny } else { full }
}

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

/// Time `measured` and `baseline` alternately, `samples` times each, so both
/// see the same load; returns (measured, baseline) durations, paired by index.
pub fn sample_pairs<F: FnMut(), G: FnMut()>(
    samples: usize,
    mut measured: F,
    mut baseline: G,
) -> (Vec<Duration>, Vec<Duration>) {
    let mut ours = Vec::with_capacity(samples);
    let mut base = Vec::with_capacity(samples);
    for i in 0..samples {
        // Alternate which side goes first, so neither always runs warm.
        if i % 2 == 0 {
            ours.extend(sample(1, &mut measured));
            base.extend(sample(1, &mut baseline));
        } else {
            base.extend(sample(1, &mut baseline));
            ours.extend(sample(1, &mut measured));
        }
    }
    (ours, base)
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

/// Median, quartiles and range of some samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// The median (upper median for an even count).
    pub median: f64,
    /// First quartile (nearest rank).
    pub q1: f64,
    /// Third quartile (nearest rank).
    pub q3: f64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// How many samples.
    pub n: usize,
}

impl Spread {
    /// The spread of `values` (all zero for none).
    pub fn of(values: &[f64]) -> Spread {
        let mut v: Vec<f64> = values.to_vec();
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v.get(((v.len().saturating_sub(1)) as f64 * q).round() as usize).copied().unwrap_or(0.0);
        Spread { median: at(0.5), q1: at(0.25), q3: at(0.75), min: at(0.0), max: at(1.0), n: v.len() }
    }

    /// The spread of durations, in seconds.
    pub fn of_durations(samples: &[Duration]) -> Spread {
        Spread::of(&samples.iter().map(Duration::as_secs_f64).collect::<Vec<_>>())
    }
}

/// A duration in seconds, printed with a unit and three significant digits.
#[derive(Debug, Clone, Copy)]
pub struct Secs(pub f64);

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        let (v, unit) = if s >= 1.0 {
            (s, "s")
        } else if s >= 1e-3 {
            (s * 1e3, "ms")
        } else if s >= 1e-6 {
            (s * 1e6, "µs")
        } else {
            (s * 1e9, "ns")
        };
        let digits = if v >= 100.0 {
            0
        } else if v >= 10.0 {
            1
        } else {
            2
        };
        write!(f, "{v:.digits$} {unit}")
    }
}

/// `median (min–max)` of durations.
pub fn describe(samples: &[Duration]) -> String {
    let s = Spread::of_durations(samples);
    format!("{} ({}–{}, n={})", Secs(s.median), Secs(s.min), Secs(s.max), s.n)
}

/// `median unit (min–max, n)` of some values (rates, shares).
pub fn describe_values(values: &[f64], unit: &str) -> String {
    let s = Spread::of(values);
    format!("{:.1} {unit} ({:.1}–{:.1}, n={})", s.median, s.min, s.max, s.n)
}

/// A ratio of paired samples: the ratio of the medians, and the spread of the
/// per-pair ratios (how much the comparison itself moves between samples).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio {
    /// Median of measured over median of baseline.
    pub of_medians: f64,
    /// Spread of measured[i] / baseline[i].
    pub pairs: Spread,
}

impl Ratio {
    /// Compare paired samples (extra samples on either side are ignored for
    /// the per-pair spread).
    pub fn of(measured: &[Duration], baseline: &[Duration]) -> Ratio {
        let m = Spread::of_durations(measured).median;
        let b = Spread::of_durations(baseline).median;
        let per_pair: Vec<f64> = measured
            .iter()
            .zip(baseline)
            .map(|(m, b)| m.as_secs_f64() / b.as_secs_f64().max(f64::MIN_POSITIVE))
            .collect();
        Ratio { of_medians: m / b.max(f64::MIN_POSITIVE), pairs: Spread::of(&per_pair) }
    }

    /// Compare in rounds: each round is a batch of paired samples (say 200
    /// commits each); the spread is that of the per-round ratios of
    /// medians, which is what a claim about the median ratio must beat.
    pub fn of_rounds(rounds: &[(Vec<Duration>, Vec<Duration>)]) -> Ratio {
        let measured: Vec<Duration> = rounds.iter().flat_map(|r| r.0.iter().copied()).collect();
        let baseline: Vec<Duration> = rounds.iter().flat_map(|r| r.1.iter().copied()).collect();
        let m = Spread::of_durations(&measured).median;
        let b = Spread::of_durations(&baseline).median;
        let per_round: Vec<f64> = rounds
            .iter()
            .map(|(m, b)| Spread::of_durations(m).median / Spread::of_durations(b).median.max(f64::MIN_POSITIVE))
            .collect();
        Ratio { of_medians: m / b.max(f64::MIN_POSITIVE), pairs: Spread::of(&per_round) }
    }

    /// Whether "ratio ≤ target" is shown by these samples: even the third
    /// quartile of the per-pair ratios is within it. `None` when the
    /// quartiles straddle the target (the spread is larger than the margin):
    /// the claim can be neither shown nor refuted here.
    pub fn at_most(&self, target: f64) -> Option<bool> {
        if self.pairs.q3 <= target {
            Some(true)
        } else if self.pairs.q1 > target {
            Some(false)
        } else {
            None
        }
    }
}

impl fmt::Display for Ratio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.pairs;
        write!(
            f,
            "{:.3} (per pair: IQR {:.3}–{:.3}, min–max {:.3}–{:.3}, n={})",
            self.of_medians, p.q1, p.q3, p.min, p.max, p.n
        )
    }
}

/// The summary a benchmark binary prints at its end: one row per figure,
/// as a Markdown table ready for `BENCHMARKS.md`.
#[derive(Debug)]
pub struct Table {
    title: String,
    rows: Vec<[String; 4]>,
}

impl Table {
    /// An empty table for one area.
    pub fn new(title: &str) -> Table {
        if smoke() {
            println!("(smoke run: tiny sizes, every code path; the figures mean nothing)");
        }
        Table { title: title.to_owned(), rows: Vec::new() }
    }

    /// Compare paired samples against a baseline: print a line now, add a
    /// row, and return the ratio.
    pub fn compare(&mut self, measure: &str, measured: &[Duration], baseline: &str, base: &[Duration]) -> Ratio {
        let ratio = Ratio::of(measured, base);
        println!("{measure}: {} vs {baseline}: {}; ratio {ratio}", describe(measured), describe(base));
        self.rows.push([
            measure.to_owned(),
            describe(measured),
            format!("{baseline}: {}", describe(base)),
            ratio.to_string(),
        ]);
        ratio
    }

    /// Compare against a baseline and state whether `ratio ≤ target` is
    /// shown, refuted or beyond what this machine's noise lets one say.
    pub fn claim(
        &mut self,
        measure: &str,
        measured: &[Duration],
        baseline: &str,
        base: &[Duration],
        target: f64,
    ) -> Ratio {
        let ratio = self.compare(measure, measured, baseline, base);
        self.verdict(ratio, target);
        ratio
    }

    /// [`Table::claim`] over rounds of paired samples (see
    /// [`Ratio::of_rounds`]).
    pub fn claim_rounds(
        &mut self,
        measure: &str,
        rounds: &[(Vec<Duration>, Vec<Duration>)],
        baseline: &str,
        target: f64,
    ) -> Ratio {
        let ratio = Ratio::of_rounds(rounds);
        let measured: Vec<Duration> = rounds.iter().flat_map(|r| r.0.iter().copied()).collect();
        let base: Vec<Duration> = rounds.iter().flat_map(|r| r.1.iter().copied()).collect();
        let shown = format!(
            "{} (per round: IQR {:.3}–{:.3}, min–max {:.3}–{:.3}, {} rounds)",
            format_args!("{:.3}", ratio.of_medians),
            ratio.pairs.q1,
            ratio.pairs.q3,
            ratio.pairs.min,
            ratio.pairs.max,
            ratio.pairs.n
        );
        println!("{measure}: {} vs {baseline}: {}; ratio {shown}", describe(&measured), describe(&base));
        self.rows.push([measure.to_owned(), describe(&measured), format!("{baseline}: {}", describe(&base)), shown]);
        self.verdict(ratio, target);
        ratio
    }

    fn verdict(&mut self, ratio: Ratio, target: f64) {
        let verdict = match ratio.at_most(target) {
            Some(true) => format!("shown: ≤ {target} (third quartile of the ratios {:.3})", ratio.pairs.q3),
            Some(false) => format!("not met: > {target} (first quartile of the ratios {:.3})", ratio.pairs.q1),
            None => format!(
                "cannot be shown here: the ratios spread {:.3}–{:.3} (IQR) across the target {target}",
                ratio.pairs.q1, ratio.pairs.q3
            ),
        };
        println!("  claim ratio ≤ {target}: {verdict}");
        if let Some(row) = self.rows.last_mut() {
            row[3] = format!("{}; {verdict}", row[3]);
        }
    }

    /// A figure without a baseline (a throughput, a size).
    pub fn figure(&mut self, measure: &str, value: &str) {
        println!("{measure}: {value}");
        self.rows.push([measure.to_owned(), value.to_owned(), "—".to_owned(), "—".to_owned()]);
    }

    /// Print the table (Markdown).
    pub fn print(&self) {
        println!();
        println!("## {}{}", self.title, if smoke() { " (smoke run: figures mean nothing)" } else { "" });
        println!();
        println!(
            "| measure | median (min–max, n) | baseline, same run | ratio of medians (spread of per-pair ratios) |"
        );
        println!("|---|---|---|---|");
        for row in &self.rows {
            println!("| {} |", row.join(" | "));
        }
    }
}

/// Peak resident set size of this process in bytes (Linux `VmHWM`), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The `cairn` binary next to the running benchmark (or `CAIRN_BIN`), for
/// the benchmarks that run the real program.
pub fn cairn_bin() -> anyhow::Result<std::path::PathBuf> {
    use anyhow::Context as _;
    if let Some(bin) = std::env::var_os("CAIRN_BIN") {
        return Ok(std::path::PathBuf::from(bin));
    }
    let here = std::env::current_exe()?;
    let bin = here.parent().context("no directory of this binary")?.join("cairn");
    if !bin.is_file() {
        anyhow::bail!(
            "no cairn binary at {} (build it: cargo build --release -p cairn-cli, or set CAIRN_BIN)",
            bin.display()
        );
    }
    Ok(bin)
}

/// A private `CAIRN_HOME` (`home`) and working directory (`cwd`) in a
/// temporary directory, for the benchmarks that run the real `cairn`.
#[derive(Debug)]
pub struct CairnHome {
    _dir: tempfile::TempDir,
    /// cairn's home (`CAIRN_HOME`).
    pub home: std::path::PathBuf,
    /// The working directory of the runs (canonical).
    pub cwd: std::path::PathBuf,
}

impl CairnHome {
    /// A new, empty home and working directory.
    pub fn new() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let home = dir.path().join("home");
        let cwd = dir.path().join("work");
        std::fs::create_dir_all(&home)?;
        std::fs::create_dir_all(&cwd)?;
        let cwd = cwd.canonicalize()?;
        Ok(Self { _dir: dir, home, cwd })
    }

    /// `bin ARGS` in `cwd` with this home and a scrubbed environment
    /// (`PATH`, a fake `HOME`, `CAIRN_HOME` only).
    pub fn command(&self, bin: &std::path::Path, args: &[&str]) -> std::process::Command {
        let mut cmd = std::process::Command::new(bin);
        cmd.args(args)
            .current_dir(&self.cwd)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.home.join("fakehome"))
            .env("CAIRN_HOME", &self.home);
        cmd
    }

    /// Write `lines` (one JSON value a line) to `name` in the home.
    pub fn write_lines(&self, name: &str, lines: &[serde_json::Value]) -> anyhow::Result<std::path::PathBuf> {
        let path = self.home.join(name);
        std::fs::write(&path, lines.iter().map(|l| format!("{l}\n")).collect::<String>())?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_and_ratio() {
        let s = Spread::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!((s.median, s.q1, s.q3, s.min, s.max, s.n), (3.0, 2.0, 4.0, 1.0, 5.0, 5));
        let ms = |v: &[u64]| v.iter().map(|&x| Duration::from_millis(x)).collect::<Vec<_>>();
        let r = Ratio::of(&ms(&[10, 11, 12, 13, 14]), &ms(&[10, 10, 10, 10, 10]));
        assert!((r.of_medians - 1.2).abs() < 1e-9);
        assert_eq!(r.at_most(1.5), Some(true));
        assert_eq!(r.at_most(1.05), Some(false));
        assert_eq!(r.at_most(1.2), None, "IQR 1.1–1.3 straddles 1.2");
        assert_eq!(Secs(0.0042).to_string(), "4.20 ms");
        assert_eq!(Secs(123e-6).to_string(), "123 µs");
    }
}
