//! The read side every face shares (issue 50.4): what a session has used
//! ([`UsageTotals`], summed from its usage ledger), which sessions descend
//! from it ([`descendants`]) and what it last answered ([`last_answer`]).
//! The CLI's status line, `cairn show`, 9P's `usage` files, ACP's `/usage`
//! and the subagent tools all read these, so a new usage field reaches
//! every face at once.
//!
//! It owns the summing and the family rule's reading of a sessions
//! directory; it must not price anything (prices are the user's, read by
//! cairn-provider; [`UsageTotals::by_model`] gives what a price applies to)
//! nor render (each face says the figures its own way).

use std::path::{Path, PathBuf};

use crate::message::{Message, Role};
use crate::provider::AttemptUsage;
use crate::storage::{FAMILY_SEP, JsonlStore, Storage, StoreOptions};

/// Tokens of the attempts made on one provider and model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelTokens {
    /// The provider's name as the ledger row records it.
    pub provider: String,
    /// The model's name as the ledger row records it.
    pub model: String,
    /// Input tokens (cached ones included).
    pub input: u64,
    /// Of `input`, the tokens the provider served from its cache.
    pub cached: u64,
    /// Output tokens.
    pub output: u64,
    /// Attempts.
    pub attempts: u64,
}

/// A usage ledger summed: every provider attempt, retries and failed
/// attempts included.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageTotals {
    /// Input tokens over every attempt.
    pub input: u64,
    /// Output tokens over every attempt.
    pub output: u64,
    /// Cached input tokens over every attempt.
    pub cached: u64,
    /// Provider attempts.
    pub attempts: u64,
    /// Attempts that failed (an error recorded with the row).
    pub failed: u64,
    /// Input tokens of the last attempt that reported any: how full the
    /// model's context was.
    pub last_input: u64,
    /// The same figures per provider and model, in the order first met
    /// (what a price applies to).
    pub by_model: Vec<ModelTokens>,
}

impl UsageTotals {
    /// The ledger of `store` (every lane, compactions included). A row
    /// that is not an attempt's usage is not counted.
    pub fn of(store: &impl Storage) -> Self {
        let mut totals = Self::default();
        for row in store.usage() {
            if let Ok(attempt) = row.usage.parse::<AttemptUsage>() {
                totals.add(&attempt);
            }
        }
        totals
    }

    /// Count one attempt.
    pub fn add(&mut self, u: &AttemptUsage) {
        self.input += u.input_tokens;
        self.output += u.output_tokens;
        self.cached += u.cached_input_tokens;
        self.attempts += 1;
        self.failed += u64::from(u.error.is_some());
        if u.input_tokens > 0 {
            self.last_input = u.input_tokens;
        }
        let model = model_entry(&mut self.by_model, &u.provider, &u.model);
        model.input += u.input_tokens;
        model.cached += u.cached_input_tokens;
        model.output += u.output_tokens;
        model.attempts += 1;
    }

    /// Another ledger's figures added to these (a family's sessions);
    /// `last_input` stays this ledger's own.
    pub fn merge(&mut self, other: &Self) {
        self.input += other.input;
        self.output += other.output;
        self.cached += other.cached;
        self.attempts += other.attempts;
        self.failed += other.failed;
        for m in &other.by_model {
            let mine = model_entry(&mut self.by_model, &m.provider, &m.model);
            mine.input += m.input;
            mine.cached += m.cached;
            mine.output += m.output;
            mine.attempts += m.attempts;
        }
    }

    /// Input and output tokens together.
    pub fn total(&self) -> u64 {
        self.input + self.output
    }
}

/// The figures of `provider` and `model` in `by_model`, added (zero) at
/// the end when first met.
fn model_entry<'a>(by_model: &'a mut Vec<ModelTokens>, provider: &str, model: &str) -> &'a mut ModelTokens {
    let i = match by_model.iter().position(|m| m.provider == provider && m.model == model) {
        Some(i) => i,
        None => {
            by_model.push(ModelTokens {
                provider: provider.to_owned(),
                model: model.to_owned(),
                ..ModelTokens::default()
            });
            by_model.len() - 1
        }
    };
    // In bounds: `i` was found in the list or is the entry just pushed.
    &mut by_model[i]
}

