//! Unit tests of the registry's types and their validation: data planes,
//! model and revision specs, Prometheus evidence.

use super::*;

#[test]
fn each_data_plane_is_checked_and_a_bad_field_is_named() {
    let plane = |v: serde_json::Value| serde_json::from_value::<DataPlane>(v).expect("parses");
    let envoy = serde_json::json!({"kind": "envoy", "routes_file": "/etc/envoy/m.rds.json",
        "clusters_file": "/etc/envoy/cds.json", "admin_url": "http://127.0.0.1:9901"});
    let nginx = serde_json::json!({"kind": "nginx", "include_file": "/etc/nginx/m.conf",
        "reload_command": ["nginx", "-s", "reload"], "confirm_url": "http://127.0.0.1/v"});
    let webhook = serde_json::json!({"kind": "webhook", "url": "https://router.internal/r"});
    for good in [&envoy, &nginx, &webhook] {
        assert!(plane(good.clone()).validate("p").is_ok(), "{good}");
    }
    let with = |base: &serde_json::Value, field: &str, value: serde_json::Value| {
        let mut v = base.clone();
        v[field] = value;
        match plane(v).validate("data_planes.p") {
            Err(StoreError::Invalid(m)) => m,
            other => panic!("{field}: {other:?}"),
        }
    };
    assert!(with(&envoy, "routes_file", "m.json".into()).contains("routes_file"));
    assert!(
        with(&envoy, "clusters_file", "/etc/envoy/m.rds.json".into()).contains("clusters_file")
    );
    assert!(with(&envoy, "admin_url", "ftp://x".into()).contains("admin_url"));
    assert!(with(&envoy, "key_header", "x user".into()).contains("key_header"));
    assert!(with(&envoy, "route_config_name", " ".into()).contains("route_config_name"));
    assert!(with(&envoy, "mirror_cluster", "".into()).contains("mirror_cluster"));
    assert!(with(&nginx, "include_file", "m.conf".into()).contains("include_file"));
    assert!(with(&nginx, "reload_command", serde_json::json!([])).contains("reload_command"));
    assert!(with(&nginx, "key", "http_x".into()).contains("key"));
    assert!(with(&webhook, "url", "router".into()).contains("url"));
    assert!(with(&envoy, "routes_file", "m.json".into()).starts_with("data_planes.p.routes_file"));
    // Another data plane's evidence is Prometheus's.
    let spec = ModelSpec {
        data_plane: Some(DataPlaneRef::Named("edge".into())),
        ..ModelSpec::default()
    };
    assert!(
        matches!(spec.validate(), Err(StoreError::Invalid(m)) if m.contains("prometheus")),
        "a data plane without prometheus"
    );
}

/// The API names, the host decides: a spec that holds a data plane's
/// files and commands, or a token's file, is refused on write, saying
/// where to declare it; a name is what a spec holds.
#[test]
fn a_spec_names_host_resources_and_never_holds_them() {
    let prometheus = PrometheusEvidence {
        url: "http://127.0.0.1:9090".into(),
        ..PrometheusEvidence::default()
    };
    let planes = [
        serde_json::json!({"kind": "nginx", "include_file": "/etc/nginx/m.conf",
            "reload_command": ["/bin/sh", "-c", "id"], "confirm_url": "http://127.0.0.1/v"}),
        serde_json::json!({"kind": "envoy", "routes_file": "/var/lib/rollgate/rollgate.db",
            "clusters_file": "/etc/envoy/cds.json", "admin_url": "http://127.0.0.1:9901"}),
        serde_json::json!({"kind": "webhook", "url": "http://127.0.0.1:1/r",
            "bearer_token_file": "/var/lib/rollgate/audit.key"}),
        serde_json::json!({"kind": "webhook", "url": "http://127.0.0.1:1/r"}),
    ];
    for plane in planes {
        let spec: ModelSpec = serde_json::from_value(serde_json::json!({
            "prometheus": {"url": "http://127.0.0.1:9090"}, "data_plane": plane,
        }))
        .expect("an inline definition still parses (specs stored before names)");
        assert!(matches!(spec.data_plane, Some(DataPlaneRef::Inline(_))));
        let e = spec.validate().expect_err("refused").to_string();
        assert!(
            e.contains("model.data_plane") && e.contains("[data_planes.NAME]"),
            "{e}"
        );
    }
    let named: ModelSpec = serde_json::from_value(serde_json::json!({
        "prometheus": {"url": "http://127.0.0.1:9090", "credential": "prom"},
        "data_plane": "edge",
    }))
    .expect("parses");
    assert_eq!(named.data_plane, Some(DataPlaneRef::Named("edge".into())));
    assert!(named.validate().is_ok());
    let with_file = ModelSpec {
        prometheus: Some(PrometheusEvidence {
            bearer_token_file: Some("/var/lib/rollgate/audit.key".into()),
            ..prometheus
        }),
        ..ModelSpec::default()
    };
    let e = with_file.validate().expect_err("refused").to_string();
    assert!(
        e.contains("bearer_token_file") && e.contains("[credentials.NAME]"),
        "{e}"
    );
    let blank = ModelSpec {
        prometheus: named.prometheus.clone(),
        data_plane: Some(DataPlaneRef::Named(" ".into())),
        ..ModelSpec::default()
    };
    assert!(blank.validate().is_err());
}

