//! `LocalProvider`: the embedded model behind cairn's `Provider` trait
//! (name "local").
//!
//! A call renders the neutral conversation as ChatML (trimmed to the
//! context), generates greedily, and streams visible text as
//! `StreamEvent::TextDelta`. With tools offered, generation is masked by the
//! tool-call grammar; an answer that is a complete call becomes one
//! `ContentPart::ToolCall` with a fresh id and `StopReason::ToolUse`. Text is
//! streamed only once the answer is known to be text (its first non-space
//! byte is not `{`), so an observer never sees the raw JSON of a call.
//!
//! With a working directory ([`LocalProvider::with_workdir`]) the system
//! prompt names it with a short listing, and path parameters marked
//! `"format": "path"` with `"x-exists"` are grounded: the grammar lets the
//! model name only existing paths under it (`crate::ground`), those named in
//! the conversation first.
//!
//! This module must not load models or talk to the network; it adapts.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use cairn_core::CancelToken;
use cairn_core::message::{ContentPart, Message, Role, ToolCall};
use cairn_core::provider::{
    AttemptUsage, ModelRequest, ModelResponse, Provider, ProviderError, ProviderErrorKind, StopReason, StreamEvent,
};
use cairn_core::tool::ToolSpec;
use serde_json::Value;

use crate::LocalError;
use crate::chat::{example_turns, fit_prompt, system_prompt, to_turns, workdir_note};
use crate::describe::{described_files, search_terms};
use crate::grammar::{Grammar, Mode};
use crate::ground::{PathCandidates, mentioned_paths};
use crate::model::{GenStop, LocalModel};

/// Default cap on generated tokens when the request sets none.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u32 = 512;

/// The embedded model as a [`Provider`].
#[derive(Debug, Clone)]
pub struct LocalProvider {
    model: Arc<LocalModel>,
    max_output_tokens: u32,
    /// The session's working directory, when known: grounds path arguments.
    workdir: Option<PathBuf>,
}

/// Entries of the working directory listed in the system prompt.
const LISTING_ENTRIES: usize = 24;

impl LocalProvider {
    /// A provider over a loaded model (share one model between providers).
    pub fn new(model: Arc<LocalModel>) -> Self {
        Self { model, max_output_tokens: DEFAULT_MAX_OUTPUT_TOKENS, workdir: None }
    }

    /// Ground path arguments in this working directory (the session's
    /// `cwd`) and show the model a short listing of it.
    pub fn with_workdir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.workdir = Some(dir.into());
        self
    }
}

/// Streams bytes as UTF-8 text, holding back an incomplete final sequence.
#[derive(Debug, Default)]
struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let (valid, rest) = self.pending.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        None => {
                            self.pending = rest.to_vec();
                            return out;
                        }
                        Some(n) => {
                            out.push('\u{FFFD}');
                            self.pending = rest.get(n..).unwrap_or_default().to_vec();
                        }
                    }
                }
            }
        }
    }

    fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

fn new_call_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
    format!("call_{:x}{:04x}", nanos as u64, COUNTER.fetch_add(1, Ordering::Relaxed) & 0xffff)
}

/// Parse a complete call produced under the grammar.
fn parse_call(bytes: &[u8], grammar: &Grammar) -> Option<(String, Value)> {
    let text = String::from_utf8_lossy(bytes);
    let value: Value = serde_json::from_str(text.trim()).ok()?;
    let name = value.get("name")?.as_str()?.to_string();
    if !grammar.tool_names().contains(&name) {
        return None;
    }
    let arguments = value.get("arguments")?.clone();
    Some((name, arguments))
}

impl LocalProvider {
    /// Generate, streaming visible text to the observer as it comes.
    #[allow(clippy::too_many_arguments)]
    fn generate_streaming(
        &self,
        prompt: &str,
        max_new: usize,
        grammar: Option<&Grammar>,
        cancel: &CancelToken,
        observer: &mut dyn FnMut(&StreamEvent),
        stream: &mut Utf8Stream,
        text: &mut String,
    ) -> Result<crate::model::Generation, LocalError> {
        let mut on_token = |ev: crate::model::TokenEvent<'_>| {
            // Before the answer is known to be text, only spaces were seen
            // (dropped); a call is reported whole at the end.
            if ev.mode == Mode::Text {
                let mut piece = stream.push(ev.bytes);
                if text.is_empty() {
                    piece = piece.trim_start().to_string();
                }
                if !piece.is_empty() {
                    text.push_str(&piece);
                    observer(&StreamEvent::TextDelta { text: piece });
                }
            }
        };
        self.model.generate(prompt, max_new, grammar, cancel, &mut on_token)
    }
}

