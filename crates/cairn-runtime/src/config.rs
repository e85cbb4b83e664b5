//! cairn's configuration: the TOML file, environment variables and command
//! line flags merged into one [`Settings`], remembering where each value
//! came from so `cairn config` can show it.
//!
//! Precedence, lowest first: built-in default, config file, environment,
//! command-line flag. This module reads the file; it never writes it.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use cairn_discovery::SelectionPolicy;
use serde::Deserialize;

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Built into cairn.
    Default,
    /// The configuration file.
    File(PathBuf),
    /// An environment variable.
    Env(&'static str),
    /// A command-line flag.
    Flag(&'static str),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => write!(f, "default"),
            Source::File(path) => write!(f, "{}", path.display()),
            Source::Env(name) => write!(f, "env {name}"),
            Source::Flag(name) => write!(f, "flag {name}"),
        }
    }
}

/// A value and its origin.
#[derive(Debug, Clone)]
pub struct Setting<T> {
    /// The value.
    pub value: T,
    /// Where it came from.
    pub source: Source,
}

impl<T> Setting<T> {
    fn default(value: T) -> Self {
        Self { value, source: Source::Default }
    }

    fn set(&mut self, value: T, source: Source) {
        self.value = value;
        self.source = source;
    }
}

/// The configuration file as written by a person.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Default provider name.
    pub provider: Option<String>,
    /// Default model.
    pub model: Option<String>,
    /// System prompt.
    pub system_prompt: Option<String>,
    /// Named providers: `[providers.NAME]` with kind, base_url, model, api_key_env.
    #[serde(default)]
    pub providers: BTreeMap<String, toml::Value>,
    /// Approval rules.
    #[serde(default)]
    pub approvals: ApprovalsConfig,
    /// Turn limits.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Tool settings.
    #[serde(default)]
    pub tools: ToolsFileConfig,
    /// Embedded model settings.
    #[serde(default)]
    pub local: LocalConfig,
    /// Session store settings.
    #[serde(default)]
    pub storage: StorageConfig,
    /// PostgreSQL URL: keep sessions in this database (`cairn worker`, `cairn submit`).
    pub database: Option<String>,
    /// Subagent limits (`[subagents]`, read by `subagents/`).
    #[serde(default)]
    pub subagents: Option<toml::Value>,
    /// Batch queue settings (`[batch]`, read by `batch.rs`).
    #[serde(default)]
    pub batch: Option<toml::Value>,
    /// `[discovery]`: read by `discover.rs` (threshold, max_tools, max_skills).
    #[serde(default)]
    pub discovery: toml::Table,
    /// `[mcp_servers.NAME]`: MCP servers whose tools cairn offers (checked
    /// by `cairn_mcp::parse_servers`).
    #[serde(default)]
    pub mcp_servers: toml::Table,
    /// `[[hooks.pre_tool]]`, `[[hooks.post_tool]]`: hook programs.
    #[serde(default)]
    pub hooks: cairn_tools::hooks::HooksConfig,
    /// `[telemetry]`: OpenTelemetry export (cairn-telemetry; the `OTEL_*`
    /// variables win over it).
    #[serde(default)]
    pub telemetry: Option<cairn_telemetry::TelemetryConfig>,
}

/// `[storage]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// Automatic compaction threshold (share of dead bytes, 0..1).
    pub compact_ratio: Option<f64>,
    /// Longest session-file line read or written, in bytes.
    pub max_line_bytes: Option<u64>,
}

/// `[approvals]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalsConfig {
    /// Allow patterns for Write tools (never Destructive).
    #[serde(default)]
    pub allow: Vec<String>,
}

/// `[limits]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Model steps per turn.
    pub max_steps: Option<u32>,
    /// Bytes of tool output the model sees.
    pub tool_output_cap: Option<usize>,
    /// Per-tool timeout in seconds.
    pub tool_timeout_secs: Option<u64>,
    /// Compact the conversation by summary past this percent of the
    /// model's context window (1–100; default 75).
    pub compaction_threshold: Option<u8>,
}

