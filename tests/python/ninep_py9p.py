"""Drive `cairn serve` with PyPI python-9p (module py9p): create a session,
prompt it, answer one approval y and one n, follow chat and event, read
usage and idx. Usage: ninep_py9p.py ADDRESS CWD SCRIPT TAG; prints OK."""
import json
import sys
import time

from py9p import Client, Dir, OREAD, OWRITE, ORDWR

address, cwd, script, tag = sys.argv[1:5]
proto, *rest = address.split("!")
if proto == "unix":
    c = Client.connect_unix(rest[0], msize=65536)
else:
    c = Client.connect_tcp(rest[0], int(rest[1]), msize=65536)
c.negotiate()
c.attach(fid=0, uname="tester")
next_fid = [10]


def fid():
    next_fid[0] += 1
    return next_fid[0]


def read(path):
    f = fid()
    c.walk(0, f, path)
    c.open(f, int(OREAD))
    out = b""
    while True:
        chunk = c.read(f, offset=len(out))
        if not chunk:
            break
        out += chunk
    c.clunk(f)
    return out


def write(path, data):
    f = fid()
    c.walk(0, f, path)
    c.open(f, int(OWRITE))
    c.write(f, data)
    c.clunk(f)


def listdir(path):
    raw = read(path)
    names = []
    while raw:
        size = int.from_bytes(raw[:2], "little") + 2
        names.append(Dir.from_bytes(raw[:size]).name)
        raw = raw[size:]
    return names


def wait(what, check):
    deadline = time.time() + 60
    while not check():
        if time.time() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.02)


assert read("s/new").startswith(b"cwd= provider="), read("s/new")
f = fid()
c.walk(0, f, "s/new")
c.open(f, int(ORDWR))
c.write(f, f"cwd={cwd} provider=scripted script={script} name=py-{tag}".encode())
sid = c.read(f, offset=0).decode().strip()
c.clunk(f)
assert sid and " " not in sid, sid
write(f"s/{sid}/prompt", b"write two files")
for answer in (b"y", b"n"):
    pending = []

    def some():
        pending[:] = listdir(f"s/{sid}/approvals")
        return bool(pending)

    wait("an approval", some)
    shown = read(f"s/{sid}/approvals/{pending[0]}").decode()
    assert "tool: write_file" in shown, shown
    write(f"s/{sid}/approvals/{pending[0]}", answer)
wait("the answer", lambda: f"assistant: done {tag}".encode() in read(f"s/{sid}/chat"))
wait("idle", lambda: read(f"s/{sid}/state") == b"idle\n")
events = []
f = fid()
c.walk(0, f, f"s/{sid}/event")
c.open(f, int(OREAD))
buf = b""
while b'"turnEnd"' not in buf:
    buf += c.read(f, offset=len(buf))
c.clunk(f)
types = [json.loads(line)["type"] for line in buf.decode().splitlines()]
for t in ("turnStarted", "approvalAsked", "toolCompleted", "toolRejected", "turnEnd"):
    assert t in types, (t, types)
usage = read(f"s/{sid}/usage").decode()
assert "attempts 3" in usage, usage
idx = read("s/idx").decode()
assert any(line.startswith(sid) and line.endswith(f"py-{tag}") for line in idx.splitlines()), idx
print("OK", sid)
