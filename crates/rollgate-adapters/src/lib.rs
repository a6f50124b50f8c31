//! Adapters that set the weights of a data plane rollgate does not run
//! (`ModelSpec::data_plane`): nginx, Envoy, or anything behind a webhook.
//! The leading controller brings each such model's data plane to the
//! routing the store holds through the [`Adapter`] trait alone, and
//! remembers what each confirmed (its `Applier`); a rollout's stage clock
//! starts only once its routing is confirmed, and a rollback is sent to
//! the data plane as champion-only routing before it is committed.
//!
//! A new kind of data plane is one module here implementing [`Adapter`],
//! wired in [`for_plane`] (the one place a kind is chosen), and one test
//! that runs `kit` (feature `testing`) against the real peer. Every
//! [`Desired`] carries the store's `routes_version` as its `generation`,
//! and no adapter replaces a routing of a higher generation with a lower
//! one ([`AdapterError::Stale`]): an old leader, cut off from the store
//! but not from the data plane, cannot push stale weights.

mod desired;
mod envoy;
mod error;
#[cfg(feature = "testing")]
pub mod kit;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
mod nginx;
mod webhook;

use std::time::Duration;

use futures::future::BoxFuture;
use rollgate_store::DataPlane;

pub use desired::{Arm, Desired, servable};
pub use error::AdapterError;
pub use nginx::render as render_nginx;
pub use rollgate_net::HttpClient;

/// One data plane's adapter: it applies a routing and confirms it. Built
/// by [`for_plane`]; object-safe, so the controller holds any kind as a
/// `Box<dyn Adapter>`.
pub trait Adapter: Send + Sync + std::fmt::Debug {
    /// The data plane's kind, as `DataPlane::kind` spells it.
    fn kind(&self) -> &'static str;

    /// The kind's own work, given a servable routing (callers use
    /// [`Adapter::apply`]): writes `desired` to the data plane and waits
    /// (bounded) until the data plane confirms it is in force. A routing
    /// of a higher generation already there is left as it is
    /// ([`AdapterError::Stale`]); an equal one is applied again.
    fn send<'a>(&'a self, desired: &'a Desired) -> BoxFuture<'a, Result<(), AdapterError>>;

    /// What the data plane must hold before it first starts, as `(where,
    /// contents)`, for the servable routing `desired` (nothing for a kind
    /// that reads nothing of rollgate's at start-up).
    fn seed_files(&self, desired: &Desired) -> Result<Vec<(String, String)>, AdapterError>;

    /// Applies `desired` and waits for its confirmation; a routing that
    /// cannot serve is refused before anything is written ([`servable`]).
    /// Not overridden: every kind gets the same check.
    fn apply<'a>(&'a self, desired: &'a Desired) -> BoxFuture<'a, Result<(), AdapterError>> {
        Box::pin(async move {
            servable(desired)?;
            self.send(desired).await
        })
    }
}

/// The adapter of `plane`, calling out through `http`: the one place a
/// kind of data plane is wired to its adapter.
pub fn for_plane(plane: &DataPlane, http: &HttpClient) -> Box<dyn Adapter> {
    match plane {
        DataPlane::Webhook {
            url,
            bearer_token_file,
        } => Box::new(webhook::Webhook {
            http: http.clone(),
            url: url.clone(),
            bearer_token_file: bearer_token_file.clone(),
        }),
        DataPlane::Nginx {
            include_file,
            reload_command,
            confirm_url,
            key,
        } => Box::new(nginx::Nginx {
            http: HttpClient::unpooled(Duration::from_secs(2)),
            include_file: include_file.clone(),
            reload_command: reload_command.clone(),
            confirm_url: confirm_url.clone(),
            key: key.clone(),
        }),
        DataPlane::Envoy {
            routes_file,
            clusters_file,
            admin_url,
            route_config_name,
            key_header,
            mirror_cluster,
        } => Box::new(envoy::Envoy {
            http: http.clone(),
            routes_file: routes_file.clone(),
            clusters_file: clusters_file.clone(),
            admin_url: admin_url.trim_end_matches('/').to_string(),
            route_config_name: route_config_name.clone(),
            key_header: key_header.clone(),
            mirror_cluster: mirror_cluster.clone(),
        }),
        DataPlane::GatewayApi { .. } | DataPlane::Istio { .. } | DataPlane::Kserve { .. } => {
            kube_adapter(plane)
        }
    }
}

