//! A `ModelRollout` mirrored into rollgate: its rollout started once, the
//! operator's hands on it (`spec.paused`, `spec.abort`, the approve and
//! promote annotations) passed on as API actions, and its status following
//! rollgate's record. rollgate's controller alone decides; this only asks
//! and reports. Deleting the object aborts an active rollout first (a
//! finalizer).
//!
//! **Started once.** `status.startRequested` (the candidate's revision) is
//! written before a start is asked for and cleared when rollgate refuses
//! it, so an operator stopped between asking and recording the id (or
//! left without an answer) finds the rollout it started — the model's
//! active rollout of that revision that no other object holds — instead
//! of starting a second. A start waiting for another rollout of the model
//! is asked again only once the model has none active. Every reconcile
//! reads the status afresh: the watched copy may predate the operator's
//! own last write.

use std::sync::Arc;

use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::admin::AdminError;
use crate::resources::{APPROVE, FINALIZER, Model, ModelRollout, ModelRolloutStatus, PROMOTE};
use crate::status::{RolloutView, actor, camel, condition, rollout_status, set_condition, short};
use crate::{Context, Error, StatusWriter, now};

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
    /// Still waiting for another rollout of the model: nothing asked,
    /// nothing to write.
    StillWaiting,
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
    let mut writer = StatusWriter::new(api, &obj.name_any(), shown.as_ref());
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
                // Aborted before it started: nothing is started, and a
                // start asked for without an answer is found and aborted.
                if let Some(rev) = status.start_requested.clone()
                    && let Some(id) = own_active_rollout(obj, ctx, api, &rev).await?
                {
                    abort(
                        ctx,
                        id,
                        &format!("spec.abort set on {}", whose(obj)),
                        &actor(obj.meta(), &ABORT),
                    )
                    .await?;
                }
                status.start_requested = None;
                status.phase = Some("ABORTED".into());
                status.verdict = Some("spec.abort set before a rollout started".into());
                status.observed_generation = generation;
                writer.write(&status).await?;
                return Ok(Action::await_change());
            }
            match start(obj, &mut status, &mut writer, ctx, api).await? {
                Found::Rollout(id) => id,
                Found::StillWaiting => return Ok(Action::requeue(ctx.resync * 5)),
                Found::Refused(r) => {
                    status.start_requested = None;
                    status.phase = Some(if r.retry { "WAITING" } else { "INVALID" }.into());
                    // Said in the Verdict column too: why there is no rollout.
                    status.verdict = Some(short(&r.message));
                    let c = condition("Valid", false, &r.reason, &r.message, generation);
                    set_condition(&mut status.conditions, c, now());
                    status.observed_generation = generation;
                    writer.write(&status).await?;
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
    status.start_requested = None;
    let mut rollout = read(ctx, id).await?;
    if rollout.is_active() {
        let acted = act(obj, ctx, &mut writer, &rollout, &mut status, shown.as_ref()).await?;
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
    writer.write(&status).await?;
    Ok(if rollout.is_active() {
        Action::requeue(ctx.resync)
    } else {
        Action::await_change()
    })
}

/// One action the object asks for: the verb, its reason, the field that
/// asks for it (whose owner it is done for) and what `status.handled`
/// records of it.
struct Wanted {
    verb: &'static str,
    reason: String,
    field: Vec<&'static str>,
    handled: (&'static str, String),
}

/// Passes on each action the object asks for, one at a time, each marked
/// handled and written *before* it is asked (so that nothing is ever done
/// twice: an operator stopped in between loses that action, which the
/// object's condition does not claim), the mark taken back when rollgate
/// did not answer; whether any was taken.
async fn act(
    obj: &ModelRollout,
    ctx: &Context,
    writer: &mut StatusWriter<'_, ModelRollout>,
    rollout: &RolloutView,
    status: &mut ModelRolloutStatus,
    shown: Option<&ModelRolloutStatus>,
) -> Result<bool, Error> {
    let mut acted = false;
    // A change of `spec.paused` that needs no action is recorded too.
    let paused = obj.spec.paused.to_string();
    status.handled.insert("paused".into(), paused);
    for w in wanted_actions(obj, rollout, shown) {
        let before = status
            .handled
            .insert(w.handled.0.into(), w.handled.1.clone());
        writer.write(status).await?;
        let path = format!("/api/v1/rollouts/{}/{}", rollout.id, w.verb);
        let who = actor(obj.meta(), &w.field);
        let body = json!({ "reason": w.reason });
        let generation = obj.meta().generation;
        let c = match ctx.admin.call("POST", &path, Some(&body), &who).await {
            Ok(_) => {
                acted = true;
                condition(
                    "Acted",
                    true,
                    "Done",
                    &format!("{}: done", w.verb),
                    generation,
                )
            }
            // Refused (nothing to resume, say): said, not retried.
            Err(AdminError::Refused { code, message, .. }) => {
                let said = format!("{}: {message}", w.verb);
                condition("Acted", false, &camel(&code), &said, generation)
            }
            Err(e) => {
                match before {
                    Some(old) => status.handled.insert(w.handled.0.into(), old),
                    None => status.handled.remove(w.handled.0),
                };
                writer.write(status).await?;
                return Err(e.into());
            }
        };
        set_condition(&mut status.conditions, c, now());
    }
    Ok(acted)
}

/// The actions the object asks for that it has not had (by what `shown`
/// says was handled): abort; pause or resume when `spec.paused`
/// *changed* (a pause from the CLI or the dashboard is not undone); each
/// approve or promote annotation value once (an approve kept until the
/// rollout waits for an approval, so that one set early is not spent on
/// nothing).
fn wanted_actions(
    obj: &ModelRollout,
    rollout: &RolloutView,
    shown: Option<&ModelRolloutStatus>,
) -> Vec<Wanted> {
    let handled = |key: &str| shown.and_then(|s| s.handled.get(key));
    let whose = whose(obj);
    if obj.spec.abort {
        return vec![Wanted {
            verb: "abort",
            reason: format!("spec.abort set on {whose}"),
            field: ABORT.to_vec(),
            handled: ("abort", "true".into()),
        }];
    }
    let mut out = Vec::new();
    let paused = obj.spec.paused.to_string();
    if handled("paused") != Some(&paused) && obj.spec.paused != rollout.state.paused {
        out.push(Wanted {
            verb: if obj.spec.paused { "pause" } else { "resume" },
            reason: format!("spec.paused set to {paused} on {whose}"),
            field: PAUSED.to_vec(),
            handled: ("paused", paused),
        });
    }
    for (key, verb) in [(APPROVE, "approve"), (PROMOTE, "promote")] {
        let Some(value) = obj.annotations().get(key) else {
            continue;
        };
        let early = verb == "approve" && rollout.state.awaiting.is_none();
        if early || handled(verb) == Some(value) {
            continue;
        }
        let reason = if value.trim().is_empty() {
            format!("{key} on {whose}")
        } else {
            value.clone()
        };
        out.push(Wanted {
            verb,
            reason,
            field: vec!["f:metadata", "f:annotations", key_field(key)],
            handled: (verb, value.clone()),
        });
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
    writer: &mut StatusWriter<'_, ModelRollout>,
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
    let waiting = status.phase.as_deref() == Some("WAITING")
        && status.observed_generation == obj.meta().generation;
    if status.start_requested.is_some() {
        if let Some(id) = own_active_rollout(obj, ctx, api, candidate).await? {
            return Ok(Found::Rollout(id));
        }
    } else {
        if waiting && model_busy(ctx, &spec.model).await? {
            return Ok(Found::StillWaiting);
        }
        status.start_requested = Some(candidate.clone());
        status.phase = Some("STARTING".into());
        writer.write(status).await?;
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
) -> Result<Option<i64>, Error> {
    let path = format!("/api/v1/rollouts?active=true&model={}", obj.spec.model);
    let active = ctx.admin.call("GET", &path, None, "operator").await?;
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

/// Whether the model has an active rollout (a start would be refused).
async fn model_busy(ctx: &Context, model: &str) -> Result<bool, Error> {
    let path = format!("/api/v1/rollouts?active=true&model={model}");
    let active = ctx.admin.call("GET", &path, None, "operator").await?;
    Ok(active.as_array().is_some_and(|a| !a.is_empty()))
}

/// Aborts rollout `id`; one that has ended (or is gone) needs nothing.
async fn abort(ctx: &Context, id: i64, reason: &str, who: &str) -> Result<(), Error> {
    let path = format!("/api/v1/rollouts/{id}/abort");
    match ctx
        .admin
        .call("POST", &path, Some(&json!({ "reason": reason })), who)
        .await
    {
        Ok(_) => Ok(()),
        Err(AdminError::Refused { code, .. })
            if code == "rollout_finished" || code == "not_found" =>
        {
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// What the operator reads of rollout `id`.
async fn read(ctx: &Context, id: i64) -> Result<RolloutView, Error> {
    let path = format!("/api/v1/rollouts/{id}");
    let v = ctx.admin.call("GET", &path, None, "operator").await?;
    serde_json::from_value(v).map_err(|e| Error::Unreadable(format!("rollout {id}: {e}")))
}

/// A deleted object's active rollout is aborted before the object goes
/// (the status read afresh, and a start asked for without an answer found
/// as [`start`] finds it, by the revision recorded: the `Model` may be
/// gone already). rollgate unreachable: the object stays until it
/// answers.
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
    let id = match (status.rollout_id, &status.start_requested) {
        (Some(id), _) => Some(id),
        (None, Some(rev)) => own_active_rollout(obj, ctx, api, rev).await?,
        (None, None) => None,
    };
    if let Some(id) = id {
        // Kubernetes does not record who deletes an object.
        let reason = format!("{} deleted", whose(obj));
        abort(ctx, id, &reason, "kubernetes:deletion").await?;
    }
    Ok(Action::await_change())
}
