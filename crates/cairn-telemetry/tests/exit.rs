//! The exporter's cost to a short process (issue 51's overhead): starting
//! telemetry starts no thread, the first span starts the one exporter
//! thread, and the flush at exit sends what is left from the exiting
//! thread itself — no flush thread, no hand-off to the SDK's batch and
//! periodic-reader threads (each of which waits for a time slice on a
//! loaded machine; that was ~30 ms per `cairn run`). The receiver is a
//! plain TCP listener in this test, reading the requests' paths.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_core::TurnEvent;

/// This process's threads, as "tid name".
fn threads() -> BTreeSet<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .map(|t| {
            let t = t.unwrap().path();
            let name = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
            format!("{} {}", t.file_name().unwrap().to_string_lossy(), name.trim())
        })
        .collect()
}

/// A receiver answering every POST with 200; the paths it was sent.
fn receiver() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let paths = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&paths);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut out = stream.try_clone().unwrap();
            let mut reader = BufReader::new(stream);
            loop {
                let mut request = String::new();
                if reader.read_line(&mut request).unwrap_or(0) == 0 {
                    break;
                }
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if line.trim().is_empty() {
                        break;
                    }
                    if let Some((k, v)) = line.split_once(':')
                        && k.eq_ignore_ascii_case("content-length")
                    {
                        length = v.trim().parse().unwrap();
                    }
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body).unwrap();
                seen.lock().unwrap().push(request.split(' ').nth(1).unwrap_or_default().to_owned());
                out.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").unwrap();
            }
        }
    });
    (url, paths)
}

#[test]
fn no_thread_until_a_span_and_the_exit_flush_runs_on_the_exiting_thread() {
    let (url, paths) = receiver();
    let before = threads();
    let plan = cairn_telemetry::Plan {
        endpoint: Some(url),
        headers: Default::default(),
        service_name: Some("cairn-test".to_owned()),
        capture_content: false,
        flush_timeout: Duration::from_secs(60),
        export_timeout: Duration::from_secs(60),
        traceparent: None,
        metrics_interval: cairn_telemetry::DEFAULT_METRICS_INTERVAL,
    };
    let guard = cairn_telemetry::init(&plan, cairn_telemetry::Hooks::plain()).unwrap();
    let started: Vec<String> = threads().difference(&before).cloned().collect();
    // (Compared by tid and name: a thread renamed since counts as new,
    // which only makes this check stricter.)
    assert!(started.is_empty(), "starting telemetry started threads: {started:?}");

    let mut trace = cairn_telemetry::TurnTrace::start("s1", "scripted", "m").unwrap();
    trace.observe(&TurnEvent::TurnStarted { turn_id: "t1".into(), lane: "main".into(), resumed: false, prompt: None });
    trace.finish(Ok(None));
    let after_span: BTreeSet<String> = threads().difference(&before).cloned().collect();
    // (A new thread names itself once it runs, so only the count is sure.)
    assert!(after_span.len() <= 1, "the first span starts one exporter thread, no more: {after_span:?}");

    // The exit's export runs here: it is done when shutdown returns, and
    // no thread was started for it.
    let summary = guard.shutdown();
    assert_eq!(summary, cairn_telemetry::Summary::default(), "nothing lost");
    // (The span may have gone on the exporter thread's timer already.)
    let sent = paths.lock().unwrap().clone();
    for path in ["/v1/traces", "/v1/metrics"] {
        assert_eq!(sent.iter().filter(|p| *p == path).count(), 1, "{path} once: {sent:?}");
    }
    let tid = |t: &String| t.split(' ').next().unwrap_or_default().to_owned();
    let known: BTreeSet<String> = before.iter().chain(&after_span).map(tid).collect();
    let extra: Vec<String> = threads().into_iter().filter(|t| !known.contains(&tid(t))).collect();
    assert!(extra.is_empty(), "the exit started threads: {extra:?}");
}
