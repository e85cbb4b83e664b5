//! The native participant `http`: outgoing HTTP for the actors whose spawn
//! request declared it (`"http": true`), and for the console and the agent.
//! It owns the request/reply format, its limits and the client; the
//! permission check is the broker's (`Broker::may_use_http`), made when a
//! message is routed, so a message from an actor without the declaration
//! never reaches this module. Transcript candidates are never routed (their
//! output goes to the transcript runner), so they have no HTTP at all.
//!
//! Request (to `http`): `{"type":"request", "url": "http(s)://…",
//! "method"?: "GET" (default) | "POST" | …, "headers"?: {name: value},
//! "body"?: "text"}`. Reply (`reply_to` = the request): `{"type":"response",
//! "status", "headers": {name: value}, "body": "text" (UTF-8, invalid bytes
//! replaced), "truncated": bool}` or `{"type":"http_failed", "reason"}`.
//!
//! Limits: bodies of at most [`BODY_CAP`] each way (a longer response is
//! cut and says so), [`TIMEOUT`] per exchange, at most [`IN_FLIGHT`]
//! exchanges at once (more are refused, not queued: a caller that floods
//! gets told at once). Each exchange runs on its own thread: the broker
//! never waits for the network.

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Map, Value, json};

/// Longest one exchange may take, connection to last byte.
pub const TIMEOUT: Duration = Duration::from_secs(30);
/// Most bytes of a request body, and of a response body kept.
pub const BODY_CAP: usize = 1 << 20;
/// Exchanges running at once.
pub const IN_FLIGHT: usize = 8;

/// A reply to send: (to, reply_to, body).
pub(crate) type Reply = (String, String, Value);

/// Runs the `http` participant until `rx` closes; `send` hands each reply
/// to the broker (from the exchange's thread).
pub(crate) fn run(rx: crate::queue::InboxRx, send: impl Fn(Reply) + Clone + Send + 'static) {
    let agent = |proxy: bool| -> ureq::Agent {
        let mut b = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(TIMEOUT))
            .user_agent(concat!("cairn-actors/", env!("CARGO_PKG_VERSION")));
        if !proxy {
            b = b.proxy(None);
        }
        b.build().into()
    };
    // A proxy from the environment never sees loopback traffic.
    let (proxied, direct) = (agent(true), agent(false));
    let running = Arc::new(AtomicUsize::new(0));
    for m in &rx {
        // Replies (and undeliverable notes) are never answered: no loops.
        if m.reply_to.is_some() {
            continue;
        }
        let parsed = parse(&m.body);
        let reply_to = (m.from.clone(), m.id.clone());
        let request = match parsed {
            Ok(r) if running.fetch_add(1, Ordering::SeqCst) < IN_FLIGHT => r,
            Ok(_) => {
                running.fetch_sub(1, Ordering::SeqCst);
                let reason = format!("{IN_FLIGHT} requests are already in flight; send it again after a reply");
                send((reply_to.0, reply_to.1, failed(&reason)));
                continue;
            }
            Err(reason) => {
                send((reply_to.0, reply_to.1, failed(&reason)));
                continue;
            }
        };
        let agent = if loopback(&request.url) { direct.clone() } else { proxied.clone() };
        let (ours, reply) = (running.clone(), send.clone());
        let spawned = std::thread::Builder::new().name("actor-http".into()).spawn(move || {
            let body = exchange(&agent, &request).unwrap_or_else(|e| failed(&e));
            ours.fetch_sub(1, Ordering::SeqCst);
            reply((reply_to.0, reply_to.1, body));
        });
        if let Err(e) = spawned {
            running.fetch_sub(1, Ordering::SeqCst);
            send((m.from, m.id, failed(&format!("cannot start a thread: {e}"))));
        }
    }
}

/// A checked request.
#[derive(Debug, Clone, PartialEq)]
struct Request {
    method: String,
    url: String,
    headers: Vec<(String, String)>,
    body: Option<String>,
}

fn failed(reason: &str) -> Value {
    json!({"type": "http_failed", "reason": reason})
}

const USAGE: &str = "http understands {\"type\":\"request\", \"url\": \"http(s)://…\", \"method\"?, \"headers\"?: {…}, \"body\"?: \"text\"}";

