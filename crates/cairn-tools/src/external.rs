//! External tools, Ollie's model: an executable plus `NAME.toml` metadata in
//! a tools directory, discovered lazily, run as a sandboxed child process.
//!
//! This module owns the metadata format and its checks, the scan of the
//! tools directories ([`ToolDirScan`]: list names cheaply, parse a tool's
//! metadata on first use, report broken metadata with the file and the
//! reason without failing the other tools, skip workspace directories that
//! are not trusted) and the invocation protocol: arguments as JSON on stdin;
//! stdout is the result (JSON becomes structured output, anything else is
//! text); stderr is captured; the exit code lands in the receipt. It does
//! not decide which directories to scan (`crate::tool_dirs` does, the host
//! passes them) nor who is trusted (`crate::trust`), and never lifts the
//! sandbox without a per-call approval through `ToolContext::approve_bypass`.
//!
//! A manifest is refused (never silently adjusted) when:
//! - its `risk` is below the tier floor of its capabilities
//!   ([`Capability::min_risk`]: fileWrite, network, shellExec and
//!   processSpawn need at least `write`), so a tool is never less than its
//!   capabilities say and never runs without the approval they call for;
//! - its executable does not live inside its tool directory: absolute
//!   paths, `..` components and symlinks resolving outside are refused, and
//!   the manifest itself must not be a link leading outside either, so what
//!   runs is what the directory holds (and what workspace trust
//!   fingerprints).
//!
//! Metadata (`NAME.toml`, next to the executable `NAME`):
//! ```toml
//! description = "What the tool does, for the model"
//! risk = "readOnly"            # readOnly | write | destructive
//! capabilities = ["fileRead"]  # fileRead fileWrite network shellExec processSpawn
//! replay = "idempotent"        # idempotent | never
//! timeout = 30                 # seconds (optional; default: the turn's limit)
//! executable = "NAME"          # optional, a path inside the metadata's directory
//! [parameters]                 # JSON Schema of the arguments object
//! type = "object"
//! properties = { query = { type = "string" } }
//! required = ["query"]
//! [bypass]                     # optional: access outside the rules, asked per call
//! reason = "fills the cargo cache"
//! read = ["~/.cargo"]
//! write = ["~/.cargo/registry"]
//! network = true
//! ```

