//! The sessions a server drives: creating them (`s/new`), starting and
//! stopping turns (one thread per running turn, at most one turn per
//! session), answering approvals, and the views the tree reads (`idx`,
//! `chat`, `state`, `usage`, `event`, `log`).
//!
//! Owns: the in-memory view of what is running right now (the cancel token,
//! the phase, the pending approvals, the events this server saw). Must not:
//! keep anything a restart would need — the session file is the truth, and
//! a session is written only while its writer lock is held (`JsonlStore`),
//! so `cairn run` and this server exclude each other per session.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result, anyhow, bail};
use cairn_core::approval::{Allowlist, Answer, PolicyApprover, SharedApprover};
use cairn_core::message::{ContentPart, Role};
use cairn_core::report::{FamilyUsage, UsageTotals};
use cairn_core::storage::registers::{self, FACT, NAME_FACT};
use cairn_core::storage::{Header, JsonlStore, Storage, Transaction, new_session_id, read_summary, to_raw};
use cairn_core::turn::Pc;
use cairn_core::{CancelToken, Session, ToolRegistry, TurnEvent, TurnStop};
use cairn_host::{Equipment, Step};

use crate::approver::{ApprovalBoard, PendingApproval, TreeApprover};
use crate::host::{Host, Rewind, Rewound, SPEC_FACT, SessionSpec};
use crate::queue;

/// Wakes blocked readers when anything changes (a bump per event).
#[derive(Debug, Default)]
pub struct Pulse {
    count: Mutex<u64>,
    cv: Condvar,
}

impl Pulse {
    /// Something changed.
    pub fn bump(&self) {
        let mut n = lock(&self.count);
        *n = n.wrapping_add(1);
        self.cv.notify_all();
    }

    /// The current count.
    pub fn now(&self) -> u64 {
        *lock(&self.count)
    }

    /// Wait until the count differs from `seen`, or `timeout` passes
    /// (other processes append to session files without telling us).
    pub fn wait(&self, seen: u64, timeout: Duration) -> u64 {
        let guard = lock(&self.count);
        let (guard, _) = self.cv.wait_timeout_while(guard, timeout, |n| *n == seen).unwrap_or_else(|e| e.into_inner());
        *guard
    }
}

/// Lock a mutex, recovering the data if a holder panicked (the data here
/// is views and handles, valid whatever a panicking thread left).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A session's `approvals/` as the approver of its turns sees it.
#[derive(Debug)]
struct Board {
    live: Arc<Live>,
    runtime: Arc<Runtime>,
}

impl ApprovalBoard for Board {
    fn post(&self, invocation_id: &str, pending: PendingApproval, phase: String) {
        self.live.add_approval(invocation_id, pending, phase);
        self.runtime.pulse.bump();
    }

    fn withdraw(&self, invocation_id: &str) {
        self.live.remove_approval(invocation_id);
        self.runtime.pulse.bump();
    }
}

#[derive(Debug)]
struct Running {
    cancel: CancelToken,
    handle: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Inner {
    turn: Option<Running>,
    /// The phase while a turn runs, or how the last one ended here.
    phase: Option<String>,
    approvals: BTreeMap<String, PendingApproval>,
    /// `event`: the log's history re-told up to `retell.last_seq()`, then
    /// the `--json` lines of the turns this server ran, as they happened.
    events: Vec<u8>,
    /// What of the log `events` already tells.
    retell: cairn_core::history::Retell,
    /// (file length, mtime) when `events` last caught up with the file.
    events_synced: Option<(u64, SystemTime)>,
    /// (file length, mtime, rendered chat).
    chat: Option<(u64, SystemTime, Arc<String>)>,
    /// Why the last prompt (or queued prompt, or resume) could not start,
    /// until a turn starts: the last line of `state`.
    refused: Option<String>,
}

/// One session this server has touched.
#[derive(Debug)]
pub struct Live {
    /// Session id (the file name without `.jsonl`).
    pub id: String,
    /// The session file.
    pub path: PathBuf,
    inner: Mutex<Inner>,
}

impl Live {
    /// Register a pending approval (called by the approver).
    pub(crate) fn add_approval(&self, invocation_id: &str, pending: PendingApproval, phase: String) {
        let mut inner = lock(&self.inner);
        inner.approvals.insert(invocation_id.to_owned(), pending);
        inner.phase = Some(phase);
    }

    /// Forget a pending approval (answered or abandoned).
    pub(crate) fn remove_approval(&self, invocation_id: &str) {
        lock(&self.inner).approvals.remove(invocation_id);
    }
}

impl Live {
    /// Bring `event` up to the file: re-tell what was committed since it
    /// last caught up (the session's history on first use, turns other
    /// processes ran since). Only while no turn of this server runs in the
    /// session: that turn tells its own events live.
    fn sync_events(&self, inner: &mut Inner, options: cairn_core::storage::StoreOptions) -> Result<()> {
        if inner.turn.is_some() {
            return Ok(());
        }
        let meta = std::fs::metadata(&self.path).with_context(|| format!("cannot read {}", self.path.display()))?;
        let key = (meta.len(), meta.modified().unwrap_or(SystemTime::UNIX_EPOCH));
        if inner.events_synced == Some(key) {
            return Ok(());
        }
        let store = JsonlStore::open_read_only_with(&self.path, options)?;
        let lane = store.index().state().and_then(|s| Pc::decode(&s.pc).ok()).map(|pc| pc.lane).unwrap_or_default();
        let lane = if lane.is_empty() { "main".to_owned() } else { lane };
        // Only the entries not told yet are materialised from the index.
        let fresh: Vec<_> = store.index().entries_since(inner.retell.last_seq()).collect();
        for event in inner.retell.records(&fresh, store.index().usage(), &lane) {
            let line = serde_json::to_string(&event)
                .unwrap_or_else(|e| format!("{{\"type\":\"unencodable\",\"error\":{:?}}}", e.to_string()));
            inner.events.extend_from_slice(line.as_bytes());
            inner.events.push(b'\n');
        }
        inner.events_synced = Some(key);
        Ok(())
    }
}

/// One line of `s/idx`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxRow {
    /// Session id.
    pub id: String,
    /// `state` of the session.
    pub state: String,
    /// Working directory.
    pub cwd: String,
    /// Provider ("-" when the session was not created here).
    pub provider: String,
    /// Model ("-" when unknown).
    pub model: String,
    /// Name ("-" when none).
    pub name: String,
    created_at: i64,
}

