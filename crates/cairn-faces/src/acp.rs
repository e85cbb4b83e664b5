//! `cairn acp`: an Agent Client Protocol agent over stdio, for editors.
//!
//! Threads. The reader owns stdin: it answers lines that are not
//! messages, routes responses to the requests this agent sent (permission
//! questions, the editor's file access), and handles `session/cancel`
//! itself — so a cancel reaches a turn that is blocked in the provider, a
//! tool or a permission question. Every other message goes, in order, to
//! the main thread, which answers `initialize` and `session/new` and hands
//! each session's prompts and loads, in order, to that session's own
//! thread (which owns the session and its provider, and runs its whole
//! turn, streaming `session/update` notifications as the core tells
//! events, each after the line holding it is committed). So sessions run
//! at once, and one session's turn never holds up another's requests.
//!
//! Sessions are cairn sessions: `session/new` creates a session file in the
//! client's cwd, `session/load` opens one by id and replays its lane as
//! updates, `session/cancel` cancels the running turn through the core
//! (settled durably, resumable: a later prompt `/resume` continues it; any
//! other prompt starts a new turn, the core settling the cancelled turn's
//! unrun calls as rejected). Approvals are the core's: Write calls no
//! allow rule covers, and every Destructive call, become
//! `session/request_permission` (allow once, allow always for Write only,
//! reject). When the client offers `fs/read_text_file`/`fs/write_text_file`,
//! `read_file` and `write_file` go through it (`client_fs`), so the model
//! sees unsaved buffers and writes land in the editor. This module must not
//! run tools or decide approvals itself.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};

use anyhow::Result;
use cairn_core::approval::{Answer, ApprovalError, ApprovalRequest, Approver, SharedApprover, Verdict};
use cairn_core::events::{
    EntryType, ToolCompletedPayload, ToolFailedPayload, ToolRejectedPayload, ToolRequestedPayload,
};
use cairn_core::message::{ContentPart, Message, Role};
use cairn_core::provider::{Provider, StreamEvent};
use cairn_core::storage::{JsonlStore, Storage};
use cairn_core::tool::{Preview, Risk};
use cairn_core::turn::Phase;
use cairn_core::{CancelToken, Reopen, Session, SessionConfig, ToolRegistry, TurnError, TurnEvent, TurnStop};
use cairn_host::{Equipment, Step};
use serde_json::{Value, json};

mod client_fs;
mod modes;
mod terminal;

use modes::{MODEL_OPTION, Mode, ModeApprover, Settings, SharedMode};

use crate::Host;
use crate::jsonrpc::{self, Id, Incoming, Line, LineReader, MAX_MESSAGE_BYTES, Out, RpcError};

/// The ACP protocol version this agent speaks.
pub const PROTOCOL_VERSION: u64 = 1;

/// The most of a running command's output shown while it runs (its tail).
const STREAMED_TAIL: usize = 16 * 1024;

/// Built-in tools whose output is not streamed while they run.
const FILE_TOOLS: [&str; 5] = ["read_file", "write_file", "edit_file", "list_dir", "search"];

/// The prompt that continues a cancelled or interrupted turn.
pub const RESUME_COMMAND: &str = "/resume";

/// The prompt that compacts the conversation now.
pub const COMPACT_COMMAND: &str = "/compact";

/// The prompt that tells the session's token usage.
pub const USAGE_COMMAND: &str = "/usage";

/// An answer to a request this agent sent.
#[derive(Debug)]
enum Reply {
    Result(Value),
    Error(Value),
    /// The session's prompt was cancelled while the question was open.
    Cancelled,
}

/// What the reader thread and the main thread share.
struct Shared {
    out: Out,
    next_id: AtomicU64,
    /// Our open requests: id → (session, where the answer goes).
    pending: Mutex<HashMap<u64, (String, Sender<Reply>)>>,
    /// The cancel tokens of each session's prompts read since its last
    /// cancel (running or queued; finished ones are harmless to cancel).
    cancels: Mutex<HashMap<String, Vec<CancelToken>>>,
    /// The input is closed: nobody will answer a question any more.
    eof: AtomicBool,
    /// The client offers form elicitation (`clientCapabilities.elicitation
    /// .form`): an MCP server's question is put to the person there.
    elicitation: AtomicBool,
    /// The client offers URL elicitation (`clientCapabilities.elicitation
    /// .url`): a server's request to open a URL is put to the person there.
    elicitation_url: AtomicBool,
    /// The person allowed the editor's terminal (`Options`) and the client
    /// offers it (`clientCapabilities.terminal`): `shell` runs there, each
    /// call asked (`terminal.rs`).
    terminal: AtomicBool,
    /// Calls running (or just run) in an editor's terminal, by invocation:
    /// their tool call shows the terminal (embedded by `terminal.rs`), so
    /// their output is not sent again as text, and their completion
    /// leaves the terminal shown.
    in_terminal: Mutex<std::collections::HashSet<String>>,
    /// What the person chose when starting the server.
    options: Options,
}

/// What the person chose when starting `cairn acp`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Run `shell` in the editor's terminal when the editor offers one.
    /// Off by default: that terminal is outside cairn's sandbox (no
    /// Landlock, staging or undo), and an editor such as Zed offers it to
    /// every agent, so offering it must not be enough to leave the sandbox.
    pub editor_terminal: bool,
}

impl Shared {
    fn notify(&self, session_id: &str, update: Value) {
        let _ =
            self.out.send(&jsonrpc::notification("session/update", json!({"sessionId": session_id, "update": update})));
    }

