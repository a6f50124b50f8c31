//! The custom resources, in rollgate's own group: a [`Model`] (its
//! settings, its revisions by name, the champion to seed it with) and a
//! [`ModelRollout`] (a candidate to roll out, and the operator's hands on
//! it). Their CRDs, OpenAPI schema included, are derived from these types
//! and committed as `deploy/kubernetes/crds.yaml` (a test keeps the two
//! equal).
//!
//! What rollgate itself validates (a model's settings, a revision, a
//! plan) is carried as a free-form object, not re-described here: the
//! admin API's validator checks it and the object's `Valid` condition
//! names the field it refused, so the two can never disagree.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The API group.
pub const GROUP: &str = "rollgate.dev";
/// Set on a `ModelRollout` (its value the reason): approve the stage
/// waiting for an approval. Acted on once per distinct value.
pub const APPROVE: &str = "rollgate.dev/approve";
/// Set on a `ModelRollout` (its value the reason): promote now,
/// skipping the remaining stages. Acted on once per distinct value.
pub const PROMOTE: &str = "rollgate.dev/promote";
/// Who a change to the object is made for, added to what the audit
/// records (the field manager of the change) as what its client says.
pub const ON_BEHALF_OF: &str = "rollgate.dev/on-behalf-of";
/// Set on a `Model` (`"true"`) whose name rollgate already has a model
/// under: this object takes it over (its settings replace the model's).
/// Without it such a `Model` is refused, so that writing an object cannot
/// silently take a model someone else registered.
pub const ADOPT: &str = "rollgate.dev/adopt";
/// The finalizer that aborts a deleted `ModelRollout`'s rollout.
pub const FINALIZER: &str = "rollgate.dev/abort-on-delete";

/// A model rollgate routes and judges: registered in rollgate under the
/// object's name.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[kube(
    group = "rollgate.dev",
    version = "v1alpha1",
    kind = "Model",
    doc = "A model rollgate routes and judges, mirrored into rollgate's registry.",
    namespaced,
    status = "ModelStatus",
    shortname = "rgm",
    category = "rollgate",
    printcolumn = r#"{"name": "Champion", "type": "string", "jsonPath": ".status.champion"}"#,
    printcolumn = r#"{"name": "Valid", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Valid\")].status"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ModelSpec {
    /// The model's settings as rollgate's admin API takes them
    /// (`POST /api/v1/models` `spec`: protocol, data plane by the name
    /// the controller's config declares, evidence source). Validated by
    /// rollgate; changes wait while a rollout is active.
    #[serde(default)]
    #[schemars(schema_with = "free_form")]
    pub settings: Value,
    /// Revisions by a name of the object's choosing, each as rollgate's
    /// admin API takes one (`upstream`, headers, ...). A revision is
    /// immutable: changing one registered under a name is refused (give
    /// the new one a new name).
    #[serde(default)]
    #[schemars(schema_with = "free_form_map")]
    pub revisions: BTreeMap<String, Value>,
    /// The plan its `ModelRollout`s use when they name none (as
    /// `POST /api/v1/rollouts` takes one); rollgate's default plan when
    /// neither does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_free_form")]
    pub plan: Option<Value>,
    /// The revision (by its name here) that serves while the model has no
    /// champion in rollgate. Afterwards rollgate moves the champion
    /// (promotions); `status.champion` says which it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub champion: Option<String>,
}

/// What rollgate holds of a `Model`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelStatus {
    /// The champion's name (from `spec.revisions`; its rollgate id when
    /// registered otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub champion: Option<String>,
    /// Each revision's rollgate id, by its name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub revisions: BTreeMap<String, String>,
    /// This object registered the model in rollgate, or adopted it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mirrored: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A rollout of one of a `Model`'s revisions, driven by rollgate's
