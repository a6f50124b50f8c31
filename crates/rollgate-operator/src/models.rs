//! A `Model` mirrored into rollgate: registered (or its settings
//! replaced) when its generation moves, each named revision registered
//! (idempotent: rollgate names a revision by its spec), the champion
//! seeded when rollgate has none; the status says what rollgate holds.
//! Deleting a `Model` leaves rollgate's model and its history as they are.

use std::sync::Arc;

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use crate::admin::AdminError;
use crate::resources::{Model, ModelStatus};
use crate::status::{actor, camel, condition, or_empty, set_condition};
use crate::{Context, Error, write_status};

/// Brings rollgate's model in line with the object and writes its status.
pub(crate) async fn reconcile(obj: Arc<Model>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = obj.name_any();
    let generation = obj.meta().generation;
    let who = actor(obj.meta(), &["f:spec"]);
    let mut status = obj.status.clone().unwrap_or_default();
    let changed = status.observed_generation != generation;
    let mut problems: Vec<String> = Vec::new();
    let mut waiting = None;

    if changed {
        match sync_settings(&ctx, &name, &obj.spec.settings, &who).await {
            Ok(()) => {}
            Err(AdminError::Refused {
                status: 409,
                message,
                ..
            }) => waiting = Some(message),
            Err(AdminError::Refused { code, message, .. }) => {
                return refuse(&ctx, &obj, status, &camel(&code), &message).await;
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

    // A generation's problems are found when it is mirrored: a later
    // look (the champion refreshed) keeps what was said of it.
    if changed || !problems.is_empty() {
        let valid = problems.is_empty();
        let message = if valid {
            "rollgate accepted the model".to_string()
        } else {
            problems.join("; ")
        };
        let reason = if valid { "Accepted" } else { "Invalid" };
        set_condition(
            &mut status.conditions,
            condition("Valid", valid, reason, &message, generation),
        );
    }
    match &waiting {
        Some(why) => set_condition(
            &mut status.conditions,
            condition("Synced", false, "WaitsForRollout", why, generation),
        ),
        None => {
            set_condition(
                &mut status.conditions,
                condition(
                    "Synced",
                    true,
                    "Synced",
                    "mirrored into rollgate",
                    generation,
                ),
            );
            status.observed_generation = generation;
        }
    }
    write(&ctx, &obj, &status).await?;
    // Promotions move the champion: looked at again now and then; a
    // change waiting for a rollout sooner.
    Ok(Action::requeue(if waiting.is_some() {
        ctx.resync * 5
    } else {
        ctx.resync * 15
    }))
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

/// Registers the model, or replaces its settings when they differ.
async fn sync_settings(
    ctx: &Context,
    name: &str,
    settings: &Value,
    who: &str,
) -> Result<(), AdminError> {
    let path = format!("/api/v1/models/{name}");
    match ctx.admin.call("GET", &path, None, who).await {
        Ok(held) if held["spec"] == or_empty(settings) => Ok(()),
        Ok(_) => ctx
            .admin
            .call("PUT", &path, Some(&or_empty(settings)), who)
            .await
            .map(drop),
        Err(e) if e.is_not_found() => {
            let body = json!({ "name": name, "spec": or_empty(settings) });
            ctx.admin
                .call("POST", "/api/v1/models", Some(&body), who)
                .await
                .map(drop)
        }
        Err(e) => Err(e),
    }
}

/// The object's settings refused: said in its status, not retried until
/// it changes.
async fn refuse(
    ctx: &Context,
    obj: &Model,
    mut status: ModelStatus,
    reason: &str,
    message: &str,
) -> Result<Action, Error> {
    let g = obj.meta().generation;
    let message = format!("spec.settings: {message}");
    set_condition(
        &mut status.conditions,
        condition("Valid", false, reason, &message, g),
    );
    set_condition(
        &mut status.conditions,
        condition(
            "Synced",
            false,
            reason,
            "not mirrored: rollgate refused the settings",
            g,
        ),
    );
    status.observed_generation = g;
    write(ctx, obj, &status).await?;
    Ok(Action::await_change())
}

async fn write(ctx: &Context, obj: &Model, status: &ModelStatus) -> Result<(), Error> {
    let api: Api<Model> = Api::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default());
    write_status(&api, &obj.name_any(), obj.status.as_ref(), status).await
}
