//! The CLI's own turns (`cairn run`, `chat`, `resume`; `ask` and
//! `compact` use its [`Runner`]): the parts built by `parts.rs`, the
//! tools of the turn (`equip.rs`: tool service or in-process, the subagent
//! family; discovery's choice), then `run`, `chat` and `resume`,
//! which hand them to `cairn_core::Session`, and Ctrl-C.
//!
//! The turn itself (state machine, effect sandwich, approval policy) lives in
//! cairn-core; this module only assembles the parts and maps outcomes to
//! exit codes.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use cairn_core::approval::{Allowlist, SharedApprover};
use cairn_core::provider::Provider;
use cairn_core::storage::registers::{self, ProviderFact};
use cairn_core::storage::{JsonlStore, Storage};
use cairn_core::{CancelToken, Session, ToolRegistry, TurnError, TurnEvent, TurnOutcome, TurnStop};
use cairn_runtime::{Equipment, Step};
use serde_json::json;

use crate::approver::TerminalApprover;
use crate::invocation::{Invocation, exit};
use crate::parts::{build_provider, create_session, open_session, policy, session_config};
use crate::render::{Mode, Renderer};

/// What runs a CLI command's turns: the parts a turn needs, built once
/// per command.
pub struct Runner {
    provider: Box<dyn Provider + Send>,
    /// The provider's name as configured (what `fact` `provider` records,
    /// so a resume can build it again).
    provider_name: String,
    /// A person chose the provider in this chat (`/provider NAME`): like
    /// `--provider`, that choice wins over a resumed session's own.
    provider_chosen: bool,
    /// The tools of the current turn and who answers their calls.
    equipment: Equipment,
    /// The family's tools (subagents, peers), built for the first turn and
    /// offered with every later choice of tools: the same instances, so
    /// children spawned by one turn can be waited for by the next.
    family: Option<Vec<Arc<dyn cairn_core::tool::Tool>>>,
    /// Notes on the tools already told (each is said once per command,
    /// not at every turn).
    told: std::collections::HashSet<String>,
    /// Who answers for the session's children (re-attached on resume).
    inheritance: crate::subagents::Inheritance,
    /// The `[providers.NAME]` tables, to price each attempt of the ledger
    /// by the provider and model that made it.
    provider_tables: std::collections::BTreeMap<String, toml::Value>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner").field("provider", &self.provider.name()).finish_non_exhaustive()
    }
}

impl Runner {
    /// Equip the next turn of the session in `store`, working in `cwd`, as
    /// every face does (`equip::turn`): the tools read once, discovery's
    /// choice for `prompt` recorded (`None`: the interrupted turn, offered
    /// what was recorded for it), the family, and the settings with the
    /// chosen skills, returned for the session's (re)open. Notes not told
    /// before are told.
    pub fn equip(
        &mut self,
        ctx: &Invocation,
        cwd: &Path,
        store: &mut JsonlStore,
        prompt: Option<&str>,
        renderer: &mut Renderer,
    ) -> Result<cairn_core::SessionConfig> {
        let family = self.family.is_none().then_some(&self.inheritance);
        let answerer = crate::equip::Answerer { approver: &self.equipment.approver, family };
        let mut equipped = crate::equip::turn(ctx, cwd, store, prompt, answerer, session_config(ctx))?;
        match &self.family {
            None => self.family = Some(equipped.family_tools().to_vec()),
            Some(family) => equipped.tools.tools.extend(family.iter().cloned()),
        }
        self.equipment.tools = equipped.registry(&self.equipment.approver);
        self.record_provider(store)?;
        for note in &equipped.tools.notes {
            if self.told.insert(note.clone()) {
                renderer.notice(note);
            }
        }
        for note in &equipped.untrusted {
            if self.told.insert(note.clone()) {
                renderer.notice(note);
                // --json and --quiet keep stderr for what a person must
                // know: tools they expected are missing.
                if mode(ctx) != Mode::Human {
                    let _ = writeln!(std::io::stderr(), "cairn: {note}");
                }
            }
        }
        Ok(equipped.config)
    }

    /// Record in `store` the provider and model the next turn runs on,
    /// when they are not what it records already (one line per change).
    fn record_provider(&self, store: &mut JsonlStore) -> Result<()> {
        let fact = ProviderFact { name: self.provider_name.clone(), model: self.provider.model().to_owned() };
        if registers::provider_fact(store).as_ref() != Some(&fact) {
            store
                .commit(cairn_core::storage::Transaction::new().set_provider_fact(&fact)?)
                .context("cannot record the session's provider")?;
        }
        Ok(())
    }

