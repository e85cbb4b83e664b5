//! An independent token count for checking that requests fit a context
//! window: it shares nothing with cairn's estimate (which counts bytes and
//! calibrates from reported usage). It splits every string of a request
//! body (keys and values, message texts, tool schemas) the way BPE
//! pre-tokenisers do and counts generously, so it errs towards more tokens
//! than the real tokenisers of English text and code: a letter run is one
//! token per 6 letters, a digit run one per 3 digits (cl100k's grouping),
//! a punctuation run one per 2 characters, every other non-ASCII
//! character one token; whitespace joins the next word. Each message
//! costs 4 more (the chat framing), and the requested output bound counts
//! against the window too.

use serde_json::Value;

/// Tokens of one text.
pub fn count_text(text: &str) -> u64 {
    #[derive(PartialEq, Clone, Copy)]
    enum Class {
        Letter,
        Digit,
        Punct,
        Space,
        Other,
    }
    let class = |c: char| {
        if c.is_ascii_alphabetic() {
            Class::Letter
        } else if c.is_ascii_digit() {
            Class::Digit
        } else if c.is_whitespace() {
            Class::Space
        } else if c.is_ascii() {
            Class::Punct
        } else {
            Class::Other
        }
    };
    let mut tokens = 0u64;
    let mut run: Option<(Class, u64)> = None;
    let flush = |run: Option<(Class, u64)>| match run {
        Some((Class::Letter, n)) => n.div_ceil(6),
        Some((Class::Digit, n)) => n.div_ceil(3),
        Some((Class::Punct, n)) => n.div_ceil(2),
        Some((Class::Other, n)) => n,
        Some((Class::Space, _)) | None => 0,
    };
    for c in text.chars() {
        let k = class(c);
        match &mut run {
            Some((current, n)) if *current == k => *n += 1,
            _ => {
                tokens += flush(run);
                run = Some((k, 1));
            }
        }
    }
    tokens + flush(run)
}

fn count_value(v: &Value) -> u64 {
    match v {
        Value::String(s) => count_text(s),
        Value::Array(items) => items.iter().map(count_value).sum(),
        Value::Object(map) => map.iter().map(|(k, v)| count_text(k) + count_value(v)).sum(),
        Value::Number(n) => count_text(&n.to_string()),
        Value::Bool(_) | Value::Null => 1,
    }
}

/// Tokens a chat request body takes of the window: every message (and
/// Responses `input` item) with its framing, the system prompt, the tool
/// definitions, and the output bound it asks for.
pub fn count_request(body: &Value) -> u64 {
    let mut total = 0;
    for key in ["messages", "input"] {
        if let Some(items) = body.get(key).and_then(Value::as_array) {
            total += items.iter().map(|m| count_value(m) + 4).sum::<u64>();
        }
    }
    for key in ["system", "instructions", "tools"] {
        if let Some(v) = body.get(key) {
            total += count_value(v);
        }
    }
    for key in ["max_tokens", "max_completion_tokens", "max_output_tokens"] {
        total += body.get(key).and_then(Value::as_u64).unwrap_or(0);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_generously() {
        assert_eq!(count_text("the quick brown fox"), 4);
        assert_eq!(count_text("extraordinarily"), 3);
        assert_eq!(count_text("12345"), 2);
        assert_eq!(count_text("{\"a\":\"b\"}"), 1 + 1 + 2 + 1 + 1);
        assert_eq!(count_text("café ☕"), 1 + 1 + 1);
    }
}
