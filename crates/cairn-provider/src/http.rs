//! [`HttpProvider`]: one adapter type for the three HTTP APIs, with the
//! attempt loop (retries, backoff, usage rows), timeouts, limits and
//! cancellation.
//!
//! This module owns the control flow of a call: build the body once, run
//! attempts, classify each failure (retryable or not), wait, and settle.
//! It owns the limits on a hostile server too: the call's total deadline,
//! the idle deadline that only content resets, and the cap on an answer's
//! content bytes.
//! It must not know any API's JSON (see `wire`) and must never let the key
//! out: headers are built here, and every error text passes through
//! [`Secret::scrub`] before it leaves.

use std::fmt;
use std::time::{Duration, Instant, SystemTime};

use cairn_core::CancelToken;
use cairn_core::provider::{
    AttemptUsage, ModelRequest, ModelResponse, Provider, ProviderError, ProviderErrorKind, StreamEvent,
};

use crate::config::{ConfigError, ProviderConfig, ProviderKind};
use crate::retry::{RetryPolicy, is_retryable_status, parse_retry_after};
use crate::secret::Secret;
use crate::sse::{SseError, SseEvent, SseParser};
use crate::transport::{self, Deadline, Exchange, FailKind, Head, Limits, Outgoing, Piece};
use crate::wire::{self, Decoder, Settled, StreamError, Usage};

/// The most of an error body read and shown.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// A provider speaking one of the HTTP APIs.
pub struct HttpProvider {
    name: String,
    model: String,
    kind: ProviderKind,
    endpoint: String,
    /// The endpoint as shown in errors and Debug: no userinfo, no query.
    shown_endpoint: String,
    key: Option<Secret>,
    retry: RetryPolicy,
    limits: Limits,
    agent: ureq::Agent,
    options: wire::Options,
    max_event_bytes: usize,
    max_response_bytes: usize,
    max_tool_calls: usize,
    /// `context_window` from the configuration.
    context_window: Option<u32>,
    /// Whether to ask `/models` for the window (`context_window_from_server`).
    probe_window: bool,
    /// The window the server stated, asked once.
    server_window: std::sync::OnceLock<Option<u32>>,
    /// The provider for `compaction_model`, if one is configured.
    compaction: Option<Box<HttpProvider>>,
    /// The model takes images (`images`).
    images: bool,
}

impl fmt::Debug for HttpProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpProvider")
            .field("name", &self.name)
            .field("model", &self.model)
            .field("kind", &self.kind)
            .field("endpoint", &self.shown_endpoint)
            .field("key", &self.key)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

/// How one attempt ended.
struct Failure {
    kind: ProviderErrorKind,
    message: String,
    retryable: bool,
    retry_after: Option<Duration>,
}

impl From<StreamError> for Failure {
    fn from(e: StreamError) -> Self {
        Self { kind: e.kind, message: e.message, retryable: e.retryable, retry_after: None }
    }
}

impl From<transport::Failure> for Failure {
    fn from(f: transport::Failure) -> Self {
        let (kind, retryable) = match f.kind {
            FailKind::Connection => (ProviderErrorKind::Connection, true),
            FailKind::Timeout => (ProviderErrorKind::Timeout, true),
            FailKind::OutOfTime => (ProviderErrorKind::Timeout, false),
            FailKind::Cancelled => (ProviderErrorKind::Cancelled, false),
        };
        Self { kind, message: f.message, retryable, retry_after: None }
    }
}

struct Attempt {
    status: Option<u16>,
    usage: Usage,
    result: Result<Settled, Failure>,
}

