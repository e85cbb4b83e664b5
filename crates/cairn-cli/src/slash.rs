//! `cairn chat`'s input: a line is a slash command (typed, listed by
//! `/help`), or a prompt, whose `@path` words attach files or directory
//! listings from the session's directory (bounded, the path recorded with
//! the text). An unknown `/word` is an error, never a prompt; `//` starts a
//! prompt with a literal `/`. It must not run turns (`turns.rs` does) or
//! print (it returns text for the renderer).

use std::fmt::Write as _;
use std::path::Path;

/// One line typed at the chat prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// Nothing to do.
    Empty,
    /// A prompt for the model (before `@path` attachment).
    Prompt(String),
    /// A command for cairn.
    Command(Slash),
}

/// The chat's commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slash {
    /// `/help`.
    Help,
    /// `/quit`, `/exit`.
    Quit,
    /// `/status`: session, lane, provider, usage so far.
    Status,
    /// `/tools`: the tools the next turn is offered.
    Tools,
    /// `/sessions`: the sessions of this cairn home.
    Sessions,
    /// `/diff`: the files this session's calls changed.
    Diff,
    /// `/last`: the last tool call's whole output.
    Last,
    /// `/allow PATTERN`: allow matching Write calls for this session.
    Allow(String),
    /// `/compact`: summarise the conversation now.
    Compact,
    /// `/fork NAME`: a new lane at the current head, and switch to it.
    Fork(String),
    /// `/undo [N]`: revert the last turn's (or turn N's and later) file
    /// effects and move the lane back.
    Undo(Option<usize>),
    /// `/redo`: reapply the undo the lane stands on.
    Redo,
    /// `/clear`: continue in a new session.
    Clear,
    /// `/model [NAME]`: show, or switch for the next turns.
    Model(Option<String>),
    /// `/provider [NAME]`: show the provider and the configured ones, or
    /// switch to NAME for the next turns.
    Provider(Option<String>),
    /// `/resume ID`: continue in another session (id, prefix or name).
    Resume(String),
    /// A `/word` cairn does not know.
    Unknown(String),
}

/// The commands and what they do, in `/help`'s order.
pub const COMMANDS: &[(&str, &str)] = &[
    ("/help", "this list"),
    ("/status", "session, lane, provider and model, context used, tokens and cost so far"),
    ("/model [NAME]", "show the model, or use NAME for the next turns"),
    ("/provider [NAME]", "show the provider and the configured ones, or switch to NAME"),
    ("/tools", "the tools the next turn is offered, with their risk"),
    ("/diff", "the files this session's tool calls changed"),
    ("/last", "the last tool call's whole output (the screen folds it)"),
    ("/allow PATTERN", "allow Write calls matching PATTERN for this session (never Destructive)"),
    ("/compact", "summarise the conversation so far (it then takes less of the context window)"),
    ("/fork NAME", "a new lane from here, and continue on it (the old lane stays)"),
    ("/undo [N]", "revert the files the last turn (or turn N and later) changed, and the conversation with them"),
    ("/redo", "reapply what the last /undo reverted"),
    ("/sessions", "the sessions here, newest first"),
    ("/resume ID", "continue in session ID (an id, its start, or a name; /sessions lists them)"),
    ("/clear", "continue in a new session"),
    ("/quit", "leave (also /exit, Ctrl-D)"),
];

/// Read one line.
pub fn parse(line: &str) -> Line {
    let text = line.trim_end_matches(['\n', '\r']);
    if text.trim().is_empty() {
        return Line::Empty;
    }
    let trimmed = text.trim_start();
    if let Some(rest) = trimmed.strip_prefix("//") {
        return Line::Prompt(format!("/{rest}"));
    }
    let Some(command) = trimmed.strip_prefix('/') else {
        return Line::Prompt(text.trim().to_owned());
    };
    let mut words = command.split_whitespace();
    let word = words.next().unwrap_or_default();
    let rest: Vec<&str> = words.collect();
    Line::Command(match (word, rest.as_slice()) {
        ("help" | "?", []) => Slash::Help,
        ("quit" | "exit", []) => Slash::Quit,
        ("status", []) => Slash::Status,
        ("tools", []) => Slash::Tools,
        ("sessions", []) => Slash::Sessions,
        ("diff", []) => Slash::Diff,
        ("last", []) => Slash::Last,
        ("compact", []) => Slash::Compact,
        ("fork", [name]) => Slash::Fork((*name).to_owned()),
        ("undo", []) => Slash::Undo(None),
        ("undo", [n]) => match n.parse::<usize>() {
            Ok(n) if n > 0 => Slash::Undo(Some(n)),
            _ => Slash::Unknown(trimmed.to_owned()),
        },
        ("redo", []) => Slash::Redo,
        ("allow", [_, ..]) => Slash::Allow(command["allow".len()..].trim().to_owned()),
        ("clear", []) => Slash::Clear,
        ("model", []) => Slash::Model(None),
        ("model", [name]) => Slash::Model(Some((*name).to_owned())),
        ("provider", []) => Slash::Provider(None),
        ("provider", [name]) => Slash::Provider(Some((*name).to_owned())),
        ("resume", [id]) => Slash::Resume((*id).to_owned()),
        _ => Slash::Unknown(trimmed.to_owned()),
    })
}

