//! Data planes driven through a Kubernetes API server (feature
//! `kubernetes`): a Gateway API `HTTPRoute` ([`gateway_api`]) or an Istio
//! `VirtualService` ([`istio`]). What every such kind shares is here:
//!
//! - **Server-side apply** under field manager [`FIELD_MANAGER`], never
//!   forced: a field another manager owns (someone's `kubectl edit` of the
//!   weights) is a conflict the API server names, reported, not
//!   overwritten. Strict field validation: a field the schema does not
//!   know is refused, not dropped.
//! - **All or nothing**: every object of a routing is applied as a dry
//!   run first, so an object the API server refuses (a weight out of its
//!   bounds, say) leaves every object as it was.
//! - **The generation guard** of every adapter, in an annotation
//!   ([`GENERATION`]), and the object's `resourceVersion` in the applied
//!   configuration, so that two controllers racing cannot both win.
//! - **Confirmation**: the new `metadata.generation` written, and (unless
//!   the data plane says not to) the route's controller reporting that
//!   generation in `status` ([`Shape::in_force`]).
//!
//! A kind is a [`Shape`]: its API resource, the objects a routing makes,
//! and how its status says a generation is in force.

mod access;
pub mod gateway_api;
pub mod istio;
pub mod kserve;
mod service;

use std::time::Duration;

use futures::future::BoxFuture;
use kube::api::{
    Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams, ValidationDirective,
};
use serde_json::{Value, json};

use crate::error::not_older;
use crate::{Adapter, AdapterError, Desired};

pub(crate) use access::client;
pub use access::config;
pub use service::Service;

/// The field manager rollgate applies under.
pub const FIELD_MANAGER: &str = "rollgate";
/// The annotation holding the generation of the routing an object holds.
pub const GENERATION: &str = "rollgate.dev/generation";
/// The annotation naming the routing an object holds (its version).
pub const ROUTING: &str = "rollgate.dev/routing";

/// How long an apply may take, its confirmation included (a hung call is
/// cut a second later): within the controller's own bound on an
/// adapter's call (10 s), so that the reason a routing is not confirmed
/// reaches the log rather than a bare timeout.
const SEND_WITHIN: Duration = Duration::from_secs(8);
/// How often it looks.
const CONFIRM_EVERY: Duration = Duration::from_millis(50);

/// One kind of Kubernetes routing object.
pub(crate) trait Shape: Send + Sync + std::fmt::Debug {
    fn kind(&self) -> &'static str;
    /// The API resource the objects are.
    fn resource(&self) -> ApiResource;
    /// The objects `desired` makes, as `(name, spec)`.
    fn objects(&self, desired: &Desired) -> Result<Vec<(String, Value)>, AdapterError>;
    /// Whether the route's controller reports generation `generation` of
    /// `object` in force; `Err` says why not yet (for the error at the
    /// end of the wait).
    fn in_force(&self, object: &DynamicObject, generation: i64) -> Result<(), String>;
    /// Annotations of the kind's own, beside rollgate's.
    fn annotations(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    /// Adjusts an object's spec for `desired` to the object as read
    /// (`None`: absent); annotations of the kind's own to write with it.
    fn revise(
        &self,
        _spec: &mut Value,
        _desired: &Desired,
        _current: Option<&DynamicObject>,
    ) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    /// Whether `object` still holds `spec` as written (its controller may
    /// have rewritten defaults), where the kind can tell (`None`).
    fn held(&self, _object: &DynamicObject, _spec: &Value) -> Option<bool> {
        None
    }
}

/// A routing object kind, the cluster it lives in, and whether its
/// controller's status must confirm each generation.
#[derive(Debug)]
pub(crate) struct Kube<S> {
    pub access: rollgate_store::KubeAccess,
    pub namespace: String,
    pub require_status: bool,
    pub shape: S,
}

impl<S: Shape> Adapter for Kube<S> {
    fn kind(&self) -> &'static str {
        self.shape.kind()
    }

    fn send<'a>(&'a self, desired: &'a Desired) -> BoxFuture<'a, Result<(), AdapterError>> {
        Box::pin(self.apply_and_confirm(desired))
    }

    /// Nothing: the API server holds the objects, no file on this host.
    fn seed_files(&self, _desired: &Desired) -> Result<Vec<(String, String)>, AdapterError> {
        Ok(Vec::new())
    }
}

