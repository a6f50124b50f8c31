//! A model keyed by a handful of tenants (issue "The statistical unit
//! under concentration"): twelve keys, real processes on 127.0.0.1. With
//! sticky assignment a 20% stage holds two or three keys, too few to judge
//! per key; with per-request assignment the request is the unit, so an
//! identical candidate is promoted and one failing half its requests is
//! rolled back, as on a model with thousands of keys.

use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;

use crate::common::*;

/// Twelve keys, in turn, until `stop`: how many requests each revision
/// answered.
fn twelve_keys(
    gateway: &str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<std::collections::BTreeMap<String, u64>> {
    traffic_over_keys(
        format!("http://{gateway}/v1/models/m:predict"),
        |_| Bytes::from_static(br#"{"instances":[[1,2]]}"#),
        "x-rollgate-revision",
        12,
        stop,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twelve_key_model_split_per_request_promotes_the_same_and_rolls_back_the_broken() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    let champion = model_server(Model::new(false)).await;
    let same = model_server(Model::new(false)).await;
    let (_, same) = setup(&c, &ctl, &champion, &same).await;
    let gw = start_gateway(dir.path());
    let stop = Arc::new(AtomicBool::new(false));
    let load = twelve_keys(gw.addr(), Arc::clone(&stop));
    // Canary steps only: the candidates are judged on the users they serve.
    let mut per_request = plan();
    per_request["assignment"] = json!("per_request");
    per_request["shadow"] = json!({ "enabled": false });

    let id = start_rollout_with(&c, &ctl, &same, per_request.clone()).await;
    let r = wait_for(&c, &ctl, id, Duration::from_secs(90), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");

    let half_model = Model::failing_one_in(2);
    let half = model_server(half_model.clone()).await;
    let half = register(&c, &ctl, &half).await;
    let id = start_rollout_with(&c, &ctl, &half, per_request).await;
    let r = wait_for(&c, &ctl, id, Duration::from_secs(90), finished).await;
    assert_eq!(phase(&r), "rolled_back", "{r}");
    assert_eq!(
        r["state"]["phase"]["reason"]["code"], "anytime_breach",
        "{r}"
    );
    stop.store(true, Ordering::SeqCst);
    let served = load.await.expect("traffic");
    // Both candidates answered users of the twelve keys.
    assert!(served.get(&same).copied().unwrap_or(0) > 0, "{served:?}");
    assert!(served.get(&half).copied().unwrap_or(0) > 0, "{served:?}");
    assert!(half_model.posts.load(Ordering::SeqCst) > 0);
}

/// The same twelve keys, sticky. Declared up front (`plan.keys`), a plan
/// whose steps cannot hold the keys a stage needs is refused, naming the
/// step and what works. Not declared, rollgate counts the keys from the
/// traffic and fails the 20% stage (about 2.4 keys) as soon as its
/// minimum duration is over, naming the keys and the weight — not at the
/// evidence deadline, and without rejecting the candidate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twelve_key_sticky_model_is_told_its_stages_cannot_be_judged_per_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    let champion = model_server(Model::new(false)).await;
    let same = model_server(Model::new(false)).await;
    let (_, same) = setup(&c, &ctl, &champion, &same).await;

    let mut declared = plan();
    declared["keys"] = json!(12);
    let (s, r) = api(
        &c,
        &ctl,
        "POST",
        "/api/v1/rollouts",
        Some(json!({ "model": "m", "revision": same, "plan": declared })),
    )
    .await;
    assert_eq!(s, 422, "{r}");
    let said = r.to_string();
    assert!(said.contains("steps[0]") && said.contains("67%"), "{r}");

    let gw = start_gateway(dir.path());
    let stop = Arc::new(AtomicBool::new(false));
    let load = twelve_keys(gw.addr(), Arc::clone(&stop));
    let mut sticky = plan();
    sticky["shadow"] = json!({ "enabled": false });
    // A deadline far beyond the wait below: only failing fast ends it.
    sticky["evidence_timeout"] = json!("10m");
    let id = start_rollout_with(&c, &ctl, &same, sticky).await;
    let r = wait_for(&c, &ctl, id, Duration::from_secs(60), finished).await;
    stop.store(true, Ordering::SeqCst);
    load.await.expect("traffic");
    assert_eq!(phase(&r), "rolled_back", "{r}");
    let reason = &r["state"]["phase"]["reason"];
    assert_eq!(reason["code"], "too_few_keys", "{r}");
    assert_eq!(reason["weight_percent"], 20, "{r}");
    let keys = reason["keys"].as_u64().expect("keys");
    assert!((8..=16).contains(&keys), "estimated {keys} keys: {r}");
    let (_, rev) = api(&c, &ctl, "GET", &format!("/api/v1/revisions/{same}"), None).await;
    assert_eq!(rev["blocked"], false, "nothing was shown against it: {rev}");
}
