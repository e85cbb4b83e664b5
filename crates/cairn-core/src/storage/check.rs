//! `cairn check`: validate a session file without modifying it and
//! summarize what a replay found.
//!
//! It owns the report's shape (its JSON form is a stable interface:
//! `{"ok","entries","registers","usage","lastSeq","tornTail",
//! "deadBytesRatio","storageVersion","warnings","error"}`; hosts may add
//! fields of their own, e.g. the CLI's peak memory and rate) and its human
//! form. Checks of what entries *mean* (the tool lifecycle) belong to the
//! turn and come in through [`check_file_with`]'s `validate`, one entry at
//! a time. It must never write to the file: it reads through a read-only
//! handle.
//!
//! It streams: every line goes through the replay's rules (`replay.rs`) and
//! every record through the index's ([`check_record`]), but nothing of a
//! record is kept beside its entry id (packed, for the parent and duplicate
//! rules) and the registers' liveness, so its memory is a small fraction
//! of the file's size rather than a copy of the session.

use std::path::Path;

use serde::Serialize;

use super::chunked::{ApplyRead, CHUNK, decoding_threads, replay_chunks};
use super::jsonl::{Access, StoreOptions, open_regular};
use super::line::{EntryRead, EntryRef};
use super::record::{EntryView, Record};
use super::replay::{Apply, ReplayedFile, replay_into};

/// What `cairn check` reports about a session file.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckReport {
    /// Whether the file opens (and passes the caller's validation).
    pub ok: bool,
    /// Number of entries.
    pub entries: u64,
    /// Number of live registers.
    pub registers: u64,
    /// Number of usage rows.
    pub usage: u64,
    /// Highest seq.
    pub last_seq: u64,
    /// Whether a torn final line was found (it is discarded, not an error).
    pub torn_tail: bool,
    /// Share of the file's bytes that a compaction would drop.
    pub dead_bytes_ratio: f64,
    /// The storage version the file declares (older ones are migrated in
    /// memory; a compaction rewrites them in the current version).
    pub storage_version: u32,
    /// Things that do not stop the file from opening but need a person
    /// (e.g. a header id that differs from the file name).
    pub warnings: Vec<String>,
    /// Why the file does not open, when it does not.
    pub error: Option<String>,
}

/// Validate the session file at `path` (read-only) and summarize it.
pub fn check_file(path: &Path) -> CheckReport {
    check_file_with(path, StoreOptions::default(), |_| Ok(()))
}

