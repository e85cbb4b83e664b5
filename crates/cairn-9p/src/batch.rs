//! Batch jobs: a durable queue of prompts run headless, at most
//! `max_running` sessions at once (`b/` in the tree, `cairn batch`).
//!
//! A job is a directory `<batch dir>/<job>/` holding its `spec` (written to
//! a temporary directory, synced, then renamed into place, so a job exists
//! whole or not at all). `parallel=N` fans it out to N sessions, unit k
//! being the session `<job>-<k>`. Everything else is derived from files:
//! a unit is done when its session's turn has finished, failed when
//! `failed-<k>` holds a reason, cancelled when the job holds `cancelled`;
//! otherwise it is queued (or running, while a worker drives it). A
//! restarted runner re-queues every unit that is not done, failed or
//! cancelled; creating a unit's session is exclusive and a unit with a
//! session is resumed, never started again, so each unit's turn runs once
//! with the turn's own exactly-once guarantees.
//!
//! Owns: the spec format, the job directory, unit states and the worker
//! pool. Must not: ask a person (jobs are headless: Write only through
//! `allow`, Destructive refused by the core's gate), or run a unit while
//! another process runs the queue (the host keeps one runner per home).

use std::collections::{BTreeMap, VecDeque};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use anyhow::{Context as _, Result, anyhow, bail};
use cairn_core::approval::{Allowlist, PolicyApprover};
use cairn_core::report::UsageTotals;
use cairn_core::storage::registers::FACT;
use cairn_core::storage::{Header, JsonlStore, Storage, Transaction, new_session_id, to_raw};
use cairn_core::{CancelToken, Session, TurnStop};
use cairn_host::{Equipment, Step};

use crate::host::{Host, SPEC_FACT, SessionSpec};

/// The most a spec may be.
pub const MAX_SPEC: usize = 1 << 20;
/// The most sessions one spec may fan out to.
pub const MAX_PARALLEL: u32 = 64;

/// A parsed spec: `key=value` lines (`cwd` required; `provider`, `model`,
/// `script`, `parallel`, `allow` repeatable), a `---` line, the prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchSpec {
    /// Working directory of the job's sessions.
    pub cwd: PathBuf,
    /// How its sessions are driven.
    pub session: SessionSpec,
    /// Sessions the spec fans out to.
    pub parallel: u32,
    /// The prompt.
    pub prompt: String,
}

impl BatchSpec {
    /// Parse a spec; every error says which line and what is expected.
    pub fn parse(text: &str) -> Result<Self> {
        let Some((head, prompt)) = text.split_once("\n---\n").or_else(|| text.strip_prefix("---\n").map(|p| ("", p)))
        else {
            bail!("a batch spec is key=value lines, a line `---`, then the prompt; no `---` line found");
        };
        let prompt = prompt.trim().to_owned();
        if prompt.is_empty() {
            bail!("the prompt after `---` is empty");
        }
        let (mut cwd, mut session, mut parallel) = (None, SessionSpec::default(), 1u32);
        for (n, line) in head.lines().enumerate().map(|(n, l)| (n + 1, l.trim())) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                bail!("line {n}: {line:?} is not key=value");
            };
            let value = value.trim().to_owned();
            match key.trim() {
                "cwd" => cwd = Some(PathBuf::from(value)),
                "provider" => session.provider = value,
                "model" => session.model = value,
                "script" => session.script = value,
                "allow" => session.allow.push(value),
                "yes" => session.yes = crate::host::parse_yes(&value).map_err(|e| anyhow!("line {n}: {e}"))?,
                "parallel" => {
                    parallel = value.parse().ok().filter(|p| (1..=MAX_PARALLEL).contains(p)).ok_or_else(|| {
                        anyhow!("line {n}: parallel={value:?}: give a number from 1 to {MAX_PARALLEL}")
                    })?;
                }
                other => bail!("line {n}: unknown key {other:?} (known: cwd provider model script parallel allow yes)"),
            }
        }
        let cwd = cwd.ok_or_else(|| anyhow!("cwd= is required (the directory the job's sessions work in)"))?;
        Ok(Self { cwd, session, parallel, prompt })
    }

    fn render(&self) -> String {
        let mut text = format!("cwd={}\n", self.cwd.display());
        for (key, value) in
            [("provider", &self.session.provider), ("model", &self.session.model), ("script", &self.session.script)]
        {
            if !value.is_empty() {
                text.push_str(&format!("{key}={value}\n"));
            }
        }
        text.push_str(&format!("parallel={}\n", self.parallel));
        for allow in &self.session.allow {
            text.push_str(&format!("allow={allow}\n"));
        }
        if self.session.yes {
            text.push_str("yes=1\n");
        }
        text.push_str(&format!("---\n{}\n", self.prompt));
        text
    }
}

