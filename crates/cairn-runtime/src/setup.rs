//! What the runtime is given by whoever runs it (the `cairn` binary parses
//! it from its command line; an embedder fills it in): the person's choices
//! for this run beyond the configuration file ([`Common`]), the resolved
//! paths and settings, and where the runtime's notes go ([`Notes`]).
//!
//! Plain data: it must not parse a command line, know exit codes or touch
//! the terminal (the CLI owns clap, printing and `--json`). It was called
//! "context", a word cairn keeps for the model's context window (core's
//! `context.rs`, `turn/context.rs`, `docs/context.md`).

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::Settings;
use crate::paths::Paths;

/// What the person chose for this run that the configuration file does not
/// say (the CLI's global flags, less the ones folded into [`Settings`]
/// through `config::Overrides` and the ones only the CLI's output reads).
#[derive(Debug, Clone, Default)]
pub struct Common {
    /// Working directory of a new session (default: the current directory).
    pub cwd: Option<PathBuf>,
    /// A name for a new session (usable instead of its id).
    pub name: Option<String>,
    /// Approve every Write call without asking (never Destructive ones).
    pub yes: bool,
    /// Never compact the conversation by summary.
    pub no_compaction: bool,
    /// The lane a resumed or continued session runs on.
    pub lane: Option<String>,
    /// Run external tools unsandboxed when the kernel cannot sandbox them.
    pub allow_unsandboxed: bool,
    /// The tool service to use (over `[tools] toolsrv`).
    pub toolsrv: Option<String>,
}

/// Something the runtime tells the person running it beside a result: a
/// problem that did not stop the work, or what a long-running part is
/// doing. The CLI writes it on stderr; an embedder decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// A problem that did not stop the command (a session file skipped,
    /// the pre-image store collected past its budget).
    Warning(String),
    /// What the runtime is doing or found (a hook's failure, waiting for
    /// running children, a bad `[batch]` table).
    Info(String),
    /// About one session a PostgreSQL worker drives (its notes, what an
    /// interrupted undo did, why it failed).
    Worker {
        /// The session's id.
        session: String,
        /// What happened.
        text: String,
    },
}

/// Where the runtime's [`Note`]s go. The default drops them (an embedder
/// that wants them gives a function: [`Notes::new`]).
#[derive(Clone)]
pub struct Notes(Arc<dyn Fn(Note) + Send + Sync>);

impl Notes {
    /// Notes handed to `sink`.
    pub fn new(sink: impl Fn(Note) + Send + Sync + 'static) -> Self {
        Self(Arc::new(sink))
    }

    /// Tell `note`.
    pub fn tell(&self, note: Note) {
        (self.0)(note);
    }

    /// Tell a [`Note::Warning`].
    pub fn warn(&self, text: impl Into<String>) {
        self.tell(Note::Warning(text.into()));
    }

    /// Tell a [`Note::Info`].
    pub fn info(&self, text: impl Into<String>) {
        self.tell(Note::Info(text.into()));
    }
}

impl Default for Notes {
    fn default() -> Self {
        Self::new(|_| {})
    }
}

impl std::fmt::Debug for Notes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Notes")
    }
}

/// Everything the runtime's functions need from the environment.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The person's choices for this run.
    pub common: Common,
    /// Where cairn's files are.
    pub paths: Paths,
    /// The resolved configuration.
    pub settings: Settings,
    /// Where notes go.
    pub notes: Notes,
}

impl Setup {
    /// A setup over `paths` and `settings` with no choices beyond them
    /// and notes dropped (see [`Setup::with_notes`]).
    pub fn new(paths: Paths, settings: Settings) -> Self {
        Self { common: Common::default(), paths, settings, notes: Notes::default() }
    }

    /// This setup with `common`.
    pub fn with_common(mut self, common: Common) -> Self {
        self.common = common;
        self
    }

    /// This setup with its notes going to `notes`.
    pub fn with_notes(mut self, notes: Notes) -> Self {
        self.notes = notes;
        self
    }
}
