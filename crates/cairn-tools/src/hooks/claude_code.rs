//! Claude Code's side of the hook protocol, so its hook scripts run
//! unchanged: its tool names for cairn's tools ([`TOOLS`]), its argument
//! names beside cairn's in `tool_input` ([`input_of`]), a rewrite written in
//! either spelling read back into cairn's ([`arguments_from`]), and matchers
//! read as Claude Code reads them ([`Matcher`]).
//!
//! It owns only these translations: it must not run anything or decide what
//! a hook's answer means (that is `super`'s).

use std::path::Path;

use serde_json::{Map, Value};

/// One tool as both agents name it: cairn's name, Claude Code's, and the
/// arguments named differently (cairn's, Claude Code's).
pub type Naming = (&'static str, &'static str, &'static [(&'static str, &'static str)]);

/// cairn's tool, Claude Code's name for it, and the arguments named
/// differently (cairn's, Claude Code's). Paths are made absolute for Claude
/// Code's `file_path`, as it gives them.
pub const TOOLS: &[Naming] = &[
    ("shell", "Bash", &[]),
    ("write_file", "Write", &[("path", "file_path")]),
    ("edit_file", "Edit", &[("path", "file_path"), ("old", "old_string"), ("new", "new_string")]),
    ("read_file", "Read", &[("path", "file_path")]),
    ("search", "Grep", &[]),
    ("list_dir", "LS", &[]),
    ("spawn_agent", "Task", &[]),
];

/// Claude Code's tool names that have no cairn tool: a matcher naming only
/// these is accepted without a warning, since it may be shared with Claude
/// Code.
const CLAUDE_ONLY: &[&str] =
    &["MultiEdit", "Glob", "NotebookEdit", "NotebookRead", "WebFetch", "WebSearch", "TodoWrite", "ExitPlanMode"];

/// Claude Code's name for cairn's `tool` (an MCP tool, `mcp__server__tool`,
/// is named alike in both), or `tool` itself.
pub fn name_of(tool: &str) -> &str {
    TOOLS.iter().find(|(ours, _, _)| *ours == tool).map_or(tool, |(_, theirs, _)| theirs)
}

fn renamed(tool: &str) -> &'static [(&'static str, &'static str)] {
    TOOLS.iter().find(|(ours, _, _)| *ours == tool).map_or(&[], |(_, _, fields)| fields)
}

/// A cairn path argument as Claude Code gives it: absolute.
fn absolute(cwd: &Path, value: &Value) -> Value {
    match value.as_str() {
        Some(p) if !Path::new(p).is_absolute() => Value::String(cwd.join(p).to_string_lossy().into_owned()),
        _ => value.clone(),
    }
}

/// `tool_input` for a hook: cairn's arguments, plus each argument Claude
/// Code names differently under its name (never replacing one of cairn's).
pub fn input_of(tool: &str, arguments: &Value, cwd: &Path) -> Value {
    let Value::Object(args) = arguments else { return arguments.clone() };
    let mut input = args.clone();
    for (ours, theirs) in renamed(tool) {
        if let Some(v) = args.get(*ours)
            && !input.contains_key(*theirs)
        {
            let v = if *theirs == "file_path" { absolute(cwd, v) } else { v.clone() };
            input.insert((*theirs).to_owned(), v);
        }
    }
    Value::Object(input)
}

