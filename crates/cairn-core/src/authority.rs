//! Authority paths (issue 46): files whose content decides what runs
//! later, outside any tool's sandbox, with the user's authority — git's
//! configuration and hooks, other agents' and editors' configurations,
//! shell start-up files, and cairn's own configuration. A tool needs no
//! escape if it can plant one of these; so writing one is never an
//! ordinary Write.
//!
//! This module owns the one rule that says which paths are such
//! ([`AuthorityRules::classify`]: a typed [`Authority`] with its
//! [`AuthorityClass`] and the reason a person is shown) and how each class
//! is protected ([`Protection`]: at least Destructive, or refused). The
//! staged judge (`staged::ChangeSet::judge`), the unstaged file tools and
//! the shell classifier all ask it; none keeps a list of its own.
//!
//! It must not touch the file system: paths are compared lexically (`.`
//! and `..` folded), and the host-specific locations (cairn's own
//! directories, the user's home) come in as data, made absolute and
//! canonical by the host.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// How an authority path is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Protection {
    /// Any change is at least Destructive: a person sees exactly what
    /// changes and decides; `--yes` and allow rules never approve it, and
    /// headless it is refused.
    Destructive,
    /// Any change is refused, whoever asks: no tool changes it.
    Refused,
}

/// Which kind of authority a path carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AuthorityClass {
    /// git's configuration: `.git/config` (and `config.worktree`, a
    /// submodule's or worktree's), `.git/commondir` (where git finds it),
    /// `.git/info/attributes`.
    GitConfig,
    /// A git hook: anything under a git directory's `hooks/`, under the
    /// tree's configured `core.hooksPath` ([`AuthorityRules::hooks_dirs`]),
    /// and the conventional hooks directories `.husky/` and `.githooks/`.
    GitHook,
    /// A `.git` entry itself (a directory replaced, or a `gitdir:` file).
    GitLink,
    /// Another agent's or editor's configuration: `.mcp.json`, `.envrc`,
    /// `.claude.json`, `.devcontainer.json`, and everything under
    /// `.claude/`, `.codex/`, `.cursor/`, `.vscode/`, `.gemini/`, `.zed/`,
    /// `.devcontainer/`, `.continue/`, `.amazonq/`.
    AgentConfig,
    /// A start-up, login or program configuration file in the user's home
    /// (only when a tree holds the home): shell rc files, `.ssh/`,
    /// `.gitconfig`, `~/.local/bin`, …
    HomeStartup,
    /// The working directory's own cairn configuration (`.cairn/`: its
    /// tools, MCP servers, hooks and skills).
    CairnWorkspace,
    /// cairn's own configuration directory or home (its configuration,
    /// trust records, tools, skills, sessions): hidden from tools, and
    /// every change refused.
    CairnHome,
}

impl AuthorityClass {
    /// Every class, in the order `cairn tools` lists them.
    pub const ALL: [AuthorityClass; 7] = [
        AuthorityClass::CairnHome,
        AuthorityClass::GitConfig,
        AuthorityClass::GitHook,
        AuthorityClass::GitLink,
        AuthorityClass::AgentConfig,
        AuthorityClass::CairnWorkspace,
        AuthorityClass::HomeStartup,
    ];

    /// How a change to a path of this class is protected.
    pub fn protection(self) -> Protection {
        match self {
            AuthorityClass::CairnHome => Protection::Refused,
            _ => Protection::Destructive,
        }
    }

