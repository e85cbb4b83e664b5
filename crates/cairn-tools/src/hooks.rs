//! Hook programs: `[[hooks.pre_tool]]` and `[[hooks.post_tool]]` entries
//! run as sandboxed processes that read a JSON document on stdin and answer
//! JSON on stdout, in Claude Code's shapes, so its hook scripts run
//! unchanged (its tool names and fields, matchers, exit codes and answers:
//! [`claude_code`]). [`CommandHooks`] implements core's
//! [`cairn_core::hooks::Hooks`]; the turn records what `pre_tool` said
//! before it takes effect.
//!
//! It owns the hook protocol and its failure rule: a `pre_tool` hook that
//! cannot start, times out, exits non-zero or answers something unreadable
//! refuses the call (fails closed), with the reason. It must not approve a
//! call (an "allow" answer only means "no objection") nor decide a tier;
//! an "ask" answer only says a person must approve (the gate decides how).
//!
//! Input (stdin): `{"hook_event_name": "PreToolUse" | "PostToolUse",
//! "session_id", "transcript_path", "cwd", "permission_mode" (pre),
//! "tool_name" (Claude Code's name: `Bash`, `Write`, …), "cairn_tool_name",
//! "tool_input" (cairn's arguments and Claude Code's names beside them),
//! "invocation_id"}`, and for `PostToolUse` `"settlement"` (`toolCompleted`
//! | `toolFailed` | `toolRejected`) and `"tool_response"` (that entry's
//! payload).
//!
//! Output of a `pre_tool` hook (stdout; empty means no objection):
//! - `{"continue": false, "stopReason": "…"}` refuses the call and stops
//!   the turn (before anything else it says);
//! - `{"hookSpecificOutput": {"permissionDecision": "deny",
//!   "permissionDecisionReason": "…"}}` refuses the call; `"ask"` puts it to
//!   a person (refused where none can answer); `"allow"` is no objection;
//! - `{"hookSpecificOutput": {"updatedInput": {…}}}` replaces the arguments
//!   (in either spelling; checked against the tool's schema, then approved
//!   as usual);
//! - `{"decision": "block", "reason": "…"}` (the older shape) refuses;
//! - exit status 2 refuses with stderr as the reason.

pub mod claude_code;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_core::CancelToken;
use cairn_core::approval::SessionMode;
use cairn_core::events::{CompactionReason, EntryType};
use cairn_core::hooks::{Hooks, PreTool, UserPrompt};
use cairn_core::tool::ToolRequest;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use self::claude_code::Matcher;
use crate::ToolsConfig;
use crate::process::{End, RunSpec};
use crate::programs::{FileAccess, expand, install_reads, resolve};
use crate::sandbox::{self, Decision, SandboxPolicy};

/// One hook program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// The program (on `PATH`, or a path).
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Which tools, as Claude Code reads a matcher ([`Matcher`]): names
    /// separated by `|` (cairn's or Claude Code's: `Bash|write_file`), a
    /// name ending in `*` for a prefix, or a regular expression
    /// (`mcp__git__.*`); none, `""` or `*` means every tool.
    #[serde(default)]
    pub matcher: Option<String>,
    /// Its time limit (default 10 s); past it the call is refused.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// The session's directory: none, read (default), write.
    #[serde(default)]
    pub files: FileAccess,
    /// Network access (off).
    #[serde(default)]
    pub network: bool,
    /// Extra read-only directories.
    #[serde(default)]
    pub read: Vec<PathBuf>,
}

fn default_timeout_ms() -> u64 {
    10_000
}

/// `[hooks]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HooksConfig {
    /// The first time a process runs a turn of a session (no `matcher`);
    /// context it gives goes with the session's next prompt.
    #[serde(default)]
    pub session_start: Vec<HookConfig>,
    /// When a process that ran turns of a session leaves it (no `matcher`).
    #[serde(default)]
    pub session_end: Vec<HookConfig>,
    /// When a subagent (a child session) ends (no `matcher`).
    #[serde(default)]
    pub subagent_stop: Vec<HookConfig>,
    /// Before each turn starts with a prompt (no `matcher`).
    #[serde(default)]
    pub user_prompt: Vec<HookConfig>,
    /// Before a compaction summarises the conversation (no `matcher`).
    #[serde(default)]
    pub pre_compact: Vec<HookConfig>,
    /// Before each call is requested.
    #[serde(default)]
    pub pre_tool: Vec<HookConfig>,
    /// After each call is settled.
    #[serde(default)]
    pub post_tool: Vec<HookConfig>,
}

