//! rollgate as a Kubernetes citizen: the `Model` and `ModelRollout`
//! custom resources ([`resources`]), followed by kube-runtime
//! controllers that mirror them into rollgate through its admin API
//! ([`admin`]) and write `status` back.
//!
//! **Boundaries.** rollgate's store stays the source of truth for every
//! decision and the audit; the objects are how a team asks, and their
//! status is what rollgate says back. Every change goes through the admin
//! API, so the validator, the roles, the host boundary and the audit
//! apply to a Kubernetes object exactly as to any other caller (the
//! operator's token is an admin's, so whoever may write these objects in
//! the followed namespace acts as an admin for them; the Kubernetes client
//! that asked is recorded "on behalf of").
//! One object refused or unreachable never stops the others: each is its
//! own reconcile, and rollgate's refusal is a status condition, never a
//! crash or a retry storm.

pub mod admin;
pub mod health;
mod models;
pub mod resources;
mod rollouts;
pub mod status;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;

pub use admin::{AdminApi, AdminError};
pub use resources::{Model, ModelRollout, crds};

/// Why a reconcile failed: retried after [`Options::resync`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Admin(#[from] AdminError),
    #[error("the Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("the finalizer: {0}")]
    Finalizer(String),
    #[error("rollgate answered what the operator cannot read: {0}")]
    Unreadable(String),
}

/// What the reconcilers share.
pub(crate) struct Context {
    client: Client,
    admin: AdminApi,
    /// How often an active rollout's status is refreshed.
    resync: Duration,
}

/// Where the operator looks and how often.
#[derive(Debug, Clone)]
pub struct Options {
    /// The namespace to follow (one: a `Model` is registered in rollgate
    /// under its name, and whoever may write these objects there acts as
    /// a rollgate admin for them).
    pub namespace: String,
    /// How often an active rollout's status is refreshed (and a failed
    /// reconcile retried).
    pub resync: Duration,
}

/// Follows both kinds until `shutdown`, then finishes the reconciles
/// under way.
pub async fn run(
    client: Client,
    admin: AdminApi,
    options: Options,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let ctx = Arc::new(Context {
        client: client.clone(),
        admin,
        resync: options.resync,
    });
    let models: Api<Model> = Api::namespaced(client.clone(), &options.namespace);
    let rollouts: Api<ModelRollout> = Api::namespaced(client, &options.namespace);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let models = Controller::new(models, watcher::Config::default())
        .graceful_shutdown_on(wait(stopped.clone()))
        .run(models::reconcile, retry, Arc::clone(&ctx))
        .for_each(|r| async move { log("Model", r) });
    let rollouts = Controller::new(rollouts, watcher::Config::default())
        .graceful_shutdown_on(wait(stopped))
        .run(rollouts::reconcile, retry, Arc::clone(&ctx))
        .for_each(|r| async move { log("ModelRollout", r) });
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop.send(true);
    });
    futures::join!(models, rollouts);
}

/// Writes `status` into the object's status subresource unless it is
/// what the object already shows (a write that changes nothing would wake
/// its reconcile again for nothing).
pub(crate) async fn write_status<K, S>(
    api: &Api<K>,
    name: &str,
    shown: Option<&S>,
    status: &S,
) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    S: PartialEq + serde::Serialize,
{
    if shown == Some(status) {
        return Ok(());
    }
    // A merge patch leaves what it does not name: a field the new status
    // no longer has is sent as null, so that it goes.
    let mut new = serde_json::to_value(status).map_err(|e| Error::Unreadable(e.to_string()))?;
    if let (Some(old), Some(new)) = (
        shown.and_then(|s| serde_json::to_value(s).ok()),
        new.as_object_mut(),
    ) && let Some(old) = old.as_object()
    {
        for key in old.keys() {
            new.entry(key.clone()).or_insert(serde_json::Value::Null);
        }
    }
    let patch = kube::api::Patch::Merge(serde_json::json!({ "status": new }));
    let params = kube::api::PatchParams::apply(status::FIELD_MANAGER);
    api.patch_status(name, &params, &patch).await?;
    Ok(())
}

/// A failed reconcile (rollgate or the Kubernetes API away) is tried
/// again after five resyncs, not at once: N objects do not storm an API
/// that is down.
fn retry<K>(_: Arc<K>, err: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %err, "reconcile failed; retrying");
    Action::requeue(ctx.resync * 5)
}

/// Now, as a condition's `lastTransitionTime` says it.
pub(crate) fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// Each reconcile's end, at debug level (a failure is logged by [`retry`]).
fn log<T: std::fmt::Debug, E: std::fmt::Display>(kind: &str, r: Result<T, E>) {
    match r {
        Ok(o) => tracing::debug!(kind, object = ?o, "reconciled"),
        Err(e) => tracing::debug!(kind, error = %e, "reconcile error"),
    }
}
