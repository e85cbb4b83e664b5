//! One running MCP server: starting it (a stdio program under cairn's
//! sandbox, or a streamable-HTTP endpoint), the MCP handshake and tool list
//! through the official SDK (`rmcp`), one `tools/call` with progress,
//! cancellation and a time limit, and noticing that the server died.
//!
//! It owns the server's process (killed with the connection) and the
//! async runtime the SDK needs. It must not decide tiers, names or
//! approvals (`tool.rs` does) nor when to restart (`pool.rs` does).

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_core::CancelToken;
use cairn_core::elicit::{Ask as Asking, ElicitAnswer};
use cairn_tools::ToolsConfig;
use cairn_tools::process::{RunSpec, Service};
use cairn_tools::sandbox::{self, Decision, SandboxPolicy};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ClientRequest,
    ElicitRequestParams, ElicitResult, ElicitationAction, Implementation, ProgressNotificationParam, ServerResult,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RequestContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};

use crate::bounded::{Bounded, OVERSIZED_CODE, Unattributed};
use crate::config::{FileAccess, ServerConfig};
use cairn_tools::programs::{expand, install_reads, resolve};

/// Why a server could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServerError {
    /// It could not be started or did not finish the handshake.
    #[error("MCP server {server} did not start: {reason}")]
    Start {
        /// The server's name.
        server: String,
        /// Why, with what the server said on stderr.
        reason: String,
    },
    /// The connection broke (the server exited) during or before a call.
    #[error("MCP server {server} is gone: {reason}")]
    Gone {
        /// The server's name.
        server: String,
        /// Why.
        reason: String,
    },
    /// The server answered the call with a protocol error.
    #[error("MCP server {server} refused the call: {reason}")]
    Refused {
        /// The server's name.
        server: String,
        /// Its error.
        reason: String,
    },
    /// The call ran past its time limit (the server was told to cancel).
    #[error("the call to MCP server {server} timed out after {after:?}")]
    Timeout {
        /// The server's name.
        server: String,
        /// The limit.
        after: Duration,
    },
    /// The turn was cancelled (the server was told to cancel).
    #[error("cancelled")]
    Cancelled,
    /// Its answer was over `max_answer_bytes` (`bounded.rs`); said at once.
    #[error("MCP server {server} answered too much: {reason}")]
    TooLarge {
        /// The server's name.
        server: String,
        /// The size and the limit.
        reason: String,
    },
}

/// Progress lines of the calls in flight, by progress token.
type Progress = Arc<Mutex<HashMap<String, std::sync::mpsc::Sender<String>>>>;

/// What a server asks for (`elicitation/create`), owned until the call
/// that runs puts it to the person.
enum Asked {
    /// A form: the JSON Schema of the object.
    Form(serde_json::Value),
    /// To visit a URL (URL mode), with the server's id for the question.
    Url { url: String, id: String },
}

impl Asked {
    fn ask(&self) -> Asking<'_> {
        match self {
            Asked::Form(schema) => Asking::Form(schema),
            Asked::Url { url, id } => Asking::Url { url, id },
        }
    }
}

/// A server's question for the person: its message, what it asks for,
/// and where the answer goes.
type Question = (String, Asked, tokio::sync::oneshot::Sender<cairn_core::elicit::ElicitAnswer>);

/// Where a server's questions go: the calls in flight (the newest asks;
/// a server asks while it runs a call of cairn's, and cairn runs one call
/// of a server at a time). None: the question is declined.
type Questions = Arc<Mutex<Vec<(u64, std::sync::mpsc::Sender<Question>)>>>;

/// Names each call's entry in [`Questions`].
static NEXT_CALL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// cairn's side of the MCP session: progress goes to the call that asked
/// for it; a changed tool list is noted so the next turn lists again.
#[derive(Clone)]
struct Handler {
    progress: Progress,
    tools_changed: Arc<AtomicBool>,
    questions: Questions,
}

