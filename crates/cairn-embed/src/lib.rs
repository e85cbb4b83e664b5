//! cairn for applications: build an [`Agent`] with your own tools
//! ([`ToolDef`]: a name, a JSON schema, a risk tier, a replay policy and a
//! callback) and your own approver (a callback given a [`Question`]: the
//! tool, its arguments, its risk tier and the diff of what it would
//! change), on a provider and model named as the `cairn` command names
//! them, and run, stream or resume its turns ([`Agent::run`],
//! [`Agent::run_with`], [`Agent::resume`]) with typed [`Event`]s.
//!
//! It is a face like the command line, the 9P tree or ACP: each turn is
//! equipped by the runtime the `cairn` binary uses (`cairn_runtime`'s
//! `RuntimeHost`: the configuration, the built-in tools with their sandbox and
//! staging, discovery, hooks) and put together and started by
//! `cairn_host::Equipment`, the one place a face's turn is built, so its
//! sessions are the same files `cairn show`, `cairn undo` and
//! `cairn resume` read, with the same durability: a call cut short by a
//! crash is settled once on resume, re-run only if its tool is
//! [`Replay::Idempotent`].
//!
//! With [`AgentBuilder::database`] the sessions are kept in PostgreSQL
//! instead, as `cairn worker` keeps them, but driven only by the
//! application: no worker takes them (the application's tools live in its
//! processes), and the application's process claims its session by id
//! under a lease with a fencing epoch, as a worker does. A new process's
//! [`Agent::resume`] claims a session whose process died once that
//! process's lease has expired.
//!
//! ```no_run
//! use cairn_embed::{Agent, Replay, Risk, ToolDef};
//! use serde_json::json;
//!
//! let weather = ToolDef::new(
//!     "weather",
//!     "Today's weather in a city.",
//!     json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
//!     Risk::ReadOnly,
//!     Replay::Idempotent,
//!     |args| Ok(format!("sunny in {}", args["city"].as_str().unwrap_or("?"))),
//! );
//! let agent = Agent::builder()
//!     .provider("openai")
//!     .model("gpt-4.1-mini")
//!     .tool(weather)
//!     .approve(|question| question.risk != Risk::Destructive)
//!     .build()?;
//! let outcome = agent.run("What is the weather in Oslo?")?;
//! println!("{} (session {})", outcome.answer, outcome.session_id);
//! # Ok::<(), anyhow::Error>(())
//! ```
//!
//! Must not: hold domain logic of its own. What a turn does, which calls
//! need approval and how a crash is settled are cairn-core's; how a session
//! is equipped is cairn-runtime's (`equip.rs`); this crate only chooses
//! which of the equipped tools are offered ([`Builtins`]) and adds the
//! application's.
#![deny(missing_docs)]

mod approve;
mod event;
mod host;
#[cfg(feature = "postgres")]
mod pg;
mod tool;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context as _, Result, bail};
use cairn_core::approval::{Allowlist, SharedApprover};
use cairn_core::provider::Provider;
use cairn_core::storage::registers::{self, ProviderFact};
use cairn_core::storage::{Storage, Transaction};
use cairn_core::{Session, ToolRegistry};
use cairn_host::{Equipment, SessionHost as _, Step};
use cairn_runtime::config::{Overrides, Settings};
use cairn_runtime::hosting::RuntimeHost;
use cairn_runtime::paths::Paths;
use cairn_runtime::setup::{Common, Setup};

pub use approve::{ApproveFn, Question};
pub use cairn_core::CancelToken;
pub use cairn_core::risk::Risk;
pub use event::{CallStatus, Event, Outcome, Stop, ToolCall, Usage};
pub use tool::{Replay, ToolDef, ToolFn};

use crate::event::Tally;
use crate::host::EmbedHost;

/// Which of cairn's own tools a session offers beside the application's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Builtins {
    /// None: only the application's tools (the default).
    #[default]
    None,
    /// Every tool `cairn run` would offer in the session's directory: the
    /// built-in file and shell tools (sandboxed; `shell` staged), external
    /// tools, configured MCP servers' tools and subagents.
    All,
    /// Only these of them, by name (e.g. `read_file`, `shell`).
    Only(Vec<String>),
}

/// Builds an [`Agent`]; see [`Agent::builder`].
#[derive(Default)]
pub struct AgentBuilder {
    home: Option<PathBuf>,
    cwd: Option<PathBuf>,
    provider: Option<String>,
    model: Option<String>,
    script: Option<PathBuf>,
    allow: Vec<String>,
    name: Option<String>,
    tools: Vec<ToolDef>,
    approve: Option<Box<ApproveFn>>,
    builtins: Builtins,
    database: Option<String>,
    lease: Option<std::time::Duration>,
}