    /// Send a request to the client and wait for its answer, or until
    /// `cancel` (a tool's own token: timeout or cancel) is set.
    fn ask_until(
        &self,
        session_id: &str,
        method: &str,
        params: Value,
        cancel: Option<&CancelToken>,
    ) -> Result<Reply, String> {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = mpsc::channel();
        if let Ok(mut pending) = self.pending.lock() {
            pending.insert(id, (session_id.to_owned(), tx));
        }
        // Checked after the insert: the reader sets `eof` before it drops
        // every pending question, so one of the two sees the other.
        if self.eof.load(Ordering::SeqCst) {
            if let Ok(mut pending) = self.pending.lock() {
                pending.remove(&id);
            }
            return Err("the client closed its input; nobody can answer".to_owned());
        }
        self.out.send(&jsonrpc::request(id, method, params)).map_err(|e| format!("cannot write to the client: {e}"))?;
        let gone = || "the client closed the connection before answering".to_owned();
        let Some(cancel) = cancel else { return rx.recv().map_err(|_| gone()) };
        loop {
            match rx.recv_timeout(std::time::Duration::from_millis(20)) {
                Ok(reply) => return Ok(reply),
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(gone()),
                Err(mpsc::RecvTimeoutError::Timeout) if cancel.is_cancelled() => {
                    if let Ok(mut pending) = self.pending.lock() {
                        pending.remove(&id);
                    }
                    return Ok(Reply::Cancelled);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        }
    }
}

/// Work for the main thread.
enum Work {
    Request { id: Id, method: String, params: Value, cancel: Option<CancelToken> },
}

/// Serve ACP on `input`/`out` until the input closes and every request
/// read before is answered.
pub fn serve(host: &dyn Host, input: impl BufRead + Send + 'static, out: Out, options: Options) -> Result<()> {
    let shared = Arc::new(Shared {
        out,
        next_id: AtomicU64::new(0),
        pending: Mutex::new(HashMap::new()),
        cancels: Mutex::new(HashMap::new()),
        eof: AtomicBool::new(false),
        elicitation: AtomicBool::new(false),
        elicitation_url: AtomicBool::new(false),
        terminal: AtomicBool::new(false),
        in_terminal: Mutex::new(std::collections::HashSet::new()),
        options,
    });
    let (tx, rx) = mpsc::channel();
    let reader_shared = Arc::clone(&shared);
    std::thread::spawn(move || read_loop(input, &reader_shared, &tx));
    main_loop(host, &shared, &rx);
    Ok(())
}

fn read_loop(input: impl BufRead, shared: &Shared, work: &Sender<Work>) {
    let mut reader = LineReader::new(input, MAX_MESSAGE_BYTES);
    loop {
        let line = match reader.next_line() {
            Ok(Line::Eof) | Err(_) => break,
            Ok(line) => line,
        };
        let bytes = match &line {
            Line::Message(bytes) => bytes,
            _ => {
                if let Some(answer) = jsonrpc::refusal(&line) {
                    let _ = shared.out.send(&answer);
                }
                continue;
            }
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match Incoming::parse(bytes) {
            Err((id, error)) => {
                let _ = shared.out.send(&jsonrpc::error_response(&id, &error));
            }
            Ok(Incoming::Response { id, result }) => {
                let waiting = id.as_u64().and_then(|id| shared.pending.lock().ok()?.remove(&id));
                if let Some((_, tx)) = waiting {
                    let _ = tx.send(match result {
                        Ok(v) => Reply::Result(v),
                        Err(e) => Reply::Error(e),
                    });
                }
            }
            Ok(Incoming::Notification { method, params }) if method == "session/cancel" => {
                let Some(session_id) = params.get("sessionId").and_then(Value::as_str) else { continue };
                let tokens = shared.cancels.lock().ok().and_then(|mut c| c.remove(session_id)).unwrap_or_default();
                for token in tokens {
                    token.cancel();
                }
                // Open questions of that session are answered "cancelled",
                // whether or not the client answers them itself.
                if let Ok(mut pending) = shared.pending.lock() {
                    let ids: Vec<u64> =
                        pending.iter().filter(|(_, (s, _))| s == session_id).map(|(id, _)| *id).collect();
                    for id in ids {
                        if let Some((_, tx)) = pending.remove(&id) {
                            let _ = tx.send(Reply::Cancelled);
                        }
                    }
                }
            }
            // Other notifications carry nothing this agent acts on.
            Ok(Incoming::Notification { .. }) => {}
            Ok(Incoming::Request { id, method, params }) => {
                // The token exists from the moment the prompt is read, so a
                // cancel right behind it on the wire is never lost.
                let cancel = (method == "session/prompt")
                    .then(|| params.get("sessionId").and_then(Value::as_str))
                    .flatten()
                    .map(|sid| {
                        let token = CancelToken::new();
                        if let Ok(mut cancels) = shared.cancels.lock() {
                            cancels.entry(sid.to_owned()).or_default().push(token.clone());
                        }
                        token
                    });
                if work.send(Work::Request { id, method, params, cancel }).is_err() {
                    break;
                }
            }
        }
    }
    // EOF: the client is gone. Turns running or queued are cancelled (saved
    // and resumable, like an editor's cancel) rather than left to run with
    // nobody to see them or answer their questions; open questions fail.
    shared.eof.store(true, Ordering::SeqCst);
    if let Ok(cancels) = shared.cancels.lock() {
        for token in cancels.values().flatten() {
            token.cancel();
        }
    }
    if let Ok(mut pending) = shared.pending.lock() {
        pending.clear();
    }
}

/// One open session, owned by its own thread.
struct Open {
    /// `None` only while a turn is re-equipped (`equip`).
    session: Option<Session<JsonlStore>>,
    /// The tools of the current turn and who answers their calls.
    equipment: Equipment<ModeApprover>,
    cwd: PathBuf,
    /// Who answers for the session and its children (the editor).
    person: SharedApprover,
    /// The editor's file access: (reads, writes).
    client_fs: (bool, bool),
    /// The tools of the MCP servers the editor gave, started once for the
    /// session and offered with every turn's choice.
    client_tools: Vec<Arc<dyn cairn_core::tool::Tool>>,
    /// Built at the first prompt (a missing key fails that prompt, not
    /// session/new) and again when the editor chooses another; one per
    /// session, so sessions run at once. With the name it was built for.
    provider: Option<(String, Box<dyn Provider + Send>)>,
    /// The title last told the editor (`session_info_update`).
    title: Option<String>,
}

impl Open {
    fn session(&mut self) -> Result<&mut Session<JsonlStore>, RpcError> {
        self.session.as_mut().ok_or_else(|| RpcError::internal("the session could not be reopened; load it again"))
    }
}

/// Work for a session's thread, in the order it was read.
enum Job {
    Prompt {
        id: Id,
        params: Value,
        cancel: CancelToken,
    },
    /// session/load of a session already open: replay it, then answer.
    Load {
        id: Id,
    },
}

struct Agent<'h> {
    host: &'h dyn Host,
    shared: Arc<Shared>,
    /// Each open session's thread and settings.
    sessions: HashMap<String, (Sender<Job>, Settings)>,
    initialized: bool,
    /// The client offers fs/read_text_file and fs/write_text_file.
    client_fs: (bool, bool),
    /// Updates to send once the current request is answered.
    after: Vec<(String, Value)>,
}

/// The main thread answers everything but prompts and loads, which go to
/// their session's thread: a turn of one session never holds up a request
/// for another (or `session/new`). Returns once the input closed and every
/// session's thread finished what it was given.
fn main_loop(host: &dyn Host, shared: &Arc<Shared>, work: &Receiver<Work>) {
    std::thread::scope(|scope| {
        let mut agent = Agent {
            host,
            shared: Arc::clone(shared),
            sessions: HashMap::new(),
            initialized: false,
            client_fs: (false, false),
            after: Vec::new(),
        };
        while let Ok(Work::Request { id, method, params, cancel }) = work.recv() {
            let answer = match agent.handle(scope, &id, &method, &params, cancel) {
                Ok(None) => continue,
                Ok(Some(result)) => jsonrpc::response(&id, result),
                Err(error) => jsonrpc::error_response(&id, &error),
            };
            if shared.out.send(&answer).is_err() {
                break;
            }
            for (sid, update) in agent.after.drain(..) {
                shared.notify(&sid, update);
            }
        }
        // Dropping the senders lets each session's thread finish its queue.
    });
}

fn str_param<'a>(params: &'a Value, key: &str) -> Result<&'a str, RpcError> {
    params.get(key).and_then(Value::as_str).ok_or_else(|| RpcError::params(format!("missing string parameter {key:?}")))
}

