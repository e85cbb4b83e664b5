//! `cairn world init|run`: a world of WASM actors (cairn-actors) driven by
//! the line console on standard input, and the native actor `agent`: an
//! ordinary durable cairn session whose turns are started by messages.
//! Wiring only: the broker, the console and the `actor_*` tools live in
//! cairn-actors; turns are cairn-core's.
//!
//! The agent: a `{"type":"text","text":…}` message without `reply_to`
//! starts a turn (replies never do); the final answer goes back to the
//! sender as a reply `{"type":"text","text":…}`. Each turn is equipped as
//! every face's is (`AgentHost`: `RuntimeHost`'s `equip::turn`, so discovery
//! chooses for the message and records its choice), with the world's
//! `actor_*` tools added. The session file's path is
//! kept in `DIR/broker/agent-session`.
//!
//! Nothing sent to the agent is lost to a crash: messages wait in its
//! durable mailbox (`broker/mailbox/agent.jsonl`, numbered), including while
//! no agent runs (`--no-agent`) or a turn runs. The message that starts a
//! turn stays there until its answer has been sent, and the turn is started
//! with `Session::run_queued` under the message's number, so the session
//! records (in the same line as the prompt) that this message was taken. A
//! turn cut off by the end of the process is resumed (cairn's resume) when
//! the world runs again and answers that message's sender; a message whose
//! turn ended but whose answer was not sent gets the turn's final text.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result};
use cairn_actors::World;
use cairn_core::approval::{Allowlist, PolicyApprover, SharedApprover};
use cairn_core::provider::Provider;
use cairn_core::storage::registers::{self, QueuedPrompt};
use cairn_core::storage::{JsonlStore, Storage};
use cairn_core::{CancelToken, Session, SessionConfig, ToolRegistry, TurnEvent, TurnOutcome};
use cairn_runtime::{Equipment, HostTools, SessionHost, Step};
use clap::Subcommand;
use serde_json::{Value, json};

use crate::hosting::RuntimeHost;
use crate::invocation::{Invocation, exit};

/// `cairn world …`.
#[derive(Debug, Subcommand)]
pub enum WorldAction {
    /// Create an empty world directory.
    Init {
        /// The world directory (default: ./world).
        dir: Option<PathBuf>,
    },
    /// Run the world; read console commands from standard input (/help).
    Run {
        /// The world directory (default: ./world).
        dir: Option<PathBuf>,
        /// Memory cap per actor instance (all its linear memories together), in MiB.
        #[arg(long, default_value_t = 64)]
        memory_mib: usize,
        /// Fuel per actor instance (default: unlimited; the epoch still applies).
        #[arg(long)]
        fuel: Option<u64>,
        /// Versions an actor keeps besides the running one, for rollback
        /// (older ones are deleted when an upgrade commits; at least 1).
        #[arg(long, default_value_t = cairn_actors::broker::VERSIONS_KEPT)]
        versions_kept: u32,
        /// Actors the world may hold (running or stopped); a spawn past it
        /// is refused.
        #[arg(long, default_value_t = cairn_actors::broker::WorldBudget::default().actors)]
        max_actors: usize,
        /// Actors descending from one actor (children, theirs, …).
        #[arg(long, default_value_t = cairn_actors::broker::WorldBudget::default().descendants)]
        max_descendants: usize,
        /// The actors' memory caps together, in MiB.
        #[arg(long, default_value_t = cairn_actors::broker::WorldBudget::default().memory_bytes >> 20)]
        world_memory_mib: u64,
        /// Do not run the native agent (messages to `agent` then wait unread).
        #[arg(long)]
        no_agent: bool,
    },
}

/// Runs a `cairn world` command.
pub fn run(ctx: &Invocation, action: WorldAction) -> Result<u8> {
    let dir = |d: Option<PathBuf>| d.unwrap_or_else(|| PathBuf::from("world"));
    match action {
        WorldAction::Init { dir: d } => {
            let d = dir(d);
            cairn_actors::init(&d)?;
            println!("world ready in {}; run it with `cairn world run {}`", d.display(), d.display());
        }
        WorldAction::Run {
            dir: d,
            memory_mib,
            fuel,
            versions_kept,
            max_actors,
            max_descendants,
            world_memory_mib,
            no_agent,
        } => {
            let d = dir(d);
            let cfg = cairn_actors::WorldConfig {
                limits: cairn_actors::Limits { memory_bytes: memory_mib << 20, fuel, ..Default::default() },
                budget: cairn_actors::broker::WorldBudget {
                    actors: max_actors,
                    descendants: max_descendants,
                    memory_bytes: world_memory_mib << 20,
                    ..Default::default()
                },
                versions_kept,
                ..Default::default()
            };
            let world = Arc::new(World::open(&d, cfg)?);
            let agent = if no_agent {
                None
            } else {
                // A world runs without its agent (no provider configured,
                // say): the console and the actors do not need it.
                match Agent::start(ctx, world.clone(), &d) {
                    Ok(a) => Some(a),
                    Err(e) => {
                        eprintln!("cairn: the agent is not running ({e:#}); messages to `agent` wait unread");
                        None
                    }
                }
            };
            let stdin = std::io::stdin().lock();
            let result = cairn_actors::console::run(&world, stdin, std::io::stdout());
            if let Some(a) = agent {
                a.stop();
            }
            world.quit();
            result?;
        }
    }
    Ok(exit::SUCCESS)
}

