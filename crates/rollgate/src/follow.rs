//! Gateways follow the store: every interval a gateway reads the routing of
//! every model from the store, applies it atomically, heartbeats so the
//! controller knows whose stats to merge, and hands the store the answers
//! it recorded for labels (users' data: never served over HTTP). It lives where gateways are
//! assembled: the gateway crate knows no store, and the controller no
//! gateway (they meet in the store and the core's types).

use std::sync::Arc;
use std::time::Duration;

use rollgate_controller::RoutePush;
use rollgate_core::Timestamp;
use rollgate_core::epoch_label;
use rollgate_core::labels::AnswerRecord;
use rollgate_gateway::{Gateway, MirroredUpstream, ModelRoute, Upstream, WeightedUpstream};
use rollgate_store::{AnswerRow, ModelRoutes, Revision, Store};

fn upstream(r: &Revision) -> Upstream {
    Upstream {
        revision: r.id.clone(),
        url: r.spec.upstream.clone(),
        timeout: r.spec.timeout_ms.map(Duration::from_millis),
        served_name: r.spec.served_name.clone(),
        headers: r.spec.headers.clone(),
        grpc_url: r.spec.grpc_upstream.clone(),
    }
}

/// The in-process gateway, as the controller's route push: routing reaches
/// it at once, before or after a commit, instead of at its next poll.
#[derive(Clone)]
pub struct PushToGateway(pub Gateway, pub Withheld);

/// Models whose candidate the follower keeps out of live traffic (the
/// store unconfirmed, or the controller not yet back on this gateway's
/// counts): a push from the in-process controller honours it too.
pub type Withheld = Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>;

impl RoutePush for PushToGateway {
    fn push_model(&self, model: &str, routes: Option<&ModelRoutes>) {
        let mut route = routes.and_then(|r| gateway_routes(std::slice::from_ref(r)).pop());
        let withheld = self.1.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = route.as_mut()
            && withheld.contains(model)
        {
            r.candidate = None;
            r.pinning = false;
        }
        self.0.set_model_route(model, route.as_ref());
    }
}

/// The gateway routes implied by the store. Models without a champion are
/// not routed (they have nothing to serve yet).
pub fn gateway_routes(routes: &[ModelRoutes]) -> Vec<ModelRoute> {
    routes
        .iter()
        .filter_map(|m| {
            let champion = m.champion.as_ref()?;
            let spec = &m.model.spec;
            let (candidate, shadow) = match &m.rollout {
                Some((cand, routing, _)) => (
                    (routing.candidate_weight_bp > 0).then(|| WeightedUpstream {
                        upstream: upstream(cand),
                        weight_bp: routing.candidate_weight_bp.min(10_000),
                    }),
                    (routing.mirror_bp > 0).then(|| MirroredUpstream {
                        upstream: upstream(cand),
                        mirror_bp: routing.mirror_bp.min(10_000),
                    }),
                ),
                None => (None, None),
            };
            Some(ModelRoute {
                name: m.model.name.clone(),
                protocol: spec.protocol,
                json_path: spec.json_path.clone(),
                key_field: spec.key_field.clone(),
                salt: None,
                assignment: m
                    .rollout
                    .as_ref()
                    .map_or(Default::default(), |(_, routing, _)| routing.assignment),
                output_pointer: spec.output_pointer.clone(),
                output: spec.output.clone(),
                confidence_threshold: spec.confidence_threshold.unwrap_or(0.9),
                numeric_tolerance: 1e-6,
                fallback_to_champion: m
                    .rollout
                    .as_ref()
                    .is_some_and(|(_, routing, _)| routing.fallback_to_champion),
                champion: upstream(champion),
                candidate,
                shadow,
                epoch: m
                    .rollout
                    .as_ref()
                    .map(|(_, routing, id)| epoch_label(*id, routing.epoch)),
                // Another data plane splits the live traffic: the gateway
                // only measures a shadow, on copies of its requests (and
                // routes no candidate: `ModelRoute::mirror_only`).
                mirror_only: spec.data_plane.is_some(),
                pinning: spec.pinning.unwrap_or(false) && !m.watching,
                record_answers: m.record_answers,
            })
        })
        .collect()
}

