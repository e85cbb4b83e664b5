//! OpenTelemetry traces and metrics of cairn's turns, with the GenAI
//! semantic conventions, for every face: cairn-host's `Equipment::run` (the
//! one place a turn is started) hands each of the turn's events to a
//! [`TurnTrace`], which turns them into `invoke_agent`, `chat` and
//! `execute_tool` spans and the conventions' metrics. Opt-in: [`init`]
//! starts an exporter only when an endpoint is configured (`config.rs`);
//! otherwise [`TurnTrace::start`] is `None` and a turn pays one atomic load.
//!
//! Owns: the exporter (OTLP http/protobuf over ureq; a bounded span queue
//! and one exporter thread started with the first span, `export.rs`), the
//! bounded flush at exit (run on the exiting thread), and the ids that
//! keep a session's trace across processes (`ids.rs`).
//!
//! Must not: block, slow or fail a turn (a full queue drops, a dead
//! collector costs the exporter's thread only), export message content
//! unless asked (`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`), or
//! export a provider key (content goes through the host's scrubber).

mod config;
mod export;
mod http;
mod ids;
mod turn;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Gauge, Histogram, MeterProvider as _, UpDownCounter};
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{ManualReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanExporter as _, Tracer};

pub use config::{DEFAULT_ENDPOINT, DEFAULT_METRICS_INTERVAL, Plan, Refused, TelemetryConfig, resolve};

pub use ids::{call_span, session_trace, spawn_span};
pub use turn::TurnTrace;

/// Rewrites exported content so no secret the host holds leaves (the
/// host's scrubber of provider keys).
pub type Scrub = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// What one provider attempt cost in US dollars, at the prices the host
/// shows the person (`None`: the model has no known price, and no cost is
/// exported for it, rather than a 0 that would read as free).
pub type Price = Arc<dyn Fn(&cairn_core::provider::AttemptUsage) -> Option<f64> + Send + Sync>;

/// What the host hands [`init`]: its scrubber of secrets and its prices.
#[derive(Clone)]
pub struct Hooks {
    /// Cleans exported content of the host's secrets.
    pub scrub: Scrub,
    /// Prices each attempt for `cairn.cost`.
    pub price: Price,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks").finish_non_exhaustive()
    }
}

impl Hooks {
    /// Content passed as it is and nothing priced (tests, a host with no
    /// secrets nor prices).
    pub fn plain() -> Self {
        Hooks { scrub: Arc::new(|s: &str| s.to_owned()), price: Arc::new(|_| None) }
    }
}

/// The process's telemetry, once [`init`] ran with a plan.
struct Telemetry {
    tracer: Tracer,
    /// Kept so the providers live as long as the process.
    _tracer_provider: SdkTracerProvider,
    _meter_provider: SdkMeterProvider,
    exporter: Arc<export::Shared>,
    instruments: Instruments,
    capture: bool,
    scrub: Scrub,
    price: Price,
    /// The `traceparent` the process was started under.
    parent: Option<SpanContext>,
    failures: Arc<AtomicU64>,
    flush_timeout: Duration,
}

/// The conventions' metrics and cairn's own.
struct Instruments {
    tokens: Histogram<u64>,
    duration: Histogram<f64>,
    tool_calls: Counter<u64>,
    approvals_waiting: UpDownCounter<i64>,
    turns: Counter<u64>,
    cost: Counter<f64>,
    claims: Counter<u64>,
    takeovers: Counter<u64>,
    lease_losses: Counter<u64>,
    sessions_held: Gauge<u64>,
    queue_depth: Gauge<u64>,
}

static GLOBAL: OnceLock<Telemetry> = OnceLock::new();

/// Traceparents handed in by a client for a session (ACP/MCP `_meta`).
static ADOPTED: Mutex<Option<HashMap<String, SpanContext>>> = Mutex::new(None);

fn global() -> Option<&'static Telemetry> {
    GLOBAL.get()
}

/// Whether this process exports telemetry.
pub fn enabled() -> bool {
    global().is_some()
}

