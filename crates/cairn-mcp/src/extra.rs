//! A server's resources and prompts as cairn tools: a server whose
//! `initialize` says it has `resources` gets `mcp__NAME__list_resources`
//! and `mcp__NAME__read_resource`; one with `prompts` gets
//! `mcp__NAME__list_prompts` and `mcp__NAME__get_prompt`. They ask the
//! server for what the protocol defines as reads, so they carry the
//! annotations of a read-only, idempotent tool — and are tiered like any
//! of the server's tools (`tool::tier`): ReadOnly only for a server the
//! user trusts whose sandbox keeps it contained, Write (asked) otherwise,
//! because the server's code runs for a read as for a call. The user's
//! `[mcp_servers.NAME.tools.list_resources]` overrides apply as to tools.
//!
//! It must not start servers (`pool.rs`) or talk MCP (`connection.rs`).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cairn_core::tool::{Preview, Tool, ToolContext, ToolError, ToolReceipt, ToolRequest, ToolSpec, Validation};
use serde_json::{Value, json};

use crate::connection::{Ask, Offers, ServerError};
use crate::pool::{Found, Slot};
use crate::tool::{Hints, MAX_STRUCTURED, cap, capabilities, now_ms, preview_call, replay, tier, tool_name};

/// Which of the four requests a tool makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    ListResources,
    ReadResource,
    ListPrompts,
    GetPrompt,
}

impl Kind {
    /// The tools a server offering `offers` gets.
    pub(crate) fn offered(offers: Offers) -> Vec<Kind> {
        let mut kinds = Vec::new();
        if offers.resources {
            kinds.extend([Kind::ListResources, Kind::ReadResource]);
        }
        if offers.prompts {
            kinds.extend([Kind::ListPrompts, Kind::GetPrompt]);
        }
        kinds
    }

    /// Its name on the server's side of `mcp__NAME__…` (and in the user's
    /// `[mcp_servers.NAME.tools.…]`).
    pub(crate) fn local(self) -> &'static str {
        match self {
            Kind::ListResources => "list_resources",
            Kind::ReadResource => "read_resource",
            Kind::ListPrompts => "list_prompts",
            Kind::GetPrompt => "get_prompt",
        }
    }

    fn description(self, server: &str) -> String {
        match self {
            Kind::ListResources => format!(
                "List the resources (documents, files, records) MCP server {server} offers, with their URIs, and its URI templates. Read one with mcp__{server}__read_resource."
            ),
            Kind::ReadResource => format!(
                "Read one resource of MCP server {server} by its URI (from mcp__{server}__list_resources, or a URI template filled in)."
            ),
            Kind::ListPrompts => format!(
                "List the prompt templates MCP server {server} offers, with their arguments. Get one with mcp__{server}__get_prompt."
            ),
            Kind::GetPrompt => format!(
                "Get one prompt template of MCP server {server}, filled in with its arguments (string values), as messages."
            ),
        }
    }

    fn schema(self) -> Value {
        match self {
            Kind::ListResources | Kind::ListPrompts => {
                json!({"type": "object", "properties": {}, "additionalProperties": false})
            }
            Kind::ReadResource => json!({
                "type": "object",
                "properties": {"uri": {"type": "string", "description": "the resource's URI"}},
                "required": ["uri"],
                "additionalProperties": false,
            }),
            Kind::GetPrompt => json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "the prompt's name"},
                    "arguments": {
                        "type": "object",
                        "description": "its arguments by name",
                        "additionalProperties": {"type": "string"},
                    },
                },
                "required": ["name"],
                "additionalProperties": false,
            }),
        }
    }
}

/// One of a server's resource or prompt tools, for one turn.
#[derive(Debug)]
pub(crate) struct ExtraTool {
    spec: ToolSpec,
    kind: Kind,
    slot: Arc<Slot>,
    restart: Arc<AtomicBool>,
    /// Offered from a listing kept between runs: the server is checked to
    /// still offer it when started.
    from_cache: bool,
}

