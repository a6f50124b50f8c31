//! What the controller's host lets an API caller name, and nothing more.
//!
//! The admin API is not the host: an adapter writes files and runs
//! commands, a credential is a file whose contents leave the host as a
//! bearer token. So only the operator's config defines them
//! (`[data_planes.NAME]`, `[credentials.NAME]`), and a model spec may only
//! refer to one by name. A credential goes only to the URL it was declared
//! for, checked where it is sent, not only where it is named.
//!
//! Specs stored before names held the definitions themselves
//! ([`DataPlaneRef::Inline`], `bearer_token_file`). They are honoured only
//! while the config declares an identical entry; otherwise the model is
//! isolated (its adapter never runs, its token is never read) with a reason
//! that says what to declare.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use rollgate_store::{DataPlane, DataPlaneRef, ModelSpec, PrometheusEvidence};
use serde::{Deserialize, Serialize};

/// `[credentials.NAME]`: a secret file, and the one URL it may be sent to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credential {
    /// The file holding the token (read at every use, so a rotated token
    /// is used without a restart).
    pub file: PathBuf,
    /// Where the token may go: a request carries it only to this scheme,
    /// host and port, and under this path.
    pub url: String,
}

/// `[registries.NAME]`: a model registry (MLflow's) model specs may follow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    /// The registry's kind: `mlflow` (the only one so far).
    #[serde(default)]
    pub kind: RegistryKind,
    /// The tracking server's base URL (e.g. `http://mlflow.ml:5000`).
    pub url: String,
    /// A `[credentials.NAME]` whose token is sent to `url` as a bearer
    /// token (declared for that URL).
    #[serde(default)]
    pub credential: Option<String>,
    /// How often each following model's aliases are read.
    #[serde(default = "default_poll", with = "humantime_serde")]
    pub poll: Duration,
    /// Each call's bound.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// The secret MLflow signs its webhook deliveries with, in a file: set,
    /// `POST /api/v1/registries/NAME/webhook` takes them (each verified
    /// delivery wakes the poll at once); unset, it answers 404.
    #[serde(default)]
    pub webhook_secret_file: Option<PathBuf>,
    /// The hosts a version's `rollgate.upstream` tag may name (a name, or
    /// `*.suffix`): the tag is MLflow's editors' word, and where user
    /// traffic goes is the operator's. Empty: tags are not followed, only
    /// a model spec's `upstream` template.
    #[serde(default)]
    pub tag_upstream_hosts: Vec<String>,
}

/// The kinds of registry rollgate follows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegistryKind {
    #[default]
    Mlflow,
}

fn default_poll() -> Duration {
    Duration::from_secs(10)
}

fn default_timeout() -> Duration {
    Duration::from_secs(5)
}

/// Why a model's spec cannot have what it names (all the spec's or the
/// config's to fix: the API answers 422, the controller isolates).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error(
        "model.data_plane: no data plane {name:?} is declared in the controller's config \
         (declared: {declared}); add [data_planes.{name}] there (docs/config.md, \
         \"Another data plane\")"
    )]
    UnknownDataPlane { name: String, declared: String },
    #[error(
        "model.prometheus.credential: no credential {name:?} is declared in the controller's \
         config; add [credentials.{name}] there with its file and the URL it may be sent to"
    )]
    UnknownCredential { name: String },
    #[error(
        "model.prometheus.credential: {name:?} is declared for {declared}, not for {url}: \
         a credential goes only where the controller's config sends it"
    )]
    CredentialElsewhere {
        name: String,
        declared: String,
        url: String,
    },
    #[error(
        "model {model:?} was stored with its {what} written in its spec, and the controller's \
         config declares no identical entry: isolated (never run); declare it in the config \
         and update the model to name it"
    )]
    Undeclared { model: String, what: String },
    #[error(
        "model.registry.name: no registry {name:?} is declared in the controller's config \
         (declared: {declared}); add [registries.{name}] there (docs/config.md, \"MLflow\")"
    )]
    UnknownRegistry { name: String, declared: String },
    #[error("credential {name:?}: {why}")]
    Unreadable { name: String, why: String },
    #[error("model {model:?} cannot use its declared data plane: {why}")]
    Unfit { model: String, why: String },
}

