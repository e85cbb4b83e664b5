//! The one escaping rule for untrusted text printed to a terminal
//! (`escape_controls`, and `escape_json` for JSON lines): what no model,
//! tool or session file may write raw. Used by the renderer, the Markdown
//! renderer and every command that prints such text; with it, how text is
//! shortened (`short`) and a path quoted as a shell word (`quoted`) for a
//! person. It must not print.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` must not reach a terminal raw: C0 controls other than
/// newline and tab (ESC starts every escape sequence; CR and BS overwrite
/// what was shown), DEL, the C1 controls (U+009B is a one-character CSI on
/// some terminals), and the bidi marks, embeddings, overrides and isolates
/// that reorder what a line appears to say.
pub fn is_unsafe_char(c: char) -> bool {
    matches!(
        c,
        '\u{0}'..='\u{8}'
            | '\u{b}'..='\u{1f}'
            | '\u{7f}'..='\u{9f}'
            | '\u{61c}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}'
    )
}

/// Whether no char of `text` is unsafe ([`is_unsafe_char`]): its bytes
/// looked at directly while they are printable ASCII, newlines or tabs
/// (nearly all text), its chars from the first other byte on.
fn all_safe(text: &str) -> bool {
    match text.bytes().position(|b| !matches!(b, b' '..=b'~' | b'\n' | b'\t')) {
        None => true,
        // Every byte before `at` is ASCII, so `at` is a char boundary.
        Some(at) => !text.get(at..).unwrap_or_default().chars().any(is_unsafe_char),
    }
}

/// Untrusted text (model text, tool output, arguments, anything read back
/// from a session file) made safe to print: newlines and tabs stay, every
/// other control character, DEL, C1 control and bidi control is shown as
/// `\u{1b}`-style text. It works character by character, so it is equally
/// safe on a stream cut anywhere (an escape sequence split across deltas
/// loses its ESC in whichever delta carries it).
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    if all_safe(text) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_unsafe_char(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A JSON text made safe for a terminal without changing its value.
/// serde_json already escapes C0 controls inside strings but leaves DEL, C1
/// and bidi controls raw; those (which valid JSON can hold only inside
/// strings) become `\uXXXX` escapes, and a CR (valid JSON holds it only as
/// whitespace between tokens) becomes a space.
pub fn escape_json(json: &str) -> Cow<'_, str> {
    if all_safe(json) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        match c {
            '\r' => out.push(' '),
            c if is_unsafe_char(c) => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// At most `max` characters of `text`, with an ellipsis when cut.
pub fn short(text: &str, max: usize) -> String {
    // Only the kept prefix is looked at (a tool's output may be long); when
    // its first `max` bytes are ASCII, they are its first `max` chars.
    let head = text.as_bytes().get(..text.len().min(max)).unwrap_or_default();
    let end = if head.is_ascii() { head.len() } else { text.char_indices().nth(max).map_or(text.len(), |(at, _)| at) };
    let mut out = text.get(..end).unwrap_or_default().replace('\n', " ");
    if end < text.len() {
        out.push('…');
    }
    out
}

/// `path` as a shell word, for commands printed to copy.
pub fn quoted(path: &std::path::Path) -> String {
    let text = path.display().to_string();
    if !text.is_empty() && text.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+,:@%".contains(c)) {
        text
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rules as first written, char by char (the oracle of the
    /// faster scans above).
    fn unsafe_anywhere(text: &str) -> bool {
        text.chars().any(is_unsafe_char)
    }

    fn short_by_chars(text: &str, max: usize) -> String {
        let mut chars = text.chars();
        let mut out: String = chars.by_ref().take(max).map(|c| if c == '\n' { ' ' } else { c }).collect();
        if chars.next().is_some() {
            out.push('…');
        }
        out
    }

    #[test]
    fn the_fast_scans_agree_with_the_char_by_char_rules() {
        // Every char up to U+2100 and a few beyond, alone and among others.
        let mut chars: Vec<char> = (0u32..0x2100).filter_map(char::from_u32).collect();
        chars.extend(['\u{feff}', '\u{1f980}', '\u{10ffff}', 'é', '…']);
        let mut texts: Vec<String> = vec![String::new(), "plain text".to_owned(), "a\nb\tc".to_owned()];
        for &c in &chars {
            texts.push(c.to_string());
            texts.push(format!("ok {c}"));
            texts.push(format!("{c} then ok\n"));
            texts.push(format!("é{c}x"));
        }
        for n in [0, 1, 2, 99, 100, 101, 150] {
            texts.push("x".repeat(n));
            texts.push(format!("{}é{}", "y".repeat(n), "z".repeat(n)));
            texts.push(format!("{}\n\u{1b}[31m", "w\n".repeat(n)));
        }
        for text in &texts {
            assert_eq!(all_safe(text), !unsafe_anywhere(text), "{text:?}");
            let escaped = escape_controls(text);
            assert_eq!(matches!(escaped, Cow::Borrowed(_)), !unsafe_anywhere(text), "{text:?}");
            for max in [0, 1, 2, 3, 5, 100, 101] {
                assert_eq!(short(text, max), short_by_chars(text, max), "{text:?}, {max}");
            }
        }
    }
}
