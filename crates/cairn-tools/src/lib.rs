//! cairn-tools: the tools an agent calls, and the fence around them.
//!
//! Built-in tools (`read_file`, `list_dir`, `search`, `write_file`,
//! `edit_file`, `shell`) and external tools (an executable plus `NAME.toml`
//! metadata, Ollie's model) all implement [`cairn_core::tool::Tool`]. Every
//! process a tool starts (`shell`, every external tool) runs in its own
//! process group, with a scrubbed environment, a timeout, an output cap and a
//! Landlock + seccomp sandbox derived from the tool's declared capabilities:
//! what a tool declares is exactly what its sandbox allows. Built-ins that
//! run in-process confine their paths to the working directory instead.
//!
//! The crate performs no approvals itself: it asks the turn through
//! `ToolContext::approve_bypass` when one call needs access outside its
//! rules, and the turn records the verdict.
//!
//! # Layout
//! - [`paths`]: resolve a path inside the working directory or refuse it.
//! - [`mod@env`]: environment scrubbing (no keys, tokens, secrets, passwords,
//!   by name and by value).
//! - [`sandbox`]: capabilities → Landlock ruleset + seccomp filters + pids
//!   cgroup; [`landlock_status`] reports what the kernel enforces.
//! - [`process`]: spawn, stream, cap, time out, cancel, kill the group.
//! - [`builtin`]: the built-in tools.
//! - [`external`]: the metadata format and its checks, the scan of the
//!   tools directories and the external tool.
//! - [`trust`]: which working directories' own tools may be loaded.
//! - [`hookspath`]: the tree's `core.hooksPath`, for the authority rule.
//!
//! Where tools come from: [`tool_dirs`] (the one precedence) and
//! [`load_tools`] (built-ins, then every external tool that may load).
#![deny(missing_docs)]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod beneath;
pub mod builtin;
mod calltemp;
pub mod env;
pub mod external;
pub mod hooks;
pub mod hookspath;
pub mod paths;
pub mod process;
pub mod programs;
pub mod rewind;
pub mod sandbox;
pub mod staging;
pub mod trust;
pub mod undo;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use cairn_core::tool::Tool;

pub use builtin::builtin_tools;
pub use external::{ExternalTool, MetadataError, ToolDirScan, UntrustedTools};
pub use sandbox::{SandboxStatus, describe_rules, landlock_abi, landlock_status};
pub use trust::{TrustState, TrustStore};

/// Settings for the tools of one session (the CLI fills it from its config
/// and flags; it deserializes from a `[tools]` table with every field
/// optional).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolsConfig {
    /// Regexes of shell command shapes that make a `shell` call Destructive.
    pub destructive_patterns: Vec<String>,
    /// Run Write/Destructive process tools even where the kernel cannot
    /// sandbox them. Off by default; an explicit per-session opt-in.
    pub allow_unsandboxed: bool,
    /// Give `shell` network access (off by default: the sandbox denies it).
    pub shell_network: bool,
    /// When a sandboxed `shell` command fails with a permission error, ask
    /// (through the bypass broker) whether to run it once more unsandboxed.
    pub offer_bypass_on_denial: bool,
    /// Largest file `read_file` reads whole (bytes); larger files need a
    /// line range.
    pub read_max_bytes: u64,
    /// Default number of lines `read_file` returns.
    pub read_default_lines: usize,
    /// Most matches `search` reports.
    pub search_max_matches: usize,
    /// Most entries `list_dir` reports.
    pub list_max_entries: usize,
    /// Most processes one call may have at once (pids cgroup, when cairn
    /// can create one).
    pub max_processes: u32,
    /// Extra read-only (and executable) paths every sandboxed process gets:
    /// in `cairn`, the developer configuration
    /// ([`programs::developer_config`]) and `[tools] sandbox_read_paths`
    /// (e.g. toolchains under `$HOME`: `~/.cargo/bin`, `~/.rustup`). Never
    /// a write, never a bypass.
    pub sandbox_read_paths: Vec<PathBuf>,
    /// Secret values the host holds (provider keys): no tool's environment
    /// carries a variable whose value equals or contains one, whatever its
    /// name. Filled by the host, never read from or written to a file.
    #[serde(skip)]
    pub secrets: env::SecretValues,
    /// Run `shell` staged in an overlay where the kernel allows it (see
    /// `staging`); off means the parsed classification alone decides.
    pub staged: bool,
    /// A staged effect changing more paths than this is Destructive.
    pub staged_max_files: usize,
    /// Where staging directories go (default: the system temp directory).
    pub staging_dir: Option<PathBuf>,
    /// The pre-image store (prior contents of the paths an effect
    /// changes, for `cairn undo`); `None` keeps none, so no effect can be
    /// undone.
    pub preimage_dir: Option<PathBuf>,
    /// An effect whose prior contents are larger than this is applied
    /// without keeping them (it cannot be undone).
    pub undo_max_bytes: u64,
    /// Paths no tool process may see (cairn's home with its control
    /// sockets): covered in each call's mount namespace (see
    /// `process::RunSpec::hidden`). Filled by the host.
    #[serde(skip)]
    pub hidden_paths: Vec<PathBuf>,
    /// Which paths carry authority (issue 46), with the host's locations:
    /// a change to one is Destructive, or refused under cairn's own
    /// directories, staged or not. Filled by the host.
    #[serde(skip)]
    pub authority: cairn_core::authority::AuthorityRules,
}

