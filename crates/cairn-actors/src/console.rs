//! The world console: reads commands line by line (a terminal or a script)
//! and prints every message addressed to `console` as one JSON line. Owns
//! command parsing only; all effects go through [`World`].
//!
//! Commands: `@<actor> <json|text>`, plain text (to `agent`), `/deploy <id>
//! <file.wasm|.wat> [source-dir]`, `/list`, `/sleep <s>`, `/await [s] [text]`,
//! `/help`, `/quit`.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
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
/await [seconds] [text]   wait for a message to the console not yet awaited
                       (default 10 s); with text, for one whose line contains it
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
    /// `/await [seconds] [text]`: the wait, and the text the message's
    /// line must contain (any message if `None`).
    Await(Duration, Option<String>),
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
            "await" => {
                let d = secs(w.next(), 10.0)?;
                // The rest of the line as written (it may hold spaces).
                let text = cmd.trim_start().strip_prefix("await").unwrap_or("").trim_start();
                let text = text.split_once(char::is_whitespace).map(|(_, t)| t.trim()).filter(|t| !t.is_empty());
                Ok(Command::Await(d, text.map(str::to_owned)))
            }
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

/// What the console has printed, shared by the reading loop and the
/// printer thread: the output itself, and the lines of the messages
/// printed that `/await` has not waited for yet (the latest
/// [`UNAWAITED_KEPT`]).
struct Printed<W> {
    out: W,
    unawaited: std::collections::VecDeque<String>,
}

/// Message lines kept for `/await` (older ones are forgotten: a session
/// that never awaits must not grow without end).
const UNAWAITED_KEPT: usize = 1000;

/// Runs the console until `/quit` or end of input (the caller then stops
/// the world with [`World::quit`]).
///
/// Messages to `console` are printed as they arrive, by a thread of their
/// own, while the loop waits for the next input line: a person at a
/// terminal (or a script waiting for a reply before it types again) sees
/// the reply without typing anything. Every line goes through one lock, so
/// command output and messages never interleave within a line. `/await`
/// waits for one message not yet awaited: a script that expects n messages
/// says `/await` n times, whether they came before or after it asked.
pub fn run(world: &World, input: impl BufRead, out: impl Write + Send) -> anyhow::Result<()> {
    let shared = Mutex::new(Printed { out, unawaited: std::collections::VecDeque::new() });
    let arrived = Condvar::new();
    let done = AtomicBool::new(false);
    let print = |m: &crate::message::Inbound| -> anyhow::Result<()> {
        let line = serde_json::to_string(m)?;
        let mut g = shared.lock().unwrap_or_else(|p| p.into_inner());
        writeln!(g.out, "{line}")?;
        g.out.flush()?;
        if g.unawaited.len() >= UNAWAITED_KEPT {
            g.unawaited.pop_front();
        }
        g.unawaited.push_back(line);
        arrived.notify_all();
        Ok(())
    };
    let say = |text: &str| -> anyhow::Result<()> {
        let mut g = shared.lock().unwrap_or_else(|p| p.into_inner());
        writeln!(g.out, "{text}")?;
        g.out.flush()?;
        Ok(())
    };
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let printer = scope.spawn(|| -> anyhow::Result<()> {
            while !done.load(Ordering::SeqCst) {
                if let Some(m) = world.recv(Duration::from_millis(100)) {
                    print(&m)?;
                }
            }
            Ok(())
        });
        let read = (|| -> anyhow::Result<()> {
            for line in input.lines() {
                let cmd = match parse(&line?) {
                    Ok(c) => c,
                    Err(e) => {
                        say(&format!("error: {e}"))?;
                        continue;
                    }
                };
                match cmd {
                    Command::Nothing => {}
                    Command::Send { to, body } => world.send(Some(&to), None, None, body),
                    Command::Deploy { id, wasm, source } => {
                        let listed = world.request(json!({"type": "list"}), Duration::from_secs(30))?;
                        let exists =
                            listed["actors"].as_array().is_some_and(|a| a.iter().any(|x| x["id"] == id.as_str()));
                        let ty = if exists { "upgrade" } else { "spawn" };
                        let mut req = json!({"type": ty, "id": id, "wasm": abs(&wasm)});
                        if let Some(s) = source {
                            req["source"] = json!(abs(&s));
                        }
                        // Upgrades run transcript tests (10 s per expect).
                        let r = world.request(req, Duration::from_secs(600))?;
                        say(&serde_json::to_string(&r)?)?;
                    }
                    Command::List => {
                        let r = world.request(json!({"type": "list"}), Duration::from_secs(30))?;
                        say(&serde_json::to_string(&r)?)?;
                    }
                    Command::Sleep(d) => std::thread::sleep(d),
                    Command::Await(d, text) => {
                        let matching = |g: &Printed<_>| {
                            g.unawaited.iter().position(|l| text.as_ref().is_none_or(|t| l.contains(t)))
                        };
                        let g = shared.lock().unwrap_or_else(|p| p.into_inner());
                        let (mut g, _) = arrived
                            .wait_timeout_while(g, d, |g| matching(g).is_none())
                            .unwrap_or_else(|p| p.into_inner());
                        if let Some(i) = matching(&g) {
                            g.unawaited.remove(i);
                        } else {
                            let what = text.as_ref().map(|t| format!(" containing {t:?}")).unwrap_or_default();
                            writeln!(g.out, "(no message{what} within {} s)", d.as_secs_f64())?;
                            g.out.flush()?;
                        }
                    }
                    Command::Help => say(HELP)?,
                    Command::Quit => break,
                }
            }
            Ok(())
        })();
        done.store(true, Ordering::SeqCst);
        let printed = printer.join().unwrap_or_else(|_| Err(anyhow::anyhow!("the console's printer thread panicked")));
        read?;
        printed?;
        // What arrived while the printer stopped.
        while let Some(m) = world.recv(Duration::ZERO) {
            print(&m)?;
        }
        Ok(())
    })
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
        assert_eq!(parse("/await"), Ok(Command::Await(Duration::from_secs(10), None)));
        assert_eq!(
            parse("/await 60 \"rolled_back\", \"to\""),
            Ok(Command::Await(Duration::from_secs(60), Some("\"rolled_back\", \"to\"".into())))
        );
        assert!(parse("/sleep x").is_err());
        assert!(parse("/deploy a").is_err());
        assert!(parse("/bogus").is_err());
        assert!(parse("@ x").is_err());
        assert_eq!(parse("  "), Ok(Command::Nothing));
    }
}