use std::collections::{BTreeSet, HashSet};
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use cairn_core::tool::{
    Capability, ReplayPolicy, Risk, Tool, ToolContext, ToolError, ToolReceipt, ToolRequest, ToolSpec, Validation,
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::builtin::BUILTIN_NAMES;
use crate::process::{self, End, RunSpec};
use crate::sandbox::{self, Decision, SandboxPolicy};
use crate::trust::{TrustState, TrustStore};
use crate::{ToolDir, ToolEntry, ToolOrigin, ToolScope, ToolsConfig};

/// Broken metadata: which file and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {reason}", file.display())]
pub struct MetadataError {
    /// The metadata file (or the directory, for scan errors).
    pub file: PathBuf,
    /// What is wrong and what to do.
    pub reason: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawMetadata {
    description: String,
    parameters: toml::Value,
    risk: Risk,
    #[serde(default)]
    capabilities: BTreeSet<Capability>,
    replay: ReplayPolicy,
    timeout: Option<f64>,
    executable: Option<String>,
    bypass: Option<Bypass>,
}

/// Access outside a tool's rules that it may ask for, one call at a time.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bypass {
    /// Why the tool needs it (shown to the person asked).
    pub reason: String,
    /// Extra readable paths (absolute or `~/…`).
    #[serde(default)]
    pub read: Vec<String>,
    /// Extra writable paths (absolute or `~/…`).
    #[serde(default)]
    pub write: Vec<String>,
    /// Network access.
    #[serde(default)]
    pub network: bool,
}

impl Bypass {
    fn describe(&self, tool: &str) -> String {
        let mut parts = Vec::new();
        if !self.read.is_empty() {
            parts.push(format!("read {}", self.read.join(", ")));
        }
        if !self.write.is_empty() {
            parts.push(format!("write {}", self.write.join(", ")));
        }
        if self.network {
            parts.push("use the network".to_string());
        }
        format!(
            "Tool `{tool}` asks, for this one call, to go outside its sandbox: {} (reason: {}). Allow?",
            parts.join("; "),
            self.reason
        )
    }
}

fn expand(path: &str) -> Option<PathBuf> {
    if let Some(rest) = path.strip_prefix("~/") {
        return std::env::var_os("HOME").map(|h| PathBuf::from(h).join(rest));
    }
    let p = PathBuf::from(path);
    p.is_absolute().then_some(p)
}

/// A loaded external tool.
#[derive(Debug)]
pub struct ExternalTool {
    spec: ToolSpec,
    metadata: PathBuf,
    executable: PathBuf,
    timeout: Option<Duration>,
    bypass: Option<Bypass>,
    allow_unsandboxed: bool,
    max_processes: u32,
    read_paths: Vec<std::path::PathBuf>,
    secrets: crate::env::SecretValues,
    hidden: Vec<std::path::PathBuf>,
    /// Staged execution for a tool that declares FileWrite.
    staged: bool,
    staged_rules: cairn_core::staged::StagedRules,
    preimages: Option<crate::undo::PreimageStore>,
    staging_dir: std::path::PathBuf,
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// How the manifest spells a risk or capability (`readOnly`, `fileWrite`).
fn manifest_word(value: impl serde::Serialize) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

/// Refuse a declared risk below the tier floor of the capabilities.
fn check_tier_floor(risk: Risk, capabilities: &BTreeSet<Capability>) -> Result<(), String> {
    let floor = Capability::floor(capabilities);
    if risk >= floor {
        return Ok(());
    }
    let needing: Vec<String> = capabilities.iter().filter(|c| c.min_risk() > risk).map(|c| manifest_word(*c)).collect();
    Err(format!(
        "risk = \"{}\" is less than its capabilities allow: the capabilities {} require at least risk = \"{}\"; \
         declare risk = \"{}\" (or drop those capabilities)",
        manifest_word(risk),
        needing.join(", "),
        manifest_word(floor),
        manifest_word(floor)
    ))
}

/// The executable `declared` in the manifest (or the tool's name), resolved
/// inside `dir`: relative, no `..`, and its canonical path (symlinks
/// followed) must stay inside the canonical `dir`. Returns the canonical
/// path, so what is checked is what runs.
fn resolve_executable(dir: &Path, declared: &str) -> Result<PathBuf, String> {
    use std::path::Component;
    let rel = Path::new(declared);
    let inside = "an external tool's executable must live inside its tool directory; \
                  to run another program, put a script there that runs it";
    if declared.is_empty() {
        return Err("executable is empty: name a file in the tool directory".into());
    }
    if rel.is_absolute() {
        return Err(format!("executable = {declared:?} is an absolute path: {inside}"));
    }
    if rel.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(format!("executable = {declared:?} uses '..': {inside}"));
    }
    let dir = dir.canonicalize().map_err(|e| format!("cannot resolve the tool directory {}: {e}", dir.display()))?;
    let path = dir.join(rel);
    let canonical = path
        .canonicalize()
        .map_err(|e| format!("executable {} is missing ({e}): install it next to the metadata", path.display()))?;
    if !canonical.starts_with(&dir) {
        return Err(format!(
            "executable {} resolves to {}, outside its tool directory {}: {inside}",
            path.display(),
            canonical.display(),
            dir.display()
        ));
    }
    Ok(canonical)
}

impl ExternalTool {
    /// Parse and check `NAME.toml`.
    pub fn load(metadata: &Path, config: &ToolsConfig) -> Result<Self, MetadataError> {
        let err = |reason: String| MetadataError { file: metadata.to_path_buf(), reason };
        let name = metadata
            .file_stem()
            .and_then(|s| s.to_str())
            .ok_or_else(|| err("the file name is not valid UTF-8".into()))?
            .to_string();
        if !valid_name(&name) {
            return Err(err(format!(
                "'{name}' is not a valid tool name: use letters, digits, '_' and '-' (at most 64)"
            )));
        }
        if BUILTIN_NAMES.contains(&name.as_str()) {
            return Err(err(format!("'{name}' is the name of a built-in tool: rename the file")));
        }
        let dir = metadata.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if let (Ok(real), Ok(real_dir)) = (metadata.canonicalize(), dir.canonicalize())
            && !real.starts_with(&real_dir)
        {
            return Err(err(format!(
                "the metadata file is a link to {}, outside its tool directory: copy the file into {}",
                real.display(),
                dir.display()
            )));
        }
        let text = std::fs::read_to_string(metadata).map_err(|e| err(format!("cannot read it: {e}")))?;
        let raw: RawMetadata = toml::from_str(&text).map_err(|e| err(format!("invalid metadata: {e}")))?;
        check_tier_floor(raw.risk, &raw.capabilities).map_err(err)?;
        if raw.description.trim().is_empty() {
            return Err(err("description is empty: say what the tool does, for the model".into()));
        }
        let schema = serde_json::to_value(&raw.parameters).map_err(|e| err(format!("parameters: {e}")))?;
        if schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(err("parameters must be a JSON Schema with type = \"object\"".into()));
        }
        if raw.replay == ReplayPolicy::Guarded {
            return Err(err(
                "replay = \"guarded\" needs a guard, which external tools cannot provide yet: use \"idempotent\" or \"never\""
                    .into(),
            ));
        }
        let timeout = match raw.timeout {
            Some(t) if t > 0.0 && t <= 86_400.0 => Some(Duration::from_secs_f64(t)),
            Some(t) => return Err(err(format!("timeout {t} is out of range: give seconds between 0 and 86400"))),
            None => None,
        };
        if let Some(bad) = raw.bypass.iter().flat_map(|b| b.read.iter().chain(&b.write)).find(|p| expand(p).is_none()) {
            return Err(err(format!("bypass path '{bad}' must be absolute or start with '~/'")));
        }
        let executable = resolve_executable(dir, raw.executable.as_deref().unwrap_or(&name)).map_err(err)?;
        let meta = std::fs::metadata(&executable).map_err(|e| {
            err(format!("executable {} is missing ({e}): install it next to the metadata", executable.display()))
        })?;
        if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
            return Err(err(format!("{} is not an executable file: chmod +x it", executable.display())));
        }
        Ok(Self {
            spec: ToolSpec {
                name,
                description: raw.description,
                input_schema: schema,
                risk: raw.risk,
                capabilities: raw.capabilities,
                replay: raw.replay,
            },
            metadata: metadata.to_path_buf(),
            executable,
            timeout,
            bypass: raw.bypass,
            allow_unsandboxed: config.allow_unsandboxed,
            max_processes: config.max_processes,
            read_paths: config.sandbox_read_paths.clone(),
            secrets: config.secrets.clone(),
            hidden: config.hidden_paths.clone(),
            staged: config.staged,
            staged_rules: cairn_core::staged::StagedRules {
                max_files: config.staged_max_files,
                authority: config.authority.clone(),
            },
            preimages: crate::undo::PreimageStore::from_config(config),
            staging_dir: config.staging_dir.clone().unwrap_or_else(crate::staging::default_base),
        })
    }

    /// Where it came from.
    pub fn origin(&self) -> ToolOrigin {
        ToolOrigin::External { metadata: self.metadata.clone(), executable: self.executable.clone() }
    }

    /// The bypass it may ask for, if any.
    pub fn bypass(&self) -> Option<&Bypass> {
        self.bypass.as_ref()
    }

    fn policy(&self, cwd: &Path) -> SandboxPolicy {
        let has = |c| self.spec.capabilities.contains(&c);
        let mut extra_read = self.read_paths.clone();
        if let Some(dir) = self.executable.parent() {
            extra_read.push(dir.to_path_buf());
        }
        SandboxPolicy {
            cwd: cwd.to_path_buf(),
            read_cwd: has(Capability::FileRead),
            write_cwd: has(Capability::FileWrite),
            network: has(Capability::Network),
            // Running a shell means starting processes.
            process_spawn: has(Capability::ProcessSpawn) || has(Capability::ShellExec),
            extra_read,
            ..SandboxPolicy::default()
        }
    }
}

