//! What every command of the binary receives from `main` ([`Invocation`]):
//! the runtime's setup (the settings sessions are built from:
//! `cairn_runtime::setup`),
//! the flags as parsed ([`Flags`]: the output's form, `--json`, `--quiet`,
//! `--plain`, is read only here), the output styles, and the documented
//! exit codes. It sits below `cli` (which parses and dispatches) and the
//! command modules (which use it), and depends on neither.

use std::path::PathBuf;

use clap::Args;

use crate::config::Overrides;
use crate::style::Style;

/// Exit codes, documented in `--help`.
pub mod exit {
    /// The command did what was asked.
    pub const SUCCESS: u8 = 0;
    /// Something failed (the message says what to do).
    pub const ERROR: u8 = 1;
    /// The command line was wrong.
    pub const USAGE: u8 = 2;
    /// The turn was cancelled (Ctrl-C) and can be resumed with `cairn resume`.
    pub const CANCELLED: u8 = 3;
    /// The turn finished, but a tool call was denied or refused.
    pub const DENIED: u8 = 4;
}

/// Flags shared by every command, as parsed.
#[derive(Debug, Args, Clone, Default)]
pub struct Flags {
    /// Provider: local (default), openai, openai-responses, anthropic, scripted, or a name from the config file.
    #[arg(long, global = true, value_name = "NAME")]
    pub provider: Option<String>,
    /// Model name for the provider.
    #[arg(long, global = true, value_name = "M")]
    pub model: Option<String>,
    /// Use the scripted provider with this JSONL script (one model turn per line).
    #[arg(long, global = true, value_name = "FILE")]
    pub script: Option<PathBuf>,
    /// Working directory of a new session (default: the current directory).
    #[arg(long, global = true, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// A name for the session (usable instead of its id).
    #[arg(long, global = true, value_name = "ALIAS")]
    pub name: Option<String>,
    /// Allow Write tool calls matching PATTERN without asking, e.g. 'shell(ls *)' or 'write_file'. Never Destructive.
    #[arg(long, global = true, value_name = "PATTERN")]
    pub allow: Vec<String>,
    /// Approve every Write call without asking. Destructive calls still ask.
    #[arg(long, global = true)]
    pub yes: bool,
    /// One JSON event per line on stdout (deltas, tool lifecycle, approvals, usage, final).
    #[arg(long, global = true)]
    pub json: bool,
    /// Print only the answer.
    #[arg(long, short, global = true)]
    pub quiet: bool,
    /// Print answers as the model wrote them (no Markdown rendering on a terminal).
    #[arg(long, global = true)]
    pub plain: bool,
    /// Never compact the conversation by summary (requests still fit the context window: the oldest messages are left out).
    #[arg(long, global = true)]
    pub no_compaction: bool,
    /// The lane (branch) a resumed or continued session runs on (see `cairn fork`).
    #[arg(long, global = true, value_name = "LANE")]
    pub lane: Option<String>,
    /// Keep sessions in this PostgreSQL database (postgres://USER@HOST/DB) instead of files; also `database` in the config.
    #[arg(long, global = true, value_name = "URL")]
    pub database: Option<String>,
    /// Run external tools unsandboxed when the kernel cannot sandbox them (this session only).
    #[arg(long, global = true)]
    pub allow_unsandboxed: bool,
    /// Use the tools of a `cairn toolsrv` at this dial string (unix!PATH or tcp!HOST!PORT); also `[tools] toolsrv`.
    #[arg(long, global = true, value_name = "ADDR")]
    pub toolsrv: Option<String>,
}

impl Flags {
    /// What the runtime reads of them beyond the configuration.
    pub fn common(&self) -> cairn_runtime::setup::Common {
        cairn_runtime::setup::Common {
            cwd: self.cwd.clone(),
            name: self.name.clone(),
            yes: self.yes,
            no_compaction: self.no_compaction,
            lane: self.lane.clone(),
            allow_unsandboxed: self.allow_unsandboxed,
            toolsrv: self.toolsrv.clone(),
        }
    }

    /// The ones that override the configuration file.
    pub fn overrides(&self) -> Overrides {
        Overrides {
            provider: self.provider.clone(),
            model: self.model.clone(),
            script: self.script.clone(),
            allow: self.allow.clone(),
            database: self.database.clone(),
        }
    }
}

/// Everything a command needs from the environment: the runtime's setup
/// (read through it: `ctx.paths`, `ctx.settings`, `ctx.common`, and passed
/// as it to the runtime's functions), the flags as parsed, and the styles.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// The runtime's setup.
    pub setup: cairn_runtime::setup::Setup,
    /// The flags as parsed.
    pub flags: Flags,
    /// Styles of stderr and stdout.
    pub err_style: Style,
    pub out_style: Style,
}

impl std::ops::Deref for Invocation {
    type Target = cairn_runtime::setup::Setup;

    fn deref(&self) -> &Self::Target {
        &self.setup
    }
}

/// The runtime's notes, each a line on stderr: a warning as `warning: …`
/// (in `style`'s yellow), the rest as `cairn: …` or `cairn worker: session
/// ID: …`; escaped, since they quote file names and errors.
pub fn notes_on_stderr(style: Style) -> cairn_runtime::setup::Notes {
    use cairn_runtime::setup::Note;
    use std::io::Write as _;
    let esc = crate::escape::escape_controls;
    cairn_runtime::setup::Notes::new(move |note| {
        let line = match note {
            Note::Warning(text) => format!("{} {}", style.yellow("warning:"), esc(&text)),
            Note::Info(text) => format!("cairn: {}", esc(&text)),
            Note::Worker { session, text } => format!("cairn worker: session {}: {}", esc(&session), esc(&text)),
        };
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    })
}