/// How many of [`HooksConfig::by_event`]'s events come first and are not
/// about a tool (they take no `matcher`).
const EVENTS_WITHOUT_TOOL: usize = 5;

impl HooksConfig {
    /// Every event's hooks with the event's name, those not about a tool
    /// first ([`EVENTS_WITHOUT_TOOL`]).
    fn by_event(&self) -> [(&'static str, &Vec<HookConfig>); 7] {
        [
            ("session_start", &self.session_start),
            ("session_end", &self.session_end),
            ("subagent_stop", &self.subagent_stop),
            ("user_prompt", &self.user_prompt),
            ("pre_compact", &self.pre_compact),
            ("pre_tool", &self.pre_tool),
            ("post_tool", &self.post_tool),
        ]
    }

    /// Whether any hook is configured.
    pub fn is_empty(&self) -> bool {
        self.by_event().iter().all(|(_, hooks)| hooks.is_empty())
    }

    /// Add `other`'s hooks after these.
    pub fn extend(&mut self, other: HooksConfig) {
        self.session_start.extend(other.session_start);
        self.session_end.extend(other.session_end);
        self.subagent_stop.extend(other.subagent_stop);
        self.user_prompt.extend(other.user_prompt);
        self.pre_compact.extend(other.pre_compact);
        self.pre_tool.extend(other.pre_tool);
        self.post_tool.extend(other.post_tool);
    }

    /// Refuse hooks cairn could not run as written.
    pub fn check(&self) -> Result<(), String> {
        let events = self.by_event();
        for (event, hooks) in &events[..EVENTS_WITHOUT_TOOL] {
            if let Some(hook) = hooks.iter().find(|h| h.matcher.is_some()) {
                return Err(format!(
                    "[[hooks.{event}]] {}: this hook takes no `matcher` (it is not about a tool)",
                    hook.command
                ));
            }
        }
        for (event, hooks) in events {
            for hook in hooks {
                if hook.command.trim().is_empty() {
                    return Err(format!("[[hooks.{event}]]: `command` is empty"));
                }
                if hook.timeout_ms == 0 || hook.timeout_ms > 600_000 {
                    return Err(format!(
                        "[[hooks.{event}]] {}: timeout_ms = {} must be between 1 and 600000",
                        hook.command, hook.timeout_ms
                    ));
                }
                if let Err(e) = Matcher::parse(hook.matcher.as_deref()) {
                    return Err(format!("[[hooks.{event}]] {}: {e}", hook.command));
                }
            }
        }
        Ok(())
    }

    /// A warning for each tool hook whose matcher can match no tool known
    /// here (`known`: the tools loaded besides the built-in ones;
    /// `mcp_servers`: the configured servers' names): such a hook would
    /// silently never run.
    pub fn matcher_warnings(&self, known: &[String], mcp_servers: &[String]) -> Vec<String> {
        let mut warnings = Vec::new();
        for (event, hooks) in &self.by_event()[EVENTS_WITHOUT_TOOL..] {
            for hook in hooks.iter() {
                let Some(m) = &hook.matcher else { continue };
                if Matcher::parse(Some(m)).is_ok_and(|matcher| !matcher.names_a_tool(known, mcp_servers)) {
                    warnings.push(format!(
                        "[[hooks.{event}]] {}: matcher {m:?} names no tool cairn knows (cairn's names, Claude \
                         Code's, or mcp__SERVER__… of a configured server), so this hook never runs",
                        hook.command
                    ));
                }
            }
        }
        warnings
    }
}

impl HookConfig {
    fn matches(&self, tool: &str) -> bool {
        // A matcher that cannot be read (refused at load) runs the hook for
        // every tool: a hook is never skipped by mistake.
        Matcher::parse(self.matcher.as_deref()).map_or(true, |m| m.matches(tool))
    }

