//! PostgreSQL under partition: a leader whose link to the database is cut
//! (frozen: packets silently go nowhere) at random points of its work,
//! inside write transactions included, never holds the others back; the
//! lease runs on the database's clock, so a controller whose clock is off
//! neither steals a healthy lease nor delays a take-over; and a fenced
//! leader commits nothing after its successor's token.
//!
//! The cut is a TCP forwarder between the leader's store and PostgreSQL
//! that this test freezes (it stops moving bytes, both ways, and closes
//! nothing), as a dropped route or a dead switch would.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rollgate_core::{Actor, AuditEvent, AuditKind, Effect, Plan, RolloutState, Timestamp};
use rollgate_store::{
    AuditFilter, ModelSpec, RevisionSpec, SessionLimits, SqlStore, Store, TransitionWrite,
};

use crate::it::postgres_server;

/// A forwarder from a local port to `target`; `freeze` stops every byte
/// (connections stay open), `cut_all` closes every connection.
struct Forwarder {
    port: u16,
    frozen: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Forwarder {
    fn start(target: String) -> Forwarder {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let frozen = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (f, c) = (Arc::clone(&frozen), Arc::clone(&conns));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                if let (Ok(c1), Ok(s1)) = (client.try_clone(), server.try_clone()) {
                    let mut all = c.lock().expect("conns");
                    all.extend([c1, s1]);
                }
                for (from, to) in [(&client, &server), (&server, &client)] {
                    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
                        continue;
                    };
                    let frozen = Arc::clone(&f);
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            while frozen.load(Ordering::SeqCst) {
                                std::thread::sleep(Duration::from_millis(5));
                            }
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            // Bytes read just as the link froze are held
                            // until it thaws (or forever): lost in transit.
                            while frozen.load(Ordering::SeqCst) {
                                std::thread::sleep(Duration::from_millis(5));
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        Forwarder {
            port,
            frozen,
            conns,
        }
    }

    fn freeze(&self, on: bool) {
        self.frozen.store(on, Ordering::SeqCst);
    }

    fn cut_all(&self) {
        for s in self.conns.lock().expect("conns").drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// A scratch database, and its URL through `port` instead.
fn database(name: &str) -> Option<(String, String, String)> {
    let server = postgres_server()?;
    let url = rollgate_store::scratch_database(&server, name).expect("scratch database");
    let config: postgres::Config = url.parse().expect("url");
    let (host, port) = match (config.get_hosts().first(), config.get_ports().first()) {
        (Some(postgres::config::Host::Tcp(h)), Some(p)) => (h.clone(), *p),
        _ => panic!("the test server is reached over TCP"),
    };
    Some((url, host, port.to_string()))
}

fn via(url: &str, host: &str, port: &str, local: u16) -> String {
    url.replacen(&format!("{host}:{port}"), &format!("127.0.0.1:{local}"), 1)
}

/// A model with a champion and an active rollout; its id.
fn rollout(store: &dyn Store) -> (i64, RolloutState) {
    store
        .create_model("risk", &ModelSpec::default(), "t")
        .expect("model");
    let rev = |n: u32| RevisionSpec {
        upstream: format!("http://127.0.0.1:{}", 9000 + n),
        ..RevisionSpec::default()
    };
    let a = store.register_revision("risk", &rev(1), "t").expect("r1");
    store
        .set_champion("risk", &a.id, "t", "first")
        .expect("champion");
    let b = store.register_revision("risk", &rev(2), "t").expect("r2");
    let r = store
        .create_rollout("risk", &b.id, &Plan::default(), "t")
        .expect("rollout");
    (r.id, r.state)
}

/// A fenced transition by `actor` that leaves one audit record.
fn mark<'a>(
    id: i64,
    version: u64,
    state: &'a RolloutState,
    effects: &'a [Effect],
    actor: &'a str,
    fence: &rollgate_store::Fence,
) -> TransitionWrite<'a> {
    TransitionWrite {
        rollout: id,
        expected_version: version,
        state,
        effects,
        actor,
        fence: Some(fence.clone()),
    }
}

fn note(state: &RolloutState) -> Vec<Effect> {
    vec![Effect::Audit {
        event: Box::new(AuditEvent {
            kind: AuditKind::Evaluated,
            actor: Actor::Controller,
            from: state.phase.clone(),
            to: state.phase.clone(),
            verdict: None,
            note: Some("partition test".into()),
            dry_run: false,
        }),
    }]
}

/// 20 cuts of the leader's link at random points of its work (renewing,
/// committing), then 5 resets (every connection closed, the link down):
/// each time a
/// standby leads within `ttl + ttl/3 + 2 s` of the cut, and every record
/// the old leader wrote precedes the new leader's first one.
#[test]
fn a_leader_cut_anywhere_is_replaced_in_time_and_never_commits_after() {
    let Some((url, host, port)) = database(&format!("rg_partition_{}", std::process::id())) else {
        return;
    };
    let ttl = Duration::from_secs(2);
    let limits = SessionLimits::for_lease(ttl);
    let bound = ttl + ttl / 3 + Duration::from_secs(2);
    let standby = SqlStore::connect_with(&url, limits).expect("standby");
    let (id, state) = rollout(&standby);
    let effects = note(&state);
    let mut takeovers = Vec::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(std::process::id());
    for cut in 0..25 {
        let reset = cut >= 20;
        let fwd = Forwarder::start(format!("{host}:{port}"));
        let leader = Arc::new(
            SqlStore::connect_with(&via(&url, &host, &port, fwd.port), limits).expect("leader"),
        );
        let name = format!("a{cut}");
        let lease = loop {
            if let Some(l) = leader
                .acquire_lease("controller", &name, ttl)
                .expect("lease")
            {
                break l;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The leader works: renews every ttl/3 and commits in between.
        let stop = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(AtomicU64::new(0));
        let work = {
            let (leader, stop, committed) = (
                Arc::clone(&leader),
                Arc::clone(&stop),
                Arc::clone(&committed),
            );
            let (name, fence, effects, state) = (
                name.clone(),
                lease.fence.clone(),
                effects.clone(),
                state.clone(),
            );
            std::thread::spawn(move || {
                let mut renewed = Instant::now();
                while !stop.load(Ordering::SeqCst) {
                    if renewed.elapsed() >= ttl / 3 {
                        if leader.acquire_lease("controller", &name, ttl).is_err() {
                            return;
                        }
                        renewed = Instant::now();
                    }
                    let Ok(r) = leader.rollout(id) else { return };
                    match leader.apply(mark(id, r.version, &state, &effects, &name, &fence)) {
                        Ok(_) => {
                            committed.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(rollgate_store::StoreError::VersionConflict { .. }) => {}
                        Err(_) => return,
                    }
                }
            })
        };
        // Cut at a random point of that work.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let wait = Duration::from_millis(50 + seed % 700);
        std::thread::sleep(wait);
        // A reset link: every connection closed, and none gets through
        // until it heals (a link that only dropped its connections would
        // let the leader reconnect and go on leading, as it should).
        fwd.freeze(true);
        if reset {
            fwd.cut_all();
        }
        let cut_at = Instant::now();
        let before = committed.load(Ordering::SeqCst);
        let next = format!("b{cut}");
        let took = loop {
            if let Ok(Some(l)) = standby.acquire_lease("controller", &next, ttl) {
                break l;
            }
            assert!(
                cut_at.elapsed() < bound + Duration::from_secs(10),
                "cut {cut}: nobody led {:?} after the cut",
                cut_at.elapsed()
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let after = cut_at.elapsed();
        if !reset {
            takeovers.push(after);
        }
        assert!(
            after <= bound,
            "cut {cut} ({wait:?} into the work, {before} commits): the standby led {after:?} after the cut, bound {bound:?}"
        );
        // The new leader commits under its token; then the link heals.
        let r = standby.rollout(id).expect("rollout");
        standby
            .apply(mark(id, r.version, &state, &effects, &next, &took.fence))
            .expect("the new leader commits");
        fwd.freeze(false);
        stop.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(200));
        fwd.cut_all();
        work.join().expect("the old leader's work ends");
        // Nothing of the old leader's lands after its successor's first.
        let records = standby
            .audit(&AuditFilter {
                rollout: Some(id),
                ..AuditFilter::default()
            })
            .expect("audit");
        let first_new = records
            .iter()
            .find(|r| r.actor == next)
            .map(|r| r.seq)
            .expect("the new leader's record");
        let late: Vec<u64> = records
            .iter()
            .filter(|r| r.actor == name && r.seq > first_new)
            .map(|r| r.seq)
            .collect();
        assert!(
            late.is_empty(),
            "cut {cut}: {name} committed after {next}: {late:?}"
        );
        standby.release_lease(&took.fence).expect("release");
    }
    assert!(standby.verify_audit().expect("verify").is_intact());
    takeovers.sort();
    eprintln!(
        "take-over after a cut (20 cuts, lease_ttl {ttl:?}): min {:?}, median {:?}, max {:?}",
        takeovers[0], takeovers[10], takeovers[19]
    );
}

/// Clocks that disagree by 30 s either way change nothing: the lease runs
/// on the database's clock.
#[test]
fn controllers_whose_clocks_are_off_neither_steal_nor_delay_the_lease() {
    let Some((url, _, _)) = database(&format!("rg_skew_{}", std::process::id())) else {
        return;
    };
    // Long enough that a stall of the loaded test machine between two
    // renewals (every ttl/5) cannot legitimately lose the lease.
    let ttl = Duration::from_secs(3);
    let skewed = |offset: i64| {
        SqlStore::connect(&url).expect("store").with_clock(move || {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_millis() as i64;
            Timestamp((now + offset) as u64)
        })
    };
    for (leader_offset, standby_offset) in [(0, 30_000), (30_000, 0), (0, -30_000)] {
        let (leader, standby) = (skewed(leader_offset), skewed(standby_offset));
        let a = leader
            .acquire_lease("controller", "a", ttl)
            .expect("a")
            .expect("free");
        // While `a` renews, `b` never gets it, however far ahead its clock.
        let healthy = Instant::now();
        while healthy.elapsed() < ttl * 2 {
            assert_eq!(
                standby.acquire_lease("controller", "b", ttl).expect("b"),
                None,
                "clocks {leader_offset}/{standby_offset} ms: a healthy lease was taken"
            );
            leader
                .acquire_lease("controller", "a", ttl)
                .expect("renew")
                .expect("own lease");
            std::thread::sleep(ttl / 5);
        }
        // `a` dies: `b` leads within the lease's length (and a margin),
        // however far behind its clock or ahead the dead leader's was.
        let died = Instant::now();
        let b = loop {
            if let Some(b) = standby.acquire_lease("controller", "b", ttl).expect("b") {
                break b;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let after = died.elapsed();
        assert!(
            after <= ttl + ttl / 3 + Duration::from_secs(2),
            "clocks {leader_offset}/{standby_offset} ms: take-over after {after:?}"
        );
        assert_eq!(b.fence.token, a.fence.token + 1);
        standby.release_lease(&b.fence).expect("release");
    }
}