/// The agent's thread and its stop flag.
struct Agent {
    stop: Arc<AtomicBool>,
    idle: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

/// What the agent thread owns.
struct AgentParts {
    provider: Box<dyn Provider + Send>,
    /// Every face's host, with the world's tools: equips each turn.
    host: AgentHost,
    /// The session's working directory.
    cwd: PathBuf,
    allow: Allowlist,
    /// `--yes`: the session's standing approval of Write calls.
    yes: bool,
    session: Session<JsonlStore>,
}

/// The agent's host: every served face's (`RuntimeHost`: each turn equipped by
/// `equip::turn`, the tools read once, discovery's choice for the prompt
/// recorded before the turn, the subagent family), with the world's
/// `actor_*` tools added to each turn's.
struct AgentHost {
    host: RuntimeHost,
    world: Arc<World>,
}

impl SessionHost for AgentHost {
    fn session_config(&self) -> SessionConfig {
        self.host.session_config()
    }

    fn turn(
        &self,
        cwd: &Path,
        store: &mut JsonlStore,
        prompt: Option<&str>,
        approver: &PolicyApprover,
        person: Option<&SharedApprover>,
    ) -> Result<(HostTools, SessionConfig)> {
        let (mut tools, config) = self.host.turn(cwd, store, prompt, approver, person)?;
        // Without a person at a terminal, Destructive tools (actor_remove)
        // cannot be approved, so the registry refuses them: not offered.
        tools.tools.extend(cairn_actors::tools::actor_tools(self.world.clone()));
        Ok((tools, config))
    }

    fn finish_undo(&self, session: &mut Session<JsonlStore>, cwd: &Path) -> Result<Option<String>> {
        self.host.finish_undo(session, cwd)
    }
}

impl Agent {
    fn start(ctx: &Invocation, world: Arc<World>, dir: &Path) -> Result<Agent> {
        let marker = dir.join("broker").join("agent-session");
        let (store, cwd) = match std::fs::read_to_string(&marker) {
            Ok(p) => {
                let path = PathBuf::from(p.trim());
                let store = crate::parts::open_session(ctx, &path).with_context(|| {
                    format!("the agent's session {} (named in {})", path.display(), marker.display())
                })?;
                let cwd = PathBuf::from(&store.header().cwd);
                (store, cwd)
            }
            Err(_) => {
                let (store, cwd) = crate::parts::create_session(ctx)?;
                cairn_actors::layout::write_atomic(&marker, store.path().to_string_lossy().as_bytes())?;
                (store, cwd)
            }
        };
        let provider = crate::parts::build_provider(ctx, &cwd)?;
        let allow = Allowlist::parse(ctx.settings.allow.value.iter().map(String::as_str))
            .context("invalid allow pattern (from --allow or [approvals] allow)")?;
        // Each turn's tools are chosen when it starts (`agent_loop`), as
        // every face's are; until then the session holds no tools.
        let config: SessionConfig = crate::parts::session_config(ctx);
        let mut session = Session::open(store, config)?;
        let host = AgentHost { host: RuntimeHost { ctx: ctx.setup.clone() }, world: world.clone() };
        // An undo killed after its plan was committed is finished before
        // any turn, as for every face's session.
        if let Some(done) = host.finish_undo(&mut session, &cwd)? {
            eprintln!("cairn: the agent: {}", crate::render::escape_controls(&done));
        }
        let parts = AgentParts { provider, host, cwd, allow, yes: ctx.common.yes, session };
        let stop = Arc::new(AtomicBool::new(false));
        let idle = Arc::new(AtomicBool::new(true));
        let (s2, i2) = (stop.clone(), idle.clone());
        let thread = std::thread::Builder::new()
            .name("agent".into())
            .spawn(move || agent_loop(parts, &world, &s2, &i2))
            .context("starting the agent thread")?;
        Ok(Agent { stop, idle, thread })
    }

    /// Stops the agent between turns. A turn still running is left to the
    /// end of the process: its session stays valid and resumes next run.
    fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        if self.idle.load(Ordering::SeqCst) {
            let _ = self.thread.join();
        }
    }
}

/// Whether a message to the agent starts a turn, and its prompt.
fn prompt(m: &cairn_actors::message::Inbound) -> Option<&str> {
    // Replies (and anything but text) never start a turn.
    if m.reply_to.is_some() || m.body["type"] != "text" {
        return None;
    }
    m.body["text"].as_str()
}

/// The last assistant text of the session (a finished turn's answer).
fn last_answer<S: Storage>(session: &Session<S>) -> String {
    cairn_core::report::last_answer(&session.messages())
}

