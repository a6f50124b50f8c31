//! The controller's retention pass: evaluation bodies past `keep` are
//! pruned, decisions are not, the chain verifies, and the pass runs at most
//! once per `PRUNE_EVERY`.

use crate::common;
use std::sync::Arc;
use std::time::Duration;

use rollgate_controller::{PRUNE_EVERY, Retention, prune};
use rollgate_core::{AuditKind, Timestamp};
use rollgate_store::{AuditFilter, SqlStore, Store};

fn evaluated(store: &dyn Store, id: i64) {
    common::record(store, id, AuditKind::Evaluated);
}

#[tokio::test(start_paused = true)]
async fn retention_prunes_old_evaluations_at_most_once_a_minute() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> = Arc::new(SqlStore::open_dir(dir.path()).expect("store"));
    let id = common::model_in_rollout(store.as_ref());
    evaluated(store.as_ref(), id);
    // The controller's clock is a day past every record; keep an hour.
    let newest = store
        .audit(&AuditFilter::default())
        .expect("audit")
        .iter()
        .map(|r| r.at.0)
        .max()
        .unwrap_or(0);
    let day_later = newest + 86_400_000;
    let mut ctx = common::context(Arc::clone(&store), Timestamp(day_later));
    ctx.retention = Some(Arc::new(Retention::new(Duration::from_secs(3600))));
    let pruned = |s: &dyn Store| {
        s.audit(&AuditFilter::default())
            .expect("audit")
            .iter()
            .filter(|r| r.pruned)
            .map(|r| r.kind.clone())
            .collect::<Vec<_>>()
    };
    prune(&ctx).await;
    assert_eq!(pruned(store.as_ref()), ["evaluated"]);
    // Another old evaluation: not pruned until a minute has passed.
    evaluated(store.as_ref(), id);
    prune(&ctx).await;
    assert_eq!(pruned(store.as_ref()).len(), 1);
    tokio::time::advance(PRUNE_EVERY).await;
    prune(&ctx).await;
    assert_eq!(pruned(store.as_ref()), ["evaluated", "evaluated"]);
    assert!(store.verify_audit().expect("verify").is_intact());
}
