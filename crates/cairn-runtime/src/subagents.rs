//! Subagents: the built-in tools `spawn_agent` and `wait_agents`, through
//! which a session (the parent) runs child sessions, and the host side of a
//! session family.
//!
//! A child is an ordinary durable session where its parent lives ([`Home`],
//! a [`Place`]): a session file beside the parent's, or — for a session a
//! PostgreSQL worker drives — a session of the same database, driven within
//! the parent's lease (`db.rs`). Its id is a function of the spawning call,
//! `<parent id>+<invocation id>` ([`child_id`]), so the parent's intent
//! entry (`toolRequested`, holding the session and invocation ids) names
//! the child before the child exists, and creating it twice is impossible:
//! the place refuses an existing id (`JsonlStore::create`,
//! `PgStore::create_within`). Its `fact` `subagent` ([`ChildFact`],
//! committed right after the header) names the parent, the invocation, the
//! depth, the prompt and the authority the child was given.
//!
//! Owns: the child id rule, creating a child once, re-attaching a child by
//! id (finished → its answer is read; unfinished → it is resumed, never run
//! anew), the authority checks (tools ⊆ parent's, allow patterns ⊆
//! parent's, cwd inside the parent's working directory) and the limits
//! (`[subagents]`: depth, children per session, children running at once).
//! Children run on host threads of this process, never in a slot a parent
//! may be waiting in; cairn-core only sees two more tools (`spawn_agent` is
//! `Guarded`, its guard being the child's stored state). The family's code
//! is one, generic over the [`Place`].
//! Must not: drive a child other than through `Session::run_turn` /
//! `Session::resume`, or give a child an approver other than the parent's.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use cairn_core::approval::{Allowlist, Approver, PolicyApprover, SharedApprover};
use cairn_core::report::{FamilyUsage, UsageTotals};
use cairn_core::storage::registers::FACT;
use cairn_core::storage::{Header, JsonlStore, Record, Storage, Tail, Transaction, now_millis, to_raw};
#[cfg(feature = "postgres")]
pub mod db;
use cairn_core::tool::{
    GuardVerdict, ReplayPolicy, Risk, Tool, ToolContext, ToolError, ToolReceipt, ToolRequest, ToolSpec, Validation,
};
use cairn_core::{CancelToken, Session, TurnStop};
use cairn_host::{Equipment, Step};
use cairn_provider::{ProviderConfig, ProviderKind};
use serde::Deserialize;
use serde_json::json;

use crate::context::Context;
use crate::family::{ChildFact, FACT_KEY, SEP, child_fact, child_id, depth_of, parent_of};

pub use crate::config::SubagentLimits as Limits;
pub use crate::family::{SPAWN, WAIT};

impl Limits {
    fn from_settings(ctx: &Context) -> Result<Self> {
        match &ctx.settings.subagents {
            None => Ok(Self::default()),
            Some(table) => table
                .clone()
                .try_into()
                .map_err(|e| anyhow!("[subagents] in {} is invalid: {e}", ctx.settings.config_file.display())),
        }
    }
}

/// What a parent session hands down to its children: who answers their
/// calls that no allow rule covers (the person the parent asks, through
/// its face; `None`: nobody, a headless session), the parent's standing
/// approval of Write calls (`--yes`, `yes=1`), and the allow patterns a
/// child may be given. Never more than the parent has.
#[derive(Debug, Clone, Default)]
pub struct Authority {
    /// The parent's person, shared by every session of the family.
    pub person: Option<SharedApprover>,
    /// Who approves every Write call (core's `PolicyApprover::approve_writes`).
    pub approve_writes: Option<String>,
    /// The parent's allow patterns.
    pub allow: Vec<String>,
    /// The parent's provider, which its children run on (`None`: the
    /// configured one).
    pub provider: Option<ParentProvider>,
    /// Where the family's sessions live.
    pub home: Home,
}

/// Where a family's sessions live: where its top-level session does.
#[derive(Debug, Clone, Default)]
pub enum Home {
    /// Session files in the sessions directory (every face but workers).
    #[default]
    Files,
    /// The database of a session a PostgreSQL worker drives, within that
    /// session's lease (`db.rs`).
    #[cfg(feature = "postgres")]
    Database(Arc<db::Database>),
}

/// Where children are created, found, read and opened to be driven (the
/// one thing the family's code is generic over): [`Files`], or a database
/// (`db::Database`). Ids follow [`child_id`] everywhere.
pub trait Place: Send + Sync + 'static {
    /// A child's store.
    type Store: Storage + Send + 'static;

    /// Create child `header.id`, refused when it exists: the only place a
    /// child is created, so never twice.
    fn create(&self, ctx: &Context, header: Header) -> Result<Self::Store>;

    /// Child `id` opened to drive it (`None`: it does not exist).
    fn open(&self, ctx: &Context, id: &str) -> Result<Option<Self::Store>>;

    /// Child `id` read, never written (`None`: it does not exist).
    fn read(&self, ctx: &Context, id: &str) -> Result<Option<Self::Store>>;

    /// Whether child `id` exists (without reading it).
    fn exists(&self, ctx: &Context, id: &str) -> Result<bool>;

    /// The ids of `parent`'s children, in any order.
    fn children(&self, ctx: &Context, parent: &str) -> Result<Vec<String>>;

    /// The token a child's turn runs under (the lease's, in a database).
    fn cancel(&self) -> CancelToken;

    /// A child's turn ended with its answer (a database marks its row
    /// idle; files need nothing: the log says it).
    fn ended(&self, _store: &mut Self::Store) -> Result<()> {
        Ok(())
    }

    /// Child `id` was found finished when attached: what `ended` says, for
    /// a child whose driver was cut off between its answer and `ended`.
    fn found_finished(&self, _ctx: &Context, _id: &str) -> Result<()> {
        Ok(())
    }

    /// How often a waiting peer looks at the family's logs again.
    fn poll_every(&self) -> Duration {
        Duration::from_millis(50)
    }

    /// A reader of session `id`'s log that reads only what was appended
    /// since its last look, if this place has one (`None`: each look
    /// reads the whole log again and skips what it visited before).
    fn follow(&self, ctx: &Context, id: &str) -> Option<Box<dyn crate::peers::Follow>> {
        let _ = (ctx, id);
        None
    }

    /// Whether every line of session `id` was written by a family's driver
    /// (a database line records the lease it was written under; an
    /// imported one records none). Files cannot tell: true.
    fn written_by_a_family(&self, _ctx: &Context, _id: &str) -> Result<bool> {
        Ok(true)
    }

    /// Which drive of the family this process is in: the children this
    /// process knows are keyed by it, so a child stopped when an earlier
    /// drive ended (a lost lease) is re-attached, never taken for a result.
    fn generation(&self) -> String;
}

