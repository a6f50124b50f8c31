//! The inference protocols rollgate speaks: shared vocabulary of the
//! registry (what a model speaks) and the gateway (how to route and read it).

use serde::{Deserialize, Serialize};

/// The inference protocol a model speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// KServe V1: `POST /v1/models/{model}:predict`, `{"instances": …}` →
    /// `{"predictions": …}`.
    #[default]
    KserveV1,
    /// Open Inference Protocol V2: `POST /v2/models/{model}/infer`.
    OipV2,
    /// Any JSON body on a configured path; predictions read with a JSON pointer.
    Json,
}
