//! A model spec the gateway cannot route — written by an older version,
//! before specs were validated as they are now — isolates that model only:
//! the store follower still loads every other model, also after a restart.

use rollgate_controller::follow::sync_once;
use rollgate_gateway::{Gateway, GatewayConfig};
use rollgate_store::{ModelSpec, RevisionSpec, SqliteStore, Store};

#[tokio::test]
async fn a_bad_spec_from_an_older_version_isolates_one_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = SqliteStore::open_dir(dir.path()).expect("store");
        for name in ["good", "legacy"] {
            store
                .create_model(name, &ModelSpec::default(), "t")
                .expect("model");
            let rev = store
                .register_revision(
                    name,
                    &RevisionSpec {
                        upstream: "http://127.0.0.1:9".into(),
                        ..RevisionSpec::default()
                    },
                    "t",
                )
                .expect("revision");
            store
                .set_champion(name, &rev.id, "t", "first")
                .expect("champion");
        }
    }
    // What an older version let through: a pointer without its '/'.
    let db = rusqlite::Connection::open(dir.path().join("rollgate.db")).expect("db");
    db.execute(
        "UPDATE models SET spec = '{\"protocol\":\"kserve_v1\",\"key_field\":\"user\"}' WHERE name = 'legacy'",
        [],
    )
    .expect("update");
    drop(db);

    // A gateway following the store, as after a restart.
    let store = SqliteStore::open_dir(dir.path()).expect("reopen");
    let gateway = Gateway::new(&GatewayConfig::default()).expect("gateway");
    sync_once(&store, &gateway).expect("the follower loads the store");
    let s = gateway.snapshot();
    assert_eq!(s.unroutable.keys().collect::<Vec<_>>(), ["legacy"]);
    assert!(s.unroutable["legacy"].contains("key_field"), "{s:?}");
    // Fixing the spec through the store routes the model again.
    store
        .update_model("legacy", &ModelSpec::default(), "t")
        .expect("a fixed spec");
    sync_once(&store, &gateway).expect("sync");
    assert!(gateway.snapshot().unroutable.is_empty());
}
