//! Provider configuration: the built-in names users type, `[providers.NAME]`
//! tables of cairn's config file, defaults and limits.
//!
//! This module owns name resolution, defaults and the ecosystem's
//! environment conventions (`OPENAI_API_KEY` / `OPENAI_BASE_URL`,
//! `ANTHROPIC_API_KEY` / `ANTHROPIC_BASE_URL`). It reads the environment only
//! through the `env` function the host passes in, never `std::env`, so hosts
//! and tests control it. It sits below the providers: it must not know how
//! a provider is built (that is `factory`), must not parse cairn's whole
//! config file (the CLI does) and must never put a key's value into an error.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::price::{Prices, UsdPerMtok};
use crate::retry::RetryPolicy;

/// The wire API a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ProviderKind {
    /// OpenAI Chat Completions (also Ollama, llama.cpp, vLLM, LM Studio).
    #[serde(rename = "openai-chat", alias = "openai", alias = "chat-completions")]
    OpenAiChat,
    /// OpenAI Responses.
    #[serde(rename = "openai-responses", alias = "responses")]
    OpenAiResponses,
    /// Anthropic Messages.
    Anthropic,
    /// Replays a JSONL script (tests, demos).
    Scripted,
    /// The embedded local model, built by the host (`cairn-local`).
    Local,
}

impl ProviderKind {}

/// Timeouts of a call. `connect`, `first_byte` and `idle` bound one HTTP
/// attempt: each that fires ends the attempt with a `Timeout` error, which
/// is retried like a connection error. `total` bounds the whole call, every
/// attempt and backoff included, and is not retried.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeouts {
    /// TCP (and TLS) connection setup.
    pub connect: Duration,
    /// From the request being sent to the response headers.
    pub first_byte: Duration,
    /// Longest time a streamed body may go without content (text,
    /// reasoning, a tool call or its arguments). Keepalive comments and
    /// events that carry no content do not count, so a server that only
    /// keeps the connection alive times out.
    pub idle: Duration,
    /// Longest time one call may take, all attempts included: bounds a
    /// server that trickles content forever.
    pub total: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(10),
            first_byte: Duration::from_secs(120),
            idle: Duration::from_secs(90),
            total: Duration::from_secs(600),
        }
    }
}

/// A resolved provider configuration.
///
/// Built from a built-in name ([`ProviderConfig::builtin`]) or a
/// `[providers.NAME]` table ([`ProviderConfig::from_toml`]); fields are public
/// so hosts and tests may adjust them before `build`.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderConfig {
    /// The name users type (`openai`, `anthropic`, or a config table name).
    pub name: String,
    /// The wire API.
    pub kind: ProviderKind,
    /// Base URL; `None` uses the kind's environment variable, then the
    /// public endpoint. Chat Completions and Responses append
    /// `/chat/completions` and `/responses`; Anthropic appends `/v1/messages`.
    pub base_url: Option<String>,
    /// Model name; `None` uses the kind's default.
    pub model: Option<String>,
    /// Name of the environment variable holding the key (never the key).
    pub api_key_env: Option<String>,
    /// Retry policy (attempt limit, backoff).
    pub retry: RetryPolicy,
    /// Per-attempt timeouts.
    pub timeouts: Timeouts,
    /// Script file for the scripted provider.
    pub script: Option<PathBuf>,
    /// Output token bound sent when the request has none (Anthropic requires
    /// one).
    pub default_max_output_tokens: u32,
    /// The largest single server-sent event (or line) accepted, in bytes.
    pub max_event_bytes: usize,
    /// The most content one attempt may stream, in bytes: text, reasoning,
    /// tool-call ids, names and arguments together. A larger answer is a
    /// `Protocol` error (not retried), so a runaway server cannot fill
    /// memory or the session file.
    pub max_response_bytes: usize,
    /// The most tool calls of one answer the turn runs; the turn settles
    /// the rest as rejected, with the reason, so the model sees why.
    pub max_tool_calls: usize,
    /// How often a blocked call checks the cancel token.
    pub cancel_poll: Duration,
    /// Reasoning effort for reasoning models (`low`, `medium`, `high`…):
    /// Responses `reasoning.effort` (with `summary: "auto"`), Chat
    /// Completions `reasoning_effort`. `None` leaves the server's default.
    pub reasoning_effort: Option<String>,
    /// Anthropic extended thinking: `thinking.budget_tokens`. `None` leaves
    /// thinking off.
    pub thinking_budget_tokens: Option<u32>,
    /// Responses: ask for `reasoning.encrypted_content` so reasoning can be
    /// passed back with `store: false` (default on; turn it off for models
    /// without reasoning, which refuse the include).
    pub encrypted_reasoning: bool,
    /// The model's context window in tokens; `None`: stated by the server
    /// (with `context_window_from_server`), else a default for a
    /// well-known model name, else 32,768.
    pub context_window: Option<u32>,
    /// Ask the server's `/models` for the window (llama.cpp, vLLM,
    /// LiteLLM metadata) when `context_window` is not set.
    pub context_window_from_server: bool,
    /// A cheaper model of the same provider that writes compaction
    /// summaries; `None` uses `model`.
    pub compaction_model: Option<String>,
    /// The model takes images in prompts (`images`): on by default for the
    /// HTTP APIs, which all carry them; off for a server whose model reads
    /// text only (its API would refuse the request). The scripted and
    /// embedded providers take none.
    pub images: bool,
    /// What the provider's model costs, as the user wrote it
    /// (`input_per_mtok`, `output_per_mtok`, `cached_input_per_mtok`);
    /// `None`: not said. They price only the table's own model (see
    /// [`ProviderConfig::prices_for`]).
    pub prices: Option<Prices>,
}