/// The arguments a hook's `updatedInput` means, in cairn's names. A hook may
/// change an argument under either name (one written for Claude Code
/// changes `file_path`); the one it changed from what it was sent wins, and
/// changing both to different values is refused. `sent` is what the hook
/// was given ([`input_of`]).
pub fn arguments_from(tool: &str, sent: &Value, updated: Map<String, Value>, cwd: &Path) -> Result<Value, String> {
    let mut out = updated;
    for (ours, theirs) in renamed(tool) {
        let Some(their_value) = out.remove(*theirs) else { continue };
        if sent.get(*theirs) == Some(&their_value) {
            // Unchanged: cairn's name keeps what was sent unless changed.
            if let (false, Some(v)) = (out.contains_key(*ours), sent.get(*ours)) {
                out.insert((*ours).to_owned(), v.clone());
            }
            continue;
        }
        let value = match (*theirs, their_value.as_str()) {
            // Back to cairn's form: relative to the working directory when
            // inside it (the tool checks the path either way).
            ("file_path", Some(p)) => match Path::new(p).strip_prefix(cwd) {
                Ok(rel) if !rel.as_os_str().is_empty() => Value::String(rel.to_string_lossy().into_owned()),
                _ => their_value.clone(),
            },
            _ => their_value.clone(),
        };
        match out.get(*ours) {
            Some(mine) if sent.get(*ours) != Some(mine) && *mine != value => {
                return Err(format!(
                    "its updatedInput changes both {ours:?} and {theirs:?} (the same argument) to different values"
                ));
            }
            _ => {
                out.insert((*ours).to_owned(), value);
            }
        }
    }
    Ok(Value::Object(out))
}

/// A hook's `matcher`, read as Claude Code reads it: none, `""` or `*`
/// matches every tool; tool names separated by `|` match exactly (cairn's
/// own `name*` matches by prefix); anything else is a regular expression,
/// unanchored. It is matched against cairn's name of the tool and Claude
/// Code's ([`name_of`]).
#[derive(Debug, Clone)]
pub enum Matcher {
    /// Every tool.
    All,
    /// Exact names, or prefixes (`true`).
    Names(Vec<(String, bool)>),
    /// A regular expression.
    Regex(regex::Regex),
}

