//! Labels that come late *unevenly*, end to end: the label's delay
//! depends on the answer its user was shown (a flagged transaction is
//! reviewed at once, a passed one is known only at its chargeback, or
//! never). Real controller and gateway processes on 127.0.0.1 in one
//! store; two [`Model::wrong_on`] servers whose every answer the test
//! knows, so the truth, each arm's answer and the label process are the
//! test's own. Every wait is bounded.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::common::*;
use crate::labels::send_labels;

/// A plan judged on labels in every stage (the agreement gate off), the
/// label window covering every delay the tests' label processes give.
fn plan(absent_label: Option<&str>) -> Value {
    let mut quality = json!({
        "enabled": true, "min_labels": 20, "margin": 0.2,
        "label_window": "6s", "label_deadline": "30s"
    });
    if let Some(a) = absent_label {
        quality["absent_label"] = json!(a);
    }
    json!({
        "steps": [50],
        "min_stage_duration": "1s",
        "evidence_timeout": "90s",
        "readiness_timeout": "5s",
        "gates": {
            "error_rate": { "min_requests": 20, "margin": 0.05 },
            "latency": { "min_requests": 20 },
            "shadow": { "min_pairs": 1, "min_agreement": 0.0, "max_flip_rate": 1.0 },
            "quality": quality
        }
    })
}

/// When a request's label comes after its answer, from its truth and the
/// class its user was shown; `None`: never.
type LabelProcess = fn(truth: usize, shown: usize) -> Option<Duration>;

/// A complaint comes at once, a confirmation after 5 s: labels of the
/// answers shown wrong come first.
fn late_when_right(truth: usize, shown: usize) -> Option<Duration> {
    Some(Duration::from_millis(if truth == shown {
        5_000
    } else {
        300
    }))
}

/// Fraud: a flagged transaction (class 1) is reviewed at once; a passed
/// fraud is known at its chargeback, 3 s later; a passed legitimate one
/// is never labelled.
fn fraud(truth: usize, shown: usize) -> Option<Duration> {
    match (shown, truth) {
        (1, _) => Some(Duration::from_millis(300)),
        (_, 1) => Some(Duration::from_millis(3_000)),
        _ => None,
    }
}

/// The class a `wrong_on(band)` model answers `(truth, u)`.
fn answer((lo, hi): (f64, f64), truth: usize, u: f64) -> usize {
    if (lo..hi).contains(&u) {
        1 - truth
    } else {
        truth
    }
}

