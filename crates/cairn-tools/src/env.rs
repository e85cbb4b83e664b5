//! Environment scrubbing for every process cairn starts for a tool.
//!
//! This module owns the rule "a tool never sees a secret": any variable whose
//! name looks like a key, token, secret, password or credential, and every
//! known provider variable, is dropped. It does not add variables beyond what
//! the caller asks (e.g. `TMPDIR`).

/// Name fragments (upper-cased) that mark a variable as secret.
const SECRET_FRAGMENTS: &[&str] = &[
    "KEY",
    "TOKEN",
    "SECRET",
    "PASSW",
    "PASSPHRASE",
    "CREDENTIAL",
    "AUTH",
    "PRIVATE",
    "COOKIE",
    "SESSION",
    "CERT",
    "SIGNATURE",
];

/// Prefixes of provider and cloud variables, dropped whatever follows.
const PROVIDER_PREFIXES: &[&str] = &[
    "OPENAI_",
    "ANTHROPIC_",
    "AZURE_",
    "AWS_",
    "GOOGLE_",
    "GEMINI_",
    "GCP_",
    "MISTRAL_",
    "GROQ_",
    "COHERE_",
    "DEEPSEEK_",
    "XAI_",
    "OPENROUTER_",
    "TOGETHER_",
    "HF_",
    "HUGGING",
    "OLLAMA_",
    "CAIRN_PROVIDER",
    "GITHUB_",
    "GH_",
    "GITLAB_",
    "NPM_",
    "CARGO_REGISTRY",
    "DOCKER_",
];

/// Whether a variable of this name must not reach a tool.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_FRAGMENTS.iter().any(|f| upper.contains(f)) || PROVIDER_PREFIXES.iter().any(|p| upper.starts_with(p))
}

/// The current environment minus every secret-looking variable.
pub fn scrubbed_env() -> Vec<(String, String)> {
    std::env::vars().filter(|(k, _)| !is_secret_name(k)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_are_recognised() {
        for name in [
            "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY",
            "GITHUB_TOKEN",
            "db_password",
            "MY_SECRET",
            "AWS_ACCESS_KEY_ID",
            "SSH_AUTH_SOCK",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "OPENAI_BASE_URL",
        ] {
            assert!(is_secret_name(name), "{name} should be scrubbed");
        }
        for name in ["PATH", "HOME", "LANG", "TERM", "USER", "TMPDIR"] {
            assert!(!is_secret_name(name), "{name} should be kept");
        }
    }
}