impl ClientHandler for Handler {
    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        let key = params.progress_token.0.to_string();
        let line = match (params.message, params.total) {
            (Some(m), _) => format!("{m}\n"),
            (None, Some(total)) => format!("progress {}/{}\n", params.progress, total),
            (None, None) => format!("progress {}\n", params.progress),
        };
        if let Some(tx) = lock(&self.progress).get(&key) {
            let _ = tx.send(line);
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.tools_changed.store(true, Ordering::SeqCst);
    }

    /// A form or a URL is put to the person through the call that is
    /// running (its turn's approver, `ToolContext::elicit`); a question
    /// with no call of cairn's running is declined.
    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, rmcp::ErrorData> {
        let (message, asked) = match request {
            ElicitRequestParams::FormElicitationParams { message, requested_schema, .. } => {
                (message, Asked::Form(serde_json::to_value(&requested_schema).unwrap_or_default()))
            }
            ElicitRequestParams::UrlElicitationParams { message, url, elicitation_id, .. } => {
                (message, Asked::Url { url, id: elicitation_id })
            }
            // A mode of a later protocol: nobody here knows how to show it.
            _ => return Ok(ElicitResult::new(ElicitationAction::Decline)),
        };
        let url_mode = matches!(asked, Asked::Url { .. });
        let (tx, rx) = tokio::sync::oneshot::channel();
        let asked = lock(&self.questions).last().is_some_and(|(_, call)| call.send((message, asked, tx)).is_ok());
        if !asked {
            return Ok(ElicitResult::new(ElicitationAction::Decline));
        }
        Ok(match rx.await {
            // A URL's acceptance carries nothing (the person goes there).
            Ok(ElicitAnswer::Accept(content)) if content.is_empty() && url_mode => {
                ElicitResult::new(ElicitationAction::Accept)
            }
            Ok(ElicitAnswer::Accept(content)) => {
                ElicitResult::new(ElicitationAction::Accept).with_content(serde_json::Value::Object(content))
            }
            Ok(ElicitAnswer::Decline(_)) => ElicitResult::new(ElicitationAction::Decline),
            // The call ended (cancelled, timed out) before an answer.
            Ok(ElicitAnswer::Cancel) | Err(_) => ElicitResult::new(ElicitationAction::Cancel),
        })
    }

    fn get_info(&self) -> ClientConfig {
        // Form and URL elicitation are declared: a question reaches the
        // person where one can answer and is declined, saying so, where
        // none can.
        let capabilities =
            serde_json::from_value::<ClientCapabilities>(serde_json::json!({"elicitation": {"form": {}, "url": {}}}))
                .unwrap_or_default();
        ClientConfig::new(capabilities, Implementation::new("cairn", env!("CARGO_PKG_VERSION")))
    }
}

/// The last bytes a server wrote to stderr (for error reports).
#[derive(Debug, Default)]
struct Tail(Vec<u8>);

const TAIL_BYTES: usize = 4096;

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
        if self.0.len() > TAIL_BYTES {
            let cut = self.0.len() - TAIL_BYTES;
            self.0.drain(..cut);
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0).trim().to_owned()
    }
}

/// A running, initialised MCP server.
pub(crate) struct Connection {
    name: String,
    service: RunningService<RoleClient, Handler>,
    /// Its tools as it last listed them.
    tools: Mutex<Vec<rmcp::model::Tool>>,
    process: Option<Mutex<Service>>,
    stderr: Arc<Mutex<Tail>>,
    progress: Progress,
    tools_changed: Arc<AtomicBool>,
    /// The running calls' question channels (see [`Questions`]).
    questions: Questions,
    /// Oversized answers whose request could not be told (`bounded.rs`).
    unattributed: Unattributed,
    /// What it offers besides tools (found at the start).
    offers: Offers,
    /// How long starting it took.
    pub(crate) started_in: Duration,
}

