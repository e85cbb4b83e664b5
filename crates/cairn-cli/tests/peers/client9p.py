# A tiny raw 9P2000 client for the peer tests (tests/peers.rs): run as
# another uid, under NoNewPrivs + seccomp, in another PID or user
# namespace, or as a tool of a cairn session, it tries what an attacker
# would against `cairn serve` / `cairn toolsrv`, and prints one line:
#   ok <result>            the server served it
#   rerror <text>          the server answered with an Rerror
#   closed                 the server closed the connection
#
# usage: client9p.py [--seccomp] [--nondumpable] [--userns-of-root-as-nobody] ADDRESS new SPEC | read PATH | job JSON | attach
# ADDRESS: unix!PATH or tcp!HOST!PORT. --seccomp: set PR_SET_NO_NEW_PRIVS
# and install an allow-everything seccomp filter first (a "tool-like" peer).
# --nondumpable: PR_SET_DUMPABLE 0 first, as cairn makes itself.
# --userns-of-root-as-nobody (run as root): continue as uid 65534 inside a
# user namespace root owns.
import ctypes
import socket
import struct
import sys

NOFID = 0xFFFFFFFF


class Refused(Exception):
    pass


class Closed(Exception):
    pass


def tool_like():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    allow = (SockFilter * 1)(SockFilter(0x06, 0, 0, 0x7FFF0000))  # BPF_RET|BPF_K, SECCOMP_RET_ALLOW
    prog = SockFprog(1, allow)
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")


def nobody_in_a_user_namespace_of_root():
    # Run as root: a child enters a new user namespace (owned by root), this
    # process (outside) maps the child's root to uid/gid 65534, and the child
    # becomes that root: uid 65534 outside, in a namespace a non-root server
    # has no capability over. This process waits and passes the status on.
    import os

    libc = ctypes.CDLL(None, use_errno=True)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")
        os.write(ready_w, b"x")
        os.read(go_r, 1)
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        return
    os.read(ready_r, 1)
    with open("/proc/%d/setgroups" % pid, "w") as f:
        f.write("deny")
    for name in ("uid_map", "gid_map"):
        with open("/proc/%d/%s" % (pid, name), "w") as f:
            f.write("0 65534 1")
    os.write(go_w, b"x")
    _, status = os.waitpid(pid, 0)
    sys.stdout.flush()
    os._exit(os.waitstatus_to_exitcode(status))


def dial(address):
    parts = address.split("!")
    if parts[0] == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(parts[1])
    elif parts[0] == "tcp":
        s = socket.create_connection((parts[1], int(parts[2])))
    else:
        raise SystemExit("bad address " + address)
    s.settimeout(120)
    return s


def string(text):
    data = text.encode()
    return struct.pack("<H", len(data)) + data


class Conn:
    def __init__(self, address):
        self.sock = dial(address)
        self.tag = 0

    def recv_exact(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise Closed()
            data += chunk
        return data

    def rpc(self, ty, body, tag=None):
        if tag is None:
            self.tag += 1
            tag = self.tag
        self.sock.sendall(struct.pack("<IBH", 7 + len(body), ty, tag) + body)
        size, rty, _rtag = struct.unpack("<IBH", self.recv_exact(7))
        payload = self.recv_exact(size - 7)
        if rty == 107:
            (n,) = struct.unpack("<H", payload[:2])
            raise Refused(payload[2 : 2 + n].decode(errors="replace"))
        if rty != ty + 1:
            raise SystemExit("unexpected reply type %d to %d" % (rty, ty))
        return payload

    def version(self):
        self.rpc(100, struct.pack("<I", 8192) + string("9P2000"), tag=0xFFFF)

    def attach(self):
        self.rpc(104, struct.pack("<II", 0, NOFID) + string("peer") + string(""))

    def walk(self, path, fid):
        names = [n for n in path.split("/") if n]
        self.rpc(110, struct.pack("<IIH", 0, fid, len(names)) + b"".join(string(n) for n in names))

    def open(self, fid, mode):
        self.rpc(112, struct.pack("<IB", fid, mode))

    def write(self, fid, data):
        self.rpc(118, struct.pack("<IQI", fid, 0, len(data)) + data)

    def read_all(self, fid):
        out, offset = b"", 0
        while True:
            payload = self.rpc(116, struct.pack("<IQI", fid, offset, 4096))
            (n,) = struct.unpack("<I", payload[:4])
            if n == 0:
                return out
            out += payload[4 : 4 + n]
            offset += n

    def read_once(self, fid):
        payload = self.rpc(116, struct.pack("<IQI", fid, 0, 4096))
        (n,) = struct.unpack("<I", payload[:4])
        return payload[4 : 4 + n]

    def clunk(self, fid):
        self.rpc(120, struct.pack("<I", fid))


def main(argv):
    while argv and argv[0].startswith("--"):
        if argv[0] == "--seccomp":
            tool_like()
        elif argv[0] == "--userns-of-root-as-nobody":
            nobody_in_a_user_namespace_of_root()
        elif argv[0] == "--nondumpable":
            # As every cairn process is: a non-root server cannot read this
            # process's /proc/PID/ns/* links nor its fd table.
            if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
                raise OSError(ctypes.get_errno(), "PR_SET_DUMPABLE")
        else:
            raise SystemExit("unknown flag " + argv[0])
        argv = argv[1:]
    address, what, rest = argv[0], argv[1], argv[2:]
    try:
        c = Conn(address)
        c.version()
        c.attach()
        if what == "attach":
            result = "attached"
        elif what == "read":
            c.walk(rest[0], 1)
            c.open(1, 0)
            result = c.read_all(1).decode(errors="replace").strip()
        elif what == "new":
            c.walk("s/new", 1)
            c.open(1, 2)
            c.write(1, rest[0].encode())
            result = c.read_once(1).decode().strip()
            c.clunk(1)
        elif what == "job":
            c.walk("jobs/new", 1)
            c.open(1, 2)
            c.write(1, rest[0].encode())
            job = c.read_once(1).decode().strip()
            c.clunk(1)
            c.walk("jobs/%s/out" % job, 2)
            c.open(2, 0)
            result = c.read_all(2).decode(errors="replace").strip()
        else:
            raise SystemExit("unknown request " + what)
        print("ok " + " ".join(result.split()))
    except Refused as e:
        print("rerror " + str(e).replace("\n", " "))
    except (Closed, ConnectionResetError, BrokenPipeError):
        print("closed")


main(sys.argv[1:])
