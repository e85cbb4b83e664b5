//! Who may drive `cairn serve` and `cairn toolsrv` (issue 25): the peer
//! rule of `cairn_9p::peer` against real processes. The servers are the
//! real `cairn` binary; the attackers are `tests/peers/client9p.py` (a raw
//! 9P client) run as another uid (`setpriv --reuid 65534`), under
//! NoNewPrivs + a seccomp filter, in another PID or user namespace
//! (`unshare`), and as the `shell` tool of a session of the server itself.
//! Each attack has a same-uid control showing the same client succeeds.
//!
//! These tests need root (to run a client as uid 65534 and to create
//! namespaces) and `/usr/bin/python3`; without them they fail saying so.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_debug_implementations, unreachable_pub)]

use crate::util;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cairn_9p::Dial;
use cairn_9p::client::Conn;
use serde_json::json;
use util::Env;

const PYTHON: &str = "/usr/bin/python3";
/// How the client prints the server's refusal.
const REFUSED: &str = "rerror cairn refuses this connection: ";
const NOBODY: &[&str] = &["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"];

/// A running server and the addresses it printed (stderr kept for the
/// refusal lines).
struct Server {
    child: Child,
    addresses: Vec<String>,
}

impl Server {
    fn start(env: &Env, command: &str, listen: &[&str]) -> Self {
        let mut args = vec![command];
        for l in listen {
            args.extend(["--listen", l]);
        }
        let mut child = env.cairn(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut addresses = Vec::new();
        while addresses.len() < listen.len() {
            let mut line = String::new();
            if out.read_line(&mut line).unwrap() == 0 {
                let mut err = String::new();
                child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
                panic!("cairn {command} printed no address; stderr: {err}");
            }
            addresses.push(line.trim().to_owned());
        }
        Self { child, addresses }
    }

    /// Stop it; its stderr.
    fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut err = String::new();
        self.child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        err
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn need_root() {
    // /proc/self is owned by the effective uid.
    let euid = std::fs::metadata("/proc/self").unwrap().uid();
    assert_eq!(euid, 0, "this test runs clients as uid 65534 and in new namespaces: it needs root");
    assert!(Path::new(PYTHON).exists(), "this test's 9P client needs {PYTHON}");
}

/// The client script in a directory everyone may enter and read.
fn client_script() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("client9p.py");
    std::fs::write(&path, include_str!("peers/client9p.py")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    (dir, path)
}

/// Run the client under `wrapper` (e.g. setpriv …); its one line.
fn client(wrapper: &[&str], script: &Path, args: &[&str]) -> String {
    let mut argv: Vec<&str> = wrapper.to_vec();
    argv.push(PYTHON);
    argv.push(script.to_str().unwrap());
    argv.extend(args);
    let out = Command::new(argv[0]).args(&argv[1..]).current_dir("/").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        out.status.success() && !stdout.is_empty(),
        "{argv:?} failed: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A socket directory under the test's home: `loosened` makes the path
/// and the directory enterable by everyone (the socket itself is opened
/// after the server starts).
fn socket_dir(env: &Env, loosened: bool) -> PathBuf {
    let dir = env.home.join("sock");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    if loosened {
        // The temp root (0700) and the home above the socket directory.
        for d in [env.home.parent().unwrap(), env.home.as_path()] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    dir
}

/// Open the socket directory and the socket to everyone (after the server
/// bound it: it refuses to bind in an open directory).
fn loosen(socket: &Path) {
    std::fs::set_permissions(socket.parent().unwrap(), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o777)).unwrap();
}

fn unix_path(address: &str) -> PathBuf {
    PathBuf::from(address.strip_prefix("unix!").unwrap())
}

fn idx(address: &str) -> String {
    let mut c = Conn::dial(&Dial::parse(address).unwrap()).unwrap();
    c.read_text("s/idx").unwrap()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn session_spec(env: &Env) -> String {
    let script = env.script(&[json!({"text": "hi"})]);
    format!("cwd=/ provider=scripted script={} yes=1", script.display())
}

/// Issue 25: uid 65534 created a `yes=1` session on root's `cairn serve`
/// over TCP loopback. Refused now, on TCP and on a Unix socket whose
/// directory and mode were opened to everyone; the same uid still works.
#[test]
fn another_uid_cannot_create_a_session_over_tcp_or_a_loosened_unix_socket() {
    need_root();
    let env = Env::new();
    let (_keep, script) = client_script();
    let dir = socket_dir(&env, true);
    let sock = format!("unix!{}", dir.join("cairn.sock").display());
    let served = Server::start(&env, "serve", &[&sock, "tcp!127.0.0.1!0"]);
    loosen(&unix_path(&served.addresses[0]));
    let spec = session_spec(&env);
    for address in &served.addresses {
        let got = client(NOBODY, &script, &[address, "new", &spec]);
        assert!(got.starts_with(REFUSED) && got.contains("uid 65534"), "{address}: uid 65534 got: {got}");
        assert_eq!(idx(address), "", "{address}: a refused peer created a session");
    }
    assert!(env.session_files().is_empty(), "{:?}", env.session_files());
    // The same client as the server's own uid works on both.
    for address in &served.addresses {
        let got = client(&[], &script, &[address, "new", &spec]);
        assert!(got.starts_with("ok ") && got.len() > 3, "{address}: same uid got: {got}");
    }
    assert_eq!(idx(&served.addresses[1]).lines().count(), 2);
    let log = served.stop();
    assert!(log.contains("cairn: refused a connection on") && log.contains("uid 65534"), "{log}");
}

/// `--listen-insecure` opens the server to peers from other hosts, not to
/// other users of this one: a local peer of another uid reaching the
/// non-loopback listener is still refused.
#[test]
fn an_insecure_listener_still_refuses_a_local_peer_of_another_uid() {
    need_root();
    let env = Env::new();
    let (_keep, script) = client_script();
    let out = env
        .cairn(&["serve", "--listen-insecure", "--listen", "tcp!0.0.0.0!0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = out;
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let served = Server { child, addresses: vec![line.trim().to_owned()] };
    let port = served.addresses[0].rsplit('!').next().unwrap().to_owned();
    let spec = session_spec(&env);
    for host in ["127.0.0.1", "0.0.0.0"] {
        let address = format!("tcp!{host}!{port}");
        let got = client(NOBODY, &script, &[&address, "new", &spec]);
        assert!(got.starts_with(REFUSED) && got.contains("uid 65534"), "{address}: uid 65534 got: {got}");
        let got = client(&[], &script, &[&address, "attach"]);
        assert_eq!(got, "ok attached", "{address}: the same uid");
    }
    assert!(env.session_files().is_empty(), "{:?}", env.session_files());
}

/// Issue 25: uid 65534 read a 0600 root file through `cairn toolsrv` on
/// TCP. Refused now (TCP and a loosened Unix socket); the same uid reads it.
#[test]
fn another_uid_cannot_read_a_private_file_through_toolsrv() {
    need_root();
    let env = Env::new();
    let (_keep, script) = client_script();
    let secret = env.cwd.join("secret.txt");
    std::fs::write(&secret, "root only 7f3a\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let dir = socket_dir(&env, true);
    let sock = format!("unix!{}", dir.join("toolsrv.sock").display());
    let served = Server::start(&env, "toolsrv", &[&sock, "tcp!127.0.0.1!0"]);
    loosen(&unix_path(&served.addresses[0]));
    let job = |invocation: &str| {
        json!({"tool": "read_file", "arguments": {"path": "secret.txt"}, "invocation": invocation,
               "session": "peers", "cwd": env.cwd.display().to_string()})
        .to_string()
    };
    for (i, address) in served.addresses.iter().enumerate() {
        let got = client(NOBODY, &script, &[address, "job", &job(&format!("nobody-{i}"))]);
        assert!(got.starts_with(REFUSED) && got.contains("uid 65534"), "{address}: uid 65534 got: {got}");
        assert!(!got.contains("7f3a"), "{got}");
    }
    let jobs = env.home.join("toolsrv").join("jobs");
    let count = std::fs::read_dir(&jobs).map(|d| d.count()).unwrap_or(0);
    assert_eq!(count, 0, "a refused peer created a job");
    for (i, address) in served.addresses.iter().enumerate() {
        let got = client(&[], &script, &[address, "job", &job(&format!("root-{i}"))]);
        assert!(got.starts_with("ok ") && got.contains("root only 7f3a"), "{address}: same uid got: {got}");
    }
}

/// A process marked as cairn marks its tools (NoNewPrivs + a seccomp
/// filter), or in another PID or user namespace, is refused even as the
/// same uid; NoNewPrivs alone is accepted.
#[test]
fn tool_like_peers_of_the_same_uid_are_refused() {
    need_root();
    let env = Env::new();
    let (_keep, script) = client_script();
    let dir = socket_dir(&env, false);
    let sock = format!("unix!{}", dir.join("cairn.sock").display());
    let served = Server::start(&env, "serve", &[&sock, "tcp!127.0.0.1!0"]);
    let spec = session_spec(&env);
    let cases: [(&str, &[&str], &[&str], &str); 3] = [
        ("NoNewPrivs + seccomp", &[], &["--seccomp"], "NoNewPrivs and a seccomp filter"),
        ("own PID namespace", &["unshare", "--pid", "--fork"], &[], "another PID namespace"),
        ("own user namespace", &["unshare", "--user", "--map-root-user"], &[], "another user namespace"),
    ];
    for (what, wrapper, flags, expected) in cases {
        for address in &served.addresses {
            let mut args: Vec<&str> = flags.to_vec();
            args.extend([address.as_str(), "new", &spec]);
            let got = client(wrapper, &script, &args);
            assert!(got.starts_with(REFUSED) && got.contains(expected), "{what} on {address}: {got}");
        }
    }
    assert_eq!(idx(&served.addresses[1]), "", "a refused peer created a session");
    // NoNewPrivs alone (setpriv, many shells) is no tool mark.
    for address in &served.addresses {
        let got = client(&["setpriv", "--no-new-privs"], &script, &[address, "attach"]);
        assert_eq!(got, "ok attached", "NoNewPrivs alone on {address}");
    }
}

/// Issue 25's attack itself: the `shell` tool of a session of `cairn
/// serve` connects to that server's socket and asks for a `yes=1` session.
/// The socket is deliberately in the session's own working tree, outside
/// cairn's home (which tools may not see) and outside /tmp (which may be
/// private to a tool), so the tool can reach the path and only the peer
/// check stands between it and the server. Should the path ever become
/// unreachable, the client's error fails this test rather than passing it.
#[test]
fn a_shell_tool_cannot_drive_the_server_of_its_own_session() {
    need_root();
    let env = Env::new();
    std::fs::write(env.home.join("config.toml"), "[tools]\nstaged = false\n").unwrap();
    std::fs::write(env.cwd.join("client9p.py"), include_str!("peers/client9p.py")).unwrap();
    let dir = env.cwd.join("sock");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let sock = format!("unix!{}", dir.join("cairn.sock").display());
    let served = Server::start(&env, "serve", &[&sock]);
    let address = &served.addresses[0];
    let evil = format!("cwd=/ provider=scripted script={} yes=1", env.home.join("script.jsonl").display());
    let command = format!("{PYTHON} client9p.py '{address}' new '{evil}' > attack.txt 2>&1");
    let script = env.script(&[
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "shell", "arguments": {"command": command}}]}),
        json!({"text": "done"}),
    ]);
    let mut c = Conn::dial(&Dial::parse(address).unwrap()).unwrap();
    let id = c
        .create_session(&format!("cwd={} provider=scripted script={} yes=1", env.cwd.display(), script.display()))
        .unwrap();
    c.write_file(&format!("s/{id}/prompt"), b"go").unwrap();
    // The call may wait for a person (it runs a file of the tree): say yes,
    // as a person who trusts the tool would.
    let approvals = format!("s/{id}/approvals");
    wait_for("the turn to end", || {
        for pending in c.list(&approvals).unwrap() {
            let _ = c.write_file(&format!("{approvals}/{}", pending.name), b"y");
        }
        c.read_text(&format!("s/{id}/chat")).unwrap().contains("assistant: done")
    });
    let got = std::fs::read_to_string(env.cwd.join("attack.txt")).unwrap();
    // Refused for a tool's marks (NoNewPrivs + seccomp first; its own PID
    // namespace would refuse it too).
    let marked = got.contains("NoNewPrivs and a seccomp filter") || got.contains("another PID namespace");
    assert!(got.starts_with(REFUSED) && marked, "the tool got: {got}");
    let sessions = c.read_text("s/idx").unwrap();
    assert_eq!(sessions.lines().count(), 1, "the tool created a session: {sessions}");
}

/// The rule for a server that is not root (uid 65534 here), where it
/// cannot read the namespace links or fd table of a non-dumpable process
/// (every cairn process is one): the same uid is served, non-dumpable or
/// not; root, a tool-like process of the same uid (dumpable or not, Unix
/// and TCP), one in a PID namespace and one in a user namespace that root
/// owns are refused, through the `NSpid` and `uid_map` fallbacks.
#[test]
fn a_non_root_server_serves_its_own_uid_only_and_still_refuses_tool_like_peers() {
    need_root();
    let (_keep, script) = client_script();
    // A home and a copy of the binary uid 65534 can use (/root is 0700).
    let top = tempfile::tempdir().unwrap();
    std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = top.path().join("cairn");
    std::fs::copy(assert_cmd::cargo::cargo_bin("cairn"), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = top.path().join("home");
    let sock_dir = home.join("sock");
    std::fs::create_dir_all(&sock_dir).unwrap();
    std::fs::set_permissions(&sock_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    for d in [&home, &sock_dir] {
        std::os::unix::fs::chown(d, Some(65534), Some(65534)).unwrap();
    }
    let sock = format!("unix!{}", sock_dir.join("cairn.sock").display());
    let mut command = Command::new(NOBODY[0]);
    command
        .args(&NOBODY[1..])
        .arg(&bin)
        .args(["serve", "--listen", &sock, "--listen", "tcp!127.0.0.1!0"])
        .current_dir(&home)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.join("fakehome"))
        .env("CAIRN_HOME", &home)
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut addresses = Vec::new();
    while addresses.len() < 2 {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            let mut err = String::new();
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            panic!("cairn serve as uid 65534 printed no address; stderr: {err}");
        }
        addresses.push(line.trim().to_owned());
    }
    let served = Server { child, addresses };
    let script_file = home.join("script.jsonl");
    std::fs::write(&script_file, "{\"text\": \"hi\"}\n").unwrap();
    let spec = format!("cwd={} provider=scripted script={} yes=1", home.display(), script_file.display());

    // Served: the same uid, dumpable or not (then only status and uid_map
    // are readable to this server).
    let mut sessions = 0;
    for flags in [&[][..], &["--nondumpable"]] {
        for address in &served.addresses {
            let mut args: Vec<&str> = flags.to_vec();
            args.extend([address.as_str(), "new", &spec]);
            let got = client(NOBODY, &script, &args);
            assert!(got.starts_with("ok "), "uid 65534 {flags:?} on {address}: {got}");
            sessions += 1;
        }
    }
    // Refused.
    let pidns_as_nobody: Vec<&str> = ["unshare", "--pid", "--fork"].iter().chain(NOBODY).copied().collect();
    let cases: [(&str, &[&str], &[&str], &str); 5] = [
        ("root", &[], &[], "uid 0"),
        ("tool-like", NOBODY, &["--seccomp"], "NoNewPrivs and a seccomp filter"),
        ("tool-like, non-dumpable", NOBODY, &["--seccomp", "--nondumpable"], "NoNewPrivs and a seccomp filter"),
        ("PID namespace, non-dumpable", &pidns_as_nobody, &["--nondumpable"], "another PID namespace"),
        (
            "user namespace of root, non-dumpable",
            &[],
            &["--userns-of-root-as-nobody", "--nondumpable"],
            "another user namespace",
        ),
    ];
    for (what, wrapper, flags, expected) in cases {
        for address in &served.addresses {
            let mut args: Vec<&str> = flags.to_vec();
            args.extend([address.as_str(), "new", &spec]);
            let got = client(wrapper, &script, &args);
            assert!(got.starts_with(REFUSED) && got.contains(expected), "{what} on {address}: {got}");
        }
    }
    let idx = client(NOBODY, &script, &[&served.addresses[0], "read", "s/idx"]);
    assert_eq!(idx.matches(" idle ").count(), sessions, "only the accepted peers created sessions: {idx}");
}