/// Parse a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`).
pub fn parse_traceparent(text: &str) -> Option<SpanContext> {
    let mut parts = text.trim().split('-');
    let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version.len() != 2 || version == "ff" || trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
        return None;
    }
    let trace = TraceId::from_hex(trace).ok()?;
    let span = SpanId::from_hex(span).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let sc = SpanContext::new(trace, span, TraceFlags::new(flags), true, TraceState::default());
    sc.is_valid().then_some(sc)
}

/// The W3C `traceparent` of a span context.
pub fn traceparent(sc: &SpanContext) -> String {
    format!("00-{}-{}-{:02x}", sc.trace_id(), sc.span_id(), sc.trace_flags().to_u8())
}

/// The W3C `traceparent` of the `execute_tool` span of `invocation` in
/// `session`, for the tool's environment; `None` when telemetry is off.
pub fn call_traceparent(session: &str, invocation: &str) -> Option<String> {
    let t = global()?;
    let sc = SpanContext::new(
        turn::trace_of(t, session),
        ids::call_span(session, invocation),
        TraceFlags::SAMPLED,
        false,
        TraceState::default(),
    );
    Some(traceparent(&sc))
}

/// Run `session`'s next turns under `traceparent`, a client's
/// `_meta.traceparent` on the request that starts them (`None`, or text
/// that is not a valid traceparent: the session's own trace again).
/// Nothing when telemetry is off.
pub fn adopt_traceparent(session: &str, traceparent: Option<&str>) {
    if !enabled() {
        return;
    }
    let mut map = ADOPTED.lock().unwrap_or_else(|p| p.into_inner());
    let map = map.get_or_insert_with(HashMap::new);
    match traceparent.and_then(parse_traceparent) {
        Some(sc) => map.insert(session.to_owned(), sc),
        None => map.remove(session),
    };
}

fn adopted(session: &str) -> Option<SpanContext> {
    ADOPTED.lock().unwrap_or_else(|p| p.into_inner()).as_ref()?.get(session).cloned()
}

/// The register a session keeps the traceparent it was run under in, so a
/// resume (another process, another worker) continues under it.
pub const PARENT_REGISTER: (&str, &str) = ("fact.telemetry", "traceparent");

/// The traceparent `session`'s turns run under, reconciled with the one
/// its log kept (`kept`, the [`PARENT_REGISTER`] value): one handed in now
/// (a client's `_meta`, the process's `TRACEPARENT`) wins and is returned
/// for the host to keep when it differs from `kept`; with none handed in,
/// the kept one is adopted for this process. `None`: nothing to write
/// (also when telemetry is off).
pub fn keep_parent(session: &str, kept: Option<&str>) -> Option<String> {
    let t = global()?;
    let given = adopted(session).or_else(|| t.parent.clone()).map(|sc| traceparent(&sc));
    match given {
        Some(given) => (kept != Some(given.as_str())).then_some(given),
        None => {
            if let Some(kept) = kept.filter(|k| parse_traceparent(k).is_some()) {
                adopt_traceparent(session, Some(kept));
            }
            None
        }
    }
}

/// A span of its own for an operation on a session outside a turn (`undo`,
/// `redo`), in the session's trace; ended by [`Operation::finish`] or when
/// dropped. Nothing when telemetry is off.
pub struct Operation {
    span: Option<opentelemetry_sdk::trace::Span>,
}

impl std::fmt::Debug for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Operation").field("on", &self.span.is_some()).finish()
    }
}

impl Operation {
    /// Start the span `name` for `session`.
    pub fn start(session: &str, name: &str) -> Operation {
        use opentelemetry::trace::Span as _;
        let Some(t) = global() else { return Operation { span: None } };
        let attrs = vec![
            opentelemetry::KeyValue::new("gen_ai.conversation.id", session.to_owned()),
            opentelemetry::KeyValue::new("cairn.operation", name.to_owned()),
        ];
        let mut span = session_span(t, session, name.to_owned(), attrs);
        span.add_event("started", vec![]);
        Operation { span: Some(span) }
    }

