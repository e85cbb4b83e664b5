//! Terminal styling: ANSI colours only when the stream is a terminal and
//! `NO_COLOR` is not set. Nothing else in the CLI writes escape codes.

use std::io::IsTerminal;

/// Whether to colour, decided once per stream.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    color: bool,
}

impl Style {
    /// Colour for stderr (prompts, progress, errors).
    pub fn stderr() -> Self {
        Self { color: colour_allowed() && std::io::stderr().is_terminal() }
    }

    /// Colour for stdout (answers, tables).
    pub fn stdout() -> Self {
        Self { color: colour_allowed() && std::io::stdout().is_terminal() }
    }

    /// Colour on or off whatever the streams are (the renderers' tests).
    #[cfg(test)]
    pub fn forced(color: bool) -> Self {
        Self { color }
    }

    /// Whether this stream is coloured.
    pub fn coloured(&self) -> bool {
        self.color
    }

    /// Foreground colour `index` of the xterm 256-colour palette
    /// (`highlight.rs`).
    pub fn colour256(&self, index: u8, text: &str) -> String {
        self.paint(&format!("38;5;{index}"), text)
    }

    /// The sequence that resets every attribute and then sets `codes`
    /// (SGR parameters, `1` bold, `2` dim, `3` italic, `36` cyan), or
    /// nothing uncoloured: for a renderer that styles text as it streams
    /// and cannot wrap a whole span (`cairn-cli`'s `markdown.rs`).
    pub fn set(&self, codes: &[&str]) -> String {
        if !self.color {
            return String::new();
        }
        let mut out = "\x1b[0m".to_owned();
        if !codes.is_empty() {
            out.push_str(&format!("\x1b[{}m", codes.join(";")));
        }
        out
    }

    fn paint(&self, code: &str, text: &str) -> String {
        if self.color { format!("\x1b[{code}m{text}\x1b[0m") } else { text.to_owned() }
    }

    /// Bold.
    pub fn bold(&self, text: &str) -> String {
        self.paint("1", text)
    }
    /// Dim.
    pub fn dim(&self, text: &str) -> String {
        self.paint("2", text)
    }
    /// Italic.
    pub fn italic(&self, text: &str) -> String {
        self.paint("3", text)
    }
    /// Red.
    pub fn red(&self, text: &str) -> String {
        self.paint("31", text)
    }
    /// Bold red.
    pub fn red_bold(&self, text: &str) -> String {
        self.paint("1;31", text)
    }
    /// Green.
    pub fn green(&self, text: &str) -> String {
        self.paint("32", text)
    }
    /// Yellow.
    pub fn yellow(&self, text: &str) -> String {
        self.paint("33", text)
    }
    /// Cyan.
    pub fn cyan(&self, text: &str) -> String {
        self.paint("36", text)
    }
}

fn colour_allowed() -> bool {
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}
