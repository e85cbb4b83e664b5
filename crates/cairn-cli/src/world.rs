//! `cairn world init|run`: a world of WASM actors (cairn-actors) driven by
//! the line console on standard input, and the native actor `agent`: an
//! ordinary durable cairn session whose turns are started by messages.
//! Wiring only: the broker, the console and the `actor_*` tools live in
//! cairn-actors; turns are cairn-core's.
//!
//! The agent: a `{"type":"text","text":…}` message without `reply_to`
//! starts a turn (replies never do); the final answer goes back to the
//! sender as a reply `{"type":"text","text":…}`. The session file's path is
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
use cairn_core::approval::Allowlist;
use cairn_core::provider::Provider;
use cairn_core::storage::registers::{self, QueuedPrompt};
use cairn_core::storage::{JsonlStore, Storage};
use cairn_core::{CancelToken, Session, SessionConfig, ToolRegistry, TurnEvent};
use cairn_runtime::{Equipment, Step};
use clap::Subcommand;
use serde_json::{Value, json};

use crate::context::{Context, exit};

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
pub fn run(ctx: &Context, action: WorldAction) -> Result<u8> {
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
    registry: ToolRegistry,
    allow: Allowlist,
    /// `--yes`: the session's standing approval of Write calls.
    yes: bool,
    session: Session<JsonlStore>,
}

impl Agent {
    fn start(ctx: &Context, world: Arc<World>, dir: &Path) -> Result<Agent> {
        let marker = dir.join("broker").join("agent-session");
        let (store, cwd) = match std::fs::read_to_string(&marker) {
            Ok(p) => {
                let path = PathBuf::from(p.trim());
                let store = crate::wiring::open_session(ctx, &path).with_context(|| {
                    format!("the agent's session {} (named in {})", path.display(), marker.display())
                })?;
                let cwd = PathBuf::from(&store.header().cwd);
                (store, cwd)
            }
            Err(_) => {
                let (store, cwd) = crate::wiring::create_session(ctx)?;
                cairn_actors::layout::write_atomic(&marker, store.path().to_string_lossy().as_bytes())?;
                (store, cwd)
            }
        };
        let provider = crate::wiring::build_provider(ctx, &cwd)?;
        let allow = Allowlist::parse(ctx.settings.allow.value.iter().map(String::as_str))
            .context("invalid allow pattern (from --allow or [approvals] allow)")?;
        // Headless: nobody answers here, so Destructive tools are not
        // offered and a Write call needs an allow rule or --yes.
        let policy = crate::wiring::policy(ctx.common.yes, allow.clone(), None);
        // The session's tools as every face offers them (a tool service
        // when configured, the subagent family); what is not offered is
        // said, not dropped silently.
        let tools = cairn_runtime::toolsrv::turn_tools(ctx, &cwd)?;
        let authority = crate::subagents::Authority::of(&policy, None);
        let asker = crate::equip::Asker { approver: &policy, family: Some(&authority) };
        let mut equipped = crate::equip::offer(ctx, &cwd, &tools, None, asker)?;
        let mut registry = equipped.registry(&policy);
        let mut notes: Vec<String> = equipped.all_notes().cloned().collect();
        // Without a person at a terminal, Destructive tools (actor_remove)
        // cannot be approved, so the registry refuses them: not offered.
        for tool in cairn_actors::tools::actor_tools(world.clone()) {
            let name = tool.spec().name.clone();
            if let Err(e) = registry.register(tool) {
                notes.push(format!("tool {name} not offered: {e}"));
            }
        }
        for note in notes {
            eprintln!("cairn: the agent: {note}");
        }
        let config: SessionConfig = crate::wiring::session_config(ctx);
        let session = Session::open(store, config)?;
        let parts = AgentParts { provider, registry, allow, yes: ctx.common.yes, session };
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

fn agent_loop(p: AgentParts, world: &World, stop: &AtomicBool, idle: &AtomicBool) {
    let cancel = CancelToken::new();
    let AgentParts { provider, registry, allow, yes, mut session } = p;
    // An approver is not `Send`: the agent's is built on its own thread.
    let mut equipment = Equipment { tools: registry, approver: crate::wiring::policy(yes, allow, None) };
    let mut observer = |_: &TurnEvent| {};
    // Resumed and new turns run with the same parts.
    let mut run = |session: &mut Session<JsonlStore>, step: Step<'_>| {
        equipment.run(session, &*provider, step, &mut observer, &cancel)
    };
    // Messages numbered up to `through` were taken into the session; the
    // one still in the mailbox is the turn not yet answered.
    let through = registers::prompt_queue(session.store()).through;
    if let Err(e) = world.agent_reserve(through + 1) {
        eprintln!("cairn: the agent's mailbox: {e:#}");
    }
    let asked = world.agent_waiting().into_iter().find(|(n, m)| *n <= through && prompt(m).is_some());
    if session.needs_resume() || asked.is_some() {
        idle.store(false, Ordering::SeqCst);
        let body = if session.needs_resume() {
            match run(&mut session, Step::Resume) {
                Ok(Some(o)) => json!({"type": "text", "text": o.text, "resumed": true}),
                Ok(None) => Value::Null,
                Err(e) => json!({"type": "error", "reason": format!("resuming the agent's turn: {e}")}),
            }
        } else {
            // The turn ended before its answer went out.
            json!({"type": "text", "text": last_answer(&session), "resumed": true})
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
    while !stop.load(Ordering::SeqCst) {
        let Some((n, m)) = world.agent_peek(Duration::from_millis(100)) else { continue };
        let Some(text) = prompt(&m).map(str::to_owned) else {
            world.agent_done(n);
            continue;
        };
        idle.store(false, Ordering::SeqCst);
        let body = match run(&mut session, Step::Queued(&[QueuedPrompt { n, prompt: text }])) {
            Ok(Some(o)) => json!({"type": "text", "text": o.text, "stop": o.stop}),
            // Taken before (its number is not above the session's mark).
            Ok(None) => json!({"type": "text", "text": last_answer(&session), "resumed": true}),
            Err(e) => json!({"type": "error", "reason": format!("the agent's turn failed: {e}")}),
        };
        // Answered (handed to the broker), then forgotten: a crash between
        // the two sends the answer again at the next run.
        world.send_as("agent", Some(&m.from), None, Some(&m.id), body);
        world.agent_done(n);
        idle.store(true, Ordering::SeqCst);
    }
}
