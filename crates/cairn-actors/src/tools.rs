//! The agent's tools over a running world: `actor_build` (C → `.wasm`
//! through the native `cc`), `actor_spawn`, `actor_send` (optionally
//! waiting for the reply), `actor_upgrade`, `actor_rollback`,
//! `actor_stop`, `actor_remove`, `actor_list`, `actor_logs`. Every call is
//! made as the native participant `agent` (so the broker's permission rule
//! lets it manage any actor) and is turned into one broker request or
//! message; this module owns argument checking and receipts, never
//! routing or lifecycle (see `broker`).
//!
//! Risk tiers: list and logs ReadOnly; build, spawn, send, upgrade,
//! rollback and stop Write; remove Destructive (it archives the actor: nothing is
//! deleted, but the actor is gone from the world).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_core::tool::{
    Capability, ReplayPolicy, Risk, Tool, ToolContext, ToolError, ToolReceipt, ToolRequest, ToolSpec,
};
use serde_json::{Value, json};

use crate::broker::World;
use crate::message::AGENT;

/// How long a broker request may take (an upgrade runs transcript tests,
/// 10 s per `expect`).
const REQUEST_WAIT: Duration = Duration::from_secs(600);
/// How long `actor_build` waits for `cc` (its clang runs at most
/// `cc::BUILD_TIMEOUT`; builds queue behind each other).
const BUILD_WAIT: Duration = Duration::from_secs(600);
/// Longest `wait_secs` an `actor_send` may ask for.
const MAX_SEND_WAIT: f64 = 600.0;
/// Bytes of `stderr.log` `actor_logs` returns at most (its tail).
const LOG_TAIL: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Build,
    Spawn,
    Send,
    Upgrade,
    Rollback,
    Stop,
    Remove,
    List,
    Logs,
}

/// One `actor_*` tool bound to a world.
pub struct ActorTool {
    kind: Kind,
    spec: ToolSpec,
    world: Arc<World>,
}

impl std::fmt::Debug for ActorTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActorTool").field("name", &self.spec.name).finish_non_exhaustive()
    }
}

fn spec(name: &str, description: &str, risk: Risk, replay: ReplayPolicy, schema: Value) -> ToolSpec {
    ToolSpec {
        name: name.to_owned(),
        description: description.to_owned(),
        input_schema: schema,
        risk,
        capabilities: BTreeSet::<Capability>::new(),
        replay,
    }
}

fn id_schema(extra: Value) -> Value {
    let mut props = json!({"id": {"type": "string", "description": "actor id (a-z 0-9 - _, at most 64)"}});
    if let (Some(p), Value::Object(e)) = (props.as_object_mut(), extra) {
        p.extend(e);
    }
    json!({"type": "object", "properties": props, "required": ["id"], "additionalProperties": false})
}

/// The `limits` of `actor_spawn`: the spawn request's (see
/// `broker::requests`, which checks them: each a whole number, never above
/// the spawner's own, here the world's).
fn limits_schema() -> Value {
    let n = |d: &str| json!({"type": "integer", "minimum": 0, "description": d});
    json!({
        "type": "object",
        "description": "lower this actor's limits below the world's (never above; absent ones are the world's)",
        "properties": {
            "memory_bytes": n("all linear memories of an instance together, bytes"),
            "table_elements": n("all table elements of an instance together"),
            "instances": n("core instances of an instance"),
            "memories": n("linear memories of an instance"),
            "tables": n("tables of an instance"),
            "disk_bytes": n("/data and /public together, bytes"),
            "disk_entries": n("/data and /public together, files and directories"),
            "fuel": n("fuel per instance (only in a world that meters fuel)")
        },
        "additionalProperties": false
    })
}

