//! The embedded engine: one SQLite file in WAL mode with `synchronous=FULL`,
//! so a committed transaction survives a killed process (and a power cut).
//! WAL works only for processes on one host; several hosts share a
//! PostgreSQL database instead (`postgres.rs`).

use std::path::Path;
use std::sync::Mutex;

use rusqlite::types::{ToSqlOutput, Value, ValueRef};
use rusqlite::{Connection, TransactionBehavior};

use crate::sql::engine::{Db, Engine, Row, TxMemo, Val, Work};
use crate::sql::store::SqlStore;
use crate::{Result, StoreError};

/// Schema migrations, applied in order; `PRAGMA user_version` records how
/// many have run. Append only: never edit a released migration.
/// (A list and a version number, not a migration crate such as refinery:
/// each engine keeps its schema in its own dialect and PostgreSQL's runner
/// migrates under an advisory lock; this is all either needs.)
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE models (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    champion TEXT,
    created_at INTEGER NOT NULL
);
CREATE TABLE revisions (
    id TEXT PRIMARY KEY,
    model TEXT NOT NULL REFERENCES models(name),
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    rejections INTEGER NOT NULL DEFAULT 0,
    blocked INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL
);
CREATE UNIQUE INDEX one_champion_per_model ON revisions(model) WHERE state = 'champion';
CREATE UNIQUE INDEX one_candidate_per_model ON revisions(model) WHERE state = 'candidate';
CREATE TABLE rollouts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    model TEXT NOT NULL REFERENCES models(name),
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    phase TEXT NOT NULL,
    active INTEGER NOT NULL,
    routing TEXT NOT NULL,
    version INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE UNIQUE INDEX one_active_rollout_per_model ON rollouts(model) WHERE active = 1;
CREATE TABLE audit (
    seq INTEGER PRIMARY KEY,
    at INTEGER NOT NULL,
    actor TEXT NOT NULL,
    model TEXT NOT NULL,
    rollout INTEGER,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE INDEX audit_by_rollout ON audit(rollout, seq);
CREATE INDEX audit_by_model ON audit(model, seq);
CREATE TRIGGER audit_is_append_only_update BEFORE UPDATE ON audit
    BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;
CREATE TRIGGER audit_is_append_only_delete BEFORE DELETE ON audit
    BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;
"#,
    r#"
CREATE TABLE gateways (
    id TEXT PRIMARY KEY,
    stats_url TEXT NOT NULL,
    last_seen INTEGER NOT NULL
);
"#,
    // Deleted models are kept (their revisions remember rejections), hidden.
    r#"
ALTER TABLE models ADD COLUMN deleted_at INTEGER;
"#,
    // Named API tokens: the secret's hash only.
    r#"
CREATE TABLE tokens (
    name TEXT PRIMARY KEY,
    role TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    hash TEXT NOT NULL UNIQUE,
    created_at INTEGER NOT NULL,
    created_by TEXT NOT NULL,
    revoked_at INTEGER
);
"#,
    // Signed checkpoints of the audit chain's head, append-only like it.
    r#"
CREATE TABLE checkpoints (
    seq INTEGER PRIMARY KEY,
    hash TEXT NOT NULL,
    at INTEGER NOT NULL,
    mac TEXT NOT NULL
);
CREATE TRIGGER checkpoints_are_append_only_update BEFORE UPDATE ON checkpoints
    BEGIN SELECT RAISE(ABORT, 'checkpoints are append-only'); END;
CREATE TRIGGER checkpoints_are_append_only_delete BEFORE DELETE ON checkpoints
    BEGIN SELECT RAISE(ABORT, 'checkpoints are append-only'); END;
"#,
    // Retention: bodies hashed by digest; an old evaluation's body may be
    // pruned, nothing else may change.
    r#"
ALTER TABLE audit ADD COLUMN body_digest TEXT;
ALTER TABLE audit ADD COLUMN pruned INTEGER NOT NULL DEFAULT 0;
CREATE INDEX audit_by_kind_at ON audit(kind, at) WHERE pruned = 0;
DROP TRIGGER audit_is_append_only_update;
CREATE TRIGGER audit_is_append_only_update BEFORE UPDATE ON audit
    WHEN NOT (OLD.kind = 'evaluated' AND OLD.pruned = 0 AND OLD.body_digest IS NOT NULL
              AND NEW.pruned = 1 AND NEW.body = '{"pruned":true}'
              AND NEW.seq IS OLD.seq AND NEW.at IS OLD.at AND NEW.actor IS OLD.actor
              AND NEW.model IS OLD.model AND NEW.rollout IS OLD.rollout
              AND NEW.kind IS OLD.kind AND NEW.prev_hash IS OLD.prev_hash
              AND NEW.hash IS OLD.hash AND NEW.body_digest IS OLD.body_digest)
    BEGIN SELECT RAISE(ABORT, 'audit log is append-only (only old evaluations may be pruned)'); END;
"#,
    // Leases with fencing tokens (one leading controller), and a counter
    // every routing change bumps (followers poll it).
    r#"
CREATE TABLE leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    token INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
CREATE TABLE routes_version (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
);
INSERT INTO routes_version (id, version) VALUES (1, 0);
"#,
    // How far each notification receiver has been sent the audit log.
    r#"
CREATE TABLE notify_cursors (
    receiver TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
"#,
    // Which key signed each checkpoint (its id, not the key): several
    // controllers verify one log, and say "another key", not "forged".
    r#"
ALTER TABLE checkpoints ADD COLUMN key_id TEXT;
"#,
    // The one key that signs this store's checkpoints, claimed by the
    // first controller that signs (its id only).
    r#"
CREATE TABLE audit_signer (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    key_id TEXT NOT NULL
);
"#,
    // Delayed labels: the `labeler` role (SQLite changes a CHECK by
    // rebuilding its table), answers recorded for labels, and the labels.
    r#"
CREATE TABLE tokens_with_labeler (
    name TEXT PRIMARY KEY,
    role TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'admin', 'labeler')),
    hash TEXT NOT NULL UNIQUE,
    created_at INTEGER NOT NULL,
    created_by TEXT NOT NULL,
    revoked_at INTEGER
);
INSERT INTO tokens_with_labeler (name, role, hash, created_at, created_by, revoked_at)
    SELECT name, role, hash, created_at, created_by, revoked_at FROM tokens;
