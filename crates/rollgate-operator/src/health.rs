//! The operator's probes, as Kubernetes controllers serve them:
//! `/healthz` while the process runs, `/readyz` while both APIs it
//! stands between answer (rollgate's admin API and the Kubernetes API
//! server), each within [`PROBE_WITHIN`].

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use kube::Client;

use crate::admin::AdminApi;

/// How long a readiness check waits for each API.
const PROBE_WITHIN: Duration = Duration::from_secs(2);

#[derive(Clone)]
struct Peers {
    client: Client,
    admin: AdminApi,
}

/// Serves the probes on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    client: Client,
    admin: AdminApi,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(Peers { client, admin });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn ready(State(p): State<Peers>) -> (StatusCode, String) {
    let rollgate = tokio::time::timeout(
        PROBE_WITHIN,
        p.admin.call("GET", "/readyz", None, "operator"),
    )
    .await;
    let kubernetes = tokio::time::timeout(PROBE_WITHIN, p.client.apiserver_version()).await;
    match (rollgate, kubernetes) {
        (Ok(Ok(_)), Ok(Ok(_))) => (StatusCode::OK, "ready\n".into()),
        (Ok(Ok(_)), k) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the Kubernetes API does not answer: {}\n", said(k)),
        ),
        (r, _) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the rollgate API does not answer: {}\n", said(r)),
        ),
    }
}

fn said<T, E: std::fmt::Display>(r: Result<Result<T, E>, tokio::time::error::Elapsed>) -> String {
    match r {
        Ok(Ok(_)) => "ok".into(),
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {PROBE_WITHIN:?}"),
    }
}