/// Why the tokens of a model have no price (see
/// [`ProviderConfig::prices_for`]); says what to write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unpriced {
    /// The table states no prices.
    #[error(
        "no price for {provider} · {model}: set input_per_mtok and output_per_mtok (US dollars per million tokens) in [providers.{provider}]"
    )]
    NoPrices {
        /// The provider's name.
        provider: String,
        /// The model asked for.
        model: String,
    },
    /// The table's prices are for another model (a `/model` or `--model`
    /// switch, a `compaction_model`).
    #[error(
        "no price for {provider} · {model}: the prices in [providers.{provider}] are for its model {priced}; price {model} in a table of its own (kind, model = \"{model}\" and its prices)"
    )]
    OtherModel {
        /// The provider's name.
        provider: String,
        /// The model asked for.
        model: String,
        /// The model the table's prices are for.
        priced: String,
    },
}

/// The names users can type without any config file.
pub const BUILTIN_NAMES: &[&str] = &["openai", "openai-responses", "anthropic", "scripted", "local"];

/// The public OpenAI endpoint (Chat Completions and Responses).
pub(crate) const DEFAULT_OPENAI_BASE: &str = "https://api.openai.com/v1";
/// The public Anthropic endpoint.
pub(crate) const DEFAULT_ANTHROPIC_BASE: &str = "https://api.anthropic.com";

impl ProviderConfig {
    /// A config of `kind` under `name` with every default.
    pub fn new(name: impl Into<String>, kind: ProviderKind) -> Self {
        Self {
            name: name.into(),
            kind,
            base_url: None,
            model: None,
            api_key_env: None,
            retry: RetryPolicy::default(),
            timeouts: Timeouts::default(),
            script: None,
            default_max_output_tokens: 8192,
            max_event_bytes: 16 << 20,
            max_response_bytes: 8 << 20,
            max_tool_calls: cairn_core::provider::DEFAULT_MAX_TOOL_CALLS,
            cancel_poll: Duration::from_millis(20),
            reasoning_effort: None,
            thinking_budget_tokens: None,
            encrypted_reasoning: true,
            context_window: None,
            context_window_from_server: false,
            compaction_model: None,
            images: matches!(kind, ProviderKind::OpenAiChat | ProviderKind::OpenAiResponses | ProviderKind::Anthropic),
            prices: None,
        }
    }

    /// The built-in provider called `name`, if there is one.
    pub fn builtin(name: &str) -> Option<Self> {
        let kind = match name {
            "openai" => ProviderKind::OpenAiChat,
            "openai-responses" => ProviderKind::OpenAiResponses,
            "anthropic" => ProviderKind::Anthropic,
            "scripted" => ProviderKind::Scripted,
            "local" => ProviderKind::Local,
            _ => return None,
        };
        Some(Self::new(name, kind))
    }

