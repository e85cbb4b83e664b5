//! Issue 53.8 through the real `cairn` binary: a streamable-HTTP MCP server
//! that requires OAuth (`oauth_server.py`: the official Python SDK's
//! resource server, with a client-credentials authorization server beside
//! it). Without `[mcp_servers.NAME.oauth]` the server is not started and
//! the note says what to configure (it said only "Auth required" before);
//! with a wrong secret or an unset variable it says which; with the
//! client's id and secret cairn gets a token through rmcp's OAuth client
//! and the call goes through. Also the credentials a configuration names
//! by variable (`env_http_headers`, a stdio server's `env`): a
//! credential-named one reaches the server, a provider key never does.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;

use super::util::Env;
use super::{Killed, by_tool, config, payloads, python_bin, repo, stderr};

/// The server on a free loopback port; counts of what it logged.
struct Server {
    port: u16,
    issued: Arc<AtomicUsize>,
    refused_clients: Arc<AtomicUsize>,
    _child: Killed,
}

/// A Python test server `script` started on a free loopback port, once it
/// said "listening"; each of `counted` is how many of its later stderr
/// lines contained that text.
fn python_server(script: &str, counted: &[&'static str]) -> (u16, Killed, Vec<Arc<AtomicUsize>>) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = Command::new(python_bin().join("python"))
        .arg(repo().join("crates/cairn-cli/tests/mcp").join(script))
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let child = Killed(child);
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(err));
    assert!(lines.by_ref().map_while(Result::ok).any(|l| l.contains("listening")), "{script} did not start");
    // The scripts say "listening" before uvicorn binds the port: on a
    // loaded machine cairn's first request came before the bind and was
    // refused. Ready means a connection is accepted (a deadline to fail
    // with a reason, not a timing assertion).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "{script} said listening but never accepted on port {port}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let counters: Vec<Arc<AtomicUsize>> = counted.iter().map(|_| Arc::new(AtomicUsize::new(0))).collect();
    let (texts, counts) = (counted.to_vec(), counters.clone());
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            for (text, count) in texts.iter().zip(&counts) {
                if line.contains(text) {
                    count.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    });
    (port, child, counters)
}

fn start() -> Server {
    let (port, child, counts) = python_server("oauth_server.py", &["issued a token", "refused a client"]);
    Server { port, issued: counts[0].clone(), refused_clients: counts[1].clone(), _child: child }
}

