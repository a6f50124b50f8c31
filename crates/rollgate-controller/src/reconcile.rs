//! The reconcile loop, in the kube-rs style: `reconcile(rollout, ctx)`
//! returns what to do next; `error_policy` decides on failures.
//!
//! A pass reads the rollout from the store, probes the candidate, merges one
//! stats snapshot from every live gateway, runs the pure state machine, and
//! commits the new state with all its effects in one store transaction,
//! compare-and-swap on the rollout's version. It is idempotent: a pass that
//! loses the race (another controller, an operator) commits nothing and is
//! simply requeued. A crash anywhere leaves the store at the last commit.

use std::sync::Arc;
use std::time::Duration;

use rollgate_core::{
    Effect, Exposure, Input, Observation, Phase, Protocol, RolloutState, Routing, SeriesReport,
    Timestamp, step,
};
use rollgate_store::{
    Fence, Model, ModelRoutes, Revision, RolloutRecord, Store, StoreError, TransitionWrite,
};

// What a pass shares moved to `context` (which imports none of the tasks
// that take it); named here too, where it was.
pub use crate::context::{
    Anchor, Context, Error, GatewayStats, PRUNE_EVERY, PassStats, Retention, RoutePush, blocking,
};

/// What to do after a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Action {
    /// Reconcile again after this long.
    Requeue(Duration),
    /// Nothing to do until the rollout changes (it is finished).
    AwaitChange,
}

impl Action {
    pub fn requeue(d: Duration) -> Action {
        Action::Requeue(d)
    }
    pub fn await_change() -> Action {
        Action::AwaitChange
    }
}

/// Every live gateway's stats, fetched concurrently.
async fn fetch_stats(ctx: &Context) -> Result<GatewayStats, Error> {
    let ttl = ctx.gateway_ttl;
    let gateways = blocking(&ctx.store, move |s| s.gateways(ttl)).await?;
    let fetched = futures::future::join_all(gateways.into_iter().map(|g| async move {
        let snap = match ctx.http.get(&g.stats_url).await {
            Some((200, body)) => serde_json::from_slice(&body).ok(),
            _ => None,
        };
        (g.stats_url, snap)
    }))
    .await;
    Ok(Arc::new(fetched))
}

/// The gateways' stats for this pass (fetched once per pass).
async fn gateway_stats(ctx: &Context) -> Result<GatewayStats, Error> {
    ctx.stats.for_pass(|| fetch_stats(ctx)).await
}

/// Prunes evaluations past retention, and the answers and labels kept
/// for quality, at most once per [`PRUNE_EVERY`].
pub async fn prune(ctx: &Context) {
    let Some(r) = &ctx.retention else {
        return;
    };
    if !r.due() {
        return;
    }
    let before = Timestamp((ctx.clock)().0.saturating_sub(r.keep.as_millis() as u64));
    match blocking(&ctx.store, move |s| s.prune_evaluations(before)).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(records = n, "pruned evaluation records past retention"),
        Err(e) => tracing::warn!(error = %e, "pruning the audit log failed"),
    }
    // Answers recorded for labels, and the labels, go with them.
    match blocking(&ctx.store, move |s| s.prune_answers(before)).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(rows = n, "pruned answers and labels past retention"),
        Err(e) => tracing::warn!(error = %e, "pruning answers and labels failed"),
    }
}

/// Brings every external data plane to the routing the store holds (each
/// confirmed routing is applied once; a failed one again after a back-off).
/// Reads the routes only when they changed since the last full sync or a
/// failed routing waits to be sent again: a pass costs one small read.
pub async fn sync_data_planes(ctx: &Context) {
    let Ok(version) = blocking(&ctx.store, |s| s.routes_version()).await else {
        return;
    };
    if !ctx.adapters.needs_sync(version) {
        return;
    }
    let Ok(routes) = blocking(&ctx.store, |s| s.routes()).await else {
        return;
    };
    // Concurrently: one data plane slow to confirm holds up no other.
    let planes: Vec<_> = routes
        .iter()
        .filter_map(|r| {
            let named = r.model.spec.data_plane.as_ref()?;
            Some((ctx.host.data_plane_or_isolate(&r.model.name, named)?, r))
        })
        .collect();
    futures::future::join_all(
        planes
            .iter()
            .map(|(plane, r)| ctx.adapters.sync(&ctx.http, plane, r, version, false)),
    )
    .await;
    ctx.adapters.synced(version);
}