/// `[tools]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolsFileConfig {
    /// Extra command shapes treated as Destructive by `shell`.
    #[serde(default)]
    pub destructive_patterns: Vec<String>,
    /// Run `shell` staged in an overlay where the kernel allows it.
    pub staged: Option<bool>,
    /// A staged effect changing more paths than this is Destructive.
    pub staged_max_files: Option<usize>,
    /// Give `shell` network access (TCP and non-unix sockets; off by
    /// default). docs/tools.md says what changes with it.
    pub shell_network: Option<bool>,
    /// An effect whose prior contents are larger than this many bytes is
    /// applied without keeping them (it cannot be undone).
    pub undo_max_bytes: Option<u64>,
    /// Past this many bytes in the whole pre-image store, the blobs no
    /// session names are collected after a turn (`cairn undo --gc`).
    pub undo_store_max_bytes: Option<u64>,
    /// Use the tools of the `cairn toolsrv` at this dial string (`toolsrv.rs`).
    pub toolsrv: Option<String>,
    /// Paths (absolute or `~/`) every sandboxed process (shell, external
    /// tools, MCP servers, hooks) may read and execute, besides the
    /// developer configuration it reads by default.
    #[serde(default)]
    pub sandbox_read_paths: Vec<PathBuf>,
}

/// `[local]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalConfig {
    /// Inference threads.
    pub threads: Option<usize>,
    /// Faster, less exact weights.
    pub fast: Option<bool>,
    /// Path of the .gguf file.
    pub model_path: Option<PathBuf>,
}

/// Flags that override configuration.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// `--provider`.
    pub provider: Option<String>,
    /// `--model`.
    pub model: Option<String>,
    /// `--script` (implies the scripted provider).
    pub script: Option<PathBuf>,
    /// `--allow`.
    pub allow: Vec<String>,
    /// `--database`.
    pub database: Option<String>,
}

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The file that was read, if it exists.
    pub config_file: PathBuf,
    /// Whether the file exists.
    pub config_file_found: bool,
    /// Provider name.
    pub provider: Setting<String>,
    /// Model (None: the provider's default).
    pub model: Setting<Option<String>>,
    /// Script for the scripted provider.
    pub script: Setting<Option<PathBuf>>,
    /// System prompt.
    pub system_prompt: Setting<Option<String>>,
    /// Allow patterns (file and flags together).
    pub allow: Setting<Vec<String>>,
    /// Model steps per turn.
    pub max_steps: Setting<u32>,
    /// Tool output cap in bytes.
    pub tool_output_cap: Setting<usize>,
    /// Tool timeout in seconds.
    pub tool_timeout_secs: Setting<u64>,
    /// Percent of the context window past which the conversation is
    /// compacted by summary.
    pub compaction_threshold: Setting<u8>,
    /// Extra destructive shapes.
    pub destructive_patterns: Setting<Vec<String>>,
    /// Staged `shell` execution.
    pub staged: Setting<bool>,
    /// Most paths a staged effect may change before it is Destructive.
    pub staged_max_files: Setting<usize>,
    /// `shell` may reach the network.
    pub shell_network: Setting<bool>,
    /// Most bytes of prior content kept for one effect's undo.
    pub undo_max_bytes: Setting<u64>,
    /// Budget of the whole pre-image store (automatic collection past it).
    pub undo_store_max_bytes: Setting<u64>,
    /// `[tools] sandbox_read_paths`, `~/` expanded.
    pub sandbox_read_paths: Setting<Vec<PathBuf>>,
    /// Local model threads.
    pub local_threads: Setting<usize>,
    /// Local model fast mode.
    pub local_fast: Setting<bool>,
    /// Local model path override.
    pub local_model_path: Setting<Option<PathBuf>>,
    /// Automatic compaction threshold of session files.
    pub compact_ratio: Setting<f64>,
    /// Longest session-file line, in bytes.
    pub max_line_bytes: Setting<u64>,
    /// PostgreSQL URL (None: session files).
    pub database: Setting<Option<String>>,
    /// Named provider tables from the file.
    pub providers: BTreeMap<String, toml::Value>,
    /// The `[subagents]` table as written (limits; parsed by `subagents/`).
    pub subagents: Option<toml::Value>,
    /// The `[batch]` table as written (parsed by `batch.rs`).
    pub batch: Option<toml::Value>,
    /// The `[discovery]` table as written (parsed by `discover.rs`).
    pub discovery: toml::Table,
    /// `[tools] toolsrv`: the tool service's dial string (`toolsrv.rs`).
    pub toolsrv: Option<String>,
    /// `[mcp_servers.NAME]`, checked.
    pub mcp_servers: BTreeMap<String, cairn_mcp::ServerConfig>,
    /// `[hooks]`, checked.
    pub hooks: cairn_tools::hooks::HooksConfig,
    /// `[telemetry]` as written (resolved with the environment by
    /// `cairn_telemetry::resolve`).
    pub telemetry: Option<cairn_telemetry::TelemetryConfig>,
}

