"""The same durability as the CLI: a Python process killed with SIGKILL
while a tool runs leaves a session that a new process resumes, settling
the call once (uncertain for replay="never", re-run for "idempotent"),
and the sessions are the files the `cairn` command reads."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import cairn
from conftest import answer, assert_resumed_once, call, kill_once_started

# The child: one turn whose tool records that it ran, says it started,
# and then blocks until it is killed.
CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import cairn

    home, work, script, marker, started, replay = sys.argv[1:7]

    @cairn.tool(name="charge", risk="write", replay=replay)
    def charge(amount: int) -> str:
        with open(marker, "a") as f:
            f.write("ran\\n")
        Path(started).write_text("1")
        time.sleep(3600)
        return "charged"

    agent = cairn.Agent(home=home, cwd=work, provider="scripted", script=script, tools=[charge], approve=lambda r: True)
    agent.run("charge 5")
    """
)


def kill_while_the_tool_runs(tmp_path: Path, home: Path, work: Path, script: Path, replay: str) -> Path:
    marker, started = tmp_path / "marker", tmp_path / "started"
    kill_once_started(
        [sys.executable, "-c", CHILD, str(home), str(work), str(script), str(marker), str(started), replay], started
    )
    return marker


def only_session(home: Path) -> str:
    files = sorted((home / "sessions").glob("*.jsonl"))
    assert len(files) == 1, files
    return files[0].stem


@pytest.mark.parametrize("replay", ["never", "idempotent"])
def test_sigkill_mid_tool_then_resume_in_a_new_process_settles_the_call_once(
    tmp_path, home, work, script, cairn_bin, replay
):
    path = script(call("charge", {"amount": 5}), answer("Charged, or not: see above."))
    marker = kill_while_the_tool_runs(tmp_path, home, work, path, replay)
    assert marker.read_text() == "ran\n"
    session = only_session(home)

    runs = []

    @cairn.tool(name="charge", risk="write", replay=replay)
    def charge(amount: int) -> str:
        runs.append(amount)
        with open(marker, "a") as f:
            f.write("ran\n")
        return "charged"

    # This process is not the one that was killed.
    agent = cairn.Agent(home=home, cwd=work, provider="scripted", script=path, tools=[charge], approve=lambda r: True)
    assert_resumed_once(agent, session, agent.resume(session), runs, marker, replay)
    # The command reads the same file: one settlement of the call.
    shown = subprocess.run(
        [cairn_bin, "show", session], env={**os.environ, "CAIRN_HOME": str(home)}, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    settlement = "tool uncertain: charge" if replay == "never" else "tool completed: charge"
    assert shown.stdout.count("tool requested: charge") == 1, shown.stdout
    assert shown.stdout.count(settlement) == 1, shown.stdout


def test_the_cli_shows_and_undoes_a_session_python_wrote(home, work, script, cairn_bin):
    path = script(call("write_file", {"path": "hello.txt", "content": "hi\n"}), answer("wrote it"))
    agent = cairn.Agent(
        home=home, cwd=work, provider="scripted", script=path, builtin_tools=["write_file"], approve=lambda r: True
    )
    result = agent.run("write hello.txt")
    assert result.tool_calls[0].status == "completed", result.tool_calls
    assert (work / "hello.txt").read_text() == "hi\n"
    env = {**os.environ, "CAIRN_HOME": str(home)}

    shown = subprocess.run([cairn_bin, "show", result.session_id], env=env, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert "write hello.txt" in shown.stdout and "wrote it" in shown.stdout

    undone = subprocess.run([cairn_bin, "undo", result.session_id], env=env, capture_output=True, text=True)
    assert undone.returncode == 0, undone.stderr
    assert not (work / "hello.txt").exists()

    resumed = subprocess.run(
        [cairn_bin, "resume", result.session_id, "--script", str(path)], env=env, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "nothing to resume" in resumed.stderr


# The child for Ctrl-C: its SIGINT handler notes that it ran (so the test
# knows the interrupt was seen while the turn was still going) before
# raising KeyboardInterrupt as Python's default does; the tool blocks
# until the test releases it.
CTRL_C_CHILD = textwrap.dedent(
    """
    import signal, sys, time
    from pathlib import Path
    import cairn

    home, work, script, started, seen, release = sys.argv[1:7]

    def on_sigint(signum, frame):
        Path(seen).write_text("1")
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)

    @cairn.tool(name="slow", risk="read_only", replay="never")
    def slow() -> str:
        Path(started).write_text("1")
        while not Path(release).exists():
            time.sleep(0.02)
        return "slow done"

    agent = cairn.Agent(home=home, cwd=work, provider="scripted", script=script, tools=[slow])
    try:
        agent.run("go slowly")
    except KeyboardInterrupt:
        sys.exit(3)
    sys.exit(0)
    """
)


def wait_for(path: Path, child: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        if child.poll() is not None:
            pytest.fail(f"the child exited ({child.returncode}) before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within 120 s")
        time.sleep(0.02)


def test_ctrl_c_stops_the_turn_raises_keyboard_interrupt_and_the_session_resumes(tmp_path, home, work, script):
    path = script(call("slow", {}), answer("Finished after the interruption."))
    started, seen, release = tmp_path / "started", tmp_path / "seen", tmp_path / "release"
    child = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_CHILD, str(home), str(work), str(path), str(started), str(seen), str(release)],
        env=os.environ.copy(),
    )
    try:
        wait_for(started, child, "its tool started")
        child.send_signal(signal.SIGINT)
        # Seen while the turn still runs (the tool is still blocked): a
        # run that left the GIL without looking at signals would see it
        # only after the turn ended.
        wait_for(seen, child, "the interrupt was seen while the turn ran")
        release.write_text("1")
        assert child.wait(timeout=120) == 3, "run() raised KeyboardInterrupt"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    # The turn stopped before asking the model again: the session has a
    # turn to finish, and a new process finishes it.
    session = only_session(home)

    @cairn.tool(name="slow", risk="read_only", replay="never")
    def slow() -> str:
        return "slow done"

    agent = cairn.Agent(home=home, cwd=work, provider="scripted", script=path, tools=[slow])
    result = agent.resume(session)
    assert result.stop != "nothing", "the interrupted turn had been finished"
    assert result.answer == "Finished after the interruption."
