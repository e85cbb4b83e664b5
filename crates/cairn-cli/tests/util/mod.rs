//! Helpers for the CLI tests: a private `CAIRN_HOME` and a command builder
//! with a clean environment (no provider keys, no colours).
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A private home and working directory for one test.
pub struct Env {
    _dir: tempfile::TempDir,
    pub home: PathBuf,
    pub cwd: PathBuf,
}

impl Env {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let cwd = dir.path().join("work");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&cwd).unwrap();
        Self { _dir: dir, home, cwd }
    }

    /// `cairn ARGS` with this env. `CAIRN_TEST_BIN` names another `cairn`
    /// binary to run (a private copy: the build directory may be shared
    /// with other checkouts, which overwrite `target/debug/cairn`).
    pub fn cairn(&self, args: &[&str]) -> Command {
        let bin = std::env::var_os("CAIRN_TEST_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| assert_cmd::cargo::cargo_bin("cairn"));
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .current_dir(&self.cwd)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.home.join("fakehome"))
            .env("CAIRN_HOME", &self.home)
            .env("NO_COLOR", "1");
        if let Some(model) = std::env::var_os("CAIRN_LOCAL_MODEL") {
            cmd.env("CAIRN_LOCAL_MODEL", model);
        }
        cmd
    }

    /// Write a scripted-provider file and return its path.
    pub fn script(&self, lines: &[serde_json::Value]) -> PathBuf {
        let path = self.home.join("script.jsonl");
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Whether a running staged `shell` call has written `name` (relative
    /// to the working tree) into its staging layer: staged, a command's
    /// writes reach the live tree only when its effect is applied.
    pub fn staged_file_exists(&self, name: &str) -> bool {
        std::fs::read_dir(self.home.join("staging"))
            .map(|rd| rd.flatten().any(|e| e.path().join("upper").join(name).exists()))
            .unwrap_or(false)
    }

    /// Session files under this home.
    pub fn session_files(&self) -> Vec<PathBuf> {
        let dir = self.home.join("sessions");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| is_jsonl(p)).collect())
            .unwrap_or_default();
        files.sort();
        files
    }
}

fn is_jsonl(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "jsonl")
}
