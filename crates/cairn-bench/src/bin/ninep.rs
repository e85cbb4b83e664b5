//! Benchmark: the 9P control plane (`cairn-9p`) against the same work done
//! in-process on the same runtime.
//!
//! - `state` read: walk + open + read + clunk over 9P (a Unix socket,
//!   served by the real listener and connection threads) vs `Runtime::state` called directly.
//! - `prompt` write: walk + open + write + clunk over 9P, returning once
//!   the turn has started, vs `Runtime::start` called directly. The turn
//!   (scripted provider, one answer) is waited for outside the timing.
//!
//! - Concurrent sessions: N sessions each get a prompt over 9P at once
//!   (scripted provider: one `echo` call, then an answer — two steps); a
//!   turn's latency (prompt write to idle) at N against the same turn
//!   alone, measured in alternating rounds; the largest N whose median
//!   stays within 2× is reported (it is bounded by the cores: every turn
//!   step is CPU work).
//!
//! Both sides run interleaved in the same run (`sample_pairs`).
//!
//! Run: `cargo run --release -p cairn-bench --bin ninep` (`--smoke`: tiny
//! sizes, for `scripts/test`).
#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use cairn_9p::client::{Conn, mode};
use cairn_9p::host::{HostTools, ProviderChoices, SessionHost};
use cairn_9p::{Host, Limits, Runtime, Server, SessionSpec};
use cairn_bench::{Table, sample_pairs, size};
use cairn_core::SessionConfig;
use cairn_core::provider::Provider;
use cairn_core::storage::{Durability, StoreOptions};
use cairn_testtools::{EchoTool, ScriptLine, ScriptProvider};

/// A host with the in-process scripted provider and no tools.
#[derive(Debug)]
struct BenchHost {
    dir: PathBuf,
}

impl SessionHost for BenchHost {
    fn session_config(&self) -> SessionConfig {
        SessionConfig::default()
    }
    fn turn(
        &self,
        _cwd: &Path,
        _store: &mut cairn_core::storage::JsonlStore,
        _prompt: Option<&str>,
        _approver: &cairn_core::approval::PolicyApprover,
        _person: Option<&cairn_core::approval::SharedApprover>,
    ) -> Result<(HostTools, SessionConfig)> {
        let tools = HostTools { tools: vec![Arc::new(EchoTool::new())], notes: Vec::new(), hooks: None };
        Ok((tools, self.session_config()))
    }
    fn providers(&self) -> ProviderChoices {
        ProviderChoices {
            current: "scripted".to_owned(),
            choices: vec![("scripted".to_owned(), "a script".to_owned())],
        }
    }
}

impl Host for BenchHost {
    fn sessions_dir(&self) -> PathBuf {
        self.dir.join("sessions")
    }
    fn archive_dir(&self) -> PathBuf {
        self.dir.join("archive")
    }
    fn store_options(&self) -> StoreOptions {
        StoreOptions::with_durability(Durability::None)
    }
    fn check_provider(&self, _name: &str) -> Result<()> {
        // Any name: the spec's `script` picks the bench script.
        Ok(())
    }
    fn provider(&self, spec: &SessionSpec, _cwd: &Path) -> Result<Box<dyn Provider + Send>> {
        let lines: Vec<ScriptLine> = if spec.script.ends_with("echo.script") {
            // Two steps: an `echo` call, then the answer.
            serde_json::from_value(serde_json::json!([
                {"text": "", "toolCalls": [{"id": "c1", "name": "echo", "arguments": {"text": "hi"}}]},
                {"text": "ok"}
            ]))?
        } else {
            serde_json::from_value(serde_json::json!([{"text": "ok"}]))?
        };
        Ok(Box::new(ScriptProvider::new(lines).cycling()))
    }
    fn tools_text(&self) -> String {
        String::new()
    }
}

