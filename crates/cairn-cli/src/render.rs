//! Turning the turn's events into output: human text (the answer streamed
//! on stdout, tool activity and a usage line on stderr, a spinner while
//! waiting for the first token) or, with `--json`, one JSON object per line
//! on stdout.
//!
//! It only renders; it never decides anything about the turn.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use cairn_core::TurnEvent;
use cairn_core::approval::Answer;
use cairn_core::provider::StreamEvent;
use serde_json::json;

use crate::style::Style;

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
    /// Input tokens over all attempts.
    pub input_tokens: u64,
    /// Output tokens over all attempts.
    pub output_tokens: u64,
    /// Provider attempts.
    pub attempts: u32,
    /// Tool calls denied or refused.
    pub denied: u32,
    /// Tool calls settled.
    pub tools: u32,
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
            spinner.set_message(message.to_owned());
            spinner.enable_steady_tick(Duration::from_millis(100));
            self.spinner = Some(spinner);
        }
    }

    fn stop_spinner(&mut self) {
        if let Some(spinner) = self.spinner.take() {
            spinner.finish_and_clear();
        }
    }

    /// Write a JSON line describing something outside the turn (the session).
    pub fn json_line(&mut self, value: &serde_json::Value) {
        if self.mode == Mode::Json {
            self.write_out(&format!("{value}\n"));
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
                let line = self.err.dim(text);
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
                Ok(line) => self.write_out(&format!("{line}\n")),
                Err(e) => self.write_out(&format!("{}\n", json!({"type": "renderError", "message": e.to_string()}))),
            }
            return;
        }
        match event {
            TurnEvent::Delta { event: StreamEvent::TextDelta { text } } => {
                self.stop_spinner();
                self.open_line = !text.ends_with('\n');
                self.write_out(text);
            }
            TurnEvent::Delta { event: StreamEvent::AttemptStarted { attempt } } if *attempt > 1 => {
                self.note(
                    &self.err.yellow(&format!("… retrying (attempt {attempt}); earlier partial output is discarded")),
                );
            }
            TurnEvent::ToolRequested { tool, arguments, .. } => {
                let args = short(&arguments.to_string(), 120);
                self.note(&format!("{} {} {}", self.err.cyan("●"), self.err.bold(tool), self.err.dim(&args)));
            }
            TurnEvent::ToolOutput { chunk, .. } if self.mode == Mode::Human => {
                self.stop_spinner();
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "{}", self.err.dim(chunk));
            }
            TurnEvent::ToolCompleted { tool, exit_code, truncated, .. } => {
                let cut = if *truncated { ", output truncated for the model" } else { "" };
                self.note(&format!("  {} {tool} (exit {exit_code}{cut})", self.err.green("✓")));
                self.start_spinner("thinking");
            }
            TurnEvent::ToolFailed { tool, reason, uncertain, .. } => {
                let what = if *uncertain { "uncertain" } else { "failed" };
                self.note(&format!("  {} {tool} {what}: {}", self.err.red("✗"), short(reason, 300)));
                self.start_spinner("thinking");
            }
            TurnEvent::ToolRejected { tool, reason, .. } => {
                self.note(&format!("  {} {tool} rejected: {}", self.err.yellow("⊘"), short(reason, 300)));
                self.start_spinner("thinking");
            }
            TurnEvent::ApprovalAsked { .. } => self.stop_spinner(),
            TurnEvent::ApprovalVerdict { verdict, .. } => {
                if let Answer::Deny { reason } = &verdict.decision {
                    self.note(&format!("  {} denied by {}: {}", self.err.yellow("⊘"), verdict.by, short(reason, 300)));
                }
            }
            TurnEvent::ProviderFailed { message, .. } => {
                self.note(&format!("{} {message}", self.err.red("provider error:")));
            }
            TurnEvent::Final { .. } => {
                self.stop_spinner();
                if self.open_line {
                    self.write_out("\n");
                    self.open_line = false;
                }
            }
            TurnEvent::StepLimit { max_steps, .. } => {
                self.note(&self.err.yellow(&format!("step limit reached ({max_steps} model calls)")));
            }
            TurnEvent::TurnCancelled { .. } => self.note(&self.err.yellow("turn cancelled")),
            _ => {}
        }
    }

    fn count(&mut self, event: &TurnEvent) {
        match event {
            TurnEvent::Usage { usage } => {
                self.totals.attempts += 1;
                self.totals.input_tokens += usage.input_tokens;
                self.totals.output_tokens += usage.output_tokens;
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
        if self.open_line {
            self.write_out("\n");
            self.open_line = false;
        }
        if self.mode == Mode::Human {
            let t = &self.totals;
            let line = format!(
                "{} in / {} out tokens · {} attempt{} · {} tool call{} · {:.1}s · session {session_id}",
                t.input_tokens,
                t.output_tokens,
                t.attempts,
                if t.attempts == 1 { "" } else { "s" },
                t.tools,
                if t.tools == 1 { "" } else { "s" },
                self.started.elapsed().as_secs_f64()
            );
            let _ = writeln!(std::io::stderr(), "{}", self.err.dim(&line));
        }
        let _ = &self.out;
    }
}

/// At most `max` characters of `text`, with an ellipsis when cut.
pub fn short(text: &str, max: usize) -> String {
    let flat: String = text.chars().map(|c| if c == '\n' { ' ' } else { c }).collect();
    if flat.chars().count() <= max {
        flat
    } else {
        let cut: String = flat.chars().take(max).collect();
        format!("{cut}…")
    }
}