/// Loads the store's routing into `gateway` once. A model the gateway
/// cannot route is isolated (answered 404 with its reason, logged once),
/// never blocking the others.
pub fn sync_once(store: &dyn Store, gateway: &Gateway) -> Result<(), rollgate_store::StoreError> {
    let routes = store.routes()?;
    gateway.set_routes(&gateway_routes(&routes));
    Ok(())
}

/// A gateway that cannot confirm with the store (read its routes *and*
/// write its heartbeat) for this long takes every candidate out of live
/// traffic: the controller cannot see its stats, so no canary on it is
/// being watched, and a candidate that dies then would keep its share.
pub const UNCONFIRMED_AFTER: Duration = Duration::from_secs(5);

/// A store call that has not returned after this long counts as a cycle
/// that did not confirm.
pub const STALLED_AFTER: Duration = Duration::from_secs(1);

/// Consecutive confirmed cycles before the store counts as back. A held
/// candidate gets its share back only after that *and* once the controller
/// has committed a look at its rollout that read this gateway's counts
/// after the store came back: a rollback those counts call for is in force
/// before the candidate could be exposed again, never after a burst of
/// stale routing.
pub const RESUME_AFTER: u32 = 3;

/// What one cycle read of the routes.
#[derive(Debug, Clone)]
pub enum Read {
    /// The routes, read because their version moved (or to resync).
    Routes(Vec<ModelRoutes>),
    /// The version did not move: the routes known are current.
    Unchanged,
    /// The store could not be read.
    Failed,
}

/// Where a follower stands with the store.
#[derive(Debug, Clone)]
pub struct FollowState {
    /// The last routing read from the store.
    last: Option<Vec<ModelRoutes>>,
    /// When a cycle last confirmed (routes current and heartbeat written).
    confirmed_at: tokio::time::Instant,
    /// Consecutive confirmed cycles.
    streak: u32,
    /// Candidates are out of live traffic until the store confirms again.
    pub held: bool,
    /// Models whose candidate stays out after the store confirms again,
    /// until the controller commits a look at their rollout that read this
    /// gateway's counts after the store came back: each with the last such
    /// look as the first read after the hold found it (`None` until that
    /// read: the routes known at the hold may be older than the looks).
    waiting: std::collections::BTreeMap<String, Option<Option<Timestamp>>>,
    /// This gateway's series in a rollout's evidence (`<id>/<boot>`).
    series: String,
    /// Shared with the in-process controller's pushes.
    pub withheld: Withheld,
}

impl FollowState {
    /// A follower of the gateway whose counts are the series `series`.
    pub fn new(now: tokio::time::Instant, series: String) -> Self {
        FollowState {
            last: None,
            confirmed_at: now,
            streak: 0,
            held: false,
            waiting: std::collections::BTreeMap::new(),
            series,
            withheld: Withheld::default(),
        }
    }

    /// Whether routes must be read at every cycle, whatever their version:
    /// models wait for their rollout's version to move, which does not
    /// move the routes' version.
    pub fn watching_rollouts(&self) -> bool {
        self.held || !self.waiting.is_empty()
    }

