//! Following a model registry (MLflow's): its alias starts rollouts, and
//! rollgate's verdicts go back to it.
//!
//! The registry says which version *should* serve; rollgate decides
//! whether it *may*, and says so back. One task per declared registry,
//! only while this controller leads, each pass in this order:
//!
//! 1. **Write back** (`write_back.rs`) what ended since the last pass,
//!    read from the audit log as notifications are (the log is the outbox;
//!    the registry has a cursor in the store). A registry that is down
//!    delays this and loses nothing; the poll waits until it is done, so no
//!    alias is read stale.
//! 2. **Poll** each following model's aliases (one call each) and act by
//!    [`decide`]: seed a champion, or register a version and start its
//!    rollout; conflicts are recorded (`registry_conflict`), once per
//!    rollout and alias position while the process runs.
//!
//! A registry that is down or slow holds up only its own task: every call
//! is bounded, nothing is started or decided for want of an answer, and a
//! controller that stops leading mid-pass stops before its next write.

use std::collections::BTreeSet;

use rollgate_core::Phase;
use rollgate_store::{
    Model, Note, RegistrySource, RegistryVersion, Revision, RevisionSpec, RolloutRecord,
    StoreError, UPSTREAM_TAG,
};

use crate::context::{Context, Error, blocking};

pub mod decide;
pub mod mlflow;
pub mod webhook;
mod write_back;

pub use crate::host::{RegistryConfig, RegistryKind};
pub use decide::{Act, Aliases, Conflict, Decision, Held, decide};
use mlflow::{Mlflow, RegistryError};

/// Who the follower acts as in the audit log.
pub fn actor(registry: &str) -> String {
    format!("registry:{registry}")
}

/// What stops a pass.
#[derive(Debug, thiserror::Error)]
enum PassError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("store: {0}")]
    Store(#[from] Error),
    #[error("this controller no longer leads")]
    NotLeading,
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
    // The record whose write-back failed last, and how many passes it has.
    let mut attempts = (0, 0);
    let wake = ctx.registry_signals.wake_of(&name);
    loop {
        if ctx.leader.fence().is_none() {
            tokio::time::sleep(ctx.tick).await;
            continue;
        }
        let ok = match ctx.host.registry_token(&name) {
            Ok(token) => {
                let mut f = Follower {
                    ctx: &ctx,
                    name: &name,
                    config: &config,
                    mlflow: Mlflow {
                        http: &http,
                        base: config.url.trim_end_matches('/'),
                        token,
                    },
                    said: &mut said,
                    attempts: &mut attempts,
                };
                f.pass().await
            }
            Err(e) => {
                tracing::error!(registry = %name, error = %e, "registry not followed");
                false
            }
        };
        ctx.metrics.registry_pass(&name, ok);
        tokio::select! {
            _ = tokio::time::sleep(config.poll) => {}
            _ = wake.notified() => {}
        }
    }
}

/// One pass over one registry.
struct Follower<'a> {
    ctx: &'a Context,
    name: &'a str,
    config: &'a RegistryConfig,
    mlflow: Mlflow<'a>,
    said: &'a mut BTreeSet<String>,
    /// `(seq, passes)`: the audit record whose write-back failed last.
    attempts: &'a mut (u64, u32),
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

/// What rollgate holds for `model`, in `registry`'s versions. Only
/// enforced rollouts judge a version (a dry run decides nothing).
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
        if r.spec.plan.mode.is_enforce()
            && matches!(r.state.phase, Phase::RolledBack { .. } | Phase::Aborted)
            && let Some(v) = version(&r.spec.candidate)
        {
            judged.insert(v);
        }
    }
    let active = rollouts
        .iter()
        .find(|r| r.spec.model == model.name && r.is_active());
    // While a rollout watches after promotion the registry's champion
    // alias still names the previous champion: it moves when the watch
    // ends, so that is the champion it is expected to name.
    let champion = match active {
        Some(r) if matches!(r.state.phase, Phase::Watching { .. }) => Some(&r.spec.champion),
        _ => model.champion.as_ref(),
    };
    Held {
        champion: champion.map(|c| version(c)),
        active: active.map(|r| (r.id, version(&r.spec.candidate))),
        judged,
    }
}

