//! Peer links inside a session family: `send_message {to, text}` and
//! `wait_for_messages {timeout?}`.
//!
//! No mailbox beside the session files: a message is sent when the
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
//! not: write any file (both tools only read logs; the turn commits).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_core::events::ToolCompletedPayload;
use cairn_core::storage::{JsonlStore, Storage, now_millis};
use cairn_core::tool::{
    ReplayPolicy, Risk, Tool, ToolContext, ToolError, ToolReceipt, ToolRequest, ToolSpec, Validation,
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::family::{SEP, parent_of};

/// The tool that sends.
pub const SEND: &str = "send_message";
/// The tool that receives.
pub const RECEIVE: &str = "wait_for_messages";
/// Broadcast to every direct child.
pub const CHILDREN: &str = "children";

/// Where session files live, and whether siblings may talk (per session,
/// from its `subagent` fact).
#[derive(Debug, Clone)]
pub struct Directory {
    sessions: PathBuf,
}

impl Directory {
    /// Sessions in `sessions`.
    pub fn new(sessions: PathBuf) -> Self {
        Self { sessions }
    }

    fn path(&self, id: &str) -> PathBuf {
        self.sessions.join(format!("{id}.jsonl"))
    }

    fn exists(&self, id: &str) -> bool {
        self.path(id).is_file()
    }

    fn children(&self, id: &str) -> Vec<String> {
        let prefix = format!("{id}{SEP}");
        let mut ids: Vec<String> = std::fs::read_dir(&self.sessions)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".jsonl")).map(str::to_owned))
                    .filter(|stem| stem.strip_prefix(&prefix).is_some_and(|rest| !rest.contains(SEP)))
                    .collect()
            })
            .unwrap_or_default();
        ids.sort();
        ids
    }

    fn peers_allowed(&self, id: &str) -> bool {
        JsonlStore::open_read_only(&self.path(id))
            .ok()
            .and_then(|s| crate::family::child_fact(&s))
            .is_some_and(|f| f.peers)
    }

    /// Whether `from` may send to `to` (a session id).
    fn may_talk(&self, from: &str, to: &str) -> bool {
        if parent_of(from) == Some(to) || parent_of(to) == Some(from) {
            return true;
        }
        parent_of(from).is_some()
            && parent_of(from) == parent_of(to)
            && self.peers_allowed(from)
            && self.peers_allowed(to)
    }

    /// Who `id` may hear from: its parent, its children, its allowed siblings.
    fn senders(&self, id: &str) -> Vec<String> {
        let mut out = self.children(id);
        if let Some(parent) = parent_of(id) {
            out.push(parent.to_owned());
            if self.peers_allowed(id) {
                out.extend(self.children(parent).into_iter().filter(|s| s != id && self.peers_allowed(s)));
            }
        }
        out
    }
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
fn sent_to(dir: &Directory, sender: &str, to: &str) -> Vec<Message> {
    let mut out = Vec::new();
    let Ok(store) = JsonlStore::open_read_only(&dir.path(sender)) else { return out };
    store.visit_entries(&mut |e| {
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
fn received(dir: &Directory, me: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let Ok(store) = JsonlStore::open_read_only(&dir.path(me)) else { return ids };
    store.visit_entries(&mut |e| {
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

fn unread(dir: &Directory, me: &str) -> Vec<Message> {
    let seen = received(dir, me);
    dir.senders(me).iter().flat_map(|s| sent_to(dir, s, me)).filter(|m| !seen.contains(&m.id)).collect()
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
    dir: Arc<Directory>,
}

struct Receive {
    spec: ToolSpec,
    dir: Arc<Directory>,
}

/// The two tools over session files in `dir`.
pub fn tools(dir: Arc<Directory>) -> [Arc<dyn Tool>; 2] {
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
    [Arc::new(Send { spec: send, dir: Arc::clone(&dir) }), Arc::new(Receive { spec: receive, dir })]
}

impl Send {
    fn resolve(&self, request: &ToolRequest) -> Result<(String, String), String> {
        let args: SendArgs = serde_json::from_value(request.arguments.clone()).map_err(|e| e.to_string())?;
        let me = request.session_id.as_str();
        let to = match args.to.as_str() {
            "parent" => parent_of(me).ok_or("this session has no parent")?.to_owned(),
            CHILDREN => {
                if self.dir.children(me).is_empty() {
                    return Err("this session has no children yet".to_owned());
                }
                CHILDREN.to_owned()
            }
            id if self.dir.exists(id) && self.dir.may_talk(me, id) => id.to_owned(),
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
            let found = unread(&self.dir, me);
            if !found.is_empty() || Instant::now() >= deadline {
                break found;
            }
            if ctx.cancel.is_cancelled() {
                return Err(ToolError::Cancelled);
            }
            std::thread::sleep(Duration::from_millis(50));
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

/// The directory of session files (for the CLI's wiring).
pub fn directory(sessions: &Path) -> Arc<Directory> {
    Arc::new(Directory::new(sessions.to_path_buf()))
}