impl HttpProvider {
    /// An adapter for `config` calling `base_url` (already resolved) with
    /// `key` (if any). Used by [`crate::build`]; public for hosts that
    /// resolve base URL and key themselves.
    pub fn new(config: &ProviderConfig, base_url: String, key: Option<Secret>) -> Result<Self, ConfigError> {
        let base = base_url.trim_end_matches('/');
        let endpoint = match config.kind {
            ProviderKind::OpenAiChat => format!("{base}/chat/completions"),
            ProviderKind::OpenAiResponses => format!("{base}/responses"),
            ProviderKind::Anthropic => format!("{base}/v1/messages"),
            ProviderKind::Scripted | ProviderKind::Local => {
                return Err(ConfigError::Invalid {
                    name: config.name.clone(),
                    reason: "not an HTTP provider kind".to_owned(),
                });
            }
        };
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(ConfigError::Invalid {
                name: config.name.clone(),
                reason: format!("base URL `{base}` must start with http:// or https://"),
            });
        }
        let loopback = ["http://127.", "http://localhost", "http://[::1]"].iter().any(|p| endpoint.starts_with(p));
        let limits = Limits {
            connect: config.timeouts.connect,
            first_byte: config.timeouts.first_byte,
            idle: config.timeouts.idle,
            total: config.timeouts.total,
            poll: config.cancel_poll.max(Duration::from_millis(1)),
        };
        let legacy_max_tokens = !endpoint.starts_with("https://api.openai.com/");
        let compaction = match &config.compaction_model {
            Some(model) if *model != config.effective_model() => {
                let mut c = config.clone();
                c.model = Some(model.clone());
                c.compaction_model = None;
                c.context_window = None;
                Some(Box::new(HttpProvider::new(&c, base_url.clone(), key.clone())?))
            }
            _ => None,
        };
        Ok(Self {
            name: config.name.clone(),
            model: config.effective_model(),
            kind: config.kind,
            shown_endpoint: shown_url(&endpoint),
            endpoint,
            key,
            retry: config.retry.clone(),
            agent: transport::agent(&limits, loopback),
            limits,
            options: wire::Options {
                default_max: config.default_max_output_tokens,
                reasoning_effort: config.reasoning_effort.clone(),
                thinking_budget: config.thinking_budget_tokens,
                legacy_max_tokens,
                encrypted_reasoning: config.encrypted_reasoning,
            },
            max_event_bytes: config.max_event_bytes,
            max_response_bytes: config.max_response_bytes,
            max_tool_calls: config.max_tool_calls,
            context_window: config.context_window,
            probe_window: config.context_window_from_server && config.kind != ProviderKind::Anthropic,
            server_window: std::sync::OnceLock::new(),
            compaction,
            images: config.images,
        })
    }

    /// The window `GET {base}/models` states for this model (llama.cpp,
    /// vLLM, LiteLLM metadata), or `None` (no answer, no such field).
    fn ask_server_window(&self) -> Option<u32> {
        let suffix = match self.kind {
            ProviderKind::OpenAiResponses => "/responses",
            _ => "/chat/completions",
        };
        let url = format!("{}/models", self.endpoint.strip_suffix(suffix)?);
        let mut call = self.agent.get(&url);
        if let Some(key) = &self.key {
            call = call.header("authorization", format!("Bearer {}", key.expose()));
        }
        let mut response = call.call().ok()?;
        if response.status().as_u16() != 200 {
            return None;
        }
        let body = response.body_mut().with_config().limit(1 << 20).read_to_vec().ok()?;
        let value: serde_json::Value = serde_json::from_slice(&body).ok()?;
        crate::window::window_from_models(&value, &self.model)
    }

    /// The URL requests go to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The request body, serialised straight from the borrowed request into
    /// its bytes (no JSON tree of the history in between).
    fn body(&self, request: &ModelRequest<'_>) -> Result<std::sync::Arc<Vec<u8>>, serde_json::Error> {
        let (model, options) = (self.model.as_str(), &self.options);
        match self.kind {
            ProviderKind::Anthropic => exact_json(&wire::anthropic::Body { model, request, options }),
            ProviderKind::OpenAiResponses => exact_json(&wire::responses::Body { model, request, options }),
            _ => exact_json(&wire::chat::Body { model, request, options }),
        }
        .map(std::sync::Arc::new)
    }

    fn headers(&self) -> Vec<(String, String)> {
        let mut h = vec![
            ("content-type".to_owned(), "application/json".to_owned()),
            ("accept".to_owned(), "text/event-stream".to_owned()),
        ];
        match (self.kind, &self.key) {
            (ProviderKind::Anthropic, key) => {
                h.push(("anthropic-version".to_owned(), wire::anthropic::VERSION.to_owned()));
                if let Some(key) = key {
                    h.push(("x-api-key".to_owned(), key.expose().to_owned()));
                }
            }
            (_, Some(key)) => h.push(("authorization".to_owned(), format!("Bearer {}", key.expose()))),
            (_, None) => {}
        }
        h
    }

    fn decoder(&self) -> Box<dyn Decoder> {
        match self.kind {
            ProviderKind::Anthropic => Box::<wire::anthropic::AnthropicDecoder>::default(),
            ProviderKind::OpenAiResponses => Box::<wire::responses::ResponsesDecoder>::default(),
            _ => Box::<wire::chat::ChatDecoder>::default(),
        }
    }

    fn scrub(&self, text: &str) -> String {
        let text = match &self.key {
            Some(key) => key.scrub(text),
            None => text.to_owned(),
        };
        if self.endpoint == self.shown_endpoint { text } else { text.replace(&self.endpoint, &self.shown_endpoint) }
    }

    fn attempt(
        &self,
        body: &std::sync::Arc<Vec<u8>>,
        observer: &mut dyn FnMut(&StreamEvent),
        cancel: &CancelToken,
        call: &Deadline,
    ) -> Attempt {
        let outgoing = Outgoing { url: self.endpoint.clone(), headers: self.headers(), body: body.clone() };
        let mut exchange = transport::start(&self.agent, outgoing, self.limits.poll);
        let first_byte = Deadline::after(
            self.limits.connect.saturating_add(self.limits.first_byte),
            format!(
                "timed out waiting for the response headers (first-byte timeout, {})",
                shown(self.limits.first_byte)
            ),
            FailKind::Timeout,
        );
        let head = match exchange.head(first_byte.earliest(call), cancel) {
            Ok(head) => head,
            Err(f) => return Attempt { status: None, usage: Usage::default(), result: Err(f.into()) },
        };
        let status = Some(head.status);
        if !(200..300).contains(&head.status) {
            let result = Err(self.http_failure(&head, &mut exchange, cancel, call));
            return Attempt { status, usage: Usage::default(), result };
        }
        let content_type = head.header("content-type").unwrap_or("").to_ascii_lowercase();
        if content_type.contains("text/html") || content_type.contains("application/json") {
            let body = read_bounded(&mut exchange, &self.limits, cancel, call);
            let what = describe_body(&content_type, &body);
            let result = Err(Failure {
                kind: ProviderErrorKind::Protocol,
                message: format!("expected an event stream but the server sent {what}; check the base URL"),
                retryable: false,
                retry_after: None,
            });
            return Attempt { status, usage: Usage::default(), result };
        }
        let mut decoder = self.decoder();
        let result = self.stream(&mut exchange, decoder.as_mut(), observer, cancel, call);
        let result = result.and_then(|settled| match settled.message.duplicate_tool_call_id() {
            // Such a message cannot enter the log (the turn refuses it too):
            // ask the model again, it may well answer properly.
            Some(id) => Err(Failure {
                kind: ProviderErrorKind::Protocol,
                message: format!("the model used the tool-call id {id:?} for more than one call"),
                retryable: true,
                retry_after: None,
            }),
            None => Ok(settled),
        });
        Attempt { status, usage: decoder.usage(), result }
    }

    /// Decode the event stream. Only content (what the decoder turns into
    /// text, reasoning or tool-call events) resets the idle deadline; the
    /// content streamed and the content the decoder holds are each capped
    /// at `max_response_bytes`.
    fn stream(
        &self,
        exchange: &mut Exchange,
        decoder: &mut dyn Decoder,
        observer: &mut dyn FnMut(&StreamEvent),
        cancel: &CancelToken,
        call: &Deadline,
    ) -> Result<Settled, Failure> {
        let mut parser = SseParser::new(self.max_event_bytes);
        let mut events: Vec<SseEvent> = Vec::new();
        let mut idle = Deadline::after(
            self.limits.idle,
            format!(
                "timed out waiting for content: none came for {} (idle timeout; keepalives and events without content do not count)",
                shown(self.limits.idle)
            ),
            FailKind::Timeout,
        );
        let mut streamed = 0usize;
        loop {
            match exchange.piece(idle.earliest(call), cancel)? {
                Piece::Bytes(bytes) => {
                    parser.feed(&bytes, &mut events).map_err(sse_failure)?;
                    for event in events.drain(..) {
                        let mut content = 0usize;
                        let terminal = decoder.event(&event, &mut |e: StreamEvent| {
                            content = content.saturating_add(content_len(&e));
                            observer(&e);
                        })?;
                        if content > 0 {
                            idle.at = transport::later(self.limits.idle);
                            streamed = streamed.saturating_add(content);
                        }
                        if streamed.max(decoder.held_bytes()) > self.max_response_bytes {
                            return Err(Failure {
                                kind: ProviderErrorKind::Protocol,
                                message: format!(
                                    "the answer grew past {} bytes of content (text, reasoning and tool calls; raise `max_response_bytes` if this is expected); it was not used",
                                    self.max_response_bytes
                                ),
                                retryable: false,
                                retry_after: None,
                            });
                        }
                        if terminal {
                            return Ok(decoder.finish(true)?);
                        }
                    }
                }
                Piece::End => {
                    parser.finish().map_err(sse_failure)?;
                    return Ok(decoder.finish(false)?);
                }
            }
        }
    }

    fn http_failure(&self, head: &Head, exchange: &mut Exchange, cancel: &CancelToken, call: &Deadline) -> Failure {
        let body = read_bounded(exchange, &self.limits, cancel, call);
        let content_type = head.header("content-type").unwrap_or("").to_ascii_lowercase();
        let what = describe_body(&content_type, &body);
        let retry_after =
            parse_retry_after(head.header("retry-after-ms"), head.header("retry-after"), SystemTime::now());
        let too_long = crate::window::is_context_length_error(head.status, &body);
        Failure {
            kind: if too_long { ProviderErrorKind::ContextLength } else { ProviderErrorKind::Http },
            message: format!("HTTP {} {}: {what}", head.status, reason(head.status)),
            retryable: !too_long && is_retryable_status(head.status),
            retry_after,
        }
    }

    fn row(&self, attempt: u32, started: Instant, outcome: &Attempt) -> AttemptUsage {
        AttemptUsage {
            provider: self.name.clone(),
            model: self.model.clone(),
            attempt,
            input_tokens: outcome.usage.input,
            output_tokens: outcome.usage.output,
            cached_input_tokens: outcome.usage.cached,
            request_bytes: None,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            status: outcome.status,
            error: outcome.result.as_ref().err().map(|f| self.scrub(&f.message)),
        }
    }

    fn give_up(&self, f: &Failure, status: Option<u16>, attempts: Vec<AttemptUsage>, note: &str) -> ProviderError {
        let message = self.scrub(&format!("{} ({}): {}{note}", self.name, self.shown_endpoint, f.message));
        ProviderError { kind: f.kind, message, status, attempts }
    }
}

