//! Skills: folders `sk/NAME/SKILL.md` under cairn's config, data and project
//! `.cairn/` directories. A SKILL.md starts with front matter between `---`
//! lines holding `name:` and `description:`; the rest is the instructions
//! injected into the system prompt when the skill is selected.
//!
//! A broken skill is reported with its path and skipped; it never hides the
//! others. Later roots override earlier ones by name (project over data over
//! config). This module must not rank or inject; it reads files.

use std::path::{Path, PathBuf};

use crate::{DiscoveryError, Document};

/// Largest SKILL.md read (bytes); a bigger one is reported, not loaded.
pub const MAX_SKILL_BYTES: u64 = 256 * 1024;

/// One installed skill.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Skill {
    /// Its name (from the front matter).
    pub name: String,
    /// One-line description (what ranking sees).
    pub description: String,
    /// The instructions.
    pub body: String,
    /// The SKILL.md it came from.
    pub path: PathBuf,
}

impl Skill {
    /// The document ranking sees.
    pub fn document(&self) -> Document {
        Document::skill(self.name.clone(), self.description.clone())
    }
}

/// Parse one SKILL.md's text.
pub fn parse_skill(path: &Path, text: &str) -> Result<Skill, DiscoveryError> {
    let bad = |reason: &str| DiscoveryError::Skill { path: path.to_path_buf(), reason: reason.to_string() };
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.lines();
    if lines.next().map(str::trim_end) != Some("---") {
        return Err(bad("must start with a `---` line opening front matter with `name:` and `description:`"));
    }
    let mut name = None;
    let mut description = None;
    let mut closed = false;
    let mut consumed = 0usize;
    for line in lines.by_ref() {
        consumed += 1;
        if line.trim_end() == "---" {
            closed = true;
            break;
        }
        if let Some((key, value)) = line.split_once(':') {
            let value = value.trim().trim_matches(|c| c == '"' || c == '\'').to_string();
            match key.trim() {
                "name" => name = Some(value),
                "description" => description = Some(value),
                _ => {}
            }
        }
    }
    if !closed {
        return Err(bad("front matter is not closed by a `---` line"));
    }
    let name = name.filter(|n| !n.is_empty()).ok_or_else(|| bad("front matter has no `name:`"))?;
    if name.contains(['/', '\\', '\0']) || name.chars().any(char::is_control) {
        return Err(bad("`name:` must not contain slashes or control characters"));
    }
    let description = description.filter(|d| !d.is_empty()).ok_or_else(|| bad("front matter has no `description:`"))?;
    let body: Vec<&str> = text.lines().skip(consumed + 1).collect();
    Ok(Skill { name, description, body: body.join("\n").trim().to_string(), path: path.to_path_buf() })
}

/// Every skill under `roots` (each a `.cairn`-style directory holding `sk/`),
/// later roots overriding earlier ones by name, sorted by name; plus the
/// errors of broken ones.
pub fn load_skills(roots: &[PathBuf]) -> (Vec<Skill>, Vec<DiscoveryError>) {
    let mut found: std::collections::BTreeMap<String, Skill> = std::collections::BTreeMap::new();
    let mut errors = Vec::new();
    for root in roots {
        let dir = root.join("sk");
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path().join("SKILL.md"))).collect();
        paths.sort();
        for path in paths {
            match std::fs::metadata(&path) {
                Err(_) => continue,
                Ok(m) if m.len() > MAX_SKILL_BYTES => {
                    errors.push(DiscoveryError::Skill {
                        path,
                        reason: format!("larger than {MAX_SKILL_BYTES} bytes; shorten it"),
                    });
                    continue;
                }
                Ok(_) => {}
            }
            match std::fs::read_to_string(&path) {
                Ok(text) => match parse_skill(&path, &text) {
                    Ok(skill) => {
                        found.insert(skill.name.clone(), skill);
                    }
                    Err(e) => errors.push(e),
                },
                Err(e) => errors.push(DiscoveryError::io(format!("cannot read {}", path.display()), e)),
            }
        }
    }
    (found.into_values().collect(), errors)
}
