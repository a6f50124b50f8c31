//! The policies: each only computes bounds and gate verdicts, and both feed
//! the one safety-model rule chain ([`crate::safety`]).
//!
//! - [`sequential`] (the default): anytime-valid tests over the whole
//!   rollout; a failing gate rolls back at once.
//! - [`windowed`]: fixed-horizon bounds on each stage's window, breaches
//!   confirmed on disjoint windows.
//!
//! A rollout's test state is one [`PolicyTests`] value; [`look`] runs the
//! plan's policy on it and says what the state machine does next.

use serde::{Deserialize, Serialize};

mod look;
pub mod sequential;
pub mod windowed;

pub use look::{Judged, LookInput, Next};
use sequential::SequentialState;
use windowed::WindowedTests;

use crate::plan::{Plan, Policy};

/// The plan's policy's test state: what its bounds need between looks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyTests {
    /// The current stage's windows (reset when a stage starts).
    Windowed(WindowedTests),
    /// The whole rollout's sequential tests.
    Sequential(SequentialState),
}

/// One look of the plan's policy: its verdict, and what the rollout does
/// next. Test state of the other policy (a plan edited mid-rollout, a
/// record from before) is dropped and begun afresh.
pub fn look(plan: &Plan, tests: &mut Option<PolicyTests>, input: &LookInput) -> Judged {
    match plan.policy {
        Policy::Sequential => {
            let mut state = match tests.take() {
                Some(PolicyTests::Sequential(s)) => s,
                _ => SequentialState::default(),
            };
            let judged = sequential::look(plan, &mut state, input);
            *tests = Some(PolicyTests::Sequential(state));
            judged
        }
        Policy::Windowed => {
            let mut windows = match tests.take() {
                Some(PolicyTests::Windowed(w)) => w,
                _ => WindowedTests::default(),
            };
            let judged = windowed::look(plan, &mut windows, input);
            *tests = Some(PolicyTests::Windowed(windows));
            judged
        }
    }
}
