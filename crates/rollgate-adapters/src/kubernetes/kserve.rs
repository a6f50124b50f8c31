//! KServe: one `InferenceService` (`serving.kserve.io/v1beta1`) per model,
//! whose predictor *is* the revision: each rollgate revision carries its
//! own predictor spec (`RevisionSpec::predictor`), and the adapter writes
//! the live revisions' predictors with the candidate's share.
//!
//! - **Knative mode**: the predictor is the candidate's, with
//!   `canaryTrafficPercent`: KServe sends that share to the latest Knative
//!   revision and the rest to the last one rolled out (the champion's).
//!   Champion-only writes the champion's predictor back; when the object
//!   held another (a rollback), with `canaryTrafficPercent: 0`, which
//!   KServe answers by sending everything to the last revision rolled out
//!   at once, rather than to the latest *ready* one (still the candidate's)
//!   until the champion's new revision is up. In force when
//!   `status.components.predictor.traffic` shows the split.
//! - **Standard mode** (KServe 0.20's `spec.canary`): the predictor is the
//!   champion's, named by its revision id; the candidate is one
//!   `spec.canary` entry with its `trafficPercent`. In force when
//!   `status.canaryStatuses` shows each entry ready at its share and the
//!   predictor ready.
//!
//! SHADOW deploys the candidate dark (a share of 0) so that rollgate's
//! gateway can mirror to it. `status.observedGeneration` is never read:
//! KServe copies it from a child object (kserve/kserve#6081).

use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use rollgate_store::{GUARDED_PREDICTOR_FIELDS, KserveMode};
use serde_json::{Value, json};

use super::{ROUTING, Shape, annotation, fill};
use crate::{AdapterError, Arm, Desired};

/// What rollgate writes of an `InferenceService`'s predictor beside the
/// revision's own predictor.
const SHARE: &str = "canaryTrafficPercent";
/// KServe's annotation naming the deployment mode.
const MODE: &str = "serving.kserve.io/deploymentMode";
/// rollgate's note of the revision whose predictor KServe last rolled out
/// (Knative mode): the one a share of 0 sends everything to.
const ROLLED_OUT: &str = "rollgate.dev/kserve-rolled-out";
/// Fields KServe refuses on a canary (it scales a canary from its share).
const NOT_ON_A_CANARY: [&str; 5] = [
    "maxReplicas",
    "scaleTarget",
    "scaleMetric",
    "scaleMetricType",
    "autoScaling",
];

/// A KServe data plane's inference services.
#[derive(Debug)]
pub(crate) struct InferenceServices {
    /// The object's name (`$model` filled in).
    pub name: String,
    pub mode: KserveMode,
    /// Of [`GUARDED_PREDICTOR_FIELDS`], those the operator lets a
    /// predictor hold.
    pub allowed: Vec<String>,
}

