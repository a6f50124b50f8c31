//! Evidence as a Prometheus server would scrape it from the model servers
//! (`ModelSpec::prometheus`) instead of as the gateways report it: each
//! revision's counters count a request when it *completes*, are sampled
//! every scrape interval (not while the target is stale), start again from
//! zero when the model server restarts, and reach the decider through the
//! same code as the controller's (`rollgate_core::scraped`): windows a
//! horizon after each epoch began. The gateways' shadow pairs still count.

use std::collections::BTreeMap;
use std::time::Duration;

use rollgate_core::scraped::{self, Samples, Scrape, TargetSamples};
use rollgate_core::{Epoch, Exposure, RevisionStats, Snapshot, Timestamp};

use crate::scenario::{CANDIDATE, CHAMPION, ScrapeModel};

/// MLServer's latency buckets (seconds): the `le` of the scraped
/// histogram.
const LE: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

/// One target per revision (`instance="sim"`).
const TARGET: &str = "instance=\"sim\"";

pub(crate) struct Scraper<'a> {
    model: &'a ScrapeModel,
    /// Everything the gateways had counted at the last tick: what completed
    /// since is what the model servers' counters counted.
    seen: Snapshot,
    counters: BTreeMap<&'static str, RevisionStats>,
    scrape: Scrape,
    restarts: Vec<u64>,
    last_scrape: Option<Duration>,
    began: BTreeMap<Epoch, Timestamp>,
}

fn ts(d: Duration) -> Timestamp {
    Timestamp(d.as_millis() as u64)
}

impl<'a> Scraper<'a> {
    pub(crate) fn new(model: &'a ScrapeModel) -> Self {
        let mut restarts = model.target_restarts.clone();
        restarts.sort_unstable_by(|a, b| b.cmp(a));
        Scraper {
            model,
            seen: Snapshot::default(),
            counters: BTreeMap::new(),
            scrape: Scrape::new(),
            restarts,
            last_scrape: None,
            began: BTreeMap::new(),
        }
    }

    /// A routing of `epoch` took effect at `now` (the simulated gateways
    /// apply it at once).
    pub(crate) fn routed(&mut self, epoch: Epoch, now: Duration) {
        self.began.entry(epoch).or_insert(ts(now));
    }

    /// One tick: what completed is counted; a restart zeroes the
    /// candidate's counters; a scrape samples them.
    pub(crate) fn tick<'s>(&mut self, counted: impl Iterator<Item = &'s Snapshot>, now: Duration) {
        let total = Snapshot::merged(counted);
        if let Ok(new) = total.window_since(&self.seen) {
            for rev in [CHAMPION, CANDIDATE] {
                let c = self.counters.entry(rev).or_default();
                c.merge(new.revision(rev));
            }
        }
        self.seen = total;
        let second = now.as_secs();
        while self.restarts.last().is_some_and(|&r| r <= second) {
            self.restarts.pop();
            self.counters.insert(CANDIDATE, RevisionStats::default());
        }
        if self
            .last_scrape
            .is_some_and(|l| now.saturating_sub(l) < self.model.interval)
        {
            return;
        }
        self.last_scrape = Some(now);
        if self
            .model
            .paused
            .is_some_and(|(from, to)| (from..to).contains(&second))
        {
            return;
        }
        let stale = self
            .model
            .stale
            .is_some_and(|(from, to)| (from..to).contains(&second));
        for rev in [CHAMPION, CANDIDATE] {
            if rev == CANDIDATE && stale {
                continue;
            }
            let c = self.counters.get(rev).cloned().unwrap_or_default();
            let at = ts(now);
            let t = self
                .scrape
                .entry(rev.to_string())
                .or_default()
                .entry(TARGET.to_string())
                .or_insert_with(|| TargetSamples {
                    successes: vec![Samples::new()],
                    failures: vec![Samples::new()],
                    latency_buckets: LE
                        .iter()
                        .chain([f64::INFINITY].iter())
                        .map(|&le| (le, Samples::new()))
                        .collect(),
                });
            t.successes[0].push((at, (c.requests() - c.failure_count()) as f64));
            t.failures[0].push((at, c.failure_count() as f64));
            let buckets = c.latency().buckets();
            for (le, samples) in &mut t.latency_buckets {
                let below: u64 = buckets
                    .iter()
                    .filter(|(us, _)| (*us as f64) <= *le * 1e6)
                    .map(|(_, n)| n)
                    .sum();
                samples.push((at, below as f64));
            }
        }
    }

    /// What the decider reads at the look at `now`: the scraped counts per
    /// epoch (none if a series stopped more than two scrape intervals
    /// before it), and the gateways' shadow pairs.
    pub(crate) fn exposure(&mut self, gateways: &Exposure, now: Duration) -> Exposure {
        let windows = scraped::windows(&self.began, self.model.horizon);
        // Samples before every window's start are never read again.
        if let Some(from) = windows.iter().map(|w| w.from).min() {
            for targets in self.scrape.values_mut() {
                for t in targets.values_mut() {
                    let series = t
                        .successes
                        .iter_mut()
                        .chain(t.failures.iter_mut())
                        .chain(t.latency_buckets.iter_mut().map(|(_, s)| s));
                    for s in series {
                        let old = s.partition_point(|(at, _)| *at < from);
                        s.drain(..old);
                    }
                }
            }
        }
        let look = scraped::Look {
            now: ts(now),
            fresh: 2 * self.model.interval,
        };
        scraped::exposure(&self.scrape, &windows, look).with_pairs_of(gateways)
    }
}
