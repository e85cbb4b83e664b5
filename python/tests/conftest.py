"""Shared pieces of the package's tests: a cairn home and working directory
per test, scripts for the scripted provider, the `cairn` binary."""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def script(tmp_path: Path):
    """Write the scripted provider's turns (dicts) and return the file."""

    def write(*turns: dict) -> Path:
        path = tmp_path / "script.jsonl"
        path.write_text("".join(json.dumps(t) + "\n" for t in turns))
        return path

    return write


def call(name: str, arguments: dict, id: str = "c1") -> dict:
    """A script turn calling one tool."""
    return {"toolCalls": [{"id": id, "name": name, "arguments": arguments}]}


def answer(text: str) -> dict:
    return {"text": text}


@pytest.fixture
def cairn_bin() -> str:
    """The `cairn` binary the tests check the sessions with: $CAIRN_BIN
    (scripts/test sets it to the one it built), else `cairn` on PATH."""
    found = os.environ.get("CAIRN_BIN") or shutil.which("cairn")
    if not found:
        pytest.fail("no cairn binary: set CAIRN_BIN to it (scripts/test does) or put cairn on PATH")
    return found


def kill_once_started(argv: list, started: Path) -> None:
    """Run `argv`, wait until it creates `started` (bounded, so a broken
    child fails the test instead of hanging it), then SIGKILL it."""
    child = subprocess.Popen(argv, env=os.environ.copy())
    try:
        deadline = time.monotonic() + 120
        while not started.exists():
            if child.poll() is not None:
                pytest.fail(f"the child exited ({child.returncode}) before its tool started")
            if time.monotonic() > deadline:
                pytest.fail("the child's tool did not start within 120 s")
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    assert child.returncode == -signal.SIGKILL


def assert_resumed_once(agent, session: str, result, runs: list, marker: Path, replay: str) -> None:
    """`result` of resuming `session` after its process was killed while
    the `charge` tool ran: a `never` call settled once as failed and
    uncertain, not run again; an `idempotent` one run once more; a second
    resume finds nothing to do and runs nothing."""
    assert result.session_id == session
    assert result.answer == "Charged, or not: see above."
    assert len(result.tool_calls) == 1, result.tool_calls
    settled = result.tool_calls[0]
    if replay == "never":
        assert runs == []
        assert marker.read_text() == "ran\n"
        assert (settled.status, settled.uncertain) == ("failed", True)
    else:
        assert runs == [5]
        assert marker.read_text() == "ran\nran\n"
        assert settled.status == "completed"
    again = agent.resume(session)
    assert again.stop == "nothing" and again.tool_calls == []
    assert marker.read_text().count("ran") == (1 if replay == "never" else 2)
