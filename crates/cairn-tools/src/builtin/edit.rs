//! The writing built-ins: `write_file {path, content}` and `edit_file
//! {path, old, new}` / `{path, patch}`.
//!
//! Both confine the path to the working directory, write atomically
//! (temp file + rename, permissions kept), preview as a unified diff and
//! carry that diff in the receipt. Both are `Guarded`: on resume the guard
//! compares the file with what the call would produce. With a pre-image
//! store, each keeps the file's prior state and has the turn record its
//! change (`toolStaged`) before writing, so the write can be undone and a
//! resume finishes it. They never run a process.
//!
//! A path that carries authority (`cairn_core::authority`: git's
//! configuration and hooks, other agents' configurations, …) makes the
//! call Destructive with the reason, before it runs when the path alone
//! tells ([`Tool::risk`]) and otherwise at the record before the write
//! (the turn's gate); under cairn's own directories the call is refused.

use std::path::{Path, PathBuf};
use std::time::Instant;

use cairn_core::authority::{Authority, AuthorityRules, Protection};
use cairn_core::staged::{
    Change, ChangeKind, ChangeSet, EntryKind, FileState, Judgement, Preimages, StagedCommit, StagedDecision,
    StagedReview,
};
use cairn_core::tool::{
    Capability, GuardVerdict, Preview, ReplayPolicy, Risk, Tool, ToolContext, ToolError, ToolReceipt, ToolRequest,
    ToolSpec, Validation,
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{caps, denied, io, parse_args, receipt};
use crate::paths::{display_rel, resolve_in_cwd};
use crate::undo::PreimageStore;

/// A unified diff of `old` to `new` of the file `rel` (a/ and b/ names).
pub fn unified_diff(rel: &str, old: &str, new: &str) -> String {
    let mut options = diffy::DiffOptions::new();
    options.set_original_filename(format!("a/{rel}")).set_modified_filename(format!("b/{rel}"));
    options.create_patch(old, new).to_string()
}

/// Current text of `path`, `None` when it does not exist.
fn current_text(path: &Path, shown: &str) -> Result<Option<String>, ToolError> {
    // Never open a pipe or a device: reading one can block forever.
    if let Ok(meta) = std::fs::symlink_metadata(path)
        && !meta.is_file()
        && !meta.is_dir()
    {
        return Err(ToolError::InvalidArguments(format!(
            "{shown} is not a regular file (a pipe, socket, device or link): cairn edits regular files only"
        )));
    }
    match std::fs::read(path) {
        Ok(bytes) => String::from_utf8(bytes).map(Some).map_err(|_| {
            ToolError::InvalidArguments(format!("{shown} is not UTF-8 text: cairn edits text files only"))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::IsADirectory => {
            Err(ToolError::InvalidArguments(format!("{shown} is a directory")))
        }
        Err(source) => Err(ToolError::Io { context: format!("cannot read {shown}"), source }),
    }
}

/// Mode of a file `write_file` creates, and of the directories it creates
/// for it (set explicitly, whatever the umask, so the change recorded
/// before the write is the change made).
const NEW_FILE_MODE: u32 = 0o644;
const NEW_DIR_MODE: u32 = 0o755;

/// Replace `path` with `content` atomically, keeping its permissions (a
/// new file gets [`NEW_FILE_MODE`], missing directories [`NEW_DIR_MODE`]).
fn write_atomic(path: &Path, content: &str, shown: &str) -> Result<(), ToolError> {
    use std::os::unix::fs::PermissionsExt;
    let parent = path.parent().ok_or_else(|| ToolError::InvalidArguments(format!("{shown} has no parent")))?;
    let missing: Vec<&Path> = parent.ancestors().take_while(|d| std::fs::symlink_metadata(d).is_err()).collect();
    for dir in missing.iter().rev() {
        match std::fs::create_dir(dir) {
            Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(NEW_DIR_MODE))
                .map_err(io(format!("cannot create the directories of {shown}")))?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(ToolError::Io { context: format!("cannot create the directories of {shown}"), source: e });
            }
        }
    }
    let mut tmp = tempfile::NamedTempFile::new_in(parent).map_err(io(format!("cannot write next to {shown}")))?;
    std::io::Write::write_all(&mut tmp, content.as_bytes()).map_err(io(format!("cannot write {shown}")))?;
    let permissions = match std::fs::metadata(path) {
        Ok(meta) => meta.permissions(),
        Err(_) => std::fs::Permissions::from_mode(NEW_FILE_MODE),
    };
    let _ = std::fs::set_permissions(tmp.path(), permissions);
    tmp.persist(path).map_err(|e| ToolError::Io { context: format!("cannot replace {shown}"), source: e.error })?;
    Ok(())
}

/// The change writing `content` to `rel` makes (the file, and each
/// directory it creates), with the prior states read from `cwd`.
fn change_set(cwd: &Path, rel: &str, content: &str) -> Result<ChangeSet, String> {
    use sha2::Digest as _;
    let mut changes = Vec::new();
    let parts: Vec<&str> = rel.split('/').collect();
    for depth in 1..parts.len() {
        let dir = parts[..depth].join("/");
        if crate::undo::observe(cwd, &dir)?.is_none() {
            let after = FileState { kind: EntryKind::Dir, size: 0, sha256: String::new(), mode: NEW_DIR_MODE };
            changes.push(Change {
                path: dir,
                kind: ChangeKind::Created,
                before: None,
                after: Some(after),
                lines: None,
                appends: false,
                discards_uncommitted: false,
            });
        }
    }
    let before = crate::undo::observe(cwd, rel)?;
    let mode = before.as_ref().map_or(NEW_FILE_MODE, |b| b.mode);
    let sha256 = crate::beneath::hex(&sha2::Sha256::digest(content.as_bytes()));
    let after = FileState { kind: EntryKind::File, size: content.len() as u64, sha256, mode };
    let kind = if before.is_some() { ChangeKind::Modified } else { ChangeKind::Created };
    changes.push(Change {
        path: rel.to_owned(),
        kind,
        before,
        after: Some(after),
        lines: None,
        appends: false,
        discards_uncommitted: false,
    });
    Ok(ChangeSet { changes })
}

/// The authority the path argument of a call names, from the path alone
/// (the rules that hold in every tree): what [`Tool::risk`] can see
/// before the call runs.
fn named_authority(rules: &AuthorityRules, arguments: &Value) -> Option<Authority> {
    let path = arguments.get("path").and_then(Value::as_str)?;
    rules.classify(Path::new(""), path)
}

/// Refuse `rel` (canonical, relative to `cwd`) when it lies under cairn's
/// own directories, which no tool may read or change; else the authority
/// it carries, if any.
fn authority_of(rules: &AuthorityRules, cwd: &Path, rel: &str) -> Result<Option<Authority>, ToolError> {
    let tree = cwd.canonicalize().unwrap_or_else(|_| cwd.to_path_buf());
    match crate::hookspath::authority_here(rules, &tree).classify(&tree, rel) {
        Some(a) if a.protection() == Protection::Refused => Err(ToolError::AccessDenied(format!(
            "{}; cairn refuses every tool access to it. Edit it yourself outside cairn if it must change",
            a.reason()
        ))),
        other => Ok(other),
    }
}

/// For a host that writes `new` to `rel` through another channel (an ACP
/// editor's `fs/write_text_file`): the checks `write_file` and `edit_file`
/// make before they write — refused under cairn's own directories, and a
/// path carrying authority that the call's `tier` did not already show a
/// person is held for one (refused headless). `diff` is what a person is
/// shown.
pub fn hold_authority(
    rules: &AuthorityRules,
    ctx: &mut ToolContext<'_>,
    rel: &str,
    new: &str,
    diff: &str,
    tier: Risk,
) -> Result<(), ToolError> {
    let authority = authority_of(rules, ctx.cwd, rel)?;
    match authority.as_ref().filter(|_| tier != Risk::Destructive) {
        Some(a) => record_write(None, ctx, rel, diff, new, Some(a)),
        None => Ok(()),
    }
}

/// Before writing `new` to `rel`: keep its prior state in `store` and have
/// the turn record the change with it (`toolStaged`), so the write can be
/// undone and a resumed session finishes it. Without a store, nothing,
/// unless `authority` is set: a path carrying authority that the call's
/// tier did not already show a person (it needed the tree to tell), so the
/// record is judged Destructive and the turn's gate asks a person (refused
/// headless).
fn record_write(
    store: Option<&PreimageStore>,
    ctx: &mut ToolContext<'_>,
    rel: &str,
    diff: &str,
    new: &str,
    authority: Option<&Authority>,
) -> Result<(), ToolError> {
    if store.is_none() && authority.is_none() {
        return Ok(());
    }
    let (changes, preimages) = match (change_set(ctx.cwd, rel, new), store) {
        (Ok(changes), Some(store)) => {
            let preimages = store.keep(ctx.cwd, &changes);
            (changes, preimages)
        }
        (Ok(changes), None) => (changes, Preimages::NotKept { reason: "no pre-image store is configured".to_owned() }),
        (Err(reason), _) => (ChangeSet::default(), Preimages::NotKept { reason }),
    };
    // Otherwise the call was approved at its tier with its preview; the
    // record adds nothing to decide.
    let judgement = match authority {
        Some(a) => {
            Judgement { risk: Risk::Destructive, reasons: vec![format!("writes {}", a.reason())], refused: Vec::new() }
        }
        None => Judgement { risk: Risk::Write, reasons: Vec::new(), refused: Vec::new() },
    };
    let review = StagedReview { changes: &changes, judgement: &judgement, diff, staging: "", preimages: &preimages };
    match (ctx.review_staged)(&review) {
        StagedDecision::Apply { .. } => Ok(()),
        StagedDecision::Discard { reason } => Err(ToolError::Rejected(reason)),
    }
}

/// On resume of a write whose change was recorded: finish it (the guard
/// says whether it is done; else it is written now).
fn finish(
    tool: &dyn Tool,
    request: &ToolRequest,
    cwd: &Path,
    plan: impl FnOnce() -> Result<(PathBuf, String, String), ToolError>,
) -> GuardVerdict {
    match tool.guard(request, cwd) {
        GuardVerdict::NotDone => {}
        verdict => return verdict,
    }
    let Ok((path, rel, new)) = plan() else { return GuardVerdict::Unknown };
    if write_atomic(&path, &new, &rel).is_err() {
        return GuardVerdict::Unknown;
    }
    GuardVerdict::AlreadyDone(ToolReceipt {
        exit_code: 0,
        output_summary: format!("[cairn: resumed after an interruption: the recorded write of {rel} was finished]"),
        structured_output: Some(json!({"path": rel, "resumed": true})),
        affected_entities: vec![rel],
        duration_ms: 0,
        tier: Risk::Write,
        timestamp: crate::now_ms(),
        truncated: false,
    })
}

/// `write_file {path, content}`.
#[derive(Debug)]
pub struct WriteFile {
    spec: ToolSpec,
    preimages: Option<PreimageStore>,
    authority: AuthorityRules,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
    content: String,
}

impl Default for WriteFile {
    fn default() -> Self {
        Self::new()
    }
}

impl WriteFile {
    /// The tool, keeping the prior state of what it writes in `store`
    /// (recorded before each write, so the write can be undone).
    pub fn with_preimages(store: Option<PreimageStore>) -> Self {
        Self { preimages: store, ..Self::new() }
    }

    /// The tool with the host's authority locations (cairn's own
    /// directories, the user's home).
    pub fn with_authority(self, authority: AuthorityRules) -> Self {
        Self { authority, ..self }
    }
}

impl WriteFile {
    /// The tool.
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "write_file".into(),
                description: "Create or overwrite a text file in the working directory with the given content \
                              (parent directories are created)."
                    .into(),
                input_schema: json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "format": "path", "description": "File path relative to the working directory"},
                        "content": {"type": "string", "description": "The complete new content"}
                    },
                    "required": ["path", "content"],
                    "additionalProperties": false
                }),
                risk: Risk::Write,
                capabilities: caps(&[Capability::FileRead, Capability::FileWrite]),
                replay: ReplayPolicy::Guarded,
            },
            preimages: None,
            authority: AuthorityRules::default(),
        }
    }

    fn plan(&self, request: &ToolRequest, cwd: &Path) -> Result<(PathBuf, String, Option<String>, String), ToolError> {
        let args: WriteArgs = parse_args(request).map_err(ToolError::InvalidArguments)?;
        let path = resolve_in_cwd(cwd, &args.path).map_err(denied)?;
        let rel = display_rel(cwd, &path);
        authority_of(&self.authority, cwd, &rel)?;
        let old = current_text(&path, &rel)?;
        Ok((path, rel, old, args.content))
    }
}