    /// Takes one cycle's outcome (what was read; whether the heartbeat was
    /// written) and returns the routes the gateway must now apply, if they
    /// changed: the store's, or while held the same with no candidate share
    /// (mirrors stay: they cannot hurt a user).
    pub fn step(
        &mut self,
        read: Read,
        heartbeat: bool,
        now: tokio::time::Instant,
    ) -> Option<Vec<ModelRoute>> {
        let (confirmed, mut changed) = match read {
            Read::Routes(r) => {
                for (model, base) in self.waiting.iter_mut().filter(|(_, b)| b.is_none()) {
                    *base = Some(
                        r.iter()
                            .find(|m| m.model.name == *model)
                            .and_then(|m| m.rollout_seen.get(&self.series).copied()),
                    );
                }
                self.last = Some(r);
                (heartbeat, true)
            }
            Read::Unchanged => (heartbeat && self.last.is_some(), false),
            Read::Failed => (false, false),
        };
        if confirmed {
            self.streak += 1;
            self.confirmed_at = now;
        } else {
            self.streak = 0;
        }
        if !self.held && now.duration_since(self.confirmed_at) >= UNCONFIRMED_AFTER {
            self.held = true;
            changed = true;
            self.waiting = self
                .last
                .iter()
                .flatten()
                .filter(|r| r.rollout.is_some())
                .map(|r| (r.model.name.clone(), None))
                .collect();
        } else if self.held && self.streak >= RESUME_AFTER {
            self.held = false;
            changed = true;
        }
        if !self.held && !self.waiting.is_empty() {
            // Released model by model: once the controller has committed a
            // look at its rollout that read this gateway's counts since the
            // hold (what it decided on them is then in force), or the
            // rollout ended.
            let last = self.last.as_deref().unwrap_or_default();
            let before = self.waiting.len();
            let series = &self.series;
            self.waiting.retain(|model, base| match base {
                None => true,
                Some(base) => last
                    .iter()
                    .find(|r| r.model.name == *model)
                    .is_some_and(|r| {
                        r.rollout.is_some() && r.rollout_seen.get(series).copied() <= *base
                    }),
            });
            changed |= self.waiting.len() != before;
        }
        {
            let mut withheld = self.withheld.lock().unwrap_or_else(|p| p.into_inner());
            *withheld = if self.held {
                self.last
                    .iter()
                    .flatten()
                    .map(|r| r.model.name.clone())
                    .collect()
            } else {
                self.waiting.keys().cloned().collect()
            };
        }
        if !changed {
            return None;
        }
        let mut out = gateway_routes(self.last.as_deref()?);
        for r in &mut out {
            if self.held || self.waiting.contains_key(&r.name) {
                // Held: nothing reaches the candidate live, pins neither.
                r.candidate = None;
                r.pinning = false;
            }
        }
        Some(out)
    }
}

/// Applies `routes` to `gateway`: all of them the first time (`applied`
/// unknown), after that only the models that changed, one by one.
fn apply(
    gateway: &Gateway,
    applied: &mut Option<std::collections::BTreeMap<String, ModelRoute>>,
    routes: Vec<ModelRoute>,
) {
    let next: std::collections::BTreeMap<String, ModelRoute> =
        routes.into_iter().map(|r| (r.name.clone(), r)).collect();
    match applied.as_ref() {
        None => {
            gateway.set_routes(&next.values().cloned().collect::<Vec<_>>());
        }
        Some(prev) => {
            for (name, route) in &next {
                if prev.get(name) != Some(route) {
                    gateway.set_model_route(name, Some(route));
                }
            }
            for name in prev.keys().filter(|n| !next.contains_key(*n)) {
                gateway.set_model_route(name, None);
            }
        }
    }
    *applied = Some(next);
}

/// Routes are read again at least this often even when their version has
/// not moved: a push the controller made to an in-process gateway before a
/// commit that then failed is undone within this long.
pub const RESYNC_EVERY: Duration = Duration::from_secs(10);

/// Follows the store until `shutdown` resolves: every `every`, heartbeats
/// and polls the routes' version, reading the routes only when it moved
/// (or every [`RESYNC_EVERY`]). Errors are logged and retried; the last good
/// routing stays, without candidate shares once the store has not confirmed
/// for [`UNCONFIRMED_AFTER`] (see [`FollowState`]).
pub async fn follow(
    store: Arc<dyn Store>,
    gateway: Gateway,
    id: String,
    stats_url: String,
    every: Duration,
    withheld: Withheld,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let snap = gateway.snapshot();
    let mut state = FollowState::new(
        tokio::time::Instant::now(),
        format!("{}/{}", snap.gateway, snap.boot),
    );
    state.withheld = withheld;
    let mut answers = AnswerWriter {
        store: Arc::clone(&store),
        pending: None,
    };
    let mut calls = StoreCalls::new(store, id, stats_url);
    let mut applied = None;
    loop {
        let (read, beat) = calls.cycle(state.watching_rollouts()).await;
        answers.write(&gateway).await;
        let was_held = state.held;
        if let Some(r) = state.step(read, beat, tokio::time::Instant::now()) {
            if calls.resync {
                // A full apply: whatever was pushed to this gateway besides
                // the follower is replaced by the store's routing.
                applied = None;
            }
            apply(&gateway, &mut applied, r);
        }
        log_hold_change(was_held, state.held);
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = &mut shutdown => {
                answers.flush(&gateway).await;
                return;
            }
        }
    }
}

