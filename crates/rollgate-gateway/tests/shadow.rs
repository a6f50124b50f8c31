//! The shadow against real upstreams on 127.0.0.1: a copy can neither
//! fail nor hold a user's request, its failures are its own, overflow is
//! dropped and counted, and its answers are paired with the champion's.

use std::sync::atomic::Ordering;

use http::StatusCode;

use crate::common::route;
use crate::it::{
    Behaviour, ONE, client, config, eventually, predict, rev, start, upstream, with_candidate,
    with_shadow,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_shadow_neither_fails_nor_holds_the_user() {
    let champ = upstream(Behaviour::Answer(200, ONE)).await;
    let shadow = upstream(Behaviour::Stall).await;
    let gw = start(config(vec![with_shadow(
        route(&champ.url),
        &shadow.url,
        10_000,
    )]))
    .await;
    let c = client();
    for i in 0..20 {
        // The shadow never answers: each reply arriving at all shows the user
        // never waits for it.
        let r = predict(&c, gw.addr, Some(&format!("u{i}"))).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.revision.as_deref(), Some("champ"));
        assert_eq!(r.body, ONE);
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_shadow_is_counted_against_itself_only() {
    let champ = upstream(Behaviour::Answer(200, ONE)).await;
    let shadow = upstream(Behaviour::Answer(500, "boom")).await;
    let gw = start(config(vec![with_shadow(
        route(&champ.url),
        &shadow.url,
        10_000,
    )]))
    .await;
    let c = client();
    for i in 0..50 {
        assert_eq!(
            predict(&c, gw.addr, Some(&format!("u{i}"))).await.status,
            StatusCode::OK
        );
    }
    let s = eventually(&gw.gateway, |s| rev(s, "shadow").requests() == 50).await;
    assert_eq!(rev(&s, "shadow").failures().upstream_5xx, 50);
    assert_eq!(rev(&s, "champ").failure_count(), 0);
    assert_eq!(rev(&s, "champ").requests(), 50);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirror_overflow_is_dropped_and_counted() {
    let champ = upstream(Behaviour::Answer(200, ONE)).await;
    let shadow = upstream(Behaviour::Stall).await;
    let mut cfg = config(vec![with_shadow(route(&champ.url), &shadow.url, 10_000)]);
    cfg.mirror.max_outstanding = 2;
    let gw = start(cfg).await;
    let c = client();
    for i in 0..30 {
        assert_eq!(
            predict(&c, gw.addr, Some(&format!("u{i}"))).await.status,
            StatusCode::OK
        );
    }
    let s = gw.gateway.snapshot();
    let pairs = s.models["m"]
        .pairs_for("shadow")
        .copied()
        .unwrap_or_default();
    // Two mirrors hold the two slots forever; every later one is dropped.
    assert_eq!(pairs.mirror_dropped(), 28);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_answers_are_paired_with_the_champions() {
    let champ = upstream(Behaviour::Answer(
        200,
        r#"{"predictions":[[0.05,0.95],[0.6,0.4]]}"#,
    ))
    .await;
    let flipped = upstream(Behaviour::Answer(
        200,
        r#"{"predictions":[[0.9,0.1],[0.6,0.4]]}"#,
    ))
    .await;
    let gw = start(config(vec![with_shadow(
        route(&champ.url),
        &flipped.url,
        10_000,
    )]))
    .await;
    let c = client();
    for i in 0..40 {
        predict(&c, gw.addr, Some(&format!("u{i}"))).await;
    }
    let s = eventually(&gw.gateway, |s| {
        s.models["m"]
            .pairs_for("shadow")
            .is_some_and(|p| p.pairs() == 80)
    })
    .await;
    let p = s.models["m"].pairs_for("shadow").copied().expect("pairs");
    // Instance 1: champion class 1 at 0.95 (confident), shadow class 0: a flip.
    // Instance 2: both class 0, champion at 0.6 (not confident): agreement.
    assert_eq!(
        (p.agreements(), p.champion_confident(), p.confident_flips()),
        (40, 40, 40)
    );
    assert_eq!(rev(&s, "champ").predictions().get("1"), Some(&40));
    assert_eq!(rev(&s, "champ").predictions().get("0"), Some(&40));
    gw.shutdown().await;
}

/// A model another data plane serves: the gateway gets copies of its
/// requests. While a shadow is mirrored each copy goes to the champion and
/// the shadow and is paired; a candidate is never routed; without a
/// shadow every copy is refused 421 without reaching a model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_only_model_pairs_copies_and_sends_nothing_else() {
    let champ = upstream(Behaviour::Answer(200, ONE)).await;
    let cand = upstream(Behaviour::Answer(200, ONE)).await;
    let shadow = upstream(Behaviour::Answer(200, ONE)).await;
    let mut mirrored = with_shadow(route(&champ.url), &shadow.url, 10_000);
    mirrored.mirror_only = true;
    mirrored = with_candidate(mirrored, &cand.url, 10_000);
    let gw = start(config(vec![mirrored])).await;
    let c = client();
    for i in 0..30 {
        assert_eq!(
            predict(&c, gw.addr, Some(&format!("u{i}"))).await.status,
            StatusCode::OK
        );
    }
    let s = eventually(&gw.gateway, |s| {
        s.models["m"]
            .pairs_for("shadow")
            .is_some_and(|p| p.pairs() == 30)
    })
    .await;
    assert_eq!(rev(&s, "champ").requests(), 30);
    assert_eq!(cand.hits.load(Ordering::SeqCst), 0, "no candidate routed");
    // (Its idle connection would hold the graceful shutdown.)
    drop(c);
    gw.shutdown().await;

    let mut idle = route(&champ.url);
    idle.mirror_only = true;
    let before = champ.hits.load(Ordering::SeqCst);
    let gw = start(config(vec![idle])).await;
    let c = client();
    for i in 0..10 {
        let r = predict(&c, gw.addr, Some(&format!("u{i}"))).await;
        assert_eq!(r.status, StatusCode::MISDIRECTED_REQUEST);
        assert!(r.body.contains("mirror_only"), "{}", r.body);
    }
    assert_eq!(
        champ.hits.load(Ordering::SeqCst),
        before,
        "no copy reached a model"
    );
    gw.shutdown().await;
}
