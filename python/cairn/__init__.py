"""cairn for Python: run durable, approved, resumable agent turns.

A thin layer over cairn's runtime (the native module ``cairn._cairn``):
sessions are the same files the ``cairn`` command reads (``cairn show``,
``cairn undo``, ``cairn resume``), a tool call cut short by a crash is
settled exactly once on resume, and calls are approved by risk tier.

    import cairn

    @cairn.tool(risk="read_only", replay="idempotent")
    def weather(city: str) -> str:
        \"\"\"Today's weather in a city.\"\"\"
        return f"sunny in {city}"

    agent = cairn.Agent(provider="openai", model="gpt-4.1-mini", tools=[weather])
    print(agent.run("Weather in Oslo?").answer)
"""

from __future__ import annotations

# `import cairn` loads only the extension: json, typing, dataclasses and
# their imports (re, enum, inspect) would triple its time. Annotations are
# not evaluated (see __init__.pyi for the types); json is imported at first
# use.
from . import _cairn

__all__ = [
    "Agent",
    "ApprovalAsked",
    "ApprovalRequest",
    "Event",
    "Final",
    "Result",
    "Retry",
    "Stream",
    "TextDelta",
    "Tool",
    "ToolCall",
    "ToolCompleted",
    "ToolFailed",
    "ToolRejected",
    "ToolRequested",
    "ToolStarted",
    "Usage",
    "tool",
]

RISKS = ("read_only", "write", "destructive")
REPLAYS = ("never", "idempotent")


def _json():
    import json

    return json


class _Record:
    """A small immutable record (what a frozen dataclass would be)."""

    __slots__ = ()
    _defaults: dict = {}

    def __init__(self, *args, **kwargs):
        names = self.__slots__
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes at most {len(names)} arguments")
        values = dict(zip(names, args))
        for name, value in kwargs.items():
            if name not in names or name in values:
                raise TypeError(f"{type(self).__name__}: unexpected or repeated argument {name!r}")
            values[name] = value
        for name in names:
            if name in values:
                value = values[name]
            elif name in self._defaults:
                value = self._defaults[name]
            else:
                raise TypeError(f"{type(self).__name__} needs {name!r}")
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __eq__(self, other):
        return type(self) is type(other) and all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __repr__(self):
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({fields})"

    __hash__ = None


# --- tools -----------------------------------------------------------------


class Tool:
    """A Python function offered to the model as a cairn tool (see :func:`tool`)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: Optional[str] = None,
        description: Optional[str] = None,
        risk: str = "write",
        replay: str = "never",
    ) -> None:
        if risk not in RISKS:
            raise ValueError(f"risk={risk!r}: a tool's risk is one of {', '.join(RISKS)}")
        if replay not in REPLAYS:
            raise ValueError(f"replay={replay!r}: a tool's replay is one of {', '.join(REPLAYS)}")
        from ._schema import schema_of

        self.fn = fn
        self.name = name or fn.__name__
        described, self.schema = schema_of(fn)
        self.description = description or described or self.name
        self.risk = risk
        self.replay = replay

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<cairn.Tool {self.name} risk={self.risk} replay={self.replay}>"

    def _native(self) -> tuple:
        fn = self.fn
        json = _json()

        def call(arguments: str) -> str:
            # An exception here is the call's failure, which the model sees.
            result = fn(**json.loads(arguments))
            if isinstance(result, str):
                return result
            return json.dumps(result)

        return (self.name, self.description, json.dumps(self.schema), self.risk, self.replay, call)


def tool(
    fn: Optional[Callable[..., Any]] = None,
    *,
    name: Optional[str] = None,
    description: Optional[str] = None,
    risk: str = "write",
    replay: str = "never",
) -> Any:
    """Make a function a cairn tool.

    Its parameters' type hints and its docstring (first paragraph, and an
    ``Args:`` section) give the JSON schema and descriptions. ``risk`` is
    ``"read_only"`` (runs without asking), ``"write"`` (the approver is asked
    unless an allow rule covers it) or ``"destructive"`` (the approver is
    always asked); ``replay`` says what a resumed session does with a call
    cut short by a crash: ``"never"`` (settled as failed and uncertain, the
    model is told) or ``"idempotent"`` (run again). A string result is what
    the model sees; anything else is sent as JSON.
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(f, name=name, description=description, risk=risk, replay=replay)

    return wrap(fn) if fn is not None else wrap


