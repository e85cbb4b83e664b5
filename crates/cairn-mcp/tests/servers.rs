//! cairn-mcp against a real server (npm `@modelcontextprotocol/server-everything`,
//! installed by `scripts/node-env mcpservers`): a server that dies is
//! restarted once per turn and the receipt says so; a cancelled call
//! returns at once and leaves the server usable.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cairn_core::CancelToken;
use cairn_core::staged::StagedDecision;
use cairn_core::tool::{ToolContext, ToolError, ToolLimits, ToolReceipt, ToolRequest};
use cairn_mcp::ServerConfig;
use cairn_tools::{ToolEntry, ToolsConfig};
use serde_json::{Value, json};

fn node_prefix() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/node-env");
    let out = Command::new(script).arg("mcpservers").output().unwrap();
    assert!(out.status.success(), "scripts/node-env mcpservers failed: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// server-everything.
fn everything() -> BTreeMap<String, ServerConfig> {
    let node = node_prefix();
    let table: toml::Table = toml::from_str(&format!(
        "command = \"{node}/node_modules/.bin/mcp-server-everything\"\nread = [\"{node}\"]\n",
        node = node.display()
    ))
    .unwrap();
    let mut servers = BTreeMap::new();
    servers.insert("every".to_owned(), ServerConfig::from_toml("every", toml::Value::Table(table)).unwrap());
    servers
}

fn tool<'a>(entries: &'a [ToolEntry], name: &str) -> &'a ToolEntry {
    entries.iter().find(|e| e.tool.spec().name == name).unwrap_or_else(|| panic!("no {name}"))
}

fn call(entry: &ToolEntry, cwd: &Path, arguments: Value, cancel: &CancelToken) -> Result<ToolReceipt, ToolError> {
    let request = ToolRequest {
        invocation_id: "i1".into(),
        call_id: "c1".into(),
        session_id: "s".into(),
        tool: entry.tool.spec().name.clone(),
        arguments,
    };
    let mut ctx = ToolContext {
        cwd,
        cancel,
        limits: ToolLimits::default(),
        output: &mut |_| {},
        approve_bypass: &mut |_| false,
        review_staged: &mut |_| StagedDecision::Apply { by: "test".into() },
        elicit: &mut |_, _| cairn_core::elicit::nobody(),
    };
    entry.tool.execute(&request, &mut ctx)
}

/// Kill every process working in `cwd` (each test's server has its own
/// temporary directory); how many.
fn kill_marked(cwd: &Path) -> usize {
    let mut killed = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if let Ok(pid) = pid.parse::<i32>()
            && pid != std::process::id() as i32
            && std::fs::read_link(entry.path().join("cwd")).is_ok_and(|d| d == cwd)
        {
            // SAFETY: kill(2) on a process this test's server started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            killed += 1;
        }
    }
    killed
}

#[test]
fn a_server_that_dies_is_restarted_once_per_turn_and_the_receipt_says_so() {
    let servers = everything();
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().canonicalize().unwrap();
    let loaded = cairn_mcp::load(&servers, &cwd, &ToolsConfig::default(), &[]);
    assert!(loaded.notes.is_empty(), "{:?}", loaded.notes);
    let echo = tool(&loaded.entries, "mcp__every__echo");
    let never = CancelToken::new();
    assert!(call(echo, &cwd, json!({"message": "one"}), &never).unwrap().output_summary.contains("one"));

    assert!(kill_marked(&cwd) > 0, "the server's process was not found");
    let deadline = Instant::now() + Duration::from_secs(10);
    let receipt = loop {
        // The kill may take a moment to be seen; a call on a connection
        // that is still closing fails, and the next one restarts.
        match call(echo, &cwd, json!({"message": "two"}), &never) {
            Ok(r) => break r,
            Err(e) if Instant::now() < deadline => {
                assert!(e.to_string().contains("is gone"), "{e}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("never restarted: {e}"),
        }
    };
    assert!(receipt.output_summary.contains("two"), "{}", receipt.output_summary);
    assert!(receipt.output_summary.contains("restarted it"), "the restart is reported: {}", receipt.output_summary);

    // Once per turn: killed again, this turn's tools do not restart it...
    assert!(kill_marked(&cwd) > 0);
    std::thread::sleep(Duration::from_millis(300));
    let again = call(echo, &cwd, json!({"message": "three"}), &never).unwrap_err().to_string();
    assert!(again.contains("already restarted once this turn"), "{again}");
    // ...and the next turn's load starts it and says so.
    let next = cairn_mcp::load(&servers, &cwd, &ToolsConfig::default(), &[]);
    assert!(next.notes.iter().any(|n| n.contains("restarted it")), "{:?}", next.notes);
    let echo = tool(&next.entries, "mcp__every__echo");
    assert!(call(echo, &cwd, json!({"message": "four"}), &never).unwrap().output_summary.contains("four"));
}

#[test]
fn a_cancelled_call_returns_at_once_and_the_server_stays_usable() {
    let servers = everything();
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().canonicalize().unwrap();
    let loaded = cairn_mcp::load(&servers, &cwd, &ToolsConfig::default(), &[]);
    let long = tool(&loaded.entries, "mcp__every__trigger-long-running-operation");
    let cancel = CancelToken::new();
    let canceller = {
        let cancel = cancel.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(500));
            cancel.cancel();
        })
    };
    let result = call(long, &cwd, json!({"duration": 60, "steps": 60}), &cancel);
    canceller.join().unwrap();
    assert!(matches!(result, Err(ToolError::Cancelled)), "{result:?}");
    let echo = tool(&loaded.entries, "mcp__every__echo");
    let receipt = call(echo, &cwd, json!({"message": "still here"}), &CancelToken::new()).unwrap();
    assert!(receipt.output_summary.contains("still here"));
    assert!(!receipt.output_summary.contains("restarted"), "the server was not restarted: {}", receipt.output_summary);
    kill_marked(&cwd);
}
