//! rollgate as a Kubernetes citizen: a `Model` and `ModelRollout` applied
//! as YAML to a real API server (the prebuilt one of `tests/k8s`, with
//! `deploy/kubernetes/crds.yaml` installed as users apply it; `CI` fails
//! without it, a local run skips), followed by `rollgate operator run`
//! into a real controller whose data plane is an `HTTPRoute` (its
//! controller played by the test over a real nginx, as in
//! `kubernetes.rs`), evidence from a real Prometheus. Every wait is
//! bounded.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use rollgate_adapters::kit::Nginx;
use rollgate_adapters::kit::k8s::{self, ApiServer, RouteController};
use rollgate_operator::resources::{Condition, Model, ModelRollout, ModelRolloutStatus};
use serde_json::{Value, json};

use crate::common::*;
use crate::data_plane::{AnsweredBy, Servers, busy_traffic, counted, plan, with_shadow};
use crate::prometheus::evidence;

const NS: &str = "models";

/// `rollgate operator run` following namespace `models` into `ctl`.
fn start_operator(server: &ApiServer, ctl: &Proc) -> Proc {
    spawn(
        &[
            "operator",
            "run",
            "--api",
            &format!("http://{}", ctl.addr()),
            "--kube-url",
            &server.url,
            "--kube-ca-file",
            &server.ca,
            "--namespace",
            NS,
            "--resync",
            "300ms",
            "--health-listen",
            "127.0.0.1:0",
        ],
        &[],
    )
}

/// A YAML document as a user writes one, made an object.
fn from_yaml<T: serde::de::DeserializeOwned>(yaml: &str) -> T {
    serde_saphyr::from_str(yaml).expect("the YAML is an object of its kind")
}

fn rollout_yaml(name: &str, candidate: &str, plan: &Value) -> String {
    format!(
        "apiVersion: rollgate.dev/v1alpha1\nkind: ModelRollout\nmetadata:\n  name: {name}\n  \
         namespace: {NS}\nspec:\n  model: m\n  candidate: {candidate}\n  plan: {plan}\n"
    )
}

fn condition<'a>(conditions: &'a [Condition], kind: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == kind)
}