/// Children as session files in the sessions directory.
#[derive(Debug, Clone, Copy, Default)]
pub struct Files;

impl Files {
    fn path(ctx: &Context, id: &str) -> PathBuf {
        ctx.paths.sessions().join(format!("{id}.jsonl"))
    }
}

impl Place for Files {
    type Store = JsonlStore;

    fn create(&self, ctx: &Context, header: Header) -> Result<JsonlStore> {
        let id = header.id.clone();
        JsonlStore::create(&ctx.paths.sessions(), header, ctx.settings.store_options())
            .with_context(|| format!("cannot create child session {id}"))
    }

    fn open(&self, ctx: &Context, id: &str) -> Result<Option<JsonlStore>> {
        let path = Self::path(ctx, id);
        if !path.exists() {
            return Ok(None);
        }
        crate::wiring::open_session(ctx, &path).map(Some)
    }

    fn read(&self, ctx: &Context, id: &str) -> Result<Option<JsonlStore>> {
        let path = Self::path(ctx, id);
        if !path.exists() {
            return Ok(None);
        }
        Ok(Some(JsonlStore::open_read_only_with(&path, ctx.settings.store_options())?))
    }

    fn exists(&self, ctx: &Context, id: &str) -> Result<bool> {
        Ok(Self::path(ctx, id).is_file())
    }

    fn follow(&self, ctx: &Context, id: &str) -> Option<Box<dyn crate::peers::Follow>> {
        Some(Box::new(FileFollow { path: Self::path(ctx, id), tail: None }))
    }

    fn children(&self, ctx: &Context, parent: &str) -> Result<Vec<String>> {
        let prefix = format!("{parent}{SEP}");
        Ok(crate::sessions::session_files(&ctx.paths)?
            .iter()
            .filter_map(|p| p.file_stem().and_then(|s| s.to_str()).map(str::to_owned))
            .filter(|stem| stem.strip_prefix(&prefix).is_some_and(|rest| !rest.contains(SEP)))
            .collect())
    }

    fn cancel(&self) -> CancelToken {
        // A child of this process stops with it (and is resumed with its
        // parent).
        CancelToken::new()
    }

    fn generation(&self) -> String {
        // One process drives its files' families; it never loses them.
        String::new()
    }
}

/// A provider a session was started on other than the configured one (a
/// served session's `provider=`, `model=`, `script=`).
#[derive(Debug, Clone, Default)]
pub struct ParentProvider {
    /// Its name.
    pub name: String,
    /// The model, if one was given.
    pub model: Option<String>,
    /// The scripted provider's script, if one was given.
    pub script: Option<PathBuf>,
}

impl Authority {
    /// The authority of a session whose calls `policy` answers, authority
    /// `person`.
    pub fn of(policy: &PolicyApprover, person: Option<SharedApprover>) -> Self {
        Self {
            person,
            approve_writes: policy.writes_approved_by().map(str::to_owned),
            allow: policy.allowlist().rules().iter().map(|r| r.text().to_owned()).collect(),
            provider: None,
            home: Home::Files,
        }
    }

    /// A child's approval policy: its own allow patterns (a subset of
    /// these), its parent's person and standing approval.
    fn policy(&self, allow: Allowlist) -> PolicyApprover {
        let person = self.person.clone().map(|p| Box::new(p) as Box<dyn Approver>);
        let policy = PolicyApprover::new(allow, person);
        match &self.approve_writes {
            Some(by) => policy.approve_writes(by.clone()),
            None => policy,
        }
    }
}

/// How a child ended, as the parent sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum ChildResult {
    /// Its final answer.
    Answered(String),
    /// It could not finish (the reason).
    Failed(String),
}

/// A child's state read from its file.
#[derive(Debug, Clone, PartialEq)]
enum ChildStatus {
    NotStarted,
    Unfinished,
    Finished(ChildResult),
}

/// One child known to this process: running on a thread, or finished.
#[derive(Debug, Default)]
struct Slot {
    done: Mutex<Option<ChildResult>>,
    changed: Condvar,
}

impl Slot {
    fn finish(&self, result: ChildResult) {
        if let Ok(mut done) = self.done.lock() {
            *done = Some(result);
        }
        self.changed.notify_all();
    }

    fn result(&self) -> Option<ChildResult> {
        self.done.lock().ok().and_then(|d| d.clone())
    }

    /// Wait for the result until `deadline` (None: no deadline) or a cancel.
    fn wait(&self, deadline: Option<Instant>, cancel: &CancelToken) -> Option<ChildResult> {
        let Ok(mut done) = self.done.lock() else { return None };
        loop {
            if let Some(result) = done.clone() {
                return Some(result);
            }
            if cancel.is_cancelled() || deadline.is_some_and(|d| Instant::now() >= d) {
                return None;
            }
            // Wake regularly to see a cancel.
            let step = Duration::from_millis(100);
            let step = deadline.map_or(step, |d| step.min(d.saturating_duration_since(Instant::now())));
            done = match self.changed.wait_timeout(done, step) {
                Ok((guard, _)) => guard,
                Err(_) => return None,
            };
        }
    }
}

