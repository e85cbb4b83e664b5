//! The OTLP exporter's HTTP client: a blocking `ureq` request (the crate
//! cairn's providers already use), run on the exporter's own thread — the
//! SDK's batch processor and periodic reader call it from their threads,
//! never from a turn's. Counts failed exports for the summary at exit.
//!
//! At exit every request is bounded by the flush's deadline too
//! ([`Ureq::set_deadline`]), so the exit's export can run on the exiting
//! thread itself: no thread to hand it to, and a collector that never
//! answers costs at most the flush bound.
//!
//! Must not: retry (the exporter's policy does) or wait past its timeout
//! or the flush's deadline.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};

/// One agent for traces and metrics.
#[derive(Debug, Clone)]
pub(crate) struct Ureq {
    agent: ureq::Agent,
    failures: Arc<AtomicU64>,
    timeout: Duration,
    /// The flush's deadline at exit: no request waits past it.
    deadline: Arc<Mutex<Option<Instant>>>,
}

impl Ureq {
    pub(crate) fn new(timeout: Duration, failures: Arc<AtomicU64>) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .user_agent(concat!("cairn/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ureq { agent, failures, timeout, deadline: Arc::default() }
    }

    /// From now on, no request waits past `deadline`.
    pub(crate) fn set_deadline(&self, deadline: Instant) {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner()) = Some(deadline);
    }

    fn send(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let mut request = http::Request::from_parts(parts, body.to_vec());
        let deadline = *self.deadline.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err("the flush at exit ran out of time".into());
            }
            request = self.agent.configure_request(request).timeout_global(Some(left.min(self.timeout))).build();
        }
        let mut response = self.agent.run(request)?;
        let status = response.status();
        let body = response.body_mut().with_config().limit(4 * 1024 * 1024).read_to_vec()?;
        let mut out = Response::builder().status(status);
        for (k, v) in response.headers() {
            out = out.header(k, v);
        }
        Ok(out.body(Bytes::from(body))?)
    }
}

#[async_trait::async_trait]
impl HttpClient for Ureq {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let result = self.send(request);
        if !result.as_ref().is_ok_and(|r| r.status().is_success()) {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        result
    }
}
