//! What the controller's integration tests share: an API over a store at a
//! fixed clock, a model in a rollout, and one request through the router.
// Each test crate uses its own part of this module.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::Request;
use http_body_util::BodyExt;
use rollgate_controller::{ApiState, Context, ControllerMetrics, HttpClient};
use rollgate_core::Timestamp;
use rollgate_store::{ModelSpec, RevisionSpec, Store};
use serde_json::Value;
use tower::ServiceExt;

/// A controller context over `store`, its clock stopped at `now`.
/// A controller that leads `store` (it takes the lease for an hour).
pub fn leading(store: &dyn Store) -> Arc<rollgate_controller::Leader> {
    let ttl = Duration::from_secs(3600);
    let lease = store
        .acquire_lease(rollgate_controller::CONTROLLER_LEASE, "test", ttl)
        .expect("lease")
        .expect("a fresh store's lease is free");
    Arc::new(rollgate_controller::Leader::holding(&lease, ttl))
}

pub fn context(store: Arc<dyn Store>, now: Timestamp) -> Context {
    Context {
        looks: Default::default(),
        registry_signals: Default::default(),
        leader: leading(store.as_ref()),
        store,
        http: HttpClient::new(Duration::from_secs(1)),
        gateway_ttl: Duration::from_secs(5),
        tick: Duration::from_secs(1),
        clock: Arc::new(move || now),
        local_gateway: None,
        metrics: Arc::new(ControllerMetrics::default()),
        anchor: None,
        retention: None,
        concurrency: 4,
        stats: Default::default(),
        notify: None,
        adapters: Default::default(),
        host: Default::default(),
    }
}

/// The API over `store` at `now`, answering as `127.0.0.1:7070`, no token.
pub fn api_state(store: Arc<dyn Store>, now: Timestamp) -> ApiState {
    ApiState {
        ctx: context(store, now),
        token: None,
        require_token: false,
        oidc: None,
        allowed_hosts: rollgate_controller::api::allowed_hosts(
            "127.0.0.1:7070".parse().expect("addr"),
            &[],
        ),
    }
}

/// Model `m` with a champion and a candidate in rollout 1 (default plan).
pub fn model_in_rollout(store: &dyn Store) -> i64 {
    model_in_rollout_with(
        store,
        "http://127.0.0.1:9002",
        &rollgate_core::Plan::default(),
    )
    .id
}

/// Model `m` with a champion (on port 9) and a candidate served at
/// `candidate` in a rollout under `plan`.
pub fn model_in_rollout_with(
    store: &dyn Store,
    candidate: &str,
    plan: &rollgate_core::Plan,
) -> rollgate_store::RolloutRecord {
    let rev = |upstream: &str| {
        let spec = RevisionSpec {
            upstream: upstream.to_string(),
            ..RevisionSpec::default()
        };
        store
            .register_revision("m", &spec, "setup")
            .expect("revision")
    };
    store
        .create_model("m", &ModelSpec::default(), "setup")
        .expect("model");
    let champion = rev("http://127.0.0.1:9001");
    store
        .set_champion("m", &champion.id, "setup", "first")
        .expect("champion");
    store
        .create_rollout("m", &rev(candidate).id, plan, "setup")
        .expect("rollout")
}

/// Sends `req` through the router: the status and the JSON answer
/// (`Null` if it is not JSON).
pub async fn send(app: &axum::Router, req: Request<Body>) -> (u16, Value) {
    let resp = app.clone().oneshot(req).await.expect("infallible");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// One request from `127.0.0.1:7070`'s clients: with `bearer` and a
/// claimed `actor` if given, a JSON body if given.
pub async fn call(
    app: &axum::Router,
    (method, path): (&str, &str),
    bearer: Option<&str>,
    actor: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "127.0.0.1:7070");
    if let Some(t) = bearer {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    if let Some(a) = actor {
        req = req.header("x-rollgate-actor", a);
    }
    let body = match body {
        Some(v) => {
            req = req.header("content-type", "application/json");
            Body::from(v.to_string())
        }
        None => Body::empty(),
    };
    send(app, req.body(body).expect("request")).await
}

#[path = "../../../../tests/support/promtool.rs"]
mod promtool;
#[allow(unused_imports)] // not every test crate scrapes metrics
pub use promtool::promtool_accepts;

/// Commits one audit record of `kind` for rollout `id` (by the controller,
/// no verdict), as a decision would; returns its seq.
pub fn record(store: &dyn Store, id: i64, kind: rollgate_core::AuditKind) -> u64 {
    use rollgate_core::{Actor, AuditEvent, Effect, Phase};
    let r = store.rollout(id).expect("rollout");
    let effects = [Effect::Audit {
        event: Box::new(AuditEvent {
            kind,
            actor: Actor::Controller,
            from: Phase::Pending,
            to: Phase::Pending,
            verdict: None,
            note: None,
            dry_run: false,
        }),
    }];
    store
        .apply(rollgate_store::TransitionWrite {
            rollout: id,
            expected_version: r.version,
            state: &r.state,
            effects: &effects,
            actor: "controller",
            fence: None,
        })
        .expect("apply");
    store.audit_head().expect("head").expect("a record").0
}
