//! What the commands and a database family ask of the session table: an
//! id from an id or a unique prefix ([`resolve`]), every session with its
//! standing ([`list`]), whether a row exists, a session's direct children
//! ([`children`]), whether a child's row says `running`, and whether every
//! line of a session was written under a lease ([`written_by_a_family`]).
//!
//! It owns these reads' SQL (every statement on cairn's tables lives in
//! this crate); the rules are not its own: the prefix rule and the family
//! separator are cairn-core's (`prefix_names`, `FAMILY_SEP`). It must not
//! write anything.

use cairn_core::storage::{FAMILY_SEP, Header, decode_header, prefix_names};

use crate::PgError;
use crate::conn::Db;

/// A session row's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Nothing to do.
    Idle,
    /// A prompt is waiting for a worker.
    Queued,
    /// A worker holds it (or held it and died: taken over once its lease ends).
    Running,
    /// A worker gave up on it (`note` says why).
    Failed,
}

impl Status {
    /// The column's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Failed => "failed",
        }
    }

    fn parse(text: &str) -> Result<Self, PgError> {
        Ok(match text {
            "idle" => Self::Idle,
            "queued" => Self::Queued,
            "running" => Self::Running,
            "failed" => Self::Failed,
            other => return Err(PgError::Schema(format!("a session row has status {other:?}, unknown to this cairn"))),
        })
    }
}

/// One session as [`list`] reads it.
#[derive(Debug, Clone)]
pub struct Listed {
    /// The session id.
    pub id: String,
    /// Its row's status.
    pub status: Status,
    /// The last committed seq (0: nothing committed yet).
    pub last_seq: i64,
    /// The fencing epoch of its latest claim.
    pub epoch: i64,
    /// The lease holder, if any.
    pub holder: Option<String>,
    /// The header (`None` when it does not decode).
    pub header: Option<Header>,
    /// Prompts waiting in its inbox.
    pub queued: i64,
    /// When the row last changed, as the server prints it (`YYYY-MM-DD HH24:MI:SS`).
    pub updated: String,
    /// The same instant in ms since the epoch.
    pub updated_ms: i64,
    /// Why a worker failed it, if one did.
    pub note: Option<String>,
}

const EXACT: &str = "SELECT id FROM cairn_sessions WHERE id = $1";
/// Ids starting with a prefix, through the C-collation index on `id`
/// (schema version 2): `LIKE 'abc%'` on it is a range scan.
const PREFIXED: &str = "SELECT id FROM cairn_sessions WHERE (id COLLATE \"C\") LIKE $1 ORDER BY (id COLLATE \"C\")";
const LIST: &str = "SELECT s.id, s.status, s.last_seq, s.epoch, s.lease_owner, s.header,
        (SELECT count(*) FROM cairn_inbox i WHERE i.session_id = s.id),
        to_char(s.updated_at, 'YYYY-MM-DD HH24:MI:SS'), s.note,
        (extract(epoch FROM s.updated_at) * 1000)::bigint
     FROM cairn_sessions s ORDER BY s.updated_at DESC, s.id";
/// A family's ids: `[parent+, parent,)` in the C collation is exactly the
/// ids that start with `parent+` (`,` follows `+`), a range of the index.
const FAMILY: &str = "SELECT id FROM cairn_sessions WHERE (id COLLATE \"C\") >= $1 AND (id COLLATE \"C\") < $2 ORDER BY (id COLLATE \"C\")";
const RUNNING: &str = "SELECT 1 FROM cairn_sessions WHERE id = $1 AND status = 'running'";
const UNLEASED_LINE: &str = "SELECT NOT EXISTS (SELECT 1 FROM cairn_lines WHERE session_id = $1 AND owner IS NULL)";

/// A session id from an exact id or a unique prefix (cairn-core's
/// `prefix_names`: a prefix names a subagent only when it reaches into the
/// child's part, as for session files).
pub fn resolve(db: &mut impl Db, target: &str) -> Result<String, PgError> {
    let exact = db.statement(EXACT)?;
    if let Some(row) = db.client().query_opt(&exact, &[&target])? {
        return Ok(row.get(0));
    }
    let pattern = format!("{}%", target.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_"));
    let prefixed = db.statement(PREFIXED)?;
    let mut found: Vec<String> = Vec::new();
    {
        use postgres::fallible_iterator::FallibleIterator as _;
        let mut rows = db.client().query_raw(&prefixed, [&pattern])?;
        while let Some(row) = rows.next()? {
            let id: String = row.get(0);
            if prefix_names(target, &id) {
                found.push(id);
                if found.len() > 1 {
                    break;
                }
            }
        }
    }
    match found.len() {
        1 => Ok(found.swap_remove(0)),
        0 => Err(PgError::NoSuchSession(target.to_owned())),
        _ => Err(PgError::Refused(format!("{target:?} matches more than one session; give more of the id"))),
    }
}

/// Every session, most recently changed first.
pub fn list(db: &mut impl Db) -> Result<Vec<Listed>, PgError> {
    let stmt = db.statement(LIST)?;
    db.client()
        .query(&stmt, &[])?
        .iter()
        .map(|row| {
            let header: String = row.get(5);
            Ok(Listed {
                id: row.get(0),
                status: Status::parse(row.get(1))?,
                last_seq: row.get(2),
                epoch: row.get(3),
                holder: row.get(4),
                header: decode_header(header.as_bytes()).ok(),
                queued: row.get(6),
                updated: row.get(7),
                note: row.get(8),
                updated_ms: row.get(9),
            })
        })
        .collect()
}

/// Whether session `id` has a row.
pub fn exists(db: &mut impl Db, id: &str) -> Result<bool, PgError> {
    let stmt = db.statement(EXACT)?;
    Ok(db.client().query_opt(&stmt, &[&id])?.is_some())
}

/// The ids of `parent`'s direct children (`<parent>+<invocation>`, not
/// their own children), by id; read through an index, so it costs the
/// same with a million other sessions in the table.
pub fn children(db: &mut impl Db, parent: &str) -> Result<Vec<String>, PgError> {
    let from = format!("{parent}{FAMILY_SEP}");
    // The character after the separator closes the range.
    let after = char::from_u32(u32::from(FAMILY_SEP) + 1).unwrap_or(char::MAX);
    let to = format!("{parent}{after}");
    let stmt = db.statement(FAMILY)?;
    Ok(db
        .client()
        .query(&stmt, &[&from, &to])?
        .iter()
        .map(|r| r.get::<_, String>(0))
        .filter(|id| id.strip_prefix(&from).is_some_and(|rest| !rest.is_empty() && !rest.contains(FAMILY_SEP)))
        .collect())
}

/// Whether session `id`'s row says `running`.
pub fn is_running(db: &mut impl Db, id: &str) -> Result<bool, PgError> {
    let stmt = db.statement(RUNNING)?;
    Ok(db.client().query_opt(&stmt, &[&id])?.is_some())
}

/// Whether every line of session `id` was written under a lease (a
/// family's child records the lease of its family on each line; an
/// imported session's lines record no owner).
pub fn written_by_a_family(db: &mut impl Db, id: &str) -> Result<bool, PgError> {
    let stmt = db.statement(UNLEASED_LINE)?;
    Ok(db.client().query_one(&stmt, &[&id])?.get(0))
}