    /// End it with what came of it (`outcome`: done, refused, nothing,
    /// dryRun) or the error.
    pub fn finish(mut self, result: Result<&str, &str>) {
        use opentelemetry::trace::{Span as _, Status};
        let Some(mut span) = self.span.take() else { return };
        match result {
            Ok(outcome) => span.set_attribute(opentelemetry::KeyValue::new("cairn.outcome", outcome.to_owned())),
            Err(e) => {
                span.set_attribute(opentelemetry::KeyValue::new("error.type", "error"));
                span.set_status(Status::error(e.to_owned()));
            }
        }
        span.end();
    }
}

/// The PostgreSQL worker holding each session's lease in this process, for
/// the `cairn.worker.id` and `cairn.lease.epoch` of its spans.
static WORKERS: Mutex<Option<HashMap<String, (String, i64)>>> = Mutex::new(None);

/// A child session is driven within its root's lease.
pub(crate) fn worker_of(session: &str) -> Option<(String, i64)> {
    let map = WORKERS.lock().unwrap_or_else(|p| p.into_inner());
    let map = map.as_ref()?;
    let mut id = session;
    loop {
        if let Some(w) = map.get(id) {
            return Some(w.clone());
        }
        id = ids::split_child(id)?.0;
    }
}

/// Worker `worker` claimed `session` at lease `epoch`; `takeover`: another
/// worker had left a turn of it unfinished. Its spans say both until
/// [`worker_released`]. Nothing when telemetry is off.
pub fn worker_claimed(session: &str, worker: &str, epoch: i64, takeover: bool) {
    let Some(t) = global() else { return };
    let worker_attr = [KeyValue::new("cairn.worker.id", worker.to_owned())];
    t.instruments.claims.add(1, &worker_attr);
    if takeover {
        t.instruments.takeovers.add(1, &worker_attr);
    }
    let mut map = WORKERS.lock().unwrap_or_else(|p| p.into_inner());
    map.get_or_insert_with(HashMap::new).insert(session.to_owned(), (worker.to_owned(), epoch));
}

/// The worker let `session` go (released, lost, failed).
pub fn worker_released(session: &str) {
    if let Some(map) = WORKERS.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        map.remove(session);
    }
}

/// Worker `worker` lost its lease on `session` at `epoch` (`reason`:
/// `lost`, another worker claimed it; `notRenewed`, the renewals failed
/// and the turn was stopped): counted by reason, and a `lease_lost` span in
/// the session's trace says when, who and why. Nothing when telemetry is
/// off.
pub fn lease_lost(session: &str, worker: &str, epoch: i64, reason: &'static str) {
    use opentelemetry::trace::{Span as _, Status};
    let Some(t) = global() else { return };
    let worker_attr = KeyValue::new("cairn.worker.id", worker.to_owned());
    let reason_attr = KeyValue::new("cairn.lease.loss", reason);
    t.instruments.lease_losses.add(1, &[worker_attr.clone(), reason_attr.clone()]);
    let attrs = vec![
        KeyValue::new("gen_ai.conversation.id", session.to_owned()),
        worker_attr.clone(),
        KeyValue::new("cairn.lease.epoch", epoch),
        reason_attr.clone(),
    ];
    let mut span = session_span(t, session, "lease_lost".to_owned(), attrs);
    span.add_event("lease_lost", vec![worker_attr, KeyValue::new("cairn.lease.epoch", epoch), reason_attr]);
    span.set_status(Status::error(format!("worker {worker} lost its lease (epoch {epoch}): {reason}")));
    span.end();
}

/// A span `name` in `session`'s trace, outside a turn: a child of the
/// span the session is tied to (a subagent's spawn call, a resumed
/// session's kept context) or a root of the trace kept for the session.
fn session_span(t: &Telemetry, session: &str, name: String, attrs: Vec<KeyValue>) -> opentelemetry_sdk::trace::Span {
    use opentelemetry::trace::Tracer as _;
    let parent = turn::parent_of(t, session);
    let trace = parent.is_none().then(|| turn::trace_of(t, session));
    let cx = match parent {
        Some(sc) => opentelemetry::Context::new().with_remote_span_context(sc),
        None => opentelemetry::Context::new(),
    };
    ids::with_ids(trace, None, || t.tracer.span_builder(name).with_attributes(attrs).start_with_context(&t.tracer, &cx))
}

