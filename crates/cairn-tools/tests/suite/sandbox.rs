//! The Landlock + seccomp sandbox, from the outside: real processes try to
//! write, read, connect and fork where their capabilities say they may not.

use std::net::TcpListener;
use std::path::Path;

use cairn_core::CancelToken;
use cairn_tools::builtin::shell::Shell;
use cairn_tools::{ToolsConfig, landlock_status};
use serde_json::json;

use super::util::{install_tool, limits, load, metadata, run, run_with, text};

fn shell(config: &ToolsConfig) -> Shell {
    Shell::new(config).unwrap()
}

#[test]
fn the_kernel_here_enforces_landlock() {
    let status = landlock_status();
    assert!(status.landlock_abi >= 4, "{}", status.describe());
    assert!(status.fully_enforced());
}

#[test]
fn a_tool_without_file_write_cannot_create_a_file_in_the_working_directory() {
    let root = tempfile::tempdir().unwrap();
    let cwd = root.path().join("work");
    std::fs::create_dir(&cwd).unwrap();
    let script = "#!/bin/bash\necho hi > created.txt && echo WROTE\nexit 0\n";
    let ro =
        load(&install_tool(&root.path().join("ro"), "try_write", script, &metadata("readOnly", &["fileRead"], "")));
    let r = run(&ro, json!({}), &cwd).unwrap();
    assert!(!cwd.join("created.txt").exists(), "{}", r.output_summary);
    assert!(r.output_summary.contains("Permission denied"), "{}", r.output_summary);
    assert!(!r.output_summary.contains("WROTE"));
    // The private TMPDIR is not writable either without FileWrite.
    let tmp_script =
        "#!/bin/bash\necho x > \"$TMPDIR/t\" && echo TMPOK\necho x > /tmp/cairn-sandbox-probe && echo SLASHTMP\n";
    let ro_tmp =
        load(&install_tool(&root.path().join("ro2"), "try_tmp", tmp_script, &metadata("readOnly", &["fileRead"], "")));
    let r = run(&ro_tmp, json!({}), &cwd).unwrap();
    assert!(!r.output_summary.contains("TMPOK") && !r.output_summary.contains("SLASHTMP"), "{}", r.output_summary);

    // Control: the same script with FileWrite does create it, and TMPDIR is
    // writable, and so is /tmp, which is the call's own (a private tmpfs):
    // the host's /tmp never sees the file.
    let rw = load(&install_tool(
        &root.path().join("rw"),
        "try_write",
        script,
        &metadata("write", &["fileRead", "fileWrite"], ""),
    ));
    let r = run(&rw, json!({}), &cwd).unwrap();
    assert!(r.output_summary.contains("WROTE"), "{}", r.output_summary);
    assert_eq!(std::fs::read_to_string(cwd.join("created.txt")).unwrap(), "hi\n");
    let rw_tmp = load(&install_tool(
        &root.path().join("rw2"),
        "try_tmp",
        tmp_script,
        &metadata("write", &["fileRead", "fileWrite"], ""),
    ));
    let _ = std::fs::remove_file("/tmp/cairn-sandbox-probe");
    let r = run(&rw_tmp, json!({}), &cwd).unwrap();
    assert!(r.output_summary.contains("TMPOK"), "{}", r.output_summary);
    assert!(r.output_summary.contains("SLASHTMP"), "{}", r.output_summary);
    assert!(!Path::new("/tmp/cairn-sandbox-probe").exists(), "the private /tmp reached the host's");
}

