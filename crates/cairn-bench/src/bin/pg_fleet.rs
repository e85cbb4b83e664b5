//! The PostgreSQL fleet end to end (issue 47.3–47.5), with real `cairn
//! worker` processes on a throwaway server started here, durable
//! (`fsync`, `synchronous_commit` and `full_page_writes` on), each figure
//! beside its baseline measured in the same run:
//!
//! - sessions per second, runnable → final, of trivial sessions (one model
//!   answer, scripted) driven by 1, 2, 4 and 8 worker processes (started
//!   and registered before the sessions are let go, all at once), next to
//!   the database's own ceiling: single-row commits per second by as many
//!   connections (`test_cluster::bench::commit_ceiling`); and the CPU time
//!   per session of the workers and of their server processes;
//! - statements, transactions and WAL flushes per trivial session, counted
//!   in the server's log and `pg_stat_wal`;
//! - one worker's sessions per second with `--finished` finished sessions
//!   in the table against an empty one (47.3);
//! - failover with 1 s leases: a worker in the middle of a busy session is
//!   cut (SIGKILL, or SIGSTOP: it keeps its connection and, when stopped
//!   inside a transaction, its row locks), and another worker, idle and
//!   registered, takes the session over; the gap from the cut to the new
//!   holder's first commit, by the server's clock (47.5).
//!
//! Run: `scripts/bench pg_fleet`, or `CAIRN_BIN=target/debug/cairn cargo
//! run -p cairn-bench --no-default-features --bin pg_fleet -- [--sessions N]
//! [--finished N] [--cuts N] [--rounds N] [--only e2e|statements|finished|failover]`
//! (`CAIRN_BIN` defaults to the `cairn` beside this binary).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use cairn_core::storage::{Header, new_session_id};
use cairn_pg::test_cluster::{TestCluster, bench};
use cairn_pg::{Connection, PgStore, connect, lease};

struct Args {
    /// Only this part (`e2e`, `statements`, `finished`, `failover`).
    only: Option<String>,
    sessions: usize,
    finished: usize,
    cuts: usize,
    rounds: usize,
}

fn args() -> Result<Args> {
    let mut a = Args {
        only: None,
        sessions: cairn_bench::size(200, 10),
        finished: cairn_bench::size(100_000, 1000),
        cuts: cairn_bench::size(24, 2),
        rounds: cairn_bench::size(3, 1),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--only" {
            a.only = it.next();
            continue;
        }
        let value: usize = it.next().with_context(|| format!("{flag} needs a number"))?.parse()?;
        match flag.as_str() {
            "--sessions" => a.sessions = value,
            "--finished" => a.finished = value,
            "--cuts" => a.cuts = value,
            "--rounds" => a.rounds = value,
            other => bail!("unknown flag {other}"),
        }
    }
    Ok(a)
}

fn cairn_bin() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("CAIRN_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let me = std::env::current_exe()?;
    let bin = me.parent().context("no directory")?.join("cairn");
    anyhow::ensure!(bin.is_file(), "no cairn binary at {}; set CAIRN_BIN", bin.display());
    Ok(bin)
}

/// What every worker process shares: the binary, a private home, the
/// sessions' working directory.
struct Fleet {
    bin: PathBuf,
    home: tempfile::TempDir,
    cwd: tempfile::TempDir,
}

impl Fleet {
    fn script(&self, name: &str, lines: &[serde_json::Value]) -> Result<PathBuf> {
        let path = self.home.path().join(name);
        std::fs::write(&path, lines.iter().map(|l| format!("{l}\n")).collect::<String>())?;
        Ok(path)
    }

    fn worker(&self, url: &str, script: &Path, lease_secs: u64) -> Result<Child> {
        Ok(Command::new(&self.bin)
            .args(["--database", url, "--script"])
            .arg(script)
            .args(["worker", "--lease", &lease_secs.to_string()])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.home.path())
            .env("CAIRN_HOME", self.home.path())
            .current_dir(self.cwd.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?)
    }