impl Default for ToolsConfig {
    fn default() -> Self {
        Self {
            destructive_patterns: builtin::shell::DEFAULT_DESTRUCTIVE_PATTERNS.iter().map(|s| s.to_string()).collect(),
            allow_unsandboxed: false,
            shell_network: false,
            offer_bypass_on_denial: true,
            read_max_bytes: 4 * 1024 * 1024,
            read_default_lines: 2000,
            search_max_matches: 200,
            list_max_entries: 1000,
            max_processes: 256,
            sandbox_read_paths: Vec::new(),
            secrets: env::SecretValues::new(),
            staged: true,
            staged_max_files: cairn_core::staged::StagedRules::default().max_files,
            staging_dir: None,
            preimage_dir: None,
            undo_max_bytes: undo::DEFAULT_MAX_BYTES,
            hidden_paths: Vec::new(),
            authority: cairn_core::authority::AuthorityRules::default(),
        }
    }
}

/// Where a tool came from, for `cairn tools`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolOrigin {
    /// Compiled into cairn.
    Builtin,
    /// An executable with a metadata file.
    External {
        /// The `NAME.toml` file.
        metadata: PathBuf,
        /// The executable.
        executable: PathBuf,
    },
    /// A tool of a configured MCP server (`cairn-mcp`).
    Mcp {
        /// The server's name.
        server: String,
    },
    /// A tool of a tool service (`cairn toolsrv`), which runs its calls.
    Service {
        /// The service's dial string.
        address: String,
    },
}

impl std::fmt::Display for ToolOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ToolOrigin::Builtin => f.write_str("builtin"),
            ToolOrigin::External { metadata, .. } => write!(f, "{}", metadata.display()),
            ToolOrigin::Mcp { server } => write!(f, "MCP server {server}"),
            ToolOrigin::Service { address } => write!(f, "tool service {address}"),
        }
    }
}

/// A tool and where it came from.
#[derive(Clone)]
pub struct ToolEntry {
    /// The tool.
    pub tool: Arc<dyn Tool>,
    /// Its origin.
    pub origin: ToolOrigin,
}

impl std::fmt::Debug for ToolEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolEntry").field("name", &self.tool.spec().name).field("origin", &self.origin).finish()
    }
}

/// Who put a tools directory where it is, which decides whether its tools
/// may load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolScope {
    /// The user's own directories (cairn's data and config directories):
    /// always trusted.
    User,
    /// `.cairn/tools/` of a working directory, which may come from anyone
    /// who can commit to it: loaded only while a person trusts `root` with
    /// exactly these files (see [`trust`]).
    Workspace {
        /// The working directory.
        root: PathBuf,
    },
}

/// A directory to scan for external tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolDir {
    /// The directory.
    pub path: PathBuf,
    /// Whose it is.
    pub scope: ToolScope,
}