    /// Its name in the log: `hook:pre_tool:COMMAND`.
    fn by(&self, event: &str) -> String {
        format!("hook:{event}:{}", self.command)
    }
}

/// The hooks of a session's tool calls, run as sandboxed programs.
pub struct CommandHooks {
    config: HooksConfig,
    tools: ToolsConfig,
    report: Box<dyn Fn(&str) + Send + Sync>,
    /// Where session files live (`transcript_path`), if sessions are files.
    sessions: Option<PathBuf>,
}

/// The sessions this process started (ran `session_start` for), with
/// what their `session_end` hooks need; and the context `session_start`
/// hooks gave that waits for the session's next prompt. Process-wide: a
/// host builds hooks again for each turn, and a session starts once per
/// process.
#[derive(Default)]
struct Started {
    sessions: std::collections::BTreeMap<String, (HooksConfig, ToolsConfig, PathBuf)>,
    context: std::collections::BTreeMap<String, (String, String)>,
}

fn started() -> std::sync::MutexGuard<'static, Started> {
    static STARTED: std::sync::OnceLock<std::sync::Mutex<Started>> = std::sync::OnceLock::new();
    let cell = STARTED.get_or_init(Default::default);
    cell.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Run the `session_end` hooks of session `id` if this process started
/// it (`reason`: `exit`, `clear`, …); `report` says what failed.
pub fn end_session(id: &str, reason: &str, report: &dyn Fn(&str)) {
    let Some((config, tools, cwd)) = started().sessions.remove(id) else { return };
    let hooks = CommandHooks { config, tools, report: Box::new(|_| {}), sessions: None };
    for hook in &hooks.config.session_end {
        let input = json!({
            "hook_event_name": "SessionEnd",
            "session_id": id,
            "cwd": cwd,
            "reason": reason,
        });
        if let Ran::Failed(why) = hooks.run(hook, &input, &cwd) {
            report(&format!("the session_end hook {} failed: {why}", hook.command));
        }
    }
}

/// Before the process leaves: [`end_session`] for every session it
/// started.
pub fn end_all_sessions(reason: &str, report: &dyn Fn(&str)) {
    let ids: Vec<String> = started().sessions.keys().cloned().collect();
    for id in ids {
        end_session(&id, reason, report);
    }
}

impl std::fmt::Debug for CommandHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandHooks").field("config", &self.config).finish_non_exhaustive()
    }
}

/// How one run of a hook ended.
enum Ran {
    /// Exit 0 with this stdout.
    Answered(String),
    /// Exit 2: a refusal, with stderr.
    Refused(String),
    /// Anything else, said in words.
    Failed(String),
}

impl CommandHooks {
    /// Hooks from `config`, sandboxed with the session's tool settings;
    /// `report` says what failed in a hook that cannot refuse anything
    /// (`post_tool`).
    pub fn new(config: HooksConfig, tools: ToolsConfig, report: Box<dyn Fn(&str) + Send + Sync>) -> Self {
        Self { config, tools, report, sessions: None }
    }

    /// Session files live in `dir`: hooks are given a session's file as
    /// `transcript_path` (cairn's log, one JSON record a line).
    pub fn with_sessions(mut self, dir: PathBuf) -> Self {
        self.sessions = Some(dir);
        self
    }

    /// The session's file, when sessions are files and it exists.
    fn transcript(&self, session_id: &str) -> Value {
        self.sessions
            .as_ref()
            .map(|dir| dir.join(format!("{session_id}.jsonl")))
            .filter(|p| p.is_file())
            .map_or(Value::Null, |p| Value::String(p.to_string_lossy().into_owned()))
    }