/// The file names of a job directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobFile {
    /// `queued`, `running`, `done`, `failed: reason`.
    Status,
    /// The answers.
    Result,
    /// Token totals of its sessions.
    Usage,
    /// The spec as accepted.
    Spec,
}

impl JobFile {
    /// Every file, in listing order.
    pub const ALL: [JobFile; 4] = [Self::Status, Self::Result, Self::Usage, Self::Spec];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Status => "status",
            Self::Result => "result",
            Self::Usage => "usage",
            Self::Spec => "spec",
        }
    }
}

type Unit = (String, u32);

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<Unit>,
    running: BTreeMap<Unit, CancelToken>,
}

/// The queue and its workers.
pub struct Batch {
    host: Arc<dyn Host>,
    dir: PathBuf,
    state: Mutex<State>,
    wake: Condvar,
    stopping: AtomicBool,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch").field("dir", &self.dir).finish_non_exhaustive()
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A job id as the tree accepts it.
pub fn valid_job(job: &str) -> bool {
    !job.is_empty() && !job.starts_with('.') && job.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

impl Batch {
    /// Open the queue in `dir`, re-queue every unfinished unit and start
    /// `max_running` workers.
    pub fn open(host: Arc<dyn Host>, dir: PathBuf, max_running: usize) -> Result<Arc<Self>> {
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let batch = Arc::new(Self {
            host,
            dir,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            stopping: AtomicBool::new(false),
            workers: Mutex::new(Vec::new()),
        });
        for job in batch.jobs() {
            if let Ok(spec) = batch.spec_of(&job) {
                for k in 0..spec.parallel {
                    if batch.unit_pending(&job, k) {
                        lock(&batch.state).queue.push_back((job.clone(), k));
                    }
                }
            }
        }
        let mut workers = Vec::new();
        for n in 0..max_running.max(1) {
            let worker = Arc::clone(&batch);
            workers.push(
                std::thread::Builder::new()
                    .name(format!("batch-{n}"))
                    .spawn(move || worker.work())
                    .context("cannot start a batch worker")?,
            );
        }
        *batch.workers.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = workers;
        Ok(batch)
    }

    /// Jobs not cancelled, oldest first (job ids are time-ordered).
    pub fn jobs(&self) -> Vec<String> {
        let mut jobs: Vec<String> = std::fs::read_dir(&self.dir)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                    .filter(|n| valid_job(n) && !self.dir.join(n).join("cancelled").exists())
                    .collect()
            })
            .unwrap_or_default();
        jobs.sort();
        jobs
    }

    /// Whether `job` exists and is not cancelled.
    pub fn exists(&self, job: &str) -> bool {
        valid_job(job) && self.dir.join(job).join("spec").is_file() && !self.dir.join(job).join("cancelled").exists()
    }

    /// Accept a spec: the job is durable when this returns its id.
    pub fn submit(&self, text: &str) -> Result<String> {
        if self.stopping.load(Ordering::SeqCst) {
            bail!("the batch queue is shutting down");
        }
        if text.len() > MAX_SPEC {
            bail!("the spec is longer than {MAX_SPEC} bytes");
        }
        let mut spec = BatchSpec::parse(text)?;
        spec.cwd = spec
            .cwd
            .canonicalize()
            .ok()
            .filter(|d| d.is_dir())
            .ok_or_else(|| anyhow!("cwd={}: no such directory", spec.cwd.display()))?;
        if spec.session.provider.is_empty() {
            // `script=` alone names the scripted provider (issue 49.9: the
            // job ran on the default one).
            spec.session.provider =
                if spec.session.script.is_empty() { self.host.providers().current } else { "scripted".to_owned() };
        }
        self.host.check_provider(&spec.session.provider)?;
        if !spec.session.script.is_empty() && !Path::new(&spec.session.script).is_file() {
            bail!("script={:?}: no such file", spec.session.script);
        }
        Allowlist::parse(spec.session.allow.iter().map(String::as_str)).context("allow= has an invalid pattern")?;
        let job = new_session_id();
        let temp = self.dir.join(format!(".{job}.new"));
        std::fs::create_dir_all(&temp)?;
        let mut file = std::fs::File::create(temp.join("spec"))?;
        file.write_all(spec.render().as_bytes())?;
        file.sync_all()?;
        std::fs::File::open(&temp)?.sync_all()?;
        std::fs::rename(&temp, self.dir.join(&job)).context("cannot add the job to the queue")?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        let mut state = lock(&self.state);
        state.queue.extend((0..spec.parallel).map(|k| (job.clone(), k)));
        drop(state);
        self.wake.notify_all();
        Ok(job)
    }

