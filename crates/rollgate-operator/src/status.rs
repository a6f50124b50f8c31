//! Pure pieces the reconcilers share: a rollout's status from rollgate's
//! record of it, conditions, and who changed an object.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rollgate_core::{Phase, Plan, StageVerdict, words};
use serde::Deserialize;
use serde_json::Value;

use crate::resources::{Condition, ModelRolloutStatus, ON_BEHALF_OF};

/// The field manager the operator writes status under; its own writes
/// are never taken for a user's.
pub const FIELD_MANAGER: &str = "rollgate-operator";

/// The longest verdict kept in a status (a column, not a report: the
/// full record is `rollgate rollout status ID`).
const VERDICT_CHARS: usize = 300;

/// What the operator reads of `GET /api/v1/rollouts/{id}`.
#[derive(Debug, Deserialize)]
pub struct RolloutView {
    pub id: i64,
    pub spec: SpecView,
    pub state: StateView,
    pub routing: RoutingView,
}

/// What the operator reads of a rollout's spec.
#[derive(Debug, Deserialize)]
pub struct SpecView {
    pub plan: Plan,
}

/// What the operator reads of a rollout's state.
#[derive(Debug, Deserialize)]
pub struct StateView {
    pub phase: Phase,
    pub paused: bool,
    #[serde(default)]
    pub last_verdict: Option<StageVerdict>,
    /// The approval it waits for, if any.
    #[serde(default)]
    pub awaiting: Option<Value>,
}

/// What the operator reads of a rollout's routing.
#[derive(Debug, Deserialize)]
pub struct RoutingView {
    pub candidate_weight_bp: u32,
}

impl RolloutView {
    pub fn is_active(&self) -> bool {
        !self.state.phase.is_terminal()
    }
}

/// The status words and numbers of a rollout as rollgate holds it;
/// `handled`, the conditions and the generation are the caller's.
pub fn rollout_status(r: &RolloutView, mut into: ModelRolloutStatus) -> ModelRolloutStatus {
    let plan = &r.spec.plan;
    let phase = &r.state.phase;
    into.rollout_id = Some(r.id);
    into.phase = Some(match phase {
        Phase::Canary { weight_percent, .. } => format!("CANARY {weight_percent}%"),
        other => other.name().to_string(),
    });
    // Promoted (and watched after), the candidate is the champion: all
    // of the traffic.
    into.weight_percent = match phase {
        Phase::Promoted { .. } | Phase::Watching { .. } => 100,
        _ => r.routing.candidate_weight_bp / 100,
    };
    into.paused = r.state.paused;
    into.verdict = Some(short(&if phase.is_terminal() {
        words::rollout_phase_line(plan, phase)
    } else {
        running_verdict(r.state.last_verdict.as_ref())
    }));
    into.reason = None;
    into.rejected = None;
    into.guarantee = None;
    match phase {
        Phase::RolledBack { reason } => {
            into.reason = Some(short(&words::phase_line(phase)));
            into.rejected = Some(plan.mode.is_enforce() && reason.rejects(plan));
            into.verdict = Some(short(&format!(
                "{}; {}",
                words::rollout_phase_line(plan, phase),
                words::rejection_line(reason, plan)
            )));
        }
        Phase::Promoted { .. } => into.guarantee = Some(words::promotion_line(plan)),
        _ => {}
    }
    into
}

/// The latest stage verdict of a running rollout in one line.
fn running_verdict(v: Option<&StageVerdict>) -> String {
    let Some(v) = v else {
        return "no verdict yet".into();
    };
    let outcome = format!("{:?}", v.outcome).to_uppercase();
    let gates: Vec<String> = v.gates.iter().map(words::gate_summary).collect();
    if gates.is_empty() {
        outcome
    } else {
        format!("{outcome}: {}", gates.join("; "))
    }
}

/// At most [`VERDICT_CHARS`] characters, control characters escaped.
pub fn short(s: &str) -> String {
    let clean = words::clean(s);
    match clean.char_indices().nth(VERDICT_CHARS) {
        Some((at, _)) => format!("{}…", &clean[..at]),
        None => clean.into_owned(),
    }
}

/// A condition for generation `generation`.
pub fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: short(message),
        observed_generation: generation,
        last_transition_time: None,
    }
}

/// Sets `c` in `conditions`, replacing the one of its type; its
/// `lastTransitionTime` is `now` when its status changed, else the old one.
pub fn set_condition(conditions: &mut Vec<Condition>, mut c: Condition, now: String) {
    let old = conditions.iter().find(|old| old.type_ == c.type_);
    c.last_transition_time = match old {
        Some(old) if old.status == c.status => old.last_transition_time.clone(),
        _ => Some(now),
    };
    conditions.retain(|old| old.type_ != c.type_);
    conditions.push(c);
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
}

/// An error code as a condition's CamelCase reason (`invalid_plan` ->
/// `InvalidPlan`).
pub fn camel(code: &str) -> String {
    code.split(['_', '-'])
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_uppercase().chain(c).collect::<String>())
                .unwrap_or_default()
        })
        .collect()
}

/// Who a change to the object is made for, as `kubernetes:<client>`: the
/// field manager that owns `field` (a path of `managedFields` keys such as
/// `["f:spec", "f:paused"]`: whoever set it last), else the newest writer
/// of the spec or annotations. Kubernetes records the client
/// (`kubectl-patch`, `argocd-controller`), not the person: the API
/// server's audit log has the person. What a `rollgate.dev/on-behalf-of`
/// annotation says is added (`kubernetes:kubectl-patch for alice`) only
/// when the same client wrote it, never in the client's place; control
/// characters dropped, 64 characters at most (what the admin API keeps),
/// so that no annotation can make a request unsendable.
pub fn actor(meta: &ObjectMeta, field: &[&str]) -> String {
    let owner = |path: &str| {
        meta.managed_fields
            .as_ref()?
            .iter()
            .filter(|f| f.subresource.as_deref().is_none_or(str::is_empty))
            .filter(|f| f.manager.as_deref() != Some(FIELD_MANAGER))
            .filter(|f| {
                f.fields_v1
                    .as_ref()
                    .is_some_and(|v| v.0.pointer(path).is_some())
            })
            .max_by_key(|f| f.time.as_ref().map(|t| t.0))
            .and_then(|f| f.manager.clone())
    };
    let pointer = |keys: &[&str]| {
        keys.iter()
            .map(|k| format!("/{}", k.replace('~', "~0").replace('/', "~1")))
            .collect::<String>()
    };
    let client = owner(&pointer(field))
        .or_else(|| owner("/f:spec"))
        .or_else(|| owner("/f:metadata/f:annotations"));
    let says = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(ON_BEHALF_OF))
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .filter(|_| {
            let annotation = ["f:metadata", "f:annotations", &format!("f:{ON_BEHALF_OF}")];
            client.is_some() && owner(&pointer(&annotation)) == client
        });
    let client = client.unwrap_or_else(|| "unknown".to_string());
    let full = match says {
        Some(s) => format!("kubernetes:{client} for {s}"),
        None => format!("kubernetes:{client}"),
    };
    full.chars().filter(|c| !c.is_control()).take(64).collect()
}

/// `value` as JSON with absent and null meaning the same: the form
/// rollgate compares specs in.
pub fn or_empty(value: &Value) -> Value {
    if value.is_null() {
        Value::Object(Default::default())
    } else {
        value.clone()
    }
}
