//! A model registry's webhook: MLflow's deliveries, authenticated by their
//! signature (MLflow sends no bearer token), each verified one waking the
//! registry's poll. Nothing in a payload is acted on (`registry::webhook`).

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use serde::Serialize;
use utoipa::ToSchema;

use super::error::{ApiError, ApiResult};
use super::extract::Path;
use super::state::ApiState;
use crate::registry::webhook::{Delivery, verify};

/// What a delivery did.
#[derive(Debug, Serialize, ToSchema)]
struct Taken {
    /// The registry's poll was woken.
    woke: bool,
    /// The delivery id was taken before (MLflow retries with the same id).
    duplicate: bool,
}

/// The largest delivery read (MLflow's are a few hundred bytes).
pub(super) const WEBHOOK_BODY_LIMIT: usize = 64 << 10;

/// The registry a webhook path names, if it is one.
fn webhook_of(path: &str) -> Option<&str> {
    match path.split('/').collect::<Vec<_>>().as_slice() {
        ["", "api", "v1", "registries", name, "webhook"] if !name.is_empty() => Some(name),
        _ => None,
    }
}

/// Whether `path` is a registry webhook's.
pub(super) fn is_webhook(path: &str) -> bool {
    webhook_of(path).is_some()
}

/// Whether `path` is the webhook of a registry the config declares with a
/// secret: authenticated by its signature, not by a token. Any other name
/// needs a token like every other route (so who is not let in learns
/// nothing of which registries take webhooks).
pub(super) fn takes_webhooks(s: &ApiState, path: &str) -> bool {
    webhook_of(path).is_some_and(|name| {
        s.ctx
            .host
            .registries()
            .get(name)
            .is_some_and(|r| r.webhook_secret_file.is_some())
    })
}

#[utoipa::path(post, path = "/api/v1/registries/{name}/webhook", tag = "registries",
    params(("name" = String, Path, description = "The registry, as [registries.NAME] declares it")),
    request_body(content = Object, description = "An MLflow webhook delivery (its payload is not acted on)"),
    security(()),
    responses(
        (status = 200, description = "Taken: the registry's poll woken (once per delivery id)", body = Taken),
        (status = 401, description = "Its signature does not verify, or its timestamp is outside 5 minutes", body = super::ErrorBody),
        (status = 404, description = "No such registry, or it takes no webhook", body = super::ErrorBody)))]
pub(super) async fn webhook(
    State(s): State<ApiState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let secret_file = s
        .ctx
        .host
        .registries()
        .get(&name)
        .and_then(|r| r.webhook_secret_file.clone())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!(
                    "no registry {name:?} takes webhooks: declare webhook_secret_file in \
                     [registries.{name}] (docs/config.md, \"MLflow\")"
                ),
            )
        })?;
    let file = secret_file.clone();
    let read = tokio::task::spawn_blocking(move || std::fs::read(file))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    let secret = read.map_err(|e| {
        tracing::error!(registry = %name, file = %secret_file.display(), error = %e, "the webhook secret cannot be read");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the registry's webhook secret cannot be read on the controller's host",
        )
    })?;
    if secret.trim_ascii().is_empty() {
        tracing::error!(registry = %name, file = %secret_file.display(), "the webhook secret file is empty");
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the registry's webhook secret is empty on the controller's host",
        ));
    }
    let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let delivery = Delivery {
        id: header("x-mlflow-delivery-id"),
        timestamp: header("x-mlflow-timestamp"),
        signature: header("x-mlflow-signature"),
        body: &body,
    };
    let now = (s.ctx.clock)().0 / 1000;
    let id = verify(secret.trim_ascii(), &delivery, now).map_err(|e| {
        tracing::warn!(registry = %name, error = %e, "a webhook delivery was refused");
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", e.to_string())
    })?;
    let woke = s.ctx.registry_signals.deliver(&name, id);
    Ok(Json(Taken {
        woke,
        duplicate: !woke,
    }))
}
