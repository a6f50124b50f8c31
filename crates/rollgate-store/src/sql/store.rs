//! [`SqlStore`] itself: an engine, a clock and the group-commit queue, and
//! how it runs one piece of work once — a serialised write at one instant
//! (ending with the audit records and the routes counter it owes), a lease
//! statement, a snapshot read or a lone statement. Every concern's module
//! runs its transactions through these; how a store opens is in `mod.rs`
//! and the engines' files.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rollgate_core::Timestamp;

use super::chain::flush_audit;
use super::engine::{Db, Engine, Work};
use super::group_commit::GroupCommit;
use crate::{Result, StoreError};

type Clock = Box<dyn Fn() -> Timestamp + Send + Sync>;

fn system_clock() -> Timestamp {
    Timestamp(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    )
}

pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The [`Store`](crate::Store): rollgate's logic over a SQL engine. Open it
/// with [`SqlStore::open_dir`] (embedded SQLite, the default) or
/// [`SqlStore::connect`] (a PostgreSQL URL), or [`SqlStore::open`] for either.
pub struct SqlStore {
    engine: Box<dyn Engine>,
    pub(super) clock: Clock,
    pub(super) group: GroupCommit,
}

impl std::fmt::Debug for SqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlStore")
            .field("engine", &self.engine.name())
            .finish_non_exhaustive()
    }
}

impl SqlStore {
    pub(crate) fn with_engine(engine: Box<dyn Engine>) -> SqlStore {
        SqlStore {
            engine,
            clock: Box::new(system_clock),
            group: GroupCommit::default(),
        }
    }

    /// `sqlite` or `postgres`.
    pub fn engine(&self) -> &'static str {
        self.engine.name()
    }

    /// Replaces the wall clock (tests pass a fixed or stepping one).
    pub fn with_clock(mut self, clock: impl Fn() -> Timestamp + Send + Sync + 'static) -> Self {
        self.clock = Box::new(clock);
        self
    }

    /// Runs `f` in one serialised write transaction at one instant.
    pub(super) fn write<T>(
        &self,
        f: impl FnOnce(&mut dyn Db, Timestamp) -> Result<T>,
    ) -> Result<T> {
        let now = (self.clock)();
        let work = |db: &mut dyn Db| -> Result<T> {
            let out = f(db, now)?;
            flush_audit(db)?;
            if db.memo().routes_changed {
                db.exec(
                    "UPDATE routes_version SET version = version + 1 WHERE id = 1",
                    &[],
                )?;
            }
            Ok(out)
        };
        run_once(
            |w| self.engine.write(w),
            work,
            "the engine ran no transaction",
        )
    }

    /// Runs `f`, one statement on the lease table, outside the writers'
    /// serialisation: a take-over never waits behind a rollout commit or a
    /// heartbeat, only (PostgreSQL) behind a fenced write reading the
    /// lease's row, which the server ends if its client is cut off.
    pub(super) fn lease_statement<T>(
        &self,
        f: impl FnOnce(&mut dyn Db, Timestamp) -> Result<T>,
    ) -> Result<T> {
        let now = (self.clock)();
        run_once(
            |w| self.engine.lease(w),
            |db| f(db, now),
            "the engine ran no statement",
        )
    }

    /// Runs `f` on one consistent snapshot.
    pub(super) fn read<T>(&self, f: impl FnOnce(&mut dyn Db) -> Result<T>) -> Result<T> {
        run_once(|w| self.engine.read(w), f, "the engine ran no transaction")
    }

    /// Runs `f`, which runs exactly one statement.
    pub(super) fn read_one<T>(&self, f: impl FnOnce(&mut dyn Db) -> Result<T>) -> Result<T> {
        run_once(
            |w| self.engine.read_one(w),
            f,
            "the engine ran no transaction",
        )
    }
}

/// Runs `f` through `run` (one of the engine's ways to run work) at most
/// once, however often the engine calls back, and returns what it returned;
/// `missing` is the error if the engine never called.
fn run_once<T>(
    run: impl FnOnce(Work) -> Result<()>,
    f: impl FnOnce(&mut dyn Db) -> Result<T>,
    missing: &'static str,
) -> Result<T> {
    let mut f = Some(f);
    let mut out = None;
    run(&mut |db| {
        if let Some(f) = f.take() {
            out = Some(f(db)?);
        }
        Ok(())
    })?;
    out.ok_or_else(|| StoreError::Database(missing.into()))
}