    /// Continue an existing session on the provider and model its turns
    /// ran on (`fact` `provider`), unless `--provider`/`--model`/`--script`
    /// (or `CAIRN_PROVIDER`/`CAIRN_MODEL`) choose another; says which it
    /// is whenever it differs from the configured default or from the
    /// session's. A session without the fact (older) runs on the
    /// configured one; a provider chosen with `/provider` in this chat
    /// counts as told.
    pub fn continue_provider(&mut self, ctx: &Invocation, store: &JsonlStore, renderer: &mut Renderer) {
        let Some(recorded) = registers::provider_fact(store) else { return };
        if self.provider_chosen {
            if (recorded.name.as_str(), recorded.model.as_str()) != (self.provider_name.as_str(), self.provider.model())
            {
                renderer.notice(&format!(
                    "the session's turns ran on {} · {}; they go on with {} · {}, chosen with /provider",
                    recorded.name,
                    recorded.model,
                    self.provider_name,
                    self.provider.model()
                ));
            }
            return;
        }
        let s = &ctx.settings;
        let told = |source: &crate::config::Source| {
            matches!(source, crate::config::Source::Flag(_) | crate::config::Source::Env(_))
        };
        let (told_provider, told_model) = (told(&s.provider.source), told(&s.model.source));
        let name = if told_provider { s.provider.value.clone() } else { recorded.name.clone() };
        let model = match (told_model, name == recorded.name) {
            (true, _) => s.model.value.clone(),
            (false, true) => Some(recorded.model.clone()),
            (false, false) => s.model.value.clone(),
        };
        let same_as_now = name == self.provider_name && model.as_deref().is_none_or(|m| m == self.provider.model());
        if !same_as_now {
            let cwd = PathBuf::from(&store.header().cwd);
            match crate::parts::provider_for(ctx, &name, model.as_deref(), s.script.value.as_deref(), &cwd) {
                Ok(provider) => {
                    self.provider = provider;
                    self.provider_name = name;
                }
                Err(e) => {
                    renderer.notice(&format!(
                        "the session's turns ran on {} · {}, which cannot be used now ({e:#}); this turn runs on {} · {} \
                         (--provider NAME --model MODEL choose another)",
                        recorded.name,
                        recorded.model,
                        self.provider_name,
                        self.provider.model()
                    ));
                    return;
                }
            }
        }
        let now = (self.provider_name.as_str(), self.provider.model());
        if now == (recorded.name.as_str(), recorded.model.as_str()) {
            if !same_as_now {
                renderer.notice(&format!(
                    "continuing on {} · {}, as the session's turns ran (--provider/--model choose another)",
                    now.0, now.1
                ));
            }
        } else {
            renderer.notice(&format!(
                "the session's turns ran on {} · {}; from now on they run on {} · {}",
                recorded.name, recorded.model, now.0, now.1
            ));
        }
    }

    /// [`Runner::equip`] for the next turn of an open session, reopened
    /// without checking the whole log again (discovery only records a
    /// fact).
    pub fn reequip(
        &mut self,
        ctx: &Invocation,
        session: Session<JsonlStore>,
        prompt: Option<&str>,
        renderer: &mut Renderer,
    ) -> Result<Session<JsonlStore>> {
        let cwd = PathBuf::from(&session.store().header().cwd);
        let mut reopen = session.into_reopen();
        let config = self.equip(ctx, &cwd, reopen.store_mut(), prompt, renderer)?;
        Ok(Session::reopen(reopen, config)?)
    }

    /// The session's usage so far, each attempt priced at its provider's
    /// prices for its model (`cairn_runtime::config::prices`, which prices
    /// the exported `cairn.cost` too).
    fn usage(&self, store: &JsonlStore) -> crate::status::SessionUsage {
        crate::status::SessionUsage::of(store, &|provider, model| {
            cairn_runtime::config::prices(&self.provider_tables, provider, model)
        })
    }

    /// Run `step` of `session` with this provider and the current tools
    /// (`cairn_host::Equipment::run`).
    pub fn run(
        &mut self,
        session: &mut Session<JsonlStore>,
        step: Step<'_>,
        observer: &mut dyn FnMut(&TurnEvent),
        cancel: &CancelToken,
    ) -> Result<Option<TurnOutcome>, TurnError> {
        self.equipment.run(session, &*self.provider, step, observer, cancel)
    }

    /// Compact `session` now (`cairn_host::Equipment::compact`).
    pub fn compact(
        &mut self,
        session: &mut Session<JsonlStore>,
        observer: &mut dyn FnMut(&TurnEvent),
        cancel: &CancelToken,
    ) -> Result<Option<String>, TurnError> {
        self.equipment.compact(session, &*self.provider, observer, cancel)
    }

    /// The tools offered now.
    pub fn tools(&self) -> &ToolRegistry {
        &self.equipment.tools
    }
}