/// A URL fit for messages: userinfo and query (where credentials hide in
/// some deployments) are replaced by `[redacted]`.
/// `value` as JSON in a buffer of exactly its length: a counting pass
/// first, so a long body is never held in a buffer grown to twice its size
/// (nor copied while growing).
fn exact_json(value: &impl serde::Serialize) -> Result<Vec<u8>, serde_json::Error> {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value)?;
    let mut out = Vec::with_capacity(count.0);
    serde_json::to_writer(&mut out, value)?;
    Ok(out)
}

fn shown_url(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, _)) => (base, "?[redacted]"),
        None => (url, ""),
    };
    let shown = match base.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            match authority.rsplit_once('@') {
                Some((_, host)) => format!("{scheme}://[redacted]@{host}{path}"),
                None => base.to_owned(),
            }
        }
        None => base.to_owned(),
    };
    format!("{shown}{query}")
}

/// Sleep `delay`, waking to check the token. Returns false if cancelled.
fn wait(delay: Duration, poll: Duration, cancel: &CancelToken) -> bool {
    let end = transport::later(delay);
    loop {
        if cancel.is_cancelled() {
            return false;
        }
        let now = Instant::now();
        if now >= end {
            return true;
        }
        std::thread::sleep(poll.min(end - now));
    }
}

