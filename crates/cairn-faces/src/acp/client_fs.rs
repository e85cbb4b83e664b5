//! `read_file`, `write_file` and `edit_file` through the editor: when the
//! client offers `fs/read_text_file` / `fs/write_text_file`, the ACP agent
//! wraps those built-ins so reads see unsaved buffers, edits apply to them
//! and writes land in the editor; the preview (the diff a person approves)
//! is made from the editor's text too, so the model, the diff and the edit
//! see one text.
//!
//! The wrapper keeps everything of the built-in but the I/O: its spec,
//! risk, validation, preview and guard (so approvals and replay are the
//! same), and the path confinement of `cairn_tools::paths` is applied
//! before the client is asked — a path outside the working directory is
//! refused without a request — and so are the built-ins' authority checks
//! (`cairn_tools::builtin::edit::hold_authority`: cairn's own directories
//! refused, other authority paths held for a person). It must not decide
//! approvals (the turn has already approved the call when `execute`
//! runs).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use cairn_core::authority::Protection;
use cairn_core::storage::now_millis;
use cairn_core::tool::{
    GuardVerdict, Preview, Risk, Tool, ToolContext, ToolError, ToolReceipt, ToolRequest, ToolSpec, Validation,
};
use cairn_tools::builtin::edit::{edit_text, hold_authority, unified_diff};
use cairn_tools::paths::{display_rel, resolve_in_cwd};
use serde_json::{Value, json};

use super::{Reply, Shared};

/// Which file operation goes through the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Read,
    Write,
    /// `edit_file`: read, edited, written back through the editor.
    Edit,
}

/// A built-in whose file I/O is done by the editor.
pub(super) struct ClientFile {
    pub(super) inner: Arc<dyn Tool>,
    pub(super) op: Op,
    pub(super) shared: Arc<Shared>,
    pub(super) session_id: String,
    /// The editor also offers reads (previews and edits read from it).
    pub(super) reads: bool,
    /// Which paths carry authority (the host's rules).
    pub(super) authority: cairn_core::authority::AuthorityRules,
}

impl ClientFile {
    fn ask(&self, method: &str, params: Value, ctx: &ToolContext<'_>) -> Result<Value, ToolError> {
        match self.shared.ask_until(&self.session_id, method, params, Some(ctx.cancel)) {
            Ok(Reply::Result(v)) => Ok(v),
            Ok(Reply::Error(e)) => {
                let message = e.get("message").and_then(Value::as_str).unwrap_or("no message");
                Err(ToolError::Other(format!("the editor refused {method}: {message}")))
            }
            Ok(Reply::Cancelled) => Err(ToolError::Cancelled),
            Err(why) => Err(ToolError::Other(why)),
        }
    }
}

/// The editor's text of `path` (its unsaved buffer, else the disk as the
/// editor sees it).
pub(super) fn editor_text(
    shared: &Shared,
    session_id: &str,
    path: &Path,
    cancel: Option<&cairn_core::CancelToken>,
) -> Result<String, ToolError> {
    let params = json!({"sessionId": session_id, "path": path});
    match shared.ask_until(session_id, "fs/read_text_file", params, cancel) {
        Ok(Reply::Result(v)) => v
            .get("content")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| ToolError::Other("the editor's fs/read_text_file answer has no content".into())),
        Ok(Reply::Error(e)) => {
            let message = e.get("message").and_then(Value::as_str).unwrap_or("no message");
            Err(ToolError::Other(format!("the editor refused fs/read_text_file: {message}")))
        }
        Ok(Reply::Cancelled) => Err(ToolError::Cancelled),
        Err(why) => Err(ToolError::Other(why)),
    }
}

fn string_arg<'a>(request: &'a ToolRequest, key: &str) -> Result<&'a str, ToolError> {
    request
        .arguments
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::InvalidArguments(format!("{key} must be a string")))
}

fn receipt(start: Instant, tier: Risk, out: String, structured: Value, affected: String) -> ToolReceipt {
    ToolReceipt {
        exit_code: 0,
        output_summary: out,
        structured_output: Some(structured),
        affected_entities: vec![affected],
        duration_ms: u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX),
        tier,
        timestamp: now_millis(),
        truncated: false,
    }
}

impl Tool for ClientFile {
    fn spec(&self) -> &ToolSpec {
        self.inner.spec()
    }

    fn risk(&self, arguments: &Value) -> Risk {
        self.inner.risk(arguments)
    }

    fn validate(&self, request: &ToolRequest) -> Validation {
        self.inner.validate(request)
    }

