//! The `cairn` command as a user runs it: real processes, a private
//! `CAIRN_HOME`, no network.

use crate::util;

use util::Env;

#[test]
fn help_documents_exit_codes() {
    let env = Env::new();
    let out = env.cairn(&["--help"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in ["Exit codes:", "0  success", "2  usage", "3  cancelled", "4  finished, but"] {
        assert!(text.contains(needle), "--help lacks {needle:?}:\n{text}");
    }
}

#[test]
fn usage_error_exits_2() {
    let env = Env::new();
    let out = env.cairn(&["no-such-command"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn config_shows_values_and_their_sources() {
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "provider = \"scripted\"\n[limits]\nmax_steps = 7\n").unwrap();
    let out = env.cairn(&["--model", "m1", "config"]).env("CAIRN_PROVIDER", "openai").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |key: &str| text.lines().find(|l| l.starts_with(key)).unwrap_or_default().to_owned();
    assert!(line("provider").contains("openai") && line("provider").contains("env CAIRN_PROVIDER"), "{text}");
    assert!(line("model").contains("m1") && line("model").contains("flag --model"), "{text}");
    assert!(line("limits.max_steps").contains('7') && line("limits.max_steps").contains("config.toml"), "{text}");
    assert!(line("limits.tool_timeout_secs").contains("default"), "{text}");
}

#[test]
fn bad_config_file_is_a_clear_error() {
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "provder = 1\n").unwrap();
    let out = env.cairn(&["config"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("config.toml is not a valid cairn configuration"), "{err}");
    assert!(err.contains("provder"), "{err}");
}
