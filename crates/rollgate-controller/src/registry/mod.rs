//! Following a model registry (MLflow's): its alias starts rollouts, and
//! rollgate's verdicts go back to it.
//!
//! The registry says which version *should* serve; rollgate decides
//! whether it *may*, and says so back. One task per declared registry,
//! only while this controller leads, each pass in this order:
//!
//! 1. **Write back** what ended since the last pass, read from the audit
//!    log as notifications are (the log is the outbox; the registry has a
//!    cursor in the store): a promotion moves the champion alias to the
//!    version; every end removes the followed alias if it still names the
//!    version and tags the version (`rollgate.verdict`, `rollgate.reason`,
//!    `rollgate.rollout`, `rollgate.audit`). Each write is idempotent, so a
//!    pass cut short is simply repeated; a `registry_written` record and
//!    the cursor commit in one transaction, so each end is recorded once.
//!    A registry that is down delays this and loses nothing; the poll
//!    waits until it is done, so no alias is read stale.
//! 2. **Poll** each following model's aliases (one call each) and act by
//!    [`decide`]: seed a champion, or register a version and start its
//!    rollout; conflicts are recorded (`registry_conflict`), once per
//!    rollout and alias position while the process runs.
//!
//! A registry that is down or slow holds up only its own task: every call
//! is bounded, and nothing is started or decided for want of an answer.

use std::collections::{BTreeMap, BTreeSet};

use rollgate_core::Phase;
use rollgate_store::{
    AuditFilter, AuditRecord, Model, Note, RegistrySource, RegistryVersion, Revision, RevisionSpec,
    RolloutRecord, StoreError, UPSTREAM_TAG,
};

use crate::context::{Context, Error, blocking};

pub mod decide;
pub mod mlflow;
pub mod webhook;

pub use crate::host::{RegistryConfig, RegistryKind};
pub use decide::{Act, Aliases, Conflict, Decision, Held, decide};
use mlflow::{Mlflow, RegistryError};

/// Who the follower acts as in the audit log.
pub fn actor(registry: &str) -> String {
    format!("registry:{registry}")
}

/// The store cursor of a registry's write-back.
fn cursor_name(registry: &str) -> String {
    format!("registry:{registry}")
}

/// What stops a pass.
#[derive(Debug, thiserror::Error)]
enum PassError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("store: {0}")]
    Store(#[from] Error),
}

impl From<StoreError> for PassError {
    fn from(e: StoreError) -> Self {
        PassError::Store(Error::Store(e))
    }
}

/// Follows every declared registry while this controller leads, until
/// `shutdown` resolves.
pub async fn run(ctx: Context, shutdown: impl std::future::Future<Output = ()>) {
    let mut tasks = tokio::task::JoinSet::new();
    for (name, config) in ctx.host.registries().clone() {
        tasks.spawn(follow(ctx.clone(), name, config));
    }
    shutdown.await;
    tasks.abort_all();
}

/// One registry's loop: a pass as soon as this controller leads, then one
/// every poll interval or when a webhook delivery wakes it.
async fn follow(ctx: Context, name: String, config: RegistryConfig) {
    let http = crate::HttpClient::new(config.timeout);
    // Conflicts said while this process runs (by rollout and what was seen).
    let mut said = BTreeSet::new();
    let wake = ctx.registry_signals.wake_of(&name);
    loop {
        if ctx.leader.fence().is_none() {
            tokio::time::sleep(ctx.tick).await;
            continue;
        }
        let ok = pass(&ctx, &name, &config, &http, &mut said).await;
        ctx.metrics.registry_pass(&name, ok);
        tokio::select! {
            _ = tokio::time::sleep(config.poll) => {}
            _ = wake.notified() => {}
        }
    }
}

