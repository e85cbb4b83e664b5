//! The cairn binary's integration tests, one test binary (each former
//! `tests/*.rs` file is a module): the program under test is the real
//! `cairn` executable, so linking one test binary instead of one per file
//! saves a whole-program link per file on a cold CI machine. Every `.rs`
//! file beside this one must be listed here (`every_integration_test_file_is_compiled` in
//! cairn-testtools' `import_circles.rs` fails on one that is not).

#![allow(unreachable_pub, missing_debug_implementations)]

mod screen;
mod util;

mod batch;
mod check_memory;
mod cli;
mod commands;
mod context_window;
mod discovery;
mod docs;
mod everyday;
mod faces;
mod faces_agree;
mod hooks;
mod hostile_apply;
mod isolation;
mod kill_compaction;
mod kill_subagents;
mod local_grounding;
mod local_model;
mod mcp_servers;
mod mount_9p;
mod peers;
mod pg_cli;
mod pg_fleet;
mod pg_hostile;
mod providers;
mod pty;
mod secrets;
mod serve_9p;
mod staged;
mod storage_cli;
mod subagents;
mod subagents_pty;
mod telemetry;
mod terminal_safety;
mod toolsrv;
mod trust;
mod turns;
mod undo;
mod world_console;