#[test]
fn no_tool_reads_outside_its_rules() {
    let root = tempfile::tempdir().unwrap();
    let cwd = root.path().join("work");
    let home = root.path().join("home");
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("secret.txt"), "TOP-SECRET\n").unwrap();
    std::fs::write(cwd.join("mine.txt"), "MINE\n").unwrap();
    std::os::unix::fs::symlink(&home, cwd.join("homelink")).unwrap();
    let secret = home.join("secret.txt");
    let via_proc = format!("/proc/self/root{}", secret.display());

    // An external tool with FileRead reads the working directory, nothing else.
    let script = format!(
        "#!/bin/bash\nIFS= read -r a < mine.txt; echo \"cwd:$a\"\nfor f in {s} homelink/secret.txt {p} /proc/1/root{s}; do IFS= read -r b < \"$f\"; echo \"got:$b\"; done\nexit 0\n",
        s = secret.display(),
        p = via_proc
    );
    let reader =
        load(&install_tool(&root.path().join("tools"), "reader", &script, &metadata("readOnly", &["fileRead"], "")));
    let r = run(&reader, json!({}), &cwd).unwrap();
    assert!(r.output_summary.contains("cwd:MINE"), "{}", r.output_summary);
    assert!(!r.output_summary.contains("TOP-SECRET"), "{}", r.output_summary);
    // Refused by Landlock, or not there at all (under the call's private
    // /tmp, where this test's directories live).
    let refused = r.output_summary.matches("Permission denied").count()
        + r.output_summary.matches("No such file or directory").count();
    assert_eq!(refused, 4, "{}", r.output_summary);

    // Without FileRead, not even the working directory.
    let blind = load(&install_tool(
        &root.path().join("tools2"),
        "blind",
        "#!/bin/bash\nIFS= read -r a < mine.txt; echo \"cwd:$a\"\n",
        &metadata("readOnly", &[], ""),
    ));
    let r = run(&blind, json!({}), &cwd).unwrap();
    assert!(!r.output_summary.contains("cwd:MINE"), "{}", r.output_summary);

    // The shell: same rules, whatever the path trick.
    let sh = shell(&ToolsConfig { offer_bypass_on_denial: false, ..Default::default() });
    for cmd in [
        format!("cat {}", secret.display()),
        "cat homelink/secret.txt".to_string(),
        format!("cat {via_proc}"),
        "cat /proc/self/cwd/../home/secret.txt".to_string(),
        format!("cd {} && cat secret.txt", home.display()),
        format!("ln -s {} l2 && cat l2", secret.display()),
        format!("ln {} hardlink && cat hardlink", secret.display()),
        format!("cp {} copy && cat copy", secret.display()),
    ] {
        let r = run(&sh, json!({"command": cmd}), &cwd).unwrap();
        assert_ne!(r.exit_code, 0, "{cmd}: {}", r.output_summary);
        assert!(!r.output_summary.contains("TOP-SECRET"), "{cmd}: {}", r.output_summary);
    }
    let r = run(&sh, json!({"command": "cat mine.txt"}), &cwd).unwrap();
    assert_eq!(r.output_summary, "MINE\n");
    // Writing is confined the same way: not beside the working directory,
    // not into the fake home, not by moving a file out. (Beside the
    // working directory lies, here, the call's private /tmp: the write may
    // succeed there, and the host never sees it.)
    let r = run(&sh, json!({"command": "cd .. && echo x > escaped.txt"}), &cwd).unwrap();
    assert!(root.path().starts_with("/tmp") || r.exit_code != 0, "{}", r.output_summary);
    for cmd in ["echo x > ../home/planted.txt", "mv mine.txt ../moved.txt"] {
        match run(&sh, json!({"command": cmd}), &cwd) {
            Ok(r) => assert_ne!(r.exit_code, 0, "{cmd}: {}", r.output_summary),
            // Moved into the private /tmp: staged, the deletion of
            // mine.txt is Destructive and discarded.
            Err(cairn_core::tool::ToolError::Rejected(why)) => assert!(why.contains("mine.txt"), "{cmd}: {why}"),
            Err(e) => panic!("{cmd}: {e}"),
        }
    }
    assert!(!root.path().join("escaped.txt").exists());
    assert!(!home.join("planted.txt").exists());
    assert!(!root.path().join("moved.txt").exists() && cwd.join("mine.txt").exists());
}