    fn run(&self, hook: &HookConfig, input: &Value, cwd: &Path) -> Ran {
        let Some(program) = resolve(&hook.command) else {
            return Ran::Failed(format!("`{}` was not found", hook.command));
        };
        let sandboxed = match sandbox::decide(
            &sandbox::landlock_status(),
            cairn_core::tool::Risk::Write,
            self.tools.allow_unsandboxed,
        ) {
            Decision::Sandboxed => true,
            Decision::Unsandboxed(_) => false,
            Decision::Refuse(why) => return Ran::Failed(why),
        };
        let mut extra_read = match install_reads(&program) {
            Ok(reads) => reads,
            Err(e) => return Ran::Failed(e.to_string()),
        };
        extra_read.extend(hook.read.iter().map(|p| expand(p)));
        extra_read.extend(self.tools.sandbox_read_paths.iter().cloned());
        let policy = SandboxPolicy {
            cwd: cwd.to_path_buf(),
            read_cwd: hook.files != FileAccess::None,
            write_cwd: hook.files == FileAccess::Write,
            network: hook.network,
            process_spawn: true,
            extra_read,
            ..SandboxPolicy::default()
        };
        let mut argv = vec![OsString::from(&program)];
        argv.extend(hook.args.iter().map(OsString::from));
        let mut env = crate::env::scrubbed_env(&self.tools.secrets);
        env.push(("CAIRN_HOOK_EVENT".into(), input["hook_event_name"].as_str().unwrap_or_default().to_owned()));
        let spec = RunSpec {
            argv,
            cwd: cwd.to_path_buf(),
            stdin: input.to_string().into_bytes(),
            env,
            sandbox: sandboxed.then_some(policy),
            timeout: Duration::from_millis(hook.timeout_ms),
            output_cap: 64 * 1024,
            max_processes: self.tools.max_processes,
            pid_namespace: true,
            hidden: self.tools.hidden_paths.clone(),
        };
        match crate::process::run(&spec, &CancelToken::new(), &mut |_| {}) {
            Err(e) => Ran::Failed(e.to_string()),
            Ok(o) if o.end == End::TimedOut => Ran::Failed(format!("it did not answer within {} ms", hook.timeout_ms)),
            Ok(o) if o.end == End::Cancelled => Ran::Failed("it was cancelled".into()),
            Ok(o) if o.stdout.truncated() => Ran::Failed("it wrote more than 64 KiB".into()),
            Ok(o) if o.exit_code == 0 => Ran::Answered(String::from_utf8_lossy(&o.stdout.kept).into_owned()),
            Ok(o) if o.exit_code == 2 => Ran::Refused(String::from_utf8_lossy(&o.stderr.kept).trim().to_owned()),
            Ok(o) => {
                let said = String::from_utf8_lossy(&o.stderr.kept).trim().to_owned();
                Ran::Failed(format!(
                    "it exited with status {}{}",
                    o.exit_code,
                    if said.is_empty() { String::new() } else { format!(": {said}") }
                ))
            }
        }
    }
}

impl Ran {
    /// The hook's answer: read from its stdout (`read`), a refusal made
    /// of its stderr (exit 2, `refuse`), or why it failed.
    fn answer<T>(
        self,
        read: impl FnOnce(&str) -> Result<Option<T>, String>,
        refuse: impl FnOnce(String) -> T,
    ) -> Result<Option<T>, String> {
        match self {
            Ran::Answered(stdout) => read(&stdout),
            Ran::Refused(stderr) if stderr.is_empty() => Ok(Some(refuse("refused by a hook".to_owned()))),
            Ran::Refused(stderr) => Ok(Some(refuse(stderr))),
            Ran::Failed(why) => Err(why),
        }
    }
}

/// What one `pre_tool` answer says, in Claude Code's order: `continue:
/// false` first, then a refusal, then a question, then changed arguments.
fn read_answer(stdout: &str) -> Result<Option<PreToolAnswer>, String> {
    let text = stdout.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let answer: Value = serde_json::from_str(text).map_err(|e| format!("its answer is not JSON ({e})"))?;
    let specific = &answer["hookSpecificOutput"];
    let said = |key: &str, v: &Value, or: &str| v[key].as_str().filter(|s| !s.is_empty()).unwrap_or(or).to_owned();
    match &answer["continue"] {
        Value::Null | Value::Bool(true) => {}
        Value::Bool(false) => return Ok(Some(PreToolAnswer::Stop(said("stopReason", &answer, "stopped by a hook")))),
        other => return Err(format!("its continue is {other}, not true or false")),
    }
    let rewrite = match &specific["updatedInput"] {
        Value::Null => None,
        Value::Object(v) => Some(v.clone()),
        _ => return Err("its updatedInput is not a JSON object".into()),
    };
    match &specific["permissionDecision"] {
        Value::Null => {}
        d if d == "deny" => {
            return Ok(Some(PreToolAnswer::Deny(said("permissionDecisionReason", specific, "refused by a hook"))));
        }
        d if d == "ask" => {
            let why = said("permissionDecisionReason", specific, "a hook asks for a person's approval");
            return Ok(Some(PreToolAnswer::Ask(why, rewrite)));
        }
        // "allow" is no objection: approvals stay with rules and people.
        d if d == "allow" => {}
        other => return Err(format!("its permissionDecision {other} is not allow, deny or ask")),
    }
    if answer["decision"] == "block" {
        return Ok(Some(PreToolAnswer::Deny(said("reason", &answer, "refused by a hook"))));
    }
    Ok(rewrite.map(PreToolAnswer::Rewrite))
}

