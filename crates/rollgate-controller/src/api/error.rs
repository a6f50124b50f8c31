//! The API's errors: one envelope (a status, a stable code, a message) for
//! every answer that is not a success, and how the store's, the reconcile
//! loop's and the state machine's errors map onto it.

use axum::Json;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use rollgate_core::StepError;
use rollgate_store::StoreError;
use serde::Serialize;
use utoipa::ToSchema;

use crate::context::Error as ReconcileError;

/// An API error: status, stable code, message.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    pub(super) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }
}

/// The envelope of every error answer (4xx and 5xx).
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable and machine-readable: `bad_request`, `unauthorized`,
    /// `forbidden_role`, `not_found`, `conflict`, `invalid`, … (docs/api.md).
    pub code: String,
    /// For a person; names the field at fault when there is one.
    pub message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
            },
        };
        (self.status, Json(body)).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "not_found", e.to_string())
            }
            StoreError::Conflict(_) => {
                ApiError::new(StatusCode::CONFLICT, "conflict", e.to_string())
            }
            StoreError::Rejected { .. } => {
                ApiError::new(StatusCode::CONFLICT, "revision_rejected", e.to_string())
            }
            StoreError::VersionConflict { .. } => {
                ApiError::new(StatusCode::CONFLICT, "version_conflict", e.to_string())
            }
            StoreError::Fenced { .. } => {
                ApiError::new(StatusCode::CONFLICT, "not_leader", e.to_string())
            }
            StoreError::Invalid(m) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", m),
            StoreError::Database(_) | StoreError::Corrupt(_) => {
                tracing::error!(error = %e, "store failure");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error",
                )
            }
        }
    }
}

impl From<ReconcileError> for ApiError {
    fn from(e: ReconcileError) -> Self {
        match e {
            ReconcileError::Store(s) => s.into(),
            ReconcileError::Join(m) => {
                tracing::error!(error = %m, "task failure");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error",
                )
            }
        }
    }
}

impl From<StepError> for ApiError {
    fn from(e: StepError) -> Self {
        match e {
            StepError::ReasonRequired { .. } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid",
                format!("field `reason`: {e}"),
            ),
            StepError::Terminal { .. } => {
                ApiError::new(StatusCode::CONFLICT, "rollout_finished", e.to_string())
            }
            StepError::AlreadyPaused
            | StepError::NotPaused
            | StepError::NothingToApprove
            | StepError::DryRunCannotPromote => {
                ApiError::new(StatusCode::CONFLICT, "conflict", e.to_string())
            }
        }
    }
}

pub(super) type ApiResult<T> = Result<T, ApiError>;

pub(super) async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
}

pub(super) async fn method_not_allowed(method: Method) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{method} is not allowed on this endpoint"),
    )
}

/// An error about something the request's body names: a model or
/// revision that does not exist is the body's mistake (422 `invalid`),
/// not a missing resource at the URL (404).
pub(super) fn in_body(named: &'static [&'static str]) -> impl Fn(ReconcileError) -> ApiError {
    move |e| match e {
        ReconcileError::Store(e @ StoreError::NotFound { what, .. }) if named.contains(&what) => {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", e.to_string())
        }
        other => other.into(),
    }
}