impl Tool for WriteFile {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn risk(&self, arguments: &Value) -> Risk {
        if named_authority(&self.authority, arguments).is_some() { Risk::Destructive } else { self.spec.risk }
    }

    fn risk_reason(&self, arguments: &Value) -> Option<String> {
        named_authority(&self.authority, arguments).map(|a| format!("it writes {}", a.reason()))
    }

    fn validate(&self, request: &ToolRequest) -> Validation {
        match parse_args::<WriteArgs>(request) {
            Ok(a) if a.path.trim().is_empty() => Validation::Invalid("path is empty".into()),
            Ok(_) => Validation::Valid,
            Err(e) => Validation::Invalid(e),
        }
    }

    fn preview(&self, request: &ToolRequest, cwd: &Path) -> Option<Preview> {
        match self.plan(request, cwd) {
            Ok((_, rel, old, new)) => {
                Some(Preview::Diff { diff: unified_diff(&rel, old.as_deref().unwrap_or(""), &new), path: rel })
            }
            Err(e) => Some(Preview::Text { text: format!("write_file will fail: {e}") }),
        }
    }

    fn guard(&self, request: &ToolRequest, cwd: &Path) -> GuardVerdict {
        match self.plan(request, cwd) {
            Ok((_, rel, Some(old), new)) if old == new => GuardVerdict::AlreadyDone(ToolReceipt {
                exit_code: 0,
                output_summary: format!("{rel} already has the requested content"),
                structured_output: Some(json!({"path": rel, "diff": ""})),
                affected_entities: vec![rel],
                duration_ms: 0,
                tier: Risk::Write,
                timestamp: crate::now_ms(),
                truncated: false,
            }),
            Ok(_) => GuardVerdict::NotDone,
            Err(_) => GuardVerdict::Unknown,
        }
    }