    /// What such a path is, for a person.
    pub fn what(self) -> &'static str {
        match self {
            AuthorityClass::GitConfig => "git configuration",
            AuthorityClass::GitHook => "a git hook",
            AuthorityClass::GitLink => "a .git entry",
            AuthorityClass::AgentConfig => "another agent's or editor's configuration",
            AuthorityClass::HomeStartup => "a start-up or configuration file in your home directory",
            AuthorityClass::CairnWorkspace => "this directory's cairn configuration (.cairn/)",
            AuthorityClass::CairnHome => "cairn's own configuration or data",
        }
    }

    /// Where such paths are, for a person (`cairn tools`, the docs).
    pub fn paths(self) -> &'static str {
        match self {
            AuthorityClass::GitConfig => {
                "config, config.worktree, commondir and info/attributes of any git directory (.git/, a submodule's, \
                 a worktree's, a bare NAME.git/)"
            }
            AuthorityClass::GitHook => "hooks/ of any git directory, the tree's core.hooksPath, .husky/, .githooks/",
            AuthorityClass::GitLink => "a .git directory replaced, or a .git file (gitdir:) created",
            AuthorityClass::AgentConfig => {
                ".mcp.json, .envrc, .claude.json, .devcontainer.json; .claude/, .codex/, .cursor/, .vscode/, \
                 .gemini/, .zed/, .devcontainer/, .continue/, .amazonq/ (anywhere in the tree)"
            }
            AuthorityClass::HomeStartup => {
                "in your home directory, when the tree holds it: shell rc and login files (.bashrc, .profile, \
                 .zshrc, …), .gitconfig, .npmrc, editor rc files, .ssh/, .gnupg/, .local/bin/, bin/, .cargo/, \
                 .config/{fish,git,nvim,systemd,autostart,environment.d,Code,Cursor,zed,direnv,gh}/"
            }
            AuthorityClass::CairnWorkspace => ".cairn/ (anywhere in the tree)",
            AuthorityClass::CairnHome => "cairn's configuration and data directories (see `cairn tools`)",
        }
    }

    /// Why writing it gains authority later.
    pub fn why(self) -> &'static str {
        match self {
            AuthorityClass::GitConfig => {
                "git reads it at every command and it can name programs git runs as you, outside any sandbox \
                 (core.fsmonitor, core.pager, aliases, filter and diff drivers, core.hooksPath)"
            }
            AuthorityClass::GitHook => "git runs it as you, outside any sandbox, at a later git command",
            AuthorityClass::GitLink => {
                "it tells git where the repository is, so it can point git at configuration and hooks a tool wrote"
            }
            AuthorityClass::AgentConfig => {
                "that program reads it later and starts what it names (MCP servers, tasks, hooks, environment) \
                 as you, outside cairn's sandbox"
            }
            AuthorityClass::HomeStartup => {
                "your shell, login, ssh, git or editor reads or runs it later as you, outside any sandbox"
            }
            AuthorityClass::CairnWorkspace => {
                "later cairn sessions here load the tools, MCP servers, hooks and skills it names"
            }
            AuthorityClass::CairnHome => {
                "it holds cairn's configuration (providers, MCP servers, hooks), trust records, tools and skills; \
                 no tool may change it"
            }
        }
    }
}

/// A path found to carry authority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authority {
    /// Its class.
    pub class: AuthorityClass,
    /// The path as it was given (relative to the tree, or absolute).
    pub path: String,
}

impl Authority {
    /// How a change to it is protected.
    pub fn protection(&self) -> Protection {
        self.class.protection()
    }

    /// One line for a person: the path (escaped), then what it is and why
    /// in parentheses (`.git/hooks/x (a git hook: git runs it …)`).
    pub fn reason(&self) -> String {
        format!("{} ({}: {})", shown(&self.path), self.class.what(), self.class.why())
    }
}

/// Who refused a change under cairn's own directories (the verdict's `by`).
pub const REFUSED_BY: &str = "policy:authority";

/// The host-specific locations of the rule, filled by the host (absolute
/// and canonical where they exist); the default knows none, so only the
/// rules that hold in every tree apply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthorityRules {
    /// cairn's own directories (configuration directory, data directory
    /// and the default locations of both): changes under them are
    /// refused, and so is replacing or removing a directory holding one.
    #[serde(default)]
    pub cairn_dirs: Vec<PathBuf>,
    /// The user's home directory: its start-up files are authority when a
    /// tree holds them.
    #[serde(default)]
    pub home: Option<PathBuf>,
    /// The directories the tree's git configuration names as
    /// `core.hooksPath` (absolute; read by the host for each tree, see
    /// `cairn_tools::authority_here`): git runs the hooks there.
    #[serde(default)]
    pub hooks_dirs: Vec<PathBuf>,
}

/// The names git runs as hooks (`githooks(5)`), for a `core.hooksPath`
/// that is the tree itself or above it: only these files are hooks there.
const HOOK_NAMES: &[&str] = &[
    "applypatch-msg",
    "pre-applypatch",
    "post-applypatch",
    "pre-commit",
    "pre-merge-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "pre-rebase",
    "post-checkout",
    "post-merge",
    "pre-push",
    "pre-receive",
    "update",
    "proc-receive",
    "post-receive",
    "post-update",
    "reference-transaction",
    "push-to-checkout",
    "pre-auto-gc",
    "post-rewrite",
    "sendemail-validate",
    "fsmonitor-watchman",
    "post-index-change",
    "p4-changelist",
    "p4-prepare-changelist",
    "p4-post-changelist",
    "p4-pre-submit",
];

