//! Benchmark of MCP servers as tools (issue 31): the per-call cost of a
//! tool of a running stdio MCP server (npm `server-everything`'s `echo`,
//! through `cairn-mcp` and the official SDK) against the same work as an
//! external executable tool (a sandboxed process that reads the JSON
//! arguments on stdin and writes them back, through cairn's process
//! runner, which is what an external tool call costs), and the time to
//! start a server and list its tools. Every row: median of several samples
//! interleaved with the baseline's, with the spread.
//!
//! Needs node and npm (the server is installed by `scripts/node-env
//! mcpservers`). Run: `cargo run --release -p cairn-bench --bin mcp`
//! (`--smoke`: a few samples, for `scripts/test`).
#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cairn_bench::{Table, describe, sample_pairs, size};
use cairn_core::CancelToken;
use cairn_core::staged::StagedDecision;
use cairn_core::tool::{ToolContext, ToolLimits, ToolRequest};
use cairn_mcp::ServerConfig;
use cairn_tools::process::{RunSpec, run};
use cairn_tools::sandbox::SandboxPolicy;
use cairn_tools::{ToolEntry, ToolsConfig};
use serde_json::json;

fn node_prefix() -> Result<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(root.join("scripts/node-env")).arg("mcpservers").output().context("scripts/node-env")?;
    if !out.status.success() {
        bail!(
            "scripts/node-env mcpservers failed (needs node, npm and the npm registry): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn server(node: &Path) -> Result<ServerConfig> {
    let table: toml::Table = toml::from_str(&format!(
        "command = \"{node}/node_modules/.bin/mcp-server-everything\"\nread = [\"{node}\"]\n",
        node = node.display()
    ))?;
    Ok(ServerConfig::from_toml("every", toml::Value::Table(table))?)
}

fn call(entry: &ToolEntry, cwd: &Path, n: usize) {
    let request = ToolRequest {
        invocation_id: String::new(),
        call_id: String::new(),
        session_id: String::new(),
        tool: entry.tool.spec().name.clone(),
        arguments: json!({ "message": format!("hello {n}") }),
    };
    let cancel = CancelToken::new();
    let mut ctx = ToolContext {
        cwd,
        cancel: &cancel,
        limits: ToolLimits::default(),
        output: &mut |_| {},
        approve_bypass: &mut |_| false,
        review_staged: &mut |_| StagedDecision::Apply { by: "bench".into() },
        elicit: &mut |_, _| cairn_core::elicit::nobody(),
    };
    let receipt = entry.tool.execute(&request, &mut ctx);
    assert!(matches!(&receipt, Ok(r) if r.output_summary.contains("hello")), "{receipt:?}");
}

fn main() -> Result<()> {
    let node = node_prefix()?;
    let dir = tempfile::tempdir()?;
    let cwd = dir.path().canonicalize()?;
    let tools = ToolsConfig::default();
    let mut servers = BTreeMap::new();
    servers.insert("every".to_owned(), server(&node)?);
    let loaded = cairn_mcp::load(&servers, &cwd, &tools, &[]);
    if !loaded.notes.is_empty() {
        bail!("the server did not load: {:?}", loaded.notes);
    }
    let echo = loaded
        .entries
        .iter()
        .find(|e| e.tool.spec().name == "mcp__every__echo")
        .context("server-everything offers no echo tool")?
        .clone();
    let echo_back = cwd.join("echo-back");
    std::fs::write(&echo_back, "#!/bin/sh\nexec cat\n")?;
    std::fs::set_permissions(&echo_back, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let external = |n: usize| {
        let spec = RunSpec {
            argv: vec![OsString::from(&echo_back)],
            cwd: cwd.clone(),
            stdin: json!({ "message": format!("hello {n}") }).to_string().into_bytes(),
            env: cairn_tools::env::scrubbed_env(&tools.secrets),
            sandbox: Some(SandboxPolicy { cwd: cwd.clone(), read_cwd: true, ..SandboxPolicy::default() }),
            timeout: Duration::from_secs(30),
            output_cap: 16 * 1024,
            max_processes: 256,
            pid_namespace: true,
            hidden: Vec::new(),
        };
        let out = run(&spec, &CancelToken::new(), &mut |_| {});
        assert!(matches!(&out, Ok(o) if String::from_utf8_lossy(&o.stdout.kept).contains("hello")), "{out:?}");
    };
    call(&echo, &cwd, 0);
    external(0);
    let samples = size(41, 5);
    let mut table = Table::new("mcp");
    let (mut i, mut j) = (0, 0);
    let (mcp, ext) = sample_pairs(
        samples,
        || {
            i += 1;
            call(&echo, &cwd, i)
        },
        || {
            j += 1;
            external(j)
        },
    );
    table.compare("one echo call to a running stdio MCP server", &mcp, "the same as a sandboxed external tool", &ext);
    // Start-up: a server is started once per process and configuration;
    // each sample is a fresh one (a new name), so nothing is reused.
    let starts = size(7, 2);
    let mut started = Vec::new();
    for k in 0..starts {
        let mut one = BTreeMap::new();
        one.insert(format!("start{k}"), server(&node)?);
        let t = Instant::now();
        let loaded = cairn_mcp::load(&one, &cwd, &tools, &[]);
        started.push(t.elapsed());
        if !loaded.notes.is_empty() {
            bail!("a server did not start: {:?}", loaded.notes);
        }
    }
    table.figure("start server-everything and list its tools (sandboxed)", &describe(&started));
    table.print();
    Ok(())
}