    fn resume_staged(&self, request: &ToolRequest, cwd: &Path, _staged: &StagedCommit<'_>) -> GuardVerdict {
        finish(self, request, cwd, || self.plan(request, cwd).map(|(path, rel, _, new)| (path, rel, new)))
    }

    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let start = Instant::now();
        let (path, rel, old, new) = self.plan(request, ctx.cwd)?;
        if ctx.cancel.is_cancelled() {
            return Err(ToolError::Cancelled);
        }
        let diff = unified_diff(&rel, old.as_deref().unwrap_or(""), &new);
        let tier = self.risk(&request.arguments);
        let authority = authority_of(&self.authority, ctx.cwd, &rel)?;
        let unasked = authority.as_ref().filter(|_| tier != Risk::Destructive);
        record_write(self.preimages.as_ref(), ctx, &rel, &diff, &new, unasked)?;
        write_atomic(&path, &new, &rel)?;
        let verb = if old.is_some() { "updated" } else { "created" };
        let summary = format!("{verb} {rel} ({} bytes)\n{diff}", new.len());
        (ctx.output)(summary.as_bytes());
        let structured = json!({"path": rel, "created": old.is_none(), "bytes": new.len(), "diff": diff});
        let tier = if authority.is_some() { Risk::Destructive } else { tier };
        Ok(receipt(start, tier, summary, ctx.limits.output_cap, Some(structured), vec![rel]))
    }
}