/// What a turn thread is started for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Start {
    /// A prompt written to `prompt` (after finishing an interrupted turn).
    Prompt(String),
    /// `ctl resume`: the interrupted or cancelled turn.
    Resume,
    /// The next queued prompt (`enqueue`).
    Queue,
}

/// The sessions of one `$CAIRN_HOME` as a server drives them.
pub struct Runtime {
    host: Arc<dyn Host>,
    lives: Mutex<HashMap<String, Arc<Live>>>,
    /// Bumped on every change a reader may wait for.
    pub pulse: Pulse,
    stopping: AtomicBool,
    /// The batch queue (`b/`), or why it could not be opened.
    batch: std::result::Result<Arc<crate::batch::Batch>, String>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("sessions", &self.host.sessions_dir()).finish_non_exhaustive()
    }
}

/// The keys `s/new` accepts, in its template's order.
pub const NEW_KEYS: [&str; 7] = ["cwd", "provider", "model", "name", "script", "allow", "yes"];

/// What reading `s/new` returns.
pub fn new_template() -> String {
    NEW_KEYS.iter().map(|k| format!("{k}=")).collect::<Vec<_>>().join(" ") + "\n"
}

/// A session id as the tree accepts it: what `new_session_id` makes, or
/// any file stem without path syntax.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'+'))
}

impl Runtime {
    /// A runtime over `host`'s sessions.
    pub fn new(host: Arc<dyn Host>) -> Arc<Self> {
        // The queue continues its unfinished jobs as soon as it opens.
        let batch = crate::batch::Batch::open(Arc::clone(&host), host.batch_dir(), host.batch_max_running())
            .map_err(|e| format!("the batch queue is unavailable: {e:#}"));
        Arc::new(Self {
            host,
            lives: Mutex::new(HashMap::new()),
            pulse: Pulse::default(),
            stopping: AtomicBool::new(false),
            batch,
        })
    }

    /// The batch queue.
    pub fn batch(&self) -> Result<&Arc<crate::batch::Batch>> {
        self.batch.as_ref().map_err(|e| anyhow!("{e}"))
    }

    /// The host.
    pub fn host(&self) -> &dyn Host {
        &*self.host
    }

    fn session_path(&self, id: &str) -> PathBuf {
        self.host.sessions_dir().join(format!("{id}.jsonl"))
    }

    /// The session `id`, if its file exists.
    pub fn live(&self, id: &str) -> Option<Arc<Live>> {
        if !valid_id(id) {
            return None;
        }
        let mut lives = lock(&self.lives);
        if let Some(live) = lives.get(id) {
            return Some(Arc::clone(live));
        }
        let path = self.session_path(id);
        if !path.is_file() {
            return None;
        }
        let live = Arc::new(Live { id: id.to_owned(), path, inner: Mutex::new(Inner::default()) });
        lives.insert(id.to_owned(), Arc::clone(&live));
        Some(live)
    }

    fn require(&self, id: &str) -> Result<Arc<Live>> {
        self.live(id).ok_or_else(|| anyhow!("no session {id:?}"))
    }