impl ExtraTool {
    pub(crate) fn new(slot: Arc<Slot>, kind: Kind, restart: Arc<AtomicBool>, from_cache: bool) -> Self {
        let config = slot.config();
        // What the protocol says these requests are: reads.
        let hints = Hints { read_only: Some(true), destructive: Some(false), idempotent: Some(true) };
        let spec = ToolSpec {
            name: tool_name(&slot.name, kind.local()),
            description: kind.description(&slot.name),
            input_schema: kind.schema(),
            risk: tier(config, config.tools.get(kind.local()), hints),
            capabilities: capabilities(config),
            replay: replay(config, hints),
        };
        Self { spec, kind, slot, restart, from_cache }
    }

    fn ask(&self, request: &ToolRequest) -> Result<Ask, ToolError> {
        let args = &request.arguments;
        let text = |key: &str| {
            args.get(key)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| ToolError::InvalidArguments(format!("`{key}` must be a string")))
        };
        Ok(match self.kind {
            Kind::ListResources => Ask::ListResources,
            Kind::ListPrompts => Ask::ListPrompts,
            Kind::ReadResource => Ask::ReadResource(text("uri")?),
            Kind::GetPrompt => {
                let arguments = match args.get("arguments") {
                    None | Some(Value::Null) => serde_json::Map::new(),
                    Some(Value::Object(map)) if map.values().all(Value::is_string) => map.clone(),
                    Some(_) => {
                        return Err(ToolError::InvalidArguments(
                            "`arguments` must be an object of string values".into(),
                        ));
                    }
                };
                Ask::GetPrompt(text("name")?, arguments)
            }
        })
    }
}

/// The text the model sees of an answer.
fn answer_text(kind: Kind, answer: &Value) -> String {
    let s = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
    let list = |v: &Value, key: &str| v.get(key).and_then(Value::as_array).cloned().unwrap_or_default();
    let mut lines = Vec::new();
    match kind {
        Kind::ListResources => {
            for r in list(answer, "resources") {
                let about = [s(&r, "title"), s(&r, "description"), s(&r, "mimeType")]
                    .into_iter()
                    .filter(|t| !t.is_empty())
                    .collect::<Vec<_>>()
                    .join("; ");
                lines.push(format!(
                    "{} ({}){}",
                    s(&r, "uri"),
                    s(&r, "name"),
                    if about.is_empty() { String::new() } else { format!(": {about}") }
                ));
            }
            let templates = list(answer, "resourceTemplates");
            if !templates.is_empty() {
                lines.push("URI templates:".into());
                for t in templates {
                    lines.push(format!("{} ({}): {}", s(&t, "uriTemplate"), s(&t, "name"), s(&t, "description")));
                }
            }
            if lines.is_empty() {
                lines.push("the server lists no resources".into());
            }
        }
        Kind::ReadResource => {
            for c in list(answer, "contents") {
                match c.get("text").and_then(Value::as_str) {
                    Some(text) => lines.push(text.to_owned()),
                    None => lines.push(format!(
                        "[{}: {} content, {} base64 bytes]",
                        s(&c, "uri"),
                        s(&c, "mimeType"),
                        s(&c, "blob").len()
                    )),
                }
            }
        }
        Kind::ListPrompts => {
            for p in list(answer, "prompts") {
                let args: Vec<String> = list(&p, "arguments")
                    .iter()
                    .map(|a| {
                        let required = a.get("required").and_then(Value::as_bool) == Some(true);
                        format!("{}{}", s(a, "name"), if required { "" } else { "?" })
                    })
                    .collect();
                lines.push(format!("{}({}): {}", s(&p, "name"), args.join(", "), s(&p, "description")));
            }
            if lines.is_empty() {
                lines.push("the server lists no prompts".into());
            }
        }
        Kind::GetPrompt => {
            let description = s(answer, "description");
            if !description.is_empty() {
                lines.push(description);
            }
            for m in list(answer, "messages") {
                let content = m.get("content").cloned().unwrap_or(Value::Null);
                let text = match content.get("text").and_then(Value::as_str) {
                    Some(t) => t.to_owned(),
                    None => match content.pointer("/resource/text").and_then(Value::as_str) {
                        Some(t) => t.to_owned(),
                        None => format!("[{} content]", s(&content, "type")),
                    },
                };
                lines.push(format!("{}: {text}", s(&m, "role")));
            }
        }
    }
    lines.join("\n")
}

