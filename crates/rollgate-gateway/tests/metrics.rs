//! What the gateway serves about itself: KServe V2 metadata, its stats,
//! and its Prometheus metrics (checked by promtool), which stop for a
//! revision that leaves the routing table.

use crate::common::route;
use crate::it::*;
use http::StatusCode;
use rollgate_core::Protocol;
use rollgate_gateway::GatewaySnapshot;

#[path = "../../../tests/support/promtool.rs"]
mod promtool;
use promtool::promtool_accepts;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v2_json_routes_metadata_stats_and_metrics() {
    let v2 = upstream(Behaviour::Answer(
        200,
        r#"{"outputs":[{"name":"p","shape":[1,2],"datatype":"FP32","data":[0.2,0.8]}]}"#,
    ))
    .await;
    let json = upstream(Behaviour::Answer(
        200,
        r#"{"score":{"label":"fraud","confidence":0.99}}"#,
    ))
    .await;
    let mut m2 = route(&v2.url);
    m2.name = "v2model".into();
    m2.protocol = Protocol::OipV2;
    let mut mj = route(&json.url);
    mj.name = "scorer".into();
    mj.protocol = Protocol::Json;
    mj.json_path = Some("/score".into());
    mj.output_pointer = Some("/score".into());
    mj.key_field = Some("/user".into());
    let gw = start(config(vec![m2, mj])).await;
    let c = client();
    let r = call(
        &c,
        gw.addr,
        "POST",
        "/v2/models/v2model/infer",
        &[],
        r#"{"inputs":[]}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = call(
        &c,
        gw.addr,
        "POST",
        "/score",
        &[],
        r#"{"user":"u1","x":[1]}"#,
    )
    .await;
    assert_eq!(
        (r.status, r.revision.as_deref()),
        (StatusCode::OK, Some("champ"))
    );
    let meta = call(&c, gw.addr, "GET", "/v2/models/v2model", &[], "").await;
    assert_eq!(meta.status, StatusCode::OK);
    let missing = call(&c, gw.addr, "POST", "/v1/models/nope:predict", &[], "{}").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(missing.body.contains("unknown_model"));

    let stats = call(&c, gw.addr, "GET", "/rollgate/stats", &[], "").await;
    let snap: GatewaySnapshot = serde_json::from_str(&stats.body).expect("stats are a snapshot");
    assert_eq!(
        snap.models["v2model"]
            .revision("champ")
            .predictions()
            .get("1"),
        Some(&1)
    );
    assert_eq!(
        snap.models["scorer"]
            .revision("champ")
            .predictions()
            .get("fraud"),
        Some(&1)
    );
    let metrics = call(&c, gw.addr, "GET", "/metrics", &[], "").await;
    assert!(
        metrics
            .body
            .contains(r#"rollgate_requests_total{model="scorer",revision="champ"} 1"#),
        "{}",
        metrics.body
    );
    assert!(metrics.body.contains("rollgate_in_flight"));
    // Latency is a histogram per revision (mergeable across gateways).
    assert!(
        metrics.body.contains(
            r#"rollgate_latency_seconds_bucket{le="+Inf",model="scorer",revision="champ"} 1"#
        ),
        "{}",
        metrics.body
    );
    assert!(!metrics.body.contains("quantile="), "{}", metrics.body);
    // The process's own metrics, as every Prometheus client names them.
    for name in [
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
    ] {
        assert!(metrics.body.contains(name), "{name}: {}", metrics.body);
    }
    promtool_accepts(&metrics.body);
    gw.shutdown().await;
}

/// A revision that leaves the routing table (a rolled-back candidate, a
/// shadow whose stage ended) stops being exported; the champion's series
/// go on. The evidence in `/rollgate/stats` keeps it (the controller's
/// ledger needs it).
#[tokio::test]
async fn metrics_stop_when_a_revision_leaves_the_routing_table() {
    let champ = upstream(Behaviour::Answer(200, ONE)).await;
    let cand = upstream(Behaviour::Answer(200, ONE)).await;
    let shadow = upstream(Behaviour::Answer(200, ONE)).await;
    let both = with_shadow(
        with_candidate(route(&champ.url), &cand.url, 5_000),
        &shadow.url,
        10_000,
    );
    let gw = start(config(vec![both])).await;
    let c = client();
    for i in 0..40 {
        let r = predict(&c, gw.addr, Some(&format!("user-{i}"))).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    let _ = eventually(&gw.gateway, |s| rev(s, "cand").requests() > 0).await;
    let series = |body: &str, revision: &str| {
        body.lines()
            .filter(|l| !l.starts_with('#') && l.contains(&format!("revision=\"{revision}\"")))
            .count()
    };
    let before = call(&c, gw.addr, "GET", "/metrics", &[], "").await.body;
    for r in ["champ", "cand", "shadow"] {
        assert!(series(&before, r) > 0, "{r} not exported:\n{before}");
    }
    gw.gateway.set_routes(&[route(&champ.url)]);
    let after = call(&c, gw.addr, "GET", "/metrics", &[], "").await.body;
    assert!(series(&after, "champ") > 0, "{after}");
    assert_eq!(series(&after, "cand"), 0, "{after}");
    assert_eq!(series(&after, "shadow"), 0, "{after}");
    promtool_accepts(&after);
    assert!(rev(&gw.gateway.snapshot(), "cand").requests() > 0);
    gw.shutdown().await;
}