/// What a server offers besides tools, which cairn turns into read-only
/// tools (`extra.rs`): what its `initialize` declares and the first page
/// of its listing shows (the Python SDK declares both for every server,
/// so a declaration alone would give a server with none four empty tools).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Offers {
    /// `resources`: `resources/list`, `resources/read`.
    #[serde(default)]
    pub(crate) resources: bool,
    /// `prompts`: `prompts/list`, `prompts/get`.
    #[serde(default)]
    pub(crate) prompts: bool,
}

/// A request cairn makes of a server besides `tools/call`.
#[derive(Debug, Clone)]
pub(crate) enum Ask {
    /// `resources/list` and `resources/templates/list`, every page.
    ListResources,
    /// `resources/read` of this URI.
    ReadResource(String),
    /// `prompts/list`, every page.
    ListPrompts,
    /// `prompts/get` of this prompt with these arguments.
    GetPrompt(String, serde_json::Map<String, serde_json::Value>),
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Connection {
    /// Start `config` for a session in `cwd` and list its tools, within its
    /// startup timeout.
    pub(crate) fn start(
        name: &str,
        config: &ServerConfig,
        cwd: &Path,
        tools: &ToolsConfig,
    ) -> Result<Connection, ServerError> {
        let rt = crate::runtime::runtime().map_err(|reason| ServerError::Start { server: name.to_owned(), reason })?;
        let (name_owned, config, cwd, tools) = (name.to_owned(), config.clone(), cwd.to_path_buf(), tools.clone());
        let limit = Duration::from_millis(config.startup_timeout_ms);
        // Spawned on the runtime's own thread (see `runtime`).
        let task = rt.spawn(async move {
            match tokio::time::timeout(limit, Self::connect(&name_owned, &config, &cwd, &tools)).await {
                Ok(result) => result,
                Err(_) => Err(ServerError::Start {
                    server: name_owned.clone(),
                    reason: format!(
                        "no answer to initialize and tools/list within {} ms (raise startup_timeout_ms if it is \
                         slow to start)",
                        config.startup_timeout_ms
                    ),
                }),
            }
        });
        rt.block_on(task).map_err(|e| ServerError::Start { server: name.to_owned(), reason: e.to_string() })?
    }

    async fn connect(
        name: &str,
        config: &ServerConfig,
        cwd: &Path,
        tools: &ToolsConfig,
    ) -> Result<Connection, ServerError> {
        let started = Instant::now();
        let fail = |reason: String| ServerError::Start { server: name.to_owned(), reason };
        let progress: Progress = Arc::default();
        let tools_changed = Arc::new(AtomicBool::new(false));
        let questions: Questions = Arc::default();
        let handler =
            Handler { progress: progress.clone(), tools_changed: tools_changed.clone(), questions: questions.clone() };
        let stderr = Arc::new(Mutex::new(Tail::default()));
        let unattributed = Unattributed::default();
        let (service, process) = match (&config.command, &config.url) {
            (Some(command), _) => {
                let mut process = spawn(name, command, config, cwd, tools).map_err(fail)?;
                let (Some(stdin), Some(stdout), Some(err)) =
                    (process.stdin.take(), process.stdout.take(), process.stderr.take())
                else {
                    return Err(fail("its pipes could not be set up".into()));
                };
                let tail = stderr.clone();
                std::thread::Builder::new()
                    .name(format!("mcp-{name}-stderr"))
                    .spawn(move || drain_stderr(err, &tail))
                    .map_err(|e| fail(format!("cannot start its stderr reader: {e}")))?;
                let rx = tokio::net::unix::pipe::Receiver::from_owned_fd(std::os::fd::OwnedFd::from(stdout))
                    .map_err(|e| fail(format!("its stdout: {e}")))?;
                let tx = tokio::net::unix::pipe::Sender::from_owned_fd(std::os::fd::OwnedFd::from(stdin))
                    .map_err(|e| fail(format!("its stdin: {e}")))?;
                // cairn bounds each message itself (`bounded.rs`), so the
                // SDK's own limit only has to let a cut line through.
                let limit = usize::try_from(config.max_answer_bytes).unwrap_or(usize::MAX);
                let rx = Bounded::new(rx, limit, unattributed.clone());
                let transport = rmcp::transport::async_rw::AsyncRwTransport::new_client(rx, tx)
                    .with_max_line_length(limit.saturating_add(1024));
                let service = handler.serve(transport).await.map_err(|e| {
                    let said = lock(&stderr).text();
                    fail(if said.is_empty() { e.to_string() } else { format!("{e}; it said: {said}") })
                })?;
                (service, Some(Mutex::new(process)))
            }
            (None, Some(url)) => {
                let mut headers = std::collections::HashMap::new();
                for (name, value) in config.headers().map_err(fail)? {
                    // As for `env`: cairn's own provider keys never leave
                    // (a variable's value was checked by the host's lookup;
                    // the credentials it holds are among `secrets`).
                    let from_env = config.env_http_headers.contains_key(&name);
                    if !from_env && tools.secrets.matches(&value) {
                        return Err(fail(format!(
                            "the value of header {name} is one of cairn's provider keys; refusing"
                        )));
                    }
                    let name =
                        http::HeaderName::from_bytes(name.as_bytes()).map_err(|e| fail(format!("{name}: {e}")))?;
                    let value = http::HeaderValue::from_str(&value).map_err(|e| fail(format!("{name}: {e}")))?;
                    headers.insert(name, value);
                }
                let http = rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                    url.as_str(),
                )
                .custom_headers(headers);
                // A person's saved login (`cairn mcp login`), unless the
                // configuration gives client credentials.
                let login = match &config.oauth {
                    None => crate::login::saved(name, url).await.map_err(fail)?,
                    Some(_) => None,
                };
                let logged_in = login.is_some();
                // A refusal for want of a token says what to configure.
                let refused = |e: rmcp::service::ClientInitializeError| {
                    let said = e.to_string();
                    match auth_challenge(&e) {
                        Some(_) if logged_in => fail(format!(
                            "{url} refused the saved login even after renewing it: log in again with `cairn mcp \
                             login {name}`"
                        )),
                        Some(challenge) if config.oauth.is_none() => fail(format!(
                            "{url} requires authorization (HTTP 401, {challenge:?}): log in with `cairn mcp login \
                             {name}` (OAuth in a browser), give [mcp_servers.{name}.oauth] with client_id and \
                             client_secret_env for OAuth client credentials, or a token you hold with \
                             env_http_headers = {{ Authorization = \"VARIABLE\" }} (VARIABLE holding \"Bearer …\")"
                        )),
                        Some(_) => fail(format!("{url} refused the OAuth token cairn obtained: {said}")),
                        None => fail(format!("{url}: {said}")),
                    }
                };
                let service = match (&config.oauth, login) {
                    (None, Some(manager)) => {
                        // rmcp renews the token when it has expired or the
                        // server answers 401 (the refresh token, once).
                        let client = rmcp::transport::AuthClient::new(reqwest::Client::default(), manager);
                        handler
                            .serve(rmcp::transport::StreamableHttpClientTransport::with_client(client, http))
                            .await
                            .map_err(refused)?
                    }
                    (None, None) => handler
                        .serve(rmcp::transport::StreamableHttpClientTransport::from_config(http))
                        .await
                        .map_err(refused)?,
                    (Some(oauth), _) => {
                        let manager = authorize(url, oauth).await.map_err(fail)?;
                        let client = rmcp::transport::AuthClient::new(reqwest::Client::default(), manager);
                        handler
                            .serve(rmcp::transport::StreamableHttpClientTransport::with_client(client, http))
                            .await
                            .map_err(refused)?
                    }
                };
                (service, None)
            }
            (None, None) => return Err(fail("neither `command` nor `url` is set".into())),
        };
        let listed = service.peer().list_all_tools().await.map_err(|e| {
            let said = lock(&stderr).text();
            fail(if said.is_empty() { format!("tools/list: {e}") } else { format!("tools/list: {e}; it said: {said}") })
        })?;
        let offers = offers(&service).await;
        Ok(Connection {
            name: name.to_owned(),
            offers,
            service,
            tools: Mutex::new(listed),
            process,
            stderr,
            progress,
            tools_changed,
            questions,
            unattributed,
            started_in: started.elapsed(),
        })
    }