impl Runner {
    /// The provider and approver for a session in `cwd`, headless when
    /// `may_ask` is false (`cairn ask`: no person is asked even when stdin is a
    /// terminal); its tools come with each turn ([`Runner::equip`]).
    pub fn new(ctx: &Invocation, cwd: &Path, may_ask: bool) -> Result<Runner> {
        let provider = build_provider(ctx, cwd)?;
        let allow = Allowlist::parse(ctx.settings.allow.value.iter().map(String::as_str))
            .context("invalid allow pattern (from --allow or [approvals] allow)")?;
        let terminal = TerminalApprover::new(ctx.err_style);
        // One approver for the session and its children (`subagents/`).
        let terminal = SharedApprover::new(Box::new(if may_ask { terminal } else { terminal.headless() }));
        let approver = policy(ctx.common.yes, allow, Some(Box::new(terminal.clone())));
        let inheritance = crate::subagents::Inheritance::of(&approver, Some(terminal));
        let tools = ToolRegistry::new(&approver);
        Ok(Runner {
            provider,
            provider_name: ctx.settings.provider.value.clone(),
            provider_chosen: false,
            equipment: Equipment { tools, approver },
            family: None,
            told: std::collections::HashSet::new(),
            inheritance,
            provider_tables: ctx.settings.providers.clone(),
        })
    }
}

/// Ctrl-C handling shared by every turn of this process: the first press
/// cancels the running turn (settled durably by the core); a second press
/// within [`leave_window`] of the one before leaves; a press with no turn
/// running (and no prompt reading keys) leaves at once, there being
/// nothing to interrupt. At chat's idle prompt the line editor reads Ctrl-C
/// as a key, and `chat_loop` applies the same two-press rule through
/// [`pressed_again`].
struct Interrupts {
    current: Mutex<Option<CancelToken>>,
    in_turn: AtomicBool,
    /// When Ctrl-C was last pressed, in a turn or at the prompt.
    last_press: Mutex<Option<Instant>>,
}

/// How close a second Ctrl-C must follow the first to leave: a second.
/// `CAIRN_CTRL_C_WINDOW_MS` sets it (a slow terminal or a test that must
/// not depend on the machine's speed).
fn leave_window() -> Duration {
    static WINDOW: OnceLock<Duration> = OnceLock::new();
    *WINDOW.get_or_init(|| {
        std::env::var("CAIRN_CTRL_C_WINDOW_MS")
            .ok()
            .and_then(|ms| ms.trim().parse::<u64>().ok())
            .map_or(Duration::from_secs(1), Duration::from_millis)
    })
}

/// Record a Ctrl-C now; true when the press before it came within the
/// leave window (so this one leaves).
fn pressed_again() -> bool {
    let state = interrupts();
    let now = Instant::now();
    let before = state.last_press.lock().ok().and_then(|mut last| last.replace(now));
    before.is_some_and(|t| now.duration_since(t) <= leave_window())
}

fn interrupts() -> &'static Arc<Interrupts> {
    static CELL: OnceLock<Arc<Interrupts>> = OnceLock::new();
    CELL.get_or_init(|| {
        let state = Arc::new(Interrupts {
            current: Mutex::new(None),
            in_turn: AtomicBool::new(false),
            last_press: Mutex::new(None),
        });
        let handler_state = Arc::clone(&state);
        // If the handler cannot be installed Ctrl-C keeps its default
        // behaviour (kill): the session file stays valid and resumable.
        let _ = ctrlc::set_handler(move || {
            let again = pressed_again();
            let token = handler_state.current.lock().ok().and_then(|g| g.clone());
            match token {
                Some(token) if handler_state.in_turn.load(Ordering::SeqCst) && !token.is_cancelled() => {
                    // Cancel first: writing may wait for the stderr lock.
                    token.cancel();
                    let _ = writeln!(std::io::stderr(), "\ninterrupting… (press Ctrl-C again to leave)");
                }
                // The turn is winding down (a tool being stopped and
                // settled): leave only on a quick second press, so a
                // stray one much later does not cut the settling short.
                Some(_) if again => {
                    crate::typeahead::restore();
                    std::process::exit(i32::from(exit::CANCELLED))
                }
                Some(_) => {
                    let _ = writeln!(std::io::stderr(), "\nstill stopping the turn… (press Ctrl-C twice to leave now)");
                }
                None => {
                    crate::typeahead::restore();
                    std::process::exit(i32::from(exit::SUCCESS))
                }
            }
        });
        state
    })
}

/// Esc pressed during a chat turn (`typeahead.rs`): interrupt it as a
/// first Ctrl-C does.
fn interrupt_by_escape() {
    let state = interrupts();
    let token = state.current.lock().ok().and_then(|g| g.clone());
    if let Some(token) = token
        && state.in_turn.load(Ordering::SeqCst)
        && !token.is_cancelled()
    {
        token.cancel();
        crate::typeahead::notice("interrupting… (Esc)");
    }
}

