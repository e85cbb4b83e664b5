//! Who may speak to cairn's control plane: the one rule both servers
//! (`cairn serve` and `cairn toolsrv`, through `NineServer::spawn`) apply to
//! every connection before serving a single message. 9P here has no
//! authentication, and whoever drives these servers can run tools as the
//! user who started them, so a peer must be **the same user as the server,
//! and not a process cairn started as a tool**.
//!
//! Unix sockets: the peer's credentials at `connect` come from the kernel
//! (`SO_PEERCRED`); the socket's 0600 mode and private directory are a
//! second wall, not the only one (a loosened mode changes nothing here).
//! TCP: loopback is not a boundary between users, so the peer's own socket
//! is looked up in `/proc/net/tcp` and `/proc/net/tcp6` (the line whose
//! local address is the peer's and whose remote address is ours) and its
//! owner uid compared; the processes holding that socket are found by
//! scanning `/proc/*/fd` for `socket:[INODE]` (bounded) and checked like a
//! Unix peer.
//!
//! The marks of a tool, each one a tool cannot undo (cairn-tools' sandbox
//! sets them between `fork` and `exec`, for every tool, sandboxed or not):
//! - `NoNewPrivs: 1` together with `Seccomp: 2` in `/proc/PID/status`:
//!   `PR_SET_NO_NEW_PRIVS` and a seccomp filter are inherited by every
//!   descendant and can never be cleared. Cost: a legitimate client run
//!   under both (a systemd unit with `NoNewPrivileges=yes` and a
//!   `SystemCallFilter=`, a container runtime's default profile, or a
//!   process started by another sandbox) is refused too; the refusal says
//!   so and what to do (run the client outside that confinement). Either
//!   mark alone is accepted: `NoNewPrivs` alone is common (`setpriv`,
//!   sudo-less shells), and a filter without it needs privilege.
//! - another PID namespace (tools get their own where the kernel allows):
//!   the peer's `/proc/PID/ns/pid` differs from the server's, or, where
//!   that link cannot be read (a non-root server may not read the link of a
//!   non-dumpable process, and every cairn process is one), its `NSpid:`
//!   line has another depth than the server's. A peer pid of 0 (its
//!   process is not visible in the server's PID namespace) is refused.
//!   Cost: a client in a container of its own cannot use a server outside
//!   it (and never could safely).
//! - another user namespace: `/proc/PID/ns/user` differs, or where that
//!   link cannot be read, `/proc/PID/uid_map` or `gid_map` differs from
//!   the server's. Cost: as for PID namespaces.
//!
//! The process a pid names is pinned while it is checked: the peer's
//! pidfd (`SO_PEERPIDFD`, Linux ≥ 6.5, else `pidfd_open` right after
//! accept, Linux ≥ 5.3) must still be alive once `/proc/PID` was read, so
//! a peer that exits and has its pid taken by another process is refused,
//! not judged by the newcomer (before 5.3 the check runs unpinned). The
//! holders of a TCP socket are checked by pid as the scan finds them, not
//! pinned: one that exits in between is refused for want of its status.
//!
//! Limits (said in the README too): the TCP "not a tool" check needs the
//! server to see the fd table of a process holding the peer's socket.
//! Root always can. A non-root server cannot read `/proc/PID/fd` of a
//! non-dumpable process (every cairn process is one, and a tool can make
//! itself one). When no holder is visible, a non-root server checks every
//! process of its uid it could not look into (their `status`, `uid_map`
//! are still readable): if any bears a tool's marks, the peer is refused
//! (it may be that process), else it is accepted on its uid. Cost: while a
//! non-dumpable tool-marked process of the user exists, a non-dumpable TCP
//! client of a non-root server is refused too (a tool without the
//! `Network` capability cannot open a TCP socket at all). Unix sockets
//! have no such gap: prefer them. A remote peer (its socket is not in this
//! network namespace) is refused on a loopback listener and accepted only
//! on a listener opened with `--listen-insecure`, the explicit opt-in for
//! unauthenticated remote clients.
//!
//! Refusals are visible: the server logs one line on its stderr and
//! answers the client's first message with an `Rerror` carrying the reason
//! (see `server.rs`), then closes the connection.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Why a peer is refused: the text the client gets as its Rerror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn refuse<T>(why: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal(format!("cairn refuses this connection: {}", why.into())))
}

