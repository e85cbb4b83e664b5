//! An MCP server's tool as a cairn tool: its name (`mcp__SERVER__TOOL`),
//! its tier (what the user said, raised by what the server's annotations
//! say, never lowered by an annotation the user did not choose to trust),
//! its replay policy (`Never` unless a trusted server says
//! `idempotentHint`), and
//! its receipt (`content`, `structuredContent`, `isError`).
//!
//! It must not start servers (`pool.rs`) or talk MCP (`connection.rs`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cairn_core::elicit::{Ask, ElicitAnswer};
use cairn_core::tool::{
    Capability, Preview, ReplayPolicy, Risk, Tool, ToolContext, ToolError, ToolReceipt, ToolRequest, ToolSpec,
    Validation,
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::config::{FileAccess, ServerConfig, ToolOverride};
use crate::connection::ServerError;
use crate::pool::{Found, Slot};

/// The prefix of every MCP tool's name (allow rules: `mcp__git__*`).
pub const PREFIX: &str = "mcp__";

/// Longest tool name cairn offers (what providers accept).
const MAX_NAME: usize = 64;

/// `mcp__SERVER__TOOL`, with characters providers refuse replaced by `_`
/// and, past 64 characters, cut and suffixed with a hash of the full name
/// so two long names stay apart.
pub fn tool_name(server: &str, tool: &str) -> String {
    let clean: String =
        tool.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    let full = format!("{PREFIX}{server}__{clean}");
    if full.len() <= MAX_NAME {
        return full;
    }
    let hash = Sha256::digest(format!("{server}\0{tool}").as_bytes());
    let hex: String = hash.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("{}_{hex}", &full[..MAX_NAME - 9])
}

/// What a server's annotations say about one tool (all hints).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hints {
    /// `readOnlyHint`.
    pub read_only: Option<bool>,
    /// `destructiveHint`.
    pub destructive: Option<bool>,
    /// `idempotentHint`.
    pub idempotent: Option<bool>,
}

impl Hints {
    pub(crate) fn of(tool: &rmcp::model::Tool) -> Self {
        tool.annotations.as_ref().map_or_else(Self::default, |a| Self {
            read_only: a.read_only_hint,
            destructive: a.destructive_hint,
            idempotent: a.idempotent_hint,
        })
    }
}

/// The tier of a server's tool. The user's override (or Write) is the
/// floor; `destructiveHint` raises it to Destructive; `readOnlyHint` lowers
/// the default to ReadOnly only for a server the user trusts with
/// `trust_annotations`. Never below what the server's sandbox lets it do
/// ([`Capability::floor`]): a server that can reach the network, write
/// files or start processes has no read-only tools, whatever anyone says
/// (a "read-only" tool that can send data away is not read-only).
pub fn tier(config: &ServerConfig, user: Option<&ToolOverride>, hints: Hints) -> Risk {
    let read_only = hints.read_only == Some(true);
    let floor = match user.and_then(|o| o.risk) {
        Some(risk) => risk,
        None if read_only && config.trust_annotations => Risk::ReadOnly,
        None => Risk::Write,
    };
    let raised = if !read_only && hints.destructive == Some(true) { Risk::Destructive } else { Risk::ReadOnly };
    floor.max(raised).max(Capability::floor(&capabilities(config)))
}

/// Replay on resume: `Never` (settled uncertain, like `shell`) unless the
/// server says the tool is idempotent and not destructive, and the user
/// trusts its annotations (`trust_annotations`): an untrusted hint may
/// only make cairn more careful, and "run it again" is the opposite.
pub fn replay(config: &ServerConfig, hints: Hints) -> ReplayPolicy {
    if config.trust_annotations && hints.idempotent == Some(true) && hints.destructive != Some(true) {
        ReplayPolicy::Idempotent
    } else {
        ReplayPolicy::Never
    }
}

/// What a server may touch, as cairn's capabilities (shown by `cairn
/// tools`; the server's sandbox enforces them).
pub(crate) fn capabilities(config: &ServerConfig) -> BTreeSet<Capability> {
    let mut caps = BTreeSet::new();
    if !config.is_stdio() || config.network {
        caps.insert(Capability::Network);
    }
    if config.is_stdio() {
        match config.files {
            FileAccess::None => {}
            FileAccess::Read => {
                caps.insert(Capability::FileRead);
            }
            FileAccess::Write => {
                caps.insert(Capability::FileRead);
                caps.insert(Capability::FileWrite);
            }
        }
        if config.processes {
            caps.insert(Capability::ProcessSpawn);
        }
    }
    caps
}

