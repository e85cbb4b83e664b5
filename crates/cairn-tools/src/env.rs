//! Environment scrubbing for every process cairn starts for a tool.
//!
//! This module owns the rule "a tool never sees a secret": any variable whose
//! name looks like a key, token, secret, password or credential, every known
//! provider variable, and every variable whose value equals or contains a
//! secret the host holds ([`SecretValues`], whatever the variable's name) is
//! dropped, and so is every one of cairn's own settings (`CAIRN_*`: where
//! its home, configuration and trust records are). It does not add
//! variables beyond what the caller asks (e.g. `TMPDIR`,
//! `CAIRN_HOOK_EVENT`).
//!
//! It also gives hosts [`take_from_own_environment`], which removes
//! variables from the host's own environment *and* overwrites their bytes
//! in the block the kernel shows as `/proc/PID/environ` (removing a variable
//! with `unsetenv` alone leaves it readable there). `cairn-cli` calls it
//! first thing in `main` for its provider keys.

use std::collections::BTreeSet;

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

/// The fragments of [`SECRET_FRAGMENTS`] that name a value which is itself a
/// secret (as opposed to `AUTH`, `SESSION`, `CERT`, `SIGNATURE`, which also
/// name sockets, paths and session types a host may still need).
const CREDENTIAL_FRAGMENTS: &[&str] =
    &["KEY", "TOKEN", "SECRET", "PASSW", "PASSPHRASE", "CREDENTIAL", "PRIVATE", "COOKIE"];

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

/// Whether a variable of this name holds a credential itself (`*KEY*`,
/// `*TOKEN*`, `*SECRET*`, `*PASSW*`, …): what a host removes from its own
/// environment at startup. Narrower than [`is_secret_name`], which also drops
/// sockets, certificate paths and provider settings from tools.
pub fn is_credential_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    CREDENTIAL_FRAGMENTS.iter().any(|f| upper.contains(f))
}

/// Secret values the host holds (provider keys and the like). A tool's
/// environment loses every variable whose value equals one of them, or
/// contains one of at least [`SecretValues::MIN_CONTAINED_LEN`] bytes,
/// whatever the variable is called. `Debug` never prints the values.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretValues(BTreeSet<String>);

impl SecretValues {
    /// Shorter secrets only match a whole value: a one- or two-character
    /// "key" (a dummy for a local server) would otherwise remove every
    /// variable containing that letter, `PATH` included.
    pub const MIN_CONTAINED_LEN: usize = 8;

    /// No secrets.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a secret; surrounding whitespace is ignored (providers trim keys)
    /// and an empty value is not a secret.
    pub fn insert(&mut self, value: &str) {
        let value = value.trim();
        if !value.is_empty() {
            self.0.insert(value.to_owned());
        }
    }

    /// How many secrets are held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `text` with every secret in it replaced by `***` (a short one only
    /// when it is the whole text), for text that leaves cairn (telemetry).
    pub fn redact(&self, text: &str) -> String {
        if self.0.iter().any(|s| text.trim() == s) {
            return "***".to_owned();
        }
        let mut out = text.to_owned();
        for s in self.0.iter().filter(|s| s.len() >= Self::MIN_CONTAINED_LEN) {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), "***");
            }
        }
        out
    }

    /// Whether `value` equals a secret or contains one (long enough to
    /// match inside a value).
    pub fn matches(&self, value: &str) -> bool {
        let trimmed = value.trim();
        self.0.iter().any(|s| trimmed == s || (s.len() >= Self::MIN_CONTAINED_LEN && value.contains(s.as_str())))
    }
}

impl std::fmt::Debug for SecretValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretValues([{} redacted])", self.0.len())
    }
}

impl FromIterator<String> for SecretValues {
    fn from_iter<I: IntoIterator<Item = String>>(iter: I) -> Self {
        let mut s = Self::new();
        for v in iter {
            s.insert(&v);
        }
        s
    }
}

/// Whether a variable of this name is one of cairn's own settings
/// (`CAIRN_HOME`, `CAIRN_CONFIG`, its test and tuning knobs): they say
/// where cairn keeps its configuration, trust records and sessions, which
/// are none of a tool's business (a tool that knows `$CAIRN_HOME` knows
/// where to plant a configuration). Case-insensitive, like the secret
/// names.
pub fn is_cairn_own(name: &str) -> bool {
    name.get(..6).is_some_and(|p| p.eq_ignore_ascii_case("CAIRN_"))
}

/// Whether the variable `name=value` may reach a tool.
pub fn may_pass(name: &str, value: &str, secrets: &SecretValues) -> bool {
    !is_secret_name(name) && !is_cairn_own(name) && !secrets.matches(value)
}

/// The current environment minus every secret-looking variable and every
/// variable carrying one of `secrets`. Variables that are not valid UTF-8
/// are dropped too (they cannot be checked as text).
pub fn scrubbed_env(secrets: &SecretValues) -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, v)| may_pass(k, v, secrets))
        .collect()
}