    /// Whether the server is still there (its process alive, the session
    /// open); `Err` says how it ended.
    pub(crate) fn alive(&self) -> Result<(), String> {
        if let Some(process) = &self.process
            && let Some(code) = lock(process).exited()
        {
            let said = lock(&self.stderr).text();
            return Err(if said.is_empty() {
                format!("it exited with status {code}")
            } else {
                format!("it exited with status {code}; it said: {said}")
            });
        }
        if self.service.is_closed() {
            return Err("its connection closed".into());
        }
        Ok(())
    }

    /// What it offers besides tools, as found at its start.
    pub(crate) fn offers(&self) -> Offers {
        self.offers
    }

    /// Make `ask` of the server, within `timeout` and until `cancel`; the
    /// answer as JSON (what the model is shown is decided by `extra.rs`).
    pub(crate) fn ask(
        &self,
        ask: Ask,
        cancel: &CancelToken,
        timeout: Duration,
    ) -> Result<serde_json::Value, ServerError> {
        let rt = crate::runtime::runtime().map_err(|reason| ServerError::Gone { server: self.name.clone(), reason })?;
        let server = self.name.clone();
        let peer = self.service.peer().clone();
        let refused = |e: rmcp::ServiceError| match e {
            rmcp::ServiceError::McpError(e) => {
                ServerError::Refused { server: server.clone(), reason: e.message.to_string() }
            }
            other => ServerError::Gone { server: server.clone(), reason: other.to_string() },
        };
        let json = |v: Result<serde_json::Value, serde_json::Error>| {
            v.map_err(|e| ServerError::Refused { server: self.name.clone(), reason: e.to_string() })
        };
        let work = async {
            match ask {
                Ask::ListResources => {
                    let resources = json(serde_json::to_value(peer.list_all_resources().await.map_err(refused)?))?;
                    // Templates are optional; a server without them answers
                    // with an error, which is not the listing's failure.
                    let templates = peer.list_all_resource_templates().await.unwrap_or_default();
                    let templates = json(serde_json::to_value(templates))?;
                    Ok(serde_json::json!({"resources": resources, "resourceTemplates": templates}))
                }
                Ask::ReadResource(uri) => {
                    let params = rmcp::model::ReadResourceRequestParams::new(uri);
                    json(serde_json::to_value(peer.read_resource(params).await.map_err(refused)?))
                }
                Ask::ListPrompts => {
                    let prompts = json(serde_json::to_value(peer.list_all_prompts().await.map_err(refused)?))?;
                    Ok(serde_json::json!({"prompts": prompts}))
                }
                Ask::GetPrompt(name, arguments) => {
                    let mut params = rmcp::model::GetPromptRequestParams::new(name);
                    if !arguments.is_empty() {
                        params = params.with_arguments(arguments);
                    }
                    json(serde_json::to_value(peer.get_prompt(params).await.map_err(refused)?))
                }
            }
        };
        rt.block_on(async {
            tokio::pin!(work);
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            let deadline = Instant::now() + timeout;
            loop {
                tokio::select! {
                    answer = &mut work => return answer,
                    _ = tick.tick() => {
                        if cancel.is_cancelled() {
                            return Err(ServerError::Cancelled);
                        }
                        if Instant::now() >= deadline {
                            return Err(ServerError::Timeout { server: self.name.clone(), after: timeout });
                        }
                        if let Err(why) = self.alive() {
                            return Err(ServerError::Gone { server: self.name.clone(), reason: why });
                        }
                    }
                }
            }
        })
    }

