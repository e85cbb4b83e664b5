//! `cairn mcp`: a Model Context Protocol server of cairn's tools over stdio.
//!
//! What is exposed: ReadOnly tools always; a Write tool only when an allow
//! rule (`--allow`, `[approvals] allow`) names it, and then only the calls
//! the rule covers run (the core's approval gate decides, as in a turn);
//! Destructive tools never (no person can answer an MCP call, and the
//! registry refuses them without an interactive approver). Annotations are
//! derived from the risk tier: `readOnlyHint` for ReadOnly,
//! `destructiveHint` false (a call that turns Destructive is refused),
//! `idempotentHint` from the replay policy, `openWorldHint` from the
//! network capability.
//!
//! Every `tools/call` is one turn of the server's own session file (created
//! at the first call): the user line says which client called what, a
//! one-shot provider asks for exactly that call, and the core runs it through
//! schema validation, the approval gate, the sandbox and the limits, and
//! records intent and settlement — so an MCP client's actions are as
//! auditable (`cairn show --tools`) as the agent's. A refused or failed call
//! is a tool result with `isError`, not a protocol error; only an unknown or
//! unexposed tool name is a JSON-RPC error (-32602), as the protocol says.
//!
//! A reader thread owns stdin and handles `notifications/cancelled`: the
//! named call's turn is cancelled through the core (a running tool is
//! killed; the session records the cancelled turn) and gets no answer.
//! Calls themselves run one at a time, in order, on the main thread;
//! `ping` is answered by the reader at once, even while a call runs.
//! Request ids are echoed exactly as written (`jsonrpc::Id`). A call whose
//! output the core cut at the prompt cap answers the whole stored output.
//!
//! This module must not run tools itself or decide approvals.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use anyhow::Result;
use cairn_core::events::{EntryType, ToolCompletedPayload};
use cairn_core::message::{ContentPart, Message, Role, ToolCall};
use cairn_core::provider::{
    AttemptUsage, ModelRequest, ModelResponse, Provider, ProviderError, StopReason, StreamEvent,
};
use cairn_core::storage::{JsonlStore, Storage};
use cairn_core::tool::{Capability, ReplayPolicy, Risk};
use cairn_core::{CancelToken, Session, TurnEvent};
use cairn_host::{Equipment, LeftOut, Step};
use serde_json::{Value, json};

use crate::Host;
use crate::jsonrpc::{self, Id, Incoming, Line, LineReader, MAX_MESSAGE_BYTES, Out, RpcError};

/// MCP protocol versions this server speaks (the stdio handshake ones),
/// oldest first; an unknown request is answered with the newest.
pub const PROTOCOL_VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// Settings of one server.
#[derive(Debug, Clone)]
pub struct McpOptions {
    /// The root: tools resolve paths inside it, the session's cwd.
    pub root: PathBuf,
    /// Tools per `tools/list` page.
    pub page_size: usize,
}

struct Server<'h> {
    host: &'h dyn Host,
    options: McpOptions,
    /// The tools served (the session's registry) and who answers their
    /// calls.
    equipment: Equipment,
    /// Tools loaded but not exposed, and why (said when one is called).
    hidden: HashMap<String, String>,
    session: Option<Session<JsonlStore>>,
    initialized: bool,
    client: String,
    calls: u64,
}

