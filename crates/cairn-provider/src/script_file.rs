//! [`ScriptFileProvider`]: the `scripted` provider kind, which replays a
//! JSONL script file, one model turn per line, for demos and tests of the
//! whole program. (cairn-testtools' `ScriptProvider` is the in-process test
//! double over the same [`ScriptLine`]s, with failure and recording hooks.)
//!
//! Line format: `{"text": "…", "toolCalls": [{"id": "…", "name": "…",
//! "arguments": {…}}]}` (both keys optional; blank lines are skipped). Request
//! k is answered with line k, where k is the number of assistant messages
//! already in the conversation (those in the request plus
//! `earlier_assistant_messages`, the ones a compaction or the window left
//! out), so a resumed session gets exactly the line it would have got.
//! Compaction requests get a deterministic summary and use no line. This module owns the script format; it must not keep any
//! state between calls (that is what makes resume exact).

use std::path::{Path, PathBuf};
use std::time::Instant;

use cairn_core::CancelToken;
use cairn_core::message::{ContentPart, Message, Role, ToolCall};
use cairn_core::provider::{
    AttemptUsage, ModelRequest, ModelResponse, Provider, ProviderError, ProviderErrorKind, RequestPurpose, StopReason,
    StreamEvent,
};
use serde::Deserialize;
use serde_json::Value;

use crate::config::ConfigError;

/// One model turn of a script.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScriptLine {
    /// Visible text.
    #[serde(default)]
    pub text: String,
    /// Tool calls, in order.
    #[serde(default)]
    pub tool_calls: Vec<ScriptCall>,
}

/// One tool call of a script line.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptCall {
    /// The call id.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments (any JSON; a string stands for text that was not JSON).
    #[serde(default = "empty_object")]
    pub arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

impl ScriptLine {
    /// The settled assistant message of this turn and why it stops. Tells
    /// `observer` about each tool call (text deltas are the caller's: how
    /// text is streamed is a choice of each scripted provider).
    pub fn reply(&self, observer: &mut dyn FnMut(&StreamEvent)) -> (Message, StopReason) {
        let mut content = Vec::new();
        if !self.text.is_empty() {
            content.push(ContentPart::Text { text: self.text.clone() });
        }
        for call in &self.tool_calls {
            observer(&StreamEvent::ToolCallStarted { id: call.id.clone(), name: call.name.clone() });
            observer(&StreamEvent::ToolCallDelta { id: call.id.clone(), arguments: call.arguments.to_string() });
            content.push(ContentPart::ToolCall(ToolCall {
                id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            }));
        }
        let stop = if self.tool_calls.is_empty() { StopReason::EndTurn } else { StopReason::ToolUse };
        (Message { role: Role::Assistant, content }, stop)
    }
}

/// A provider that answers from a script file.
#[derive(Debug, Clone)]
pub struct ScriptFileProvider {
    name: String,
    model: String,
    path: PathBuf,
    turns: Vec<ScriptLine>,
    max_tool_calls: usize,
    context_window: Option<u32>,
}

impl ScriptFileProvider {
    /// Load and check the whole script; a malformed line is an error that
    /// names the file and the line number.
    pub fn from_file(name: &str, path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Script {
            path: path.to_owned(),
            reason: format!("cannot read the script: {e}"),
        })?;
        Self::from_str(name, path, &text)
    }

    /// Parse a script held in memory (`path` is used in messages only).
    pub fn from_str(name: &str, path: &Path, text: &str) -> Result<Self, ConfigError> {
        let mut turns = Vec::new();
        for (number, raw) in text.lines().enumerate() {
            if raw.trim().is_empty() {
                continue;
            }
            let line: ScriptLine = serde_json::from_str(raw).map_err(|e| ConfigError::Script {
                path: path.to_owned(),
                reason: format!(
                    "line {} is not a turn ({e}); expected {{\"text\": \"…\", \"toolCalls\": [{{\"id\", \"name\", \"arguments\"}}]}}",
                    number + 1
                ),
            })?;
            turns.push(line);
        }
        let model = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_else(|| "script".to_owned());
        Ok(Self {
            name: name.to_owned(),
            model,
            path: path.to_owned(),
            turns,
            max_tool_calls: cairn_core::provider::DEFAULT_MAX_TOOL_CALLS,
            context_window: None,
        })
    }

    /// Set the most tool calls of one answer the turn runs
    /// ([`Provider::max_tool_calls`]).
    pub fn with_max_tool_calls(mut self, max: usize) -> Self {
        self.max_tool_calls = max;
        self
    }

    /// Set the context window the turn bounds requests by
    /// ([`Provider::context_window`]; `None`: unbounded).
    pub fn with_context_window(mut self, window: Option<u32>) -> Self {
        self.context_window = window;
        self
    }

    /// How many turns the script holds.
    pub fn len(&self) -> usize {
        self.turns.len()
    }

    /// Whether the script holds no turn.
    pub fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }
}