/// What one store call of the follower answers: the routes' version with
/// the routes if they were read, and whether the heartbeat was written.
type Answer = (
    rollgate_store::Result<(u64, Option<Vec<ModelRoutes>>)>,
    rollgate_store::Result<()>,
);

/// Answers for labels written to the store per write at most.
const ANSWERS_PER_WRITE: usize = 5_000;

/// Writes the gateway's answers for labels to the store, one write at a
/// time, apart from the follower's confirming call: a slow write must
/// never make the gateway take the store for gone (and withdraw its
/// candidates). What a write could not store is queued again.
struct AnswerWriter {
    store: Arc<dyn Store>,
    pending: Option<tokio::task::JoinHandle<Vec<AnswerRecord>>>,
}

impl AnswerWriter {
    /// Collects the last write if it ended, and starts the next one.
    async fn write(&mut self, gateway: &Gateway) {
        if self.pending.as_ref().is_some_and(|h| !h.is_finished()) {
            return;
        }
        if let Some(done) = self.pending.take() {
            match done.await {
                Ok(unstored) => gateway.put_back_answers(unstored),
                Err(e) => tracing::warn!(error = %e, "an answers write failed"),
            }
        }
        let batch = gateway.take_answers(ANSWERS_PER_WRITE);
        if batch.is_empty() {
            return;
        }
        let store = Arc::clone(&self.store);
        self.pending = Some(tokio::task::spawn_blocking(move || {
            store_answers(store.as_ref(), batch)
        }));
    }

    /// On shutdown: the write under way, then what is still queued, until
    /// the queue is empty or the store refuses.
    async fn flush(&mut self, gateway: &Gateway) {
        for _ in 0..=(rollgate_gateway::answers::ANSWERS_KEPT / ANSWERS_PER_WRITE) {
            self.write(gateway).await;
            let Some(write) = self.pending.take() else {
                return;
            };
            match write.await {
                Ok(unstored) if unstored.is_empty() => {}
                Ok(unstored) => {
                    gateway.put_back_answers(unstored);
                    return;
                }
                Err(_) => return,
            }
        }
    }
}

/// An answer recorded for labels as the store keeps it; `None` when its
/// epoch names no rollout (routed outside a rollout).
fn answer_row(a: &AnswerRecord) -> Option<AnswerRow> {
    let (rollout, _) = a.epoch.split_once('.')?;
    let rollout: i64 = rollout.parse().ok()?;
    Some(AnswerRow {
        model: a.model.clone(),
        request_id: a.request_id.clone(),
        revision: a.revision.clone(),
        rollout,
        epoch: rollgate_core::epoch_of(&a.epoch, rollout)?,
        unit: a.unit,
        at: rollgate_core::Timestamp(a.at_ms),
        class: a.class.clone(),
        value: a.value,
    })
}

/// Writes `answers` to the store; those it did not take, to queue again.
fn store_answers(store: &dyn Store, answers: Vec<AnswerRecord>) -> Vec<AnswerRecord> {
    if answers.is_empty() {
        return answers;
    }
    let rows: Vec<AnswerRow> = answers.iter().filter_map(answer_row).collect();
    match store.record_answers(&rows) {
        Ok(_) => Vec::new(),
        Err(e) => {
            tracing::warn!(error = %e, answers = answers.len(), "storing answers for labels failed; they wait for the next cycle");
            answers
        }
    }
}