/// The name of a provider kind as a person writes it in `kind =`.
fn kind_name(kind: cairn_provider::ProviderKind) -> &'static str {
    use cairn_provider::ProviderKind as K;
    match kind {
        K::OpenAiChat => "openai-chat",
        K::OpenAiResponses => "openai-responses",
        K::Anthropic => "anthropic",
        K::Scripted => "scripted",
        K::Local => "local",
        _ => "other",
    }
}

/// Every key the configuration file accepts, as `section.key` paths
/// (`providers.NAME.kind`, `mcp_servers.NAME.tools.TOOL.risk`,
/// `hooks.EVENT.command`) and each section's own name, read from the serde structs that parse the file
/// (their field lists), so the list cannot drift from the parser.
/// docs/config.md documents each (a test checks both ways).
pub fn accepted_keys() -> Vec<String> {
    let mut keys = Vec::new();
    let nest = |keys: &mut Vec<String>, prefix: &str, fields: &[&str]| {
        keys.extend(fields.iter().map(|f| format!("{prefix}.{f}")));
    };
    for &section in fields_of::<FileConfig>() {
        // The section itself (a table) or a top-level key.
        keys.push(section.to_owned());
        match section {
            "providers" => nest(&mut keys, "providers.NAME", fields_of::<cairn_provider::ProviderTable>()),
            "approvals" => nest(&mut keys, section, fields_of::<ApprovalsConfig>()),
            "limits" => nest(&mut keys, section, fields_of::<LimitsConfig>()),
            "tools" => nest(&mut keys, section, fields_of::<ToolsFileConfig>()),
            "local" => nest(&mut keys, section, fields_of::<LocalConfig>()),
            "storage" => nest(&mut keys, section, fields_of::<StorageConfig>()),
            "subagents" => nest(&mut keys, section, fields_of::<SubagentLimits>()),
            "batch" => nest(&mut keys, section, fields_of::<BatchConfig>()),
            "discovery" => nest(&mut keys, section, fields_of::<DiscoveryConfig>()),
            "mcp_servers" => {
                nest(&mut keys, "mcp_servers.NAME", fields_of::<cairn_mcp::ServerConfig>());
                nest(&mut keys, "mcp_servers.NAME.tools.TOOL", fields_of::<cairn_mcp::ToolOverride>());
            }
            "telemetry" => nest(&mut keys, section, fields_of::<cairn_telemetry::TelemetryConfig>()),
            "hooks" => {
                nest(&mut keys, "hooks", fields_of::<cairn_tools::hooks::HooksConfig>());
                nest(&mut keys, "hooks.EVENT", fields_of::<cairn_tools::hooks::HookConfig>());
            }
            _ => {}
        }
    }
    // `mcp_servers.NAME.tools` is the table of per-tool overrides above.
    keys.retain(|k| k != "mcp_servers.NAME.tools");
    keys
}

/// The field names serde's derive gives `T` (what `deny_unknown_fields`
/// accepts): a deserializer that stops at `deserialize_struct` and keeps
/// the list it is handed.
fn fields_of<T: serde::de::DeserializeOwned>() -> &'static [&'static str] {
    use serde::de::{Error as _, Visitor};
    struct Probe<'a>(&'a mut &'static [&'static str]);
    impl<'de> serde::Deserializer<'de> for Probe<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(Self::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(Self::Error::custom("fields read"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut fields));
    fields
}

/// The prices of `model` as asked of provider `provider` (a usage row's
/// names), from its `[providers.NAME]` table in `tables` or the built-in
/// of that name (`cairn_provider::ProviderConfig::prices_for`): what
/// `/status` shows and what `cairn.cost` exports, priced in one place.
pub fn prices(
    tables: &BTreeMap<String, toml::Value>,
    provider: &str,
    model: &str,
) -> Result<cairn_provider::Prices, cairn_provider::Unpriced> {
    match cairn_provider::ProviderConfig::resolve(provider, tables.get(provider)) {
        Ok(config) => config.prices_for(model),
        // A provider no longer configured (or no longer valid).
        Err(_) => Err(cairn_provider::Unpriced::NoPrices { provider: provider.to_owned(), model: model.to_owned() }),
    }
}

/// Default model steps per turn.
pub const DEFAULT_MAX_STEPS: u32 = 24;
/// Default bytes of tool output shown to the model.
pub const DEFAULT_TOOL_OUTPUT_CAP: usize = 16 * 1024;
/// Default per-tool timeout.
pub const DEFAULT_TOOL_TIMEOUT_SECS: u64 = 120;

