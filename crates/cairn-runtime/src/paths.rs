//! Where cairn keeps things: the data directory (sessions, installed model,
//! tools, trusted workspaces) and the configuration file, following the XDG
//! base directories, with `CAIRN_HOME` overriding both.
//!
//! This module only computes paths; it creates nothing.

use std::path::PathBuf;

use anyhow::{Context, Result};

/// The directories cairn uses.
#[derive(Debug, Clone)]
pub struct Paths {
    /// Data directory (`$CAIRN_HOME`, else `$XDG_DATA_HOME/cairn`, else
    /// `~/.local/share/cairn`).
    pub data: PathBuf,
    /// The configuration file (`$CAIRN_HOME/config.toml`, else
    /// `$XDG_CONFIG_HOME/cairn/config.toml`, else `~/.config/cairn/config.toml`).
    pub config_file: PathBuf,
    /// The configuration directory (holds `tools/` too).
    pub config_dir: PathBuf,
    /// The user's home directory (`$HOME`), when set.
    pub user_home: Option<PathBuf>,
    /// Where cairn's data and configuration would be without
    /// `CAIRN_HOME` (the XDG locations): a later `cairn` started without
    /// it reads them, so they are protected like the ones in use.
    pub default_dirs: Vec<PathBuf>,
}

impl Paths {
    /// Resolve from the environment.
    pub fn from_env() -> Result<Self> {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let user_home = var("HOME");
        let xdg = |home: &PathBuf| {
            let data = var("XDG_DATA_HOME").unwrap_or_else(|| home.join(".local/share")).join("cairn");
            let config = var("XDG_CONFIG_HOME").unwrap_or_else(|| home.join(".config")).join("cairn");
            (data, config)
        };
        let default_dirs = user_home.as_ref().map(xdg).map(|(d, c)| vec![d, c]).unwrap_or_default();
        if let Some(home) = var("CAIRN_HOME") {
            return Ok(Self {
                data: home.clone(),
                config_file: home.join("config.toml"),
                config_dir: home,
                user_home,
                default_dirs,
            });
        }
        let home = user_home
            .as_ref()
            .context("neither CAIRN_HOME nor HOME is set: set CAIRN_HOME to a directory for cairn's data")?;
        let (data, config_dir) = xdg(home);
        Ok(Self { data, config_file: config_dir.join("config.toml"), config_dir, user_home, default_dirs })
    }

    /// cairn's own directories, each once: the data and configuration
    /// directories in use and the default ones. No tool sees them and
    /// every change under them is refused (`cairn_core::authority`).
    pub fn own_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = vec![self.data.clone(), self.config_dir.clone()];
        for d in &self.default_dirs {
            if !dirs.contains(d) {
                dirs.push(d.clone());
            }
        }
        dirs
    }

    /// Where session files live.
    pub fn sessions(&self) -> PathBuf {
        self.data.join("sessions")
    }

    /// The record of trusted workspaces (whose `.cairn/tools/` may load;
    /// see `cairn_tools::trust`). In the data directory, like direnv's
    /// allow list: it is state cairn writes, not configuration.
    pub fn trust_file(&self) -> PathBuf {
        self.data.join("trust.json")
    }

    /// Directories searched for external tools (precedence and trust:
    /// `cairn_tools::tool_dirs`).
    pub fn tool_dirs(&self, cwd: &std::path::Path) -> Vec<cairn_tools::ToolDir> {
        cairn_tools::tool_dirs(&self.data, &self.config_dir, cwd)
    }
}
