//! Adapters that set the weights of a data plane rollgate does not run
//! (`ModelSpec::data_plane`): nginx, Envoy, or anything behind a webhook. The
//! leading controller brings each such model's data plane to the routing
//! the store holds, and remembers the routing version each confirmed; a
//! rollout's stage clock starts only once its routing is confirmed
//! (`Observation::routing_applied`), and a rollback is sent to the data
//! plane as champion-only routing before it is committed.

mod envoy;
mod nginx;
mod webhook;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use rollgate_core::{Epoch, epoch_label};
use rollgate_store::{DataPlane, ModelRoutes};
use serde::Serialize;
use tokio::time::Instant;

use crate::http::HttpClient;

pub use nginx::render as render_nginx;

/// What a data plane must hold before it first starts (nginx and Envoy
/// read rollgate's files at start-up): the files the adapter itself would
/// write for a champion-only routing of `model` to `upstream`, under the
/// version `"seed"`, as `(what, contents)`. The adapter rewrites them at
/// the first routing it applies (when the model has a champion).
pub fn seed(
    plane: &DataPlane,
    model: &str,
    upstream: &str,
) -> Result<Vec<(String, String)>, AdapterError> {
    let desired = Desired {
        model: model.to_string(),
        version: "seed".into(),
        rollout: None,
        epoch: 0,
        arms: vec![Arm {
            role: "champion",
            revision: "seed".into(),
            upstream: upstream.to_string(),
            weight_bp: 10_000,
        }],
    };
    servable(&desired)?;
    match plane {
        DataPlane::Nginx {
            include_file, key, ..
        } => Ok(vec![(include_file.clone(), render_nginx(&desired, key)?)]),
        DataPlane::Envoy {
            routes_file,
            clusters_file,
            key_header,
            route_config_name,
            ..
        } => {
            let (routes, clusters) =
                envoy::seed(&desired, route_config_name.as_deref(), key_header)?;
            Ok(vec![
                (routes_file.clone(), format!("{routes:#}\n")),
                (clusters_file.clone(), format!("{clusters:#}\n")),
            ])
        }
        DataPlane::Webhook { .. } => Ok(vec![]),
    }
}

/// `name` as part of an identifier in a data plane's configuration.
fn ident(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// Replaces `path` with `bytes` in one rename: a data plane watching or
/// reloading it never reads half a file.
fn write_atomically(path: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = format!("{path}.rollgate-tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// What a data plane must route for one model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Desired {
    pub model: String,
    /// Names this routing: the rollout's epoch label while one is active
    /// (`"<rollout>.<epoch>"`), else `"champion:<revision>"`. The data
    /// plane confirms by answering it.
    pub version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<i64>,
    pub epoch: Epoch,
    /// The revisions to route to, the champion first; weights in basis
    /// points add up to 10,000.
    pub arms: Vec<Arm>,
}

/// One revision a data plane routes to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Arm {
    pub role: &'static str,
    pub revision: String,
    pub upstream: String,
    pub weight_bp: u32,
}

impl Desired {
    /// The routing `routes` asks of a data plane (mirroring is not a data
    /// plane's: a shadow needs rollgate's gateway).
    pub fn of(routes: &ModelRoutes) -> Desired {
        let model = routes.model.name.clone();
        let candidate = routes
            .rollout
            .as_ref()
            .filter(|(_, routing, _)| routing.candidate_weight_bp > 0);
        let share = candidate.map_or(0, |(_, r, _)| r.candidate_weight_bp.min(10_000));
        let mut arms = Vec::with_capacity(2);
        if let Some(champion) = &routes.champion {
            arms.push(Arm {
                role: "champion",
                revision: champion.id.clone(),
                upstream: champion.spec.upstream.clone(),
                weight_bp: 10_000 - share,
            });
        }
        if let Some((rev, _, _)) = candidate {
            arms.push(Arm {
                role: "candidate",
                revision: rev.id.clone(),
                upstream: rev.spec.upstream.clone(),
                weight_bp: share,
            });
        }
        let (version, rollout, epoch) = match &routes.rollout {
            Some((_, routing, id)) => (epoch_label(*id, routing.epoch), Some(*id), routing.epoch),
            None => (
                format!(
                    "champion:{}",
                    routes.champion.as_ref().map_or("none", |c| c.id.as_str())
                ),
                None,
                0,
            ),
        };
        Desired {
            model,
            version,
            rollout,
            epoch,
            arms,
        }
    }
}

/// Why a data plane did not confirm a routing.
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    #[error("the webhook at {url} did not answer")]
    Unreachable { url: String },
    #[error("the webhook at {url} answered {status}: {body}")]
    Refused {
        url: String,
        status: u16,
        body: String,
    },
    #[error("the data plane confirmed {got:?}, not {want:?}")]
    OtherVersion { want: String, got: String },
    #[error("{0}")]
    Io(String),
    #[error("cannot route {upstream:?}: {why}")]
    Unroutable { upstream: String, why: String },
}