/// Every `actor_*` tool for `world`, acting as `agent`.
pub fn actor_tools(world: Arc<World>) -> Vec<Arc<dyn Tool>> {
    let wasm = json!({
        "wasm": {"type": "string", "description": "path of the .wasm (or .wat) file"},
        "source": {"type": "string", "description": "source directory; its tests/*.jsonl gate upgrades"},
        "built_by": {"type": "string", "description": "what built the wasm (recorded in meta.json)"}
    });
    let specs = [
        (
            Kind::Build,
            spec(
                "actor_build",
                "Compile C into an actor with the world's `cc` (clang --target=wasm32-wasi, wasi-libc, -O2). Give `files` (name → text; every top-level .c is compiled, tests/*.jsonl transcripts travel with the source) or `source` (a .c file or a directory). Returns the `wasm` and `source` paths to pass to actor_spawn / actor_upgrade, or clang's errors.",
                Risk::Write,
                ReplayPolicy::Never,
                json!({"type": "object", "properties": {
                "name": {"type": "string", "description": "build name (a-z 0-9 - _); a new build of a name replaces the last"},
                "files": {"type": "object", "additionalProperties": {"type": "string"}, "description": "file name → content, e.g. {\"main.c\": \"…\", \"tests/echo.jsonl\": \"…\"}"},
                "source": {"type": "string", "description": "path of a .c file or a source directory (instead of files)"}},
                "required": ["name"], "additionalProperties": false}),
            ),
        ),
        (
            Kind::Spawn,
            spec(
                "actor_spawn",
                "Start a new WASM actor from a .wasm/.wat file (WASI command component or p1 module).",
                Risk::Write,
                ReplayPolicy::Never,
                json!({"type": "object", "properties": {
                "id": {"type": "string", "description": "new actor id (a-z 0-9 - _, at most 64)"},
                "wasm": wasm["wasm"], "source": wasm["source"], "built_by": wasm["built_by"],
                "http": {"type": "boolean", "description": "let the actor send requests to the native `http` (outgoing HTTP); default false"},
                "limits": limits_schema()},
                "required": ["id", "wasm"], "additionalProperties": false}),
            ),
        ),
        (
            Kind::Send,
            spec(
                "actor_send",
                "Send a JSON message to an actor; with wait_secs, wait that long for its reply and return it.",
                Risk::Write,
                ReplayPolicy::Never,
                json!({"type": "object", "properties": {
                "to": {"type": "string", "description": "recipient actor id"},
                "body": {"description": "the message body (any JSON)"},
                "wait_secs": {"type": "number", "description": "seconds to wait for a reply (default: do not wait)"}},
                "required": ["to", "body"], "additionalProperties": false}),
            ),
        ),
        (
            Kind::Upgrade,
            spec(
                "actor_upgrade",
                "Install a new version of an actor. Its source tests/*.jsonl transcripts (or a 2 s smoke test) must pass first; otherwise the old version keeps running.",
                Risk::Write,
                ReplayPolicy::Never,
                id_schema(wasm.clone()),
            ),
        ),
        (
            Kind::Rollback,
            spec(
                "actor_rollback",
                "Go back to an older version of an actor (default: the highest older one); its data is restored from that version's snapshot.",
                Risk::Write,
                ReplayPolicy::Never,
                id_schema(json!({"version": {"type": "integer", "minimum": 1}})),
            ),
        ),
        (
            Kind::Stop,
            spec(
                "actor_stop",
                "Stop an actor (it stays installed; start it again with a message to the broker).",
                Risk::Write,
                ReplayPolicy::Idempotent,
                id_schema(json!({})),
            ),
        ),
        (
            Kind::Remove,
            spec(
                "actor_remove",
                "Remove an actor from the world (its files are archived, not deleted).",
                Risk::Destructive,
                ReplayPolicy::Never,
                id_schema(json!({})),
            ),
        ),
        (
            Kind::List,
            spec(
                "actor_list",
                "List the actors: id, version, state, subscribers.",
                Risk::ReadOnly,
                ReplayPolicy::Idempotent,
                json!({"type": "object", "properties": {}, "additionalProperties": false}),
            ),
        ),
        (
            Kind::Logs,
            spec(
                "actor_logs",
                "The tail of an actor's stderr.log and its status.json.",
                Risk::ReadOnly,
                ReplayPolicy::Idempotent,
                id_schema(json!({})),
            ),
        ),
    ];
    specs
        .into_iter()
        .map(|(kind, spec)| Arc::new(ActorTool { kind, spec, world: world.clone() }) as Arc<dyn Tool>)
        .collect()
}

fn str_arg<'a>(args: &'a Value, k: &str) -> Result<&'a str, ToolError> {
    args.get(k).and_then(Value::as_str).ok_or_else(|| ToolError::InvalidArguments(format!("{k:?} must be a string")))
}

fn abs(cwd: &Path, p: &str) -> String {
    cwd.join(p).to_string_lossy().into_owned()
}

fn receipt(start: Instant, tier: Risk, summary: String, structured: Value, ok: bool) -> ToolReceipt {
    ToolReceipt {
        exit_code: if ok { 0 } else { 1 },
        output_summary: summary,
        structured_output: Some(structured),
        affected_entities: Vec::new(),
        duration_ms: u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX),
        tier,
        timestamp: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0),
        truncated: false,
    }
}

impl ActorTool {
    fn broker(&self, body: Value) -> Result<Value, ToolError> {
        self.world.request_as(AGENT, body, REQUEST_WAIT).map_err(|e| ToolError::Other(format!("{e:#}")))
    }

