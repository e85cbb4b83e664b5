//! [`build`]: turn a resolved [`ProviderConfig`] into a ready [`Provider`].
//!
//! This module sits above `config` (what to build), `http` and
//! `script_file` (the providers), so none of them needs to know the others.
//! It owns the key rules (when a key is required, where it is read from);
//! it must not parse configuration (that is `config`) and must never put a
//! key's value into an error.

use std::path::PathBuf;

use cairn_core::provider::Provider;

use crate::config::{ConfigError, DEFAULT_ANTHROPIC_BASE, DEFAULT_OPENAI_BASE, ProviderConfig, ProviderKind};
use crate::http::HttpProvider;
use crate::script_file::ScriptFileProvider;
use crate::secret::Secret;

/// Build the provider `config` describes. `env` looks up environment
/// variables (pass `&|k| std::env::var(k).ok()` in a host).
///
/// A key is required when `api_key_env` is set explicitly, or when the base
/// URL is the public OpenAI / Anthropic endpoint; a local server (Ollama,
/// llama.cpp) at a custom base URL may run without one. `Local` returns
/// [`ConfigError::LocalModel`]: the host builds it from `cairn-local`.
pub fn build(
    config: &ProviderConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Box<dyn Provider + Send>, ConfigError> {
    match config.kind {
        ProviderKind::Local => Err(ConfigError::LocalModel { name: config.name.clone() }),
        ProviderKind::Scripted => {
            let path = config
                .script
                .clone()
                .or_else(|| env("CAIRN_SCRIPT").map(PathBuf::from))
                .ok_or_else(|| ConfigError::MissingScript { name: config.name.clone() })?;
            let provider = ScriptFileProvider::from_file(&config.name, &path)?
                .with_max_tool_calls(config.max_tool_calls)
                .with_context_window(config.context_window);
            Ok(Box::new(provider))
        }
        ProviderKind::OpenAiChat | ProviderKind::OpenAiResponses | ProviderKind::Anthropic => {
            let base_url = config.effective_base_url(env);
            let var = config.effective_key_env();
            let key = env(var).filter(|k| !k.trim().is_empty()).map(|k| Secret::new(k.trim()));
            let public = base_url.starts_with(DEFAULT_OPENAI_BASE) || base_url.starts_with(DEFAULT_ANTHROPIC_BASE);
            if key.is_none() && (config.api_key_env.is_some() || public) {
                return Err(ConfigError::MissingKey { name: config.name.clone(), var: var.to_owned() });
            }
            Ok(Box::new(HttpProvider::new(config, base_url, key)?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn a_local_server_needs_no_key_and_limits_reach_the_provider() {
        let mut c = ProviderConfig::new("ollama", ProviderKind::OpenAiChat);
        c.base_url = Some("http://127.0.0.1:11434/v1/".into());
        c.model = Some("qwen3:8b".into());
        c.max_tool_calls = 7;
        let p = build(&c, &no_env).unwrap();
        assert_eq!((p.name(), p.model(), p.max_tool_calls()), ("ollama", "qwen3:8b", 7));
    }

    #[test]
    fn env_supplies_the_key() {
        let env = |k: &str| (k == "ANTHROPIC_API_KEY").then(|| "sk-ant-secret-value".to_owned());
        let p = build(&ProviderConfig::builtin("anthropic").unwrap(), &env).unwrap();
        assert_eq!(p.name(), "anthropic");
    }

    #[test]
    fn missing_key_names_the_variable() {
        let openai = ProviderConfig::builtin("openai").unwrap();
        let err = build(&openai, &no_env).err().unwrap();
        assert_eq!(err, ConfigError::MissingKey { name: "openai".into(), var: "OPENAI_API_KEY".into() });
        assert!(err.to_string().contains("set the environment variable OPENAI_API_KEY"));
        let mut custom = ProviderConfig::new("corp", ProviderKind::OpenAiResponses);
        custom.base_url = Some("http://127.0.0.1:9/v1".into());
        custom.api_key_env = Some("CORP_LLM_KEY".into());
        let err = build(&custom, &no_env).err().unwrap();
        assert!(err.to_string().contains("CORP_LLM_KEY"), "{err}");
    }

    #[test]
    fn local_and_scripted_need_the_host() {
        let err = build(&ProviderConfig::builtin("local").unwrap(), &no_env).err().unwrap();
        assert!(matches!(err, ConfigError::LocalModel { .. }));
        let err = build(&ProviderConfig::builtin("scripted").unwrap(), &no_env).err().unwrap();
        assert!(err.to_string().contains("script = "), "{err}");
    }
}
