//! The store failing (a full disk, a held write lock) while a candidate
//! dies, end to end: the gateway takes the candidate out of traffic, the
//! controller records the rollback once the store is back.

use serde_json::json;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::e2e::start_up;

/// A tmpfs mounted for one test and lazily unmounted after it.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` at `at`. Needs root (CAP_SYS_ADMIN): in CI
    /// a failure is the test's; locally (CI unset) the test is skipped.
    fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).expect("mount point");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(Tmpfs(at.to_path_buf()));
        }
        assert!(
            std::env::var_os("CI").is_none(),
            "this test mounts a tmpfs to fill the store's disk: run it as root (CAP_SYS_ADMIN)"
        );
        eprintln!("skipped: cannot mount a tmpfs (not root); CI runs it");
        None
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the filesystem of `path` until writes fail; returns the bytes.
fn fill_disk(path: &Path) -> u64 {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("filler");
    let mut written = 0u64;
    for chunk in [1 << 20, 4096, 512] {
        let buf = vec![0u8; chunk];
        // Bounded: the tmpfs is far smaller than this.
        for _ in 0..4096 {
            if f.write_all(&buf).and_then(|()| f.flush()).is_err() {
                break;
            }
            written += chunk as u64;
        }
    }
    let _ = f.sync_all();
    written
}

/// How the store fails in [`store_outage_while_the_candidate_dies`].
#[derive(Debug, Clone, Copy)]
enum Outage {
    /// The filesystem fills up: writes fail at once.
    DiskFull,
    /// Another process holds the database's write lock (a stuck backup or
    /// migration tool): writes hang for the store's 10 s busy timeout,
    /// then fail. (A file made read-only does not stop root, and a tmpfs
    /// with files open cannot be remounted read-only, so this is the
    /// unwritable database the tests can make.)
    Locked,
}

impl Outage {
    /// Starts the outage; the returned connection holds the lock.
    fn start(self, data: &Path) -> Option<rusqlite::Connection> {
        match self {
            Outage::DiskFull => {
                assert!(fill_disk(&data.join("filler")) > 0);
                None
            }
            Outage::Locked => {
                let c = rusqlite::Connection::open(data.join("rollgate.db")).expect("open");
                // Wait our turn: the process writes heartbeats all the time.
                c.busy_timeout(Duration::from_secs(10))
                    .expect("busy timeout");
                c.execute_batch(
                    "BEGIN IMMEDIATE; INSERT INTO gateways VALUES ('lock-holder', '-', 0);",
                )
                .expect("take the write lock");
                Some(c)
            }
        }
    }

    fn end(self, data: &Path, lock: Option<rusqlite::Connection>) {
        match self {
            Outage::DiskFull => std::fs::remove_file(data.join("filler")).expect("free space"),
            Outage::Locked => {
                let c = lock.expect("the lock holder");
                c.execute_batch("ROLLBACK;").expect("release");
            }
        }
    }
}

/// The disk under the store fills while the candidate dies (the field
/// report: nearly half the requests failed for 31 s). The gateway cannot
/// confirm with the store, so within 10 s the candidate has no live
/// traffic; when space is freed the controller records the rollback, and
/// the audit chain is intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_while_the_candidate_dies_takes_it_out_of_traffic_and_records_the_rollback_after()
 {
    store_outage_while_the_candidate_dies(Outage::DiskFull).await;
}

/// The same with the database's write lock held by another process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_store_while_the_candidate_dies_takes_it_out_of_traffic_and_records_the_rollback_after()
 {
    store_outage_while_the_candidate_dies(Outage::Locked).await;
}

async fn store_outage_while_the_candidate_dies(outage: Outage) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    // Only a full disk needs a filesystem of its own.
    let _mount = match outage {
        Outage::DiskFull => match Tmpfs::mount(&data, "64m") {
            Some(m) => Some(m),
            None => return,
        },
        Outage::Locked => None,
    };
    let (gw, api_addr) = (free_addr(), free_addr());
    let up = start_up(dir.path(), &gw, &api_addr);
    let c = client();
    let candidate_model = Model::new(false);
    let champion_url = model_server(Model::new(false)).await;
    let candidate_url = model_server(candidate_model.clone()).await;
    let (_, cand) = setup(&c, &up, &champion_url, &candidate_url).await;
    let mut p = plan();
    p["shadow"] = json!({ "enabled": false });
    p["steps"] = json!([50]);
    p["min_stage_duration"] = json!("10m");
    p["evidence_timeout"] = json!("20m");
    let id = start_rollout_with(&c, &up, &cand, p).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(&gw, Arc::clone(&stop));
    wait_for(&c, &up, id, Duration::from_secs(30), |r| {
        phase(r) == "canary" && r["routing"]["candidate_weight_bp"] == 5000
    })
    .await;
    let started = Instant::now();
    while candidate_model.posts.load(Ordering::SeqCst) < 50 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no candidate traffic"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let lock = outage.start(&data);
    candidate_model.failing.store(true, Ordering::SeqCst);
    let died = Instant::now();
    // Out of traffic: no new candidate request for a whole second, within 10 s.
    let out_at = loop {
        let before = candidate_model.posts.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(1)).await;
        if candidate_model.posts.load(Ordering::SeqCst) == before {
            break died.elapsed();
        }
        assert!(
            died.elapsed() < Duration::from_secs(11),
            "the dead candidate still had traffic {:?} after it died",
            died.elapsed()
        );
    };
    eprintln!("candidate out of traffic {out_at:?} after it died ({outage:?})");
    let posts_when_out = candidate_model.posts.load(Ordering::SeqCst);
    let (s, r) = api(&c, &up, "GET", &format!("/api/v1/rollouts/{id}"), None).await;
    assert_eq!(
        (s, phase(&r)),
        (200, "canary"),
        "nothing could be recorded yet: {r}"
    );

    outage.end(&data, lock);
    let r = wait_for(&c, &up, id, Duration::from_secs(30), finished).await;
    assert_eq!(phase(&r), "rolled_back", "{r}");
    // The stale share never came back before the rollback was recorded:
    // no user request reached the candidate after the hold took it out.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        candidate_model.posts.load(Ordering::SeqCst),
        posts_when_out,
        "requests reached the dead candidate after the store came back"
    );
    let kinds = audit_kinds(&c, &up, id).await;
    assert_eq!(count(&kinds, "rolled_back"), 1, "{kinds:?}");
    assert!(chain_intact(&c, &up).await);
    stop.store(true, Ordering::SeqCst);
    let _ = load.await;
    drop(up);
}
