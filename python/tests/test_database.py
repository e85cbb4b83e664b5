"""`database=`: sessions in PostgreSQL, driven only by the application.

The server is the throwaway cluster `tests/pytest.rs` starts for the run
($CAIRN_TEST_DATABASE). A session an application creates is claimed by id
by the application's own process under a lease, never by a `cairn worker`
(the application's tools live only in its processes); after a SIGKILL a
new process's `agent.resume(id)` claims it once the dead process's lease
has expired and settles the cut-off call once."""

import json
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

# Short, so a dead process's session is free again soon, yet with a
# margin (a quarter of it) no stall of a loaded machine eats.
LEASE = 2.0


@pytest.fixture
def database() -> str:
    url = os.environ.get("CAIRN_TEST_DATABASE")
    if not url:
        pytest.fail(
            "CAIRN_TEST_DATABASE is not set: these tests run inside "
            "`cargo test -p cairn-python --all-features --test pytest`, which starts PostgreSQL"
        )
    return url


def cli(cairn_bin: str, home: Path, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [cairn_bin, *args], env={**os.environ, "CAIRN_HOME": str(home)}, capture_output=True, text=True
    )
    assert done.returncode == 0, f"cairn {' '.join(args)}: {done.stderr}"
    return done


def sessions_in(cairn_bin: str, home: Path, database: str, work: Path) -> list:
    """The database's sessions working in `work` (the database is shared
    by the run's tests; each test works in its own directory)."""
    out = cli(cairn_bin, home, "--database", database, "--json", "sessions").stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [r for r in rows if r["cwd"] == str(work.resolve())]


def test_a_turn_with_a_python_tool_is_kept_in_the_database(home, work, script, cairn_bin, database):
    @cairn.tool(risk="read_only")
    def add(a: int, b: int) -> str:
        """Add two numbers."""
        return str(a + b)

    path = script(call("add", {"a": 2, "b": 3}), answer("It is 5."))
    agent = cairn.Agent(home=home, cwd=work, provider="scripted", script=path, tools=[add], database=database)
    result = agent.run("what is 2 + 3?")
    assert result.answer == "It is 5."
    assert [(c.tool, c.status, c.output) for c in result.tool_calls] == [("add", "completed", "5")]
    # In the database, not in a file.
    assert not list((home / "sessions").glob("*.jsonl"))
    [row] = sessions_in(cairn_bin, home, database, work)
    assert row["id"] == result.session_id and row["backend"] == "postgres" and row["state"] == "idle", row
    shown = cli(cairn_bin, home, "--database", database, "show", result.session_id).stdout
    assert shown.count("tool completed: add") == 1, shown
    # Nothing left to resume; a prompt submitted to it is refused (no
    # worker would ever take it).
    assert agent.resume(result.session_id).stop == "nothing"
    submitted = subprocess.run(
        [cairn_bin, "--database", database, "submit", "--session", result.session_id, "more"],
        env={**os.environ, "CAIRN_HOME": str(home)},
        capture_output=True,
        text=True,
    )
    assert submitted.returncode != 0 and "driven only by it" in submitted.stderr, submitted.stderr
    # Nor is it requeued for the workers (none would take it).
    requeued = subprocess.run(
        [cairn_bin, "--database", database, "requeue", result.session_id],
        env={**os.environ, "CAIRN_HOME": str(home)},
        capture_output=True,
        text=True,
    )
    assert requeued.returncode != 0 and "driven only by it" in requeued.stderr, requeued.stderr


