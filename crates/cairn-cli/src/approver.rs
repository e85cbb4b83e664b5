//! The interactive approver: a y/N prompt on the terminal, default No,
//! showing the tool, its risk (and why, when the tool raised it) and a
//! preview a person can judge.
//!
//! A server's question (MCP elicitation) is asked here too: its message,
//! then accept/decline/cancel, then each field with what it takes, asked
//! again with the reason until the answer fits (cairn-core's
//! `elicit::form` reads and checks; this only prompts).
//!
//! This is the host side of the approval boundary: it presents a question
//! and relays the answer. The policy (what needs asking, what an allowlist
//! or `--yes` may approve, when "always" may be offered, the refusal when
//! there is no terminal) lives in cairn-core's `PolicyApprover` and gate,
//! which ask this approver only when it can answer.

use std::io::{BufRead, IsTerminal, Write};

use cairn_core::approval::{Answer, ApprovalError, ApprovalRequest, Approver, Verdict};
use cairn_core::elicit::{Ask, ElicitAnswer, Elicitation, form};
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

impl TerminalApprover {
    /// A server asks the person to visit `url` (MCP's URL mode): shown
    /// whole, with its host set apart (a look-alike link is the risk), and
    /// opened only with the person's yes — by `$BROWSER` if set, else by
    /// the person.
    fn visit(&self, question: &Elicitation<'_>, url: &str) -> ElicitAnswer {
        crate::render::hide_spinner();
        let _paused = crate::typeahead::pause();
        let st = &self.style;
        let host =
            url.split_once("://").map_or(url, |(_, rest)| rest).split(['/', '?', '#']).next().unwrap_or_default();
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err);
        let _ = writeln!(err, "{} {}", st.bold("question from"), st.bold(&esc(question.tool)));
        for line in esc(question.message).lines() {
            let _ = writeln!(err, "  {line}");
        }
        let _ = writeln!(err, "  {} {}", st.dim("it asks you to open:"), esc(url));
        let _ = writeln!(err, "  {} {}", st.dim("on the site:"), st.bold(&esc(host)));
        drop(err);
        let Some(choice) = prompt("Open it? [y/N=decline/c=cancel] ") else { return ElicitAnswer::Cancel };
        match choice.trim().to_ascii_lowercase().as_str() {
            "y" | "yes" => {}
            "c" | "cancel" => return ElicitAnswer::Cancel,
            _ => return ElicitAnswer::Decline("the person declined to open the server's URL".to_owned()),
        }
        let said = match open_in_browser(url) {
            Ok(true) => "opened in your browser".to_owned(),
            Ok(false) => "open it in your browser ($BROWSER is not set)".to_owned(),
            Err(e) => format!("{e}: open it yourself"),
        };
        let _ = writeln!(std::io::stderr(), "  {}", st.dim(&said));
        ElicitAnswer::Accept(serde_json::Map::new())
    }
}

impl Approver for TerminalApprover {
    fn is_interactive(&self) -> bool {
        self.interactive
    }

    fn elicit(&mut self, question: &Elicitation<'_>) -> ElicitAnswer {
        // Only reached with a person at the terminal (the policy declines
        // for nobody); the form is read here field by field.
        let schema = match question.ask {
            Ask::Form(schema) => schema,
            Ask::Url { url, .. } => return self.visit(question, url),
        };
        let fields = match form::form(schema) {
            Ok(fields) => fields,
            Err(e) => return ElicitAnswer::Decline(format!("{e}; cairn declined it without asking")),
        };
        crate::render::hide_spinner();
        let _paused = crate::typeahead::pause();
        let st = &self.style;
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err);
        let _ = writeln!(err, "{} {}", st.bold("question from"), st.bold(&esc(question.tool)));
        for line in esc(question.message).lines() {
            let _ = writeln!(err, "  {line}");
        }
        if !fields.is_empty() {
            let names: Vec<String> = fields.iter().map(|f| esc(f.label()).into_owned()).collect();
            let _ = writeln!(err, "  {} {}", st.dim("it asks for:"), names.join(", "));
        }
        drop(err);
        let Some(choice) = prompt("Answer it? [y/N=decline/c=cancel] ") else {
            return ElicitAnswer::Cancel;
        };
        match choice.trim().to_ascii_lowercase().as_str() {
            "y" | "yes" => {}
            "c" | "cancel" => return ElicitAnswer::Cancel,
            _ => return ElicitAnswer::Decline("the person declined to answer".to_owned()),
        }
        let mut answer = serde_json::Map::new();
        for field in &fields {
            let mut err = std::io::stderr().lock();
            let mut about = format!("  {}", st.bold(&esc(field.label())));
            if let Some(description) = &field.description {
                about.push_str(&format!(" {} {}", st.dim("—"), esc(description)));
            }
            let _ = writeln!(err, "{about}");
            for (i, option) in field.options().iter().enumerate() {
                let _ = writeln!(err, "    {}. {}", i + 1, esc(&option.label()));
            }
            drop(err);
            let mut hint = field.hint();
            match (&field.default, field.required) {
                (Some(default), _) => hint.push_str(&format!("; Enter: {}", form::plain(default))),
                (None, true) => hint.push_str(", required"),
                (None, false) => hint.push_str("; Enter leaves it out"),
            }
            let ask = format!("  {} ({}): ", esc(&field.name), esc(&hint));
            loop {
                // Ctrl-D (end of input) dismisses the whole form.
                let Some(typed) = prompt(&ask) else { return ElicitAnswer::Cancel };
                match field.read(&typed) {
                    Ok(Some(value)) => {
                        answer.insert(field.name.clone(), value);
                        break;
                    }
                    Ok(None) => break,
                    Err(why) => {
                        let _ = writeln!(std::io::stderr(), "  {} {}", st.red("✗"), esc(&why));
                    }
                }
            }
        }
        ElicitAnswer::Accept(answer)
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

/// Open `url` with the browser the person configured (`$BROWSER`), if
/// any: `Ok(false)` when none is. It is not waited for (a browser may
/// outlive the question); a thread reaps it when it exits.
pub fn open_in_browser(url: &str) -> Result<bool, String> {
    let Some(browser) = std::env::var_os("BROWSER").filter(|b| !b.is_empty()) else { return Ok(false) };
    let mut child = std::process::Command::new(&browser)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("could not start $BROWSER ({}: {e})", esc(&browser.to_string_lossy())))?;
    let _reaper = std::thread::spawn(move || child.wait());
    Ok(true)
}

/// Write `question` on stderr and read a line from stdin; None at the end
/// of input (Ctrl-D) or when it cannot be read.
fn prompt(question: &str) -> Option<String> {
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "{question}");
    let _ = err.flush();
    // Released while waiting: the Ctrl-C handler writes to it.
    drop(err);
    let mut line = String::new();
    match std::io::stdin().lock().read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line),
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