/// A child known to this process: the drive of its family it belongs to
/// ([`Place::generation`]) and its id.
type SlotKey = (String, String);

/// The children of this process (one family per `cairn` process).
struct Family {
    ctx: Context,
    limits: Limits,
    slots: Mutex<BTreeMap<SlotKey, Arc<Slot>>>,
}

static FAMILY: OnceLock<Family> = OnceLock::new();

fn family(ctx: &Context, limits: Limits) -> &'static Family {
    FAMILY.get_or_init(|| Family { ctx: ctx.clone(), limits, slots: Mutex::new(BTreeMap::new()) })
}

/// Before the process exits: wait for the children still running on its
/// threads (started with `wait: false` and never gathered), so they finish
/// instead of stopping mid-turn. Ctrl-C leaves at once (a child stopped
/// there is resumed when its parent re-attaches it).
pub fn finish_running() {
    let Some(family) = FAMILY.get() else { return };
    let slots: Vec<Arc<Slot>> = family.slots.lock().map(|s| s.values().cloned().collect()).unwrap_or_default();
    if slots.iter().any(|s| s.result().is_none()) {
        family
            .ctx
            .notes
            .info("waiting for running child sessions to finish (Ctrl-C leaves; they resume with their parent)");
    }
    let never = CancelToken::new();
    for slot in slots {
        slot.wait(None, &never);
    }
}

/// `cairn resume` of a parent (or a worker's turn of one): resume its
/// children a crash left unfinished, also those no pending call of the
/// parent will re-attach (started with `wait: false`; `finish_running`, or
/// for a worker `finish_children`, waits for them).
pub fn reattach_children(parent: &str, authority: &Authority) {
    match &authority.home {
        Home::Files => reattach(&Arc::new(Files), parent, authority),
        #[cfg(feature = "postgres")]
        Home::Database(db) => reattach(db, parent, authority),
    }
}

fn reattach<P: Place>(place: &Arc<P>, parent: &str, authority: &Authority) {
    let Some(family) = FAMILY.get() else { return };
    for id in family.children_of(&**place, parent).unwrap_or_default() {
        // Without its fact the child was cut off while being created: only
        // its `spawn_agent` call (pending, so re-run) can finish that.
        let Ok(Some(store)) = place.read(&family.ctx, &id) else { continue };
        if child_fact(&store).is_none() || own_child(&**place, &family.ctx, &id, &store, None).is_err() {
            continue;
        }
        if matches!(status(&family.ctx, store), Ok(ChildStatus::Finished(_))) {
            // Its driver may have been cut off between its answer and
            // saying so (a database row left `running`).
            let _ = place.found_finished(&family.ctx, &id);
        } else {
            // A child that cannot be re-attached is reported by the call
            // that gathers it.
            let _ = family.attach(place, &id, None, authority);
        }
    }
}

/// Wait until the children of `parent` (and theirs) that this drive of the
/// family started are no longer running (a worker, before it leaves a
/// turn: its children run within its lease, which it must not release
/// under them), then forget them: their results are in the place, read
/// again should a later call gather them (a long-running worker keeps no
/// table of every child it ever ran). A child stopped by the drive's token
/// ends at once.
#[cfg(feature = "postgres")]
pub fn finish_children(parent: &str, authority: &Authority) {
    let generation = match &authority.home {
        Home::Files => Files.generation(),
        #[cfg(feature = "postgres")]
        Home::Database(db) => db.generation(),
    };
    let Some(family) = FAMILY.get() else { return };
    let prefix = format!("{parent}{SEP}");
    let never = CancelToken::new();
    loop {
        let running: Vec<Arc<Slot>> = family
            .slots
            .lock()
            .map(|slots| {
                slots
                    .iter()
                    .filter(|((g, id), slot)| *g == generation && id.starts_with(&prefix) && slot.result().is_none())
                    .map(|(_, slot)| Arc::clone(slot))
                    .collect()
            })
            .unwrap_or_default();
        if running.is_empty() {
            if let Ok(mut slots) = family.slots.lock() {
                slots.retain(|(g, id), slot| !(*g == generation && id.starts_with(&prefix) && slot.result().is_some()));
            }
            return;
        }
        // A child may start a grandchild while we wait: look again.
        for slot in running {
            slot.wait(None, &never);
        }
    }
}

/// What one session may hand down to its children.
#[derive(Debug, Clone)]
struct Scope {
    cwd: PathBuf,
    tools: Vec<String>,
    allow: Vec<String>,
    provider: String,
    model: Option<String>,
    script: Option<PathBuf>,
    scripted: bool,
    /// Who answers for the session and its children.
    authority: Authority,
}

/// Whether the provider `name` is the embedded model, which is offered
/// neither the family's tools nor `plan`.
pub(crate) fn is_local(ctx: &Context, name: &str) -> bool {
    ProviderConfig::resolve(name, ctx.settings.providers.get(name)).is_ok_and(|c| c.kind == ProviderKind::Local)
}

/// The family's tools for a top-level session in `cwd` offered
/// `parent_tools`, its calls answered by `authority` (`equip.rs` offers
/// them to every face that has a family). Empty where the family is off
/// (`[subagents] max_depth = 0`) or the provider is the embedded model.
pub fn tools(
    ctx: &Context,
    cwd: &Path,
    mut parent_tools: Vec<String>,
    authority: Authority,
) -> Result<Vec<Arc<dyn Tool>>> {
    let limits = Limits::from_settings(ctx)?;
    let family = family(ctx, limits);
    let home = authority.home.clone();
    let (provider, model, script) = match &authority.provider {
        Some(p) => (p.name.clone(), p.model.clone(), p.script.clone()),
        None => {
            (ctx.settings.provider.value.clone(), ctx.settings.model.value.clone(), ctx.settings.script.value.clone())
        }
    };
    // The embedded 135M model is not offered the family's tools: it cannot
    // use them, and its prompt and decoding grammar stay as they were.
    let local = is_local(ctx, &provider);
    if family.limits.max_depth == 0 || local {
        return Ok(Vec::new());
    }
    parent_tools.extend([SPAWN, WAIT].map(str::to_owned));
    // Peer messages are read from the senders' logs, wherever the
    // family's sessions live (`FamilyLogs`).
    parent_tools.extend([crate::peers::SEND, crate::peers::RECEIVE].map(str::to_owned));
    let scope = Scope {
        cwd: cwd.to_path_buf(),
        tools: parent_tools,
        allow: authority.allow.clone(),
        scripted: is_scripted(ctx, &provider),
        provider,
        model,
        script,
        authority,
    };
    Ok(match home {
        Home::Files => build(family, scope, Arc::new(Files), true),
        #[cfg(feature = "postgres")]
        Home::Database(db) => build(family, scope, db, true),
    })
}

