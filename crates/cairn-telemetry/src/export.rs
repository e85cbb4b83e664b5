//! The way finished spans and collected metrics reach the collector: a
//! bounded queue the turn's thread only pushes into, one exporter thread
//! started with the first span (batches every [`SCHEDULED_DELAY`] or
//! when [`BATCH`] spans wait; metrics every `Plan::metrics_interval`), and the
//! flush at exit run on the exiting thread itself.
//!
//! Why not the SDK's batch processor and periodic reader: each starts a
//! thread at init, and their shutdown hands the last export to those
//! threads and waits for each in turn (exit → flush thread → span thread
//! → flush thread → metric thread → exit). On a loaded machine every such
//! hand-off waits for a time slice; for a one-shot `cairn run` that was
//! the ~30 ms telemetry cost per process (BENCHMARKS.md, issue 51). Here
//! the exit sends what is left directly, one request per signal over the
//! exporter's kept-alive connection, each bounded by the flush deadline.
//!
//! Must not: block a span's end (a full queue drops and counts), export
//! after the flush at exit, or wait past the flush bound at exit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter as _;
use opentelemetry_sdk::metrics::reader::MetricReader;
use opentelemetry_sdk::metrics::{InstrumentKind, ManualReader, Pipeline, Temporality};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter as _, SpanProcessor};

use crate::http::Ureq;

/// Spans kept at most while the collector is slow; more are dropped.
pub(crate) const MAX_QUEUE: usize = 2048;
/// Spans that wake the exporter before its timer.
const BATCH: usize = 512;
/// How long a finished span waits at most before it is sent (long-running
/// faces; a one-shot run sends everything at exit).
const SCHEDULED_DELAY: Duration = Duration::from_millis(500);

/// The OTLP exporters: one pair for the exporter thread (with the plan's
/// retry), one for the exit (no retry: the flush bound is short).
pub(crate) struct Exporters {
    pub(crate) spans: opentelemetry_otlp::SpanExporter,
    pub(crate) metrics: opentelemetry_otlp::MetricExporter,
    pub(crate) exit_spans: opentelemetry_otlp::SpanExporter,
    pub(crate) exit_metrics: opentelemetry_otlp::MetricExporter,
}

#[derive(Default)]
struct State {
    queue: Vec<SpanData>,
    /// The exporter thread was started.
    started: bool,
    /// The exporter thread is sending a batch.
    busy: bool,
    /// The flush at exit began: nothing more is queued or sent.
    stopping: bool,
}

/// What the queue, the exporter thread and the exit share.
pub(crate) struct Shared {
    exporters: Exporters,
    reader: Arc<ManualReader>,
    client: Ureq,
    state: Mutex<State>,
    wake: Condvar,
    dropped: AtomicU64,
    metrics_interval: Duration,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

/// What the flush at exit could not do.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Flushed {
    pub(crate) timed_out: bool,
}

impl Shared {
    pub(crate) fn new(
        exporters: Exporters,
        reader: Arc<ManualReader>,
        client: Ureq,
        metrics_interval: Duration,
    ) -> Arc<Self> {
        Arc::new(Shared {
            exporters,
            reader,
            client,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            dropped: AtomicU64::new(0),
            metrics_interval,
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Spans dropped because the queue was full or the exit had begun.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn push(self: &Arc<Self>, span: SpanData) {
        let mut state = self.state();
        if state.stopping || state.queue.len() >= MAX_QUEUE {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        state.queue.push(span);
        self.start(&mut state);
        if state.queue.len() >= BATCH {
            self.wake.notify_all();
        }
    }

    /// Start the exporter thread unless it runs (a worker's gauges need it
    /// before any span: an idle worker still reports its queue).
    pub(crate) fn ensure_started(self: &Arc<Self>) {
        let mut state = self.state();
        if !state.stopping {
            self.start(&mut state);
        }
    }

    fn start(self: &Arc<Self>, state: &mut State) {
        if !state.started {
            state.started = true;
            let shared = Arc::clone(self);
            // A process that cannot start a thread still sends at exit.
            let _ = std::thread::Builder::new().name("cairn-otel".to_owned()).spawn(move || shared.run());
        }
    }

    fn metrics(&self) -> Option<ResourceMetrics> {
        let mut rm = ResourceMetrics::default();
        self.reader.collect(&mut rm).ok()?;
        let any = rm.scope_metrics().next().is_some();
        any.then_some(rm)
    }

    /// The exporter thread: batches on its timer, metrics on theirs, until
    /// the exit takes over.
    fn run(&self) {
        let mut metrics_due = Instant::now() + self.metrics_interval;
        loop {
            let batch = {
                let mut state = self.state();
                if !state.stopping && state.queue.len() < BATCH {
                    state = self.wake.wait_timeout(state, SCHEDULED_DELAY).unwrap_or_else(|p| p.into_inner()).0;
                }
                if state.stopping {
                    return;
                }
                state.busy = true;
                std::mem::take(&mut state.queue)
            };
            if !batch.is_empty() {
                let _ = futures_executor::block_on(self.exporters.spans.export(batch));
            }
            if Instant::now() >= metrics_due {
                metrics_due = Instant::now() + self.metrics_interval;
                if let Some(rm) = self.metrics() {
                    let _ = futures_executor::block_on(self.exporters.metrics.export(&rm));
                }
            }
            self.state().busy = false;
            self.wake.notify_all();
        }
    }

    /// Send what is left from this thread, within `bound`: the exporter
    /// thread's batch in flight is waited for (within the bound), then the
    /// queue's spans and the metrics go out as one request each.
    pub(crate) fn flush_at_exit(&self, bound: Duration) -> Flushed {
        let deadline = Instant::now() + bound;
        self.client.set_deadline(deadline);
        let batch = {
            let mut state = self.state();
            if state.stopping {
                return Flushed::default();
            }
            state.stopping = true;
            self.wake.notify_all();
            while state.busy {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Flushed { timed_out: true };
                }
                state = self.wake.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
            }
            std::mem::take(&mut state.queue)
        };
        if !batch.is_empty() {
            let _ = futures_executor::block_on(self.exporters.exit_spans.export(batch));
        }
        if let Some(rm) = self.metrics() {
            let _ = futures_executor::block_on(self.exporters.exit_metrics.export(&rm));
        }
        Flushed { timed_out: Instant::now() >= deadline }
    }
}

/// The tracer provider's processor: ends spans into the queue.
#[derive(Debug)]
pub(crate) struct Queue(pub(crate) Arc<Shared>);

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        self.0.push(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        // The flush at exit (`Shared::flush_at_exit`) is cairn's shutdown.
        Ok(())
    }
}

/// The meter provider's reader: the manual reader the exporter thread and
/// the exit collect from.
#[derive(Debug)]
pub(crate) struct Reader(pub(crate) Arc<ManualReader>);

impl MetricReader for Reader {
    fn register_pipeline(&self, pipeline: std::sync::Weak<Pipeline>) {
        self.0.register_pipeline(pipeline);
    }
    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.collect(rm)
    }
    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
    fn temporality(&self, kind: InstrumentKind) -> Temporality {
        self.0.temporality(kind)
    }
}
