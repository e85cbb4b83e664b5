//! The world console: reads commands line by line (a terminal or a script)
//! and prints every message addressed to `console` as one JSON line. Owns
//! command parsing only; all effects go through [`World`].
//!
//! Commands: `@<actor> <json|text>`, plain text (to `agent`), `/deploy <id>
//! <file.wasm|.wat> [source-dir]`, `/list`, `/sleep <s>`, `/await [s]`,
//! `/help`, `/quit`.

use std::io::{BufRead, Write};
use std::time::Duration;

use serde_json::{Value, json};

use crate::broker::World;
use crate::message::AGENT;

/// Help text printed by `/help`.
pub const HELP: &str = "\
@<actor> <json|text>   send a message (text becomes {\"type\":\"text\",\"text\":…})
<text>                 send {\"type\":\"text\"} to the agent
/deploy <id> <file.wasm|.wat> [source-dir]   spawn, or upgrade if <id> exists
/list                  list actors
/sleep <seconds>       wait (for scripts)
/await [seconds]       wait for the next message to the console (default 10)
/help                  this text
/quit                  stop every actor and leave";

/// One parsed console line.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// `@actor body` or plain text.
    Send {
        /// Recipient.
        to: String,
        /// Message body.
        body: Value,
    },
    /// `/deploy id file [source]`.
    Deploy {
        /// Actor id.
        id: String,
        /// Host path of the wasm.
        wasm: String,
        /// Host path of the source folder.
        source: Option<String>,
    },
    /// `/list`.
    List,
    /// `/sleep`.
    Sleep(Duration),
    /// `/await`.
    Await(Duration),
    /// `/help`.
    Help,
    /// `/quit`.
    Quit,
    /// Blank line.
    Nothing,
}

fn text(t: &str) -> Value {
    json!({"type": "text", "text": t})
}

fn secs(s: Option<&str>, default: f64) -> Result<Duration, String> {
    let v = match s {
        None => default,
        Some(s) => s.parse::<f64>().map_err(|_| format!("{s:?} is not a number of seconds"))?,
    };
    Duration::try_from_secs_f64(v).map_err(|_| format!("{v} is not a duration"))
}

/// Parses one console line.
pub fn parse(line: &str) -> Result<Command, String> {
    let line = line.trim();
    if line.is_empty() {
        return Ok(Command::Nothing);
    }
    if let Some(rest) = line.strip_prefix('@') {
        let (to, body) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        let body = body.trim();
        if to.is_empty() {
            return Err("@ needs an actor id: @<actor> <json|text>".into());
        }
        let body = serde_json::from_str(body).unwrap_or_else(|_| text(body));
        return Ok(Command::Send { to: to.to_owned(), body });
    }
    if let Some(cmd) = line.strip_prefix('/') {
        let mut w = cmd.split_whitespace();
        return match w.next().unwrap_or("") {
            "deploy" => match (w.next(), w.next()) {
                (Some(id), Some(wasm)) => {
                    Ok(Command::Deploy { id: id.into(), wasm: wasm.into(), source: w.next().map(str::to_owned) })
                }
                _ => Err("usage: /deploy <id> <file.wasm|.wat> [source-dir]".into()),
            },
            "list" => Ok(Command::List),
            "sleep" => Ok(Command::Sleep(secs(w.next(), 1.0)?)),
            "await" => Ok(Command::Await(secs(w.next(), 10.0)?)),
            "help" => Ok(Command::Help),
            "quit" => Ok(Command::Quit),
            other => Err(format!("unknown command /{other}; try /help")),
        };
    }
    Ok(Command::Send { to: AGENT.into(), body: text(line) })
}

fn abs(p: &str) -> String {
    std::path::absolute(p).map(|p| p.to_string_lossy().into_owned()).unwrap_or_else(|_| p.to_owned())
}

/// Runs the console until `/quit` or end of input (the caller then stops
/// the world with [`World::quit`]).
pub fn run(world: &World, input: impl BufRead, out: &mut impl Write) -> anyhow::Result<()> {
    let drain = |out: &mut dyn Write, world: &World| -> anyhow::Result<()> {
        while let Some(m) = world.recv(Duration::ZERO) {
            writeln!(out, "{}", serde_json::to_string(&m)?)?;
        }
        out.flush()?;
        Ok(())
    };
    for line in input.lines() {
        let line = line?;
        drain(out, world)?;
        let cmd = match parse(&line) {
            Ok(c) => c,
            Err(e) => {
                writeln!(out, "error: {e}")?;
                continue;
            }
        };
        match cmd {
            Command::Nothing => {}
            Command::Send { to, body } => world.send(Some(&to), None, None, body),
            Command::Deploy { id, wasm, source } => {
                let listed = world.request(json!({"type": "list"}), Duration::from_secs(30))?;
                let exists = listed["actors"].as_array().is_some_and(|a| a.iter().any(|x| x["id"] == id.as_str()));
                let ty = if exists { "upgrade" } else { "spawn" };
                let mut req = json!({"type": ty, "id": id, "wasm": abs(&wasm)});
                if let Some(s) = source {
                    req["source"] = json!(abs(&s));
                }
                // Upgrades run transcript tests (10 s per expect).
                let r = world.request(req, Duration::from_secs(600))?;
                writeln!(out, "{}", serde_json::to_string(&r)?)?;
            }
            Command::List => {
                let r = world.request(json!({"type": "list"}), Duration::from_secs(30))?;
                writeln!(out, "{}", serde_json::to_string(&r)?)?;
            }
            Command::Sleep(d) => std::thread::sleep(d),
            Command::Await(d) => match world.recv(d) {
                Some(m) => writeln!(out, "{}", serde_json::to_string(&m)?)?,
                None => writeln!(out, "(no message within {} s)", d.as_secs_f64())?,
            },
            Command::Help => writeln!(out, "{HELP}")?,
            Command::Quit => break,
        }
        out.flush()?;
    }
    drain(out, world)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands() {
        assert_eq!(parse("@echo {\"a\":1}"), Ok(Command::Send { to: "echo".into(), body: json!({"a":1}) }));
        assert_eq!(parse("@echo hi there"), Ok(Command::Send { to: "echo".into(), body: text("hi there") }));
        assert_eq!(parse("hello"), Ok(Command::Send { to: "agent".into(), body: text("hello") }));
        assert_eq!(parse("/sleep 0.5"), Ok(Command::Sleep(Duration::from_millis(500))));
        assert!(parse("/sleep x").is_err());
        assert!(parse("/deploy a").is_err());
        assert!(parse("/bogus").is_err());
        assert!(parse("@ x").is_err());
        assert_eq!(parse("  "), Ok(Command::Nothing));
    }
}
