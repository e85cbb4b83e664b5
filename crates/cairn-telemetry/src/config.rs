//! What telemetry a process exports, from the standard `OTEL_*` variables
//! and the configuration's `[telemetry]` table: [`resolve`] is a pure
//! function of the two, so the opt-in rule (nothing configured, nothing
//! sent) is decided and tested in one place.
//!
//! Must not: read the environment itself (the caller hands a lookup) or
//! start anything.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

/// `[telemetry]` as a person writes it. Every key is optional; the
/// standard variables win over it, as the environment wins over the file
/// for cairn's other settings.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// `false` turns telemetry off whatever the environment says; `true`
    /// with no endpoint exports to the OTLP default `http://localhost:4318`.
    pub enabled: Option<bool>,
    /// The collector's OTLP/HTTP base URL (`/v1/traces` and `/v1/metrics`
    /// are added), used when `OTEL_EXPORTER_OTLP_ENDPOINT` is not set.
    pub endpoint: Option<String>,
    /// Headers sent with each export (added to `OTEL_EXPORTER_OTLP_HEADERS`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// `service.name` when `OTEL_SERVICE_NAME` is not set (default `cairn`).
    pub service_name: Option<String>,
    /// Export prompts, answers, tool arguments and outputs, as
    /// `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true` does.
    pub capture_message_content: Option<bool>,
    /// Longest wait for the last export when cairn exits, in milliseconds
    /// (default 2000); what is not sent by then is dropped.
    pub flush_timeout_ms: Option<u64>,
}

/// The OTLP default endpoint for http/protobuf.
pub const DEFAULT_ENDPOINT: &str = "http://localhost:4318";

/// Telemetry as it will run in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Base URL from the table (or the default), when the environment
    /// names none; `None`: the exporter reads `OTEL_EXPORTER_OTLP_*`.
    pub endpoint: Option<String>,
    /// The table's headers (the exporter adds the environment's).
    pub headers: BTreeMap<String, String>,
    /// `service.name` to set when `OTEL_SERVICE_NAME` is absent.
    pub service_name: Option<String>,
    /// Message content is exported.
    pub capture_content: bool,
    /// Bound of the flush at exit.
    pub flush_timeout: Duration,
    /// Bound of one export request (`OTEL_EXPORTER_OTLP_TIMEOUT`, default 10 s).
    pub export_timeout: Duration,
    /// The W3C `traceparent` the process was started under (`TRACEPARENT`).
    pub traceparent: Option<String>,
    /// How often a long-running process sends its metrics
    /// (`OTEL_METRIC_EXPORT_INTERVAL` in milliseconds, default 10 s; a
    /// one-shot run sends them at exit).
    pub metrics_interval: Duration,
}

/// The default of [`Plan::metrics_interval`].
pub const DEFAULT_METRICS_INTERVAL: Duration = Duration::from_secs(10);

/// Why telemetry stays off although something asked for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

fn truthy(v: &str) -> bool {
    v.trim().eq_ignore_ascii_case("true")
}