impl<'h> Agent<'h> {
    /// Answer a request (`Some`), or hand it to a session's thread, which
    /// answers it (`None`).
    fn handle<'s>(
        &mut self,
        scope: &'s std::thread::Scope<'s, '_>,
        id: &Id,
        method: &str,
        params: &Value,
        cancel: Option<CancelToken>,
    ) -> Result<Option<Value>, RpcError>
    where
        'h: 's,
    {
        match method {
            "initialize" => self.initialize(params).map(Some),
            _ if !self.initialized => Err(RpcError::new(
                jsonrpc::code::INVALID_REQUEST,
                "the agent is not initialized: send initialize first",
            )),
            "authenticate" => Ok(Some(json!({}))),
            "session/new" => self.new_session(scope, params).map(Some),
            "session/load" => self.load_session(scope, id, params).map(|()| None),
            "session/list" => self.list_sessions(params).map(Some),
            "session/prompt" => {
                let sid = str_param(params, "sessionId")?;
                let Some((thread, _)) = self.sessions.get(sid) else {
                    return Err(RpcError::params(format!(
                        "unknown session {sid:?}: create one with session/new or open it with session/load"
                    )));
                };
                let job = Job::Prompt { id: id.clone(), params: params.clone(), cancel: cancel.unwrap_or_default() };
                thread.send(job).map_err(|_| RpcError::internal(format!("session {sid:?} is closed")))?;
                Ok(None)
            }
            "session/set_mode" => {
                let sid = str_param(params, "sessionId")?;
                let mode = Mode::parse(str_param(params, "modeId")?).map_err(RpcError::params)?;
                let Some((_, settings)) = self.sessions.get(sid) else {
                    return Err(RpcError::params(format!(
                        "unknown session {sid:?}: create one with session/new or open it with session/load"
                    )));
                };
                settings.mode.set(mode);
                self.after.push((
                    sid.to_owned(),
                    json!({"sessionUpdate": "current_mode_update", "currentModeId": mode.id()}),
                ));
                Ok(Some(json!({})))
            }
            "session/set_config_option" => {
                let sid = str_param(params, "sessionId")?;
                let Some((_, settings)) = self.sessions.get(sid) else {
                    return Err(RpcError::params(format!(
                        "unknown session {sid:?}: create one with session/new or open it with session/load"
                    )));
                };
                let config = str_param(params, "configId")?;
                if config != MODEL_OPTION {
                    return Err(RpcError::params(format!(
                        "unknown configuration option {config:?}: cairn has {MODEL_OPTION:?} (modes are set with session/set_mode)"
                    )));
                }
                let value = str_param(params, "value")?;
                settings.choose_provider(value).map_err(RpcError::params)?;
                Ok(Some(json!({"configOptions": settings.config_options()})))
            }
            other => Err(RpcError::no_method(other, "ACP")),
        }
    }

    /// `session/list`: every session (of `cwd`, when given), most recently
    /// changed first, with its title (its name, else its first prompt's
    /// first line) and when it changed. One page: no cursor is issued.
    fn list_sessions(&self, params: &Value) -> Result<Value, RpcError> {
        if params.get("cursor").is_some_and(|c| !c.is_null()) {
            return Err(RpcError::params("cairn answers session/list in one page and issued no cursor"));
        }
        let cwd = match params.get("cwd") {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) if Path::new(c).is_absolute() => {
                Some(Path::new(c).canonicalize().unwrap_or_else(|_| PathBuf::from(c)))
            }
            Some(other) => return Err(RpcError::params(format!("cwd {other} must be an absolute path"))),
        };
        let listed = self.host.list_sessions().map_err(|e| RpcError::internal(format!("{e:#}")))?;
        let sessions: Vec<Value> = listed
            .into_iter()
            .filter(|s| cwd.as_deref().is_none_or(|c| Path::new(&s.cwd) == c))
            .map(|s| {
                let title = s.name.clone().or_else(|| title_in_file(&s.path));
                let mut info = json!({"sessionId": s.id, "cwd": s.cwd, "updatedAt": iso8601(s.modified)});
                if let Some(title) = title {
                    info["title"] = json!(title);
                }
                info
            })
            .collect();
        Ok(json!({"sessions": sessions}))
    }

    fn initialize(&mut self, params: &Value) -> Result<Value, RpcError> {
        if params.get("protocolVersion").and_then(Value::as_u64).is_none() {
            return Err(RpcError::params("initialize needs an integer protocolVersion (this agent speaks 1)"));
        }
        self.initialized = true;
        let fs = params.pointer("/clientCapabilities/fs");
        let offers = |key: &str| fs.and_then(|f| f.get(key)).and_then(Value::as_bool).unwrap_or(false);
        self.client_fs = (offers("readTextFile"), offers("writeTextFile"));
        let form = params.pointer("/clientCapabilities/elicitation/form").is_some_and(Value::is_object);
        self.shared.elicitation.store(form, Ordering::SeqCst);
        let url = params.pointer("/clientCapabilities/elicitation/url").is_some_and(Value::is_object);
        self.shared.elicitation_url.store(url, Ordering::SeqCst);
        let offered = params.pointer("/clientCapabilities/terminal").and_then(Value::as_bool) == Some(true);
        self.shared.terminal.store(offered && self.shared.options.editor_terminal, Ordering::SeqCst);
        // Images when the configured provider's model takes them (a
        // session whose editor picks another model is checked at its
        // prompt).
        let images = self.host.accepts_images(&self.host.providers().current);
        // One version exists; a client asking for another gets ours and
        // decides whether it can go on.
        Ok(json!({
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": true,
                "promptCapabilities": {"image": images, "audio": false, "embeddedContext": true},
                "mcpCapabilities": {"http": true, "sse": false},
                "sessionCapabilities": {"list": {}},
            },
            "authMethods": [],
            "agentInfo": {"name": "cairn", "title": "cairn", "version": env!("CARGO_PKG_VERSION")},
        }))
    }

    /// Start the thread of the session in `store`; once it has opened the
    /// session (or failed to).
    fn spawn<'s>(
        &mut self,
        scope: &'s std::thread::Scope<'s, '_>,
        store: JsonlStore,
        servers: Vec<crate::ClientMcpServer>,
    ) -> Result<String, RpcError>
    where
        'h: 's,
    {
        let id = store.header().id.clone();
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let (jobs_tx, jobs_rx) = mpsc::channel();
        let (host, shared, client_fs) = (self.host, Arc::clone(&self.shared), self.client_fs);
        let settings = Settings::new(self.host.providers());
        let thread_settings = settings.clone();
        std::thread::Builder::new()
            .name(format!("acp-{id}"))
            .spawn_scoped(scope, move || {
                session_thread(host, &shared, client_fs, store, &servers, thread_settings, &ready_tx, &jobs_rx);
            })
            .map_err(|e| RpcError::internal(format!("cannot start the session's thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(())) => {
                self.sessions.insert(id.clone(), (jobs_tx, settings));
                Ok(id)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(RpcError::internal("the session's thread stopped before opening it")),
        }
    }

    fn new_session<'s>(&mut self, scope: &'s std::thread::Scope<'s, '_>, params: &Value) -> Result<Value, RpcError>
    where
        'h: 's,
    {
        let cwd = Path::new(str_param(params, "cwd")?);
        if !cwd.is_absolute() {
            return Err(RpcError::params(format!("cwd {} must be an absolute path", cwd.display())));
        }
        let cwd = cwd
            .canonicalize()
            .ok()
            .filter(|c| c.is_dir())
            .ok_or_else(|| RpcError::params(format!("cwd {} is not an existing directory", cwd.display())))?;
        let servers = mcp_servers(params)?;
        let store = self.host.create_session(&cwd).map_err(|e| RpcError::internal(format!("{e:#}")))?;
        let id = self.spawn(scope, store, servers)?;
        self.after.push((id.clone(), commands_update()));
        let (modes, options) =
            self.sessions.get(&id).map(|(_, s)| (s.mode.state(), s.config_options())).unwrap_or_default();
        Ok(json!({"sessionId": id, "modes": modes, "configOptions": options}))
    }

    fn load_session<'s>(
        &mut self,
        scope: &'s std::thread::Scope<'s, '_>,
        id: &Id,
        params: &Value,
    ) -> Result<(), RpcError>
    where
        'h: 's,
    {
        let wanted = str_param(params, "sessionId")?;
        let servers = mcp_servers(params)?;
        if !self.sessions.contains_key(wanted) {
            let store = self.host.open_session(wanted).map_err(|e| RpcError::params(format!("{e:#}")))?;
            if store.header().id != wanted {
                return Err(RpcError::params(format!(
                    "session file {wanted} declares the id {}; load it by that id",
                    store.header().id
                )));
            }
            self.spawn(scope, store, servers)?;
        }
        let (thread, _) = self.sessions.get(wanted).ok_or_else(|| RpcError::internal("the session vanished"))?;
        thread
            .send(Job::Load { id: id.clone() })
            .map_err(|_| RpcError::internal(format!("session {wanted:?} is closed")))
    }
}

/// The `mcpServers` of a `session/new` or `session/load` (absent: none):
/// stdio (`command`, `args`, `env: [{name, value}]`) and `http` servers;
/// `sse` is refused with the reason (deprecated by MCP; cairn speaks
/// streamable HTTP).
fn mcp_servers(params: &Value) -> Result<Vec<crate::ClientMcpServer>, RpcError> {
    let Some(list) = params.get("mcpServers") else {
        return Ok(Vec::new());
    };
    let list = list.as_array().ok_or_else(|| RpcError::params("mcpServers must be an array"))?;
    let pairs = |v: Option<&Value>, what: &str| -> Result<Vec<(String, String)>, RpcError> {
        v.map_or(Ok(Vec::new()), |v| {
            v.as_array()
                .ok_or_else(|| RpcError::params(format!("{what} must be an array of {{name, value}}")))?
                .iter()
                .map(|p| match (p.get("name").and_then(Value::as_str), p.get("value").and_then(Value::as_str)) {
                    (Some(n), Some(v)) => Ok((n.to_owned(), v.to_owned())),
                    _ => Err(RpcError::params(format!("each of {what} needs a string name and value"))),
                })
                .collect()
        })
    };
    list.iter()
        .map(|server| {
            let name = server
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| RpcError::params("each MCP server needs a name"))?
                .to_owned();
            let kind = server.get("type").and_then(Value::as_str).unwrap_or("stdio");
            let transport = match kind {
                "stdio" => crate::ClientMcpTransport::Stdio {
                    command: server
                        .get("command")
                        .and_then(Value::as_str)
                        .ok_or_else(|| RpcError::params(format!("MCP server {name}: a stdio server needs a command")))?
                        .to_owned(),
                    args: server
                        .get("args")
                        .and_then(Value::as_array)
                        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                        .unwrap_or_default(),
                    env: pairs(server.get("env"), "env")?,
                },
                "http" => crate::ClientMcpTransport::Http {
                    url: server
                        .get("url")
                        .and_then(Value::as_str)
                        .ok_or_else(|| RpcError::params(format!("MCP server {name}: an http server needs a url")))?
                        .to_owned(),
                    headers: pairs(server.get("headers"), "headers")?,
                },
                other => {
                    return Err(RpcError::params(format!(
                        "MCP server {name}: transport {other:?} is not supported (cairn takes stdio and http)"
                    )));
                }
            };
            Ok(crate::ClientMcpServer { name, transport })
        })
        .collect()
}

/// Open `store` as a session of this agent: its approver, the editor's
/// MCP servers, then its tools for the interrupted turn if any (`equip`),
/// the core session.
fn open_session(
    host: &dyn Host,
    shared: &Arc<Shared>,
    client_fs: (bool, bool),
    store: JsonlStore,
    servers: &[crate::ClientMcpServer],
    mode: SharedMode,
) -> Result<Open, RpcError> {
    let cwd = PathBuf::from(&store.header().cwd);
    // The person behind the editor's permission requests, shared with the
    // children the session spawns.
    let person = SharedApprover::new(Box::new(PermissionAsker {
        shared: Arc::clone(shared),
        session_id: store.header().id.clone(),
        editor_reads: client_fs.0,
        mode: mode.clone(),
    }));
    // The approver first: the registry offers what it can answer.
    let inner = host.policy(Some(Box::new(person.clone()))).map_err(|e| RpcError::internal(format!("{e:#}")))?;
    let approver = ModeApprover { inner, mode };
    // The editor's own MCP servers for this session, after cairn's tools
    // (a name already taken stays cairn's).
    let mut client_tools = Vec::new();
    if !servers.is_empty() {
        let taken = host
            .tools(&cwd, &approver.inner, Some(&person))
            .map_err(|e| RpcError::internal(format!("{e:#}")))?
            .tools
            .iter()
            .map(|t| t.spec().name.clone())
            .collect::<Vec<_>>();
        let client = host.client_mcp_tools(&cwd, servers, &taken).map_err(|e| RpcError::internal(format!("{e:#}")))?;
        client_tools = client.tools;
        for note in client.notes {
            eprintln!("cairn acp: {note}");
        }
    }
    let mut open = Open {
        session: None,
        equipment: Equipment { tools: ToolRegistry::new(&approver), approver },
        cwd,
        person,
        client_fs,
        client_tools,
        provider: None,
        title: None,
    };
    equip(host, shared, &mut open, Opening::Fresh(Box::new(store)), None)?;
    Ok(open)
}