/// The adapter of a data plane reached through a Kubernetes API server.
#[cfg(feature = "kubernetes")]
fn kube_adapter(plane: &DataPlane) -> Box<dyn Adapter> {
    use kubernetes::{
        Kube, gateway_api::HttpRoutes, istio::VirtualServices, kserve::InferenceServices,
    };
    match plane {
        DataPlane::GatewayApi {
            cluster,
            namespace,
            routes,
            mirror,
            require_status,
            controller_name,
        } => Box::new(Kube {
            access: cluster.clone(),
            namespace: namespace.clone(),
            require_status: *require_status,
            shape: HttpRoutes {
                routes: routes.clone(),
                mirror: mirror.clone(),
                controller_name: controller_name.clone(),
            },
        }),
        DataPlane::Istio {
            cluster,
            namespace,
            name,
            hosts,
            gateways,
            mirror,
            require_status,
        } => Box::new(Kube {
            access: cluster.clone(),
            namespace: namespace.clone(),
            require_status: *require_status,
            shape: VirtualServices {
                name: name.clone(),
                hosts: hosts.clone(),
                gateways: gateways.clone(),
                mirror: mirror.clone(),
            },
        }),
        DataPlane::Kserve {
            cluster,
            namespace,
            name,
            mode,
            require_status,
            allow_predictor_fields,
        } => Box::new(Kube {
            access: cluster.clone(),
            namespace: namespace.clone(),
            require_status: *require_status,
            shape: InferenceServices {
                name: name.clone(),
                mode: *mode,
                allowed: allow_predictor_fields.clone(),
            },
        }),
        other => Box::new(NotBuilt(other.kind())),
    }
}

/// Without the `kubernetes` feature: every apply says so.
#[cfg(not(feature = "kubernetes"))]
fn kube_adapter(plane: &DataPlane) -> Box<dyn Adapter> {
    Box::new(NotBuilt(plane.kind()))
}

/// A data plane this build cannot drive.
#[derive(Debug)]
struct NotBuilt(&'static str);

impl Adapter for NotBuilt {
    fn kind(&self) -> &'static str {
        self.0
    }

    fn send<'a>(&'a self, _desired: &'a Desired) -> BoxFuture<'a, Result<(), AdapterError>> {
        Box::pin(async { Err(AdapterError::NotBuilt(self.0)) })
    }

    fn seed_files(&self, _desired: &Desired) -> Result<Vec<(String, String)>, AdapterError> {
        Err(AdapterError::NotBuilt(self.0))
    }
}

/// What a data plane must hold before it first starts (nginx and Envoy
/// read rollgate's files at start-up): the files the adapter itself would
/// write for a champion-only routing of `model` to `upstream`, under the
/// version `"seed"` and generation 0 (any routing the store holds
/// replaces it), as `(what, contents)`. The adapter rewrites them at the
/// first routing it applies (when the model has a champion).
pub fn seed(
    plane: &DataPlane,
    model: &str,
    upstream: &str,
) -> Result<Vec<(String, String)>, AdapterError> {
    let desired = Desired {
        model: model.to_string(),
        version: "seed".into(),
        rollout: None,
        epoch: 0,
        generation: 0,
        shadow: None,
        arms: vec![Arm {
            role: "champion",
            revision: "seed".into(),
            upstream: upstream.to_string(),
            weight_bp: 10_000,
            predictor: None,
        }],
    };
    servable(&desired)?;
    // Seeding calls nobody: the client is never used.
    let http = HttpClient::new(std::time::Duration::from_secs(1));
    for_plane(plane, &http).seed_files(&desired)
}

/// `name` as part of an identifier in a data plane's configuration.
fn ident(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// Replaces `path` with `bytes` in one rename: a data plane watching or
/// reloading it never reads half a file.
fn write_atomically(path: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = format!("{path}.rollgate-tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests;
