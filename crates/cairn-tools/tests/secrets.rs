//! Secrets never reach a tool: not through its environment (by name or by
//! value), and not through cairn's process (`/proc/$PPID/environ`, `maps`,
//! `mem`) nor any other process's (`/proc/*/environ`). Its own test binary:
//! it changes the process environment before any thread reads it, and
//! re-executes itself as the "victim" (a process holding a secret in the
//! environment block it started with, as cairn does) to attack it from
//! tools.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "suite/util.rs"]
mod util;

use std::ffi::OsString;
use std::process::Command;
use std::time::Duration;

use cairn_core::CancelToken;
use cairn_tools::ToolsConfig;
use cairn_tools::builtin::shell::Shell;
use cairn_tools::env::SecretValues;
use cairn_tools::process::{RunSpec, capped_text, run as run_process};
use cairn_tools::sandbox::{SandboxPolicy, host_process_dumpable, protect_host_process};
use serde_json::json;

const VICTIM: &str = "CAIRN_TEST_SECRETS_VICTIM";
/// Every secret the victim holds starts with this (tools grep for it).
const VICTIM_PREFIX: &str = "victimsecret";

#[test]
fn secrets_never_reach_a_tool() {
    if std::env::var_os(VICTIM).is_some() {
        victim();
        return;
    }
    by_name_and_by_value();
    // The victim: this binary again, with secrets in its initial
    // environment block (under a credential name and an odd one).
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "secrets_never_reach_a_tool", "--nocapture", "--test-threads=1"])
        .env(VICTIM, "1")
        .env("VICTIM_API_KEY", format!("{VICTIM_PREFIX}-by-name-0123456789"))
        .env("LLM_PAT", format!("{VICTIM_PREFIX}-odd-name-0123456789"))
        .output()
        .unwrap();
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the victim's checks failed:\n{text}");
    assert!(text.contains("VICTIM CHECKS PASSED"), "the victim ran its checks:\n{text}");
}

/// A tool's environment has no credential-named variable and no variable
/// carrying a secret value the host holds, whatever its name.
fn by_name_and_by_value() {
    let planted = [
        ("OPENAI_API_KEY", "sk-planted-openai"),
        ("ANTHROPIC_API_KEY", "sk-ant-planted"),
        ("GITHUB_TOKEN", "ghp_planted"),
        ("MY_SERVICE_SECRET", "planted-secret"),
        ("DB_PASSWORD", "planted-password"),
        ("AWS_SECRET_ACCESS_KEY", "planted-aws"),
        ("SOME_CREDENTIALS", "planted-cred"),
    ];
    let odd = "sk-odd-name-provider-key-4242";
    let odd_named = [
        ("LLM_PAT", odd.to_string()),
        ("X", format!(" {odd}\n")),
        ("PROXY_URL", format!("https://user:{odd}@proxy.example/")),
        ("lowercase_thing", format!("Bearer {odd}")),
    ];
    for (k, v) in planted {
        // SAFETY: no other thread of this test binary exists yet (a single
        // test; the victim runs in another process).
        unsafe { std::env::set_var(k, v) };
    }
    for (k, v) in &odd_named {
        // SAFETY: as above.
        unsafe { std::env::set_var(k, v) };
    }
    // SAFETY: as above. Not a CAIRN_ name: cairn's own variables never
    // reach a tool (issue 46.7).
    unsafe { std::env::set_var("TEST_HARMLESS_VARIABLE", "visible") };
    let mut secrets = SecretValues::new();
    secrets.insert(odd);
    let config = ToolsConfig { secrets, ..ToolsConfig::default() };

    let root = tempfile::tempdir().unwrap();
    let meta = util::install_tool(
        root.path(),
        "envdump",
        "#!/bin/bash\nexport -p\necho ---\ncat /proc/self/environ | tr '\\0' '\\n'\n",
        &util::metadata("write", &["processSpawn"], ""),
    );
    let external = cairn_tools::ExternalTool::load(&meta, &config).unwrap();
    let r = util::run(&external, json!({}), root.path()).unwrap();
    let sh = Shell::new(&config).unwrap();
    let s = util::run(&sh, json!({"command": "env; echo ---; cat /proc/self/environ | tr '\\0' '\\n'"}), root.path())
        .unwrap();
    for out in [&r.output_summary, &s.output_summary] {
        assert_eq!(out.matches("TEST_HARMLESS_VARIABLE").count(), 2, "the environment is passed at all: {out}");
        for (k, v) in planted {
            assert!(!out.contains(k) && !out.contains(v), "{k} leaked: {out}");
        }
        for (k, _) in &odd_named {
            let named = |l: &str| l.strip_prefix("declare -x ").unwrap_or(l).starts_with(&format!("{k}="));
            assert!(!out.lines().any(named), "{k} (carrying the secret) leaked: {out}");
        }
        assert!(!out.contains(odd), "the secret value leaked: {out}");
    }
    // Control: without the secret in the config, the odd names pass (the
    // by-value rule is what removed them).
    let plain = Shell::new(&ToolsConfig::default()).unwrap();
    let p = util::run(&plain, json!({"command": "env"}), root.path()).unwrap();
    for (k, _) in &odd_named {
        assert!(p.output_summary.lines().any(|l| l.starts_with(&format!("{k}="))), "{k}: {}", p.output_summary);
    }
}

