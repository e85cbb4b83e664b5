//! A person's OAuth login to a streamable-HTTP server (the MCP
//! authorization spec's authorization-code flow) and the tokens it leaves.
//!
//! [`login`] finds the authorization server (protected resource metadata,
//! RFC 9728, then its own, RFC 8414), registers cairn as a public client
//! when it has no client id (RFC 7591), and builds the authorization URL
//! with PKCE S256 and a loopback redirect; the person opens it in a browser
//! and the one redirect that comes back is read here, then the code is
//! exchanged for tokens. rmcp's OAuth client does each step; this module
//! owns the loopback listener and where tokens live.
//!
//! Tokens are kept per server and URL (`NAME-DIGEST.json` in the login
//! directory, cairn's data `mcp-logins/`, which tools never see), written
//! 0600 in a 0700 directory; they never go in session files or logs (errors
//! name the server, never a token). A connection to a server with a saved
//! login ([`saved`]) sends its access token, refreshed by rmcp when it has
//! expired or the server answers 401; a refused refresh says to log in
//! again.
//!
//! It must not decide what a server may do (`tool.rs`) or start servers.

use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::OnceLock;

use rmcp::transport::auth::{
    AuthError, AuthorizationManager, AuthorizationRequest, CredentialStore, StoredCredentials,
};
use sha2::Digest as _;

static LOGIN_DIR: OnceLock<PathBuf> = OnceLock::new();

/// Where logins are kept (cairn's data `mcp-logins/`): set once by the
/// host; without it, no login is read or written.
pub fn set_login_dir(dir: PathBuf) {
    let _ = LOGIN_DIR.set(dir);
}

/// The file holding `name`'s login at `url` (a changed URL is another
/// server: its tokens never go to the new one).
fn file(dir: &Path, name: &str, url: &str) -> PathBuf {
    let digest = sha2::Sha256::digest(url.as_bytes());
    let short: String = format!("{digest:x}").chars().take(16).collect();
    dir.join(format!("{name}-{short}.json"))
}

/// rmcp's credentials in one file, written whole (a temporary file made
/// 0600, then renamed over the old one).
#[derive(Debug, Clone)]
struct FileStore {
    path: PathBuf,
}

type Boxed<'a, T> = Pin<Box<dyn Future<Output = Result<T, AuthError>> + Send + 'a>>;

impl FileStore {
    fn read(&self) -> Result<Option<StoredCredentials>, AuthError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                AuthError::CredentialStoreError(format!(
                    "{} is not a login cairn wrote ({e}); remove it and log in again",
                    self.path.display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(AuthError::CredentialStoreError(format!("cannot read {}: {e}", self.path.display()))),
        }
    }

    fn write(&self, credentials: &StoredCredentials) -> Result<(), AuthError> {
        let fail = |e: std::io::Error| AuthError::CredentialStoreError(format!("{}: {e}", self.path.display()));
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(fail)?;
        let text = serde_json::to_vec(credentials)
            .map_err(|e| AuthError::CredentialStoreError(format!("cannot write the login: {e}")))?;
        let tmp = self.path.with_extension(format!("tmp{}", std::process::id()));
        let mut out =
            std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp).map_err(fail)?;
        out.write_all(&text).and_then(|()| out.sync_all()).map_err(fail)?;
        std::fs::rename(&tmp, &self.path).map_err(fail)
    }
}

impl CredentialStore for FileStore {
    fn load<'a, 'b>(&'a self) -> Boxed<'b, Option<StoredCredentials>>
    where
        'a: 'b,
        Self: 'b,
    {
        Box::pin(async move { self.read() })
    }

    fn save<'a, 'b>(&'a self, credentials: StoredCredentials) -> Boxed<'b, ()>
    where
        'a: 'b,
        Self: 'b,
    {
        Box::pin(async move { self.write(&credentials) })
    }

    fn clear<'a, 'b>(&'a self) -> Boxed<'b, ()>
    where
        'a: 'b,
        Self: 'b,
    {
        Box::pin(async move {
            match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(AuthError::CredentialStoreError(format!("cannot remove {}: {e}", self.path.display())))
                }
                _ => Ok(()),
            }
        })
    }
}

/// Why a login failed, said for a person.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    /// The host set no login directory.
    #[error("cairn has no directory for MCP logins (the host did not set one)")]
    NoDirectory,
    /// A step of the flow failed.
    #[error("{0}")]
    Failed(String),
}

