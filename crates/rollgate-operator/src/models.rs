//! A `Model` mirrored into rollgate: registered (or its settings
//! replaced) when its generation moves, each named revision registered
//! (idempotent: rollgate names a revision by its spec), the champion
//! seeded when rollgate has none; the status says what rollgate holds.
//! Deleting a `Model` leaves rollgate's model and its history as they are.

use std::sync::Arc;

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::admin::AdminError;
use crate::resources::{ADOPT, Model, ModelStatus};
use crate::status::{actor, camel, condition, or_empty, set_condition};
use crate::{Context, Error, StatusWriter, now};

/// Brings rollgate's model in line with the object and writes its status.
pub(crate) async fn reconcile(obj: Arc<Model>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = obj.name_any();
    let generation = obj.meta().generation;
    let who = actor(obj.meta(), &["f:spec"]);
    let api: Api<Model> = Api::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default());
    // Read afresh: the watched copy may predate the operator's own last
    // write.
    let shown = api.get_status(&name).await?.status;
    let mut status = shown.clone().unwrap_or_default();
    let changed = status.observed_generation != generation;
    let refusal = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Synced" && c.status == "False" && c.reason != "WaitsForRollout")
        .map(|c| c.reason.clone());
    // An annotation does not move the generation: adopting after the
    // refusal that asked for it is looked at without one.
    let adopt = obj.annotations().get(ADOPT).is_some_and(|v| v == "true");
    let adopting = refusal.as_deref() == Some("Exists") && adopt;
    if !changed && refusal.is_some() && !adopting {
        // This generation's settings were refused: nothing to do until
        // the object changes.
        return Ok(Action::await_change());
    }
    let changed = changed || adopting;
    let mut problems: Vec<String> = Vec::new();
    let mut waiting = None;

    if changed {
        match sync_settings(&ctx, &obj, &mut status, &who).await {
            Ok(()) => {}
            // A rollout of the model is active: the change waits for it.
            Err(AdminError::Refused {
                status: 409,
                code,
                message,
            }) if code != "exists" => waiting = Some(message),
            Err(AdminError::Refused { code, message, .. }) => {
                return refuse(&api, &obj, shown.as_ref(), status, &camel(&code), &message).await;
            }
            Err(e) => return Err(e.into()),
        }
        problems = register_revisions(&ctx, &obj, &who, &mut status).await?;
    }

    let held = match ctx
        .admin
        .call("GET", &format!("/api/v1/models/{name}"), None, &who)
        .await
    {
        Ok(held) => held,
        // Refused when its generation was mirrored: nothing to look at
        // until the object changes.
        Err(e) if e.is_not_found() => return Ok(Action::await_change()),
        Err(e) => return Err(e.into()),
    };
    let mut champion = held["champion"].as_str().map(str::to_string);
    if champion.is_none()
        && let Some(seed) = &obj.spec.champion
    {
        match seed_champion(&ctx, &obj, seed, &status, &who).await? {
            Ok(id) => champion = Some(id),
            Err(problem) => problems.push(problem),
        }
    }
    status.champion = champion.map(|id| {
        status
            .revisions
            .iter()
            .find(|(_, v)| **v == id)
            .map(|(k, _)| k.clone())
            .unwrap_or(id)
    });

    say(
        &mut status,
        &problems,
        waiting.as_deref(),
        changed,
        generation,
    );
    StatusWriter::new(&api, &name, shown.as_ref())
        .write(&status)
        .await?;
    // Promotions move the champion: looked at again now and then; a
    // change waiting for a rollout sooner.
    Ok(Action::requeue(if waiting.is_some() {
        ctx.resync * 5
    } else {
        ctx.resync * 15
    }))
}

/// The conditions a look says: `Valid` when the generation was mirrored
/// (its problems are found then: a later look, refreshing the champion,
/// keeps what was said) or a look found problems; `Synced` when the
/// generation was mirrored, waiting or not.
fn say(
    status: &mut ModelStatus,
    problems: &[String],
    waiting: Option<&str>,
    changed: bool,
    generation: Option<i64>,
) {
    if changed || !problems.is_empty() {
        let valid = problems.is_empty();
        let message = if valid {
            "rollgate accepted the model".to_string()
        } else {
            problems.join("; ")
        };
        let reason = if valid { "Accepted" } else { "Invalid" };
        let c = condition("Valid", valid, reason, &message, generation);
        set_condition(&mut status.conditions, c, now());
    }
    if changed {
        let synced = match waiting {
            Some(why) => condition("Synced", false, "WaitsForRollout", why, generation),
            None => {
                status.observed_generation = generation;
                condition(
                    "Synced",
                    true,
                    "Synced",
                    "mirrored into rollgate",
                    generation,
                )
            }
        };
        set_condition(&mut status.conditions, synced, now());
    }
}

