//! [`ScriptProvider`]: replays canned model turns in process.
//!
//! Script: JSONL, one model turn per line,
//! `{"text": "…", "toolCalls": [{"id": "…", "name": "…", "arguments": {…}}]}`.
//! Request k is answered with line k, where k is the number of assistant
//! messages already in the request — so a resumed session gets exactly the
//! line it would have got (the rule of cairn-provider's `ScriptFileProvider`,
//! whose script types and reply building it shares).
//! It records every request's messages so tests can check what the model saw.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use cairn_core::CancelToken;
use cairn_core::message::{Message, Role};
use cairn_core::provider::{
    AttemptUsage, ModelRequest, ModelResponse, Provider, ProviderError, ProviderErrorKind, StreamEvent,
};
pub use cairn_provider::script_file::{ScriptCall, ScriptLine};

/// The in-process scripted provider.
#[derive(Debug, Default)]
pub struct ScriptProvider {
    lines: Vec<ScriptLine>,
    cycle: bool,
    fail_first: AtomicU32,
    /// Messages of every request, in order.
    pub requests: Mutex<Vec<Vec<Message>>>,
    record: bool,
}

impl ScriptProvider {
    /// A provider over `lines`.
    pub fn new(lines: Vec<ScriptLine>) -> Self {
        Self { lines, record: true, ..Self::default() }
    }

    /// Parse a JSONL script (blank lines skipped).
    pub fn from_jsonl(text: &str) -> Result<Self, String> {
        let lines = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("script line {}: {e}", i + 1)))
            .collect::<Result<_, _>>()?;
        Ok(Self::new(lines))
    }

    /// Answer request k with line k mod len (for benchmarks over long
    /// histories); stop recording requests.
    pub fn cycling(mut self) -> Self {
        self.cycle = true;
        self.record = false;
        self
    }

    /// Fail the first `n` calls with an HTTP-like error (one failed attempt
    /// row each).
    pub fn failing_first(self, n: u32) -> Self {
        self.fail_first.store(n, Ordering::SeqCst);
        self
    }

    fn attempt(&self, request: &ModelRequest<'_>, output: usize, error: Option<String>) -> AttemptUsage {
        AttemptUsage {
            provider: "script".to_owned(),
            model: "script".to_owned(),
            attempt: 1,
            input_tokens: request.messages.len() as u64,
            output_tokens: output as u64,
            cached_input_tokens: 0,
            request_bytes: None,
            duration_ms: 0,
            status: if error.is_some() { Some(500) } else { Some(200) },
            error,
        }
    }
}

impl Provider for ScriptProvider {
    fn name(&self) -> &str {
        "script"
    }

    fn model(&self) -> &str {
        "script"
    }

    fn complete(
        &self,
        request: &ModelRequest<'_>,
        observer: &mut dyn FnMut(&StreamEvent),
        cancel: &CancelToken,
    ) -> Result<ModelResponse, ProviderError> {
        if self.record
            && let Ok(mut requests) = self.requests.lock()
        {
            requests.push(request.messages.to_vec());
        }
        observer(&StreamEvent::AttemptStarted { attempt: 1 });
        if cancel.is_cancelled() {
            return Err(ProviderError::new(ProviderErrorKind::Cancelled, "cancelled"));
        }
        if self.fail_first.load(Ordering::SeqCst) > 0 {
            self.fail_first.fetch_sub(1, Ordering::SeqCst);
            let mut error = ProviderError::new(ProviderErrorKind::Http, "scripted failure (HTTP 500)");
            error.status = Some(500);
            error.attempts = vec![self.attempt(request, 0, Some("HTTP 500".to_owned()))];
            return Err(error);
        }
        let k =
            request.earlier_assistant_messages + request.messages.iter().filter(|m| m.role == Role::Assistant).count();
        let line =
            if self.cycle && !self.lines.is_empty() { self.lines.get(k % self.lines.len()) } else { self.lines.get(k) };
        let Some(line) = line else {
            return Err(ProviderError::new(
                ProviderErrorKind::Exhausted,
                format!("the script has {} lines and request {} needs line {}", self.lines.len(), k + 1, k + 1),
            ));
        };
        if !line.text.is_empty() {
            observer(&StreamEvent::TextDelta { text: line.text.clone() });
        }
        let (message, stop) = line.reply(observer);
        Ok(ModelResponse { message, stop, attempts: vec![self.attempt(request, line.text.len(), None)] })
    }
}
