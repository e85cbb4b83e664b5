//! A throwaway PostgreSQL server for tests and benchmarks: `initdb` into a
//! temporary directory, `pg_ctl start` listening only on a Unix socket in
//! that directory, one database created, everything stopped and removed on
//! drop.
//!
//! It owns the cluster's processes and files and nothing else; it never
//! touches a server it did not start. `initdb` refuses to run as root, so
//! when this process is root the server programs run as the unprivileged
//! `postgres` user (from /etc/passwd) and the directory is handed to it. A
//! missing program or user is an error that says so: tests that need the
//! server fail with that reason instead of passing.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context as _, Result, bail};

/// Where the PostgreSQL server programs are looked for, in order, before
/// `PATH`: `CAIRN_PG_BIN`, then the usual install directories.
const BIN_DIRS: &[&str] = &["/usr/local/bin", "/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin"];

/// A running temporary PostgreSQL cluster.
#[derive(Debug)]
pub struct TestCluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    ids: Option<(u32, u32)>,
    url: String,
    stopped: bool,
}

fn find_bin(name: &str) -> Result<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("CAIRN_PG_BIN").map(PathBuf::from).into_iter().collect();
    dirs.extend(BIN_DIRS.iter().map(PathBuf::from));
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file()).with_context(|| {
        format!(
            "the PostgreSQL server program `{name}` was not found (looked in $CAIRN_PG_BIN, {} and PATH); install PostgreSQL's server binaries (Debian: apt-get install postgresql) or set CAIRN_PG_BIN",
            BIN_DIRS.join(", ")
        )
    })
}

/// uid and gid of `user` from /etc/passwd.
fn user_ids(user: &str) -> Result<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").context("cannot read /etc/passwd")?;
    for line in passwd.lines() {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() > 3 && fields[0] == user {
            let uid = fields[2].parse().context("bad uid in /etc/passwd")?;
            let gid = fields[3].parse().context("bad gid in /etc/passwd")?;
            return Ok((uid, gid));
        }
    }
    bail!(
        "running as root, and there is no `{user}` user to run PostgreSQL as (initdb refuses root); create it (useradd -r {user})"
    )
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn checked(output: std::io::Result<Output>, what: &str) -> Result<()> {
    let output = output.with_context(|| format!("cannot run {what}"))?;
    if !output.status.success() {
        bail!(
            "{what} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

impl TestCluster {
    /// initdb, start, and create the database `cairn`.
    pub fn start() -> Result<Self> {
        let initdb = find_bin("initdb")?;
        let bin = initdb.parent().context("initdb has no directory")?.to_owned();
        find_bin("pg_ctl")?;
        let dir = tempfile::Builder::new().prefix("cairn-pg").tempdir().context("cannot create a temp dir")?;
        let ids = if is_root() { Some(user_ids("postgres")?) } else { None };
        if let Some((uid, gid)) = ids {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))?;
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .context("cannot hand the temp dir to postgres")?;
        }
        let mut cluster = Self {
            url: format!("host={} port=5432 user=postgres dbname=cairn", dir.path().display()),
            dir,
            bin,
            ids,
            stopped: true,
        };
        let data = cluster.data();
        checked(
            cluster
                .cmd("initdb")
                .arg("-D")
                .arg(&data)
                .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"])
                .output(),
            "initdb",
        )?;
        // Sockets only, in the temp dir; small and fast (no fsync: a test
        // cluster's durability is the machine's, restarts are clean stops).
        let conf = format!(
            "listen_addresses = ''\nunix_socket_directories = '{}'\nfsync = off\nfull_page_writes = off\nmax_connections = 200\nshared_buffers = 32MB\n",
            cluster.dir.path().display()
        );
        let path = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&path).context("cannot read postgresql.conf")?;
        text.push_str(&conf);
        std::fs::write(&path, text).context("cannot write postgresql.conf")?;
        cluster.pg_ctl("start")?;
        cluster.stopped = false;
        let mut admin = postgres::Client::connect(
            &format!("host={} port=5432 user=postgres dbname=postgres", cluster.dir.path().display()),
            postgres::NoTls,
        )
        .context("cannot connect to the test cluster")?;
        admin.batch_execute("CREATE DATABASE cairn").context("cannot create the database")?;
        Ok(cluster)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn cmd(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        if let Some((uid, gid)) = self.ids {
            cmd.uid(uid).gid(gid);
            // std drops the supplementary groups (setgroups) before setuid.
        }
        cmd.current_dir(self.dir.path()).env_remove("PGDATA");
        cmd
    }

    fn pg_ctl(&self, action: &str) -> Result<()> {
        let log = self.dir.path().join("server.log");
        checked(
            self.cmd("pg_ctl")
                .arg(action)
                .arg("-D")
                .arg(self.data())
                .arg("-l")
                .arg(&log)
                .args(["-w", "-t", "120", "-m", "fast"])
                .output(),
            &format!("pg_ctl {action}"),
        )
    }

    /// A cluster shared by the tests of one process that run at the same
    /// time: the last holder to drop its handle stops it (a static would
    /// never be dropped and would leave the server running).
    pub fn shared() -> Result<std::sync::Arc<Self>> {
        static CELL: std::sync::Mutex<std::sync::Weak<TestCluster>> = std::sync::Mutex::new(std::sync::Weak::new());
        let mut slot = CELL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(cluster) = slot.upgrade() {
            return Ok(cluster);
        }
        let cluster = std::sync::Arc::new(Self::start()?);
        *slot = std::sync::Arc::downgrade(&cluster);
        Ok(cluster)
    }

    /// The connection string (key=value form) of the database `cairn`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Create another database in the cluster; its connection string.
    pub fn create_database(&self, name: &str) -> Result<String> {
        let mut admin =
            postgres::Client::connect(&self.url.replace("dbname=cairn", "dbname=postgres"), postgres::NoTls)?;
        admin.batch_execute(&format!("CREATE DATABASE \"{}\"", name.replace('"', "")))?;
        Ok(self.url.replace("dbname=cairn", &format!("dbname={name}")))
    }

    /// The socket directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `pg_ctl restart` (fast shutdown: every connection is cut).
    pub fn restart(&self) -> Result<()> {
        self.pg_ctl("restart")
    }

    /// The server log (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = self.cmd("pg_ctl").arg("stop").arg("-D").arg(self.data()).args(["-w", "-m", "immediate"]).output();
            self.stopped = true;
        }
    }
}

