//! Benchmark: the 9P control plane (`cairn-9p`) against the same work done
//! in-process on the same runtime.
//!
//! - `state` read: walk + open + read + clunk over 9P (a Unix socket,
//!   served by the real listener and connection threads) vs `Runtime::state` called directly.
//! - `prompt` write: walk + open + write + clunk over 9P, returning once
//!   the turn has started, vs `Runtime::start` called directly. The turn
//!   (scripted provider, one answer) is waited for outside the timing.
//!
//! Both sides run interleaved in the same run (`sample_pairs`). Not
//! measured yet: how many concurrent sessions one server drives before a
//! turn's step overhead doubles (reported as pending).
//!
//! Run: `cargo run --release -p cairn-bench --bin ninep` (`--smoke`: tiny
//! sizes, for `scripts/test`).
#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use cairn_9p::client::{Conn, mode};
use cairn_9p::{Host, Limits, Runtime, Server, SessionSpec};
use cairn_bench::{Table, sample_pairs, size};
use cairn_core::provider::Provider;
use cairn_core::storage::{Durability, StoreOptions};
use cairn_core::{SessionConfig, ToolRegistry};
use cairn_testtools::{ScriptLine, ScriptProvider};

/// A host with the in-process scripted provider and no tools.
#[derive(Debug)]
struct BenchHost {
    dir: PathBuf,
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
    fn session_config(&self) -> SessionConfig {
        SessionConfig::default()
    }
    fn default_provider(&self) -> String {
        "scripted".to_owned()
    }
    fn check_provider(&self, _name: &str) -> Result<()> {
        Ok(())
    }
    fn provider(&self, _spec: &SessionSpec, _cwd: &Path) -> Result<Box<dyn Provider + Send>> {
        let line: ScriptLine = serde_json::from_value(serde_json::json!({"text": "ok"}))?;
        Ok(Box::new(ScriptProvider::new(vec![line]).cycling()))
    }
    fn tools(&self, _cwd: &Path) -> Result<ToolRegistry> {
        Ok(ToolRegistry::new(true))
    }
    fn providers_text(&self) -> String {
        "scripted\n".to_owned()
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
    table.figure("concurrent sessions before a step's overhead doubles", "pending (not measured yet)");
    table.print();
    Ok(())
}
