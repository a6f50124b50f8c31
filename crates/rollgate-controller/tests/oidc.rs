//! OIDC tokens against a JWKS served on loopback, with Ed25519 keys the test
//! generates: a valid token acts with its claimed role and its `sub`, under
//! the provider's name, as the actor; a wrong audience or issuer, an expired
//! token, one not yet valid, one that lives too long and one signed by
//! another key are refused; a rotated key is fetched when a token names it;
//! a hanging key endpoint delays no token whose key is known.

use crate::common;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use ring::signature::{Ed25519KeyPair, KeyPair};
use rollgate_controller::oidc::{Oidc, OidcConfig};
use rollgate_controller::router;
use rollgate_core::Timestamp;
use rollgate_store::SqlStore;
use serde_json::{Value, json};

/// A fresh Ed25519 key: its signing key and its public JWK under `kid`.
fn key(kid: &str) -> (EncodingKey, Value) {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).expect("keygen");
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("pair");
    let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(pair.public_key().as_ref());
    (
        EncodingKey::from_ed_der(pkcs8.as_ref()),
        json!({ "kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": "EdDSA", "use": "sig" }),
    )
}

fn token(key: &EncodingKey, kid: &str, claims: Value) -> String {
    let mut h = Header::new(Algorithm::EdDSA);
    h.kid = Some(kid.into());
    encode(&h, &claims, key).expect("sign")
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Serves `keys` (changeable) as a JWKS on loopback; counts the fetches.
async fn jwks(keys: Arc<std::sync::Mutex<Vec<Value>>>, fetches: Arc<AtomicUsize>) -> String {
    let app = axum::Router::new().route(
        "/jwks",
        axum::routing::get(move || {
            let keys = Arc::clone(&keys);
            let fetches = Arc::clone(&fetches);
            async move {
                fetches.fetch_add(1, Ordering::SeqCst);
                let keys = keys.lock().map(|k| k.clone()).unwrap_or_default();
                axum::Json(json!({ "keys": keys }))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/jwks")
}

/// The provider of these tests, as `[api.oidc]` would declare it.
fn config(jwks_url: String) -> OidcConfig {
    toml::from_str(&format!(
        "issuer = \"https://idp.example\"\naudience = \"rollgate\"\njwks_url = \"{jwks_url}\"\n"
    ))
    .expect("config")
}

async fn call(app: &axum::Router, path: &str, bearer: &str) -> (u16, Value) {
    let (method, body) = if path.ends_with("/pause") || path.ends_with("/resume") {
        ("POST", Some(json!({})))
    } else {
        ("GET", None)
    };
    common::call(app, (method, path), Some(bearer), None, body).await
}

#[tokio::test]
async fn oidc_tokens_are_verified_against_the_providers_keys() {
    let (k1, jwk1) = key("k1");
    let (k2, jwk2) = key("k2");
    let (stranger, _) = key("k1");
    let keys = Arc::new(std::sync::Mutex::new(vec![jwk1]));
    let fetches = Arc::new(AtomicUsize::new(0));
    let url = jwks(Arc::clone(&keys), Arc::clone(&fetches)).await;
    let oidc = Oidc::new(config(url)).expect("oidc");

    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqlStore::open_dir(dir.path()).expect("store");
    common::model_in_rollout(&store);
    let mut state = common::api_state(Arc::new(store), Timestamp(0));
    state.require_token = true;
    state.oidc = Some(Arc::new(oidc));
    let app = router(state);
    let claims = |role: &str| {
        json!({ "iss": "https://idp.example", "aud": "rollgate", "sub": "alice@example.com",
                "rollgate_role": role, "exp": now_s() + 3600 })
    };

    // An operator pauses, and is the actor.
    let (s, v) = call(
        &app,
        "/api/v1/rollouts/1/pause",
        &token(&k1, "k1", claims("operator")),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    // The actor of rollout 1's first audit record of `kind`, read by a viewer.
    let actor_of = |kind: &'static str| {
        let (app, viewer) = (app.clone(), token(&k1, "k1", claims("viewer")));
        async move {
            let (_, audit) = call(&app, "/api/v1/audit?rollout=1", &viewer).await;
            audit
                .as_array()
                .and_then(|a| a.iter().find(|r| r["kind"] == kind))
                .map(|r| r["actor"].clone())
                .unwrap_or_else(|| panic!("no {kind} record"))
        }
    };
    assert_eq!(
        actor_of("paused").await,
        "oidc:https://idp.example:alice@example.com"
    );
    // A viewer reads but may not pause.
    let (s, v) = call(
        &app,
        "/api/v1/rollouts/1/pause",
        &token(&k1, "k1", claims("viewer")),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (403, Some("forbidden_role"))
    );

    // Refused: wrong audience, wrong issuer, expired, another key, no role.
    let mut wrong_aud = claims("admin");
    wrong_aud["aud"] = json!("someone-else");
    let mut wrong_iss = claims("admin");
    wrong_iss["iss"] = json!("https://evil.example");
    let mut expired = claims("admin");
    expired["exp"] = json!(now_s() - 3600);
    let mut no_role = claims("admin");
    no_role
        .as_object_mut()
        .expect("object")
        .remove("rollgate_role");
    // Valid until the year 9999, or from tomorrow: refused.
    let mut for_ever = claims("admin");
    for_ever["exp"] = json!(253_402_300_799u64);
    let mut not_yet = claims("admin");
    not_yet["nbf"] = json!(now_s() + 24 * 3600);
    for (what, t) in [
        ("audience", token(&k1, "k1", wrong_aud)),
        ("issuer", token(&k1, "k1", wrong_iss)),
        ("expired", token(&k1, "k1", expired)),
        ("exp in 9999", token(&k1, "k1", for_ever)),
        ("nbf tomorrow", token(&k1, "k1", not_yet)),
        ("another key", token(&stranger, "k1", claims("admin"))),
        ("no role", token(&k1, "k1", no_role)),
        ("not a JWT", "a.b.c".to_string()),
    ] {
        let (s, v) = call(&app, "/api/v1/models", &t).await;
        assert_eq!(s, 401, "{what}: {v}");
    }

    // The provider rotates to k2: a token naming it fetches the set again.
    let before = fetches.load(Ordering::SeqCst);
    keys.lock().expect("keys").push(jwk2);
    tokio::time::pause();
    tokio::time::advance(rollgate_controller::oidc::REFETCH_AFTER + Duration::from_secs(1)).await;
    tokio::time::resume();
    let (s, v) = call(&app, "/api/v1/models", &token(&k2, "k2", claims("viewer"))).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(fetches.load(Ordering::SeqCst), before + 1);
    // Made-up key ids do not make it fetch again within the interval.
    for i in 0..5 {
        let (s, _) = call(
            &app,
            "/api/v1/models",
            &token(&k2, &format!("x{i}"), claims("viewer")),
        )
        .await;
        assert_eq!(s, 401);
    }
    assert_eq!(fetches.load(Ordering::SeqCst), before + 1);

    // A token whose subject is one of rollgate's own actors is recorded
    // under the provider's name, never as that actor.
    let mut controller = claims("operator");
    controller["sub"] = json!("controller");
    let (s, v) = call(
        &app,
        "/api/v1/rollouts/1/resume",
        &token(&k1, "k1", controller),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        actor_of("resumed").await,
        "oidc:https://idp.example:controller"
    );

    // An OIDC admin is not the host: a spec that names a command or a
    // token file directly is refused, saying where to declare it.
    let admin = token(&k1, "k1", claims("admin"));
    for spec in [
        json!({ "prometheus": { "url": "http://127.0.0.1:9" }, "data_plane": {
            "kind": "nginx", "include_file": "/tmp/pwned.conf",
            "reload_command": ["/bin/sh", "-c", "id"], "confirm_url": "http://127.0.0.1:9/v" } }),
        json!({ "prometheus": { "url": "http://127.0.0.1:9",
            "bearer_token_file": "/etc/shadow" } }),
    ] {
        let (s, v) = common::call(
            &app,
            ("POST", "/api/v1/models"),
            Some(&admin),
            None,
            Some(json!({ "name": "evil", "spec": spec })),
        )
        .await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (422, Some("invalid")),
            "{v}"
        );
        let message = v["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains("controller's config"), "{message}");
    }
}

/// While the provider's key endpoint hangs (a fetch for a token naming an
/// unknown key holds it), a token whose key is known is verified without
/// waiting for that fetch: it is answered while the fetch is still open.
#[tokio::test]
async fn a_hanging_key_endpoint_delays_no_token_with_a_known_key() {
    let (k1, jwk1) = key("k1");
    let hang = Arc::new(tokio::sync::Notify::new());
    let asked = Arc::new(AtomicUsize::new(0));
    let app = {
        let (hang, asked) = (Arc::clone(&hang), Arc::clone(&asked));
        axum::Router::new().route(
            "/jwks",
            axum::routing::get(move || {
                let (hang, asked, jwk1) = (Arc::clone(&hang), Arc::clone(&asked), jwk1.clone());
                async move {
                    // The first fetch answers; later ones hang until released.
                    if asked.fetch_add(1, Ordering::SeqCst) > 0 {
                        hang.notified().await;
                    }
                    axum::Json(json!({ "keys": [jwk1] }))
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/jwks", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let oidc = Arc::new(Oidc::new(config(url)).expect("oidc"));
    let claims = json!({ "iss": "https://idp.example", "aud": "rollgate", "sub": "bob",
                         "rollgate_role": "viewer", "exp": now_s() + 3600 });
    let known = token(&k1, "k1", claims.clone());
    oidc.identity(&known).await.expect("first fetch");

    // Past the refetch interval, a token naming an unknown key fetches
    // again, and the endpoint hangs.
    tokio::time::pause();
    tokio::time::advance(rollgate_controller::oidc::REFETCH_AFTER + Duration::from_secs(1)).await;
    tokio::time::resume();
    let fetching = {
        let (oidc, unknown) = (Arc::clone(&oidc), token(&k1, "k9", claims));
        tokio::spawn(async move { oidc.identity(&unknown).await })
    };
    for _ in 0..500 {
        if asked.load(Ordering::SeqCst) >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(asked.load(Ordering::SeqCst), 2, "the second fetch started");
    let who = tokio::time::timeout(Duration::from_secs(30), oidc.identity(&known))
        .await
        .expect("bounded")
        .expect("verified");
    assert_eq!(who.0, "oidc:https://idp.example:bob");
    assert!(
        !fetching.is_finished(),
        "the known key was used while the fetch was still open"
    );
    hang.notify_waiters();
    let _ = fetching.await;
}
