//! The model kit for demos and benchmarks: everything needed to run a real
//! rollout without outside data or downloads.
//!
//! - [`task`]: a seeded synthetic transaction-risk task.
//! - [`model`]: logistic-regression models trained with linfa, saved as JSON,
//!   and the zoo: `champion`, `retrained`, `broken-feature`.
//! - [`server`]: a KServe V1 / Open Inference Protocol V2 model server with
//!   fault injection (failure rate, added latency, ready-then-503), which
//!   also answers the protocol's gRPC service on the same port.
//! - [`traffic`]: an open-loop load generator with sticky keys.
//! - [`metrics`]: the server's Prometheus metrics, in MLServer's shape.

mod config;
mod grpc;
pub mod metrics;
pub mod model;
pub mod server;
pub mod task;
pub mod traffic;
