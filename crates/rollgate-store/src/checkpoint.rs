//! Signed checkpoints of the audit chain's head: an anchor outside the
//! database.
//!
//! The hash chain alone shows that no record was edited *without
//! re-hashing everything after it*; someone who can write the database can
//! drop the append-only triggers, then cut the tail or edit a record and
//! recompute every later hash, and the chain verifies again. A checkpoint
//! says "record `seq` had hash `hash`", signed with HMAC-SHA256 under a key
//! that is not in the database, and is written both to the store and to a
//! sink outside it (a JSON Lines file). `verify_anchors` then detects a cut
//! tail (a checkpoint past the log's end), a re-hashed record (its hash no
//! longer the checkpoint's), a deleted checkpoint (in the sink, not in the
//! store) and a forged one (its MAC). What it cannot detect is written in
//! docs/api.md ("What the audit log proves").

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::Path;

use hmac::{Hmac, Mac};
use rollgate_core::Timestamp;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// "Record `seq` of the audit chain had hash `hash`", signed at `at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Checkpoint {
    pub seq: u64,
    pub hash: String,
    pub at: Timestamp,
    /// HMAC-SHA256 of the three fields above (and `key_id`, when set), hex.
    pub mac: String,
    /// The id of the key that signed it ([`CheckpointKey::id`]); none on
    /// checkpoints signed before ids were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
}

/// The checkpoint key. Its `Debug` never shows it.
#[derive(Clone)]
pub struct CheckpointKey(Vec<u8>);

impl std::fmt::Debug for CheckpointKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CheckpointKey(<redacted>)")
    }
}

impl CheckpointKey {
    /// A key of at least 16 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() < 16 {
            return Err(format!(
                "a checkpoint key needs at least 16 bytes, got {}",
                bytes.len()
            ));
        }
        Ok(CheckpointKey(bytes.to_vec()))
    }

    /// Reads the key file at `path` (its bytes, trimmed), or creates it with
    /// 32 bytes from `fresh` (readable by its owner only) if it is absent.
    /// The key is written whole beside it and then linked into place, so
    /// processes starting together on one key file all read one key.
    pub fn load_or_create(path: &Path, fresh: impl FnOnce() -> [u8; 32]) -> Result<Self, String> {
        match std::fs::read(path) {
            Ok(bytes) => Self::from_bytes(bytes.trim_ascii()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let bytes = fresh();
                let key = hex::encode(bytes);
                // A name of its own (processes on a shared volume may
                // share a pid), never truncating another's.
                let tmp = path.with_extension(format!("new.{}", hex::encode(&bytes[..8])));
                let mut opts = std::fs::OpenOptions::new();
                opts.write(true).create_new(true);
                #[cfg(unix)]
                {
                    use std::os::unix::fs::OpenOptionsExt;
                    opts.mode(0o600);
                }
                let mut f = opts
                    .open(&tmp)
                    .map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
                f.write_all(key.as_bytes())
                    .and_then(|()| f.sync_all())
                    .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
                // Linked into place whole; where links are not supported,
                // renamed, only if the name is still free. Either way the
                // file now at `path` is the key (another process may have
                // made it first).
                let placed = match std::fs::hard_link(&tmp, path) {
                    Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists && !path.exists() => {
                        std::fs::rename(&tmp, path)
                    }
                    _ => Ok(()),
                };
                let _ = std::fs::remove_file(&tmp);
                placed.map_err(|e| format!("cannot create {}: {e}", path.display()))?;
                std::fs::read(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))
                    .and_then(|b| Self::from_bytes(b.trim_ascii()))
            }
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        }
    }

    /// The key's public name: the first 16 hex digits of a SHA-256 of it
    /// (a one-way function of 16+ random bytes: it names the key, it does
    /// not help forge with it).
    pub fn id(&self) -> String {
        use sha2::Digest;
        let mut h = Sha256::new();
        h.update(b"rollgate-checkpoint-key-id\n");
        h.update(&self.0);
        hex::encode(h.finalize())[..16].to_string()
    }

    fn mac(&self, seq: u64, hash: &str, at: Timestamp, key_id: Option<&str>) -> String {
        // The key length is checked on construction; HMAC takes any length.
        let mut m = match Hmac::<Sha256>::new_from_slice(&self.0) {
            Ok(m) => m,
            Err(_) => return String::new(),
        };
        m.update(format!("rollgate-checkpoint\n{seq}\n{hash}\n{}", at.0).as_bytes());
        if let Some(id) = key_id {
            m.update(format!("\n{id}").as_bytes());
        }
        hex::encode(m.finalize().into_bytes())
    }

    pub fn sign(&self, seq: u64, hash: &str, at: Timestamp) -> Checkpoint {
        let id = self.id();
        Checkpoint {
            seq,
            hash: hash.to_string(),
            at,
            mac: self.mac(seq, hash, at, Some(&id)),
            key_id: Some(id),
        }
    }

    /// Whether `cp` was signed with this key (compared in constant time).
    pub fn signed(&self, cp: &Checkpoint) -> bool {
        let want = self.mac(cp.seq, &cp.hash, cp.at, cp.key_id.as_deref());
        want.len() == cp.mac.len()
            && want
                .bytes()
                .zip(cp.mac.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

/// Appends one checkpoint to a JSON Lines sink and syncs it.
pub fn append_to_sink(path: &Path, cp: &Checkpoint) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let mut line = serde_json::to_vec(cp)?;
    line.push(b'\n');
    f.write_all(&line)?;
    f.sync_data()
}

/// Reads a JSON Lines sink; a line that is not a checkpoint is reported by
/// its number. A missing file is an empty sink.
pub fn read_sink(path: &Path) -> std::io::Result<(Vec<Checkpoint>, Vec<usize>)> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((vec![], vec![])),
        Err(e) => return Err(e),
    };
    let (mut out, mut bad) = (Vec::new(), Vec::new());
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(&line) {
            Ok(cp) => out.push(cp),
            Err(_) => bad.push(i + 1),
        }
    }
    Ok((out, bad))
}

