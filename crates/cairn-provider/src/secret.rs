//! A secret string (an API key) that never shows itself.
//!
//! This module owns the only place where a key's bytes are readable
//! ([`Secret::expose`], used to build one request header). It must not
//! implement `Display`, `Serialize` or a revealing `Debug`: every other path
//! (errors, logs, `{:?}` of a config or provider) sees `[redacted]`.

use std::fmt;

/// An API key or other credential. `Debug` prints `Secret([redacted])`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wrap a credential.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The raw value, for building a request header and nothing else.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Replace every occurrence of the secret in `text` (e.g. a provider's
    /// error body that echoes the key back) with `[redacted]`.
    pub fn scrub(&self, text: &str) -> String {
        // Short values would redact innocent text and are not real keys.
        if self.0.len() < 6 {
            return text.to_owned();
        }
        text.replace(&self.0, "[redacted]")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_value() {
        let s = Secret::new("sk-very-secret-123");
        assert_eq!(format!("{s:?}"), "Secret([redacted])");
        assert!(!format!("{:#?}", Some(&s)).contains("very-secret"));
    }

    #[test]
    fn scrub_removes_every_occurrence() {
        let s = Secret::new("sk-very-secret-123");
        let out = s.scrub("bad key sk-very-secret-123 (sk-very-secret-123)");
        assert_eq!(out, "bad key [redacted] ([redacted])");
    }
}
