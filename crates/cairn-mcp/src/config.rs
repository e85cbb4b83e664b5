//! `[mcp_servers.NAME]`: how a person describes an MCP server to cairn, and
//! the checks that refuse a description cairn could not run safely (a bad
//! name, both or neither of `command` and `url`, an environment *value*
//! where a variable name belongs). It must not start anything.

use std::collections::BTreeMap;
use std::path::PathBuf;

use cairn_core::tool::Risk;
use serde::{Deserialize, Serialize};

pub use cairn_tools::programs::FileAccess;

/// `[mcp_servers.NAME.tools.TOOL]`: the user's word about one tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolOverride {
    /// The tier this tool runs at before what its annotations can raise
    /// (`destructiveHint` still makes it Destructive).
    #[serde(default)]
    pub risk: Option<Risk>,
    /// `false` leaves the tool out.
    #[serde(default = "yes")]
    pub enabled: bool,
}

/// `[mcp_servers.NAME.oauth]`: OAuth 2.0 client credentials (RFC 6749
/// §4.4, MCP's SEP-1046) for a streamable-HTTP server that requires a
/// token: cairn finds the authorization server from the server's protected
/// resource metadata, asks it for a token with this client's id and secret
/// (and the server's URL as `resource`), and sends it as a bearer token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthConfig {
    /// The client id registered with the authorization server.
    pub client_id: String,
    /// The environment variable holding the client secret (never the
    /// secret itself).
    pub client_secret_env: String,
    /// Scopes to ask for.
    #[serde(default)]
    pub scopes: Vec<String>,
}

/// One configured MCP server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// The program of a stdio server (looked up on `PATH`).
    #[serde(default)]
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Names of environment variables passed through from cairn's
    /// environment (values never live in the file).
    #[serde(default)]
    pub env: Vec<String>,
    /// Its working directory (default: the session's).
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// The endpoint of a streamable-HTTP server (instead of `command`).
    #[serde(default)]
    pub url: Option<String>,
    /// Headers sent to a streamable-HTTP server with every request, with
    /// their values (for what is not secret: a version, a tenant).
    #[serde(default)]
    pub http_headers: BTreeMap<String, String>,
    /// Headers whose values come from cairn's environment: header name →
    /// variable name (`Authorization = "GITHUB_MCP_AUTH"`), so a token
    /// never lives in the file.
    #[serde(default)]
    pub env_http_headers: BTreeMap<String, String>,
    /// OAuth client credentials for a `url` server that requires a token.
    #[serde(default)]
    pub oauth: Option<OAuthConfig>,
    /// `false` keeps the server configured but unused.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// How long starting and listing its tools may take.
    #[serde(default = "default_startup_timeout_ms")]
    pub startup_timeout_ms: u64,
    /// A call's time limit (it can only shorten the turn's tool timeout).
    #[serde(default)]
    pub tool_timeout_ms: Option<u64>,
    /// Access to the session's working directory (stdio servers).
    #[serde(default)]
    pub files: FileAccess,
    /// Network access (stdio servers; off by default).
    #[serde(default)]
    pub network: bool,
    /// Extra read-only directories (where the server is installed).
    #[serde(default)]
    pub read: Vec<PathBuf>,
    /// Extra writable directories.
    #[serde(default)]
    pub write: Vec<PathBuf>,
    /// Whether the server may start processes (capped like a tool's).
    #[serde(default = "yes")]
    pub processes: bool,
    /// Believe the server's `readOnlyHint`: its read-only tools run
    /// without asking (only when the server has no network and no write
    /// access). Off: every tool is at least Write unless overridden.
    #[serde(default)]
    pub trust_annotations: bool,
    /// The largest message cairn reads from a stdio server (one JSON-RPC
    /// line); a call answered with more fails at once, saying the size.
    /// What the model sees of an answer is capped separately.
    #[serde(default = "default_max_answer_bytes")]
    pub max_answer_bytes: u64,
    /// Per-tool overrides.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolOverride>,
    /// Variables with their values, given by a client that started the
    /// server for its session (an editor over ACP); never read from a file.
    #[serde(skip)]
    pub env_values: Vec<(String, String)>,
    /// Headers with their values, given by such a client; never read from
    /// a file.
    #[serde(skip)]
    pub header_values: Vec<(String, String)>,
}