impl<S: Shape> Kube<S> {
    async fn apply_and_confirm(&self, desired: &Desired) -> Result<(), AdapterError> {
        let deadline = tokio::time::Instant::now() + SEND_WITHIN;
        let api: Api<DynamicObject> = Api::namespaced_with(
            client(&self.access).await?,
            &self.namespace,
            &self.shape.resource(),
        );
        let objects = self.shape.objects(desired)?;
        // Another writer between our read and our write (a controller's
        // status report, a racing controller) makes our resourceVersion
        // stale: read again (the generation guard then decides), until
        // the deadline. Two creating the same object have no
        // resourceVersion to race on: the older routing may land second,
        // and the newer writer, seeing it in confirmation, writes again.
        let mut raced = 0u32;
        while tokio::time::Instant::now() < deadline {
            let attempt = async {
                let written = self.apply_all(&api, desired, &objects).await?;
                self.confirm(&api, desired, &written, deadline).await
            };
            // A backstop for a call that hangs: the confirmation's own
            // deadline (with its reason) comes first.
            let backstop = deadline + Duration::from_secs(1);
            let Ok(outcome) = tokio::time::timeout_at(backstop, attempt).await else {
                return Err(AdapterError::NotConfirmed {
                    within: SEND_WITHIN,
                    why: format!(
                        "the API server did not answer in time ({raced} attempts raced another writer)"
                    ),
                });
            };
            match outcome {
                Ok(()) => return Ok(()),
                Err(NotApplied::Failed(e)) => return Err(e),
                Err(NotApplied::Raced) => raced += 1,
            }
            tokio::time::sleep(CONFIRM_EVERY).await;
        }
        Err(AdapterError::NotConfirmed {
            within: SEND_WITHIN,
            why: format!("another writer changed the objects at each of {raced} attempts"),
        })
    }

    /// Every object checked against the guard and applied as a dry run,
    /// then each for real: `(name, generation written, spec)`.
    async fn apply_all(
        &self,
        api: &Api<DynamicObject>,
        desired: &Desired,
        objects: &[(String, Value)],
    ) -> Result<Vec<Written>, NotApplied> {
        let mut bodies = Vec::with_capacity(objects.len());
        for (name, spec) in objects {
            let current = match api.get_opt(name).await {
                Ok(c) => c,
                Err(e) => return Err(NotApplied::Failed(self.refused(name, e))),
            };
            let version = current
                .as_ref()
                .and_then(|c| c.metadata.resource_version.clone());
            let have = current
                .as_ref()
                .map_or(0, |c| annotation(c, GENERATION).parse::<u64>().unwrap_or(0));
            not_older(have, desired.generation).map_err(NotApplied::Failed)?;
            let mut spec = spec.clone();
            let noted = self.shape.revise(&mut spec, desired, current.as_ref());
            // Already written and still held: writing again would only
            // undo the defaults its controller wrote (a loop, in the seeds).
            if let Some(c) = current.as_ref().filter(|c| {
                have == desired.generation
                    && annotation(c, ROUTING) == desired.version
                    && self.shape.held(c, &spec) == Some(true)
            }) {
                bodies.push((name, spec, None, c.metadata.generation.unwrap_or(0)));
                continue;
            }
            let mut body = self.body(name, &spec, desired, version);
            for (key, value) in noted {
                body["metadata"]["annotations"][key] = json!(value);
            }
            bodies.push((name, spec, Some(body), 0));
        }
        for (name, _, body, _) in &bodies {
            if let Some(body) = body {
                self.write(api, name, body, true).await?;
            }
        }
        let mut written = Vec::with_capacity(bodies.len());
        for (name, spec, body, held_at) in bodies {
            let generation = match body {
                Some(body) => self.write(api, name, &body, false).await?,
                None => held_at,
            };
            written.push((name.to_string(), generation, spec));
        }
        Ok(written)
    }