    /// Its tools, listed again first when the server said they changed
    /// (`notifications/tools/list_changed`).
    pub(crate) fn tools(&self) -> Result<Vec<rmcp::model::Tool>, ServerError> {
        if self.tools_changed.swap(false, Ordering::SeqCst) {
            let rt =
                crate::runtime::runtime().map_err(|reason| ServerError::Gone { server: self.name.clone(), reason })?;
            let peer = self.service.peer().clone();
            let listed = rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(30), peer.list_all_tools()).await })
                .map_err(|_| ServerError::Gone { server: self.name.clone(), reason: "tools/list timed out".into() })?
                .map_err(|e| ServerError::Gone { server: self.name.clone(), reason: format!("tools/list: {e}") })?;
            *lock(&self.tools) = listed;
        }
        Ok(lock(&self.tools).clone())
    }

    /// Call `tool` with `arguments`; progress lines go to `output` while it
    /// runs; `cancel` and `timeout` end it with `notifications/cancelled`.
    /// A question the server asks meanwhile (`elicitation/create`) is put
    /// to `elicit` (the person, through the turn's approver); the time the
    /// person takes does not count against `timeout`.
    pub(crate) fn call(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
        cancel: &CancelToken,
        timeout: Duration,
        output: &mut dyn FnMut(&[u8]),
        elicit: &mut dyn FnMut(&str, Asking<'_>) -> ElicitAnswer,
    ) -> Result<CallToolResult, ServerError> {
        let rt = crate::runtime::runtime().map_err(|reason| ServerError::Gone { server: self.name.clone(), reason })?;
        let gone = |reason: String| ServerError::Gone { server: self.name.clone(), reason };
        let peer = self.service.peer().clone();
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let (ask_tx, asks) = std::sync::mpsc::channel::<Question>();
        let call_id = NEXT_CALL.fetch_add(1, Ordering::SeqCst);
        lock(&self.questions).push((call_id, ask_tx));
        let mut deadline = Instant::now() + timeout;
        let oversized_before = self.unattributed.load(Ordering::SeqCst);
        let result = rt.block_on(async {
            let mut handle = peer
                .send_cancellable_request(request, PeerRequestOptions::no_options())
                .await
                .map_err(|e| gone(e.to_string()))?;
            // A progress line sent before this point is lost (the SDK picks
            // the token while sending); the result is not.
            let key = handle.progress_token.0.to_string();
            lock(&self.progress).insert(key.clone(), tx);
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            let outcome = loop {
                tokio::select! {
                    answer = &mut handle.rx => break Ok(answer),
                    _ = tick.tick() => {
                        while let Ok(line) = rx.try_recv() {
                            output(line.as_bytes());
                        }
                        while let Ok((message, asked, reply)) = asks.try_recv() {
                            let asked_at = Instant::now();
                            let answer = elicit(&message, asked.ask());
                            deadline += asked_at.elapsed();
                            let _ = reply.send(answer);
                        }
                        if cancel.is_cancelled() {
                            break Err(ServerError::Cancelled);
                        }
                        if Instant::now() >= deadline {
                            break Err(ServerError::Timeout { server: self.name.clone(), after: timeout });
                        }
                        if let Err(why) = self.alive() {
                            break Err(gone(why));
                        }
                        // An answer too large to read whose id was not
                        // found may have been this call's: it would never
                        // be answered otherwise.
                        if self.unattributed.load(Ordering::SeqCst) != oversized_before {
                            break Err(ServerError::TooLarge {
                                server: self.name.clone(),
                                reason: "it sent a message over the limit of max_answer_bytes whose request could \
                                         not be told, while this call waited"
                                    .into(),
                            });
                        }
                    }
                }
            };
            lock(&self.progress).remove(&key);
            while let Ok(line) = rx.try_recv() {
                output(line.as_bytes());
            }
            match outcome {
                Ok(answer) => Ok(answer),
                Err(e) => {
                    if matches!(e, ServerError::Cancelled | ServerError::Timeout { .. }) {
                        let _ = handle.cancel(Some("cancelled by cairn".into())).await;
                    }
                    Err(e)
                }
            }
        });
        // A question still waiting is cancelled (its answer channel dropped).
        lock(&self.questions).retain(|(id, _)| *id != call_id);
        let result = result?;
        match result {
            Ok(Ok(ServerResult::CallToolResult(result))) => Ok(result),
            Ok(Ok(other)) => Err(ServerError::Refused {
                server: self.name.clone(),
                reason: format!("it answered tools/call with something else: {other:?}"),
            }),
            Ok(Err(rmcp::ServiceError::McpError(e)))
                if e.code.0 == OVERSIZED_CODE
                    && e.data.as_ref().is_some_and(|d| d.get("cairn").is_some_and(|c| c == "oversized")) =>
            {
                Err(ServerError::TooLarge { server: self.name.clone(), reason: e.message.to_string() })
            }
            Ok(Err(rmcp::ServiceError::McpError(e))) => {
                Err(ServerError::Refused { server: self.name.clone(), reason: e.message.to_string() })
            }
            Ok(Err(e)) => Err(gone(self.alive().err().unwrap_or_else(|| e.to_string()))),
            Err(_) => Err(gone(self.alive().err().unwrap_or_else(|| "it closed the connection".into()))),
        }
    }
}

