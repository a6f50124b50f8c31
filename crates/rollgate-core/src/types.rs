//! The leaf types every layer of the core names: time and routing epochs.
//! This module imports nothing of the core, so the modules read top-down:
//! types → statistics → evidence → policies → safety → state machine →
//! words.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A routing epoch: a rollout's routing changes bump it; counts are kept
/// and compared per epoch of arrival (see [`crate::exposure`]).
pub type Epoch = u32;

/// Milliseconds since the Unix epoch. The core never reads a clock: the
/// caller passes `now`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// Time from `earlier` to `self`; zero if `earlier` is later (a clock
    /// that stepped back must not make a stage older).
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }

    pub fn plus(self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(d.as_millis() as u64))
    }
}