fn arm(token: &CancelToken) {
    let state = interrupts();
    if let Ok(mut current) = state.current.lock() {
        *current = Some(token.clone());
    }
    state.in_turn.store(true, Ordering::SeqCst);
}

fn disarm() {
    let state = interrupts();
    state.in_turn.store(false, Ordering::SeqCst);
    // No turn is running: a Ctrl-C now leaves (exit 0), it cancels nothing.
    if let Ok(mut current) = state.current.lock() {
        *current = None;
    }
}

/// Run one turn (a new prompt) or resume the interrupted one (`prompt` None).
fn drive(
    session: &mut Session<JsonlStore>,
    runner: &mut Runner,
    renderer: &mut Renderer,
    prompt: Option<&str>,
) -> Result<Option<TurnOutcome>> {
    let cancel = CancelToken::new();
    arm(&cancel);
    renderer.begin();
    let result = {
        let step = prompt.map_or(Step::Resume, Step::Prompt);
        runner.run(session, step, &mut |event| renderer.event(event), &cancel)
    };
    disarm();
    let id = session.store().header().id.clone();
    renderer.set_window(runner.provider.context_window());
    renderer.set_session(runner.usage(session.store()));
    renderer.finish(&id);
    if let Some(e) = renderer.write_error.take() {
        return Err(e.into());
    }
    result.with_context(|| format!("session {id}"))
}

/// The exit code for a finished turn, with a hint on stderr.
fn outcome_code(outcome: &TurnOutcome, renderer: &mut Renderer, session_id: &str) -> u8 {
    let code = match outcome.stop {
        TurnStop::Answered if renderer.totals.denied > 0 => exit::DENIED,
        TurnStop::Answered => exit::SUCCESS,
        TurnStop::Cancelled => {
            renderer.notice(&format!("the turn is saved; continue it with `cairn resume {session_id}`"));
            exit::CANCELLED
        }
        TurnStop::StepLimit => {
            renderer.notice(&format!(
                "the turn reached its step limit; raise [limits] max_steps or continue with `cairn resume {session_id} --prompt …`"
            ));
            exit::ERROR
        }
        TurnStop::Stopped => {
            renderer.notice(&format!(
                "a pre_tool hook stopped the turn: {}",
                crate::render::escape_controls(&outcome.text)
            ));
            exit::DENIED
        }
    };
    renderer.json_line(&json!({"type": "turnEnd", "stop": outcome.stop, "exitCode": code, "sessionId": session_id}));
    code
}

pub fn mode(ctx: &Invocation) -> Mode {
    if ctx.flags.json {
        Mode::Json
    } else if ctx.flags.quiet {
        Mode::Quiet
    } else {
        Mode::Human
    }
}

fn announce(renderer: &mut Renderer, store: &JsonlStore) {
    let header = store.header();
    renderer.json_line(&json!({"type": "session", "id": header.id, "path": store.path(), "cwd": header.cwd}));
}

/// Read the prompt of `cairn run`.
/// The prompt from the argument, or from `--prompt-file` (`-`: stdin);
/// empty refused.
pub(crate) fn read_prompt(prompt: Option<String>, file: Option<&Path>) -> Result<String> {
    let text = match (prompt, file) {
        (Some(p), _) => p,
        (None, Some(path)) if path == Path::new("-") => {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text).context("cannot read the prompt from stdin")?;
            text
        }
        (None, Some(path)) => {
            std::fs::read_to_string(path).with_context(|| format!("cannot read the prompt file {}", path.display()))?
        }
        (None, None) => {
            bail!("no prompt: give one (`cairn run \"…\"`), or --prompt-file FILE, or --prompt-file - for stdin")
        }
    };
    if text.trim().is_empty() {
        bail!("the prompt is empty");
    }
    Ok(text)
}

/// `cairn run`.
pub fn run(ctx: &Invocation, prompt: Option<String>, prompt_file: Option<&Path>) -> Result<u8> {
    let prompt = read_prompt(prompt, prompt_file)?;
    let mut renderer = Renderer::new(mode(ctx));
    renderer.set_markdown(ctx.flags.plain);
    let (mut store, cwd) = create_session(ctx)?;
    let started = Runner::new(ctx, &cwd, true)
        .and_then(|mut runner| Ok((runner.equip(ctx, &cwd, &mut store, Some(&prompt), &mut renderer)?, runner)));
    let (config, mut runner) = match started {
        Ok(started) => started,
        Err(e) => return Err(discard_unstarted(store, e)),
    };
    announce(&mut renderer, &store);
    let id = store.header().id.clone();
    let mut session = Session::open(store, config)?;
    let outcome = drive(&mut session, &mut runner, &mut renderer, Some(&prompt))?;
    Ok(outcome.map_or(exit::SUCCESS, |o| outcome_code(&o, &mut renderer, &id)))
}