/// Give a tool's process the W3C `TRACEPARENT` of its call's
/// `execute_tool` span when cairn exports telemetry (so the tool's own
/// telemetry joins the trace), replacing one inherited from cairn's
/// environment; nothing when telemetry is off.
pub fn add_traceparent(env: &mut Vec<(String, String)>, request: &cairn_core::tool::ToolRequest) {
    if let Some(tp) = cairn_telemetry::call_traceparent(&request.session_id, &request.invocation_id) {
        env.retain(|(k, _)| k != "TRACEPARENT");
        env.push(("TRACEPARENT".to_owned(), tp));
    }
}

/// Remove from the calling process's environment every variable for which
/// `take(name, value)` says so, and return them. Each removed `NAME=value`
/// string is overwritten with NUL bytes where it lies, so neither `environ`
/// nor `/proc/self/environ` (the kernel's view of the block the process
/// started with) still holds it. Variables that are not valid UTF-8 are
/// offered to `take` lossily converted.
///
/// # Safety
/// Call only while the process has a single thread (first thing in `main`):
/// it changes the environment and writes to the memory `environ` points to,
/// which no other thread may be reading.
pub unsafe fn take_from_own_environment(take: &dyn Fn(&str, &str) -> bool) -> Vec<(String, String)> {
    unsafe extern "C" {
        static mut environ: *const *mut libc::c_char;
    }
    let mut taken = Vec::new();
    let mut entries: Vec<(*mut libc::c_char, usize)> = Vec::new();
    // SAFETY: single-threaded per the contract; `environ` is the C
    // library's NULL-terminated array of NUL-terminated strings.
    unsafe {
        let mut p = environ;
        while !p.is_null() && !(*p).is_null() {
            let entry = *p;
            let len = libc::strlen(entry);
            let bytes = std::slice::from_raw_parts(entry as *const u8, len);
            if let Some(eq) = bytes.iter().position(|&b| b == b'=').filter(|&eq| eq > 0) {
                let name = String::from_utf8_lossy(&bytes[..eq]).into_owned();
                let value = String::from_utf8_lossy(&bytes[eq + 1..]).into_owned();
                if take(&name, &value) {
                    entries.push((entry, len));
                    taken.push((name, value));
                }
            }
            p = p.add(1);
        }
        let mut names: Vec<&str> = taken.iter().map(|(n, _)| n.as_str()).collect();
        names.dedup();
        for name in names {
            // SAFETY: single-threaded per the contract.
            std::env::remove_var(name);
        }
        // The strings are no longer referenced by `environ`; wipe them.
        for (entry, len) in entries {
            for i in 0..len {
                std::ptr::write_volatile(entry.add(i), 0);
            }
        }
    }
    taken
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
        for name in ["PATH", "HOME", "LANG", "TERM", "USER", "TMPDIR", "LLM_PAT"] {
            assert!(!is_secret_name(name), "{name} should be kept");
            assert!(!is_cairn_own(name), "{name} is not cairn's");
        }
        for name in ["CAIRN_HOME", "cairn_config", "CAIRN_CTRL_C_WINDOW_MS"] {
            assert!(is_cairn_own(name) && !may_pass(name, "/x", &SecretValues::new()), "{name} is cairn's own");
        }
        for name in ["OPENAI_API_KEY", "github_token", "DB_PASSWD", "X_PRIVATE", "MY_COOKIE_JAR"] {
            assert!(is_credential_name(name), "{name} is a credential");
        }
        for name in ["SSH_AUTH_SOCK", "SSL_CERT_FILE", "XDG_SESSION_TYPE", "OPENAI_BASE_URL", "LLM_PAT"] {
            assert!(!is_credential_name(name), "{name} is not a credential by its name");
        }
    }

    #[test]
    fn values_carrying_a_secret_are_dropped_whatever_the_name() {
        let secrets: SecretValues =
            ["  sk-odd-name-0123456789\n".to_owned(), "x".to_owned(), "".to_owned()].into_iter().collect();
        assert_eq!(secrets.len(), 2, "trimmed, empty dropped");
        assert!(format!("{secrets:?}").contains("redacted") && !format!("{secrets:?}").contains("sk-odd"));
        for (name, value) in [
            ("LLM_PAT", "sk-odd-name-0123456789"),
            ("FOO", " sk-odd-name-0123456789 "),
            ("URL", "https://user:sk-odd-name-0123456789@host/"),
            ("HEADER", "Bearer sk-odd-name-0123456789"),
            ("SHORT", "x"),
        ] {
            assert!(!may_pass(name, value, &secrets), "{name}={value} must be dropped");
        }
        // A short secret only matches whole values: PATH stays.
        for (name, value) in [("PATH", "/usr/bin:/bin:/opt/xbin"), ("LANG", "C.UTF-8"), ("HALF", "sk-odd-name")] {
            assert!(may_pass(name, value, &secrets), "{name}={value} must pass");
        }
    }
}