/// Registers each named revision (idempotent: rollgate names a revision
/// by its spec); what rollgate refused, or a name whose spec changed, is
/// a problem to say, and the others are registered all the same.
async fn register_revisions(
    ctx: &Context,
    obj: &Model,
    who: &str,
    status: &mut ModelStatus,
) -> Result<Vec<String>, Error> {
    let path = format!("/api/v1/models/{}/revisions", obj.name_any());
    let mut problems = Vec::new();
    for (rev, spec) in &obj.spec.revisions {
        match ctx.admin.call("POST", &path, Some(spec), who).await {
            Ok(r) => {
                let id = r["id"].as_str().unwrap_or_default().to_string();
                match status.revisions.get(rev) {
                    Some(old) if *old != id => problems.push(format!(
                        "spec.revisions.{rev}: a revision is immutable; {rev} is registered \
                         as {old} and its spec has changed (give the new one a new name)"
                    )),
                    _ => {
                        status.revisions.insert(rev.clone(), id);
                    }
                }
            }
            Err(AdminError::Refused { message, .. }) => {
                problems.push(format!("spec.revisions.{rev}: {message}"))
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(problems)
}

/// Makes the revision named `seed` the champion of a model that has none:
/// its id, or the problem to say.
async fn seed_champion(
    ctx: &Context,
    obj: &Model,
    seed: &str,
    status: &ModelStatus,
    who: &str,
) -> Result<Result<String, String>, Error> {
    let Some(id) = status.revisions.get(seed) else {
        return Ok(Err(format!(
            "spec.champion: {seed:?} is not a name in spec.revisions"
        )));
    };
    let name = obj.name_any();
    let reason = format!(
        "seeded from Model {}/{name}",
        obj.namespace().unwrap_or_default()
    );
    let body = json!({ "revision": id, "reason": reason });
    let path = format!("/api/v1/models/{name}/champion");
    match ctx.admin.call("PUT", &path, Some(&body), who).await {
        Ok(_) => Ok(Ok(id.clone())),
        Err(AdminError::Refused { message, .. }) => Ok(Err(format!("spec.champion: {message}"))),
        Err(e) => Err(e.into()),
    }
}

/// Registers the model, or replaces its settings when they differ. A
/// model rollgate already has and this object did not register is taken
/// over only with the `rollgate.dev/adopt: "true"` annotation.
async fn sync_settings(
    ctx: &Context,
    obj: &Model,
    status: &mut ModelStatus,
    who: &str,
) -> Result<(), AdminError> {
    let name = obj.name_any();
    let settings = or_empty(&obj.spec.settings);
    let path = format!("/api/v1/models/{name}");
    let adopt = obj.annotations().get(ADOPT).is_some_and(|v| v == "true");
    match ctx.admin.call("GET", &path, None, who).await {
        Ok(_) if !status.mirrored && !adopt => Err(AdminError::Refused {
            status: 409,
            code: "exists".into(),
            message: format!(
                "rollgate already has a model {name:?} this object did not register; set the \
                 annotation {ADOPT}: \"true\" to take it over (its settings are replaced)"
            ),
        }),
        Ok(held) if held["spec"] == settings => {
            status.mirrored = true;
            Ok(())
        }
        Ok(_) => {
            ctx.admin.call("PUT", &path, Some(&settings), who).await?;
            status.mirrored = true;
            Ok(())
        }
        Err(e) if e.is_not_found() => {
            let body = json!({ "name": name, "spec": settings });
            ctx.admin
                .call("POST", "/api/v1/models", Some(&body), who)
                .await?;
            status.mirrored = true;
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// The object's settings refused: said in its status, not retried until
/// it changes.
async fn refuse(
    api: &Api<Model>,
    obj: &Model,
    shown: Option<&ModelStatus>,
    mut status: ModelStatus,
    reason: &str,
    message: &str,
) -> Result<Action, Error> {
    let g = obj.meta().generation;
    let message = format!("spec.settings: {message}");
    let valid = condition("Valid", false, reason, &message, g);
    set_condition(&mut status.conditions, valid, now());
    let why = "not mirrored: rollgate refused the settings";
    set_condition(
        &mut status.conditions,
        condition("Synced", false, reason, why, g),
        now(),
    );
    status.observed_generation = g;
    StatusWriter::new(api, &obj.name_any(), shown)
        .write(&status)
        .await?;
    Ok(Action::await_change())
}
