"""Drive `cairn serve` with PyPI p9fs (fsspec over 9P2000, TCP only): list
the tree, create a session through s/new, prompt it and read the answer
from chat. Usage: ninep_p9fs.py PORT CWD SCRIPT; prints OK."""
import sys
import time

from p9fs import P9FileSystem

port, cwd, script = int(sys.argv[1]), sys.argv[2], sys.argv[3]
fs = P9FileSystem(host="127.0.0.1", port=port, username="tester", version="9P2000")
# p9fs walks each part of a path, so paths are relative to the root.
names = sorted(entry["name"] for entry in fs.ls("", detail=True))
assert names == ["/help", "/providers", "/s/", "/tools"], names
assert b"s/new" in fs.cat("help")
before = fs.cat("s/idx").decode().splitlines()
with fs.open("s/new", "wb") as f:
    f.write(f"cwd={cwd} provider=scripted script={script} name=fsspec".encode())
rows = [r for r in fs.cat("s/idx").decode().splitlines() if r not in before]
assert len(rows) == 1 and rows[0].endswith(" fsspec"), rows
sid = rows[0].split()[0]
with fs.open(f"s/{sid}/prompt", "wb") as f:
    f.write(b"hello")
deadline = time.time() + 60
while b"assistant: hello from fsspec" not in fs.cat(f"s/{sid}/chat"):
    if time.time() > deadline:
        sys.exit("timed out waiting for the answer")
    time.sleep(0.05)
print("OK", sid)
