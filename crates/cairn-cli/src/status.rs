//! What a session has used so far, for the status line after each turn
//! (`render.rs`) and chat's `/status` (`host.rs`): tokens of every provider
//! attempt in the session's usage ledger, how full the model's context
//! window was at the last attempt, and what it cost.
//!
//! Cost is said only where cairn knows it: the embedded model and the
//! scripted provider cost nothing; for a remote provider cairn has no price
//! table (prices change, and a wrong figure is worse than none), so the
//! cost is "unknown" and the tokens are what to price. It reads the ledger;
//! it must not write anywhere.

use cairn_core::provider::AttemptUsage;
use cairn_core::storage::Storage;

/// A session's usage so far.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SessionUsage {
    /// Input tokens over every attempt.
    pub input: u64,
    /// Output tokens over every attempt.
    pub output: u64,
    /// Cached input tokens over every attempt.
    pub cached: u64,
    /// Provider attempts recorded.
    pub attempts: usize,
    /// Input tokens of the last attempt that reported any (how full the
    /// context was).
    pub last_input: u64,
}

impl SessionUsage {
    /// Sum the usage ledger of `store` (every lane, compactions included).
    pub fn of(store: &impl Storage) -> Self {
        let mut usage = Self::default();
        for row in store.usage() {
            if let Ok(u) = serde_json::from_str::<AttemptUsage>(row.usage.get()) {
                usage.input += u.input_tokens;
                usage.output += u.output_tokens;
                usage.cached += u.cached_input_tokens;
                usage.attempts += 1;
                if u.input_tokens > 0 {
                    usage.last_input = u.input_tokens;
                }
            }
        }
        usage
    }

    /// Input and output tokens together.
    pub fn total(&self) -> u64 {
        self.input + self.output
    }
}

/// What the session cost, as far as cairn knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cost {
    /// Nothing: the model runs here, or is a script.
    Free,
    /// No price table for this provider.
    Unknown,
}

impl Cost {
    /// The cost of the provider named `provider` (as `Provider::name` says).
    pub fn of_provider(provider: &str) -> Self {
        match provider {
            "local" | "scripted" => Cost::Free,
            _ => Cost::Unknown,
        }
    }

    /// Short form, for the status line.
    pub fn short(self) -> &'static str {
        match self {
            Cost::Free => "$0",
            Cost::Unknown => "cost unknown",
        }
    }
}

/// `n` with thousands separators.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// "N% of Wk" for `used` tokens of a `window`, when both are known.
pub fn context_share(used: u64, window: Option<u32>) -> Option<String> {
    let window = window.filter(|w| *w > 0)?;
    (used > 0).then(|| {
        let percent = (used * 100).div_ceil(u64::from(window)).min(100);
        let w = if window >= 1000 { format!("{}k", window / 1000) } else { window.to_string() };
        format!("{percent}% of {w}")
    })
}

/// The facts `/status` shows.
#[derive(Debug, Clone)]
pub struct Report<'a> {
    /// The session id.
    pub session: &'a str,
    /// The lane the chat is on.
    pub lane: &'a str,
    /// The provider's name.
    pub provider: &'a str,
    /// The model.
    pub model: &'a str,
    /// The model's context window, when known.
    pub window: Option<u32>,
    /// The ledger's sums.
    pub usage: &'a SessionUsage,
    /// Tools the next turn is offered.
    pub tools: usize,
}

impl Report<'_> {
    /// `/status`'s text.
    pub fn text(&self) -> String {
        let u = self.usage;
        let context = match (self.window, u.last_input) {
            (Some(w), used) if w > 0 && used > 0 => format!(
                "context {}% used: {} of {} tokens (at the last call)",
                (used * 100).div_ceil(u64::from(w)).min(100),
                thousands(used),
                thousands(u64::from(w))
            ),
            (Some(w), _) if w > 0 => format!("context window {} tokens; nothing sent yet", thousands(u64::from(w))),
            _ => "context window unknown (set context_window in [providers.NAME])".to_owned(),
        };
        let cached = if u.cached > 0 { format!(", {} cached", thousands(u.cached)) } else { String::new() };
        let cost = match Cost::of_provider(self.provider) {
            Cost::Free => format!("cost $0 ({} provider)", self.provider),
            Cost::Unknown => {
                format!("cost unknown: cairn has no price table for {}; price the tokens above", self.provider)
            }
        };
        format!(
            "session {}\nlane {}\nprovider {} · model {}\n{context}\ntokens {} in / {} out{cached} over {} provider attempt{}\n{cost}\n{} tools offered",
            self.session,
            self.lane,
            self.provider,
            self.model,
            thousands(u.input),
            thousands(u.output),
            u.attempts,
            if u.attempts == 1 { "" } else { "s" },
            self.tools,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_as_people_write_them() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(context_share(1, Some(128_000)).as_deref(), Some("1% of 128k"));
        assert_eq!(context_share(64_000, Some(128_000)).as_deref(), Some("50% of 128k"));
        assert_eq!(context_share(500, None), None);
        assert_eq!(Cost::of_provider("local"), Cost::Free);
        assert_eq!(Cost::of_provider("openai"), Cost::Unknown);
    }

    #[test]
    fn the_report_names_every_fact() {
        let usage = SessionUsage { input: 12_345, output: 678, cached: 0, attempts: 3, last_input: 4_000 };
        let text = Report {
            session: "s1",
            lane: "main",
            provider: "openai",
            model: "gpt-x",
            window: Some(8_000),
            usage: &usage,
            tools: 6,
        }
        .text();
        for part in [
            "session s1",
            "lane main",
            "provider openai · model gpt-x",
            "context 50% used: 4,000 of 8,000 tokens",
            "tokens 12,345 in / 678 out over 3 provider attempts",
            "cost unknown",
            "6 tools offered",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
    }
}