/// A token for `url` by OAuth client credentials: the authorization server
/// is found from the server's protected resource metadata (RFC 9728) and
/// its own (RFC 8414), then asked with the client's id and secret and the
/// server's URL as `resource` (RFC 8707). Why not, said with what to check.
async fn authorize(
    url: &str,
    oauth: &crate::config::OAuthConfig,
) -> Result<rmcp::transport::AuthorizationManager, String> {
    let var = &oauth.client_secret_env;
    let secret = match crate::credential(var) {
        crate::Credential::Value(s) if !s.is_empty() => s,
        crate::Credential::Value(_) | crate::Credential::Unset => {
            return Err(format!("its OAuth client secret is read from ${var}, which is not set"));
        }
        // As for headers and `env`: cairn's own provider keys never leave.
        crate::Credential::ProviderKey => {
            return Err(format!("${var} holds one of cairn's provider keys; refusing to send it as an OAuth secret"));
        }
    };
    let mut state =
        rmcp::transport::auth::OAuthState::new(url, None).await.map_err(|e| format!("OAuth for {url}: {e}"))?;
    let credentials = rmcp::transport::ClientCredentialsConfig::ClientSecret {
        client_id: oauth.client_id.clone(),
        client_secret: secret,
        scopes: oauth.scopes.clone(),
        resource: Some(url.to_owned()),
    };
    state.authenticate_client_credentials(credentials).await.map_err(|e| {
        format!(
            "OAuth client credentials for {url} failed: {e} (check oauth.client_id {:?}, the secret in ${var} and \
             oauth.scopes)",
            oauth.client_id
        )
    })?;
    state.into_authorization_manager().ok_or_else(|| format!("OAuth for {url}: the authorization server gave no token"))
}

