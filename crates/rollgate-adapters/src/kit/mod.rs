//! The test kit every adapter passes (feature `testing`), run by each
//! adapter's test against its REAL peer over 127.0.0.1 (a real nginx, a
//! real Envoy, the reference webhook receiver; an API server for the
//! Kubernetes kinds). Given an adapter and a way to send requests through
//! the data plane it drives to two [`Upstreams`] that answer their own
//! name, [`run`] checks, in order:
//!
//! 1. **apply and confirm a split**: 70/30 is confirmed, and requests
//!    through the data plane reach both upstreams in about that share,
//!    each key sticking to one;
//! 2. **champion-only**: confirmed, every request to the champion;
//! 3. **champion-only first on a rollback**: a rollback's champion-only
//!    routing applied right after a split (at the same generation, as the
//!    controller sends it before the rollback is committed) is confirmed
//!    and wins: no request reaches the candidate after it;
//! 4. **a stale write does not clobber**: a routing of a lower generation
//!    is refused ([`AdapterError::Stale`]) and the data plane still routes
//!    the newer one; the same generation applies again, a higher one
//!    applies;
//! 5. **nothing unservable is written**: refused before the data plane is
//!    touched;
//! 6. **what others wrote is kept** ([`Peer::others_kept`], e.g. Envoy's
//!    shared clusters file).
//!
//! The pieces a test needs to stand the peer up are here too: the
//! upstreams and a client that opens a connection per request
//! ([`upstream`]), the reference webhook receiver ([`receiver`]), and
//! starting a peer's process with a bounded wait ([`process`]).

#[cfg(feature = "kubernetes")]
pub mod k8s;
pub mod nginx;
pub mod process;
pub mod receiver;
pub mod upstream;

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::BoxFuture;

pub use nginx::Nginx;
pub use process::{free_addr, listening, stop_nginx};
pub use receiver::Receiver;
pub use upstream::{Upstreams, get};

use crate::{Adapter, AdapterError, Arm, Desired};

/// The model every kit routing is for: a peer routes it.
pub const MODEL: &str = "m";
/// The header the kit's requests carry their sticky key in.
pub const KEY_HEADER: &str = "x-rollgate-key";

/// How long one apply may take to be confirmed (a reload included).
const APPLY_WITHIN: Duration = Duration::from_secs(20);

/// A data plane under test: the adapter that drives it, and a way to send
/// requests through it.
pub trait Peer: Send + Sync {
    /// The adapter under test.
    fn adapter(&self) -> &dyn Adapter;

    /// One request through the data plane with sticky key `key`: the name
    /// of the upstream that answered, `None` if none did.
    fn route<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Option<String>>;

    /// Whether what others wrote beside the adapter is still there (an
    /// error saying what is missing if not); nothing to check by default.
    fn others_kept(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
}

/// A data plane reached at `url` with the sticky key in [`KEY_HEADER`]
/// (nginx, Envoy, the reference receiver's router).
#[derive(Debug)]
pub struct Proxy {
    pub adapter: Box<dyn Adapter>,
    pub url: String,
}

impl Peer for Proxy {
    fn adapter(&self) -> &dyn Adapter {
        self.adapter.as_ref()
    }

    fn route<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(get(&self.url, key))
    }
}

/// Runs every check of the kit against `peer`, whose data plane routes
/// [`MODEL`] and reaches `upstreams`; panics saying which check failed.
pub async fn run(peer: &dyn Peer, upstreams: &Upstreams) {
    let kind = peer.adapter().kind();
    let by = a_split_is_confirmed_and_routed(peer, upstreams).await;
    eprintln!("{kind}: a 70/30 split is confirmed and routed sticky by key: {by:?}");
    champion_only_is_confirmed_and_routed(peer, upstreams).await;
    eprintln!("{kind}: champion-only is confirmed and routed");
    a_rollback_wins_right_after_a_split(peer, upstreams).await;
    eprintln!("{kind}: a rollback's champion-only routing wins right after a split");
    a_stale_write_does_not_clobber(peer, upstreams).await;
    eprintln!("{kind}: a stale write is refused and clobbers nothing");
    nothing_unservable_is_written(peer, upstreams).await;
    eprintln!("{kind}: an unservable routing is refused before anything is written");
    if let Err(e) = peer.others_kept().await {
        panic!("{kind}: what others wrote beside the adapter was lost: {e}");
    }
}

/// How many of 200 keys each upstream answered.
async fn a_split_is_confirmed_and_routed(
    peer: &dyn Peer,
    upstreams: &Upstreams,
) -> BTreeMap<String, usize> {
    applied(peer, &upstreams.split(3_000, 10, "1.1")).await;
    let by = traffic(peer, 200).await;
    let candidate = by.get(upstream::CANDIDATE).copied().unwrap_or(0);
    let champion = by.get(upstream::CHAMPION).copied().unwrap_or(0);
    assert_eq!(candidate + champion, 200, "only the two upstreams: {by:?}");
    assert!(
        (40..=80).contains(&candidate),
        "{}: about 30% of 200 keys to the candidate, got {by:?}",
        peer.adapter().kind()
    );
    by
}

async fn champion_only_is_confirmed_and_routed(peer: &dyn Peer, upstreams: &Upstreams) {
    applied(peer, &upstreams.champion_only(11)).await;
    all_to_the_champion(peer, "champion-only").await;
}