/// Directories (anywhere in a tree) holding another agent's or editor's
/// configuration.
const AGENT_DIRS: &[&str] =
    &[".claude", ".codex", ".cursor", ".vscode", ".gemini", ".zed", ".devcontainer", ".continue", ".amazonq"];

/// Files (anywhere in a tree) holding another agent's configuration or an
/// environment a program loads on entering the directory.
const AGENT_FILES: &[&str] = &[".mcp.json", ".envrc", ".claude.json", ".devcontainer.json"];

/// Directories (anywhere in a tree) conventionally named by
/// `core.hooksPath` (husky, hand-made hook directories).
const HOOK_DIRS: &[&str] = &[".husky", ".githooks"];

/// Files directly in the home directory that a shell, login, git, ssh or
/// an editor reads or runs later.
const HOME_FILES: &[&str] = &[
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".zlogout",
    ".login",
    ".logout",
    ".cshrc",
    ".tcshrc",
    ".kshrc",
    ".mkshrc",
    ".xprofile",
    ".xinitrc",
    ".xsession",
    ".xsessionrc",
    ".pam_environment",
    ".gitconfig",
    ".npmrc",
    ".yarnrc",
    ".curlrc",
    ".wgetrc",
    ".vimrc",
    ".exrc",
    ".emacs",
    ".tmux.conf",
    ".screenrc",
    ".inputrc",
];

/// Directories under the home directory whose files are read or run later
/// (each a `/`-separated path relative to the home).
const HOME_DIRS: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".bashrc.d",
    ".local/bin",
    "bin",
    ".cargo",
    ".vim",
    ".emacs.d",
    ".config/fish",
    ".config/git",
    ".config/nvim",
    ".config/systemd",
    ".config/autostart",
    ".config/environment.d",
    ".config/Code",
    ".config/Cursor",
    ".config/zed",
    ".config/direnv",
    ".config/gh",
];

/// `path` made absolute against `tree` (unless it is already) with `.`
/// and `..` folded lexically.
fn absolute(tree: &Path, path: &str) -> PathBuf {
    let given = Path::new(path);
    let joined = if given.is_absolute() { given.to_path_buf() } else { tree.join(given) };
    let mut out = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The names of `path`'s normal components (a non-UTF-8 name matches no
/// rule, as it can be none of the names below).
fn names(path: &Path) -> Vec<&str> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_str().unwrap_or("\u{0}")),
            _ => None,
        })
        .collect()
}

/// Whether `name` names a git directory: `.git`, or a bare repository's
/// conventional `NAME.git`.
fn is_git_dir(name: &str) -> bool {
    name == ".git" || (name.len() > 4 && name.ends_with(".git"))
}

/// The git rule on the names after a git directory (`rest`; empty for the
/// `.git` entry itself).
fn git_class(rest: &[&str], bare_suffix: bool) -> Option<AuthorityClass> {
    let Some((last, _)) = rest.split_last() else {
        // `NAME.git` itself is a plain directory name unless it is `.git`.
        return (!bare_suffix).then_some(AuthorityClass::GitLink);
    };
    if bare_suffix {
        // `NAME.git` may be a plain directory: only a bare repository's own
        // top-level configuration and hooks count.
        return match rest {
            ["hooks", ..] => Some(AuthorityClass::GitHook),
            ["config" | "config.worktree" | "commondir"] | ["info", "attributes"] => Some(AuthorityClass::GitConfig),
            _ => None,
        };
    }
    // Objects, refs and logs are data git writes all the time; a branch
    // may be called `hooks` or `config`.
    if matches!(rest.first(), Some(&("objects" | "refs" | "logs" | "lfs"))) {
        return None;
    }
    if rest.contains(&"hooks") {
        return Some(AuthorityClass::GitHook);
    }
    if matches!(*last, "config" | "config.worktree" | "commondir") || rest.ends_with(&["info", "attributes"]) {
        return Some(AuthorityClass::GitConfig);
    }
    None
}