/// `edit_file {path, old, new}` (exact text, must match once) or
/// `{path, patch}` (a unified diff).
#[derive(Debug)]
pub struct EditFile {
    spec: ToolSpec,
    preimages: Option<PreimageStore>,
    authority: AuthorityRules,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EditArgs {
    path: String,
    old: Option<String>,
    new: Option<String>,
    patch: Option<String>,
}

enum Edit {
    Replace { old: String, new: String },
    Patch(String),
}

fn edit_of(args: EditArgs) -> Result<(String, Edit), String> {
    match (args.old, args.new, args.patch) {
        (Some(old), Some(new), None) => {
            if old.is_empty() {
                Err("old is empty: give the exact text to replace (use write_file to create a file)".into())
            } else if old == new {
                Err("old and new are identical: nothing would change".into())
            } else {
                Ok((args.path, Edit::Replace { old, new }))
            }
        }
        (None, None, Some(patch)) => Ok((args.path, Edit::Patch(patch))),
        _ => {
            Err("give either {path, old, new} (exact replacement) or {path, patch} (a unified diff), not a mix".into())
        }
    }
}

impl Default for EditFile {
    fn default() -> Self {
        Self::new()
    }
}

impl EditFile {
    /// The tool, keeping the prior state of what it edits in `store`
    /// (recorded before each edit, so the edit can be undone).
    pub fn with_preimages(store: Option<PreimageStore>) -> Self {
        Self { preimages: store, ..Self::new() }
    }