impl Tool for ExtraTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn validate(&self, request: &ToolRequest) -> Validation {
        Validation::object_arguments(&self.spec, request)
    }

    fn preview(&self, request: &ToolRequest, _cwd: &Path) -> Option<Preview> {
        Some(preview_call(&self.slot.name, self.kind.local(), &request.arguments))
    }

    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let start = Instant::now();
        let ask = self.ask(request)?;
        let conn = match self.slot.ensure(self.restart.load(Ordering::SeqCst)) {
            Ok(Found::Restarted(conn, _)) => {
                self.restart.store(false, Ordering::SeqCst);
                conn
            }
            Ok(found) => found.connection().clone(),
            Err(e) => return Err(ToolError::Other(e.to_string())),
        };
        if self.from_cache && !Kind::offered(conn.offers()).contains(&self.kind) {
            return Err(ToolError::Other(format!(
                "MCP server {} no longer offers {} (it changed since cairn listed it); the request was not made",
                self.slot.name,
                self.kind.local()
            )));
        }
        let timeout = self
            .slot
            .config()
            .tool_timeout_ms
            .map_or(ctx.limits.timeout, |ms| Duration::from_millis(ms).min(ctx.limits.timeout));
        let answer = match conn.ask(ask, ctx.cancel, timeout) {
            Ok(answer) => answer,
            Err(ServerError::Cancelled) => return Err(ToolError::Cancelled),
            Err(ServerError::Timeout { after, .. }) => return Err(ToolError::Timeout(after)),
            Err(e) => return Err(ToolError::Other(e.to_string())),
        };
        let (summary, truncated) = cap(answer_text(self.kind, &answer), ctx.limits.output_cap);
        let structured = if answer.to_string().len() > MAX_STRUCTURED {
            json!({"omitted": format!("the answer was larger than {MAX_STRUCTURED} bytes; the text shown is capped")})
        } else {
            answer
        };
        Ok(ToolReceipt {
            exit_code: 0,
            output_summary: summary,
            structured_output: Some(structured),
            affected_entities: Vec::new(),
            duration_ms: start.elapsed().as_millis() as u64,
            tier: self.spec.risk,
            timestamp: now_ms(),
            truncated,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_read_as_lines_the_model_can_use() {
        let listed = json!({"resources": [{"uri": "demo://a", "name": "a", "mimeType": "text/plain"}],
            "resourceTemplates": [{"uriTemplate": "demo://t/{id}", "name": "t", "description": "by id"}]});
        assert_eq!(
            answer_text(Kind::ListResources, &listed),
            "demo://a (a): text/plain\nURI templates:\ndemo://t/{id} (t): by id"
        );
        let read = json!({"contents": [{"uri": "demo://a", "text": "hello"}, {"uri": "demo://b", "mimeType": "image/png", "blob": "AAAA"}]});
        assert_eq!(answer_text(Kind::ReadResource, &read), "hello\n[demo://b: image/png content, 4 base64 bytes]");
        let prompts = json!({"prompts": [{"name": "p", "description": "d", "arguments": [{"name": "x", "required": true}, {"name": "y"}]}]});
        assert_eq!(answer_text(Kind::ListPrompts, &prompts), "p(x, y?): d");
        let got = json!({"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}]});
        assert_eq!(answer_text(Kind::GetPrompt, &got), "user: hi");
    }
}