/// Equip the turn of the session in `store` (the host's tools, chosen for
/// `prompt`, or as recorded for the interrupted turn when `None`; the
/// editor's MCP servers' tools), then open it into `open`. File tools go
/// through the editor where it offers file access.
fn equip(
    host: &dyn Host,
    shared: &Arc<Shared>,
    open: &mut Open,
    mut opening: Opening,
    prompt: Option<&str>,
) -> Result<(), RpcError> {
    let session_id = opening.store_mut().header().id.clone();
    let (mut equipped, config) =
        match host.turn(&open.cwd, opening.store_mut(), prompt, &open.equipment.approver.inner, Some(&open.person)) {
            Ok(equipped) => equipped,
            Err(e) => {
                // The session stays open with what it was equipped with.
                open.session = opening.into_session(host.session_config()).ok();
                return Err(RpcError::internal(format!("{e:#}")));
            }
        };
    // The editor's MCP servers' tools after cairn's; the file tools through
    // the editor where it offers file access.
    let client_fs = open.client_fs;
    let editor_terminal = shared.terminal.load(Ordering::SeqCst);
    let tools = std::mem::take(&mut equipped.tools).into_iter().chain(open.client_tools.iter().cloned());
    equipped.tools = tools
        .map(|tool| {
            if editor_terminal && tool.spec().name == "shell" {
                let wrapped = terminal::EditorTerminal::new(tool, Arc::clone(shared), session_id.clone());
                return Arc::new(wrapped) as Arc<dyn cairn_core::tool::Tool>;
            }
            let op = match tool.spec().name.as_str() {
                "read_file" if client_fs.0 => Some(client_fs::Op::Read),
                "write_file" if client_fs.1 => Some(client_fs::Op::Write),
                "edit_file" if client_fs.0 && client_fs.1 => Some(client_fs::Op::Edit),
                _ => None,
            };
            match op {
                Some(op) => Arc::new(client_fs::ClientFile {
                    inner: tool,
                    op,
                    shared: Arc::clone(shared),
                    session_id: session_id.clone(),
                    reads: client_fs.0,
                    authority: host.authority(),
                }) as Arc<dyn cairn_core::tool::Tool>,
                None => tool,
            }
        })
        .collect();
    open.equipment.tools = equipped.into_registry(&open.equipment.approver, |note| eprintln!("cairn acp: {note}"));
    open.session =
        Some(opening.into_session(config).map_err(|e| RpcError::internal(format!("cannot open the session: {e}")))?);
    Ok(())
}

/// A session store on its way to being (re)opened by [`equip`].
enum Opening {
    /// Loaded from its file: the open checks the whole log.
    Fresh(Box<JsonlStore>),
    /// The session of the previous turn: its reopen skips the log check
    /// when only discovery's choice was added since (`Session::reopen`).
    Again(Box<Reopen<JsonlStore>>),
}

impl Opening {
    fn store_mut(&mut self) -> &mut JsonlStore {
        match self {
            Opening::Fresh(store) => store,
            Opening::Again(reopen) => reopen.store_mut(),
        }
    }

    fn into_session(self, config: SessionConfig) -> Result<Session<JsonlStore>, TurnError> {
        match self {
            Opening::Fresh(store) => Session::open(*store, config),
            Opening::Again(reopen) => Session::reopen(*reopen, config),
        }
    }
}

/// Re-equip the open session for a new turn on `prompt` (discovery's
/// choice for it is recorded before the turn's first entry).
fn equip_for(host: &dyn Host, shared: &Arc<Shared>, open: &mut Open, prompt: &str) -> Result<(), RpcError> {
    let Some(session) = open.session.take() else {
        return Err(RpcError::internal("the session could not be reopened; load it again"));
    };
    equip(host, shared, open, Opening::Again(Box::new(session.into_reopen())), Some(prompt))
}