impl Settings {
    /// Read the file (if present), then apply environment and flags.
    pub fn load(config_file: &Path, overrides: &Overrides) -> Result<Self> {
        let (file, found) = match std::fs::read_to_string(config_file) {
            Ok(text) => {
                let parsed: FileConfig = toml::from_str(&text).with_context(|| {
                    format!("{} is not a valid cairn configuration; fix it or move it away", config_file.display())
                })?;
                (parsed, true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (FileConfig::default(), false),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", config_file.display())),
        };
        let from_file = || Source::File(config_file.to_path_buf());
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());

        let mut provider = Setting::default("local".to_owned());
        let mut model = Setting::default(None);
        let mut script = Setting::default(None);
        let mut system_prompt = Setting::default(None);
        let mut allow = Setting::default(Vec::new());
        let mut max_steps = Setting::default(DEFAULT_MAX_STEPS);
        let mut tool_output_cap = Setting::default(DEFAULT_TOOL_OUTPUT_CAP);
        let mut tool_timeout_secs = Setting::default(DEFAULT_TOOL_TIMEOUT_SECS);
        let mut destructive_patterns = Setting::default(Vec::new());
        let mut staged = Setting::default(true);
        let mut staged_max_files = Setting::default(cairn_core::staged::StagedRules::default().max_files);
        let mut undo_max_bytes = Setting::default(cairn_tools::undo::DEFAULT_MAX_BYTES);
        let mut shell_network = Setting::default(false);
        let mut undo_store_max_bytes = Setting::default(cairn_tools::undo::DEFAULT_STORE_MAX_BYTES);
        let mut compaction_threshold = Setting::default(75u8);
        let mut sandbox_read_paths = Setting::default(Vec::new());
        let mut local_threads = Setting::default(1);
        let mut local_fast = Setting::default(false);
        let mut local_model_path = Setting::default(None);
        let mut compact_ratio = Setting::default(cairn_core::storage::DEFAULT_COMPACT_RATIO);
        let mut max_line_bytes = Setting::default(cairn_core::storage::DEFAULT_MAX_LINE_BYTES);

        if let Some(v) = file.provider {
            provider.set(v, from_file());
        }
        if let Some(v) = file.model {
            model.set(Some(v), from_file());
        }
        if let Some(v) = file.system_prompt {
            system_prompt.set(Some(v), from_file());
        }
        if !file.approvals.allow.is_empty() {
            allow.set(file.approvals.allow, from_file());
        }
        if let Some(v) = file.limits.max_steps {
            max_steps.set(v, from_file());
        }
        if let Some(v) = file.limits.tool_output_cap {
            tool_output_cap.set(v, from_file());
        }
        if let Some(v) = file.limits.tool_timeout_secs {
            tool_timeout_secs.set(v, from_file());
        }
        if let Some(v) = file.limits.compaction_threshold {
            if !(1..=100).contains(&v) {
                anyhow::bail!(
                    "{}: [limits] compaction_threshold = {v} must be a percent of the context window between 1 and 100 \
                     (use --no-compaction to turn compaction off)",
                    config_file.display()
                );
            }
            compaction_threshold.set(v, from_file());
        }
        if !file.tools.destructive_patterns.is_empty() {
            destructive_patterns.set(file.tools.destructive_patterns, from_file());
        }
        if let Some(v) = file.tools.staged {
            staged.set(v, from_file());
        }
        if let Some(v) = file.tools.staged_max_files {
            staged_max_files.set(v, from_file());
        }
        if let Some(v) = file.tools.shell_network {
            shell_network.set(v, from_file());
        }
        if let Some(v) = file.tools.undo_store_max_bytes {
            undo_store_max_bytes.set(v, from_file());
        }
        if let Some(v) = file.tools.undo_max_bytes {
            undo_max_bytes.set(v, from_file());
        }
        if !file.tools.sandbox_read_paths.is_empty() {
            let mut paths = Vec::new();
            for p in &file.tools.sandbox_read_paths {
                let expanded = cairn_tools::programs::expand(p);
                if !expanded.is_absolute() {
                    anyhow::bail!(
                        "{}: [tools] sandbox_read_paths entry {} is relative; give an absolute path or one starting \
                         with ~/",
                        config_file.display(),
                        p.display()
                    );
                }
                paths.push(expanded);
            }
            sandbox_read_paths.set(paths, from_file());
        }
        if let Some(v) = file.local.threads {
            local_threads.set(v, from_file());
        }
        if let Some(v) = file.local.fast {
            local_fast.set(v, from_file());
        }
        if let Some(v) = file.local.model_path {
            local_model_path.set(Some(v), from_file());
        }
        if let Some(v) = file.storage.compact_ratio {
            if !(v > 0.0 && v < 1.0) {
                anyhow::bail!(
                    "{}: storage.compact_ratio = {v} is out of range; use a share of dead bytes between 0 and 1 (default {})",
                    config_file.display(),
                    cairn_core::storage::DEFAULT_COMPACT_RATIO
                );
            }
            compact_ratio.set(v, from_file());
        }
        if let Some(v) = file.storage.max_line_bytes {
            if v < 4096 {
                anyhow::bail!(
                    "{}: storage.max_line_bytes = {v} is too small; use at least 4096 (default {})",
                    config_file.display(),
                    cairn_core::storage::DEFAULT_MAX_LINE_BYTES
                );
            }
            max_line_bytes.set(v, from_file());
        }

        // Every section is checked here, not when a command first uses it,
        // so `cairn config` is the check of a whole file (issue 49.8).
        if let Err(e) = SubagentLimits::of(file.subagents.as_ref()) {
            anyhow::bail!("{}: [subagents] is invalid: {e}", config_file.display());
        }
        if let Err(e) = BatchConfig::of(file.batch.as_ref()) {
            anyhow::bail!("{}: [batch] is invalid: {e}; its one key is max_running (default 2)", config_file.display());
        }
        policy_of(&file.discovery, config_file)?;
        for (name, table) in &file.providers {
            cairn_provider::ProviderConfig::from_toml(name, table)
                .map_err(|e| anyhow::anyhow!("{}: {e}", config_file.display()))?;
        }
        let mcp_servers = cairn_mcp::parse_servers(&file.mcp_servers)
            .with_context(|| format!("{} has an MCP server cairn cannot use", config_file.display()))?;
        file.hooks.check().map_err(|e| anyhow::anyhow!("{}: {e}", config_file.display()))?;
        let mut database = Setting::default(None);
        if let Some(v) = file.database {
            database.set(Some(v), from_file());
        }
        if let Some(v) = env("CAIRN_DATABASE") {
            database.set(Some(v), Source::Env("CAIRN_DATABASE"));
        }
        if let Some(v) = &overrides.database {
            database.set(Some(v.clone()), Source::Flag("--database"));
        }
        if let Some(v) = env("CAIRN_PROVIDER") {
            provider.set(v, Source::Env("CAIRN_PROVIDER"));
        }
        if let Some(v) = env("CAIRN_MODEL") {
            model.set(Some(v), Source::Env("CAIRN_MODEL"));
        }
        if let Some(v) = env("CAIRN_LOCAL_MODEL") {
            local_model_path.set(Some(PathBuf::from(v)), Source::Env("CAIRN_LOCAL_MODEL"));
        }

        if let Some(path) = &overrides.script {
            script.set(Some(path.clone()), Source::Flag("--script"));
            provider.set("scripted".to_owned(), Source::Flag("--script"));
        }
        if let Some(v) = &overrides.provider {
            provider.set(v.clone(), Source::Flag("--provider"));
        }
        if let Some(v) = &overrides.model {
            model.set(Some(v.clone()), Source::Flag("--model"));
        }
        if !overrides.allow.is_empty() {
            let mut all = allow.value.clone();
            all.extend(overrides.allow.iter().cloned());
            allow.set(all, Source::Flag("--allow"));
        }

        Ok(Self {
            config_file: config_file.to_path_buf(),
            config_file_found: found,
            provider,
            model,
            script,
            system_prompt,
            allow,
            max_steps,
            tool_output_cap,
            tool_timeout_secs,
            compaction_threshold,
            destructive_patterns,
            staged,
            staged_max_files,
            shell_network,
            undo_max_bytes,
            undo_store_max_bytes,
            sandbox_read_paths,
            local_threads,
            local_fast,
            local_model_path,
            compact_ratio,
            max_line_bytes,
            database,
            providers: file.providers,
            subagents: file.subagents,
            batch: file.batch,
            discovery: file.discovery,
            toolsrv: file.tools.toolsrv,
            mcp_servers,
            hooks: file.hooks,
            telemetry: file.telemetry,
        })
    }

    /// The session store options these settings give.
    pub fn store_options(&self) -> cairn_core::storage::StoreOptions {
        cairn_core::storage::StoreOptions {
            compact_ratio: Some(self.compact_ratio.value),
            max_line_bytes: self.max_line_bytes.value,
            ..cairn_core::storage::StoreOptions::default()
        }
    }

    /// `(key, value, source)` rows for `cairn config`: every section of
    /// the file, with the defaults of what it does not set.
    pub fn rows(&self) -> Vec<(String, String, String)> {
        fn opt<T: fmt::Display>(v: &Option<T>) -> String {
            v.as_ref().map_or_else(|| "(none)".to_owned(), ToString::to_string)
        }
        let path = |p: &Option<PathBuf>| p.as_ref().map_or_else(|| "(none)".to_owned(), |p| p.display().to_string());
        let rows = vec![
            ("provider", self.provider.value.clone(), self.provider.source.to_string()),
            ("model", opt(&self.model.value), self.model.source.to_string()),
            ("script", path(&self.script.value), self.script.source.to_string()),
            ("system_prompt", opt(&self.system_prompt.value), self.system_prompt.source.to_string()),
            ("approvals.allow", format!("{:?}", self.allow.value), self.allow.source.to_string()),
            ("limits.max_steps", self.max_steps.value.to_string(), self.max_steps.source.to_string()),
            ("limits.tool_output_cap", self.tool_output_cap.value.to_string(), self.tool_output_cap.source.to_string()),
            (
                "limits.tool_timeout_secs",
                self.tool_timeout_secs.value.to_string(),
                self.tool_timeout_secs.source.to_string(),
            ),
            (
                "limits.compaction_threshold",
                self.compaction_threshold.value.to_string(),
                self.compaction_threshold.source.to_string(),
            ),
            (
                "tools.destructive_patterns",
                format!("{:?}", self.destructive_patterns.value),
                self.destructive_patterns.source.to_string(),
            ),
            ("tools.staged", self.staged.value.to_string(), self.staged.source.to_string()),
            (
                "tools.staged_max_files",
                self.staged_max_files.value.to_string(),
                self.staged_max_files.source.to_string(),
            ),
            ("tools.shell_network", self.shell_network.value.to_string(), self.shell_network.source.to_string()),
            ("tools.undo_max_bytes", self.undo_max_bytes.value.to_string(), self.undo_max_bytes.source.to_string()),
            (
                "tools.undo_store_max_bytes",
                self.undo_store_max_bytes.value.to_string(),
                self.undo_store_max_bytes.source.to_string(),
            ),
            (
                "tools.sandbox_read_paths",
                format!("{:?}", self.sandbox_read_paths.value),
                self.sandbox_read_paths.source.to_string(),
            ),
            ("local.threads", self.local_threads.value.to_string(), self.local_threads.source.to_string()),
            ("local.fast", self.local_fast.value.to_string(), self.local_fast.source.to_string()),
            ("local.model_path", path(&self.local_model_path.value), self.local_model_path.source.to_string()),
            ("storage.compact_ratio", self.compact_ratio.value.to_string(), self.compact_ratio.source.to_string()),
            ("storage.max_line_bytes", self.max_line_bytes.value.to_string(), self.max_line_bytes.source.to_string()),
            (
                "database",
                self.database.value.as_deref().map_or_else(|| "(none)".to_owned(), crate::redact::redact),
                self.database.source.to_string(),
            ),
        ];
        let mut rows: Vec<(String, String, String)> = rows.into_iter().map(|(k, v, s)| (k.to_owned(), v, s)).collect();
        let file = Source::File(self.config_file.clone()).to_string();
        let default = Source::Default.to_string();
        // The source of `section.key`: the file when the table sets it.
        let from = |table: Option<&toml::Table>, key: &str| {
            if table.is_some_and(|t| t.contains_key(key)) { file.clone() } else { default.clone() }
        };
        rows.push((
            "tools.toolsrv".to_owned(),
            self.toolsrv.clone().unwrap_or_else(|| "(none)".to_owned()),
            if self.toolsrv.is_some() { file.clone() } else { default.clone() },
        ));
        // Checked by `load`; a table that no longer parses shows the defaults.
        let subagents = SubagentLimits::of(self.subagents.as_ref()).unwrap_or_default();
        let table = self.subagents.as_ref().and_then(toml::Value::as_table);
        rows.push(("subagents.max_depth".to_owned(), subagents.max_depth.to_string(), from(table, "max_depth")));
        rows.push((
            "subagents.max_children".to_owned(),
            subagents.max_children.to_string(),
            from(table, "max_children"),
        ));
        rows.push(("subagents.max_running".to_owned(), subagents.max_running.to_string(), from(table, "max_running")));
        let batch = BatchConfig::of(self.batch.as_ref()).map_or(2, |b| b.max_running);
        let table = self.batch.as_ref().and_then(toml::Value::as_table);
        rows.push(("batch.max_running".to_owned(), batch.to_string(), from(table, "max_running")));
        let policy = policy_of(&self.discovery, &self.config_file).unwrap_or_default();
        let discovery = policy.select;
        let table = Some(&self.discovery);
        rows.push(("discovery.threshold".to_owned(), discovery.threshold.to_string(), from(table, "threshold")));
        rows.push((
            "discovery.bm25_threshold".to_owned(),
            discovery.bm25_threshold.to_string(),
            from(table, "bm25_threshold"),
        ));
        rows.push(("discovery.max_tools".to_owned(), discovery.max_tools.to_string(), from(table, "max_tools")));
        rows.push(("discovery.max_skills".to_owned(), discovery.max_skills.to_string(), from(table, "max_skills")));
        rows.push(("discovery.mcp_tools".to_owned(), policy.mcp_tools.to_string(), from(table, "mcp_tools")));
        for (name, table) in &self.providers {
            let value = match cairn_provider::ProviderConfig::from_toml(name, table) {
                Ok(p) => {
                    let base = p.base_url.as_deref().map(|u| format!(", base_url {u}")).unwrap_or_default();
                    let window = p.context_window.map(|w| format!(", context_window {w}")).unwrap_or_default();
                    format!("{} model {}{base}{window}", kind_name(p.kind), p.effective_model())
                }
                Err(e) => format!("(invalid: {e})"),
            };
            rows.push((format!("providers.{name}"), value, file.clone()));
        }
        for (name, server) in &self.mcp_servers {
            let what = match (&server.command, &server.url) {
                (Some(command), _) => format!("command {command:?} {:?}", server.args),
                (None, Some(url)) => format!("url {url}"),
                (None, None) => "(neither command nor url)".to_owned(),
            };
            let state = if server.enabled { "" } else { ", disabled" };
            rows.push((
                format!("mcp_servers.{name}"),
                format!(
                    "{what}, files {}, network {}{state}",
                    format!("{:?}", server.files).to_lowercase(),
                    server.network
                ),
                file.clone(),
            ));
        }
        let hooks = &self.hooks;
        for (event, list) in [
            ("session_start", &hooks.session_start),
            ("session_end", &hooks.session_end),
            ("subagent_stop", &hooks.subagent_stop),
            ("user_prompt", &hooks.user_prompt),
            ("pre_compact", &hooks.pre_compact),
            ("pre_tool", &hooks.pre_tool),
            ("post_tool", &hooks.post_tool),
        ] {
            let commands: Vec<&str> = list.iter().map(|h| h.command.as_str()).collect();
            let source = if list.is_empty() { default.clone() } else { file.clone() };
            rows.push((format!("hooks.{event}"), format!("{commands:?}"), source));
        }
        rows
    }
}

// The sections other modules read, parsed here so that checking a whole
// file at load names no module above the configuration (no import circle).

/// `[subagents]` in the configuration.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SubagentLimits {
    /// Deepest child (a top-level session is depth 0); 0 turns the tools off.
    pub max_depth: u32,
    /// Children one session may start.
    pub max_children: usize,
    /// Children running at once in this process.
    pub max_running: usize,
}

