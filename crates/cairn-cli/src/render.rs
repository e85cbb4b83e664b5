//! Turning the turn's events into output: human text (the answer streamed
//! on stdout, tool activity and a usage line on stderr, a spinner while
//! waiting for the first token) or, with `--json`, one JSON object per line
//! on stdout.
//!
//! It only renders; it never decides anything about the turn.
//!
//! It also owns the one rule for putting untrusted text on a terminal
//! ([`escape_controls`], and [`escape_json`] for JSON lines): model text,
//! tool output, arguments and anything read back from a session file go
//! through it, so no control sequence they carry reaches the terminal raw.

pub use crate::escape::{escape_controls, escape_json, short};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use cairn_core::TurnEvent;
use cairn_core::approval::Answer;
use cairn_core::provider::StreamEvent;
use serde_json::json;

use crate::style::Style;

/// The spinner on the terminal now, if any. A question to the person
/// hides it first ([`hide_spinner`]), whoever asks: a subagent's question
/// comes while its parent's spinner runs, and tells no event of its own.
static DRAWN: std::sync::Mutex<Option<indicatif::ProgressBar>> = std::sync::Mutex::new(None);

/// Take the spinner off the terminal (it is drawn again with the turn's
/// next event), so what is written next stays on screen.
pub fn hide_spinner() {
    let drawn = DRAWN.lock().ok().and_then(|mut drawn| drawn.take());
    if let Some(spinner) = drawn {
        spinner.finish_and_clear();
    }
}

/// How to render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Text for people.
    Human,
    /// Only the answer.
    Quiet,
    /// JSON lines.
    Json,
}

/// Totals of one turn, for the usage line and the exit code.
#[derive(Debug, Default, Clone)]
pub struct Totals {
    /// The turn's provider attempts, summed as every face sums a ledger.
    pub usage: cairn_core::report::UsageTotals,
    /// Tool calls denied or refused.
    pub denied: u32,
    /// Tool calls settled.
    pub tools: u32,
    /// The model of the last attempt.
    pub model: String,
}

/// Renders events as they come.
pub struct Renderer {
    mode: Mode,
    out: Style,
    err: Style,
    started: Instant,
    spinner: Option<indicatif::ProgressBar>,
    /// Whether the answer text currently ends without a newline.
    open_line: bool,
    /// Pending stdout write error (a closed pipe), reported after the turn.
    pub write_error: Option<std::io::Error>,
    /// Totals so far.
    pub totals: Totals,
    /// The model's context window, when known.
    window: Option<u32>,
    /// Answers rendered as Markdown (a terminal, not `--plain`).
    markdown: Option<crate::markdown::Markdown>,
    /// Tool output shown so far for the running call.
    fold: Fold,
    /// The session's usage so far and its cost, for the status line.
    session: Option<crate::status::SessionUsage>,
}

/// Tool output on a terminal: the first lines of each call, the rest
/// counted (the whole output stays in the session file).
#[derive(Debug, Clone, Copy)]
struct Fold {
    /// Lines shown per call (`usize::MAX`: all, when stderr is not a terminal).
    limit: usize,
    /// Lines shown so far.
    lines: usize,
    /// Lines not shown.
    hidden: usize,
}

/// Lines of a tool's output shown on a terminal.
const FOLD_LINES: usize = 12;

impl Fold {
    fn new(limit: usize) -> Self {
        Self { limit, lines: 0, hidden: 0 }
    }

    /// The part of `chunk` to show.
    fn show(&mut self, chunk: &str) -> String {
        let mut out = String::new();
        for piece in chunk.split_inclusive('\n') {
            if self.lines < self.limit {
                out.push_str(piece);
            } else if piece.ends_with('\n') {
                self.hidden += 1;
            }
            if piece.ends_with('\n') {
                self.lines += 1;
            }
        }
        out
    }
}

impl std::fmt::Debug for Renderer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renderer").field("mode", &self.mode).field("totals", &self.totals).finish_non_exhaustive()
    }
}