fn wait_idle(rt: &Runtime, id: &str) {
    while rt.is_running(id) {
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn main() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // The server refuses a socket in a directory others can enter.
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    let rt = Runtime::new(Arc::new(BenchHost { dir: dir.path().to_owned() }));
    let server = Arc::new(Server::new(Arc::clone(&rt), Limits::default()));
    let sock = dir.path().join("bench.sock");
    let (listener, dial) = cairn_9p::server::Listener::bind(&cairn_9p::Dial::Unix(sock), false)?;
    server.spawn(listener)?;
    let mut conn = Conn::dial(&dial)?;
    let id = conn.create_session(&format!("cwd={}", dir.path().display()))?;

    let mut table = Table::new("9P control plane vs in-process");
    let samples = size(200, 5);
    let state_path = format!("s/{id}/state");
    let (over_9p, direct) = sample_pairs(
        samples,
        || {
            let _ = conn.read_file(&state_path);
        },
        || {
            let _ = rt.state(&id);
        },
    );
    table.compare("state read over 9P (walk+open+read+clunk)", &over_9p, "in-process Runtime::state", &direct);

    let (fid, _) = conn.walk(&state_path)?;
    conn.open(fid, mode::READ)?;
    let (one_read, direct) = sample_pairs(
        samples,
        || {
            let _ = conn.read_at(fid, 0, 1024);
        },
        || {
            let _ = rt.state(&id);
        },
    );
    conn.clunk(fid)?;
    table.compare("state read over 9P (one Tread on an open fid)", &one_read, "in-process Runtime::state", &direct);

    let prompts = size(50, 5);
    let prompt_path = format!("s/{id}/prompt");
    let mut over_9p = Vec::new();
    let mut direct = Vec::new();
    for _ in 0..prompts {
        let (a, b) = sample_pairs(
            1,
            || {
                let _ = conn.write_file(&prompt_path, b"hello");
                wait_idle(&rt, &id);
            },
            || {
                let _ = rt.start(&id, Some("hello".to_owned()));
                wait_idle(&rt, &id);
            },
        );
        over_9p.extend(a);
        direct.extend(b);
    }
    table.compare("prompt write over 9P + the turn (one answer)", &over_9p, "Runtime::start + the turn", &direct);
    concurrent_sessions(&mut conn, &rt, dir.path(), &mut table)?;
    table.print();
    Ok(())
}

/// Prompt every session in `ids` over 9P at once; each one's turn latency
/// (its prompt write until it is idle again).
fn round(conn: &mut Conn, rt: &Runtime, ids: &[String]) -> Result<Vec<Duration>> {
    let mut started = Vec::with_capacity(ids.len());
    for id in ids {
        started.push(Instant::now());
        conn.write_file(&format!("s/{id}/prompt"), b"go")?;
    }
    let mut done: Vec<Option<Duration>> = vec![None; ids.len()];
    while done.iter().any(Option::is_none) {
        for (i, id) in ids.iter().enumerate() {
            if done[i].is_none() && !rt.is_running(id) {
                done[i] = Some(started[i].elapsed());
            }
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    Ok(done.into_iter().flatten().collect())
}

fn concurrent_sessions(conn: &mut Conn, rt: &Runtime, dir: &Path, table: &mut Table) -> Result<()> {
    let levels: Vec<usize> = size(vec![2, 4, 8, 16, 32, 64], vec![2, 4]);
    let rounds = size(9, 2);
    let max = levels.iter().copied().max().unwrap_or(1);
    // `s/new` wants an existing script file; the host picks the bench
    // script by its name.
    let script = dir.join("echo.script");
    std::fs::write(&script, "")?;
    let mut ids = Vec::with_capacity(max);
    for _ in 0..max {
        ids.push(conn.create_session(&format!("cwd={} script={}", dir.display(), script.display()))?);
    }
    let mut largest_within = 1;
    for &n in &levels {
        let mut together = Vec::new();
        let mut alone = Vec::new();
        for r in 0..rounds {
            // Alternate which goes first, so neither always runs warm.
            // A lone turn is short: take three per round, so the baseline's
            // median rests on as many rounds as the measured one.
            for half in [r % 2, 1 - r % 2] {
                if half == 0 {
                    together.extend(round(conn, rt, &ids[..n])?);
                } else {
                    for _ in 0..3 {
                        alone.extend(round(conn, rt, &ids[..1])?);
                    }
                }
            }
        }
        let ratio = table.compare(
            &format!("a two-step turn with {n} sessions prompted at once"),
            &together,
            "the same turn alone",
            &alone,
        );
        if ratio.of_medians <= 2.0 && largest_within == n / 2 {
            largest_within = n;
        }
    }
    table.figure(
        "most concurrent sessions with a turn's latency within 2× of one alone",
        &format!("{largest_within} (levels tried: {levels:?}; {} cores)", cores()),
    );
    Ok(())
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}
