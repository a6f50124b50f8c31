//! The custom resources' definitions as committed, and the pure pieces of
//! the reconcilers: a rollout's status in words, who changed an object.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldsV1, ManagedFieldsEntry, ObjectMeta, Time,
};
use rollgate_operator::resources::{ModelRolloutStatus, ON_BEHALF_OF};
use rollgate_operator::status::{
    RolloutView, actor, camel, condition, rollout_status, set_condition,
};
use serde_json::{Value, json};

const COMMITTED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/kubernetes/crds.yaml"
);

/// `deploy/kubernetes/crds.yaml` is what the types derive
/// (`ROLLGATE_BLESS=1` writes it).
#[test]
fn the_committed_crds_are_the_derived_ones() {
    let derived = rollgate_operator::resources::crds_yaml();
    if std::env::var_os("ROLLGATE_BLESS").is_some() {
        std::fs::write(COMMITTED, &derived).expect("write crds.yaml");
    }
    let committed = std::fs::read_to_string(COMMITTED).expect("deploy/kubernetes/crds.yaml");
    assert!(
        committed == derived,
        "deploy/kubernetes/crds.yaml differs from the types: run ROLLGATE_BLESS=1 cargo test -p rollgate-operator"
    );
}

/// `kubectl get modelrollouts` shows the phase, the weight, the verdict
/// and the age; status is a subresource (a user's `kubectl apply` of the
/// spec never overwrites it).
#[test]
fn the_rollout_crd_has_its_columns_and_a_status_subresource() {
    let crds = rollgate_operator::crds();
    let rollout = serde_json::to_value(&crds[1]).expect("json");
    let version = &rollout["spec"]["versions"][0];
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    for want in ["Phase", "Weight", "Verdict", "Age"] {
        assert!(columns.contains(&want), "{want} in {columns:?}");
    }
    assert!(version["subresources"]["status"].is_object(), "{version}");
    assert_eq!(rollout["spec"]["group"], "rollgate.dev");
    // The plan is rollgate's to validate: carried whole.
    let plan = &version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["plan"];
    assert_eq!(plan["x-kubernetes-preserve-unknown-fields"], true, "{plan}");
}

fn view(phase: Value, weight_bp: u32) -> RolloutView {
    serde_json::from_value(json!({
        "id": 7,
        "spec": { "plan": {} },
        "state": { "phase": phase, "paused": false },
        "routing": { "candidate_weight_bp": weight_bp },
    }))
    .expect("a rollout as the API shows it")
}

#[test]
fn a_status_says_the_stage_the_weight_and_how_it_ended() {
    let s = rollout_status(
        &view(
            json!({ "phase": "canary", "step": 1, "weight_percent": 25 }),
            2_500,
        ),
        ModelRolloutStatus::default(),
    );
    assert_eq!(s.phase.as_deref(), Some("CANARY 25%"));
    assert_eq!(s.weight_percent, 25);
    assert_eq!(s.rollout_id, Some(7));
    assert_eq!(s.verdict.as_deref(), Some("no verdict yet"));
    assert_eq!(s.reason, None);

    let breach = json!({ "phase": "rolled_back",
        "reason": { "code": "anytime_breach", "gates": ["error_rate"] } });
    let s = rollout_status(&view(breach, 0), s);
    assert_eq!(s.phase.as_deref(), Some("ROLLED_BACK"));
    assert_eq!(s.weight_percent, 0);
    assert_eq!(s.rejected, Some(true));
    let reason = s.reason.clone().expect("a reason");
    assert!(
        reason.contains("error_rate shown worse than the champion"),
        "{reason}"
    );
    assert!(
        s.verdict.as_deref().is_some_and(|v| v.contains("REJECTED")),
        "{s:?}"
    );

    let starved = json!({ "phase": "rolled_back",
        "reason": { "code": "evidence_timeout", "gates": [] } });
    let s = rollout_status(&view(starved, 0), s);
    assert_eq!(s.rejected, Some(false));

    let s = rollout_status(
        &view(json!({ "phase": "promoted", "manual": false }), 10_000),
        s,
    );
    assert_eq!(s.phase.as_deref(), Some("PROMOTED"));
    assert_eq!((s.reason.as_deref(), s.rejected), (None, None));
    assert!(
        s.guarantee
            .as_deref()
            .is_some_and(|g| g.starts_with("guarantee")),
        "{s:?}"
    );
}