impl Renderer {
    /// A renderer for `mode`.
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            out: Style::stdout(),
            err: Style::stderr(),
            started: Instant::now(),
            spinner: None,
            open_line: false,
            write_error: None,
            totals: Totals::default(),
            window: None,
            markdown: None,
            fold: Fold::new(if std::io::stderr().is_terminal() { FOLD_LINES } else { usize::MAX }),
            session: None,
        }
    }

    /// Start timing a turn (and the spinner, on a terminal).
    pub fn begin(&mut self) {
        self.started = Instant::now();
        self.totals = Totals::default();
        self.start_spinner("thinking");
    }

    fn start_spinner(&mut self, message: &str) {
        if self.mode == Mode::Human && std::io::stderr().is_terminal() && self.spinner.is_none() {
            let spinner = indicatif::ProgressBar::new_spinner();
            spinner.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            // What is running and for how long (the turn's clock).
            if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg} {elapsed}") {
                spinner.set_style(style);
            }
            spinner.set_message(message.to_owned());
            spinner.enable_steady_tick(Duration::from_millis(100));
            if let Ok(mut drawn) = DRAWN.lock() {
                *drawn = Some(spinner.clone());
            }
            self.spinner = Some(spinner);
        }
    }

    fn stop_spinner(&mut self) {
        if let Some(spinner) = self.spinner.take() {
            if let Ok(mut drawn) = DRAWN.lock() {
                drawn.take();
            }
            spinner.finish_and_clear();
        }
    }

    /// Write a JSON line describing something outside the turn (the session).
    pub fn json_line(&mut self, value: &serde_json::Value) {
        if self.mode == Mode::Json {
            self.write_out(&format!("{}\n", escape_json(&value.to_string())));
        }
    }

    fn write_out(&mut self, text: &str) {
        if self.write_error.is_some() {
            return;
        }
        let mut out = std::io::stdout().lock();
        if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            self.write_error = Some(e);
        }
    }

    /// A message about the run itself (not the turn): stderr for people,
    /// a `notice` object in JSON mode, nothing when quiet.
    pub fn notice(&mut self, text: &str) {
        match self.mode {
            Mode::Json => self.json_line(&json!({"type": "notice", "message": text})),
            Mode::Human => {
                let line = self.err.dim(&escape_controls(text));
                self.note(&line);
            }
            Mode::Quiet => {}
        }
    }

    fn note(&mut self, text: &str) {
        if self.mode != Mode::Human {
            return;
        }
        self.stop_spinner();
        // The answer's text so far goes out before the note (a tool call
        // follows the sentence that announced it).
        if let Some(rest) = self.markdown.as_mut().map(crate::markdown::Markdown::finish)
            && !rest.is_empty()
        {
            self.open_line = !rest.ends_with('\n');
            self.write_out(&rest);
        }
        let mut err = std::io::stderr().lock();
        if self.open_line {
            let _ = writeln!(std::io::stdout());
            self.open_line = false;
        }
        let _ = writeln!(err, "{text}");
    }

    /// Render one event.
    pub fn event(&mut self, event: &TurnEvent) {
        self.count(event);
        if self.mode == Mode::Json {
            match serde_json::to_string(event) {
                Ok(line) => self.write_out(&format!("{}\n", escape_json(&line))),
                Err(e) => self.write_out(&format!("{}\n", json!({"type": "renderError", "message": e.to_string()}))),
            }
            return;
        }
        if matches!(event, TurnEvent::ToolCompleted { .. } | TurnEvent::ToolFailed { .. }) {
            let hidden = self.fold.hidden;
            self.fold = Fold::new(self.fold.limit);
            if hidden > 0 {
                let line =
                    self.err.dim(&format!("  … {hidden} more lines of output folded (/last in chat shows them)"));
                self.note(&line);
            }
        }
        match event {
            TurnEvent::Delta { event: StreamEvent::TextDelta { text } } => {
                self.stop_spinner();
                let shown = match &mut self.markdown {
                    Some(md) => md.push(text),
                    None => escape_controls(text).into_owned(),
                };
                if !shown.is_empty() {
                    self.open_line = !shown.ends_with('\n');
                    self.write_out(&shown);
                }
            }
            TurnEvent::Delta { event: StreamEvent::AttemptStarted { attempt } } if *attempt > 1 => {
                // The partial line of the failed attempt is dropped too.
                if let Some(md) = &mut self.markdown {
                    let _ = md.finish();
                }
                self.note(
                    &self.err.yellow(&format!("… retrying (attempt {attempt}); earlier partial output is discarded")),
                );
            }
            TurnEvent::ToolStarted { tool, .. } => {
                let running = format!("running {}", short(&escape_controls(tool), 60));
                self.start_spinner(&running);
            }
            TurnEvent::ToolRequested { tool, arguments, .. } if tool == cairn_tools::builtin::plan::NAME => {
                // The model's plan, as a checklist (a plan the tool will
                // refuse is shown as its arguments).
                match cairn_tools::builtin::plan::Plan::from_arguments(arguments) {
                    Ok(plan) => {
                        let list = escape_controls(plan.checklist().trim_end()).into_owned().replace('\n', "\n    ");
                        self.note(&format!("{} {}\n    {list}", self.err.cyan("●"), self.err.bold("plan")));
                    }
                    Err(_) => {
                        let args = escape_controls(&short(&arguments.to_string(), 120)).into_owned();
                        self.note(&format!("{} {} {}", self.err.cyan("●"), self.err.bold(tool), self.err.dim(&args)));
                    }
                }
            }
            TurnEvent::ToolRequested { tool, arguments, .. } => {
                let args = escape_controls(&short(&arguments.to_string(), 120)).into_owned();
                let tool = escape_controls(tool);
                self.note(&format!("{} {} {}", self.err.cyan("●"), self.err.bold(&tool), self.err.dim(&args)));
            }
            TurnEvent::ToolOutput { chunk, .. } if self.mode == Mode::Human => {
                self.stop_spinner();
                let shown = self.fold.show(chunk);
                if !shown.is_empty() {
                    let mut err = std::io::stderr().lock();
                    let _ = write!(err, "{}", self.err.dim(&escape_controls(&shown)));
                }
            }
            TurnEvent::ToolCompleted { tool, exit_code, truncated, .. } => {
                let cut = if *truncated { ", output truncated for the model" } else { "" };
                let tool = escape_controls(tool);
                // A command that ran and exited non-zero did not succeed:
                // marked as failed, not with a green tick (issue 49.9).
                if *exit_code == 0 {
                    self.note(&format!("  {} {tool} (exit {exit_code}{cut})", self.err.green("✓")));
                } else {
                    self.note(&format!("  {} {tool} failed (exit {exit_code}{cut})", self.err.red("✗")));
                }
                self.start_spinner("thinking");
            }
            TurnEvent::ToolFailed { tool, reason, uncertain, .. } => {
                let what = if *uncertain { "uncertain" } else { "failed" };
                let (tool, reason) = (escape_controls(tool), escape_controls(&short(reason, 300)).into_owned());
                self.note(&format!("  {} {tool} {what}: {reason}", self.err.red("✗")));
                self.start_spinner("thinking");
            }
            TurnEvent::ToolRejected { tool, reason, .. } => {
                let (tool, reason) = (escape_controls(tool), escape_controls(&short(reason, 300)).into_owned());
                self.note(&format!("  {} {tool} rejected: {reason}", self.err.yellow("⊘")));
                self.start_spinner("thinking");
            }
            TurnEvent::ApprovalAsked { .. } => self.stop_spinner(),
            TurnEvent::ApprovalVerdict { verdict, .. } => {
                if let Answer::Deny { reason } = &verdict.decision {
                    let (by, reason) =
                        (escape_controls(&verdict.by), escape_controls(&short(reason, 300)).into_owned());
                    self.note(&format!("  {} denied by {by}: {reason}", self.err.yellow("⊘")));
                }
            }
            TurnEvent::ProviderFailed { message, .. } => {
                self.note(&format!("{} {}", self.err.red("provider error:"), escape_controls(message)));
            }
            TurnEvent::Final { .. } => {
                self.stop_spinner();
                // The rest of a line shown in part while it streamed ends
                // the answer before its newline.
                if let Some(rest) = self.markdown.as_mut().map(crate::markdown::Markdown::finish)
                    && !rest.is_empty()
                {
                    self.open_line = !rest.ends_with('\n');
                    self.write_out(&rest);
                }
                if self.open_line {
                    self.write_out("\n");
                    self.open_line = false;
                }
            }
            TurnEvent::StepLimit { max_steps, .. } => {
                self.note(&self.err.yellow(&format!("step limit reached ({max_steps} model calls)")));
            }
            TurnEvent::TurnCancelled { .. } => self.note(&self.err.yellow("turn cancelled")),
            TurnEvent::Compacted { entry_id, messages, .. } => {
                let entry_id = escape_controls(entry_id);
                self.note(&self.err.dim(&format!(
                    "context compacted: {messages} earlier messages summarised (entry {entry_id}; the originals stay in the session)"
                )));
            }
            _ => {}
        }
    }

    fn count(&mut self, event: &TurnEvent) {
        match event {
            TurnEvent::Usage { usage } => {
                self.totals.model.clone_from(&usage.model);
                self.totals.usage.add(usage);
            }
            TurnEvent::ToolCompleted { .. } | TurnEvent::ToolFailed { .. } => self.totals.tools += 1,
            TurnEvent::ToolRejected { .. } => {
                self.totals.tools += 1;
                self.totals.denied += 1;
            }
            _ => {}
        }
    }

    /// End of a turn: stop the spinner, print the usage line.
    pub fn finish(&mut self, session_id: &str) {
        self.stop_spinner();
        if let Some(rest) = self.markdown.as_mut().map(crate::markdown::Markdown::finish)
            && !rest.is_empty()
        {
            self.open_line = !rest.ends_with('\n');
            self.write_out(&rest);
        }
        if self.open_line {
            self.write_out("\n");
            self.open_line = false;
        }
        if self.mode == Mode::Human {
            let t = &self.totals;
            let so_far = match &self.session {
                Some(usage) => {
                    format!(" · so far {} tokens, {}", crate::status::thousands(usage.total()), usage.cost_short())
                }
                None => String::new(),
            };
            let line = format!(
                "{} in / {} out tokens · {} attempt{} · {} tool call{} · {:.1}s{so_far} · session {session_id}",
                crate::status::thousands(t.usage.input),
                crate::status::thousands(t.usage.output),
                t.usage.attempts,
                if t.usage.attempts == 1 { "" } else { "s" },
                t.tools,
                if t.tools == 1 { "" } else { "s" },
                self.started.elapsed().as_secs_f64()
            );
            let line = match crate::status::context_share(t.usage.last_input, self.window) {
                Some(share) => format!("{} · context {share} · {line}", t.model),
                None if !t.model.is_empty() => format!("{} · {line}", t.model),
                None => line,
            };
            let _ = writeln!(std::io::stderr(), "{}", self.err.dim(&escape_controls(&line)));
        }
        let _ = &self.out;
    }

    /// Render answers as Markdown when stdout is a terminal (and a person
    /// reads it: human mode), unless `plain`.
    pub fn set_markdown(&mut self, plain: bool) {
        self.markdown = (self.mode == Mode::Human && !plain && std::io::stdout().is_terminal())
            .then(|| crate::markdown::Markdown::new(self.out));
    }

    /// The session's usage so far (the ledger, this turn included) and its
    /// cost, for the status line after the turn.
    pub fn set_session(&mut self, usage: crate::status::SessionUsage) {
        self.session = Some(usage);
    }

    /// The model's context window, for the status line's "context N% of
    /// W" (unknown: not shown).
    pub fn set_window(&mut self, window: Option<u32>) {
        self.window = window;
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use crate::escape::is_unsafe_char;

    use super::*;

    #[test]
    fn controls_are_shown_not_sent() {
        let hostile = "a\u{1b}]0;pwned\u{7}b\u{1b}[2J\u{9b}31m\r\u{8}\u{7f}\u{202e}txt.exe\u{2066}\u{0}";
        let safe = escape_controls(hostile);
        assert!(!safe.chars().any(is_unsafe_char), "{safe:?}");
        assert_eq!(
            safe,
            "a\\u{1b}]0;pwned\\u{7}b\\u{1b}[2J\\u{9b}31m\\u{d}\\u{8}\\u{7f}\\u{202e}txt.exe\\u{2066}\\u{0}"
        );
        assert_eq!(escape_controls("line\n\tindented é ✓"), "line\n\tindented é ✓");
        assert!(matches!(escape_controls("plain"), Cow::Borrowed(_)));
        // Every code point below U+00A0 other than newline, tab and the
        // printable ASCII range is escaped.
        for c in (0u32..0xa0).filter_map(char::from_u32) {
            let printable = c == '\n' || c == '\t' || (' '..='~').contains(&c);
            assert_eq!(escape_controls(&c.to_string()) == c.to_string(), printable, "{c:?}");
        }
    }

    #[test]
    fn json_stays_the_same_value() {
        let value = serde_json::json!({"text": "x\u{1b}[2J\u{9b}\u{7f}\u{202e}\r\n", "n": 1});
        let line = value.to_string();
        let safe = escape_json(&line);
        assert!(!safe.chars().any(is_unsafe_char), "{safe}");
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back, value);
        assert_eq!(escape_json("{\"a\":\r1}"), "{\"a\": 1}");
    }
}