/// The data planes and credentials the operator declared.
#[derive(Debug, Default)]
pub struct Host {
    data_planes: BTreeMap<String, DataPlane>,
    credentials: BTreeMap<String, Credential>,
    registries: BTreeMap<String, RegistryConfig>,
    /// Models whose isolation was logged (once each).
    told: Mutex<BTreeSet<String>>,
}

/// `$model` in a declared data plane's values becomes the model's name, so
/// one declaration serves every model (`/etc/nginx/rollgate/$model.conf`).
const MODEL_MARK: &str = "$model";

fn for_model(plane: &DataPlane, model: &str) -> DataPlane {
    fn fill(v: &mut serde_json::Value, model: &str) {
        match v {
            serde_json::Value::String(s) if s.contains(MODEL_MARK) => {
                *s = s.replace(MODEL_MARK, model)
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(|v| fill(v, model)),
            serde_json::Value::Object(o) => o.values_mut().for_each(|v| fill(v, model)),
            _ => {}
        }
    }
    let Ok(mut v) = serde_json::to_value(plane) else {
        return plane.clone();
    };
    fill(&mut v, model);
    serde_json::from_value(v).unwrap_or_else(|_| plane.clone())
}

/// Where `$model` may stand inside a data plane's lists and tables: the
/// arguments of the operator's own reload command (a model's name is
/// `[A-Za-z0-9._-]`), and the names, hosts and paths of the model's own
/// routing objects; never the cluster, the credentials or where copies of
/// the traffic go.
const MARKED_WITHIN: [&str; 5] = [
    "reload_command",
    "routes.name",
    "routes.hostnames",
    "routes.path_prefix",
    "hosts",
];

/// Checks that `$model` fills only what a model's name may choose: a file
/// name in its declared directory, a URL's path on its declared host, or
/// the name, host or path of the model's own Kubernetes routing object.
/// Else a model's name (which an API caller picks) would choose a
/// directory, a namespace, or the host or cluster a token goes to. The
/// field at fault otherwise.
fn model_mark_placed(plane: &DataPlane) -> Result<(), String> {
    let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(plane) else {
        return Ok(());
    };
    for (field, value) in fields {
        let Some(v) = value.as_str() else {
            let mut marked = Vec::new();
            marked_within(&value, &field, &mut marked);
            match marked
                .into_iter()
                .find(|at| !MARKED_WITHIN.contains(&at.as_str()))
            {
                Some(at) => return Err(at),
                None => continue,
            }
        };
        if !v.contains(MODEL_MARK) {
            continue;
        }
        let placed = if field.ends_with("_file") {
            !v.rsplit_once('/')
                .map_or(v, |(dir, _)| dir)
                .contains(MODEL_MARK)
        } else if field.ends_with("url") {
            let authority = v.split_once("://").map_or(v, |(_, rest)| rest);
            !authority
                .split('/')
                .next()
                .unwrap_or("")
                .contains(MODEL_MARK)
        } else {
            !matches!(field.as_str(), "namespace" | "controller_name")
        };
        if !placed {
            return Err(field);
        }
    }
    Ok(())
}

/// The paths (`routes.name`, list indices left out) of the strings in
/// `value` that hold `$model`.
fn marked_within(value: &serde_json::Value, at: &str, out: &mut Vec<String>) {
    match value {
        serde_json::Value::String(s) if s.contains(MODEL_MARK) => out.push(at.to_string()),
        serde_json::Value::Array(a) => a.iter().for_each(|v| marked_within(v, at, out)),
        serde_json::Value::Object(o) => o
            .iter()
            .for_each(|(k, v)| marked_within(v, &format!("{at}.{k}"), out)),
        _ => {}
    }
}

/// The Kubernetes object names that must hold `$model`: one declaration
/// serves many models, and two models writing one object would overwrite
/// each other's routing. The field at fault.
fn model_mark_required(plane: &DataPlane) -> Result<(), String> {
    match plane {
        DataPlane::GatewayApi { routes, .. } => {
            match routes.iter().position(|r| !r.name.contains(MODEL_MARK)) {
                Some(i) => Err(format!("routes[{i}].name")),
                None => Ok(()),
            }
        }
        DataPlane::Istio { name, .. } | DataPlane::Kserve { name, .. }
            if !name.contains(MODEL_MARK) =>
        {
            Err("name".into())
        }
        _ => Ok(()),
    }
}

/// Whether a URL path steps out of where it seems to be (`..`, `.`, or
/// their percent-encodings, or an encoded `/`).
fn escapes(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    lower.contains("%2e")
        || lower.contains("%2f")
        || lower.contains("%5c")
        || path.split('/').any(|seg| seg == "." || seg == "..")
}

/// Whether a request to `url` may carry a credential declared for
/// `declared`: the same scheme, host and port (defaults filled in), no
/// user-info to confuse a reader, and a path at or under the declared one.
pub fn sends_to(declared: &str, url: &str) -> bool {
    let parts = |u: &str| {
        let uri: http::Uri = u.trim().parse().ok()?;
        let authority = uri.authority()?;
        if authority.as_str().contains('@') {
            return None;
        }
        let scheme = uri.scheme_str()?.to_ascii_lowercase();
        let port = uri.port_u16().or(match scheme.as_str() {
            "http" => Some(80),
            "https" => Some(443),
            _ => None,
        })?;
        if escapes(uri.path()) {
            return None;
        }
        let path = uri.path().trim_end_matches('/').to_string();
        Some((scheme, authority.host().to_ascii_lowercase(), port, path))
    };
    match (parts(declared), parts(url)) {
        (Some((s1, h1, p1, path1)), Some((s2, h2, p2, path2))) => {
            s1 == s2
                && h1 == h2
                && p1 == p2
                && (path2 == path1 || path2.starts_with(&format!("{path1}/")))
        }
        _ => false,
    }
}

impl Host {
    /// Checks every declaration (a data plane as its adapter needs it, a
    /// credential's URL); errors name the entry.
    pub fn new(
        data_planes: BTreeMap<String, DataPlane>,
        credentials: BTreeMap<String, Credential>,
    ) -> Result<Host, String> {
        for (name, plane) in &data_planes {
            rollgate_core::spec::check_model_name(name)
                .map_err(|e| format!("[data_planes.{name}]: the {}", e.message))?;
            model_mark_placed(plane).map_err(|field| {
                format!(
                    "data_planes.{name}.{field}: $model may fill only a file's name (the last \
                     segment of a path), a URL's path, or the name, hosts or path of the \
                     model's own routing object; never a directory, a namespace or a host"
                )
            })?;
            model_mark_required(plane).map_err(|field| {
                format!(
                    "data_planes.{name}.{field}: must hold $model, so that each model has an \
                     object of its own (else models would overwrite each other's routing)"
                )
            })?;
            for_model(plane, "model")
                .validate(&format!("data_planes.{name}"))
                .map_err(|e| e.to_string())?;
        }
        for (name, c) in &credentials {
            if !sends_to(&c.url, &c.url) {
                return Err(format!(
                    "credentials.{name}.url: an http:// or https:// URL without user-info, got {:?}",
                    c.url
                ));
            }
        }
        Ok(Host {
            data_planes,
            credentials,
            registries: BTreeMap::new(),
            told: Mutex::new(BTreeSet::new()),
        })
    }

    /// With the model registries the operator declared
    /// (`[registries.NAME]`), each credential bound to its registry's URL.
    pub fn with_registries(
        mut self,
        registries: BTreeMap<String, RegistryConfig>,
    ) -> Result<Host, String> {
        for (name, r) in &registries {
            rollgate_core::spec::check_model_name(name)
                .map_err(|e| format!("[registries.{name}]: the {}", e.message))?;
            if !sends_to(&r.url, &r.url) {
                return Err(format!(
                    "registries.{name}.url: an http:// or https:// URL without user-info, got {:?}",
                    r.url
                ));
            }
            if let Some(c) = &r.credential {
                self.credential_for(c, &r.url)
                    .map_err(|e| format!("registries.{name}.credential: {e}"))?;
            }
            if r.poll.is_zero() || r.timeout.is_zero() {
                return Err(format!(
                    "registries.{name}: poll and timeout must be positive"
                ));
            }
        }
        self.registries = registries;
        Ok(self)
    }

    /// The declared model registries.
    pub fn registries(&self) -> &BTreeMap<String, RegistryConfig> {
        &self.registries
    }

    /// The bearer token to send registry `name`, read now from its
    /// credential's file; `None` when it declares none.
    pub fn registry_token(&self, name: &str) -> Result<Option<String>, HostError> {
        let Some(r) = self.registries.get(name) else {
            return Err(HostError::UnknownRegistry {
                name: name.to_string(),
                declared: self
                    .registries
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        let Some(c) = &r.credential else {
            return Ok(None);
        };
        let credential = self.credential_for(c, &r.url)?;
        crate::http::bearer_token(&credential.file.to_string_lossy())
            .map(Some)
            .map_err(|why| HostError::Unreadable {
                name: c.clone(),
                why,
            })
    }

    /// What a spec written through the API may name: declared data planes
    /// and credentials bound to its Prometheus URL. (A spec holding a
    /// definition itself is refused by `ModelSpec::validate`.)
    pub fn check(&self, spec: &ModelSpec) -> Result<(), HostError> {
        if let Some(DataPlaneRef::Named(name)) = &spec.data_plane
            && !self.data_planes.contains_key(name)
        {
            return Err(HostError::UnknownDataPlane {
                name: name.clone(),
                declared: self.declared_planes(),
            });
        }
        if let Some(p) = &spec.prometheus
            && let Some(name) = &p.credential
        {
            self.credential_for(name, &p.url)?;
        }
        if let Some(r) = &spec.registry
            && !self.registries.contains_key(&r.name)
        {
            let declared = self.registries.keys().cloned().collect::<Vec<_>>();
            return Err(HostError::UnknownRegistry {
                name: r.name.clone(),
                declared: if declared.is_empty() {
                    "none".into()
                } else {
                    declared.join(", ")
                },
            });
        }
        Ok(())
    }

    fn declared_planes(&self) -> String {
        if self.data_planes.is_empty() {
            "none".into()
        } else {
            self.data_planes
                .keys()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        }
    }

    /// The data plane `model`'s spec names, as its adapter drives it: the
    /// declaration with `$model` filled in, checked again once filled (a
    /// model's name must not make two files one).
    pub fn data_plane(&self, model: &str, named: &DataPlaneRef) -> Result<DataPlane, HostError> {
        match named {
            DataPlaneRef::Named(name) => {
                let plane =
                    self.data_planes
                        .get(name)
                        .ok_or_else(|| HostError::UnknownDataPlane {
                            name: name.clone(),
                            declared: self.declared_planes(),
                        })?;
                let filled = for_model(plane, model);
                rollgate_core::spec::check_model_name(model)
                    .map_err(|e| e.message)
                    .and_then(|()| {
                        filled
                            .validate(&format!("data_planes.{name}"))
                            .map_err(|e| e.to_string())
                    })
                    .map_err(|why| HostError::Unfit {
                        model: model.to_string(),
                        why,
                    })?;
                Ok(filled)
            }
            DataPlaneRef::Inline(stored) => self
                .data_planes
                .values()
                .map(|p| for_model(p, model))
                .find(|p| p == stored.as_ref())
                .ok_or_else(|| HostError::Undeclared {
                    model: model.to_string(),
                    what: format!("{} data plane", stored.kind()),
                }),
        }
    }

    /// Like [`Host::data_plane`], logging a model's isolation once.
    pub fn data_plane_or_isolate(&self, model: &str, named: &DataPlaneRef) -> Option<DataPlane> {
        match self.data_plane(model, named) {
            Ok(p) => Some(p),
            Err(e) => {
                let mut told = self.told.lock().unwrap_or_else(|p| p.into_inner());
                if told.insert(model.to_string()) {
                    tracing::error!(model, "data plane not run: {e}");
                }
                None
            }
        }
    }

    fn credential_for(&self, name: &str, url: &str) -> Result<&Credential, HostError> {
        let c = self
            .credentials
            .get(name)
            .ok_or_else(|| HostError::UnknownCredential {
                name: name.to_string(),
            })?;
        if !sends_to(&c.url, url) {
            return Err(HostError::CredentialElsewhere {
                name: name.to_string(),
                declared: c.url.clone(),
                url: url.to_string(),
            });
        }
        Ok(c)
    }

    /// The bearer token to send to `cfg.url`, read now from its declared
    /// file; `None` when the spec names none.
    pub fn prometheus_token(
        &self,
        model: &str,
        cfg: &PrometheusEvidence,
    ) -> Result<Option<String>, HostError> {
        let (name, credential) = match (&cfg.credential, &cfg.bearer_token_file) {
            (Some(name), _) => (name.clone(), self.credential_for(name, &cfg.url)?),
            (None, Some(file)) => self
                .credentials
                .iter()
                .find(|(_, c)| c.file == std::path::Path::new(file) && sends_to(&c.url, &cfg.url))
                .map(|(n, c)| (n.clone(), c))
                .ok_or_else(|| HostError::Undeclared {
                    model: model.to_string(),
                    what: "Prometheus token file".into(),
                })?,
            (None, None) => return Ok(None),
        };
        crate::http::bearer_token(&credential.file.to_string_lossy())
            .map(Some)
            .map_err(|why| HostError::Unreadable { name, why })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nginx(include: &str, command: &[&str]) -> DataPlane {
        DataPlane::Nginx {
            include_file: include.into(),
            reload_command: command.iter().map(|s| s.to_string()).collect(),
            confirm_url: "http://127.0.0.1:8081/rollgate/routing/$model".into(),
            key: "$http_x_rollgate_key".into(),
        }
    }

    fn host() -> Host {
        Host::new(
            BTreeMap::from([(
                "edge".to_string(),
                nginx(
                    "/etc/nginx/rollgate/$model.conf",
                    &["nginx", "-s", "reload"],
                ),
            )]),
            BTreeMap::from([(
                "prom".to_string(),
                Credential {
                    file: "/etc/rollgate/prom.token".into(),
                    url: "https://prom.internal:9090/".into(),
                },
            )]),
        )
        .expect("valid")
    }

    #[test]
    fn a_credential_goes_only_where_it_was_declared() {
        let declared = "https://prom.internal:9090/api";
        for ok in [
            "https://prom.internal:9090/api",
            "https://PROM.internal:9090/api/",
            "https://prom.internal:9090/api/v1",
        ] {
            assert!(sends_to(declared, ok), "{ok}");
        }
        for elsewhere in [
            "http://prom.internal:9090/api",
            "https://prom.internal:9091/api",
            "https://prom.internal.evil.example:9090/api",
            "https://prom.internal:9090@evil.example/api",
            "https://evil.example/?https://prom.internal:9090/api",
            "https://prom.internal:9090/apiary",
            "https://prom.internal:9090/",
            "prom.internal:9090/api",
            "",
        ] {
            assert!(!sends_to(declared, elsewhere), "{elsewhere}");
        }
        assert!(sends_to("https://h", "https://h:443/x"), "default ports");
    }

    #[test]
    fn a_named_data_plane_is_the_declared_one_for_its_model() {
        let h = host();
        let p = h
            .data_plane("fraud", &DataPlaneRef::Named("edge".into()))
            .expect("declared");
        let DataPlane::Nginx {
            include_file,
            confirm_url,
            key,
            ..
        } = p
        else {
            panic!("nginx");
        };
        assert_eq!(include_file, "/etc/nginx/rollgate/fraud.conf");
        assert_eq!(confirm_url, "http://127.0.0.1:8081/rollgate/routing/fraud");
        assert_eq!(key, "$http_x_rollgate_key", "other variables untouched");
        let e = h
            .data_plane("fraud", &DataPlaneRef::Named("other".into()))
            .expect_err("undeclared");
        assert!(e.to_string().contains("[data_planes.other]"), "{e}");
    }

    /// A spec stored with the definition inline keeps working only if the
    /// config declares the identical data plane; else it is isolated.
    #[test]
    fn a_stored_inline_data_plane_needs_an_identical_declaration() {
        let h = host();
        let same = nginx("/etc/nginx/rollgate/fraud.conf", &["nginx", "-s", "reload"]);
        let DataPlane::Nginx {
            include_file,
            reload_command,
            key,
            ..
        } = same.clone()
        else {
            panic!("nginx");
        };
        let same = DataPlane::Nginx {
            include_file,
            reload_command,
            confirm_url: "http://127.0.0.1:8081/rollgate/routing/fraud".into(),
            key,
        };
        assert_eq!(
            h.data_plane("fraud", &DataPlaneRef::Inline(Box::new(same.clone()))),
            Ok(same.clone())
        );
        let shell = nginx("/etc/nginx/rollgate/fraud.conf", &["/bin/sh", "-c", "id"]);
        let e = h
            .data_plane("fraud", &DataPlaneRef::Inline(Box::new(shell)))
            .expect_err("isolated");
        assert!(matches!(e, HostError::Undeclared { .. }), "{e}");
        assert!(
            h.data_plane("other", &DataPlaneRef::Inline(Box::new(same)))
                .is_err(),
            "declared for another model's file"
        );
    }

    #[test]
    fn a_spec_may_name_only_what_is_declared_for_where_it_goes() {
        let h = host();
        let spec = |credential: Option<&str>, url: &str, plane: Option<&str>| ModelSpec {
            prometheus: Some(PrometheusEvidence {
                url: url.into(),
                credential: credential.map(String::from),
                ..PrometheusEvidence::default()
            }),
            data_plane: plane.map(|p| DataPlaneRef::Named(p.into())),
            ..ModelSpec::default()
        };
        let home = "https://prom.internal:9090";
        assert_eq!(h.check(&spec(Some("prom"), home, Some("edge"))), Ok(()));
        assert!(matches!(
            h.check(&spec(Some("prom"), "http://127.0.0.1:1", None)),
            Err(HostError::CredentialElsewhere { .. })
        ));
        assert!(matches!(
            h.check(&spec(Some("vault"), home, None)),
            Err(HostError::UnknownCredential { .. })
        ));
        assert!(matches!(
            h.check(&spec(None, home, Some("mesh"))),
            Err(HostError::UnknownDataPlane { .. })
        ));
        // A stored token file is honoured only as a declared credential
        // for the same URL; it is never read otherwise.
        let legacy = |file: &str, url: &str| PrometheusEvidence {
            url: url.into(),
            bearer_token_file: Some(file.into()),
            ..PrometheusEvidence::default()
        };
        for (file, url) in [
            ("/var/lib/rollgate/audit.key", home),
            ("/etc/rollgate/prom.token", "http://127.0.0.1:1"),
        ] {
            assert!(matches!(
                h.prometheus_token("m", &legacy(file, url)),
                Err(HostError::Undeclared { .. })
            ));
        }
        assert!(
            matches!(
                h.prometheus_token("m", &legacy("/etc/rollgate/prom.token", home)),
                Err(HostError::Unreadable { .. })
            ),
            "declared: read (the file is absent here)"
        );
    }

    /// A model's name (an API caller's choice) fills only a file name or a
    /// URL's path: never a directory, never a host a token goes to, never
    /// two files into one; a path that steps out is no credential's.
    #[test]
    fn a_model_name_chooses_no_directory_host_or_second_file() {
        let plane = |v: serde_json::Value| serde_json::from_value::<DataPlane>(v).expect("plane");
        let declared = |p| Host::new(BTreeMap::from([("p".to_string(), p)]), BTreeMap::new());
        for (what, bad) in [
            (
                "a directory",
                json!({"kind": "nginx", "include_file": "/etc/$model/x.conf",
                "reload_command": ["nginx"], "confirm_url": "http://127.0.0.1/v"}),
            ),
            (
                "a host",
                json!({"kind": "webhook", "url": "http://$model:8080/r",
                "bearer_token_file": "/run/token"}),
            ),
            (
                "a host",
                json!({"kind": "webhook", "url": "https://$model.example/r"}),
            ),
        ] {
            let e = declared(plane(bad)).expect_err(what);
            assert!(e.contains("$model may fill only"), "{what}: {e}");
        }
        // Kubernetes: never the cluster, a namespace or the mirror.
        let route = json!([{ "name": "$model", "parent_refs": [{ "name": "gw" }] }]);
        for (field, bad) in [
            (
                "cluster.url",
                json!({"kind": "gateway_api", "namespace": "models", "routes": route,
                "cluster": { "url": "https://k8s-$model.corp" }}),
            ),
            (
                "cluster.kubeconfig",
                json!({"kind": "gateway_api", "namespace": "models",
                "routes": route, "cluster": { "kubeconfig": "/etc/kube/$model.yaml" }}),
            ),
            (
                "cluster.context",
                json!({"kind": "istio", "namespace": "models", "hosts": ["h"],
                "cluster": { "context": "$model" }}),
            ),
            (
                "mirror.service",
                json!({"kind": "istio", "namespace": "models", "hosts": ["h"],
                "mirror": { "service": "$model.evil.example", "port": 80 }}),
            ),
            (
                "routes.parent_refs.namespace",
                json!({"kind": "gateway_api", "namespace": "models",
                "routes": [{ "name": "$model", "parent_refs": [{ "name": "gw", "namespace": "$model" }] }]}),
            ),
            (
                "gateways",
                json!({"kind": "istio", "namespace": "models", "hosts": ["h"],
                "gateways": ["$model/gw"]}),
            ),
        ] {
            let e = declared(plane(bad)).expect_err(field);
            assert!(
                e.contains(&format!("data_planes.p.{field}: $model may fill only")),
                "{field}: {e}"
            );
        }
        for (field, unshared) in [
            (
                "routes[0].name",
                json!({"kind": "gateway_api", "namespace": "models",
                "routes": [{ "name": "shared", "parent_refs": [{ "name": "gw" }] }]}),
            ),
            (
                "name",
                json!({"kind": "istio", "namespace": "models", "name": "shared", "hosts": ["h"]}),
            ),
            (
                "name",
                json!({"kind": "kserve", "namespace": "models", "name": "shared"}),
            ),
        ] {
            let e = declared(plane(unshared)).expect_err(field);
            assert!(
                e.contains(&format!("data_planes.p.{field}: must hold $model")),
                "{field}: {e}"
            );
        }
        let ok = json!({"kind": "gateway_api", "namespace": "models", "routes": [{
            "name": "$model", "parent_refs": [{ "name": "gw" }],
            "hostnames": ["$model.example.com"], "path_prefix": "/v2/models/$model" }]});
        assert!(declared(plane(ok)).is_ok());
        let envoy = declared(plane(json!({"kind": "envoy",
            "routes_file": "/etc/envoy/rollgate/$model.json",
            "clusters_file": "/etc/envoy/rollgate/cds.json", "admin_url": "http://127.0.0.1:9901"})))
        .expect("declared");
        let e = envoy
            .data_plane("cds", &DataPlaneRef::Named("p".into()))
            .expect_err("routes over the shared clusters");
        assert!(matches!(e, HostError::Unfit { .. }), "{e}");
        assert!(
            envoy
                .data_plane("fraud", &DataPlaneRef::Named("p".into()))
                .is_ok()
        );
        for out in [
            "https://h/api/../admin",
            "https://h/api/%2E%2E/admin",
            "https://h/api/a%2fb",
        ] {
            assert!(!sends_to("https://h/api", out), "{out}");
        }
    }

    #[test]
    fn declarations_are_checked_when_the_config_is_read() {
        let bad_plane = Host::new(
            BTreeMap::from([("edge".to_string(), nginx("relative.conf", &["nginx"]))]),
            BTreeMap::new(),
        );
        assert!(
            bad_plane
                .expect_err("relative")
                .contains("data_planes.edge.include_file")
        );
        let bad_url = Host::new(
            BTreeMap::new(),
            BTreeMap::from([(
                "t".to_string(),
                Credential {
                    file: "/t".into(),
                    url: "https://user@prom".into(),
                },
            )]),
        );
        assert!(
            bad_url
                .expect_err("user-info")
                .contains("credentials.t.url")
        );
    }
}