/// Checks a request body; the error says what was wrong.
fn parse(body: &Value) -> Result<Request, String> {
    if body.get("type").and_then(Value::as_str) != Some("request") {
        return Err(USAGE.into());
    }
    let url = body.get("url").and_then(Value::as_str).ok_or_else(|| format!("no \"url\"; {USAGE}"))?;
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!("{url:?}: only http:// and https:// URLs"));
    }
    let method = match body.get("method") {
        None => "GET".to_owned(),
        Some(Value::String(m)) if !m.is_empty() && m.bytes().all(|b| b.is_ascii_alphabetic()) => m.to_ascii_uppercase(),
        Some(m) => return Err(format!("method {m}: a word such as GET or POST")),
    };
    let mut headers = Vec::new();
    match body.get("headers") {
        None => {}
        Some(Value::Object(h)) => {
            for (k, v) in h {
                let v = v.as_str().ok_or_else(|| format!("header {k:?}: the value must be a string"))?;
                headers.push((k.clone(), v.to_owned()));
            }
        }
        Some(_) => return Err("\"headers\" must be an object of strings".into()),
    }
    let body = match body.get("body") {
        None | Some(Value::Null) => None,
        Some(Value::String(b)) if b.len() <= BODY_CAP => Some(b.clone()),
        Some(Value::String(b)) => return Err(format!("the body is {} bytes; at most {BODY_CAP}", b.len())),
        Some(_) => return Err("\"body\" must be a string".into()),
    };
    Ok(Request { method, url: url.to_owned(), headers, body })
}

/// Whether `url` names this machine (`localhost`, 127.0.0.0/8, `::1`).
fn loopback(url: &str) -> bool {
    let Ok(uri) = url.parse::<ureq::http::Uri>() else { return false };
    let host = uri.host().unwrap_or("").trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Runs one exchange.
fn exchange(agent: &ureq::Agent, r: &Request) -> Result<Value, String> {
    let mut req = ureq::http::Request::builder().method(r.method.as_str()).uri(r.url.as_str());
    for (k, v) in &r.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req.body(r.body.clone().unwrap_or_default().into_bytes()).map_err(|e| format!("bad request: {e}"))?;
    let response = agent.run(req).map_err(|e| format!("{}: {e}", r.url))?;
    let status = response.status().as_u16();
    let mut headers = Map::new();
    for (k, v) in response.headers() {
        headers.insert(k.as_str().to_owned(), Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()));
    }
    let mut bytes = Vec::new();
    let mut reader = response.into_body().into_reader().take(BODY_CAP as u64 + 1);
    reader.read_to_end(&mut bytes).map_err(|e| format!("{}: reading the response: {e}", r.url))?;
    let truncated = bytes.len() > BODY_CAP;
    bytes.truncate(BODY_CAP);
    Ok(json!({
        "type": "response",
        "status": status,
        "headers": headers,
        "body": String::from_utf8_lossy(&bytes),
        "truncated": truncated,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_bypass_the_proxy() {
        for (url, is) in [
            ("http://127.0.0.1:8080/x", true),
            ("http://127.3.4.5/", true),
            ("http://localhost/", true),
            ("http://[::1]:9/", true),
            ("https://example.com/", false),
            ("http://10.0.0.1/", false),
        ] {
            assert_eq!(loopback(url), is, "{url}");
        }
    }

    #[test]
    fn requests_are_checked_before_anything_is_sent() {
        let ok = parse(&json!({"type": "request", "url": "http://127.0.0.1:1/x"})).unwrap();
        assert_eq!((ok.method.as_str(), ok.body), ("GET", None));
        let post = parse(&json!({"type": "request", "url": "https://h/", "method": "post", "headers": {"a": "b"},
            "body": "hi"}))
        .unwrap();
        assert_eq!(
            (post.method.as_str(), post.headers, post.body.as_deref()),
            ("POST", vec![("a".into(), "b".into())], Some("hi"))
        );
        for (bad, says) in [
            (json!({"type": "get", "url": "http://h/"}), "http understands"),
            (json!({"type": "request"}), "no \"url\""),
            (json!({"type": "request", "url": "file:///etc/passwd"}), "only http"),
            (json!({"type": "request", "url": "http://h/", "method": "GE T"}), "a word"),
            (json!({"type": "request", "url": "http://h/", "headers": {"a": 1}}), "must be a string"),
            (json!({"type": "request", "url": "http://h/", "body": "x".repeat(BODY_CAP + 1)}), "at most"),
        ] {
            let e = parse(&bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