#[derive(Debug, Clone)]
struct Confirmed {
    version: String,
    rollout: Option<i64>,
    epoch: Epoch,
}

/// The routing each adapter-routed model's data plane confirmed, and when
/// to try again one that failed.
#[derive(Debug, Default)]
pub struct Applier {
    confirmed: Mutex<BTreeMap<String, Confirmed>>,
    retry: Mutex<BTreeMap<String, (Instant, u32)>>,
    /// The store's `routes_version` at the last pass that synced every
    /// model.
    synced: Mutex<Option<u64>>,
    /// Models left unrouted for want of a champion (each said once).
    no_champion: Mutex<std::collections::BTreeSet<String>>,
}

/// How long an apply may take (a reload and its confirmation included).
const APPLY_TIMEOUT: Duration = Duration::from_secs(10);

impl Applier {
    /// The latest epoch of `rollout` the model's data plane confirmed (0:
    /// none yet).
    pub fn applied_epoch(&self, model: &str, rollout: i64) -> Epoch {
        let confirmed = self.confirmed.lock().unwrap_or_else(|p| p.into_inner());
        confirmed
            .get(model)
            .filter(|c| c.rollout == Some(rollout))
            .map_or(0, |c| c.epoch)
    }

    /// Whether a pass must read the routes: they changed since the last
    /// sync (`routes_version`), or a failed routing waits to be sent again.
    pub fn needs_sync(&self, routes_version: u64) -> bool {
        let synced = *self.synced.lock().unwrap_or_else(|p| p.into_inner());
        synced != Some(routes_version)
            || !self
                .retry
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
    }

    /// Records that every model was synced to the routes of
    /// `routes_version`.
    pub fn synced(&self, routes_version: u64) {
        *self.synced.lock().unwrap_or_else(|p| p.into_inner()) = Some(routes_version);
    }

    fn is_confirmed(&self, desired: &Desired) -> bool {
        let confirmed = self.confirmed.lock().unwrap_or_else(|p| p.into_inner());
        confirmed
            .get(&desired.model)
            .is_some_and(|c| c.version == desired.version)
    }

    /// Brings the model's data plane to `routes` unless it already
    /// confirmed them, or a failed attempt's back-off has not passed
    /// (unless `now_or_never`: a rollback's champion-only routing goes at
    /// once). A model without a champion has nothing to route: its data
    /// plane is left as it is (as seeded) until a champion is set.
    pub async fn sync(
        &self,
        http: &HttpClient,
        plane: &DataPlane,
        routes: &ModelRoutes,
        now_or_never: bool,
    ) {
        let desired = Desired::of(routes);
        if desired.arms.is_empty() {
            let mut waiting = self.no_champion.lock().unwrap_or_else(|p| p.into_inner());
            if waiting.insert(desired.model.clone()) {
                tracing::info!(model = %desired.model, "no champion yet: its data plane is left as it is until one is set");
            }
            return;
        }
        self.no_champion
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&desired.model);
        if self.is_confirmed(&desired) {
            return;
        }
        let model = desired.model.clone();
        if !now_or_never {
            let retry = self.retry.lock().unwrap_or_else(|p| p.into_inner());
            if retry
                .get(&model)
                .is_some_and(|(at, _)| *at > Instant::now())
            {
                return;
            }
        }
        let applied = tokio::time::timeout(APPLY_TIMEOUT, apply(http, plane, &desired))
            .await
            .unwrap_or_else(|_| Err(AdapterError::Io("timed out".into())));
        match applied {
            Ok(()) => {
                tracing::info!(model = %model, version = %desired.version, "data plane confirmed the routing");
                self.retry
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&model);
                self.confirmed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(
                        model,
                        Confirmed {
                            version: desired.version,
                            rollout: desired.rollout,
                            epoch: desired.epoch,
                        },
                    );
            }
            Err(e) => {
                let mut retry = self.retry.lock().unwrap_or_else(|p| p.into_inner());
                let failures = retry.get(&model).map_or(0, |(_, n)| *n) + 1;
                // 250 ms, doubling, at most 30 s.
                let wait =
                    Duration::from_millis(250 << failures.min(7)).min(Duration::from_secs(30));
                tracing::warn!(model = %model, version = %desired.version, "data plane did not confirm the routing (try {failures}, again in {wait:?}): {e}");
                retry.insert(model, (Instant::now() + wait, failures));
            }
        }
    }
}

/// Whether `desired` can serve: at least one arm, weights adding up to
/// the whole, every live arm's upstream an `http(s)://host` URL (the rule
/// revisions are registered under).
/// Checked before any adapter writes anything: no adapter ever puts a
/// routing in force that would answer users with errors.
pub fn servable(desired: &Desired) -> Result<(), AdapterError> {
    let unroutable = |upstream: &str, why: &str| AdapterError::Unroutable {
        upstream: upstream.to_string(),
        why: why.to_string(),
    };
    if desired.arms.is_empty() {
        return Err(unroutable("", "no revision to route to (no champion)"));
    }
    let total: u32 = desired.arms.iter().map(|a| a.weight_bp).sum();
    if total != 10_000 {
        return Err(unroutable(
            "",
            &format!("the weights add up to {total} basis points, not 10000"),
        ));
    }
    for arm in desired.arms.iter().filter(|a| a.weight_bp > 0) {
        // The one upstream rule revisions are registered under.
        if let Err(e) = rollgate_core::spec::check_upstream_url("upstream", &arm.upstream) {
            return Err(unroutable(&arm.upstream, &e.to_string()));
        }
    }
    Ok(())
}

