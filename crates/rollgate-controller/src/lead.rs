//! Leadership: several controllers may run on one store; one leads by a
//! lease held in the store and reconciles, the others stand by and serve
//! the API. Every commit the leader makes carries the lease's fencing
//! token, and the store refuses a token that another holder has since
//! superseded — so a leader that paused (GC, SIGSTOP, a partition) past its
//! lease and wakes up can never commit after another took over (Argo
//! Rollouts #2117: an old leader kept acting). Clocks only decide *when* a
//! standby may take over; the token alone decides what may commit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rollgate_core::Timestamp;
use rollgate_store::{Fence, Lease, Store};
use tokio::time::Instant;

/// The lease controllers lead by.
pub const CONTROLLER_LEASE: &str = "controller";

/// This controller's standing.
#[derive(Debug)]
pub struct Leader {
    holder: String,
    ttl: Duration,
    /// What campaigns record: also those whose answer comes after the
    /// campaign stopped waiting for it.
    state: Arc<Standing>,
    /// A campaign's call is waiting on the store (a cut link): no second
    /// one starts; the call clears it when it ends, however it ends.
    asking: Arc<AtomicBool>,
}

/// What this controller's campaigns learnt.
#[derive(Debug, Default)]
struct Standing {
    /// The fence while leading, and when the lease was last renewed.
    held: Mutex<Option<(Fence, Instant)>>,
    /// What the last campaigns learnt of the store, for answering at once
    /// when it cannot be asked.
    seen: Mutex<Seen>,
}

/// Clears `asking` when dropped (also when the call panics).
struct Asking(Arc<AtomicBool>);

impl Drop for Asking {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl Standing {
    fn held(&self) -> std::sync::MutexGuard<'_, Option<(Fence, Instant)>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn saw(&self, answered: Option<Option<Lease>>) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        match answered {
            Some(lease) => {
                if lease.is_some() {
                    seen.lease = lease;
                }
                seen.unreachable_since = None;
            }
            None => {
                seen.unreachable_since.get_or_insert_with(wall_clock);
            }
        }
    }

    /// Records the store's answer to a campaign asked at `asked`.
    fn record(&self, holder: &str, asked: Instant, got: rollgate_store::Result<Option<Lease>>) {
        let before = self.held().as_ref().map(|(f, _)| f.clone());
        match got {
            Ok(Some(lease)) => {
                self.saw(Some(Some(lease.clone())));
                if before.as_ref() != Some(&lease.fence) {
                    tracing::info!(holder, token = lease.fence.token, "leading");
                }
                // The lease runs from when it was asked for, not answered
                // (the database's expiry is at least that late).
                *self.held() = Some((lease.fence, asked));
            }
            Ok(None) => {
                self.saw(Some(None));
                if before.is_some() {
                    tracing::warn!(holder, "another controller leads; standing by");
                }
                *self.held() = None;
            }
            Err(e) => {
                self.saw(None);
                tracing::warn!(error = %e, "renewing the lease failed");
            }
        }
    }
}

/// The store as this controller's campaigns last found it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// The lease as last read or taken.
    pub lease: Option<Lease>,
    /// Since when the store has not answered a campaign (wall clock).
    pub unreachable_since: Option<Timestamp>,
}

fn wall_clock() -> Timestamp {
    Timestamp(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    )
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
            state: Arc::default(),
            asking: Arc::default(),
        }
    }

    /// A controller that already holds `lease` (taken by its caller).
    pub fn holding(lease: &rollgate_store::Lease, ttl: Duration) -> Leader {
        Leader {
            holder: lease.holder.clone(),
            ttl,
            state: Arc::new(Standing {
                held: Mutex::new(Some((lease.fence.clone(), Instant::now()))),
                seen: Mutex::new(Seen {
                    lease: Some(lease.clone()),
                    unreachable_since: None,
                }),
            }),
            asking: Arc::default(),
        }
    }

    /// What the last campaigns learnt of the store.
    pub fn seen(&self) -> Seen {
        self.state
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
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
        self.state.held()
    }

    /// The fence to commit under, while this controller leads: held, and
    /// renewed within the lease's length by the local clock.
    pub fn fence(&self) -> Option<Fence> {
        let held = self.held();
        let (fence, renewed) = held.as_ref()?;
        (renewed.elapsed() < self.ttl).then(|| fence.clone())
    }

    /// Takes or renews the lease; returns whether this controller leads.
    /// A store that does not answer within a renewal period counts as
    /// unreachable (the call goes on in the background; no second one
    /// starts while it hangs), so the controller never stalls on a cut
    /// link and can say so.
    pub async fn campaign(&self, store: &Arc<dyn Store>) -> bool {
        if self.asking.swap(true, Ordering::SeqCst) {
            self.state.saw(None);
            return self.fence().is_some();
        }
        let asking = Asking(Arc::clone(&self.asking));
        let (s, holder, ttl) = (Arc::clone(store), self.holder.clone(), self.ttl);
        let state = Arc::clone(&self.state);
        let asked = Instant::now();
        // The answer is recorded when it comes, even after this campaign
        // stopped waiting: a renewal or take-over the database made is
        // never lost.
        let call = tokio::task::spawn_blocking(move || {
            let _asking = asking;
            let got = s.acquire_lease(CONTROLLER_LEASE, &holder, ttl);
            state.record(&holder, asked, got);
        });
        match tokio::time::timeout(self.renew_every(), call).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "lease task failed"),
            Err(_) => {
                self.state.saw(None);
                tracing::warn!("the store did not answer the lease renewal in time");
            }
        }
        self.fence().is_some()
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
