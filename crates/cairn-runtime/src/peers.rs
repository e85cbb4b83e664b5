//! Peer links inside a session family: `send_message {to, text}` and
//! `wait_for_messages {timeout?}`.
//!
//! No mailbox beside the sessions (files, or a worker's database: the
//! family's [`Logs`]): a message is sent when the
//! sender's `send_message` call is settled (its receipt holds `from`,
//! `to`, `text` and the message id `<sender id>/<invocation id>`), so it is
//! committed in the sender's log exactly once (the turn settles an
//! invocation once; re-running an unsettled call after a crash yields the
//! same id). It is received when one of the receiver's `wait_for_messages`
//! calls is settled holding it: that call reads the senders' logs and
//! leaves out every id its own log already received, so a message lands in
//! the receiver's log once — never lost (the sender's log keeps it until
//! it is taken), never twice.
//!
//! Who may talk: a child and its parent (`to: "parent"`, a child id, or
//! `"children"` for every child), and siblings whose parent started them
//! with `peers: true`. Owns: addressing, the message id, the scan. Must
//! not: write any session (both tools only read logs; the turn commits).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_core::events::ToolCompletedPayload;
use cairn_core::storage::{Entry, now_millis};
use cairn_core::tool::{
    ReplayPolicy, Risk, Tool, ToolContext, ToolError, ToolReceipt, ToolRequest, ToolSpec, Validation,
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::family::parent_of;

/// The tool that sends.
pub const SEND: &str = "send_message";
/// The tool that receives.
pub const RECEIVE: &str = "wait_for_messages";
/// Broadcast to every direct child.
pub const CHILDREN: &str = "children";

/// The family's logs, read, never written: session files, or sessions of
/// a worker's database (`subagents::FamilyLogs` over either `Place`).
pub trait Logs: std::marker::Send + Sync + 'static {
    /// Whether session `id` exists.
    fn exists(&self, id: &str) -> bool;

    /// The ids of `id`'s direct children, sorted.
    fn children(&self, id: &str) -> Vec<String>;

    /// Whether `id` was started with `peers: true` (its `subagent` fact).
    fn peers_allowed(&self, id: &str) -> bool;

    /// Each entry of `id`'s log, in order (none when it cannot be read).
    fn visit(&self, id: &str, f: &mut dyn FnMut(&Entry));

    /// How long a `wait_for_messages` waits between two looks (each look
    /// reads every sender's log).
    fn poll_every(&self) -> Duration;
}

/// Whether `from` may send to `to` (a session id).
fn may_talk(logs: &dyn Logs, from: &str, to: &str) -> bool {
    if parent_of(from) == Some(to) || parent_of(to) == Some(from) {
        return true;
    }
    parent_of(from).is_some() && parent_of(from) == parent_of(to) && logs.peers_allowed(from) && logs.peers_allowed(to)
}

/// Who `id` may hear from: its parent, its children, its allowed siblings.
fn senders(logs: &dyn Logs, id: &str) -> Vec<String> {
    let mut out = logs.children(id);
    if let Some(parent) = parent_of(id) {
        out.push(parent.to_owned());
        if logs.peers_allowed(id) {
            out.extend(logs.children(parent).into_iter().filter(|s| s != id && logs.peers_allowed(s)));
        }
    }
    out
}

/// One message as both logs hold it.
#[derive(Debug, Clone, PartialEq)]
struct Message {
    id: String,
    from: String,
    text: String,
}

/// Settled `send_message` receipts of `sender` addressed to `to` (directly
/// or, from its parent, to `children`).
fn sent_to(logs: &dyn Logs, sender: &str, to: &str) -> Vec<Message> {
    let mut out = Vec::new();
    logs.visit(sender, &mut |e| {
        let Some(p) = cairn_core::events::payload_of::<ToolCompletedPayload>(e) else { return };
        if p.tool != SEND {
            return;
        }
        let Some(s) = p.receipt.structured_output.as_ref() else { return };
        let addressed =
            s["to"].as_str() == Some(to) || (s["to"].as_str() == Some(CHILDREN) && parent_of(to) == Some(sender));
        if addressed && let (Some(id), Some(text)) = (s["id"].as_str(), s["text"].as_str()) {
            out.push(Message { id: id.to_owned(), from: sender.to_owned(), text: text.to_owned() });
        }
    });
    out
}

/// Message ids `me` has received (its settled `wait_for_messages` calls).
fn received(logs: &dyn Logs, me: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    logs.visit(me, &mut |e| {
        let Some(p) = cairn_core::events::payload_of::<ToolCompletedPayload>(e) else { return };
        if p.tool != RECEIVE {
            return;
        }
        if let Some(messages) = p.receipt.structured_output.as_ref().and_then(|s| s["messages"].as_array()) {
            ids.extend(messages.iter().filter_map(|m| m["id"].as_str().map(str::to_owned)));
        }
    });
    ids
}