/// The attack every route runs: cairn's (here: the victim's) environ, maps
/// and memory, then every process's environ; prints lines carrying the
/// victim's prefix, and proves it could read something at all.
fn attack() -> String {
    format!(
        "echo \"ppid=$PPID\"\n\
         tr '\\0' '\\n' < /proc/$PPID/environ\n\
         head -c 300 /proc/$PPID/maps\n\
         head -c 64 /proc/$PPID/mem > /dev/null && echo MEM-READ\n\
         for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < \"$f\"; done 2>/dev/null | grep -a {VICTIM_PREFIX}\n\
         grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status\n\
         echo \"own=$(cat /proc/self/environ | tr '\\0' '\\n' | grep -c '^PATH=')\"\n\
         echo END\n"
    )
}

/// Fail (exit non-zero through the panic) unless the output shows the
/// attack ran and found nothing.
fn assert_safe(route: &str, out: &str) {
    println!("--- {route}:\n{out}");
    assert!(out.contains("END"), "{route}: the attack did not finish: {out}");
    assert!(out.contains("own=1"), "{route}: the tool could not even read its own environ: {out}");
    assert!(!out.contains(VICTIM_PREFIX), "{route}: a secret leaked: {out}");
    assert!(!out.contains("MEM-READ"), "{route}: the victim's memory was readable: {out}");
    assert!(!out.contains("r-xp"), "{route}: the victim's maps were readable: {out}");
    // What makes the kernel say no even to a root tool: no capability at
    // all (CAP_SYS_PTRACE would override the victim's non-dumpable flag),
    // no new privileges, a seccomp filter.
    let caps: Vec<&str> = out.lines().filter(|l| l.starts_with("Cap")).collect();
    assert_eq!(caps.len(), 5, "{route}: {out}");
    for line in caps {
        assert!(line.ends_with("0000000000000000"), "{route}: a capability is left: {line}");
    }
    assert!(out.contains("NoNewPrivs:\t1") && out.contains("Seccomp:\t2"), "{route}: {out}");
}

fn spec(cwd: &std::path::Path, secrets: &SecretValues, sandboxed: bool, pid_namespace: bool) -> RunSpec {
    RunSpec {
        argv: vec![OsString::from("bash"), OsString::from("-c"), OsString::from(attack())],
        cwd: cwd.to_path_buf(),
        stdin: Vec::new(),
        env: cairn_tools::env::scrubbed_env(secrets),
        sandbox: sandboxed.then(|| SandboxPolicy {
            cwd: cwd.to_path_buf(),
            read_cwd: true,
            write_cwd: true,
            process_spawn: true,
            ..SandboxPolicy::default()
        }),
        timeout: Duration::from_secs(60),
        output_cap: 256 * 1024,
        max_processes: 64,
        pid_namespace,
        hidden: Vec::new(),
    }
}

