//! rollgate's decision core: statistics, gates and the rollout state machine.
//!
//! **Architecture invariant:** nothing in this crate does I/O, reads a clock
//! or uses a global random number generator. Time (`now`) and measurements
//! (stats snapshots) are arguments; decisions and their effects are return
//! values. `tests/architecture.rs` checks this on every `cargo test`.

pub mod anytime;
pub mod exposition;
pub mod exposure;
pub mod gate;
pub mod histogram;
pub mod keys;
pub mod labels;
mod memo;
pub mod plan;
pub mod plot;
pub mod policy;
pub mod protocol;
pub mod rollout;
pub mod safety;
pub mod scraped;
pub mod snapshot;
pub mod spec;
pub mod stage;
pub mod stats;
pub mod types;
pub mod unit;
pub mod words;

pub use exposure::{
    Epoch, Exposure, GatewaySnapshot, Ledger, MAX_SERIES, SeriesReport, epoch_label, epoch_of,
};
pub use gate::{Evidence, GateKind, GateVerdict, Outcome, Reason};
pub use histogram::{LatencyHistogram, MAX_LATENCY_US};
pub use plan::{Advance, Mode, Plan, PlanError, Policy};
pub use policy::{PolicyTests, sequential, windowed};
pub use protocol::Protocol;
pub use rollout::{
    Actor, AuditEvent, AuditKind, Effect, Input, Observation, OperatorAction, Phase, RolloutSpec,
    RolloutState, Routing, StepError, Transition, step,
};
pub use snapshot::{FailureClass, PairStats, RevisionStats, Snapshot, SnapshotError};
pub use stage::{RollbackReason, StageKind, StageReason, StageVerdict};
pub use types::Timestamp;
pub use unit::{UNITS, UnitTotals, unit_of};