/// `cairn resume`.
pub fn resume(ctx: &Invocation, path: &Path, prompt: Option<String>) -> Result<u8> {
    let mut renderer = Renderer::new(mode(ctx));
    renderer.set_markdown(ctx.flags.plain);
    let store = open_session(ctx, path)?;
    if let Some(child) = crate::family::child_fact(&store) {
        // A child's authority is a subset of its parent's, recorded in its
        // file; flags given here could exceed it. Its parent drives it.
        anyhow::bail!(
            "session {} is a child of session {} (spawned by {}); resume the parent with `cairn resume {}`, which re-attaches its unfinished children",
            store.header().id,
            child.parent,
            child.invocation,
            child.parent
        );
    }
    let cwd = PathBuf::from(&store.header().cwd);
    // An interrupted turn is offered what discovery recorded for it; a new
    // prompt gets a new choice (see `crate::discover`).
    let mut opened = Session::open(store, session_config(ctx))?;
    cairn_runtime::parts::give_back_free_memory();
    // An undo killed after its plan was committed is finished first: no
    // turn runs on a half-reverted tree.
    if let Some(done) = crate::undo::finish_interrupted(ctx, &mut opened, &cwd)? {
        renderer.notice(&done);
    }
    let interrupted = opened.needs_resume();
    let mut runner = Runner::new(ctx, &cwd, true)?;
    runner.continue_provider(ctx, opened.store(), &mut renderer);
    // The interrupted turn is offered what discovery recorded for it; a new
    // prompt (when nothing is interrupted) gets a new choice.
    let first = if interrupted { None } else { prompt.as_deref() };
    let mut session = runner.reequip(ctx, opened, first, &mut renderer)?;
    announce(&mut renderer, session.store());
    let id = session.store().header().id.clone();
    let mut code = exit::SUCCESS;
    crate::subagents::reattach_children(&id, &runner.inheritance);
    if interrupted {
        renderer.notice(&format!("resuming the interrupted turn of session {id}"));
        if let Some(outcome) = drive(&mut session, &mut runner, &mut renderer, None)? {
            code = outcome_code(&outcome, &mut renderer, &id);
            if outcome.stop != TurnStop::Answered {
                return Ok(code);
            }
        }
    }
    match prompt {
        Some(text) => {
            if interrupted {
                // The new prompt gets its own choice of tools.
                session = runner.reequip(ctx, session, Some(&text), &mut renderer)?;
            }
            let outcome = drive(&mut session, &mut runner, &mut renderer, Some(&text))?;
            Ok(outcome.map_or(code, |o| outcome_code(&o, &mut renderer, &id)))
        }
        None if !interrupted && std::io::stdin().is_terminal() => chat_loop(ctx, session, &mut runner, &mut renderer),
        None => {
            if !interrupted {
                renderer.notice(&format!(
                    "nothing to resume in session {id}; start a new turn with `cairn resume {id} --prompt \"…\"`"
                ));
            }
            Ok(code)
        }
    }
}

/// `cairn chat`.
pub fn chat(ctx: &Invocation, existing: Option<&Path>) -> Result<u8> {
    let mut renderer = Renderer::new(mode(ctx));
    renderer.set_markdown(ctx.flags.plain);
    let (store, cwd) = match existing {
        Some(path) => {
            let store = open_session(ctx, path)?;
            let cwd = PathBuf::from(&store.header().cwd);
            (store, cwd)
        }
        None => {
            let (store, cwd) = create_session(ctx)?;
            match Runner::new(ctx, &cwd, true) {
                Ok(runner) => return chat_in(ctx, store, cwd, runner, renderer),
                Err(e) => return Err(discard_unstarted(store, e)),
            }
        }
    };
    let runner = Runner::new(ctx, &cwd, true)?;
    chat_in(ctx, store, cwd, runner, renderer)
}

/// A new session whose start failed before anything was recorded in it
/// (the provider cannot be built, the tools cannot be equipped) is removed
/// with its lock, so `cairn sessions` lists no empty "new" session for
/// every failed start (issue 49.9); the error is returned as it was.
fn discard_unstarted(store: JsonlStore, error: anyhow::Error) -> anyhow::Error {
    let path = store.path().to_path_buf();
    drop(store);
    let _ = std::fs::remove_file(&path);
    let mut lock = path.into_os_string();
    lock.push(".lock");
    let _ = std::fs::remove_file(lock);
    error
}