# The child: one turn in the database whose tool records that it ran, says
# it started, and blocks until it is killed.
CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import cairn

    home, work, script, marker, started, replay, database, lease = sys.argv[1:9]

    @cairn.tool(name="charge", risk="write", replay=replay)
    def charge(amount: int) -> str:
        with open(marker, "a") as f:
            f.write("ran\\n")
        Path(started).write_text("1")
        time.sleep(3600)
        return "charged"

    agent = cairn.Agent(home=home, cwd=work, provider="scripted", script=script, tools=[charge],
                        approve=lambda r: True, database=database, lease=float(lease))
    agent.run("charge 5")
    """
)


def kill_while_the_tool_runs(tmp_path, home, work, script, replay, database) -> Path:
    marker, started = tmp_path / "marker", tmp_path / "started"
    args = [str(home), str(work), str(script), str(marker), str(started), replay, database, str(LEASE)]
    kill_once_started([sys.executable, "-c", CHILD, *args], started)
    return marker


def resume_and_check(home, work, path, marker, replay, session, database, cairn_bin):
    runs = []

    @cairn.tool(name="charge", risk="write", replay=replay)
    def charge(amount: int) -> str:
        runs.append(amount)
        with open(marker, "a") as f:
            f.write("ran\n")
        return "charged"

    # This process is not the one that was killed; its resume waits for the
    # dead process's lease to expire, then claims the session.
    agent = cairn.Agent(
        home=home, cwd=work, provider="scripted", script=path, tools=[charge],
        approve=lambda r: True, database=database, lease=LEASE,
    )
    assert_resumed_once(agent, session, agent.resume(session), runs, marker, replay)
    shown = cli(cairn_bin, home, "--database", database, "show", session).stdout
    settlement = "tool uncertain: charge" if replay == "never" else "tool completed: charge"
    assert shown.count("tool requested: charge") == 1, shown
    assert shown.count(settlement) == 1, shown


@pytest.mark.parametrize("replay", ["never", "idempotent"])
def test_sigkill_mid_tool_then_resume_in_a_new_process_settles_the_call_once(
    tmp_path, home, work, script, cairn_bin, database, replay
):
    path = script(call("charge", {"amount": 5}), answer("Charged, or not: see above."))
    marker = kill_while_the_tool_runs(tmp_path, home, work, path, replay, database)
    assert marker.read_text() == "ran\n"
    [row] = sessions_in(cairn_bin, home, database, work)
    resume_and_check(home, work, path, marker, replay, row["id"], database, cairn_bin)


def test_a_running_worker_does_not_take_the_applications_session(
    tmp_path, home, work, script, cairn_bin, database
):
    path = script(call("charge", {"amount": 5}), answer("Charged, or not: see above."))
    worker_script = tmp_path / "worker.jsonl"
    worker_script.write_text(json.dumps(answer("done by the worker")) + "\n")
    worker = subprocess.Popen(
        [cairn_bin, "--database", database, "--provider", "scripted", "--script", str(worker_script),
         "worker", "--lease", "1"],
        env={**os.environ, "CAIRN_HOME": str(home)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        marker = kill_while_the_tool_runs(tmp_path, home, work, path, "never", database)
        [row] = sessions_in(cairn_bin, home, database, work)
        app_session = row["id"]
        # The dead process's lease has surely ended (its last renewal came
        # before the kill): by the workers' rule its session is now runnable.
        time.sleep(LEASE + 0.3)
        # A session of the workers', submitted after: the worker claims the
        # oldest runnable session first, so once it has finished this one it
        # has passed over the application's.
        other = tmp_path / "other"
        other.mkdir()
        submitted = cli(cairn_bin, home, "--database", database, "--cwd", str(other), "submit", "hello").stdout.strip()
        deadline = time.monotonic() + 120
        while True:
            rows = sessions_in(cairn_bin, home, database, other)
            if rows and rows[0]["state"] == "idle" and rows[0]["lastSeq"]:
                break
            if worker.poll() is not None:
                pytest.fail(f"the worker exited: {worker.stderr.read()}")
            if time.monotonic() > deadline:
                pytest.fail(f"the worker did not finish session {submitted} within 120 s: {rows}")
            time.sleep(0.1)
        [row] = sessions_in(cairn_bin, home, database, work)
        assert row["state"] == "running", row  # still the dead process's
        resume_and_check(home, work, path, marker, "never", app_session, database, cairn_bin)
    finally:
        worker.send_signal(signal.SIGINT)
        try:
            _, err = worker.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            _, err = worker.communicate()
    assert f"claimed {submitted}" in err, err
    assert app_session not in err, err