fn spec(upstream: &str) -> RevisionSpec {
    RevisionSpec {
        upstream: upstream.into(),
        ..RevisionSpec::default()
    }
}

#[test]
fn absent_empty_and_default_spellings_share_one_identity() {
    let plain = spec("http://127.0.0.1:9001");
    let spelled = RevisionSpec {
        upstream: " http://127.0.0.1:9001/ ".into(),
        grpc_upstream: Some(" ".into()),
        artifact: Some("  ".into()),
        readiness_path: Some(String::new()),
        timeout_ms: Some(DEFAULT_TIMEOUT_MS),
        headers: BTreeMap::new(),
        secret_headers: vec![" ".into()],
        served_name: Some(" ".into()),
        env: BTreeMap::new(),
        secret_env: vec![" ".into()],
        predictor: None,
        registry_version: None,
    };
    assert_eq!(
        plain.identity("m").expect("valid"),
        spelled.identity("m").expect("valid")
    );
    let json_absent: RevisionSpec =
        serde_json::from_str(r#"{"upstream":"http://127.0.0.1:9001"}"#).expect("parse");
    let json_empty: RevisionSpec = serde_json::from_str(
        r#"{"upstream":"http://127.0.0.1:9001","env":{},"headers":{},"artifact":""}"#,
    )
    .expect("parse");
    assert_eq!(
        json_absent.identity("m").expect("valid"),
        json_empty.identity("m").expect("valid")
    );
}

#[test]
fn real_changes_change_identity() {
    let base = spec("http://127.0.0.1:9001");
    let id = base.identity("m").expect("valid");
    let mut env = base.clone();
    env.env.insert("SECRET_REF".into(), "vault:x".into());
    let mut timeout = base.clone();
    timeout.timeout_ms = Some(5_000);
    let mut artifact = base.clone();
    artifact.artifact = Some("models/v2.json".into());
    for changed in [env, timeout, artifact] {
        assert_ne!(changed.identity("m").expect("valid"), id);
    }
    assert_ne!(base.identity("other-model").expect("valid"), id);
}

#[test]
fn invalid_specs_name_their_field() {
    let e = spec("ftp://x").identity("m").expect_err("bad url");
    assert!(e.to_string().contains("revision.upstream"), "{e}");
    let mut p = spec("http://x");
    p.readiness_path = Some("ready".into());
    assert!(
        p.identity("m")
            .expect_err("bad path")
            .to_string()
            .contains("readiness_path")
    );
    let mut g = spec("http://x");
    g.grpc_upstream = Some("grpc://x:9081".into());
    let e = g.identity("m").expect_err("bad gRPC url");
    assert!(e.to_string().contains("revision.grpc_upstream"), "{e}");
    // A gRPC endpoint is part of what a revision is.
    g.grpc_upstream = Some("http://x:9081/".into());
    let with = g.identity("m").expect("valid");
    assert_ne!(with, spec("http://x").identity("m").expect("valid"));
    g.grpc_upstream = Some("http://x:9081".into());
    assert_eq!(
        g.identity("m").expect("valid"),
        with,
        "a trailing / is no change"
    );
}

#[test]
fn secret_header_values_are_redacted_when_shown_and_kept_for_routing() {
    let mut s = spec("http://127.0.0.1:9001");
    s.headers
        .insert("Authorization".into(), "Bearer t0ken".into());
    s.headers.insert("X-Tenant".into(), "acme".into());
    s.headers.insert("X-Model-Key".into(), "k3y".into());
    s.secret_headers = vec!["x-model-key".into()];
    let n = s.normalised().expect("valid");
    let rev = Revision {
        id: "r1".into(),
        model: "m".into(),
        spec: n.clone(),
        state: RevisionState::Available,
        rejections: 0,
        blocked: false,
        created_at: rollgate_core::Timestamp(0),
    };
    let shown = serde_json::to_string(&rev).expect("json");
    assert!(
        !shown.contains("t0ken") && !shown.contains("k3y"),
        "{shown}"
    );
    assert!(
        shown.contains("acme") && shown.contains(REDACTED),
        "{shown}"
    );
    assert_eq!(
        n.headers["Authorization"], "Bearer t0ken",
        "kept for routing"
    );
    let mut bad = spec("http://127.0.0.1:9001");
    bad.headers.insert("X-Evil".into(), "a\r\nb".into());
    assert!(bad.normalised().is_err());
    bad.headers.clear();
    bad.served_name = Some("a/b".into());
    assert!(bad.normalised().is_err());
}

/// Secret env values never leave the store: names that look secret and
/// names listed in `secret_env` are redacted, the rest shown.
#[test]
fn secret_env_values_are_redacted() {
    let mut s = spec("http://127.0.0.1:9001");
    s.env.insert("HF_TOKEN".into(), "hf_abc".into());
    s.env.insert("db_password".into(), "hunter2".into());
    s.env.insert("INTERNAL_URL".into(), "http://vault/x".into());
    s.env.insert("THREADS".into(), "4".into());
    s.secret_env = vec!["internal_url".into()];
    let shown = serde_json::to_string(&s.redacted()).expect("json");
    for secret in ["hf_abc", "hunter2", "vault"] {
        assert!(!shown.contains(secret), "{shown}");
    }
    assert!(shown.contains("\"THREADS\":\"4\""), "{shown}");
}

#[test]
fn prometheus_evidence_is_checked_where_it_is_given() {
    let with = |p: PrometheusEvidence| ModelSpec {
        prometheus: Some(p),
        ..ModelSpec::default()
    };
    let good = PrometheusEvidence {
        url: "http://127.0.0.1:9090".into(),
        ..PrometheusEvidence::default()
    };
    assert!(with(good.clone()).validate().is_ok());
    let refused = |p: PrometheusEvidence, why: &str| {
        let e = with(p).validate().expect_err("refused").to_string();
        assert!(e.contains(why), "{e} lacks {why:?}");
    };
    refused(
        PrometheusEvidence {
            url: "prometheus:9090".into(),
            ..good.clone()
        },
        "model.prometheus.url",
    );
    refused(
        PrometheusEvidence {
            successes: r#"model_infer_request_success_total{model="m"}"#.into(),
            ..good.clone()
        },
        "names neither $revision nor $instance",
    );
    refused(
        PrometheusEvidence {
            failures: r#"rate(errors_total{revision="$revision"}[1m])"#.into(),
            ..good.clone()
        },
        "not a series selector",
    );
    refused(
        PrometheusEvidence {
            latency_buckets: Some(r#"{revision="$revision"}[5m]"#.into()),
            ..good.clone()
        },
        "latency_buckets",
    );
    refused(
        PrometheusEvidence {
            target_labels: vec![],
            ..good.clone()
        },
        "target_labels",
    );
    // A histogram whose name says its unit must be read in it: Istio's,
    // Linkerd's in milliseconds; a seconds histogram declared in ms.
    for name in [
        "istio_request_duration_milliseconds_bucket",
        "response_latency_ms_bucket",
    ] {
        let ms = PrometheusEvidence {
            latency_buckets: Some(format!("{name}{{destination_workload=\"$revision\"}}")),
            ..good.clone()
        };
        refused(ms.clone(), "latency_unit = \"ms\"");
        let declared = PrometheusEvidence {
            latency_unit: LatencyUnit::Milliseconds,
            ..ms
        };
        assert!(with(declared).validate().is_ok(), "{name}");
    }
    refused(
        PrometheusEvidence {
            latency_buckets: Some(
                r#"http_request_duration_seconds_bucket{pod="$revision"}"#.into(),
            ),
            latency_unit: LatencyUnit::Milliseconds,
            ..good.clone()
        },
        "latency_unit = \"s\"",
    );
    // A name that says nothing (Envoy's `upstream_rq_time`): the declared
    // unit, whichever it is; milliseconds read as seconds at 1/1000.
    let envoy = PrometheusEvidence {
        latency_buckets: Some(
            r#"envoy_cluster_upstream_rq_time_bucket{envoy_cluster_name="$revision"}"#.into(),
        ),
        latency_unit: LatencyUnit::Milliseconds,
        ..good.clone()
    };
    assert!(with(envoy).validate().is_ok());
    assert_eq!(LatencyUnit::Milliseconds.seconds(250.0), 0.25);
    assert_eq!(LatencyUnit::Seconds.seconds(0.25), 0.25);
    assert_eq!(
        LatencyUnit::Milliseconds.seconds(f64::INFINITY),
        f64::INFINITY
    );
    // A selector of matchers alone is one.
    assert!(
        with(PrometheusEvidence {
            successes: r#"{__name__="ok_total",revision="$revision"}"#.into(),
            ..good
        })
        .validate()
        .is_ok()
    );
}

#[test]
fn a_predictor_is_registered_without_what_kserve_omits_or_the_adapter_writes() {
    let with = |p: serde_json::Value| RevisionSpec {
        predictor: Some(p),
        ..spec("http://127.0.0.1:9001")
    };
    let plain = with(serde_json::json!({
        "model": { "modelFormat": { "name": "sklearn" }, "storageUri": "s3://m/v1" },
        "volumes": [{ "name": "cache", "emptyDir": {} }],
    }));
    let spelled = with(serde_json::json!({
        "model": {
            "modelFormat": { "name": "sklearn" }, "storageUri": "s3://m/v1",
            "env": [], "args": null,
        },
        "volumes": [{ "name": "cache", "emptyDir": {} }],
        "tolerations": [],
    }));
    assert_eq!(
        plain.identity("m").expect("valid"),
        spelled.identity("m").expect("valid")
    );
    let normal = spelled.normalised().expect("valid");
    assert_eq!(
        normal.predictor, plain.predictor,
        "an empty map means something: kept"
    );
    let other = with(serde_json::json!({ "model": { "storageUri": "s3://m/v2" } }));
    let by_ref = with(serde_json::json!({ "model": { "env": [{ "name": "HF_TOKEN",
        "valueFrom": { "secretKeyRef": { "name": "hf", "key": "token" } } }] } }));
    assert!(
        by_ref.normalised().is_ok(),
        "a Secret by reference is the data plane's to allow"
    );
    let declared = RevisionSpec {
        secret_env: vec!["db_pass".into()],
        ..with(serde_json::json!({ "model": { "env": [{ "name": "DB_PASS", "value": "x" }] } }))
    };
    let err = declared
        .normalised()
        .expect_err("a declared secret")
        .to_string();
    assert!(err.contains("DB_PASS"), "{err}");
    assert_ne!(plain.identity("m").ok(), other.identity("m").ok());
    for (bad, says) in [
        (serde_json::json!("s3://m/v1"), "must be an object"),
        (serde_json::json!({ "args": [] }), "is empty"),
        (
            serde_json::json!({ "canaryTrafficPercent": 10, "model": {} }),
            "canaryTrafficPercent",
        ),
        (
            serde_json::json!({ "name": "v2", "model": {} }),
            "must not set name",
        ),
        (
            serde_json::json!({ "model": { "env": [{ "name": "HF_TOKEN", "value": "hf_x" }] } }),
            "secret-looking env \"HF_TOKEN\"",
        ),
    ] {
        let err = with(bad).normalised().expect_err(says).to_string();
        assert!(
            err.contains(says) && err.contains("revision.predictor"),
            "{says}: {err}"
        );
    }
}
