"""One-tool scripted turn through the Python package against the `cairn`
command doing the same turn, side by side, and `import cairn`.

Usage: PYTHONPATH=<dir holding the built package> python bench/turn.py CAIRN_BIN [ROUNDS]

Each round runs, alternating, a fresh process of each: `cairn run` on the
scripted provider calling the built-in `read_file` once, and a Python
process that imports cairn and runs the same turn (`builtin_tools=
["read_file"]`). Prints each side's median wall time with its spread and
their ratio; then the time of `import cairn` in a fresh process against
`import json` (the baseline: an interpreter start). Asserts nothing.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def wall(cmd, env):
    """Wall time of the process, and what it printed."""
    start = time.perf_counter()
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return time.perf_counter() - start, out.stdout


def spread(xs):
    return f"median {statistics.median(xs) * 1000:.0f} ms (min {min(xs) * 1000:.0f}, max {max(xs) * 1000:.0f})"


def main():
    cairn_bin = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 9
    root = Path(tempfile.mkdtemp(prefix="cairn-bench-"))
    home, work = root / "home", root / "work"
    home.mkdir()
    work.mkdir()
    (work / "notes.txt").write_text("The launch code is 7-ALPHA-42.\n")
    script = root / "script.jsonl"
    script.write_text(
        json.dumps({"toolCalls": [{"id": "c1", "name": "read_file", "arguments": {"path": "notes.txt"}}]})
        + "\n"
        + json.dumps({"text": "7-ALPHA-42"})
        + "\n"
    )
    env = {**os.environ, "CAIRN_HOME": str(home)}
    cli = [cairn_bin, "run", "--quiet", "--provider", "scripted", "--script", str(script), "--cwd", str(work), "code?"]
    py = [
        sys.executable,
        "-c",
        "import time; t = time.perf_counter(); import cairn, sys; i = time.perf_counter();"
        " a = cairn.Agent(home=sys.argv[1], cwd=sys.argv[2], provider='scripted', script=sys.argv[3],"
        " builtin_tools=['read_file']); r = a.run('code?'); e = time.perf_counter();"
        " assert r.answer == '7-ALPHA-42', r; print(e - i)",
        str(home),
        str(work),
        str(script),
    ]
    # Warm the page cache for both.
    wall(cli, env)
    wall(py, env)
    cli_t, py_t, api_t, bare_t = [], [], [], []
    for _ in range(rounds):
        bare_t.append(wall([sys.executable, "-c", "pass"], env)[0])
        cli_t.append(wall(cli, env)[0])
        took, out = wall(py, env)
        py_t.append(took)
        api_t.append(float(out))
    print(f"cairn run, the whole process (one read_file call): {spread(cli_t)}")
    print(f"python, the whole process (start, import, Agent, run): {spread(py_t)}")
    print(f"python, Agent(...) + its first run() in that process: {spread(api_t)}")
    print(f"python -c pass (the interpreter's own start): {spread(bare_t)}")
    for name, xs in (("whole process", py_t), ("Agent + run", api_t)):
        ratios = [p / c for p, c in zip(xs, cli_t)]
        print(
            f"ratio python ({name}) / cairn run: {statistics.median(xs) / statistics.median(cli_t):.2f}"
            f" (per round: min {min(ratios):.2f}, max {max(ratios):.2f})"
        )

    probe = "import time; t = time.perf_counter(); import {m}; print(time.perf_counter() - t)"
    imp, base = [], []
    for _ in range(rounds):
        imp.append(float(subprocess.run([sys.executable, "-c", probe.format(m="cairn")], capture_output=True, text=True, check=True).stdout))
        base.append(float(subprocess.run([sys.executable, "-c", probe.format(m="json")], capture_output=True, text=True, check=True).stdout))
    print(f"import cairn: {spread(imp)}")
    print(f"import json (baseline): {spread(base)}")


if __name__ == "__main__":
    main()