/// What benchmarks measure the fleet with (`cairn-bench`'s `pg_fleet`),
/// here because every statement on cairn's tables is cairn-pg's.
pub mod bench {
    use std::time::{Duration, Instant};

    use anyhow::Result;

    use crate::conn::Db;

    /// The database's own commit rate, the ceiling of anything that commits:
    /// `threads` connections each making `commits` single-row commits
    /// (autocommit inserts into a scratch table). Commits per second.
    pub fn commit_ceiling(url: &str, threads: usize, commits: usize) -> Result<f64> {
        let mut admin = crate::connect(url)?;
        admin.batch_execute("CREATE TABLE IF NOT EXISTS bench_ceiling (id BIGSERIAL PRIMARY KEY, v TEXT NOT NULL)")?;
        let start = Instant::now();
        std::thread::scope(|s| -> Result<()> {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(move || -> Result<()> {
                        let mut c = crate::Connection::from(crate::connect(url)?);
                        let stmt = c.statement("INSERT INTO bench_ceiling (v) VALUES ($1)")?;
                        for n in 0..commits {
                            c.client().execute(&stmt, &[&format!("row {n}")])?;
                        }
                        Ok(())
                    })
                })
                .collect();
            for h in handles {
                h.join().map_err(|_| anyhow::anyhow!("a committing thread panicked"))??;
            }
            Ok(())
        })?;
        Ok((threads * commits) as f64 / start.elapsed().as_secs_f64())
    }

    /// Add `n` finished sessions (idle, one line each), as a busy
    /// database accumulates them.
    pub fn fill_finished(url: &str, n: usize) -> Result<()> {
        let mut c = crate::connect(url)?;
        let n = i64::try_from(n)?;
        c.execute(
            "INSERT INTO cairn_sessions (id, header, status, last_seq, updated_at)
             SELECT 'done-' || g, '{}', 'idle', 1, now() - interval '1 day' FROM generate_series(1, $1::bigint) g",
            &[&n],
        )?;
        c.execute(
            "INSERT INTO cairn_lines (session_id, first_seq, last_seq, line, epoch, owner)
             SELECT 'done-' || g, 1, 1, '{\"finished\":true}', 1, 'bench' FROM generate_series(1, $1::bigint) g",
            &[&n],
        )?;
        // Settled before anything is measured: vacuumed (no autovacuum
        // starts under the measurement) and checkpointed (no flush of the
        // fill's pages either).
        for settle in ["VACUUM ANALYZE cairn_sessions", "VACUUM ANALYZE cairn_lines", "CHECKPOINT"] {
            c.batch_execute(settle)?;
        }
        Ok(())
    }

    /// A checkpoint (so that two databases are measured from the same
    /// state: the pages of earlier writes flushed).
    pub fn checkpoint(url: &str) -> Result<()> {
        crate::connect(url)?.batch_execute("CHECKPOINT")?;
        Ok(())
    }

    /// Keep every queued session from being claimed (`not_before` at
    /// infinity), so that workers can start and register first.
    pub fn hold_queued(db: &mut impl Db) -> Result<u64> {
        let stmt = db.statement("UPDATE cairn_sessions SET not_before = 'infinity' WHERE status = 'queued'")?;
        Ok(db.client().execute(&stmt, &[])?)
    }

    /// Let the held sessions go, all at once, and wake the idle workers
    /// (as a submit does).
    pub fn let_go(db: &mut impl Db) -> Result<u64> {
        let free = db.statement("UPDATE cairn_sessions SET not_before = NULL WHERE not_before = 'infinity'")?;
        let notify = db.statement("SELECT pg_notify($1, '')")?;
        let mut tx = db.client().transaction()?;
        let n = tx.execute(&free, &[])?;
        tx.execute(&notify, &[&crate::lease::CHANNEL])?;
        tx.commit()?;
        Ok(n)
    }

    /// Worker threads of this database asleep on `LISTEN` after finding no
    /// work (their connection's last statement is `lease::next_expiry`'s).
    pub fn idle_claimers(db: &mut impl Db) -> Result<i64> {
        let stmt = db.statement(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND state = 'idle' AND query LIKE '%min(lease_expires)%'",
        )?;
        Ok(db.client().query_one(&stmt, &[])?.get(0))
    }

    /// The server processes of this database's other connections (to read
    /// their CPU time in `/proc`).
    pub fn backend_pids(db: &mut impl Db) -> Result<Vec<i64>> {
        let stmt = db.statement(
            "SELECT pid::int8 FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )?;
        Ok(db.client().query(&stmt, &[])?.iter().map(|r| r.get(0)).collect())
    }

    /// Sessions queued or running (top-level and children).
    pub fn unfinished(db: &mut impl Db) -> Result<i64> {
        let stmt = db.statement("SELECT count(*) FROM cairn_sessions WHERE status IN ('queued', 'running')")?;
        Ok(db.client().query_one(&stmt, &[])?.get(0))
    }

    /// Sessions failed.
    pub fn failed(db: &mut impl Db) -> Result<i64> {
        let stmt = db.statement("SELECT count(*) FROM cairn_sessions WHERE status = 'failed'")?;
        Ok(db.client().query_one(&stmt, &[])?.get(0))
    }

    /// Session `id`'s lease owner and epoch now.
    pub fn holder(db: &mut impl Db, id: &str) -> Result<(Option<String>, i64)> {
        let stmt = db.statement("SELECT lease_owner, epoch FROM cairn_sessions WHERE id = $1")?;
        let row = db.client().query_one(&stmt, &[&id])?;
        Ok((row.get(0), row.get(1)))
    }

    /// When (ms since the Unix epoch, the server's clock) the first line
    /// of session `id` written under an epoch above `epoch` was committed.
    pub fn first_commit_after(db: &mut impl Db, id: &str, epoch: i64) -> Result<Option<i64>> {
        let stmt = db.statement(
            "SELECT (extract(epoch FROM min(committed_at)) * 1000)::bigint FROM cairn_lines
             WHERE session_id = $1 AND epoch > $2",
        )?;
        Ok(db.client().query_one(&stmt, &[&id, &epoch])?.get(0))
    }

    /// Connections of this database left inside a transaction (a stopped
    /// worker's, holding its row locks).
    pub fn idle_in_transaction(db: &mut impl Db) -> Result<i64> {
        let stmt = db.statement(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
        )?;
        Ok(db.client().query_one(&stmt, &[])?.get(0))
    }

    /// Lines of session `id`.
    pub fn lines(db: &mut impl Db, id: &str) -> Result<i64> {
        let stmt = db.statement("SELECT count(*) FROM cairn_lines WHERE session_id = $1")?;
        Ok(db.client().query_one(&stmt, &[&id])?.get(0))
    }

    /// Turn durability on for the whole cluster (`fsync`,
    /// `synchronous_commit`, `full_page_writes`; the test cluster starts
    /// without), so that figures are those of a real server on this disk.
    pub fn durable(url: &str) -> Result<()> {
        let mut c = crate::connect(url)?;
        for setting in ["fsync = on", "synchronous_commit = on", "full_page_writes = on"] {
            c.batch_execute(&format!("ALTER SYSTEM SET {setting}"))?;
        }
        c.batch_execute("SELECT pg_reload_conf()")?;
        std::thread::sleep(Duration::from_millis(500));
        Ok(())
    }

    /// WAL flushes (`pg_stat_wal.wal_sync`) of the whole server so far:
    /// with `fsync` on, one per synchronous commit that was not grouped
    /// with another, plus the WAL writer's (asynchronous commits).
    pub fn wal_syncs(url: &str) -> Result<i64> {
        let mut c = crate::connect(url)?;
        c.batch_execute("SELECT pg_stat_force_next_flush()")?;
        Ok(c.query_one("SELECT wal_sync FROM pg_stat_wal", &[])?.get(0))
    }

    /// Log every statement (`log_statement = 'all'`) or stop, for counting
    /// statements per session in the server log.
    pub fn log_statements(url: &str, on: bool) -> Result<()> {
        let mut c = crate::connect(url)?;
        c.batch_execute(&format!("ALTER SYSTEM SET log_statement = '{}'", if on { "all" } else { "none" }))?;
        c.batch_execute("SELECT pg_reload_conf()")?;
        std::thread::sleep(Duration::from_millis(500));
        Ok(())
    }
}