/// One MCP tool of one server, for one turn.
#[derive(Debug)]
pub struct McpTool {
    spec: ToolSpec,
    /// The tool's own name on its server.
    remote: String,
    slot: Arc<Slot>,
    /// Whether this turn may still restart the server (shared by the
    /// server's tools of the turn).
    restart: Arc<AtomicBool>,
    /// When the tool was offered from a listing kept between runs
    /// (`cache.rs`): that file, and the definition it held, which the call
    /// checks against what the running server lists before calling.
    cached: Option<(PathBuf, Value)>,
}

impl McpTool {
    pub(crate) fn new(
        slot: Arc<Slot>,
        tool: &rmcp::model::Tool,
        restart: Arc<AtomicBool>,
        cached: Option<PathBuf>,
    ) -> Self {
        let config = slot.config();
        let hints = Hints::of(tool);
        let user = config.tools.get(tool.name.as_ref());
        let description = tool
            .description
            .as_deref()
            .or(tool.title.as_deref())
            .map_or_else(|| format!("{} (MCP server {})", tool.name, slot.name), str::to_owned);
        let spec = ToolSpec {
            name: tool_name(&slot.name, &tool.name),
            description,
            input_schema: Value::Object((*tool.input_schema).clone()),
            risk: tier(config, user, hints),
            capabilities: capabilities(config),
            replay: replay(config, hints),
        };
        let cached = cached.map(|file| (file, serde_json::to_value(tool).unwrap_or(Value::Null)));
        Self { spec, remote: tool.name.to_string(), slot, restart, cached }
    }

    /// The server it belongs to.
    pub fn server(&self) -> &str {
        &self.slot.name
    }
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// The text the model sees of an MCP result.
fn result_text(result: &rmcp::model::CallToolResult) -> String {
    use rmcp::model::ContentBlock as C;
    let mut parts = Vec::new();
    for block in &result.content {
        match block {
            C::Text(t) => parts.push(t.text.clone()),
            C::Image(i) => parts.push(format!("[image: {}, {} base64 bytes]", i.mime_type, i.data.len())),
            C::Audio(a) => parts.push(format!("[audio: {}, {} base64 bytes]", a.mime_type, a.data.len())),
            C::Resource(r) => parts.push(match serde_json::to_value(&r.resource) {
                Ok(v) => v.get("text").and_then(Value::as_str).map_or_else(
                    || format!("[resource {}]", v.get("uri").and_then(Value::as_str).unwrap_or("?")),
                    str::to_owned,
                ),
                Err(_) => "[resource]".to_owned(),
            }),
            C::ResourceLink(l) => parts.push(format!("[resource link {}]", l.uri)),
            _ => parts.push("[content of a kind cairn does not show]".to_owned()),
        }
    }
    if parts.is_empty()
        && let Some(s) = &result.structured_content
    {
        parts.push(s.to_string());
    }
    parts.join("\n")
}

pub(crate) fn cap(text: String, cap: usize) -> (String, bool) {
    if text.len() <= cap {
        return (text, false);
    }
    let mut end = cap;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let total = text.len();
    (format!("{}\n[cairn: output truncated: {end} of {total} bytes shown]", &text[..end]), true)
}

impl McpTool {
    /// A tool offered from a kept listing is called only if the running
    /// server still lists it the same way (its tier and schema came from
    /// that listing); else the listing is renewed and the call refused.
    fn still_as_listed(&self, conn: &crate::connection::Connection) -> Result<(), ToolError> {
        let Some((file, definition)) = &self.cached else { return Ok(()) };
        let now = conn.tools().map_err(|e| ToolError::Other(e.to_string()))?;
        let same = now
            .iter()
            .find(|t| t.name.as_ref() == self.remote)
            .is_some_and(|t| serde_json::to_value(t).is_ok_and(|v| &v == definition));
        if same {
            return Ok(());
        }
        crate::cache::write(file, &now, conn.offers());
        Err(ToolError::Other(format!(
            "MCP server {}'s tool {} is not as cairn listed it before (it changed or is gone since); the call was not \
             made; the next turn offers the server's tools as they are now",
            self.slot.name, self.remote
        )))
    }
}

/// The largest structured result kept in a receipt (the session file's
/// lines are bounded; the text the model sees is capped separately); the
/// resource and prompt tools (`extra.rs`) keep answers under it too.
pub(crate) const MAX_STRUCTURED: usize = 1 << 20;

/// What a person is shown before a call to server `server`: `what` it
/// calls (a tool, a resource read, a prompt) and its arguments, capped.
pub(crate) fn preview_call(server: &str, what: &str, arguments: &Value) -> Preview {
    let args = serde_json::to_string_pretty(arguments).unwrap_or_default();
    let (args, _) = cap(args, 4096);
    Preview::Text { text: format!("MCP server {server}: {what}\n{args}") }
}

impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn validate(&self, request: &ToolRequest) -> Validation {
        Validation::object_arguments(&self.spec, request)
    }

