//! The native half of the Python package `cairn` (`cairn._cairn`): an
//! `Agent` over `cairn_embed::Agent`, taking Python callables as tools and
//! approver, and handing back outcomes and events as JSON text, which
//! `cairn/__init__.py` turns into typed objects. It holds no logic of its
//! own beyond that conversion.
//!
//! The GIL is released while cairn works (`Python::detach`); a tool or the
//! approver takes it back only for its own call (`Python::attach`). A
//! Python exception in a tool is the call's failure, which the model sees.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_embed::{Builtins, CancelToken, Event, Question, Replay, Risk, ToolDef};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// A cairn error as Python's `RuntimeError`, with its causes.
fn error(e: anyhow::Error) -> PyErr {
    PyRuntimeError::new_err(format!("{e:#}"))
}

fn risk_of(name: &str) -> PyResult<Risk> {
    match name {
        "read_only" => Ok(Risk::ReadOnly),
        "write" => Ok(Risk::Write),
        "destructive" => Ok(Risk::Destructive),
        other => Err(PyValueError::new_err(format!(
            "risk={other:?}: a tool's risk is \"read_only\", \"write\" or \"destructive\""
        ))),
    }
}

fn replay_of(name: &str) -> PyResult<Replay> {
    match name {
        "never" => Ok(Replay::Never),
        "idempotent" => Ok(Replay::Idempotent),
        other => {
            Err(PyValueError::new_err(format!("replay={other:?}: a tool's replay is \"never\" or \"idempotent\"")))
        }
    }
}

/// A tool from Python: `(name, description, schema JSON, risk, replay,
/// call)`, where `call(arguments_json) -> str`.
type PyToolSpec = (String, String, String, String, String, Py<PyAny>);

fn tool_of((name, description, schema, risk, replay, call): PyToolSpec) -> PyResult<ToolDef> {
    let schema: serde_json::Value = serde_json::from_str(&schema)
        .map_err(|e| PyValueError::new_err(format!("tool {name}: its schema is not JSON: {e}")))?;
    let run = move |arguments: &serde_json::Value| -> Result<String, String> {
        let text = arguments.to_string();
        Python::attach(|py| {
            call.bind(py).call1((text,)).and_then(|out| out.extract::<String>()).map_err(|e| e.to_string())
        })
    };
    Ok(ToolDef::new(name, description, schema, risk_of(&risk)?, replay_of(&replay)?, run))
}

/// The native agent.
#[pyclass(module = "cairn._cairn", name = "Agent", frozen)]
struct Agent {
    agent: Arc<cairn_embed::Agent>,
}