DROP TABLE tokens;
ALTER TABLE tokens_with_labeler RENAME TO tokens;
CREATE TABLE answers (
    model TEXT NOT NULL,
    request_id TEXT NOT NULL,
    revision TEXT NOT NULL,
    rollout INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    unit INTEGER NOT NULL,
    at INTEGER NOT NULL,
    class TEXT,
    value TEXT,
    PRIMARY KEY (rollout, request_id, revision)
);
CREATE INDEX answers_by_request ON answers (model, request_id);
CREATE INDEX answers_by_time ON answers (at);
CREATE TABLE labels (
    model TEXT NOT NULL,
    request_id TEXT NOT NULL,
    label TEXT NOT NULL,
    observed_at INTEGER,
    received_at INTEGER NOT NULL,
    received_by TEXT NOT NULL,
    PRIMARY KEY (model, request_id)
);
CREATE INDEX labels_by_time ON labels (received_at);
"#,
];

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Database(Box::new(e))
    }
}

impl rusqlite::ToSql for Val {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Val::Null => ToSqlOutput::Owned(Value::Null),
            Val::Int(v) => ToSqlOutput::Owned(Value::Integer(*v)),
            Val::Text(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
        })
    }
}

fn val(v: ValueRef) -> Val {
    match v {
        ValueRef::Null => Val::Null,
        ValueRef::Integer(i) => Val::Int(i),
        ValueRef::Text(t) | ValueRef::Blob(t) => Val::Text(String::from_utf8_lossy(t).into_owned()),
        // The schema stores no reals; one read as text fails as bad data.
        ValueRef::Real(f) => Val::Text(f.to_string()),
    }
}

/// A connection (or a transaction, through `Deref`) as a [`Db`]; statements
/// are prepared once per connection and cached.
struct Lite<'a>(&'a Connection, TxMemo);

impl Db for Lite<'_> {
    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64> {
        let mut st = self.0.prepare_cached(sql)?;
        Ok(st.execute(rusqlite::params_from_iter(params))? as u64)
    }

    fn rows(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>> {
        let mut st = self.0.prepare_cached(sql)?;
        let n = st.column_count();
        let mut rows = st.query(rusqlite::params_from_iter(params))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            let vals = (0..n)
                .map(|i| r.get_ref(i).map(val))
                .collect::<rusqlite::Result<Vec<_>>>()?;
            out.push(Row(vals));
        }
        Ok(out)
    }

    fn memo(&mut self) -> &mut TxMemo {
        &mut self.1
    }
}

