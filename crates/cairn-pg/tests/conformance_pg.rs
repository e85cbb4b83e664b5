//! The storage conformance suite (cairn-core's `tests/conformance/mod.rs`,
//! the same functions MemStore, JSONL and SQLite pass) on PostgreSQL, against
//! a real server started for this test; then the schema's version rules,
//! export/import byte identity with the JSONL backend, and fencing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use cairn_core::storage::{Header, Storage, new_session_id};
use cairn_pg::test_cluster::TestCluster;
use cairn_pg::{PgStore, connect};

#[macro_use]
#[path = "../../cairn-core/tests/conformance/mod.rs"]
mod conformance;
use conformance::Backend;

/// A server shared by the tests running at the same time (a missing
/// PostgreSQL fails every test with the reason).
fn cluster() -> Arc<TestCluster> {
    match TestCluster::shared() {
        Ok(c) => c,
        Err(e) => panic!("cannot start a PostgreSQL test server: {e:#}"),
    }
}

struct Pg(Arc<TestCluster>);
impl Pg {
    fn new() -> Self {
        Pg(cluster())
    }
}
impl Backend for Pg {
    type S = PgStore;
    fn fresh(&mut self) -> PgStore {
        PgStore::create(connect(self.0.url()).unwrap(), Header::new(new_session_id(), "/")).unwrap()
    }
    fn reopen(&mut self, store: PgStore) -> PgStore {
        let id = store.header().id.clone();
        drop(store);
        PgStore::open(connect(self.0.url()).unwrap(), &id).unwrap()
    }
}

conformance!(pg, Pg::new());