    /// Resolve `name`: a `[providers.NAME]` table from the config file when
    /// the host has one (`table`), else the built-in of that name.
    pub fn resolve(name: &str, table: Option<&toml::Value>) -> Result<Self, ConfigError> {
        match table {
            Some(table) => Self::from_toml(name, table),
            None => Self::builtin(name).ok_or_else(|| ConfigError::UnknownProvider { name: name.to_owned() }),
        }
    }

    /// Read one `[providers.NAME]` table. Keys: `kind`, `base_url`, `model`,
    /// `api_key_env`, `script`, `max_attempts`, `connect_timeout_ms`,
    /// `first_byte_timeout_ms`, `idle_timeout_ms`, `total_timeout_ms`,
    /// `initial_backoff_ms`, `max_backoff_ms`, `max_output_tokens`,
    /// `max_response_bytes`, `max_event_bytes`, `max_tool_calls`,
    /// `reasoning_effort`, `thinking_budget_tokens`, `encrypted_reasoning`,
    /// `context_window`, `context_window_from_server`, `compaction_model`,
    /// `images`, `input_per_mtok`, `output_per_mtok`, `cached_input_per_mtok`.
    /// `kind` may be left out when NAME is a built-in name (the table then
    /// adjusts the built-in).
    pub fn from_toml(name: &str, table: &toml::Value) -> Result<Self, ConfigError> {
        let raw: ProviderTable = table.clone().try_into().map_err(|e: toml::de::Error| ConfigError::Invalid {
            name: name.to_owned(),
            reason: e.message().to_owned(),
        })?;
        Self::from_table(name, raw)
    }

    /// The config of provider `name` from its already-deserialized table
    /// (see [`ProviderTable`]); missing keys take the defaults.
    pub fn from_table(name: &str, raw: ProviderTable) -> Result<Self, ConfigError> {
        let mut config = match (raw.kind, Self::builtin(name)) {
            (Some(kind), _) => Self::new(name, kind),
            (None, Some(builtin)) => builtin,
            (None, None) => {
                return Err(ConfigError::Invalid {
                    name: name.to_owned(),
                    reason: "missing `kind` (one of openai-chat, openai-responses, anthropic, scripted, local)"
                        .to_owned(),
                });
            }
        };
        config.base_url = raw.base_url.or(config.base_url);
        config.model = raw.model.or(config.model);
        config.api_key_env = raw.api_key_env.or(config.api_key_env);
        config.script = raw.script.or(config.script);
        if let Some(n) = raw.max_attempts {
            if n == 0 {
                return Err(ConfigError::Invalid {
                    name: name.to_owned(),
                    reason: "`max_attempts` must be at least 1".to_owned(),
                });
            }
            config.retry.max_attempts = n;
        }
        // A zero limit would refuse every call; say so instead.
        let positive = |key: &str, v: u64| -> Result<u64, ConfigError> {
            if v == 0 {
                return Err(ConfigError::Invalid {
                    name: name.to_owned(),
                    reason: format!("`{key}` must be at least 1"),
                });
            }
            Ok(v)
        };
        let ms = Duration::from_millis;
        if let Some(v) = raw.total_timeout_ms {
            config.timeouts.total = ms(positive("total_timeout_ms", v)?);
        }
        if let Some(v) = raw.max_response_bytes {
            config.max_response_bytes = usize::try_from(positive("max_response_bytes", v)?).unwrap_or(usize::MAX);
        }
        if let Some(v) = raw.max_event_bytes {
            config.max_event_bytes = usize::try_from(positive("max_event_bytes", v)?).unwrap_or(usize::MAX);
        }
        if let Some(v) = raw.max_tool_calls {
            config.max_tool_calls = usize::try_from(positive("max_tool_calls", v)?).unwrap_or(usize::MAX);
        }
        if let Some(v) = raw.connect_timeout_ms {
            config.timeouts.connect = ms(v);
        }
        if let Some(v) = raw.first_byte_timeout_ms {
            config.timeouts.first_byte = ms(v);
        }
        if let Some(v) = raw.idle_timeout_ms {
            config.timeouts.idle = ms(v);
        }
        if let Some(v) = raw.initial_backoff_ms {
            config.retry.initial_backoff = ms(v);
        }
        if let Some(v) = raw.max_backoff_ms {
            config.retry.max_backoff = ms(v);
        }
        if let Some(v) = raw.max_output_tokens {
            config.default_max_output_tokens = v;
        }
        config.reasoning_effort = raw.reasoning_effort.or(config.reasoning_effort);
        config.thinking_budget_tokens = raw.thinking_budget_tokens.or(config.thinking_budget_tokens);
        if let Some(v) = raw.encrypted_reasoning {
            config.encrypted_reasoning = v;
        }
        if let Some(v) = raw.context_window {
            let v = positive("context_window", u64::from(v))?;
            if v < 1024 {
                return Err(ConfigError::Invalid {
                    name: name.to_owned(),
                    reason: format!("`context_window` = {v} is below 1024 tokens; no agent prompt fits in that"),
                });
            }
            config.context_window = Some(u32::try_from(v).unwrap_or(u32::MAX));
        }
        if let Some(v) = raw.context_window_from_server {
            config.context_window_from_server = v;
        }
        config.compaction_model = raw.compaction_model.or(config.compaction_model);
        match raw.images {
            Some(true) if matches!(config.kind, ProviderKind::Scripted | ProviderKind::Local) => {
                return Err(ConfigError::Invalid {
                    name: name.to_owned(),
                    reason: "`images = true`: the scripted and embedded providers take no images; remove it".to_owned(),
                });
            }
            Some(v) => config.images = v,
            None => {}
        }
        let prices = Prices::from_written(raw.input_per_mtok, raw.output_per_mtok, raw.cached_input_per_mtok)
            .map_err(|reason| ConfigError::Invalid { name: name.to_owned(), reason })?;
        if prices.is_some() && config.kind == ProviderKind::Local {
            return Err(ConfigError::Invalid {
                name: name.to_owned(),
                reason: "the embedded model runs on this machine and costs nothing: remove `input_per_mtok`, `output_per_mtok` and `cached_input_per_mtok`".to_owned(),
            });
        }
        config.prices = prices.or(config.prices);
        Ok(config)
    }