/// A session's thread: opens it, then runs its prompts and loads one at a
/// time, answering each itself.
#[allow(clippy::too_many_arguments)]
fn session_thread(
    host: &dyn Host,
    shared: &Arc<Shared>,
    client_fs: (bool, bool),
    store: JsonlStore,
    servers: &[crate::ClientMcpServer],
    settings: Settings,
    ready: &mpsc::SyncSender<Result<(), RpcError>>,
    jobs: &Receiver<Job>,
) {
    let sid = store.header().id.clone();
    let mut open = match open_session(host, shared, client_fs, store, servers, settings.mode.clone()) {
        Ok(open) => open,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    if ready.send(Ok(())).is_err() {
        return;
    }
    while let Ok(job) = jobs.recv() {
        match job {
            Job::Prompt { id, params, cancel } => {
                let answer = match prompt(host, shared, &sid, &mut open, &settings, &params, &cancel) {
                    Ok(result) => jsonrpc::response(&id, result),
                    Err(error) => jsonrpc::error_response(&id, &error),
                };
                // The title and the context's fill, before the answer (an
                // editor reads the turn's updates until its answer).
                tell_title(shared, &sid, &mut open);
                tell_usage(shared, &sid, &open);
                let _ = shared.out.send(&answer);
            }
            Job::Load { id } => {
                replay(shared, &sid, &open);
                tell_title(shared, &sid, &mut open);
                let answer = json!({"modes": settings.mode.state(), "configOptions": settings.config_options()});
                let _ = shared.out.send(&jsonrpc::response(&id, answer));
                shared.notify(&sid, commands_update());
            }
        }
    }
}

fn prompt(
    host: &dyn Host,
    shared: &Arc<Shared>,
    sid: &str,
    open: &mut Open,
    settings: &Settings,
    params: &Value,
    cancel: &CancelToken,
) -> Result<Value, RpcError> {
    let (text, images) = prompt_content(params.get("prompt").unwrap_or(&Value::Null))?;
    // The client's trace, when it sends one (issue 51).
    cairn_telemetry::adopt_traceparent(sid, params.pointer("/_meta/traceparent").and_then(Value::as_str));
    let tell = |text: String| {
        shared.notify(sid, json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}));
    };
    // `/undo [N]`, `/redo`: the host's, never sent to the model; what
    // happened (a refusal included) is the agent's message.
    if let Some(request) = rewind_command(&text).filter(|_| images.is_empty()) {
        let message = match request {
            Ok(request) => {
                let cwd = open.cwd.clone();
                host.rewind(open.session()?, &cwd, request)
                    .map_or_else(|e| format!("{e:#}"), |done| done.text().to_owned())
            }
            Err(why) => why,
        };
        tell(message);
        return Ok(json!({"stopReason": "end_turn"}));
    }
    // An undo killed after its plan was committed is finished first.
    let cwd = open.cwd.clone();
    match host.finish_undo(open.session()?, &cwd) {
        Ok(Some(done)) => tell(format!("[{done}]\n")),
        Ok(None) => {}
        Err(e) => return Err(RpcError::internal(format!("{e:#}"))),
    }
    // The provider the editor chose (built again when it changed).
    let chosen = settings.provider();
    if open.provider.as_ref().is_none_or(|(name, _)| *name != chosen) {
        let provider = host.provider_named(&chosen, &open.cwd).map_err(|e| RpcError::internal(format!("{e:#}")))?;
        open.provider = Some((chosen, provider));
    }
    // Images only to a model that takes them; refused before anything is
    // recorded (the core refuses them too).
    if !images.is_empty()
        && let Some((name, provider)) = &open.provider
        && !provider.accepts_images()
    {
        return Err(RpcError::params(format!(
            "the session's model ({name}: {}) takes no images (promptCapabilities.image is false for it): choose a model that takes them, or send text",
            provider.model()
        )));
    }
    // Output of running tools so far, by invocation: a tool_call_update's
    // content replaces the last, so each streamed chunk sends the tail.
    // Only commands (shell, external tools) stream: a file tool's output is
    // whole in its completion.
    let mut streamed: HashMap<String, String> = HashMap::new();
    // `plan` calls are shown as the editor's plan, not as tool calls.
    let mut plans = PlanCalls::default();
    let mut observer = |event: &TurnEvent| {
        match plans.live(event) {
            Seen::Plan(update) => return shared.notify(sid, update),
            Seen::Hidden => return,
            Seen::Other => {}
        }
        if let TurnEvent::ToolRequested { invocation_id, tool, .. } = event
            && !FILE_TOOLS.contains(&tool.as_str())
        {
            streamed.insert(invocation_id.clone(), String::new());
        }
        if let TurnEvent::ToolOutput { invocation_id, chunk } = event {
            // The editor shows this call's terminal, live: not again as text.
            if shared.in_terminal.lock().is_ok_and(|t| t.contains(invocation_id)) {
                return;
            }
            let Some(so_far) = streamed.get_mut(invocation_id) else { return };
            so_far.push_str(chunk);
            if so_far.len() > STREAMED_TAIL {
                let mut cut = so_far.len() - STREAMED_TAIL;
                while !so_far.is_char_boundary(cut) {
                    cut += 1;
                }
                so_far.replace_range(..cut, "");
            }
            shared.notify(sid, tool_update(invocation_id, "in_progress", Some(so_far)));
            return;
        }
        if let TurnEvent::ToolCompleted { invocation_id, exit_code, .. } = event
            && shared.in_terminal.lock().is_ok_and(|mut t| t.remove(invocation_id))
        {
            // No content: the terminal stays shown (an editor keeps a
            // released terminal's output in the tool call).
            let status = if *exit_code == 0 { "completed" } else { "failed" };
            let mut update = tool_update(invocation_id, status, None);
            update["rawOutput"] = json!({"exitCode": exit_code});
            shared.notify(sid, update);
            return;
        }
        if let TurnEvent::ToolFailed { invocation_id, .. } = event
            && let Ok(mut t) = shared.in_terminal.lock()
        {
            // Its reason replaces the terminal (below).
            t.remove(invocation_id);
        }
        if let Some(update) = live_update(event, &cwd) {
            shared.notify(sid, update);
        }
    };
    let resume_only = text.trim() == RESUME_COMMAND && images.is_empty();
    let say = |text: String| {
        shared.notify(sid, json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}));
    };
    // The commands and the interrupted turn, with the tools the session
    // was equipped with for it; then a new turn, equipped for its prompt.
    let first = {
        let Open { session, equipment, provider, .. } = &mut *open;
        let session = session.as_mut().ok_or_else(|| RpcError::internal("the session is not open; load it again"))?;
        let provider = provider.as_ref().map(|(_, p)| &**p).ok_or_else(|| RpcError::internal("no provider"))?;
        match text.trim() {
            _ if !images.is_empty() => {}
            COMPACT_COMMAND => {
                let said = match equipment.compact(session, provider, &mut observer, cancel) {
                    Ok(Some(entry)) => format!("compacted the conversation (its summary is entry {entry})"),
                    Ok(None) => "nothing to compact yet".to_owned(),
                    Err(e) => return Err(RpcError::internal(format!("cannot compact: {e}"))),
                };
                say(said);
                return Ok(json!({"stopReason": "end_turn"}));
            }
            USAGE_COMMAND => {
                say(usage_text(session.store()));
                return Ok(json!({"stopReason": "end_turn"}));
            }
            _ => {}
        }
        // A crashed or failed turn is finished first (as `cairn chat`
        // does); a cancelled one only when asked, else a new prompt
        // replaces it. `Ok(Err(stop))`: the prompt's turn is not run.
        (|| -> Result<Result<(), Option<TurnStop>>, TurnError> {
            let mut last = None;
            if session.needs_resume() && (resume_only || session.pc().phase != Phase::Cancelled) {
                last = equipment.run(session, provider, Step::Resume, &mut observer, cancel)?.map(|o| o.stop);
                if last != Some(TurnStop::Answered) || resume_only {
                    return Ok(Err(last));
                }
            }
            if resume_only {
                return Ok(Err(last));
            }
            Ok(Ok(()))
        })()
    };
    let result = match first {
        Err(e) => Err(e),
        Ok(Err(stop)) => Ok(stop),
        Ok(Ok(())) => {
            equip_for(host, shared, open, &text)?;
            let Open { session, equipment, provider, .. } = &mut *open;
            let session =
                session.as_mut().ok_or_else(|| RpcError::internal("the session is not open; load it again"))?;
            let provider = provider.as_ref().map(|(_, p)| &**p).ok_or_else(|| RpcError::internal("no provider"))?;
            let step = if images.is_empty() { Step::Prompt(&text) } else { Step::PromptWithImages(&text, &images) };
            equipment.run(session, provider, step, &mut observer, cancel).map(|o| o.map(|o| o.stop))
        }
    };
    match result {
        Ok(stop) => {
            if stop.is_none() {
                shared.notify(
                    sid,
                    json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "nothing to resume in this session"}}),
                );
            }
            let reason = match stop {
                None | Some(TurnStop::Answered) => "end_turn",
                Some(TurnStop::StepLimit) => "max_turn_requests",
                Some(TurnStop::Cancelled) => "cancelled",
                // A hook ended the turn (Claude Code's `continue: false`).
                Some(TurnStop::Stopped) => "refusal",
            };
            Ok(json!({"stopReason": reason}))
        }
        Err(e) if cancel.is_cancelled() => {
            eprintln!("cairn acp: cancelled turn ended with: {e}");
            Ok(json!({"stopReason": "cancelled"}))
        }
        Err(e) => Err(RpcError::internal(format!("{e}; the turn is saved, send {RESUME_COMMAND} to continue it"))),
    }
}

/// The commands a person can type: `/resume` continues a cancelled or
/// interrupted turn; `/undo [N]` reverts the files and the conversation of
/// the last turn (or turn N on), `/redo` reapplies it.
fn commands_update() -> Value {
    let command =
        |name: &str, description: &str| json!({"name": name.trim_start_matches('/'), "description": description});
    json!({
        "sessionUpdate": "available_commands_update",
        "availableCommands": [
            command(RESUME_COMMAND, "continue the cancelled or interrupted turn of this session"),
            command(COMPACT_COMMAND, "summarise the conversation so far to free the model's context"),
            command(USAGE_COMMAND, "token totals of this session over every provider attempt"),
            json!({
                "name": "undo",
                "description": "revert the file changes of the last turn (or of turn N and later) and the conversation with them",
                "input": {"hint": "turn number (optional)"},
            }),
            command("/redo", "reapply what the last /undo reverted"),
        ],
    })
}

/// The longest title told an editor, in characters.
const MAX_TITLE: usize = 80;

/// A title from a session's first prompt: its first non-empty line, cut.
fn title_from(prompt: &str) -> Option<String> {
    let line = prompt.lines().map(str::trim).find(|l| !l.is_empty())?;
    let mut title: String = line.chars().take(MAX_TITLE).collect();
    if line.chars().count() > MAX_TITLE {
        title.push('…');
    }
    Some(title)
}