/// [`chat`] once its session and runner are ready.
fn chat_in(
    ctx: &Invocation,
    store: JsonlStore,
    cwd: PathBuf,
    mut runner: Runner,
    mut renderer: Renderer,
) -> Result<u8> {
    runner.continue_provider(ctx, &store, &mut renderer);
    announce(&mut renderer, &store);
    let id = store.header().id.clone();
    let mut session = Session::open(store, session_config(ctx))?;
    cairn_runtime::parts::give_back_free_memory();
    renderer.notice(&format!(
        "session {id} in {} — Ctrl-C interrupts a turn, Ctrl-D leaves, /undo reverts the last turn's files",
        cwd.display()
    ));
    if let Some(done) = crate::undo::finish_interrupted(ctx, &mut session, &cwd)? {
        renderer.notice(&done);
    }
    // The interrupted turn (if any) is offered what discovery recorded for
    // it; each prompt gets its own choice (`chat_loop`).
    session = runner.reequip(ctx, session, None, &mut renderer)?;
    if session.needs_resume() {
        renderer.notice("finishing the interrupted turn first");
        if let Some(outcome) = drive(&mut session, &mut runner, &mut renderer, None)? {
            outcome_code(&outcome, &mut renderer, &id);
        }
    }
    chat_loop(ctx, session, &mut runner, &mut renderer)
}

/// What the chat does after a command.
enum Flow {
    /// Read the next line.
    Next,
    /// Leave.
    Quit,
    /// Go on in this session.
    Switch(Box<Session<JsonlStore>>),
}

/// Print a command's answer on stdout, escaped (it may hold file names and
/// tool names from anywhere).
fn say(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", crate::render::escape_controls(text.trim_end()))?;
    out.flush()?;
    Ok(())
}

