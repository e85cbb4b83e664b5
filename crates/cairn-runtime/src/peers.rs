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

use std::collections::{BTreeMap, BTreeSet};
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

    /// A reader of `id`'s log from its start, for a wait that looks again
    /// and again: each look reads only what was appended since the last.
    fn follow(&self, id: &str) -> Box<dyn Follow>;

    /// How long a `wait_for_messages` waits between two looks.
    fn poll_every(&self) -> Duration;
}

/// One session's log, read in order across looks.
pub trait Follow: std::marker::Send {
    /// Visit each entry appended since the last call (every entry the first
    /// time; none while the log cannot be read).
    fn poll(&mut self, f: &mut dyn FnMut(&Entry));
}

/// Whether `from` may send to `to` (a session id).
fn may_talk(logs: &dyn Logs, from: &str, to: &str) -> bool {
    if parent_of(from) == Some(to) || parent_of(to) == Some(from) {
        return true;
    }
    parent_of(from).is_some() && parent_of(from) == parent_of(to) && logs.peers_allowed(from) && logs.peers_allowed(to)
}

/// One message as both logs hold it.
#[derive(Debug, Clone, PartialEq)]
struct Message {
    id: String,
    from: String,
    text: String,
}

/// The message in `e`, if it is a settled `send_message` receipt of
/// `sender` addressed to `to` (directly or, from its parent, to
/// `children`).
fn sent_to(e: &Entry, sender: &str, to: &str) -> Option<Message> {
    let p = cairn_core::events::payload_of::<ToolCompletedPayload>(e)?;
    if p.tool != SEND {
        return None;
    }
    let s = p.receipt.structured_output.as_ref()?;
    let addressed =
        s["to"].as_str() == Some(to) || (s["to"].as_str() == Some(CHILDREN) && parent_of(to) == Some(sender));
    match (addressed, s["id"].as_str(), s["text"].as_str()) {
        (true, Some(id), Some(text)) => {
            Some(Message { id: id.to_owned(), from: sender.to_owned(), text: text.to_owned() })
        }
        _ => None,
    }
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

/// One `wait_for_messages` call's view of the family, kept across its
/// looks: what `me` had received when the call began (its own log does not
/// change while the call runs), a reader per sender that reads only what
/// was appended since the last look, the messages found so far, and which
/// siblings were started with `peers: true` (a fact, written once).
struct Look<'a> {
    logs: &'a dyn Logs,
    me: &'a str,
    seen: BTreeSet<String>,
    readers: BTreeMap<String, Box<dyn Follow>>,
    found: Vec<Message>,
    peers: BTreeSet<String>,
}

impl<'a> Look<'a> {
    fn new(logs: &'a dyn Logs, me: &'a str) -> Self {
        let seen = received(logs, me);
        Self { logs, me, seen, readers: BTreeMap::new(), found: Vec::new(), peers: BTreeSet::new() }
    }

    /// Whether `id` was started with `peers: true` (asked again only
    /// while it was not: the fact may not be committed yet).
    fn peers_allowed(&mut self, id: &str) -> bool {
        if self.peers.contains(id) {
            return true;
        }
        let allowed = self.logs.peers_allowed(id);
        if allowed {
            self.peers.insert(id.to_owned());
        }
        allowed
    }

    /// Who `me` may hear from now: its parent, its children, its allowed
    /// siblings (children are started while the wait runs).
    fn senders(&mut self) -> Vec<String> {
        let mut out = self.logs.children(self.me);
        if let Some(parent) = parent_of(self.me) {
            out.push(parent.to_owned());
            if self.peers_allowed(self.me) {
                for sibling in self.logs.children(parent) {
                    if sibling != self.me && self.peers_allowed(&sibling) {
                        out.push(sibling);
                    }
                }
            }
        }
        out
    }