#[test]
fn an_oauth_server_is_reached_with_client_credentials_and_refusals_say_why() {
    let env = Env::new();
    let server = start();
    let url = format!("http://127.0.0.1:{}/mcp", server.port);
    let call = json!({"text": "", "toolCalls": [{"id": "c1", "name": "mcp__web__whoami", "arguments": {}}]});
    let script = env.script(&[call, json!({"text": "done"})]);
    let s = script.to_str().unwrap();
    let run_with = |vars: &[(&str, &str)]| {
        let mut cmd = env.cairn(&["--script", s, "--allow", "mcp__web__*", "run", "go"]);
        cmd.env_remove("WEB_MCP_SECRET");
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let out = cmd.stdin(Stdio::null()).output().unwrap();
        let done = payloads(&env, "toolCompleted");
        for f in env.session_files() {
            std::fs::remove_file(f).unwrap();
        }
        (out, done)
    };
    let run = |secret: Option<&str>| match secret {
        Some(v) => run_with(&[("WEB_MCP_SECRET", v)]),
        None => run_with(&[]),
    };

    // No OAuth configured: the server's 401 is reported with what to do.
    config(&env, &format!("[mcp_servers.web]\nurl = \"{url}\"\n"));
    let (out, done) = run(None);
    assert!(done.is_empty(), "{done:#?}");
    let said = stderr(&out);
    assert!(said.contains("requires authorization (HTTP 401"), "{said}");
    assert!(said.contains("[mcp_servers.web.oauth]") && said.contains("env_http_headers"), "{said}");

    let oauth = format!(
        "[mcp_servers.web]\nurl = \"{url}\"\n[mcp_servers.web.oauth]\nclient_id = \"cairn-test\"\n\
         client_secret_env = \"WEB_MCP_SECRET\"\nscopes = [\"mcp\"]\n"
    );
    config(&env, &oauth);
    // The secret's variable unset: nothing is asked of the server.
    let (out, done) = run(None);
    assert!(done.is_empty());
    assert!(stderr(&out).contains("$WEB_MCP_SECRET, which is not set"), "{}", stderr(&out));
    assert_eq!(server.refused_clients.load(Ordering::SeqCst), 0);

    // A wrong secret: the authorization server refuses, cairn says so.
    let (out, done) = run(Some("wrong"));
    assert!(done.is_empty());
    assert!(server.refused_clients.load(Ordering::SeqCst) > 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("OAuth client credentials for"), "{}", stderr(&out));
    assert_eq!(server.issued.load(Ordering::SeqCst), 0);

    // cairn's provider key named as the secret: refused, never sent.
    let refused_before = server.refused_clients.load(Ordering::SeqCst);
    config(&env, &oauth.replace("WEB_MCP_SECRET", "OPENAI_API_KEY"));
    let (out, done) = run_with(&[("OPENAI_API_KEY", "sk-the-provider-key-0123456789")]);
    assert!(done.is_empty());
    assert!(stderr(&out).contains("holds one of cairn's provider keys"), "{}", stderr(&out));
    assert_eq!(
        server.refused_clients.load(Ordering::SeqCst),
        refused_before,
        "the key reached the authorization server"
    );
    config(&env, &oauth);

    // The right secret: a token is issued and the call goes through.
    let (out, done) = run(Some("m2m-s3cret"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(server.issued.load(Ordering::SeqCst) > 0, "{}", stderr(&out));
    let receipt = &by_tool(&done, "mcp__web__whoami")["receipt"];
    assert!(receipt["outputSummary"].as_str().unwrap().contains("client-credentials grant"), "{receipt:#}");
}

/// A token you hold, in a credential-named variable (`*TOKEN*`, which cairn
/// takes out of its own environment at startup): `env_http_headers` found
/// it "not set" before; now it is read from where cairn keeps it. A
/// provider's key variable named there is refused, never sent.
#[test]
fn a_token_in_a_credential_named_variable_reaches_the_server_and_provider_keys_do_not() {
    let env = Env::new();
    let (port, _server, counts) = python_server("headers_server.py", &["refused a request"]);
    let refused = &counts[0];
    let call =
        json!({"text": "", "toolCalls": [{"id": "c1", "name": "mcp__web__hello", "arguments": {"name": "cairn"}}]});
    let script = env.script(&[call, json!({"text": "done"})]);
    let s = script.to_str().unwrap();
    let with_var = |var: &str| {
        format!(
            "[mcp_servers.web]\nurl = \"http://127.0.0.1:{port}/mcp\"\nhttp_headers = {{ X-Tenant = \"acme\" }}\n\
             env_http_headers = {{ Authorization = \"{var}\" }}\n"
        )
    };

    // A provider's key variable: refused before anything is sent.
    config(&env, &with_var("OPENAI_API_KEY"));
    let out = env
        .cairn(&["--script", s, "--allow", "mcp__web__*", "run", "go"])
        .env("OPENAI_API_KEY", "Bearer s3cret")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(stderr(&out).contains("holds one of cairn's provider keys"), "{}", stderr(&out));
    assert!(payloads(&env, "toolCompleted").is_empty());
    assert_eq!(refused.load(Ordering::SeqCst), 0, "the key was sent");
    std::fs::remove_file(&env.session_files()[0]).unwrap();

    config(&env, &with_var("WEB_MCP_TOKEN"));
    let out = env
        .cairn(&["--script", s, "--allow", "mcp__web__*", "run", "go"])
        .env("WEB_MCP_TOKEN", "Bearer s3cret")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let done = payloads(&env, "toolCompleted");
    let receipt = &by_tool(&done, "mcp__web__hello")["receipt"];
    assert!(receipt["outputSummary"].as_str().unwrap().contains("you were let in"), "{receipt:#}");
}

/// The README's `env = ["GITHUB_TOKEN"]` for a stdio server: a
/// credential-named variable is taken out of cairn's environment at
/// startup, and was silently not passed; now the server gets it (the
/// registry's server-everything shows its environment with `get-env`). A
/// provider's key variable named there still keeps the server from
/// starting.
#[test]
fn a_stdio_server_gets_the_credential_named_variables_its_env_names() {
    let env = Env::new();
    let node = super::node_prefix();
    let server = |var: &str| {
        format!(
            "[mcp_servers.every]\ncommand = \"{}/node_modules/.bin/mcp-server-everything\"\nenv = [\"{var}\"]\n",
            node.display()
        )
    };
    let call = json!({"text": "", "toolCalls": [{"id": "c1", "name": "mcp__every__get-env", "arguments": {}}]});
    let script = env.script(&[call, json!({"text": "done"})]);
    let s = script.to_str().unwrap();
    config(&env, &server("GITHUB_TOKEN"));
    let out = env
        .cairn(&["--script", s, "--allow", "mcp__every__*", "run", "go"])
        .env("GITHUB_TOKEN", "ghp_passed-on-by-name-1234")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let done = payloads(&env, "toolCompleted");
    let shown = by_tool(&done, "mcp__every__get-env")["receipt"]["outputSummary"].as_str().unwrap().to_owned();
    assert!(shown.contains("ghp_passed-on-by-name-1234"), "{shown}");
    std::fs::remove_file(&env.session_files()[0]).unwrap();

    config(&env, &server("OPENAI_API_KEY"));
    let out = env
        .cairn(&["--script", s, "--allow", "mcp__every__*", "run", "go"])
        .env("OPENAI_API_KEY", "sk-never-to-a-server-1234")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(stderr(&out).contains("one of cairn's provider keys"), "{}", stderr(&out));
    assert!(payloads(&env, "toolCompleted").is_empty());
}

/// One HTTP/1.1 request to a loopback `url` (`http://127.0.0.1:PORT/…`):
/// its status and the value of its `Location` header, if any. The test's
/// "browser" (it follows no redirect by itself).
fn http(method: &str, url: &str) -> (u16, Option<String>) {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").unwrap_or_else(|| panic!("not a loopback http URL: {url}"));
    let (host, path) = rest.split_once('/').map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    let request = format!("{method} {path} HTTP/1.1\r\nhost: {host}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let location = answer.lines().take_while(|l| !l.is_empty()).find_map(|l| {
        l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("location")).map(|(_, v)| v.trim().to_owned())
    });
    (status, location)
}

