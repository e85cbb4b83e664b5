//! The provider's log lines (via `tracing`) never carry the key, even when
//! the server echoes it back in an error that gets logged before a retry.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_core::CancelToken;
use cairn_core::message::{Message, Role};
use cairn_core::provider::{ModelRequest, Provider};
use cairn_provider::{HttpProvider, ProviderConfig, ProviderKind, Secret};
use cairn_test_server::{Reply, TestServer, fixtures};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

const KEY: &str = "sk-log-test-9f8e7d6c5b4a-SECRET";

/// A subscriber that writes every event and its fields into a string.
struct Capture(Arc<Mutex<String>>);

struct Fields<'a>(&'a mut String);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={:?}", field.name(), value);
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut line = format!("{} {}:", event.metadata().level(), event.metadata().target());
        event.record(&mut Fields(&mut line));
        let mut out = self.0.lock().unwrap();
        out.push_str(&line);
        out.push('\n');
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn retry_logs_name_the_error_but_never_the_key() {
    let echo = serde_json::json!({"error": {"message": format!("Key {KEY} is rate limited"), "type": "requests"}});
    let server =
        TestServer::start(vec![Reply::json(429, &echo).header("retry-after-ms", "1"), Reply::sse(fixtures::CHAT_TEXT)])
            .unwrap();
    let mut config = ProviderConfig::new("logged", ProviderKind::OpenAiChat);
    config.retry.initial_backoff = Duration::from_millis(1);
    let p = HttpProvider::new(&config, format!("{}/v1", server.url()), Some(Secret::new(KEY))).unwrap();
    let logs = Arc::new(Mutex::new(String::new()));
    let messages = [Message::text(Role::User, "hi")];
    let request = ModelRequest {
        system: None,
        messages: &messages,
        tools: &[],
        max_output_tokens: None,
        earlier_assistant_messages: 0,
        purpose: Default::default(),
    };
    let result = tracing::subscriber::with_default(Capture(logs.clone()), || {
        p.complete(&request, &mut |_| {}, &CancelToken::new())
    });
    assert_eq!(result.unwrap().attempts.len(), 2);
    let logs = logs.lock().unwrap().clone();
    assert!(logs.contains("retrying") && logs.contains("[redacted] is rate limited"), "{logs}");
    assert!(!logs.contains(KEY) && !logs.contains("9f8e7d6c5b4a"), "{logs}");
}
