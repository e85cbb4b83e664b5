//! OpenTelemetry traces and metrics of cairn's turns, with the GenAI
//! semantic conventions, for every face: cairn-host's `Equipment::run` (the
//! one place a turn is started) hands each of the turn's events to a
//! [`TurnTrace`], which turns them into `invoke_agent`, `chat` and
//! `execute_tool` spans and the conventions' metrics. Opt-in: [`init`]
//! starts an exporter only when an endpoint is configured (`config.rs`);
//! otherwise [`TurnTrace::start`] is `None` and a turn pays one atomic load.
//!
//! Owns: the exporter (OTLP http/protobuf over ureq, batch span processor
//! with a bounded queue and a periodic metric reader, each on its own
//! thread), the bounded flush at exit, and the ids that keep a session's
//! trace across processes (`ids.rs`).
//!
//! Must not: block, slow or fail a turn (a full queue drops, a dead
//! collector costs the exporter's thread only), export message content
//! unless asked (`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`), or
//! export a provider key (content goes through the host's scrubber).

mod config;
mod http;
mod ids;
mod turn;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use opentelemetry::metrics::{Counter, Histogram, MeterProvider as _, UpDownCounter};
use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState, TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, Tracer};

pub use config::{DEFAULT_ENDPOINT, Plan, Refused, TelemetryConfig, resolve};

pub use ids::{call_span, session_trace};
pub use turn::TurnTrace;

/// Rewrites exported content so no secret the host holds leaves (the
/// host's scrubber of provider keys).
pub type Scrub = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// The process's telemetry, once [`init`] ran with a plan.
struct Telemetry {
    tracer: Tracer,
    tracer_provider: SdkTracerProvider,
    meter_provider: SdkMeterProvider,
    instruments: Instruments,
    capture: bool,
    scrub: Scrub,
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

/// What the exporter lost, told at exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Summary {
    /// Export requests that failed (collector down, refusing, too slow).
    pub failed_exports: u64,
    /// The flush at exit did not finish within its bound.
    pub flush_timed_out: bool,
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
    // On a thread of its own: the SDK's shutdown waits for the exporter,
    // and a collector that accepted the connection and never answers would
    // hold the process at exit until the export's own timeout.
    let (tx, rx) = std::sync::mpsc::channel();
    let tracer_provider = t.tracer_provider.clone();
    let meter_provider = t.meter_provider.clone();
    let bound = t.flush_timeout;
    let spawned = std::thread::Builder::new().name("cairn-otel-flush".to_owned()).spawn(move || {
        let _ = tracer_provider.shutdown_with_timeout(bound);
        let _ = meter_provider.shutdown_with_timeout(bound);
        let _ = tx.send(());
    });
    let flush_timed_out = spawned.is_err() || rx.recv_timeout(bound).is_err();
    Summary { failed_exports: t.failures.load(Ordering::Relaxed), flush_timed_out }
}

/// Start exporting as `plan` says (once per process; a second call keeps
/// the first). `scrub` cleans exported content of the host's secrets.
pub fn init(plan: &Plan, scrub: Scrub) -> anyhow::Result<Guard> {
    if global().is_some() {
        return Ok(Guard { done: true });
    }
    let failures = Arc::new(AtomicU64::new(0));
    let client = http::Ureq::new(plan.export_timeout, Arc::clone(&failures));
    let headers: HashMap<String, String> = plan.headers.clone().into_iter().collect();
    // One retry: the batch is small and the next one comes soon; a dead
    // collector should cost the exporter's thread little.
    let retry = opentelemetry_otlp::RetryPolicy::default().with_max_retries(1);
    let mut spans = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client.clone())
        .with_protocol(Protocol::HttpBinary)
        .with_timeout(plan.export_timeout)
        .with_headers(headers.clone())
        .with_retry_policy(retry.clone());
    let mut metrics = opentelemetry_otlp::MetricExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_timeout(plan.export_timeout)
        .with_headers(headers)
        .with_retry_policy(retry);
    if let Some(base) = &plan.endpoint {
        spans = spans.with_endpoint(format!("{base}/v1/traces"));
        metrics = metrics.with_endpoint(format!("{base}/v1/metrics"));
    }
    let spans = spans.build()?;
    let metrics = metrics.build()?;
    let mut resource = Resource::builder();
    if let Some(name) = &plan.service_name {
        resource = resource.with_service_name(name.clone());
    }
    let resource = resource.build();
    let batch = BatchConfigBuilder::default()
        .with_max_queue_size(2048)
        .with_scheduled_delay(Duration::from_millis(500))
        .build();
    let tracer_provider = SdkTracerProvider::builder()
        .with_span_processor(BatchSpanProcessor::builder(spans).with_batch_config(batch).build())
        .with_id_generator(ids::Ids::default())
        .with_resource(resource.clone())
        .build();
    let meter_provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(metrics).with_interval(Duration::from_secs(10)).build())
        .with_resource(resource)
        .build();
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
    };
    let parent = plan.traceparent.as_deref().and_then(parse_traceparent);
    let telemetry = Telemetry {
        tracer,
        tracer_provider,
        meter_provider,
        instruments,
        capture: plan.capture_content,
        scrub,
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
