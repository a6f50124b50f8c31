//! A `ModelRollout` mirrored into rollgate: its rollout started once, the
//! operator's hands on it (`spec.paused`, `spec.abort`, the approve and
//! promote annotations) passed on as API actions, and its status following
//! rollgate's record. rollgate's controller alone decides; this only asks
//! and reports. Deleting the object aborts an active rollout first (a
//! finalizer).
//!
//! **Started once.** `status.startRequested` is written before the first
//! start is asked for and never cleared, so an operator stopped between
//! asking and recording the id finds the rollout it started (the model's
//! active rollout of this candidate that no other object holds) instead of
//! starting a second. Every reconcile reads the status afresh: the watched
//! copy may predate the operator's own last write.

use std::sync::Arc;

use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::admin::AdminError;
use crate::resources::{APPROVE, FINALIZER, Model, ModelRollout, ModelRolloutStatus, PROMOTE};
use crate::status::{
    RolloutView, actor, camel, claimed, condition, rollout_status, set_condition, short,
};
use crate::{Context, Error, now, write_status};

const PAUSED: [&str; 2] = ["f:spec", "f:paused"];
const ABORT: [&str; 2] = ["f:spec", "f:abort"];
const CANDIDATE: [&str; 2] = ["f:spec", "f:candidate"];