impl AuthorityRules {
    /// The authority `path` carries, if any. `path` is relative to `tree`
    /// (`/`-separated, as a change set names it) or absolute; `tree` is
    /// the absolute working tree, or empty when unknown (then only the
    /// rules that hold in every tree apply: git, agents, `.cairn/`). The
    /// strongest class wins: cairn's own directories first.
    pub fn classify(&self, tree: &Path, path: &str) -> Option<Authority> {
        let abs = absolute(tree, path);
        let found = |class| Some(Authority { class, path: path.to_owned() });
        if self.cairn_dirs.iter().any(|d| !d.as_os_str().is_empty() && abs.starts_with(d)) {
            return found(AuthorityClass::CairnHome);
        }
        for dir in self.hooks_dirs.iter().filter(|d| !d.as_os_str().is_empty() && abs.starts_with(d)) {
            // A hooks path that is the tree (or above it) would make every
            // file a hook: there only git's hook names count.
            let whole = !tree.as_os_str().is_empty() && tree.starts_with(dir);
            let hook_name = abs.parent() == Some(dir.as_path())
                && abs.file_name().and_then(|n| n.to_str()).is_some_and(|n| HOOK_NAMES.contains(&n));
            if !whole || hook_name {
                return found(AuthorityClass::GitHook);
            }
        }
        let all = names(&abs);
        // Only names inside the tree count for the tree-wide rules: a tree
        // that is itself under `.vscode/` does not make all of it authority.
        let skip = if abs.starts_with(tree) && tree.is_absolute() { names(tree).len() } else { 0 };
        // Git directories may sit above the tree (a tree inside `.git`, or
        // a bare repository `x.git`): every name of the path counts there.
        for (i, name) in all.iter().enumerate() {
            if is_git_dir(name)
                && let Some(class) = git_class(&all[i + 1..], *name != ".git")
            {
                return found(class);
            }
        }
        let inside = all.get(skip..).unwrap_or(&[]);
        if let Some((last, dirs)) = inside.split_last() {
            if HOOK_DIRS.iter().any(|d| dirs.contains(d)) {
                return found(AuthorityClass::GitHook);
            }
            if AGENT_FILES.contains(last) || inside.iter().any(|n| AGENT_DIRS.contains(n)) {
                return found(AuthorityClass::AgentConfig);
            }
            if inside.contains(&".cairn") {
                return found(AuthorityClass::CairnWorkspace);
            }
        }
        if let Some(home) = self.home.as_deref().filter(|h| h.is_absolute())
            && let Ok(rel) = abs.strip_prefix(home)
        {
            let rel = names(rel);
            let joined = rel.join("/");
            let under = |d: &&str| joined == **d || joined.starts_with(&format!("{d}/"));
            if (rel.len() == 1 && HOME_FILES.contains(&rel[0])) || HOME_DIRS.iter().any(under) {
                return found(AuthorityClass::HomeStartup);
            }
        }
        None
    }

    /// Whether `path` (as for [`AuthorityRules::classify`]) is a directory
    /// holding one of cairn's own directories: removing it, or replacing
    /// it with a link or a file, would remove or redirect cairn's
    /// configuration.
    pub fn holds_cairn_dir(&self, tree: &Path, path: &str) -> bool {
        let abs = absolute(tree, path);
        self.cairn_dirs.iter().any(|d| d.starts_with(&abs) && *d != abs)
    }
}

