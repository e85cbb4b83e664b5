//! Issue 25, at the level of the process layer: a tool process inherits no
//! descriptor above 2 (sandboxed, unsandboxed, bypass); a sandboxed call
//! with a mount namespace gets a private `/tmp`; paths the host hides
//! (cairn's home and its sockets) are covered in the call's mount
//! namespace; and the staged suite passes for a non-root user too.
//!
//! Each attack is performed for real; the oracles are the host's files and
//! what the tool printed.

use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cairn_core::CancelToken;
use cairn_tools::ToolsConfig;
use cairn_tools::builtin::shell::Shell;
use cairn_tools::process::{RunSpec, run as run_process};
use cairn_tools::sandbox::SandboxPolicy;
use serde_json::json;

use super::util::run;

fn require_namespaces() {
    if let Err(why) = cairn_tools::sandbox::isolation_status() {
        panic!("tool processes get no mount namespace here, so this test cannot run: {why}");
    }
}

fn spec(cwd: &Path, command: &str, sandbox: Option<SandboxPolicy>, hidden: Vec<PathBuf>) -> RunSpec {
    RunSpec {
        argv: ["bash", "-c", command].iter().map(OsString::from).collect(),
        cwd: cwd.to_path_buf(),
        stdin: Vec::new(),
        env: cairn_tools::env::scrubbed_env(&Default::default()),
        sandbox,
        timeout: Duration::from_secs(60),
        output_cap: 64 * 1024,
        max_processes: 64,
        pid_namespace: true,
        hidden,
    }
}

fn writer(cwd: &Path) -> SandboxPolicy {
    SandboxPolicy { cwd: cwd.to_path_buf(), read_cwd: true, write_cwd: true, process_spawn: true, ..Default::default() }
}

fn output(spec: &RunSpec) -> String {
    let out = run_process(spec, &CancelToken::new(), &mut |_| {}).unwrap();
    format!("{}{}", String::from_utf8_lossy(&out.stdout.kept), String::from_utf8_lossy(&out.stderr.kept))
}