/// The SQLite engine: a writer connection (its mutex and IMMEDIATE
/// transactions serialise writers, across processes too by SQLite's own
/// lock) and a reader, so reads never queue behind a write waiting for that
/// lock (WAL lets readers run beside a writer).
struct Sqlite {
    writer: Mutex<Connection>,
    reader: Mutex<Connection>,
}

fn locked(conn: &Mutex<Connection>) -> Result<std::sync::MutexGuard<'_, Connection>> {
    conn.lock()
        .map_err(|_| StoreError::Conflict("store lock poisoned by an earlier panic".into()))
}

impl Engine for Sqlite {
    fn write(&self, work: Work) -> Result<()> {
        let mut conn = locked(&self.writer)?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        work(&mut Lite(&tx, TxMemo::default()))?;
        tx.commit()?;
        Ok(())
    }

    fn read(&self, work: Work) -> Result<()> {
        let mut conn = locked(&self.reader)?;
        let tx = conn.transaction()?;
        work(&mut Lite(&tx, TxMemo::default()))?;
        tx.commit()?;
        Ok(())
    }

    fn name(&self) -> &'static str {
        "sqlite"
    }
}

impl SqlStore {
    /// Opens (creating if needed) `rollgate.db` in the data directory `dir`.
    pub fn open_dir(dir: &Path) -> Result<SqlStore> {
        std::fs::create_dir_all(dir).map_err(|e| {
            StoreError::Invalid(format!(
                "cannot create data directory {}: {e}",
                dir.display()
            ))
        })?;
        Self::open_file(&dir.join("rollgate.db"))
    }

    /// Opens (creating if needed) the SQLite file at `path` and migrates it.
    pub fn open_file(path: &Path) -> Result<SqlStore> {
        let connect = || -> Result<Connection> {
            let conn = Connection::open(path)?;
            conn.busy_timeout(std::time::Duration::from_secs(10))?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "FULL")?;
            conn.pragma_update(None, "foreign_keys", "ON")?;
            conn.set_prepared_statement_cache_capacity(64);
            Ok(conn)
        };
        let mut writer = connect()?;
        migrate(&mut writer)?;
        let reader = connect()?;
        reader.pragma_update(None, "query_only", "ON")?;
        Ok(SqlStore::with_engine(Box::new(Sqlite {
            writer: Mutex::new(writer),
            reader: Mutex::new(reader),
        })))
    }
}

fn migrate(conn: &mut Connection) -> Result<()> {
    let done: usize = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if done > MIGRATIONS.len() {
        return Err(StoreError::Invalid(format!(
            "database schema version {done} is newer than this rollgate ({})",
            MIGRATIONS.len()
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(done) {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", i + 1)?;
        tx.commit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ModelSpec, Store};

    #[test]
    fn every_earlier_schema_migrates_to_the_latest_keeping_its_data() {
        for done in 1..=MIGRATIONS.len() {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("rollgate.db");
            {
                let mut c = Connection::open(&path).expect("open");
                for (i, sql) in MIGRATIONS[..done].iter().enumerate() {
                    let tx = c.transaction().expect("tx");
                    tx.execute_batch(sql).expect("migration");
                    tx.pragma_update(None, "user_version", i + 1)
                        .expect("version");
                    tx.commit().expect("commit");
                }
                c.execute(
                    "INSERT INTO models (name, spec, champion, created_at) VALUES ('old', ?1, NULL, 1)",
                    [serde_json::to_string(&ModelSpec::default()).expect("spec")],
                )
                .expect("a model written by version {done}");
            }
            let store = SqlStore::open_file(&path).expect("migrates");
            assert_eq!(store.model("old").expect("kept").created_at.0, 1);
            store
                .create_model("new", &ModelSpec::default(), "t")
                .expect("usable");
            assert!(store.routes_version().expect("version") > 0);
            assert!(
                store
                    .acquire_lease("controller", "t", std::time::Duration::from_secs(1))
                    .expect("lease")
                    .is_some()
            );
            assert!(store.verify_audit().expect("verify").is_intact());
            let c = Connection::open(&path).expect("reopen");
            let v: usize = c
                .pragma_query_value(None, "user_version", |r| r.get(0))
                .expect("version");
            assert_eq!(v, MIGRATIONS.len(), "from version {done}");
        }
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("rollgate.db");
        Connection::open(&path)
            .expect("open")
            .pragma_update(None, "user_version", MIGRATIONS.len() + 1)
            .expect("version");
        let e = SqlStore::open_file(&path).expect_err("newer");
        assert!(e.to_string().contains("newer than this rollgate"), "{e}");
    }
}