fn run_spec(spec: &RunSpec) -> String {
    let o = run_process(spec, &CancelToken::new(), &mut |_| {}).unwrap();
    format!("{}{}", capped_text(&o.stdout), capped_text(&o.stderr))
}

/// Runs in the re-executed process, which holds the secrets in the
/// environment block it started with.
fn victim() {
    let cwd = tempfile::tempdir().unwrap();
    // The host holds the odd-named key (a provider's `api_key_env`).
    let secrets: SecretValues = [std::env::var("LLM_PAT").unwrap()].into_iter().collect();
    let config = ToolsConfig { secrets: secrets.clone(), ..ToolsConfig::default() };
    // Control: a plain child (no cairn protections, no secret in its own
    // environment) reads the victim's environ, so the attack is real and
    // the oracle can see a leak.
    let plain = Command::new("bash")
        .args(["-c", &attack()])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap())
        .output()
        .unwrap();
    let plain = String::from_utf8_lossy(&plain.stdout);
    assert!(plain.contains(&format!("{VICTIM_PREFIX}-odd-name")), "control: the route exists: {plain}");
    assert!(plain.contains("MEM-READ") || plain.contains("r-xp"), "control: maps/mem readable: {plain}");

    protect_host_process().unwrap();
    assert!(!host_process_dumpable());
    let status = cairn_tools::landlock_status();
    println!("sandbox: {}", status.describe());

    // The layers without a PID namespace (what a kernel that refuses one
    // leaves): non-dumpable victim, no capabilities, seccomp, Landlock.
    for (route, sandboxed) in [("unsandboxed, no pid namespace", false), ("sandboxed, no pid namespace", true)] {
        let out = run_spec(&spec(cwd.path(), &secrets, sandboxed, false));
        assert_safe(route, &out);
        assert!(out.contains("Permission denied"), "{route}: {out}");
    }
    // With everything: the victim is not even visible.
    if status.pid_namespace {
        for (route, sandboxed) in [("unsandboxed, pid namespace", false), ("sandboxed, pid namespace", true)] {
            let out = run_spec(&spec(cwd.path(), &secrets, sandboxed, true));
            assert_safe(route, &out);
            assert!(out.contains("ppid=0"), "{route}: PID 1 of its namespace: {out}");
        }
    } else {
        println!("no pid namespace here: {}", status.pid_namespace_note);
    }
    // The tools as cairn runs them: shell (also after an approved bypass,
    // i.e. unsandboxed) and an external tool.
    // The command fails on a file outside the working directory, so the
    // shell offers the bypass, which is approved: the attack runs again
    // without Landlock.
    // Not under /tmp: a sandboxed call has a private /tmp, where the probe
    // would be missing rather than denied (and no bypass offered).
    let outside = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::write(outside.path().join("probe"), "outside\n").unwrap();
    let sh = Shell::new(&config).unwrap();
    let command = format!("{}cat {}/probe || exit 1\n", attack(), outside.path().display());
    let (r, seen) =
        util::run_with(&sh, json!({"command": command}), cwd.path(), util::limits(), true, &CancelToken::new());
    let r = r.unwrap();
    assert_eq!(seen.bypass_questions.len(), 1, "{}", r.output_summary);
    assert_eq!(r.structured_output.as_ref().unwrap()["bypassApproved"], true, "{}", r.output_summary);
    assert!(r.output_summary.contains("outside"), "{}", r.output_summary);
    assert_safe("shell (bypass approved)", &r.output_summary);
    let tools = tempfile::tempdir().unwrap();
    let meta = util::install_tool(
        tools.path(),
        "attack",
        &format!("#!/bin/bash\n{}", attack()),
        &util::metadata("write", &["fileRead", "processSpawn"], ""),
    );
    let t = cairn_tools::ExternalTool::load(&meta, &config).unwrap();
    assert_safe("external tool", &util::run(&t, json!({}), cwd.path()).unwrap().output_summary);
    println!("VICTIM CHECKS PASSED");
}