/// The family's logs as the peer tools read them, wherever its sessions
/// live: through the same [`Place`] the family creates and drives them in.
struct FamilyLogs<P> {
    place: Arc<P>,
    ctx: &'static Context,
}

impl<P: Place> crate::peers::Logs for FamilyLogs<P> {
    fn exists(&self, id: &str) -> bool {
        self.place.exists(self.ctx, id).unwrap_or(false)
    }

    fn children(&self, id: &str) -> Vec<String> {
        let mut ids = self.place.children(self.ctx, id).unwrap_or_default();
        ids.sort();
        ids
    }

    fn peers_allowed(&self, id: &str) -> bool {
        self.place.read(self.ctx, id).ok().flatten().and_then(|s| child_fact(&s)).is_some_and(|f| f.peers)
    }

    fn visit(&self, id: &str, f: &mut dyn FnMut(&cairn_core::storage::Entry)) {
        if let Ok(Some(store)) = self.place.read(self.ctx, id) {
            store.visit_entries(f);
        }
    }

    fn follow(&self, id: &str) -> Box<dyn crate::peers::Follow> {
        self.place.follow(self.ctx, id).unwrap_or_else(|| {
            Box::new(Rescan { place: Arc::clone(&self.place), ctx: self.ctx, id: id.to_owned(), visited: 0 })
        })
    }

    fn poll_every(&self) -> Duration {
        self.place.poll_every()
    }
}

/// A session file followed with core's [`Tail`] (complete lines only;
/// a compaction or a cut torn tail re-read without repeating an entry),
/// opened once the file exists.
struct FileFollow {
    path: PathBuf,
    tail: Option<Tail>,
}

impl crate::peers::Follow for FileFollow {
    fn poll(&mut self, f: &mut dyn FnMut(&cairn_core::storage::Entry)) {
        if self.tail.is_none() {
            self.tail = Tail::open(&self.path).ok();
        }
        // A log that cannot be read now is read at a later look.
        let records = self.tail.as_mut().map(Tail::poll).and_then(Result::ok).unwrap_or_default();
        for record in records {
            if let Record::Entry(entry) = record {
                f(&entry);
            }
        }
    }
}

/// A log followed by reading it whole at each look and visiting only the
/// entries past those visited before (entries are only ever appended), for
/// a place without a reader of its own.
struct Rescan<P> {
    place: Arc<P>,
    ctx: &'static Context,
    id: String,
    visited: usize,
}

impl<P: Place> crate::peers::Follow for Rescan<P> {
    fn poll(&mut self, f: &mut dyn FnMut(&cairn_core::storage::Entry)) {
        let Ok(Some(store)) = self.place.read(self.ctx, &self.id) else { return };
        let mut n = 0;
        store.visit_entries(&mut |e| {
            if n >= self.visited {
                f(e);
            }
            n += 1;
        });
        self.visited = self.visited.max(n);
    }
}

fn is_scripted(ctx: &Context, provider: &str) -> bool {
    ProviderConfig::resolve(provider, ctx.settings.providers.get(provider))
        .is_ok_and(|c| c.kind == ProviderKind::Scripted)
}

/// What `scope.tools` names of the family's tools: `spawn_agent` and
/// `wait_agents` only when `may_spawn` (below the depth limit), the peer
/// tools (`peers.rs`) when named.
fn build<P: Place>(family: &'static Family, scope: Scope, place: Arc<P>, may_spawn: bool) -> Vec<Arc<dyn Tool>> {
    let scope = Arc::new(scope);
    let spawn =
        SpawnAgent { spec: spawn_spec(scope.scripted), scope: Arc::clone(&scope), place: Arc::clone(&place), family };
    let logs = Arc::new(FamilyLogs { place: Arc::clone(&place), ctx: &family.ctx });
    let wait = WaitAgents { spec: wait_spec(), authority: scope.authority.clone(), place, family };
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    if may_spawn {
        tools.extend([Arc::new(spawn) as Arc<dyn Tool>, Arc::new(wait)]);
    }
    let peers = crate::peers::tools(logs);
    tools.extend(peers.into_iter().filter(|t| scope.tools.contains(&t.spec().name)));
    tools
}

fn spawn_spec(scripted: bool) -> ToolSpec {
    let mut properties = json!({
        "prompt": {"type": "string", "minLength": 1, "description": "The child's task."},
        "cwd": {"type": "string", "description": "Its working directory, inside yours (default: yours)."},
        "tools": {"type": "array", "items": {"type": "string"}, "description": "Tools it may use, a subset of yours (default: all of yours)."},
        "allow": {"type": "array", "items": {"type": "string"}, "description": "Allow patterns it gets, a subset of yours (default: all of yours)."},
        "wait": {"type": "boolean", "description": "true (default): return its answer; false: return its id at once, collect it with wait_agents."},
        "peers": {"type": "boolean", "description": "Let it message its siblings started with peers too (default false)."}
    });
    if scripted {
        properties["script"] = json!({"type": "string", "description": "The scripted provider's script for the child (relative to the parent's script)."});
    }
    ToolSpec {
        name: SPAWN.to_owned(),
        description: "Start a child agent (its own durable session) on a task and get its final answer.".to_owned(),
        input_schema: json!({"type": "object", "properties": properties, "required": ["prompt"]}),
        risk: Risk::ReadOnly,
        capabilities: BTreeSet::new(),
        replay: ReplayPolicy::Guarded,
    }
}

