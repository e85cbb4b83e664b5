"""Type stubs of the native module (``cairn._cairn``); use :mod:`cairn`."""

from os import PathLike
from typing import Callable, Optional, Sequence, Tuple, Union

_Path = Union[str, PathLike]
# (name, description, schema JSON, risk, replay, call(arguments_json) -> str)
_ToolSpec = Tuple[str, str, str, str, str, Callable[[str], str]]

class Stream:
    def __iter__(self) -> "Stream": ...
    def __next__(self) -> Tuple[str, str]: ...
    def cancel(self) -> None: ...

class Agent:
    def __init__(
        self,
        *,
        home: Optional[_Path] = None,
        cwd: Optional[_Path] = None,
        provider: Optional[str] = None,
        model: Optional[str] = None,
        script: Optional[_Path] = None,
        allow: Sequence[str] = ...,
        tools: Sequence[_ToolSpec] = ...,
        approve: Optional[Callable[[str], bool]] = None,
        builtin_all: bool = False,
        builtin_only: Optional[Sequence[str]] = None,
        database: Optional[str] = None,
        lease: Optional[float] = None,
    ) -> None: ...
    @property
    def sessions_dir(self) -> str: ...
    def run(self, prompt: str) -> str: ...
    def resume(self, session_id: str) -> str: ...
    def stream(self, prompt: Optional[str] = None, resume: Optional[str] = None) -> Stream: ...