/// Serve MCP on `input`/`out` until the input closes. Bad lines are
/// answered and skipped; only a failed write (the client is gone) ends it
/// early.
pub fn serve(host: &dyn Host, options: McpOptions, input: impl BufRead + Send + 'static, out: &Out) -> Result<()> {
    // Nobody answers over MCP: the registry offers no Destructive tool
    // (the gate's refusal is what the client is told), and a Write tool is
    // exposed only when an allow rule names it or `--yes` approves every
    // Write call.
    let approver = host.policy(None)?;
    let tools = host.tools(&options.root, &approver, None)?;
    for note in &tools.notes {
        eprintln!("cairn mcp: {note}");
    }
    let exposes_writes = approver.writes_approved_by().is_some();
    let named = |name: &str| approver.allowlist().rules().iter().any(|r| r.tool() == name);
    let mut hidden = HashMap::new();
    let registry = tools.registry_where(
        &approver,
        |spec| {
            (spec.risk == Risk::Write && !exposes_writes && !named(&spec.name)).then(|| {
                format!(
                    "{} is a Write tool and is not exposed; start the server with `cairn mcp --allow {}` (or a pattern such as '{}(…)', or [approvals] allow in the config) to expose it, or with `cairn --yes mcp` to expose every Write tool",
                    spec.name, spec.name, spec.name
                )
            })
        },
        |spec, why| {
            let reason = match why {
                LeftOut::Hidden(reason) => reason,
                LeftOut::Refused(e) => format!("{} is not offered over MCP: {e}", spec.name),
            };
            hidden.insert(spec.name.clone(), reason);
        },
    );
    let mut server = Server {
        host,
        options,
        equipment: Equipment { tools: registry, approver },
        hidden,
        session: None,
        initialized: false,
        client: "unknown".to_owned(),
        calls: 0,
    };
    let calls: Arc<Mutex<HashMap<String, (Id, CancelToken)>>> = Arc::default();
    let (tx, rx) = mpsc::channel();
    let reader_out = out.clone();
    let reader_calls = Arc::clone(&calls);
    std::thread::spawn(move || read_loop(input, &reader_out, &reader_calls, &tx));
    while let Ok(Work { id, method, params, cancel }) = rx.recv() {
        let answer = match server.handle(&method, params, &cancel) {
            Ok(result) => jsonrpc::response(&id, result),
            Err(error) => jsonrpc::error_response(&id, &error),
        };
        if let Ok(mut calls) = calls.lock() {
            calls.remove(id.text());
        }
        // A cancelled request gets no answer (the client has moved on).
        if !cancel.is_cancelled() && out.send(&answer).is_err() {
            return Ok(());
        }
    }
    Ok(())
}

/// A request for the main thread, with the token a
/// `notifications/cancelled` naming it sets.
struct Work {
    id: Id,
    method: String,
    params: Value,
    cancel: CancelToken,
}