/// One thing the checkpoints show is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AnchorProblem {
    pub seq: u64,
    pub problem: String,
}

/// What the checkpoints say of the chain.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AnchorReport {
    /// Distinct checkpoints checked (store and sink together).
    pub checkpoints: u64,
    /// The latest checkpoint's seq, if any.
    pub latest: Option<u64>,
    pub problems: Vec<AnchorProblem>,
}

impl AnchorReport {
    pub fn is_intact(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks the chain against the checkpoints of the store and of the sink.
/// `hash_at(seq)` is the log's record `seq`'s hash (`None`: no such
/// record); `last_seq` the log's last record.
pub fn verify_anchors(
    key: &CheckpointKey,
    stored: &[Checkpoint],
    sink: &[Checkpoint],
    last_seq: u64,
    hash_at: impl Fn(u64) -> Option<String>,
) -> AnchorReport {
    let mut problems = Vec::new();
    let mut all: BTreeMap<u64, &Checkpoint> = BTreeMap::new();
    let in_store: BTreeMap<u64, &Checkpoint> = stored.iter().map(|c| (c.seq, c)).collect();
    let own = key.id();
    for (source, cps) in [("store", stored), ("sink", sink)] {
        for cp in cps {
            if !key.signed(cp) {
                let problem = match cp.key_id.as_deref() {
                    // One log has one signer (`key_fits_store`): another
                    // key's checkpoint is forged or from a controller that
                    // was set up wrong; it says which key, and where to look.
                    Some(id) if id != own => format!(
                        "the {source}'s checkpoint is signed with another key (key id {id}; \
                         this controller signs with {own}): forged, or written by a controller \
                         whose [audit] checkpoint_key_file differs"
                    ),
                    Some(_) => format!(
                        "the {source}'s checkpoint is not signed with the key it names (forged or damaged)"
                    ),
                    None => format!(
                        "the {source}'s checkpoint is not signed with this controller's key \
                         (forged or damaged, or signed with another key before key ids were recorded)"
                    ),
                };
                problems.push(AnchorProblem {
                    seq: cp.seq,
                    problem,
                });
                continue;
            }
            all.insert(cp.seq, cp);
        }
    }
    for cp in sink.iter().filter(|c| key.signed(c)) {
        if !in_store.contains_key(&cp.seq) {
            problems.push(AnchorProblem {
                seq: cp.seq,
                problem: "a checkpoint in the sink is missing from the store (deleted)".into(),
            });
        }
    }
    for (&seq, cp) in &all {
        if seq > last_seq {
            problems.push(AnchorProblem {
                seq,
                problem: format!(
                    "a checkpoint vouches for record {seq}, but the log ends at {last_seq} \
                     (records were cut from its tail)"
                ),
            });
        } else if hash_at(seq).as_deref() != Some(cp.hash.as_str()) {
            problems.push(AnchorProblem {
                seq,
                problem: format!(
                    "record {seq} does not have its checkpointed hash (the log was edited and re-hashed)"
                ),
            });
        }
    }
    problems.sort_by_key(|p| p.seq);
    AnchorReport {
        checkpoints: all.len() as u64,
        latest: all.keys().next_back().copied(),
        problems,
    }
}

/// Checks `store`'s chain against its own checkpoints and the sink's.
pub fn verify_store_anchors(
    store: &dyn crate::Store,
    key: &CheckpointKey,
    sink: &[Checkpoint],
) -> crate::Result<AnchorReport> {
    let stored = store.checkpoints()?;
    let last = store.audit_head()?.map_or(0, |(seq, _)| seq);
    let seqs: Vec<u64> = stored.iter().chain(sink).map(|c| c.seq).collect();
    let hashes = store.audit_hashes(&seqs)?;
    Ok(verify_anchors(key, &stored, sink, last, |seq| {
        hashes.get(&seq).cloned()
    }))
}

/// Whether `key` may sign this store's checkpoints: one log has one signer
/// (controllers sharing a store share the key), so a key other than the
/// one that signed the latest checkpoint is refused, naming the setting.
/// (Otherwise every controller would find the others' checkpoints
/// unverifiable, and an operator who sees that on an intact log learns to
/// ignore it.)
pub fn key_fits_store(store: &dyn crate::Store, key: &CheckpointKey) -> Result<(), String> {
    signs_latest(store, key)?;
    // Claimed once, atomically: two controllers starting together on a
    // fresh store with different keys cannot both sign.
    let own = key.id();
    let signer = store
        .claim_checkpoint_signer(&own)
        .map_err(|e| e.to_string())?;
    if signer != own {
        return Err(format!(
            "the store's audit checkpoints are signed with key id {signer}, this controller's \
             checkpoint key is {own}: {SAME_KEY}"
        ));
    }
    Ok(())
}

const SAME_KEY: &str = "controllers sharing a store need the same key; set [audit] \
                        checkpoint_key_file to the same secret file on every one";

/// Whether no other key signed the latest checkpoint (a read: checked
/// before every signature).
fn signs_latest(store: &dyn crate::Store, key: &CheckpointKey) -> Result<(), String> {
    let own = key.id();
    let latest = store.latest_checkpoint().map_err(|e| e.to_string())?;
    match latest.and_then(|cp| cp.key_id.map(|id| (cp.seq, id))) {
        Some((seq, id)) if id != own => Err(format!(
            "the store's audit checkpoints are signed with key id {id} (the latest at record \
             {seq}), this controller's checkpoint key is {own}: {SAME_KEY}"
        )),
        _ => Ok(()),
    }
}

/// Signs the chain's head, if it moved past `after`, into the store and
/// then the sink. Returns the new checkpoint's seq. Refused (see
/// [`key_fits_store`]) if another key signed the latest checkpoint.
pub fn checkpoint_head(
    store: &dyn crate::Store,
    key: &CheckpointKey,
    sink: Option<&Path>,
    after: Option<u64>,
    now: Timestamp,
) -> Result<Option<u64>, String> {
    let Some((seq, hash)) = store.audit_head().map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    if after.is_some_and(|a| a >= seq) {
        return Ok(None);
    }
    signs_latest(store, key)?;
    let cp = key.sign(seq, &hash, now);
    store.add_checkpoint(&cp).map_err(|e| e.to_string())?;
    if let Some(path) = sink {
        append_to_sink(path, &cp)
            .map_err(|e| format!("checkpoint sink {}: {e}", path.display()))?;
    }
    Ok(Some(seq))
}