/// What an agent's turn came to: its outcome, or why it did not run (the
/// session is still open), or the session is gone (it could not be
/// reopened after equipping failed; the agent stops).
enum Ran {
    Done(Result<Option<TurnOutcome>, String>),
    Lost(String),
}

fn agent_loop(p: AgentParts, world: &World, stop: &AtomicBool, idle: &AtomicBool) {
    let cancel = CancelToken::new();
    let AgentParts { provider, host, cwd, allow, yes, session } = p;
    // An approver is not `Send`: the agent's is built on its own thread.
    // Headless: nobody answers here, so Destructive tools are not offered
    // and a Write call needs an allow rule or --yes.
    let approver = crate::parts::policy(yes, allow, None);
    let tools = ToolRegistry::new(&approver);
    let mut equipment = Equipment { tools, approver };
    let mut observer = |_: &TurnEvent| {};
    // What is not offered is said once, not dropped silently.
    let mut told = std::collections::HashSet::new();
    let mut note = move |note: &str| {
        if told.insert(note.to_owned()) {
            eprintln!("cairn: the agent: {}", crate::render::escape_controls(note));
        }
    };
    let mut session = Some(session);
    // Each turn equipped as every face's (`equip::turn` through the host):
    // discovery chooses for `prompt` (`None`: the interrupted turn, offered
    // what was recorded for it), then the step runs.
    let mut run = |session: &mut Option<Session<JsonlStore>>, prompt: Option<&str>, step: Step<'_>| -> Ran {
        let Some(open) = session.take() else { return Ran::Lost("the agent's session is closed".to_owned()) };
        match equipment.reequip(&host, open, &cwd, prompt, None, &mut note) {
            Ok(mut open) => {
                let ran = equipment.run(&mut open, &*provider, step, &mut observer, &cancel).map_err(|e| e.to_string());
                *session = Some(open);
                Ran::Done(ran)
            }
            Err(unequipped) => {
                let why = format!("equipping the agent's turn: {:#}", unequipped.error);
                match unequipped.session {
                    Some(open) => {
                        *session = Some(*open);
                        Ran::Done(Err(why))
                    }
                    None => Ran::Lost(why),
                }
            }
        }
    };
    // Messages numbered up to `through` were taken into the session; the
    // one still in the mailbox is the turn not yet answered.
    let Some(open) = session.as_ref() else { return };
    let through = registers::prompt_queue(open.store()).through;
    if let Err(e) = world.agent_reserve(through + 1) {
        eprintln!("cairn: the agent's mailbox: {e:#}");
    }
    let asked = world.agent_waiting().into_iter().find(|(n, m)| *n <= through && prompt(m).is_some());
    let needs_resume = open.needs_resume();
    if needs_resume || asked.is_some() {
        idle.store(false, Ordering::SeqCst);
        let body = if needs_resume {
            match run(&mut session, None, Step::Resume) {
                Ran::Done(Ok(Some(o))) => json!({"type": "text", "text": o.text, "resumed": true}),
                Ran::Done(Ok(None)) => Value::Null,
                Ran::Done(Err(e)) | Ran::Lost(e) => {
                    json!({"type": "error", "reason": format!("resuming the agent's turn: {e}")})
                }
            }
        } else {
            // The turn ended before its answer went out.
            json!({"type": "text", "text": session.as_ref().map(last_answer).unwrap_or_default(), "resumed": true})
        };
        match (&asked, body.is_null()) {
            (_, true) => {}
            (Some((n, m)), false) => {
                world.send_as("agent", Some(&m.from), None, Some(&m.id), body);
                world.agent_done(*n);
            }
            // A turn started before the asker was recorded (an older world).
            (None, false) => world.send_as("agent", Some("console"), None, None, body),
        }
        idle.store(true, Ordering::SeqCst);
    }
    while !stop.load(Ordering::SeqCst) && session.is_some() {
        let Some((n, m)) = world.agent_peek(Duration::from_millis(100)) else { continue };
        let Some(text) = prompt(&m).map(str::to_owned) else {
            world.agent_done(n);
            continue;
        };
        idle.store(false, Ordering::SeqCst);
        let queued = [QueuedPrompt { n, prompt: text.clone() }];
        let body = match run(&mut session, Some(&text), Step::Queued(&queued)) {
            Ran::Done(Ok(Some(o))) => json!({"type": "text", "text": o.text, "stop": o.stop}),
            // Taken before (its number is not above the session's mark).
            Ran::Done(Ok(None)) => {
                json!({"type": "text", "text": session.as_ref().map(last_answer).unwrap_or_default(), "resumed": true})
            }
            Ran::Done(Err(e)) | Ran::Lost(e) => {
                json!({"type": "error", "reason": format!("the agent's turn failed: {e}")})
            }
        };
        // Answered (handed to the broker), then forgotten: a crash between
        // the two sends the answer again at the next run.
        world.send_as("agent", Some(&m.from), None, Some(&m.id), body);
        world.agent_done(n);
        idle.store(true, Ordering::SeqCst);
    }
}