    fn submit(&self, url: &str, n: usize) -> Result<Vec<String>> {
        let mut c = connect(url)?;
        let mut ids = Vec::with_capacity(n);
        for _ in 0..n {
            let header = Header::new(new_session_id(), self.cwd.path().display().to_string());
            let id = header.id.clone();
            c = PgStore::create(c, header)?.into_client();
            lease::submit(&mut c, &id, "go")?;
            ids.push(id);
        }
        Ok(ids)
    }
}

fn signal(child: &Child, sig: &str) {
    let _ = Command::new("kill").args([sig, &child.id().to_string()]).status();
}

fn stop_all(children: Vec<Child>) {
    for mut c in children {
        signal(&c, "-CONT");
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// CPU time (user + system) of the processes `pids` so far, in clock ticks;
/// a process gone counts nothing.
fn cpu_ticks(pids: &[i64]) -> u64 {
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .filter_map(|stat| {
            // Fields after the command's closing parenthesis: state is the
            // 3rd field of the line, utime the 14th, stime the 15th.
            let rest = stat.rsplit_once(") ")?.1.split_whitespace().collect::<Vec<_>>();
            Some(rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?)
        })
        .sum()
}

fn clock_ticks_per_sec() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// What one `end_to_end` run measured.
struct Throughput {
    /// Sessions per second, from the let-go to the last final.
    rate: f64,
    /// Seconds the workers took to start and register (not counted).
    startup: f64,
    /// CPU ms per session of the worker processes, and of their server
    /// processes, over the measured span.
    worker_cpu_ms: f64,
    server_cpu_ms: f64,
}

/// A fleet's throughput: `n` trivial sessions submitted and held, `workers`
/// worker processes started and registered, then the sessions let go all
/// at once; sessions per second from then until none is queued or
/// running, and the seconds the workers took to start and register (not
/// counted: until 47.4's second look it was, and a debug `cairn` process
/// takes about as long to start on this loaded VM as a few hundred
/// sessions take to run, so more workers looked slower).
fn end_to_end(fleet: &Fleet, url: &str, script: &Path, workers: usize, n: usize) -> Result<Throughput> {
    fleet.submit(url, n)?;
    let mut watch = Connection::from(connect(url)?);
    bench::hold_queued(&mut watch)?;
    let spawned = Instant::now();
    let children: Vec<Child> = (0..workers).map(|_| fleet.worker(url, script, 10)).collect::<Result<_>>()?;
    let pids: Vec<i64> = children.iter().map(|c| i64::from(c.id())).collect();
    // Registered, and each one's thread asleep on LISTEN (a notification
    // before it listens would be missed until its next timed look).
    loop {
        let live = cairn_pg::fleet::workers(&mut watch)?;
        if pids.iter().all(|p| live.iter().any(|w| w.pid == *p && !w.stopped))
            && bench::idle_claimers(&mut watch)? >= i64::try_from(workers)?
        {
            break;
        }
        if spawned.elapsed() > Duration::from_secs(300) {
            stop_all(children);
            bail!("the workers did not register in 5 minutes");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let startup = spawned.elapsed().as_secs_f64();
    let backends = bench::backend_pids(&mut watch)?;
    let (workers_cpu, server_cpu) = (cpu_ticks(&pids), cpu_ticks(&backends));
    let start = Instant::now();
    anyhow::ensure!(bench::let_go(&mut watch)? == n as u64, "not every session was held");
    loop {
        if bench::unfinished(&mut watch)? == 0 {
            break;
        }
        if start.elapsed() > Duration::from_secs(600) {
            stop_all(children);
            bail!("the workers did not finish {n} sessions in 10 minutes");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let wall = start.elapsed();
    let per_session_ms = |ticks: u64| ticks as f64 / clock_ticks_per_sec() * 1000.0 / n as f64;
    let worker_cpu_ms = per_session_ms(cpu_ticks(&pids).saturating_sub(workers_cpu));
    let server_cpu_ms = per_session_ms(cpu_ticks(&backends).saturating_sub(server_cpu));
    for c in &children {
        signal(c, "-TERM");
    }
    stop_all(children);
    let failed = bench::failed(&mut watch)?;
    anyhow::ensure!(failed == 0, "{failed} sessions failed");
    Ok(Throughput { rate: n as f64 / wall.as_secs_f64(), startup, worker_cpu_ms, server_cpu_ms })
}

fn median_spread(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(0))
}

/// A pseudo-random number below `n` (no rand dependency).
fn jitter(n: u64) -> u64 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    u64::from(nanos.wrapping_mul(2_654_435_761)) % n.max(1)
}

/// One cut: a worker driving a busy session is SIGKILLed or SIGSTOPped;
/// (gap from the cut to another worker's first commit on it in ms, whether
/// a transaction was left open by the cut), or `None` when the session
/// was finished before the cut landed (a fast, quiet machine; nothing
/// was taken over, so there is no gap to measure and the caller cuts
/// again).
fn failover(fleet: &Fleet, url: &str, script: &Path, stop: bool) -> Result<Option<(i64, bool)>> {
    let id = fleet.submit(url, 1)?.remove(0);
    let mut watch = Connection::from(connect(url)?);
    let victim = fleet.worker(url, script, 1)?;
    let mark = format!(":{}/", victim.id());
    let start = Instant::now();
    let mut children = vec![victim];
    let wait = |what: &str, start: Instant| -> Result<()> {
        if start.elapsed() > Duration::from_secs(60) {
            bail!("{what} did not happen in a minute");
        }
        std::thread::sleep(Duration::from_millis(5));
        Ok(())
    };
    while !(bench::holder(&mut watch, &id)?.0.is_some_and(|o| o.contains(&mark)) && bench::lines(&mut watch, &id)? >= 4)
    {
        wait("the first worker's commits", start)?;
    }
    let taker = fleet.worker(url, script, 1)?;
    let taker_pid = i64::from(taker.id());
    children.push(taker);
    while !cairn_pg::fleet::workers(&mut watch)?.iter().any(|w| w.pid == taker_pid && w.heartbeat_age_ms < 1000) {
        wait("the second worker's registration", start)?;
    }
    std::thread::sleep(Duration::from_millis(jitter(300)));
    let (_, epoch) = bench::holder(&mut watch, &id)?;
    signal(&children[0], if stop { "-STOP" } else { "-KILL" });
    let cut = now_ms();
    // A stopped worker may have been inside a commit's transaction.
    std::thread::sleep(Duration::from_millis(20));
    let open = stop && bench::idle_in_transaction(&mut watch)? > 0;
    let start = Instant::now();
    let gap = loop {
        if let Some(at) = bench::first_commit_after(&mut watch, &id, epoch)? {
            break at - cut;
        }
        if bench::unfinished(&mut watch)? == 0 {
            stop_all(children);
            return Ok(None);
        }
        if start.elapsed() > Duration::from_secs(60) {
            stop_all(children);
            bail!("no takeover in a minute");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    stop_all(children);
    Ok(Some((gap, open)))
}

fn pct(sorted: &[i64], p: f64) -> i64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() -> Result<()> {
    let a = args()?;
    anyhow::ensure!(a.cuts >= 2 && a.rounds >= 1 && a.sessions >= 1, "give at least 2 cuts, 1 round and 1 session");
    let fleet = Fleet { bin: cairn_bin()?, home: tempfile::tempdir()?, cwd: tempfile::tempdir()? };
    std::fs::write(fleet.cwd.path().join("notes.txt"), "a line to read\n")?;
    // The failover's busy session is 2,000 steps: with the default step
    // limit (24) its turn ended before a cut could land on a quiet machine.
    std::fs::write(fleet.home.path().join("config.toml"), "[limits]\nmax_steps = 5000\n")?;
    let cluster = TestCluster::start().context("cannot start a PostgreSQL server for the benchmark")?;
    bench::durable(cluster.url())?;
    let trivial = fleet.script("trivial.jsonl", &[serde_json::json!({"text": "done", "toolCalls": []})])?;
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("# pg_fleet: {} (cairn binary), {cpus} CPUs, load average at start {}", fleet.bin.display(), load.trim());

    // Sessions per second vs the commit ceiling, 1/2/4 workers.
    let mut db = 0;
    let mut fresh = |name: &str| -> Result<String> {
        db += 1;
        let url = cluster.create_database(&format!("{name}_{db}"))?;
        drop(connect(&url)?);
        Ok(url)
    };
    let part = |name: &str| a.only.as_deref().is_none_or(|only| only == name);
    for workers in [1usize, 2, 4, 8].into_iter().filter(|_| part("e2e")) {
        let (mut e2e, mut ceiling, mut ratios, mut startups) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut wcpu, mut scpu) = (Vec::new(), Vec::new());
        for _ in 0..a.rounds {
            let url = fresh("e2e")?;
            // The ceiling just before and just after the sessions (the
            // disk's flush time drifts with the machine's other load).
            let before = bench::commit_ceiling(&url, workers, cairn_bench::size(500, 50))?;
            let Throughput { rate, startup, worker_cpu_ms, server_cpu_ms } =
                end_to_end(&fleet, &url, &trivial, workers, a.sessions)?;
            startups.push(startup);
            wcpu.push(worker_cpu_ms);
            scpu.push(server_cpu_ms);
            let after = bench::commit_ceiling(&url, workers, cairn_bench::size(500, 50))?;
            let roof = (before + after) / 2.0;
            e2e.push(rate);
            ceiling.push(roof);
            ratios.push(rate / roof);
        }
        let (em, elo, ehi) = median_spread(&mut e2e);
        let (cm, clo, chi) = median_spread(&mut ceiling);
        let (rm, rlo, rhi) = median_spread(&mut ratios);
        let (sm, slo, shi) = median_spread(&mut startups);
        let (wm, wlo, whi) = median_spread(&mut wcpu);
        let (bm, blo, bhi) = median_spread(&mut scpu);
        println!(
            "{workers} worker(s): {em:.1} sessions/s ({elo:.1}–{ehi:.1}) vs ceiling {cm:.0} single-row commits/s ({clo:.0}–{chi:.0}) with {workers} connection(s); ratio of medians {:.3}, median of the rounds' ratios {rm:.3} ({rlo:.3}–{rhi:.3}) ({} rounds of {} sessions; the workers started and registered in {sm:.2} s ({slo:.2}–{shi:.2}), not counted); CPU per session: workers {wm:.2} ms ({wlo:.2}–{whi:.2}), their server processes {bm:.2} ms ({blo:.2}–{bhi:.2})",
            em / cm,
            a.rounds,
            a.sessions
        );
    }

    // Statements per trivial session, from the server's log.
    if part("statements") {
        let url = fresh("statements")?;
        let n = 20;
        fleet.submit(&url, n)?;
        let dbname = url.rsplit("dbname=").next().unwrap_or("").to_owned();
        bench::log_statements(&url, true)?;
        let before = cluster.log().len();
        let syncs_before = bench::wal_syncs(&url)?;
        let worker = fleet.worker(&url, &trivial, 10)?;
        let mut watch = Connection::from(connect(&url)?);
        let start = Instant::now();
        while bench::unfinished(&mut watch)? > 0 && start.elapsed() < Duration::from_secs(300) {
            std::thread::sleep(Duration::from_millis(50));
        }
        signal(&worker, "-TERM");
        stop_all(vec![worker]);
        // The worker's backend reports its WAL figures as it exits.
        std::thread::sleep(Duration::from_millis(1500));
        let syncs = bench::wal_syncs(&url)? - syncs_before;
        bench::log_statements(&url, false)?;
        let log = cluster.log();
        let _ = dbname;
        let statements = log
            .get(before..)
            .unwrap_or("")
            .lines()
            .filter(|l| l.contains("LOG:  execute ") || l.contains("LOG:  statement: "))
            .count();
        // Writing transactions: an explicit `COMMIT`, and the statements
        // that commit by themselves (the claim, a worker's one-statement
        // commit of a line, the release of a finished turn: 47.4); not the
        // registry's heartbeats (as before).
        let commits = log
            .get(before..)
            .unwrap_or("")
            .lines()
            .filter(|l| {
                l.contains("LOG:  statement: COMMIT")
                    || l.contains("WITH claimed AS")
                    || l.contains("WITH cur AS")
                    // A finished turn's release: one message of two
                    // statements, the first locking the row (cairn-pg's
                    // `lease::release_done`).
                    || (l.contains("LOG:  statement: SELECT 1") && l.contains("FOR UPDATE;"))
            })
            .count();
        println!(
            "statements (round trips: a simple-query message counts once) per trivial session: {:.1} ({statements} logged for {n} sessions by one worker, its heartbeats and watchers included); commits {:.1} per session; WAL flushes {:.2} per session ({syncs} for {n}, the server's, WAL writer included)",
            statements as f64 / n as f64,
            commits as f64 / n as f64,
            syncs as f64 / n as f64
        );
    }

    // One worker's sessions per second with many finished sessions vs none.
    if part("finished") {
        let (mut empty, mut full, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..a.rounds {
            let url = fresh("empty")?;
            bench::checkpoint(&url)?;
            let e = end_to_end(&fleet, &url, &trivial, 1, a.sessions)?.rate;
            let url = fresh("finished")?;
            bench::fill_finished(&url, a.finished)?;
            let f = end_to_end(&fleet, &url, &trivial, 1, a.sessions)?.rate;
            empty.push(e);
            full.push(f);
            ratios.push(f / e);
        }
        let (em, elo, ehi) = median_spread(&mut empty);
        let (fm, flo, fhi) = median_spread(&mut full);
        let (rm, rlo, rhi) = median_spread(&mut ratios);
        println!(
            "one worker, {} finished sessions in the table: {fm:.1} sessions/s ({flo:.1}–{fhi:.1}) vs empty {em:.1} ({elo:.1}–{ehi:.1}); ratio of medians {:.3}, median of the rounds' ratios {rm:.3} ({rlo:.3}–{rhi:.3})",
            a.finished,
            fm / em
        );
    }

    // Failover with 1 s leases.
    if part("failover") {
        let busy: Vec<serde_json::Value> = (0..2000)
            .map(|k| {
                serde_json::json!({"text": "", "toolCalls": [{"id": format!("c{k}"), "name": "read_file",
                    "arguments": {"path": "notes.txt"}}]})
            })
            .chain(std::iter::once(serde_json::json!({"text": "done", "toolCalls": []})))
            .collect();
        let script = fleet.script("busy.jsonl", &busy)?;
        let (mut gaps, mut kill, mut stop, mut open) = (Vec::new(), Vec::new(), Vec::new(), 0);
        let mut missed = 0;
        for n in 0..a.cuts {
            let stopped = n % 2 == 1;
            let (gap, in_tx) = loop {
                let url = fresh("failover")?;
                match failover(&fleet, &url, &script, stopped)? {
                    Some(measured) => break measured,
                    None if missed < 3 * a.cuts => missed += 1,
                    None => bail!("{missed} cuts landed after the busy session had finished; make it longer"),
                }
            };
            open += usize::from(in_tx);
            gaps.push(gap);
            if stopped { stop.push(gap) } else { kill.push(gap) }
        }
        for v in [&mut gaps, &mut kill, &mut stop] {
            v.sort_unstable();
        }
        if missed > 0 {
            println!("failover: {missed} cut(s) landed after the session had finished and were made again");
        }
        println!(
            "failover, 1 s leases, {} cuts ({} SIGKILL, {} SIGSTOP, {open} of them inside a transaction): p50 {} ms, p99 {} ms (max {} ms; p99/lease {:.2}); SIGKILL p50/max {}/{} ms, SIGSTOP p50/max {}/{} ms",
            gaps.len(),
            kill.len(),
            stop.len(),
            pct(&gaps, 0.5),
            pct(&gaps, 0.99),
            gaps[gaps.len() - 1],
            pct(&gaps, 0.99) as f64 / 1000.0,
            pct(&kill, 0.5),
            kill[kill.len() - 1],
            pct(&stop, 0.5),
            stop[stop.len() - 1],
        );
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("# load average at the end {}", load.trim());
    Ok(())
}