    /// Applies one object's configuration (as a dry run, or for real): the
    /// generation written. An object read as absent is created, which
    /// fails if another writer created it meanwhile (server-side apply
    /// would land unconditionally, and an older routing could win); then
    /// it is applied over at once, so that rollgate owns its fields as an
    /// applier.
    async fn write(
        &self,
        api: &Api<DynamicObject>,
        name: &str,
        body: &Value,
        dry_run: bool,
    ) -> Result<i64, NotApplied> {
        // Raced: created by another writer meanwhile (AlreadyExists), or
        // changed since we read it ("modified").
        let raced_or = |e: kube::Error| match e {
            kube::Error::Api(s)
                if s.code == 409 && (s.reason != "Conflict" || s.message.contains("modified")) =>
            {
                NotApplied::Raced
            }
            e => NotApplied::Failed(self.refused(name, e)),
        };
        let mut params = PatchParams::apply(FIELD_MANAGER);
        params.dry_run = dry_run;
        params.field_validation = Some(ValidationDirective::Strict);
        let mut body = body.clone();
        if !dry_run && body["metadata"]["resourceVersion"].is_null() {
            let object: DynamicObject = serde_json::from_value(body.clone())
                .map_err(|e| NotApplied::Failed(AdapterError::Io(format!("{name}: {e}"))))?;
            let create = PostParams {
                dry_run: false,
                field_manager: Some(FIELD_MANAGER.into()),
            };
            let created = api.create(&create, &object).await.map_err(raced_or)?;
            body["metadata"]["resourceVersion"] = json!(created.metadata.resource_version);
            // Created as an update: take the fields over as their applier
            // (no one else has written it: the resourceVersion says so).
            params.force = true;
        }
        match api.patch(name, &params, &Patch::Apply(&body)).await {
            Ok(object) => Ok(object.metadata.generation.unwrap_or(0)),
            // Fields rollgate's own create recorded as an update (shared
            // with its applier when the values were equal): taken over,
            // still only if no one wrote since our read.
            Err(kube::Error::Api(s)) if s.code == 409 && only_our_own(&s.message) => {
                params.force = true;
                match api.patch(name, &params, &Patch::Apply(&body)).await {
                    Ok(object) => Ok(object.metadata.generation.unwrap_or(0)),
                    Err(e) => Err(raced_or(e)),
                }
            }
            Err(e) => Err(raced_or(e)),
        }
    }

    /// The applied configuration of one object: its spec, the routing's
    /// generation and version, and the `resourceVersion` it was read at.
    fn body(&self, name: &str, spec: &Value, desired: &Desired, version: Option<String>) -> Value {
        let resource = self.shape.resource();
        let mut metadata = json!({
            "name": name,
            "namespace": self.namespace,
            "annotations": {
                GENERATION: desired.generation.to_string(),
                ROUTING: desired.version,
            },
        });
        for (key, value) in self.shape.annotations() {
            metadata["annotations"][key] = json!(value);
        }
        if let Some(v) = version {
            metadata["resourceVersion"] = json!(v);
        }
        json!({
            "apiVersion": resource.api_version,
            "kind": resource.kind,
            "metadata": metadata,
            "spec": spec,
        })
    }

    /// Waits until `deadline` for every written object's controller to
    /// report its generation (or only reads it back, without
    /// `require_status`), each object still holding this routing: one a
    /// newer routing replaced meanwhile is [`AdapterError::Stale`], one an
    /// older routing replaced is [`NotApplied::Raced`] (write again).
    async fn confirm(
        &self,
        api: &Api<DynamicObject>,
        desired: &Desired,
        written: &[Written],
        deadline: tokio::time::Instant,
    ) -> Result<(), NotApplied> {
        let mut pending: Vec<&Written> = written.iter().collect();
        let mut why = String::new();
        loop {
            let mut still = Vec::with_capacity(pending.len());
            for item @ (name, generation, spec) in pending {
                match api.get_opt(name).await {
                    Ok(Some(object)) => {
                        let holds = annotation(&object, GENERATION).parse::<u64>().unwrap_or(0);
                        not_older(holds, desired.generation).map_err(NotApplied::Failed)?;
                        if holds < desired.generation {
                            return Err(NotApplied::Raced);
                        }
                        let have = object.metadata.generation.unwrap_or(0);
                        let routing = annotation(&object, ROUTING);
                        let verdict = if routing != desired.version {
                            Err(format!("it holds routing {routing:?}"))
                        } else if have < *generation {
                            Err(format!("the API server holds generation {have}"))
                        } else if self.shape.held(&object, spec) == Some(false) {
                            // Its spec changed since (another writer): write again.
                            return Err(NotApplied::Raced);
                        } else if self.require_status {
                            self.shape.in_force(&object, *generation)
                        } else {
                            Ok(())
                        };
                        if let Err(w) = verdict {
                            why = format!("{}/{name}: {w}", self.shape.kind());
                            still.push(item);
                        }
                    }
                    Ok(None) => {
                        why = format!("{}/{name} was deleted", self.shape.kind());
                        still.push(item);
                    }
                    Err(e) => {
                        why = self.refused(name, e).to_string();
                        still.push(item);
                    }
                }
            }
            if still.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(NotApplied::Failed(AdapterError::NotConfirmed {
                    within: SEND_WITHIN,
                    why,
                }));
            }
            pending = still;
            tokio::time::sleep(CONFIRM_EVERY).await;
        }
    }

    /// A client error as the adapter's, naming the object.
    fn refused(&self, name: &str, e: kube::Error) -> AdapterError {
        let object = format!("{} {}/{name}", self.shape.kind(), self.namespace);
        match e {
            kube::Error::Api(s) => AdapterError::Kubernetes {
                object,
                code: s.code,
                why: if s.message.is_empty() {
                    s.reason
                } else {
                    s.message
                },
            },
            other => AdapterError::Io(format!("{object}: {other}")),
        }
    }
}

