//! Ask the local model a few prompts with the three standard tools offered
//! and print what it answers (a manual check of tool-call behaviour).
//! Usage: `CAIRN_LOCAL_MODEL=... cargo run -p cairn-local --example probe -- "prompt" ...`
//! (`PROBE_THREADS=2`, `PROBE_PRECISION=q8_0` to try other options).
#![allow(clippy::print_stdout)]

use std::sync::Arc;

use cairn_core::CancelToken;
use cairn_core::message::{Message, Role};
use cairn_core::provider::{ModelRequest, Provider};
use cairn_core::tool::{ReplayPolicy, Risk, ToolSpec};
use cairn_local::{LocalModel, LocalOptions, LocalProvider, MODEL_ENV};
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::var(MODEL_ENV).map_err(|_| format!("set {MODEL_ENV}"))?;
    let threads = std::env::var("PROBE_THREADS").ok().and_then(|t| t.parse().ok()).unwrap_or(1);
    let precision = std::env::var("PROBE_PRECISION").unwrap_or_else(|_| "f32".into()).parse()?;
    let options = LocalOptions { threads, precision, ..LocalOptions::default() };
    let model = Arc::new(LocalModel::load(path.as_ref(), options)?);
    let provider = LocalProvider::new(model);
    let spec = |name: &str, description: &str, schema: serde_json::Value| ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema: schema,
        risk: Risk::ReadOnly,
        capabilities: Default::default(),
        replay: ReplayPolicy::Idempotent,
    };
    let tools = vec![
        spec(
            "read_file",
            "Read a text file and return its content.",
            json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
        ),
        spec(
            "list_dir",
            "List the entries of a directory.",
            json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        ),
        spec(
            "shell",
            "Run a shell command and return its output.",
            json!({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}),
        ),
    ];
    for prompt in std::env::args().skip(1) {
        let messages = vec![Message::text(Role::User, prompt.clone())];
        let request = ModelRequest {
            system: None,
            messages: &messages,
            tools: &tools,
            max_output_tokens: Some(48),
            earlier_assistant_messages: 0,
            purpose: Default::default(),
        };
        let response = provider.complete(&request, &mut |_| {}, &CancelToken::new())?;
        println!("{prompt:?} -> {:?} {}", response.stop, serde_json::to_string(&response.message.content)?);
    }
    Ok(())
}