impl Shape for InferenceServices {
    fn kind(&self) -> &'static str {
        "kserve"
    }

    fn resource(&self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("serving.kserve.io", "v1beta1", "InferenceService"),
            "inferenceservices",
        )
    }

    fn annotations(&self) -> Vec<(&'static str, String)> {
        let mode = match self.mode {
            KserveMode::Knative => "Knative",
            KserveMode::Standard => "Standard",
        };
        vec![(MODE, mode.to_string())]
    }

    fn objects(&self, desired: &Desired) -> Result<Vec<(String, Value)>, AdapterError> {
        let live: Vec<&Arm> = desired.arms.iter().filter(|a| a.weight_bp > 0).collect();
        let (champion, candidate) = match live.as_slice() {
            [only] => (*only, desired.shadow.as_ref()),
            [champion, candidate] => (*champion, Some(*candidate)),
            _ => {
                return Err(AdapterError::Unroutable {
                    upstream: String::new(),
                    why: format!("KServe splits two revisions, not {}", live.len()),
                });
            }
        };
        let share = candidate.map(|c| percent(c.weight_bp));
        let spec = match self.mode {
            KserveMode::Knative => {
                let mut predictor = self.predictor(candidate.unwrap_or(champion))?;
                if let Some(share) = share {
                    predictor[SHARE] = json!(share);
                }
                json!({ "predictor": predictor })
            }
            KserveMode::Standard => {
                let mut stable = self.predictor(champion)?;
                stable["name"] = json!(champion.revision);
                let mut spec = json!({ "predictor": stable });
                if let (Some(c), Some(share)) = (candidate, share) {
                    let mut canary = self.predictor(c)?;
                    same_storage_refused(champion, c, &stable, &canary)?;
                    canary["name"] = json!(c.revision);
                    for field in NOT_ON_A_CANARY {
                        canary.as_object_mut().map(|o| o.remove(field));
                    }
                    spec["canary"] = json!([{ "trafficPercent": share, "predictor": canary }]);
                }
                spec
            }
        };
        Ok(vec![(fill(&self.name, &desired.model), spec)])
    }

    /// Knative mode. One revision alone: if it is the one KServe last
    /// rolled out and a share is in force (a canary, a SHADOW: a rollback
    /// or an abort), a share of 0, so that KServe sends everything to it
    /// at once, rather than to the latest *ready* revision (the
    /// candidate's) until its predictor's new revision is up; the share
    /// stays 0 until the next promotion. Otherwise (the first routing, a
    /// promotion, a champion switched by hand) no share: the latest
    /// revision gets everything once ready, and is then the one rolled
    /// out. A split keeps the note of the revision rolled out.
    fn revise(
        &self,
        spec: &mut Value,
        desired: &Desired,
        current: Option<&DynamicObject>,
    ) -> Vec<(&'static str, String)> {
        if self.mode != KserveMode::Knative {
            return Vec::new();
        }
        let rolled_out = current
            .map(|c| annotation(c, ROLLED_OUT))
            .filter(|r| !r.is_empty());
        let live: Vec<&Arm> = desired.arms.iter().filter(|a| a.weight_bp > 0).collect();
        let alone = match live.as_slice() {
            [only] if desired.shadow.is_none() => &only.revision,
            _ => {
                return rolled_out
                    .map(|r| vec![(ROLLED_OUT, r)])
                    .unwrap_or_default();
            }
        };
        let sharing = current.is_some_and(|c| c.data["spec"]["predictor"][SHARE].is_number());
        if sharing && rolled_out.as_ref() == Some(alone) {
            spec["predictor"][SHARE] = json!(0);
        }
        vec![(ROLLED_OUT, alone.clone())]
    }

    fn held(&self, object: &DynamicObject, spec: &Value) -> Option<bool> {
        let have = &object.data["spec"];
        Some(
            have["predictor"][SHARE] == spec["predictor"][SHARE]
                && same_predictor(&have["predictor"], &spec["predictor"])
                && super::covers(&have["canary"], &spec["canary"]),
        )
    }

    fn in_force(&self, object: &DynamicObject, _generation: i64) -> Result<(), String> {
        match self.mode {
            KserveMode::Knative => {
                // Champion-only at a share of 0 routes to a revision up
                // already; anything else (a SHADOW's dark candidate) must
                // be up itself.
                let champion_only = annotation(object, ROUTING).starts_with("champion:");
                knative_split(object, !champion_only)
            }
            KserveMode::Standard => standard_split(object),
        }
    }
}

/// Whether the predictor `have` holds `want`'s fields (default-aware:
/// KServe omits empty lists and zero defaults), the share aside.
fn same_predictor(have: &Value, want: &Value) -> bool {
    let without_share = |v: &Value| {
        let mut v = v.clone();
        v.as_object_mut().map(|o| o.remove(SHARE));
        v
    };
    super::covers(&without_share(have), &without_share(want))
}

impl InferenceServices {
    /// An arm's predictor, or why it cannot be routed: none, or one
    /// holding a guarded field the declaration does not allow.
    fn predictor(&self, arm: &Arm) -> Result<Value, AdapterError> {
        let refused = |why: String| AdapterError::Unroutable {
            upstream: arm.upstream.clone(),
            why,
        };
        let Some(p @ Value::Object(_)) = &arm.predictor else {
            return Err(refused(format!(
                "revision {} carries no KServe predictor (register it with one: \
                 `rollgate revision add --predictor FILE`)",
                arm.revision
            )));
        };
        let guarded = GUARDED_PREDICTOR_FIELDS
            .into_iter()
            .find(|f| !self.allowed.iter().any(|a| a == f) && holds_key(p, f));
        if let Some(field) = guarded {
            return Err(refused(format!(
                "revision {}'s predictor sets {field:?}, which chooses what runs in the cluster \
                 or what it reads: the data plane's allow_predictor_fields does not list it",
                arm.revision
            )));
        }
        Ok(p.clone())
    }
}

/// Whether `key` is a field name anywhere in `value`.
fn holds_key(value: &Value, key: &str) -> bool {
    match value {
        Value::Object(o) => o.iter().any(|(k, v)| k == key || holds_key(v, key)),
        Value::Array(a) => a.iter().any(|v| holds_key(v, key)),
        _ => false,
    }
}

/// Standard mode: KServe refuses to rename the predictor (a promotion)
/// unless its storage URI changes too, so a candidate with the champion's
/// storage URI could never be promoted: refused from its first stage.
fn same_storage_refused(
    champion: &Arm,
    candidate: &Arm,
    stable: &Value,
    canary: &Value,
) -> Result<(), AdapterError> {
    let uri = |p: &Value| -> Option<Value> {
        let o = p.as_object()?;
        o.get("storageUri")
            .or_else(|| o.values().find_map(|v| v.get("storageUri")))
            .cloned()
    };
    if uri(stable) == uri(canary) {
        return Err(AdapterError::Unroutable {
            upstream: candidate.upstream.clone(),
            why: format!(
                "revision {} has the storage URI of the champion {} ({}): KServe's Standard mode \
                 promotes a canary only to a new storage URI",
                candidate.revision,
                champion.revision,
                uri(canary).map_or("none".into(), |u| u.to_string())
            ),
        });
    }
    Ok(())
}