/// The `WWW-Authenticate` challenge of a server's 401 behind `e`, if that
/// is why it failed.
fn auth_challenge(e: &rmcp::service::ClientInitializeError) -> Option<String> {
    // The transport's error is a field, not a `source`, of rmcp's error.
    let mut cause: Option<&(dyn std::error::Error + 'static)> = match e {
        rmcp::service::ClientInitializeError::TransportError { error, .. } => Some(error),
        other => Some(other),
    };
    while let Some(err) = cause {
        if let Some(required) = err.downcast_ref::<rmcp::transport::streamable_http_client::AuthRequiredError>() {
            return Some(required.www_authenticate_header.clone());
        }
        cause = err.source();
    }
    // rmcp's own words, should the typed cause be out of reach.
    e.to_string().contains("Auth required").then(|| "no challenge given".to_owned())
}

/// What `service`'s server offers besides tools: a capability it declares
/// and whose first page lists something (an error counts as nothing).
async fn offers(service: &RunningService<RoleClient, Handler>) -> Offers {
    let peer = service.peer();
    let declared = peer.peer_info().map(|info| info.capabilities.clone()).unwrap_or_default();
    let resources = declared.resources.is_some()
        && (peer.list_resources(None).await.is_ok_and(|r| !r.resources.is_empty())
            || peer.list_resource_templates(None).await.is_ok_and(|t| !t.resource_templates.is_empty()));
    let prompts = declared.prompts.is_some() && peer.list_prompts(None).await.is_ok_and(|p| !p.prompts.is_empty());
    Offers { resources, prompts }
}

