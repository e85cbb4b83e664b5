//! Syntax highlighting of the code blocks of a rendered answer, line by
//! line while it streams (syntect with its bundled Sublime Text syntaxes
//! and themes, pure-Rust regexes: no C library, no files read at run time).
//!
//! It colours text that is already escaped (`escape::escape_controls`):
//! what it returns is the input's characters with cairn's own SGR codes
//! (256-colour foregrounds) between them, so no sequence of the model's can
//! get through. Highlighting is bounded: a line longer than
//! [`MAX_LINE`] or a block past [`MAX_BLOCK`] bytes ends the highlighting of
//! that block (the rest is shown in the plain code colour), so a hostile
//! answer costs what escaping it costs. The syntaxes are loaded once, on
//! the first block whose language is known (~2 ms: syntect reads each
//! grammar from its dump only when asked for it). It must not write
//! anywhere.

use std::sync::OnceLock;

use syntect::easy::HighlightLines;
use syntect::highlighting::{Theme, ThemeSet};
use syntect::parsing::SyntaxSet;

use crate::style::Style;

/// The longest line highlighted.
pub const MAX_LINE: usize = 2 * 1024;
/// Bytes of one block highlighted; past them the block goes on uncoloured.
/// A line costs ~0.2 ms to highlight (measured in a test build on a loaded
/// machine), so a block stops costing after ~0.2 s however long it is.
pub const MAX_BLOCK: usize = 64 * 1024;

fn syntaxes() -> &'static SyntaxSet {
    static SET: OnceLock<SyntaxSet> = OnceLock::new();
    SET.get_or_init(SyntaxSet::load_defaults_newlines)
}

fn theme() -> Option<&'static Theme> {
    static THEMES: OnceLock<ThemeSet> = OnceLock::new();
    THEMES.get_or_init(ThemeSet::load_defaults).themes.get("base16-ocean.dark")
}

/// The highlighter of one fenced code block.
pub struct Code {
    style: Style,
    lines: Option<HighlightLines<'static>>,
    /// Bytes highlighted so far.
    seen: usize,
}

impl std::fmt::Debug for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Code").field("highlighting", &self.lines.is_some()).field("seen", &self.seen).finish()
    }
}

impl Code {
    /// A block in `lang` (a fence's info string: `rust`, `py`, `sh`, …).
    /// Unknown or empty languages, and no colour, give plain code lines.
    pub fn new(lang: &str, style: Style) -> Self {
        let word = lang.split_whitespace().next().unwrap_or_default().trim_start_matches('.');
        let lines = if style.coloured() && !word.is_empty() {
            let set = syntaxes();
            let syntax = set.find_syntax_by_token(word).or_else(|| set.find_syntax_by_token(&word.to_lowercase()));
            syntax.zip(theme()).map(|(syntax, theme)| HighlightLines::new(syntax, theme))
        } else {
            None
        };
        Self { style, lines, seen: 0 }
    }

    /// One line of the block (already escaped, without its newline), coloured.
    pub fn line(&mut self, escaped: &str) -> String {
        self.seen += escaped.len() + 1;
        if escaped.len() > MAX_LINE || self.seen > MAX_BLOCK {
            self.lines = None;
        }
        let Some(lines) = &mut self.lines else { return self.style.cyan(escaped) };
        let with_newline = format!("{escaped}\n");
        match lines.highlight_line(&with_newline, syntaxes()) {
            Ok(ranges) => {
                let mut out = String::with_capacity(escaped.len() * 2);
                for (style, text) in ranges {
                    let text = text.strip_suffix('\n').unwrap_or(text);
                    if text.is_empty() {
                        continue;
                    }
                    let c = style.foreground;
                    out.push_str(&self.style.colour256(xterm256(c.r, c.g, c.b), text));
                }
                out
            }
            Err(_) => {
                // A grammar that fails once is not trusted for the rest.
                self.lines = None;
                self.style.cyan(escaped)
            }
        }
    }
}

