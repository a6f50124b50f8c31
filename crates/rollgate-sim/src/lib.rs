//! Synthetic traffic for rollgate's real state machine and gates.
//!
//! A seeded, deterministic stand-in for the gateway: Poisson arrivals,
//! sticky keys hashed into buckets, per-arm failure probability, lognormal
//! latency, and paired answers with a chosen disagreement and
//! high-confidence-flip rate. It records exactly what a gateway records
//! (a cumulative [`Snapshot`](rollgate_core::Snapshot)) and feeds it to
//! [`rollgate_core::step`] once a tick, applying the routing effects it
//! returns. No clock, no network.
//!
//! The crate reads top-down: what to run (`scenario.rs`), the random draws
//! (`draw.rs`) and traffic models built from it (`traffic.rs`, `users.rs`,
//! `scrape.rs`), how a tick's requests are served and recorded
//! (`serve.rs`), who decides (`decider.rs`, `baseline.rs`), the runner
//! (`run.rs`), and the scenarios × policies × seeds matrix (`matrix.rs`);
//! apart, delayed labels judged by the quality gate (`labels.rs`).

pub mod baseline;
mod decider;
mod draw;
pub mod labels;
pub mod matrix;
mod run;
mod scenario;
mod scrape;
mod serve;
mod traffic;
mod users;

pub use decider::{CoreDecider, Decider, pooled};
pub use run::{SimResult, TimedEvent, simulate, simulate_with};
pub use scenario::{ArmModel, CANDIDATE, CHAMPION, Expect, Scenario, ScrapeModel, Slowdown};
pub use traffic::{Traffic, bot_bucket};
pub use users::{Assignment, Users};