/// What to do about a refused legitimate client run under NoNewPrivs and
/// seccomp.
const TOOL_HINT: &str = "processes cairn starts as tools may not drive cairn; if this is a legitimate client \
                         running under NoNewPrivileges and a seccomp filter (e.g. a systemd unit with \
                         NoNewPrivileges=yes and SystemCallFilter=), run it outside that confinement";

/// The fields of `/proc/PID/status` the rule reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// `NoNewPrivs: 1`.
    pub no_new_privs: bool,
    /// `Seccomp:` (0 none, 1 strict, 2 filter).
    pub seccomp: u32,
    /// How many pids `NSpid:` lists (0 where the kernel has no such line).
    pub nspid_depth: usize,
    /// The effective uid (the second field of `Uid:`).
    pub euid: Option<u32>,
}

/// Parse the text of `/proc/PID/status`.
pub fn parse_status(text: &str) -> Status {
    let mut status = Status::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        match key {
            "NoNewPrivs" => status.no_new_privs = value == "1",
            "Seccomp" => status.seccomp = value.parse().unwrap_or(0),
            "NSpid" => status.nspid_depth = value.split_whitespace().count(),
            "Uid" => status.euid = value.split_whitespace().nth(1).and_then(|u| u.parse().ok()),
            _ => {}
        }
    }
    status
}

/// One line of `/proc/net/tcp` or `/proc/net/tcp6`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpEntry {
    /// The socket's own address.
    pub local: SocketAddr,
    /// The address it is connected to.
    pub remote: SocketAddr,
    /// The state (1 = established, 10 = listen, …).
    pub state: u8,
    /// The uid that owns the socket.
    pub uid: u32,
    /// The socket's inode (0 for a socket no process holds, e.g. TIME_WAIT).
    pub inode: u64,
}

/// Parse one line of `/proc/net/tcp{,6}` (`None` for the header and for
/// anything malformed). Addresses are printed by the kernel as 32-bit
/// words in the host's byte order, each as 8 hex digits; ports as 4 hex
/// digits in network order.
pub fn parse_tcp_line(line: &str) -> Option<TcpEntry> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
    if fields.len() < 10 || !fields[0].ends_with(':') {
        return None;
    }
    Some(TcpEntry {
        local: parse_tcp_address(fields[1])?,
        remote: parse_tcp_address(fields[2])?,
        state: u8::from_str_radix(fields[3], 16).ok()?,
        uid: fields[7].parse().ok()?,
        inode: fields[9].parse().ok()?,
    })
}