/// Decide from the `[telemetry]` table and the environment (`env`) whether
/// and how this process exports. `Ok(None)`: nothing is configured (or it
/// is disabled), nothing is sent and nothing is started.
pub fn resolve(table: Option<&TelemetryConfig>, env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Plan>, Refused> {
    let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|v| truthy(&v)) {
        return Ok(None);
    }
    let table = table.cloned().unwrap_or_default();
    if table.enabled == Some(false) {
        return Ok(None);
    }
    let from_env =
        ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"].iter().any(|n| var(n).is_some());
    let endpoint = if from_env {
        None
    } else if let Some(e) = table.endpoint.clone().filter(|e| !e.trim().is_empty()) {
        Some(e)
    } else if table.enabled == Some(true) {
        Some(DEFAULT_ENDPOINT.to_owned())
    } else {
        // Opt-in: no endpoint anywhere, nothing is sent.
        return Ok(None);
    };
    if let Some(e) = &endpoint
        && !(e.starts_with("http://") || e.starts_with("https://"))
    {
        return Err(Refused(format!(
            "[telemetry] endpoint = {e:?} is not an http(s) URL; give the collector's OTLP/HTTP address, e.g. {DEFAULT_ENDPOINT}"
        )));
    }
    for name in
        ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"]
    {
        if let Some(p) = var(name)
            && p.trim() != "http/protobuf"
        {
            return Err(Refused(format!(
                "{name}={p}: cairn exports OTLP over http/protobuf only; set it to http/protobuf (or unset it) and \
                 point OTEL_EXPORTER_OTLP_ENDPOINT at the collector's HTTP port (usually 4318)"
            )));
        }
    }
    let capture_content = match var("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT") {
        Some(v) => truthy(&v),
        None => table.capture_message_content == Some(true),
    };
    let export_timeout = var("OTEL_EXPORTER_OTLP_TIMEOUT")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(10), Duration::from_millis);
    Ok(Some(Plan {
        endpoint: endpoint.map(|e| e.trim_end_matches('/').to_owned()),
        headers: table.headers,
        service_name: if var("OTEL_SERVICE_NAME").is_some() {
            None
        } else {
            Some(table.service_name.unwrap_or_else(|| "cairn".to_owned()))
        },
        capture_content,
        flush_timeout: Duration::from_millis(table.flush_timeout_ms.unwrap_or(2000)),
        export_timeout,
        traceparent: var("TRACEPARENT"),
        metrics_interval: var("OTEL_METRIC_EXPORT_INTERVAL")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|ms| *ms > 0)
            .map_or(DEFAULT_METRICS_INTERVAL, Duration::from_millis),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn nothing_configured_sends_nothing() {
        assert_eq!(resolve(None, &env(&[])), Ok(None));
        assert_eq!(resolve(Some(&TelemetryConfig::default()), &env(&[("OTEL_SERVICE_NAME", "x")])), Ok(None));
        // Content capture alone is no endpoint.
        assert_eq!(resolve(None, &env(&[("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")])), Ok(None));
    }

    #[test]
    fn the_environment_turns_it_on_and_off() {
        let on = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")];
        let plan = resolve(None, &env(&on)).unwrap().unwrap();
        assert_eq!(plan.endpoint, None, "the exporter reads the variable itself");
        assert!(!plan.capture_content);
        assert_eq!(plan.service_name.as_deref(), Some("cairn"));
        assert_eq!(plan.metrics_interval, DEFAULT_METRICS_INTERVAL);
        let fast = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_METRIC_EXPORT_INTERVAL", "250")];
        assert_eq!(resolve(None, &env(&fast)).unwrap().unwrap().metrics_interval, Duration::from_millis(250));
        let off = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_SDK_DISABLED", "TRUE")];
        assert_eq!(resolve(None, &env(&off)), Ok(None));
        let table = TelemetryConfig { enabled: Some(false), ..Default::default() };
        assert_eq!(resolve(Some(&table), &env(&on)), Ok(None));
    }

    #[test]
    fn the_table_names_an_endpoint_and_content_needs_asking() {
        let table = TelemetryConfig {
            endpoint: Some("http://127.0.0.1:6006/".into()),
            capture_message_content: Some(true),
            ..Default::default()
        };
        let plan = resolve(Some(&table), &env(&[])).unwrap().unwrap();
        assert_eq!(plan.endpoint.as_deref(), Some("http://127.0.0.1:6006"));
        assert!(plan.capture_content);
        // The variable wins over the table, both ways.
        let no = [("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "false")];
        assert!(!resolve(Some(&table), &env(&no)).unwrap().unwrap().capture_content);
        let on = TelemetryConfig { enabled: Some(true), ..Default::default() };
        assert_eq!(resolve(Some(&on), &env(&[])).unwrap().unwrap().endpoint.as_deref(), Some(DEFAULT_ENDPOINT));
    }

    #[test]
    fn grpc_and_bad_urls_are_refused_with_what_to_do() {
        let grpc = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")];
        let e = resolve(None, &env(&grpc)).unwrap_err();
        assert!(e.0.contains("http/protobuf") && e.0.contains("4318"), "{e}");
        let table = TelemetryConfig { endpoint: Some("localhost:4318".into()), ..Default::default() };
        assert!(resolve(Some(&table), &env(&[])).unwrap_err().0.contains("http(s) URL"));
    }
}