    /// The prices of `model` as asked of this provider: nothing for the
    /// embedded model, nothing for a script unless its table says a price
    /// (a demo may), and for a remote provider the table's prices when
    /// `model` is the table's own model ([`Self::effective_model`]): a
    /// price written for one model is never put on another's tokens.
    pub fn prices_for(&self, model: &str) -> Result<Prices, Unpriced> {
        match (self.kind, self.prices) {
            (ProviderKind::Local, _) => Ok(Prices::FREE),
            (ProviderKind::Scripted, prices) => Ok(prices.unwrap_or(Prices::FREE)),
            (_, None) => Err(Unpriced::NoPrices { provider: self.name.clone(), model: model.to_owned() }),
            (_, Some(prices)) => {
                let priced = self.effective_model();
                if priced == model {
                    Ok(prices)
                } else {
                    Err(Unpriced::OtherModel { provider: self.name.clone(), model: model.to_owned(), priced })
                }
            }
        }
    }

    /// The base URL this config will call, after the environment fallback.
    pub fn effective_base_url(&self, env: &dyn Fn(&str) -> Option<String>) -> String {
        let (var, default) = match self.kind {
            ProviderKind::Anthropic => ("ANTHROPIC_BASE_URL", DEFAULT_ANTHROPIC_BASE),
            _ => ("OPENAI_BASE_URL", DEFAULT_OPENAI_BASE),
        };
        let url = self.base_url.clone().or_else(|| env(var).filter(|v| !v.trim().is_empty()));
        url.unwrap_or_else(|| default.to_owned()).trim_end_matches('/').to_owned()
    }

    /// The environment variable holding the key.
    pub fn effective_key_env(&self) -> &str {
        match (&self.api_key_env, self.kind) {
            (Some(var), _) => var,
            (None, ProviderKind::Anthropic) => "ANTHROPIC_API_KEY",
            (None, _) => "OPENAI_API_KEY",
        }
    }

    /// The model this config will ask for.
    pub fn effective_model(&self) -> String {
        if let Some(model) = &self.model {
            return model.clone();
        }
        match self.kind {
            ProviderKind::OpenAiChat | ProviderKind::OpenAiResponses => "gpt-5-mini".to_owned(),
            ProviderKind::Anthropic => "claude-sonnet-4-5".to_owned(),
            ProviderKind::Scripted => "script".to_owned(),
            ProviderKind::Local => "local".to_owned(),
        }
    }
}