/// The text of the first user message of the session's current lane.
fn first_prompt(open: &Open) -> Option<String> {
    let session = open.session.as_ref()?;
    let path = session.store().path_to(session.head()?).ok()?;
    path.into_iter().find_map(|entry| {
        if EntryType::of(&entry.entry_type) != Some(EntryType::Message) {
            return None;
        }
        let message = entry.payload.parse::<Message>().ok()?;
        (message.role == Role::User).then(|| {
            message
                .content
                .iter()
                .filter_map(|p| match p {
                    ContentPart::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect::<String>()
        })
    })
}

/// The title of a session file not open here (`session/list`): the first
/// user message among its first lines, read without opening the session
/// (which would take its writer's lock).
fn title_in_file(path: &Path) -> Option<String> {
    use std::io::Read as _;
    // The first prompt is among the first entries; a bounded read keeps a
    // list of many long sessions cheap.
    let mut head = Vec::new();
    std::fs::File::open(path).ok()?.take(256 * 1024).read_to_end(&mut head).ok()?;
    let text = String::from_utf8_lossy(&head);
    // A line is one record or an array of records committed together.
    let records = text.lines().filter_map(|line| serde_json::from_str::<Value>(line).ok()).flat_map(|v| match v {
        Value::Array(batch) => batch,
        one => vec![one],
    });
    records.into_iter().find_map(|entry| {
        if entry.get("type").and_then(Value::as_str) != Some("message") {
            return None;
        }
        let message = serde_json::from_value::<Message>(entry.get("payload")?.clone()).ok()?;
        if message.role != Role::User {
            return None;
        }
        let text: String = message
            .content
            .iter()
            .filter_map(|p| match p {
                ContentPart::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        title_from(&text)
    })
}

/// Tell the editor the session's title (`session_info_update`) when it
/// has one it was not told yet.
fn tell_title(shared: &Shared, sid: &str, open: &mut Open) {
    let Some(title) = first_prompt(open).as_deref().and_then(title_from) else { return };
    if open.title.as_ref() == Some(&title) {
        return;
    }
    shared.notify(
        sid,
        json!({"sessionUpdate": "session_info_update", "title": title, "updatedAt": iso8601(std::time::SystemTime::now())}),
    );
    open.title = Some(title);
}

/// Tell the editor how full the model's context is (`usage_update`): the
/// input tokens of the last provider attempt against the provider's
/// context window. Not told when the window is unknown (ACP requires it).
fn tell_usage(shared: &Shared, sid: &str, open: &Open) {
    let Some((_, provider)) = &open.provider else { return };
    let Some(size) = provider.context_window() else { return };
    let Some(session) = &open.session else { return };
    let used = cairn_core::report::UsageTotals::of(session.store()).last_input;
    shared.notify(sid, json!({"sessionUpdate": "usage_update", "used": used, "size": size}));
}

/// `t` as ISO 8601 in UTC, to the second (`2026-12-07T18:20:00Z`).
fn iso8601(t: std::time::SystemTime) -> String {
    let secs = t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The `/usage` answer: token totals over the session's provider attempts.
fn usage_text(store: &JsonlStore) -> String {
    let u = cairn_core::report::UsageTotals::of(store);
    format!(
        "{} input tokens ({} cached), {} output tokens, {} in all, over {} provider attempts ({} failed)",
        u.input,
        u.cached,
        u.output,
        u.total(),
        u.attempts,
        u.failed
    )
}

/// `/undo`, `/undo N` or `/redo` (a usage message for a wrong form);
/// `None` for any other prompt.
fn rewind_command(text: &str) -> Option<Result<crate::Rewind, String>> {
    let mut words = text.split_whitespace();
    let command = words.next()?;
    let rest: Vec<&str> = words.collect();
    match (command, rest.as_slice()) {
        ("/undo", []) => Some(Ok(crate::Rewind::Undo(None))),
        ("/undo", [n]) => Some(
            n.parse::<usize>()
                .map(|n| crate::Rewind::Undo(Some(n)))
                .map_err(|_| format!("/undo takes a turn number (1 is the first turn), not {n:?}")),
        ),
        ("/redo", []) => Some(Ok(crate::Rewind::Redo)),
        ("/undo" | "/redo", _) => Some(Err("usage: /undo [N] or /redo".to_owned())),
        _ => None,
    }
}

/// The text of an ACP prompt (text blocks, resource links, embedded text
/// resources) and its images (checked: type, base64, the prompt's size
/// limit); other content is refused with what to do.
fn prompt_content(prompt: &Value) -> Result<(String, Vec<ContentPart>), RpcError> {
    let Some(blocks) = prompt.as_array() else {
        return Err(RpcError::params("prompt must be an array of content blocks"));
    };
    let mut text = String::new();
    let mut images = Vec::new();
    let mut image_bytes = 0;
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("image") => {
                let (Some(mime), Some(data)) =
                    (block.get("mimeType").and_then(Value::as_str), block.get("data").and_then(Value::as_str))
                else {
                    return Err(RpcError::params(
                        "an image block needs its mimeType and its data (base64); a uri alone is not fetched",
                    ));
                };
                let image = cairn_core::message::image(mime, data, image_bytes)
                    .map_err(|e| RpcError::params(format!("image {}: {e}", images.len() + 1)))?;
                if let ContentPart::Image { data, .. } = &image {
                    image_bytes += data.len();
                }
                images.push(image);
            }
            Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or_default()),
            Some("resource_link") => {
                let uri = block.get("uri").and_then(Value::as_str).unwrap_or_default();
                let name = block.get("name").and_then(Value::as_str).unwrap_or(uri);
                text.push_str(&format!("[{name}]({uri})"));
            }
            Some("resource") => {
                let uri = block.pointer("/resource/uri").and_then(Value::as_str).unwrap_or_default();
                match block.pointer("/resource/text").and_then(Value::as_str) {
                    Some(body) => text.push_str(&format!("\n<context uri=\"{uri}\">\n{body}\n</context>\n")),
                    None => {
                        return Err(RpcError::params(format!(
                            "resource {uri} has no text; cairn accepts text resources only"
                        )));
                    }
                }
            }
            Some(other) => {
                return Err(RpcError::params(format!(
                    "cairn does not accept {other} content (see promptCapabilities); send text"
                )));
            }
            None => return Err(RpcError::params("a content block needs a \"type\"")),
        }
    }
    if text.trim().is_empty() && images.is_empty() {
        return Err(RpcError::params("the prompt is empty"));
    }
    Ok((text, images))
}

/// The ACP tool kind of a cairn tool.
fn kind(tool: &str) -> &'static str {
    match tool {
        "read_file" | "list_dir" => "read",
        "search" | "grep" | "glob" => "search",
        "write_file" | "edit_file" => "edit",
        "shell" => "execute",
        _ => "other",
    }
}

/// A short title: the tool and its main argument.
fn title(tool: &str, arguments: &Value) -> String {
    let main = ["command", "path", "pattern"].iter().find_map(|k| arguments.get(*k).and_then(Value::as_str));
    match main {
        Some(m) => {
            let m: String = m.chars().take(120).collect();
            format!("{tool}: {m}")
        }
        None => tool.to_owned(),
    }
}

fn locations(arguments: &Value, cwd: &Path) -> Value {
    match arguments.get("path").and_then(Value::as_str) {
        Some(p) => json!([{"path": cwd.join(p)}]),
        None => json!([]),
    }
}

fn text_content(text: &str) -> Value {
    json!([{"type": "content", "content": {"type": "text", "text": text}}])
}

fn tool_call(id: &str, tool: &str, arguments: &Value, cwd: &Path) -> Value {
    json!({
        "sessionUpdate": "tool_call",
        "toolCallId": id,
        "title": title(tool, arguments),
        "kind": kind(tool),
        "status": "pending",
        "rawInput": arguments,
        "locations": locations(arguments, cwd),
    })
}

fn tool_update(id: &str, status: &str, text: Option<&str>) -> Value {
    let mut update = json!({"sessionUpdate": "tool_call_update", "toolCallId": id, "status": status});
    if let Some(text) = text {
        update["content"] = text_content(text);
    }
    update
}

/// The update telling a live [`TurnEvent`], if any. Tool calls are named by
/// cairn's invocation id (unique in the session, unlike model call ids).
fn live_update(event: &TurnEvent, cwd: &Path) -> Option<Value> {
    match event {
        TurnEvent::Delta { event: StreamEvent::TextDelta { text } } => {
            Some(json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}))
        }
        TurnEvent::Delta { event: StreamEvent::ReasoningDelta { text } } => {
            Some(json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": text}}))
        }
        TurnEvent::ToolRequested { invocation_id, tool, arguments, .. } => {
            Some(tool_call(invocation_id, tool, arguments, cwd))
        }
        TurnEvent::ToolStarted { invocation_id, .. } => Some(tool_update(invocation_id, "in_progress", None)),
        TurnEvent::ToolCompleted { invocation_id, exit_code, output_summary, .. } => {
            let status = if *exit_code == 0 { "completed" } else { "failed" };
            let mut update = tool_update(invocation_id, status, Some(output_summary));
            update["rawOutput"] = json!({"exitCode": exit_code});
            Some(update)
        }
        TurnEvent::ToolFailed { invocation_id, reason, .. } => Some(tool_update(invocation_id, "failed", Some(reason))),
        TurnEvent::ToolRejected { invocation_id, reason, .. } => {
            Some(tool_update(invocation_id, "failed", Some(reason)))
        }
        _ => None,
    }
}

/// What a turn event is to the editor, as far as `plan` calls go.
enum Seen {
    /// A plan was recorded: tell the editor (a `plan` update).
    Plan(Value),
    /// An event of a `plan` call: not shown as a tool call.
    Hidden,
    /// Not a `plan` call's.
    Other,
}

/// The `plan` calls of a turn (or a replayed lane) by invocation, with
/// the plan each sets: the editor is told the plan once the call
/// completed (a call refused by a hook or cancelled sets none).
#[derive(Default)]
struct PlanCalls(HashMap<String, Option<cairn_tools::builtin::plan::Plan>>);

impl PlanCalls {
    /// Note the call if it is a `plan` call (true).
    fn requested(&mut self, invocation_id: &str, tool: &str, arguments: &Value) -> bool {
        if tool != cairn_tools::builtin::plan::NAME {
            return false;
        }
        // Arguments the tool refuses set no plan (the call fails).
        let plan = cairn_tools::builtin::plan::Plan::from_arguments(arguments).ok();
        self.0.insert(invocation_id.to_owned(), plan);
        true
    }

    fn holds(&self, invocation_id: &str) -> bool {
        self.0.contains_key(invocation_id)
    }

    /// A `plan` call settled: its plan when it completed.
    fn settled(&mut self, invocation_id: &str, exit_code: Option<i32>) -> Seen {
        match self.0.remove(invocation_id) {
            Some(Some(plan)) if exit_code == Some(0) => Seen::Plan(plan_update(&plan)),
            _ => Seen::Hidden,
        }
    }

