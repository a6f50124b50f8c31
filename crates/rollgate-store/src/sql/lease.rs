//! Leases and fencing: taking, renewing and releasing a lease in one
//! statement outside the writers' serialisation (on the database's clock
//! where there is one), and the check every fenced write makes that its
//! lease's token is still the current one.

use std::time::Duration;

use super::engine::Db;
use super::store::{SqlStore, millis};
use crate::{Fence, Lease, Result, StoreError};

/// The fencing check: a write made under a lease lands only while that
/// lease's token is still the current one.
pub(super) fn check_fence(db: &mut dyn Db, fence: &Fence) -> Result<()> {
    let sql = format!(
        "SELECT token FROM leases WHERE name = ?1{}",
        db.share_lock_sql()
    );
    let current = db
        .row(&sql, p![&fence.lease])?
        .map(|r| r.u64(0))
        .transpose()?;
    if current != Some(fence.token) {
        return Err(StoreError::Fenced {
            lease: fence.lease.clone(),
            token: fence.token,
            current,
        });
    }
    Ok(())
}

pub(super) fn acquire_lease(
    store: &SqlStore,
    name: &str,
    holder: &str,
    ttl: Duration,
) -> Result<Option<Lease>> {
    // Takes the lease if it is free or expired (a new token), or
    // renews it for its holder (the same token: nobody held it in
    // between), in one statement on the database's clock where there
    // is one.
    store.lease_statement(|db, now| {
        let clock = db.clock_sql();
        let at = clock.unwrap_or("?4");
        let sql = format!(
            "INSERT INTO leases (name, holder, token, expires_at) VALUES (?1, ?2, 1, {at} + ?3) \
                 ON CONFLICT (name) DO UPDATE SET \
                 token = CASE WHEN leases.holder = excluded.holder \
                 THEN leases.token ELSE leases.token + 1 END, \
                 holder = excluded.holder, expires_at = excluded.expires_at \
                 WHERE leases.holder = excluded.holder OR leases.expires_at <= {at} \
                 RETURNING token, expires_at"
        );
        let params = p![name, holder, millis(ttl), now.0];
        let params = if clock.is_some() {
            &params[..3]
        } else {
            &params[..]
        };
        db.row(&sql, params)?
            .map(|r| {
                Ok(Lease {
                    fence: Fence {
                        lease: name.to_string(),
                        token: r.u64(0)?,
                    },
                    holder: holder.to_string(),
                    expires_at: r.ts(1)?,
                })
            })
            .transpose()
    })
}

pub(super) fn release_lease(store: &SqlStore, fence: &Fence) -> Result<()> {
    store.lease_statement(|db, now| {
        match db.clock_sql() {
            Some(at) => db.exec(
                &format!("UPDATE leases SET expires_at = {at} WHERE name = ?1 AND token = ?2"),
                p![&fence.lease, fence.token],
            )?,
            None => db.exec(
                "UPDATE leases SET expires_at = ?3 WHERE name = ?1 AND token = ?2",
                p![&fence.lease, fence.token, now.0],
            )?,
        };
        Ok(())
    })
}

pub(super) fn lease(store: &SqlStore, name: &str) -> Result<Option<Lease>> {
    store.read_one(|db| {
        db.row(
            "SELECT holder, token, expires_at FROM leases WHERE name = ?1",
            p![name],
        )?
        .map(|r| {
            Ok(Lease {
                fence: Fence {
                    lease: name.to_string(),
                    token: r.u64(1)?,
                },
                holder: r.text(0)?,
                expires_at: r.ts(2)?,
            })
        })
        .transpose()
    })
}