enum PreToolAnswer {
    Deny(String),
    Stop(String),
    Ask(String, Option<serde_json::Map<String, Value>>),
    Rewrite(serde_json::Map<String, Value>),
}

/// What one `user_prompt` answer says: a refusal, context to add, or
/// nothing. Plain text (not JSON) is context, as in Claude Code.
fn read_prompt_answer(stdout: &str) -> Result<Option<PromptAnswer>, String> {
    let text = stdout.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let Ok(answer) = serde_json::from_str::<Value>(text) else {
        return Ok(Some(PromptAnswer::Context(text.to_owned())));
    };
    if answer["decision"] == "block" {
        let reason = answer["reason"].as_str().filter(|s| !s.is_empty()).unwrap_or("refused by a hook");
        return Ok(Some(PromptAnswer::Block(reason.to_owned())));
    }
    match &answer["hookSpecificOutput"]["additionalContext"] {
        Value::Null => Ok(None),
        Value::String(s) if s.trim().is_empty() => Ok(None),
        Value::String(s) => Ok(Some(PromptAnswer::Context(s.clone()))),
        _ => Err("its additionalContext is not a string".into()),
    }
}

enum PromptAnswer {
    Block(String),
    Context(String),
}

impl Hooks for CommandHooks {
    fn session_start(&self, session_id: &str, cwd: &Path, resumed: bool) {
        {
            let mut started = started();
            if started.sessions.contains_key(session_id) {
                return;
            }
            started
                .sessions
                .insert(session_id.to_owned(), (self.config.clone(), self.tools.clone(), cwd.to_path_buf()));
        }
        let mut context = Vec::new();
        let mut by = Vec::new();
        for hook in &self.config.session_start {
            let input = json!({
                "hook_event_name": "SessionStart",
                "session_id": session_id,
                "transcript_path": self.transcript(session_id),
                "cwd": cwd,
                "source": if resumed { "resume" } else { "startup" },
            });
            match self.run(hook, &input, cwd).answer(read_prompt_answer, PromptAnswer::Block) {
                Ok(None) => {}
                Ok(Some(PromptAnswer::Context(text))) => {
                    context.push(text);
                    by.push(hook.by("session_start"));
                }
                Ok(Some(PromptAnswer::Block(_))) => (self.report)(&format!(
                    "the session_start hook {} asked to block; a session_start hook cannot refuse anything (use a user_prompt hook)",
                    hook.command
                )),
                Err(why) => (self.report)(&format!("the session_start hook {} failed: {why}", hook.command)),
            }
        }
        if !context.is_empty() {
            started().context.insert(session_id.to_owned(), (by.join(","), context.join("\n")));
        }
    }

    fn subagent_stop(&self, parent: &str, child: &str, cwd: &Path, answer: &str, failed: bool) {
        for hook in &self.config.subagent_stop {
            let input = json!({
                "hook_event_name": "SubagentStop",
                "session_id": parent,
                "subagent_session_id": child,
                "cwd": cwd,
                "status": if failed { "failed" } else { "answered" },
                "answer": answer,
            });
            if let Ran::Failed(why) = self.run(hook, &input, cwd) {
                (self.report)(&format!("the subagent_stop hook {} failed: {why}", hook.command));
            }
        }
    }