/// Whether a tag may name `upstream`: its host is one the registry's
/// config lists (`tag_upstream_hosts`: a name, or `*.suffix`).
fn tag_may_name(hosts: &[String], upstream: &str) -> bool {
    let Ok(uri) = upstream.parse::<http::Uri>() else {
        return false;
    };
    let Some(host) = uri.host().map(str::to_ascii_lowercase) else {
        return false;
    };
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return false;
    }
    hosts.iter().any(|h| {
        let h = h.to_ascii_lowercase();
        match h.strip_prefix("*.") {
            Some(suffix) => host.ends_with(&format!(".{suffix}")),
            None => host == h,
        }
    })
}

impl Follower<'_> {
    fn leading(&self) -> Result<(), PassError> {
        match self.ctx.leader.fence() {
            Some(_) => Ok(()),
            None => Err(PassError::NotLeading),
        }
    }

    /// Writes back, then polls; whether the pass ended.
    async fn pass(&mut self) -> bool {
        if let Err(e) = self.write_back().await {
            tracing::warn!(registry = %self.name, error = %e, "writing verdicts back failed; retrying");
            return false;
        }
        self.poll().await
    }

    /// Polls every model that follows this registry; one model's failure
    /// is logged and the others go on.
    async fn poll(&mut self) -> bool {
        let models = match blocking(&self.ctx.store, |st| st.models()).await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(registry = %self.name, error = %e, "listing models failed");
                return false;
            }
        };
        let mut ok = true;
        for model in models {
            let Some(source) = model.spec.registry.clone() else {
                continue;
            };
            if source.name != self.name {
                continue;
            }
            if let Err(e) = self.follow_model(&model, &source).await {
                tracing::warn!(registry = %self.name, model = %model.name, error = %e, "following the registry failed");
                ok = false;
                if matches!(e, PassError::NotLeading) {
                    break;
                }
            }
        }
        ok
    }

    async fn follow_model(
        &mut self,
        model: &Model,
        source: &RegistrySource,
    ) -> Result<(), PassError> {
        self.leading()?;
        let registered = source.registered_model(&model.name).to_string();
        let aliases = self.mlflow.aliases(&registered).await?;
        let m = model.name.clone();
        // Read after the registry answered, all at once.
        let (model, revisions, rollouts) = blocking(&self.ctx.store, move |st| {
            Ok((st.model(&m)?, st.revisions(&m)?, st.rollouts(false)?))
        })
        .await?;
        let model = &model;
        let now = held(model, &revisions, &rollouts, self.name, &registered);
        let seen = Aliases {
            champion: aliases.get(&source.champion).cloned(),
            followed: aliases.get(&source.follow).cloned(),
        };
        let d = decide(&seen, &now);
        for c in &d.conflicts {
            self.say_conflict(model, source, c).await?;
        }
        let Some(act) = d.act else {
            return Ok(());
        };
        let version = match &act {
            Act::Seed(v) | Act::Start(v) => v.clone(),
        };
        let Some(revision) = self
            .revision_for(model, source, &registered, &version, &revisions)
            .await?
        else {
            return Ok(());
        };
        self.leading()?;
        let (who, m, id) = (actor(self.name), model.name.clone(), revision.id.clone());
        match act {
            Act::Seed(_) => {
                let reason = format!(
                    "seeded from registry {}: {registered}@{} is version {version}",
                    self.name, source.champion
                );
                // Only while it still has none (an admin may have set one
                // since the poll read it).
                let seeded = blocking(&self.ctx.store, move |st| {
                    st.seed_champion(&m, &id, &who, &reason)
                })
                .await?;
                if seeded.is_some() {
                    tracing::info!(registry = %self.name, model = %model.name, version, "champion seeded from the registry");
                }
            }
            Act::Start(_) => {
                let plan = source.plan.clone().unwrap_or_default();
                match blocking(&self.ctx.store, move |st| {
                    st.create_rollout(&m, &id, &plan, &who)
                })
                .await
                {
                    Ok(r) => {
                        tracing::info!(registry = %self.name, model = %model.name, version, rollout = r.id, "rollout started from the registry")
                    }
                    // Another rollout started in between: the next poll sees it.
                    Err(Error::Store(StoreError::Conflict(why))) => {
                        tracing::info!(registry = %self.name, model = %model.name, version, why, "rollout not started")
                    }
                    // The plan cannot run on this model, or the revision
                    // was rejected since the poll read it: said once.
                    Err(Error::Store(
                        e @ (StoreError::Invalid(_) | StoreError::Rejected { .. }),
                    )) => {
                        let problem = format!("version {version} was not rolled out: {e}");
                        self.say_once(model, &registered, &version, "not-started", problem)
                            .await?;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    /// The revision of `version`: the one registered from it before, else
    /// a new one (its upstream from the model's template, or the version's
    /// `rollgate.upstream` tag where the registry's config lets tags name
    /// its host). `None` (said once) when it has none rollgate may use.
    async fn revision_for(
        &mut self,
        model: &Model,
        source: &RegistrySource,
        registered: &str,
        version: &str,
        revisions: &[Revision],
    ) -> Result<Option<Revision>, PassError> {
        if let Some(r) = revisions
            .iter()
            .find(|r| version_of(r, self.name, registered) == Some(version))
        {
            return Ok(Some(r.clone()));
        }
        let info = self.mlflow.version(registered, version).await?;
        let upstream = match (source.upstream_of(version), info.tags.get(UPSTREAM_TAG)) {
            (Some(u), _) => u,
            (None, Some(tagged)) if tag_may_name(&self.config.tag_upstream_hosts, tagged) => {
                tagged.clone()
            }
            (None, tagged) => {
                let problem = match tagged {
                    Some(t) => format!(
                        "its {UPSTREAM_TAG} tag names {t:?}, a host [registries.{}] tag_upstream_hosts \
                         does not list: not rolled out",
                        self.name
                    ),
                    None => format!(
                        "it has no {UPSTREAM_TAG} tag and the model no upstream template: not rolled out"
                    ),
                };
                self.say_once(model, registered, version, "no-upstream", problem)
                    .await?;
                return Ok(None);
            }
        };
        let spec = RevisionSpec {
            upstream,
            artifact: info.source.clone(),
            registry_version: Some(RegistryVersion {
                registry: self.name.to_string(),
                model: registered.to_string(),
                version: version.to_string(),
                source: info.source,
                run_id: info.run_id,
                follow: source.follow.clone(),
                champion: source.champion.clone(),
            }),
            ..RevisionSpec::default()
        };
        self.leading()?;
        let (m, who) = (model.name.clone(), actor(self.name));
        match blocking(&self.ctx.store, move |st| {
            st.register_revision(&m, &spec, &who)
        })
        .await
        {
            Ok(r) => Ok(Some(r)),
            Err(Error::Store(StoreError::Invalid(why))) => {
                let problem = format!("not a revision rollgate can route to: {why}");
                self.say_once(model, registered, version, "invalid", problem)
                    .await?;
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Records a version's problem once while this process runs.
    async fn say_once(
        &mut self,
        model: &Model,
        registered: &str,
        version: &str,
        what: &str,
        problem: String,
    ) -> Result<(), PassError> {
        let key = format!("{}/{version}/{what}", model.name);
        if self.said.contains(&key) {
            return Ok(());
        }
        tracing::warn!(registry = %self.name, model = %model.name, version, "{problem}");
        let body = serde_json::json!({
            "registry": self.name, "registered_model": registered, "version": version,
            "problem": problem,
        });
        self.note(&model.name, None, "registry_conflict", body)
            .await?;
        // Only once recorded: a note that failed is tried again.
        self.said.insert(key);
        Ok(())
    }

    async fn say_conflict(
        &mut self,
        model: &Model,
        source: &RegistrySource,
        c: &Conflict,
    ) -> Result<(), PassError> {
        let body = match c {
            Conflict::ChampionMoved {
                expected, found, ..
            } => serde_json::json!({
                "registry": self.name, "alias": source.champion, "expected": expected, "found": found,
                "problem": format!(
                    "@{} was moved away from rollgate's champion during the rollout: reported, not followed; \
                     the rollout goes on and its verdict is written back when it ends",
                    source.champion
                ),
            }),
            Conflict::FollowedMoved {
                rolling_out, found, ..
            } => serde_json::json!({
                "registry": self.name, "alias": source.follow, "rolling_out": rolling_out, "found": found,
                "problem": format!(
                    "@{} names version {found} while another rollout is active: reported, not followed; \
                     it is rolled out once this rollout ends, if the alias still names it",
                    source.follow
                ),
            }),
        };
        let key = format!("{}/{body}", c.rollout());
        if self.said.contains(&key) {
            return Ok(());
        }
        tracing::warn!(registry = %self.name, model = %model.name, rollout = c.rollout(), "{}", body["problem"].as_str().unwrap_or(""));
        self.note(&model.name, Some(c.rollout()), "registry_conflict", body)
            .await?;
        self.said.insert(key);
        Ok(())
    }

    /// Appends an audit record as the follower (with a cursor: only if it
    /// is behind `seq`, moved in the same transaction).
    async fn note(
        &self,
        model: &str,
        rollout: Option<i64>,
        kind: &'static str,
        body: serde_json::Value,
    ) -> Result<(), PassError> {
        self.note_at(model, rollout, kind, body, None).await
    }

    async fn note_at(
        &self,
        model: &str,
        rollout: Option<i64>,
        kind: &'static str,
        body: serde_json::Value,
        cursor: Option<u64>,
    ) -> Result<(), PassError> {
        self.leading()?;
        let (model, who, c) = (
            model.to_string(),
            actor(self.name),
            write_back::cursor_name(self.name),
        );
        blocking(&self.ctx.store, move |st| {
            st.note(Note {
                model: &model,
                rollout,
                kind,
                actor: &who,
                body,
                cursor: cursor.map(|seq| (c.as_str(), seq)),
            })
        })
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_tag_names_only_the_hosts_the_config_lists() {
        let hosts = vec!["models.internal".to_string(), "*.serving.svc".to_string()];
        assert!(tag_may_name(&hosts, "http://models.internal:8080"));
        assert!(tag_may_name(&hosts, "https://fraud-v2.serving.svc/v1"));
        assert!(!tag_may_name(&hosts, "http://serving.svc"));
        assert!(!tag_may_name(&hosts, "http://evil.example"));
        assert!(!tag_may_name(&hosts, "http://models.internal.evil.example"));
        assert!(!tag_may_name(&hosts, "http://x@models.internal"));
        assert!(!tag_may_name(&[], "http://models.internal"));
    }

    /// The example of docs/config.md ("MLflow") reads, and the host takes
    /// it, as written.
    #[test]
    fn the_documented_example_reads_as_written() {
        let doc = include_str!("../../../../docs/config.md");
        let section = doc.split("\n## MLflow").nth(1).expect("the MLflow section");
        let block = |lang: &str| {
            section
                .split(&format!("```{lang}"))
                .nth(1)
                .and_then(|b| b.split("```").next())
                .expect("a block")
                .to_string()
        };
        let config: toml::Value = toml::from_str(&block("toml")).expect("TOML");
        let registries: std::collections::BTreeMap<String, RegistryConfig> = config["registries"]
            .clone()
            .try_into()
            .expect("[registries]");
        let credentials: std::collections::BTreeMap<String, crate::host::Credential> =
            config["credentials"]
                .clone()
                .try_into()
                .expect("[credentials]");
        let host = crate::host::Host::new(Default::default(), credentials)
            .and_then(|h| h.with_registries(registries))
            .expect("the host takes it");
        let mlflow = &host.registries()["mlflow"];
        assert_eq!(mlflow.tag_upstream_hosts, ["*.models.svc.cluster.local"]);
        let spec: serde_json::Value = serde_json::from_str(&block("json")).expect("JSON");
        let source: RegistrySource =
            serde_json::from_value(spec["spec"]["registry"].clone()).expect("a source");
        source.validate().expect("valid");
        assert_eq!(
            source.upstream_of("7").as_deref(),
            Some("http://fraud-v7.models:8080")
        );
    }

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
