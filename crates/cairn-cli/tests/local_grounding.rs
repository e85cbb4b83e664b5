//! Issue 19's first impression, as a newcomer meets it: a directory with
//! `notes.txt` and a distractor, `cairn run "Read notes.txt and tell me the
//! launch code."` on the embedded model. The path argument is grounded in
//! the session's directory, so the call names a file that exists, and the
//! answer carries the code. The model comes from the project's own set-up
//! (`CAIRN_LOCAL_MODEL`, set by `scripts/test`); without it the test fails
//! with that reason.
#![cfg(feature = "local")]
#![allow(clippy::unwrap_used)]

use crate::util;

use serde_json::Value;
use util::Env;

#[test]
fn the_named_file_is_read_and_the_code_answered() {
    let model = std::env::var_os("CAIRN_LOCAL_MODEL").map(std::path::PathBuf::from).unwrap_or_else(|| {
        panic!("CAIRN_LOCAL_MODEL is not set: run the tests with ./scripts/test, which installs the model first")
    });
    assert!(model.is_file(), "{} is missing: run ./scripts/fetch-model", model.display());
    let env = Env::new();
    std::fs::write(env.cwd.join("notes.txt"), "The launch code is 7731.\n").unwrap();
    std::fs::write(env.cwd.join("todo.md"), "# Todo\n- buy milk\n- call Sam\n").unwrap();
    let out = env
        .cairn(&["--json", "run", "Read notes.txt and tell me the launch code."])
        .env("CAIRN_LOCAL_MODEL", &model)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let events: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let calls: Vec<&Value> = events.iter().filter(|e| e["type"] == "toolRequested").collect();
    assert!(!calls.is_empty(), "the model called a tool: {stdout}");
    for call in &calls {
        if let Some(path) = call["arguments"]["path"].as_str() {
            assert!(env.cwd.join(path).exists(), "a grounded path names an existing entry: {path:?}");
        }
    }
    assert!(events.iter().all(|e| e["type"] != "toolFailed"), "no call failed: {stdout}");
    let answer = events.iter().find(|e| e["type"] == "final").expect("a final answer");
    assert!(answer["text"].as_str().unwrap().contains("7731"), "the answer carries the code: {stdout}");
}