/// The store's `routes_version`, then one model's routes: the version is
/// read first, so the routes are at least as new as the generation their
/// routing is sent to a data plane under.
fn versioned_routes(s: &dyn Store, model: &str) -> Result<(u64, Option<ModelRoutes>), StoreError> {
    Ok((s.routes_version()?, s.model_routes(model)?))
}

/// Sends one model's routes (as of `generation`) to its external data
/// plane, if it has one, and to the in-process gateway: read once, given
/// to both.
async fn route(ctx: &Context, model: &str, routes: Option<ModelRoutes>, generation: u64) {
    if let Some(routes) = &routes
        && let Some(named) = &routes.model.spec.data_plane
        && let Some(plane) = ctx.host.data_plane_or_isolate(model, named)
    {
        ctx.adapters
            .sync(&ctx.http, &plane, routes, generation, true)
            .await;
    }
    if let Some(g) = ctx.local_gateway.clone() {
        let model = model.to_string();
        let _ = tokio::task::spawn_blocking(move || g.push_model(&model, routes.as_ref())).await;
    }
}

/// Pushes one model's routing from the store to its external data plane
/// and to the in-process gateway.
pub async fn push_model(ctx: &Context, model: &str) {
    let name = model.to_string();
    if let Ok((generation, routes)) =
        blocking(&ctx.store, move |s| versioned_routes(s, &name)).await
    {
        route(ctx, model, routes, generation).await;
    }
}

/// Signs the chain's head if it moved since the last checkpoint: every
/// decision (and every audited evaluation) is anchored within one pass.
pub async fn checkpoint(ctx: &Context) {
    let Some(anchor) = ctx.anchor.clone() else {
        return;
    };
    let store = Arc::clone(&ctx.store);
    let now = (ctx.clock)();
    let done = tokio::task::spawn_blocking(move || {
        let mut last = anchor.last.lock().map_err(|_| "poisoned".to_string())?;
        let signed = rollgate_store::checkpoint_head(
            store.as_ref(),
            &anchor.key,
            anchor.sink.as_deref(),
            *last,
            now,
        )?;
        if signed.is_some() {
            *last = signed;
        }
        Ok::<_, String>(())
    })
    .await;
    match done {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "audit checkpoint failed"),
        Err(e) => tracing::warn!(error = %e, "audit checkpoint task failed"),
    }
}

/// The readiness URL of a revision: its configured path, or the protocol's.
/// (The name the server serves the model under: `served_name` when the
/// revision has one, as the gateway rewrites requests to it.)
pub fn readiness_url(model: &Model, rev: &Revision) -> String {
    let name = rev.spec.served_name.as_deref().unwrap_or(&model.name);
    let path = rev
        .spec
        .readiness_path
        .clone()
        .unwrap_or_else(|| match model.spec.protocol {
            Protocol::KserveV1 => format!("/v1/models/{name}"),
            Protocol::OipV2 => format!("/v2/models/{name}/ready"),
            Protocol::Json => "/".to_string(),
        });
    format!("{}{}", rev.spec.upstream, path)
}

async fn probe_ready(ctx: &Context, model: &Model, rev: &Revision) -> bool {
    matches!(
        ctx.http.get(&readiness_url(model, rev)).await,
        Some((200, _))
    )
}

/// What every live gateway that answered reported for rollout `rollout`
/// of `model`: each gateway process (id and boot) is its own series, with
/// its counts per routing epoch of arrival, so the core differences each
/// on its own (a restart is a new series; a gateway that missed a pass
/// adds what is new when it returns). A gateway that reports no boot (an
/// older version) is one pooled series. `None` when no gateway answered:
/// missing evidence is never health.
pub async fn exposure(ctx: &Context, model: &str, rollout: i64) -> Result<Option<Exposure>, Error> {
    let stats = gateway_stats(ctx).await?;
    let mut out = Exposure::default();
    let mut answered = false;
    for (url, snap) in stats.iter() {
        let Some(snap) = snap else {
            continue;
        };
        answered = true;
        if snap.boot.is_empty() {
            let total = snap.models.get(model).cloned().unwrap_or_default();
            out.series
                .insert(url.clone(), SeriesReport::Pooled { total });
            continue;
        }
        let epochs = snap
            .epochs
            .get(model)
            .into_iter()
            .flatten()
            .filter_map(|(label, s)| Some((rollgate_core::epoch_of(label, rollout)?, s.clone())))
            .collect();
        out = out.with_epochs(format!("{}/{}", snap.gateway, snap.boot), epochs);
    }
    Ok(answered.then_some(out))
}