/// Run one of the chat's slash commands (`crate::slash`).
fn command_of_chat(
    ctx: &Invocation,
    command: &crate::slash::Slash,
    session: &mut Session<JsonlStore>,
    runner: &mut Runner,
    renderer: &mut Renderer,
) -> Result<Flow> {
    use crate::slash::Slash;
    let store = session.store();
    match command {
        Slash::Help => say(&crate::slash::help())?,
        Slash::Quit => return Ok(Flow::Quit),
        Slash::Status => {
            let usage = runner.usage(store);
            say(&crate::status::Report {
                session: &store.header().id,
                lane: session.lane(),
                provider: runner.provider.name(),
                model: runner.provider.model(),
                window: runner.provider.context_window(),
                usage: &usage,
                tools: runner.tools().specs().len(),
            }
            .text())?;
        }
        Slash::Tools => {
            let lines: Vec<String> =
                runner.tools().specs().iter().map(|s| format!("{:<40} {:?}", s.name, s.risk)).collect();
            say(&lines.join("\n"))?;
        }
        Slash::Sessions => {
            crate::state::sessions(ctx)?;
        }
        Slash::Diff => {
            let mut changed = std::collections::BTreeSet::new();
            for entry in store.entries().iter().filter(|e| e.entry_type == "toolCompleted") {
                let payload: serde_json::Value = serde_json::from_str(entry.payload.get()).unwrap_or_default();
                for path in payload["receipt"]["affectedEntities"].as_array().into_iter().flatten() {
                    if let Some(path) = path.as_str() {
                        changed.insert(path.to_owned());
                    }
                }
            }
            if changed.is_empty() {
                say("no file was changed by this session's tool calls")?;
            } else {
                say(&changed.into_iter().collect::<Vec<_>>().join("\n"))?;
            }
        }
        Slash::Last => {
            let last = store
                .entries()
                .into_iter()
                .rev()
                .find(|e| matches!(e.entry_type.as_str(), "toolCompleted" | "toolFailed" | "toolRejected"));
            match last {
                None => say("no tool call yet in this session")?,
                Some(entry) => {
                    let payload: serde_json::Value = serde_json::from_str(entry.payload.get()).unwrap_or_default();
                    let text = payload["fullOutput"]
                        .as_str()
                        .or_else(|| payload["receipt"]["outputSummary"].as_str())
                        .or_else(|| payload["reason"].as_str())
                        .unwrap_or_default();
                    let tool = payload["tool"].as_str().unwrap_or("?");
                    say(&format!("{tool} ({}):\n{text}", entry.entry_type))?;
                }
            }
        }
        Slash::Allow(rule) => match session.allow(rule, "user:chat") {
            Ok(rule) => {
                say(&format!("allowed for this session: {} (Write calls only; never Destructive)", rule.text()))?
            }
            Err(e) => renderer.notice(&format!("not allowed: {e}")),
        },
        Slash::Compact => {
            let cancel = CancelToken::new();
            match runner.compact(session, &mut |event| renderer.event(event), &cancel) {
                Ok(Some(entry)) => say(&format!("compacted: summary entry {entry}"))?,
                Ok(None) => say("nothing to compact: no messages before the last prompt")?,
                Err(e) => renderer.notice(&format!("cannot compact: {e}")),
            }
        }
        Slash::Fork(name) => {
            let made = match session.head().map(str::to_owned) {
                None => Err("there is nothing to fork yet: send a prompt first".to_owned()),
                Some(head) => {
                    session.fork(name, &head).and_then(|()| session.switch_lane(name)).map_err(|e| e.to_string())
                }
            };
            match made {
                Ok(()) => say(&format!("now on lane {name} (forked from the last entry; /status shows it)"))?,
                Err(e) => renderer.notice(&format!("cannot fork: {e}")),
            }
        }
        Slash::Clear => {
            // The session being left ends here for its hooks (reason clear).
            cairn_tools::hooks::end_session(&store.header().id, "clear", &|note| {
                eprintln!("cairn: {}", crate::render::escape_controls(note))
            });
            let (store, _) = create_session(ctx)?;
            renderer.notice(&format!("new session {}", store.header().id));
            return Ok(Flow::Switch(Box::new(Session::open(store, session_config(ctx))?)));
        }
        Slash::Model(None) => say(&format!("{} · {}", runner.provider.name(), runner.provider.model()))?,
        Slash::Model(Some(name)) => {
            let cwd = PathBuf::from(&store.header().cwd);
            let s = &ctx.settings;
            match crate::parts::provider_for(ctx, &s.provider.value, Some(name), s.script.value.as_deref(), &cwd) {
                Ok(provider) => {
                    runner.provider = provider;
                    // The provider it was built from; `name` is the model.
                    runner.provider_name = s.provider.value.clone();
                    runner.provider_chosen = true;
                    say(&format!("the next turns use {} · {}", runner.provider.name(), runner.provider.model()))?;
                }
                Err(e) => renderer.notice(&format!("cannot use model {name}: {e:#}")),
            }
        }
        Slash::Provider(None) => {
            let configured: Vec<&str> = ctx.settings.providers.keys().map(String::as_str).collect();
            let configured = if configured.is_empty() { "none".to_owned() } else { configured.join(", ") };
            say(&format!(
                "provider {} · model {}\nconfigured ([providers.NAME] in {}): {configured}\nbuilt in: {}\n/provider NAME switches for the next turns",
                runner.provider.name(),
                runner.provider.model(),
                ctx.settings.config_file.display(),
                cairn_provider::config::BUILTIN_NAMES.join(", ")
            ))?;
        }
        Slash::Provider(Some(name)) => {
            let cwd = PathBuf::from(&store.header().cwd);
            let s = &ctx.settings;
            match crate::parts::provider_for(ctx, name, None, s.script.value.as_deref(), &cwd) {
                Ok(provider) => {
                    runner.provider = provider;
                    runner.provider_name = name.clone();
                    runner.provider_chosen = true;
                    say(&format!("the next turns use {} · {}", runner.provider.name(), runner.provider.model()))?;
                }
                Err(e) => renderer.notice(&format!("cannot use provider {name}: {e:#}")),
            }
        }
        Slash::Resume(target) => {
            let path = match crate::sessions::resolve(ctx, target) {
                Ok(path) => path,
                Err(e) => {
                    renderer.notice(&format!("cannot resume: {e:#}"));
                    return Ok(Flow::Next);
                }
            };
            if path == store.path() {
                say(&format!("already in session {}", store.header().id))?;
                return Ok(Flow::Next);
            }
            let opened = match crate::parts::open_session(ctx, &path) {
                Ok(opened) => opened,
                Err(e) => {
                    renderer.notice(&format!("cannot resume {target}: {e:#}"));
                    return Ok(Flow::Next);
                }
            };
            if let Some(child) = crate::family::child_fact(&opened) {
                renderer.notice(&format!(
                    "session {} is a child of session {}; /resume {} (its parent) drives it",
                    opened.header().id,
                    child.parent,
                    child.parent
                ));
                return Ok(Flow::Next);
            }
            let cwd = PathBuf::from(&opened.header().cwd);
            if cwd != Path::new(&store.header().cwd) {
                // Its tools work in its own directory.
                *runner = Runner::new(ctx, &cwd, true)?;
            }
            runner.continue_provider(ctx, &opened, renderer);
            let mut next = Session::open(opened, session_config(ctx))?;
            let id = next.store().header().id.clone();
            let turns = next.store().entries().iter().filter(|e| e.entry_type == "message").count();
            renderer.notice(&format!("now in session {id} ({turns} messages) in {}", cwd.display()));
            if let Some(done) = crate::undo::finish_interrupted(ctx, &mut next, &cwd)? {
                renderer.notice(&done);
            }
            if next.needs_resume() {
                renderer.notice("finishing its interrupted turn first");
                next = runner.reequip(ctx, next, None, renderer)?;
                if let Some(outcome) = drive(&mut next, runner, renderer, None)? {
                    outcome_code(&outcome, renderer, &id);
                }
            }
            return Ok(Flow::Switch(Box::new(next)));
        }
        Slash::Undo(turn) => {
            let cwd = PathBuf::from(&store.header().cwd);
            let target = turn.map_or(crate::undo::Target::LastTurn, crate::undo::Target::Turn);
            match crate::undo::undo_session(ctx, session, &cwd, target, false, false) {
                Ok(outcome) => drop(crate::state::report(outcome)?),
                Err(e) => renderer.notice(&format!("{e:#}")),
            }
        }
        Slash::Redo => {
            let cwd = PathBuf::from(&store.header().cwd);
            match crate::undo::redo_session(ctx, session, &cwd, false, false) {
                Ok(outcome) => drop(crate::state::report(outcome)?),
                Err(e) => renderer.notice(&format!("{e:#}")),
            }
        }
        Slash::Unknown(text) => renderer.notice(&crate::slash::unknown(text)),
    }
    Ok(Flow::Next)
}

