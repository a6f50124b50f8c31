//! The store over TLS to a real PostgreSQL (`tests/postgres/start.sh`
//! turns `ssl` on with a throwaway CA whose server certificate names only
//! 127.0.0.1, and a client certificate for role `rollgate_cert`): each
//! `sslmode` does what libpq's does, and the connection is encrypted when
//! it says so (the server's own `pg_stat_ssl`).

use std::path::PathBuf;

use rollgate_store::{ModelSpec, SqlStore, Store, StoreError};

use crate::it::postgres_server;

/// The test server's URL, its CA, and a scratch database's URL.
fn setup(name: &str) -> Option<(String, PathBuf, String)> {
    let server = postgres_server()?;
    let ca = match std::env::var("ROLLGATE_POSTGRES_CA") {
        Ok(ca) => PathBuf::from(ca),
        Err(_) if std::env::var_os("CI").is_some() => {
            panic!("ROLLGATE_POSTGRES_CA is not set: tests/postgres/start.sh prints it")
        }
        Err(_) => {
            eprintln!("-- postgres TLS skipped: ROLLGATE_POSTGRES_CA is unset");
            return None;
        }
    };
    let url = rollgate_store::scratch_database(&server, name).expect("scratch database");
    Some((server, ca, url))
}

/// Whether the sessions named `app` are encrypted, by the server's account.
fn encrypted(server: &str, app: &str) -> Vec<bool> {
    let mut c = postgres::Client::connect(server, postgres::NoTls).expect("admin");
    c.query(
        "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.application_name = $1",
        &[&app],
    )
    .expect("pg_stat_ssl")
    .iter()
    .map(|r| r.get(0))
    .collect()
}

fn with(url: &str, params: &str) -> String {
    format!("{url}?{params}")
}

/// A store that works: it writes and reads back.
fn works(store: &SqlStore, model: &str) {
    store
        .create_model(model, &ModelSpec::default(), "t")
        .expect("write over TLS");
    assert!(
        store
            .models()
            .expect("read")
            .iter()
            .any(|m| m.name == model)
    );
}

#[test]
fn each_sslmode_does_what_libpq_does_against_a_real_server() {
    let Some((server, ca, url)) = setup(&format!("rg_tls_{}", std::process::id())) else {
        return;
    };
    let ca = ca.to_string_lossy().into_owned();
    let localhost = url.replacen("127.0.0.1", "localhost", 1);
    // verify-full: the chain and the name (the certificate names 127.0.0.1).
    let store = SqlStore::connect(&with(
        &url,
        &format!("sslmode=verify-full&sslrootcert={ca}&application_name=rg_full"),
    ))
    .expect("verify-full to the name in the certificate");
    works(&store, "full");
    let ssl = encrypted(&server, "rg_full");
    assert!(!ssl.is_empty() && ssl.iter().all(|s| *s), "{ssl:?}");
    let Err(e) = SqlStore::connect(&with(
        &localhost,
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    )) else {
        panic!("verify-full to a name the certificate does not hold connected");
    };
    assert!(e.to_string().contains("cannot reach PostgreSQL"), "{e}");
    // verify-ca: the chain only.
    let store = SqlStore::connect(&with(
        &localhost,
        &format!("sslmode=verify-ca&sslrootcert={ca}&application_name=rg_ca"),
    ))
    .expect("verify-ca ignores the name");
    works(&store, "ca");
    assert!(encrypted(&server, "rg_ca").iter().all(|s| *s));
    // A CA that did not sign the server's certificate: refused.
    let dir = tempfile::tempdir().expect("tempdir");
    let other = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).expect("cert");
    let other_ca = dir.path().join("other-ca.pem");
    std::fs::write(&other_ca, other.cert.pem()).expect("write");
    for mode in ["verify-ca", "verify-full", "require"] {
        let e = SqlStore::connect(&with(
            &url,
            &format!("sslmode={mode}&sslrootcert={}", other_ca.display()),
        ))
        .err()
        .unwrap_or_else(|| panic!("{mode} with another CA connected"));
        assert!(
            e.to_string().contains("cannot reach PostgreSQL"),
            "{mode}: {e}"
        );
    }
    // require without a CA: encrypted, the server not authenticated.
    let store =
        SqlStore::connect(&with(&url, "sslmode=require&application_name=rg_req")).expect("require");
    works(&store, "req");
    assert!(encrypted(&server, "rg_req").iter().all(|s| *s));
    // The default (prefer) encrypts when the server offers TLS.
    let store = SqlStore::connect(&with(&url, "application_name=rg_prefer")).expect("prefer");
    works(&store, "prefer");
    assert!(encrypted(&server, "rg_prefer").iter().all(|s| *s));
    // disable, only where named: plain.
    let store = SqlStore::connect(&with(&url, "sslmode=disable&application_name=rg_plain"))
        .expect("disable");
    works(&store, "plain");
    let plain = encrypted(&server, "rg_plain");
    assert!(!plain.is_empty() && plain.iter().all(|s| !*s), "{plain:?}");
    // A client certificate: role rollgate_cert may log in only with it.
    let tls = std::path::Path::new(&ca).parent().expect("tls dir");
    let as_cert = url.replacen("rollgate@", "rollgate_cert@", 1);
    let store = SqlStore::connect(&with(
        &as_cert,
        &format!(
            "sslmode=verify-full&sslrootcert={ca}&sslcert={}&sslkey={}",
            tls.join("client.crt").display(),
            tls.join("client.key").display()
        ),
    ))
    .expect("logged in with the client certificate");
    works(&store, "cert");
    let Err(e) = SqlStore::connect(&with(
        &as_cert,
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    )) else {
        panic!("rollgate_cert logged in without its certificate");
    };
    assert!(e.to_string().contains("cannot reach PostgreSQL"), "{e}");
    // Settings that cannot work are refused before connecting.
    for bad in ["sslmode=verify-full", "sslmode=sometimes", "sslcert=/x.pem"] {
        assert!(
            matches!(
                SqlStore::connect(&with(&url, bad)),
                Err(StoreError::Invalid(_))
            ),
            "{bad}"
        );
    }
}
