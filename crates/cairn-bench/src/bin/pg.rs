//! PostgreSQL backend benchmarks (issue 14), each against a baseline in the
//! same run, on a throwaway server started here (`cairn_pg::test_cluster`:
//! Unix socket, `fsync = off`).
//!
//! Run: `cargo run --release -p cairn-bench --no-default-features --bin pg`
//! (`--smoke`: tiny sizes, for `scripts/test`).
//!
//! - commits per second and p50/p99 commit latency with 1, 2 and 4 writers
//!   (threads, each driving its own session under a lease, as workers do)
//!   vs. the JSONL backend doing the same commits with the same number of
//!   threads. Both without fsync (the test server runs `fsync = off`; the
//!   JSONL stores use `Durability::None`), so the comparison is the cost of
//!   the database round trips and transactions, not of the disk;
//! - failover: a holder that stops without releasing (its connection
//!   dropped, as after SIGKILL), then the time until another worker's first
//!   commit on that session; bounded by the lease (here 1 s) plus the
//!   claimer's wake-up (it waits on LISTEN with a timeout of half a lease);
//! - claims per second (issue 27): short sessions claimed, finished with one
//!   commit and released by 1, 2 and 4 threads, each keeping one connection
//!   for all its claims (as the worker does) vs. a connection per claim.
//!   (Failover from a *partition* is measured by cairn-pg's
//!   `partition_pg_workers` soak test, which needs its proxy.)
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cairn_bench::{Table, size};
use cairn_core::storage::{Durability, Header, JsonlStore, Storage, StoreOptions, Transaction, new_session_id, to_raw};
use cairn_pg::test_cluster::TestCluster;
use cairn_pg::{PgStore, connect, lease};

fn tx(n: usize) -> Result<Transaction> {
    let payload = to_raw(&serde_json::json!({"text": "a message of an agent session", "n": n}))?;
    Ok(Transaction::new().entry(format!("e{n}"), None, "message", payload))
}

fn commit_all(store: &mut dyn Storage, commits: usize) -> Result<Vec<Duration>> {
    let mut lat = Vec::with_capacity(commits);
    for n in 0..commits {
        let start = Instant::now();
        store.commit(tx(n)?)?;
        lat.push(start.elapsed());
    }
    Ok(lat)
}

/// Run `writers` threads of `commits` commits each; (all latencies, wall time).
fn run_writers(
    writers: usize,
    commits: usize,
    make: &(dyn Fn() -> Result<Box<dyn Storage + Send>> + Sync),
) -> Result<(Vec<Duration>, Duration)> {
    let mut stores: Vec<Box<dyn Storage + Send>> = (0..writers).map(|_| make()).collect::<Result<_>>()?;
    let start = Instant::now();
    let results: Vec<Result<Vec<Duration>>> = std::thread::scope(|s| {
        let handles: Vec<_> = stores.iter_mut().map(|st| s.spawn(move || commit_all(&mut **st, commits))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("writer panicked")))).collect()
    });
    let wall = start.elapsed();
    let mut all = Vec::new();
    for r in results {
        all.extend(r?);
    }
    Ok((all, wall))
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