/// One pass: write back, then poll; whether it ended.
async fn pass(
    ctx: &Context,
    name: &str,
    config: &RegistryConfig,
    http: &crate::HttpClient,
    said: &mut BTreeSet<String>,
) -> bool {
    let token = match ctx.host.registry_token(name) {
        Ok(token) => token,
        Err(e) => {
            tracing::error!(registry = %name, error = %e, "registry not followed");
            return false;
        }
    };
    let mlflow = Mlflow {
        http,
        base: config.url.trim_end_matches('/'),
        token,
    };
    match write_back(ctx, name, &mlflow).await {
        Ok(()) => poll(ctx, name, &mlflow, said).await,
        Err(e) => {
            tracing::warn!(registry = %name, error = %e, "writing verdicts back failed; retrying");
            false
        }
    }
}

/// Polls every model that follows `name`; one model's failure is logged
/// and the others go on.
async fn poll(ctx: &Context, name: &str, mlflow: &Mlflow<'_>, said: &mut BTreeSet<String>) -> bool {
    let models = match blocking(&ctx.store, |st| st.models()).await {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(registry = %name, error = %e, "listing models failed");
            return false;
        }
    };
    let mut ok = true;
    for model in models {
        let Some(source) = model.spec.registry.clone() else {
            continue;
        };
        if source.name != name {
            continue;
        }
        if let Err(e) = follow_model(ctx, name, mlflow, &model, &source, said).await {
            tracing::warn!(registry = %name, model = %model.name, error = %e, "following the registry failed");
            ok = false;
        }
    }
    ok
}

/// The version `revision` was registered from in this registry's model.
fn version_of<'a>(revision: &'a Revision, registry: &str, model: &str) -> Option<&'a str> {
    revision
        .spec
        .registry_version
        .as_ref()
        .filter(|v| v.registry == registry && v.model == model)
        .map(|v| v.version.as_str())
}

/// What rollgate holds for `model`, in `registry`'s versions.
fn held(
    model: &Model,
    revisions: &[Revision],
    rollouts: &[RolloutRecord],
    registry: &str,
    registered: &str,
) -> Held {
    let version = |id: &str| {
        revisions
            .iter()
            .find(|r| r.id == id)
            .and_then(|r| version_of(r, registry, registered))
            .map(str::to_string)
    };
    let mut judged: BTreeSet<String> = revisions
        .iter()
        .filter(|r| r.blocked)
        .filter_map(|r| version_of(r, registry, registered))
        .map(str::to_string)
        .collect();
    for r in rollouts.iter().filter(|r| r.spec.model == model.name) {
        if matches!(r.state.phase, Phase::RolledBack { .. } | Phase::Aborted)
            && let Some(v) = version(&r.spec.candidate)
        {
            judged.insert(v);
        }
    }
    Held {
        champion: model.champion.as_deref().map(version),
        active: rollouts
            .iter()
            .find(|r| r.spec.model == model.name && r.is_active())
            .map(|r| (r.id, version(&r.spec.candidate))),
        judged,
    }
}