fn wait_spec() -> ToolSpec {
    ToolSpec {
        name: WAIT.to_owned(),
        description: "Collect the final answers of children started with spawn_agent (wait: false).".to_owned(),
        input_schema: json!({
            "type": "object",
            "properties": {
                "ids": {"type": "array", "items": {"type": "string"}, "description": "Child ids spawn_agent returned (default: all your children)."},
                "timeout": {"type": "integer", "minimum": 0, "description": "Seconds to wait at most (default: until all finish)."}
            },
        }),
        risk: Risk::ReadOnly,
        capabilities: BTreeSet::new(),
        replay: ReplayPolicy::Idempotent,
    }
}

#[derive(Debug, Deserialize)]
struct SpawnArgs {
    prompt: String,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    tools: Option<Vec<String>>,
    #[serde(default)]
    allow: Option<Vec<String>>,
    #[serde(default)]
    wait: Option<bool>,
    #[serde(default)]
    script: Option<String>,
    #[serde(default)]
    peers: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct WaitArgs {
    #[serde(default)]
    ids: Option<Vec<String>>,
    #[serde(default)]
    timeout: Option<u64>,
}

struct SpawnAgent<P> {
    spec: ToolSpec,
    scope: Arc<Scope>,
    place: Arc<P>,
    family: &'static Family,
}

struct WaitAgents<P> {
    spec: ToolSpec,
    authority: Authority,
    place: Arc<P>,
    family: &'static Family,
}

impl<P: Place> SpawnAgent<P> {
    /// The child's fact and working directory, or why the call exceeds the
    /// parent's authority or the limits.
    fn plan(&self, request: &ToolRequest) -> Result<(ChildFact, PathBuf), String> {
        let args: SpawnArgs = serde_json::from_value(request.arguments.clone()).map_err(|e| e.to_string())?;
        let scope = &self.scope;
        let depth = depth_of(&request.session_id) + 1;
        if depth > self.family.limits.max_depth {
            return Err(format!(
                "a child here would be at depth {depth}, past the limit of {} ([subagents] max_depth)",
                self.family.limits.max_depth
            ));
        }
        let tools = match args.tools {
            None => scope.tools.clone(),
            Some(tools) => {
                if let Some(extra) = tools.iter().find(|t| !scope.tools.contains(t)) {
                    return Err(format!(
                        "this session has no tool {extra:?}, so its child cannot have it (a child's tools are a subset of its parent's: {})",
                        scope.tools.join(", ")
                    ));
                }
                tools
            }
        };
        let allow = match args.allow {
            None => scope.allow.clone(),
            Some(allow) => {
                if let Some(extra) = allow.iter().find(|p| !scope.allow.contains(p)) {
                    return Err(format!(
                        "this session has no allow pattern {extra:?}, so its child cannot have it (a child's allow patterns are a subset of its parent's: {:?})",
                        scope.allow
                    ));
                }
                allow
            }
        };
        let root = scope.cwd.canonicalize().map_err(|e| format!("{}: {e}", scope.cwd.display()))?;
        let cwd = match &args.cwd {
            None => root.clone(),
            Some(dir) => {
                let joined = root.join(dir);
                let cwd = joined.canonicalize().map_err(|e| format!("cwd {dir:?}: {e}"))?;
                if !cwd.starts_with(&root) || !cwd.is_dir() {
                    return Err(format!(
                        "cwd {dir:?} is not a directory inside this session's working directory {} (a child stays inside its parent's)",
                        root.display()
                    ));
                }
                cwd
            }
        };
        let script = match (&args.script, scope.scripted) {
            (Some(_), false) => return Err("`script` is only for the scripted provider".to_owned()),
            (None, true) => {
                return Err(
                    "with the scripted provider a child needs its own `script` (one answer per line)".to_owned()
                );
            }
            (Some(s), true) => {
                let base = scope.script.as_deref().and_then(Path::parent).unwrap_or(&root);
                Some(base.join(s))
            }
            (None, false) => None,
        };
        let fact = ChildFact {
            parent: request.session_id.clone(),
            invocation: request.invocation_id.clone(),
            depth,
            prompt: args.prompt,
            tools,
            allow,
            provider: scope.provider.clone(),
            model: scope.model.clone(),
            script,
            peers: args.peers.unwrap_or(false),
        };
        Ok((fact, cwd))
    }

    fn waits(request: &ToolRequest) -> bool {
        serde_json::from_value::<SpawnArgs>(request.arguments.clone()).ok().and_then(|a| a.wait).unwrap_or(true)
    }
}

impl<P: Place> Tool for SpawnAgent<P> {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn validate(&self, request: &ToolRequest) -> Validation {
        match self.plan(request) {
            Ok(_) => Validation::Valid,
            Err(reason) => Validation::Invalid(reason),
        }
    }

    /// The child's stored state is the guard: finished → its answer (a
    /// `wait: false` call → its id); anything else → run again, which
    /// re-attaches the existing child instead of creating one.
    fn guard(&self, request: &ToolRequest, _cwd: &Path) -> GuardVerdict {
        let id = child_id(&request.session_id, &request.invocation_id);
        let Ok(Some(store)) = self.place.read(&self.family.ctx, &id) else {
            return GuardVerdict::NotDone;
        };
        // Only this call's own child answers for it; anything else under
        // its name is refused when the call runs again (`attach`).
        let expected = self.plan(request).ok().map(|(fact, _)| fact);
        if own_child(&*self.place, &self.family.ctx, &id, &store, expected.as_ref()).is_err() {
            return GuardVerdict::NotDone;
        }
        match status(&self.family.ctx, store) {
            Ok(ChildStatus::Finished(result)) if Self::waits(request) => {
                GuardVerdict::AlreadyDone(receipt(&id, Some(&result), Duration::ZERO))
            }
            _ => GuardVerdict::NotDone,
        }
    }

    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let started = Instant::now();
        let (fact, cwd) = self.plan(request).map_err(ToolError::InvalidArguments)?;
        let id = child_id(&request.session_id, &request.invocation_id);
        let slot = self
            .family
            .attach(&self.place, &id, Some((&fact, &cwd)), &self.scope.authority)
            .map_err(|e| ToolError::Other(format!("{e:#}")))?;
        if !Self::waits(request) {
            return Ok(receipt(&id, slot.result().as_ref(), started.elapsed()));
        }
        match slot.wait(None, ctx.cancel) {
            Some(result) => Ok(receipt(&id, Some(&result), started.elapsed())),
            None => Err(ToolError::Cancelled),
        }
    }
}

