//! cairn-telemetry's integration tests, one binary (the process-wide
//! exporter is started once per process, so each behaviour that needs its
//! own process is its own test function here only when it can share it).

mod exit;