impl Matcher {
    /// Read `matcher`, or say why it cannot be.
    pub fn parse(matcher: Option<&str>) -> Result<Self, String> {
        let m = matcher.map(str::trim).unwrap_or_default();
        if m.is_empty() || m == "*" {
            return Ok(Matcher::All);
        }
        // Claude Code's exact names: letters, digits, `_` and `-` (a `.`
        // makes a regular expression, as in `mcp__git__.*`).
        let plain = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "_-".contains(c));
        let names: Option<Vec<(String, bool)>> = m
            .split('|')
            .map(|p| {
                let p = p.trim();
                match p.strip_suffix('*') {
                    Some(prefix) if plain(prefix) => Some((prefix.to_owned(), true)),
                    _ if plain(p) => Some((p.to_owned(), false)),
                    _ => None,
                }
            })
            .collect();
        match names {
            Some(names) => Ok(Matcher::Names(names)),
            None => regex::Regex::new(m).map(Matcher::Regex).map_err(|e| {
                format!(
                    "matcher {m:?} is neither tool names separated by `|` nor a regular expression: {}",
                    e.to_string().lines().last().unwrap_or_default()
                )
            }),
        }
    }

    fn matches_name(&self, name: &str) -> bool {
        match self {
            Matcher::All => true,
            Matcher::Names(names) => {
                names.iter().any(|(n, prefix)| if *prefix { name.starts_with(n.as_str()) } else { name == n })
            }
            Matcher::Regex(re) => re.is_match(name),
        }
    }

    /// Whether a hook with this matcher runs for cairn's `tool`.
    pub fn matches(&self, tool: &str) -> bool {
        self.matches_name(tool) || self.matches_name(name_of(tool))
    }

    /// Whether it can match any tool known here: cairn's built-in and
    /// `known` tools by either name, Claude Code's tools cairn lacks, and
    /// the tools of the MCP servers named in `mcp_servers`.
    pub fn names_a_tool(&self, known: &[String], mcp_servers: &[String]) -> bool {
        let mut names: Vec<String> = TOOLS.iter().flat_map(|(a, b, _)| [(*a).to_owned(), (*b).to_owned()]).collect();
        names.extend(CLAUDE_ONLY.iter().map(|n| (*n).to_owned()));
        names.extend(known.iter().cloned());
        if names.iter().any(|n| self.matches_name(n)) {
            return true;
        }
        // An MCP server's tools are not known before it starts: a matcher
        // naming the server's prefix counts.
        mcp_servers.iter().any(|server| {
            let prefix = format!("mcp__{server}__");
            match self {
                Matcher::All => true,
                Matcher::Names(names) => names.iter().any(|(n, _)| n.starts_with(&prefix)),
                Matcher::Regex(re) => re.is_match(&format!("{prefix}tool")) || re.as_str().contains(&prefix),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn matchers_read_as_claude_code_reads_them_over_either_name() {
        let m = |s: &str| Matcher::parse(Some(s)).unwrap();
        assert!(m("Bash").matches("shell") && !m("Bash").matches("write_file"));
        let edits = m("Edit|Write|MultiEdit");
        assert!(edits.matches("edit_file") && edits.matches("write_file") && !edits.matches("shell"));
        let mcp = m("mcp__x__.*");
        assert!(mcp.matches("mcp__x__do") && !mcp.matches("mcp__y__do"));
        assert!(m("*").matches("anything") && m("").matches("anything"));
        assert!(Matcher::parse(None).unwrap().matches("anything"));
        // cairn's own names and prefixes still mean what they meant.
        let own = m("shell|mcp__git__*");
        assert!(own.matches("shell") && own.matches("mcp__git__git_add"));
        assert!(!own.matches("shellx") && !own.matches("mcp__gitlab__x") && !own.matches("write_file"));
        assert!(Matcher::parse(Some("sh(ell")).is_err());
    }

    #[test]
    fn a_matcher_naming_no_known_tool_is_found() {
        let m = |s: &str| Matcher::parse(Some(s)).unwrap();
        let none: &[String] = &[];
        assert!(m("Bash").names_a_tool(none, none));
        assert!(m("MultiEdit").names_a_tool(none, none), "Claude Code's own tools are known");
        assert!(!m("Bsh").names_a_tool(none, none));
        assert!(!m("mcp__x__.*").names_a_tool(none, &["y".to_owned()]));
        assert!(m("mcp__x__.*").names_a_tool(none, &["x".to_owned()]));
        assert!(m("mcp__x__*").names_a_tool(none, &["x".to_owned()]));
        assert!(m("hello").names_a_tool(&["hello".to_owned()], none));
    }

    #[test]
    fn claude_code_s_fields_go_beside_cairn_s_and_come_back() {
        let cwd = Path::new("/w");
        let sent = input_of("edit_file", &json!({"path": "a.txt", "old": "x", "new": "y"}), cwd);
        assert_eq!(
            sent,
            json!({"path": "a.txt", "old": "x", "new": "y", "file_path": "/w/a.txt", "old_string": "x", "new_string": "y"})
        );
        // A Claude Code hook changes file_path and new_string.
        let mut updated = sent.as_object().unwrap().clone();
        updated.insert("file_path".into(), json!("/w/b.txt"));
        updated.insert("new_string".into(), json!("z"));
        let back = arguments_from("edit_file", &sent, updated, cwd).unwrap();
        assert_eq!(back, json!({"path": "b.txt", "old": "x", "new": "z"}));
        // A cairn hook changes path only.
        let mut updated = sent.as_object().unwrap().clone();
        updated.insert("path".into(), json!("c.txt"));
        assert_eq!(arguments_from("edit_file", &sent, updated, cwd).unwrap()["path"], "c.txt");
        // Both, to different values: refused.
        let mut updated = sent.as_object().unwrap().clone();
        updated.insert("path".into(), json!("c.txt"));
        updated.insert("file_path".into(), json!("/w/d.txt"));
        assert!(arguments_from("edit_file", &sent, updated, cwd).is_err());
        // A hook that sends back only Claude Code's fields.
        let only: Map<String, Value> = json!({"file_path": "/w/e.txt", "content": "c"}).as_object().unwrap().clone();
        let sent = input_of("write_file", &json!({"path": "a.txt", "content": "c"}), cwd);
        assert_eq!(arguments_from("write_file", &sent, only, cwd).unwrap(), json!({"path": "e.txt", "content": "c"}));
        assert_eq!(name_of("shell"), "Bash");
        assert_eq!(name_of("mcp__git__git_status"), "mcp__git__git_status");
    }
}
