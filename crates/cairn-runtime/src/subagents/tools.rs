//! The family's tools: `spawn_agent` and `wait_agents` ([`tools`], for
//! a top-level session; `build` for a child), each call checked against
//! what the parent has (`SpawnAgent::plan`: tools, allow patterns, cwd,
//! depth), and their receipts.
//!
//! Must not: create or drive a child itself (`drive.rs`'s `Family::attach`
//! does).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use cairn_core::storage::now_millis;
use cairn_core::tool::{
    GuardVerdict, ReplayPolicy, Risk, Tool, ToolContext, ToolError, ToolReceipt, ToolRequest, ToolSpec, Validation,
};
use cairn_provider::{ProviderConfig, ProviderKind};
use serde::Deserialize;
use serde_json::json;

use super::drive::{Family, family};
use super::{
    ChildResult, ChildStatus, FamilyPlace, Files, Inheritance, Limits, Place, SPAWN, Scope, WAIT, build, is_scripted,
    own_child, status,
};
use crate::family::{ChildFact, child_id, depth_of, parent_of};
use crate::setup::Setup;

/// Whether the provider `name` is the embedded model, which is offered
/// neither the family's tools nor `plan`.
pub(crate) fn is_local(ctx: &Setup, name: &str) -> bool {
    ProviderConfig::resolve(name, ctx.settings.providers.get(name)).is_ok_and(|c| c.kind == ProviderKind::Local)
}

/// The family's tools for a top-level session in `cwd` offered
/// `parent_tools`, its calls answered by `authority` (`equip.rs` offers
/// them to every face that has a family). Empty where the family is off
/// (`[subagents] max_depth = 0`) or the provider is the embedded model.
pub fn tools(
    ctx: &Setup,
    cwd: &Path,
    mut parent_tools: Vec<String>,
    inheritance: Inheritance,
) -> Result<Vec<Arc<dyn Tool>>> {
    let limits = Limits::from_settings(ctx)?;
    let family = family(ctx, limits);
    let family_place = inheritance.place.clone();
    let (provider, model, script) = match &inheritance.provider {
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
        allow: inheritance.allow.clone(),
        scripted: is_scripted(ctx, &provider),
        provider,
        model,
        script,
        inheritance,
    };
    Ok(match family_place {
        FamilyPlace::Files => build(family, scope, Arc::new(Files), true),
        #[cfg(feature = "postgres")]
        FamilyPlace::Database(db) => build(family, scope, db, true),
    })
}

pub(super) fn spawn_spec(scripted: bool) -> ToolSpec {
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

pub(super) fn wait_spec() -> ToolSpec {
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

pub(super) struct SpawnAgent<P> {
    pub(super) spec: ToolSpec,
    pub(super) scope: Arc<Scope>,
    pub(super) place: Arc<P>,
    pub(super) family: &'static Family,
}

pub(super) struct WaitAgents<P> {
    pub(super) spec: ToolSpec,
    pub(super) inheritance: Inheritance,
    pub(super) place: Arc<P>,
    pub(super) family: &'static Family,
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
            .attach(&self.place, &id, Some((&fact, &cwd)), &self.scope.inheritance)
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
                .attach(&self.place, id, None, &self.inheritance)
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