impl Tool for ExternalTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn validate(&self, request: &ToolRequest) -> Validation {
        Validation::object_arguments(&self.spec, request)
    }

    fn resume_staged(
        &self,
        request: &ToolRequest,
        cwd: &Path,
        staged: &cairn_core::staged::StagedCommit<'_>,
    ) -> cairn_core::tool::GuardVerdict {
        crate::staging::resume(staged, cwd, &self.staging_dir, &request.invocation_id, &self.staged_rules)
    }

    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let start = Instant::now();
        let mut note = None;
        let sandboxed = match sandbox::decide(&sandbox::landlock_status(), self.spec.risk, self.allow_unsandboxed) {
            Decision::Sandboxed => true,
            Decision::Unsandboxed(n) => {
                note = Some(n);
                false
            }
            Decision::Refuse(why) => return Err(ToolError::Sandbox(why)),
        };
        let mut policy = self.policy(ctx.cwd);
        if let Some(bypass) = &self.bypass {
            if !(ctx.approve_bypass)(&bypass.describe(&self.spec.name)) {
                return Err(ToolError::AccessDenied(format!(
                    "the sandbox bypass for {} was not approved, so the tool did not run",
                    self.spec.name
                )));
            }
            policy.extra_read.extend(bypass.read.iter().filter_map(|p| expand(p)));
            policy.extra_write.extend(bypass.write.iter().filter_map(|p| expand(p)));
            policy.network |= bypass.network;
        }
        let stdin = serde_json::to_vec(&request.arguments).map_err(|e| ToolError::Other(e.to_string()))?;
        let mut env = crate::env::scrubbed_env(&self.secrets);
        env.push(("CAIRN_TOOL_NAME".into(), self.spec.name.clone()));
        env.push(("CAIRN_INVOCATION_ID".into(), request.invocation_id.clone()));
        crate::env::add_traceparent(&mut env, request);
        // The metadata's timeout can only shorten the turn's limit.
        let timeout = self.timeout.map_or(ctx.limits.timeout, |t| t.min(ctx.limits.timeout));
        let spec = RunSpec {
            argv: vec![OsString::from(&self.executable)],
            cwd: ctx.cwd.to_path_buf(),
            stdin,
            env,
            sandbox: sandboxed.then_some(policy),
            timeout,
            output_cap: ctx.limits.output_cap,
            max_processes: self.max_processes,
            pid_namespace: true,
            hidden: self.hidden.clone(),
        };
        // A tool that declares FileWrite runs staged where overlays work:
        // its file effect is judged, reviewed and applied like shell's.
        let staging = match &spec.sandbox {
            Some(policy) if policy.write_cwd && self.staged && crate::staging::overlay_status().is_ok() => Some(
                crate::staging::Staging::create(&self.staging_dir, &request.invocation_id)
                    .map_err(|e| ToolError::Sandbox(format!("cannot stage the call: {e}")))?,
            ),
            _ => None,
        };
        let mut spec = spec;
        if let (Some(policy), Some(staging)) = (&mut spec.sandbox, &staging) {
            policy.overlay = Some(staging.dirs().clone());
        }
        let outcome = process::run(&spec, ctx.cancel, ctx.output);
        let outcome = match (outcome, staging) {
            (Ok(o), staging) if o.end == End::Exited => (o, staging),
            (result, staging) => {
                if let Some(staging) = staging {
                    staging.remove();
                }
                return match result.map(|o| o.end) {
                    Ok(End::TimedOut) => Err(ToolError::Timeout(timeout)),
                    Ok(_) => Err(ToolError::Cancelled),
                    Err(e) => Err(e.into()),
                };
            }
        };
        let (outcome, mut staging) = outcome;
        if let Some(staging) = &mut staging {
            staging.ran(&outcome);
        }
        let settled = match staging {
            Some(staging) => Some(crate::staging::settle(
                staging,
                ctx.cwd,
                &self.staged_rules,
                self.preimages.as_ref(),
                &mut *ctx.review_staged,
            )?),
            None => None,
        };
        let structured =
            if outcome.stdout.truncated() { None } else { serde_json::from_slice::<Value>(&outcome.stdout.kept).ok() };
        let mut text = crate::builtin::shell::outcome_text(&outcome);
        if outcome.exit_code != 0 {
            text.push_str(&format!("[exit code {}]\n", outcome.exit_code));
        }
        if let Some(n) = note {
            text.push_str(&n);
            text.push('\n');
        }
        let mut structured = structured.unwrap_or_else(
            || json!({"exitCode": outcome.exit_code, "stdoutBytes": outcome.stdout.total, "stderrBytes": outcome.stderr.total}),
        );
        let (mut affected, mut tier) = (Vec::new(), self.spec.risk);
        match &settled {
            Some(s) => {
                record_staging(&mut structured, s);
                affected = s.changes.affected();
                tier = tier.max(s.risk);
            }
            None if self.spec.capabilities.contains(&Capability::FileWrite) => {
                let why = if !self.staged {
                    "staging is turned off in the tools config".to_owned()
                } else if !sandboxed {
                    "the call runs unsandboxed".to_owned()
                } else {
                    crate::staging::overlay_status().err().unwrap_or_default()
                };
                let mode = cairn_core::staged::StagingMode::Unstaged { why };
                set_key(&mut structured, "staging", json!(mode));
            }
            None => {}
        }
        let (output_summary, cut) = crate::cap_text(text, ctx.limits.output_cap + 256);
        Ok(ToolReceipt {
            exit_code: outcome.exit_code,
            output_summary,
            structured_output: Some(structured),
            affected_entities: affected,
            duration_ms: start.elapsed().as_millis() as u64,
            tier,
            timestamp: crate::now_ms(),
            truncated: cut || outcome.stdout.truncated() || outcome.stderr.truncated(),
        })
    }
}