# --- results and events ------------------------------------------------------


class ApprovalRequest(_Record):
    """A call the approver is asked about."""

    __slots__ = ("tool", "arguments", "risk", "diff", "staged", "reason", "session_id", "invocation_id")
    _defaults = {"diff": None, "staged": False, "reason": None, "session_id": "", "invocation_id": ""}


class ToolCall(_Record):
    """A tool call a run settled: ``status`` is completed, failed or rejected."""

    __slots__ = ("invocation_id", "tool", "arguments", "status", "output", "uncertain")
    _defaults = {"uncertain": False}


class Usage(_Record):
    """Tokens of model calls (one event per call; totals on a :class:`Result`)."""

    __slots__ = ("input_tokens", "output_tokens", "calls")
    _defaults = {"input_tokens": 0, "output_tokens": 0, "calls": 1}


class Result(_Record):
    """How a run ended: the answer, the session's id, the settled tool calls."""

    __slots__ = ("answer", "session_id", "stop", "tool_calls", "usage", "notes")


class TextDelta(_Record):
    """More of the model's answer."""

    __slots__ = ("text",)


class Retry(_Record):
    """The model call is retried from the start: earlier deltas are void."""

    __slots__ = ("attempt",)


class ToolRequested(_Record):
    """The model asked for a call (its intent is recorded)."""

    __slots__ = ("invocation_id", "tool", "arguments", "risk")


class ApprovalAsked(_Record):
    """The approver is being asked about a call."""

    __slots__ = ("invocation_id", "tool", "risk")


class ToolStarted(_Record):
    """A call was approved and starts."""

    __slots__ = ("invocation_id", "tool")


class ToolCompleted(_Record):
    """A call finished; the model sees ``output``."""

    __slots__ = ("invocation_id", "tool", "output")


class ToolFailed(_Record):
    """A call failed, or was cut short and not re-run (``uncertain``)."""

    __slots__ = ("invocation_id", "tool", "reason", "uncertain")


class ToolRejected(_Record):
    """A call was refused before it ran."""

    __slots__ = ("invocation_id", "tool", "reason")


class Final(_Record):
    """The turn's final answer."""

    __slots__ = ("text",)


Event = (TextDelta, Retry, ToolRequested, ApprovalAsked, ToolStarted, ToolCompleted, ToolFailed, ToolRejected, Usage, Final)
"""The event classes (``isinstance(e, cairn.Event)`` holds for every event)."""

_EVENTS = {
    "text_delta": TextDelta,
    "retry": Retry,
    "tool_requested": ToolRequested,
    "approval_asked": ApprovalAsked,
    "tool_started": ToolStarted,
    "tool_completed": ToolCompleted,
    "tool_failed": ToolFailed,
    "tool_rejected": ToolRejected,
    "usage": Usage,
    "final": Final,
}

_RISK_NAMES = {"readOnly": "read_only", "write": "write", "destructive": "destructive"}


def _event(text: str) -> Event:
    data = _json().loads(text)
    kind = data.pop("type")
    if "risk" in data and data["risk"] is not None:
        data["risk"] = _RISK_NAMES.get(data["risk"], data["risk"])
    return _EVENTS[kind](**data)


def _result(text: str) -> Result:
    data = _json().loads(text)
    return Result(
        answer=data["answer"],
        session_id=data["session_id"],
        stop=data["stop"],
        tool_calls=[ToolCall(**call) for call in data["tool_calls"]],
        usage=Usage(**data["usage"]),
        notes=data["notes"],
    )


class Stream:
    """The events of a running turn, in order; ``result`` once it ended.

    Dropping a stream before its end cancels the turn (it can be resumed).
    """

    def __init__(self, native: Any) -> None:
        self._native = native
        self.result: Optional[Result] = None

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        item = next(self._native)
        kind, text = item
        if kind == "outcome":
            self.result = _result(text)
            raise StopIteration
        return _event(text)

    def cancel(self) -> None:
        """Stop the turn; it is settled as cancelled and can be resumed."""
        self._native.cancel()


# --- the agent -----------------------------------------------------------------


