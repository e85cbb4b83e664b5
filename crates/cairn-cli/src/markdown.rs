//! Answers rendered as Markdown on a terminal, while they stream: a line
//! that arrives whole is rendered at once (headings, lists, quotes, rules,
//! fenced code with its language and syntax highlighting, inline code,
//! bold and italic); a line still arriving is shown word by word as soon
//! as its first word says what kind of line it is (issue 49.6: a model
//! writes a paragraph as one long line, and holding it for its newline
//! showed nothing for seconds), its inline styles opened and closed as
//! their markers arrive; fenced code and rules wait for their newline, and
//! `finish` renders what is left.
//!
//! Written by hand rather than with a Markdown crate: a parser of whole
//! documents (pulldown-cmark) cannot render a stream line by line without
//! re-rendering, and the subset models write is small. The one rule that
//! matters: the model's text is escaped (`escape::escape_controls`) before
//! any styling is added (code blocks are coloured by `highlight.rs` after
//! escaping too), so the only escape sequences written are cairn's. What
//! one answer costs is bounded: each delta is scanned once, and a line is
//! shown up to [`MAX_LINE`] bytes (the rest counted, and said to be in the
//! session). It must not write anywhere itself.

use crate::escape::escape_controls;
use crate::highlight::Code;
use crate::style::Style;

/// A Markdown stream being rendered.
#[derive(Debug)]
pub struct Markdown {
    style: Style,
    /// The current line, until its newline (at most [`MAX_LINE`] bytes).
    pending: String,
    /// Bytes of the current line past [`MAX_LINE`], not shown.
    cut: usize,
    /// Whether the shown part of an over-long line went out already.
    flushed: bool,
    /// Inside a fenced code block (its fence, and its highlighter).
    fence: Option<(String, Code)>,
    /// Bytes of the current line taken so far (shown or pending).
    line_len: usize,
    /// The current line, shown in part already (its kind and open styles).
    streaming: Option<Inline>,
}

/// The styles open in a line being shown as it streams.
#[derive(Debug, Default)]
struct Inline {
    /// The line's own style (a heading's bold, a quote's dim).
    base: Option<&'static str>,
    /// Inside `code`.
    code: bool,
    /// Bold, opened by this marker character (`*` or `_`).
    bold: Option<char>,
    /// Italic, opened by this marker character.
    italic: Option<char>,
    /// The last character shown (a `_` inside a word is not emphasis).
    prev: Option<char>,
}

impl Inline {
    /// The SGR sequence for the styles open now.
    fn sgr(&self, s: Style) -> String {
        let mut codes: Vec<&str> = self.base.into_iter().collect();
        if self.bold.is_some() {
            codes.push("1");
        }
        if self.italic.is_some() {
            codes.push("3");
        }
        if self.code {
            codes.push("36");
        }
        s.set(&codes)
    }

    /// Whether any style is open (the line must be reset at its end).
    fn open(&self) -> bool {
        self.base.is_some() || self.code || self.bold.is_some() || self.italic.is_some()
    }

    /// Show `text` (escaped already; at a word boundary: the character
    /// after it is a space or the end of the line), toggling styles at
    /// their markers. A marker opens only before a non-space and closes
    /// only after one, so `5 * 3` stays as written.
    fn render(&mut self, s: Style, text: &str, out: &mut String) {
        let chars: Vec<char> = text.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            let next = chars.get(i + 1).copied();
            if self.code {
                if c == '`' {
                    self.code = false;
                    out.push_str(&self.sgr(s));
                } else {
                    out.push(c);
                }
                self.prev = Some(c);
                i += 1;
                continue;
            }
            let after_space = self.prev.is_none_or(char::is_whitespace);
            match c {
                '`' if next.is_some_and(|n| n != '`' && !n.is_whitespace()) => {
                    self.code = true;
                    out.push_str(&self.sgr(s));
                    i += 1;
                    self.prev = Some(c);
                    continue;
                }
                '*' | '_' => {
                    let double = next == Some(c);
                    let width = if double { 2 } else { 1 };
                    let following = chars.get(i + width).copied();
                    let word_inside = c == '_'
                        && self.prev.is_some_and(char::is_alphanumeric)
                        && following.is_some_and(char::is_alphanumeric);
                    let slot = if double { &mut self.bold } else { &mut self.italic };
                    let toggled = match *slot {
                        Some(open) if open == c && !after_space && !word_inside => {
                            *slot = None;
                            true
                        }
                        None if following.is_some_and(|f| !f.is_whitespace())
                            && !word_inside
                            && !(c == '_' && self.prev.is_some_and(char::is_alphanumeric)) =>
                        {
                            *slot = Some(c);
                            true
                        }
                        _ => false,
                    };
                    if toggled {
                        out.push_str(&self.sgr(s));
                    } else {
                        chars[i..i + width].iter().for_each(|m| out.push(*m));
                    }
                    self.prev = Some(c);
                    i += width;
                    continue;
                }
                _ => out.push(c),
            }
            self.prev = Some(c);
            i += 1;
        }
    }
}

