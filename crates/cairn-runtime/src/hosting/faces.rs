//! The editor and agent faces' host (`cairn_faces::Host`): the provider
//! of an ACP or MCP session, every tool for MCP (equipped as every face's
//! turn is: `equip.rs`), an editor's own MCP servers, and creating and
//! opening sessions by id; everything else is [`RuntimeHost`]'s `SessionHost`.
//!
//! Must not: speak JSON-RPC or read stdio (`cairn-faces` does).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use cairn_core::approval::{Allowlist, Approver, PolicyApprover, SharedApprover};
use cairn_core::provider::Provider;
use cairn_core::storage::{Header, JsonlStore, new_session_id};
use cairn_faces::HostTools;

use crate::hosting::RuntimeHost;

impl cairn_faces::Host for RuntimeHost {
    fn authority(&self) -> cairn_core::authority::AuthorityRules {
        crate::tools::authority_rules(&self.ctx.paths)
    }

    fn provider(&self, cwd: &Path) -> Result<Box<dyn Provider + Send>> {
        crate::parts::build_provider(&self.ctx, cwd)
    }

    fn tools(&self, cwd: &Path, approver: &PolicyApprover, person: Option<&SharedApprover>) -> Result<HostTools> {
        // As every face equips a session (`equip.rs`): the tool service's
        // tools or the in-process ones, and the subagent family, whose
        // children ask the same person (the editor's permission requests;
        // nobody over MCP).
        let inheritance = crate::subagents::Inheritance::of(approver, person.cloned());
        let tools = crate::tools::turn_tools(&self.ctx, cwd)?;
        let answerer = crate::equip::Answerer { approver, family: Some(&inheritance) };
        let equipped = crate::equip::offer(&self.ctx, cwd, &tools, None, answerer)?;
        Ok(equipped.into_host_tools())
    }

    fn client_mcp_tools(
        &self,
        cwd: &Path,
        servers: &[cairn_faces::ClientMcpServer],
        taken: &[String],
    ) -> Result<HostTools> {
        let mut notes = Vec::new();
        let mut configs = std::collections::BTreeMap::new();
        for server in servers {
            // A name fit for tool names (mcp__NAME__TOOL); the user's own
            // servers of that name win.
            let mut name: String = server
                .name
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' })
                .collect::<String>()
                .split("__")
                .collect::<Vec<_>>()
                .join("_");
            name.truncate(cairn_mcp::config::MAX_SERVER_NAME);
            if name.is_empty() || self.ctx.settings.mcp_servers.contains_key(&name) || configs.contains_key(&name) {
                notes.push(format!(
                    "the editor's MCP server {:?} is not started: its name is taken or empty",
                    server.name
                ));
                continue;
            }
            let config = match &server.transport {
                cairn_faces::ClientMcpTransport::Stdio { command, args, env } => cairn_mcp::ServerConfig::from_client(
                    &name,
                    Some(command.clone()),
                    args.clone(),
                    env.clone(),
                    None,
                    Vec::new(),
                ),
                cairn_faces::ClientMcpTransport::Http { url, headers } => cairn_mcp::ServerConfig::from_client(
                    &name,
                    None,
                    Vec::new(),
                    Vec::new(),
                    Some(url.clone()),
                    headers.clone(),
                ),
            };
            match config {
                Ok(config) => {
                    configs.insert(name, config);
                }
                Err(e) => notes.push(format!("the editor's MCP server {:?} is not started: {e}", server.name)),
            }
        }
        let loaded = cairn_mcp::load(&configs, cwd, &crate::tools::tools_config(&self.ctx), taken);
        notes.extend(loaded.notes);
        Ok(HostTools { tools: loaded.entries.into_iter().map(|e| e.tool).collect(), notes, hooks: None })
    }

    fn policy(&self, person: Option<Box<dyn Approver>>) -> Result<PolicyApprover> {
        let allow = Allowlist::parse(self.ctx.settings.allow.value.iter().map(String::as_str))
            .context("invalid allow pattern (from --allow or [approvals] allow)")?;
        Ok(crate::parts::policy(self.ctx.common.yes, allow, person))
    }

    fn create_session(&self, cwd: &Path) -> Result<JsonlStore> {
        let header = Header::new(new_session_id(), cwd.display().to_string());
        let dir = self.ctx.paths.sessions();
        JsonlStore::create(&dir, header, self.ctx.settings.store_options())
            .with_context(|| format!("cannot create a session in {}", dir.display()))
    }

    fn open_session(&self, id: &str) -> Result<JsonlStore> {
        // Only a session file of the sessions directory, by its whole id:
        // never a path (opening takes a writer lock beside the file, which
        // must not be created anywhere else), and never a prefix (the
        // client would go on using the id it sent).
        let dir = self.ctx.paths.sessions();
        if id.is_empty() || id.starts_with('.') || id.contains(['/', '\\', '\0']) {
            anyhow::bail!("{id:?} is not a session id: give the id of a session in {}", dir.display());
        }
        let path = dir.join(format!("{id}.jsonl"));
        if !path.is_file() {
            let stem = |p: &PathBuf| p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let prefixed: Vec<String> = crate::sessions::session_files(&self.ctx.paths)
                .unwrap_or_default()
                .iter()
                .map(stem)
                .filter(|s| s.starts_with(id))
                .collect();
            match prefixed.as_slice() {
                [] => anyhow::bail!("no session {id:?} in {}", dir.display()),
                many => anyhow::bail!(
                    "{id:?} is only the start of a session id ({}); load it by its whole id",
                    many.join(", ")
                ),
            }
        }
        crate::parts::open_session(&self.ctx, &path)
    }

    fn list_sessions(&self) -> Result<Vec<cairn_faces::ListedSession>> {
        let all = crate::sessions::list(&self.ctx)?;
        Ok(all
            .into_iter()
            .filter(|s| !crate::family::is_child_id(&s.id))
            .map(|s| cairn_faces::ListedSession {
                id: s.id,
                cwd: s.cwd,
                path: s.path,
                name: s.name,
                modified: s.modified,
            })
            .collect())
    }

    fn provider_named(&self, name: &str, cwd: &Path) -> Result<Box<dyn Provider + Send>> {
        if name == self.ctx.settings.provider.value {
            return self.provider(cwd);
        }
        // Another provider runs as its configuration says (the command
        // line's --model and --script are the configured provider's).
        crate::parts::provider_for(&self.ctx, name, None, None, cwd)
    }

    fn accepts_images(&self, name: &str) -> bool {
        let providers = &self.ctx.settings.providers;
        cairn_provider::config::ProviderConfig::resolve(name, providers.get(name)).is_ok_and(|c| c.images)
    }
}