/// [`check_file`] with options (the line limit) and a further validation
/// of each entry in file order (e.g. the turn's tool lifecycle): its first
/// error makes the report not ok, and later entries are no longer passed to
/// it. An error of the file itself (anywhere in it) is the one reported, as
/// a replay would stop on it.
pub fn check_file_with(
    path: &Path,
    opts: StoreOptions,
    mut validate: impl FnMut(EntryView<'_>) -> Result<(), String>,
) -> CheckReport {
    let file = match open_regular(path, Access::Read) {
        Ok(file) => file,
        Err(e) => return failed(e.to_string()),
    };
    let mut validate = |entry: EntryView<'_>, ()| validate(entry);
    let mut verify = Verify::new(&mut validate);
    let replayed = replay_into(&path.display().to_string(), file, opts.max_line_bytes, &mut verify);
    report(path, replayed, verify)
}

/// [`check_file_with`] with each entry's payload read ahead by `read` on
/// other threads (the file's lines are decoded there too: `chunked.rs`),
/// and `validate` given, in file order, each entry's index fields (its
/// view's `payload` is empty) with what `read` made of it. The same report
/// as [`check_file_with`] with a `validate` that reads the payload itself,
/// in less wall time on a machine with a second core.
pub fn check_file_read<R: EntryRead>(
    path: &Path,
    opts: StoreOptions,
    read: R,
    mut validate: impl FnMut(EntryView<'_>, R::Out) -> Result<(), String>,
) -> CheckReport {
    check_read_in(path, opts, decoding_threads(), CHUNK, &read, &mut validate)
}

/// The applying side's validation of an entry and what was read of it.
type Validate<'v, P> = dyn FnMut(EntryView<'_>, P) -> Result<(), String> + 'v;

/// [`check_file_read`] with `threads` decoding threads and chunks of
/// `chunk` bytes.
fn check_read_in<R: EntryRead>(
    path: &Path,
    opts: StoreOptions,
    threads: usize,
    chunk: usize,
    read: &R,
    validate: &mut Validate<'_, R::Out>,
) -> CheckReport {
    let file = match open_regular(path, Access::Read) {
        Ok(file) => file,
        Err(e) => return failed(e.to_string()),
    };
    let mut verify = Verify::new(validate);
    let replayed =
        replay_chunks(&path.display().to_string(), file, opts.max_line_bytes, threads, chunk, read, &mut verify);
    report(path, replayed, verify)
}

fn failed(error: String) -> CheckReport {
    CheckReport {
        ok: false,
        entries: 0,
        registers: 0,
        usage: 0,
        last_seq: 0,
        torn_tail: false,
        dead_bytes_ratio: 0.0,
        storage_version: 0,
        warnings: Vec::new(),
        error: Some(error),
    }
}

fn report<P>(path: &Path, replayed: Result<ReplayedFile, super::StorageError>, verify: Verify<'_, P>) -> CheckReport {
    let replayed = match replayed {
        Ok(replayed) => replayed,
        Err(e) => return failed(e.to_string()),
    };
    let mut warnings = Vec::new();
    if let Some(warning) = header_id_mismatch(path, &replayed.header.id) {
        warnings.push(warning);
    }
    let error = verify.invalid;
    let len = replayed.valid_len;
    CheckReport {
        ok: error.is_none(),
        entries: verify.entries,
        registers: replayed.liveness.registers.values().map(|keys| keys.len() as u64).sum(),
        usage: verify.usage,
        last_seq: verify.last_seq,
        torn_tail: replayed.torn_bytes > 0,
        dead_bytes_ratio: if len == 0 { 0.0 } else { replayed.liveness.dead_bytes as f64 / len as f64 },
        storage_version: replayed.file_version,
        warnings,
        error,
    }
}

/// The index's rules over a stream of records, keeping of them only the
/// entry ids (packed) and counts; each entry also goes to the caller's
/// validation until it first fails.
struct Verify<'a, P> {
    ids: crate::idset::IdSet,
    last_seq: u64,
    entries: u64,
    usage: u64,
    validate: &'a mut dyn FnMut(EntryView<'_>, P) -> Result<(), String>,
    invalid: Option<String>,
}

impl<'a, P> Verify<'a, P> {
    fn new(validate: &'a mut dyn FnMut(EntryView<'_>, P) -> Result<(), String>) -> Self {
        Self { ids: crate::idset::IdSet::default(), last_seq: 0, entries: 0, usage: 0, validate, invalid: None }
    }

    /// An entry: the index's rules, then the caller's validation.
    fn entry(&mut self, entry: EntryView<'_>, read: P) -> Result<(), String> {
        super::index::check_entry(&entry, self.last_seq, |id| self.ids.get(id))?;
        self.last_seq = entry.seq;
        self.ids.insert(entry.id, 0);
        self.entries += 1;
        if self.invalid.is_none()
            && let Err(e) = (self.validate)(entry, read)
        {
            self.invalid = Some(e);
        }
        Ok(())
    }

    /// Any other record: the index's rules.
    fn other(&mut self, record: &Record) -> Result<(), String> {
        super::index::check_record::<u8>(record, self.last_seq, |_| None)?;
        self.last_seq = record.seq();
        if let Record::Usage(_) = record {
            self.usage += 1;
        }
        Ok(())
    }
}

impl Apply for Verify<'_, ()> {
    fn apply(&mut self, record: Record) -> Result<(), String> {
        match &record {
            Record::Entry(entry) => self.entry(entry.view(), ()),
            other => self.other(other),
        }
    }

    /// An entry as it stands in its line: checked and validated in place
    /// (no copy of its strings or payload).
    fn apply_entry(&mut self, entry: EntryRef<'_>) -> Result<(), String> {
        self.entry(entry.view(), ())
    }
}

impl<P> ApplyRead<P> for Verify<'_, P> {
    fn entry(&mut self, entry: EntryView<'_>, read: P) -> Result<(), String> {
        Verify::entry(self, entry, read)
    }

    fn other(&mut self, record: Record) -> Result<(), String> {
        Verify::other(self, &record)
    }
}

/// A warning when the header's id is not the file's name (`<id>.jsonl`):
/// sessions are looked up by file name, so such a file is listed under an
/// id that finds nothing.
pub fn header_id_mismatch(path: &Path, header_id: &str) -> Option<String> {
    let stem = path.file_stem()?.to_string_lossy();
    (stem != header_id).then(|| {
        format!(
            "{}: the header says session id {header_id:?} but the file is named {stem:?}; cairn looks sessions up by file name — rename the file to {header_id}.jsonl if it is that session",
            path.display()
        )
    })
}