/// Paths named in the conversation, the latest message first (its text,
/// calls' arguments and tool results).
fn conversation_paths(messages: &[Message]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for msg in messages.iter().rev() {
        for part in &msg.content {
            let found = match part {
                ContentPart::Text { text } => mentioned_paths(text),
                ContentPart::ToolResult { content, .. } => mentioned_paths(content),
                ContentPart::ToolCall(call) => mentioned_paths(&call.arguments.to_string()),
                ContentPart::Reasoning { .. } | ContentPart::Image { .. } => Vec::new(),
            };
            for p in found {
                if !out.contains(&p) {
                    out.push(p);
                }
            }
        }
    }
    out
}

/// The existing paths (files, then directories; `.` aside) the last
/// message names when it is the user's; empty otherwise.
fn named_existing_paths(messages: &[Message], candidates: &PathCandidates) -> PathCandidates {
    let (mut files, mut dirs) = (Vec::new(), Vec::new());
    if let Some(last) = messages.last().filter(|m| m.role == Role::User) {
        for part in &last.content {
            let ContentPart::Text { text } = part else { continue };
            for m in mentioned_paths(text) {
                let m = m.trim_start_matches("./").trim_end_matches('/').to_owned();
                if candidates.files().contains(&m) && !files.contains(&m) {
                    files.push(m);
                } else if m != "." && candidates.dirs().contains(&m) && !dirs.contains(&m) {
                    dirs.push(m);
                }
            }
        }
    }
    PathCandidates::from_lists(files, dirs)
}

/// Whether `tool` searches file contents: a read-only tool whose one
/// required parameter is a string `pattern` (the built-in `search`).
fn takes_a_pattern(tool: &ToolSpec) -> bool {
    let schema = &tool.input_schema;
    tool.risk == cairn_core::tool::Risk::ReadOnly
        && schema.get("required").and_then(Value::as_array).is_some_and(|r| r.len() == 1 && r[0] == "pattern")
        && schema["properties"]["pattern"]["type"] == "string"
}

/// `schema` with only its required properties (and no others allowed).
fn required_only(schema: &Value) -> Value {
    let mut out = schema.clone();
    let required: Vec<String> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default();
    if let Some(props) = out.get_mut("properties").and_then(Value::as_object_mut) {
        props.retain(|k, _| required.contains(k));
    }
    if let Some(obj) = out.as_object_mut() {
        obj.insert("additionalProperties".to_owned(), Value::Bool(false));
    }
    out
}

/// Whether `tool` has a required parameter grounded to a path of `kind`
/// (`"file"` or `"directory"`).
fn reads_required(tool: &ToolSpec, kind: &str) -> bool {
    let schema = &tool.input_schema;
    let required = schema.get("required").and_then(Value::as_array);
    let props = schema.get("properties").and_then(Value::as_object);
    let (Some(required), Some(props)) = (required, props) else { return false };
    required.iter().filter_map(Value::as_str).any(|name| {
        props.get(name).is_some_and(|p| {
            p.get("format").and_then(Value::as_str) == Some("path")
                && p.get("x-exists").and_then(Value::as_str) == Some(kind)
        })
    })
}