impl<P: Place> Tool for WaitAgents<P> {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn validate(&self, request: &ToolRequest) -> Validation {
        let Ok(args) = serde_json::from_value::<WaitArgs>(request.arguments.clone()) else {
            return Validation::Invalid("ids is a list of child ids spawn_agent returned".to_owned());
        };
        match args.ids.unwrap_or_default().iter().find(|id| parent_of(id) != Some(request.session_id.as_str())) {
            Some(id) => Validation::Invalid(format!("{id:?} is not a child of this session")),
            None => Validation::Valid,
        }
    }

    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let started = Instant::now();
        let args: WaitArgs = serde_json::from_value(request.arguments.clone())
            .map_err(|e| ToolError::InvalidArguments(e.to_string()))?;
        let deadline = args.timeout.map(|s| started + Duration::from_secs(s));
        let ids = match args.ids {
            Some(ids) => ids,
            None => self
                .family
                .children_of(&*self.place, &request.session_id)
                .map_err(|e| ToolError::Other(format!("{e:#}")))?,
        };
        let mut slots = Vec::new();
        for id in &ids {
            let slot = self
                .family
                .attach(&self.place, id, None, &self.authority)
                .map_err(|e| ToolError::Other(format!("{e:#}")))?;
            slots.push((id, slot));
        }
        let mut text = String::new();
        let mut children = Vec::new();
        for (id, slot) in slots {
            let result = slot.wait(deadline, ctx.cancel);
            if result.is_none() && ctx.cancel.is_cancelled() {
                return Err(ToolError::Cancelled);
            }
            let (status, answer) = describe(result.as_ref());
            text.push_str(&format!("{id} ({status}): {answer}\n"));
            children.push(json!({"id": id, "status": status, "answer": answer}));
        }
        Ok(ToolReceipt {
            exit_code: 0,
            output_summary: text,
            structured_output: Some(json!({"children": children})),
            affected_entities: Vec::new(),
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            tier: Risk::ReadOnly,
            timestamp: now_millis(),
            truncated: false,
        })
    }
}

fn describe(result: Option<&ChildResult>) -> (&'static str, String) {
    match result {
        None => ("running", String::new()),
        Some(ChildResult::Answered(text)) => ("done", text.clone()),
        Some(ChildResult::Failed(why)) => ("failed", why.clone()),
    }
}

fn receipt(id: &str, result: Option<&ChildResult>, took: Duration) -> ToolReceipt {
    let (status, answer) = describe(result);
    let summary = match result {
        None => format!("started child {id}; collect its answer with wait_agents"),
        Some(ChildResult::Answered(text)) => text.clone(),
        Some(ChildResult::Failed(why)) => format!("child {id} failed: {why}"),
    };
    ToolReceipt {
        exit_code: i32::from(matches!(result, Some(ChildResult::Failed(_)))),
        output_summary: summary,
        structured_output: Some(json!({"childId": id, "status": status, "answer": answer})),
        affected_entities: vec![id.to_owned()],
        duration_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
        tier: Risk::ReadOnly,
        timestamp: now_millis(),
        truncated: false,
    }
}

impl Family {
    /// The slot of child `id` of `place`: already known to this drive of
    /// the family, or read from the place (finished), or started on a
    /// thread (unfinished: resumed). With `create` the child is created
    /// when it does not exist — the only place a child is created, so never
    /// twice.
    fn attach<P: Place>(
        &'static self,
        place: &Arc<P>,
        id: &str,
        create: Option<(&ChildFact, &Path)>,
        authority: &Authority,
    ) -> Result<Arc<Slot>> {
        let ctx = &self.ctx;
        let key = (place.generation(), id.to_owned());
        let mut slots = self.slots.lock().map_err(|_| anyhow!("the subagent table is poisoned"))?;
        if let Some(slot) = slots.get(&key) {
            return Ok(Arc::clone(slot));
        }
        // A store opened for writing here is handed to the child's thread,
        // never closed and reopened: a process forked meanwhile (a tool's
        // namespace waiter) would hold a closed file's lock a while.
        let mut writer = None;
        let found = place.read(ctx, id)?;
        if let Some(existing) = &found {
            own_child(&**place, ctx, id, existing, create.map(|(fact, _)| fact))?;
        }
        match (found, create) {
            (None, None) => bail!("no child session {id}"),
            (None, Some((fact, cwd))) => {
                self.check_limits(&**place, &fact.parent, &slots)?;
                let mut store = place.create(ctx, Header::new(id, cwd.display().to_string()))?;
                store.commit(Transaction::new().set(FACT, FACT_KEY, to_raw(fact)?))?;
                writer = Some(store);
            }
            (Some(existing), Some((fact, _))) => {
                // Killed between the header and the fact: add the fact.
                if existing.register(FACT, FACT_KEY).is_none() {
                    drop(existing);
                    let mut store = place.open(ctx, id)?.ok_or_else(|| anyhow!("child session {id} is gone"))?;
                    store.commit(Transaction::new().set(FACT, FACT_KEY, to_raw(fact)?))?;
                    writer = Some(store);
                }
            }
            (Some(_), None) => {}
        }
        let slot = Arc::new(Slot::default());
        let stored = place.read(ctx, id)?.ok_or_else(|| anyhow!("child session {id} is gone"))?;
        if let ChildStatus::Finished(result) = status(ctx, stored)? {
            // Said by its stored state; a row left `running` says it too
            // (a failure to say so leaves the answer as it is).
            let _ = place.found_finished(ctx, id);
            slot.finish(result);
        } else {
            let (runner, child, authority, place) =
                (Arc::clone(&slot), id.to_owned(), authority.clone(), Arc::clone(place));
            std::thread::Builder::new()
                .name(format!("child {id}"))
                .spawn(move || {
                    let result = match self.run_child(&place, &child, writer, authority) {
                        Ok(result) => result,
                        Err(e) => ChildResult::Failed(format!("{e:#}")),
                    };
                    self.stopped(&*place, &child, &result);
                    runner.finish(result);
                })
                .context("cannot start a thread for the child")?;
        }
        slots.insert(key, Arc::clone(&slot));
        Ok(slot)
    }

