//! Answers for labels: read each pass from every live gateway's answers
//! log (`GET /rollgate/answers?after=SEQ`) while a rollout judges quality,
//! and kept in the store, where labels join them. A gateway's log is
//! bounded: what it lost before it was read is counted, never guessed.
//! The store keeps each answer once, so reading a page again (after a
//! controller restart, which starts every cursor over) adds nothing.

use std::collections::BTreeMap;

use rollgate_core::labels::AnswersPage;
use rollgate_core::{Timestamp, epoch_of};
use rollgate_store::{AnswerRow, RolloutRecord};

use crate::context::{Context, blocking};

/// Records read per page; a pass reads at most [`PAGES_PER_PASS`] pages a
/// gateway, so one busy gateway cannot hold a pass.
const PAGE: usize = 5_000;
const PAGES_PER_PASS: usize = 10;

/// Where a gateway serves its answers log, from where it serves its stats.
fn answers_url(stats_url: &str) -> String {
    let base = stats_url
        .strip_suffix("/rollgate/stats")
        .unwrap_or(stats_url.trim_end_matches('/'));
    format!("{base}/rollgate/answers")
}

/// The page's records that belong to `wanted` rollouts (by id, with their
/// model), as the store keeps them.
fn rows_of(page: &AnswersPage, wanted: &BTreeMap<i64, &str>) -> Vec<AnswerRow> {
    page.answers
        .iter()
        .filter_map(|a| {
            let (rollout, _) = a.epoch.split_once('.')?;
            let rollout: i64 = rollout.parse().ok()?;
            (wanted.get(&rollout) == Some(&a.model.as_str())).then_some(())?;
            Some(AnswerRow {
                model: a.model.clone(),
                request_id: a.request_id.clone(),
                revision: a.revision.clone(),
                rollout,
                epoch: epoch_of(&a.epoch, rollout)?,
                unit: a.unit,
                at: Timestamp(a.at_ms),
                class: a.class.clone(),
                value: a.value,
            })
        })
        .collect()
}

/// Reads every live gateway's new answers for the active rollouts that
/// judge quality, and keeps them. Failures are logged and retried next
/// pass (a gateway that does not answer keeps its records until then).
pub async fn collect(ctx: &Context, rollouts: &[RolloutRecord]) {
    let wanted: BTreeMap<i64, &str> = rollouts
        .iter()
        .filter(|r| r.spec.plan.gates.quality.enabled)
        .map(|r| (r.id, r.spec.model.as_str()))
        .collect();
    if wanted.is_empty() {
        return;
    }
    let ttl = ctx.gateway_ttl;
    let gateways = match blocking(&ctx.store, move |s| s.gateways(ttl)).await {
        Ok(g) => g,
        Err(e) => {
            tracing::warn!("answers not read this pass: {e}");
            return;
        }
    };
    for g in gateways {
        if let Err(e) = collect_from(ctx, &g.stats_url, &wanted).await {
            tracing::warn!(gateway = %g.id, "answers not read this pass: {e}");
        }
    }
}

async fn collect_from(
    ctx: &Context,
    stats_url: &str,
    wanted: &BTreeMap<i64, &str>,
) -> Result<(), String> {
    let url = answers_url(stats_url);
    for _ in 0..PAGES_PER_PASS {
        let (known, after) = match ctx.answer_cursors.get(stats_url) {
            Some((boot, seq)) => (Some(boot), seq),
            None => (None, 0),
        };
        let page: AnswersPage = match ctx
            .http
            .get(&format!("{url}?after={after}&limit={PAGE}"))
            .await
        {
            Some((200, body)) => serde_json::from_slice(&body).map_err(|e| e.to_string())?,
            Some((status, _)) => return Err(format!("{url} answered {status}")),
            None => return Err(format!("{url} did not answer")),
        };
        // A restarted gateway numbers from 1 again: read it from its start.
        if known.is_some_and(|b| b != page.boot) {
            ctx.answer_cursors.set(stats_url, &page.boot, 0);
            continue;
        }
        let lost = page.first.saturating_sub(after + 1);
        if lost > 0 {
            tracing::warn!(gateway = %page.gateway, lost, "answers lost before they were read (the gateway's log wrapped)");
        }
        let rows = rows_of(&page, wanted);
        let last = page.answers.last().map_or(after, |a| a.seq);
        let kept = blocking(&ctx.store, move |s| s.record_answers(&rows))
            .await
            .map_err(|e| e.to_string())?;
        ctx.metrics.answers(kept, lost);
        ctx.answer_cursors
            .set(stats_url, &page.boot, last.max(after));
        if page.answers.len() < PAGE {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rollgate_core::labels::AnswerRecord;

    fn rec(seq: u64, model: &str, epoch: &str) -> AnswerRecord {
        AnswerRecord {
            seq,
            request_id: format!("r{seq}"),
            model: model.into(),
            epoch: epoch.into(),
            revision: "v2".into(),
            unit: 3,
            at_ms: 10,
            class: Some("1".into()),
            value: None,
        }
    }

    #[test]
    fn only_the_answers_of_rollouts_judged_on_labels_are_kept() {
        let page = AnswersPage {
            gateway: "g".into(),
            boot: "b".into(),
            first: 1,
            next: 5,
            answers: vec![
                rec(1, "fraud", "7.1"),
                rec(2, "fraud", "8.1"),
                rec(3, "other", "7.1"),
                rec(4, "fraud", ""),
            ],
        };
        let wanted = BTreeMap::from([(7, "fraud")]);
        let rows = rows_of(&page, &wanted);
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].rollout, rows[0].epoch, rows[0].unit), (7, 1, 3));
    }

    #[test]
    fn the_answers_log_is_beside_the_stats() {
        assert_eq!(
            answers_url("http://127.0.0.1:8080/rollgate/stats"),
            "http://127.0.0.1:8080/rollgate/answers"
        );
    }
}