impl std::fmt::Debug for AgentBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentBuilder")
            .field("home", &self.home)
            .field("cwd", &self.cwd)
            .field("provider", &self.provider)
            .field("tools", &self.tools)
            .field("approve", &self.approve.is_some())
            .field("database", &self.database.is_some())
            .finish_non_exhaustive()
    }
}

impl AgentBuilder {
    /// cairn's home: where sessions, pre-images and `config.toml` live (as
    /// `CAIRN_HOME` sets it for the command). Default: the command's
    /// (`$CAIRN_HOME`, else the XDG directories).
    pub fn home(mut self, home: impl Into<PathBuf>) -> Self {
        self.home = Some(home.into());
        self
    }

    /// The working directory of new sessions (default: the process's).
    pub fn cwd(mut self, cwd: impl Into<PathBuf>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// The provider, by the names `cairn --provider` takes: `local`,
    /// `openai`, `openai-responses`, `anthropic`, `scripted` (with
    /// [`AgentBuilder::script`]) or a `[providers.NAME]` of the
    /// configuration. Default: the configuration's.
    pub fn provider(mut self, name: impl Into<String>) -> Self {
        self.provider = Some(name.into());
        self
    }

    /// The provider's model (default: the configuration's or the
    /// provider's own).
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// The script of the `scripted` provider (a JSONL file, one model turn
    /// a line); implies that provider unless another is named.
    pub fn script(mut self, path: impl Into<PathBuf>) -> Self {
        self.script = Some(path.into());
        self
    }

    /// Allow Write calls matching `pattern` without asking (as `--allow`:
    /// `write_file`, `shell(ls *)`); never Destructive ones.
    pub fn allow(mut self, pattern: impl Into<String>) -> Self {
        self.allow.push(pattern.into());
        self
    }

    /// A name for each new session (usable instead of its id).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Offer `tool` to the model.
    pub fn tool(mut self, tool: ToolDef) -> Self {
        self.tools.push(tool);
        self
    }

    /// Ask `approve` about every call the policy puts to a person: Write
    /// calls no allow rule covers and every Destructive call (no rule
    /// answers those). Without an approver, such calls are refused and
    /// Destructive tools are not offered.
    pub fn approve(mut self, approve: impl FnMut(&Question) -> bool + Send + 'static) -> Self {
        self.approve = Some(Box::new(approve));
        self
    }

    /// Which of cairn's own tools to offer (default: none).
    pub fn builtin_tools(mut self, builtins: Builtins) -> Self {
        self.builtins = builtins;
        self
    }

    /// Keep the sessions in this PostgreSQL database (a URL,
    /// `postgres://USER@HOST/DB`, or `key=value` pairs) instead of files.
    /// Such a session is driven only by this application's processes,
    /// never by a `cairn worker` (the application's tools live here): each
    /// run claims its new session under a lease, every commit is fenced by
    /// it, and [`Agent::resume`] claims the session by id once a dead
    /// process's lease has expired. `cairn sessions`, `show`, `log` and
    /// `export` with `--database` read it. Needs the feature `postgres`.
    pub fn database(mut self, url: impl Into<String>) -> Self {
        self.database = Some(url.into());
        self
    }

    /// The lease a database session is held under (default 10 s): a
    /// process killed mid-turn leaves its session to a new process's
    /// [`Agent::resume`] after at most this long. 1 s to a day; only with
    /// [`AgentBuilder::database`].
    pub fn lease(mut self, lease: std::time::Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Read the configuration and build the provider: the agent, or what is
    /// wrong (an unknown provider, a missing key, a bad allow pattern).
    pub fn build(self) -> Result<Agent> {
        let mut paths = match (Paths::from_env(), &self.home) {
            (Ok(paths), _) => paths,
            (Err(_), Some(home)) => Paths {
                data: home.clone(),
                config_file: home.join("config.toml"),
                config_dir: home.clone(),
                user_home: None,
                default_dirs: Vec::new(),
            },
            (Err(e), None) => return Err(e),
        };
        if let Some(home) = &self.home {
            let home = absolute(home)?;
            paths.config_file = home.join("config.toml");
            paths.config_dir = home.clone();
            paths.data = home;
        }
        let overrides = Overrides {
            provider: self.provider.clone(),
            model: self.model.clone(),
            script: self.script.as_deref().map(absolute).transpose()?,
            allow: self.allow.clone(),
            database: self.database.clone(),
        };
        let settings = Settings::load(&paths.config_file, &overrides)?;
        let common =
            Common { cwd: self.cwd.as_deref().map(absolute).transpose()?, name: self.name, ..Common::default() };
        let ctx = Setup::new(paths, settings).with_common(common);
        // The sandbox's kernel probes fork throwaway children: start them
        // now, on a thread, while the process is small, as `cairn run` does.
        let probes = cairn_tools::probe_ahead();
        let allow = Allowlist::parse(ctx.settings.allow.value.iter().map(String::as_str))
            .context("invalid allow pattern (from allow or [approvals] allow)")?;
        let cwd = cairn_runtime::parts::new_session_cwd(&ctx)?;
        let provider = cairn_runtime::parts::build_provider(&ctx, &cwd)?;
        let person = self.approve.map(|f| SharedApprover::new(Box::new(approve::CallbackApprover(f))));
        let database = database(self.database, self.lease)?;
        Ok(Agent {
            host: RuntimeHost { ctx },
            provider: Mutex::new(provider),
            tools: self.tools,
            builtins: self.builtins,
            allow,
            person,
            database,
            _probes: probes,
        })
    }
}

#[cfg(feature = "postgres")]
type Database = pg::Database;
/// Without the feature there is never a database (asking for one fails).
#[cfg(not(feature = "postgres"))]
type Database = std::convert::Infallible;

/// The database the builder was given, checked.
fn database(url: Option<String>, lease: Option<std::time::Duration>) -> Result<Option<Database>> {
    match url {
        None if lease.is_some() => bail!("a lease was given without a database; give the database too (or no lease)"),
        None => Ok(None),
        #[cfg(feature = "postgres")]
        Some(url) => pg::Database::new(url, lease).map(Some),
        #[cfg(not(feature = "postgres"))]
        Some(_) => bail!("{}", cairn_runtime::parts::NO_POSTGRES),
    }
}

/// `path` made absolute against the current directory (sessions record
/// where they work; a later process may start elsewhere).
fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("{}: cannot make it an absolute path", path.display()))
}

