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

/// One object's status subresource, written as merge patches against
/// what it last held: what the reconcile read afresh, then each write of
/// its own. A merge patch leaves what it does not name, so whatever the
/// new status no longer has (a field, a key of a map) is sent as null;
/// a write that changes nothing is not sent (it would wake the reconcile
/// again for nothing).
pub(crate) struct StatusWriter<'a, K> {
    api: &'a Api<K>,
    name: String,
    written: Option<serde_json::Value>,
}

impl<'a, K> StatusWriter<'a, K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    pub(crate) fn new<S: serde::Serialize>(api: &'a Api<K>, name: &str, shown: Option<&S>) -> Self {
        StatusWriter {
            api,
            name: name.to_string(),
            written: shown.and_then(|s| serde_json::to_value(s).ok()),
        }
    }

    pub(crate) async fn write<S: serde::Serialize>(&mut self, status: &S) -> Result<(), Error> {
        let new = serde_json::to_value(status).map_err(|e| Error::Unreadable(e.to_string()))?;
        if self.written.as_ref() == Some(&new) {
            return Ok(());
        }
        let mut patch = new.clone();
        if let Some(old) = &self.written {
            null_missing(old, &mut patch);
        }
        let patch = kube::api::Patch::Merge(serde_json::json!({ "status": patch }));
        let params = kube::api::PatchParams::apply(status::FIELD_MANAGER);
        self.api.patch_status(&self.name, &params, &patch).await?;
        self.written = Some(new);
        Ok(())
    }
}

/// Every key `old` has and `new` lacks, at any depth of objects, set to
/// null in `new` (a merge patch's way of removing it).
fn null_missing(old: &serde_json::Value, new: &mut serde_json::Value) {
    if let (serde_json::Value::Object(old), serde_json::Value::Object(new)) = (old, new) {
        for (key, was) in old {
            match new.get_mut(key) {
                Some(is) => null_missing(was, is),
                None => {
                    new.insert(key.clone(), serde_json::Value::Null);
                }
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// What a status no longer has, at any depth of objects, goes as
    /// null in its merge patch; lists are replaced whole by a merge patch
    /// and left as they are.
    #[test]
    fn what_went_is_sent_as_null() {
        let old = json!({ "startRequested": "r1", "handled": { "paused": "false", "approve": "x" },
                          "conditions": [{ "type": "Valid" }], "phase": "STARTING" });
        let mut new =
            json!({ "handled": { "paused": "false" }, "conditions": [], "phase": "WAITING" });
        super::null_missing(&old, &mut new);
        assert_eq!(
            new,
            json!({ "startRequested": null, "handled": { "paused": "false", "approve": null },
                    "conditions": [], "phase": "WAITING" })
        );
    }
}