    fn preview(&self, request: &ToolRequest, cwd: &Path) -> Option<Preview> {
        if self.op == Op::Read || !self.reads {
            return self.inner.preview(request, cwd);
        }
        let given = string_arg(request, "path").ok()?;
        let path = resolve_in_cwd(cwd, given).ok()?;
        let rel = display_rel(cwd, &path);
        let current = editor_text(&self.shared, &self.session_id, &path, None);
        let planned = match self.op {
            Op::Edit => current.and_then(|old| Ok((edit_text(request, &old, &rel)?, old))),
            // A file the editor cannot read is new.
            _ => string_arg(request, "content").map(|new| (new.to_owned(), current.unwrap_or_default())),
        };
        Some(match planned {
            Ok((new, old)) => Preview::Diff { diff: unified_diff(&rel, &old, &new), path: rel },
            Err(e) => Preview::Text { text: format!("{} will fail: {e}", self.inner.spec().name) },
        })
    }

    fn guard(&self, request: &ToolRequest, cwd: &Path) -> GuardVerdict {
        self.inner.guard(request, cwd)
    }

    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let start = Instant::now();
        let given = string_arg(request, "path")?;
        let path = resolve_in_cwd(ctx.cwd, given).map_err(|e| ToolError::AccessDenied(e.to_string()))?;
        let rel = display_rel(ctx.cwd, &path);
        // cairn's own directories are hidden from tools, through the editor too.
        let tree = ctx.cwd.canonicalize().unwrap_or_else(|_| ctx.cwd.to_path_buf());
        if let Some(a) = self.authority.classify(&tree, &rel).filter(|a| a.protection() == Protection::Refused) {
            return Err(ToolError::AccessDenied(format!("{}; cairn refuses every tool access to it", a.reason())));
        }
        match self.op {
            Op::Read => {
                let line = request.arguments.get("offset").and_then(Value::as_u64);
                let limit = request.arguments.get("limit").and_then(Value::as_u64);
                let mut params = json!({"sessionId": self.session_id, "path": path});
                if let Some(line) = line {
                    params["line"] = json!(line);
                }
                if let Some(limit) = limit {
                    params["limit"] = json!(limit);
                }
                let answer = self.ask("fs/read_text_file", params, ctx)?;
                let content = answer
                    .get("content")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ToolError::Other("the editor's fs/read_text_file answer has no content".into()))?;
                // Numbered like the built-in, from the line the client started at.
                let first = line.unwrap_or(1).max(1);
                let mut out = String::new();
                let mut shown = 0u64;
                for (i, text) in content.lines().enumerate() {
                    if out.len() > ctx.limits.output_cap {
                        break;
                    }
                    out.push_str(&format!("{:>6}\t{text}\n", first + i as u64));
                    shown += 1;
                }
                if content.is_empty() {
                    out.push_str("[empty file]\n");
                }
                (ctx.output)(out.as_bytes());
                let structured = json!({"path": rel, "firstLine": first, "linesShown": shown, "via": "editor"});
                Ok(receipt(start, Risk::ReadOnly, out, structured, rel))
            }
            Op::Edit => {
                let old = editor_text(&self.shared, &self.session_id, &path, Some(ctx.cancel))?;
                let new = edit_text(request, &old, &rel)?;
                let diff = unified_diff(&rel, &old, &new);
                hold_authority(&self.authority, ctx, &rel, &new, &diff, self.inner.risk(&request.arguments))?;
                let params = json!({"sessionId": self.session_id, "path": path, "content": new});
                self.ask("fs/write_text_file", params, ctx)?;
                let out = format!("edited {rel} through the editor\n{diff}");
                (ctx.output)(out.as_bytes());
                let structured = json!({"path": rel, "bytes": new.len(), "diff": diff, "via": "editor"});
                Ok(receipt(start, self.inner.risk(&request.arguments), out, structured, rel))
            }
            Op::Write => {
                let content = string_arg(request, "content")?;
                let diff = unified_diff(&rel, "", content);
                hold_authority(&self.authority, ctx, &rel, content, &diff, self.inner.risk(&request.arguments))?;
                let params = json!({"sessionId": self.session_id, "path": path, "content": content});
                self.ask("fs/write_text_file", params, ctx)?;
                let out = format!("wrote {rel} ({} bytes) through the editor\n", content.len());
                (ctx.output)(out.as_bytes());
                let structured = json!({"path": rel, "bytes": content.len(), "via": "editor"});
                Ok(receipt(start, self.inner.risk(&request.arguments), out, structured, rel))
            }
        }
    }
}