/// The models' bands by revision id, to know what each user was shown.
struct Arms<'a> {
    champion: (&'a str, (f64, f64)),
    candidate: (&'a str, (f64, f64)),
}

/// Requests of truth 1 with probability 0.3 through the gateway, each
/// labelled as `process` says of the answer its user was shown, until
/// rollout `id` has ended. Returns the rollout and the requests sent.
async fn traffic_labelled_by(
    (c, ctl, gw): (&HttpClient, &Proc, &str),
    (id, seed): (i64, u64),
    arms: &Arms<'_>,
    process: LabelProcess,
) -> (Value, usize) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut owed: Vec<(Instant, String, usize)> = Vec::new();
    let started = Instant::now();
    let mut sent = 0;
    loop {
        for _ in 0..20 {
            let truth = usize::from(rng.random_bool(0.3));
            let u: f64 = rng.random();
            let rid = format!("{seed}-{sent}");
            let body = json!({"instances": [[truth, u]]}).to_string();
            let (status, who) = predict_answered_by(c, gw, Some(&rid), body).await;
            assert_eq!(status, 200);
            let band = if who == arms.candidate.0 {
                arms.candidate.1
            } else {
                assert_eq!(who, arms.champion.0, "answered by a third revision");
                arms.champion.1
            };
            if let Some(delay) = process(truth, answer(band, truth, u)) {
                owed.push((Instant::now() + delay, rid, truth));
            }
            sent += 1;
        }
        let now = Instant::now();
        let due: Vec<Value> = owed
            .iter()
            .filter(|(at, ..)| *at <= now)
            .map(|(_, rid, truth)| json!({"request_id": rid, "label": truth}))
            .collect();
        owed.retain(|(at, ..)| *at > now);
        if !due.is_empty() {
            let (s, counts) = send_labels(c, ctl, None, json!({"labels": due})).await;
            assert_eq!(s, 200, "{counts}");
        }
        let (_, r) = api(c, ctl, "GET", &format!("/api/v1/rollouts/{id}"), None).await;
        if finished(&r) {
            return (r, sent);
        }
        assert!(
            started.elapsed() < Duration::from_secs(150) && sent < 30_000,
            "not decided after {sent} requests: {r}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_of_wrong_answers_coming_first_neither_pass_a_worse_candidate_nor_refuse_an_equal_one()
 {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    // The champion is wrong on 10% of requests; `worse` on 40% (30 points
    // worse, past the margin); `equal` on another 10%.
    let bands = [(0.0, 0.1), (0.1, 0.5), (0.1, 0.2)];
    let champion_url = model_server(Model::wrong_on(bands[0].0, bands[0].1)).await;
    let worse_url = model_server(Model::wrong_on(bands[1].0, bands[1].1)).await;
    let equal_url = model_server(Model::wrong_on(bands[2].0, bands[2].1)).await;
    let (champion, worse) = setup(&c, &ctl, &champion_url, &worse_url).await;
    let equal = register(&c, &ctl, &equal_url).await;
    let gw = start_gateway(dir.path());
    let peers = (&c, &ctl, gw.addr());

    // Labels of the champion's mistakes come 5 s before the rest: read as
    // they come, the first look sees the worse candidate right where the
    // champion is wrong, and nothing of its own mistakes.
    let id = start_rollout_with(&c, &ctl, &worse, plan(None)).await;
    let arms = Arms {
        champion: (&champion, bands[0]),
        candidate: (&worse, bands[1]),
    };
    let (r, sent) = traffic_labelled_by(peers, (id, 1), &arms, late_when_right).await;
    assert_eq!(phase(&r), "rolled_back", "{r}");
    let reason = &r["state"]["phase"]["reason"];
    assert_eq!(reason["code"], "anytime_breach", "{r}");
    assert_eq!(reason["gates"], json!(["quality"]), "{r}");
    assert_eq!(r["state"]["last_verdict"]["stage"], "shadow", "{r}");
    eprintln!("worse refused in SHADOW after {sent} requests");

    // The same label process, an equal candidate: promoted.
    let id = start_rollout_with(&c, &ctl, &equal, plan(None)).await;
    let arms = Arms {
        champion: (&champion, bands[0]),
        candidate: (&equal, bands[2]),
    };
    let (r, sent) = traffic_labelled_by(peers, (id, 2), &arms, late_when_right).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    eprintln!("equal promoted after {sent} requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fraud_model_whose_passed_answers_are_never_labelled_fails_safe_then_passes_with_absent_label()
 {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    // Equal models, wrong on different 10% of transactions.
    let bands = [(0.0, 0.1), (0.1, 0.2)];
    let champion_url = model_server(Model::wrong_on(bands[0].0, bands[0].1)).await;
    let candidate_url = model_server(Model::wrong_on(bands[1].0, bands[1].1)).await;
    let (champion, cand) = setup(&c, &ctl, &champion_url, &candidate_url).await;
    let gw = start_gateway(dir.path());
    let peers = (&c, &ctl, gw.addr());
    let arms = Arms {
        champion: (&champion, bands[0]),
        candidate: (&cand, bands[1]),
    };

    // Nothing declares what a missing label means: about a third of the
    // answers are ever labelled, counted against each verdict, so no
    // verdict is reached; the deadline ends it, the candidate not blamed.
    let id = start_rollout_with(&c, &ctl, &cand, plan(None)).await;
    let (r, sent) = traffic_labelled_by(peers, (id, 3), &arms, fraud).await;
    let reason = &r["state"]["phase"]["reason"];
    assert_eq!(reason["code"], "label_timeout", "{r}");
    let (labelled, recorded) = (
        reason["labelled"].as_u64().expect("labelled"),
        reason["recorded"].as_u64().expect("recorded"),
    );
    assert!(labelled > 0 && labelled * 2 < recorded, "{r}");
    let (_, rev) = api(&c, &ctl, "GET", &format!("/api/v1/revisions/{cand}"), None).await;
    assert_ne!(rev["state"], "rejected", "{rev}");
    eprintln!("no absent_label: label_timeout after {sent} requests ({labelled} of {recorded})");

    // Declared: a transaction unlabelled once the window is past was
    // legitimate. Every matured answer has its label; promoted.
    let id = start_rollout_with(&c, &ctl, &cand, plan(Some("0"))).await;
    let (r, sent) = traffic_labelled_by(peers, (id, 4), &arms, fraud).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    eprintln!("absent_label = 0: promoted after {sent} requests");
    // The status shows the test that judged the last (CANARY) stage.
    let (code, out, err) = cli(ctl.addr(), &["rollout", "status", &id.to_string()]);
    assert!(
        code == 0 && out.contains("matured answers labelled") && !out.contains("pairs labelled"),
        "{out}{err}"
    );
}
