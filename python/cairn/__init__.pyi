"""Type stubs of the package ``cairn`` (the module defines them without
importing ``typing``, to keep ``import cairn`` fast)."""

from os import PathLike
from typing import Any, AsyncIterator, Callable, Iterator, List, Optional, Sequence, Tuple, Union, overload

_Path = Union[str, PathLike]
RISKS: Tuple[str, ...]
REPLAYS: Tuple[str, ...]

class Tool:
    fn: Callable[..., Any]
    name: str
    description: str
    schema: dict
    risk: str
    replay: str
    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: Optional[str] = None,
        description: Optional[str] = None,
        risk: str = "write",
        replay: str = "never",
    ) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

@overload
def tool(fn: Callable[..., Any]) -> Tool: ...
@overload
def tool(
    *, name: Optional[str] = None, description: Optional[str] = None, risk: str = "write", replay: str = "never"
) -> Callable[[Callable[..., Any]], Tool]: ...

class ApprovalRequest:
    tool: str
    arguments: dict
    risk: str
    diff: Optional[str]
    staged: bool
    reason: Optional[str]
    session_id: str
    invocation_id: str
    def __init__(
        self,
        tool: str,
        arguments: dict,
        risk: str,
        diff: Optional[str] = None,
        staged: bool = False,
        reason: Optional[str] = None,
        session_id: str = "",
        invocation_id: str = "",
    ) -> None: ...

class ToolCall:
    invocation_id: str
    tool: str
    arguments: Any
    status: str
    output: str
    uncertain: bool
    def __init__(
        self, invocation_id: str, tool: str, arguments: Any, status: str, output: str, uncertain: bool = False
    ) -> None: ...

class Usage:
    input_tokens: int
    output_tokens: int
    calls: int
    def __init__(self, input_tokens: int = 0, output_tokens: int = 0, calls: int = 1) -> None: ...

class Result:
    answer: str
    session_id: str
    stop: str
    tool_calls: List[ToolCall]
    usage: Usage
    notes: List[str]
    def __init__(
        self, answer: str, session_id: str, stop: str, tool_calls: List[ToolCall], usage: Usage, notes: List[str]
    ) -> None: ...

class TextDelta:
    text: str
    def __init__(self, text: str) -> None: ...

class Retry:
    attempt: int
    def __init__(self, attempt: int) -> None: ...

class ToolRequested:
    invocation_id: str
    tool: str
    arguments: Any
    risk: Optional[str]
    def __init__(self, invocation_id: str, tool: str, arguments: Any, risk: Optional[str]) -> None: ...

class ApprovalAsked:
    invocation_id: str
    tool: str
    risk: str
    def __init__(self, invocation_id: str, tool: str, risk: str) -> None: ...

class ToolStarted:
    invocation_id: str
    tool: str
    def __init__(self, invocation_id: str, tool: str) -> None: ...

class ToolCompleted:
    invocation_id: str
    tool: str
    output: str
    def __init__(self, invocation_id: str, tool: str, output: str) -> None: ...

class ToolFailed:
    invocation_id: str
    tool: str
    reason: str
    uncertain: bool
    def __init__(self, invocation_id: str, tool: str, reason: str, uncertain: bool) -> None: ...

class ToolRejected:
    invocation_id: str
    tool: str
    reason: str
    def __init__(self, invocation_id: str, tool: str, reason: str) -> None: ...

class Final:
    text: str
    def __init__(self, text: str) -> None: ...

Event = Union[
    TextDelta, Retry, ToolRequested, ApprovalAsked, ToolStarted, ToolCompleted, ToolFailed, ToolRejected, Usage, Final
]

class Stream:
    result: Optional[Result]
    def __iter__(self) -> Iterator[Event]: ...
    def __next__(self) -> Event: ...
    def cancel(self) -> None: ...

class Agent:
    tools: List[Tool]
    def __init__(
        self,
        *,
        cwd: Optional[_Path] = None,
        home: Optional[_Path] = None,
        provider: Optional[str] = None,
        model: Optional[str] = None,
        script: Optional[_Path] = None,
        tools: Sequence[Union[Tool, Callable[..., Any]]] = (),
        approve: Optional[Callable[[ApprovalRequest], bool]] = None,
        builtin_tools: Union[bool, Sequence[str], None] = None,
        allow: Sequence[str] = (),
        database: Optional[str] = None,
        lease: Optional[float] = None,
    ) -> None: ...
    @property
    def sessions_dir(self) -> str: ...
    def run(self, prompt: str) -> Result: ...
    def resume(self, session_id: str) -> Result: ...
    def stream(self, prompt: str) -> Stream: ...
    def stream_resume(self, session_id: str) -> Stream: ...
    async def arun(self, prompt: str) -> Result: ...
    async def aresume(self, session_id: str) -> Result: ...
    def astream(self, prompt: str) -> AsyncIterator[Event]: ...