    /// Every session, oldest first.
    pub fn idx(&self) -> Vec<IdxRow> {
        let dir = self.host.sessions_dir();
        let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
        let max_line = self.host.store_options().max_line_bytes;
        let mut rows = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "jsonl") {
                continue;
            }
            let Some(id) = path.file_stem().map(|s| s.to_string_lossy().into_owned()) else { continue };
            if !valid_id(&id) {
                continue;
            }
            let Ok(summary) = read_summary(&path, &[(FACT, NAME_FACT), (FACT, SPEC_FACT)], max_line) else {
                continue;
            };
            let name = summary.registers.first().cloned().flatten().and_then(|r| r.parse::<String>().ok());
            let spec = summary.registers.get(1).cloned().flatten().and_then(|r| r.parse::<SessionSpec>().ok());
            let stored_in_progress =
                summary.state.as_ref().and_then(|s| Pc::decode(&s.pc).ok()).is_some_and(|pc| pc.in_progress());
            let state = self.live_phase(&id).unwrap_or_else(|| stored_state(&path, stored_in_progress));
            let dash = |s: Option<String>| s.filter(|s| !s.is_empty()).unwrap_or_else(|| "-".to_owned());
            rows.push(IdxRow {
                id,
                state,
                cwd: summary.header.cwd.clone(),
                provider: dash(spec.as_ref().map(|s| s.provider.clone())),
                model: dash(spec.as_ref().map(|s| s.model.clone())),
                name: dash(name),
                created_at: summary.header.created_at,
            });
        }
        rows.sort_by(|a, b| a.created_at.cmp(&b.created_at).then_with(|| a.id.cmp(&b.id)));
        rows
    }

    fn live_phase(&self, id: &str) -> Option<String> {
        let lives = lock(&self.lives);
        let live = lives.get(id)?;
        lock(&live.inner).phase.clone()
    }

    /// Create a session from `s/new` text (`key=value` pairs separated by
    /// blanks or newlines); returns its id.
    pub fn create(&self, text: &str) -> Result<String> {
        let mut spec = SessionSpec::default();
        let mut cwd: Option<String> = None;
        let mut name: Option<String> = None;
        let mut any = false;
        for pair in text.split_whitespace() {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| anyhow!("{pair:?} is not key=value; the keys are {}", NEW_KEYS.join(", ")))?;
            any = true;
            match key {
                "cwd" => cwd = Some(value.to_owned()),
                "provider" => spec.provider = value.to_owned(),
                "model" => spec.model = value.to_owned(),
                "name" => name = Some(value.to_owned()).filter(|v| !v.is_empty()),
                "script" => spec.script = value.to_owned(),
                "allow" => spec.allow.extend(value.split(',').filter(|v| !v.is_empty()).map(str::to_owned)),
                "yes" => spec.yes = crate::host::parse_yes(value)?,
                other => bail!("unknown key {other:?}; the keys are {}", NEW_KEYS.join(", ")),
            }
        }
        if !any {
            bail!("nothing to create: write key=value pairs, at least cwd=DIR (read s/new for the keys)");
        }
        let cwd = cwd
            .filter(|c| !c.is_empty())
            .ok_or_else(|| anyhow!("cwd= is missing: give the session's working directory"))?;
        let dir = Path::new(&cwd);
        if !dir.is_absolute() {
            bail!("cwd={cwd:?} is not an absolute path");
        }
        let dir = dir.canonicalize().with_context(|| format!("cwd={cwd:?}: no such directory"))?;
        if !dir.is_dir() {
            bail!("cwd={cwd:?} is not a directory");
        }
        if spec.provider.is_empty() {
            // `script=` alone names the scripted provider (issue 49.9).
            spec.provider = if spec.script.is_empty() { self.host.providers().current } else { "scripted".to_owned() };
        }
        self.host.check_provider(&spec.provider)?;
        if !spec.script.is_empty() && !Path::new(&spec.script).is_file() {
            bail!("script={:?}: no such file", spec.script);
        }
        Allowlist::parse(spec.allow.iter().map(String::as_str)).context("allow= has an invalid pattern")?;
        let header = Header::new(new_session_id(), dir.display().to_string());
        let id = header.id.clone();
        let mut store = JsonlStore::create(&self.host.sessions_dir(), header, self.host.store_options())
            .with_context(|| format!("cannot create a session in {}", self.host.sessions_dir().display()))?;
        let mut tx = Transaction::new().set(FACT, SPEC_FACT, to_raw(&spec)?);
        if let Some(name) = &name {
            tx = tx.set_session_name(name)?;
        }
        store.commit(tx)?;
        self.pulse.bump();
        Ok(id)
    }

    /// Start a turn with `prompt` (after finishing an interrupted one), or
    /// resume the interrupted turn (`prompt` None). Returns once the turn
    /// runs; fails with "busy" while another turn (here or in another
    /// process) holds the session.
    pub fn start(self: &Arc<Self>, id: &str, prompt: Option<String>) -> Result<()> {
        self.start_with(id, prompt.map_or(Start::Resume, Start::Prompt))
    }

    fn start_with(self: &Arc<Self>, id: &str, start: Start) -> Result<()> {
        let live = self.require(id)?;
        let told = matches!(start, Start::Prompt(_) | Start::Queue);
        let started = self.start_live(&live, start);
        if let Err(e) = &started
            && told
        {
            self.refuse(&mut lock(&live.inner), &format!("{e:#}"));
        }
        started
    }

    fn start_live(self: &Arc<Self>, live: &Arc<Live>, start: Start) -> Result<()> {
        let id = live.id.as_str();
        let mut inner = lock(&live.inner);
        if inner.turn.is_some() {
            bail!(
                "busy: a turn is running in session {id}; write the prompt to enqueue to run it next, or stop to ctl"
            );
        }
        if self.stopping.load(Ordering::SeqCst) {
            bail!("the server is shutting down");
        }
        // `event` tells the history before this turn's live events.
        live.sync_events(&mut inner, self.host.store_options())?;
        let cancel = CancelToken::new();
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<Result<(), String>>(1);
        let runtime = Arc::clone(self);
        let thread_live = Arc::clone(live);
        let thread_cancel = cancel.clone();
        let handle = std::thread::Builder::new()
            .name(format!("turn-{id}"))
            .spawn(move || runtime.turn_thread(&thread_live, start, &thread_cancel, ready_tx))
            .context("cannot start a turn thread")?;
        match ready_rx.recv() {
            Ok(Ok(())) => {
                inner.refused = None;
                inner.turn = Some(Running { cancel, handle: Some(handle) });
                inner.phase = Some("thinking".to_owned());
                drop(inner);
                self.pulse.bump();
                Ok(())
            }
            Ok(Err(e)) => {
                let _ = handle.join();
                Err(anyhow!(e))
            }
            Err(_) => {
                let _ = handle.join();
                Err(anyhow!("the turn thread stopped before starting"))
            }
        }
    }

    /// A prompt's start was refused: said where a writer and a reader of
    /// the session see it (a prompt's clunk has no one else to tell), as
    /// the last line of `state` and an `event` line.
    fn refuse(&self, inner: &mut Inner, why: &str) {
        let why = one_line(why);
        let line = serde_json::json!({"type": "startRefused", "error": why}).to_string();
        inner.events.extend_from_slice(line.as_bytes());
        inner.events.push(b'\n');
        inner.refused = Some(why);
        self.pulse.bump();
    }

    /// Whether a prompt could start in `id` now; the reason if not (the
    /// write of `prompt` fails with it rather than its clunk).
    pub fn check_start(&self, id: &str) -> Result<()> {
        let live = self.require(id)?;
        if lock(&live.inner).turn.is_some() {
            bail!(
                "busy: a turn is running in session {id}; write the prompt to enqueue to run it next, or stop to ctl"
            );
        }
        if let Some(pid) = busy_elsewhere(&live.path) {
            bail!("busy: {}; wait for it to finish", elsewhere(pid));
        }
        let store = JsonlStore::open_read_only_with(&live.path, self.host.store_options())?;
        let spec = store.register(FACT, SPEC_FACT).and_then(|r| r.parse::<SessionSpec>().ok()).unwrap_or_default();
        let cwd = PathBuf::from(&store.header().cwd);
        if store.register(FACT, registers::SUBAGENT_FACT).is_some() {
            bail!("session {id} is a child session; its parent drives it");
        }
        self.host.provider(&spec, &cwd).map(|_| ())
    }

    fn turn_thread(
        self: Arc<Self>,
        live: &Arc<Live>,
        start: Start,
        cancel: &CancelToken,
        ready: std::sync::mpsc::SyncSender<Result<(), String>>,
    ) {
        // Everything that can refuse the start happens before `ready`, so
        // the write that asked for it fails with the reason.
        let prepared = (|| -> Result<_> {
            let store = JsonlStore::open(&live.path, self.host.store_options())?;
            let spec = store.register(FACT, SPEC_FACT).and_then(|r| r.parse::<SessionSpec>().ok()).unwrap_or_default();
            let cwd = PathBuf::from(&store.header().cwd);
            let provider = self.host.provider(&spec, &cwd)?;
            let allow = Allowlist::parse(spec.allow.iter().map(String::as_str))?;
            if store.register(FACT, registers::SUBAGENT_FACT).is_some() {
                // Its authority is a subset of its parent's; the parent
                // drives it (and re-attaches it on resume).
                bail!("session {} is a child session; its parent drives it", live.id);
            }
            let mut session = Session::open(store, self.host.session_config())?;
            if let Some(done) = self.host.finish_undo(&mut session, &cwd)? {
                eprintln!("cairn serve: session {}: {}", live.id, done.escape_debug());
            }
            if start == Start::Resume && !session.needs_resume() {
                bail!("nothing to resume in session {}: the last turn finished", live.id);
            }
            if start == Start::Queue && session.needs_resume() {
                bail!(
                    "session {} has an unfinished turn; its queued prompts wait until you write resume to ctl",
                    live.id
                );
            }
            // The first turn's tools: the interrupted turn's, else the
            // new prompt's (the host may choose them by the prompt).
            let first = if session.needs_resume() {
                None
            } else {
                match &start {
                    Start::Prompt(text) => Some(text.clone()),
                    Start::Queue => self.next_queued(live, session.store()),
                    Start::Resume => None,
                }
            };
            let board = Board { live: Arc::clone(live), runtime: Arc::clone(&self) };
            // The person behind `approvals/`, shared with the children the
            // session spawns (their questions appear in this session's
            // `approvals/`).
            let person =
                SharedApprover::new(Box::new(TreeApprover::new(Arc::new(board), cancel.clone(), live.id.clone())));
            let approver = PolicyApprover::new(allow, Some(Box::new(person.clone())));
            let approver = if spec.yes { approver.approve_writes("9p:yes=1") } else { approver };
            let mut equipment = Equipment { tools: ToolRegistry::new(&approver), approver };
            let session = self.for_turn(&mut equipment, session, &cwd, first.as_deref(), &person)?;
            Ok((cwd, provider, equipment, person, session))
        })();
        let (cwd, provider, mut equipment, person, session) = match prepared {
            Ok(parts) => parts,
            Err(e) => {
                let _ = ready.send(Err(format!("{e:#}")));
                return;
            }
        };
        // The caller records the turn as running before it reads `ready`'s
        // answer; wait for that so the end below cannot race it.
        let _ = ready.send(Ok(()));
        let observer_live = Arc::clone(live);
        let observer_rt = Arc::clone(&self);
        let mut observer = move |event: &TurnEvent| observer_rt.observe(&observer_live, event);
        let end = |stop: Result<Option<TurnStop>, String>| -> bool {
            let (phase, json) = match &stop {
                Ok(Some(TurnStop::Cancelled)) => {
                    ("cancelled", serde_json::json!({"type": "turnEnd", "stop": "cancelled"}))
                }
                Ok(Some(s)) => ("idle", serde_json::json!({"type": "turnEnd", "stop": s})),
                Ok(None) => ("idle", serde_json::json!({"type": "turnEnd", "stop": null})),
                Err(e) => ("interrupted", serde_json::json!({"type": "error", "message": e})),
            };
            self.push_event(live, &json.to_string(), Some(phase));
            matches!(stop, Ok(Some(TurnStop::Answered)) | Ok(None))
        };
        // Every turn of this thread (resumed, prompted, queued) runs with the
        // same provider, approver, observer and cancel token; `equipment`
        // holds the tools of the next turn.
        let mut run = |equipment: &mut Equipment, session: &mut Session<JsonlStore>, step: Step<'_>| {
            equipment.run(session, &*provider, step, &mut observer, cancel).map_err(|e| format!("{e:#}"))
        };
        // The session; None once reopening it for a turn failed (the
        // failure was told).
        let mut current = Some(session);
        let mut go_on = true;
        let mut ran = false;
        if let Some(session) = current.as_mut()
            && session.needs_resume()
        {
            let result = run(&mut equipment, session, Step::Resume).map(|o| o.map(|o| o.stop));
            go_on = end(result);
            ran = true;
            if let (true, Start::Prompt(text)) = (go_on, &start) {
                // The new prompt gets its own choice of tools.
                current = self.next_turn(current, &mut equipment, &cwd, Some(text), &person, &end);
            }
        }
        if let (true, Start::Prompt(text), Some(session)) = (go_on, &start, current.as_mut()) {
            let result = run(&mut equipment, session, Step::Prompt(text)).map(|o| o.map(|o| o.stop));
            go_on = end(result);
            ran = true;
        }
        // Then the queued prompts, one turn each, while turns end well.
        let journal = queue::journal_path(&self.host.sessions_dir(), &live.id);
        let mut first_queued = start == Start::Queue;
        while go_on && !cancel.is_cancelled() && !self.is_stopping() {
            let arrived = {
                let _inner = lock(&live.inner);
                queue::read(&journal).unwrap_or_default()
            };
            if !first_queued {
                // Each queued prompt gets its own choice of tools.
                let Some(session) = current.as_ref() else { break };
                let Some(next) = next_in_queue(session.store(), &arrived) else { break };
                current = self.next_turn(current, &mut equipment, &cwd, Some(&next), &person, &end);
            }
            first_queued = false;
            let Some(session) = current.as_mut() else { break };
            match run(&mut equipment, session, Step::Queued(&arrived)) {
                Ok(None) => break,
                Ok(Some(outcome)) => go_on = end(Ok(Some(outcome.stop))),
                Err(e) => go_on = end(Err(e)),
            }
            ran = true;
            self.forget_queued(live, &journal, registers::prompt_queue(session.store()).through);
        }
        let through = current.as_ref().map_or(0, |s| registers::prompt_queue(s.store()).through);
        // This turn's records were told live: `event` skips them.
        let told_through = current.as_ref().map(|s| s.store().index().last_seq());
        drop(current);
        // The writer lock is released (the store dropped) before the
        // session reads as not running.
        let mut inner = lock(&live.inner);
        if let Some(seq) = told_through {
            inner.retell.skip_through(seq);
        }
        inner.events_synced = None;
        inner.turn = None;
        inner.approvals.clear();
        if !ran {
            // Nothing was queued after all: the file says the state.
            inner.phase = None;
        }
        // A prompt queued after the loop last looked (the queue writer
        // holds this lock and saw a turn running) starts its own turn.
        let waiting = go_on
            && told_through.is_some()
            && !cancel.is_cancelled()
            && queue::read(&journal).unwrap_or_default().iter().any(|q| q.n > through);
        drop(inner);
        self.pulse.bump();
        if waiting {
            let _ = self.start_with(&live.id, Start::Queue);
        }
    }

    /// The prompt the next queued turn of the session in `store` takes.
    /// Called while the turn thread prepares, when the thread that starts
    /// it holds `live.inner` (and waits for `ready`): taking that lock here
    /// would deadlock, and is not needed, since the queue's writer takes
    /// it too and so cannot write meanwhile.
    fn next_queued(&self, live: &Live, store: &JsonlStore) -> Option<String> {
        let journal = queue::journal_path(&self.host.sessions_dir(), &live.id);
        next_in_queue(store, &queue::read(&journal).unwrap_or_default())
    }

    /// Reopen `session` with the host's tools and settings for its next
    /// turn: `prompt`, or (None) resuming its interrupted turn. The host
    /// may record its choice in the session file (the CLI's discovery
    /// does), so a resumed turn is offered the same tools.
    fn for_turn(
        &self,
        equipment: &mut Equipment,
        session: Session<JsonlStore>,
        cwd: &Path,
        prompt: Option<&str>,
        person: &SharedApprover,
    ) -> Result<Session<JsonlStore>> {
        let note = |note: &str| eprintln!("cairn serve: {}", note.escape_debug());
        equipment.reequip(&*self.host, session, cwd, prompt, Some(person), note).map_err(|e| e.error)
    }

    /// [`Runtime::for_turn`] between two turns of one thread; a failure
    /// ends the thread's turns and is told like a failed turn.
    fn next_turn(
        &self,
        current: Option<Session<JsonlStore>>,
        equipment: &mut Equipment,
        cwd: &Path,
        prompt: Option<&str>,
        person: &SharedApprover,
        end: &dyn Fn(Result<Option<TurnStop>, String>) -> bool,
    ) -> Option<Session<JsonlStore>> {
        match self.for_turn(equipment, current?, cwd, prompt, person) {
            Ok(next) => Some(next),
            Err(e) => {
                end(Err(format!("cannot prepare the next turn: {e:#}")));
                None
            }
        }
    }

    fn forget_queued(&self, live: &Live, journal: &Path, through: u64) {
        let _inner = lock(&live.inner);
        if let Err(e) = queue::forget_through(journal, through) {
            // Harmless: the session's queue skips what it already has.
            self.push_event(live, &serde_json::json!({"type": "error", "message": format!("{e:#}")}).to_string(), None);
        }
    }

    /// `enqueue`: keep `prompt` durably for after the running turn (or
    /// start it now when none runs). Returns its number.
    pub fn enqueue(self: &Arc<Self>, id: &str, prompt: String) -> Result<u64> {
        let live = self.require(id)?;
        let inner = lock(&live.inner);
        if self.is_stopping() {
            bail!("the server is shutting down");
        }
        let journal = queue::journal_path(&self.host.sessions_dir(), id);
        let journaled = queue::read(&journal)?;
        let store = JsonlStore::open_read_only_with(&live.path, self.host.store_options())?;
        if store.register(FACT, registers::SUBAGENT_FACT).is_some() {
            bail!("session {id} is a child session; its parent drives it");
        }
        let kept = registers::prompt_queue(&store);
        let n = journaled.iter().map(|q| q.n).chain([kept.through]).max().unwrap_or(0) + 1;
        queue::append(&journal, &registers::QueuedPrompt { n, prompt })?;
        let running = inner.turn.is_some();
        drop(inner);
        self.pulse.bump();
        if !running {
            // Queued durably either way; a session that needs `ctl resume`
            // first (or one another process is driving) keeps it waiting.
            let _ = self.start_with(id, Start::Queue);
        }
        Ok(n)
    }

    /// What reading `enqueue` shows: the prompts waiting, oldest first,
    /// `N: first line`.
    pub fn queued(&self, id: &str) -> Result<String> {
        let live = self.require(id)?;
        let inner = lock(&live.inner);
        let store = JsonlStore::open_read_only_with(&live.path, self.host.store_options())?;
        let mut kept = registers::prompt_queue(&store);
        kept.bring_in(&queue::read(&queue::journal_path(&self.host.sessions_dir(), id))?);
        drop(inner);
        Ok(kept
            .items
            .iter()
            .map(|q| format!("{}: {}\n", q.n, one_line(q.prompt.lines().next().unwrap_or(""))))
            .collect())
    }

    /// Start the queued prompts of every idle session that has some (a
    /// server starting again after a crash or a stop).
    pub fn start_queues(self: &Arc<Self>) {
        let sessions = self.host.sessions_dir();
        let max_line = self.host.store_options().max_line_bytes;
        let mut ids = queue::journaled(&sessions);
        for row in self.idx() {
            let path = self.session_path(&row.id);
            if read_summary(&path, &[(FACT, registers::QUEUE_FACT)], max_line)
                .ok()
                .and_then(|s| s.registers.first().cloned().flatten())
                .and_then(|r| r.parse::<registers::PromptQueue>().ok())
                .is_some_and(|q| !q.items.is_empty())
            {
                ids.push(row.id);
            }
        }
        ids.sort();
        ids.dedup();
        for id in ids {
            if self.state(&id).is_ok_and(|s| s == "idle") {
                let _ = self.start_with(&id, Start::Queue);
            }
        }
    }

    fn observe(&self, live: &Live, event: &TurnEvent) {
        let phase = match event {
            TurnEvent::TurnStarted { .. } | TurnEvent::ProviderRequested { .. } => Some("thinking".to_owned()),
            TurnEvent::ToolRequested { tool, .. } | TurnEvent::ToolStarted { tool, .. } => {
                Some(format!("calling: {tool}"))
            }
            TurnEvent::ApprovalAsked { tool, .. } => Some(format!("awaiting approval: {tool}")),
            TurnEvent::ToolCompleted { .. } | TurnEvent::ToolFailed { .. } | TurnEvent::ToolRejected { .. } => {
                Some("thinking".to_owned())
            }
            _ => None,
        };
        let line = serde_json::to_string(event)
            .unwrap_or_else(|e| format!("{{\"type\":\"unencodable\",\"error\":{:?}}}", e.to_string()));
        self.push_event(live, &line, phase.as_deref());
    }

    fn push_event(&self, live: &Live, line: &str, phase: Option<&str>) {
        let mut inner = lock(&live.inner);
        inner.events.extend_from_slice(line.as_bytes());
        inner.events.push(b'\n');
        if let Some(phase) = phase {
            inner.phase = Some(phase.to_owned());
        }
        drop(inner);
        self.pulse.bump();
    }

    /// `ctl`: one command a line.
    pub fn ctl(self: &Arc<Self>, id: &str, text: &str) -> Result<()> {
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let mut words = line.split_whitespace();
            let cmd = words.next().unwrap_or_default();
            let args: Vec<&str> = words.collect();
            match (cmd, args.as_slice()) {
                ("stop", []) => self.stop(id)?,
                ("resume", []) => self.start(id, None)?,
                ("compact", []) => self.with_store(id, |mut store| Ok(store.compact()?))?,
                ("rn", [name]) => self.with_store(id, |mut store| {
                    store.commit(Transaction::new().set_session_name(name)?)?;
                    Ok(())
                })?,
                ("model", [model]) => self.with_store(id, |mut store| {
                    let mut spec =
                        store.register(FACT, SPEC_FACT).and_then(|r| r.parse::<SessionSpec>().ok()).unwrap_or_default();
                    spec.model = (*model).to_owned();
                    store.commit(Transaction::new().set(FACT, SPEC_FACT, to_raw(&spec)?))?;
                    Ok(())
                })?,
                ("fork", [entry, rest @ ..]) if rest.len() <= 1 => {
                    let config = self.host.session_config();
                    let lane = rest.first().map(|l| (*l).to_owned());
                    self.with_store(id, move |store| {
                        let mut session = Session::open(store, config)?;
                        let lane = lane.unwrap_or_else(|| {
                            let taken: Vec<String> = session.lanes().into_iter().map(|(n, _)| n).collect();
                            (1..).map(|n| format!("fork-{n}")).find(|n| !taken.contains(n)).unwrap_or_default()
                        });
                        session.fork(&lane, entry)?;
                        Ok(())
                    })?
                }
                ("undo", []) => self.rewind(id, Rewind::Undo(None))?,
                ("undo", [n]) => {
                    let n = n
                        .parse::<usize>()
                        .map_err(|_| anyhow!("{line:?}: undo takes a turn number (1 is the first turn), not {n:?}"))?;
                    self.rewind(id, Rewind::Undo(Some(n)))?
                }
                ("redo", []) => self.rewind(id, Rewind::Redo)?,
                ("stop" | "resume" | "compact" | "rn" | "model" | "fork" | "undo" | "redo", _) => {
                    bail!(
                        "{line:?}: wrong arguments; use stop, resume, compact, rn NAME, model NAME, fork ENTRY [LANE], undo [N] or redo"
                    )
                }
                (other, _) => {
                    bail!(
                        "unknown ctl command {other:?}; use stop, resume, compact, rn NAME, model NAME, fork ENTRY [LANE], undo [N] or redo"
                    )
                }
            }
        }
        self.pulse.bump();
        Ok(())
    }

    /// `ctl undo`/`ctl redo`: the host's, on the session's store while no
    /// turn runs.
    fn rewind(&self, id: &str, request: Rewind) -> Result<()> {
        let host = Arc::clone(&self.host);
        self.with_store(id, move |store| {
            let cwd = PathBuf::from(&store.header().cwd);
            let mut session = Session::open(store, host.session_config())?;
            match host.rewind(&mut session, &cwd, request)? {
                Rewound::Done(_) => Ok(()),
                Rewound::Refused(why) => bail!("{}", why.trim_end()),
            }
        })
    }

    /// Run `f` on the session's store while no turn runs (here: checked
    /// under the session's lock; elsewhere: the writer lock refuses).
    fn with_store(&self, id: &str, f: impl FnOnce(JsonlStore) -> Result<()>) -> Result<()> {
        let live = self.require(id)?;
        let inner = lock(&live.inner);
        if inner.turn.is_some() {
            bail!("busy: a turn is running in session {id}; wait for it or write stop to ctl");
        }
        let store = JsonlStore::open(&live.path, self.host.store_options())?;
        let result = f(store);
        drop(inner);
        result
    }

    /// Cancel the running turn of `id` (settled durably by the core).
    pub fn stop(&self, id: &str) -> Result<()> {
        let live = self.require(id)?;
        let inner = lock(&live.inner);
        match &inner.turn {
            Some(running) => {
                running.cancel.cancel();
                Ok(())
            }
            None => bail!("no turn is running in session {id}"),
        }
    }

    /// Move the session file to the archive (refused while a turn runs).
    pub fn archive(&self, id: &str) -> Result<()> {
        let live = self.require(id)?;
        let inner = lock(&live.inner);
        if inner.turn.is_some() {
            bail!("busy: a turn is running in session {id}; stop it first");
        }
        // Holding the writer lock while moving keeps `cairn run` out.
        let store = JsonlStore::open(&live.path, self.host.store_options())?;
        let archive = self.host.archive_dir();
        std::fs::create_dir_all(&archive).with_context(|| format!("cannot create {}", archive.display()))?;
        let target = archive.join(format!("{id}.jsonl"));
        if target.exists() {
            bail!("{} already exists; nothing was moved", target.display());
        }
        std::fs::rename(&live.path, &target)
            .with_context(|| format!("cannot move {} to {}", live.path.display(), target.display()))?;
        // Prompts still queued go with it (nothing is ever deleted).
        let journal = queue::journal_path(&self.host.sessions_dir(), id);
        if journal.exists() {
            let kept = archive.join(format!("{id}.queue.jsonl"));
            std::fs::rename(&journal, &kept)
                .with_context(|| format!("cannot move {} to {}", journal.display(), kept.display()))?;
        }
        drop(store);
        let _ = std::fs::remove_file(cairn_core::storage::lock_path(&live.path));
        drop(inner);
        lock(&self.lives).remove(id);
        self.pulse.bump();
        Ok(())
    }

    /// `state`.
    pub fn state(&self, id: &str) -> Result<String> {
        let live = self.require(id)?;
        let (phase, refused) = {
            let inner = lock(&live.inner);
            (inner.phase.clone(), inner.refused.clone())
        };
        let state = match phase {
            Some(phase) => phase,
            None => {
                let max_line = self.host.store_options().max_line_bytes;
                let summary = read_summary(&live.path, &[], max_line)?;
                let in_progress =
                    summary.state.as_ref().and_then(|s| Pc::decode(&s.pc).ok()).is_some_and(|pc| pc.in_progress());
                stored_state(&live.path, in_progress)
            }
        };
        Ok(match refused {
            Some(why) => format!("{state}\nnot started: {why}"),
            None => state,
        })
    }

    /// `usage`: token totals over every provider attempt.
    pub fn usage(&self, id: &str) -> Result<String> {
        let live = self.require(id)?;
        let store = JsonlStore::open_read_only_with(&live.path, self.host.store_options())?;
        let own = UsageTotals::of(&store);
        let dir = live.path.parent().unwrap_or(Path::new("."));
        let family = FamilyUsage::of(dir, id, self.host.store_options());
        Ok(format!(
            "input {}\noutput {}\ncached {}\ntotal {}\nattempts {}\nfailed {}\n\
             children {}\nchildren_input {}\nchildren_output {}\n",
            own.input,
            own.output,
            own.cached,
            own.total(),
            own.attempts,
            own.failed,
            family.sessions,
            family.totals.input,
            family.totals.output
        ))
    }

    /// `chat`: the current lane's conversation, one line per part.
    pub fn chat(&self, id: &str) -> Result<Arc<String>> {
        let live = self.require(id)?;
        let meta = std::fs::metadata(&live.path).with_context(|| format!("cannot read {}", live.path.display()))?;
        let key = (meta.len(), meta.modified().unwrap_or(SystemTime::UNIX_EPOCH));
        if let Some((len, mtime, text)) = &lock(&live.inner).chat
            && (*len, *mtime) == key
        {
            return Ok(Arc::clone(text));
        }
        let store = JsonlStore::open_read_only_with(&live.path, self.host.store_options())?;
        let session = Session::open(store, self.host.session_config())?;
        let mut out = String::new();
        for message in session.messages() {
            for part in &message.content {
                match (message.role, part) {
                    (Role::System, _) | (_, ContentPart::Reasoning { .. }) => {}
                    (Role::User, ContentPart::Text { text }) => push_line(&mut out, "user: ", text),
                    (_, ContentPart::Text { text }) => push_line(&mut out, "assistant: ", text),
                    (_, ContentPart::ToolCall(call)) => {
                        let _ = writeln!(out, "-> {}({})", one_line(&call.name), one_line(&call.arguments.to_string()));
                    }
                    (_, ContentPart::ToolResult { content, .. }) => {
                        let _ = writeln!(out, "= {}", one_line(content.lines().next().unwrap_or_default()));
                    }
                    (_, ContentPart::Image { mime_type, data }) => {
                        let _ = writeln!(out, "[image {}, {} bytes of base64]", one_line(mime_type), data.len());
                    }
                }
            }
        }
        let text = Arc::new(out);
        lock(&live.inner).chat = Some((key.0, key.1, Arc::clone(&text)));
        Ok(text)
    }

    /// Bytes of `event` from `offset` (at most `count`); empty at its end.
    pub fn events(&self, id: &str, offset: u64, count: usize) -> Result<Vec<u8>> {
        let live = self.require(id)?;
        let mut inner = lock(&live.inner);
        live.sync_events(&mut inner, self.host.store_options())?;
        Ok(slice(&inner.events, offset, count))
    }

    /// The length of `event` so far (caught up with the file first).
    pub fn events_len(&self, id: &str) -> u64 {
        self.live(id).map_or(0, |live| {
            let mut inner = lock(&live.inner);
            // A file that cannot be read shows what is known; reading the
            // data itself reports the error.
            let _ = live.sync_events(&mut inner, self.host.store_options());
            inner.events.len() as u64
        })
    }

    /// Bytes of `log` (the session file's records) from `offset`.
    pub fn log(&self, id: &str, offset: u64, count: usize) -> Result<Vec<u8>> {
        use std::io::{Read, Seek, SeekFrom};
        let live = self.require(id)?;
        let mut file =
            std::fs::File::open(&live.path).with_context(|| format!("cannot read {}", live.path.display()))?;
        file.seek(SeekFrom::Start(offset))?;
        let mut buf = Vec::with_capacity(count.min(1 << 20));
        file.take(count as u64).read_to_end(&mut buf)?;
        // Only whole lines: a commit in progress is not shown half-written.
        match buf.iter().rposition(|&b| b == b'\n') {
            Some(end) => buf.truncate(end + 1),
            None if buf.len() < count => buf.clear(),
            None => {}
        }
        Ok(buf)
    }

    /// The ids of pending approvals of `id`.
    pub fn approvals(&self, id: &str) -> Vec<String> {
        self.live(id).map(|live| lock(&live.inner).approvals.keys().cloned().collect()).unwrap_or_default()
    }

    /// What reading `approvals/INV` shows.
    pub fn approval_text(&self, id: &str, invocation: &str) -> Option<String> {
        let live = self.live(id)?;
        let inner = lock(&live.inner);
        inner.approvals.get(invocation).map(|p| p.text.clone())
    }

    /// Answer `approvals/INV` with `y`, `n` or `a`.
    pub fn answer(&self, id: &str, invocation: &str, text: &str) -> Result<()> {
        let live = self.require(id)?;
        let mut inner = lock(&live.inner);
        let Some(pending) = inner.approvals.get(invocation) else {
            bail!("no pending approval {invocation:?} in session {id}");
        };
        let answer = match text.trim() {
            "y" | "yes" => Answer::Approve,
            "n" | "no" => Answer::Deny { reason: "denied by a person over 9P".to_owned() },
            "a" | "always" if pending.session_allowed => Answer::ApproveForSession,
            "a" | "always" => bail!("a (allow for the session) is only for Write calls; answer y or n"),
            other => bail!("{other:?} is not an answer: write y, n or a"),
        };
        let sent = pending.answer.try_send(answer);
        inner.approvals.remove(invocation);
        drop(inner);
        self.pulse.bump();
        sent.map_err(|_| anyhow!("the approval {invocation:?} is no longer waiting"))
    }

    /// Whether a turn runs in `id`.
    pub fn is_running(&self, id: &str) -> bool {
        self.live(id).is_some_and(|live| lock(&live.inner).turn.is_some())
    }

    /// Cancel every running turn and wait for each to settle durably
    /// (clean shutdown). New turns are refused from here on.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Ok(batch) = &self.batch {
            batch.shutdown();
        }
        let lives: Vec<Arc<Live>> = lock(&self.lives).values().cloned().collect();
        let mut handles = Vec::new();
        for live in &lives {
            let mut inner = lock(&live.inner);
            if let Some(running) = inner.turn.as_mut() {
                running.cancel.cancel();
                handles.extend(running.handle.take());
            }
        }
        for handle in handles {
            let _ = handle.join();
        }
        self.pulse.bump();
    }

    /// Whether the server is shutting down.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }
}