pub(crate) async fn reconcile(obj: Arc<ModelRollout>, ctx: Arc<Context>) -> Result<Action, Error> {
    let api: Api<ModelRollout> =
        Api::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default());
    finalizer(&api, FINALIZER, obj, |event| async {
        match event {
            Event::Apply(o) => apply(&o, &ctx, &api).await,
            Event::Cleanup(o) => cleanup(&o, &ctx, &api).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(e.to_string()))
}

/// Why the object has no rollout.
struct Refusal {
    /// The condition's reason.
    reason: String,
    /// In words, naming the field.
    message: String,
    /// Whether it may clear by itself (another rollout of the model
    /// active, the model not there yet): looked at again later.
    retry: bool,
}

/// Where the object's rollout is, or why there is none.
enum Found {
    Rollout(i64),
    Refused(Refusal),
}

/// `ModelRollout ns/name`, as reasons say it.
fn whose(obj: &ModelRollout) -> String {
    format!(
        "ModelRollout {}/{}",
        obj.namespace().unwrap_or_default(),
        obj.name_any()
    )
}

async fn apply(
    obj: &ModelRollout,
    ctx: &Context,
    api: &Api<ModelRollout>,
) -> Result<Action, Error> {
    let generation = obj.meta().generation;
    let shown = api.get_status(&obj.name_any()).await?.status;
    let mut status = shown.clone().unwrap_or_default();
    let id = match status.rollout_id {
        Some(id) => id,
        None => {
            let settled = matches!(status.phase.as_deref(), Some("INVALID" | "ABORTED"))
                && status.observed_generation == generation;
            if settled {
                return Ok(Action::await_change());
            }
            if obj.spec.abort {
                // Aborted before it started: nothing is started.
                status.phase = Some("ABORTED".into());
                status.verdict = Some("spec.abort set before a rollout started".into());
                status.observed_generation = generation;
                write_status(api, &obj.name_any(), shown.as_ref(), &status).await?;
                return Ok(Action::await_change());
            }
            match start(obj, &mut status, shown.as_ref(), ctx, api).await? {
                Found::Rollout(id) => id,
                Found::Refused(r) => {
                    status.phase = Some(if r.retry { "WAITING" } else { "INVALID" }.into());
                    // Said in the Verdict column too: why there is no rollout.
                    status.verdict = Some(short(&r.message));
                    let c = condition("Valid", false, &r.reason, &r.message, generation);
                    set_condition(&mut status.conditions, c, now());
                    status.observed_generation = generation;
                    write_status(api, &obj.name_any(), shown.as_ref(), &status).await?;
                    return Ok(if r.retry {
                        Action::requeue(ctx.resync * 5)
                    } else {
                        Action::await_change()
                    });
                }
            }
        }
    };
    status.rollout_id = Some(id);
    let mut rollout = read(ctx, id).await?;
    if rollout.is_active() {
        let acted = act(obj, ctx, api, &rollout, &mut status, shown.as_ref()).await?;
        if acted {
            rollout = read(ctx, id).await?;
        }
    }
    let mut status = rollout_status(&rollout, status);
    let accepted = condition(
        "Valid",
        true,
        "Accepted",
        "rollgate started the rollout",
        generation,
    );
    set_condition(&mut status.conditions, accepted, now());
    status.observed_generation = generation;
    write_status(api, &obj.name_any(), shown.as_ref(), &status).await?;
    Ok(if rollout.is_active() {
        Action::requeue(ctx.resync)
    } else {
        Action::await_change()
    })
}

/// Passes on each action the object asks for, recording each in
/// `status.handled` (written at once, so that a later failure cannot
/// make it happen twice); whether any was taken.
async fn act(
    obj: &ModelRollout,
    ctx: &Context,
    api: &Api<ModelRollout>,
    rollout: &RolloutView,
    status: &mut ModelRolloutStatus,
    shown: Option<&ModelRolloutStatus>,
) -> Result<bool, Error> {
    let id = rollout.id;
    let mut acted = false;
    let mut written = shown.cloned();
    for (verb, reason, field) in wanted_actions(obj, rollout, status) {
        let path = format!("/api/v1/rollouts/{id}/{verb}");
        let who = actor(obj.meta(), &field);
        let body = json!({ "reason": reason });
        let c = match ctx.admin.call("POST", &path, Some(&body), &who).await {
            Ok(_) => {
                acted = true;
                condition(
                    "Acted",
                    true,
                    "Done",
                    &format!("{verb}: done"),
                    obj.meta().generation,
                )
            }
            // Refused (nothing to resume, say): said, not retried.
            Err(AdminError::Refused { code, message, .. }) => condition(
                "Acted",
                false,
                &camel(&code),
                &format!("{verb}: {message}"),
                obj.meta().generation,
            ),
            Err(e) => return Err(e.into()),
        };
        set_condition(&mut status.conditions, c, now());
        write_status(api, &obj.name_any(), written.as_ref(), status).await?;
        written = Some(status.clone());
    }
    Ok(acted)
}

/// The actions the object asks for that it has not had, each with its
/// reason and the field that asks for it (whose owner it is done for):
/// abort; pause or resume when `spec.paused` *changed* (a pause from the
/// CLI or the dashboard is not undone); each approve or promote annotation
/// value once (an approve kept until the rollout waits for an approval,
/// so that one set early is not spent on nothing). Each is marked handled
/// here.
fn wanted_actions(
    obj: &ModelRollout,
    rollout: &RolloutView,
    status: &mut ModelRolloutStatus,
) -> Vec<(&'static str, String, Vec<&'static str>)> {
    let whose = whose(obj);
    if obj.spec.abort {
        let reason = format!("spec.abort set on {whose}");
        return vec![("abort", reason, ABORT.to_vec())];
    }
    let mut out = Vec::new();
    let paused = obj.spec.paused.to_string();
    if status.handled.get("paused") != Some(&paused) {
        status.handled.insert("paused".into(), paused.clone());
        if obj.spec.paused != rollout.state.paused {
            let verb = if obj.spec.paused { "pause" } else { "resume" };
            let reason = format!("spec.paused set to {paused} on {whose}");
            out.push((verb, reason, PAUSED.to_vec()));
        }
    }
    for (key, verb) in [(APPROVE, "approve"), (PROMOTE, "promote")] {
        let Some(value) = obj.annotations().get(key) else {
            continue;
        };
        let early = verb == "approve" && rollout.state.awaiting.is_none();
        if early || status.handled.get(verb) == Some(value) {
            continue;
        }
        status.handled.insert(verb.to_string(), value.clone());
        let reason = if value.trim().is_empty() {
            format!("{key} on {whose}")
        } else {
            value.clone()
        };
        out.push((
            verb,
            reason,
            vec!["f:metadata", "f:annotations", key_field(key)],
        ));
    }
    out
}

/// An annotation's key as `managedFields` names it.
fn key_field(key: &str) -> &'static str {
    if key == APPROVE {
        "f:rollgate.dev/approve"
    } else {
        "f:rollgate.dev/promote"
    }
}