/// Record a staged call's mode, change set and who applied it in its
/// structured output (under `cairnStaging` when the tool printed an object
/// of its own, which is kept as it is).
fn record_staging(structured: &mut Value, settled: &crate::staging::Settled) {
    set_key(
        structured,
        "staging",
        json!({
            "mode": "overlay",
            "changeSet": settled.changes,
            "appliedBy": settled.applied_by,
            "diff": settled.diff,
        }),
    );
}

/// Set `key` in an object, or wrap a non-object under `output`.
fn set_key(structured: &mut Value, key: &str, value: Value) {
    if !structured.is_object() {
        *structured = json!({ "output": structured.take() });
    }
    if let Some(map) = structured.as_object_mut() {
        let key = if map.contains_key(key) {
            let mut chars = key.chars();
            let first = chars.next().map(|c| c.to_ascii_uppercase()).unwrap_or_default();
            format!("cairn{first}{}", chars.as_str())
        } else {
            key.to_owned()
        };
        map.insert(key, value);
    }
}

struct Slot {
    name: String,
    metadata: PathBuf,
    loaded: OnceLock<Result<Arc<ExternalTool>, MetadataError>>,
}

/// Workspace tools that were found but not loaded because their directory
/// is not trusted (see [`crate::trust`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UntrustedTools {
    /// The working directory that ships them.
    pub workspace: PathBuf,
    /// Its tools directory.
    pub dir: PathBuf,
    /// The tool names found there (`*.toml` stems), sorted.
    pub names: Vec<String>,
    /// Never trusted, or changed since it was trusted.
    pub state: TrustState,
}

