//! Mirroring and pairing: a copy of a champion's request sent to the shadow
//! after the champion answered, fire-and-forget on a bounded pool, and the
//! two answers' predictions paired into agreement counts.

use std::sync::Arc;

use bytes::Bytes;
use http::Method;
use http::header::HeaderMap;
use http::uri::PathAndQuery;

use super::answer::record;
use super::forward::{Partial, Sent, Upstreamed, forward};
use super::wire::Wire;
use crate::Inner;
use crate::extract::{Prediction, agree};
use crate::routing::Route;
use crate::stream::{Streamed, Tally};

/// Fire-and-forget: the user's response never waits for this. A slot from
/// the bounded pool, or a counted drop.
#[allow(clippy::too_many_arguments)]
pub(super) fn mirror(
    inner: &Arc<Inner>,
    route: &Arc<Route>,
    pairs: &Arc<crate::recorder::Sharded<rollgate_core::PairStats>>,
    method: Method,
    path_q: PathAndQuery,
    headers: HeaderMap,
    body: Bytes,
    (unit, champion, wire): (u16, Option<Vec<Prediction>>, Wire),
) {
    let Ok(slot) = Arc::clone(&inner.mirror_slots).try_acquire_owned() else {
        pairs.with(|p| p.record_drop());
        return;
    };
    let inner = Arc::clone(inner);
    let route = Arc::clone(route);
    let pairs = Arc::clone(pairs);
    tokio::spawn(async move {
        let _slot = slot;
        let Some((shadow, _, _)) = &route.shadow else {
            return;
        };
        shadow.stats.with(|s| s.record_arrivals(1));
        let may_stream = wire == Wire::Rest && !route.read_predictions;
        let sent = Sent::Whole(body);
        let outcome = forward(
            &inner, shadow, method, &path_q, &headers, sent, wire, may_stream,
        )
        .await;
        if let Upstreamed::Streamed(partial) = outcome {
            // Nobody receives it: read to its end and counted then.
            let tally = Tally {
                stats: Arc::clone(&shadow.stats),
                unit,
            };
            let Partial {
                status,
                prefix,
                rest,
                times,
                ..
            } = *partial;
            Streamed::new(prefix, rest, status, times, Some(tally))
                .drain()
                .await;
            return;
        }
        let answer = record(
            (&inner, &headers, true),
            &route,
            shadow,
            unit,
            &outcome,
            wire,
        );
        if let (Some(champion), Some(answer)) = (champion, answer)
            && route.read_predictions
        {
            pair(&route, &pairs, &champion, &answer);
        }
    });
}

/// Counts agreement per instance, and the request as one unit of the
/// shadow tests; a missing counterpart is a disagreement.
fn pair(
    route: &Route,
    pairs: &crate::recorder::Sharded<rollgate_core::PairStats>,
    champion: &[Prediction],
    shadow: &[Prediction],
) {
    let instances: Vec<(bool, bool)> = champion
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let agreed = shadow
                .get(i)
                .is_some_and(|s| agree(c, s, route.numeric_tolerance));
            let confident = c
                .confidence
                .is_some_and(|x| x >= route.confidence_threshold);
            (agreed, confident)
        })
        .collect();
    pairs.with(|p| p.record_request(&instances));
}