    fn preview(&self, request: &ToolRequest, _cwd: &Path) -> Option<Preview> {
        Some(preview_call(&self.slot.name, &format!("tool {}", self.remote), &request.arguments))
    }

    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let start = Instant::now();
        let Value::Object(arguments) = request.arguments.clone() else {
            return Err(ToolError::InvalidArguments("arguments must be a JSON object".into()));
        };
        let mut notes = Vec::new();
        let may_restart = self.restart.load(Ordering::SeqCst);
        let conn = match self.slot.ensure(may_restart) {
            Ok(Found::Restarted(conn, why)) => {
                self.restart.store(false, Ordering::SeqCst);
                notes.push(format!("[cairn: MCP server {} had stopped ({why}); restarted it]", self.slot.name));
                conn
            }
            Ok(found) => found.connection().clone(),
            Err(e) => return Err(ToolError::Other(e.to_string())),
        };
        self.still_as_listed(&conn)?;
        let timeout = self
            .slot
            .config()
            .tool_timeout_ms
            .map_or(ctx.limits.timeout, |ms| Duration::from_millis(ms).min(ctx.limits.timeout));
        // What the person was asked and how it went, said to the model
        // beside the result (MCP carries no reason for a decline).
        let ask = &mut *ctx.elicit;
        let mut elicit = |message: &str, asked: Ask<'_>| {
            let answer = ask(message, asked);
            let said = match (&answer, asked) {
                (ElicitAnswer::Accept(_), Ask::Url { url, .. }) => format!("the person agreed to open {url}"),
                (ElicitAnswer::Accept(_), Ask::Form(_)) => "the person answered".to_owned(),
                (ElicitAnswer::Decline(why), _) => format!("declined: {why}"),
                (ElicitAnswer::Cancel, _) => "the person dismissed it".to_owned(),
            };
            notes.push(format!("[cairn: the server asked {:?}; {said}]", message.trim()));
            answer
        };
        let called = conn.call(&self.remote, arguments, ctx.cancel, timeout, ctx.output, &mut elicit);
        let result = match called {
            Ok(result) => result,
            Err(ServerError::Cancelled) => return Err(ToolError::Cancelled),
            Err(ServerError::Timeout { after, .. }) => return Err(ToolError::Timeout(after)),
            Err(e @ ServerError::Gone { .. }) => {
                return Err(ToolError::Other(format!(
                    "{e}; whether the call took effect is unknown, so cairn does not repeat it"
                )));
            }
            Err(e) => return Err(ToolError::Other(e.to_string())),
        };
        let is_error = result.is_error == Some(true);
        let mut text = result_text(&result);
        for note in notes {
            text.push('\n');
            text.push_str(&note);
        }
        let (summary, truncated) = cap(text, ctx.limits.output_cap);
        let mut structured = json!({
            "content": result.content,
            "structuredContent": result.structured_content,
            "isError": is_error,
        });
        if structured.to_string().len() > MAX_STRUCTURED {
            structured = json!({
                "content": [],
                "structuredContent": null,
                "isError": is_error,
                "omitted": format!("the result was larger than {MAX_STRUCTURED} bytes; the text shown is capped"),
            });
        }
        Ok(ToolReceipt {
            exit_code: i32::from(is_error),
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

    fn server(text: &str) -> ServerConfig {
        let table: toml::Table = toml::from_str(text).unwrap_or_default();
        ServerConfig::from_toml("s", toml::Value::Table(table)).unwrap_or_else(|e| panic!("{e}"))
    }

    fn hints(read_only: Option<bool>, destructive: Option<bool>) -> Hints {
        Hints { read_only, destructive, idempotent: None }
    }

    #[test]
    fn an_annotation_raises_the_tier_but_never_lowers_it_unless_trusted() {
        let plain = server("command = \"x\"");
        assert_eq!(tier(&plain, None, Hints::default()), Risk::Write);
        assert_eq!(tier(&plain, None, hints(Some(true), None)), Risk::Write, "untrusted readOnlyHint");
        assert_eq!(tier(&plain, None, hints(Some(false), Some(true))), Risk::Destructive);
        let trusted = server("command = \"x\"\ntrust_annotations = true\nprocesses = false");
        assert_eq!(tier(&trusted, None, hints(Some(true), None)), Risk::ReadOnly);
        // Trusted, but it may start processes: not read-only.
        let spawns = server("command = \"x\"\ntrust_annotations = true");
        assert_eq!(tier(&spawns, None, hints(Some(true), None)), Risk::Write);
        // Trusted, but it can reach the network or write: not read-only.
        let net = server("command = \"x\"\ntrust_annotations = true\nnetwork = true");
        assert_eq!(tier(&net, None, hints(Some(true), None)), Risk::Write);
        let http = server("url = \"http://127.0.0.1:1/mcp\"\ntrust_annotations = true");
        assert_eq!(tier(&http, None, hints(Some(true), None)), Risk::Write);
    }

    #[test]
    fn the_user_sets_the_floor_and_destructive_hints_still_raise_it() {
        let config = server(
            "command = \"x\"\nprocesses = false\n[tools.t]\nrisk = \"readOnly\"\n[tools.d]\nrisk = \"readOnly\"",
        );
        assert_eq!(tier(&config, config.tools.get("t"), Hints::default()), Risk::ReadOnly);
        assert_eq!(tier(&config, config.tools.get("d"), hints(None, Some(true))), Risk::Destructive);
        // The user cannot lower a tool below what its server's sandbox allows.
        let net = server("command = \"x\"\nnetwork = true\n[tools.t]\nrisk = \"readOnly\"");
        assert_eq!(tier(&net, net.tools.get("t"), Hints::default()), Risk::Write);
        let strict = server("command = \"x\"\n[tools.t]\nrisk = \"destructive\"");
        assert_eq!(tier(&strict, strict.tools.get("t"), hints(Some(true), None)), Risk::Destructive);
    }

    #[test]
    fn only_calls_a_trusted_server_says_are_idempotent_are_replayed() {
        let trusted = server("command = \"x\"\ntrust_annotations = true");
        let plain = server("command = \"x\"");
        let idem = Hints { idempotent: Some(true), ..Hints::default() };
        assert_eq!(replay(&trusted, Hints::default()), ReplayPolicy::Never);
        assert_eq!(replay(&trusted, idem), ReplayPolicy::Idempotent);
        assert_eq!(replay(&plain, idem), ReplayPolicy::Never, "an untrusted hint never allows a re-run");
        let destructive = Hints { idempotent: Some(true), destructive: Some(true), read_only: None };
        assert_eq!(replay(&trusted, destructive), ReplayPolicy::Never);
        assert_eq!(replay(&trusted, hints(Some(true), None)), ReplayPolicy::Never, "read-only is not a promise");
    }

    #[test]
    fn names_fit_what_providers_accept_and_stay_apart() {
        assert_eq!(tool_name("git", "git_status"), "mcp__git__git_status");
        assert_eq!(tool_name("fs", "read file/x"), "mcp__fs__read_file_x");
        let a = tool_name("srv", &"a".repeat(80));
        let b = tool_name("srv", &format!("{}b", "a".repeat(79)));
        assert!(a.len() <= 64 && b.len() <= 64 && a != b, "{a} {b}");
    }
}