async fn follow_model(
    ctx: &Context,
    name: &str,
    mlflow: &Mlflow<'_>,
    model: &Model,
    source: &RegistrySource,
    said: &mut BTreeSet<String>,
) -> Result<(), PassError> {
    let registered = source.registered_model(&model.name).to_string();
    let aliases = mlflow.aliases(&registered).await?;
    let m = model.name.clone();
    let (revisions, rollouts) = blocking(&ctx.store, move |st| {
        Ok((st.revisions(&m)?, st.rollouts(false)?))
    })
    .await?;
    let now = held(model, &revisions, &rollouts, name, &registered);
    let seen = Aliases {
        champion: aliases.get(&source.champion).cloned(),
        followed: aliases.get(&source.follow).cloned(),
    };
    let d = decide(&seen, &now);
    for c in &d.conflicts {
        say_conflict(ctx, name, model, source, c, said).await?;
    }
    let Some(act) = d.act else {
        return Ok(());
    };
    let version = match &act {
        Act::Seed(v) | Act::Start(v) => v.clone(),
    };
    let Some(revision) = revision_for(
        ctx,
        name,
        mlflow,
        model,
        source,
        &registered,
        &version,
        &revisions,
        said,
    )
    .await?
    else {
        return Ok(());
    };
    let (who, m, id) = (actor(name), model.name.clone(), revision.id.clone());
    match act {
        Act::Seed(_) => {
            let reason = format!(
                "seeded from registry {name}: {registered}@{} is version {version}",
                source.champion
            );
            blocking(&ctx.store, move |st| {
                st.set_champion(&m, &id, &who, &reason)
            })
            .await?;
            tracing::info!(registry = %name, model = %model.name, version, "champion seeded from the registry");
        }
        Act::Start(_) => {
            let plan = source.plan.clone().unwrap_or_default();
            match blocking(&ctx.store, move |st| {
                st.create_rollout(&m, &id, &plan, &who)
            })
            .await
            {
                Ok(r) => {
                    tracing::info!(registry = %name, model = %model.name, version, rollout = r.id, "rollout started from the registry")
                }
                // Another rollout started in between, or the revision was
                // rejected since the poll read it: the next poll sees it.
                Err(Error::Store(StoreError::Conflict(why) | StoreError::Invalid(why))) => {
                    tracing::info!(registry = %name, model = %model.name, version, why, "rollout not started")
                }
                Err(Error::Store(e @ StoreError::Rejected { .. })) => {
                    tracing::info!(registry = %name, model = %model.name, version, error = %e, "rollout not started")
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// The revision of `version`: the one registered from it before, else a
/// new one (its upstream from the model's template or the version's
/// `rollgate.upstream` tag). `None` (said once) when it has no upstream.
#[allow(clippy::too_many_arguments)]
async fn revision_for(
    ctx: &Context,
    name: &str,
    mlflow: &Mlflow<'_>,
    model: &Model,
    source: &RegistrySource,
    registered: &str,
    version: &str,
    revisions: &[Revision],
    said: &mut BTreeSet<String>,
) -> Result<Option<Revision>, PassError> {
    if let Some(r) = revisions
        .iter()
        .find(|r| version_of(r, name, registered) == Some(version))
    {
        return Ok(Some(r.clone()));
    }
    let info = mlflow.version(registered, version).await?;
    let Some(upstream) = source
        .upstream_of(version)
        .or_else(|| info.tags.get(UPSTREAM_TAG).cloned())
    else {
        let key = format!("{}/{version}/no-upstream", model.name);
        if said.insert(key) {
            let body = serde_json::json!({
                "registry": name, "registered_model": registered, "version": version,
                "problem": format!("the version has no {UPSTREAM_TAG} tag and the model no upstream template: not rolled out"),
            });
            note(ctx, &model.name, None, "registry_conflict", name, body).await?;
        }
        return Ok(None);
    };
    let spec = RevisionSpec {
        upstream,
        artifact: info.source.clone(),
        registry_version: Some(RegistryVersion {
            registry: name.to_string(),
            model: registered.to_string(),
            version: version.to_string(),
            source: info.source,
            run_id: info.run_id,
        }),
        ..RevisionSpec::default()
    };
    let (m, who) = (model.name.clone(), actor(name));
    match blocking(&ctx.store, move |st| st.register_revision(&m, &spec, &who)).await {
        Ok(r) => Ok(Some(r)),
        Err(Error::Store(StoreError::Invalid(why))) => {
            let key = format!("{}/{version}/invalid", model.name);
            if said.insert(key) {
                let body = serde_json::json!({
                    "registry": name, "registered_model": registered, "version": version,
                    "problem": format!("not a revision rollgate can route to: {why}"),
                });
                note(ctx, &model.name, None, "registry_conflict", name, body).await?;
            }
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

async fn say_conflict(
    ctx: &Context,
    name: &str,
    model: &Model,
    source: &RegistrySource,
    c: &Conflict,
    said: &mut BTreeSet<String>,
) -> Result<(), PassError> {
    let body = match c {
        Conflict::ChampionMoved {
            expected, found, ..
        } => serde_json::json!({
            "registry": name, "alias": source.champion, "expected": expected, "found": found,
            "problem": format!(
                "@{} was moved away from rollgate's champion during the rollout: reported, not followed; \
                 the rollout goes on and its verdict is written back when it ends",
                source.champion
            ),
        }),
        Conflict::FollowedMoved {
            rolling_out, found, ..
        } => serde_json::json!({
            "registry": name, "alias": source.follow, "rolling_out": rolling_out, "found": found,
            "problem": format!(
                "@{} names version {found} while another rollout is active: reported, not followed; \
                 it is rolled out once this rollout ends, if the alias still names it",
                source.follow
            ),
        }),
    };
    let key = format!("{}/{body}", c.rollout());
    if !said.insert(key) {
        return Ok(());
    }
    tracing::warn!(registry = %name, model = %model.name, rollout = c.rollout(), "{}", body["problem"].as_str().unwrap_or(""));
    note(
        ctx,
        &model.name,
        Some(c.rollout()),
        "registry_conflict",
        name,
        body,
    )
    .await
}

async fn note(
    ctx: &Context,
    model: &str,
    rollout: Option<i64>,
    kind: &'static str,
    registry: &str,
    body: serde_json::Value,
) -> Result<(), PassError> {
    let (model, who) = (model.to_string(), actor(registry));
    blocking(&ctx.store, move |st| {
        st.note(Note {
            model: &model,
            rollout,
            kind,
            actor: &who,
            body,
            cursor: None,
        })
    })
    .await?;
    Ok(())
}

/// Writes back, in order, every rollout end after the registry's cursor.
async fn write_back(ctx: &Context, name: &str, mlflow: &Mlflow<'_>) -> Result<(), PassError> {
    let cursor_name = cursor_name(name);
    let c = cursor_name.clone();
    let mut cursor = blocking(&ctx.store, move |st| {
        Ok(match st.notify_cursor(&c)? {
            Some(seq) => seq,
            None => {
                // A new registry hears of ends from now on.
                let head = st.audit_head()?.map_or(0, |(seq, _)| seq);
                st.set_notify_cursor(&c, head)?;
                head
            }
        })
    })
    .await?;
    loop {
        let filter = AuditFilter {
            after_seq: Some(cursor),
            limit: Some(200),
            ..AuditFilter::default()
        };
        let page = blocking(&ctx.store, move |st| st.audit(&filter)).await?;
        let Some(last) = page.last().map(|r| r.seq) else {
            return Ok(());
        };
        for rec in &page {
            if matches!(rec.kind.as_str(), "promoted" | "rolled_back" | "aborted")
                && !rec.body["dry_run"].as_bool().unwrap_or(false)
            {
                write_end(ctx, name, mlflow, rec).await?;
            }
        }
        let c = cursor_name.clone();
        blocking(&ctx.store, move |st| st.set_notify_cursor(&c, last)).await?;
        cursor = last;
    }
}

/// Writes one rollout's end back, if its candidate came from this
/// registry, and records it with the cursor moved past it.
async fn write_end(
    ctx: &Context,
    name: &str,
    mlflow: &Mlflow<'_>,
    rec: &AuditRecord,
) -> Result<(), PassError> {
    let Some(id) = rec.rollout else {
        return Ok(());
    };
    let found = blocking(&ctx.store, move |st| {
        let r = st.rollout(id)?;
        let candidate = st.revision(&r.spec.candidate)?;
        let model = st.model(&r.spec.model).ok();
        Ok((r, candidate, model))
    })
    .await;
    let (rollout, candidate, model) = match found {
        Ok(f) => f,
        Err(Error::Store(StoreError::NotFound { .. })) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let Some(v) = candidate
        .spec
        .registry_version
        .clone()
        .filter(|v| v.registry == name)
    else {
        return Ok(());
    };
    // The aliases as the model names them now (the defaults if it no
    // longer follows this registry).
    let source = model
        .as_ref()
        .and_then(|m| m.spec.registry.clone())
        .filter(|s| s.name == name)
        .unwrap_or_else(|| RegistrySource {
            name: name.to_string(),
            registered_model: None,
            follow: "challenger".into(),
            champion: "champion".into(),
            upstream: None,
            plan: None,
        });
    let verdict = match &rollout.state.phase {
        Phase::Promoted { .. } => "promoted",
        Phase::RolledBack { .. } => "rolled_back",
        Phase::Aborted => "aborted",
        _ => return Ok(()),
    };
    let (moved, tags) = write_verdict(mlflow, &v, &source, verdict, &rollout, rec).await?;
    let said: Vec<String> = moved.iter().map(|(a, how)| format!("@{a} {how}")).collect();
    let body = serde_json::json!({
        "written": format!(
            "version {} of {}: {}tagged {verdict}",
            v.version,
            v.model,
            said.iter().map(|s| format!("{s}, ")).collect::<String>()
        ),
        "registry": name, "registered_model": v.model, "version": v.version,
        "verdict": verdict, "aliases": moved,
        "tags": tags.iter().map(|(k, v)| (k.to_string(), v.clone())).collect::<BTreeMap<_, _>>(),
        "end": rec.seq,
    });
    let (model, who, c, seq) = (
        rollout.spec.model.clone(),
        actor(name),
        cursor_name(name),
        rec.seq,
    );
    blocking(&ctx.store, move |st| {
        st.note(Note {
            model: &model,
            rollout: Some(id),
            kind: "registry_written",
            actor: &who,
            body,
            cursor: Some((&c, seq)),
        })
    })
    .await?;
    tracing::info!(registry = %name, rollout = id, verdict, version = %v.version, "verdict written back to the registry");
    Ok(())
}

/// The registry writes of one end: the aliases moved, then the tags,
/// each idempotent (a repeated pass writes the same again).
async fn write_verdict(
    mlflow: &Mlflow<'_>,
    v: &RegistryVersion,
    source: &RegistrySource,
    verdict: &'static str,
    rollout: &RolloutRecord,
    rec: &AuditRecord,
) -> Result<(BTreeMap<String, &'static str>, Vec<(&'static str, String)>), PassError> {
    let mut moved = BTreeMap::new();
    if verdict == "promoted" {
        mlflow
            .set_alias(&v.model, &source.champion, &v.version)
            .await?;
        moved.insert(source.champion.clone(), "set");
    }
    let aliases = mlflow.aliases(&v.model).await?;
    if aliases.get(&source.follow) == Some(&v.version) {
        mlflow.delete_alias(&v.model, &source.follow).await?;
        moved.insert(source.follow.clone(), "removed");
    }
    // The verdict last: a reader who sees it sees the rest.
    let mut tags = vec![
        ("rollgate.rollout", rollout.id.to_string()),
        ("rollgate.audit", format!("{}:{}", rec.seq, rec.hash)),
    ];
    if verdict != "promoted" {
        tags.push((
            "rollgate.reason",
            rollgate_core::words::phase_line(&rollout.state.phase),
        ));
    }
    tags.push(("rollgate.verdict", verdict.to_string()));
    for (key, value) in &tags {
        mlflow.set_tag(&v.model, &v.version, key, value).await?;
    }
    Ok((moved, tags))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_config_reads_with_its_defaults() {
        let c: RegistryConfig = toml_like(r#"{"url": "http://mlflow:5000"}"#);
        assert_eq!(c.kind, RegistryKind::Mlflow);
        assert_eq!(
            (c.poll, c.timeout),
            (Duration::from_secs(10), Duration::from_secs(5))
        );
        assert!(serde_json::from_str::<RegistryConfig>(r#"{"url": "x", "token": "t"}"#).is_err());
    }

    fn toml_like(json: &str) -> RegistryConfig {
        serde_json::from_str(json).expect("config")
    }
}
