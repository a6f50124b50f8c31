//! What an engine gives the store's logic: values and rows, one open
//! transaction ([`Db`]) and the ways to run one ([`Engine`]).
//!
//! This is the one place where SQLite and PostgreSQL differ as far as the
//! logic can tell: the database's clock for the lease ([`Db::clock_sql`]),
//! the lock a fenced write takes on its lease row ([`Db::share_lock_sql`]),
//! a lone statement run without a transaction ([`Engine::read_one`]) and
//! the lease statement run outside the writers' serialisation
//! ([`Engine::lease`]). Each engine (`sqlite.rs`, `postgres.rs`) implements
//! these traits; the modules beside this one never ask which engine runs
//! them.

use rollgate_core::Timestamp;

use crate::audit::AuditRecord;
use crate::{Result, RolloutRecord, StoreError};

/// A value bound to or read from a statement: the three types the schema
/// uses (integers, text and NULL), the same in both engines.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Val {
    Null,
    Int(i64),
    Text(String),
}

impl From<i64> for Val {
    fn from(v: i64) -> Self {
        Val::Int(v)
    }
}
impl From<u64> for Val {
    fn from(v: u64) -> Self {
        // Timestamps, versions and sequence numbers; beyond i64 nothing exists.
        Val::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}
impl From<u32> for Val {
    fn from(v: u32) -> Self {
        Val::Int(i64::from(v))
    }
}
impl From<bool> for Val {
    fn from(v: bool) -> Self {
        Val::Int(i64::from(v))
    }
}
impl From<&str> for Val {
    fn from(v: &str) -> Self {
        Val::Text(v.to_string())
    }
}
impl From<String> for Val {
    fn from(v: String) -> Self {
        Val::Text(v)
    }
}
impl From<&String> for Val {
    fn from(v: &String) -> Self {
        Val::Text(v.clone())
    }
}
impl<T: Into<Val>> From<Option<T>> for Val {
    fn from(v: Option<T>) -> Self {
        v.map_or(Val::Null, Into::into)
    }
}

/// Binds values: `p![a, b]` is `&[Val::from(a), Val::from(b)]`.
macro_rules! p {
    ($($v:expr),* $(,)?) => { &[$($crate::sql::engine::Val::from($v)),*] };
}

/// One result row.
#[derive(Debug)]
pub(crate) struct Row(pub(crate) Vec<Val>);

fn bad_column(i: usize, want: &str, got: &Val) -> StoreError {
    StoreError::Database(format!("stored data: column {i} is {got:?}, expected {want}").into())
}

impl Row {
    fn get(&self, i: usize) -> &Val {
        self.0.get(i).unwrap_or(&Val::Null)
    }
    pub(super) fn i64(&self, i: usize) -> Result<i64> {
        match self.get(i) {
            Val::Int(v) => Ok(*v),
            v => Err(bad_column(i, "an integer", v)),
        }
    }
    pub(super) fn u64(&self, i: usize) -> Result<u64> {
        let v = self.i64(i)?;
        u64::try_from(v).map_err(|_| bad_column(i, "a non-negative integer", &Val::Int(v)))
    }
    pub(super) fn u32(&self, i: usize) -> Result<u32> {
        let v = self.i64(i)?;
        u32::try_from(v).map_err(|_| bad_column(i, "a small integer", &Val::Int(v)))
    }
    pub(super) fn bool(&self, i: usize) -> Result<bool> {
        Ok(self.i64(i)? != 0)
    }
    pub(super) fn opt_u64(&self, i: usize) -> Result<Option<u64>> {
        match self.get(i) {
            Val::Null => Ok(None),
            _ => self.u64(i).map(Some),
        }
    }
    pub(super) fn opt_i64(&self, i: usize) -> Result<Option<i64>> {
        match self.get(i) {
            Val::Null => Ok(None),
            _ => self.i64(i).map(Some),
        }
    }
    pub(super) fn text(&self, i: usize) -> Result<String> {
        match self.get(i) {
            Val::Text(s) => Ok(s.clone()),
            v => Err(bad_column(i, "text", v)),
        }
    }
    pub(super) fn opt_text(&self, i: usize) -> Result<Option<String>> {
        match self.get(i) {
            Val::Null => Ok(None),
            _ => self.text(i).map(Some),
        }
    }
    pub(super) fn ts(&self, i: usize) -> Result<Timestamp> {
        self.u64(i).map(Timestamp)
    }
    pub(super) fn json<T: serde::de::DeserializeOwned>(&self, i: usize) -> Result<T> {
        Ok(serde_json::from_str(&self.text(i)?)?)
    }
}

/// One open transaction (or connection) of an engine.
pub(crate) trait Db {
    /// Runs a statement; returns how many rows it changed.
    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64>;
    /// Runs a query; returns every row.
    fn rows(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>>;
    /// What this transaction remembers between statements.
    fn memo(&mut self) -> &mut TxMemo;
    /// The database's own clock in epoch milliseconds, as an SQL
    /// expression, for the lease: hosts whose clocks disagree then agree
    /// on when a lease expires. `None`: the store's clock is the only one
    /// (an embedded database on one host), bound as a parameter.
    fn clock_sql(&self) -> Option<&'static str> {
        None
    }
    /// What a fenced write's read of its lease row appends so that a
    /// take-over waits for the write to end (PostgreSQL: `FOR SHARE`):
    /// no write commits under a token after the token was replaced.
    fn share_lock_sql(&self) -> &'static str {
        ""
    }
}

/// What a write transaction remembers between its statements, to save
/// round trips (they dominate on a networked database).
#[derive(Debug, Default)]
pub(crate) struct TxMemo {
    /// The audit chain's head as this transaction left it.
    pub(super) audit_head: Option<(u64, String)>,
    /// Audit records appended, written in one statement at commit.
    pub(super) pending_audit: Vec<AuditRecord>,
    /// Rollouts a batch read in one query, before applying to each.
    pub(super) rollouts: std::collections::HashMap<i64, RolloutRecord>,
    /// Whether anything gateways route changed (the version moves once,
    /// at the end).
    pub(super) routes_changed: bool,
}

impl dyn Db + '_ {
    /// The first row, if any.
    pub(super) fn row(&mut self, sql: &str, params: &[Val]) -> Result<Option<Row>> {
        Ok(self.rows(sql, params)?.into_iter().next())
    }
}

/// What a [`Db`] callback does inside an engine's transaction.
pub(crate) type Work<'a> = &'a mut dyn FnMut(&mut dyn Db) -> Result<()>;

/// A database engine: how to run a serialised write transaction and a
/// consistent read.
pub(crate) trait Engine: Send + Sync {
    /// Runs `work` in one write transaction, serialised with every other
    /// writer; commits if it returns Ok and rolls back entirely if not.
    fn write(&self, work: Work) -> Result<()>;
    /// Runs `work` on one consistent snapshot of the database.
    fn read(&self, work: Work) -> Result<()>;
    /// Runs `work`, which runs one statement: no snapshot to hold, so a
    /// networked engine saves the round trips of a transaction.
    fn read_one(&self, work: Work) -> Result<()> {
        self.read(work)
    }
    /// Runs `work`, one statement on the lease table, atomically but not
    /// serialised with the writers (PostgreSQL); by default as a write.
    fn lease(&self, work: Work) -> Result<()> {
        self.write(work)
    }
    /// `sqlite` or `postgres`.
    fn name(&self) -> &'static str;
}