fn sse_failure(e: SseError) -> Failure {
    match e {
        // A cut stream is a broken connection: worth another attempt.
        SseError::Truncated { .. } => {
            Failure { kind: ProviderErrorKind::Connection, message: e.to_string(), retryable: true, retry_after: None }
        }
        _ => Failure { kind: ProviderErrorKind::Protocol, message: e.to_string(), retryable: false, retry_after: None },
    }
}

/// The content bytes a stream event carries (what `max_response_bytes`
/// counts, and what resets the idle deadline).
fn content_len(event: &StreamEvent) -> usize {
    match event {
        StreamEvent::TextDelta { text } | StreamEvent::ReasoningDelta { text } => text.len(),
        StreamEvent::ToolCallStarted { id, name } => id.len() + name.len(),
        StreamEvent::ToolCallDelta { arguments, .. } => arguments.len(),
        StreamEvent::AttemptStarted { .. } => 0,
    }
}

/// A duration as people read it in a message ("90 s", "250 ms").
fn shown(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.as_secs() > 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// Read at most [`MAX_ERROR_BODY`] bytes of a body (best effort), each
/// piece within the idle timeout and all of it within the call's deadline.
fn read_bounded(exchange: &mut Exchange, limits: &Limits, cancel: &CancelToken, call: &Deadline) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BODY {
        let idle =
            Deadline::after(limits.idle, "timed out reading the body (idle timeout)".to_owned(), FailKind::Timeout);
        match exchange.piece(idle.earliest(call), cancel) {
            Ok(Piece::Bytes(bytes)) => body.extend_from_slice(&bytes),
            Ok(Piece::End) | Err(_) => break,
        }
    }
    body.truncate(MAX_ERROR_BODY);
    body
}