/// The prompt `run_queued` would take next: the session's queue with the
/// journal's new lines brought in, oldest first.
fn next_in_queue(store: &JsonlStore, arrived: &[registers::QueuedPrompt]) -> Option<String> {
    let mut queue = registers::prompt_queue(store);
    queue.bring_in(arrived);
    queue.items.into_iter().next().map(|q| q.prompt)
}

/// The state of a session no turn of this server runs: busy in another
/// process (which holds its writer lock: a turn of `cairn run`, or a
/// `cairn chat` between turns; a prompt would be refused), else interrupted
/// or idle as the file says.
fn stored_state(path: &Path, in_progress: bool) -> String {
    match busy_elsewhere(path) {
        // This process's own lock is not "elsewhere".
        Some(pid) if pid != Some(std::process::id()) => {
            if in_progress {
                elsewhere(pid)
            } else {
                match pid {
                    Some(pid) => format!("busy elsewhere: process {pid} has the session open"),
                    None => "busy elsewhere: another process has the session open".to_owned(),
                }
            }
        }
        _ if in_progress => "interrupted".to_owned(),
        _ => "idle".to_owned(),
    }
}

fn elsewhere(pid: Option<u32>) -> String {
    match pid {
        Some(pid) => format!("busy elsewhere: process {pid} is running a turn"),
        None => "busy elsewhere: another process is running a turn".to_owned(),
    }
}

