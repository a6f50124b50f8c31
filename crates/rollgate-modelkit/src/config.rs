//! What a model server serves (its model, under which name, over TLS or
//! not) and the faults it injects into predictions. Both of its faces read
//! them: REST in `server.rs`, which also takes every connection and hands
//! gRPC calls on, and gRPC in `grpc.rs`, which needs nothing else of it.

use std::time::Duration;

use crate::model::LinearModel;

/// Faults to inject into predictions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    /// Share of predictions answered 500.
    pub failure_rate: f64,
    /// Added to every prediction.
    pub latency: Duration,
    /// Added on top for a `tail_fraction` share of predictions.
    pub tail_latency: Duration,
    pub tail_fraction: f64,
    /// Readiness passes; every prediction answers 503.
    pub ready_then_503: bool,
}

/// A fault injected into one prediction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Ready, yet unavailable (503, gRPC `UNAVAILABLE`).
    Unavailable,
    /// An injected failure (500, gRPC `INTERNAL`).
    Failure,
}

impl Faults {
    /// Waits the added latency, then says which fault (if any) this
    /// prediction gets.
    pub(crate) async fn inject(&self) -> Option<Fault> {
        let mut delay = self.latency;
        if self.tail_fraction > 0.0 && rand::random_bool(self.tail_fraction.clamp(0.0, 1.0)) {
            delay += self.tail_latency;
        }
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if self.ready_then_503 {
            return Some(Fault::Unavailable);
        }
        if self.failure_rate > 0.0 && rand::random_bool(self.failure_rate.clamp(0.0, 1.0)) {
            return Some(Fault::Failure);
        }
        None
    }
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The model name in request paths.
    pub name: String,
    pub model: LinearModel,
    pub faults: Faults,
    /// Serve over TLS (HTTP/2 offered by ALPN), as model servers behind a
    /// team's CA do.
    pub tls: Option<rollgate_net::ServerTls>,
}
