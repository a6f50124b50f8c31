//! rollgate's control plane. The controller judges and never serves: it
//! reconciles rollouts from the store through the pure state machine, and
//! serves the admin API. It knows no gateway: gateways follow the store
//! (the binary assembles them), and report their stats over HTTP in the
//! core's `GatewaySnapshot`.
//!
//! **Architecture invariant:** the store is the only truth. Every decision
//! commits with its effects in one transaction, compare-and-swap on the
//! rollout's version; a crashed or racing controller can lose a pass, never
//! duplicate or half-apply one.

pub mod adapter;
pub mod api;
pub mod context;
pub mod dashboard;
pub mod host;
pub mod http;
pub mod lead;
pub mod metrics;
pub mod notify;
pub mod oidc;
pub mod prometheus;
pub mod reconcile;
pub mod registry;

pub use api::{ApiState, router};
pub use context::{Anchor, Context, GatewayStats, PRUNE_EVERY, PassStats, Retention, RoutePush};
pub use http::HttpClient;
pub use lead::{CONTROLLER_LEASE, Leader, holder_id};
pub use metrics::ControllerMetrics;
pub use reconcile::{
    Action, Schedule, checkpoint, error_policy, pass, prune, push_model, reconcile, run,
};