/// Applies `desired` through the model's adapter and waits for its
/// confirmation; a routing that cannot serve is refused before anything is
/// written.
async fn apply(
    http: &HttpClient,
    plane: &DataPlane,
    desired: &Desired,
) -> Result<(), AdapterError> {
    servable(desired)?;
    match plane {
        DataPlane::Webhook {
            url,
            bearer_token_file,
        } => webhook::apply(http, url, bearer_token_file.as_deref(), desired).await,
        DataPlane::Nginx {
            include_file,
            reload_command,
            confirm_url,
            key,
        } => {
            nginx::apply(
                http,
                include_file,
                reload_command,
                confirm_url,
                key,
                desired,
            )
            .await
        }
        DataPlane::Envoy {
            routes_file,
            clusters_file,
            admin_url,
            route_config_name,
            key_header,
            mirror_cluster,
        } => {
            let files = envoy::Files {
                routes_file,
                clusters_file,
                admin_url: admin_url.trim_end_matches('/'),
                route_config_name: route_config_name.as_deref(),
                key_header,
                mirror_cluster: mirror_cluster.as_deref(),
            };
            envoy::apply(http, &files, desired).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arm(role: &'static str, upstream: &str, weight_bp: u32) -> Arm {
        Arm {
            role,
            revision: format!("r-{role}"),
            upstream: upstream.into(),
            weight_bp,
        }
    }

    /// Every adapter kind refuses a routing that cannot serve before it
    /// writes a file, runs a command or calls anyone.
    #[tokio::test]
    async fn no_adapter_writes_a_routing_that_cannot_serve() {
        let dir = tempfile::tempdir().expect("tempdir");
        let at = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
        let planes = [
            DataPlane::Nginx {
                include_file: at("m.conf"),
                reload_command: vec!["touch".into(), at("reloaded")],
                confirm_url: "http://127.0.0.1:9/v".into(),
                key: "$http_x_rollgate_key".into(),
            },
            DataPlane::Envoy {
                routes_file: at("m.rds.json"),
                clusters_file: at("cds.json"),
                admin_url: "http://127.0.0.1:9".into(),
                route_config_name: None,
                key_header: "x-rollgate-key".into(),
                mirror_cluster: None,
            },
            DataPlane::Webhook {
                url: "http://127.0.0.1:9/r".into(),
                bearer_token_file: None,
            },
        ];
        let unservable = [
            vec![],
            vec![arm("champion", "http://10.0.0.5:8080", 9_000)],
            vec![
                arm("champion", "http://10.0.0.5:8080", 5_000),
                arm("candidate", "http://", 5_000),
            ],
            vec![arm("champion", "unix:/run/model.sock", 10_000)],
        ];
        let http = HttpClient::new(Duration::from_secs(1));
        for plane in &planes {
            for arms in &unservable {
                let desired = Desired {
                    model: "m".into(),
                    version: "1.1".into(),
                    rollout: Some(1),
                    epoch: 1,
                    arms: arms.clone(),
                };
                let e = apply(&http, plane, &desired).await.expect_err("refused");
                assert!(
                    matches!(e, AdapterError::Unroutable { .. }),
                    "{}: {e}",
                    plane.kind()
                );
            }
        }
        let written: Vec<_> = std::fs::read_dir(dir.path()).expect("dir").collect();
        assert!(written.is_empty(), "nothing written or run: {written:?}");
        // A champion-only routing and a split are servable.
        let ok = |arms| Desired {
            model: "m".into(),
            version: "champion:r".into(),
            rollout: None,
            epoch: 0,
            arms,
        };
        assert!(servable(&ok(vec![arm("champion", "http://10.0.0.5:8080", 10_000)])).is_ok());
        assert!(
            servable(&ok(vec![
                arm("champion", "http://10.0.0.5:8080", 9_500),
                arm("candidate", "https://m.internal", 500),
            ]))
            .is_ok()
        );
    }

    #[test]
    fn a_pass_reads_the_routes_only_when_they_moved_or_a_routing_waits() {
        let a = Applier::default();
        assert!(a.needs_sync(3), "never synced");
        a.synced(3);
        assert!(!a.needs_sync(3), "nothing changed");
        assert!(a.needs_sync(4), "the routes moved");
        a.retry
            .lock()
            .expect("retry")
            .insert("m".into(), (Instant::now(), 1));
        assert!(a.needs_sync(3), "a failed routing waits to be sent again");
    }
}