    fn spec_of(&self, job: &str) -> Result<BatchSpec> {
        let text = std::fs::read_to_string(self.dir.join(job).join("spec"))
            .with_context(|| format!("no batch job {job:?}"))?;
        BatchSpec::parse(&text)
    }

    fn unit_path(&self, job: &str, k: u32) -> PathBuf {
        self.host.sessions_dir().join(format!("{job}-{k}.jsonl"))
    }

    fn failure(&self, job: &str, k: u32) -> Option<String> {
        std::fs::read_to_string(self.dir.join(job).join(format!("failed-{k}"))).ok()
    }

    /// The unit's session has finished its turn.
    fn unit_done(&self, job: &str, k: u32) -> bool {
        let Ok(store) = JsonlStore::open_read_only_with(&self.unit_path(job, k), self.host.store_options()) else {
            return false;
        };
        store.entry_count() > 0 && Session::open(store, self.host.session_config()).is_ok_and(|s| !s.needs_resume())
    }

    fn unit_pending(&self, job: &str, k: u32) -> bool {
        self.exists(job) && self.failure(job, k).is_none() && !self.unit_done(job, k)
    }

    /// `status`: `queued`, `running`, `done` or `failed: reason`.
    pub fn status(&self, job: &str) -> Result<String> {
        let spec = self.spec_of(job)?;
        if self.dir.join(job).join("cancelled").exists() {
            return Ok("failed: cancelled".to_owned());
        }
        let state = lock(&self.state);
        let (mut done, mut running) = (0, 0);
        for k in 0..spec.parallel {
            if let Some(reason) = self.failure(job, k) {
                return Ok(format!("failed: {}", reason.trim()));
            }
            if state.running.contains_key(&(job.to_owned(), k)) {
                running += 1;
            } else if self.unit_done(job, k) {
                done += 1;
            }
        }
        Ok(if done == spec.parallel {
            "done"
        } else if running > 0 || done > 0 {
            "running"
        } else {
            "queued"
        }
        .to_owned())
    }

    /// `result`: each finished session's answer (`parallel` > 1: headed by
    /// `=== k ===`).
    pub fn result(&self, job: &str) -> Result<String> {
        let spec = self.spec_of(job)?;
        let mut text = String::new();
        for k in 0..spec.parallel {
            if spec.parallel > 1 {
                text.push_str(&format!("=== {k} ===\n"));
            }
            if let Ok(store) = JsonlStore::open_read_only_with(&self.unit_path(job, k), self.host.store_options())
                && let Ok(session) = Session::open(store, self.host.session_config())
                && !session.needs_resume()
            {
                text.push_str(cairn_core::report::last_answer(&session.messages()).trim_end());
                text.push('\n');
            }
        }
        Ok(text)
    }

    /// `usage`: token totals over the job's sessions.
    pub fn usage(&self, job: &str) -> Result<String> {
        let spec = self.spec_of(job)?;
        let mut totals = UsageTotals::default();
        for k in 0..spec.parallel {
            if let Ok(store) = JsonlStore::open_read_only_with(&self.unit_path(job, k), self.host.store_options()) {
                totals.merge(&UsageTotals::of(&store));
            }
        }
        Ok(format!(
            "input {}\noutput {}\ncached {}\ntotal {}\nattempts {}\nfailed {}\nsessions {}\n",
            totals.input,
            totals.output,
            totals.cached,
            totals.total(),
            totals.attempts,
            totals.failed,
            spec.parallel
        ))
    }

    /// `spec`: the spec as accepted.
    pub fn spec_text(&self, job: &str) -> Result<String> {
        Ok(self.spec_of(job)?.render())
    }

    /// The text of one file of a job.
    pub fn file(&self, job: &str, file: JobFile) -> Result<String> {
        match file {
            JobFile::Status => self.status(job).map(|s| format!("{s}\n")),
            JobFile::Result => self.result(job),
            JobFile::Usage => self.usage(job),
            JobFile::Spec => self.spec_text(job),
        }
    }

    /// `rmdir b/<job>` (9P: remove): cancel it durably (the `cancelled` mark is synced
    /// before its running turns are cancelled; they are never resumed).
    pub fn cancel(&self, job: &str) -> Result<()> {
        if !self.exists(job) {
            bail!("no batch job {job:?}");
        }
        let mark = self.dir.join(job).join("cancelled");
        std::fs::File::create(&mark)?.sync_all()?;
        std::fs::File::open(self.dir.join(job))?.sync_all()?;
        let mut state = lock(&self.state);
        state.queue.retain(|(j, _)| j != job);
        for ((j, _), cancel) in &state.running {
            if j == job {
                cancel.cancel();
            }
        }
        Ok(())
    }

