//! The interactive approver: a y/N prompt on the terminal, default No,
//! showing the tool, its risk (and why, when the tool raised it) and a
//! preview a person can judge.
//!
//! This is the host side of the approval boundary: it presents a question
//! and relays the answer. The policy (what needs asking, what an allowlist
//! or `--yes` may approve, when "always" may be offered, the refusal when
//! there is no terminal) lives in cairn-core's `PolicyApprover` and gate,
//! which ask this approver only when it can answer.

use std::io::{BufRead, IsTerminal, Write};

use cairn_core::approval::{Answer, ApprovalError, ApprovalRequest, Approver, Verdict};
use cairn_core::tool::{Preview, Risk};

use crate::render::{escape_controls as esc, escape_json};
use crate::style::Style;

/// Lines of a preview shown before asking; `e` shows the rest.
const PREVIEW_LINES: usize = 40;

/// Asks on the controlling terminal (stdin/stderr).
#[derive(Debug)]
pub struct TerminalApprover {
    style: Style,
    interactive: bool,
}

impl TerminalApprover {
    /// Asks when stdin is a terminal.
    pub fn new(style: Style) -> Self {
        Self { style, interactive: std::io::stdin().is_terminal() }
    }

    /// Never ask, whatever stdin is (`cairn ask` runs headless).
    pub fn headless(mut self) -> Self {
        self.interactive = false;
        self
    }
}

impl Approver for TerminalApprover {
    fn is_interactive(&self) -> bool {
        self.interactive
    }

    fn elicit(&mut self, question: &cairn_core::elicit::Elicitation<'_>) -> cairn_core::elicit::ElicitAnswer {
        // Not asked on the terminal yet: said plainly, so the model and
        // the person know why the server got no answer.
        let _ = question;
        cairn_core::elicit::ElicitAnswer::Decline(
            "cairn's terminal does not answer a server's questions (MCP elicitation) yet: it was declined; an \
             editor over ACP that offers elicitation does"
                .to_owned(),
        )
    }

    fn decide(&mut self, request: &ApprovalRequest<'_>) -> Result<Verdict, ApprovalError> {
        // The question stays on screen while cairn waits: no spinner may
        // draw over it, whichever turn (a child's too) is asking.
        crate::render::hide_spinner();
        // Keys typed ahead during the turn stay the next prompt: never
        // read as this answer (the reader stops; the terminal echoes).
        let _paused = crate::typeahead::pause();
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err);
        let risk = match request.risk {
            Risk::ReadOnly => self.style.dim("read-only"),
            Risk::Write => self.style.yellow("write"),
            Risk::Destructive => self.style.red_bold("DESTRUCTIVE"),
        };
        // Everything shown here comes from the model or a tool: escaped.
        let _ = writeln!(err, "{} {} ({risk})", self.style.bold("approve"), self.style.bold(&esc(request.tool)));
        if let Some(why) = request.why {
            let _ = writeln!(err, "  {} {}", self.style.dim("why:"), esc(why));
        }
        if let Some(bypass) = request.bypass {
            let _ = writeln!(err, "  {} {}", self.style.red_bold("sandbox bypass:"), esc(bypass));
        }
        let mut shown = Vec::new();
        match request.preview {
            Some(preview) => write_preview(&mut shown, &self.style, preview),
            None => {
                let args = serde_json::to_string_pretty(request.arguments).unwrap_or_default();
                for line in escape_json(&args).lines() {
                    let _ = writeln!(shown, "  {line}");
                }
            }
        }
        let shown = String::from_utf8_lossy(&shown).into_owned();
        let lines = shown.lines().count();
        let long = lines > PREVIEW_LINES;
        let head: String = shown.lines().take(PREVIEW_LINES).map(|l| format!("{l}\n")).collect();
        let _ = write!(err, "{}", if long { &head } else { &shown });
        if long {
            let _ = writeln!(
                err,
                "  {}",
                self.style.dim(&format!("… {} more lines; e shows the whole change", lines - PREVIEW_LINES))
            );
        }
        // "Always" is never offered for what the gate will not remember
        // (Destructive calls, bypasses).
        let always = request.may_remember();
        let choices = match (always, long) {
            (true, true) => "[y/N/a=always this session/e=explain]",
            (true, false) => "[y/N/a=always this session]",
            (false, true) => "[y/N/e=explain]",
            (false, false) => "[y/N]",
        };
        loop {
            let _ = write!(err, "Run it? {choices} ");
            let _ = err.flush();
            // Release stderr while waiting: the Ctrl-C handler writes to it.
            drop(err);
            let mut line = String::new();
            let read =
                std::io::stdin().lock().read_line(&mut line).map_err(|e| ApprovalError::Failed(e.to_string()))?;
            let answer = line.trim().to_ascii_lowercase();
            err = std::io::stderr().lock();
            let decision = match answer.as_str() {
                "y" | "yes" => Answer::Approve,
                "a" | "always" if always => Answer::ApproveForSession,
                "e" | "explain" if read > 0 => {
                    let _ = write!(err, "{shown}");
                    continue;
                }
                _ if read == 0 => Answer::Deny { reason: "the user closed the terminal input (EOF)".to_owned() },
                _ => Answer::Deny { reason: "the user declined".to_owned() },
            };
            return Ok(Verdict { decision, by: "user:terminal".to_owned() });
        }
    }
}

/// Print a preview (shared by the approver and `cairn show`), its text
/// escaped (it comes from the model's arguments).
pub fn write_preview(out: &mut dyn Write, style: &Style, preview: &Preview) {
    match preview {
        Preview::Diff { path, diff } => {
            let _ = writeln!(out, "  {}", style.bold(&esc(path)));
            let diff = esc(diff);
            for line in diff.lines() {
                let coloured = if line.starts_with("+++") || line.starts_with("---") {
                    style.bold(line)
                } else if line.starts_with('+') {
                    style.green(line)
                } else if line.starts_with('-') {
                    style.red(line)
                } else if line.starts_with("@@") {
                    style.cyan(line)
                } else {
                    line.to_owned()
                };
                let _ = writeln!(out, "  {coloured}");
            }
        }
        Preview::Command { command, cwd } => {
            let _ = writeln!(out, "  {} {}", style.dim("$"), style.bold(&esc(command)));
            let _ = writeln!(out, "  {} {}", style.dim("in"), esc(cwd));
        }
        Preview::Paths { paths } => {
            for path in paths {
                let _ = writeln!(out, "  {} {}", style.dim("writes"), esc(path));
            }
        }
        Preview::Text { text } => {
            for line in esc(text).lines() {
                let _ = writeln!(out, "  {line}");
            }
        }
    }
}