fn parse_tcp_address(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |chunk: &str| u32::from_str_radix(chunk, 16).ok().map(u32::to_ne_bytes);
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(ip)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for (i, out) in bytes.chunks_mut(4).enumerate() {
                out.copy_from_slice(&word(ip.get(i * 8..i * 8 + 8)?)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// `addr` with an IPv4-mapped IPv6 address as plain IPv4 (a dual-stack
/// listener sees a v4 peer as `::ffff:a.b.c.d`; the peer's own line says
/// `a.b.c.d`).
fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// The peer's socket among `lines`: the line whose local address is
/// `peer` and whose remote address is `ours` (and that a process holds).
pub fn find_peer_socket<'a>(
    lines: impl IntoIterator<Item = &'a str>,
    peer: SocketAddr,
    ours: SocketAddr,
) -> Option<TcpEntry> {
    let (peer, ours) = (canonical(peer), canonical(ours));
    lines
        .into_iter()
        .filter_map(parse_tcp_line)
        .find(|e| e.inode != 0 && canonical(e.local) == peer && canonical(e.remote) == ours)
}

/// The server's own identity, read once per listener.
#[derive(Debug, Clone)]
pub struct Me {
    uid: u32,
    status: Status,
    pid_ns: Option<std::path::PathBuf>,
    user_ns: Option<std::path::PathBuf>,
    uid_map: Option<String>,
    gid_map: Option<String>,
}

impl Me {
    /// The calling process.
    pub fn current() -> Self {
        let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        Self {
            uid: sys::euid(),
            status: parse_status(&text),
            pid_ns: std::fs::read_link("/proc/self/ns/pid").ok(),
            user_ns: std::fs::read_link("/proc/self/ns/user").ok(),
            uid_map: std::fs::read_to_string("/proc/self/uid_map").ok(),
            gid_map: std::fs::read_to_string("/proc/self/gid_map").ok(),
        }
    }

    /// Check the process `pid` (a Unix peer, or a holder of a TCP peer's
    /// socket): same effective uid, not marked as a tool, same PID and user
    /// namespace.
    pub fn check_process(&self, pid: u32) -> Result<(), Refusal> {
        if pid == 0 {
            return refuse(
                "the peer's process is not visible in this server's PID namespace (it runs in another \
                 container or namespace, as cairn's tools may)",
            );
        }
        let proc_dir = format!("/proc/{pid}");
        let status = match std::fs::read_to_string(format!("{proc_dir}/status")) {
            Ok(text) => parse_status(&text),
            Err(e) => return refuse(format!("cannot read {proc_dir}/status ({e}): the peer is gone or hidden")),
        };
        if status.euid != Some(self.uid) {
            let uid = status.euid.map_or_else(|| "unknown".to_owned(), |u| u.to_string());
            return refuse(format!(
                "the peer (pid {pid}) runs as uid {uid}, this server as uid {}: only the same user may connect",
                self.uid
            ));
        }
        if status.no_new_privs && status.seccomp == 2 {
            return refuse(format!(
                "the peer (pid {pid}) runs with NoNewPrivs and a seccomp filter, as every tool cairn starts \
                 does: {TOOL_HINT}"
            ));
        }
        let other_pid_ns = match std::fs::read_link(format!("{proc_dir}/ns/pid")) {
            Ok(link) => self.pid_ns.as_ref() != Some(&link),
            Err(e) if denied(&e) => status.nspid_depth != self.status.nspid_depth,
            Err(e) => return refuse(format!("cannot read {proc_dir}/ns/pid ({e})")),
        };
        if other_pid_ns {
            return refuse(format!(
                "the peer (pid {pid}) runs in another PID namespace than this server, as cairn's tools do; \
                 {TOOL_HINT}"
            ));
        }
        let other_user_ns = match std::fs::read_link(format!("{proc_dir}/ns/user")) {
            Ok(link) => self.user_ns.as_ref() != Some(&link),
            Err(e) if denied(&e) => {
                std::fs::read_to_string(format!("{proc_dir}/uid_map")).ok() != self.uid_map
                    || std::fs::read_to_string(format!("{proc_dir}/gid_map")).ok() != self.gid_map
            }
            Err(e) => return refuse(format!("cannot read {proc_dir}/ns/user ({e})")),
        };
        if other_user_ns {
            return refuse(format!(
                "the peer (pid {pid}) runs in another user namespace than this server, as cairn's tools may; \
                 {TOOL_HINT}"
            ));
        }
        Ok(())
    }

    /// Check the peer of an accepted Unix stream; a label for the log.
    pub fn check_unix(&self, stream: &std::os::unix::net::UnixStream) -> Result<String, Refusal> {
        let cred = match sys::peer_cred(stream) {
            Ok(cred) => cred,
            Err(e) => return refuse(format!("cannot read the peer's credentials (SO_PEERCRED): {e}")),
        };
        if cred.uid != self.uid {
            return refuse(format!(
                "the peer runs as uid {}, this server as uid {}: only the same user may connect",
                cred.uid, self.uid
            ));
        }
        let pin = sys::Pin::peer(stream, cred.pid);
        self.check_process(cred.pid)?;
        pin.still_alive(cred.pid)?;
        Ok(format!("pid {} uid {}", cred.pid, cred.uid))
    }

    /// Check the peer of an accepted TCP stream (`remote_ok`: the listener
    /// was opened with `--listen-insecure`); a label for the log.
    pub fn check_tcp(&self, stream: &std::net::TcpStream, remote_ok: bool) -> Result<String, Refusal> {
        let (Ok(peer), Ok(ours)) = (stream.peer_addr(), stream.local_addr()) else {
            return refuse("cannot read the connection's addresses");
        };
        let mut found = None;
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            if let Ok(text) = std::fs::read_to_string(table) {
                found = find_peer_socket(text.lines(), peer, ours);
            }
            if found.is_some() {
                break;
            }
        }
        let Some(entry) = found else {
            if remote_ok && !peer.ip().to_canonical().is_loopback() {
                return Ok(format!("{peer} (remote, accepted on a --listen-insecure listener)"));
            }
            return refuse(format!(
                "the peer {peer} is not a socket of this machine's network namespace (not in \
                 /proc/net/tcp); remote peers are accepted only on a listener opened with --listen-insecure"
            ));
        };
        if entry.uid != self.uid {
            return refuse(format!(
                "the peer {peer} is a socket of uid {}, this server runs as uid {}: only the same user may \
                 connect (loopback is not a boundary between users)",
                entry.uid, self.uid
            ));
        }
        let scan = scan_holders(entry.inode);
        for &pid in &scan.holders {
            self.check_process(pid)?;
        }
        if scan.holders.is_empty() {
            if self.uid == 0 || scan.hidden.is_empty() {
                return refuse(format!("no process visible to this server holds the peer's socket {peer}"));
            }
            // See the module doc: a non-root server cannot see a
            // non-dumpable holder's fds. The holder is one of the processes
            // it could not look into; if any of those of this uid bears a
            // tool's marks, it may be the peer.
            for &pid in &scan.hidden {
                let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { continue };
                if parse_status(&text).euid != Some(self.uid) {
                    continue;
                }
                if let Err(why) = self.check_process(pid) {
                    return refuse(format!(
                        "this server cannot see which process holds the peer's socket {peer}, and a process \
                         of this uid it cannot look into may be it: {}",
                        why.0.trim_start_matches("cairn refuses this connection: ")
                    ));
                }
            }
            return Ok(format!("{peer} uid {} (its process not visible to a non-root server)", entry.uid));
        }
        Ok(format!("{peer} uid {} pid {:?}", entry.uid, scan.holders))
    }
}

fn denied(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::PermissionDenied
}

/// Processes scanned and fds read per TCP connection, at most.
const MAX_PROCESSES: usize = 1 << 16;
const MAX_FDS: usize = 1 << 20;

/// What a scan of `/proc/*/fd` for one socket found.
#[derive(Debug, Default)]
struct Scan {
    holders: Vec<u32>,
    /// Processes whose fd table could not be read (not ours to read).
    hidden: Vec<u32>,
}

/// The processes holding socket `inode` (the server itself included: an
/// in-process client is checked like any other).
fn scan_holders(inode: u64) -> Scan {
    let target = format!("socket:[{inode}]");
    let mut scan = Scan::default();
    let Ok(procs) = std::fs::read_dir("/proc") else { return scan };
    let mut fds = 0usize;
    for entry in procs.flatten().take(MAX_PROCESSES) {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let dir = match std::fs::read_dir(entry.path().join("fd")) {
            Ok(dir) => dir,
            Err(e) => {
                if denied(&e) {
                    scan.hidden.push(pid);
                }
                continue;
            }
        };
        for fd in dir.flatten() {
            fds += 1;
            if fds > MAX_FDS {
                return scan;
            }
            if std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == target.as_str()) {
                scan.holders.push(pid);
                break;
            }
        }
    }
    scan
}

