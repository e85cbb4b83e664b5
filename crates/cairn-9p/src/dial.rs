//! Plan 9 dial strings as plan9port's `9p -a` takes them: `unix!PATH` and
//! `tcp!HOST!PORT`. Parsing and the loopback check only; binding and
//! connecting live in `server` and `client`.

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};

/// Where a server listens or a client connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dial {
    /// A Unix socket at this path.
    Unix(PathBuf),
    /// A TCP host (name or address) and port.
    Tcp {
        /// Host name or IP address.
        host: String,
        /// Port (0: any free port, for servers).
        port: u16,
    },
}

impl Dial {
    /// Parse `unix!PATH` or `tcp!HOST!PORT` (a bare path is taken as
    /// `unix!PATH`, as plan9port's tools do).
    pub fn parse(text: &str) -> Result<Self> {
        let parts: Vec<&str> = text.split('!').collect();
        match parts.as_slice() {
            ["unix", path] if !path.is_empty() => Ok(Self::Unix(PathBuf::from(path))),
            ["tcp", host, port] if !host.is_empty() => {
                let port = port
                    .parse::<u16>()
                    .with_context(|| format!("{text:?}: the port {port:?} is not a number from 0 to 65535"))?;
                Ok(Self::Tcp { host: (*host).to_owned(), port })
            }
            [path] if path.starts_with('/') || path.starts_with('.') => Ok(Self::Unix(PathBuf::from(path))),
            _ => bail!("{text:?} is not a dial string: use unix!PATH or tcp!HOST!PORT (e.g. tcp!127.0.0.1!5640)"),
        }
    }

    /// The socket addresses a TCP dial string resolves to.
    pub fn socket_addrs(&self) -> Result<Vec<SocketAddr>> {
        match self {
            Self::Unix(_) => Ok(Vec::new()),
            Self::Tcp { host, port } => {
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let addrs: Vec<SocketAddr> =
                    (host, *port).to_socket_addrs().with_context(|| format!("cannot resolve {host:?}"))?.collect();
                if addrs.is_empty() {
                    bail!("{host:?} resolves to no address");
                }
                Ok(addrs)
            }
        }
    }

    /// Whether every address this dial string names is a loopback address
    /// (a Unix socket counts as local).
    pub fn is_local(&self) -> Result<bool> {
        match self {
            Self::Unix(_) => Ok(true),
            Self::Tcp { .. } => Ok(self.socket_addrs()?.iter().all(|a| is_loopback(a.ip()))),
        }
    }
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
    }
}

impl fmt::Display for Dial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "unix!{}", path.display()),
            Self::Tcp { host, port } => write!(f, "tcp!{host}!{port}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_forms_and_refuses_others() {
        assert_eq!(Dial::parse("unix!/tmp/x.sock").unwrap(), Dial::Unix("/tmp/x.sock".into()));
        assert_eq!(Dial::parse("tcp!127.0.0.1!564").unwrap(), Dial::Tcp { host: "127.0.0.1".into(), port: 564 });
        for bad in ["", "tcp!x", "tcp!!5", "tcp!h!99999", "tcp!h!-1", "udp!h!5", "unix!", "a!b!c!d", "name"] {
            assert!(Dial::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn loopback_is_local_and_others_are_not() {
        assert!(Dial::parse("tcp!127.0.0.1!1").unwrap().is_local().unwrap());
        assert!(Dial::parse("tcp!::1!1").unwrap().is_local().unwrap());
        assert!(Dial::parse("tcp!localhost!1").unwrap().is_local().unwrap());
        assert!(!Dial::parse("tcp!0.0.0.0!1").unwrap().is_local().unwrap());
        assert!(!Dial::parse("tcp!10.1.2.3!1").unwrap().is_local().unwrap());
    }
}