/// The authorization-code flow for server `name` at `url`: `show` is given
/// the URL to open (and should open a browser if one is configured); the
/// redirect is awaited on a loopback port and the tokens saved. Blocks
/// until the person has authorized in the browser (or the flow failed).
pub fn login(name: &str, url: &str, show: &mut dyn FnMut(&str)) -> Result<PathBuf, LoginError> {
    let dir = LOGIN_DIR.get().ok_or(LoginError::NoDirectory)?;
    let path = file(dir, name, url);
    let failed = |what: &str, e: &dyn std::fmt::Display| LoginError::Failed(format!("{what}: {e}"));
    // One loopback port, bound before the URL is made (it names it).
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| failed("cannot listen on a loopback port for the redirect", &e))?;
    let port = listener.local_addr().map_err(|e| failed("the loopback port", &e))?.port();
    let redirect = format!("http://127.0.0.1:{port}/callback");
    let rt = crate::runtime::runtime().map_err(LoginError::Failed)?;
    let store = FileStore { path: path.clone() };
    let mut manager =
        rt.block_on(AuthorizationManager::new(url)).map_err(|e| failed(&format!("OAuth for {url}"), &e))?;
    manager.set_credential_store(store);
    let mut state = rmcp::transport::auth::OAuthState::Unauthorized(manager);
    let request = AuthorizationRequest::new(redirect.clone()).with_client_name("cairn");
    rt.block_on(state.start_authorization(request)).map_err(|e| {
        failed(&format!("{url} did not start an authorization (its metadata, or registering cairn as a client)"), &e)
    })?;
    let address = rt.block_on(state.get_authorization_url()).map_err(|e| failed("the authorization URL", &e))?;
    show(&address);
    let callback = redirected(&listener, port)?;
    rt.block_on(state.handle_callback_url(&callback))
        .map_err(|e| failed(&format!("{url}'s authorization server did not give tokens for the code it sent"), &e))?;
    Ok(path)
}

/// The URL of the first request to `/callback` on `listener` (other
/// requests, a browser's favicon, are answered 404). An `error` in it is
/// the authorization server's refusal.
fn redirected(listener: &std::net::TcpListener, port: u16) -> Result<String, LoginError> {
    loop {
        let (stream, _) =
            listener.accept().map_err(|e| LoginError::Failed(format!("waiting for the redirect: {e}")))?;
        let mut reader = BufReader::new(&stream);
        let mut line = String::new();
        if reader.read_line(&mut line).is_err() {
            continue;
        }
        let target = line.split_whitespace().nth(1).unwrap_or_default().to_owned();
        // The rest of the request's head is read before answering (closing
        // on unread bytes would reset the browser's connection).
        let mut header = String::new();
        while reader.read_line(&mut header).is_ok_and(|n| n > 0) && !header.trim().is_empty() {
            header.clear();
        }
        let mut writer = &stream;
        if !target.starts_with("/callback") {
            let _ = writer.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            continue;
        }
        let refused = target.contains("error=");
        let body: &[u8] = if refused {
            b"cairn: the authorization was refused; see the terminal.\n"
        } else {
            b"cairn: logged in; you can close this tab.\n"
        };
        let _ = write!(
            writer,
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let _ = writer.write_all(body);
        let url = format!("http://127.0.0.1:{port}{target}");
        if refused {
            let query = target.split_once('?').map_or("", |(_, q)| q);
            let said: Vec<&str> = query.split('&').filter(|p| p.starts_with("error")).collect();
            return Err(LoginError::Failed(format!("the authorization server refused: {}", said.join(", "))));
        }
        return Ok(url);
    }
}

/// A manager holding the saved login of `name` at `url`, if there is one;
/// `Err` when it is there but unusable, saying to log in again.
pub(crate) async fn saved(name: &str, url: &str) -> Result<Option<AuthorizationManager>, String> {
    let Some(dir) = LOGIN_DIR.get() else { return Ok(None) };
    let store = FileStore { path: file(dir, name, url) };
    if !store.path.exists() {
        return Ok(None);
    }
    let again = format!("log in again with `cairn mcp login {name}`");
    let mut manager = AuthorizationManager::new(url).await.map_err(|e| format!("OAuth for {url}: {e}"))?;
    manager.set_credential_store(store);
    match manager.initialize_from_store().await {
        Ok(true) => {}
        Ok(false) => return Err(format!("the saved login for {url} no longer fits its authorization server; {again}")),
        Err(e) => return Err(format!("the saved login for {url} cannot be used ({e}); {again}")),
    }
    // The token now, refreshed if it has expired: a refused refresh is
    // said here, before any request, not as a bare 401 later.
    match manager.get_access_token().await {
        Ok(_) => Ok(Some(manager)),
        Err(AuthError::AuthorizationRequired | AuthError::TokenRefreshRejected(_)) => Err(format!(
            "the saved login for {url} has expired and its authorization server refused to renew it; {again}"
        )),
        Err(e) => Err(format!("the saved login for {url} could not be renewed ({e}); try again, or {again}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_login_is_written_owner_only_and_per_url() {
        let dir = tempfile::tempdir().unwrap();
        let logins = dir.path().join("mcp-logins");
        let a = file(&logins, "web", "https://a.example/mcp");
        let b = file(&logins, "web", "https://b.example/mcp");
        assert_ne!(a, b, "another URL is another login");
        let store = FileStore { path: a.clone() };
        store.write(&StoredCredentials::new("client".into(), None, vec![], None)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&a).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&logins).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(store.read().unwrap().unwrap().client_id, "client");
    }
}
