//! Pinned routing for testers: a request that names a revision (pin header
//! or cookie) is served by it whatever the weights, counted apart, and
//! never counted as evidence; a model can turn it off.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http::StatusCode;

use rollgate_gateway::ModelRoute;

use crate::common::route;
use crate::it::{
    Behaviour, ONE, call, client, config, rev, start, upstream, with_candidate, with_shadow,
};

/// A prediction for model `m` with `headers`: its status, the revision
/// that answered, its body.
async fn ask(addr: SocketAddr, headers: &[(&str, &str)]) -> (StatusCode, Option<String>, String) {
    let path = "/v1/models/m:predict";
    let r = call(
        &client(),
        addr,
        "POST",
        path,
        headers,
        r#"{"instances":[[1.0]]}"#,
    )
    .await;
    (r.status, r.revision, r.body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_request_reaches_its_revision_and_is_never_evidence() {
    let champ = upstream(Behaviour::Answer(200, ONE)).await;
    let cand = upstream(Behaviour::Answer(200, ONE)).await;
    let shadow = upstream(Behaviour::Answer(200, ONE)).await;
    // No live share for the candidate; every unpinned request mirrored.
    let mut m = with_shadow(
        with_candidate(route(&champ.url), &cand.url, 0),
        &shadow.url,
        10_000,
    );
    m.pinning = true;
    let mut cfg = config(vec![m.clone()]);
    cfg.pin_cookie = Some("rollgate_pin".into());
    let gw = start(cfg).await;
    let pin = |v: &'static str| [("x-rollgate-pin", v)];
    for _ in 0..5 {
        let (s, r, _) = ask(gw.addr, &pin("candidate")).await;
        assert_eq!((s, r.as_deref()), (StatusCode::OK, Some("cand")));
    }
    let (s, r, _) = ask(gw.addr, &pin("shadow")).await;
    assert_eq!((s, r.as_deref()), (StatusCode::OK, Some("shadow")));
    let (s, r, _) = ask(gw.addr, &[("cookie", "a=b; rollgate_pin=cand")]).await;
    assert_eq!(
        (s, r.as_deref()),
        (StatusCode::OK, Some("cand")),
        "by cookie, by id"
    );
    let (s, r, _) = ask(gw.addr, &pin("champ")).await;
    assert_eq!(
        (s, r.as_deref()),
        (StatusCode::OK, Some("champ")),
        "the champion by id"
    );
    let (s, r, _) = ask(gw.addr, &[]).await;
    assert_eq!(
        (s, r.as_deref()),
        (StatusCode::OK, Some("champ")),
        "unpinned"
    );
    // A pin to what is not routed is refused, saying what may be pinned;
    // an empty pin is refused, never routed at random.
    let (s, _, body) = ask(gw.addr, &pin("r-gone")).await;
    assert_eq!(s, StatusCode::CONFLICT, "{body}");
    assert!(
        body.contains("pin_not_routed") && body.contains("candidate"),
        "{body}"
    );
    let (s, _, body) = ask(gw.addr, &[("cookie", "rollgate_pin=")]).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("bad_pin"), "{body}");

    // The one unpinned request was mirrored: the shadow's other hit.
    let mirrored = 1;
    let snap = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let s = gw.gateway.snapshot();
            if s.models["m"]
                .pairs_for("shadow")
                .is_some_and(|p| p.pairs() == mirrored)
            {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the unpinned request's mirror was paired");
    assert_eq!(cand.hits.load(Ordering::SeqCst), 6);
    assert_eq!(shadow.hits.load(Ordering::SeqCst), 1 + mirrored);
    let pinned = &snap.pinned["m"];
    assert_eq!(
        (pinned["cand"], pinned["shadow"], pinned["champ"]),
        (6, 1, 1),
        "{pinned:?}"
    );
    // Nothing pinned is evidence: the candidate has no counts at all, the
    // shadow only its mirror, the champion only the unpinned request.
    let st = rev(&snap, "cand");
    assert_eq!((st.arrived(), st.requests()), (0, 0), "{st:?}");
    assert_eq!(rev(&snap, "shadow").requests(), mirrored);
    assert_eq!(rev(&snap, "champ").requests(), 1);
    let metrics = call(&client(), gw.addr, "GET", "/metrics", &[], "")
        .await
        .body;
    assert!(
        metrics.contains(r#"rollgate_pinned_requests_total{model="m",revision="cand"} 6"#),
        "{metrics}"
    );
    gw.shutdown().await;

    // In SHADOW (no candidate routed live), `candidate` is the shadow.
    let mut shadow_only = with_shadow(route(&champ.url), &shadow.url, 10_000);
    shadow_only.pinning = true;
    let gw = start(config(vec![shadow_only.clone()])).await;
    let (s, r, _) = ask(gw.addr, &pin("candidate")).await;
    assert_eq!((s, r.as_deref()), (StatusCode::OK, Some("shadow")));
    gw.shutdown().await;

    // Off (the default), and for a mirror-only model: the pin is ignored,
    // the request routed as any other (here: to the champion).
    let mut mirror_only = shadow_only;
    mirror_only.mirror_only = true;
    for m in [
        ModelRoute {
            pinning: false,
            ..m
        },
        mirror_only,
    ] {
        let gw = start(config(vec![m])).await;
        let (s, r, _) = ask(gw.addr, &pin("candidate")).await;
        assert!(
            r.as_deref() != Some("cand")
                && (s == StatusCode::OK || s == StatusCode::MISDIRECTED_REQUEST),
            "{s} {r:?}"
        );
        assert!(gw.gateway.snapshot().pinned.is_empty());
        gw.shutdown().await;
    }
}

#[test]
fn a_pin_header_must_be_a_header_of_its_own() {
    let mut cfg = config(vec![route("http://127.0.0.1:1")]);
    for taken in [
        "x-rollgate-key",
        "cookie",
        "Content-Type",
        "te",
        "grpc-timeout",
    ] {
        cfg.pin_header = taken.into();
        let e = rollgate_gateway::Gateway::new(&cfg).expect_err(taken);
        assert_eq!(e.field, "pin_header", "{taken}");
    }
    cfg.pin_header = "x-rollgate-pin".into();
    cfg.pin_cookie = Some("a b".into());
    let e = rollgate_gateway::Gateway::new(&cfg).expect_err("bad cookie name");
    assert_eq!(e.field, "pin_cookie");
}