impl std::fmt::Display for UntrustedTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let why = match self.state {
            TrustState::Changed => "its tools changed since it was trusted",
            _ => "this directory is not trusted",
        };
        write!(
            f,
            "{} workspace tool(s) in {} not loaded ({}): {why}",
            self.names.len(),
            self.dir.display(),
            self.names.join(", ")
        )
    }
}

/// What scanning the tools directories found: names, lazily parsed
/// metadata, scan problems, and the workspace tools left out because their
/// directory is not trusted. (The tools a session offers the model are
/// `cairn_core::ToolRegistry`; this is only where external tools come from.)
pub struct ToolDirScan {
    slots: Vec<Slot>,
    scan_errors: Vec<MetadataError>,
    untrusted: Vec<UntrustedTools>,
    config: ToolsConfig,
}

impl std::fmt::Debug for ToolDirScan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolDirScan")
            .field("tools", &self.slots.iter().map(|s| &s.name).collect::<Vec<_>>())
            .field("scan_errors", &self.scan_errors)
            .field("untrusted", &self.untrusted)
            .finish()
    }
}

impl ToolDirScan {
    /// List `*.toml` files in `dirs` (missing directories are skipped). The
    /// first directory that has a name wins; later ones are reported as
    /// shadowed. A [`ToolScope::Workspace`] directory with tools is listed
    /// only when `trust` says its workspace is trusted with exactly these
    /// files; otherwise its names are reported in
    /// [`ToolDirScan::untrusted`] and none of its tools can be loaded.
    /// Nothing is parsed yet.
    pub fn scan(dirs: &[ToolDir], config: &ToolsConfig, trust: &TrustStore) -> Self {
        let mut slots: Vec<Slot> = Vec::new();
        let mut seen: HashSet<String> = HashSet::new();
        let mut scan_errors = Vec::new();
        let mut untrusted = Vec::new();
        for tool_dir in dirs {
            let dir = &tool_dir.path;
            let read = match std::fs::read_dir(dir) {
                Ok(r) => r,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    scan_errors.push(MetadataError {
                        file: dir.clone(),
                        reason: format!("cannot list the tools directory: {e}"),
                    });
                    continue;
                }
            };
            let mut files: Vec<PathBuf> =
                read.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "toml")).collect();
            files.sort();
            if files.is_empty() {
                continue;
            }
            if let ToolScope::Workspace { root } = &tool_dir.scope {
                let state = match trust.check(root, dir) {
                    Ok(state) => state,
                    Err(e) => {
                        scan_errors.push(MetadataError {
                            file: dir.clone(),
                            reason: format!("workspace tools not loaded: {e}"),
                        });
                        continue;
                    }
                };
                if state != TrustState::Trusted {
                    let names = files
                        .iter()
                        .map(|m| m.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default());
                    untrusted.push(UntrustedTools {
                        workspace: root.clone(),
                        dir: dir.clone(),
                        names: names.collect(),
                        state,
                    });
                    continue;
                }
            }
            for metadata in files {
                let name = metadata.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
                if !seen.insert(name.clone()) {
                    scan_errors.push(MetadataError {
                        file: metadata,
                        reason: format!(
                            "ignored: a tool named '{name}' was already found in an earlier tools directory"
                        ),
                    });
                    continue;
                }
                slots.push(Slot { name, metadata, loaded: OnceLock::new() });
            }
        }
        Self { slots, scan_errors, untrusted, config: config.clone() }
    }

    /// Names found, in scan order.
    pub fn names(&self) -> Vec<&str> {
        self.slots.iter().map(|s| s.name.as_str()).collect()
    }

    /// The metadata file of tool `name`, without parsing it (a host that
    /// keeps parsed tools across scans, like `cairn toolsrv`, parses and
    /// caches by path itself).
    pub fn metadata_path(&self, name: &str) -> Option<&Path> {
        self.slots.iter().find(|s| s.name == name).map(|s| s.metadata.as_path())
    }

    /// Problems found while scanning (unlistable directories, shadowed names).
    pub fn scan_errors(&self) -> &[MetadataError] {
        &self.scan_errors
    }

    /// Workspace tools left out because their directory is not trusted.
    pub fn untrusted(&self) -> &[UntrustedTools] {
        &self.untrusted
    }

    /// The tool `name`, loading its metadata now if needed; `None` if no
    /// such file was found.
    pub fn get(&self, name: &str) -> Option<Result<Arc<ExternalTool>, MetadataError>> {
        let slot = self.slots.iter().find(|s| s.name == name)?;
        Some(slot.loaded.get_or_init(|| ExternalTool::load(&slot.metadata, &self.config).map(Arc::new)).clone())
    }

    /// Load every tool: the good ones, and one error per broken file (scan
    /// errors included).
    pub fn load_all(&self) -> (Vec<ToolEntry>, Vec<MetadataError>) {
        let mut tools = Vec::new();
        let mut errors = self.scan_errors.clone();
        for slot in &self.slots {
            match self.get(&slot.name) {
                Some(Ok(tool)) => {
                    let origin = tool.origin();
                    tools.push(ToolEntry { tool, origin });
                }
                Some(Err(e)) => errors.push(e),
                None => {}
            }
        }
        (tools, errors)
    }
}
