//! Token masking: which vocabulary tokens may come next under the tool-call
//! grammar.
//!
//! Each token's bytes are known once (from the tokenizer); tokens are grouped
//! by their first byte. At a step, a group whose first byte the grammar
//! refuses is skipped whole; the others are tried by copying the small
//! [`State`] and feeding the token's bytes. Inside a free JSON string (at a
//! character boundary, no length limit left to check) every token of whole
//! UTF-8 text without `"`, `\` or control bytes leaves the state unchanged,
//! so those are allowed without simulation. In plain-text mode nothing is
//! masked.
//!
//! This module must not run the model; it only fills a mask.

use crate::grammar::{Grammar, Mode, State};

/// Per-token facts precomputed once per model.
#[derive(Debug)]
pub(crate) struct TokenIndex {
    bytes: Vec<Vec<u8>>,
    /// Token ids grouped by first byte (control and empty tokens excluded).
    by_first: Vec<Vec<u32>>,
    /// Tokens that keep a free string unchanged.
    string_safe: Vec<bool>,
    /// Tokens never produced while constrained (control tokens).
    control: Vec<bool>,
}

impl TokenIndex {
    pub(crate) fn new(bytes: &[Vec<u8>], control: impl Fn(u32) -> bool) -> Self {
        let mut by_first = vec![Vec::new(); 256];
        let mut string_safe = Vec::with_capacity(bytes.len());
        let mut ctl = Vec::with_capacity(bytes.len());
        for (id, b) in bytes.iter().enumerate() {
            let id = id as u32;
            let is_control = control(id);
            ctl.push(is_control);
            // Whole UTF-8 text only: a token that starts or ends inside a
            // character changes the string's state.
            string_safe.push(
                !is_control
                    && !b.is_empty()
                    && std::str::from_utf8(b).is_ok()
                    && b.iter().all(|&c| c >= 0x20 && c != b'"' && c != b'\\'),
            );
            if let (false, Some(&first)) = (is_control, b.first())
                && let Some(group) = by_first.get_mut(first as usize)
            {
                group.push(id);
            }
        }
        Self { bytes: bytes.to_vec(), by_first, string_safe, control: ctl }
    }

    pub(crate) fn bytes(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map(Vec::as_slice).unwrap_or_default()
    }

    /// Fill `allowed` (one flag per token) for the next step from `state`.
    /// `end_tokens` are allowed exactly when the answer may end here.
    pub(crate) fn allowed(&self, g: &Grammar, state: &State, end_tokens: &[u32], allowed: &mut Vec<bool>) {
        allowed.clear();
        allowed.resize(self.bytes.len(), false);
        match state.mode() {
            Mode::Text => {
                for (flag, ctl) in allowed.iter_mut().zip(&self.control) {
                    *flag = !ctl;
                }
            }
            Mode::Done => {}
            Mode::Start | Mode::Call => {
                let free = state.in_free_string();
                for (first, group) in self.by_first.iter().enumerate() {
                    if group.is_empty() {
                        continue;
                    }
                    let mut after_first = *state;
                    if !after_first.feed(g, first as u8) {
                        continue;
                    }
                    for &id in group {
                        let i = id as usize;
                        if free && self.string_safe.get(i).copied().unwrap_or(false) {
                            if let Some(flag) = allowed.get_mut(i) {
                                *flag = true;
                            }
                            continue;
                        }
                        let rest = self.bytes.get(i).and_then(|b| b.get(1..)).unwrap_or_default();
                        let mut s = after_first;
                        if s.feed_all(g, rest)
                            && let Some(flag) = allowed.get_mut(i)
                        {
                            *flag = true;
                        }
                    }
                }
            }
        }
        if state.can_end() {
            for &t in end_tokens {
                if let Some(flag) = allowed.get_mut(t as usize) {
                    *flag = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn toy() -> (TokenIndex, Grammar) {
        let vocab: Vec<&[u8]> = vec![
            b"", // 0: control (end)
            b"{\"",
            b"name",
            b"\":",
            b" \"",
            b"read_file",
            b"\",",
            b" \"arguments",
            b"\": {",
            b"\"path",
            b"src",
            b"/main.rs",
            b"\"}}",
            b"}",
            b"Hello",
            b" world",
            b"\"",
            b"a\"b",
            b"\n",
        ];
        let bytes: Vec<Vec<u8>> = vocab.iter().map(|b| b.to_vec()).collect();
        let index = TokenIndex::new(&bytes, |id| id == 0);
        let schema = json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]});
        (index, Grammar::new([("read_file", &schema)]))
    }

    fn allowed_ids(index: &TokenIndex, g: &Grammar, s: &State) -> Vec<u32> {
        let mut mask = Vec::new();
        index.allowed(g, s, &[0], &mut mask);
        mask.iter().enumerate().filter(|(_, a)| **a).map(|(i, _)| i as u32).collect()
    }

    #[test]
    fn start_allows_text_or_a_call_but_not_the_end() {
        let (index, g) = toy();
        let ids = allowed_ids(&index, &g, &State::new());
        assert!(ids.contains(&1) && ids.contains(&14) && ids.contains(&18));
        assert!(!ids.contains(&0), "cannot end before saying anything");
        assert!(ids.contains(&13), "a byte other than `{{` starts plain text");
    }

    #[test]
    fn drives_a_call_to_its_closing_brace() {
        let (index, g) = toy();
        let mut s = State::new();
        for (tok, expect_only) in
            [(1u32, None), (2, Some(vec![2u32])), (3, Some(vec![3, 16])), (4, None), (5, Some(vec![5]))]
        {
            let ids = allowed_ids(&index, &g, &s);
            if let Some(only) = expect_only {
                assert_eq!(ids, only, "before token {tok}");
            }
            assert!(ids.contains(&tok), "token {tok} must be allowed, got {ids:?}");
            assert!(s.feed_all(&g, index.bytes(tok)));
        }
        for tok in [6u32, 7, 8, 9] {
            assert!(allowed_ids(&index, &g, &s).contains(&tok));
            assert!(s.feed_all(&g, index.bytes(tok)));
        }
        // Close the key, then `:` and the string's opening quote.
        assert!(s.feed_all(&g, b"\": \""));
        let ids = allowed_ids(&index, &g, &s);
        assert!(ids.contains(&10) && ids.contains(&11) && ids.contains(&12) && ids.contains(&16));
        assert!(!ids.contains(&17), "a quote inside the token would need a comma or brace next");
        assert!(!ids.contains(&18), "raw newline inside a string");
        assert!(!ids.contains(&0));
        assert!(s.feed_all(&g, index.bytes(10)));
        assert!(s.feed_all(&g, index.bytes(12)));
        assert_eq!(s.mode(), Mode::Done);
        assert_eq!(allowed_ids(&index, &g, &s), vec![0], "nothing may follow the closing brace");
    }
}
