//! Leadership: several controllers may run on one store; one leads by a
//! lease held in the store and reconciles, the others stand by and serve
//! the API. Every commit the leader makes carries the lease's fencing
//! token, and the store refuses a token that another holder has since
//! superseded — so a leader that paused (GC, SIGSTOP, a partition) past its
//! lease and wakes up can never commit after another took over (Argo
//! Rollouts #2117: an old leader kept acting). Clocks only decide *when* a
//! standby may take over; the token alone decides what may commit.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rollgate_store::{Fence, Store};
use tokio::time::Instant;

/// The lease controllers lead by.
pub const CONTROLLER_LEASE: &str = "controller";

/// This controller's standing.
#[derive(Debug)]
pub struct Leader {
    holder: String,
    ttl: Duration,
    /// The fence while leading, and when the lease was last renewed.
    held: Mutex<Option<(Fence, Instant)>>,
}

/// A holder name unique to this process: host, pid and a random suffix
/// (a restarted process is a new holder).
pub fn holder_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into());
    format!(
        "{host}/{}/{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

impl Leader {
    /// A controller that leads for `ttl` after each renewal.
    pub fn new(holder: impl Into<String>, ttl: Duration) -> Leader {
        Leader {
            holder: holder.into(),
            ttl,
            held: Mutex::new(None),
        }
    }

    /// A controller that already holds `lease` (taken by its caller).
    pub fn holding(lease: &rollgate_store::Lease, ttl: Duration) -> Leader {
        Leader {
            holder: lease.holder.clone(),
            ttl,
            held: Mutex::new(Some((lease.fence.clone(), Instant::now()))),
        }
    }

    /// How often the lease is renewed (and a standby tries to take it):
    /// a third of its length, so two renewals may fail before it lapses.
    pub fn renew_every(&self) -> Duration {
        (self.ttl / 3).max(Duration::from_millis(50))
    }

    pub fn holder(&self) -> &str {
        &self.holder
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Option<(Fence, Instant)>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fence to commit under, while this controller leads: held, and
    /// renewed within the lease's length by the local clock.
    pub fn fence(&self) -> Option<Fence> {
        let held = self.held();
        let (fence, renewed) = held.as_ref()?;
        (renewed.elapsed() < self.ttl).then(|| fence.clone())
    }

    /// Takes or renews the lease; returns whether this controller leads.
    pub async fn campaign(&self, store: &Arc<dyn Store>) -> bool {
        let (s, holder, ttl) = (Arc::clone(store), self.holder.clone(), self.ttl);
        let asked = Instant::now();
        let got =
            tokio::task::spawn_blocking(move || s.acquire_lease(CONTROLLER_LEASE, &holder, ttl))
                .await;
        let before = self.fence();
        match got {
            Ok(Ok(Some(lease))) => {
                if before.as_ref() != Some(&lease.fence) {
                    tracing::info!(holder = %self.holder, token = lease.fence.token, "leading");
                }
                // The lease runs from when it was asked for, not answered.
                *self.held() = Some((lease.fence, asked));
                true
            }
            Ok(Ok(None)) => {
                if before.is_some() {
                    tracing::warn!(holder = %self.holder, "another controller leads; standing by");
                }
                *self.held() = None;
                false
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "renewing the lease failed");
                self.fence().is_some()
            }
            Err(e) => {
                tracing::warn!(error = %e, "lease task failed");
                self.fence().is_some()
            }
        }
    }

    /// A commit was refused as fenced: another controller leads.
    pub fn step_down(&self) {
        if self.held().take().is_some() {
            tracing::warn!(holder = %self.holder, "fenced: another controller took over; standing by");
        }
    }

    /// Ends the lease (on shutdown) so a standby takes over at once.
    pub async fn resign(&self, store: &Arc<dyn Store>) {
        let Some(fence) = self.held().take().map(|(f, _)| f) else {
            return;
        };
        let s = Arc::clone(store);
        let _ = tokio::task::spawn_blocking(move || s.release_lease(&fence)).await;
    }
}
