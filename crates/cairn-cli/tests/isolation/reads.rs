//! What sandboxed processes may read, through the real `cairn` binary
//! (issues 53.3, 53.4 and 49.4), as root and (the rerun in the parent
//! module) as uid 65534:
//! - `/etc` is readable by entries: `shadow`, `gshadow`, `ssl/private`
//!   are not, even to root's tools (shell and hooks); `passwd`,
//!   `resolv.conf`, the CA bundle and a `/etc/*release` glob are;
//! - git reads `~/.gitconfig` (a staged `git status` through an alias
//!   defined there), while `~/.ssh` stays unreadable;
//! - `[tools] sandbox_read_paths` is accepted and grants reading exactly
//!   what it names;
//! - a hook program in `$HOME` reads nothing next to it.
//!
//! Oracles: files this test wrote or read itself, never cairn's code.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::util::{Env, require_staging};
use super::{results, script_calls, session_text, shell};

/// A home outside cairn's and outside `/tmp` (where a person's lives),
/// with a private key and cloud credentials in it.
struct Home {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

const SSH_SECRET: &str = "SSH-PRIVATE-KEY-7f3a";
const AWS_SECRET: &str = "AWS-SECRET-ACCESS-KEY-91c2";

impl Home {
    fn new() -> Self {
        // Not under /tmp: a staged call's private /tmp would hide it
        // whatever the rules (a person's home is not in /tmp).
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let path = dir.path().join("person");
        std::fs::create_dir_all(path.join(".ssh")).unwrap();
        std::fs::create_dir_all(path.join(".aws")).unwrap();
        std::fs::write(path.join(".ssh/id_ed25519"), format!("{SSH_SECRET}\n")).unwrap();
        std::fs::write(path.join(".aws/credentials"), format!("{AWS_SECRET}\n")).unwrap();
        Self { _dir: dir, path }
    }

