use std::time::Duration;

use rollgate_store::DataPlane;

use super::*;

fn arm(role: &'static str, upstream: &str, weight_bp: u32) -> Arm {
    Arm {
        role,
        revision: format!("r-{role}"),
        upstream: upstream.into(),
        weight_bp,
        predictor: None,
    }
}

/// Every adapter kind refuses a routing that cannot serve before it
/// writes a file, runs a command or calls anyone.
#[tokio::test]
async fn no_adapter_writes_a_routing_that_cannot_serve() {
    let dir = tempfile::tempdir().expect("tempdir");
    let at = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let planes = [
        DataPlane::Nginx {
            include_file: at("m.conf"),
            reload_command: vec!["touch".into(), at("reloaded")],
            confirm_url: "http://127.0.0.1:9/v".into(),
            key: "$http_x_rollgate_key".into(),
        },
        DataPlane::Envoy {
            routes_file: at("m.rds.json"),
            clusters_file: at("cds.json"),
            admin_url: "http://127.0.0.1:9".into(),
            route_config_name: None,
            key_header: "x-rollgate-key".into(),
            mirror_cluster: None,
        },
        DataPlane::Webhook {
            url: "http://127.0.0.1:9/r".into(),
            bearer_token_file: None,
        },
    ];
    let unservable = [
        vec![],
        vec![arm("champion", "http://10.0.0.5:8080", 9_000)],
        vec![
            arm("champion", "http://10.0.0.5:8080", 5_000),
            arm("candidate", "http://", 5_000),
        ],
        vec![arm("champion", "unix:/run/model.sock", 10_000)],
    ];
    let http = HttpClient::new(Duration::from_secs(1));
    for plane in &planes {
        let adapter = for_plane(plane, &http);
        assert_eq!(adapter.kind(), plane.kind());
        for arms in &unservable {
            let desired = Desired {
                model: "m".into(),
                version: "1.1".into(),
                rollout: Some(1),
                epoch: 1,
                generation: 1,
                shadow: None,
                arms: arms.clone(),
            };
            let e = adapter.apply(&desired).await.expect_err("refused");
            assert!(
                matches!(e, AdapterError::Unroutable { .. }),
                "{}: {e}",
                plane.kind()
            );
        }
    }
    let written: Vec<_> = std::fs::read_dir(dir.path()).expect("dir").collect();
    assert!(written.is_empty(), "nothing written or run: {written:?}");
    // A champion-only routing and a split are servable.
    let ok = |arms| Desired {
        model: "m".into(),
        version: "champion:r".into(),
        rollout: None,
        epoch: 0,
        generation: 1,
        shadow: None,
        arms,
    };
    assert!(servable(&ok(vec![arm("champion", "http://10.0.0.5:8080", 10_000)])).is_ok());
    assert!(
        servable(&ok(vec![
            arm("champion", "http://10.0.0.5:8080", 9_500),
            arm("candidate", "https://m.internal", 500),
        ]))
        .is_ok()
    );
}

/// A seed is the adapter's own output for the champion, at generation 0:
/// any routing the store holds replaces it.
#[test]
fn a_seed_is_the_adapters_own_output_at_generation_zero() {
    let nginx = DataPlane::Nginx {
        include_file: "/etc/nginx/rollgate/m.conf".into(),
        reload_command: vec!["nginx".into(), "-s".into(), "reload".into()],
        confirm_url: "http://127.0.0.1/v".into(),
        key: "$http_x_rollgate_key".into(),
    };
    let files = seed(&nginx, "m", "http://127.0.0.1:9001").expect("seed");
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].0, "/etc/nginx/rollgate/m.conf");
    assert!(files[0].1.contains("# generation 0 "), "{}", files[0].1);
    let envoy = DataPlane::Envoy {
        routes_file: "/etc/envoy/m.rds.json".into(),
        clusters_file: "/etc/envoy/cds.json".into(),
        admin_url: "http://127.0.0.1:9901".into(),
        route_config_name: None,
        key_header: "x-rollgate-key".into(),
        mirror_cluster: None,
    };
    let files = seed(&envoy, "m", "http://127.0.0.1:9001").expect("seed");
    let names: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(names, ["/etc/envoy/m.rds.json", "/etc/envoy/cds.json"]);
    let webhook = DataPlane::Webhook {
        url: "http://127.0.0.1:9/r".into(),
        bearer_token_file: None,
    };
    assert!(
        seed(&webhook, "m", "http://127.0.0.1:9001")
            .expect("seed")
            .is_empty()
    );
    assert!(matches!(
        seed(&nginx, "m", "unix:/run/m.sock"),
        Err(AdapterError::Unroutable { .. })
    ));
}