/// Headers cairn's MCP client sets itself (the protocol's own), which a
/// configuration may not set.
const RESERVED_HEADERS: &[&str] =
    &["accept", "content-type", "mcp-session-id", "mcp-protocol-version", "last-event-id"];

/// Why `name: value` cannot be sent as an HTTP header, if it cannot.
fn bad_header(name: &str, value: Option<&str>) -> Option<String> {
    let token = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !token {
        return Some(format!("{name:?} is not an HTTP header name"));
    }
    if RESERVED_HEADERS.iter().any(|r| name.eq_ignore_ascii_case(r)) {
        return Some(format!("header {name} is set by cairn's MCP client itself"));
    }
    match value {
        Some(v) if v.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) => {
            Some(format!("the value of header {name} holds a control character"))
        }
        _ => None,
    }
}

impl ServerConfig {
    /// Every header to send (`http_headers`, `env_http_headers` read from
    /// cairn's environment now, then a client's), or why one cannot be
    /// (an unset variable is named).
    pub fn headers(&self) -> Result<Vec<(String, String)>, String> {
        let mut headers: Vec<(String, String)> =
            self.http_headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        for (header, var) in &self.env_http_headers {
            // Where the host keeps credentials (a `*TOKEN*` variable is
            // taken out of cairn's environment at startup), never a
            // provider key.
            match crate::credential(var) {
                crate::Credential::Value(value) if !value.is_empty() => headers.push((header.clone(), value)),
                crate::Credential::ProviderKey => {
                    return Err(format!(
                        "header {header} takes its value from ${var}, which holds one of cairn's provider keys; refusing"
                    ));
                }
                _ => return Err(format!("header {header} takes its value from ${var}, which is not set")),
            }
        }
        headers.extend(self.header_values.iter().cloned());
        for (name, value) in &headers {
            if let Some(why) = bad_header(name, Some(value)) {
                return Err(why);
            }
        }
        Ok(headers)
    }
}