    fn live(&mut self, event: &TurnEvent) -> Seen {
        match event {
            TurnEvent::ToolRequested { invocation_id, tool, arguments, .. } => {
                if self.requested(invocation_id, tool, arguments) { Seen::Hidden } else { Seen::Other }
            }
            TurnEvent::ToolCompleted { invocation_id, exit_code, .. } if self.holds(invocation_id) => {
                self.settled(invocation_id, Some(*exit_code))
            }
            TurnEvent::ToolFailed { invocation_id, .. } | TurnEvent::ToolRejected { invocation_id, .. }
                if self.holds(invocation_id) =>
            {
                self.settled(invocation_id, None)
            }
            TurnEvent::ToolStarted { invocation_id, .. }
            | TurnEvent::ToolOutput { invocation_id, .. }
            | TurnEvent::ApprovalAsked { invocation_id, .. }
            | TurnEvent::ApprovalVerdict { invocation_id, .. }
                if self.holds(invocation_id) =>
            {
                Seen::Hidden
            }
            _ => Seen::Other,
        }
    }
}

/// The `plan` update telling the editor the whole plan.
fn plan_update(plan: &cairn_tools::builtin::plan::Plan) -> Value {
    json!({"sessionUpdate": "plan", "entries": plan.entries})
}

/// Replay the lane of a loaded session as the updates a live turn sends.
fn replay(shared: &Shared, sid: &str, open: &Open) {
    let Some(session) = &open.session else { return };
    let store = session.store();
    let Some(head) = session.head() else { return };
    let Ok(path) = store.path_to(head) else { return };
    let mut plans = PlanCalls::default();
    for entry in path {
        let Some(kind) = EntryType::of(&entry.entry_type) else { continue };
        let updates: Vec<Value> = match kind {
            EntryType::Message => {
                let Ok(message) = entry.payload.parse::<Message>() else { continue };
                let chunk = match message.role {
                    Role::User => "user_message_chunk",
                    _ => "agent_message_chunk",
                };
                message
                    .content
                    .iter()
                    .filter_map(|part| match part {
                        ContentPart::Text { text } if !text.is_empty() => {
                            Some(json!({"sessionUpdate": chunk, "content": {"type": "text", "text": text}}))
                        }
                        ContentPart::Reasoning { text, .. } if !text.is_empty() => Some(
                            json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": text}}),
                        ),
                        ContentPart::Image { mime_type, data } => Some(
                            json!({"sessionUpdate": chunk, "content": {"type": "image", "mimeType": mime_type, "data": data}}),
                        ),
                        _ => None,
                    })
                    .collect()
            }
            EntryType::ToolRequested => match entry.payload.parse::<ToolRequestedPayload>() {
                Ok(p) if plans.requested(&p.invocation_id, &p.request.tool, &p.request.arguments) => continue,
                Ok(p) => vec![tool_call(&p.invocation_id, &p.request.tool, &p.request.arguments, &open.cwd)],
                Err(_) => continue,
            },
            EntryType::ToolCompleted => match entry.payload.parse::<ToolCompletedPayload>() {
                Ok(p) if plans.holds(&p.invocation_id) => {
                    match plans.settled(&p.invocation_id, Some(p.receipt.exit_code)) {
                        Seen::Plan(update) => vec![update],
                        _ => continue,
                    }
                }
                Ok(p) => {
                    let status = if p.receipt.exit_code == 0 { "completed" } else { "failed" };
                    vec![tool_update(&p.invocation_id, status, Some(&p.receipt.output_summary))]
                }
                Err(_) => continue,
            },
            EntryType::ToolFailed => match entry.payload.parse::<ToolFailedPayload>() {
                Ok(p) if plans.holds(&p.invocation_id) => {
                    plans.settled(&p.invocation_id, None);
                    continue;
                }
                Ok(p) => vec![tool_update(&p.invocation_id, "failed", Some(&p.reason))],
                Err(_) => continue,
            },
            EntryType::ToolRejected => match entry.payload.parse::<ToolRejectedPayload>() {
                Ok(p) if plans.holds(&p.invocation_id) => {
                    plans.settled(&p.invocation_id, None);
                    continue;
                }
                Ok(p) => vec![tool_update(&p.invocation_id, "failed", Some(&p.reason))],
                Err(_) => continue,
            },
            _ => continue,
        };
        for update in updates {
            shared.notify(sid, update);
        }
    }
}

/// The interactive approver of an ACP session: asks the person in the
/// editor with `session/request_permission`.
struct PermissionAsker {
    shared: Arc<Shared>,
    session_id: String,
    /// The editor offers reads: the diff's old text is the editor's.
    editor_reads: bool,
    /// The session's mode: the person's, so the subagents that share this
    /// person are held by it too (plan mode holds for them).
    mode: SharedMode,
}

const ALLOW_ONCE: &str = "allow-once";
const ALLOW_ALWAYS: &str = "allow-always";
const REJECT: &str = "reject-once";

fn preview_text(preview: &Preview) -> String {
    match preview {
        Preview::Diff { path, diff } => format!("{path}\n{diff}"),
        Preview::Command { command, cwd } => format!("$ {command}\n(in {cwd})"),
        Preview::Paths { paths } => paths.iter().map(|p| format!("writes {p}")).collect::<Vec<_>>().join("\n"),
        Preview::Text { text } => text.clone(),
    }
}

/// Editors render a `diff` content as a diff view: the whole new file of a
/// `write_file` against what is on disk now (text up to 1 MiB, read only
/// inside the working directory), or the replaced text of an `edit_file`.
fn diff_content(request: &ApprovalRequest<'_>, editor: Option<(&Shared, &str)>) -> Option<Value> {
    let args = request.arguments;
    let given = args.get("path").and_then(Value::as_str)?;
    let path = cairn_tools::paths::resolve_in_cwd(request.cwd, given).ok()?;
    // With the editor's file access, the old text is the editor's (what
    // the model read and what the edit will change), not the disk's.
    if let Some((shared, sid)) = editor
        && matches!(request.tool, "write_file" | "edit_file")
    {
        let old = client_fs::editor_text(shared, sid, &path, None).ok();
        let new = match request.tool {
            "write_file" => args.get("content").and_then(Value::as_str)?.to_owned(),
            _ => {
                let call = cairn_core::tool::ToolRequest {
                    invocation_id: request.invocation_id.to_owned(),
                    call_id: String::new(),
                    session_id: sid.to_owned(),
                    tool: request.tool.to_owned(),
                    arguments: args.clone(),
                };
                let rel = cairn_tools::paths::display_rel(request.cwd, &path);
                cairn_tools::builtin::edit::edit_text(&call, old.as_deref()?, &rel).ok()?
            }
        };
        return Some(json!({"type": "diff", "path": path, "oldText": old, "newText": new}));
    }
    let (old, new) = match request.tool {
        "write_file" => {
            let new = args.get("content").and_then(Value::as_str)?;
            let old = std::fs::metadata(&path)
                .ok()
                .filter(|m| m.is_file() && m.len() <= 1024 * 1024)
                .and_then(|_| std::fs::read_to_string(&path).ok());
            (old, new.to_owned())
        }
        "edit_file" => {
            let old = args.get("old").and_then(Value::as_str)?;
            (Some(old.to_owned()), args.get("new").and_then(Value::as_str)?.to_owned())
        }
        _ => return None,
    };
    Some(json!({"type": "diff", "path": path, "oldText": old, "newText": new}))
}

impl Approver for PermissionAsker {
    fn is_interactive(&self) -> bool {
        true
    }

    fn mode(&self) -> cairn_core::approval::SessionMode {
        self.mode.get().session_mode()
    }

    fn elicit(&mut self, question: &cairn_core::elicit::Elicitation<'_>) -> cairn_core::elicit::ElicitAnswer {
        PermissionAsker::elicit(self, question)
    }