/// The xterm 256-colour index nearest `r, g, b` (the 6×6×6 cube or the
/// grey ramp): understood by every terminal that has colours, unlike
/// 24-bit colour.
fn xterm256(r: u8, g: u8, b: u8) -> u8 {
    let level = |v: u8| -> u8 {
        if v < 48 {
            0
        } else if v < 115 {
            1
        } else {
            (v - 35) / 40
        }
    };
    let (lr, lg, lb) = (level(r), level(g), level(b));
    let cube = 16 + 36 * lr + 6 * lg + lb;
    let value = |l: u8| -> i32 { if l == 0 { 0 } else { 55 + 40 * i32::from(l) } };
    let grey_avg = (u32::from(r) + u32::from(g) + u32::from(b)) / 3;
    let grey_index = if grey_avg > 238 { 23 } else { grey_avg.saturating_sub(3) / 10 };
    let grey = 8 + 10 * i32::try_from(grey_index).unwrap_or(23);
    let dist = |cr: i32, cg: i32, cb: i32| {
        let (dr, dg, db) = (cr - i32::from(r), cg - i32::from(g), cb - i32::from(b));
        dr * dr + dg * dg + db * db
    };
    if dist(grey, grey, grey) < dist(value(lr), value(lg), value(lb)) {
        232 + u8::try_from(grey_index).unwrap_or(23)
    } else {
        cube
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::escape::escape_controls;

    #[test]
    fn a_known_language_is_coloured_and_keeps_its_text() {
        let mut code = Code::new("rust", Style::forced(true));
        let out = code.line("fn main() { let x = \"hi\"; }");
        assert!(out.contains("\x1b[38;5;"), "{out:?}");
        let plain: String = strip_sgr(&out);
        assert_eq!(plain, "fn main() { let x = \"hi\"; }");
        assert_ne!(out, Style::forced(true).cyan("fn main() { let x = \"hi\"; }"));
    }

    #[test]
    fn unknown_languages_and_no_colour_are_plain() {
        assert_eq!(Code::new("no-such-lang", Style::forced(true)).line("x = 1"), "\x1b[36mx = 1\x1b[0m");
        assert_eq!(Code::new("rust", Style::forced(false)).line("let x = 1;"), "let x = 1;");
    }

    #[test]
    fn escaped_hostile_text_stays_escaped_and_long_lines_stop_highlighting() {
        let mut code = Code::new("sh", Style::forced(true));
        let hostile = escape_controls("echo \x1b]52;c;eA==\x07 \u{202e}x");
        let out = code.line(&hostile);
        assert!(!out.contains("\x1b]") && !out.contains('\x07') && !out.contains('\u{202e}'), "{out:?}");
        let foreign = out.match_indices('\x1b').filter(|(i, _)| !out[*i..].starts_with("\x1b[")).count();
        assert_eq!(foreign, 0, "{out:?}");
        assert_eq!(strip_sgr(&out), hostile);
        let long = "a".repeat(MAX_LINE + 1);
        assert_eq!(code.line(&long), Style::forced(true).cyan(&long), "a long line ends highlighting");
        assert_eq!(code.line("echo hi"), Style::forced(true).cyan("echo hi"), "for the rest of the block");
    }

    #[test]
    fn a_long_block_stops_being_highlighted() {
        let mut code = Code::new("rust", Style::forced(true));
        let line = "let x = 1; // a line of code in a long block";
        let mut coloured = 0;
        for _ in 0..(MAX_BLOCK / line.len() + 10) {
            if code.line(line) != Style::forced(true).cyan(line) {
                coloured += 1;
            }
        }
        assert!(coloured > 0 && coloured <= MAX_BLOCK / line.len(), "{coloured}");
        assert_eq!(code.line(line), Style::forced(true).cyan(line));
    }

    #[test]
    fn the_colour_cube_is_nearest() {
        assert_eq!(xterm256(0, 0, 0), 16);
        assert_eq!(xterm256(255, 0, 0), 196);
        assert_eq!(xterm256(255, 255, 255), 231);
        assert_eq!(xterm256(128, 128, 128), 244);
    }

    fn strip_sgr(text: &str) -> String {
        let mut out = String::new();
        let mut rest = text;
        while let Some(i) = rest.find("\x1b[") {
            out.push_str(&rest[..i]);
            let after = &rest[i..];
            let end = after.find('m').map_or(after.len(), |e| e + 1);
            rest = &after[end..];
        }
        out.push_str(rest);
        out
    }
}