/// Longest part of one line shown: a line is held back until its newline
/// up to this many bytes; past it that part is shown as it is and the rest
/// of the line is counted, not shown (a 1 MB line must not wait, or cost,
/// or scroll, forever; the session keeps it whole).
pub const MAX_LINE: usize = 16 * 1024;

impl Markdown {
    /// A renderer styling with `style`.
    pub fn new(style: Style) -> Self {
        Self { style, pending: String::new(), cut: 0, flushed: false, fence: None, line_len: 0, streaming: None }
    }

    /// Take `text` (a delta); return what can be shown now.
    pub fn push(&mut self, text: &str) -> String {
        let mut out = String::new();
        let mut rest = text;
        while let Some(end) = rest.find('\n') {
            self.take(&rest[..end], &mut out);
            self.end_line(&mut out);
            out.push('\n');
            rest = &rest[end + 1..];
        }
        self.take(rest, &mut out);
        self.stream(&mut out);
        out
    }

    /// Show the complete words of the line still arriving, once its first
    /// word says what kind of line it is.
    fn stream(&mut self, out: &mut String) {
        if self.flushed || self.fence.is_some() {
            return;
        }
        let s = self.style;
        if self.streaming.is_none() {
            let trimmed = self.pending.trim_start_matches([' ', '\t']);
            let indent_len = self.pending.len() - trimmed.len();
            let Some(space) = trimmed.find(' ') else { return };
            let first = &trimmed[..space];
            // Fences and rules are whole-line constructs: they wait.
            if first.starts_with("```") || first.starts_with("~~~") || first.is_empty() {
                return;
            }
            let hashes = first.chars().take_while(|c| *c == '#').count();
            let (head, base, body_at) = if (1..=6).contains(&hashes) && hashes == first.len() {
                (String::new(), Some("1"), space)
            } else if matches!(first, "-" | "*" | "+") {
                ("• ".to_owned(), None, space)
            } else if first == ">" {
                (format!("{} ", s.dim("│")), Some("2"), space)
            } else {
                (String::new(), None, 0)
            };
            let body = &trimmed[body_at..];
            let body = body.trim_start_matches(' ');
            // A complete word of the body: a space after something (its
            // leading spaces are gone).
            let Some(upto) = body.rfind(' ').map(|i| i + 1) else { return };
            let body_start = self.pending.len() - body.len();
            let indent = escape_controls(&self.pending[..indent_len]).into_owned();
            let mut state = Inline { base, ..Inline::default() };
            out.push_str(&indent);
            out.push_str(&head);
            if base.is_some() {
                out.push_str(&state.sgr(s));
            }
            let text = escape_controls(&self.pending[body_start..body_start + upto]).into_owned();
            state.render(s, &text, out);
            self.pending.drain(..body_start + upto);
            self.streaming = Some(state);
            return;
        }
        let Some(upto) = self.pending.rfind(' ').map(|i| i + 1) else { return };
        let text = escape_controls(&self.pending[..upto]).into_owned();
        if let Some(state) = &mut self.streaming {
            state.render(s, &text, out);
        }
        self.pending.drain(..upto);
    }

    /// The rest of a line shown in part already, its styles closed.
    fn finish_streamed(&mut self, rest: &str, out: &mut String) {
        if let Some(mut state) = self.streaming.take() {
            let text = escape_controls(rest).into_owned();
            state.render(self.style, &text, out);
            if state.open() {
                out.push_str(&self.style.set(&[]));
            }
        }
    }

    /// Add `piece` (no newline) to the current line, within the bound.
    fn take(&mut self, piece: &str, out: &mut String) {
        let room = MAX_LINE.saturating_sub(self.line_len);
        if piece.len() <= room && !self.flushed {
            self.pending.push_str(piece);
            self.line_len += piece.len();
            return;
        }
        let keep = if self.flushed { 0 } else { piece.floor_char_boundary(room) };
        self.pending.push_str(&piece[..keep]);
        self.line_len += keep;
        self.cut += piece.len() - keep;
        if !self.flushed {
            // The line is over the bound: show its first part now.
            self.flushed = true;
            let shown = std::mem::take(&mut self.pending);
            if self.streaming.is_some() {
                self.finish_streamed(shown.trim_end_matches('\r'), out);
            } else {
                out.push_str(&escape_controls(shown.trim_end_matches('\r')));
            }
        }
    }