/// The follower's store calls. One at a time: a store that hangs (a held
/// lock, a stuck disk) is a cycle that did not confirm, not a follower that
/// stops.
struct StoreCalls {
    store: Arc<dyn Store>,
    id: String,
    stats_url: String,
    /// The routes' version as last read.
    known: Option<u64>,
    /// When the routes were last read.
    read_at: tokio::time::Instant,
    /// Whether the call made last replaces the whole table.
    resync: bool,
    /// A call that has not returned yet.
    pending: Option<tokio::task::JoinHandle<Answer>>,
}

impl StoreCalls {
    fn new(store: Arc<dyn Store>, id: String, stats_url: String) -> Self {
        StoreCalls {
            store,
            id,
            stats_url,
            known: None,
            read_at: tokio::time::Instant::now(),
            resync: true,
            pending: None,
        }
    }

    /// One cycle: heartbeats and polls the routes' version, reading the
    /// routes when it moved, a resync is due or `watching_rollouts` (or
    /// waits on the call still pending). Returns what was read and whether
    /// the heartbeat was written; a call not back within [`STALLED_AFTER`]
    /// read nothing and wrote nothing.
    async fn cycle(&mut self, watching_rollouts: bool) -> (Read, bool) {
        let call = self.pending.get_or_insert_with(|| {
            let (s, i, u) = (
                Arc::clone(&self.store),
                self.id.clone(),
                self.stats_url.clone(),
            );
            // A resync replaces the whole table; reads forced only to watch
            // held rollouts apply model by model, like any other read.
            self.resync = self.known.is_none() || self.read_at.elapsed() >= RESYNC_EVERY;
            let current = self.known.filter(|_| !self.resync && !watching_rollouts);
            tokio::task::spawn_blocking(move || {
                let beat = s.heartbeat(&i, &u);
                let read = s.routes_version().and_then(|v| match current {
                    Some(k) if k == v => Ok((v, None)),
                    _ => s.routes().map(|r| (v, Some(r))),
                });
                (read, beat)
            })
        });
        match tokio::time::timeout(STALLED_AFTER, call).await {
            Ok(Ok((read, beat))) => {
                self.pending = None;
                if let Err(e) = &beat {
                    tracing::warn!(error = %e, "writing the heartbeat failed");
                }
                let read = match read {
                    Ok((v, Some(routes))) => {
                        self.known = Some(v);
                        self.read_at = tokio::time::Instant::now();
                        Read::Routes(routes)
                    }
                    Ok((_, None)) => Read::Unchanged,
                    Err(e) => {
                        tracing::warn!(error = %e, "reading routes from the store failed");
                        Read::Failed
                    }
                };
                (read, beat.is_ok())
            }
            Ok(Err(e)) => {
                self.pending = None;
                tracing::warn!(error = %e, "route follower task failed");
                (Read::Failed, false)
            }
            Err(_) => {
                tracing::warn!("the store has not answered for {STALLED_AFTER:?}");
                (Read::Failed, false)
            }
        }
    }
}

