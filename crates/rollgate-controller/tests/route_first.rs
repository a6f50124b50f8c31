//! On a rollback or an abort, the in-process gateway of `rollgate up`
//! (`Context::local_gateway`) is told champion-only routing before the
//! transition commits: the safe direction, so a commit that fails can only
//! have reduced the candidate's exposure. Each push is recorded with the
//! rollout as the store held it at that instant.

use crate::common;
use std::sync::{Arc, Mutex};

use rollgate_controller::{RoutePush, reconcile, router};
use rollgate_core::{Input, Observation, Plan, Timestamp, step};
use rollgate_store::{ModelRoutes, SqlStore, Store, TransitionWrite};
use serde_json::json;

const CREATED: Timestamp = Timestamp(1_767_225_600_000);

/// One push to the in-process gateway: the candidate's live and mirrored
/// shares it was given, and the rollout's phase committed at that instant.
#[derive(Debug, PartialEq)]
struct Push {
    candidate_bp: u32,
    mirror_bp: u32,
    committed: &'static str,
}

/// An in-process gateway that notes every push it gets.
struct Recorder {
    store: Arc<dyn Store>,
    rollout: i64,
    pushes: Mutex<Vec<Push>>,
}

impl RoutePush for Recorder {
    fn push_model(&self, _model: &str, routes: Option<&ModelRoutes>) {
        let (candidate_bp, mirror_bp) = routes
            .and_then(|r| r.rollout.as_ref())
            .map_or((0, 0), |(_, routing, _)| {
                (routing.candidate_weight_bp, routing.mirror_bp)
            });
        let committed = self
            .store
            .rollout(self.rollout)
            .expect("rollout")
            .state
            .phase
            .name();
        self.pushes.lock().expect("lock").push(Push {
            candidate_bp,
            mirror_bp,
            committed,
        });
    }
}

/// Model `m` with a champion, and a rollout of a candidate (on a port
/// nothing listens on) at its first canary step, committed as the
/// controller would: the store and the rollout's id.
fn canary() -> (tempfile::TempDir, Arc<dyn Store>, i64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> = Arc::new(
        SqlStore::open_dir(dir.path())
            .expect("store")
            .with_clock(|| CREATED),
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr");
    let mut plan = Plan::default();
    plan.shadow.enabled = false;
    let r = common::model_in_rollout_with(&*store, &format!("http://{closed}"), &plan);
    let ready = Observation {
        routing_applied: None,
        candidate_ready: true,
        exposure: None,
        labels: None,
    };
    let t = step(&r.spec, &r.state, Input::Observe(ready), CREATED).expect("observe");
    store
        .apply(TransitionWrite {
            rollout: r.id,
            expected_version: r.version,
            state: &t.state,
            effects: &t.effects,
            actor: "controller",
            fence: None,
        })
        .expect("enter the canary");
    let routes = store.model_routes("m").expect("routes").expect("routed");
    let (_, routing, _) = routes.rollout.expect("a rollout");
    assert_eq!(
        store.rollout(r.id).expect("rollout").state.phase.name(),
        "CANARY"
    );
    assert!(routing.candidate_weight_bp > 0, "{routing:?}");
    (dir, store, r.id)
}

fn recorder(store: &Arc<dyn Store>, rollout: i64) -> Arc<Recorder> {
    Arc::new(Recorder {
        store: Arc::clone(store),
        rollout,
        pushes: Mutex::new(Vec::new()),
    })
}

/// Champion-only routing pushed while the store still held `before`, then
/// the store's routing once `after` was committed.
fn champion_first(before: &'static str, after: &'static str) -> Vec<Push> {
    let champion_only = |committed| Push {
        candidate_bp: 0,
        mirror_bp: 0,
        committed,
    };
    vec![champion_only(before), champion_only(after)]
}

#[tokio::test]
async fn an_abort_routes_the_in_process_gateway_to_the_champion_before_it_commits() {
    let (_dir, store, id) = canary();
    let gateway = recorder(&store, id);
    let mut state = common::api_state(Arc::clone(&store), CREATED);
    state.ctx.local_gateway = Some(gateway.clone());
    let (status, body) = common::call(
        &router(state),
        ("POST", &format!("/api/v1/rollouts/{id}/abort")),
        None,
        Some("carol"),
        Some(json!({ "reason": "wrong artifact" })),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        *gateway.pushes.lock().expect("lock"),
        champion_first("CANARY", "ABORTED")
    );
}

#[tokio::test]
async fn a_rollback_routes_the_in_process_gateway_to_the_champion_before_it_commits() {
    let (_dir, store, id) = canary();
    let gateway = recorder(&store, id);
    // A day on, no gateway has reported: the stage fails safe.
    let mut ctx = common::context(Arc::clone(&store), Timestamp(CREATED.0 + 86_400_000));
    ctx.local_gateway = Some(gateway.clone());
    let _next = reconcile(id, &ctx).await.expect("pass");
    assert_eq!(
        store.rollout(id).expect("rollout").state.phase.name(),
        "ROLLED_BACK"
    );
    assert_eq!(
        *gateway.pushes.lock().expect("lock"),
        champion_first("CANARY", "ROLLED_BACK")
    );
}
