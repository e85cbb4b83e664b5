//! What gets ranked: a tool's or a skill's metadata and the text derived from
//! it for BM25 and for the embedding (the cache keys vectors by that text,
//! `cache.rs`).
//!
//! This module must not load files or rank; it only shapes metadata.

/// Whether a document describes a tool or a skill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DocKind {
    /// A tool the model can call.
    Tool,
    /// A skill (instructions injected into the system prompt).
    Skill,
}

/// One parameter of a tool with its description.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ParamDoc {
    /// Parameter name.
    pub name: String,
    /// What the parameter means.
    pub description: String,
}

/// A rankable tool or skill.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Document {
    /// Tool or skill name (unique within its kind).
    pub name: String,
    /// Tool or skill.
    pub kind: DocKind,
    /// The one-paragraph description.
    pub description: String,
    /// Parameter descriptions (tools only).
    #[serde(default)]
    pub params: Vec<ParamDoc>,
}

impl Document {
    /// A tool document.
    pub fn tool(name: impl Into<String>, description: impl Into<String>, params: Vec<ParamDoc>) -> Self {
        Document { name: name.into(), kind: DocKind::Tool, description: description.into(), params }
    }

    /// A skill document.
    pub fn skill(name: impl Into<String>, description: impl Into<String>) -> Self {
        Document { name: name.into(), kind: DocKind::Skill, description: description.into(), params: Vec::new() }
    }

    /// The text that is embedded and indexed: the name with `_`/`-` read as
    /// spaces (so `git_log` reads as words), the description, then each
    /// parameter's name and description.
    pub fn text(&self) -> String {
        let mut text = self.name.replace(['_', '-', '.'], " ");
        text.push_str(": ");
        text.push_str(self.description.trim());
        for p in &self.params {
            text.push_str(&format!(" {}: {}.", p.name.replace(['_', '-'], " "), p.description.trim()));
        }
        text
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
