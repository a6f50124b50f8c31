//! Answers and their labels: what the gateways recorded for each request
//! of a rollout judged on quality, and the ground truth sent later,
//! joined by request id. A label is the request's, so in the SHADOW stage
//! one label judges both arms' answers.

use rollgate_core::Timestamp;
use serde::{Deserialize, Serialize};

/// One arm's answer to one request, as a gateway recorded it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnswerRow {
    pub model: String,
    pub request_id: String,
    pub revision: String,
    pub rollout: i64,
    pub epoch: u32,
    pub unit: u16,
    pub at: Timestamp,
    pub class: Option<String>,
    pub value: Option<f64>,
}

/// One label as sent: the request it is for, the truth, and when it was
/// observed (for reading; the gate does not use it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabelIn {
    pub request_id: String,
    /// A class, or a number's text.
    pub label: String,
    pub observed_at: Option<Timestamp>,
}

/// What became of a batch of labels: each one applied (joined to a
/// recorded answer), unknown (kept, but no recorded answer has that id
/// yet: one its gateway has not handed to the store yet joins it when it
/// is; one
/// never recorded, or pruned, never does), a duplicate (the same label
/// again), or a conflict (a different label for a request already
/// labelled: not applied, the first stands).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LabelCounts {
    pub received: u64,
    pub applied: u64,
    pub duplicates: u64,
    pub conflicts: u64,
    pub unknown: u64,
}

/// The longest request id or label kept.
pub const MAX_LABEL_TEXT: usize = 128;