/// The saved login files under cairn's home.
fn logins(env: &Env) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![env.home.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.parent().is_some_and(|p| p.ends_with("mcp-logins")) {
                found.push(path);
            }
        }
    }
    found
}

/// Make the saved login's access token look long expired (its receipt
/// time moved to the epoch): the next run must renew it.
fn expire(login: &std::path::Path) {
    let mut saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(login).unwrap()).unwrap();
    saved["token_received_at"] = json!(1);
    std::fs::write(login, saved.to_string()).unwrap();
}

/// 53.8: a server that wants a person's OAuth login (the MCP authorization
/// spec: protected resource metadata, authorization server metadata,
/// dynamic client registration, PKCE S256, a loopback redirect; the
/// official Python SDK's authorization server). Without a login the note
/// says to run `cairn mcp login`; the login prints the URL, the "browser"
/// (this test's HTTP client) follows it, and the tokens are kept 0600 and
/// never in a session file or cairn's output; an expired access token is
/// renewed with the refresh token, a 401 too; a refused renewal says to
/// log in again.
#[test]
fn cairn_mcp_login_keeps_a_token_that_is_renewed_and_a_refused_renewal_says_to_log_in_again() {
    let env = Env::new();
    let (port, _child, counts) = python_server(
        "oauth_code_server.py",
        &["registered a client none", "issued a token for a code", "refreshed a token", "refused a refresh token"],
    );
    let [registered, issued, refreshed, refused] = [&counts[0], &counts[1], &counts[2], &counts[3]];
    let url = format!("http://127.0.0.1:{port}/mcp");
    config(&env, &format!("[mcp_servers.web]\nurl = \"{url}\"\n"));
    let call = json!({"text": "", "toolCalls": [{"id": "c1", "name": "mcp__web__whoami", "arguments": {}}]});
    let script = env.script(&[call, json!({"text": "done"})]);
    let run = || {
        let out = env
            .cairn(&["--script", script.to_str().unwrap(), "--allow", "mcp__web__*", "run", "go"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let done = payloads(&env, "toolCompleted");
        let sessions: Vec<String> = env.session_files().iter().map(|f| std::fs::read_to_string(f).unwrap()).collect();
        for f in env.session_files() {
            std::fs::remove_file(f).unwrap();
        }
        (out, done, sessions.concat())
    };
    let answered = |done: &[serde_json::Value]| {
        by_tool(done, "mcp__web__whoami")["receipt"]["outputSummary"]
            .as_str()
            .unwrap()
            .contains("authorization-code grant")
    };

    // Not logged in: the note says how to.
    let (out, done, _) = run();
    assert!(done.is_empty(), "{done:#?}");
    assert!(stderr(&out).contains("log in with `cairn mcp login web`"), "{}", stderr(&out));

    // The login: the URL on stdout, the browser's round trip, the tokens kept.
    let mut login = env.cairn(&["mcp", "login", "web"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(login.stdout.take().unwrap()));
    let address = lines.next().unwrap().unwrap();
    assert!(address.starts_with(&format!("http://127.0.0.1:{port}/authorize?")), "{address}");
    assert!(address.contains("code_challenge_method=S256") && address.contains("code_challenge="), "PKCE: {address}");
    assert!(address.contains("redirect_uri=http%3A%2F%2F127.0.0.1%3A"), "a loopback redirect: {address}");
    let (status, back) = http("GET", &address);
    assert_eq!(status, 302, "the authorization server approves and redirects");
    let back = back.unwrap();
    assert!(back.contains("/callback?") && back.contains("code="), "{back}");
    assert_eq!(http("GET", &back).0, 200, "cairn's loopback listener takes the redirect");
    let said: Vec<String> = lines.map_while(Result::ok).collect();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut login.stderr.take().unwrap(), &mut err).unwrap();
    assert!(login.wait().unwrap().success(), "{said:?} {err}");
    assert!(said.concat().contains("logged in to web"), "{said:?}");
    assert_eq!(registered.load(Ordering::SeqCst), 1, "cairn registered itself as a public client (RFC 7591)");
    assert_eq!(issued.load(Ordering::SeqCst), 1);
    let kept = logins(&env);
    assert_eq!(kept.len(), 1, "{kept:?}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&kept[0]).unwrap().permissions().mode() & 0o777, 0o600);
    let token = |file: &std::path::Path| {
        let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        saved["token_response"]["access_token"].as_str().unwrap().to_owned()
    };
    let first = token(&kept[0]);
    assert!(!said.concat().contains(&first) && !err.contains(&first), "the token was printed");

    // Logged in: the call goes through with the token, which no session file holds.
    let (out, done, sessions) = run();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(answered(&done), "{done:#?}");
    assert!(!sessions.contains(&first) && !stderr(&out).contains(&first), "the token reached a log");
    assert_eq!(refreshed.load(Ordering::SeqCst), 0);

    // The access token expired: renewed with the refresh token.
    expire(&kept[0]);
    let (out, done, _) = run();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(answered(&done), "{done:#?}");
    assert_eq!(refreshed.load(Ordering::SeqCst), 1, "{}", stderr(&out));
    assert_ne!(token(&kept[0]), first, "the renewed token is kept");

    // The server no longer takes the token (401): renewed and retried.
    assert_eq!(http("POST", &format!("http://127.0.0.1:{port}/test/forget-access")).0, 200);
    let (out, done, _) = run();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(answered(&done), "{done:#?}");
    assert_eq!(refreshed.load(Ordering::SeqCst), 2, "{}", stderr(&out));

    // The authorization server refuses to renew: log in again, it says.
    assert_eq!(http("POST", &format!("http://127.0.0.1:{port}/test/refuse-refresh")).0, 200);
    expire(&kept[0]);
    let (out, done, _) = run();
    assert!(done.is_empty(), "{done:#?}");
    assert!(refused.load(Ordering::SeqCst) > 0, "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("refused to renew it; log in again with `cairn mcp login web`"), "{said}");
}
