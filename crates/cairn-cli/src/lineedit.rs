//! `cairn chat`'s line editor on a terminal (rustyline): editing keys,
//! history per working directory (kept private in cairn's data directory),
//! Ctrl-R search, Alt-Enter for a newline inside a prompt, bracketed paste
//! (pasted newlines stay in one prompt), and Tab completion of slash
//! commands and of `@path` words. Without a terminal it reads plain lines.
//! It must not interpret what was typed (`slash.rs` does).

use std::io::BufRead;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use rustyline::completion::{Completer, Pair};
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::history::DefaultHistory;
use rustyline::validate::Validator;
use rustyline::{Cmd, Config, Editor, EventHandler, KeyCode, KeyEvent, Modifiers};
use sha2::{Digest, Sha256};

/// What reading a line gave.
#[derive(Debug)]
pub enum Read {
    /// A line (possibly several, from Alt-Enter or a paste).
    Line(String),
    /// Ctrl-C at the prompt.
    Interrupted,
    /// Ctrl-D, or the end of the input.
    Eof,
}

/// Completion of `/commands` (at the start of the line) and `@paths` (of
/// the session's directory).
pub struct Complete {
    cwd: PathBuf,
}

impl Completer for Complete {
    type Candidate = Pair;

    fn complete(&self, line: &str, pos: usize, _: &rustyline::Context<'_>) -> rustyline::Result<(usize, Vec<Pair>)> {
        let before = &line[..pos];
        let start = before.rfind(char::is_whitespace).map_or(0, |i| i + 1);
        let word = &before[start..];
        if start == 0 && word.starts_with('/') {
            let names = crate::slash::COMMANDS.iter().filter_map(|(usage, _)| usage.split_whitespace().next());
            let found = names
                .filter(|name| name.starts_with(word))
                .map(|name| Pair { display: name.to_owned(), replacement: format!("{name} ") })
                .collect();
            return Ok((0, found));
        }
        let Some(partial) = word.strip_prefix('@') else {
            return Ok((pos, Vec::new()));
        };
        let (dir, prefix) = match partial.rfind('/') {
            Some(i) => (&partial[..=i], &partial[i + 1..]),
            None => ("", partial),
        };
        let Ok(read) = std::fs::read_dir(self.cwd.join(dir)) else {
            return Ok((pos, Vec::new()));
        };
        let mut found: Vec<Pair> = read
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                (name.starts_with(prefix) && (prefix.starts_with('.') || !name.starts_with('.'))).then(|| {
                    let slash = if e.path().is_dir() { "/" } else { "" };
                    Pair { display: format!("{name}{slash}"), replacement: format!("@{dir}{name}{slash}") }
                })
            })
            .take(200)
            .collect();
        found.sort_by(|a, b| a.display.cmp(&b.display));
        Ok((start, found))
    }
}

impl Hinter for Complete {
    type Hint = String;
}
impl Highlighter for Complete {}
impl Validator for Complete {}
impl rustyline::Helper for Complete {}

/// Where the history of prompts typed in `cwd` is kept.
fn history_file(data: &Path, cwd: &Path) -> PathBuf {
    let digest = Sha256::digest(cwd.as_os_str().as_encoded_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    data.join("history").join(hex)
}

/// The chat's input.
pub enum Input {
    /// A person at a terminal.
    Terminal {
        /// The editor.
        editor: Box<Editor<Complete, DefaultHistory>>,
        /// Its history file.
        history: PathBuf,
    },
    /// Lines from a pipe or a file.
    Plain,
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Input::Terminal { .. } => "Input::Terminal",
            Input::Plain => "Input::Plain",
        })
    }
}

impl Input {
    /// The editor when stdin is a terminal (history of `cwd` loaded), else
    /// plain lines.
    pub fn new(data: &Path, cwd: &Path, terminal: bool) -> Result<Self> {
        if !terminal {
            return Ok(Input::Plain);
        }
        let config = Config::builder()
            .max_history_size(10_000)
            .context("history size")?
            .history_ignore_dups(true)
            .context("history")?
            .auto_add_history(false)
            .bracketed_paste(true)
            .build();
        let mut editor: Editor<Complete, DefaultHistory> =
            Editor::with_config(config).context("cannot start the line editor")?;
        editor.set_helper(Some(Complete { cwd: cwd.to_path_buf() }));
        // Alt-Enter (ESC then Enter in most terminals): a newline inside
        // the prompt instead of sending it.
        editor.bind_sequence(KeyEvent(KeyCode::Enter, Modifiers::ALT), EventHandler::Simple(Cmd::Newline));
        let history = history_file(data, cwd);
        // A missing or unreadable history starts empty.
        let _ = editor.load_history(&history);
        Ok(Input::Terminal { editor: Box::new(editor), history })
    }

    /// Read the next line, showing `prompt` on a terminal (as written, and
    /// styled).
    /// The line starts as `initial`: the text before and after the cursor
    /// (keys typed while a turn ran, `typeahead.rs`).
    pub fn read_with(&mut self, prompt: &(&str, String), initial: (&str, &str)) -> Result<Read> {
        match self {
            Input::Plain => {
                let mut line = String::new();
                let n = std::io::stdin().lock().read_line(&mut line).context("cannot read from stdin")?;
                Ok(if n == 0 { Read::Eof } else { Read::Line(line) })
            }
            Input::Terminal { editor, history } => match editor.readline_with_initial(prompt, initial) {
                Ok(line) => {
                    if !line.trim().is_empty() {
                        let _ = editor.add_history_entry(line.as_str());
                        save_history(editor, history);
                    }
                    Ok(Read::Line(line))
                }
                Err(rustyline::error::ReadlineError::Interrupted) => Ok(Read::Interrupted),
                Err(rustyline::error::ReadlineError::Eof) => Ok(Read::Eof),
                Err(e) => Err(e).context("cannot read from the terminal"),
            },
        }
    }
}

/// Keep the history private (0600 in a 0700 directory): prompts may hold
/// anything the person typed.
fn save_history(editor: &mut Editor<Complete, DefaultHistory>, path: &Path) {
    if let Some(dir) = path.parent()
        && std::fs::create_dir_all(dir).is_ok()
    {
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    }
    // Created 0600 before rustyline writes it.
    let _ = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path);
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    let _ = editor.save_history(path);
}