/// A descriptor cairn inherited (not close-on-exec) reaches no tool: read
/// directly (`<&N`, which Landlock does not check), written through, or
/// walked (`/proc/self/fd/N/…`), whatever the route the tool runs by.
#[test]
fn inherited_descriptors_reach_no_tool_process() {
    let outside = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::write(outside.path().join("secret.txt"), "FD-SECRET\n").unwrap();
    std::fs::create_dir(outside.path().join("sub")).unwrap();
    std::fs::write(outside.path().join("sub/keep.txt"), "keep\n").unwrap();
    let secret = std::fs::File::open(outside.path().join("secret.txt")).unwrap();
    let dir = std::fs::File::open(outside.path()).unwrap();
    // What `exec 7<secret` does for cairn: descriptors that survive exec.
    let (sfd, dfd) = (secret.as_raw_fd(), dir.as_raw_fd());
    for fd in [sfd, dfd] {
        // SAFETY: fcntl on descriptors this test owns.
        unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
    }
    let cwd = tempfile::tempdir().unwrap();
    let attack = format!(
        "cat <&{sfd}; cat /proc/self/fd/{sfd}; rm -rf /proc/self/fd/{dfd}/sub; ls /proc/self/fd/{dfd}/; echo END"
    );
    let mut bypass = writer(cwd.path());
    bypass.bypass = true;
    let routes = [
        ("sandboxed", Some(writer(cwd.path())), true),
        ("unsandboxed", None, true),
        ("bypass", Some(bypass), true),
        ("sandboxed, no pid namespace", Some(writer(cwd.path())), false),
        ("unsandboxed, no pid namespace", None, false),
    ];
    let mut failures = Vec::new();
    for (route, sandbox, pidns) in routes {
        let mut s = spec(cwd.path(), &attack, sandbox, Vec::new());
        s.pid_namespace = pidns;
        let text = output(&s);
        if !text.contains("END") {
            failures.push(format!("{route}: the attack did not run: {text}"));
        }
        if text.contains("FD-SECRET") || text.contains("keep.txt") {
            failures.push(format!("{route}: an inherited descriptor reached the tool: {text}"));
        }
        if !outside.path().join("sub/keep.txt").exists() {
            failures.push(format!("{route}: deleted through an inherited descriptor"));
            std::fs::create_dir_all(outside.path().join("sub")).unwrap();
            std::fs::write(outside.path().join("sub/keep.txt"), "keep\n").unwrap();
        }
    }
    drop((secret, dir));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A sandboxed call writes `/tmp` freely, into a tmpfs of its own: the
/// host's `/tmp` never sees the file, and the tool cannot list the host's.
#[test]
fn a_sandboxed_call_gets_a_private_tmp() {
    require_namespaces();
    let marker = format!("cairn-host-marker-{}", std::process::id());
    let probe = format!("cairn-private-probe-{}", std::process::id());
    std::fs::write(Path::new("/tmp").join(&marker), "host\n").unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let command = format!("echo PRIVATE > /tmp/{probe} && cat /tmp/{probe}; ls -A /tmp; echo END");
    // Through the staged shell, as a session runs it.
    let staging = tempfile::tempdir().unwrap();
    let shell =
        Shell::new(&ToolsConfig { staging_dir: Some(staging.path().to_path_buf()), ..ToolsConfig::default() }).unwrap();
    let r = run(&shell, json!({"command": command}), cwd.path()).unwrap();
    let text = r.output_summary.clone();
    let host_probe = Path::new("/tmp").join(&probe).exists();
    let _ = std::fs::remove_file(Path::new("/tmp").join(&probe));
    let _ = std::fs::remove_file(Path::new("/tmp").join(&marker));
    assert!(text.contains("END"), "{text}");
    assert!(text.contains("PRIVATE"), "the call could not write its /tmp: {text}");
    assert!(!host_probe, "the call's /tmp write reached the host's /tmp");
    assert!(!text.contains(&marker), "the call listed the host's /tmp: {text}");
}

/// A hidden directory (cairn's home) is an empty read-only tmpfs in the
/// call's mount namespace: its files cannot be listed and its unix socket
/// cannot be connected to — Landlock before ABI 9 does not check
/// `connect()` on a pathname socket, so without the cover it can. A hidden
/// socket file (the working directory is the home) is covered by itself.
#[test]
fn hidden_paths_and_their_sockets_are_out_of_reach() {
    require_namespaces();
    let home = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::write(home.path().join("session.jsonl"), "SESSION-DATA\n").unwrap();
    let sock = home.path().join("cairn.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    listener.set_nonblocking(true).unwrap();
    let connect = format!(
        "/usr/bin/python3 -c \"import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print('CONNECTED')\" {}",
        sock.display()
    );
    let cwd = tempfile::tempdir().unwrap();
    let command = format!("ls -A {h}; cat {h}/session.jsonl; {connect}; echo END", h = home.path().display());
    let mut bypass = writer(cwd.path());
    bypass.bypass = true;
    // Control: without hiding, the socket is reachable even sandboxed.
    let control = output(&spec(cwd.path(), &command, Some(writer(cwd.path())), Vec::new()));
    assert!(control.contains("CONNECTED"), "control: the route exists: {control}");
    let mut failures = Vec::new();
    for (route, sandbox) in [("sandboxed", Some(writer(cwd.path()))), ("unsandboxed", None), ("bypass", Some(bypass))] {
        let text = output(&spec(cwd.path(), &command, sandbox, vec![home.path().to_path_buf(), sock.clone()]));
        if !text.contains("END")
            || text.contains("CONNECTED")
            || text.contains("SESSION-DATA")
            || text.contains("cairn.sock")
        {
            failures.push(format!("{route}: {text}"));
        }
    }
    // The working directory is the home: the home stays, the socket goes.
    let text =
        output(&spec(home.path(), &connect, Some(writer(home.path())), vec![home.path().to_path_buf(), sock.clone()]));
    if text.contains("CONNECTED") {
        failures.push(format!("cwd = home: {text}"));
    }
    let text =
        output(&spec(home.path(), "cat session.jsonl", Some(writer(home.path())), vec![home.path().to_path_buf()]));
    if !text.contains("SESSION-DATA") {
        failures.push(format!("cwd = home: the working directory must stay visible: {text}"));
    }
    // A program installed under the hidden directory (an external tool in
    // cairn's home) still runs, on every route.
    let tools = home.path().join("tools");
    std::fs::create_dir(&tools).unwrap();
    let program = tools.join("t");
    std::fs::write(&program, "#!/bin/bash\nls -A \"$(dirname \"$0\")/..\"; echo RAN\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut tool_policy = writer(cwd.path());
    tool_policy.extra_read = vec![tools.clone()];
    for (route, sandbox) in [("sandboxed", Some(tool_policy)), ("unsandboxed", None)] {
        let mut s = spec(cwd.path(), "", sandbox, vec![home.path().to_path_buf()]);
        s.argv = vec![program.clone().into_os_string()];
        let text = output(&s);
        if !text.contains("RAN") || text.contains("session.jsonl") {
            failures.push(format!("{route}: a program under the hidden directory: {text}"));
        }
    }
    drop(listener);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Set when this binary runs again as a non-root user (no recursion).
const AS_USER: &str = "CAIRN_TEST_AS_NON_ROOT";

/// The staged-effects suite, rerun as uid 65534 (`setpriv`): staging works
/// through an unprivileged user namespace, and what a call creates in its
/// staging layer belongs to that user.
#[test]
fn the_staged_suite_passes_as_a_non_root_user() {
    // The rerun skips this test by name; the variable guards against a
    // rerun that would start another one anyway.
    assert!(std::env::var_os(AS_USER).is_none(), "the non-root rerun must not rerun itself");
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(uid, 0, "switching to uid 65534 needs root (this suite runs as uid {uid})");
    let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"].into_iter().find(|p| Path::new(p).exists());
    let setpriv = setpriv.expect("setpriv (util-linux) is needed to rerun the suite as another user");
    // A copy any user may execute (/root is 0700 here).
    let dir = tempfile::Builder::new().prefix("cairn-nonroot-").tempdir_in("/var/tmp").unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = dir.path().join("suite");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(65534), Some(65534)).unwrap();
    let rerun = || {
        Command::new(setpriv)
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "--"])
            .arg(&exe)
            .args(["suite::staged", "suite::isolation", "--skip", "the_staged_suite_passes_as_a_non_root_user"])
            .arg("--test-threads=2")
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &home)
            .env("TMPDIR", &home)
            .env(AS_USER, "1")
            .current_dir(&home)
            .output()
            .unwrap()
    };
    // "Text file busy": another test thread forked while the copy was open
    // for writing; that child holds it until its exec. Try again.
    let mut out = rerun();
    for _ in 0..50 {
        if !String::from_utf8_lossy(&out.stderr).contains("Text file busy") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        out = rerun();
    }
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the staged suite failed as uid 65534:\n{text}");
    let passed: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("test result: ok. "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(passed > 0, "as uid 65534, no test ran:\n{text}");
    println!("as uid 65534: {passed} tests passed");
}

/// A staged call's new files in its staging layer belong to the user who
/// runs cairn (from a user namespace that maps only the caller's own uid
/// and gid; as root, root), before cairn applies them.
#[test]
fn staged_files_belong_to_the_user_who_runs_cairn() {
    use cairn_core::tool::{Tool, ToolContext};
    use std::os::unix::fs::MetadataExt;
    require_namespaces();
    let cwd = tempfile::tempdir().unwrap();
    let staging = tempfile::tempdir().unwrap();
    let shell =
        Shell::new(&ToolsConfig { staging_dir: Some(staging.path().to_path_buf()), ..ToolsConfig::default() }).unwrap();
    let mut owners = Vec::new();
    let receipt = {
        let mut out = |_: &[u8]| {};
        let mut bypass = |_: &str| false;
        let mut review = |r: &cairn_core::staged::StagedReview<'_>| {
            for p in ["d", "d/new.txt"] {
                let meta = std::fs::symlink_metadata(Path::new(r.staging).join(p)).unwrap();
                owners.push((p, meta.uid(), meta.gid()));
            }
            cairn_core::staged::StagedDecision::Apply { by: "test".into() }
        };
        let cancel = CancelToken::new();
        let mut ctx = ToolContext {
            cwd: cwd.path(),
            cancel: &cancel,
            limits: super::util::limits(),
            output: &mut out,
            approve_bypass: &mut bypass,
            review_staged: &mut review,
            elicit: &mut |_, _| cairn_core::elicit::nobody(),
        };
        let req = super::util::request("shell", json!({"command": "mkdir -p d && echo x > d/new.txt && id -u"}));
        shell.execute(&req, &mut ctx).unwrap()
    };
    // SAFETY: geteuid/getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    assert_eq!(receipt.output_summary.lines().next(), Some(uid.to_string().as_str()), "the tool runs as the same user");
    assert_eq!(owners, [("d", uid, gid), ("d/new.txt", uid, gid)]);
    assert_eq!(std::fs::read_to_string(cwd.path().join("d/new.txt")).unwrap(), "x\n");
}