    /// Block until `job` is done, failed or cancelled.
    pub fn wait(&self, job: &str) -> Result<String> {
        let mut state = lock(&self.state);
        loop {
            let busy = state.running.keys().any(|(j, _)| j == job) || state.queue.iter().any(|(j, _)| j == job);
            if !busy || self.stopping.load(Ordering::SeqCst) {
                drop(state);
                return self.status(job);
            }
            state = self.wake.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Stop: cancel running units (they are resumed at the next start) and
    /// join the workers.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        {
            let state = lock(&self.state);
            for cancel in state.running.values() {
                cancel.cancel();
            }
        }
        self.wake.notify_all();
        let workers = std::mem::take(&mut *self.workers.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        for worker in workers {
            let _ = worker.join();
        }
    }

    fn work(&self) {
        loop {
            let (unit, cancel) = {
                let mut state = lock(&self.state);
                loop {
                    if self.stopping.load(Ordering::SeqCst) {
                        return;
                    }
                    if let Some(unit) = state.queue.pop_front() {
                        let cancel = CancelToken::new();
                        state.running.insert(unit.clone(), cancel.clone());
                        break (unit, cancel);
                    }
                    state = self.wake.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
                }
            };
            let (job, k) = &unit;
            if let Err(e) = self.run_unit(job, *k, &cancel)
                && !cancel.is_cancelled()
            {
                let path = self.dir.join(job).join(format!("failed-{k}"));
                if let Ok(mut file) = std::fs::File::create(&path) {
                    let _ = writeln!(file, "{}", format!("{e:#}").replace('\n', " "));
                    let _ = file.sync_all();
                }
            }
            lock(&self.state).running.remove(&unit);
            self.wake.notify_all();
        }
    }

    /// Drive unit k of `job` to its answer: create its session once, or
    /// resume the one a killed runner left.
    fn run_unit(&self, job: &str, k: u32, cancel: &CancelToken) -> Result<()> {
        if !self.unit_pending(job, k) {
            return Ok(());
        }
        let spec = self.spec_of(job)?;
        let path = self.unit_path(job, k);
        let store = if path.exists() {
            open_unit(&path, self.host.store_options())?
        } else {
            let header = Header::new(format!("{job}-{k}"), spec.cwd.display().to_string());
            let mut store = JsonlStore::create(&self.host.sessions_dir(), header, self.host.store_options())?;
            store.commit(Transaction::new().set(FACT, SPEC_FACT, to_raw(&spec.session)?))?;
            store
        };
        let cwd = PathBuf::from(&store.header().cwd);
        let provider = self.host.provider(&spec.session, &cwd)?;
        // Headless: nobody answers a batch unit, so its registry offers no
        // Destructive tool and a Write call needs an allow rule or `yes`.
        let allow = Allowlist::parse(spec.session.allow.iter().map(String::as_str))?;
        let approver = PolicyApprover::new(allow, None);
        let approver = if spec.session.yes { approver.approve_writes("9p:yes=1") } else { approver };
        // The unit's tools as any served turn gets them (discovery's choice
        // recorded for a new turn, the recorded one on resume; the family's
        // tools, whose children are headless too).
        let prompt = (store.entry_count() == 0).then_some(spec.prompt.as_str());
        let note = |note: &str| eprintln!("cairn batch: {}", note.escape_debug());
        let (mut session, mut equipment) = Equipment::for_turn(&*self.host, store, &cwd, prompt, approver, None, note)?;
        let outcome = equipment.run(&mut session, &*provider, Step::Once(&spec.prompt), &mut |_| {}, cancel)?;
        match outcome.map(|o| o.stop) {
            Some(TurnStop::StepLimit) => bail!("the session reached its step limit"),
            Some(TurnStop::Stopped) => bail!("a pre_tool hook stopped the turn"),
            _ => Ok(()),
        }
    }
}

/// Open a unit's session to resume it. This runner owns the unit and the
/// serve lock keeps other servers out, so a writer still holding the file
/// is what a killed server left dying (a lock lives until the last process
/// holding the descriptor is gone): wait for it, bounded, before failing
/// the unit.
fn open_unit(path: &std::path::Path, options: cairn_core::storage::StoreOptions) -> Result<JsonlStore> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match JsonlStore::open(path, options) {
            Err(cairn_core::storage::StorageError::Busy { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => return Ok(other?),
        }
    }
}
