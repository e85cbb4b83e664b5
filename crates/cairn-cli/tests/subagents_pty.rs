//! A child's calls reach the same person as its parent's: the real `cairn`
//! binary in a pseudo-terminal (rexpect), a parent spawning a child whose
//! Destructive `shell` call is put on the parent's terminal; answered `n`,
//! nothing is deleted and the refusal is in the child's log, by the person.

#![allow(clippy::unwrap_used)]

use crate::util;

use std::path::Path;

use rexpect::process::WaitStatus;
use serde_json::{Value, json};
use util::Env;

fn entries(path: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    for line in std::fs::read_to_string(path).unwrap().lines().skip(1) {
        match serde_json::from_str(line).unwrap() {
            Value::Array(items) => out.extend(items),
            one => out.push(one),
        }
    }
    out.into_iter().filter(|r| r["kind"] == "entry").collect()
}

#[test]
fn a_childs_destructive_call_is_asked_on_the_parents_terminal() {
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    std::fs::create_dir(env.cwd.join("somedir")).unwrap();
    std::fs::write(env.cwd.join("somedir/data"), "keep me").unwrap();
    std::fs::write(
        env.home.join("child.jsonl"),
        format!(
            "{}\n{}\n",
            json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell", "arguments": {"command": "rm -rf somedir"}}]}),
            json!({"text": "the person said no"})
        ),
    )
    .unwrap();
    let script = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "s1", "name": "spawn_agent", "arguments": {"prompt": "clean", "script": "child.jsonl"}}]}),
        json!({"text": "Parent done."}),
    ]);
    let cmd = env.cairn(&["--script", script.to_str().unwrap(), "--yes", "run", "clean up"]);
    let mut p = rexpect::session::spawn_command(cmd, Some(20_000)).unwrap();
    let shown = p.exp_string("Run it? [y/N] ").unwrap();
    assert!(shown.contains("approve shell (DESTRUCTIVE)") && shown.contains("rm -rf somedir"), "{shown}");
    p.send_line("n").unwrap();
    p.flush().unwrap();
    p.exp_string("Parent done.").unwrap();
    let rest = p.exp_eof().unwrap();
    match p.process().wait().unwrap() {
        WaitStatus::Exited(_, 0) => {}
        other => panic!("{other:?}: {rest}"),
    }
    assert_eq!(std::fs::read_to_string(env.cwd.join("somedir/data")).unwrap(), "keep me");
    let child = env.session_files().into_iter().find(|p| p.to_str().unwrap().contains('+')).unwrap();
    let rejected: Vec<Value> = entries(&child).into_iter().filter(|e| e["type"] == "toolRejected").collect();
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0]["payload"]["verdict"]["by"], "user:terminal", "{}", rejected[0]);
}