fn main() -> Result<()> {
    let cluster = TestCluster::start().context("cannot start a PostgreSQL server for the benchmark")?;
    let url = cluster.url().to_owned();
    let dir = tempfile::tempdir()?;
    let commits = size(2000, 20);
    let rounds = size(5, 1);
    let mut table = Table::new("PostgreSQL backend (issue 14)");
    for writers in [1usize, 2, 4] {
        let mut pg_rates = Vec::new();
        let mut js_rates = Vec::new();
        let mut pg_lat = Vec::new();
        let mut js_lat = Vec::new();
        for _ in 0..rounds {
            // Interleave the two sides so both see the same load.
            let pg = |owner: &str| -> Result<Box<dyn Storage + Send>> {
                let header = Header::new(new_session_id(), "/");
                let id = header.id.clone();
                drop(PgStore::create(connect(&url)?, header)?);
                let mut c = connect(&url)?;
                lease::submit(&mut c, &id, "bench")?;
                // Claim this very session (others may be runnable too: claim
                // until ours comes up, releasing nothing else matters here).
                let fence = loop {
                    let claim = lease::claim(&mut c, owner, Duration::from_secs(60))?.context("nothing to claim")?;
                    if claim.session == id {
                        break claim.fence;
                    }
                };
                Ok(Box::new(PgStore::open_fenced(c, &id, fence)?))
            };
            let owner = format!("bench-{writers}");
            let (lat, wall) = run_writers(writers, commits, &|| pg(&owner))?;
            pg_rates.push((writers * commits) as f64 / wall.as_secs_f64());
            pg_lat.extend(lat);
            let js = || -> Result<Box<dyn Storage + Send>> {
                let opts = StoreOptions { compact_ratio: None, ..StoreOptions::with_durability(Durability::None) };
                Ok(Box::new(JsonlStore::create(dir.path(), Header::new(new_session_id(), "/"), opts)?))
            };
            let (lat, wall) = run_writers(writers, commits, &js)?;
            js_rates.push((writers * commits) as f64 / wall.as_secs_f64());
            js_lat.extend(lat);
        }
        pg_lat.sort();
        js_lat.sort();
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            (v[v.len() / 2], v[0], v[v.len() - 1])
        };
        let (pm, plo, phi) = med(&mut pg_rates);
        let (jm, jlo, jhi) = med(&mut js_rates);
        table.figure(
            &format!("{writers} writer(s): commits/s"),
            &format!(
                "PostgreSQL {pm:.0} ({plo:.0}–{phi:.0}, {rounds} rounds) vs JSONL {jm:.0} ({jlo:.0}–{jhi:.0}); ratio {:.3}",
                pm / jm
            ),
        );
        table.figure(
            &format!("{writers} writer(s): commit latency p50 / p99"),
            &format!(
                "PostgreSQL {} / {} vs JSONL {} / {}",
                ms(pct(&pg_lat, 0.5)),
                ms(pct(&pg_lat, 0.99)),
                ms(pct(&js_lat, 0.5)),
                ms(pct(&js_lat, 0.99))
            ),
        );
    }
    // Failover: a holder vanishes mid-session; another claims and commits.
    let lease_len = Duration::from_secs(1);
    let mut failovers = Vec::new();
    for _ in 0..size(5, 1) {
        let header = Header::new(new_session_id(), "/");
        let id = header.id.clone();
        drop(PgStore::create(connect(&url)?, header)?);
        let mut c = connect(&url)?;
        lease::submit(&mut c, &id, "bench")?;
        // Claim this very session (a claim takes any runnable one).
        let claim = loop {
            let claim = lease::claim(&mut c, "dying", lease_len)?.context("nothing to claim")?;
            if claim.session == id {
                break claim;
            }
        };
        let mut store = PgStore::open_fenced(c, &id, claim.fence)?;
        store.commit(tx(0)?)?;
        drop(store); // the connection closes; the lease stays until it expires
        let died = Instant::now();
        let mut other = connect(&url)?;
        lease::listen(&mut other)?;
        let claim = loop {
            match lease::claim(&mut other, "taker", lease_len)? {
                Some(claim) if claim.session == id => break claim,
                Some(_) => {}
                None => {
                    lease::wait(&mut other, lease_len / 2)?;
                }
            }
        };
        let mut store = PgStore::open_fenced(other, &claim.session, claim.fence.clone())?;
        store.commit(tx(1)?)?;
        failovers.push(died.elapsed());
        // Out of the way of the next rounds: idle, its prompt dropped.
        let mut c = store.into_client();
        lease::release(&mut c, &id, &claim.fence, lease::Release::Cancelled, None)?;
    }
    failovers.sort();
    table.figure(
        "failover: holder gone → next commit by another worker (lease 1 s)",
        &format!(
            "median {} (min {}, max {}, n {})",
            ms(failovers[failovers.len() / 2]),
            ms(failovers[0]),
            ms(failovers[failovers.len() - 1]),
            failovers.len()
        ),
    );
    // Claims per second: short sessions (claim, take the prompt with one
    // commit, release) driven by 1, 2 and 4 worker threads, each keeping
    // one connection for all its claims (as `cairn worker` does since issue
    // 27), against connecting (and checking the schema) for every claim.
    for threads in [1usize, 2, 4] {
        let n = size(400, 8) * threads;
        // Each run in a database of its own: the sessions of the runs above
        // (leases left to expire) must not be claimed here.
        let reused =
            claims_per_second(&cluster.create_database(&format!("claims_{threads}_reused"))?, threads, n, true)?;
        let fresh =
            claims_per_second(&cluster.create_database(&format!("claims_{threads}_fresh"))?, threads, n, false)?;
        table.figure(
            &format!("{threads} worker thread(s): short sessions claimed and finished per second"),
            &format!(
                "one connection per thread {reused:.0}/s vs a connection per claim {fresh:.0}/s; ratio {:.2} ({n} sessions each)",
                reused / fresh
            ),
        );
    }
    table.print();
    Ok(())
}

/// `n` sessions with a prompt each, driven by `threads` threads until none
/// is left; sessions per second.
fn claims_per_second(url: &str, threads: usize, n: usize, reuse: bool) -> Result<f64> {
    let mut c = connect(url)?;
    for _ in 0..n {
        let header = Header::new(new_session_id(), "/");
        let id = header.id.clone();
        c = PgStore::create(c, header)?.into_client();
        lease::submit(&mut c, &id, "bench")?;
    }
    let lease_len = Duration::from_secs(60);
    let start = Instant::now();
    let results: Vec<Result<usize>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || -> Result<usize> {
                    let owner = format!("bench-claims-{t}");
                    let mut done = 0;
                    let mut conn = Some(cairn_pg::connect_for(url, lease_len)?);
                    loop {
                        let mut c = match conn.take() {
                            Some(c) if reuse => c,
                            _ => cairn_pg::connect_for(url, lease_len)?,
                        };
                        let Some(claim) = lease::claim(&mut c, &owner, lease_len)? else { break };
                        let mut store = PgStore::open_fenced(c, &claim.session, claim.fence.clone())?;
                        let (inbox, _) = store.next_prompt()?.context("a claimed session without its prompt")?;
                        if let Ok(mut slot) = store.inbox_slot().lock() {
                            *slot = Some(inbox);
                        }
                        store.commit(tx(done)?)?;
                        let mut c = store.into_client();
                        lease::release(&mut c, &claim.session, &claim.fence, lease::Release::Done, None)?;
                        conn = Some(c);
                        done += 1;
                    }
                    Ok(done)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("thread panicked")))).collect()
    });
    let wall = start.elapsed();
    let mut total = 0;
    for r in results {
        total += r?;
    }
    anyhow::ensure!(total == n, "{total} of {n} sessions were driven");
    Ok(total as f64 / wall.as_secs_f64())
}
