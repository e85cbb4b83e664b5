//! What a session has used so far, for the status line after each turn
//! (`render.rs`) and chat's `/status` (`turns.rs`): tokens of every provider
//! attempt in the session's usage ledger, how full the model's context
//! window was at the last attempt, and what it cost.
//!
//! Cost is said only where cairn knows it: each attempt is priced by the
//! provider and model its ledger row names, at the prices the user wrote in
//! that `[providers.NAME]` table (`cairn_provider::price`); the embedded
//! model and scripts cost nothing. cairn keeps no price table of its own
//! (prices change, and a wrong figure is worse than none), so tokens with
//! no price are counted apart and said to be unpriced, with how to price
//! them. It reads the ledger; it must not write anywhere.

use cairn_core::report::UsageTotals;
use cairn_core::storage::Storage;
use cairn_provider::{Prices, Unpriced, Usd};

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
    /// What the attempts with a known price cost.
    pub cost: Usd,
    /// Attempts with a known price (free ones included).
    pub priced_attempts: usize,
    /// Tokens (input and output) of attempts with no known price, by why,
    /// in the order first met.
    pub unpriced: Vec<(Unpriced, u64)>,
}

impl SessionUsage {
    /// The usage ledger of `store` (every lane, compactions included,
    /// summed by `cairn_core::ledger`), each provider and model priced by
    /// `price` (its provider's name and model, as the rows record them).
    pub fn of(store: &impl Storage, price: &dyn Fn(&str, &str) -> Result<Prices, Unpriced>) -> Self {
        Self::priced(&UsageTotals::of(store), price)
    }

    /// `totals` with what they cost. Prices are linear in tokens, so one
    /// price per provider and model costs exactly what pricing each
    /// attempt would.
    fn priced(totals: &UsageTotals, price: &dyn Fn(&str, &str) -> Result<Prices, Unpriced>) -> Self {
        let mut usage = Self {
            input: totals.input,
            output: totals.output,
            cached: totals.cached,
            attempts: usize::try_from(totals.attempts).unwrap_or(usize::MAX),
            last_input: totals.last_input,
            ..Self::default()
        };
        for m in &totals.by_model {
            match price(&m.provider, &m.model) {
                Ok(prices) => {
                    usage.cost += prices.cost(m.input, m.cached, m.output);
                    usage.priced_attempts += usize::try_from(m.attempts).unwrap_or(usize::MAX);
                }
                Err(why) => {
                    let tokens = m.input + m.output;
                    match usage.unpriced.iter_mut().find(|(w, _)| *w == why) {
                        Some((_, n)) => *n += tokens,
                        None => usage.unpriced.push((why, tokens)),
                    }
                }
            }
        }
        usage
    }

    /// Input and output tokens together.
    pub fn total(&self) -> u64 {
        self.input + self.output
    }

    /// The cost in a few words, for the status line: `$0.0123`; `cost
    /// unknown` when no attempt has a price; `$0.0123 + unpriced` when some
    /// have none (`/status` says which and how to price them).
    pub fn cost_short(&self) -> String {
        if self.unpriced.is_empty() {
            self.cost.to_string()
        } else if self.priced_attempts == 0 {
            "cost unknown".to_owned()
        } else {
            format!("{} + unpriced", self.cost)
        }
    }

    /// The cost as `/status` says it: the sum, and for tokens without a
    /// price, how many and how to price them.
    pub fn cost_text(&self) -> String {
        let mut text = if self.unpriced.is_empty() {
            format!("cost {}", self.cost)
        } else if self.priced_attempts == 0 {
            "cost unknown".to_owned()
        } else {
            format!("cost {} for the priced tokens, the rest unknown", self.cost)
        };
        for (why, tokens) in &self.unpriced {
            text.push_str(&format!("\n  {} tokens unpriced: {why}", thousands(*tokens)));
        }
        text
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
        let cost = u.cost_text();
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
    use cairn_core::provider::AttemptUsage;

    #[test]
    fn figures_read_as_people_write_them() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(context_share(1, Some(128_000)).as_deref(), Some("1% of 128k"));
        assert_eq!(context_share(64_000, Some(128_000)).as_deref(), Some("50% of 128k"));
        assert_eq!(context_share(500, None), None);
    }

