//! Labels: ground truth for requests a model answered, sent later (by a
//! labelling pipeline holding a `labeler` token), joined with the answers
//! the gateways recorded. A batch is applied whole or not at all: one
//! entry that is not a label refuses the batch, naming it; ids no answer
//! has, duplicates and conflicting labels are counted, never an error.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::{Extension, Json};
use rollgate_core::Timestamp;
use rollgate_store::{LabelCounts, LabelIn, MAX_LABEL_TEXT};
use serde::Deserialize;
use utoipa::ToSchema;

use super::auth::{Identity, actor};
use super::error::{ApiError, ApiResult};
use super::extract::{JsonBody, Path};
use super::state::ApiState;
use crate::context::blocking;

/// Labels one batch holds at most.
pub const MAX_BATCH: usize = 10_000;

/// A batch of labels.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LabelBatch {
    /// Each: `request_id` (the `x-request-id` the answer carried), `label`
    /// (a class as a string, a number, or a boolean), and optionally
    /// `observed_at` (milliseconds since the Unix epoch, for reading).
    #[schema(value_type = Vec<Object>)]
    labels: Vec<serde_json::Value>,
}

/// One entry read as a label, or why it is not one (`i`: its index).
fn label_of(i: usize, v: &serde_json::Value) -> Result<LabelIn, String> {
    let obj = v
        .as_object()
        .ok_or_else(|| format!("labels[{i}]: expected an object"))?;
    if let Some(k) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "request_id" | "label" | "observed_at"))
    {
        return Err(format!("labels[{i}]: unknown field {k:?}"));
    }
    let request_id = match obj.get("request_id") {
        Some(serde_json::Value::String(s))
            if !s.is_empty() && s.len() <= MAX_LABEL_TEXT && !s.chars().any(char::is_control) =>
        {
            s.clone()
        }
        _ => {
            return Err(format!(
                "labels[{i}].request_id: expected the request's id, 1-{MAX_LABEL_TEXT} characters"
            ));
        }
    };
    let label = match obj.get("label") {
        Some(serde_json::Value::String(s)) if !s.trim().is_empty() && s.len() <= MAX_LABEL_TEXT => {
            s.clone()
        }
        Some(serde_json::Value::Bool(b)) => b.to_string(),
        // An integral number reads as the class a model would name it by.
        Some(serde_json::Value::Number(n)) => match (n.as_i64(), n.as_f64()) {
            (Some(k), _) => k.to_string(),
            (None, Some(x)) if x.fract() == 0.0 && x.abs() < 1e15 => format!("{x:.0}"),
            (None, Some(x)) => x.to_string(),
            (None, None) => n.to_string(),
        },
        _ => {
            return Err(format!(
                "labels[{i}].label: expected a string (1-{MAX_LABEL_TEXT} characters), \
                 a number or a boolean"
            ));
        }
    };
    let observed_at = match obj.get("observed_at") {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => Some(Timestamp(v.as_u64().ok_or_else(|| {
            format!("labels[{i}].observed_at: expected milliseconds since the Unix epoch")
        })?)),
    };
    Ok(LabelIn {
        request_id,
        label,
        observed_at,
    })
}

/// Sends labels for a model's answers. Idempotent by request id: the same
/// label again is a duplicate, a different one a conflict (not applied);
/// an id no recorded answer has (never recorded, or pruned) is unknown.
/// Audited as one `labels_received` record of the counts.
#[utoipa::path(post, path = "/api/v1/models/{model}/labels", tag = "models",
    params(("model" = String, Path, description = "The model's name")),
    request_body = LabelBatch,
    responses(
        (status = 200, description = "What became of each label, counted", body = LabelCounts),
        (status = 404, description = "No such model", body = super::ErrorBody),
        (status = 422, description = "An entry is not a label, or the batch is too large: nothing applied", body = super::ErrorBody)))]
pub(super) async fn send_labels(
    State(s): State<ApiState>,
    Path(model): Path<String>,
    Extension(me): Extension<Identity>,
    headers: HeaderMap,
    JsonBody(b): JsonBody<LabelBatch>,
) -> ApiResult<impl IntoResponse> {
    if b.labels.len() > MAX_BATCH {
        return Err(invalid(format!(
            "labels: {} in one batch, at most {MAX_BATCH}",
            b.labels.len()
        )));
    }
    let batch = b
        .labels
        .iter()
        .enumerate()
        .map(|(i, v)| label_of(i, v))
        .collect::<Result<Vec<_>, _>>()
        .map_err(invalid)?;
    let who = actor(&me, &headers);
    let counts = blocking(&s.ctx.store, move |st| st.add_labels(&model, &batch, &who)).await?;
    s.ctx.metrics.labels(&counts);
    Ok(Json(counts))
}

fn invalid(message: String) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_entry_reads_as_a_label_or_says_which_field_is_wrong() {
        let ok = label_of(
            0,
            &json!({"request_id": "r1", "label": 1, "observed_at": 5}),
        )
        .expect("a label");
        assert_eq!(
            (ok.label.as_str(), ok.observed_at),
            ("1", Some(Timestamp(5)))
        );
        assert_eq!(
            label_of(0, &json!({"request_id": "r", "label": 1.0}))
                .expect("a label")
                .label,
            "1"
        );
        assert_eq!(
            label_of(0, &json!({"request_id": "r", "label": 2.5}))
                .expect("a label")
                .label,
            "2.5"
        );
        assert_eq!(
            label_of(0, &json!({"request_id": "r", "label": true}))
                .expect("a label")
                .label,
            "true"
        );
        for (bad, field) in [
            (json!([1]), "labels[3]: expected an object"),
            (
                json!({"request_id": 7, "label": "a"}),
                "labels[3].request_id",
            ),
            (
                json!({"request_id": "", "label": "a"}),
                "labels[3].request_id",
            ),
            (json!({"request_id": "r"}), "labels[3].label"),
            (json!({"request_id": "r", "label": [1]}), "labels[3].label"),
            (json!({"request_id": "r", "label": " "}), "labels[3].label"),
            (
                json!({"request_id": "r", "label": "a", "observed_at": "now"}),
                "labels[3].observed_at",
            ),
            (
                json!({"request_id": "r", "label": "a", "extra": 1}),
                "unknown field \"extra\"",
            ),
        ] {
            let e = label_of(3, &bad).expect_err("not a label");
            assert!(e.contains(field), "{bad}: {e}");
        }
    }
}