fn reason(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Payload Too Large",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        529 => "Overloaded",
        _ => "",
    }
}

/// A one-line account of a (usually error) body: the provider's own message
/// from a JSON error object, an HTML page's title, or the start of the text.
pub(crate) fn describe_body(content_type: &str, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return "an empty body".to_owned();
    }
    if let Ok(value) = serde_json::from_str::<serde_json::Value>(trimmed)
        && let Some(message) = wire::error_object_text(&value)
    {
        return message;
    }
    let lower = trimmed.to_ascii_lowercase();
    if content_type.contains("html") || lower.starts_with("<!doctype html") || lower.starts_with("<html") {
        let title = lower
            .find("<title>")
            .and_then(|start| {
                let rest = &trimmed[start + 7..];
                rest.to_ascii_lowercase().find("</title>").map(|end| rest[..end].trim().to_owned())
            })
            .filter(|t| !t.is_empty());
        return match title {
            Some(title) => format!("an HTML page titled \"{}\" (not an API response)", clip(&title, 200)),
            None => "an HTML page (not an API response)".to_owned(),
        };
    }
    clip(&trimmed.split_whitespace().collect::<Vec<_>>().join(" "), 300)
}

fn clip(text: &str, max_chars: usize) -> String {
    let mut out: String = text.chars().take(max_chars).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

impl Provider for HttpProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn model(&self) -> &str {
        &self.model
    }

    fn max_tool_calls(&self) -> usize {
        self.max_tool_calls
    }

    fn accepts_images(&self) -> bool {
        self.images
    }

    /// Configured, else stated by the server (when asked to ask), else a
    /// default for a well-known model name, else the fallback.
    fn context_window(&self) -> Option<u32> {
        let server = || *self.server_window.get_or_init(|| self.ask_server_window());
        let stated = self.context_window.or_else(|| if self.probe_window { server() } else { None });
        Some(
            stated
                .or_else(|| crate::window::known_context_window(&self.model))
                .unwrap_or(crate::window::FALLBACK_CONTEXT_WINDOW),
        )
    }

    fn max_output_tokens(&self) -> Option<u32> {
        Some(self.options.default_max)
    }

    fn compaction_provider(&self) -> Option<&dyn Provider> {
        self.compaction.as_deref().map(|p| p as &dyn Provider)
    }

    fn complete(
        &self,
        request: &ModelRequest<'_>,
        observer: &mut dyn FnMut(&StreamEvent),
        cancel: &CancelToken,
    ) -> Result<ModelResponse, ProviderError> {
        let call = Deadline::after(
            self.limits.total,
            format!(
                "timed out: the call ran past its total time limit of {} (`total_timeout_ms`); a server this slow is not waited for",
                shown(self.limits.total)
            ),
            FailKind::OutOfTime,
        );
        let body = self.body(request).map_err(|e| {
            ProviderError::new(ProviderErrorKind::Other, format!("the request body could not be written: {e}"))
        })?;
        let max = self.retry.max_attempts.max(1);
        let mut attempts: Vec<AttemptUsage> = Vec::new();
        for attempt in 1..=max {
            if cancel.is_cancelled() {
                let mut e = ProviderError::new(ProviderErrorKind::Cancelled, "the call was cancelled");
                e.attempts = attempts;
                return Err(e);
            }
            observer(&StreamEvent::AttemptStarted { attempt });
            let started = Instant::now();
            let outcome = self.attempt(&body, observer, cancel, &call);
            attempts.push(self.row(attempt, started, &outcome));
            let failure = match outcome.result {
                Ok(settled) => {
                    return Ok(ModelResponse { message: settled.message, stop: settled.stop, attempts });
                }
                Err(failure) => failure,
            };
            if !failure.retryable || cancel.is_cancelled() {
                let note = if attempt > 1 { format!(" (attempt {attempt} of {max})") } else { String::new() };
                return Err(self.give_up(&failure, outcome.status, attempts, &note));
            }
            if attempt == max {
                let note = format!(" (gave up after {max} attempts)");
                return Err(self.give_up(&failure, outcome.status, attempts, &note));
            }
            if let Some(asked) = failure.retry_after
                && asked > self.retry.max_retry_after
            {
                let note = format!(
                    " (the server asked to retry after {}s, longer than the {}s cairn waits)",
                    asked.as_secs(),
                    self.retry.max_retry_after.as_secs()
                );
                return Err(self.give_up(&failure, outcome.status, attempts, &note));
            }
            let delay = self.retry.delay(attempt + 1, failure.retry_after, fastrand::f64());
            if transport::later(delay) >= call.at {
                let note = format!(
                    " (attempt {attempt} of {max}; no time is left for another within the total time limit of {})",
                    shown(self.limits.total)
                );
                return Err(self.give_up(&failure, outcome.status, attempts, &note));
            }
            tracing::debug!(
                provider = %self.name,
                attempt,
                delay_ms = delay.as_millis() as u64,
                error = %self.scrub(&failure.message),
                "provider attempt failed; retrying"
            );
            if !wait(delay, self.limits.poll, cancel) {
                let mut e = ProviderError::new(ProviderErrorKind::Cancelled, "the call was cancelled");
                e.attempts = attempts;
                return Err(e);
            }
        }
        // Unreachable in practice: the loop returns on the last attempt.
        Err(ProviderError::new(ProviderErrorKind::Other, "no attempt was made"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_bodies() {
        assert_eq!(describe_body("", b""), "an empty body");
        assert_eq!(
            describe_body(
                "application/json",
                br#"{"error":{"message":"model not found","type":"invalid_request_error"}}"#
            ),
            "model not found (invalid_request_error)"
        );
        let html = b"<!DOCTYPE html><html><head><TITLE>502 Bad Gateway</TITLE></head><body>nginx</body></html>";
        assert_eq!(describe_body("text/html", html), "an HTML page titled \"502 Bad Gateway\" (not an API response)");
        assert_eq!(describe_body("text/plain", b"  upstream   connect\nerror "), "upstream connect error");
    }

    #[test]
    fn urls_lose_credentials_when_shown() {
        assert_eq!(shown_url("https://u:p@host:1/v1/x?api-key=k"), "https://[redacted]@host:1/v1/x?[redacted]");
        assert_eq!(shown_url("http://127.0.0.1:9/v1/chat/completions"), "http://127.0.0.1:9/v1/chat/completions");
    }

    #[test]
    fn debug_hides_the_key() {
        let mut config = ProviderConfig::new("x", ProviderKind::Anthropic);
        config.model = Some("m".into());
        let p =
            HttpProvider::new(&config, "http://127.0.0.1:9".into(), Some(Secret::new("sk-ant-hidden-999"))).unwrap();
        let shown = format!("{p:?}");
        assert!(shown.contains("[redacted]") && !shown.contains("hidden-999"), "{shown}");
    }
}
