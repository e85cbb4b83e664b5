//! `cairn ask "QUESTION"`: standard input as context, one headless turn,
//! only the answer on standard output, so shell pipelines work
//! (`git diff | cairn ask "review this" | cairn ask "top three issues"`).
//!
//! Owns: composing the prompt from the question and stdin, and the exit
//! rule — a turn in which a call was refused (an approval nobody could
//! give headless) prints no answer and exits 4 with the reason on stderr.
//! Must not: ask a person (it is headless even on a terminal) or print
//! anything but the answer on stdout.

use std::io::{IsTerminal, Read, Write};

use anyhow::{Context as _, Result, bail};
use cairn_core::storage::Storage;
use cairn_core::{CancelToken, Session, TurnEvent, TurnStop};
use cairn_runtime::Step;

use crate::invocation::{Invocation, exit};
use crate::render::{Mode, Renderer, escape_controls};

/// Most bytes of standard input taken as context.
const MAX_INPUT: u64 = 8 * 1024 * 1024;

/// The prompt: the question, then the input (if any) between markers.
pub fn prompt(question: &str, input: &str) -> String {
    if input.trim().is_empty() {
        question.to_owned()
    } else {
        format!("{question}\n\n<input>\n{}\n</input>", input.trim_end_matches('\n'))
    }
}

fn read_input() -> Result<String> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Ok(String::new());
    }
    let mut bytes = Vec::new();
    stdin.lock().take(MAX_INPUT + 1).read_to_end(&mut bytes).context("cannot read standard input")?;
    if bytes.len() as u64 > MAX_INPUT {
        bail!("standard input is over {} MiB; give cairn ask a smaller part", MAX_INPUT / 1024 / 1024);
    }
    String::from_utf8(bytes).context("standard input is not UTF-8 text; cairn ask reads text")
}

/// `cairn ask`.
pub fn ask(ctx: &Invocation, question: &str) -> Result<u8> {
    if question.trim().is_empty() {
        bail!("the question is empty: `cairn ask \"QUESTION\"` (standard input is the context)");
    }
    let text = prompt(question, &read_input()?);
    let mut renderer = Renderer::new(Mode::Quiet);
    let (mut store, cwd) = crate::parts::create_session(ctx)?;
    let mut runner = crate::turns::Runner::new(ctx, &cwd, false)?;
    // The tools for the question (discovery ranks them by it, not by the
    // context read from stdin), as any turn is equipped.
    let config = runner.equip(ctx, &cwd, &mut store, Some(question), &mut renderer)?;
    let id = store.header().id.clone();
    let mut session = Session::open(store, config)?;
    let cancel = CancelToken::new();
    let mut refused: Vec<(String, String)> = Vec::new();
    let outcome = {
        let mut observer = |event: &TurnEvent| {
            if let TurnEvent::ToolRejected { tool, reason, .. } = event {
                refused.push((tool.clone(), reason.clone()));
            }
        };
        let outcome = runner.run(&mut session, Step::Prompt(&text), &mut observer, &cancel);
        outcome.with_context(|| format!("session {id}"))?.context("the new turn did not start")?
    };
    let mut err = std::io::stderr().lock();
    if let Some((tool, reason)) = refused.first() {
        let _ = writeln!(
            err,
            "cairn ask: the turn needed an approval it could not get ({} refused: {}); no answer printed. \
             Allow the call with --allow PATTERN (or --yes for Write calls), or run `cairn run` in a terminal. \
             Session {id}.",
            escape_controls(tool),
            escape_controls(reason)
        );
        return Ok(exit::DENIED);
    }
    match outcome.stop {
        TurnStop::Answered => {
            let mut out = std::io::stdout().lock();
            let answer = escape_controls(&outcome.text);
            out.write_all(answer.as_bytes())?;
            if !answer.ends_with('\n') {
                out.write_all(b"\n")?;
            }
            out.flush()?;
            Ok(exit::SUCCESS)
        }
        TurnStop::StepLimit => {
            let _ = writeln!(err, "cairn ask: the turn reached its step limit without an answer (session {id})");
            Ok(exit::ERROR)
        }
        TurnStop::Cancelled => {
            let _ = writeln!(err, "cairn ask: cancelled; continue with `cairn resume {id}`");
            Ok(exit::CANCELLED)
        }
        TurnStop::Stopped => {
            let _ = writeln!(err, "cairn ask: a pre_tool hook stopped the turn: {}", escape_controls(&outcome.text));
            Ok(exit::DENIED)
        }
    }
}
