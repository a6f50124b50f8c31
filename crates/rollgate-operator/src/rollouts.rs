//! A `ModelRollout` mirrored into rollgate: its rollout started once
//! (`STARTING` is written before the start is asked for, so that an
//! operator stopped between the two finds the rollout it started again
//! instead of starting a second; an object that never asked adopts
//! nothing; a start retried while `WAITING` for another rollout of the
//! model writes no marker, so an operator stopped in that instant leaves
//! the object `WAITING` beside the rollout it started), the operator's
//! hands on it (`spec.paused`, `spec.abort`, the
//! approve and promote annotations) passed on as API actions, and its
//! status following rollgate's record. rollgate's controller alone
//! decides; this only asks and reports. Deleting the object aborts an
//! active rollout first (a finalizer).

use std::sync::Arc;

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::admin::AdminError;
use crate::resources::{APPROVE, FINALIZER, Model, ModelRollout, ModelRolloutStatus, PROMOTE};
use crate::status::{RolloutView, actor, camel, condition, rollout_status, set_condition};
use crate::{Context, Error, write_status};

/// The phase written before a start is asked for.
const STARTING: &str = "STARTING";

pub(crate) async fn reconcile(obj: Arc<ModelRollout>, ctx: Arc<Context>) -> Result<Action, Error> {
    let api: Api<ModelRollout> =
        Api::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default());
    finalizer(&api, FINALIZER, obj, |event| async {
        match event {
            Event::Apply(o) => apply(&o, &ctx, &api).await,
            Event::Cleanup(o) => cleanup(&o, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(e.to_string()))
}

/// Where the object's rollout is, or why there is none.
enum Found {
    Rollout(i64),
    /// rollgate refused to start it, or the object names what does not
    /// exist: `(reason, message, retry)`.
    Refused(String, String, bool),
}

async fn apply(
    obj: &ModelRollout,
    ctx: &Context,
    api: &Api<ModelRollout>,
) -> Result<Action, Error> {
    let generation = obj.meta().generation;
    let who = actor(obj.meta(), &["f:spec", "f:candidate"]);
    let mut status = obj.status.clone().unwrap_or_default();
    if status.rollout_id.is_none() {
        // Not started, as far as this copy says: what was last written is
        // read afresh (the watched copy may predate the operator's own
        // last write), so that a start is neither asked twice nor a
        // `STARTING` marker taken for one this object no longer holds.
        status = api
            .get_status(&obj.name_any())
            .await?
            .status
            .unwrap_or_default();
    }
    let refused_already =
        status.phase.as_deref() == Some("INVALID") && status.observed_generation == generation;
    if status.rollout_id.is_none() && refused_already {
        return Ok(Action::await_change());
    }
    let id = match status.rollout_id {
        Some(id) => id,
        None => match start(obj, &status, ctx, api, &who).await? {
            Found::Rollout(id) => id,
            Found::Refused(reason, message, retry) => {
                // A conflict (another rollout of the model active) may
                // clear; anything else is the object's to change.
                status.phase = Some(if retry { "WAITING" } else { "INVALID" }.into());
                set_condition(
                    &mut status.conditions,
                    condition("Valid", false, &reason, &message, generation),
                );
                status.observed_generation = generation;
                write(api, obj, &status).await?;
                return Ok(if retry {
                    Action::requeue(ctx.resync * 5)
                } else {
                    Action::await_change()
                });
            }
        },
    };
    let mut rollout = read(ctx, id, &who).await?;
    let mut acted = false;
    if rollout.is_active() {
        for (verb, reason, field) in wanted_actions(obj, &rollout, &mut status) {
            let path = format!("/api/v1/rollouts/{id}/{verb}");
            let body = json!({ "reason": reason });
            let who = actor(obj.meta(), &field);
            match ctx.admin.call("POST", &path, Some(&body), &who).await {
                Ok(_) => acted = true,
                // Refused (nothing awaits approval, say): said, not retried.
                Err(AdminError::Refused { code, message, .. }) => set_condition(
                    &mut status.conditions,
                    condition(
                        "Acted",
                        false,
                        &camel(&code),
                        &format!("{verb}: {message}"),
                        generation,
                    ),
                ),
                Err(e) => return Err(e.into()),
            }
        }
    }
    if acted {
        rollout = read(ctx, id, &who).await?;
    }
    let mut status = rollout_status(&rollout, status);
    set_condition(
        &mut status.conditions,
        condition(
            "Valid",
            true,
            "Accepted",
            "rollgate started the rollout",
            generation,
        ),
    );
    status.observed_generation = generation;
    write(api, obj, &status).await?;
    Ok(if rollout.is_active() {
        Action::requeue(ctx.resync)
    } else {
        Action::await_change()
    })
}

/// The actions the object asks for that the rollout has not had: abort,
/// pause or resume, and each approve or promote annotation value once
/// (recorded in `status.handled` whatever rollgate answers; an approve
/// kept until the rollout waits for an approval, so that one set early is
/// not spent on nothing); each with its reason and the field that asks
/// for it (whose owner it is done for).
fn wanted_actions<'a>(
    obj: &ModelRollout,
    rollout: &RolloutView,
    status: &mut ModelRolloutStatus,
) -> Vec<(&'static str, String, Vec<&'a str>)> {
    let whose = format!(
        "ModelRollout {}/{}",
        obj.namespace().unwrap_or_default(),
        obj.name_any()
    );
    if obj.spec.abort {
        return vec![(
            "abort",
            format!("spec.abort set on {whose}"),
            vec!["f:spec", "f:abort"],
        )];
    }
    let mut out = Vec::new();
    if obj.spec.paused != rollout.state.paused {
        let verb = if obj.spec.paused { "pause" } else { "resume" };
        out.push((
            verb,
            format!("spec.paused set to {} on {whose}", obj.spec.paused),
            vec!["f:spec", "f:paused"],
        ));
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
        let field = match verb {
            "approve" => vec!["f:metadata", "f:annotations", "f:rollgate.dev/approve"],
            _ => vec!["f:metadata", "f:annotations", "f:rollgate.dev/promote"],
        };
        out.push((verb, reason, field));
    }
    out
}

/// Starts the object's rollout, or finds the one it started when the
/// status recording it was lost (`STARTING` written, no id: the model's
/// active rollout of this candidate).
async fn start(
    obj: &ModelRollout,
    status: &ModelRolloutStatus,
    ctx: &Context,
    api: &Api<ModelRollout>,
    who: &str,
) -> Result<Found, Error> {
    let ns = obj.namespace().unwrap_or_default();
    let spec = &obj.spec;
    let models: Api<Model> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(model) = models.get_opt(&spec.model).await? else {
        return Ok(Found::Refused(
            "ModelNotFound".into(),
            format!("spec.model: no Model {:?} in namespace {ns}", spec.model),
            true,
        ));
    };
    let registered = model
        .status
        .as_ref()
        .and_then(|s| s.revisions.get(&spec.candidate));
    let Some(candidate) = registered else {
        let named = model.spec.revisions.contains_key(&spec.candidate);
        return Ok(Found::Refused(
            "CandidateNotFound".into(),
            if named {
                format!(
                    "spec.candidate: {:?} is not registered in rollgate yet",
                    spec.candidate
                )
            } else {
                format!(
                    "spec.candidate: {:?} is not a name in Model {}'s spec.revisions",
                    spec.candidate, spec.model
                )
            },
            true,
        ));
    };
    let mut status = status.clone();
    let same_generation = status.observed_generation == obj.meta().generation;
    let waiting = status.phase.as_deref() == Some("WAITING") && same_generation;
    if status.phase.as_deref() == Some(STARTING) {
        let path = format!("/api/v1/rollouts?active=true&model={}", spec.model);
        let active = ctx.admin.call("GET", &path, None, who).await?;
        if let Some(found) = active
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["candidate"] == candidate.as_str())
            .and_then(|r| r["id"].as_i64())
        {
            return Ok(Found::Rollout(found));
        }
    } else if !waiting {
        // Asked again while WAITING, no marker: writing one would undo
        // the WAITING status and wake this reconcile again at once.
        status.phase = Some(STARTING.into());
        write(api, obj, &status).await?;
    }
    let mut body = json!({ "model": spec.model, "revision": candidate });
    if let Some(plan) = spec.plan.as_ref().or(model.spec.plan.as_ref()) {
        body["plan"] = plan.clone();
    }
    match ctx
        .admin
        .call("POST", "/api/v1/rollouts", Some(&body), who)
        .await
    {
        Ok(r) => Ok(r["id"].as_i64().map(Found::Rollout).unwrap_or_else(|| {
            Found::Refused("NoId".into(), "rollgate answered no id".into(), true)
        })),
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
            // A conflict (another rollout active) may clear; a refused
            // spec waits for the object to change.
            Ok(Found::Refused(
                camel(&code),
                format!("{field}: {message}"),
                status == 409,
            ))
        }
        Err(e) => Err(e.into()),
    }
}