/// Whether another process holds the writer lock of the session file at
/// `path` (and its pid, when it wrote one). Never creates the lock file.
fn busy_elsewhere(path: &Path) -> Option<Option<u32>> {
    use std::io::Read as _;
    let mut file = std::fs::File::open(cairn_core::storage::lock_path(path)).ok()?;
    match file.try_lock_shared() {
        Ok(()) => {
            let _ = file.unlock();
            None
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            Some(file.read_to_string(&mut text).ok().and_then(|_| text.trim().parse().ok()))
        }
        Err(std::fs::TryLockError::Error(_)) => None,
    }
}

fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

fn push_line(out: &mut String, prefix: &str, text: &str) {
    let text = text.trim();
    if text.is_empty() {
        return;
    }
    let mut lines = text.lines();
    let _ = writeln!(out, "{prefix}{}", lines.next().unwrap_or_default());
    for line in lines {
        let _ = writeln!(out, "  {line}");
    }
}

/// `data[offset..offset+count]`, empty past the end.
pub(crate) fn slice(data: &[u8], offset: u64, count: usize) -> Vec<u8> {
    let start = usize::try_from(offset).unwrap_or(usize::MAX).min(data.len());
    let end = start.saturating_add(count).min(data.len());
    data[start..end].to_vec()
}
