//! The policies: each only computes bounds and gate verdicts, and both feed
//! the one safety-model rule chain ([`crate::safety`]).
//!
//! - [`sequential`] (the default): anytime-valid tests over the whole
//!   rollout; a failing gate rolls back at once.
//! - [`windowed`]: fixed-horizon bounds on each stage's window, breaches
//!   confirmed on disjoint windows.
//!
//! A rollout's test state is one [`PolicyTests`] value.

use serde::{Deserialize, Serialize};

pub mod sequential;
pub mod windowed;

use sequential::SequentialState;
use windowed::WindowedTests;

/// The plan's policy's test state: what its bounds need between looks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyTests {
    /// The current stage's windows (reset when a stage starts).
    Windowed(WindowedTests),
    /// The whole rollout's sequential tests.
    Sequential(SequentialState),
}