/// `/help`'s text.
pub fn help() -> String {
    let mut out = String::from("commands:\n");
    for (name, what) in COMMANDS {
        let _ = writeln!(out, "  {name:<18} {what}");
    }
    out.push_str("  @PATH in a prompt attaches that file (or a directory's listing); start with // for a literal /\n");
    out
}

/// What the refusal of an unknown command says.
pub fn unknown(text: &str) -> String {
    format!(
        "unknown command {text:?}: nothing was sent to the model; /help lists the commands, and a prompt starting with // sends a literal /"
    )
}

/// Bytes of one attached file, at most.
pub const MAX_ATTACH_FILE: usize = 64 * 1024;
/// Bytes of every attachment of one prompt, at most.
pub const MAX_ATTACH_TOTAL: usize = 256 * 1024;
/// Entries of an attached directory's listing, at most.
pub const MAX_LISTING: usize = 200;

/// `prompt` with its `@path` words attached: each path must be inside
/// `cwd` (links resolved); a file's text (bounded, cut marked) or a
/// directory's listing follows the prompt, headed by the path. An
/// `@word` naming nothing that exists stays plain text (an e-mail
/// address, a handle); one that leaves `cwd` or cannot be read is an error.
pub fn attach(cwd: &Path, prompt: &str) -> Result<String, String> {
    let root = cwd.canonicalize().map_err(|e| format!("cannot resolve {}: {e}", cwd.display()))?;
    let mut out = prompt.to_owned();
    let mut total = 0usize;
    for word in prompt.split_whitespace() {
        let Some(raw) = word.strip_prefix('@') else { continue };
        let raw = raw.trim_end_matches([',', '.', ';', ':', '!', '?', ')']);
        if raw.is_empty() {
            continue;
        }
        let candidate = root.join(raw);
        let Ok(path) = candidate.canonicalize() else { continue };
        if !path.starts_with(&root) {
            return Err(format!("@{raw} is outside the session's directory {}; nothing was sent", root.display()));
        }
        let shown = path.strip_prefix(&root).map_or_else(|_| raw.to_owned(), |p| p.display().to_string());
        let body = if path.is_dir() {
            let mut names: Vec<String> = std::fs::read_dir(&path)
                .map_err(|e| format!("cannot list @{raw}: {e}"))?
                .flatten()
                .map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if e.path().is_dir() { format!("{name}/") } else { name }
                })
                .collect();
            names.sort();
            let more = names.len().saturating_sub(MAX_LISTING);
            names.truncate(MAX_LISTING);
            let mut listing = names.join("\n");
            if more > 0 {
                let _ = write!(listing, "\n[… {more} more entries]");
            }
            format!("\n\n[attached @{shown}/: directory listing]\n{listing}")
        } else {
            let bytes = std::fs::read(&path).map_err(|e| format!("cannot read @{raw}: {e}"))?;
            let keep = bytes.len().min(MAX_ATTACH_FILE);
            let mut text = String::from_utf8_lossy(&bytes[..keep]).into_owned();
            if keep < bytes.len() {
                let _ = write!(text, "\n[… cut: {keep} of {} bytes attached]", bytes.len());
            }
            format!("\n\n[attached @{shown} ({} bytes)]\n```\n{text}\n```", bytes.len())
        };
        total += body.len();
        if total > MAX_ATTACH_TOTAL {
            return Err(format!(
                "the attachments of this prompt pass {MAX_ATTACH_TOTAL} bytes; attach fewer or smaller files (nothing was sent)"
            ));
        }
        out.push_str(&body);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_prompts_and_escapes() {
        assert_eq!(parse("  \n"), Line::Empty);
        assert_eq!(parse("hello /help\n"), Line::Prompt("hello /help".into()));
        assert_eq!(parse("/help"), Line::Command(Slash::Help));
        assert_eq!(parse("/model gpt-x"), Line::Command(Slash::Model(Some("gpt-x".into()))));
        assert_eq!(parse("//etc/hosts is odd"), Line::Prompt("/etc/hosts is odd".into()));
        assert_eq!(parse("/provider"), Line::Command(Slash::Provider(None)));
        assert_eq!(parse("/provider local"), Line::Command(Slash::Provider(Some("local".into()))));
        assert_eq!(parse("/resume 01ab"), Line::Command(Slash::Resume("01ab".into())));
        for typo in ["/hepl", "/model a b", "/quit now", "/", "/resume", "/resume a b"] {
            assert!(matches!(parse(typo), Line::Command(Slash::Unknown(_))), "{typo}");
        }
    }

    #[test]
    fn attachments_stay_inside_the_directory_and_are_bounded() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let cwd = dir.path();
        std::fs::write(cwd.join("notes.txt"), "launch code 7-4-1").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(cwd.join("big.bin"), vec![b'x'; MAX_ATTACH_FILE + 10]).unwrap_or_else(|e| panic!("{e}"));
        let out = attach(cwd, "read @notes.txt, then mail me@example.com").unwrap_or_default();
        assert!(out.contains("[attached @notes.txt (17 bytes)]") && out.contains("7-4-1"), "{out}");
        assert!(!out.contains("attached @example"), "{out}");
        let big = attach(cwd, "@big.bin").unwrap_or_default();
        assert!(big.contains("cut: 65536 of 65546 bytes"), "{}", &big[big.len() - 80..]);
        assert!(attach(cwd, "@../../etc/passwd").is_err() || !cwd.join("../../etc/passwd").exists());
        assert!(attach(cwd, "@/etc/hostname").is_err() || !Path::new("/etc/hostname").exists());
    }
}