/// Own the input: answer what is not a message, cancel calls the client
/// cancels, queue requests in order. Ends at end of input (the requests
/// already queued are still answered).
fn read_loop(
    input: impl BufRead,
    out: &Out,
    calls: &Mutex<HashMap<String, (Id, CancelToken)>>,
    work: &mpsc::Sender<Work>,
) {
    let mut reader = LineReader::new(input, MAX_MESSAGE_BYTES);
    loop {
        let line = match reader.next_line() {
            Ok(Line::Eof) | Err(_) => return,
            Ok(line) => line,
        };
        let bytes = match &line {
            Line::Message(bytes) => bytes,
            _ => {
                if let Some(answer) = jsonrpc::refusal(&line) {
                    let _ = out.send(&answer);
                }
                continue;
            }
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match Incoming::parse(bytes) {
            Err((id, error)) => {
                let _ = out.send(&jsonrpc::error_response(&id, &error));
            }
            // Answered here, at once, even while a call runs (the spec
            // asks a server to answer ping promptly).
            Ok(Incoming::Request { id, method, .. }) if method == "ping" => {
                let _ = out.send(&jsonrpc::response(&id, json!({})));
            }
            Ok(Incoming::Request { id, method, params }) => {
                // Registered when read, so a cancel right behind it is kept.
                let cancel = CancelToken::new();
                if let Ok(mut calls) = calls.lock() {
                    calls.insert(id.text().to_owned(), (id.clone(), cancel.clone()));
                }
                if work.send(Work { id, method, params, cancel }).is_err() {
                    return;
                }
            }
            Ok(Incoming::Notification { method, params }) if method == "notifications/cancelled" => {
                let Some(request) = params.get("requestId") else { continue };
                let token =
                    calls.lock().ok().and_then(|c| c.values().find(|(id, _)| id.is(request)).map(|(_, t)| t.clone()));
                if let Some(token) = token {
                    token.cancel();
                }
            }
            // Other notifications (initialized, …) and stray responses
            // need nothing.
            Ok(Incoming::Notification { .. } | Incoming::Response { .. }) => {}
        }
    }
}

impl Server<'_> {
    fn handle(&mut self, method: &str, params: Value, cancel: &CancelToken) -> Result<Value, RpcError> {
        match method {
            "initialize" => Ok(self.initialize(&params)),
            "ping" => Ok(json!({})),
            "tools/list" | "tools/call" if !self.initialized => Err(RpcError::new(
                jsonrpc::code::INVALID_REQUEST,
                "the server is not initialized: send initialize first",
            )),
            "tools/list" => self.list(&params),
            "tools/call" => self.call(&params, cancel),
            other => Err(RpcError::no_method(other, "MCP")),
        }
    }

    fn initialize(&mut self, params: &Value) -> Value {
        let asked = params.get("protocolVersion").and_then(Value::as_str).unwrap_or_default();
        let version = PROTOCOL_VERSIONS.iter().find(|v| **v == asked).unwrap_or(&PROTOCOL_VERSIONS[3]);
        if let Some(name) = params.pointer("/clientInfo/name").and_then(Value::as_str) {
            self.client = name.chars().take(100).collect();
        }
        self.initialized = true;
        json!({
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": false}},
            "serverInfo": {"name": "cairn", "version": env!("CARGO_PKG_VERSION")},
            "instructions": format!(
                "cairn's tools, confined to {}; every call is recorded in a cairn session file. Write tools appear only when allowed; Destructive tools never.",
                self.options.root.display()
            ),
        })
    }

    fn list(&self, params: &Value) -> Result<Value, RpcError> {
        let start = match params.get("cursor") {
            None | Some(Value::Null) => 0,
            Some(Value::String(c)) => c
                .strip_prefix("cairn-")
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|n| *n <= self.equipment.tools.len())
                .ok_or_else(|| {
                    RpcError::params(format!("invalid cursor {c:?}: pass back a nextCursor this server gave"))
                })?,
            Some(_) => return Err(RpcError::params("the cursor must be a string")),
        };
        let page = self.options.page_size.max(1);
        let specs = self.equipment.tools.specs();
        let end = start.saturating_add(page).min(specs.len());
        let tools: Vec<Value> = specs[start..end]
            .iter()
            .map(|spec| {
                json!({
                    "name": spec.name,
                    "description": spec.description,
                    "inputSchema": spec.input_schema,
                    "annotations": {
                        "title": spec.name,
                        "readOnlyHint": spec.risk == Risk::ReadOnly,
                        "destructiveHint": spec.risk == Risk::Destructive,
                        "idempotentHint": spec.replay == ReplayPolicy::Idempotent,
                        "openWorldHint": spec.capabilities.contains(&Capability::Network),
                    },
                })
            })
            .collect();
        let mut result = json!({"tools": tools});
        if end < specs.len() {
            result["nextCursor"] = json!(format!("cairn-{end}"));
        }
        Ok(result)
    }

    fn call(&mut self, params: &Value, cancel: &CancelToken) -> Result<Value, RpcError> {
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| RpcError::params("tools/call needs a string \"name\""))?
            .to_owned();
        if self.equipment.tools.get(&name).is_none() {
            return Err(RpcError::params(match self.hidden.get(&name) {
                Some(reason) => reason.clone(),
                None => format!("unknown tool {name:?}; tools/list says which tools this server offers"),
            }));
        }
        // Arguments of any shape reach the core, which rejects what does not
        // fit the schema as a settled, recorded call (a tool error).
        let arguments = params.get("arguments").cloned().unwrap_or_else(|| json!({}));
        if self.session.is_none() {
            let store =
                self.host.create_session(&self.options.root).map_err(|e| RpcError::internal(format!("{e:#}")))?;
            eprintln!("cairn mcp: recording calls in session {} ({})", store.header().id, store.path().display());
            let session = Session::open(store, self.host.session_config())
                .map_err(|e| RpcError::internal(format!("cannot open the MCP session: {e}")))?;
            self.session = Some(session);
        }
        let Some(session) = self.session.as_mut() else {
            return Err(RpcError::internal("no session"));
        };
        self.calls += 1;
        // The client's trace, when it sends one (issue 51).
        let traceparent = params.pointer("/_meta/traceparent").and_then(Value::as_str);
        cairn_telemetry::adopt_traceparent(&session.store().header().id, traceparent);
        let provider = OneCall {
            call: ToolCall { id: format!("mcp-{}", self.calls), name: name.clone(), arguments },
            asked: AtomicBool::new(false),
        };
        let mut settled: Option<(bool, String)> = None;
        let mut truncated = false;
        let mut observer = |event: &TurnEvent| match event {
            TurnEvent::ToolCompleted { exit_code, output_summary, truncated: cut, .. } => {
                settled = Some((*exit_code != 0, output_summary.clone()));
                truncated = *cut;
            }
            TurnEvent::ToolFailed { reason, .. } => settled = Some((true, format!("the call failed: {reason}"))),
            TurnEvent::ToolRejected { reason, .. } => settled = Some((true, format!("the call was refused: {reason}"))),
            _ => {}
        };
        let prompt = format!("MCP client {:?} called tools/call {name}", self.client);
        self.equipment
            .run(session, &provider, Step::Prompt(&prompt), &mut observer, cancel)
            .map_err(|e| RpcError::internal(format!("the call could not be recorded: {e}")))?;
        // The cap keeps a model's prompt small; an MCP client has no prompt
        // to protect and cannot reach the session file, so it gets the
        // whole output as stored (bounded by the stored-output limit).
        let whole = if truncated { stored_full_output(session) } else { None };
        let (is_error, text) = match settled {
            Some((is_error, summary)) => (is_error, whole.unwrap_or(summary)),
            None if cancel.is_cancelled() => (true, "the call was cancelled before it ran".to_owned()),
            None => (true, "the call was not settled".to_owned()),
        };
        Ok(json!({"content": [{"type": "text", "text": text}], "isError": is_error}))
    }
}