    /// The tool with the host's authority locations (cairn's own
    /// directories, the user's home).
    pub fn with_authority(self, authority: AuthorityRules) -> Self {
        Self { authority, ..self }
    }
}

impl EditFile {
    /// The tool.
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "edit_file".into(),
                description: "Edit a text file in the working directory. Either replace the exact text `old` \
                              (which must occur exactly once, whitespace included) with `new`, or apply `patch`, \
                              a unified diff against the file's current content."
                    .into(),
                input_schema: json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "format": "path", "description": "File path relative to the working directory"},
                        "old": {"type": "string", "description": "Exact text to replace (must occur exactly once)"},
                        "new": {"type": "string", "description": "Replacement text"},
                        "patch": {"type": "string", "description": "A unified diff to apply instead of old/new (give either old and new, or patch)"}
                    },
                    "required": ["path"],
                    "additionalProperties": false
                }),
                risk: Risk::Write,
                capabilities: caps(&[Capability::FileRead, Capability::FileWrite]),
                replay: ReplayPolicy::Guarded,
            },
            preimages: None,
            authority: AuthorityRules::default(),
        }
    }

    /// Path, relative name, current content and the edited content.
    fn plan(&self, request: &ToolRequest, cwd: &Path) -> Result<(PathBuf, String, String, String), ToolError> {
        let args: EditArgs = parse_args(request).map_err(ToolError::InvalidArguments)?;
        let (given, _) = edit_of(args).map_err(ToolError::InvalidArguments)?;
        let path = resolve_in_cwd(cwd, &given).map_err(denied)?;
        let rel = display_rel(cwd, &path);
        authority_of(&self.authority, cwd, &rel)?;
        let current = current_text(&path, &rel)?
            .ok_or_else(|| ToolError::InvalidArguments(format!("{rel} does not exist: use write_file to create it")))?;
        let edited = edit_text(request, &current, &rel)?;
        Ok((path, rel, current, edited))
    }
}

/// The text `current` of the file `rel` with the edit of an `edit_file`
/// `request` applied, or why it does not apply. Pure (no file access): the
/// ACP face applies it to the editor's buffer.
pub fn edit_text(request: &ToolRequest, current: &str, rel: &str) -> Result<String, ToolError> {
    let args: EditArgs = parse_args(request).map_err(ToolError::InvalidArguments)?;
    let (_, edit) = edit_of(args).map_err(ToolError::InvalidArguments)?;
    match edit {
        Edit::Replace { old, new } => match current.matches(old.as_str()).count() {
            1 => Ok(current.replacen(old.as_str(), &new, 1)),
            0 => Err(ToolError::InvalidArguments(format!(
                "the old text was not found in {rel}: read the file and copy the exact text, whitespace included"
            ))),
            n => Err(ToolError::InvalidArguments(format!(
                "the old text occurs {n} times in {rel}: include more surrounding lines so it matches exactly once"
            ))),
        },
        Edit::Patch(text) => {
            let patch = diffy::Patch::from_str(&text)
                .map_err(|e| ToolError::InvalidArguments(format!("the patch is not a valid unified diff: {e}")))?;
            diffy::apply(current, &patch).map_err(|e| {
                    ToolError::InvalidArguments(format!(
                        "the patch does not apply to {rel} ({e}): read the file again and make the diff against its current content"
                    ))
                })
        }
    }
}