/// controller; its status follows the rollout.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[kube(
    group = "rollgate.dev",
    version = "v1alpha1",
    kind = "ModelRollout",
    doc = "A rollout of one of a Model's revisions; its status follows rollgate's record.",
    namespaced,
    status = "ModelRolloutStatus",
    shortname = "rgr",
    category = "rollgate",
    printcolumn = r#"{"name": "Model", "type": "string", "jsonPath": ".spec.model"}"#,
    printcolumn = r#"{"name": "Candidate", "type": "string", "jsonPath": ".spec.candidate"}"#,
    printcolumn = r#"{"name": "Phase", "type": "string", "jsonPath": ".status.phase"}"#,
    printcolumn = r#"{"name": "Weight", "type": "integer", "jsonPath": ".status.weightPercent"}"#,
    printcolumn = r#"{"name": "Verdict", "type": "string", "jsonPath": ".status.verdict"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ModelRolloutSpec {
    /// The `Model` (in this namespace) to roll out.
    pub model: String,
    /// The candidate: a revision's name in the model's `spec.revisions`.
    pub candidate: String,
    /// The plan as rollgate's admin API takes one (stages, gates,
    /// policy); the `Model`'s `spec.plan`, else rollgate's default plan,
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_free_form")]
    pub plan: Option<Value>,
    /// Hold the rollout where it is (true) or let it go on (false).
    #[serde(default)]
    pub paused: bool,
    /// Stop the rollout and send every request to the champion.
    #[serde(default)]
    pub abort: bool,
}

/// Where a `ModelRollout`'s rollout stands, in words and numbers.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelRolloutStatus {
    /// rollgate's rollout id (`rollgate rollout status ID`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_id: Option<i64>,
    /// `PENDING`, `SHADOW`, `CANARY 25%`, `PROMOTED`, `ROLLED_BACK`,
    /// `ABORTED`; before rollgate has it, `STARTING`, `WAITING` (another
    /// rollout of the model is active) or `INVALID` (rollgate refused the
    /// spec: the `Valid` condition says which field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The candidate's share of live traffic (100 once promoted).
    #[serde(default)]
    pub weight_percent: u32,
    #[serde(default)]
    pub paused: bool,
    /// The deciding verdict in words: the latest stage verdict while the
    /// rollout runs, how it ended once it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// Why it was rolled back, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Whether the rollback rejected the candidate (blocked from new
    /// rollouts until an operator unblocks it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<bool>,
    /// What the promotion guarantees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guarantee: Option<String>,
    /// The candidate's rollgate revision id, written before a start is
    /// asked for and cleared when rollgate refuses it: while set without a
    /// `rolloutId`, the start's outcome is unknown (the operator stopped,
    /// or rollgate did not answer), and the model's active rollout of that
    /// revision no other object holds is taken for this object's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_requested: Option<String>,
    /// What was already acted on (`paused`: the value of `spec.paused`
    /// last passed on; `approve`, `promote`: the annotation values), so
    /// that each is acted on once.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub handled: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A status condition, as Kubernetes conventions have them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Valid` (rollgate accepted the spec), `Synced` (mirrored into
    /// rollgate) or `Acted` (the last action passed on).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// A CamelCase reason; rollgate's error code where it refused.
    pub reason: String,
    /// In words; the field rollgate refused, where it named one.
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When its status last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

/// Both CRDs, as `kubectl apply` takes them.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![Model::crd(), ModelRollout::crd()]
}

/// Both CRDs as one YAML stream (what `deploy/kubernetes/crds.yaml` holds).
pub fn crds_yaml() -> String {
    let header = "# Generated from crates/rollgate-operator/src/resources.rs by \
                  `rollgate operator crds`; a test keeps them equal.\n";
    let docs = serde_saphyr::to_string_multiple(&crds()).unwrap_or_default();
    format!("{header}{docs}")
}

fn free_form(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

fn optional_free_form(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut s = free_form(g);
    s.insert("nullable".into(), true.into());
    s
}

fn free_form_map(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true,
        },
    })
}