/// Whether the candidate of a model on another data plane gets only the
/// copies rollgate's gateway mirrors (in SHADOW, or a dry run): then the
/// gateway's counts of both arms, on the same requests, are the evidence;
/// the candidate's server counts only the copies, the champion's all its
/// traffic, so Prometheus's counts would not compare like with like.
fn only_mirrored(model: &Model, rec: &RolloutRecord) -> bool {
    model.spec.data_plane.is_some()
        && (rec.state.phase == Phase::Shadow || !rec.spec.plan.mode.is_enforce())
}

/// A model's evidence from Prometheus (`ModelSpec::prometheus`): its
/// revisions' counts as scraped, per target and epoch, with the gateways'
/// shadow pairs (only a gateway can pair answers; its own counts of the
/// revisions are not read, so nothing is counted twice). `None` when
/// Prometheus gave nothing readable: missing evidence is never health.
async fn scraped_exposure(
    ctx: &Context,
    cfg: &rollgate_store::PrometheusEvidence,
    model: &Model,
    candidate: Revision,
    rec: &RolloutRecord,
    now: Timestamp,
) -> Result<Option<Exposure>, Error> {
    let champion = match model.champion.clone() {
        Some(id) if id != candidate.id => {
            Some(blocking(&ctx.store, move |s| s.revision(&id)).await?)
        }
        _ => None,
    };
    let revisions: Vec<&Revision> = std::iter::once(&candidate)
        .chain(champion.as_ref())
        .collect();
    let scraped = match crate::prometheus::exposure(
        &ctx.http, &ctx.host, cfg, model, &revisions, &rec.state, now,
    )
    .await
    {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(rollout = rec.id, model = %model.name, "no evidence this look: {e}");
            return Ok(None);
        }
    };
    Ok(Some(match exposure(ctx, &model.name, rec.id).await? {
        Some(gateways) => scraped.with_pairs_of(&gateways),
        None => scraped,
    }))
}

/// Pushes champion-only routing for `model` to its external data plane and
/// the in-process gateway before a rollback or abort is committed: the
/// safe direction, so a failed commit can only have reduced exposure.
async fn pre_route_to_champion(
    ctx: &Context,
    rec: &RolloutRecord,
    effects: &[Effect],
    next: &RolloutState,
) {
    let back = matches!(next.phase, Phase::RolledBack { .. } | Phase::Aborted)
        && effects.contains(&Effect::SetRouting {
            routing: Routing::CHAMPION_ONLY,
        });
    if !back {
        return;
    }
    let (model, id, version) = (rec.spec.model.clone(), rec.id, rec.version);
    // Only while the record decided on is still the stored one (a look
    // uses the record its pass listed): a decision whose commit will
    // lose to an operator's meanwhile takes nothing back.
    let read = blocking(&ctx.store, move |s| {
        if s.rollout(id)?.version != version {
            return Ok((0, None));
        }
        versioned_routes(s, &model)
    })
    .await;
    if let Ok((generation, Some(mut routes))) = read {
        routes.rollout = None;
        route(ctx, &rec.spec.model, Some(routes), generation).await;
    }
}

