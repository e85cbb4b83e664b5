//! `cairn acp` and `cairn mcp`: the CLI's side of the editor and agent
//! faces. It only adds to [`RuntimeHost`] (every served face's host, which
//! equips each turn: `hosting.rs`) what these protocols need besides
//! ([`cairn_faces::Host`]: the provider, every tool for MCP, an editor's
//! MCP servers, the approval policy, finding a session by id), and hands
//! stdio to `cairn-faces`, which owns the protocols.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use cairn_faces::jsonrpc::Out;

use crate::hosting::RuntimeHost;
use crate::invocation::{Invocation, exit};

fn stdout() -> Out {
    Out::new(Box::new(std::io::stdout()))
}

/// `cairn acp` (`--editor-terminal`: `shell` may run in the editor's
/// terminal when it offers one).
pub fn acp(ctx: &Invocation, editor_terminal: bool) -> Result<u8> {
    let stdin = std::io::BufReader::new(std::io::stdin());
    let options = cairn_faces::acp::Options { editor_terminal };
    cairn_faces::acp::serve(&RuntimeHost { ctx: ctx.setup.clone() }, stdin, stdout(), options)?;
    Ok(exit::SUCCESS)
}

/// `cairn mcp`.
pub fn mcp(ctx: &Invocation, page_size: usize) -> Result<u8> {
    let root: PathBuf = match &ctx.common.cwd {
        Some(dir) => dir.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    let root = root.canonicalize().with_context(|| format!("--cwd {}: no such directory", root.display()))?;
    let options = cairn_faces::mcp_server::McpOptions { root, page_size };
    let stdin = std::io::BufReader::new(std::io::stdin());
    cairn_faces::mcp_server::serve(&RuntimeHost { ctx: ctx.setup.clone() }, options, stdin, &stdout())?;
    Ok(exit::SUCCESS)
}
