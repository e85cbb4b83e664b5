"""Drive `cairn toolsrv` with PyPI python-9p (module py9p): list t/, read
shell's meta, run one job through jobs/new and read its out, status and
receipt. Usage: toolsrv_py9p.py ADDRESS CWD; prints OK."""
import json
import sys

from py9p import Client, Dir, OREAD, ORDWR

address, cwd = sys.argv[1:3]
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


def listdir(path):
    raw = read(path)
    names = []
    while raw:
        size = int.from_bytes(raw[:2], "little") + 2
        names.append(Dir.from_bytes(raw[:size]).name)
        raw = raw[size:]
    return names


tools = listdir("t")
assert "shell" in tools and "read_file" in tools, tools
meta = json.loads(read("t/shell/meta"))
assert meta["name"] == "shell", meta

f = fid()
c.walk(0, f, "jobs/new")
c.open(f, int(ORDWR))
request = {"tool": "shell", "arguments": {"command": "echo from-python"}, "invocation": "py-1", "cwd": cwd}
c.write(f, json.dumps(request).encode())
job = c.read(f, offset=0).decode().strip()
c.clunk(f)
assert job in listdir("jobs"), (job, listdir("jobs"))
out = read(f"jobs/{job}/out").decode()
assert out.strip() == "from-python", out
status = read(f"jobs/{job}/status").decode().strip()
assert status == "done", status
receipt = json.loads(read(f"jobs/{job}/receipt"))
assert receipt["exitCode"] == 0, receipt
print("OK")
