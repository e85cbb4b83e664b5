//! Interop checks against a real third-party server (llama.cpp's
//! `llama-server`, `llama-cpp-python`'s server, Ollama, vLLM…). Ignored by
//! default because they need that server running; run them by hand:
//!
//! ```text
//! CAIRN_INTEROP_BASE_URL=http://127.0.0.1:8080/v1 CAIRN_INTEROP_KIND=openai-chat \
//!   cargo test -p cairn-provider --test interop -- --ignored
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use cairn_core::CancelToken;
use cairn_core::message::{Message, Role};
use cairn_core::provider::{ModelRequest, Provider, StreamEvent};
use cairn_provider::{HttpProvider, ProviderConfig, ProviderTable};

fn provider() -> HttpProvider {
    let base = std::env::var("CAIRN_INTEROP_BASE_URL").expect("set CAIRN_INTEROP_BASE_URL to the server's base URL");
    let kind = std::env::var("CAIRN_INTEROP_KIND").unwrap_or_else(|_| "openai-chat".into());
    let table: ProviderTable = serde_json::from_value(serde_json::json!({"kind": kind})).unwrap();
    let mut config = ProviderConfig::from_table("interop", table).unwrap();
    config.model = std::env::var("CAIRN_INTEROP_MODEL").ok().or(Some("local".into()));
    config.retry.max_attempts = 1;
    config.timeouts.first_byte = Duration::from_secs(300);
    config.timeouts.idle = Duration::from_secs(120);
    HttpProvider::new(&config, base, None).unwrap()
}

#[test]
#[ignore = "needs a real server: set CAIRN_INTEROP_BASE_URL"]
fn a_real_server_streams_an_answer_cairn_settles() {
    let p = provider();
    let messages = [Message::text(Role::User, "Say hello in three words.")];
    let request = ModelRequest {
        system: Some("You are brief."),
        messages: &messages,
        tools: &[],
        max_output_tokens: Some(32),
        earlier_assistant_messages: 0,
        purpose: Default::default(),
    };
    let mut text = String::new();
    let r = p
        .complete(
            &request,
            &mut |e| {
                if let StreamEvent::TextDelta { text: t } = e {
                    text.push_str(t);
                }
            },
            &CancelToken::new(),
        )
        .unwrap();
    eprintln!("settled: {:?}\nattempts: {:?}", r.message, r.attempts);
    assert_eq!(r.message.role, Role::Assistant);
    assert!(!r.message.joined_text().is_empty());
    assert_eq!(text, r.message.joined_text());
    assert_eq!(r.attempts.len(), 1);
    assert_eq!(r.attempts[0].status, Some(200));
}