fn is_var_name(var: &str) -> bool {
    var.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn yes() -> bool {
    true
}

fn default_startup_timeout_ms() -> u64 {
    20_000
}

/// 64 MiB: four times the SDK's own limit, so large answers (a big file,
/// a long log) are read and capped for the model rather than refused.
fn default_max_answer_bytes() -> u64 {
    64 << 20
}

/// The most `max_answer_bytes` may be (the line is held in memory).
const MAX_ANSWER_LIMIT: u64 = 1 << 30;

/// A server description cairn refuses, and what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("[mcp_servers.{server}]: {reason}")]
pub struct ConfigError {
    /// The server's name as written.
    pub server: String,
    /// What is wrong and what to do.
    pub reason: String,
}

/// The longest server name (tool names must stay within 64 characters).
pub const MAX_SERVER_NAME: usize = 24;

impl ServerConfig {
    /// Parse one `[mcp_servers.NAME]` table and check it.
    pub fn from_toml(name: &str, table: toml::Value) -> Result<Self, ConfigError> {
        let config: ServerConfig = table
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError { server: name.to_owned(), reason: e.message().to_owned() })?;
        config.check(name)?;
        Ok(config)
    }

    /// Refuse what cairn could not run as written.
    pub fn check(&self, name: &str) -> Result<(), ConfigError> {
        let err = |reason: String| Err(ConfigError { server: name.to_owned(), reason });
        if name.is_empty()
            || name.len() > MAX_SERVER_NAME
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            || name.contains("__")
        {
            return err(format!(
                "the server name must be 1–{MAX_SERVER_NAME} letters, digits, `-` or `_` without `__` (its tools are \
                 named mcp__NAME__TOOL)"
            ));
        }
        match (&self.command, &self.url) {
            (Some(_), Some(_)) => {
                return err("give either `command` (stdio) or `url` (streamable HTTP), not both".into());
            }
            (None, None) => return err("give `command` (a stdio server) or `url` (a streamable-HTTP server)".into()),
            (Some(c), None) if c.trim().is_empty() => return err("`command` is empty".into()),
            (None, Some(u)) if !(u.starts_with("http://") || u.starts_with("https://")) => {
                return err(format!("`url` = {u:?} must start with http:// or https://"));
            }
            _ => {}
        }
        let any_headers =
            !(self.http_headers.is_empty() && self.env_http_headers.is_empty() && self.header_values.is_empty());
        if any_headers && self.url.is_none() {
            return err(
                "`http_headers` and `env_http_headers` are for a `url` server (a stdio server takes `env`)".into()
            );
        }
        for (name, value) in &self.http_headers {
            if let Some(why) = bad_header(name, Some(value)) {
                return err(format!("http_headers: {why}"));
            }
        }
        if let Some(oauth) = &self.oauth {
            if self.url.is_none() {
                return err("`oauth` is for a `url` server".into());
            }
            if oauth.client_id.trim().is_empty() {
                return err("oauth.client_id is empty".into());
            }
            if !is_var_name(&oauth.client_secret_env) {
                return err(format!(
                    "oauth.client_secret_env = {:?} must name an environment variable holding the secret, never the secret itself",
                    oauth.client_secret_env
                ));
            }
            let authorization = self.http_headers.keys().chain(self.env_http_headers.keys());
            if authorization.into_iter().any(|h| h.eq_ignore_ascii_case("authorization")) {
                return err("give either `oauth` or an Authorization header, not both".into());
            }
        }
        for (name, var) in &self.env_http_headers {
            if let Some(why) = bad_header(name, None) {
                return err(format!("env_http_headers: {why}"));
            }
            let valid = var.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return err(format!(
                    "env_http_headers: {name} = {var:?} must name an environment variable holding the value, never the value itself"
                ));
            }
        }
        for (name, value) in &self.header_values {
            if let Some(why) = bad_header(name, Some(value)) {
                return err(format!("the client's header: {why}"));
            }
        }
        for var in &self.env {
            let valid = var.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return err(format!(
                    "`env` lists names of variables to pass from cairn's environment, and {var:?} is not one; \
                     set the value in the environment, never in this file"
                ));
            }
        }
        if self.startup_timeout_ms == 0 || self.startup_timeout_ms > 600_000 {
            return err(format!("startup_timeout_ms = {} must be between 1 and 600000", self.startup_timeout_ms));
        }
        if !(1024..=MAX_ANSWER_LIMIT).contains(&self.max_answer_bytes) {
            return err(format!(
                "max_answer_bytes = {} must be between 1024 and {MAX_ANSWER_LIMIT}",
                self.max_answer_bytes
            ));
        }
        if self.tool_timeout_ms == Some(0) {
            return err("tool_timeout_ms = 0 would refuse every call; leave it out for the turn's limit".into());
        }
        for path in self.read.iter().chain(&self.write) {
            let text = path.to_string_lossy();
            if !(path.is_absolute() || text.starts_with("~/")) {
                return err(format!("{} must be an absolute path (or start with ~/)", path.display()));
            }
        }
        Ok(())
    }

    /// A server an editor passes for its session (ACP `mcpServers`): stdio
    /// with `command` and `args`, or streamable HTTP at `url`; cairn's
    /// defaults for everything else (the session's directory read-only, no
    /// network for stdio, annotations not trusted, so every tool is at
    /// least Write and asks through the editor).
    pub fn from_client(
        name: &str,
        command: Option<String>,
        args: Vec<String>,
        env_values: Vec<(String, String)>,
        url: Option<String>,
        header_values: Vec<(String, String)>,
    ) -> Result<Self, ConfigError> {
        let config = ServerConfig {
            command,
            args,
            env: Vec::new(),
            cwd: None,
            url,
            http_headers: BTreeMap::new(),
            env_http_headers: BTreeMap::new(),
            oauth: None,
            enabled: true,
            startup_timeout_ms: default_startup_timeout_ms(),
            tool_timeout_ms: None,
            files: FileAccess::Read,
            network: false,
            read: Vec::new(),
            write: Vec::new(),
            processes: true,
            trust_annotations: false,
            max_answer_bytes: default_max_answer_bytes(),
            tools: BTreeMap::new(),
            env_values,
            header_values,
        };
        config.check(name)?;
        Ok(config)
    }

    /// Whether this is a stdio server (else streamable HTTP).
    pub fn is_stdio(&self) -> bool {
        self.command.is_some()
    }
}