    fn run(&self, args: &Value, cwd: &Path) -> Result<(String, Value, bool), ToolError> {
        let from_broker = |r: Value| {
            let ok = r["type"] != "error";
            let text = if ok { r.to_string() } else { format!("refused: {}", r["reason"].as_str().unwrap_or("")) };
            (text, r, ok)
        };
        match self.kind {
            Kind::Build => {
                let mut req = json!({"type": "build", "name": str_arg(args, "name")?});
                if let Some(f) = args.get("files") {
                    req["files"] = f.clone();
                }
                if let Some(s) = args.get("source").and_then(Value::as_str) {
                    req["source"] = json!(abs(cwd, s));
                }
                let (reply, _) = self
                    .world
                    .ask_as(AGENT, crate::message::CC, req, BUILD_WAIT)
                    .map_err(|e| ToolError::Other(format!("{e:#}")))?;
                let b = reply.body;
                if b["type"] == "built" {
                    let mut text = format!("built {}: wasm {} source {}", b["name"], b["wasm"], b["source"]);
                    if let Some(w) = b["warnings"].as_str().filter(|w| !w.is_empty()) {
                        text.push_str(&format!("\nwarnings:\n{w}"));
                    }
                    Ok((text, b, true))
                } else {
                    let text = format!(
                        "build failed: {}\n{}",
                        b["reason"].as_str().unwrap_or("(no reason)"),
                        b["stderr"].as_str().unwrap_or("")
                    );
                    Ok((text, b, false))
                }
            }
            Kind::Spawn | Kind::Upgrade => {
                let ty = if self.kind == Kind::Spawn { "spawn" } else { "upgrade" };
                let mut req = json!({"type": ty, "id": str_arg(args, "id")?, "wasm": abs(cwd, str_arg(args, "wasm")?)});
                if let Some(s) = args.get("source").and_then(Value::as_str) {
                    req["source"] = json!(abs(cwd, s));
                }
                if let Some(b) = args.get("built_by").and_then(Value::as_str) {
                    req["built_by"] = json!(b);
                }
                if self.kind == Kind::Spawn && args.get("http").and_then(Value::as_bool) == Some(true) {
                    req["http"] = json!(true);
                }
                // Passed as given: the broker checks them (the rule is the
                // console's: a spawn may only lower a limit) and says why
                // it refuses.
                if let Some(l) = args.get("limits").filter(|l| self.kind == Kind::Spawn && !l.is_null()) {
                    req["limits"] = l.clone();
                }
                Ok(from_broker(self.broker(req)?))
            }
            Kind::Rollback => {
                let mut req = json!({"type": "rollback", "id": str_arg(args, "id")?});
                if let Some(v) = args.get("version") {
                    req["version"] = v.clone();
                }
                Ok(from_broker(self.broker(req)?))
            }
            Kind::Stop => Ok(from_broker(self.broker(json!({"type": "stop", "id": str_arg(args, "id")?}))?)),
            Kind::Remove => Ok(from_broker(self.broker(json!({"type": "remove", "id": str_arg(args, "id")?}))?)),
            Kind::List => Ok(from_broker(self.broker(json!({"type": "list"}))?)),
            Kind::Send => {
                let to = str_arg(args, "to")?;
                let body = args
                    .get("body")
                    .cloned()
                    .ok_or_else(|| ToolError::InvalidArguments("\"body\" is required".into()))?;
                match args.get("wait_secs") {
                    None | Some(Value::Null) => {
                        self.world.send_as(AGENT, Some(to), None, None, body);
                        Ok((format!("sent to {to}"), json!({"sent": true, "to": to}), true))
                    }
                    Some(w) => {
                        let secs = w.as_f64().filter(|s| (0.0..=MAX_SEND_WAIT).contains(s)).ok_or_else(|| {
                            ToolError::InvalidArguments(format!("wait_secs must be 0 to {MAX_SEND_WAIT}"))
                        })?;
                        match self.world.ask_as(AGENT, to, body, Duration::from_secs_f64(secs)) {
                            Ok((reply, id)) => {
                                let r = serde_json::to_value(&reply).unwrap_or(Value::Null);
                                let undeliverable =
                                    reply.from == crate::message::BROKER && reply.body["type"] == "undeliverable";
                                Ok((format!("message {id}: reply {r}"), json!({"id": id, "reply": r}), !undeliverable))
                            }
                            Err(e) => Ok((format!("{e:#}"), json!({"reply": null}), false)),
                        }
                    }
                }
            }
            Kind::Logs => {
                let id = str_arg(args, "id")?;
                crate::message::check_actor_id(id).map_err(|e| ToolError::InvalidArguments(e.to_string()))?;
                let dir = self.world.root().join("actor").join(id);
                if !dir.is_dir() {
                    return Ok((format!("no actor {id:?}"), Value::Null, false));
                }
                let log = std::fs::read(dir.join("stderr.log")).unwrap_or_default();
                let tail = String::from_utf8_lossy(&log[log.len().saturating_sub(LOG_TAIL)..]).into_owned();
                let status: Value = std::fs::read_to_string(dir.join("status.json"))
                    .ok()
                    .and_then(|t| serde_json::from_str(&t).ok())
                    .unwrap_or(Value::Null);
                Ok((
                    format!("status: {status}\nstderr.log (tail):\n{tail}"),
                    json!({"status": status, "stderr": tail}),
                    true,
                ))
            }
        }
    }
}

impl Tool for ActorTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let start = Instant::now();
        let (summary, structured, ok) = self.run(&request.arguments, ctx.cwd)?;
        Ok(receipt(start, self.spec.risk, summary, structured, ok))
    }
}
