//! Answers rendered as Markdown on a terminal, while they stream: each
//! line is rendered once it is complete (headings, lists, quotes, rules,
//! fenced code with its language, inline code, bold and italic); the rest
//! of a line waits for its newline, and `finish` renders what is left.
//!
//! Written by hand rather than with a Markdown crate: a parser of whole
//! documents (pulldown-cmark) cannot render a stream line by line without
//! re-rendering, and the subset models write is small. The one rule that
//! matters: the model's text is escaped (`escape::escape_controls`) before
//! any styling is added, so the only escape sequences written are cairn's.
//! It must not write anywhere itself.

use crate::escape::escape_controls;
use crate::style::Style;

/// A Markdown stream being rendered.
#[derive(Debug)]
pub struct Markdown {
    style: Style,
    /// The current line, until its newline.
    pending: String,
    /// Inside a fenced code block (its fence).
    fence: Option<String>,
}

/// Longest line held back waiting for its newline; past it the line is
/// rendered as it is (a 1 MB line must not wait, or cost, forever).
const MAX_PENDING: usize = 16 * 1024;

impl Markdown {
    /// A renderer styling with `style`.
    pub fn new(style: Style) -> Self {
        Self { style, pending: String::new(), fence: None }
    }

    /// Take `text` (a delta); return what can be shown now.
    pub fn push(&mut self, text: &str) -> String {
        self.pending.push_str(text);
        let mut out = String::new();
        while let Some(end) = self.pending.find('\n') {
            let line: String = self.pending.drain(..=end).collect();
            out.push_str(&self.line(line.trim_end_matches(['\n', '\r'])));
            out.push('\n');
        }
        if self.pending.len() > MAX_PENDING {
            let line = std::mem::take(&mut self.pending);
            out.push_str(&escape_controls(&line));
        }
        out
    }

    /// What is left at the end of the answer.
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.pending);
        self.fence = None;
        if rest.is_empty() { String::new() } else { self.line(&rest) }
    }

    fn line(&mut self, raw: &str) -> String {
        let line = escape_controls(raw).into_owned();
        let s = self.style;
        let trimmed = line.trim_start();
        if let Some(fence) = &self.fence {
            if trimmed.starts_with(fence.as_str())
                && trimmed.trim_start_matches(fence.chars().next().unwrap_or('`')).trim().is_empty()
            {
                self.fence = None;
                return s.dim("└────");
            }
            return s.cyan(&line);
        }
        for fence in ["```", "~~~"] {
            if let Some(lang) = trimmed.strip_prefix(fence) {
                self.fence = Some(fence.to_owned());
                let lang = lang.trim();
                return s.dim(&if lang.is_empty() {
                    "┌────".to_owned()
                } else {
                    format!("┌──── {lang}")
                });
            }
        }
        let hashes = trimmed.chars().take_while(|c| *c == '#').count();
        if (1..=6).contains(&hashes) && trimmed[hashes..].starts_with(' ') {
            return s.bold(&inline(s, trimmed[hashes..].trim()));
        }
        if matches!(trimmed, "---" | "***" | "___") {
            return s.dim("────────────────────────");
        }
        let indent = &line[..line.len() - trimmed.len()];
        for bullet in ["- ", "* ", "+ "] {
            if let Some(item) = trimmed.strip_prefix(bullet) {
                return format!("{indent}• {}", inline(s, item));
            }
        }
        if let Some(quote) = trimmed.strip_prefix("> ").or_else(|| (trimmed == ">").then_some("")) {
            return format!("{indent}{} {}", s.dim("│"), s.dim(&inline(s, quote)));
        }
        format!("{indent}{}", inline(s, trimmed))
    }
}

/// Inline code, bold and italic of one (already escaped) line. Unmatched
/// markers stay as they are.
fn inline(s: Style, text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while !rest.is_empty() {
        let next = rest.find(['`', '*', '_']).unwrap_or(rest.len());
        out.push_str(&rest[..next]);
        rest = &rest[next..];
        if rest.is_empty() {
            break;
        }
        let (marker, styled): (&str, fn(&Style, &str) -> String) = if rest.starts_with('`') {
            ("`", Style::cyan)
        } else if rest.starts_with("**") {
            ("**", Style::bold)
        } else if rest.starts_with("__") {
            ("__", Style::bold)
        } else if rest.starts_with('*') {
            ("*", Style::italic)
        } else {
            ("_", Style::italic)
        };
        let body = &rest[marker.len()..];
        match body.find(marker) {
            // `_` inside words (snake_case) is not emphasis.
            Some(end) if end > 0 && !(marker == "_" && out.ends_with(|c: char| c.is_alphanumeric())) => {
                let inner = &body[..end];
                out.push_str(&styled(&s, inner));
                rest = &body[end + marker.len()..];
            }
            _ => {
                out.push_str(marker);
                rest = body;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(text: &str) -> String {
        let mut md = Markdown::new(Style::forced(true));
        let mut out = md.push(text);
        out.push_str(&md.finish());
        out
    }

    #[test]
    fn the_common_subset_is_styled() {
        let out =
            render("# Title\n- one **two** `three`\n> quoted\n```rust\nfn main() {}\n```\nsnake_case_name *it*\n");
        assert!(out.contains("\x1b[1mTitle\x1b[0m"), "{out:?}");
        assert!(out.contains("• one \x1b[1mtwo\x1b[0m \x1b[36mthree\x1b[0m"), "{out:?}");
        assert!(
            out.contains("┌──── rust") && out.contains("\x1b[36mfn main() {}\x1b[0m") && out.contains("└"),
            "{out:?}"
        );
        assert!(out.contains("snake_case_name \x1b[3mit\x1b[0m"), "{out:?}");
    }

    #[test]
    fn hostile_text_is_escaped_before_it_is_styled() {
        let out = render("# \x1b]52;c;cGF3bmVk\x07 **\x1b[2J** \u{202e}evil\n");
        assert!(!out.contains("\x1b]52") && !out.contains("\x1b[2J") && !out.contains('\u{202e}'), "{out:?}");
        assert!(out.contains("\\u{1b}"), "{out:?}");
        // Only cairn's own sequences remain: SGR codes.
        let foreign = out.match_indices('\x1b').filter(|(i, _)| !out[*i..].starts_with("\x1b[")).count();
        assert_eq!(foreign, 0, "{out:?}");
    }

    #[test]
    fn a_line_streams_when_complete_and_a_huge_line_is_not_held() {
        let mut md = Markdown::new(Style::forced(false));
        assert_eq!(md.push("# Ti"), "");
        assert_eq!(md.push("tle\nnext"), "Title\n");
        assert_eq!(md.finish(), "next");
        let mut md = Markdown::new(Style::forced(false));
        let out = md.push(&"x".repeat(MAX_PENDING + 1));
        assert_eq!(out.len(), MAX_PENDING + 1, "past the bound the line is shown as it is");
    }
}