/// Parse every `[mcp_servers.NAME]` table.
pub fn parse_servers(tables: &toml::Table) -> Result<BTreeMap<String, ServerConfig>, ConfigError> {
    tables.iter().map(|(name, value)| Ok((name.clone(), ServerConfig::from_toml(name, value.clone())?))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<BTreeMap<String, ServerConfig>, ConfigError> {
        let table: toml::Table =
            toml::from_str(text).map_err(|e| ConfigError { server: "?".into(), reason: e.to_string() })?;
        parse_servers(&table)
    }

    #[test]
    fn a_plain_stdio_server_takes_the_defaults() {
        let servers = parse("[time]\ncommand = \"mcp-server-time\"\n").map_err(|e| e.to_string());
        let servers = servers.unwrap_or_default();
        let time = &servers["time"];
        assert!(time.enabled && time.is_stdio() && !time.network && !time.trust_annotations);
        assert_eq!(time.files, FileAccess::Read);
    }

    #[test]
    fn descriptions_cairn_cannot_run_are_refused_with_the_reason() {
        for (text, says) in [
            ("[\"a__b\"]\ncommand = \"x\"\n", "without `__`"),
            ("[\"a b\"]\ncommand = \"x\"\n", "letters, digits"),
            ("[a]\ncommand = \"x\"\nurl = \"http://h\"\n", "not both"),
            ("[a]\nargs = []\n", "give `command`"),
            ("[a]\nurl = \"ftp://h\"\n", "http://"),
            ("[a]\ncommand = \"x\"\nenv = [\"TOKEN=abc\"]\n", "never in this file"),
            ("[a]\ncommand = \"x\"\nread = [\"rel/dir\"]\n", "absolute"),
            ("[a]\ncommand = \"x\"\ncolour = 1\n", "unknown field"),
            ("[a]\ncommand = \"x\"\n[a.tools.t]\nrisk = \"harmless\"\n", "unknown variant"),
            ("[a]\ncommand = \"x\"\nhttp_headers = { X-A = \"b\" }\n", "for a `url` server"),
            ("[a]\nurl = \"http://h\"\nhttp_headers = { Accept = \"x\" }\n", "set by cairn's MCP client"),
            ("[a]\nurl = \"http://h\"\nhttp_headers = { \"X A\" = \"x\" }\n", "not an HTTP header name"),
            ("[a]\nurl = \"http://h\"\nhttp_headers = { X-A = \"a\\nb\" }\n", "control character"),
            ("[a]\nurl = \"http://h\"\nenv_http_headers = { Authorization = \"Bearer abc\" }\n", "never the value"),
            ("[a]\ncommand = \"x\"\noauth = { client_id = \"c\", client_secret_env = \"S\" }\n", "for a `url` server"),
            (
                "[a]\nurl = \"http://h\"\noauth = { client_id = \"c\", client_secret_env = \"s3cr3t-value!\" }\n",
                "never the secret",
            ),
            (
                "[a]\nurl = \"http://h\"\noauth = { client_id = \"\", client_secret_env = \"S\" }\n",
                "client_id is empty",
            ),
            (
                "[a]\nurl = \"http://h\"\nenv_http_headers = { Authorization = \"T\" }\noauth = { client_id = \"c\", client_secret_env = \"S\" }\n",
                "not both",
            ),
        ] {
            let e = parse(text).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains(says), "{text:?} gave {e:?}, wanted {says:?}");
        }
    }
}