/// A candidate's share in whole percent (KServe's unit): at least 1% while
/// it has any.
fn percent(bp: u32) -> u32 {
    if bp == 0 {
        0
    } else {
        ((bp + 50) / 100).clamp(1, 100)
    }
}

/// Knative mode: the traffic KServe reports is the split the predictor
/// asks for, and the latest revision is ready when it has a share or
/// `latest_up` says so.
fn knative_split(object: &DynamicObject, latest_up: bool) -> Result<(), String> {
    let share = object.data["spec"]["predictor"][SHARE].as_u64();
    let status = &object.data["status"]["components"]["predictor"];
    let Some(traffic) = status["traffic"].as_array() else {
        return Err("KServe reports no traffic for the predictor (is it running?)".into());
    };
    let percent_of = |latest: bool| -> u64 {
        traffic
            .iter()
            .filter(|t| t["latestRevision"].as_bool().unwrap_or(false) == latest)
            .filter_map(|t| t["percent"].as_u64())
            .sum()
    };
    let (latest, rest) = (percent_of(true), percent_of(false));
    let want = share.unwrap_or(100).min(100);
    if latest != want || rest != 100 - want {
        return Err(format!(
            "KServe reports {latest}% to the latest revision and {rest}% to the last rolled out, not {want}%/{}%",
            100 - want
        ));
    }
    let created = status["latestCreatedRevision"].as_str().unwrap_or_default();
    let ready = status["latestReadyRevision"].as_str().unwrap_or_default();
    if (want > 0 || latest_up) && (created.is_empty() || created != ready) {
        return Err(format!(
            "the latest revision {created:?} is not ready yet (ready: {ready:?})"
        ));
    }
    Ok(())
}

/// Standard mode: the predictor is ready, and every canary entry is
/// reported ready at its share (none when there is none).
fn standard_split(object: &DynamicObject) -> Result<(), String> {
    let status = &object.data["status"];
    let ready = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "PredictorReady" && c["status"] == "True");
    if !ready {
        return Err("KServe does not report the predictor ready".into());
    }
    let canaries = object.data["spec"]["canary"].as_array().cloned();
    let reported = status["canaryStatuses"].as_array().cloned();
    let (canaries, reported) = (canaries.unwrap_or_default(), reported.unwrap_or_default());
    if canaries.len() != reported.len() {
        return Err(format!(
            "KServe reports {} canaries, the object has {}",
            reported.len(),
            canaries.len()
        ));
    }
    for canary in &canaries {
        let name = &canary["predictor"]["name"];
        let Some(seen) = reported.iter().find(|s| &s["name"] == name) else {
            return Err(format!("KServe reports nothing of canary {name}"));
        };
        if seen["trafficPercent"] != canary["trafficPercent"] || seen["ready"] != true {
            return Err(format!(
                "KServe reports canary {name} at {}% ready {}, not {}% ready",
                seen["trafficPercent"], seen["ready"], canary["trafficPercent"]
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_is_whole_percent_never_nothing_while_it_has_some() {
        assert_eq!(percent(0), 0);
        assert_eq!(percent(1), 1);
        assert_eq!(percent(500), 5);
        assert_eq!(percent(2_549), 25);
        assert_eq!(percent(9_999), 100);
        assert_eq!(percent(10_000), 100);
    }

    #[test]
    fn kserve_omitting_empty_lists_and_zeros_is_the_same_predictor() {
        let want = json!({
            "model": { "storageUri": "s3://m/v1", "env": [],
                       "readinessProbe": { "initialDelaySeconds": 0, "periodSeconds": 5 } },
            "minReplicas": 1,
        });
        let reported = json!({
            "model": { "storageUri": "s3://m/v1", "readinessProbe": { "periodSeconds": 5 },
                       "resources": {} },
            "minReplicas": 1, "canaryTrafficPercent": 10,
        });
        assert!(same_predictor(&reported, &want));
        let changed = json!({ "model": { "storageUri": "s3://m/v2" }, "minReplicas": 1 });
        assert!(!same_predictor(&changed, &want));
        let delay = json!({ "model": { "storageUri": "s3://m/v1",
                            "readinessProbe": { "initialDelaySeconds": 5, "periodSeconds": 5 } },
                            "minReplicas": 1 });
        assert!(
            !same_predictor(&delay, &want),
            "a changed non-zero delay is drift"
        );
        let removed = json!({ "model": { "storageUri": "s3://m/v1" } });
        let with_secret = json!({ "model": { "storageUri": "s3://m/v1",
                                  "env": [{ "name": "K", "valueFrom": { "secretKeyRef": { "name": "s" } } }] } });
        assert!(
            !same_predictor(&removed, &with_secret),
            "a removed secret is drift"
        );
    }
}