impl Tool for EditFile {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn risk(&self, arguments: &Value) -> Risk {
        if named_authority(&self.authority, arguments).is_some() { Risk::Destructive } else { self.spec.risk }
    }

    fn risk_reason(&self, arguments: &Value) -> Option<String> {
        named_authority(&self.authority, arguments).map(|a| format!("it edits {}", a.reason()))
    }

    fn validate(&self, request: &ToolRequest) -> Validation {
        match parse_args::<EditArgs>(request).and_then(edit_of) {
            Ok((path, _)) if path.trim().is_empty() => Validation::Invalid("path is empty".into()),
            Ok((_, Edit::Patch(p))) => match diffy::Patch::from_str(&p) {
                Ok(_) => Validation::Valid,
                Err(e) => Validation::Invalid(format!("the patch is not a valid unified diff: {e}")),
            },
            Ok(_) => Validation::Valid,
            Err(e) => Validation::Invalid(e),
        }
    }

    fn preview(&self, request: &ToolRequest, cwd: &Path) -> Option<Preview> {
        match self.plan(request, cwd) {
            Ok((_, rel, old, new)) => Some(Preview::Diff { diff: unified_diff(&rel, &old, &new), path: rel }),
            Err(e) => Some(Preview::Text { text: format!("edit_file will fail: {e}") }),
        }
    }

    fn guard(&self, request: &ToolRequest, cwd: &Path) -> GuardVerdict {
        if self.plan(request, cwd).is_ok() {
            // The edit still applies to the current content: not done yet.
            return GuardVerdict::NotDone;
        }
        let Ok(args) = parse_args::<EditArgs>(request) else { return GuardVerdict::Unknown };
        let Ok((given, edit)) = edit_of(args) else { return GuardVerdict::Unknown };
        let Ok(path) = resolve_in_cwd(cwd, &given) else { return GuardVerdict::Unknown };
        let rel = display_rel(cwd, &path);
        let Ok(Some(current)) = current_text(&path, &rel) else { return GuardVerdict::Unknown };
        let done = match edit {
            Edit::Replace { old, new } => !current.contains(old.as_str()) && current.contains(new.as_str()),
            Edit::Patch(text) => {
                diffy::Patch::from_str(&text).ok().is_some_and(|p| diffy::apply(&current, &p.reverse()).is_ok())
            }
        };
        if done {
            GuardVerdict::AlreadyDone(ToolReceipt {
                exit_code: 0,
                output_summary: format!("{rel} already contains the edit"),
                structured_output: Some(json!({"path": rel})),
                affected_entities: vec![rel],
                duration_ms: 0,
                tier: Risk::Write,
                timestamp: crate::now_ms(),
                truncated: false,
            })
        } else {
            GuardVerdict::Unknown
        }
    }

    fn resume_staged(&self, request: &ToolRequest, cwd: &Path, _staged: &StagedCommit<'_>) -> GuardVerdict {
        finish(self, request, cwd, || self.plan(request, cwd).map(|(path, rel, _, new)| (path, rel, new)))
    }

    fn execute(&self, request: &ToolRequest, ctx: &mut ToolContext<'_>) -> Result<ToolReceipt, ToolError> {
        let start = Instant::now();
        let (path, rel, old, new) = self.plan(request, ctx.cwd)?;
        if ctx.cancel.is_cancelled() {
            return Err(ToolError::Cancelled);
        }
        let diff = unified_diff(&rel, &old, &new);
        let tier = self.risk(&request.arguments);
        let authority = authority_of(&self.authority, ctx.cwd, &rel)?;
        let unasked = authority.as_ref().filter(|_| tier != Risk::Destructive);
        record_write(self.preimages.as_ref(), ctx, &rel, &diff, &new, unasked)?;
        write_atomic(&path, &new, &rel)?;
        let summary = format!("edited {rel}\n{diff}");
        (ctx.output)(summary.as_bytes());
        let structured = json!({"path": rel, "diff": diff});
        let tier = if authority.is_some() { Risk::Destructive } else { tier };
        Ok(receipt(start, tier, summary, ctx.limits.output_cap, Some(structured), vec![rel]))
    }
}