/// A path as a person is shown it: control characters (a newline, a
/// carriage return, an escape sequence), backslashes and quotes escaped
/// Rust-style, so a file name can never forge a line of cairn's own (a
/// verdict, another change) in a listing, a diff header or a reason. A
/// plain name is shown as it is.
pub fn shown(path: &str) -> String {
    if path.chars().all(|c| !c.is_control() && c != '\\' && c != '"') {
        return path.to_owned();
    }
    format!("\"{}\"", path.escape_debug())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> AuthorityRules {
        AuthorityRules {
            cairn_dirs: vec!["/h/.config/cairn".into(), "/h/.local/share/cairn".into()],
            home: Some("/h".into()),
            hooks_dirs: Vec::new(),
        }
    }

    #[test]
    fn each_class_is_found_where_it_lives() {
        let r = rules();
        let cases: &[(&str, &str, Option<AuthorityClass>)] = &[
            ("/p", ".git/config", Some(AuthorityClass::GitConfig)),
            ("/p", ".git/hooks/post-checkout", Some(AuthorityClass::GitHook)),
            ("/p", "sub/.git/hooks/pre-commit", Some(AuthorityClass::GitHook)),
            ("/p", ".git/info/attributes", Some(AuthorityClass::GitConfig)),
            ("/p", ".git/commondir", Some(AuthorityClass::GitConfig)),
            ("/p", ".git/modules/lib/config", Some(AuthorityClass::GitConfig)),
            ("/p", ".git/worktrees/w/config.worktree", Some(AuthorityClass::GitConfig)),
            ("/p", "sub/.git", Some(AuthorityClass::GitLink)),
            ("/p", "repo.git/hooks/post-receive", Some(AuthorityClass::GitHook)),
            ("/p/.git", "hooks/x", Some(AuthorityClass::GitHook)),
            ("/p/.git", "config", Some(AuthorityClass::GitConfig)),
            ("/p", ".git/index", None),
            ("/p", ".git/objects/ab/cdef", None),
            ("/p", ".git/refs/heads/hooks", None),
            ("/p", ".git/refs/heads/config", None),
            ("/p", ".gitattributes", None),
            ("/p", ".gitmodules", None),
            ("/p", "src/config", None),
            ("/p", "x.git", None),
            ("/p", "x.git/src/config", None),
            ("/p", ".husky/pre-commit", Some(AuthorityClass::GitHook)),
            ("/p", ".mcp.json", Some(AuthorityClass::AgentConfig)),
            ("/p", ".vscode/tasks.json", Some(AuthorityClass::AgentConfig)),
            ("/p", "a/.claude/settings.json", Some(AuthorityClass::AgentConfig)),
            ("/p", ".envrc", Some(AuthorityClass::AgentConfig)),
            ("/p", ".cairn/config.toml", Some(AuthorityClass::CairnWorkspace)),
            ("/p", "./a/../.git/hooks/x", Some(AuthorityClass::GitHook)),
            ("/p", "README.md", None),
            ("/h", ".config/cairn/config.toml", Some(AuthorityClass::CairnHome)),
            ("/h", ".local/share/cairn/trust.json", Some(AuthorityClass::CairnHome)),
            ("/h", "/h/.config/cairn", Some(AuthorityClass::CairnHome)),
            ("/h", ".bashrc", Some(AuthorityClass::HomeStartup)),
            ("/h", ".ssh/authorized_keys", Some(AuthorityClass::HomeStartup)),
            ("/h", ".local/bin/git", Some(AuthorityClass::HomeStartup)),
            ("/h", ".config/nvim", Some(AuthorityClass::HomeStartup)),
            ("/h", ".config/other/x", None),
            ("/h", "proj/.bashrc", None),
            ("/", "h/.profile", Some(AuthorityClass::HomeStartup)),
            ("/h/proj", "notes.txt", None),
            // The tree's own location does not make everything in it
            // authority.
            ("/x/.vscode/proj", "notes.txt", None),
            ("/x/.cairn/ws", "notes.txt", None),
            // Unknown tree: the rules that hold everywhere.
            ("", ".git/hooks/x", Some(AuthorityClass::GitHook)),
            ("", ".mcp.json", Some(AuthorityClass::AgentConfig)),
            ("", ".bashrc", None),
        ];
        for (tree, path, want) in cases {
            let got = r.classify(Path::new(tree), path).map(|a| a.class);
            assert_eq!(got, *want, "{tree} {path}");
        }
    }

    #[test]
    fn a_configured_hooks_path_holds_hooks() {
        let r = AuthorityRules { hooks_dirs: vec!["/p/tools/hooks".into(), "/p".into()], ..rules() };
        let tree = Path::new("/p");
        let class = |path| r.classify(tree, path).map(|a| a.class);
        assert_eq!(class("tools/hooks/anything"), Some(AuthorityClass::GitHook));
        assert_eq!(class("pre-commit"), Some(AuthorityClass::GitHook));
        assert_eq!(class("notes.txt"), None);
        assert_eq!(class("src/pre-commit"), None);
    }

    #[test]
    fn protection_and_reasons() {
        let r = rules();
        let a = r.classify(Path::new("/h"), ".config/cairn/config.toml").unwrap();
        assert_eq!(a.protection(), Protection::Refused);
        assert!(a.reason().starts_with(".config/cairn/config.toml (cairn's own"), "{}", a.reason());
        let hook = r.classify(Path::new("/p"), ".git/hooks/a\nb").unwrap();
        assert_eq!(hook.protection(), Protection::Destructive);
        assert!(!hook.reason().contains('\n'), "{}", hook.reason());
        assert!(r.holds_cairn_dir(Path::new("/h"), ".config"));
        assert!(r.holds_cairn_dir(Path::new("/h"), "."));
        assert!(!r.holds_cairn_dir(Path::new("/h"), ".config/cairn"));
        assert!(!r.holds_cairn_dir(Path::new("/h"), ".cache"));
        for class in AuthorityClass::ALL {
            assert!(!class.what().is_empty() && !class.why().is_empty());
        }
    }
}