    /// The current line is complete.
    fn end_line(&mut self, out: &mut String) {
        let line = std::mem::take(&mut self.pending);
        self.line_len = 0;
        let streamed = self.streaming.is_some();
        if streamed {
            self.finish_streamed(line.trim_end_matches('\r'), out);
        }
        if self.flushed {
            let cut = std::mem::take(&mut self.cut);
            self.flushed = false;
            out.push_str(
                &self.style.dim(&format!(
                    " … [{cut} more bytes of this line not shown; `cairn show` prints the whole answer]"
                )),
            );
        } else if !streamed {
            out.push_str(&self.line(line.trim_end_matches('\r')));
        }
    }

    /// What is left at the end of the answer.
    pub fn finish(&mut self) -> String {
        let mut out = String::new();
        if self.flushed || !self.pending.is_empty() || self.streaming.is_some() {
            self.end_line(&mut out);
        }
        self.fence = None;
        out
    }

    fn line(&mut self, raw: &str) -> String {
        let line = escape_controls(raw).into_owned();
        let s = self.style;
        let trimmed = line.trim_start();
        if let Some((fence, code)) = &mut self.fence {
            if trimmed.starts_with(fence.as_str())
                && trimmed.trim_start_matches(fence.chars().next().unwrap_or('`')).trim().is_empty()
            {
                self.fence = None;
                return s.dim("└────");
            }
            return code.line(&line);
        }
        for fence in ["```", "~~~"] {
            if let Some(lang) = trimmed.strip_prefix(fence) {
                let lang = lang.trim();
                self.fence = Some((fence.to_owned(), Code::new(lang, s)));
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
        assert!(out.contains("┌──── rust") && out.contains("└"), "{out:?}");
        // The code is highlighted (256-colour foregrounds), its text whole.
        assert!(out.contains("\x1b[38;5;") && out.contains("main"), "{out:?}");
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
        let out = md.push(&"x".repeat(MAX_LINE + 1));
        assert_eq!(out, "x".repeat(MAX_LINE), "past the bound the line's first part is shown at once");
        assert_eq!(md.push(&"y".repeat(1 << 20)), "", "the rest is counted, not held");
        assert_eq!(
            md.push("\nnext\n"),
            format!(
                " … [{} more bytes of this line not shown; `cairn show` prints the whole answer]\nnext\n",
                (1 << 20) + 1
            )
        );
    }

    #[test]
    fn a_paragraph_streams_word_by_word_with_its_styles() {
        // Issue 49.6: the first words show before the line's newline.
        let mut md = Markdown::new(Style::forced(false));
        assert_eq!(md.push("Hel"), "");
        assert_eq!(md.push("lo wor"), "Hello ");
        assert_eq!(md.push("ld and "), "world and ");
        assert_eq!(md.push("more\nnext"), "more\n");
        assert_eq!(md.finish(), "next");
        // Styled: markers become attributes as they arrive, closed at the
        // end of the line; `5 * 3` and snake_case stay as written.
        let mut md = Markdown::new(Style::forced(true));
        let mut out = md.push("- one **bo");
        assert_eq!(out, "• one ");
        out.push_str(&md.push("ld** `co"));
        out.push_str(&md.push("de` 5 * 3 snake_case_name *it* "));
        out.push_str(&md.push("end\n"));
        assert_eq!(
            out,
            "• one \x1b[0m\x1b[1mbold\x1b[0m \x1b[0m\x1b[36mcode\x1b[0m 5 * 3 snake_case_name \x1b[0m\x1b[3mit\x1b[0m end\n"
        );
        // A heading and a quote keep their own style; a fence waits.
        let mut md = Markdown::new(Style::forced(true));
        assert_eq!(md.push("# Big title "), "\x1b[0m\x1b[1mBig title ");
        assert_eq!(md.push("x\n"), "x\x1b[0m\n");
        assert_eq!(md.push("```rust "), "");
        // Control characters are escaped in a streamed line too.
        let mut md = Markdown::new(Style::forced(false));
        let out = md.push("a \x1b]52;c;x\x07 b ");
        assert!(!out.contains('\x1b') && out.contains("\\u{1b}"), "{out:?}");
    }

    #[test]
    fn a_big_answer_in_one_delta_costs_one_pass() {
        // 10 MB of short lines in one delta: linear, not a drain per line.
        let line = "a line of an answer, about sixty bytes long, **bold** here\n";
        let text = line.repeat(10 * 1024 * 1024 / line.len());
        let mut md = Markdown::new(Style::forced(true));
        let out = md.push(&text);
        assert_eq!(out.matches('\n').count(), text.matches('\n').count());
    }

    #[test]
    fn a_long_line_split_across_deltas_keeps_characters_whole() {
        let mut md = Markdown::new(Style::forced(false));
        let mut out = md.push(&"é".repeat(MAX_LINE));
        out.push_str(&md.finish());
        assert!(out.starts_with(&"é".repeat(MAX_LINE / 2)), "cut on a character boundary");
        assert!(out.contains(&format!("{} more bytes", MAX_LINE)), "{}", &out[out.len() - 120..]);
    }
}