    /// Tell the `subagent_stop` hooks (of the child's directory) that
    /// child `id` ended with `result`, before its parent is given it.
    fn stopped<P: Place>(&self, place: &P, id: &str, result: &ChildResult) {
        let Ok(Some(store)) = place.read(&self.ctx, id) else { return };
        let cwd = PathBuf::from(&store.header().cwd);
        let parent = parent_of(id).unwrap_or_default();
        if let Some(hooks) = crate::wiring::hooks(&self.ctx, &cwd) {
            let (answer, failed) = match result {
                ChildResult::Answered(text) => (text.as_str(), false),
                ChildResult::Failed(why) => (why.as_str(), true),
            };
            hooks.subagent_stop(parent, id, &cwd, answer, failed);
        }
    }

    fn check_limits<P: Place>(&self, place: &P, parent: &str, slots: &BTreeMap<SlotKey, Arc<Slot>>) -> Result<()> {
        let running = slots.values().filter(|s| s.result().is_none()).count();
        if running >= self.limits.max_running {
            bail!(
                "{running} children are running, the limit ([subagents] max_running); collect some with wait_agents first"
            );
        }
        let mine = self.children_of(place, parent)?.len();
        if mine >= self.limits.max_children {
            bail!("this session has started {mine} children, the limit ([subagents] max_children)");
        }
        Ok(())
    }

    /// The ids of `parent`'s children, in the order they were started
    /// (invocation ids grow with the log).
    fn children_of<P: Place>(&self, place: &P, parent: &str) -> Result<Vec<String>> {
        let mut ids = place.children(&self.ctx, parent)?;
        ids.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
        Ok(ids)
    }

    /// Drive child `id` to its answer: its first turn, or the resumption of
    /// an interrupted one. The place keeps a second driver out (a file's
    /// writer lock; a database's lease).
    fn run_child<P: Place>(
        &'static self,
        place: &Arc<P>,
        id: &str,
        writer: Option<P::Store>,
        authority: Authority,
    ) -> Result<ChildResult> {
        let ctx = &self.ctx;
        let store = match writer {
            Some(store) => store,
            None => place.open(ctx, id)?.ok_or_else(|| anyhow!("no child session {id}"))?,
        };
        let fact: ChildFact = store
            .register(FACT, FACT_KEY)
            .ok_or_else(|| anyhow!("child session {id} has no `subagent` fact"))?
            .parse()
            .with_context(|| format!("child session {id}: unreadable `subagent` fact"))?;
        let cwd = PathBuf::from(&store.header().cwd);
        let provider =
            crate::wiring::provider_for(ctx, &fact.provider, fact.model.as_deref(), fact.script.as_deref(), &cwd)?;
        let allow = Allowlist::parse(fact.allow.iter().map(String::as_str)).context("child allow patterns")?;
        let approver = authority.policy(allow);
        // The tools as the parent's face was equipped with them (the tool
        // service's when one is configured), only those the child was
        // given; a tool the registry refuses here (Destructive, headless) is
        // simply not offered, as for the parent.
        let mut given = crate::toolsrv::turn_tools(ctx, &cwd)?.chosen(None);
        given.tools.retain(|t| fact.tools.contains(&t.spec().name));
        {
            let scripted = is_scripted(ctx, &fact.provider);
            let scope = Scope {
                cwd: cwd.clone(),
                tools: fact.tools.clone(),
                allow: fact.allow.clone(),
                provider: fact.provider.clone(),
                model: fact.model.clone(),
                script: fact.script.clone(),
                scripted,
                authority: authority.clone(),
            };
            let may_spawn = fact.tools.iter().any(|t| t == SPAWN) && fact.depth < self.limits.max_depth;
            // Its own children live where it does.
            // Offered to the parent under the same rules: not refused.
            given.tools.extend(build(self, scope, Arc::clone(place), may_spawn));
        }
        let registry = given.registry(&approver, |_| {});
        let mut config = crate::wiring::session_config(ctx);
        config.lane = cairn_core::turn::DEFAULT_LANE.to_owned();
        let mut session = Session::open(store, config)?;
        let mut equipment = Equipment { tools: registry, approver };
        let outcome =
            equipment.run(&mut session, &*provider, Step::Once(&fact.prompt), &mut |_| {}, &place.cancel())?;
        let result = if let Some(o) = outcome.as_ref().filter(|o| o.stop == TurnStop::Stopped) {
            ChildResult::Failed(format!("a pre_tool hook stopped the child's turn: {}", o.text))
        } else if outcome.is_some_and(|o| o.stop == TurnStop::StepLimit) {
            ChildResult::Failed("the child reached its step limit".to_owned())
        } else {
            ChildResult::Answered(last_answer(&session))
        };
        place.ended(&mut session.into_store())?;
        Ok(result)
    }
}

fn last_answer<S: Storage>(session: &Session<S>) -> String {
    cairn_core::report::last_answer(&session.messages())
}