/// Commits a transition (under `fence`, for the leader's own decisions);
/// a lost race is not an error, and a fenced commit makes this controller
/// stand by.
pub async fn commit(
    ctx: &Context,
    rec: &RolloutRecord,
    state: RolloutState,
    effects: Vec<Effect>,
    actor: &str,
    fence: Option<Fence>,
) -> Result<Option<RolloutRecord>, Error> {
    pre_route_to_champion(ctx, rec, &effects, &state).await;
    // An evaluation alone (only audited) leaves the routes as they were:
    // nothing to push, which would cost the in-process gateway a new
    // routing table per look.
    let routes_moved = state.phase != rec.state.phase
        || state.epoch != rec.state.epoch
        || state.paused != rec.state.paused
        || effects.iter().any(|e| !matches!(e, Effect::Audit { .. }));
    let (id, version, actor) = (rec.id, rec.version, actor.to_string());
    let out = blocking(&ctx.store, move |s| {
        match s.apply(TransitionWrite {
            rollout: id,
            expected_version: version,
            state: &state,
            effects: &effects,
            actor: &actor,
            fence,
        }) {
            Ok(r) => Ok(Some(r)),
            Err(StoreError::VersionConflict { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    })
    .await;
    let out = match out {
        Err(Error::Store(StoreError::Fenced { .. })) => {
            ctx.leader.step_down();
            None
        }
        other => other?,
    };
    if let Some(done) = &out {
        log_decision(rec, done);
        if routes_moved {
            push_model(ctx, &rec.spec.model).await;
        }
    }
    Ok(out)
}

/// Logs a committed change of phase (or of pause): the decisions an
/// operator greps for, with the model, the rollout and why.
fn log_decision(before: &RolloutRecord, after: &RolloutRecord) {
    let (from, to) = (&before.state.phase, &after.state.phase);
    if from == to && before.state.paused == after.state.paused {
        return;
    }
    let reason = match to {
        Phase::RolledBack { reason } => reason.code(),
        _ if after.state.paused != before.state.paused => {
            if after.state.paused {
                "paused"
            } else {
                "resumed"
            }
        }
        _ => to.name(),
    };
    tracing::info!(
        model = %after.spec.model,
        rollout = after.id,
        from = from.name(),
        to = to.name(),
        weight_bp = after.routing.candidate_weight_bp,
        dry_run = !after.spec.plan.mode.is_enforce(),
        reason,
        "decision"
    );
}

/// One pass over rollout `id`.
pub async fn reconcile(id: i64, ctx: &Context) -> Result<Action, Error> {
    let rec = blocking(&ctx.store, move |s| s.rollout(id)).await?;
    look(rec, ctx).await
}

/// One look at a rollout as read (at most a pass ago: a commit made
/// since, an operator's pause say, makes this look's commit a version
/// conflict, and the next look reads it).
async fn look(mut rec: RolloutRecord, ctx: &Context) -> Result<Action, Error> {
    let id = rec.id;
    let stored_evaluations = rec.state.evaluations;
    // Looks that changed nothing are counted with this one.
    rec.state.evaluations += ctx.looks.pending(id);
    if rec.state.phase.is_terminal() {
        return Ok(Action::await_change());
    }
    let (model_name, cand) = (rec.spec.model.clone(), rec.spec.candidate.clone());
    let (model, candidate) = blocking(&ctx.store, move |s| {
        Ok((s.model(&model_name)?, s.revision(&cand)?))
    })
    .await?;
    let candidate_ready = probe_ready(ctx, &model, &candidate).await;
    let now = (ctx.clock)();
    let exposure = match &model.spec.prometheus {
        Some(cfg) if !only_mirrored(&model, &rec) => {
            scraped_exposure(ctx, cfg, &model, candidate, &rec, now).await?
        }
        _ => exposure(ctx, &rec.spec.model, rec.id).await?,
    };
    let labels = labelled(ctx, &rec).await;
    let t = match step(
        &rec.spec,
        &rec.state,
        Input::Observe(Observation {
            candidate_ready,
            exposure,
            labels,
            routing_applied: model
                .spec
                .data_plane
                .as_ref()
                .map(|_| ctx.adapters.applied_epoch(&model.name, rec.id)),
        }),
        now,
    ) {
        Ok(t) => t,
        // Observations never err; if one did, try again later.
        Err(_) => return Ok(Action::requeue(ctx.tick)),
    };
    if t.state == rec.state && t.effects.is_empty() {
        return Ok(Action::requeue(ctx.tick));
    }
    // A look that changed nothing but the count of looks (a WAIT on
    // evidence that did not move: nothing audited, no routing) is not
    // written until ten ticks after the last commit.
    if t.effects.is_empty()
        && t.state.evidence.series_count() + 1 < rollgate_core::MAX_SERIES
        && only_looked(&rec.state, &t.state)
        && now.since(rec.updated_at) < ctx.tick * crate::context::Looks::COMMIT_EVERY_TICKS
    {
        ctx.looks.skipped(id);
        return Ok(Action::requeue(ctx.tick));
    }
    // Only the leader's decisions commit, each under its fence.
    let Some(fence) = ctx.leader.fence() else {
        return Ok(Action::requeue(ctx.tick));
    };
    let evaluated = t.state.evaluations > rec.state.evaluations;
    let next = t.state.phase.clone();
    let committed = commit(ctx, &rec, t.state, t.effects, "controller", Some(fence)).await?;
    if committed.is_some() {
        ctx.looks.take(id);
    }
    if let Some(done) = committed {
        if evaluated {
            // This look and those not committed before it.
            ctx.metrics
                .evaluations(done.state.evaluations.saturating_sub(stored_evaluations));
        }
        // A dry run's "rollback" took nothing back: not counted as one.
        if let Phase::RolledBack { reason } = &next
            && rec.spec.plan.mode.is_enforce()
        {
            ctx.metrics.rollback(reason.code());
        }
        if done.state.phase.is_terminal() {
            return Ok(Action::await_change());
        }
    }
    Ok(Action::requeue(ctx.tick))
}

/// The rollout's recorded answers with their labels, when its plan
/// judges quality (`None` otherwise, or when the store could not say: the
/// quality gate then waits).
async fn labelled(
    ctx: &Context,
    rec: &RolloutRecord,
) -> Option<std::sync::Arc<Vec<rollgate_core::labels::Recorded>>> {
    let quality = &rec.spec.plan.gates.quality;
    let judged = match rec.state.phase {
        Phase::Shadow | Phase::Canary { .. } => quality.in_stages,
        Phase::Watching { .. } => true,
        _ => false,
    };
    if !quality.enabled || !judged {
        return None;
    }
    let id = rec.id;
    match blocking(&ctx.store, move |s| s.labelled_answers(id)).await {
        Ok(rows) => Some(std::sync::Arc::new(rows)),
        Err(e) => {
            tracing::warn!(rollout = id, "labelled answers not read this look: {e}");
            None
        }
    }
}

/// Whether `after` differs from `before` only by the look it counted:
/// its verdict, and the ledger's note of a look that counted nothing.
fn only_looked(before: &RolloutState, after: &RolloutState) -> bool {
    let mut same = after.clone();
    same.evaluations = before.evaluations;
    same.last_verdict.clone_from(&before.last_verdict);
    same.evidence = after.evidence.counted();
    let mut was = before.clone();
    was.evidence = before.evidence.counted();
    same == was
}

/// On an error, retry after a back-off that doubles with each consecutive
/// failure of the rollout (from one tick, at least 500 ms, up to 30 s): the
/// store is the truth, so a later pass simply starts again from it.
/// Written here, not with a retry crate (e.g. `backon`): the back-off is an
/// entry in the run loop's [`Schedule`], not a loop around one call.
pub fn error_policy(err: &Error, ctx: &Context, failures: u32) -> Action {
    tracing::warn!(error = %err, failures, "reconcile failed; retrying");
    let base = ctx.tick.max(Duration::from_millis(500));
    let factor = 1u32 << failures.saturating_sub(1).min(6);
    Action::requeue((base * factor).min(Duration::from_secs(30)))
}

/// When each active rollout is due, from the `Action` its last pass
/// returned, when it was last looked at, and how many of its passes
/// failed in a row.
#[derive(Debug, Default)]
pub struct Schedule {
    due: std::collections::HashMap<i64, tokio::time::Instant>,
    looked: std::collections::HashMap<i64, tokio::time::Instant>,
    failures: std::collections::HashMap<i64, u32>,
}

impl Schedule {
    /// The active rollouts due at `now`, the one due longest first (new
    /// ones are due at once, before all): when a pass runs late, no
    /// rollout waits behind others that waited less. Forgets rollouts no
    /// longer active.
    pub fn due(&mut self, active: &[i64], now: tokio::time::Instant) -> Vec<i64> {
        let live: std::collections::HashSet<i64> = active.iter().copied().collect();
        self.due.retain(|id, _| live.contains(id));
        self.looked.retain(|id, _| live.contains(id));
        self.failures.retain(|id, _| live.contains(id));
        let mut due: Vec<(Option<tokio::time::Instant>, i64)> = active
            .iter()
            .map(|id| (self.due.get(id).copied(), *id))
            .filter(|(at, _)| at.is_none_or(|t| t <= now))
            .collect();
        due.sort();
        due.into_iter().map(|(_, id)| id).collect()
    }

    /// How long each of `ids` has waited since its last look (none for a
    /// first look), noting `now` as its look.
    /// A rollout in error back-off waits by design: not counted.
    pub fn look(&mut self, ids: &[i64], now: tokio::time::Instant) -> Vec<f64> {
        ids.iter()
            .filter_map(|id| {
                if self.failures.contains_key(id) {
                    self.looked.insert(*id, now);
                    return None;
                }
                let before = self.looked.insert(*id, now)?;
                Some(now.duration_since(before).as_secs_f64())
            })
            .collect()
    }

    /// Records the outcome of a look that began at `now`.
    pub fn done(
        &mut self,
        id: i64,
        outcome: Result<Action, Error>,
        ctx: &Context,
        now: tokio::time::Instant,
    ) {
        let action = match outcome {
            Ok(a) => {
                self.failures.remove(&id);
                a
            }
            Err(e) => {
                let n = self.failures.entry(id).or_insert(0);
                *n += 1;
                error_policy(&e, ctx, *n)
            }
        };
        match action {
            Action::Requeue(d) => {
                self.due.insert(id, now + d);
            }
            // Finished: it leaves the active list, and the schedule with it.
            Action::AwaitChange => {
                self.due.remove(&id);
            }
        }
    }

    /// Forgets when rollouts were last looked at (standing by: the next
    /// leadership's first looks are not late).
    pub fn stand_by(&mut self) {
        self.looked.clear();
    }

    /// The earliest time a rollout is due.
    pub fn next(&self) -> Option<tokio::time::Instant> {
        self.due.values().min().copied()
    }
}

/// One pass of the run loop: reconciles the active rollouts that are due,
/// at most `ctx.concurrency` at once, with one fetch of the gateways'
/// stats; schedules each from its outcome. Returns how many it reconciled.
pub async fn pass(ctx: &Context, schedule: &mut Schedule) -> Result<usize, Error> {
    use futures::stream::StreamExt as _;
    sync_data_planes(ctx).await;
    let rollouts = blocking(&ctx.store, |s| s.rollouts(true)).await?;
    ctx.metrics.set_active(&rollouts);
    ctx.stats.next_pass();
    let started = tokio::time::Instant::now();
    let ids: Vec<i64> = rollouts.iter().map(|r| r.id).collect();
    ctx.looks.keep_only(&ids);
    let due = schedule.due(&ids, started);
    let waits = schedule.look(&due, started);
    // The records just listed, in the order they are due.
    let mut listed: std::collections::HashMap<i64, RolloutRecord> =
        rollouts.into_iter().map(|r| (r.id, r)).collect();
    let due: Vec<RolloutRecord> = due.iter().filter_map(|id| listed.remove(id)).collect();
    let outcomes: Vec<(i64, Result<Action, Error>)> = futures::stream::iter(due)
        .map(|rec| async move { (rec.id, look(rec, ctx).await) })
        .buffer_unordered(ctx.concurrency.max(1))
        .collect()
        .await;
    let now = tokio::time::Instant::now();
    let n = outcomes.len();
    // Due again a tick after this look began, not after the pass ended:
    // a pass that takes part of a tick does not stretch every rollout's
    // cadence by that part.
    for (id, outcome) in outcomes {
        schedule.done(id, outcome, ctx, started);
    }
    ctx.metrics
        .pass(now.duration_since(started).as_secs_f64(), &waits);
    Ok(n)
}

/// Keeps the lease: renews it while leading, tries to take it while
/// standing by.
async fn keep_lease(ctx: Context) {
    loop {
        let lead = ctx.leader.campaign(&ctx.store).await;
        ctx.metrics.set_leader(lead);
        tokio::time::sleep(ctx.leader.renew_every()).await;
    }
}

/// Reconciles the active rollouts when each is due, at most
/// `ctx.concurrency` at once, while this controller leads; signs and prunes
/// the audit log; until `shutdown` resolves. Then hands the lease over.
pub async fn run(ctx: Context, shutdown: impl std::future::Future<Output = ()>) {
    tokio::pin!(shutdown);
    let lease = tokio::spawn(keep_lease(ctx.clone()));
    let mut schedule = Schedule::default();
    loop {
        if ctx.leader.fence().is_none() {
            schedule.stand_by();
        } else {
            if let Err(e) = pass(&ctx, &mut schedule).await {
                tracing::warn!(error = %e, "listing active rollouts failed; retrying");
            }
            checkpoint(&ctx).await;
            prune(&ctx).await;
        }
        // Wake for the next due rollout, and at least every tick (new
        // rollouts, leadership changes).
        let wake = schedule
            .next()
            .unwrap_or_else(tokio::time::Instant::now)
            .max(tokio::time::Instant::now() + Duration::from_millis(10))
            .min(tokio::time::Instant::now() + ctx.tick);
        tokio::select! {
            () = tokio::time::sleep_until(wake) => {}
            () = &mut shutdown => break,
        }
    }
    lease.abort();
    ctx.leader.resign(&ctx.store).await;
}

#[cfg(test)]
mod tests {
    use rollgate_core::Timestamp;
    use rollgate_store::{Model, ModelSpec, Protocol, Revision, RevisionSpec, RevisionState};

    use super::{Schedule, readiness_url};

    #[test]
    fn a_late_pass_looks_first_at_the_rollout_that_waited_longest() {
        let t0 = tokio::time::Instant::now();
        let looked_at = |s: &mut Schedule, id: i64, at, after| {
            s.due.insert(id, at + after);
            s.looked.insert(id, at);
        };
        let mut s = Schedule::default();
        let tick = std::time::Duration::from_secs(1);
        // 3 looked at first, then 1, then 2; 4 is new.
        looked_at(&mut s, 3, t0, tick);
        looked_at(&mut s, 1, t0 + tick / 2, tick);
        looked_at(&mut s, 2, t0 + tick, tick);
        let late = t0 + tick * 5;
        assert_eq!(s.due(&[1, 2, 3, 4], late), vec![4, 3, 1, 2]);
        assert_eq!(
            s.due(&[1, 2, 3], t0 + tick * 3 / 2),
            vec![3, 1],
            "2 is not due yet"
        );
        let waits = s.look(&[3, 1, 4], late);
        assert_eq!(waits, vec![5.0, 4.5], "a first look has no wait");
        assert!(
            s.due(&[1], late).len() == 1 && !s.looked.contains_key(&3),
            "3 ended: forgotten"
        );
    }

    #[test]
    fn readiness_asks_for_the_name_the_server_serves() {
        let model = |protocol| Model {
            name: "fraud".into(),
            spec: ModelSpec {
                protocol,
                ..ModelSpec::default()
            },
            champion: None,
            created_at: Timestamp(0),
        };
        let revision = |served_name: Option<&str>| Revision {
            id: "r1".into(),
            model: "fraud".into(),
            spec: RevisionSpec {
                upstream: "http://m:8080".into(),
                served_name: served_name.map(str::to_string),
                ..RevisionSpec::default()
            },
            state: RevisionState::Available,
            rejections: 0,
            blocked: false,
            created_at: Timestamp(0),
        };
        let v1 = model(Protocol::KserveV1);
        assert_eq!(
            readiness_url(&v1, &revision(None)),
            "http://m:8080/v1/models/fraud"
        );
        assert_eq!(
            readiness_url(&v1, &revision(Some("fraud-v2"))),
            "http://m:8080/v1/models/fraud-v2"
        );
        let v2 = model(Protocol::OipV2);
        assert_eq!(
            readiness_url(&v2, &revision(Some("fraud-v2"))),
            "http://m:8080/v2/models/fraud-v2/ready"
        );
    }
}