/// One `[providers.NAME]` table of cairn's config file, as written. Hosts
/// that parse the config file with their own TOML (or other serde) crate
/// can deserialize a `BTreeMap<String, ProviderTable>` and hand each entry
/// to [`ProviderConfig::from_table`]. Unknown keys are refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderTable {
    /// `openai-chat` (alias `openai`), `openai-responses`, `anthropic`,
    /// `scripted` or `local`; may be left out for a built-in name.
    pub kind: Option<ProviderKind>,
    /// Base URL (e.g. `http://127.0.0.1:11434/v1` for Ollama).
    pub base_url: Option<String>,
    /// Model name.
    pub model: Option<String>,
    /// Name of the environment variable holding the key.
    pub api_key_env: Option<String>,
    /// Script file (scripted provider).
    pub script: Option<PathBuf>,
    /// Total attempts per call (at least 1).
    pub max_attempts: Option<u32>,
    /// Connect timeout in milliseconds.
    pub connect_timeout_ms: Option<u64>,
    /// First-byte timeout in milliseconds.
    pub first_byte_timeout_ms: Option<u64>,
    /// Idle-stream timeout in milliseconds (time without content).
    pub idle_timeout_ms: Option<u64>,
    /// Total time limit of one call, all attempts included, in milliseconds.
    pub total_timeout_ms: Option<u64>,
    /// First retry backoff in milliseconds.
    pub initial_backoff_ms: Option<u64>,
    /// Backoff cap in milliseconds.
    pub max_backoff_ms: Option<u64>,
    /// Output token bound when the turn sets none.
    pub max_output_tokens: Option<u32>,
    /// Content bytes one attempt may stream (text, reasoning, tool calls).
    pub max_response_bytes: Option<u64>,
    /// The largest server-sent event in bytes.
    pub max_event_bytes: Option<u64>,
    /// Tool calls of one answer the turn runs (the rest are rejected).
    pub max_tool_calls: Option<u64>,
    /// Reasoning effort (`low`, `medium`, `high`, …).
    pub reasoning_effort: Option<String>,
    /// Anthropic thinking budget in tokens.
    pub thinking_budget_tokens: Option<u32>,
    /// Responses: request encrypted reasoning (default true).
    pub encrypted_reasoning: Option<bool>,
    /// The model's context window in tokens.
    pub context_window: Option<u32>,
    /// Ask the server's `/models` for the context window.
    pub context_window_from_server: Option<bool>,
    /// A cheaper model that writes compaction summaries.
    pub compaction_model: Option<String>,
    /// The model takes images in prompts (default: true for HTTP APIs).
    pub images: Option<bool>,
    /// US dollars per million input tokens of the table's model.
    pub input_per_mtok: Option<UsdPerMtok>,
    /// US dollars per million output tokens of the table's model.
    pub output_per_mtok: Option<UsdPerMtok>,
    /// US dollars per million cached input tokens (default: the input price).
    pub cached_input_per_mtok: Option<UsdPerMtok>,
}