/// An application's agent: its provider, tools and approver, and cairn's
/// configuration. Each [`Agent::run`] starts a new session; one run at a
/// time per agent (a second waits).
pub struct Agent {
    host: RuntimeHost,
    provider: Mutex<Box<dyn Provider + Send>>,
    tools: Vec<ToolDef>,
    builtins: Builtins,
    allow: Allowlist,
    person: Option<SharedApprover>,
    /// Where sessions are kept when not in files.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    database: Option<Database>,
    /// Waited for when the agent is dropped (no probe directory is left).
    _probes: cairn_tools::ProbesAhead,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("sessions", &self.host.ctx.paths.sessions())
            .field("tools", &self.tools)
            .field("builtins", &self.builtins)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// Start building an agent.
    pub fn builder() -> AgentBuilder {
        AgentBuilder::default()
    }

    /// The directory of this agent's session files (`<id>.jsonl`).
    pub fn sessions_dir(&self) -> PathBuf {
        self.host.ctx.paths.sessions()
    }

    /// Run `prompt` as the first turn of a new session.
    pub fn run(&self, prompt: &str) -> Result<Outcome> {
        self.run_with(prompt, &mut |_| {}, &CancelToken::new())
    }

    /// [`Agent::run`], telling each [`Event`] to `on_event` as it happens,
    /// until the turn ends or `cancel` is cancelled (the session then
    /// resumes where it stopped).
    pub fn run_with(&self, prompt: &str, on_event: &mut dyn FnMut(&Event), cancel: &CancelToken) -> Result<Outcome> {
        if prompt.trim().is_empty() {
            bail!("the prompt is empty");
        }
        #[cfg(feature = "postgres")]
        if let Some(db) = &self.database {
            return pg::run(self, db, prompt, on_event, cancel);
        }
        let ctx = &self.host.ctx;
        let (mut store, cwd) = cairn_runtime::parts::create_session(ctx)?;
        let mut notes = Vec::new();
        let mut provider = self.provider.lock().map_err(|_| anyhow::anyhow!("an earlier run panicked"))?;
        let equipped = self.record_provider(&mut store, &**provider).and_then(|()| {
            Equipment::for_turn(&self.host(), store, &cwd, Some(prompt), self.approver(), self.person.as_ref(), |n| {
                notes.push(n.to_owned())
            })
        });
        let (mut session, mut equipment) = equipped?;
        self.drive(&mut session, &mut equipment, &mut **provider, Step::Prompt(prompt), notes, on_event, cancel)
    }