    fn user_prompt(&self, session_id: &str, cwd: &Path, prompt: &str) -> UserPrompt {
        let mut context = Vec::new();
        let mut by = Vec::new();
        // What session_start hooks said goes with the first prompt after.
        if let Some((from, text)) = started().context.remove(session_id) {
            context.push(text);
            by.push(from);
        }
        for hook in &self.config.user_prompt {
            let input = json!({
                "hook_event_name": "UserPromptSubmit",
                "session_id": session_id,
                "transcript_path": self.transcript(session_id),
                "cwd": cwd,
                "prompt": prompt,
            });
            let answer = self.run(hook, &input, cwd).answer(read_prompt_answer, PromptAnswer::Block);
            match answer {
                Ok(None) => {}
                Ok(Some(PromptAnswer::Block(reason))) => {
                    return UserPrompt::Block { by: hook.by("user_prompt"), reason };
                }
                Ok(Some(PromptAnswer::Context(text))) => {
                    context.push(text);
                    by.push(hook.by("user_prompt"));
                }
                // A prompt hook that fails is said and does not refuse.
                Err(why) => (self.report)(&format!("the user_prompt hook {} failed: {why}", hook.command)),
            }
        }
        if context.is_empty() {
            UserPrompt::Continue
        } else {
            UserPrompt::AddContext { by: by.join(","), text: context.join("\n") }
        }
    }

    fn pre_tool(&self, request: &ToolRequest, cwd: &Path, mode: SessionMode) -> PreTool {
        let mut arguments = request.arguments.clone();
        let mut rewritten_by = Vec::new();
        let mut asked: Option<(String, String)> = None;
        for hook in self.config.pre_tool.iter().filter(|h| h.matches(&request.tool)) {
            let by = hook.by("pre_tool");
            let tool_input = claude_code::input_of(&request.tool, &arguments, cwd);
            let input = json!({
                "hook_event_name": "PreToolUse",
                "session_id": request.session_id,
                "transcript_path": self.transcript(&request.session_id),
                "cwd": cwd,
                "permission_mode": mode.claude_code_name(),
                "tool_name": claude_code::name_of(&request.tool),
                "cairn_tool_name": request.tool,
                "tool_input": tool_input,
                "invocation_id": request.invocation_id,
            });
            let answer = self.run(hook, &input, cwd).answer(read_answer, PreToolAnswer::Deny);
            let mut rewrite = |new| match claude_code::arguments_from(&request.tool, &tool_input, new, cwd) {
                Ok(new) => {
                    arguments = new;
                    rewritten_by.push(by.clone());
                    Ok(())
                }
                Err(why) => Err(why),
            };
            let failed = match answer {
                Ok(None) => None,
                Ok(Some(PreToolAnswer::Deny(reason))) => return PreTool::Deny { by, reason },
                Ok(Some(PreToolAnswer::Stop(reason))) => return PreTool::Stop { by, reason },
                Ok(Some(PreToolAnswer::Rewrite(new))) => rewrite(new).err(),
                Ok(Some(PreToolAnswer::Ask(reason, new))) => {
                    // The first hook that asks is the one named; later
                    // hooks still run (one may refuse).
                    if asked.is_none() {
                        asked = Some((by.clone(), reason));
                    }
                    new.and_then(|new| rewrite(new).err())
                }
                Err(why) => Some(why),
            };
            if let Some(why) = failed {
                return PreTool::Deny {
                    reason: format!(
                        "the pre_tool hook {} failed ({why}); hooks fail closed, so the call was refused",
                        hook.command
                    ),
                    by,
                };
            }
        }
        let rewrite = (!rewritten_by.is_empty()).then(|| (rewritten_by.join(","), arguments));
        match (asked, rewrite) {
            (Some((by, reason)), rewrite) => PreTool::Ask { by, reason, rewrite },
            (None, Some((by, arguments))) => PreTool::Rewrite { by, arguments },
            (None, None) => PreTool::Continue,
        }
    }

