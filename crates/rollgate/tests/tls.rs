//! A rollout end to end over TLS and HTTP/2, with real processes on
//! 127.0.0.1 and certificates from a team's own CA (made here): model
//! servers at `https://` URLs (`rollgate serve --tls-cert`), a gateway
//! listening on TLS that clients reach by h2 (ALPN), and the admin API on
//! TLS requiring client certificates (mTLS) that the CLI reaches with
//! `--api https://… --ca-cert … --client-cert … --client-key …`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rollgate_net::ClientTls;
use rollgate_net::testing::Ca;

use crate::common::{Proc, spawn, write};

/// What the CLI trusts and presents.
#[derive(Clone, Default)]
struct Trust {
    ca: Option<PathBuf>,
    cert: Option<(PathBuf, PathBuf)>,
}

/// `rollgate ARGS` with the API at `api`: `(exit code, stdout, stderr)`.
fn cli(api: &str, trust: &Trust, args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rollgate"));
    cmd.args(args).env("ROLLGATE_API", api);
    for var in [
        "ROLLGATE_CA_CERT",
        "ROLLGATE_CLIENT_CERT",
        "ROLLGATE_CLIENT_KEY",
    ] {
        cmd.env_remove(var);
    }
    if let Some(ca) = &trust.ca {
        cmd.env("ROLLGATE_CA_CERT", ca);
    }
    if let Some((cert, key)) = &trust.cert {
        cmd.env("ROLLGATE_CLIENT_CERT", cert)
            .env("ROLLGATE_CLIENT_KEY", key);
    }
    let out = cmd.output().expect("run rollgate");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn port(p: &Proc, i: usize) -> &str {
    p.addrs[i].rsplit(':').next().expect("port")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_runs_end_to_end_over_tls_and_http2() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let ca = Ca::new("team CA");
    let ca_file = ca.write(d, "ca.pem");
    let (model_cert, model_key) = ca.issue(&["localhost"]).write(d, "model");
    // The controller reads the gateway's stats at the address it listens
    // on (no --advertise here): its certificate names that address too.
    let (gw_cert, gw_key) = ca.issue(&["localhost", "127.0.0.1"]).write(d, "gateway");
    let (api_cert, api_key) = ca.issue(&["localhost"]).write(d, "api");
    let operators = Ca::new("operators");
    let operators_file = operators.write(d, "operators.pem");
    let olga = operators.issue(&["olga"]).write(d, "olga");
    let s = |p: &Path| p.to_string_lossy().into_owned();

    let models = d.join("models");
    let trained = Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args(["train", "--out", &s(&models)])
        .output()
        .expect("train");
    assert!(trained.status.success());
    let model_file = s(&models.join("champion.json"));
    let serve = || {
        spawn(
            &[
                "serve",
                "--model",
                &model_file,
                "--name",
                "m",
                "--listen",
                "127.0.0.1:0",
                "--tls-cert",
                &s(&model_cert),
                "--tls-key",
                &s(&model_key),
            ],
            &[],
        )
    };
    let (champion, candidate) = (serve(), serve());

    let config = write(
        d,
        "up.toml",
        &format!(
            r#"
[api]
listen = "127.0.0.1:0"
[api.tls]
cert_file = "{api_cert}"
key_file = "{api_key}"
client_ca_file = "{operators}"
[controller]
tick = "200ms"
[gateway]
listen = "127.0.0.1:0"
[gateway.tls]
cert_file = "{gw_cert}"
key_file = "{gw_key}"
[gateway.upstream_tls]
ca_file = "{ca}"
"#,
            api_cert = s(&api_cert),
            api_key = s(&api_key),
            operators = s(&operators_file),
            gw_cert = s(&gw_cert),
            gw_key = s(&gw_key),
            ca = s(&ca_file),
        ),
    );
    let up = spawn(
        &["up", "--data", &s(&d.join("data")), "--config", &config],
        &[],
    );
    let gateway = format!("https://localhost:{}", port(&up, 0));
    let api = format!("https://localhost:{}", port(&up, 1));

    // Without the team's CA the CLI refuses the API's certificate; without
    // a client certificate the API refuses the CLI; a CA file that is not
    // one is the user's input error.
    let (code, _, err) = cli(&api, &Trust::default(), &["model", "list"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("UnknownIssuer"), "{err}");
    let anonymous = Trust {
        ca: Some(ca_file.clone()),
        cert: None,
    };
    let (code, _, err) = cli(&api, &anonymous, &["model", "list"]);
    assert_eq!(code, Some(1), "{err}");
    let junk = Trust {
        ca: Some(PathBuf::from(write(d, "junk.pem", "not a certificate"))),
        cert: None,
    };
    let (code, _, err) = cli(&api, &junk, &["model", "list"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("junk.pem"), "{err}");

    let trust = Trust {
        ca: Some(ca_file.clone()),
        cert: Some(olga),
    };
    let ok = |args: &[&str]| {
        let (code, out, err) = cli(&api, &trust, args);
        assert_eq!(code, Some(0), "{args:?}: {out}\n{err}");
        out
    };
    ok(&["model", "add", "m"]);
    let champ = ok(&[
        "revision",
        "add",
        "m",
        "--upstream",
        &format!("https://localhost:{}", port(&champion, 0)),
    ]);
    let cand = ok(&[
        "revision",
        "add",
        "m",
        "--upstream",
        &format!("https://localhost:{}", port(&candidate, 0)),
    ]);
    ok(&["champion", "set", "m", &champ, "--reason", "first"]);
    let plan = write(
        d,
        "plan.toml",
        r#"
steps = [20, 50]
min_stage_duration = "1s"
evidence_timeout = "20s"
readiness_timeout = "10s"
[gates.error_rate]
min_requests = 20
margin = 0.05
[gates.latency]
min_requests = 20
[gates.shadow]
min_pairs = 30
"#,
    );
    let started = ok(&["rollout", "start", "m", &cand, "--plan", &plan]);
    let id = started
        .split_whitespace()
        .nth(1)
        .expect("rollout N started")
        .to_string();

    // Clients reach the gateway by h2 over TLS.
    let connector = rollgate_net::connector(
        HttpConnector::new(),
        &ClientTls {
            ca_file: Some(ca_file.clone()),
            ..ClientTls::default()
        },
    )
    .expect("connector");
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let (stop, sent) = (
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
        std::sync::Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<
            String,
            u64,
        >::new())),
    );
    let traffic = {
        let (stop, sent, url) = (
            stop.clone(),
            sent.clone(),
            format!("{gateway}/v1/models/m:predict"),
        );
        tokio::spawn(async move {
            let started = Instant::now();
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst)
                && started.elapsed() < Duration::from_secs(120)
            {
                let req = Request::post(&url)
                    .header("content-type", "application/json")
                    .header("x-rollgate-key", format!("user-{}", n % 500))
                    .body(Full::new(Bytes::from_static(
                        br#"{"instances":[[0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0,1.1,1.2]]}"#,
                    )))
                    .expect("request");
                let key =
                    match tokio::time::timeout(Duration::from_secs(5), client.request(req)).await {
                        Ok(Ok(r)) => {
                            let key = format!(
                                "{:?} {} {}",
                                r.version(),
                                r.status().as_u16(),
                                r.headers()
                                    .get("x-rollgate-revision")
                                    .and_then(|v| v.to_str().ok())
                                    .unwrap_or("none")
                            );
                            let _ = r.into_body().collect().await;
                            key
                        }
                        _ => "no answer".to_string(),
                    };
                *sent.lock().expect("lock").entry(key).or_insert(0) += 1;
                n += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let (code, out, err) = tokio::task::spawn_blocking({
        let (api, trust, id) = (api.clone(), trust.clone(), id.clone());
        move || cli(&api, &trust, &["rollout", "wait", &id, "--timeout", "100s"])
    })
    .await
    .expect("join");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = traffic.await;
    let sent = sent.lock().expect("lock").clone();
    assert_eq!(
        code,
        Some(0),
        "not promoted: {out}\n{err}\ntraffic: {sent:?}"
    );
    // Every answer came over HTTP/2, from one of the two https revisions.
    let by_revision = |rev: &str| {
        sent.get(&format!("{:?} 200 {rev}", Version::HTTP_2))
            .copied()
            .unwrap_or(0)
    };
    let (to_champ, to_cand) = (by_revision(&champ), by_revision(&cand));
    assert!(to_champ > 0 && to_cand > 0, "{sent:?}");
    assert_eq!(to_champ + to_cand, sent.values().sum::<u64>(), "{sent:?}");
    let status = ok(&["rollout", "status", &id]);
    assert!(status.contains("PROMOTED"), "{status}");
}
