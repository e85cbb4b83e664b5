//! `cairn run` on the embedded local model, as a newcomer runs it: no
//! provider configured, no key, the model installed by the project's own
//! set-up (`CAIRN_LOCAL_MODEL`, set by `scripts/test`). The turn must call
//! `read_file` (a well-formed call, thanks to constrained decoding) and then
//! answer.
#![cfg(feature = "local")]
#![allow(clippy::unwrap_used)]

use crate::util;

use serde_json::Value;
use util::Env;

fn model_path() -> std::path::PathBuf {
    let path = std::env::var_os("CAIRN_LOCAL_MODEL").map(std::path::PathBuf::from).unwrap_or_else(|| {
        panic!("CAIRN_LOCAL_MODEL is not set: run the tests with ./scripts/test, which installs the model first")
    });
    assert!(path.is_file(), "{} is missing: run ./scripts/fetch-model", path.display());
    path
}

#[test]
fn local_model_reads_a_file_and_answers() {
    let model = model_path();
    let env = Env::new();
    std::fs::write(env.cwd.join("notes.txt"), "The meeting is on Tuesday at noon.\n").unwrap();
    let out = env
        .cairn(&["--json", "run", "Read the file notes.txt and tell me what it says."])
        .env("CAIRN_LOCAL_MODEL", &model)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let events: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let completed: Vec<&Value> =
        events.iter().filter(|e| e["type"] == "toolCompleted" && e["tool"] == "read_file").collect();
    assert!(!completed.is_empty(), "the model called read_file: {stdout}");
    assert!(completed[0]["outputSummary"].as_str().unwrap().contains("Tuesday"));
    assert!(
        events.iter().all(|e| e["type"] != "toolRejected"),
        "every call the model made was well-formed and valid: {stdout}"
    );
    let answer = events.iter().find(|e| e["type"] == "final").expect("a final answer");
    assert!(!answer["text"].as_str().unwrap().trim().is_empty(), "{stdout}");
    let usage = events.iter().filter(|e| e["type"] == "usage").count();
    assert!(usage >= 2, "a provider call before and after the tool: {stdout}");
}

#[test]
fn model_install_from_the_gguf_verifies_and_installs_it() {
    let model = model_path();
    let env = Env::new();
    let out = env.cairn(&["model", "path"]).env_remove("CAIRN_LOCAL_MODEL").output().unwrap();
    assert_eq!(out.status.code(), Some(1), "not installed yet");
    assert!(String::from_utf8_lossy(&out.stdout).contains("run `cairn model install`"));

    let out = env
        .cairn(&["model", "install", "--from", model.to_str().unwrap()])
        .env_remove("CAIRN_LOCAL_MODEL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("sha256 verified"));
    let installed = env.home.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(std::fs::metadata(&installed).unwrap().len(), std::fs::metadata(&model).unwrap().len());
    let out = env.cairn(&["model", "path"]).env_remove("CAIRN_LOCAL_MODEL").output().unwrap();
    assert_eq!(out.status.code(), Some(0));

    // A file that is not the model is refused, and nothing is replaced.
    let fake = env.home.join("fake.gguf");
    std::fs::write(&fake, b"GGUF but not the model").unwrap();
    let out = env
        .cairn(&["model", "install", "--from", fake.to_str().unwrap()])
        .env_remove("CAIRN_LOCAL_MODEL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(std::fs::metadata(&installed).unwrap().len(), std::fs::metadata(&model).unwrap().len());
}