fn unread(logs: &dyn Logs, me: &str) -> Vec<Message> {
    let seen = received(logs, me);
    senders(logs, me).iter().flat_map(|s| sent_to(logs, s, me)).filter(|m| !seen.contains(&m.id)).collect()
}

#[derive(Debug, Deserialize)]
struct SendArgs {
    to: String,
    text: String,
}

#[derive(Debug, Deserialize)]
struct WaitArgs {
    #[serde(default)]
    timeout: Option<u64>,
}

struct Send {
    spec: ToolSpec,
    logs: Arc<dyn Logs>,
}

struct Receive {
    spec: ToolSpec,
    logs: Arc<dyn Logs>,
}

/// The two tools over the family's `logs`.
pub fn tools(logs: Arc<dyn Logs>) -> [Arc<dyn Tool>; 2] {
    let send = ToolSpec {
        name: SEND.to_owned(),
        description: "Send a message to your parent (\"parent\"), a child (its id), every child (\"children\"), or a sibling when allowed.".to_owned(),
        input_schema: json!({"type": "object", "properties": {
            "to": {"type": "string", "minLength": 1}, "text": {"type": "string", "minLength": 1}}, "required": ["to", "text"]}),
        risk: Risk::ReadOnly,
        capabilities: BTreeSet::new(),
        replay: ReplayPolicy::Idempotent,
    };
    let receive = ToolSpec {
        name: RECEIVE.to_owned(),
        description: "Wait for messages from your parent, children or siblings; returns the ones not received yet."
            .to_owned(),
        input_schema: json!({"type": "object", "properties": {
            "timeout": {"type": "integer", "minimum": 0, "description": "Seconds to wait at most (default 60)."}}}),
        risk: Risk::ReadOnly,
        capabilities: BTreeSet::new(),
        replay: ReplayPolicy::Idempotent,
    };
    [Arc::new(Send { spec: send, logs: Arc::clone(&logs) }), Arc::new(Receive { spec: receive, logs })]
}

impl Send {
    fn resolve(&self, request: &ToolRequest) -> Result<(String, String), String> {
        let args: SendArgs = serde_json::from_value(request.arguments.clone()).map_err(|e| e.to_string())?;
        let me = request.session_id.as_str();
        let to = match args.to.as_str() {
            "parent" => parent_of(me).ok_or("this session has no parent")?.to_owned(),
            CHILDREN => {
                if self.logs.children(me).is_empty() {
                    return Err("this session has no children yet".to_owned());
                }
                CHILDREN.to_owned()
            }
            id if self.logs.exists(id) && may_talk(self.logs.as_ref(), me, id) => id.to_owned(),
            id => {
                return Err(format!(
                    "{id:?} is not a session this one may message (its parent, its children, or siblings started with peers: true)"
                ));
            }
        };
        Ok((to, args.text))
    }
}

fn receipt(summary: String, structured: Value) -> ToolReceipt {
    ToolReceipt {
        exit_code: 0,
        output_summary: summary,
        structured_output: Some(structured),
        affected_entities: Vec::new(),
        duration_ms: 0,
        tier: Risk::ReadOnly,
        timestamp: now_millis(),
        truncated: false,
    }
}

impl Tool for Send {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn validate(&self, request: &ToolRequest) -> Validation {
        match self.resolve(request) {
            Ok(_) => Validation::Valid,
            Err(reason) => Validation::Invalid(reason),
        }
    }

    fn execute(&self, request: &ToolRequest, _ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let (to, text) = self.resolve(request).map_err(ToolError::InvalidArguments)?;
        let id = format!("{}/{}", request.session_id, request.invocation_id);
        Ok(receipt(
            format!("sent to {to} (message {id})"),
            json!({"id": id, "from": request.session_id, "to": to, "text": text}),
        ))
    }
}

impl Tool for Receive {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let args: WaitArgs = serde_json::from_value(request.arguments.clone())
            .map_err(|e| ToolError::InvalidArguments(e.to_string()))?;
        let deadline = Instant::now() + Duration::from_secs(args.timeout.unwrap_or(60));
        let me = request.session_id.as_str();
        let messages = loop {
            let found = unread(self.logs.as_ref(), me);
            if !found.is_empty() || Instant::now() >= deadline {
                break found;
            }
            if ctx.cancel.is_cancelled() {
                return Err(ToolError::Cancelled);
            }
            std::thread::sleep(self.logs.poll_every());
        };
        let summary = if messages.is_empty() {
            "no messages".to_owned()
        } else {
            messages.iter().map(|m| format!("from {}: {}\n", m.from, m.text)).collect()
        };
        let list: Vec<Value> = messages.iter().map(|m| json!({"id": m.id, "from": m.from, "text": m.text})).collect();
        Ok(receipt(summary, json!({"messages": list})))
    }
}