/// The session files in `dir` that descend from session `id` (its
/// children, their children, …): a child is named `<parent>+<invocation>`
/// ([`FAMILY_SEP`]), so every file whose id starts with `id+`. A directory
/// that cannot be listed holds none.
pub fn descendants(dir: &Path, id: &str) -> Vec<PathBuf> {
    let prefix = format!("{id}{FAMILY_SEP}");
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .filter(|p| p.file_stem().and_then(|s| s.to_str()).is_some_and(|s| s.starts_with(&prefix)))
        .collect();
    found.sort();
    found
}

/// The usage of a session's descendants: how many there are and their
/// ledgers summed. A descendant that cannot be read is counted and adds
/// nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FamilyUsage {
    /// Descendant sessions found.
    pub sessions: u64,
    /// Their ledgers, summed.
    pub totals: UsageTotals,
}

impl FamilyUsage {
    /// The descendants of `id` among the session files in `dir`.
    pub fn of(dir: &Path, id: &str, opts: StoreOptions) -> Self {
        let mut family = Self::default();
        for path in descendants(dir, id) {
            family.sessions += 1;
            if let Ok(store) = JsonlStore::open_read_only_with(&path, opts) {
                family.totals.merge(&UsageTotals::of(&store));
            }
        }
        family
    }
}

/// The last assistant text of a conversation (a finished turn's answer);
/// empty when the model has said nothing yet.
pub fn last_answer(messages: &[Message]) -> String {
    messages.iter().rev().find(|m| m.role == Role::Assistant).map(Message::joined_text).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(provider: &str, model: &str, input: u64, cached: u64, output: u64, failed: bool) -> AttemptUsage {
        AttemptUsage {
            provider: provider.to_owned(),
            model: model.to_owned(),
            attempt: 1,
            input_tokens: input,
            cached_input_tokens: cached,
            output_tokens: output,
            error: failed.then(|| "503".to_owned()),
            ..AttemptUsage::default()
        }
    }

    #[test]
    fn attempts_are_summed_in_all_and_per_model() {
        let mut t = UsageTotals::default();
        t.add(&attempt("openai", "a", 100, 10, 5, false));
        t.add(&attempt("openai", "a", 0, 0, 0, true));
        t.add(&attempt("local", "b", 7, 0, 3, false));
        assert_eq!((t.input, t.output, t.cached, t.attempts, t.failed), (107, 8, 10, 3, 1));
        // The failed attempt reported no input: the context figure is the
        // last one that did.
        assert_eq!(t.last_input, 7);
        assert_eq!(t.total(), 115);
        assert_eq!(t.by_model.len(), 2);
        assert_eq!(
            t.by_model[0],
            ModelTokens {
                provider: "openai".into(),
                model: "a".into(),
                input: 100,
                cached: 10,
                output: 5,
                attempts: 2
            }
        );

        let mut other = UsageTotals::default();
        other.add(&attempt("local", "b", 1, 0, 1, false));
        other.add(&attempt("x", "y", 2, 0, 2, false));
        let before = t.last_input;
        t.merge(&other);
        assert_eq!((t.input, t.output, t.attempts, t.last_input), (110, 11, 5, before));
        assert_eq!(t.by_model.iter().map(|m| m.attempts).collect::<Vec<_>>(), vec![2, 2, 1]);
    }

    #[test]
    fn descendants_are_the_files_named_under_the_id() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["p.jsonl", "p+i1.jsonl", "p+i1+i2.jsonl", "pq.jsonl", "q+i1.jsonl", "p+i3.txt"] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        let found: Vec<String> = descendants(dir.path(), "p")
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(found, vec!["p+i1+i2.jsonl", "p+i1.jsonl"]);
        assert!(descendants(&dir.path().join("missing"), "p").is_empty());
    }

    #[test]
    fn the_last_answer_is_the_last_assistant_text() {
        let user = Message::text(Role::User, "q");
        let a1 = Message::text(Role::Assistant, "first");
        let a2 = Message::text(Role::Assistant, "second");
        assert_eq!(last_answer(&[user.clone(), a1, user.clone(), a2]), "second");
        assert_eq!(last_answer(&[user]), "");
    }
}