#[pymethods]
impl Agent {
    #[new]
    #[pyo3(signature = (*, home=None, cwd=None, provider=None, model=None, script=None, allow=Vec::new(), tools=Vec::new(), approve=None, builtin_all=false, builtin_only=None, database=None, lease=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        home: Option<PathBuf>,
        cwd: Option<PathBuf>,
        provider: Option<String>,
        model: Option<String>,
        script: Option<PathBuf>,
        allow: Vec<String>,
        tools: Vec<PyToolSpec>,
        approve: Option<Py<PyAny>>,
        builtin_all: bool,
        builtin_only: Option<Vec<String>>,
        database: Option<String>,
        lease: Option<f64>,
    ) -> PyResult<Self> {
        let mut builder = cairn_embed::Agent::builder();
        if let Some(home) = home {
            builder = builder.home(home);
        }
        if let Some(cwd) = cwd {
            builder = builder.cwd(cwd);
        }
        if let Some(provider) = provider {
            builder = builder.provider(provider);
        }
        if let Some(model) = model {
            builder = builder.model(model);
        }
        if let Some(script) = script {
            builder = builder.script(script);
        }
        for pattern in allow {
            builder = builder.allow(pattern);
        }
        for tool in tools {
            builder = builder.tool(tool_of(tool)?);
        }
        if let Some(approve) = approve {
            builder = builder.approve(move |question: &Question| {
                let text = serde_json::to_string(question).unwrap_or_default();
                // The Python side turns an exception into a denial; one that
                // escapes it denies too.
                Python::attach(|py| approve.bind(py).call1((text,)).and_then(|r| r.is_truthy()).unwrap_or(false))
            });
        }
        builder = builder.builtin_tools(match (builtin_all, builtin_only) {
            (_, Some(names)) => Builtins::Only(names),
            (true, None) => Builtins::All,
            (false, None) => Builtins::None,
        });
        if let Some(url) = database {
            builder = builder.database(url);
        }
        if let Some(secs) = lease {
            let lease = Duration::try_from_secs_f64(secs)
                .map_err(|_| PyValueError::new_err(format!("lease={secs}: give a number of seconds, 1 to 86400")))?;
            builder = builder.lease(lease);
        }
        let agent = py.detach(|| builder.build()).map_err(error)?;
        Ok(Agent { agent: Arc::new(agent) })
    }

    /// Run `prompt` in a new session: the outcome as JSON. Ctrl-C stops
    /// the turn (settled as cancelled, resumable) and raises
    /// `KeyboardInterrupt`.
    fn run(&self, py: Python<'_>, prompt: String) -> PyResult<String> {
        let agent = Arc::clone(&self.agent);
        interruptible(py, move |cancel| agent.run_with(&prompt, &mut |_| {}, cancel))
    }

    /// Finish session `session_id`'s interrupted turn: the outcome as JSON.
    /// Ctrl-C as for [`Agent::run`].
    fn resume(&self, py: Python<'_>, session_id: String) -> PyResult<String> {
        let agent = Arc::clone(&self.agent);
        interruptible(py, move |cancel| agent.resume_with(&session_id, &mut |_| {}, cancel))
    }

    /// Run `prompt` (or resume session `resume`) on a thread of its own,
    /// its events read from the returned stream.
    #[pyo3(signature = (prompt=None, resume=None))]
    fn stream(&self, prompt: Option<String>, resume: Option<String>) -> PyResult<Stream> {
        let (tx, rx) = channel::<Item>();
        let cancel = CancelToken::new();
        let agent = Arc::clone(&self.agent);
        let token = cancel.clone();
        let job = match (prompt, resume) {
            (Some(prompt), None) => Job::Run(prompt),
            (None, Some(id)) => Job::Resume(id),
            _ => return Err(PyValueError::new_err("stream takes a prompt or resume=SESSION_ID, not both")),
        };
        std::thread::Builder::new()
            .name("cairn-stream".to_owned())
            .spawn(move || {
                let events = tx.clone();
                let mut on_event = |event: &Event| {
                    let _ = events.send(Item::Event(serde_json::to_string(event).unwrap_or_default()));
                };
                let outcome = match &job {
                    Job::Run(prompt) => agent.run_with(prompt, &mut on_event, &token),
                    Job::Resume(id) => agent.resume_with(id, &mut on_event, &token),
                };
                let _ = tx.send(match outcome {
                    Ok(outcome) => Item::Done(serde_json::to_string(&outcome).unwrap_or_default()),
                    Err(e) => Item::Failed(format!("{e:#}")),
                });
            })
            .map_err(|e| PyRuntimeError::new_err(format!("cannot start the turn's thread: {e}")))?;
        Ok(Stream { rx: Mutex::new(Some(rx)), cancel })
    }

    /// Where this agent's session files are.
    #[getter]
    fn sessions_dir(&self) -> PathBuf {
        self.agent.sessions_dir()
    }
}

enum Job {
    Run(String),
    Resume(String),
}

enum Item {
    Event(String),
    Done(String),
    Failed(String),
}

/// A running turn's events: `("event", json)` items, then one
/// `("outcome", json)`; a failure raises `RuntimeError`.
#[pyclass(module = "cairn._cairn", name = "Stream", frozen)]
struct Stream {
    rx: Mutex<Option<Receiver<Item>>>,
    cancel: CancelToken,
}