/// What PostgreSQL worker `worker` (the process) sees now: the sessions
/// whose lease it holds and, when it could count them, the sessions
/// waiting in the database for any worker. Gauges, sent with the other
/// metrics; nothing when telemetry is off.
pub fn worker_gauges(worker: &str, held: usize, waiting: Option<u64>) {
    let Some(t) = global() else { return };
    t.exporter.ensure_started();
    let attrs = [KeyValue::new("cairn.worker.id", worker.to_owned())];
    t.instruments.sessions_held.record(u64::try_from(held).unwrap_or(u64::MAX), &attrs);
    if let Some(waiting) = waiting {
        t.instruments.queue_depth.record(waiting, &attrs);
    }
}

/// What the exporter lost, told at exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Summary {
    /// Export requests that failed (collector down, refusing, too slow).
    pub failed_exports: u64,
    /// The flush at exit did not finish within its bound.
    pub flush_timed_out: bool,
    /// Spans dropped because the queue was full (a slow collector).
    pub dropped_spans: u64,
}

/// Ends the exporter when dropped or [`Guard::shutdown`] is called: the
/// last batch is flushed within the plan's bound, never longer.
#[derive(Debug)]
pub struct Guard {
    done: bool,
}

impl Guard {
    /// Flush and stop, waiting at most the flush bound; what the exporter
    /// lost on the way.
    pub fn shutdown(mut self) -> Summary {
        self.done = true;
        shutdown()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.done {
            shutdown();
        }
    }
}

/// Flush what is left within the bound and stop exporting (once; a no-op
/// when telemetry is off or already stopped).
pub fn shutdown() -> Summary {
    let Some(t) = global() else { return Summary::default() };
    // On this thread: every request is bounded by the flush's deadline
    // (`http.rs`), so a collector that never answers costs at most the
    // bound, and no hand-off to another thread waits for a time slice.
    let flushed = t.exporter.flush_at_exit(t.flush_timeout);
    Summary {
        failed_exports: t.failures.load(Ordering::Relaxed),
        flush_timed_out: flushed.timed_out,
        dropped_spans: t.exporter.dropped(),
    }
}