fn entry(manager: &str, at: i64, fields: Value, subresource: Option<&str>) -> ManagedFieldsEntry {
    ManagedFieldsEntry {
        manager: Some(manager.into()),
        operation: Some("Update".into()),
        time: Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(at).expect("time"),
        )),
        fields_v1: Some(FieldsV1(fields)),
        subresource: subresource.map(str::to_string),
        ..ManagedFieldsEntry::default()
    }
}

/// The owner of the field that asked (whoever set it last, whatever the
/// order of entries of one second), never the operator's own status
/// writes; what an annotation says is added, never in its place, and
/// nothing in it can make the request unsendable.
#[test]
fn a_change_is_recorded_for_whoever_made_it() {
    let mut meta = ObjectMeta {
        managed_fields: Some(vec![
            entry(
                "kubectl-patch",
                100,
                json!({ "f:spec": { "f:paused": {} } }),
                None,
            ),
            entry(
                "rollgate-operator",
                300,
                json!({ "f:status": {} }),
                Some("status"),
            ),
            // Created in the same second, sorted after by name.
            entry(
                "unknown",
                100,
                json!({ "f:spec": { "f:candidate": {} } }),
                None,
            ),
            entry(
                "argocd",
                90,
                json!({ "f:metadata": { "f:annotations": {
                "f:rollgate.dev/approve": {} } } }),
                None,
            ),
        ]),
        ..ObjectMeta::default()
    };
    assert_eq!(
        actor(&meta, &["f:spec", "f:paused"]),
        "kubernetes:kubectl-patch"
    );
    assert_eq!(
        actor(&meta, &["f:spec", "f:candidate"]),
        "kubernetes:unknown"
    );
    let approve = ["f:metadata", "f:annotations", "f:rollgate.dev/approve"];
    assert_eq!(actor(&meta, &approve), "kubernetes:argocd");
    // What the annotation says counts only from the client that acts.
    meta.annotations = Some([(ON_BEHALF_OF.to_string(), "alice\r\nx".to_string())].into());
    assert_eq!(
        actor(&meta, &["f:spec", "f:paused"]),
        "kubernetes:kubectl-patch"
    );
    let says = json!({ "f:metadata": { "f:annotations": { "f:rollgate.dev/on-behalf-of": {} } } });
    if let Some(fields) = meta.managed_fields.as_mut() {
        fields.push(entry("kubectl-patch", 100, says, None));
    }
    assert_eq!(
        actor(&meta, &["f:spec", "f:paused"]),
        "kubernetes:kubectl-patch for alicex"
    );
    assert_eq!(
        actor(&meta, &["f:spec", "f:candidate"]),
        "kubernetes:unknown"
    );
    meta.annotations = Some([(ON_BEHALF_OF.to_string(), "b".repeat(100))].into());
    assert_eq!(actor(&meta, &["f:spec", "f:paused"]).chars().count(), 64);
    assert_eq!(
        actor(&ObjectMeta::default(), &["f:spec"]),
        "kubernetes:unknown"
    );
}

/// A condition's `lastTransitionTime` moves only when its status does.
#[test]
fn a_condition_keeps_its_transition_time_while_its_status_holds() {
    let mut conditions = Vec::new();
    set_condition(
        &mut conditions,
        condition("Valid", true, "Accepted", "ok", Some(1)),
        "t1".into(),
    );
    set_condition(
        &mut conditions,
        condition("Valid", true, "Accepted", "still", Some(2)),
        "t2".into(),
    );
    assert_eq!(conditions[0].last_transition_time.as_deref(), Some("t1"));
    assert_eq!(conditions[0].message, "still");
    set_condition(
        &mut conditions,
        condition("Valid", false, "Invalid", "no", Some(3)),
        "t3".into(),
    );
    assert_eq!(conditions[0].last_transition_time.as_deref(), Some("t3"));
    set_condition(
        &mut conditions,
        condition("Acted", true, "Done", "pause: done", Some(3)),
        "t4".into(),
    );
    let kinds: Vec<&str> = conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(kinds, ["Acted", "Valid"], "one of each, sorted");
}

#[test]
fn error_codes_become_condition_reasons() {
    assert_eq!(camel("invalid_plan"), "InvalidPlan");
    assert_eq!(camel("revision_rejected"), "RevisionRejected");
    assert_eq!(camel("conflict"), "Conflict");
}