#[pymethods]
impl Stream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next item. Ctrl-C while waiting stops the turn (settled as
    /// cancelled, resumable) and raises `KeyboardInterrupt`; the stream
    /// then yields what the stopped turn sends, ending with its outcome.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<(&'static str, String)>> {
        let next = loop {
            let waited = py.detach(|| {
                let mut rx = self.rx.lock().map_err(|_| "the stream's lock is poisoned".to_owned())?;
                let Some(receiver) = rx.as_ref() else { return Ok(Some(None)) };
                let item = match receiver.recv_timeout(SIGNAL_POLL) {
                    Ok(item) => Some(item),
                    Err(RecvTimeoutError::Timeout) => return Ok(None),
                    Err(RecvTimeoutError::Disconnected) => None,
                };
                if matches!(item, None | Some(Item::Done(_) | Item::Failed(_))) {
                    *rx = None;
                }
                Ok::<_, String>(Some(item))
            });
            match waited.map_err(PyRuntimeError::new_err)? {
                Some(item) => break item,
                None => {
                    if let Err(interrupt) = py.check_signals() {
                        self.cancel.cancel();
                        return Err(interrupt);
                    }
                }
            }
        };
        match next {
            None => Ok(None),
            Some(Item::Event(json)) => Ok(Some(("event", json))),
            Some(Item::Done(json)) => Ok(Some(("outcome", json))),
            Some(Item::Failed(message)) => Err(PyRuntimeError::new_err(message)),
        }
    }

    /// Stop the turn (it is settled as cancelled and can be resumed).
    fn cancel(&self) {
        self.cancel.cancel();
    }
}

impl Drop for Stream {
    /// A stream dropped before its end stops its turn (resumable).
    fn drop(&mut self) {
        let finished = self.rx.lock().map(|rx| rx.is_none()).unwrap_or(true);
        if !finished {
            self.cancel.cancel();
        }
    }
}

/// How often a thread waiting for cairn looks at Python's signals (a
/// Ctrl-C is seen only when Python code runs, and none runs while the
/// GIL is released for a turn).
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// Run `turn` on a thread of its own while this one, without the GIL,
/// waits for it and looks at Python's signals between waits: a signal
/// handler that raises (Ctrl-C's `KeyboardInterrupt`) cancels the turn,
/// which is then waited for (it settles its calls as cancelled, so the
/// session resumes cleanly) before the exception is raised. The outcome
/// as JSON otherwise.
fn interruptible(
    py: Python<'_>,
    turn: impl FnOnce(&CancelToken) -> anyhow::Result<cairn_embed::Outcome> + Send + 'static,
) -> PyResult<String> {
    let cancel = CancelToken::new();
    let token = cancel.clone();
    let (tx, rx) = channel();
    // Behind a lock so the wait can leave the GIL: a receiver alone cannot
    // be shared across threads.
    let rx = Mutex::new(rx);
    let worker = std::thread::Builder::new()
        .name("cairn-turn".to_owned())
        .spawn(move || {
            let _ = tx.send(turn(&token));
        })
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the turn's thread: {e}")))?;
    let mut interrupt = None;
    let outcome = loop {
        let waited = py.detach(|| rx.lock().map(|rx| rx.recv_timeout(SIGNAL_POLL)).map_err(|_| ()));
        match waited.map_err(|()| PyRuntimeError::new_err("the turn's lock is poisoned"))? {
            Ok(outcome) => break Some(outcome),
            Err(RecvTimeoutError::Disconnected) => break None,
            Err(RecvTimeoutError::Timeout) => {
                if interrupt.is_none()
                    && let Err(e) = py.check_signals()
                {
                    cancel.cancel();
                    interrupt = Some(e);
                }
            }
        }
    };
    let _ = py.detach(move || worker.join());
    if let Some(interrupt) = interrupt {
        return Err(interrupt);
    }
    match outcome {
        Some(outcome) => to_json(&outcome.map_err(error)?),
        None => Err(PyRuntimeError::new_err("the turn's thread ended without an outcome (it panicked)")),
    }
}

fn to_json(value: &impl serde::Serialize) -> PyResult<String> {
    serde_json::to_string(value).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// The module `cairn._cairn`.
#[pymodule]
fn _cairn(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Agent>()?;
    m.add_class::<Stream>()?;
    Ok(())
}