#[test]
fn without_network_connecting_to_a_loopback_listener_fails() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let cwd = tempfile::tempdir().unwrap();
    let cmd = format!("echo hello > /dev/tcp/127.0.0.1/{port} && echo CONNECTED");

    let sh = shell(&ToolsConfig::default());
    let (r, seen) = run_with(&sh, json!({"command": cmd}), cwd.path(), limits(), false, &CancelToken::new());
    let r = r.unwrap();
    assert_ne!(r.exit_code, 0);
    assert!(!r.output_summary.contains("CONNECTED"), "{}", r.output_summary);
    assert!(listener.accept().is_err(), "no connection may reach the listener");
    // The denial was offered to the bypass broker, and refused.
    assert_eq!(seen.bypass_questions.len(), 1, "{:?}", seen.bypass_questions);
    assert!(seen.bypass_questions[0].contains("WITHOUT the sandbox"));

    // An external tool without Network: python-free, bash's /dev/tcp again.
    let root = tempfile::tempdir().unwrap();
    let script = format!("#!/bin/bash\nexec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED\nexit 0\n");
    let t = load(&install_tool(root.path(), "net", &script, &metadata("readOnly", &[], "")));
    let r = run(&t, json!({}), cwd.path()).unwrap();
    assert!(!r.output_summary.contains("CONNECTED"), "{}", r.output_summary);
    assert!(listener.accept().is_err());

    // Control: with Network declared the same tool connects.
    let t = load(&install_tool(&root.path().join("n2"), "net", &script, &metadata("write", &["network"], "")));
    let r = run(&t, json!({}), cwd.path()).unwrap();
    assert!(r.output_summary.contains("CONNECTED"), "{}", r.output_summary);
    listener.set_nonblocking(false).unwrap();
    assert!(listener.accept().is_ok());
}

#[test]
fn an_approved_bypass_reruns_the_command_once_outside_the_sandbox() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let cwd = tempfile::tempdir().unwrap();
    let sh = shell(&ToolsConfig::default());
    let cmd = format!("echo hello > /dev/tcp/127.0.0.1/{port} && echo CONNECTED");
    let (r, seen) = run_with(&sh, json!({"command": cmd}), cwd.path(), limits(), true, &CancelToken::new());
    let r = r.unwrap();
    assert_eq!(seen.bypass_questions.len(), 1);
    assert_eq!(r.exit_code, 0, "{}", r.output_summary);
    assert!(r.output_summary.contains("CONNECTED"));
    assert!(r.output_summary.contains("approved bypass"));
    assert_eq!(r.structured_output.unwrap()["bypassApproved"], true);
    assert!(listener.accept().is_ok());
}

#[test]
fn external_bypass_metadata_asks_once_per_call_and_widens_only_that_call() {
    let root = tempfile::tempdir().unwrap();
    let cwd = root.path().join("work");
    let cache = root.path().join("cache");
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::create_dir_all(&cache).unwrap();
    let extra = format!("[bypass]\nreason = \"fills its cache\"\nwrite = [\"{}\"]\n", cache.display());
    let script = format!("#!/bin/bash\necho v > {}/entry && echo CACHED\nexit 0\n", cache.display());
    let t =
        load(&install_tool(&root.path().join("tools"), "cacher", &script, &metadata("write", &["fileRead"], &extra)));
    let (r, seen) = run_with(&t, json!({}), &cwd, limits(), false, &CancelToken::new());
    assert!(matches!(r, Err(cairn_core::tool::ToolError::AccessDenied(_))), "{}", text(&r));
    assert!(seen.bypass_questions[0].contains("fills its cache"));
    assert!(!cache.join("entry").exists());
    let (r, seen) = run_with(&t, json!({}), &cwd, limits(), true, &CancelToken::new());
    assert_eq!(seen.bypass_questions.len(), 1);
    assert!(r.unwrap().output_summary.contains("CACHED"));
    assert!(cache.join("entry").exists());
}