async fn a_rollback_wins_right_after_a_split(peer: &dyn Peer, upstreams: &Upstreams) {
    applied(peer, &upstreams.split(5_000, 12, "2.1")).await;
    // No pause: the rollback's routing goes as soon as the split is in.
    applied(peer, &upstreams.champion_only(12)).await;
    all_to_the_champion(peer, "a rollback right after a split").await;
}

async fn a_stale_write_does_not_clobber(peer: &dyn Peer, upstreams: &Upstreams) {
    let adapter = peer.adapter();
    let stale = upstreams.split(3_000, 11, "1.3");
    match bounded(adapter, &stale).await {
        Err(AdapterError::Stale { have: 12, want: 11 }) => {}
        other => panic!(
            "{}: a routing of generation 11 over one of 12 must be refused as stale \
             (Stale {{ have: 12, want: 11 }}), got {other:?}",
            adapter.kind()
        ),
    }
    all_to_the_champion(peer, "after a stale write").await;
    // The same generation applies again; a higher one applies.
    applied(peer, &upstreams.champion_only(12)).await;
    applied(peer, &upstreams.split(3_000, 13, "3.1")).await;
    let by = traffic(peer, 100).await;
    assert!(
        by.len() == 2,
        "{}: a higher generation applies (both upstreams reached): {by:?}",
        adapter.kind()
    );
    applied(peer, &upstreams.champion_only(14)).await;
}

async fn nothing_unservable_is_written(peer: &dyn Peer, upstreams: &Upstreams) {
    let mut unservable = upstreams.split(3_000, 15, "4.1");
    unservable.arms[1].upstream = "unix:/run/model.sock".into();
    match bounded(peer.adapter(), &unservable).await {
        Err(AdapterError::Unroutable { .. }) => {}
        other => panic!(
            "{}: an unservable routing must be refused (Unroutable), got {other:?}",
            peer.adapter().kind()
        ),
    }
    all_to_the_champion(peer, "after an unservable routing").await;
}

/// `adapter.apply(desired)`, bounded.
async fn bounded(adapter: &dyn Adapter, desired: &Desired) -> Result<(), AdapterError> {
    tokio::time::timeout(APPLY_WITHIN, adapter.apply(desired))
        .await
        .unwrap_or_else(|_| panic!("{}: apply took over {APPLY_WITHIN:?}", adapter.kind()))
}

/// Applies `desired`, which must be confirmed.
async fn applied(peer: &dyn Peer, desired: &Desired) {
    if let Err(e) = bounded(peer.adapter(), desired).await {
        panic!(
            "{}: routing {} (generation {}) not confirmed: {e}",
            peer.adapter().kind(),
            desired.version,
            desired.generation
        );
    }
}

/// Requests under `keys` keys, each sent twice (the same answer both
/// times: sticky), right after the last apply was confirmed: how many
/// keys each upstream answered.
async fn traffic(peer: &dyn Peer, keys: usize) -> BTreeMap<String, usize> {
    let kind = peer.adapter().kind();
    let mut by = BTreeMap::new();
    for i in 0..keys {
        let key = format!("user-{i}");
        let first = peer.route(&key).await;
        let second = peer.route(&key).await;
        let Some(first) = first else {
            panic!("{kind}: no answer through the data plane for key {key}");
        };
        assert_eq!(
            Some(&first),
            second.as_ref(),
            "{kind}: key {key} is not sticky"
        );
        *by.entry(first).or_insert(0) += 1;
    }
    by
}

async fn all_to_the_champion(peer: &dyn Peer, when: &str) {
    let by = traffic(peer, 50).await;
    assert!(
        by.keys().all(|k| k == upstream::CHAMPION),
        "{} {when}: every request to the champion, got {by:?}",
        peer.adapter().kind()
    );
}

impl Upstreams {
    /// A split of [`MODEL`]: `candidate_bp` to the candidate, as of
    /// `generation`, under rollout version `version`.
    pub fn split(&self, candidate_bp: u32, generation: u64, version: &str) -> Desired {
        Desired {
            model: MODEL.into(),
            version: version.into(),
            rollout: Some(1),
            epoch: 1,
            generation,
            shadow: None,
            arms: vec![
                self.arm(upstream::CHAMPION, 10_000 - candidate_bp),
                self.arm(upstream::CANDIDATE, candidate_bp),
            ],
        }
    }

    /// Champion-only routing of [`MODEL`] as of `generation` (what a
    /// rollback sends, and what a model without a rollout routes).
    pub fn champion_only(&self, generation: u64) -> Desired {
        Desired {
            model: MODEL.into(),
            version: format!("champion:r-{}", upstream::CHAMPION),
            rollout: None,
            epoch: 0,
            generation,
            shadow: None,
            arms: vec![self.arm(upstream::CHAMPION, 10_000)],
        }
    }

    fn arm(&self, name: &'static str, weight_bp: u32) -> Arm {
        Arm {
            role: name,
            revision: format!("r-{name}"),
            upstream: self.url(name),
            weight_bp,
            predictor: Some(self.predictor(name)),
        }
    }

    /// The KServe predictor of the kit's revision `name`: its own model,
    /// its server's port as the container's (what the stand-in KServe of
    /// [`k8s::inference_services`] routes to). Other kinds ignore it.
    pub fn predictor(&self, name: &str) -> serde_json::Value {
        let url = self.url(name);
        let port: u16 = url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        serde_json::json!({
            "model": {
                "modelFormat": { "name": "sklearn" },
                "storageUri": format!("s3://rollgate-kit/{name}"),
                "ports": [{ "containerPort": port }],
            },
        })
    }
}