impl ToolDir {
    /// One of the user's own tools directories (trusted).
    pub fn user(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into(), scope: ToolScope::User }
    }

    /// The tools a working directory ships: `ROOT/.cairn/tools/`
    /// (untrusted until trusted).
    pub fn workspace(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        Self { path: root.join(trust::WORKSPACE_TOOLS_DIR), scope: ToolScope::Workspace { root } }
    }
}

/// The tools directories in cairn's order of precedence, highest first:
/// `DATA/tools`, `CONFIG/tools` (once, when both are the same directory, as
/// with `CAIRN_HOME`), then the working directory's `.cairn/tools/`. On a
/// name clash the first directory wins and the later file is reported as
/// shadowed, so a project can never replace a tool the user installed.
pub fn tool_dirs(data_dir: &Path, config_dir: &Path, cwd: &Path) -> Vec<ToolDir> {
    let mut dirs = vec![ToolDir::user(data_dir.join("tools"))];
    if config_dir != data_dir {
        dirs.push(ToolDir::user(config_dir.join("tools")));
    }
    dirs.push(ToolDir::workspace(cwd));
    dirs
}

/// Start the kernel probes tool registration asks (namespaces, the pids
/// cgroup, overlay staging; each probed once per process) on a thread of
/// their own, for a command that will register tools after opening a
/// session: the probes' throwaway children are forked while the process is
/// still small (forking it after a long session's replay copies the page
/// tables of all of it), and the answers are ready when the registration
/// asks (it waits for a probe still running). The children issue raw
/// syscalls only, so forking beside other threads is safe. Keep the guard
/// for the command's life: dropping it waits for the probes, so a command
/// that ends early leaves no probe directory behind.
pub fn probe_ahead() -> ProbesAhead {
    let spawned = std::thread::Builder::new().name("cairn-probe".into()).spawn(|| {
        let _ = staging::overlay_status();
        let _ = sandbox::landlock_status();
    });
    // Without the thread, registration probes when it asks, as before.
    ProbesAhead(spawned.ok())
}

/// The probes [`probe_ahead`] started; waited for when dropped.
#[derive(Debug)]
pub struct ProbesAhead(Option<std::thread::JoinHandle<()>>);

impl Drop for ProbesAhead {
    fn drop(&mut self) {
        if let Some(thread) = self.0.take() {
            let _ = thread.join();
        }
    }
}

/// Every tool a session may offer, and why others are missing.
#[derive(Debug, Clone)]
pub struct LoadedTools {
    /// The built-ins, then the external tools in scan order.
    pub tools: Vec<ToolEntry>,
    /// Broken metadata, shadowed names and unreadable directories, one per
    /// file: show them to the user.
    pub errors: Vec<MetadataError>,
    /// Workspace tools not loaded because their directory is not trusted:
    /// tell the user how to trust it.
    pub untrusted: Vec<UntrustedTools>,
}

/// Every tool of a session: the built-ins, then the external tools found in
/// `dirs` (see [`tool_dirs`]) that may load under `trust`. Fails only on an
/// invalid destructive pattern in `config`.
pub fn load_tools(
    config: &ToolsConfig,
    dirs: &[ToolDir],
    trust: &TrustStore,
) -> Result<LoadedTools, builtin::shell::PatternError> {
    let mut tools = builtin_tools(config)?;
    let scan = ToolDirScan::scan(dirs, config, trust);
    let (external, errors) = scan.load_all();
    tools.extend(external);
    Ok(LoadedTools { tools, errors, untrusted: scan.untrusted().to_vec() })
}

/// Now in ms since the Unix epoch (receipt timestamps).
pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Cut `text` to at most `cap` bytes (on a char boundary) and append the
/// truncation marker; returns the text and whether it was cut.
pub(crate) fn cap_text(text: String, cap: usize) -> (String, bool) {
    if text.len() <= cap {
        return (text, false);
    }
    let mut end = cap;
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = text[..end].to_string();
    out.push_str(&process::truncation_marker(end as u64, text.len() as u64));
    (out, true)
}