    /// Finish the interrupted turn of session `id` (an id, a unique prefix
    /// of one, or its name) as `cairn resume` does: a call cut short is
    /// settled once (re-run only if its tool is [`Replay::Idempotent`],
    /// else failed and uncertain) and the turn goes on. A session with
    /// nothing to finish ends at once ([`Stop::Nothing`]).
    pub fn resume(&self, id: &str) -> Result<Outcome> {
        self.resume_with(id, &mut |_| {}, &CancelToken::new())
    }

    /// [`Agent::resume`], telling each [`Event`] to `on_event`. For a
    /// database session this first waits, at most one lease, for a dead
    /// process's lease to expire (`cancel` stops the wait).
    pub fn resume_with(&self, id: &str, on_event: &mut dyn FnMut(&Event), cancel: &CancelToken) -> Result<Outcome> {
        #[cfg(feature = "postgres")]
        if let Some(db) = &self.database {
            return pg::resume(self, db, id, on_event, cancel);
        }
        let ctx = &self.host.ctx;
        let path = cairn_runtime::sessions::resolve(ctx, id)?;
        let mut store = cairn_runtime::parts::open_session(ctx, &path)?;
        if let Some(child) = cairn_runtime::family::child_fact(&store) {
            bail!(
                "session {} is a child of session {}; resume its parent, which re-attaches its children",
                store.header().id,
                child.parent
            );
        }
        let cwd = PathBuf::from(&store.header().cwd);
        let mut provider = self.provider.lock().map_err(|_| anyhow::anyhow!("an earlier run panicked"))?;
        self.record_provider(&mut store, &**provider)?;
        let host = self.host();
        let mut session = Session::open(store, host.session_config())?;
        let mut notes = Vec::new();
        // An undo killed after its plan was committed is finished first: no
        // turn runs on a half-reverted tree.
        notes.extend(host.finish_undo(&mut session, &cwd)?);
        let approver = self.approver();
        let mut equipment = Equipment { tools: ToolRegistry::new(&approver), approver };
        let mut session = equipment
            .reequip(&host, session, &cwd, None, self.person.as_ref(), |n| notes.push(n.to_owned()))
            .map_err(|unequipped| unequipped.error)?;
        self.drive(&mut session, &mut equipment, &mut **provider, Step::Resume, notes, on_event, cancel)
    }

    /// The host that equips this agent's turns.
    fn host(&self) -> EmbedHost<'_> {
        EmbedHost { inner: &self.host, tools: &self.tools, builtins: &self.builtins }
    }

    /// The session's policy over this agent's approver: allow rules for
    /// Write calls; everything else the policy puts to a person asks it.
    fn approver(&self) -> cairn_core::approval::PolicyApprover {
        let ask = self.person.clone().map(|p| Box::new(p) as Box<dyn cairn_core::approval::Approver>);
        cairn_runtime::parts::policy(false, self.allow.clone(), ask)
    }

    /// Record the provider the session's turns run on (the fact `cairn
    /// resume` continues on), when it is not recorded already.
    fn record_provider<S: Storage>(&self, store: &mut S, provider: &dyn Provider) -> Result<()> {
        let name = self.host.ctx.settings.provider.value.clone();
        let fact = ProviderFact { name, model: provider.model().to_owned() };
        if registers::provider_fact(store).as_ref() != Some(&fact) {
            store
                .commit(Transaction::new().set_provider_fact(&fact)?)
                .context("cannot record the session's provider")?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn drive<S: Storage>(
        &self,
        session: &mut Session<S>,
        equipment: &mut Equipment,
        provider: &mut dyn Provider,
        step: Step<'_>,
        notes: Vec<String>,
        on_event: &mut dyn FnMut(&Event),
        cancel: &CancelToken,
    ) -> Result<Outcome> {
        let session_id = session.store().header().id.clone();
        let mut tally = Tally::default();
        let mut observer = |event: &cairn_core::TurnEvent| {
            tally.see_core(event);
            if let Some(event) = Event::of(event) {
                tally.see(&event);
                on_event(&event);
            }
        };
        let outcome = equipment
            .run(session, &*provider, step, &mut observer, cancel)
            .with_context(|| format!("session {session_id}"))?;
        let (answer, stop) = match outcome {
            Some(outcome) => (outcome.text, Stop::from(outcome.stop)),
            None => (cairn_core::report::last_answer(&session.messages()), Stop::Nothing),
        };
        Ok(Outcome { session_id, answer, stop, usage: tally.usage(), tool_calls: tally.calls, notes })
    }
}