impl Default for SubagentLimits {
    fn default() -> Self {
        Self { max_depth: 3, max_children: 16, max_running: 8 }
    }
}

impl SubagentLimits {
    /// The `[subagents]` table as written (`None`: absent), or what is wrong.
    pub fn of(table: Option<&toml::Value>) -> Result<Self, String> {
        match table {
            None => Ok(Self::default()),
            Some(t) => t.clone().try_into().map_err(|e: toml::de::Error| e.message().to_owned()),
        }
    }
}

/// `[batch]` in the configuration (checked when it is loaded).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchConfig {
    /// Sessions of batch jobs run at once.
    #[serde(default = "default_max_running")]
    pub max_running: usize,
}

impl BatchConfig {
    /// The `[batch]` table as written (`None`: absent), or what is wrong.
    pub fn of(table: Option<&toml::Value>) -> Result<Self, String> {
        match table {
            None => Ok(Self { max_running: default_max_running() }),
            Some(t) => t.clone().try_into().map_err(|e: toml::de::Error| e.message().to_owned()),
        }
    }
}

pub(crate) fn default_max_running() -> usize {
    2
}

/// How many of the configured MCP servers' tools a turn is offered unless
/// `[discovery] mcp_tools` says otherwise: all of them, as other agents do,
/// for any usual configuration (a person configured them to be used).
pub const DEFAULT_MCP_TOOLS: usize = 64;