    /// `cairn ARGS` with this home as `HOME`.
    fn cairn(&self, env: &Env, args: &[&str]) -> Command {
        let mut cmd = env.cairn(args);
        cmd.env("HOME", &self.path);
        cmd
    }
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap() == 0
}

/// Issue 53.4 (root deployments): root's sandboxed `shell` read
/// `/etc/shadow`. Now `shadow`, `gshadow` and `ssl/private` are out of
/// reach while ordinary `/etc` reads still work.
#[test]
fn a_sandboxed_shell_cannot_read_etc_secrets_but_reads_the_rest_of_etc() {
    let env = Env::new();
    if is_root() {
        // The attack is real: unsandboxed, root reads it.
        std::fs::read("/etc/shadow").expect("root reads /etc/shadow outside the sandbox");
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let first = passwd.lines().next().unwrap().to_owned();
    let line = "for f in /etc/shadow /etc/gshadow /etc/ssl/private/*; do \
                  cat \"$f\" >/dev/null 2>&1 && echo \"READ:$f\" || echo \"DENIED:$f\"; done; \
                head -1 /etc/passwd; \
                cat /etc/resolv.conf >/dev/null && echo RESOLV-OK; \
                grep -q 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt && echo CERTS-OK; \
                cat /etc/*release >/dev/null && echo RELEASE-OK; echo END";
    let script = script_calls(&env, &[shell(line)]);
    let out = env
        .cairn(&["--script", script.to_str().unwrap(), "--allow", "shell(*)", "run", "go"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = results(&session_text(&env));
    assert!(text.contains("END"), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(!text.contains("READ:"), "a sandboxed shell read an /etc secret: {text}");
    assert!(text.contains("DENIED:/etc/shadow") && text.contains("DENIED:/etc/gshadow"), "{text}");
    assert!(text.contains(&first), "/etc/passwd is readable: {text}");
    for ok in ["RESOLV-OK", "CERTS-OK", "RELEASE-OK"] {
        assert!(text.contains(ok), "{ok} missing: {text}");
    }
}

/// Issue 49.4: with `~/.gitconfig` present, a staged `git status` failed
/// ("unable to access '$HOME/.gitconfig': Permission denied", exit 128).
/// Now git reads it (an alias defined there works), read-only, and the
/// home's keys stay out of reach.
#[test]
fn git_reads_its_configuration_in_the_sandbox_and_nothing_else_of_home() {
    let env = Env::new();
    require_staging(&env);
    let home = Home::new();
    let gitconfig = "[user]\n\tname = T\n\temail = t@example.invalid\n[alias]\n\tst = status --short --branch\n";
    std::fs::write(home.path.join(".gitconfig"), gitconfig).unwrap();
    let git = |args: &[&str]| {
        let out = Command::new("git").args(args).current_dir(&env.cwd).env("HOME", &home.path).output().unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    git(&["init", "-q", "-b", "trunk"]);
    std::fs::write(env.cwd.join("a.txt"), "a\n").unwrap();
    git(&["add", "a.txt"]);
    git(&["commit", "-q", "-m", "one"]);
    std::fs::write(env.cwd.join("new.txt"), "n\n").unwrap();
    let line = format!(
        "git st; echo \"git=$?\"; git config user.name; cat {h}/.ssh/id_ed25519 {h}/.aws/credentials; \
         echo x >> {h}/.gitconfig; echo END",
        h = home.path.display()
    );
    let script = script_calls(&env, &[shell(&line)]);
    let out = home
        .cairn(&env, &["--script", script.to_str().unwrap(), "--allow", "shell(*)", "run", "go"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = results(&session_text(&env));
    assert!(text.contains("END"), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("## trunk") && text.contains("?? new.txt"), "git st (an alias of ~/.gitconfig): {text}");
    assert!(text.contains("git=0"), "{text}");
    assert!(!text.contains(SSH_SECRET) && !text.contains(AWS_SECRET), "a key of the home was read: {text}");
    assert_eq!(
        std::fs::read_to_string(home.path.join(".gitconfig")).unwrap(),
        gitconfig,
        "~/.gitconfig is read-only to tools"
    );
}

/// Issue 49.4: the documented `[tools] sandbox_read_paths` was refused by
/// the config parser. Now it is accepted (`~/` expands), shown by `cairn
/// config`, and grants reading what it names and nothing beside it.
#[test]
fn sandbox_read_paths_is_accepted_and_grants_reading() {
    let env = Env::new();
    let home = Home::new();
    std::fs::create_dir_all(home.path.join("toolchain")).unwrap();
    std::fs::write(home.path.join("toolchain/VERSION"), "TOOLCHAIN-VERSION-7\n").unwrap();
    std::fs::write(home.path.join("notes.txt"), "NEXT-TO-IT\n").unwrap();
    std::fs::write(env.home.join("config.toml"), "[tools]\nsandbox_read_paths = [\"~/toolchain\"]\n").unwrap();
    let config = home.cairn(&env, &["config"]).output().unwrap();
    let shown = String::from_utf8_lossy(&config.stdout).into_owned();
    assert!(config.status.success(), "the key is accepted: {}", String::from_utf8_lossy(&config.stderr));
    assert!(shown.contains(&home.path.join("toolchain").display().to_string()), "{shown}");
    let tools = String::from_utf8_lossy(&home.cairn(&env, &["tools"]).output().unwrap().stdout).into_owned();
    let also = tools.lines().find(|l| l.starts_with("tools also read:")).unwrap_or_default();
    assert!(also.contains(&home.path.join("toolchain").display().to_string()), "cairn tools says so: {tools}");
    let line = format!("cat {h}/toolchain/VERSION; cat {h}/notes.txt; echo END", h = home.path.display());
    let script = script_calls(&env, &[shell(&line)]);
    let out = home
        .cairn(&env, &["--script", script.to_str().unwrap(), "--allow", "shell(*)", "run", "go"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = results(&session_text(&env));
    assert!(text.contains("END"), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("TOOLCHAIN-VERSION-7"), "the configured path is readable: {text}");
    assert!(!text.contains("NEXT-TO-IT"), "only what it names: {text}");
    // A relative entry is refused, saying what to write instead.
    std::fs::write(env.home.join("config.toml"), "[tools]\nsandbox_read_paths = [\"toolchain\"]\n").unwrap();
    let out = home.cairn(&env, &["config"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("absolute"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Issues 53.3 and 53.4, for hooks: a hook program was granted its whole
/// directory (a hook in `$HOME` read `.ssh`), and as root `/etc/shadow`.
/// The hook tries both and refuses the call with what it found.
#[test]
fn a_hook_in_home_reads_nothing_next_to_it_nor_etc_shadow() {
    let env = Env::new();
    let home = Home::new();
    let hook = home.path.join("guard.sh");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\ncat >/dev/null\n{{ cat {h}/.ssh/id_ed25519 {h}/.aws/credentials || echo HOME-DENIED; \
             cat /etc/shadow >/dev/null 2>&1 && echo SHADOW-READ || echo SHADOW-DENIED; }} >&2\nexit 2\n",
            h = home.path.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        env.home.join("config.toml"),
        format!("[[hooks.pre_tool]]\ncommand = \"{}\"\nmatcher = \"shell\"\n", hook.display()),
    )
    .unwrap();
    let script = script_calls(&env, &[shell("echo ran")]);
    let out = home
        .cairn(&env, &["--script", script.to_str().unwrap(), "--allow", "shell(*)", "run", "go"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = session_text(&env);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("HOME-DENIED") && text.contains("SHADOW-DENIED"),
        "the hook ran and reported: {text}\n{said}"
    );
    for leak in [SSH_SECRET, AWS_SECRET, "SHADOW-READ"] {
        assert!(!text.contains(leak) && !said.contains(leak), "the hook read {leak}: {text}");
    }
}