fn drain_stderr(mut err: std::process::ChildStderr, tail: &Mutex<Tail>) {
    let mut buf = [0u8; 4096];
    loop {
        match err.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => lock(tail).push(&buf[..n]),
        }
    }
}

/// Start a stdio server under the sandbox its configuration declares.
fn spawn(name: &str, command: &str, config: &ServerConfig, cwd: &Path, tools: &ToolsConfig) -> Result<Service, String> {
    let program = resolve(command)
        .ok_or_else(|| format!("`{command}` was not found on PATH; give its absolute path in `command`"))?;
    let cwd = config.cwd.as_deref().map(expand).unwrap_or_else(|| cwd.to_path_buf());
    let mut env = cairn_tools::env::scrubbed_env(&tools.secrets);
    for var in &config.env {
        // Passed because the user named it (a credential-named one, such
        // as GITHUB_TOKEN, from where the host keeps it), unless it carries
        // one of cairn's own provider keys.
        match crate::credential(var) {
            crate::Credential::Value(value) => env.push((var.clone(), value)),
            crate::Credential::ProviderKey => {
                return Err(format!("`env` names {var}, whose value is one of cairn's provider keys; refusing"));
            }
            crate::Credential::Unset => {}
        }
    }
    for (var, value) in &config.env_values {
        if tools.secrets.matches(value) {
            return Err(format!("the value given for {var} is one of cairn's provider keys; refusing"));
        }
        env.push((var.clone(), value.clone()));
    }
    env.push(("CAIRN_MCP_SERVER".into(), name.to_owned()));
    // A server is a long-lived Write-tier program: it runs sandboxed, or
    // unsandboxed only where the user opted in (as for external tools).
    let sandboxed =
        match sandbox::decide(&sandbox::landlock_status(), cairn_core::tool::Risk::Write, tools.allow_unsandboxed) {
            Decision::Sandboxed => true,
            Decision::Unsandboxed(_) => false,
            Decision::Refuse(why) => return Err(why),
        };
    let mut extra_read = install_reads(&program).map_err(|e| e.to_string())?;
    extra_read.extend(config.read.iter().map(|p| expand(p)));
    extra_read.extend(tools.sandbox_read_paths.iter().cloned());
    let policy = SandboxPolicy {
        cwd: cwd.clone(),
        read_cwd: config.files != FileAccess::None,
        write_cwd: config.files == FileAccess::Write,
        network: config.network,
        process_spawn: config.processes,
        extra_read,
        extra_write: config.write.iter().map(|p| expand(p)).collect(),
        max_processes: tools.max_processes,
        ..SandboxPolicy::default()
    };
    let mut argv = vec![OsString::from(&program)];
    argv.extend(config.args.iter().map(OsString::from));
    let spec = RunSpec {
        argv,
        cwd,
        stdin: Vec::new(),
        env,
        sandbox: sandboxed.then_some(policy),
        timeout: Duration::MAX,
        output_cap: 0,
        max_processes: tools.max_processes,
        pid_namespace: true,
        hidden: tools.hidden_paths.clone(),
    };
    Service::spawn(&spec).map_err(|e| e.to_string())
}