    /// Every message for `me` not received before, found so far.
    fn unread(&mut self) -> Vec<Message> {
        for sender in self.senders() {
            let logs = self.logs;
            let reader = self.readers.entry(sender.clone()).or_insert_with(|| logs.follow(&sender));
            let (me, seen, found) = (self.me, &self.seen, &mut self.found);
            reader.poll(&mut |e| {
                if let Some(m) = sent_to(e, &sender, me)
                    && !seen.contains(&m.id)
                    && !found.iter().any(|f| f.id == m.id)
                {
                    found.push(m);
                }
            });
        }
        self.found.clone()
    }
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
        let mut look = Look::new(self.logs.as_ref(), me);
        let messages = loop {
            let found = look.unread();
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use cairn_core::storage::RawJson;

    use super::*;

    /// A family in memory that counts how many entries were handed out, so
    /// a test can tell one read of a log from a read at every look.
    #[derive(Default)]
    struct Memory {
        logs: Mutex<HashMap<String, Vec<Entry>>>,
        handed: AtomicUsize,
    }

    impl Memory {
        fn append(&self, id: &str, tool: &str, structured: Value) {
            let mut logs = self.logs.lock().unwrap();
            let log = logs.entry(id.to_owned()).or_default();
            let n = log.len() + 1;
            let payload = ToolCompletedPayload {
                invocation_id: format!("i{n}"),
                call_id: format!("c{n}"),
                tool: tool.to_owned(),
                receipt: receipt("".to_owned(), structured),
                full_output: None,
                settled_by: None,
                bypasses: Vec::new(),
            };
            log.push(Entry {
                seq: n as u64,
                timestamp: 0,
                id: format!("e{n}"),
                parent_id: None,
                entry_type: "toolCompleted".to_owned(),
                payload: RawJson::from_json(serde_json::to_string(&payload).unwrap()).unwrap(),
            });
        }

        fn send(&self, from: &str, to: &str, n: usize) {
            let id = format!("{from}/s{n}");
            self.append(from, SEND, json!({"id": id, "from": from, "to": to, "text": format!("m{n}")}));
        }
    }

    struct Cursor {
        memory: Arc<Memory>,
        id: String,
        next: usize,
    }

    impl Follow for Cursor {
        fn poll(&mut self, f: &mut dyn FnMut(&Entry)) {
            let logs = self.memory.logs.lock().unwrap();
            for e in logs.get(&self.id).map(|l| &l[self.next..]).unwrap_or_default() {
                self.memory.handed.fetch_add(1, Ordering::SeqCst);
                f(e);
                self.next += 1;
            }
        }
    }

    impl Logs for Arc<Memory> {
        fn exists(&self, id: &str) -> bool {
            self.logs.lock().unwrap().contains_key(id)
        }
        fn children(&self, id: &str) -> Vec<String> {
            let prefix = format!("{id}+");
            let mut ids: Vec<String> = self
                .logs
                .lock()
                .unwrap()
                .keys()
                .filter(|k| k.strip_prefix(&prefix).is_some_and(|rest| !rest.contains('+')))
                .cloned()
                .collect();
            ids.sort();
            ids
        }
        fn peers_allowed(&self, _id: &str) -> bool {
            false
        }
        fn visit(&self, id: &str, f: &mut dyn FnMut(&Entry)) {
            for e in self.logs.lock().unwrap().get(id).cloned().unwrap_or_default() {
                self.handed.fetch_add(1, Ordering::SeqCst);
                f(&e);
            }
        }
        fn follow(&self, id: &str) -> Box<dyn Follow> {
            Box::new(Cursor { memory: Arc::clone(self), id: id.to_owned(), next: 0 })
        }
        fn poll_every(&self) -> Duration {
            Duration::from_millis(1)
        }
    }

    #[test]
    fn a_wait_reads_each_senders_entry_once_however_many_looks_it_takes() {
        let memory = Arc::new(Memory::default());
        memory.append("p", "other", json!({}));
        // The child's long log: 200 settled calls, none a message.
        for _ in 0..200 {
            memory.append("p+c", "other", json!({}));
        }
        let logs = Arc::clone(&memory);
        let mut look = Look::new(&logs, "p");
        let looks = 50;
        for _ in 0..looks {
            assert!(look.unread().is_empty());
        }
        memory.send("p+c", "p", 1);
        let found = look.unread();
        assert_eq!(found, vec![Message { id: "p+c/s1".into(), from: "p+c".into(), text: "m1".into() }]);
        // The parent's own log once (what it had received), each of the
        // child's 201 entries once: not 201 × 51 looks.
        assert_eq!(memory.handed.load(Ordering::SeqCst), 1 + 201);
    }

    #[test]
    fn a_message_received_before_is_not_received_again_and_a_broadcast_reaches_each_child() {
        let memory = Arc::new(Memory::default());
        memory.append("p", "other", json!({}));
        memory.append("p+a", "other", json!({}));
        memory.send("p", CHILDREN, 1);
        memory.send("p", "p+a", 2);
        memory.append("p+a", RECEIVE, json!({"messages": [{"id": "p/s1"}]}));
        let logs = Arc::clone(&memory);
        let ids = |found: Vec<Message>| found.into_iter().map(|m| m.id).collect::<Vec<_>>();
        assert_eq!(ids(Look::new(&logs, "p+a").unread()), ["p/s2"]);
        memory.append("p+b", "other", json!({}));
        assert_eq!(ids(Look::new(&logs, "p+b").unread()), ["p/s1"]);
        // Nothing is addressed to the parent.
        assert!(Look::new(&logs, "p").unread().is_empty());
    }
}