    fn decide(&mut self, request: &ApprovalRequest<'_>) -> Result<Verdict, ApprovalError> {
        // "Always" is offered for Write calls only: a Destructive call or a
        // sandbox bypass is asked every time (the core would refuse to
        // remember it anyway).
        let always = request.may_remember();
        let mut options = vec![json!({"optionId": ALLOW_ONCE, "name": "Allow once", "kind": "allow_once"})];
        if always {
            options.push(json!({"optionId": ALLOW_ALWAYS, "name": format!("Always allow {} in this session", request.tool), "kind": "allow_always"}));
        }
        options.push(json!({"optionId": REJECT, "name": "Reject", "kind": "reject_once"}));
        let mut shown = String::new();
        if request.risk == Risk::Destructive {
            shown.push_str("DESTRUCTIVE\n");
        }
        if let Some(bypass) = request.bypass {
            shown.push_str(&format!("sandbox bypass: {bypass}\n"));
        }
        if let Some(why) = request.why {
            shown.push_str(&format!("{why}\n"));
        }
        match request.preview {
            Some(preview) => shown.push_str(&preview_text(preview)),
            None => shown.push_str(&serde_json::to_string_pretty(request.arguments).unwrap_or_default()),
        }
        let mut content = text_content(&shown);
        let editor = self.editor_reads.then_some((&*self.shared, self.session_id.as_str()));
        if let (Some(diff), Some(items)) = (diff_content(request, editor), content.as_array_mut()) {
            items.insert(0, diff);
        }
        // A subagent's call is asked in its parent's session under an id of
        // its own (`i5+i3`), announced first: the editor never saw the
        // child's turn.
        let call_id = request.question_id(&self.session_id);
        let child = request.is_of_descendant(&self.session_id);
        if child {
            self.shared.notify(
                &self.session_id,
                json!({
                    "sessionUpdate": "tool_call",
                    "toolCallId": call_id,
                    "title": format!("subagent {}: {}", request.session_id, title(request.tool, request.arguments)),
                    "kind": kind(request.tool),
                    "status": "pending",
                    "rawInput": request.arguments,
                }),
            );
        }
        let params = json!({
            "sessionId": self.session_id,
            "toolCall": {
                "toolCallId": call_id,
                "title": title(request.tool, request.arguments),
                "kind": kind(request.tool),
                "status": "pending",
                "rawInput": request.arguments,
                "content": content,
            },
            "options": options,
        });
        let verdict = self.ask(params, always);
        if child {
            // The child's own turn runs the call; here it is settled as
            // far as this editor can follow it.
            let (status, said) = match &verdict {
                Ok(Verdict { decision: Answer::Approve | Answer::ApproveForSession, .. }) => {
                    ("completed", format!("approved; it runs in subagent session {}", request.session_id))
                }
                Ok(Verdict { decision: Answer::Deny { reason }, .. }) => ("failed", reason.clone()),
                Err(e) => ("failed", e.to_string()),
            };
            self.shared.notify(
                &self.session_id,
                json!({"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": status, "content": text_content(&said)}),
            );
        }
        verdict
    }
}

impl PermissionAsker {
    /// Put an MCP server's question to the person in the editor
    /// (`elicitation/create`, form mode, tied to the session and the call).
    fn elicit(&self, question: &cairn_core::elicit::Elicitation<'_>) -> cairn_core::elicit::ElicitAnswer {
        use cairn_core::elicit::{Ask, ElicitAnswer};
        let message = format!("{} asks: {}", question.tool, question.message);
        let mut params = match question.ask {
            Ask::Form(_) if !self.shared.elicitation.load(Ordering::SeqCst) => {
                return ElicitAnswer::Decline(
                    "the editor does not offer elicitation (clientCapabilities.elicitation.form), so the server's \
                     question was declined"
                        .to_owned(),
                );
            }
            Ask::Url { .. } if !self.shared.elicitation_url.load(Ordering::SeqCst) => {
                return ElicitAnswer::Decline(
                    "the editor does not offer URL elicitation (clientCapabilities.elicitation.url), so the \
                     server's request to open a URL was declined"
                        .to_owned(),
                );
            }
            Ask::Form(schema) => json!({
                "sessionId": self.session_id,
                "mode": "form",
                "message": message,
                "requestedSchema": schema,
            }),
            Ask::Url { url, id } => json!({
                "sessionId": self.session_id,
                "mode": "url",
                "message": message,
                "url": url,
                "elicitationId": id,
            }),
        };
        // A subagent's call is not one the editor was told of.
        if question.session_id == self.session_id {
            params["toolCallId"] = json!(question.invocation_id);
        }
        match self.shared.ask_until(&self.session_id, "elicitation/create", params, None) {
            Err(why) => ElicitAnswer::Decline(why),
            Ok(Reply::Cancelled) => ElicitAnswer::Cancel,
            Ok(Reply::Error(e)) => ElicitAnswer::Decline(format!("the editor answered with an error: {e}")),
            Ok(Reply::Result(result)) => match result.get("action").and_then(Value::as_str) {
                Some("accept") => match result.get("content") {
                    Some(Value::Object(content)) => ElicitAnswer::Accept(content.clone()),
                    None | Some(Value::Null) => ElicitAnswer::Accept(serde_json::Map::new()),
                    Some(_) => ElicitAnswer::Decline("the editor's answer was not an object; declined".to_owned()),
                },
                Some("decline") => ElicitAnswer::Decline("the person declined in the editor".to_owned()),
                Some("cancel") => ElicitAnswer::Cancel,
                _ => ElicitAnswer::Decline("the editor's answer was not understood; declined".to_owned()),
            },
        }
    }

    /// Ask the editor `params` (a `session/request_permission`) and read
    /// its answer as a verdict (`always`: whether "allow always" was
    /// offered).
    fn ask(&self, params: Value, always: bool) -> Result<Verdict, ApprovalError> {
        let by = "user:acp".to_owned();
        let deny = |reason: &str| Ok(Verdict { decision: Answer::Deny { reason: reason.to_owned() }, by: by.clone() });
        match self.shared.ask_until(&self.session_id, "session/request_permission", params, None) {
            Err(why) => Err(ApprovalError::Unavailable(why)),
            Ok(Reply::Cancelled) => deny("the prompt was cancelled in the editor"),
            Ok(Reply::Error(e)) => {
                Err(ApprovalError::Failed(format!("the client answered the permission request with an error: {e}")))
            }
            Ok(Reply::Result(result)) => {
                let outcome = result.get("outcome");
                match outcome.and_then(|o| o.get("outcome")).and_then(Value::as_str) {
                    Some("cancelled") => deny("the prompt was cancelled in the editor"),
                    Some("selected") => match outcome.and_then(|o| o.get("optionId")).and_then(Value::as_str) {
                        Some(ALLOW_ONCE) => Ok(Verdict { decision: Answer::Approve, by }),
                        Some(ALLOW_ALWAYS) if always => Ok(Verdict { decision: Answer::ApproveForSession, by }),
                        Some(REJECT) => deny("the user rejected this call in the editor"),
                        other => deny(&format!("the editor chose an option that was not offered ({other:?}); not run")),
                    },
                    _ => deny("the editor's answer to the permission request was not understood; not run"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn prompt_content_takes_text_links_text_resources_and_images_and_refuses_the_rest() {
        let (ok, images) = prompt_content(&json!([
            {"type": "text", "text": "look at "},
            {"type": "resource_link", "uri": "file:///w/a.rs", "name": "a.rs"},
            {"type": "resource", "resource": {"uri": "file:///w/b.rs", "text": "fn b() {}"}},
        ]))
        .unwrap();
        assert_eq!(ok, "look at [a.rs](file:///w/a.rs)\n<context uri=\"file:///w/b.rs\">\nfn b() {}\n</context>\n");
        assert!(images.is_empty());
        let (text, images) =
            prompt_content(&json!([{"type": "image", "data": "iVBORw==", "mimeType": "image/png"}])).unwrap();
        assert_eq!((text.as_str(), images.len()), ("", 1));
        for bad in [
            json!(null),
            json!("text"),
            json!([]),
            json!([{"type": "text", "text": "  \n"}]),
            json!([{"text": "no type"}]),
            json!([{"type": "image", "data": "", "mimeType": "image/png"}]),
            json!([{"type": "image", "data": "AAAA", "mimeType": "image/tiff"}]),
            json!([{"type": "image", "uri": "file:///x.png", "mimeType": "image/png"}]),
            json!([{"type": "audio", "data": "", "mimeType": "audio/wav"}]),
            json!([{"type": "resource", "resource": {"uri": "file:///x", "blob": "AAAA"}}]),
        ] {
            let e = prompt_content(&bad).unwrap_err();
            assert_eq!(e.code, jsonrpc::code::INVALID_PARAMS, "{bad}");
        }
    }

    #[test]
    fn iso8601_in_utc_and_titles_from_the_first_line() {
        let at = |secs: u64| iso8601(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        // `date -u -d @1700000000` and a leap day.
        assert_eq!(at(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(title_from("\n  fix the parser  \nmore"), Some("fix the parser".to_owned()));
        assert_eq!(title_from(" \n "), None);
        let long = "é".repeat(100);
        assert_eq!(title_from(&long).map(|t| t.chars().count()), Some(MAX_TITLE + 1));
    }

    #[test]
    fn tool_kinds_and_titles() {
        assert_eq!(kind("read_file"), "read");
        assert_eq!(kind("write_file"), "edit");
        assert_eq!(kind("shell"), "execute");
        assert_eq!(kind("my_external_tool"), "other");
        assert_eq!(title("shell", &json!({"command": "ls"})), "shell: ls");
        assert_eq!(title("x", &json!({"n": 1})), "x");
        let long = "é".repeat(500);
        assert_eq!(title("shell", &json!({"command": long})).chars().count(), "shell: ".len() + 120);
    }
}