#[test]
fn without_process_spawn_a_tool_cannot_start_processes() {
    let root = tempfile::tempdir().unwrap();
    let script = "#!/bin/bash\n( echo CHILD )\n/bin/echo EXTERNAL\necho DONE\n";
    let t = load(&install_tool(&root.path().join("a"), "forker", script, &metadata("readOnly", &[], "")));
    let r = run(&t, json!({}), root.path()).unwrap();
    assert!(!r.output_summary.contains("CHILD") && !r.output_summary.contains("EXTERNAL"), "{}", r.output_summary);
    // bash gives up when fork fails: the seccomp filter answered EPERM.
    assert!(r.output_summary.contains("fork: Operation not permitted"), "{}", r.output_summary);
    assert!(!r.output_summary.contains("DONE"));
    let t = load(&install_tool(&root.path().join("b"), "forker", script, &metadata("write", &["processSpawn"], "")));
    let r = run(&t, json!({}), root.path()).unwrap();
    assert!(r.output_summary.contains("CHILD") && r.output_summary.contains("EXTERNAL"), "{}", r.output_summary);
    assert!(r.output_summary.contains("DONE"));
}

#[test]
fn configured_read_paths_are_readable_but_not_writable() {
    let root = tempfile::tempdir().unwrap();
    let cwd = root.path().join("work");
    let toolchain = root.path().join("toolchain");
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::create_dir_all(&toolchain).unwrap();
    std::fs::write(toolchain.join("version"), "1.0\n").unwrap();
    let cmd = format!("cat {t}/version; echo x > {t}/new", t = toolchain.display());
    let plain = shell(&ToolsConfig { offer_bypass_on_denial: false, ..Default::default() });
    let r = run(&plain, json!({"command": cmd}), &cwd).unwrap();
    assert!(!r.output_summary.contains("1.0"), "{}", r.output_summary);
    let config = ToolsConfig {
        offer_bypass_on_denial: false,
        sandbox_read_paths: vec![toolchain.clone()],
        ..Default::default()
    };
    let r = run(&shell(&config), json!({"command": cmd}), &cwd).unwrap();
    assert!(r.output_summary.starts_with("1.0\n"), "{}", r.output_summary);
    // Refused by Landlock, or (under the call's private /tmp, where this
    // test's directories live) re-exposed read-only.
    assert!(
        r.output_summary.contains("Permission denied") || r.output_summary.contains("Read-only file system"),
        "{}",
        r.output_summary
    );
    assert!(!toolchain.join("new").exists());
}

#[test]
fn without_network_udp_datagrams_do_not_leave_either() {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_nonblocking(true).unwrap();
    let port = socket.local_addr().unwrap().port();
    let cwd = tempfile::tempdir().unwrap();
    let cmd = format!("echo datagram > /dev/udp/127.0.0.1/{port} && echo SENT");
    let sh = shell(&ToolsConfig { offer_bypass_on_denial: false, ..Default::default() });
    let r = run(&sh, json!({"command": cmd}), cwd.path()).unwrap();
    assert!(!r.output_summary.contains("SENT"), "{}", r.output_summary);
    assert!(r.output_summary.contains("Operation not permitted"), "seccomp refuses the socket: {}", r.output_summary);
    let mut buf = [0u8; 64];
    assert!(socket.recv(&mut buf).is_err(), "no datagram may arrive");
    // Control: with network the datagram arrives.
    let sh = shell(&ToolsConfig { shell_network: true, ..Default::default() });
    let r = run(&sh, json!({"command": cmd}), cwd.path()).unwrap();
    assert!(r.output_summary.contains("SENT"), "{}", r.output_summary);
    socket.set_nonblocking(false).unwrap();
    let n = socket.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"datagram\n");
}