    fn row(provider: &str, model: &str, input: u64, cached: u64, output: u64) -> AttemptUsage {
        AttemptUsage {
            provider: provider.to_owned(),
            model: model.to_owned(),
            input_tokens: input,
            cached_input_tokens: cached,
            output_tokens: output,
            ..AttemptUsage::default()
        }
    }

    /// "openai · gpt-x" at $2 in, $0.5 cached, $8 out per million;
    /// "local" free; everything else unpriced.
    fn price(provider: &str, model: &str) -> Result<Prices, Unpriced> {
        match (provider, model) {
            ("openai", "gpt-x") => Ok(Prices { input: 2_000_000, cached_input: 500_000, output: 8_000_000 }),
            ("local", _) => Ok(Prices::FREE),
            _ => Err(Unpriced::NoPrices { provider: provider.to_owned(), model: model.to_owned() }),
        }
    }

    fn usage_of(rows: &[AttemptUsage]) -> SessionUsage {
        let mut totals = UsageTotals::default();
        for r in rows {
            totals.add(r);
        }
        SessionUsage::priced(&totals, &price)
    }

    #[test]
    fn each_attempt_is_priced_by_its_own_provider_and_model() {
        // By hand: 10,000 in (4,000 cached) and 1,000 out at $2 / $0.5 / $8
        // per million: 6,000 × 2 + 4,000 × 0.5 + 1,000 × 8 = 12,000 + 2,000
        // + 8,000 µ$ = $0.022; a second attempt of 5,000 in, 500 out:
        // 10,000 + 4,000 µ$ = $0.014. Together $0.036.
        let priced = usage_of(&[row("openai", "gpt-x", 10_000, 4_000, 1_000), row("openai", "gpt-x", 5_000, 0, 500)]);
        assert_eq!(priced.cost.pico, 36_000 * 1_000_000);
        assert_eq!(priced.cost_short(), "$0.0360");
        assert_eq!(priced.cost_text(), "cost $0.0360");
        let free = usage_of(&[row("local", "smol", 900, 0, 90)]);
        assert_eq!((free.cost_short(), free.cost_text()), ("$0".to_owned(), "cost $0".to_owned()));
        // Another model of the same provider, and a provider without prices.
        let mixed = usage_of(&[
            row("openai", "gpt-x", 10_000, 4_000, 1_000),
            row("openai", "gpt-y", 300, 0, 20),
            row("anthropic", "claude", 1_000, 0, 234),
            row("openai", "gpt-y", 700, 0, 80),
        ]);
        assert_eq!(mixed.cost_short(), "$0.0220 + unpriced");
        let text = mixed.cost_text();
        assert!(text.starts_with("cost $0.0220 for the priced tokens, the rest unknown"), "{text}");
        assert!(text.contains("1,100 tokens unpriced: no price for openai · gpt-y"), "{text}");
        assert!(text.contains("1,234 tokens unpriced: no price for anthropic · claude"), "{text}");
        let unknown = usage_of(&[row("anthropic", "claude", 1_000, 0, 234)]);
        assert_eq!(unknown.cost_short(), "cost unknown");
        assert!(unknown.cost_text().contains("set input_per_mtok and output_per_mtok"), "{}", unknown.cost_text());
    }

    #[test]
    fn the_report_names_every_fact() {
        let mut usage = usage_of(&[row("openai", "gpt-x", 4_000, 0, 678), row("openai", "gpt-x", 8_345, 0, 0)]);
        usage.last_input = 4_000;
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
        // By hand: 12,345 × 2 + 678 × 8 = 24,690 + 5,424 µ$ = $0.030114.
        for part in [
            "session s1",
            "lane main",
            "provider openai · model gpt-x",
            "context 50% used: 4,000 of 8,000 tokens",
            "tokens 12,345 in / 678 out over 2 provider attempts",
            "cost $0.0301",
            "6 tools offered",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
    }
}
