//! Starting and ending the process's OpenTelemetry export from the
//! settings (`[telemetry]` and the `OTEL_*` variables): the binary calls
//! [`start`] once after the configuration is read and [`finish`] once at
//! exit, whatever the face. Content is scrubbed of the provider keys the
//! vault holds (`secrets.rs`) before it is exported; model calls are priced
//! for `cairn.cost` as `/status` prices them (`config::prices`).
//!
//! Must not: print (it returns what to tell the person) or fail a command
//! over telemetry (a refused configuration leaves telemetry off, said).

use std::sync::Arc;

use crate::config::Settings;

/// Start exporting when the settings and environment ask for it. `Some`:
/// a note for the person (telemetry asked for but left off, and why).
pub fn start(settings: &Settings) -> Option<String> {
    let env = |name: &str| std::env::var(name).ok();
    let plan = match cairn_telemetry::resolve(settings.telemetry.as_ref(), &env) {
        Ok(Some(plan)) => plan,
        Ok(None) => return None,
        Err(refused) => return Some(format!("telemetry is off: {refused}")),
    };
    let scrub: cairn_telemetry::Scrub = Arc::new(|text: &str| crate::secrets::values().redact(text));
    // Priced as `/status` prices (`config::prices`): a model with no known
    // price exports no cost.
    let tables = settings.providers.clone();
    let price: cairn_telemetry::Price = Arc::new(move |usage: &cairn_core::provider::AttemptUsage| {
        let prices = crate::config::prices(&tables, &usage.provider, &usage.model).ok()?;
        let cost = prices.cost(usage.input_tokens, usage.cached_input_tokens, usage.output_tokens);
        // Picodollars to dollars: exact below 2^53 pUSD (about $9,000 per
        // attempt), close enough above.
        Some(cost.pico as f64 / 1e12)
    });
    match cairn_telemetry::init(&plan, cairn_telemetry::Hooks { scrub, price }) {
        Ok(guard) => {
            // Ended by `finish`, not by the guard's drop.
            std::mem::forget(guard);
            None
        }
        Err(e) => Some(format!("telemetry is off: cannot start the OTLP exporter: {e:#}")),
    }
}

/// Flush what is left (bounded) and stop; `Some`: what was lost, for the
/// person.
pub fn finish() -> Option<String> {
    let summary = cairn_telemetry::shutdown();
    let mut lost = Vec::new();
    if summary.failed_exports > 0 {
        lost.push(format!("{} export(s) to the collector failed", summary.failed_exports));
    }
    if summary.dropped_spans > 0 {
        lost.push(format!("{} span(s) found the queue full", summary.dropped_spans));
    }
    if summary.flush_timed_out {
        lost.push("the last flush did not finish in time".to_owned());
    }
    (!lost.is_empty()).then(|| format!("telemetry: {}; their spans and metrics were dropped", lost.join(" and ")))
}