/// What a turn may be offered: the ranking's policy for installed tools
/// and skills, and the budget of MCP tools.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Installed (external) tools and skills: the best `max_tools` above
    /// the threshold, when there are more than `max_tools`.
    pub select: SelectionPolicy,
    /// MCP tools (`mcp__SERVER__TOOL`): all of them up to this many; past
    /// it, the best this many by the ranking, with no threshold (a weak
    /// ranking, BM25 without the model, must not hide what the user set up).
    pub mcp_tools: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Self { select: SelectionPolicy::default(), mcp_tools: DEFAULT_MCP_TOOLS }
    }
}

/// `[discovery]` as written: every key optional, the ranges checked by
/// [`policy_of`] (docs/config.md lists them).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// Cosine similarity a tool or skill must reach (-1..1).
    pub threshold: Option<f64>,
    /// BM25 score a tool must reach when no embedding model is installed.
    pub bm25_threshold: Option<f64>,
    /// Most non-built-in tools a turn is offered (0..64).
    pub max_tools: Option<i64>,
    /// Most skills a turn is given (0..16).
    pub max_skills: Option<i64>,
    /// Most MCP tools a turn is offered (0..256); past it, the best ranked.
    pub mcp_tools: Option<i64>,
}

/// The policy a `[discovery]` table gives, or what is wrong with it
/// (checked when the configuration is loaded, so `cairn config` says so).
pub fn policy_of(table: &toml::Table, config_file: &Path) -> Result<Policy> {
    const USE: &str = "use threshold (cosine, -1..1, default 0.25), bm25_threshold (>= 0, default 3), \
                       max_tools (0..64, default 5), max_skills (0..16, default 3) or mcp_tools (0..256, default 64)";
    let file = config_file.display();
    let written: DiscoveryConfig = toml::Value::Table(table.clone())
        .try_into()
        .map_err(|e: toml::de::Error| anyhow::anyhow!("{file}: [discovery] is not valid ({}); {USE}", e.message()))?;
    let bad = |key: &str, value: &dyn std::fmt::Display| {
        anyhow::anyhow!("{file}: [discovery] {key} = {value} is not valid; {USE}")
    };
    let mut p = SelectionPolicy::default();
    let mut mcp_tools = DEFAULT_MCP_TOOLS;
    if let Some(v) = written.mcp_tools {
        mcp_tools = usize::try_from(v).ok().filter(|n| *n <= 256).ok_or_else(|| bad("mcp_tools", &v))?;
    }
    if let Some(v) = written.threshold {
        if !(-1.0..=1.0).contains(&v) {
            return Err(bad("threshold", &v));
        }
        p.threshold = v as f32;
    }
    if let Some(v) = written.bm25_threshold {
        if v.is_nan() || v < 0.0 {
            return Err(bad("bm25_threshold", &v));
        }
        p.bm25_threshold = v as f32;
    }
    if let Some(v) = written.max_tools {
        p.max_tools = usize::try_from(v).ok().filter(|n| *n <= 64).ok_or_else(|| bad("max_tools", &v))?;
    }
    if let Some(v) = written.max_skills {
        p.max_skills = usize::try_from(v).ok().filter(|n| *n <= 16).ok_or_else(|| bad("max_skills", &v))?;
    }
    Ok(Policy { select: p, mcp_tools })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// The `key` cells of docs/config.md's tables (the first cell of each
    /// row, in backticks).
    fn documented_keys() -> BTreeSet<String> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/config.md");
        let text = std::fs::read_to_string(path).expect("docs/config.md is readable");
        text.lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|rest| rest.split_once('`').map(|(key, _)| key.to_owned()))
            .collect()
    }

    /// Issue 49.8: the reference and the parser cannot drift. The parser's
    /// side is read from serde's field lists, not from a hand-kept table.
    #[test]
    fn every_accepted_key_is_documented_and_every_documented_key_is_accepted() {
        let accepted: BTreeSet<String> = super::accepted_keys().into_iter().collect();
        // Sanity of the probe itself: keys of every kind of section.
        for key in ["provider", "limits.max_steps", "providers.NAME.context_window", "hooks.EVENT.matcher"] {
            assert!(accepted.contains(key), "{key} not read from the structs: {accepted:?}");
        }
        for key in
            ["subagents.max_depth", "batch.max_running", "discovery.max_tools", "mcp_servers.NAME.tools.TOOL.risk"]
        {
            assert!(accepted.contains(key), "{key} not read from the structs: {accepted:?}");
        }
        let documented = documented_keys();
        let undocumented: Vec<_> = accepted.difference(&documented).collect();
        let unknown: Vec<_> = documented.difference(&accepted).collect();
        assert!(undocumented.is_empty(), "accepted by the parser but not in docs/config.md: {undocumented:?}");
        assert!(unknown.is_empty(), "in docs/config.md but refused by the parser: {unknown:?}");
    }
}