fn chat_loop(
    ctx: &Invocation,
    mut session: Session<JsonlStore>,
    runner: &mut Runner,
    renderer: &mut Renderer,
) -> Result<u8> {
    let mut cwd = PathBuf::from(&session.store().header().cwd);
    // Install the Ctrl-C handler before the first turn: its default (kill)
    // would cut a write short.
    let _ = interrupts();
    let mut id = session.store().header().id.clone();
    let interactive = std::io::stdin().is_terminal();
    let mut input = crate::lineedit::Input::new(&ctx.paths.data, &cwd, interactive && !ctx.flags.json)?;
    let prompt_text = ("› ", ctx.err_style.bold("›") + " ");
    let mut last = exit::SUCCESS;
    // Keys typed while a turn ran (`typeahead.rs`): lines to send, and the
    // start of the next one.
    let typing_ahead = interactive && !ctx.flags.json && crate::typeahead::available();
    let mut queued: std::collections::VecDeque<String> = std::collections::VecDeque::new();
    let mut started = (String::new(), String::new());
    let mut leave = false;
    loop {
        let read = match queued.pop_front() {
            Some(line) => {
                // Shown as if typed at the prompt.
                let _ = writeln!(std::io::stdout(), "{}{}", prompt_text.1, crate::render::escape_controls(&line));
                crate::lineedit::Read::Line(line)
            }
            // Ctrl-D typed during the turn, once the queued lines ran.
            None if leave => crate::lineedit::Read::Eof,
            None => {
                let (left, right) = std::mem::take(&mut started);
                input.read_with(&prompt_text, (&left, &right))?
            }
        };
        let line = match read {
            crate::lineedit::Read::Line(line) => line,
            // Ctrl-C at an idle prompt clears the line; a second one
            // within the leave window leaves (as after interrupting a
            // turn, see `interrupts`). Ctrl-D leaves at once.
            crate::lineedit::Read::Interrupted if !pressed_again() => {
                renderer.notice("press Ctrl-C again to leave (or Ctrl-D)");
                continue;
            }
            crate::lineedit::Read::Interrupted | crate::lineedit::Read::Eof => {
                if interactive {
                    let _ = writeln!(std::io::stderr());
                }
                return Ok(last);
            }
        };
        let prompt = match crate::slash::parse(&line) {
            crate::slash::Line::Empty => continue,
            crate::slash::Line::Command(command) => {
                match command_of_chat(ctx, &command, &mut session, runner, renderer)? {
                    Flow::Next => continue,
                    Flow::Quit => return Ok(last),
                    Flow::Switch(next) => {
                        session = *next;
                        id = session.store().header().id.clone();
                        cwd = PathBuf::from(&session.store().header().cwd);
                        continue;
                    }
                }
            }
            crate::slash::Line::Prompt(prompt) => match crate::slash::attach(&cwd, &prompt) {
                Ok(prompt) => prompt,
                Err(why) => {
                    renderer.notice(&why);
                    continue;
                }
            },
        };
        let text = prompt.as_str();
        // The prompt's tools, read once: ranked (discovery records its
        // choice when it applies here), then offered.
        session = runner.reequip(ctx, session, Some(text), renderer)?;
        if typing_ahead {
            crate::typeahead::start(std::sync::Arc::new(interrupt_by_escape));
        }
        let driven = drive(&mut session, runner, renderer, Some(text));
        if typing_ahead {
            let keys = crate::typeahead::replay(&crate::typeahead::finish());
            queued.extend(keys.lines);
            started = keys.partial;
            leave |= keys.eof;
        }
        match driven {
            Ok(Some(outcome)) => last = outcome_code(&outcome, renderer, &id),
            Ok(None) => {}
            // Refused before anything was recorded: the chat goes on.
            Err(e) if matches!(e.downcast_ref::<TurnError>(), Some(TurnError::PromptTooLarge(_))) => {
                renderer.notice(&format!("{e:#}"));
                last = exit::ERROR;
            }
            Err(e) => return Err(e),
        }
    }
}