/// Whether the conversation already holds this exact call with its result.
fn already_answered(messages: &[Message], name: &str, arguments: &Value) -> bool {
    let answered: Vec<&str> = messages
        .iter()
        .flat_map(|m| &m.content)
        .filter_map(|p| match p {
            ContentPart::ToolResult { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    messages
        .iter()
        .flat_map(|m| m.tool_calls())
        .any(|c| c.name == name && &c.arguments == arguments && answered.contains(&c.id.as_str()))
}

impl Provider for LocalProvider {
    fn name(&self) -> &str {
        "local"
    }

    fn model(&self) -> &str {
        self.model.name()
    }

    fn context_window(&self) -> Option<u32> {
        u32::try_from(self.model.options().context_tokens).ok()
    }

    fn max_output_tokens(&self) -> Option<u32> {
        Some(self.max_output_tokens)
    }

    /// The model's own tokenizer (rebuilt from the GGUF metadata).
    fn count_tokens(&self, text: &str) -> Option<u64> {
        self.model.tokenizer().encode(text).ok().map(|ids| ids.len() as u64)
    }

    fn complete(
        &self,
        request: &ModelRequest<'_>,
        observer: &mut dyn FnMut(&StreamEvent),
        cancel: &CancelToken,
    ) -> Result<ModelResponse, ProviderError> {
        let started = Instant::now();
        observer(&StreamEvent::AttemptStarted { attempt: 1 });
        let ctx = self.model.options().context_tokens;
        let max_new = request.max_output_tokens.unwrap_or(self.max_output_tokens).max(1) as usize;
        // Keep at least half the context for the prompt.
        let max_new = max_new.min(ctx / 2);
        let candidates = self
            .workdir
            .as_ref()
            .filter(|_| !request.tools.is_empty())
            .map(|dir| (dir, PathCandidates::scan(dir, &conversation_paths(request.messages))));
        let mut system = system_prompt(request.system, request.tools);
        if let Some((dir, c)) = &candidates {
            let listing = c.listing(LISTING_ENTRIES);
            system.push_str(&workdir_note(dir, &listing, c.len() - 1 > listing.len() || c.truncated()));
        }
        // The example's file name is one grounding refuses (absent from the
        // tree), so the model cannot copy it into a real call.
        let example_name = ["example.txt", "example-file.txt", "example-0.txt"]
            .into_iter()
            .find(|n| candidates.as_ref().is_none_or(|(_, c)| !c.files().iter().any(|f| f == n)))
            .unwrap_or("example-0.txt");
        let turns = to_turns(&system, &example_turns(request.tools, example_name), request.messages);
        let tokenizer = self.model.tokenizer();
        let mut count = |s: &str| tokenizer.encode(s).map_or(s.len(), |ids| ids.len());
        let (prompt, _dropped) = fit_prompt(&turns, ctx - max_new, &mut count);
        let grammar = (!request.tools.is_empty()).then(|| {
            // The model cannot know a file it has not read: when the user's
            // latest message names existing paths, its answer is a call of a
            // tool that reads such a path (a file: `read_file`; a
            // directory: `list_dir`), on one of the named paths — a small
            // model otherwise wanders to a neighbour file or a listing.
            // A request that names no path but describes files ("my
            // notes", "the config file") points at those the same way.
            let named = candidates
                .as_ref()
                .map(|(_, c)| {
                    let named = named_existing_paths(request.messages, c);
                    if named.files().len() + named.dirs().len() > 0 {
                        return named;
                    }
                    let described = match request.messages.last() {
                        Some(m) if m.role == Role::User => described_files(&m.joined_text(), c),
                        _ => Vec::new(),
                    };
                    PathCandidates::from_lists(described, Vec::new())
                })
                .filter(|n| n.files().len() + n.dirs().len() > 0);
            if let Some(named) = &named {
                let readers: Vec<&ToolSpec> = request
                    .tools
                    .iter()
                    .filter(|t| {
                        (!named.files().is_empty() && reads_required(t, "file"))
                            || (!named.dirs().is_empty() && reads_required(t, "directory"))
                    })
                    .collect();
                if !readers.is_empty() {
                    // The first look reads the whole file: optional
                    // arguments (`offset`, `limit`) only let a small model
                    // cut away the line it needs.
                    let schemas: Vec<(&str, Value)> =
                        readers.iter().map(|t| (t.name.as_str(), required_only(&t.input_schema))).collect();
                    return Grammar::with_paths(schemas.iter().map(|(n, s)| (*n, s)), Some(named)).require_call();
                }
            }
            // Nothing on disk pointed at, but the request names an
            // identifier or asks to find something: search for it first.
            let terms = match request.messages.last() {
                Some(m) if m.role == Role::User && named.is_none() && candidates.is_some() => {
                    search_terms(&m.joined_text())
                }
                _ => Vec::new(),
            };
            if let Some(search) = request.tools.iter().find(|t| takes_a_pattern(t)).filter(|_| !terms.is_empty()) {
                let mut schema = required_only(&search.input_schema);
                schema["properties"]["pattern"] = serde_json::json!({"type": "string", "enum": terms});
                return Grammar::with_paths([(search.name.as_str(), &schema)], candidates.as_ref().map(|(_, c)| c))
                    .require_call();
            }
            let g = Grammar::with_paths(
                request.tools.iter().map(|t| (t.name.as_str(), &t.input_schema)),
                candidates.as_ref().map(|(_, c)| c),
            );
            if named.is_some() { g.require_call() } else { g }
        });

        let mut stream = Utf8Stream::default();
        let mut text = String::new();
        let mut result =
            self.generate_streaming(&prompt, max_new, grammar.as_ref(), cancel, observer, &mut stream, &mut text);
        let mut extra = (0, 0, 0);
        if let (Ok(g), Some(gr)) = (&result, &grammar)
            && g.stop == GenStop::CallComplete
            && parse_call(&g.bytes, gr).is_some_and(|(name, args)| already_answered(request.messages, &name, &args))
        {
            // A tiny model tends to repeat a call whose result it was just
            // given. Repeating it cannot help: answer in text instead (the
            // prompt comes from the prefix cache, so this costs only the
            // answer).
            extra = (g.prompt_tokens, g.tokens.len(), g.cached_tokens);
            let text_only = Grammar::new(std::iter::empty());
            result =
                self.generate_streaming(&prompt, max_new, Some(&text_only), cancel, observer, &mut stream, &mut text);
        }
        let mut usage = AttemptUsage {
            provider: "local".into(),
            model: self.model.name().to_string(),
            attempt: 1,
            ..AttemptUsage::default()
        };
        let generation = match result {
            Ok(g) => g,
            Err(e) => {
                usage.duration_ms = started.elapsed().as_millis() as u64;
                usage.error = Some(e.to_string());
                let kind = match e {
                    LocalError::Cancelled => ProviderErrorKind::Cancelled,
                    LocalError::InvalidOption(_) => ProviderErrorKind::Config,
                    _ => ProviderErrorKind::Other,
                };
                let mut err = ProviderError::new(kind, e.to_string());
                err.attempts.push(usage);
                return Err(err);
            }
        };
        usage.input_tokens = (generation.prompt_tokens + extra.0) as u64;
        usage.output_tokens = (generation.tokens.len() + extra.1) as u64;
        usage.cached_input_tokens = (generation.cached_tokens + extra.2) as u64;
        usage.duration_ms = started.elapsed().as_millis() as u64;

        let call = match (&grammar, generation.stop) {
            (Some(g), GenStop::CallComplete) => parse_call(&generation.bytes, g),
            _ => None,
        };
        let (content, stop) = if let Some((name, arguments)) = call {
            let id = new_call_id();
            observer(&StreamEvent::ToolCallStarted { id: id.clone(), name: name.clone() });
            observer(&StreamEvent::ToolCallDelta { id: id.clone(), arguments: arguments.to_string() });
            (vec![ContentPart::ToolCall(ToolCall { id, name, arguments })], StopReason::ToolUse)
        } else {
            // Text (streamed already), or an unfinished call kept as text.
            if generation.mode == Mode::Text {
                let rest = stream.finish();
                if !rest.is_empty() {
                    text.push_str(&rest);
                    observer(&StreamEvent::TextDelta { text: rest });
                }
            } else {
                let raw = generation.text().trim_start().to_string();
                if !raw.is_empty() {
                    observer(&StreamEvent::TextDelta { text: raw.clone() });
                }
                text = raw;
            }
            let stop = match generation.stop {
                // A loop cut short: the answer is what came before it.
                GenStop::EndOfTurn | GenStop::CallComplete | GenStop::Repeating => StopReason::EndTurn,
                GenStop::MaxTokens => StopReason::MaxTokens,
                GenStop::NoAllowedToken => StopReason::Other,
            };
            (vec![ContentPart::Text { text }], stop)
        };
        Ok(ModelResponse { message: Message { role: Role::Assistant, content }, stop, attempts: vec![usage] })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_stream_holds_back_split_sequences() {
        let mut s = Utf8Stream::default();
        let bytes = "é✓".as_bytes();
        assert_eq!(s.push(&bytes[..1]), "");
        assert_eq!(s.push(&bytes[1..3]), "é");
        assert_eq!(s.push(&bytes[3..]), "✓");
        assert_eq!(s.push(&[0xff, b'a']), "\u{FFFD}a");
        assert_eq!(s.push(&[0xe2]), "");
        assert_eq!(s.finish(), "\u{FFFD}");
    }

    #[test]
    fn recognises_a_call_that_already_has_its_result() {
        let call = ToolCall { id: "c1".into(), name: "read_file".into(), arguments: serde_json::json!({"path": "a"}) };
        let mut messages = vec![Message { role: Role::Assistant, content: vec![ContentPart::ToolCall(call)] }];
        let args = serde_json::json!({"path": "a"});
        assert!(!already_answered(&messages, "read_file", &args), "no result yet");
        messages.push(Message {
            role: Role::Tool,
            content: vec![ContentPart::ToolResult { call_id: "c1".into(), content: "x".into(), is_error: false }],
        });
        assert!(already_answered(&messages, "read_file", &args));
        assert!(!already_answered(&messages, "read_file", &serde_json::json!({"path": "b"})));
        assert!(!already_answered(&messages, "shell", &args));
    }

    #[test]
    fn only_a_user_message_naming_an_existing_path_names_paths() {
        let c =
            PathCandidates::from_lists(vec!["notes.txt".into(), "docs/a.md".into()], vec![".".into(), "docs".into()]);
        let user = |t: &str| vec![Message::text(Role::User, t)];
        let named = |m: &[Message]| {
            let n = named_existing_paths(m, &c);
            (n.files().to_vec(), n.dirs().to_vec())
        };
        assert_eq!(named(&user("Read notes.txt and tell me the code.")), (vec!["notes.txt".into()], vec![]));
        assert_eq!(named(&user("what is in ./docs/a.md?")), (vec!["docs/a.md".into()], vec![]));
        assert_eq!(named(&user("list docs/ please")), (vec![], vec!["docs".into()]));
        assert_eq!(named(&user("What is the capital of France?")), (vec![], vec![]));
        assert_eq!(named(&user("Read launch.txt.")), (vec![], vec![]), "not an existing path");
        assert_eq!(named(&[Message::text(Role::Assistant, "notes.txt")]), (vec![], vec![]));
    }

    #[test]
    fn a_named_file_is_read_by_a_tool_that_requires_a_file() {
        let tool = |name: &str, schema: Value| ToolSpec {
            name: name.into(),
            description: String::new(),
            input_schema: schema,
            risk: cairn_core::tool::Risk::ReadOnly,
            capabilities: std::collections::BTreeSet::new(),
            replay: cairn_core::tool::ReplayPolicy::Idempotent,
        };
        let read = tool(
            "read_file",
            serde_json::json!({"properties": {"path": {"type": "string", "format": "path", "x-exists": "file"}}, "required": ["path"]}),
        );
        let list = tool(
            "list_dir",
            serde_json::json!({"properties": {"path": {"type": "string", "format": "path", "x-exists": "directory"}}}),
        );
        assert!(reads_required(&read, "file") && !reads_required(&read, "directory"));
        assert!(!reads_required(&list, "directory"), "an optional path does not make a reader");
        let with_options = serde_json::json!({"type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["path"]});
        assert_eq!(
            required_only(&with_options),
            serde_json::json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": false})
        );
    }

    #[test]
    fn call_ids_are_unique() {
        let a = new_call_id();
        let b = new_call_id();
        assert_ne!(a, b);
        assert!(a.starts_with("call_"));
    }

    #[test]
    fn parses_only_offered_tools() {
        let schema = serde_json::json!({"type": "object"});
        let g = Grammar::new([("read_file", &schema)]);
        let (name, args) = parse_call(br#"{"name": "read_file", "arguments": {"path": "a"}}"#, &g).unwrap();
        assert_eq!(name, "read_file");
        assert_eq!(args, serde_json::json!({"path": "a"}));
        assert!(parse_call(br#"{"name": "rm", "arguments": {}}"#, &g).is_none());
    }
}
