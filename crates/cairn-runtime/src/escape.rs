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

/// Untrusted text (model text, tool output, arguments, anything read back
/// from a session file) made safe to print: newlines and tabs stay, every
/// other control character, DEL, C1 control and bidi control is shown as
/// `\u{1b}`-style text. It works character by character, so it is equally
/// safe on a stream cut anywhere (an escape sequence split across deltas
/// loses its ESC in whichever delta carries it).
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe_char) {
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
    if !json.chars().any(is_unsafe_char) {
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
    // Only the kept prefix is looked at (a tool's output may be long).
    let mut chars = text.chars();
    let mut out: String = chars.by_ref().take(max).map(|c| if c == '\n' { ' ' } else { c }).collect();
    if chars.next().is_some() {
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