/// Starts the object's rollout, or finds the one it started when the
/// status recording it was lost.
async fn start(
    obj: &ModelRollout,
    status: &mut ModelRolloutStatus,
    shown: Option<&ModelRolloutStatus>,
    ctx: &Context,
    api: &Api<ModelRollout>,
) -> Result<Found, Error> {
    let ns = obj.namespace().unwrap_or_default();
    let spec = &obj.spec;
    let who = actor(obj.meta(), &CANDIDATE);
    let models: Api<Model> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(model) = models.get_opt(&spec.model).await? else {
        return Ok(Found::Refused(Refusal {
            reason: "ModelNotFound".into(),
            message: format!("spec.model: no Model {:?} in namespace {ns}", spec.model),
            retry: true,
        }));
    };
    let registered = model
        .status
        .as_ref()
        .and_then(|s| s.revisions.get(&spec.candidate));
    let Some(candidate) = registered else {
        let named = model.spec.revisions.contains_key(&spec.candidate);
        let message = if named {
            format!(
                "spec.candidate: {:?} is not registered in rollgate yet",
                spec.candidate
            )
        } else {
            format!(
                "spec.candidate: {:?} is not a name in Model {}'s spec.revisions",
                spec.candidate, spec.model
            )
        };
        let reason = "CandidateNotFound".into();
        return Ok(Found::Refused(Refusal {
            reason,
            message,
            retry: true,
        }));
    };
    if status.start_requested {
        if let Some(id) = own_active_rollout(obj, ctx, api, candidate, &who).await? {
            return Ok(Found::Rollout(id));
        }
    } else {
        status.start_requested = true;
        status.phase = Some("STARTING".into());
        write_status(api, &obj.name_any(), shown, status).await?;
    }
    let mut body = json!({ "model": spec.model, "revision": candidate });
    if let Some(plan) = spec.plan.as_ref().or(model.spec.plan.as_ref()) {
        body["plan"] = plan.clone();
    }
    match ctx
        .admin
        .call("POST", "/api/v1/rollouts", Some(&body), &who)
        .await
    {
        Ok(r) => match r["id"].as_i64() {
            Some(id) => Ok(Found::Rollout(id)),
            None => Err(Error::Unreadable("a started rollout without an id".into())),
        },
        Err(AdminError::Refused {
            status,
            code,
            message,
        }) => {
            let field = if code.contains("plan") || message.starts_with("plan") {
                "spec.plan"
            } else {
                "spec"
            };
            // A conflict (another rollout of the model active, the
            // candidate rejected) may clear; a refused spec waits for
            // the object to change.
            let (reason, message) = (camel(&code), format!("{field}: {message}"));
            Ok(Found::Refused(Refusal {
                reason,
                message,
                retry: status == 409,
            }))
        }
        Err(e) => Err(e.into()),
    }
}

/// The model's active rollout of this object's candidate, if no other
/// `ModelRollout` of the namespace holds it: the one this object asked
/// for before its status could say so.
async fn own_active_rollout(
    obj: &ModelRollout,
    ctx: &Context,
    api: &Api<ModelRollout>,
    candidate: &str,
    who: &str,
) -> Result<Option<i64>, Error> {
    let path = format!("/api/v1/rollouts?active=true&model={}", obj.spec.model);
    let active = ctx.admin.call("GET", &path, None, who).await?;
    let Some(id) = active
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["candidate"] == candidate)
        .and_then(|r| r["id"].as_i64())
    else {
        return Ok(None);
    };
    let held = api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .any(|o| o.name_any() != obj.name_any() && o.status.and_then(|s| s.rollout_id) == Some(id));
    Ok((!held).then_some(id))
}

/// What the operator reads of rollout `id`.
async fn read(ctx: &Context, id: i64) -> Result<RolloutView, Error> {
    let path = format!("/api/v1/rollouts/{id}");
    let v = ctx.admin.call("GET", &path, None, "operator").await?;
    serde_json::from_value(v).map_err(|e| Error::Unreadable(format!("rollout {id}: {e}")))
}

/// A deleted object's active rollout is aborted before the object goes
/// (the status read afresh, and a start it asked for but could not
/// record found as [`start`] finds it). rollgate unreachable: the object
/// stays until it answers.
async fn cleanup(
    obj: &ModelRollout,
    ctx: &Context,
    api: &Api<ModelRollout>,
) -> Result<Action, Error> {
    let status = api
        .get_status(&obj.name_any())
        .await?
        .status
        .unwrap_or_default();
    // Kubernetes does not record who deletes an object.
    let who = claimed("kubernetes:deletion", obj.meta());
    let id = match status.rollout_id {
        Some(id) => Some(id),
        None if status.start_requested => {
            let model: Api<Model> =
                Api::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default());
            let candidate = model
                .get_opt(&obj.spec.model)
                .await?
                .and_then(|m| m.status)
                .and_then(|s| s.revisions.get(&obj.spec.candidate).cloned());
            match candidate {
                Some(c) => own_active_rollout(obj, ctx, api, &c, &who).await?,
                None => None,
            }
        }
        None => None,
    };
    let Some(id) = id else {
        return Ok(Action::await_change());
    };
    let reason = format!("{} deleted", whose(obj));
    let path = format!("/api/v1/rollouts/{id}/abort");
    match ctx
        .admin
        .call("POST", &path, Some(&json!({ "reason": reason })), &who)
        .await
    {
        Ok(_) => Ok(Action::await_change()),
        // Ended already, or gone: nothing to abort.
        Err(AdminError::Refused {
            status: 404 | 409, ..
        }) => Ok(Action::await_change()),
        Err(e) => Err(e.into()),
    }
}