/// Start exporting as `plan` says (once per process; a second call keeps
/// the first). `hooks` clean exported content of the host's secrets and
/// price the model calls.
pub fn init(plan: &Plan, hooks: Hooks) -> anyhow::Result<Guard> {
    if global().is_some() {
        return Ok(Guard { done: true });
    }
    let failures = Arc::new(AtomicU64::new(0));
    let client = http::Ureq::new(plan.export_timeout, Arc::clone(&failures));
    let headers: HashMap<String, String> = plan.headers.clone().into_iter().collect();
    let mut resource = Resource::builder();
    if let Some(name) = &plan.service_name {
        resource = resource.with_service_name(name.clone());
    }
    let resource = resource.build();
    // One retry on the exporter thread: the batch is small and the next
    // one comes soon; none at exit, where the flush bound is short.
    let span_exporter = |retries: usize| {
        let mut b = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client.clone())
            .with_protocol(Protocol::HttpBinary)
            .with_timeout(plan.export_timeout)
            .with_headers(headers.clone())
            .with_retry_policy(opentelemetry_otlp::RetryPolicy::default().with_max_retries(retries));
        if let Some(base) = &plan.endpoint {
            b = b.with_endpoint(format!("{base}/v1/traces"));
        }
        b.build().map(|mut e| {
            e.set_resource(&resource);
            e
        })
    };
    let metric_exporter = |retries: usize| {
        let mut b = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_http_client(client.clone())
            .with_protocol(Protocol::HttpBinary)
            .with_timeout(plan.export_timeout)
            .with_headers(headers.clone())
            .with_retry_policy(opentelemetry_otlp::RetryPolicy::default().with_max_retries(retries));
        if let Some(base) = &plan.endpoint {
            b = b.with_endpoint(format!("{base}/v1/metrics"));
        }
        b.build()
    };
    let exporters = export::Exporters {
        spans: span_exporter(1)?,
        metrics: metric_exporter(1)?,
        exit_spans: span_exporter(0)?,
        exit_metrics: metric_exporter(0)?,
    };
    let reader = Arc::new(ManualReader::builder().build());
    let exporter = export::Shared::new(exporters, Arc::clone(&reader), client, plan.metrics_interval);
    let tracer_provider = SdkTracerProvider::builder()
        .with_span_processor(export::Queue(Arc::clone(&exporter)))
        .with_id_generator(ids::Ids::default())
        .with_resource(resource.clone())
        .build();
    let meter_provider =
        SdkMeterProvider::builder().with_reader(export::Reader(reader)).with_resource(resource).build();
    let tracer = tracer_provider.tracer("cairn");
    let meter = meter_provider.meter("cairn");
    let instruments = Instruments {
        tokens: meter
            .u64_histogram("gen_ai.client.token.usage")
            .with_unit("{token}")
            .with_description("Tokens of each model call, by gen_ai.token.type")
            .build(),
        duration: meter
            .f64_histogram("gen_ai.client.operation.duration")
            .with_unit("s")
            .with_description("Wall time of each model call attempt")
            .build(),
        tool_calls: meter
            .u64_counter("cairn.tool.calls")
            .with_unit("{call}")
            .with_description("Settled tool calls by tool, risk tier, verdict and settlement")
            .build(),
        approvals_waiting: meter
            .i64_up_down_counter("cairn.approvals.waiting")
            .with_unit("{approval}")
            .with_description("Calls waiting for a person's verdict")
            .build(),
        turns: meter
            .u64_counter("cairn.turns")
            .with_unit("{turn}")
            .with_description("Turns run, by how they ended")
            .build(),
        cost: meter
            .f64_counter("cairn.cost")
            .with_unit("USD")
            .with_description(
                "What model calls cost, at the prices cairn shows (models without a price are not counted)",
            )
            .build(),
        claims: meter
            .u64_counter("cairn.worker.claims")
            .with_unit("{claim}")
            .with_description("Sessions a PostgreSQL worker claimed")
            .build(),
        takeovers: meter
            .u64_counter("cairn.worker.takeovers")
            .with_unit("{claim}")
            .with_description("Claims of a session whose turn another worker left unfinished")
            .build(),
        lease_losses: meter
            .u64_counter("cairn.worker.lease_losses")
            .with_unit("{loss}")
            .with_description("Leases a worker lost, by reason")
            .build(),
        sessions_held: meter
            .u64_gauge("cairn.worker.sessions_held")
            .with_unit("{session}")
            .with_description("Sessions whose lease a PostgreSQL worker holds")
            .build(),
        queue_depth: meter
            .u64_gauge("cairn.worker.queue.depth")
            .with_unit("{session}")
            .with_description("Sessions waiting in the database for a worker, as a worker last saw them")
            .build(),
    };
    let parent = plan.traceparent.as_deref().and_then(parse_traceparent);
    let telemetry = Telemetry {
        tracer,
        _tracer_provider: tracer_provider,
        _meter_provider: meter_provider,
        exporter,
        instruments,
        capture: plan.capture_content,
        scrub: hooks.scrub,
        price: hooks.price,
        parent,
        failures,
        flush_timeout: plan.flush_timeout,
    };
    // A lost race (two faces starting at once) keeps the first; the second
    // one's providers shut down when dropped.
    let _ = GLOBAL.set(telemetry);
    Ok(Guard { done: false })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_round_trip_and_bad_ones_are_ignored() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let sc = parse_traceparent(text).unwrap();
        assert_eq!(traceparent(&sc), text);
        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-zzf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn off_means_no_trace_and_nothing_started() {
        // No init in this test binary: a turn gets nothing to feed.
        assert!(!enabled());
        assert!(TurnTrace::start("s", "scripted", "m").is_none());
    }
}