    fn pre_compact(&self, session_id: &str, cwd: &Path, reason: CompactionReason) {
        let trigger = match reason {
            CompactionReason::Forced => "manual",
            CompactionReason::Threshold | CompactionReason::ProviderRejected => "auto",
        };
        for hook in &self.config.pre_compact {
            let input = json!({
                "hook_event_name": "PreCompact",
                "session_id": session_id,
                "transcript_path": self.transcript(session_id),
                "cwd": cwd,
                "trigger": trigger,
                "reason": reason,
            });
            if let Ran::Failed(why) = self.run(hook, &input, cwd) {
                (self.report)(&format!("the pre_compact hook {} failed: {why}", hook.command));
            }
        }
    }

    fn post_tool(&self, kind: EntryType, settlement: &Value, cwd: &Path) {
        let tool = settlement["tool"].as_str().unwrap_or_default();
        for hook in self.config.post_tool.iter().filter(|h| h.matches(tool)) {
            let input = json!({
                "hook_event_name": "PostToolUse",
                "cwd": cwd,
                "tool_name": claude_code::name_of(tool),
                "cairn_tool_name": tool,
                "invocation_id": settlement["invocationId"],
                "settlement": kind.tag(),
                "tool_response": settlement,
            });
            match self.run(hook, &input, cwd) {
                Ran::Answered(_) | Ran::Refused(_) => {}
                Ran::Failed(why) => (self.report)(&format!("the post_tool hook {} failed: {why}", hook.command)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_in_claude_code_s_shapes_are_read() {
        let deny = r#"{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"deny","permissionDecisionReason":"no curl"}}"#;
        assert!(matches!(read_answer(deny), Ok(Some(PreToolAnswer::Deny(r))) if r == "no curl"));
        assert!(
            matches!(read_answer(r#"{"decision":"block","reason":"x"}"#), Ok(Some(PreToolAnswer::Deny(r))) if r == "x")
        );
        let rewrite = r#"{"hookSpecificOutput":{"updatedInput":{"command":"ls"}}}"#;
        assert!(matches!(read_answer(rewrite), Ok(Some(PreToolAnswer::Rewrite(v))) if v["command"] == "ls"));
        // "allow" is no objection: approvals stay with rules and people.
        let allow = r#"{"hookSpecificOutput":{"permissionDecision":"allow"}}"#;
        assert!(matches!(read_answer(allow), Ok(None)));
        let ask = r#"{"hookSpecificOutput":{"permissionDecision":"ask","permissionDecisionReason":"check"}}"#;
        assert!(matches!(read_answer(ask), Ok(Some(PreToolAnswer::Ask(r, None))) if r == "check"));
        // continue: false wins over everything else it says.
        let stop = r#"{"continue":false,"stopReason":"enough","hookSpecificOutput":{"permissionDecision":"allow"}}"#;
        assert!(matches!(read_answer(stop), Ok(Some(PreToolAnswer::Stop(r))) if r == "enough"));
        assert!(matches!(read_answer(r#"{"continue":true}"#), Ok(None)));
        assert!(read_answer(r#"{"continue":"no"}"#).is_err());
        assert!(read_answer(r#"{"hookSpecificOutput":{"permissionDecision":"maybe"}}"#).is_err());
        assert!(matches!(read_answer("  \n"), Ok(None)));
        assert!(read_answer("yes please").is_err(), "unreadable answers fail closed");
        assert!(read_answer(r#"{"hookSpecificOutput":{"updatedInput":"ls"}}"#).is_err());
    }

    #[test]
    fn matchers_take_names_and_prefixes() {
        let hook = |m: Option<&str>| HookConfig {
            command: "x".into(),
            args: Vec::new(),
            matcher: m.map(str::to_owned),
            timeout_ms: 1,
            files: FileAccess::Read,
            network: false,
            read: Vec::new(),
        };
        assert!(hook(None).matches("anything"));
        let h = hook(Some("shell|mcp__git__*"));
        assert!(h.matches("shell") && h.matches("mcp__git__git_add"));
        assert!(!h.matches("shellx") && !h.matches("mcp__gitlab__x") && !h.matches("write_file"));
        let bad = HooksConfig { pre_tool: vec![hook(Some("sh(ell"))], ..HooksConfig::default() };
        assert!(bad.check().is_err());
        let bad = HooksConfig { user_prompt: vec![hook(Some("shell"))], ..HooksConfig::default() };
        assert!(bad.check().is_err());
    }
}