impl ScriptFileProvider {
    /// A compaction request is answered without using a script line (the
    /// script numbers the turn's calls only): a deterministic summary that
    /// names how much it covers and quotes the end of what it was shown.
    fn summarise(&self, request: &ModelRequest<'_>, started: Instant) -> ModelResponse {
        let shown: String = request.messages.iter().map(Message::joined_text).collect();
        let tail: String = {
            let chars: Vec<char> = shown.chars().collect();
            chars[chars.len().saturating_sub(300)..].iter().collect()
        };
        let text = format!("(scripted summary of {} bytes of conversation) … {tail}", shown.len());
        let row = AttemptUsage {
            provider: self.name.clone(),
            model: self.model.clone(),
            attempt: 1,
            input_tokens: estimate_tokens(shown.len()),
            output_tokens: estimate_tokens(text.len()),
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            ..AttemptUsage::default()
        };
        ModelResponse { message: Message::text(Role::Assistant, text), stop: StopReason::EndTurn, attempts: vec![row] }
    }
}

/// A rough token estimate (4 bytes a token) so usage ledgers have numbers.
fn estimate_tokens(bytes: usize) -> u64 {
    bytes.div_ceil(4) as u64
}

impl Provider for ScriptFileProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn model(&self) -> &str {
        &self.model
    }

    fn max_tool_calls(&self) -> usize {
        self.max_tool_calls
    }

    fn context_window(&self) -> Option<u32> {
        self.context_window
    }

    fn complete(
        &self,
        request: &ModelRequest<'_>,
        observer: &mut dyn FnMut(&StreamEvent),
        cancel: &CancelToken,
    ) -> Result<ModelResponse, ProviderError> {
        let started = Instant::now();
        if request.purpose == RequestPurpose::Compaction {
            return Ok(self.summarise(request, started));
        }
        let k =
            request.earlier_assistant_messages + request.messages.iter().filter(|m| m.role == Role::Assistant).count();
        let mut row = AttemptUsage {
            provider: self.name.clone(),
            model: self.model.clone(),
            attempt: 1,
            input_tokens: estimate_tokens(request.messages.iter().map(|m| m.joined_text().len()).sum()),
            ..AttemptUsage::default()
        };
        let fail = |kind, message: String, mut row: AttemptUsage| {
            row.error = Some(message.clone());
            row.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            ProviderError { kind, message, status: None, attempts: vec![row] }
        };
        let Some(line) = self.turns.get(k) else {
            let message = format!(
                "script {} ran out: it has {} turn(s) but this is request {} ({k} assistant message(s) already in the session); add lines to the script",
                self.path.display(),
                self.turns.len(),
                k + 1
            );
            return Err(fail(ProviderErrorKind::Exhausted, message, row));
        };
        observer(&StreamEvent::AttemptStarted { attempt: 1 });
        // Stream the text in word-sized pieces, like a model would.
        for piece in line.text.split_inclusive(' ') {
            if cancel.is_cancelled() {
                return Err(fail(ProviderErrorKind::Cancelled, "the call was cancelled".to_owned(), row));
            }
            observer(&StreamEvent::TextDelta { text: piece.to_owned() });
        }
        let (message, stop) = line.reply(observer);
        row.output_tokens = estimate_tokens(serde_json::to_string(&message.content).map(|s| s.len()).unwrap_or(0));
        row.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Ok(ModelResponse { message, stop, attempts: vec![row] })
    }
}