/// Polls the `ModelRollout` `name` until `done` holds (panics after
/// `limit`), recording every phase its status showed, in order.
async fn watch_rollout(
    api: &Api<ModelRollout>,
    name: &str,
    limit: Duration,
    phases: &mut Vec<String>,
    done: impl Fn(&ModelRolloutStatus) -> bool,
) -> ModelRolloutStatus {
    let started = Instant::now();
    loop {
        let status = api
            .get_status(name)
            .await
            .ok()
            .and_then(|o| o.status)
            .unwrap_or_default();
        if let Some(p) = &status.phase
            && phases.last() != Some(p)
        {
            phases.push(p.clone());
        }
        if done(&status) {
            return status;
        }
        assert!(
            started.elapsed() < limit,
            "{name} not done within {limit:?}: {status:?}, phases {phases:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What `kubectl get modelrollouts` prints, as the API server renders it
/// from the CRD's printer columns (a `Table`): each object's cells by
/// column name.
async fn columns(kube: &kube::Client) -> BTreeMap<String, BTreeMap<String, Value>> {
    let request = http::Request::get(format!(
        "/apis/rollgate.dev/v1alpha1/namespaces/{NS}/modelrollouts"
    ))
    .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
    .body(Vec::new())
    .expect("request");
    let table: Value = kube.request(request).await.expect("a Table");
    let names: Vec<String> = table["columnDefinitions"]
        .as_array()
        .expect("columns")
        .iter()
        .map(|c| c["name"].as_str().unwrap_or_default().to_string())
        .collect();
    table["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|row| {
            let cells = row["cells"].as_array().cloned().unwrap_or_default();
            let by: BTreeMap<String, Value> = names.iter().cloned().zip(cells).collect();
            (by["Name"].as_str().unwrap_or_default().to_string(), by)
        })
        .collect()
}

/// Waits (bounded by `limit`) until the `ModelRollout` `name` is gone:
/// its finalizer let it go.
async fn gone(api: &Api<ModelRollout>, name: &str, limit: Duration, why: &str) {
    let started = Instant::now();
    while api.get_opt(name).await.ok().flatten().is_some() {
        assert!(started.elapsed() < limit, "{name}: {why}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ended(s: &ModelRolloutStatus) -> bool {
    matches!(
        s.phase.as_deref(),
        Some("PROMOTED" | "ROLLED_BACK" | "ABORTED")
    )
}

/// The whole life of the objects: a `Model` registered with its champion
/// seeded; an identical candidate promoted through SHADOW, 20% and 50%
/// with the columns moving and the controller and operator restarted
/// mid-rollout; a ready-then-503 one rolled back, its status saying why
/// and that it was rejected; an invalid rollout and an invalid model each
/// told so in a condition while the others go on; a rollout paused from
/// its spec (audited on behalf of the Kubernetes client) and deleted
/// mid-canary: aborted, the route champion-only; one promoted by an
/// annotation; a model someone else registered not taken over; an
/// operator stopped between asking for a start and recording it finding
/// that rollout; a registered revision's spec changed under its name,
/// refused in a condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_and_rollouts_applied_as_yaml_are_driven_and_reported() {
    let Some(server) = ApiServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(servers) = Servers::start_at(dir.path(), "localhost") else {
        return;
    };
    let gw = start_gateway(dir.path());
    let upstream = |p: &Proc| format!("http://{}", p.addr().replace("127.0.0.1", "localhost"));
    let Some(nginx) = Nginx::start(
        &format!("http://{}", servers.champion.addr()),
        Some(gw.addr()),
    ) else {
        return;
    };
    let kube = server.client().await;
    let route = RouteController::start(kube.clone(), NS, k8s::http_routes(), "m", nginx.adapter());
    let port = |addr: &str| {
        addr.rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
    };
    let gw_port = port(gw.addr()).expect("the gateway's port");
    let plane = json!({
        "kind": "gateway_api",
        "controller_name": k8s::STAND_IN,
        "routes": [{ "name": "$model", "parent_refs": [{ "name": "inference" }],
                     "path_prefix": "/v1/models/$model" }],
        "cluster": { "url": server.url, "ca_file": server.ca },
        "namespace": NS,
        "mirror": { "service": "localhost", "port": gw_port },
    });
    let mut ctl = start_controller_declaring(dir.path(), "edge", &plane);
    let mut operator = start_operator(&server, &ctl);
    let programmed = Arc::clone(&route.programmed);
    let champion_only = |champion_port: Option<u16>| {
        let log = programmed.lock().unwrap_or_else(|p| p.into_inner());
        let last = log.iter().rev().find(|(name, _, _)| name == "m");
        last.is_some_and(|(_, _, w)| w.len() == 1 && Some(w[0].0) == champion_port)
    };

    // The model, its revisions named, its champion seeded.
    let settings = json!({ "prometheus": evidence(&servers.prometheus.url), "data_plane": "edge" });
    let model: Model = from_yaml(&format!(
        "apiVersion: rollgate.dev/v1alpha1\nkind: Model\nmetadata:\n  name: m\n  namespace: {NS}\n\
         spec:\n  settings: {settings}\n  champion: v1\n  revisions:\n\
         \x20   v1: {{ upstream: \"{}\" }}\n    v2: {{ upstream: \"{}\" }}\n\
         \x20   v3: {{ upstream: \"{}\" }}\n    v4: {{ upstream: \"{}\" }}\n",
        upstream(&servers.champion),
        upstream(&servers.identical),
        upstream(&servers.broken),
        upstream(&servers.disagreeing),
    ));
    let models: Api<Model> = Api::namespaced(kube.clone(), NS);
    models
        .create(&PostParams::default(), &model)
        .await
        .expect("Model created");
    let c = client();
    servers
        .prometheus
        .wait_for(&c, "count(up == 1)", |v| v == 6.0)
        .await;
    let started = Instant::now();
    let seeded = loop {
        let m = models.get_status("m").await.expect("the Model");
        if m.status.as_ref().and_then(|s| s.champion.as_deref()) == Some("v1") {
            break m;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "not seeded: {:?}",
            m.status
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let revisions = seeded.status.map(|s| s.revisions).unwrap_or_default();
    assert_eq!(revisions.len(), 4, "{revisions:?}");
    let (_, held) = api(&c, &ctl, "GET", "/api/v1/models/m", None).await;
    assert_eq!(
        held["champion"].as_str(),
        revisions.get("v1").map(String::as_str),
        "{held}"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let load = busy_traffic(&nginx.addr, AnsweredBy::Upstream, &stop);
    let rollouts: Api<ModelRollout> = Api::namespaced(kube.clone(), NS);

    // An identical candidate, the controller and the operator restarted
    // mid-rollout.
    let good: ModelRollout = from_yaml(&rollout_yaml("m-v2", "v2", &with_shadow(plan())));
    rollouts
        .create(&PostParams::default(), &good)
        .await
        .expect("created");
    let mut phases = Vec::new();
    let before = watch_rollout(
        &rollouts,
        "m-v2",
        Duration::from_secs(90),
        &mut phases,
        |s| s.phase.as_deref().is_some_and(|p| p.starts_with("CANARY")) || ended(s),
    )
    .await;
    eprintln!("m-v2 mid-rollout: {before:?}");
    let (s, _, _) = request(
        &c,
        "GET",
        &format!("http://{}/readyz", operator.addr()),
        None,
        None,
    )
    .await;
    assert_eq!(s, 200, "ready while both APIs answer");
    ctl.kill();
    let (s, _, _) = request(
        &c,
        "GET",
        &format!("http://{}/readyz", operator.addr()),
        None,
        None,
    )
    .await;
    assert_eq!(s, 503, "not ready without rollgate's API");
    operator.kill();
    ctl = start_controller_declaring(dir.path(), "edge", &plane);
    operator = start_operator(&server, &ctl);
    let promoted = watch_rollout(
        &rollouts,
        "m-v2",
        Duration::from_secs(120),
        &mut phases,
        ended,
    )
    .await;
    eprintln!("m-v2 phases: {phases:?}");
    assert_eq!(promoted.phase.as_deref(), Some("PROMOTED"), "{promoted:?}");
    assert_eq!(
        promoted.rollout_id, before.rollout_id,
        "resumed, not started again"
    );
    for want in ["SHADOW", "CANARY 20%", "CANARY 50%", "PROMOTED"] {
        assert!(phases.iter().any(|p| p == want), "{want} shown: {phases:?}");
    }
    let order: Vec<usize> = ["SHADOW", "CANARY 20%", "CANARY 50%", "PROMOTED"]
        .iter()
        .filter_map(|w| phases.iter().position(|p| p == w))
        .collect();
    assert!(order.is_sorted(), "in order: {phases:?}");
    assert_eq!(promoted.weight_percent, 100, "{promoted:?}");
    assert!(
        promoted
            .guarantee
            .as_deref()
            .is_some_and(|g| g.starts_with("guarantee"))
    );
    let id = promoted.rollout_id.expect("an id");
    let (_, record) = api(&c, &ctl, "GET", &format!("/api/v1/rollouts/{id}"), None).await;
    assert_eq!(
        phase(&record),
        "promoted",
        "status and store agree: {record}"
    );
    let started = Instant::now();
    while models
        .get_status("m")
        .await
        .ok()
        .and_then(|m| m.status)
        .and_then(|s| s.champion)
        != Some("v2".into())
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the Model's champion follows"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // An invalid rollout and an invalid model: told so; the others go on.
    let mut bad_plan = plan();
    bad_plan["steps"] = json!([150]);
    rollouts
        .create(
            &PostParams::default(),
            &from_yaml(&rollout_yaml("m-invalid", "v3", &bad_plan)),
        )
        .await
        .expect("created");
    // A model rollgate already has, registered by someone else: not
    // taken over without the adopt annotation.
    let (st, r) = api(
        &c,
        &ctl,
        "POST",
        "/api/v1/models",
        Some(json!({ "name": "taken" })),
    )
    .await;
    assert_eq!(st, 201, "{r}");
    let mut taken = model.clone();
    taken.metadata.name = Some("taken".into());
    models
        .create(&PostParams::default(), &taken)
        .await
        .expect("created");
    let mut invalid_model = model.clone();
    invalid_model.metadata.name = Some("elsewhere".into());
    invalid_model.spec.settings = json!({ "data_plane": "nowhere" });
    models
        .create(&PostParams::default(), &invalid_model)
        .await
        .expect("created");

    // A ready-then-503 candidate.
    let broken: ModelRollout = from_yaml(&rollout_yaml("m-v3", "v3", &plan()));
    rollouts
        .create(&PostParams::default(), &broken)
        .await
        .expect("created");
    let mut phases = Vec::new();
    let s = watch_rollout(
        &rollouts,
        "m-v3",
        Duration::from_secs(90),
        &mut phases,
        ended,
    )
    .await;
    eprintln!("m-v3: {s:?}");
    assert_eq!(s.phase.as_deref(), Some("ROLLED_BACK"), "{s:?}");
    assert!(
        s.reason
            .as_deref()
            .is_some_and(|r| r.contains("error_rate")),
        "{s:?}"
    );
    assert_eq!(s.rejected, Some(true), "{s:?}");
    assert!(
        champion_only(port(servers.identical.addr())),
        "champion-only after the rollback"
    );

    // The columns `kubectl get` shows, rendered by the real API server.
    let table = columns(&kube).await;
    eprintln!("kubectl get modelrollouts: {table:?}");
    let (v2, v3) = (&table["m-v2"], &table["m-v3"]);
    assert_eq!(
        (&v2["Phase"], &v2["Weight"]),
        (&json!("PROMOTED"), &json!(100)),
        "{v2:?}"
    );
    assert_eq!(
        (&v3["Phase"], &v3["Weight"]),
        (&json!("ROLLED_BACK"), &json!(0)),
        "{v3:?}"
    );
    assert!(
        v3["Verdict"]
            .as_str()
            .is_some_and(|v| v.starts_with("ROLLED BACK: error_rate")),
        "{v3:?}"
    );
    assert_eq!(
        (&v3["Model"], &v3["Candidate"]),
        (&json!("m"), &json!("v3")),
        "{v3:?}"
    );
    assert!(v3["Age"].is_string(), "{v3:?}");

    let s = watch_rollout(
        &rollouts,
        "m-invalid",
        Duration::from_secs(20),
        &mut Vec::new(),
        |s| s.phase.as_deref() == Some("INVALID"),
    )
    .await;
    assert_eq!(
        s.start_requested, None,
        "a refused start is not taken for asked: {s:?}"
    );
    let valid = condition(&s.conditions, "Valid").expect("a Valid condition");
    assert_eq!(valid.status, "False");
    assert!(
        valid.message.starts_with("spec.plan") && valid.message.contains("step"),
        "{valid:?}"
    );
    let table = columns(&kube).await;
    let refused = &table["m-invalid"];
    assert!(
        refused["Verdict"]
            .as_str()
            .is_some_and(|v| v.starts_with("spec.plan")),
        "why there is no rollout, in the Verdict column: {refused:?}"
    );
    let m = models.get_status("elsewhere").await.expect("elsewhere");
    let valid = m
        .status
        .as_ref()
        .and_then(|s| condition(&s.conditions, "Valid"))
        .cloned();
    let valid = valid.expect("a Valid condition on the invalid model");
    assert_eq!(valid.status, "False", "{valid:?}");
    assert!(
        valid.message.contains("spec.settings") && valid.message.contains("nowhere"),
        "{valid:?}"
    );

    let started = Instant::now();
    let valid = loop {
        let m = models.get_status("taken").await.expect("taken");
        let valid = m
            .status
            .as_ref()
            .and_then(|s| condition(&s.conditions, "Valid"))
            .cloned();
        if let Some(v) = valid {
            break v;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "taken looked at"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        valid.status == "False" && valid.message.contains("rollgate.dev/adopt"),
        "{valid:?}"
    );
    let (_, held) = api(&c, &ctl, "GET", "/api/v1/models/taken", None).await;
    assert!(
        held["spec"]["data_plane"].is_null(),
        "its settings untouched: {held}"
    );
    // Adopted once the object says so (an annotation: no new generation).
    let adopt =
        Patch::Merge(json!({ "metadata": { "annotations": { "rollgate.dev/adopt": "true" } } }));
    models
        .patch("taken", &PatchParams::apply("kubectl-annotate"), &adopt)
        .await
        .expect("annotated");
    let started = Instant::now();
    loop {
        let (_, held) = api(&c, &ctl, "GET", "/api/v1/models/taken", None).await;
        if held["spec"]["data_plane"] == "edge" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "adopted: {held}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Paused from the spec; a resume from the API is not undone (the spec
    // is acted on when it changes); deleted mid-canary while rollgate is
    // away: held by the finalizer until rollgate answers, then aborted.
    let mut holding = plan();
    holding["min_stage_duration"] = json!("90s");
    holding["evidence_timeout"] = json!("120s");
    let held: ModelRollout = from_yaml(&rollout_yaml("m-v4", "v4", &holding));
    rollouts
        .create(&PostParams::default(), &held)
        .await
        .expect("created");
    let mut phases = Vec::new();
    let s = watch_rollout(
        &rollouts,
        "m-v4",
        Duration::from_secs(60),
        &mut phases,
        |s| s.phase.as_deref() == Some("CANARY 20%"),
    )
    .await;
    let id = s.rollout_id.expect("an id");
    let pause = Patch::Merge(json!({ "spec": { "paused": true } }));
    rollouts
        .patch("m-v4", &PatchParams::apply("kubectl-patch"), &pause)
        .await
        .expect("paused");
    watch_rollout(
        &rollouts,
        "m-v4",
        Duration::from_secs(20),
        &mut phases,
        |s| s.paused,
    )
    .await;
    let (_, audit) = api(
        &c,
        &ctl,
        "GET",
        &format!("/api/v1/audit?rollout={id}"),
        None,
    )
    .await;
    assert!(
        audit
            .to_string()
            .contains("on behalf of kubernetes:kubectl-patch"),
        "the pause is audited on behalf of the client: {audit}"
    );
    let (st, r) = api(
        &c,
        &ctl,
        "POST",
        &format!("/api/v1/rollouts/{id}/resume"),
        Some(json!({})),
    )
    .await;
    assert_eq!(st, 200, "{r}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, record) = api(&c, &ctl, "GET", &format!("/api/v1/rollouts/{id}"), None).await;
    assert_eq!(
        record["state"]["paused"], false,
        "the API's resume stands: {record}"
    );
    ctl.kill();
    rollouts
        .delete("m-v4", &DeleteParams::default())
        .await
        .expect("deleted");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = rollouts
        .get_opt("m-v4")
        .await
        .expect("read")
        .expect("held by its finalizer");
    assert!(held.metadata.deletion_timestamp.is_some());
    ctl = start_controller_declaring(dir.path(), "edge", &plane);
    operator.kill();
    operator = start_operator(&server, &ctl);
    gone(
        &rollouts,
        "m-v4",
        Duration::from_secs(30),
        "the finalizer let it go once rollgate answered",
    )
    .await;
    let (_, record) = api(&c, &ctl, "GET", &format!("/api/v1/rollouts/{id}"), None).await;
    assert_eq!(phase(&record), "aborted", "{record}");
    assert!(
        champion_only(port(servers.identical.addr())),
        "champion-only after the delete"
    );

    // Approved by an annotation set before anything awaited it (kept
    // until then), then promoted by another, each once, for whoever set it.
    let mut gated = plan();
    gated["approvals"] = json!([{ "before": 50 }, { "before": "promotion" }]);
    let mut again: ModelRollout = from_yaml(&rollout_yaml("m-v4-again", "v4", &gated));
    again.metadata.annotations = Some(
        [(
            "rollgate.dev/approve".to_string(),
            "first look fine".to_string(),
        )]
        .into(),
    );
    let by_kubectl = PostParams {
        field_manager: Some("kubectl-create".into()),
        ..PostParams::default()
    };
    rollouts.create(&by_kubectl, &again).await.expect("created");
    let mut phases = Vec::new();
    let s = watch_rollout(
        &rollouts,
        "m-v4-again",
        Duration::from_secs(60),
        &mut phases,
        |s| s.phase.as_deref() == Some("CANARY 50%") || ended(s),
    )
    .await;
    assert_eq!(
        s.phase.as_deref(),
        Some("CANARY 50%"),
        "approved past 20%: {s:?}"
    );
    assert_eq!(
        s.handled.get("approve").map(String::as_str),
        Some("first look fine")
    );
    let promote = Patch::Merge(json!({ "metadata": { "annotations": {
        "rollgate.dev/promote": "reviewed by hand" } } }));
    rollouts
        .patch(
            "m-v4-again",
            &PatchParams::apply("argocd-controller"),
            &promote,
        )
        .await
        .expect("annotated");
    let s = watch_rollout(
        &rollouts,
        "m-v4-again",
        Duration::from_secs(20),
        &mut phases,
        ended,
    )
    .await;
    assert_eq!(s.phase.as_deref(), Some("PROMOTED"), "{s:?}");
    assert_eq!(
        s.verdict.as_deref(),
        Some("PROMOTED by an operator"),
        "{s:?}"
    );
    assert_eq!(
        s.handled.get("promote").map(String::as_str),
        Some("reviewed by hand")
    );
    let id = s.rollout_id.expect("an id");
    let (_, audit) = api(
        &c,
        &ctl,
        "GET",
        &format!("/api/v1/audit?rollout={id}"),
        None,
    )
    .await;
    let audit = audit.to_string();
    assert!(
        audit.contains("on behalf of kubernetes:kubectl-create")
            && audit.contains("first look fine"),
        "the approval is audited with its reason, on behalf of the annotation's writer: {audit}"
    );
    assert!(
        audit.contains("on behalf of kubernetes:argocd-controller")
            && audit.contains("reviewed by hand"),
        "the promotion is audited with its reason, on behalf of the annotation's writer: {audit}"
    );

    // The operator stopped after asking for a start and before recording
    // its id (played here: the start asked through the API as the operator
    // would, the status holding what it wrote before asking): restarted,
    // it finds that rollout and starts no other.
    operator.kill();
    let body = json!({ "model": "m", "revision": revisions["v2"], "plan": holding });
    let (st, r) = api(&c, &ctl, "POST", "/api/v1/rollouts", Some(body)).await;
    assert_eq!(st, 201, "{r}");
    let orphan = r["id"].as_i64().expect("an id");
    let asked: ModelRollout = from_yaml(&rollout_yaml("m-orphan", "v2", &holding));
    rollouts
        .create(&PostParams::default(), &asked)
        .await
        .expect("created");
    let marker = Patch::Merge(json!({ "status": {
        "startRequested": revisions["v2"], "phase": "STARTING" } }));
    rollouts
        .patch_status("m-orphan", &PatchParams::default(), &marker)
        .await
        .expect("marked");
    operator = start_operator(&server, &ctl);
    let s = watch_rollout(
        &rollouts,
        "m-orphan",
        Duration::from_secs(20),
        &mut Vec::new(),
        |s| s.rollout_id.is_some(),
    )
    .await;
    assert_eq!(
        s.rollout_id,
        Some(orphan),
        "the rollout it asked for, found: {s:?}"
    );
    rollouts
        .delete("m-orphan", &DeleteParams::default())
        .await
        .expect("deleted");
    gone(
        &rollouts,
        "m-orphan",
        Duration::from_secs(20),
        "m-orphan let go",
    )
    .await;
    let (_, record) = api(&c, &ctl, "GET", &format!("/api/v1/rollouts/{orphan}"), None).await;
    assert_eq!(phase(&record), "aborted", "{record}");

    // A registered revision's spec changed under its name: refused, said.
    let changed = Patch::Merge(json!({ "spec": { "revisions": {
        "v1": { "upstream": upstream(&servers.broken) } } } }));
    models
        .patch("m", &PatchParams::apply("kubectl-edit"), &changed)
        .await
        .expect("patched");
    let started = Instant::now();
    loop {
        let m = models.get_status("m").await.expect("the Model");
        let status = m.status.unwrap_or_default();
        if status.observed_generation == m.metadata.generation {
            let valid = condition(&status.conditions, "Valid").expect("Valid");
            assert_eq!(valid.status, "False", "{valid:?}");
            assert!(
                valid
                    .message
                    .contains("spec.revisions.v1: a revision is immutable"),
                "{valid:?}"
            );
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the change looked at: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    stop.store(true, Ordering::SeqCst);
    let by: BTreeMap<String, u64> = counted(load).await;
    eprintln!("requests by who answered: {by:?}");
    assert!(
        by.get(servers.identical.addr()).copied().unwrap_or(0) > 0,
        "{by:?}"
    );
    drop(operator);
}