impl std::fmt::Display for CheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(error) = &self.error {
            write!(f, "not ok: {error}")?;
        } else {
            write!(
                f,
                "ok: {} entries, {} live registers, {} usage rows, last seq {}, {:.1}% dead bytes",
                self.entries,
                self.registers,
                self.usage,
                self.last_seq,
                self.dead_bytes_ratio * 100.0
            )?;
            if self.torn_tail {
                write!(
                    f,
                    "; a torn final line (an interrupted commit) is ignored and will be cut off on the next write"
                )?;
            }
            if self.storage_version < super::STORAGE_VERSION && self.error.is_none() {
                write!(
                    f,
                    "; storage version {} is read through a migration (a compaction rewrites it as version {})",
                    self.storage_version,
                    super::STORAGE_VERSION
                )?;
            }
        }
        for warning in &self.warnings {
            write!(f, "\nwarning: {warning}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{JsonlStore, Storage};

    /// The report as it was built before the check streamed: a read-only
    /// store replayed whole (the reference the streaming check must equal).
    fn through_the_store(path: &Path) -> CheckReport {
        match JsonlStore::open_read_only(path) {
            Err(e) => CheckReport {
                ok: false,
                entries: 0,
                registers: 0,
                usage: 0,
                last_seq: 0,
                torn_tail: false,
                dead_bytes_ratio: 0.0,
                storage_version: 0,
                warnings: Vec::new(),
                error: Some(e.to_string()),
            },
            Ok(store) => CheckReport {
                ok: true,
                entries: store.index().entry_count() as u64,
                registers: store.index().register_count() as u64,
                usage: store.index().usage().len() as u64,
                last_seq: store.index().last_seq(),
                torn_tail: store.torn_tail_bytes() > 0,
                dead_bytes_ratio: store.dead_bytes_ratio(),
                storage_version: store.file_storage_version(),
                warnings: header_id_mismatch(path, &store.header().id).into_iter().collect(),
                error: None,
            },
        }
    }

    const HEADER: &str = r#"{"v":1,"kind":"header","id":"s","storageVersion":1,"createdAt":1,"cwd":"/"}"#;

    fn entry(seq: u64, id: &str, parent: Option<&str>) -> String {
        let parent = parent.map_or("null".to_owned(), |p| format!("{p:?}"));
        format!(
            r#"{{"kind":"entry","seq":{seq},"timestamp":1,"id":"{id}","parentId":{parent},"type":"message","payload":{{"n":{seq}}}}}"#
        )
    }

    fn set(seq: u64, namespace: &str, key: &str) -> String {
        format!(r#"{{"kind":"register","op":"set","seq":{seq},"namespace":"{namespace}","key":"{key}","value":{seq}}}"#)
    }

    fn delete(seq: u64, key: &str) -> String {
        format!(r#"{{"kind":"register","op":"delete","seq":{seq},"namespace":"fact","key":"{key}"}}"#)
    }

    #[test]
    fn the_streaming_check_reports_what_a_whole_replay_reports() {
        let dir = tempfile::tempdir().unwrap();
        // A long healthy body: entries chained (and a fork from the first
        // one at the end), registers overwritten and deleted, usage rows.
        let mut body = Vec::new();
        let mut seq = 0;
        for i in 0..3_000u64 {
            seq += 1;
            body.push(entry(seq, &format!("e{i}"), (i > 0).then(|| format!("e{}", i - 1)).as_deref()));
            seq += 1;
            body.push(set(seq, "fact", &format!("k{}", i % 7)));
            if i % 5 == 0 {
                seq += 1;
                body.push(delete(seq, &format!("k{}", i % 7)));
            }
            if i % 3 == 0 {
                seq += 1;
                body.push(format!(r#"{{"kind":"usage","seq":{seq},"id":"u{i}","entryId":"e{i}","usage":{{"in":1}}}}"#));
            }
        }
        let cases: Vec<(&str, Vec<String>)> = vec![
            ("healthy", vec![]),
            ("fork from the first entry", vec![entry(seq + 1, "fork", Some("e0"))]),
            ("duplicate id far from the first", vec![entry(seq + 1, "e0", Some("e2999"))]),
            ("unknown parent", vec![entry(seq + 1, "x", Some("nowhere"))]),
            ("seq going back", vec![entry(seq, "x", Some("e1"))]),
            ("unknown namespace", vec![set(seq + 1, "nowhere", "k")]),
            (
                "set without a value",
                vec![format!(r#"{{"kind":"register","op":"set","seq":{},"namespace":"fact","key":"k"}}"#, seq + 1)],
            ),
            ("corrupt line in the middle", vec!["{not json".to_owned(), entry(seq + 1, "x", Some("e1"))]),
            ("torn tail", vec!["{\"kind\":\"entr".to_owned()]),
            ("an array line", vec![format!("[{},{}]", entry(seq + 1, "a", Some("e5")), set(seq + 2, "lane", "main"))]),
        ];
        for (name, tail) in cases {
            let path = dir.path().join(format!("{}.jsonl", name.replace(' ', "-")));
            let mut text = format!("{HEADER}\n");
            for line in body.iter().chain(&tail) {
                text.push_str(line);
                text.push('\n');
            }
            if name == "torn tail" {
                text.pop();
            }
            std::fs::write(&path, text).unwrap();
            let streamed = check_file(&path);
            let whole = through_the_store(&path);
            assert_eq!(streamed, whole, "{name}");
            assert_eq!(
                streamed.ok,
                name.starts_with("healthy")
                    || name.starts_with("fork")
                    || name.starts_with("torn")
                    || name.starts_with("an array"),
                "{name}: {streamed:?}"
            );
        }
    }

    /// A tool event's entry line (the lifecycle check's payloads).
    fn tool(seq: u64, id: &str, parent: &str, entry_type: &str, invocation: &str) -> String {
        let payload = match entry_type {
            "toolRequested" => format!(
                r#"{{"invocationId":"{invocation}","turnId":"t","request":{{"invocationId":"{invocation}","callId":"c","sessionId":"s","tool":"read_file","arguments":{{"path":"a"}}}}}}"#
            ),
            "toolStarted" => format!(
                r#"{{"invocationId":"{invocation}","callId":"c","tool":"read_file","verdict":{{"decision":"approve","by":"policy","at":1}}}}"#
            ),
            _ => format!(
                r#"{{"invocationId":"{invocation}","callId":"c","tool":"read_file","receipt":{{"exitCode":0,"outputSummary":"ok","durationMs":1,"tier":"readOnly","timestamp":1}}}}"#
            ),
        };
        format!(
            r#"{{"kind":"entry","seq":{seq},"timestamp":1,"id":"{id}","parentId":"{parent}","type":"{entry_type}","payload":{payload}}}"#
        )
    }

    #[test]
    fn the_chunked_check_reports_what_the_sequential_check_reports() {
        use crate::projection::{LifecycleCheck, LifecycleReader};
        let dir = tempfile::tempdir().unwrap();
        let mut body = vec![entry(1, "e0", None)];
        let mut seq = 1;
        for i in 0..60u64 {
            for (n, kind) in ["toolRequested", "toolStarted", "toolCompleted"].into_iter().enumerate() {
                seq += 1;
                body.push(tool(seq, &format!("t{i}.{n}"), "e0", kind, &format!("i{i}")));
            }
            seq += 1;
            body.push(set(seq, "fact", &format!("k{}", i % 3)));
        }
        let long = format!(
            r#"{{"kind":"entry","seq":{},"timestamp":1,"id":"long","parentId":"e0","type":"message","payload":"{}"}}"#,
            seq + 1,
            "x".repeat(1000)
        );
        let cases: Vec<(&str, Vec<String>)> = vec![
            ("healthy", vec![]),
            ("torn tail", vec!["{\"kind\":\"entr".to_owned()]),
            ("torn tail that is valid JSON", vec![entry(seq + 1, "x", Some("e0"))]),
            ("syntax error on the last whole line", vec!["{not json".to_owned()]),
            ("syntax error then a torn tail", vec!["{not json".to_owned(), "{\"kind".to_owned()]),
            ("shape error on the last line", vec!["42".to_owned()]),
            ("empty line in the middle", vec![String::new(), entry(seq + 1, "x", Some("e0"))]),
            ("too long in the middle", vec![long.clone(), entry(seq + 2, "x", Some("e0"))]),
            ("too long at the end", vec![long.clone()]),
            ("duplicate id", vec![entry(seq + 1, "e0", None)]),
            ("lifecycle: requested twice", vec![tool(seq + 1, "x", "e0", "toolRequested", "i3")]),
            (
                "lifecycle: bad payload",
                vec![tool(seq + 1, "x", "e0", "toolStarted", "i3").replace("\"callId\"", "\"callid\"")],
            ),
            (
                "lifecycle anomaly then a corrupt line",
                vec![
                    tool(seq + 1, "x", "e0", "toolCompleted", "nope"),
                    "{not json".to_owned(),
                    entry(seq + 2, "y", None),
                ],
            ),
            ("an array line", vec![format!("[{},{}]", entry(seq + 1, "a", Some("e0")), set(seq + 2, "lane", "main"))]),
            (
                "lifecycle: payload before type",
                vec![
                    tool(seq + 1, "x", "e0", "toolRequested", "j1"),
                    format!(
                        r#"{{"kind":"entry","seq":{},"timestamp":1,"id":"y","parentId":"e0","payload":{{"invocationId":"j1","callId":"c","tool":"t","verdict":{{"decision":"approve","by":"p","at":1}}}},"type":"toolStarted"}}"#,
                        seq + 2
                    ),
                    tool(seq + 3, "z", "e0", "toolRequested", "j1"),
                ],
            ),
            (
                "lifecycle: bad payload in an array line",
                vec![format!(
                    "[{},{}]",
                    tool(seq + 1, "x", "e0", "toolRequested", "j1"),
                    tool(seq + 2, "y", "e0", "toolCompleted", "j1").replace("\"exitCode\":0", "\"exitCode\":\"0\"")
                )],
            ),
            (
                "not UTF-8 in a tool payload's unknown field",
                vec![
                    tool(seq + 1, "x", "e0", "toolRequested", "j1")
                        .replace("\"turnId\"", "\"extra\":\"\u{1}\",\"turnId\""),
                    entry(seq + 2, "y", Some("e0")),
                ],
            ),
        ];
        for (name, tail) in cases {
            let path = dir.path().join(format!("{}.jsonl", name.replace([' ', ':', '\''], "-")));
            let mut text = format!("{HEADER}\n");
            for line in body.iter().chain(&tail) {
                text.push_str(line);
                text.push('\n');
            }
            if name.starts_with("torn tail") || name.ends_with("torn tail") {
                text.pop();
            }
            // A byte that is not UTF-8 where a payload read inline skips.
            let text: Vec<u8> = text.into_bytes().into_iter().map(|b| if b == 1 { 0xff } else { b }).collect();
            std::fs::write(&path, text).unwrap();
            let opts = StoreOptions { max_line_bytes: 900, ..StoreOptions::default() };
            let mut tools = LifecycleCheck::default();
            let sequential = check_file_with(&path, opts, |e| tools.check(e).map_err(|e| e.to_string()));
            for threads in [0, 1, 2, 3] {
                for chunk in [1, 7, 100, 299, 300, 301, 899, 900, 901, 4096, CHUNK] {
                    let mut tools = LifecycleCheck::default();
                    let chunked = check_read_in(&path, opts, threads, chunk, &LifecycleCheck::read, &mut |e, read| {
                        tools.check_read(e.id, read).map_err(|e| e.to_string())
                    });
                    assert_eq!(chunked, sequential, "{name}, {threads} threads, chunks of {chunk}");
                    // The reader `cairn check` uses: hot payloads read inline.
                    let mut tools = LifecycleCheck::default();
                    let inline = check_read_in(&path, opts, threads, chunk, &LifecycleReader, &mut |e, read| {
                        tools.check_read(e.id, read).map_err(|e| e.to_string())
                    });
                    assert_eq!(inline, sequential, "{name}, inline reads, {threads} threads, chunks of {chunk}");
                }
            }
            let mut tools = LifecycleCheck::default();
            let public = check_file_read(&path, opts, LifecycleCheck::read, |e, read| {
                tools.check_read(e.id, read).map_err(|e| e.to_string())
            });
            assert_eq!(public, sequential, "{name}");
            let mut tools = LifecycleCheck::default();
            let public = check_file_read(&path, opts, LifecycleReader, |e, read| {
                tools.check_read(e.id, read).map_err(|e| e.to_string())
            });
            assert_eq!(public, sequential, "{name}, inline reads");
            let ok = matches!(
                name,
                "healthy"
                    | "torn tail"
                    | "torn tail that is valid JSON"
                    | "syntax error on the last whole line"
                    | "an array line"
            );
            assert_eq!(sequential.ok, ok, "{name}: {sequential:?}");
        }
    }
}