/// An object written: its name, the generation written, and its spec.
type Written = (String, i64, Value);

/// An annotation of `object` (empty if absent).
fn annotation(object: &DynamicObject, key: &str) -> String {
    let a = object.metadata.annotations.as_ref();
    a.and_then(|a| a.get(key)).cloned().unwrap_or_default()
}

/// Whether `have` holds every field of `want` (fields only `have` has are
/// others': defaults, other managers'), where absent, null, zero, false,
/// `""`, `[]` and `{}` are the same thing: a controller that omits an
/// empty list or a zero default has not changed what was written.
pub(crate) fn covers(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (_, w) if is_empty(w) => is_empty(have),
        (Value::Object(h), Value::Object(w)) => w
            .iter()
            .all(|(k, v)| covers(h.get(k).unwrap_or(&Value::Null), v)),
        (Value::Array(h), Value::Array(w)) => {
            h.len() == w.len() && h.iter().zip(w).all(|(h, w)| covers(h, w))
        }
        (Value::Number(h), Value::Number(w)) => h.as_f64() == w.as_f64(),
        // Kubernetes writes quantities back in its own spelling (`1` as
        // "1", "0.5" as "500m").
        (Value::String(_) | Value::Number(_), Value::String(_) | Value::Number(_)) => {
            have == want || quantity(have).is_some_and(|h| quantity(want) == Some(h))
        }
        (h, w) => h == w,
    }
}

/// A number, or a Kubernetes quantity ("500m", "2Gi", "1e3"), as a number.
fn quantity(v: &Value) -> Option<f64> {
    let s = match v {
        Value::Number(n) => return n.as_f64(),
        Value::String(s) => s.trim(),
        _ => return None,
    };
    const SUFFIXES: [(&str, f64); 12] = [
        ("Ki", 1024.0),
        ("Mi", 1_048_576.0),
        ("Gi", 1_073_741_824.0),
        ("Ti", 1_099_511_627_776.0),
        ("Pi", 1_125_899_906_842_624.0),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    let (digits, factor) = SUFFIXES
        .iter()
        .find_map(|(suffix, f)| Some((s.strip_suffix(suffix)?, *f)))
        .unwrap_or((s, 1.0));
    let number: f64 = digits.parse().ok()?;
    Some(number * factor)
}

/// Whether `v` is what a Kubernetes controller may leave out.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.values().all(is_empty),
    }
}

/// Why a routing's objects were not applied.
enum NotApplied {
    /// Another writer changed an object between our read and our write:
    /// read again.
    Raced,
    /// For a reason reading again will not change.
    Failed(AdapterError),
}

/// `template` with `$model` filled in.
pub(crate) fn fill(template: &str, model: &str) -> String {
    template.replace("$model", model)
}

/// Whether a server-side apply's conflicts are all with rollgate's own
/// manager (the fields a create by rollgate recorded as an update).
fn only_our_own(message: &str) -> bool {
    let with: Vec<&str> = message
        .split("with \"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .collect();
    !with.is_empty() && with.iter().all(|m| *m == FIELD_MANAGER)
}

#[cfg(test)]
mod tests {
    use super::only_our_own;

    #[test]
    fn kubernetes_spellings_of_a_quantity_are_the_same() {
        use serde_json::json;
        assert!(super::covers(&json!({ "cpu": "1" }), &json!({ "cpu": 1 })));
        assert!(super::covers(
            &json!({ "cpu": "500m" }),
            &json!({ "cpu": "0.5" })
        ));
        assert!(super::covers(
            &json!({ "memory": "1Gi" }),
            &json!({ "memory": "1024Mi" })
        ));
        assert!(!super::covers(
            &json!({ "cpu": "2" }),
            &json!({ "cpu": "500m" })
        ));
        assert!(!super::covers(
            &json!({ "uri": "s3://a" }),
            &json!({ "uri": "s3://b" })
        ));
        assert!(!super::covers(&json!({ "n": 1 }), &json!({ "n": true })));
    }

    #[test]
    fn conflicts_with_our_own_create_are_a_race_others_are_not() {
        let ours = "Apply failed with 2 conflicts: conflicts with \"rollgate\" using \
                    gateway.networking.k8s.io/v1:\n- .spec.rules";
        assert!(only_our_own(ours));
        let theirs = "Apply failed with 1 conflict: conflict with \"kubectl-edit\" using v1: .spec";
        assert!(!only_our_own(theirs));
        let both = "Apply failed with 2 conflicts: conflicts with \"rollgate\": .a\nconflict with \"argocd\": .b";
        assert!(!only_our_own(both));
        assert!(!only_our_own("the object has been modified"));
    }
}