/// Whether the existing session `id` is its family's own child — the one
/// invariant that keeps a session under a child's name (imported, copied
/// in) from answering for the parent's call or being driven as its child.
/// A child is created only by [`Family::attach`], whose first record is the
/// child's `subagent` fact, made from the parent's record of the spawn (its
/// `spawn_agent` request: parent, invocation, depth, prompt, peers). So a
/// session is the family's own only when it holds that fact naming the
/// parent and call its id names, equal in those fields to `expected` (the
/// fact the call's request makes, when the caller has it), or — cut off
/// between the header and the fact — holds nothing at all; and, in a
/// database, when every line of it was written under a family's lease
/// ([`Place::written_by_a_family`]). `Err` says why not, and what to do.
fn own_child<P: Place + ?Sized>(
    place: &P,
    ctx: &Context,
    id: &str,
    store: &P::Store,
    expected: Option<&ChildFact>,
) -> Result<()> {
    let refuse = |why: String| {
        anyhow!(
            "session {} has a subagent's name but was not created by this call of its parent ({why}); it is not adopted — it was imported or copied in: remove it, then run the call again",
            id.escape_debug()
        )
    };
    match child_fact(store) {
        None if store.entry_count() == 0 && store.last_seq() == 0 => {}
        None => return Err(refuse("it holds records but no `subagent` fact".to_owned())),
        Some(fact) => {
            if child_id(&fact.parent, &fact.invocation) != id {
                return Err(refuse(format!(
                    "its `subagent` fact names call {} of {}",
                    fact.invocation.escape_debug(),
                    fact.parent.escape_debug()
                )));
            }
            if let Some(want) = expected {
                let same = fact.parent == want.parent
                    && fact.invocation == want.invocation
                    && fact.depth == want.depth
                    && fact.prompt == want.prompt
                    && fact.peers == want.peers;
                if !same {
                    return Err(refuse("its `subagent` fact is not the one the parent's request makes".to_owned()));
                }
            }
        }
    }
    if !place.written_by_a_family(ctx, id)? {
        return Err(refuse("some of its lines were not written under its family's lease".to_owned()));
    }
    Ok(())
}

/// A child's state as its store says (read, never written).
fn status<S: Storage>(ctx: &Context, store: S) -> Result<ChildStatus> {
    if store.entry_count() == 0 {
        return Ok(ChildStatus::NotStarted);
    }
    let mut config = crate::wiring::session_config(ctx);
    config.lane = cairn_core::turn::DEFAULT_LANE.to_owned();
    let session = Session::open(store, config)?;
    if session.needs_resume() {
        return Ok(ChildStatus::Unfinished);
    }
    Ok(ChildStatus::Finished(ChildResult::Answered(last_answer(&session))))
}

/// `usage …` for `cairn show`: the session's own tokens and its
/// descendants' (the ledgers summed by `cairn_core::ledger`).
pub fn usage_line<S: Storage>(ctx: &Context, store: &S) -> String {
    let own = UsageTotals::of(store);
    let family = FamilyUsage::of(&ctx.paths.sessions(), &store.header().id, ctx.settings.store_options());
    let children = &family.totals;
    let mut line = format!("usage: own {} in / {} out tokens ({} attempts)", own.input, own.output, own.attempts);
    if family.sessions > 0 {
        line.push_str(&format!(
            "; {} descendant sessions {} in / {} out ({} attempts); total {} in / {} out",
            family.sessions,
            children.input,
            children.output,
            children.attempts,
            own.input + children.input,
            own.output + children.output
        ));
    }
    line
}

/// For `cairn show`: under a `spawn_agent` intent of session `parent`, the
/// child it names (and, indented, that child's own children): state,
/// tokens and answer.
pub fn child_lines(ctx: &Context, parent: &str, entry: cairn_core::storage::EntryView<'_>) -> Vec<String> {
    use cairn_core::events::{EntryPayload, ToolRequestedPayload};
    let mut lines = Vec::new();
    if entry.entry_type != ToolRequestedPayload::TYPE.tag() {
        return lines;
    }
    // Only a payload naming the tool (or with a `\u` escape, which could
    // spell it) can be a spawn: the others are not parsed a second time.
    if !entry.payload.contains(SPAWN) && !entry.payload.contains("\\u") {
        return lines;
    }
    let Ok(p) = entry.parse::<ToolRequestedPayload>() else {
        return lines;
    };
    if p.request.tool != SPAWN {
        return lines;
    }
    child_tree(ctx, &child_id(parent, &p.invocation_id), 0, &mut lines);
    lines
}

fn child_tree(ctx: &Context, id: &str, depth: usize, lines: &mut Vec<String>) {
    let pad = "   ".repeat(depth);
    let path = ctx.paths.sessions().join(format!("{id}.jsonl"));
    let Ok(store) = JsonlStore::open_read_only_with(&path, ctx.settings.store_options()) else {
        lines.push(format!("{pad}└─ child {id}: not created"));
        return;
    };
    let tokens = UsageTotals::of(&store);
    let mut grandchildren = Vec::new();
    store.visit_entries(&mut |e| {
        if let Some(p) = cairn_core::events::payload_of::<cairn_core::events::ToolRequestedPayload>(e)
            && p.request.tool == SPAWN
        {
            grandchildren.push(child_id(id, &p.invocation_id));
        }
    });
    let state = match status(ctx, store) {
        Ok(ChildStatus::NotStarted) => "not started".to_owned(),
        Ok(ChildStatus::Unfinished) => "interrupted (resumed by its parent)".to_owned(),
        Ok(ChildStatus::Finished(ChildResult::Answered(a))) => {
            format!("answered: {}", crate::escape::short(a.trim(), 80))
        }
        Ok(ChildStatus::Finished(ChildResult::Failed(why))) => format!("failed: {why}"),
        Err(e) => format!("unreadable: {e:#}"),
    };
    lines.push(format!("{pad}└─ child {id} — {} in / {} out tokens — {state}", tokens.input, tokens.output));
    for grandchild in grandchildren {
        child_tree(ctx, &grandchild, depth + 1, lines);
    }
}