/// The full output of the session's last completed call, kept out of the
/// prompt in its `toolCompleted` entry.
fn stored_full_output(session: &Session<JsonlStore>) -> Option<String> {
    let head = session.head()?;
    let path = session.store().path_to(head).ok()?;
    path.into_iter()
        .rev()
        .find(|e| EntryType::of(&e.entry_type) == Some(EntryType::ToolCompleted))
        .and_then(|e| e.payload.parse::<ToolCompletedPayload>().ok())
        .and_then(|p| p.full_output)
}

/// The provider of one MCP call: its first answer asks for exactly the
/// client's call, the next one ends the turn.
struct OneCall {
    call: ToolCall,
    asked: AtomicBool,
}

impl Provider for OneCall {
    fn name(&self) -> &str {
        "mcp"
    }

    fn model(&self) -> &str {
        "tools/call"
    }

    fn complete(
        &self,
        _request: &ModelRequest<'_>,
        _observer: &mut dyn FnMut(&StreamEvent),
        _cancel: &CancelToken,
    ) -> Result<ModelResponse, ProviderError> {
        let first = !self.asked.swap(true, Ordering::SeqCst);
        let (content, stop) = if first {
            (vec![ContentPart::ToolCall(self.call.clone())], StopReason::ToolUse)
        } else {
            (vec![ContentPart::Text { text: "(settled)".to_owned() }], StopReason::EndTurn)
        };
        let usage = AttemptUsage {
            provider: "mcp".to_owned(),
            model: "tools/call".to_owned(),
            attempt: 1,
            ..AttemptUsage::default()
        };
        Ok(ModelResponse { message: Message { role: Role::Assistant, content }, stop, attempts: vec![usage] })
    }
}