class Agent:
    """An agent: a provider and model, your tools, your approver.

    ``provider``/``model`` take the names the ``cairn`` command takes
    (``openai``, ``anthropic``, ``openai-responses``, ``local``,
    ``scripted`` with ``script=PATH``, or a ``[providers.NAME]`` of the
    configuration); ``home`` is cairn's home (default: the command's,
    ``$CAIRN_HOME`` or the XDG directories); ``cwd`` the working directory
    of new sessions. ``approve(request) -> bool`` is asked about every call
    the policy puts to a person (Write calls no ``allow`` rule covers, and
    every Destructive call); without it such calls are refused.
    ``builtin_tools`` offers cairn's own tools (sandboxed file and shell
    tools, ``shell`` staged): ``True`` for all, or a list of names.
    ``database`` keeps the sessions in PostgreSQL (a URL) instead of files,
    driven only by this application's processes (never by a ``cairn
    worker``: your tools live here), each under a lease of ``lease``
    seconds (default 10); :meth:`resume` in a new process claims a session
    whose process died once its lease has expired.
    """

    def __init__(
        self,
        *,
        cwd: Optional[str] = None,
        home: Optional[str] = None,
        provider: Optional[str] = None,
        model: Optional[str] = None,
        script: Optional[str] = None,
        tools: Sequence[Union[Tool, Callable[..., Any]]] = (),
        approve: Optional[Callable[[ApprovalRequest], bool]] = None,
        builtin_tools: Union[bool, Sequence[str], None] = None,
        allow: Sequence[str] = (),
        database: Optional[str] = None,
        lease: Optional[float] = None,
    ) -> None:
        offered = [t if isinstance(t, Tool) else Tool(t) for t in tools]
        ask = None
        if approve is not None:

            def ask(question: str) -> bool:
                data = _json().loads(question)
                data["risk"] = _RISK_NAMES.get(data["risk"], data["risk"])
                try:
                    return bool(approve(ApprovalRequest(**data)))
                except Exception:
                    # An approver that fails denies; say why.
                    import traceback

                    traceback.print_exc()
                    return False

        only = None
        if builtin_tools is not None and not isinstance(builtin_tools, bool):
            only = list(builtin_tools)
        self._native = _cairn.Agent(
            home=None if home is None else str(home),
            cwd=None if cwd is None else str(cwd),
            provider=provider,
            model=model,
            script=None if script is None else str(script),
            allow=list(allow),
            tools=[t._native() for t in offered],
            approve=ask,
            builtin_all=builtin_tools is True,
            builtin_only=only,
            database=database,
            lease=lease,
        )
        self.tools = offered

    @property
    def sessions_dir(self) -> str:
        """The directory of this agent's session files."""
        return str(self._native.sessions_dir)

    def run(self, prompt: str) -> Result:
        """Run ``prompt`` as the first turn of a new session.

        Tools run on a thread of cairn's, not the calling one. Ctrl-C
        (``KeyboardInterrupt``) stops the turn at its next step, once a
        running tool returns; the session keeps the interrupted turn, which
        :meth:`resume` finishes."""
        return _result(self._native.run(prompt))

    def resume(self, session_id: str) -> Result:
        """Finish the interrupted turn of ``session_id`` as ``cairn resume`` does."""
        return _result(self._native.resume(session_id))

    def stream(self, prompt: str) -> Stream:
        """Run ``prompt`` in a new session, yielding its events as they happen."""
        return Stream(self._native.stream(prompt=prompt))

    def stream_resume(self, session_id: str) -> Stream:
        """Resume ``session_id``, yielding its events as they happen."""
        return Stream(self._native.stream(resume=session_id))

    async def arun(self, prompt: str) -> Result:
        """:meth:`run` for asyncio (on a worker thread; the loop keeps running)."""
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(None, self.run, prompt)

    async def aresume(self, session_id: str) -> Result:
        """:meth:`resume` for asyncio."""
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(None, self.resume, session_id)

    async def astream(self, prompt: str):  # -> AsyncIterator[Event]
        """:meth:`stream` for asyncio: ``async for event in agent.astream(...)``."""
        import asyncio

        loop = asyncio.get_running_loop()
        stream = self.stream(prompt)
        end = object()
        while True:
            event = await loop.run_in_executor(None, next, stream, end)
            if event is end:
                return
            yield event