/// Why a provider could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// No built-in and no config table of that name.
    #[error(
        "unknown provider `{name}`: use one of openai, openai-responses, anthropic, scripted, local, or add a [providers.{name}] table to the config file"
    )]
    UnknownProvider {
        /// The name asked for.
        name: String,
    },
    /// A config table is malformed.
    #[error("invalid [providers.{name}] table: {reason}")]
    Invalid {
        /// The provider name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The key's environment variable is not set.
    #[error("provider `{name}` needs an API key: set the environment variable {var}")]
    MissingKey {
        /// The provider name.
        name: String,
        /// The variable to set.
        var: String,
    },
    /// The scripted provider has no script.
    #[error("provider `{name}` replays a script: set `script = \"path/to/turns.jsonl\"` in [providers.{name}]")]
    MissingScript {
        /// The provider name.
        name: String,
    },
    /// The script file could not be read or has a malformed line.
    #[error("script {path}: {reason}")]
    Script {
        /// The script file.
        path: PathBuf,
        /// What is wrong (line number included).
        reason: String,
    },
    /// `local` is built by the host from `cairn-local`, not here.
    #[error("provider `{name}` is the embedded local model: the host builds it with cairn-local, not cairn-provider")]
    LocalModel {
        /// The provider name.
        name: String,
    },
    /// The HTTP client could not be set up.
    #[error("provider `{name}`: cannot set up the HTTP client: {reason}")]
    Client {
        /// The provider name.
        name: String,
        /// What failed.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn builtins_and_unknown_names() {
        for name in BUILTIN_NAMES {
            assert!(ProviderConfig::builtin(name).is_some(), "{name}");
        }
        let err = ProviderConfig::resolve("gpt", None).unwrap_err();
        assert!(err.to_string().contains("[providers.gpt]"), "{err}");
    }

    #[test]
    fn table_for_a_custom_server() {
        let table: toml::Value = toml::from_str(
            r#"kind = "openai-chat"
base_url = "http://127.0.0.1:11434/v1/"
model = "qwen3:8b"
max_attempts = 2
idle_timeout_ms = 1500"#,
        )
        .unwrap();
        let c = ProviderConfig::from_toml("ollama", &table).unwrap();
        assert_eq!(c.kind, ProviderKind::OpenAiChat);
        assert_eq!(c.retry.max_attempts, 2);
        assert_eq!(c.timeouts.idle, Duration::from_millis(1500));
        assert_eq!(c.effective_base_url(&no_env), "http://127.0.0.1:11434/v1");
        assert_eq!(c.effective_model(), "qwen3:8b");
    }

    #[test]
    fn limits_are_configurable_and_zero_is_refused() {
        let table: toml::Value = toml::from_str(
            "kind = \"anthropic\"\ntotal_timeout_ms = 2500\nmax_response_bytes = 4096\nmax_event_bytes = 2048\nmax_tool_calls = 3",
        )
        .unwrap();
        let c = ProviderConfig::from_toml("a", &table).unwrap();
        assert_eq!(c.timeouts.total, Duration::from_millis(2500));
        assert_eq!((c.max_response_bytes, c.max_event_bytes, c.max_tool_calls), (4096, 2048, 3));
        let defaults = ProviderConfig::new("d", ProviderKind::OpenAiChat);
        assert_eq!(defaults.timeouts.total, Duration::from_secs(600));
        assert_eq!(defaults.max_response_bytes, 8 << 20);
        assert_eq!(defaults.max_tool_calls, cairn_core::provider::DEFAULT_MAX_TOOL_CALLS);
        for key in ["total_timeout_ms", "max_response_bytes", "max_event_bytes", "max_tool_calls"] {
            let table: toml::Value = toml::from_str(&format!("kind = \"anthropic\"\n{key} = 0")).unwrap();
            let err = ProviderConfig::from_toml("a", &table).unwrap_err();
            assert!(err.to_string().contains(&format!("`{key}` must be at least 1")), "{err}");
        }
    }

    #[test]
    fn tables_deserialize_with_any_serde_format() {
        let tables: std::collections::BTreeMap<String, ProviderTable> = serde_json::from_str(
            r#"{"lmstudio": {"kind": "openai", "base_url": "http://127.0.0.1:1234/v1", "model": "qwen"},
                "scripted": {"script": "demo.jsonl"}}"#,
        )
        .unwrap();
        let lm = ProviderConfig::from_table("lmstudio", tables["lmstudio"].clone()).unwrap();
        assert_eq!((lm.kind, lm.effective_model()), (ProviderKind::OpenAiChat, "qwen".to_owned()));
        let s = ProviderConfig::from_table("scripted", tables["scripted"].clone()).unwrap();
        assert_eq!(s.script.as_deref(), Some(std::path::Path::new("demo.jsonl")));
        let bad = ProviderConfig::from_table("x", ProviderTable { max_attempts: Some(0), ..Default::default() });
        assert!(bad.is_err());
    }

    #[test]
    fn table_errors_are_clear() {
        let table: toml::Value = toml::from_str("model = \"m\"").unwrap();
        let err = ProviderConfig::from_toml("mine", &table).unwrap_err();
        assert!(err.to_string().contains("missing `kind`"), "{err}");
        let table: toml::Value = toml::from_str("kind = \"anthropic\"\napi_key = \"sk-x\"").unwrap();
        let err = ProviderConfig::from_toml("mine", &table).unwrap_err();
        assert!(err.to_string().contains("api_key"), "{err}");
        // A builtin name may be adjusted without a kind.
        let table: toml::Value = toml::from_str("model = \"claude-opus-4-1\"").unwrap();
        let c = ProviderConfig::from_toml("anthropic", &table).unwrap();
        assert_eq!(c.kind, ProviderKind::Anthropic);
    }

    #[test]
    fn env_conventions() {
        let env = |k: &str| match k {
            "OPENAI_BASE_URL" => Some("http://localhost:8080/v1".to_owned()),
            "ANTHROPIC_API_KEY" => Some("sk-ant-secret-value".to_owned()),
            _ => None,
        };
        let openai = ProviderConfig::builtin("openai").unwrap();
        assert_eq!(openai.effective_base_url(&env), "http://localhost:8080/v1");
        assert_eq!(openai.effective_base_url(&no_env), DEFAULT_OPENAI_BASE);
        let anthropic = ProviderConfig::builtin("anthropic").unwrap();
        assert_eq!(anthropic.effective_base_url(&env), DEFAULT_ANTHROPIC_BASE);
    }

    #[test]
    fn prices_are_read_checked_and_put_only_on_their_model() {
        let table: toml::Value = toml::from_str(
            "model = \"gpt-x\"\ninput_per_mtok = 1.25\noutput_per_mtok = 10\ncached_input_per_mtok = 0.125",
        )
        .unwrap();
        let c = ProviderConfig::from_toml("openai", &table).unwrap();
        let prices = Prices { input: 1_250_000, cached_input: 125_000, output: 10_000_000 };
        assert_eq!(c.prices_for("gpt-x"), Ok(prices));
        let other = c.prices_for("gpt-y").unwrap_err();
        assert!(other.to_string().contains("are for its model gpt-x"), "{other}");
        let unset = ProviderConfig::builtin("anthropic").unwrap().prices_for("claude-sonnet-4-5").unwrap_err();
        assert!(unset.to_string().contains("set input_per_mtok and output_per_mtok"), "{unset}");
        // Without a `model` key the prices are the default model's.
        let table: toml::Value = toml::from_str("input_per_mtok = 3\noutput_per_mtok = 15").unwrap();
        let c = ProviderConfig::from_toml("anthropic", &table).unwrap();
        assert!(c.prices_for(&c.effective_model()).is_ok());
        // The embedded model costs nothing and takes no price; a script is
        // free unless its table prices it.
        assert_eq!(ProviderConfig::builtin("local").unwrap().prices_for("any"), Ok(Prices::FREE));
        assert_eq!(ProviderConfig::builtin("scripted").unwrap().prices_for("script"), Ok(Prices::FREE));
        let table: toml::Value = toml::from_str("input_per_mtok = 1\noutput_per_mtok = 2").unwrap();
        let err = ProviderConfig::from_toml("local", &table).unwrap_err();
        assert!(err.to_string().contains("costs nothing"), "{err}");
        // A bad value is refused with its key, NaN and negatives included.
        for (written, key) in [
            ("input_per_mtok = -3\noutput_per_mtok = 15", "input_per_mtok"),
            ("input_per_mtok = 3\noutput_per_mtok = nan", "output_per_mtok"),
            ("input_per_mtok = 3\noutput_per_mtok = 15000000", "output_per_mtok"),
            ("input_per_mtok = 3", "output_per_mtok"),
        ] {
            let table: toml::Value = toml::from_str(&format!("kind = \"anthropic\"\n{written}")).unwrap();
            let err = ProviderConfig::from_toml("work", &table).unwrap_err().to_string();
            assert!(err.contains("[providers.work]") && err.contains(&format!("`{key}`")), "{err}");
        }
        let table: toml::Value = toml::from_str("kind = \"anthropic\"\ninput_per_mtok = \"3\"").unwrap();
        assert!(ProviderConfig::from_toml("work", &table).is_err(), "a price is a number");
    }

    #[test]
    fn key_value_never_appears_in_debug_output() {
        let c = ProviderConfig::builtin("openai").unwrap();
        assert!(!format!("{c:?}").contains("topsecret"));
    }
}
