//! Context windows: defaults for well-known model names, the window a
//! server states in its `/v1/models` metadata (llama.cpp, vLLM, LiteLLM),
//! and recognising a "context length exceeded" error body (OpenAI,
//! Anthropic, llama.cpp), which the turn answers with one compaction and
//! one retry.
//!
//! It must not talk HTTP itself (the provider fetches; this module reads
//! what came back) and must not guess a window for a model it does not
//! know: the caller then uses the configured value or the fallback.

use serde_json::Value;

/// The window assumed for a model nobody states one for: small enough for
/// most servers people run locally with default settings.
pub const FALLBACK_CONTEXT_WINDOW: u32 = 32_768;

/// The context window of a well-known model, by name (prefix match on the
/// name without a vendor prefix such as `openai/`).
pub fn known_context_window(model: &str) -> Option<u32> {
    let name = model.rsplit('/').next().unwrap_or(model).to_ascii_lowercase();
    const TABLE: &[(&str, u32)] = &[
        ("gpt-5", 400_000),
        ("gpt-4.1", 1_047_576),
        ("gpt-4o", 128_000),
        ("gpt-4-turbo", 128_000),
        ("gpt-4", 8_192),
        ("gpt-3.5-turbo", 16_385),
        ("o1", 200_000),
        ("o3", 200_000),
        ("o4-mini", 200_000),
        ("claude-", 200_000),
        ("gemini-", 1_048_576),
        ("qwen3", 32_768),
        ("qwen2.5", 32_768),
        ("llama3.1", 131_072),
        ("llama-3.1", 131_072),
        ("llama3.2", 131_072),
        ("llama-3.2", 131_072),
        ("mistral-large", 131_072),
        ("smollm2", 8_192),
    ];
    TABLE.iter().find(|(prefix, _)| name.starts_with(prefix)).map(|&(_, w)| w)
}

/// The window a `/v1/models` answer states for `model`: llama.cpp's
/// `meta.n_ctx_train` (and `n_ctx`), vLLM's `max_model_len`, LiteLLM's
/// `model_info.max_input_tokens` / `max_tokens`, or a top-level
/// `context_length` / `context_window`. When the list holds one model
/// only, its value counts whatever its id (llama.cpp names the file).
pub fn window_from_models(body: &Value, model: &str) -> Option<u32> {
    let list = body.get("data").and_then(Value::as_array)?;
    let named = list.iter().find(|m| {
        m.get("id").and_then(Value::as_str) == Some(model) || m.get("model_name").and_then(Value::as_str) == Some(model)
    });
    let entry = named.or_else(|| (list.len() == 1).then(|| &list[0]))?;
    let number =
        |v: Option<&Value>| v.and_then(Value::as_u64).filter(|&n| n > 0).map(|n| u32::try_from(n).unwrap_or(u32::MAX));
    number(entry.get("max_model_len"))
        .or_else(|| number(entry.pointer("/meta/n_ctx")))
        .or_else(|| number(entry.pointer("/meta/n_ctx_train")))
        .or_else(|| number(entry.pointer("/model_info/max_input_tokens")))
        .or_else(|| number(entry.pointer("/model_info/max_tokens")))
        .or_else(|| number(entry.get("context_length")))
        .or_else(|| number(entry.get("context_window")))
}

/// Whether an error answer (status and body) says the request was longer
/// than the model's context: OpenAI's `context_length_exceeded` code,
/// Anthropic's "prompt is too long", llama.cpp's `exceed_context_size_error`
/// (and the wordings of vLLM and Ollama-style servers).
pub fn is_context_length_error(status: u16, body: &[u8]) -> bool {
    if !matches!(status, 400 | 413 | 422 | 500) {
        return false;
    }
    let text = String::from_utf8_lossy(body).to_ascii_lowercase();
    [
        "context_length_exceeded",
        "exceed_context_size_error",
        "prompt is too long",
        "maximum context length",
        "exceeds the available context size",
        "context window",
        "too many tokens",
    ]
    .iter()
    .any(|marker| text.contains(marker))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn well_known_names_and_no_guess_for_others() {
        assert_eq!(known_context_window("gpt-4o-mini"), Some(128_000));
        assert_eq!(known_context_window("claude-sonnet-4-5"), Some(200_000));
        assert_eq!(known_context_window("openai/gpt-5-mini"), Some(400_000));
        assert_eq!(known_context_window("my-finetune"), None);
    }

    #[test]
    fn servers_state_their_window() {
        let llama = json!({"object": "list", "data": [{"id": "/models/q.gguf", "object": "model", "meta": {"n_ctx_train": 131072, "n_vocab": 32000}}]});
        assert_eq!(window_from_models(&llama, "whatever"), Some(131_072));
        let vllm = json!({"data": [{"id": "a", "max_model_len": 4096}, {"id": "b", "max_model_len": 32768}]});
        assert_eq!(window_from_models(&vllm, "b"), Some(32_768));
        assert_eq!(window_from_models(&vllm, "c"), None);
        let litellm =
            json!({"data": [{"model_name": "m", "model_info": {"max_input_tokens": 65536, "max_tokens": 8192}}]});
        assert_eq!(window_from_models(&litellm, "m"), Some(65_536));
        assert_eq!(window_from_models(&json!({"data": [{"id": "x"}]}), "x"), None);
        assert_eq!(window_from_models(&json!({"error": "no"}), "x"), None);
    }
}