async fn read(ctx: &Context, id: i64, who: &str) -> Result<RolloutView, Error> {
    let v = ctx
        .admin
        .call("GET", &format!("/api/v1/rollouts/{id}"), None, who)
        .await?;
    serde_json::from_value(v).map_err(|e| Error::Unreadable(format!("rollout {id}: {e}")))
}

/// A deleted object's active rollout is aborted before the object goes.
async fn cleanup(obj: &ModelRollout, ctx: &Context) -> Result<Action, Error> {
    let Some(id) = obj.status.as_ref().and_then(|s| s.rollout_id) else {
        return Ok(Action::await_change());
    };
    // Kubernetes does not record who deleted an object: its last writer.
    let who = actor(obj.meta(), &["f:spec"]);
    let reason = format!(
        "ModelRollout {}/{} deleted",
        obj.namespace().unwrap_or_default(),
        obj.name_any()
    );
    let path = format!("/api/v1/rollouts/{id}/abort");
    match ctx
        .admin
        .call("POST", &path, Some(&json!({ "reason": reason })), &who)
        .await
    {
        // Refused: it had ended (or is gone); nothing to abort.
        Ok(_) | Err(AdminError::Refused { .. }) => Ok(Action::await_change()),
        Err(e) => Err(e.into()),
    }
}

async fn write(
    api: &Api<ModelRollout>,
    obj: &ModelRollout,
    status: &ModelRolloutStatus,
) -> Result<(), Error> {
    write_status(api, &obj.name_any(), obj.status.as_ref(), status).await
}