/// Says when candidates leave live traffic because the store stopped
/// confirming, and when they may come back.
fn log_hold_change(was_held: bool, held: bool) {
    if held != was_held {
        if held {
            tracing::warn!(
                "the store has not confirmed for {UNCONFIRMED_AFTER:?}: candidates are out of live traffic"
            );
        } else {
            tracing::info!(
                "the store confirms again: each candidate gets its share back once the controller has judged its rollout on this gateway's counts"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rollgate_core::{Plan, Routing, Timestamp};
    use rollgate_gateway::GatewayConfig;
    use rollgate_store::SqlStore;
    use rollgate_store::{Model, ModelSpec, Revision, RevisionSpec, RevisionState};

    fn revision(id: &str, spec: RevisionSpec) -> Revision {
        Revision {
            id: id.into(),
            model: "m".into(),
            spec,
            state: RevisionState::Available,
            rejections: 0,
            blocked: false,
            created_at: Timestamp(0),
        }
    }

    /// What a revision and a rollout's plan say reaches the gateway's route:
    /// served name, headers, output, assignment, fallback and epoch.
    #[test]
    fn a_route_carries_the_revision_and_plan_settings() {
        let plan = Plan {
            fallback_to_champion: true,
            assignment: rollgate_core::plan::Assignment::PerRequest,
            ..Plan::default()
        };
        let phase = rollgate_core::Phase::Canary {
            step: 0,
            weight_percent: 5,
        };
        let routing = Routing {
            epoch: 3,
            ..Routing::for_phase(&plan, &phase)
        };
        let mut cand = RevisionSpec {
            upstream: "http://127.0.0.1:2".into(),
            served_name: Some("fraud-v2".into()),
            ..RevisionSpec::default()
        };
        cand.headers.insert("host".into(), "fraud.models".into());
        let routes = [ModelRoutes {
            model: Model {
                name: "m".into(),
                spec: ModelSpec {
                    protocol: rollgate_core::Protocol::OipV2,
                    output: Some("predict_proba".into()),
                    ..ModelSpec::default()
                },
                champion: Some("r1".into()),
                created_at: Timestamp(0),
            },
            champion: Some(revision(
                "r1",
                RevisionSpec {
                    upstream: "http://127.0.0.1:1".into(),
                    ..RevisionSpec::default()
                },
            )),
            rollout: Some((revision("r2", cand), routing, 7)),
            rollout_seen: Default::default(),
            record_answers: false,
            watching: false,
        }];
        let r = &gateway_routes(&routes)[0];
        assert!(r.fallback_to_champion);
        assert_eq!(r.assignment, rollgate_core::plan::Assignment::PerRequest);
        assert_eq!(r.output.as_deref(), Some("predict_proba"));
        assert_eq!(r.epoch.as_deref(), Some("7.3"));
        let c = r.candidate.as_ref().expect("candidate");
        assert_eq!(c.weight_bp, 500);
        assert_eq!(c.upstream.served_name.as_deref(), Some("fraud-v2"));
        assert_eq!(c.upstream.headers["host"], "fraud.models");
    }

    /// A model in a 25% canary with a mirror, its rollout last judged on
    /// this gateway's counts (`gw/b`) at 1 ms.
    fn canary() -> Vec<ModelRoutes> {
        canary_at(1)
    }

    /// The same, last judged on them at `seen` ms.
    fn canary_at(seen: u64) -> Vec<ModelRoutes> {
        let plan = Plan::default();
        let phase = rollgate_core::Phase::Canary {
            step: 1,
            weight_percent: 25,
        };
        let spec = |port: u16| RevisionSpec {
            upstream: format!("http://127.0.0.1:{port}"),
            ..RevisionSpec::default()
        };
        vec![ModelRoutes {
            model: Model {
                name: "m".into(),
                spec: ModelSpec {
                    pinning: Some(true),
                    ..ModelSpec::default()
                },
                champion: Some("r1".into()),
                created_at: Timestamp(0),
            },
            champion: Some(revision("r1", spec(1))),
            rollout: Some((
                revision("r2", spec(2)),
                Routing {
                    mirror_bp: 10_000,
                    ..Routing::for_phase(&plan, &phase)
                },
                7,
            )),
            rollout_seen: std::collections::BTreeMap::from([("gw/b".to_string(), Timestamp(seen))]),
            record_answers: false,
            watching: false,
        }]
    }

    /// The store unconfirmed (reads or heartbeats failing) for 5 s: the
    /// candidate's share goes to the champion, mirrors stay; three
    /// confirmed cycles give it back. Time is passed in: no clock is read.
    #[test]
    fn an_unconfirmed_store_takes_candidates_out_of_traffic_until_it_confirms_again() {
        let t0 = tokio::time::Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let share = |r: &Option<Vec<ModelRoute>>| {
            let r = &r.as_ref().expect("routes")[0];
            // A tester's pin reaches the candidate only while it has its
            // share: never during the hold.
            assert_eq!(r.pinning, r.candidate.is_some(), "{r:?}");
            (
                r.candidate.as_ref().map(|c| c.weight_bp),
                r.shadow.is_some(),
            )
        };
        let mut f = FollowState::new(t0, "gw/b".into());
        assert_eq!(
            f.step(Read::Failed, false, at(0)),
            None,
            "nothing known yet"
        );
        assert_eq!(
            share(&f.step(Read::Routes(canary()), true, at(500))),
            (Some(2500), true)
        );
        // Nothing moved: nothing to apply.
        assert_eq!(f.step(Read::Unchanged, true, at(700)), None);
        // Disk full: routes still read, heartbeats fail.
        for ms in [1000, 2000, 3000, 4000, 5100] {
            let r = f.step(Read::Routes(canary()), false, at(ms));
            assert_eq!(share(&r), (Some(2500), true), "at {ms} ms");
        }
        let r = f.step(Read::Unchanged, false, at(5700));
        assert!(f.held);
        assert_eq!(share(&r), (None, true), "5 s unconfirmed: held");
        // Unreachable altogether: the last routes stay, still held.
        assert_eq!(f.step(Read::Failed, false, at(9000)), None);
        assert!(f.held);
        // Back: held for two confirmed cycles; at the third the store is
        // back, but the candidate waits for the controller's first
        // committed look on this gateway's counts since the hold: what it
        // decides on them comes first, never a burst of the stale routing.
        // (A look without them, e.g. "no stats", does not count.)
        assert!(f.watching_rollouts(), "routes read at every cycle");
        assert_eq!(
            share(&f.step(Read::Routes(canary()), true, at(9500))),
            (None, true)
        );
        for ms in [10_000, 10_500, 11_000] {
            assert_eq!(
                share(&f.step(Read::Routes(canary()), true, at(ms))),
                (None, true),
                "at {ms} ms: no look at the rollout since the hold"
            );
        }
        assert!(!f.held, "the store is back");
        assert!(f.withheld.lock().expect("withheld").contains("m"));
        let mut other_gateway = canary();
        other_gateway[0]
            .rollout_seen
            .insert("gw2/c".into(), Timestamp(9_999));
        assert_eq!(
            share(&f.step(Read::Routes(other_gateway), true, at(11_200))),
            (None, true),
            "another gateway's counts are not this gateway's"
        );
        assert_eq!(
            share(&f.step(Read::Routes(canary_at(2)), true, at(11_500))),
            (Some(2500), true),
            "the controller judged on this gateway's counts again: the share is back"
        );
        assert!(!f.watching_rollouts());
    }

    /// A rollout rolled back while the store was out: its candidate never
    /// gets a share back, not even for a cycle.
    #[test]
    fn a_rollback_decided_during_an_outage_is_never_preceded_by_the_stale_share() {
        let t0 = tokio::time::Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut f = FollowState::new(t0, "gw/b".into());
        let _ = f.step(Read::Routes(canary()), true, at(0));
        let _ = f.step(Read::Failed, false, at(5_100));
        assert!(f.held);
        let mut routes_seen = Vec::new();
        for (i, ms) in [6_000, 6_500, 7_000, 7_500].into_iter().enumerate() {
            // The store is back; the controller's rollback commits at the
            // fourth cycle (champion-only, the rollout over).
            let routes = if i < 3 {
                canary()
            } else {
                let mut r = canary();
                r[0].rollout = None;
                r[0].rollout_seen.clear();
                r
            };
            if let Some(r) = f.step(Read::Routes(routes), true, at(ms)) {
                routes_seen.push(r);
            }
        }
        assert!(
            routes_seen.iter().flatten().all(|r| r.candidate.is_none()),
            "{routes_seen:?}"
        );
        assert!(!f.watching_rollouts());
    }

    /// A model spec the gateway cannot route — written by an older version,
    /// before specs were validated as they are now — isolates that model only:
    /// the store follower still loads every other model, also after a restart.
    #[tokio::test]
    async fn a_bad_spec_from_an_older_version_isolates_one_model() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let store = SqlStore::open_dir(dir.path()).expect("store");
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
        let store = SqlStore::open_dir(dir.path()).expect("reopen");
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
}