#[cfg(target_os = "linux")]
mod sys {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    use super::{Refusal, refuse};

    pub(super) fn euid() -> u32 {
        // SAFETY: geteuid has no failure mode.
        unsafe { libc::geteuid() }
    }

    pub(super) struct Cred {
        pub pid: u32,
        pub uid: u32,
    }

    pub(super) fn peer_cred(stream: &impl AsRawFd) -> std::io::Result<Cred> {
        let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
        let mut len = libc::socklen_t::try_from(size_of::<libc::ucred>()).unwrap_or(0);
        // SAFETY: `cred` and `len` are valid for the kernel to write.
        let rc = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&raw mut cred).cast(),
                &raw mut len,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Cred { pid: u32::try_from(cred.pid).unwrap_or(0), uid: cred.uid })
    }

    /// A pidfd of the peer, to tell that the process checked by pid is
    /// still the one that connected; `Unsupported` on kernels before 5.3
    /// (no pidfds: the check runs unpinned, the race the module doc names).
    pub(super) enum Pin {
        Fd(OwnedFd),
        Unsupported,
        Failed,
    }

    impl Pin {
        pub(super) fn peer(stream: &impl AsRawFd, pid: u32) -> Self {
            let mut fd: libc::c_int = -1;
            let mut len = libc::socklen_t::try_from(size_of::<libc::c_int>()).unwrap_or(0);
            // SAFETY: `fd` and `len` are valid for the kernel to write.
            let rc = unsafe {
                libc::getsockopt(
                    stream.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_PEERPIDFD,
                    (&raw mut fd).cast(),
                    &raw mut len,
                )
            };
            if rc == 0 && fd >= 0 {
                // SAFETY: the kernel gave us this fd; we own it.
                return Self::Fd(unsafe { OwnedFd::from_raw_fd(fd) });
            }
            // Before Linux 6.5: a pidfd of the pid now (the window between
            // accept and here is the remaining race).
            let Ok(pid) = libc::pid_t::try_from(pid) else { return Self::Failed };
            // SAFETY: pidfd_open takes a pid and flags and returns a new fd.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
            match i32::try_from(fd) {
                // SAFETY: a new fd we own.
                Ok(fd) if fd >= 0 => Self::Fd(unsafe { OwnedFd::from_raw_fd(fd) }),
                _ if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) => Self::Unsupported,
                _ => Self::Failed,
            }
        }

        /// Refuse when the pinned process has exited (its pid may name
        /// another process now).
        pub(super) fn still_alive(&self, pid: u32) -> Result<(), Refusal> {
            let fd = match self {
                Self::Fd(fd) => fd,
                Self::Unsupported => return Ok(()),
                Self::Failed => {
                    return refuse(format!("cannot pin the peer's process (pid {pid}) while checking it"));
                }
            };
            let mut poll = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd, no wait.
            let rc = unsafe { libc::poll(&raw mut poll, 1, 0) };
            if rc != 0 {
                return refuse(format!("the peer's process (pid {pid}) exited while it was checked"));
            }
            Ok(())
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use super::{Refusal, refuse};

    pub(super) fn euid() -> u32 {
        u32::MAX
    }

    pub(super) struct Cred {
        pub pid: u32,
        pub uid: u32,
    }

    pub(super) fn peer_cred<T>(_stream: &T) -> std::io::Result<Cred> {
        Err(std::io::Error::other("peer checks need Linux"))
    }

    pub(super) struct Pin;

    impl Pin {
        pub(super) fn peer<T>(_stream: &T, _pid: u32) -> Self {
            Self
        }

        pub(super) fn still_alive(&self, _pid: u32) -> Result<(), Refusal> {
            refuse("peer checks need Linux")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Lines as a little-endian (x86_64, aarch64) kernel prints them.
    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1608 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 40213 1 0000000000000000 100 0 0 10 0
   1: 0100007F:A4E2 0100007F:1608 01 00000000:00000000 00:00000000 00000000 65534        0 40977 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:1608 0100007F:A4E2 01 00000000:00000000 00:00000000 00000000     0        0 40978 1 0000000000000000 20 4 31 10 -1
   3: 0100007F:A4E0 0100007F:1608 06 00000000:00000000 03:00000F36 00000000     0        0 0 3 0000000000000000
   4: 0F02000A:0016 0102000A:D2F0 01 00000000:00000000 02:00099A5F 00000000     0        0 31337 2 0000000000000000 20 4 1 10 17";

    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1608 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 51110 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000001000000:C350 00000000000000000000000001000000:1608 01 00000000:00000000 00:00000000 00000000  1000        0 51234 1 0000000000000000 20 4 30 10 -1
   2: 0000000000000000FFFF00000100007F:1608 0000000000000000FFFF00000100007F:B000 01 00000000:00000000 00:00000000 00000000     0        0 51300 1 0000000000000000 20 4 30 10 -1";

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    #[cfg_attr(target_endian = "big", ignore = "the literal lines are a little-endian kernel's")]
    fn parses_ipv4_lines_of_proc_net_tcp() {
        let lines: Vec<&str> = TCP.lines().collect();
        assert_eq!(parse_tcp_line(lines[0]), None, "the header");
        assert_eq!(
            parse_tcp_line(lines[1]),
            Some(TcpEntry {
                local: addr("127.0.0.1:5640"),
                remote: addr("0.0.0.0:0"),
                state: 0x0A,
                uid: 0,
                inode: 40213
            })
        );
        let client = parse_tcp_line(lines[2]).unwrap();
        assert_eq!(client.local, addr("127.0.0.1:42210"));
        assert_eq!(client.remote, addr("127.0.0.1:5640"));
        assert_eq!((client.state, client.uid, client.inode), (1, 65534, 40977));
        let ssh = parse_tcp_line(lines[5]).unwrap();
        assert_eq!(ssh.local, addr("10.0.2.15:22"));
        assert_eq!(ssh.remote, addr("10.0.2.1:54000"));
        assert_eq!(ssh.inode, 31337);
    }

    #[test]
    #[cfg_attr(target_endian = "big", ignore = "the literal lines are a little-endian kernel's")]
    fn parses_ipv6_lines_of_proc_net_tcp6() {
        let lines: Vec<&str> = TCP6.lines().collect();
        let listen = parse_tcp_line(lines[1]).unwrap();
        assert_eq!(listen.local, addr("[::1]:5640"));
        assert_eq!(listen.remote, addr("[::]:0"));
        assert_eq!((listen.state, listen.uid, listen.inode), (0x0A, 1000, 51110));
        let client = parse_tcp_line(lines[2]).unwrap();
        assert_eq!(client.local, addr("[::1]:50000"));
        assert_eq!(client.remote, addr("[::1]:5640"));
        let mapped = parse_tcp_line(lines[3]).unwrap();
        assert_eq!(mapped.local, addr("[::ffff:127.0.0.1]:5640"));
        assert_eq!(mapped.remote, addr("[::ffff:127.0.0.1]:45056"));
    }

    #[test]
    fn malformed_lines_are_skipped() {
        for line in [
            "",
            "garbage",
            "   0: 0100007F:1608 00000000:0000 0A 00000000:00000000 00:00000000 00000000",
            "   0: 0100007:1608 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1",
            "   0: 0100007F:1608 00000000:0000 0A 00000000:00000000 00:00000000 00000000    -1        0 1 1",
            "   0: 0100007F:XYZW 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1",
            "   0: 00000000000000000000000001000000 00000000000000000000000000000000:0000 0A 0 0 0 0 0 1 1",
        ] {
            assert_eq!(parse_tcp_line(line), None, "{line:?}");
        }
    }

    #[test]
    #[cfg_attr(target_endian = "big", ignore = "the literal lines are a little-endian kernel's")]
    fn the_peer_is_the_line_from_its_address_to_ours_not_our_own_end() {
        // The server (127.0.0.1:5640) accepted 127.0.0.1:42210: its own
        // accepted socket (uid 0) is the reverse line and must not count.
        let server = addr("127.0.0.1:5640");
        let peer = find_peer_socket(TCP.lines(), addr("127.0.0.1:42210"), server).unwrap();
        assert_eq!((peer.uid, peer.inode), (65534, 40977));
        // A connection in TIME_WAIT (inode 0) is no peer.
        assert_eq!(find_peer_socket(TCP.lines(), addr("127.0.0.1:42208"), server), None);
        // Unknown peer.
        assert_eq!(find_peer_socket(TCP.lines(), addr("127.0.0.1:1"), server), None);
        // IPv6 loopback.
        let peer = find_peer_socket(TCP6.lines(), addr("[::1]:50000"), addr("[::1]:5640")).unwrap();
        assert_eq!((peer.uid, peer.inode), (1000, 51234));
        // A dual-stack listener sees a v4 peer as ::ffff:a.b.c.d; the peer's
        // own line is plain v4 (and the reverse for a mapped line).
        let peer = find_peer_socket(TCP.lines(), addr("[::ffff:127.0.0.1]:42210"), addr("[::ffff:127.0.0.1]:5640"));
        assert_eq!(peer.map(|p| p.inode), Some(40977));
        let peer = find_peer_socket(TCP6.lines(), addr("127.0.0.1:5640"), addr("127.0.0.1:45056"));
        assert_eq!(peer.map(|p| p.inode), Some(51300));
    }

    #[test]
    fn parses_the_status_fields_the_rule_reads() {
        let tool = "Name:\tbash\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\nNgid:\t0\nPid:\t4242\nPPid:\t4241\n\
                    Uid:\t1000\t1001\t1002\t1003\nGid:\t1000\t1000\t1000\t1000\nNSpid:\t4242\t1\nNSsid:\t4242\t1\n\
                    CapEff:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t3\n";
        assert_eq!(parse_status(tool), Status { no_new_privs: true, seccomp: 2, nspid_depth: 2, euid: Some(1001) });
        let shell = "Name:\tsh\nUid:\t0\t0\t0\t0\nNSpid:\t77\nNoNewPrivs:\t0\nSeccomp:\t0\n";
        assert_eq!(parse_status(shell), Status { no_new_privs: false, seccomp: 0, nspid_depth: 1, euid: Some(0) });
        // An old kernel without NSpid or NoNewPrivs lines.
        assert_eq!(parse_status("Name:\tx\nUid:\t5\t5\t5\t5\n"), Status { euid: Some(5), ..Status::default() });
    }

    #[test]
    fn an_in_process_client_is_checked_like_any_other_on_tcp_and_unix() {
        // The test process is the peer: same uid, same namespaces; on TCP it
        // is found as the holder of its own client socket.
        let marked = {
            let own = parse_status(&std::fs::read_to_string("/proc/self/status").unwrap());
            own.no_new_privs && own.seccomp == 2
        };
        let me = Me::current();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let (tcp, unix) = (me.check_tcp(&accepted, false), me.check_unix(&a));
        drop(b);
        if marked {
            assert!(tcp.is_err() && unix.is_err(), "this test runs under NoNewPrivs + seccomp: {tcp:?} {unix:?}");
        } else {
            let label = tcp.unwrap();
            assert!(label.contains(&format!("pid [{}]", std::process::id())), "{label}");
            unix.unwrap();
        }
    }

    #[test]
    fn this_process_is_accepted_by_its_own_rule_unless_it_is_marked() {
        // The test process itself (same uid, same namespaces), by pid; a
        // pid that names no process and pid 0 are refused.
        let me = Me::current();
        let own = parse_status(&std::fs::read_to_string("/proc/self/status").unwrap());
        if own.no_new_privs && own.seccomp == 2 {
            let err = me.check_process(std::process::id()).unwrap_err();
            assert!(err.0.contains("NoNewPrivs"), "{err}");
        } else {
            me.check_process(std::process::id()).unwrap();
        }
        assert!(me.check_process(0).unwrap_err().0.contains("not visible"));
        assert!(me.check_process(u32::MAX).unwrap_err().0.contains("cannot read /proc/"));
    }
}
