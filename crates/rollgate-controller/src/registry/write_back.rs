//! Verdicts back to the registry, from the audit log (the outbox), after
//! the registry's cursor in the store:
//!
//! - a rollout's end (`promoted`, `rolled_back`, `aborted`, or with a
//!   watch after promotion `watch_ended` — the promotion that began the
//!   watch is no end, so a version the watch rolls back never held the
//!   champion alias; dry runs change nothing and are skipped): on a
//!   promotion the champion alias moves to
//!   the version; every end removes the followed alias if it still names
//!   the version, and tags it (`rollgate.rollout`, `rollgate.audit`,
//!   `rollgate.reason`, then `rollgate.verdict`, last, so whoever sees it
//!   sees the rest);
//! - a champion set by hand (`champion_set` without a rollout, by anyone
//!   but the follower): the champion alias moves to its version, or, for a
//!   revision the registry never had, a conflict is recorded.
//!
//! Each registry write is idempotent, so a pass cut short is repeated;
//! its record (`registry_written`) and the cursor commit in one
//! transaction, so each is recorded once. A write the registry refuses for
//! good (the version deleted, a 4xx) is recorded as a `registry_conflict`
//! and passed, so one bad version never holds up the others; an
//! unreachable registry (or a 5xx, 408, 429) is retried from the cursor.

use std::collections::BTreeMap;

use rollgate_core::Phase;
use rollgate_store::{AuditFilter, AuditRecord, RegistryVersion, RolloutRecord, StoreError};

use super::mlflow::RegistryError;
use super::{Follower, PassError};
use crate::context::{Error, blocking};

/// The store cursor of a registry's write-back (notification receivers
/// may not take `registry:` names).
pub(super) fn cursor_name(registry: &str) -> String {
    format!("registry:{registry}")
}

/// Whether the registry refused a write for good: the version is gone,
/// or the request itself is wrong (400, 409, 422). Anything else — no
/// answer, a 5xx, 408, 429, and also 401, 403 and a bare 404 (a token
/// being rotated, a proxy's wrong path: the operator's to fix) — is tried
/// again, up to [`ATTEMPTS`] passes for an answer that is not silence.
fn refused_for_good(e: &RegistryError) -> bool {
    match e {
        RegistryError::NotFound(_) => true,
        RegistryError::Refused { status, .. } => matches!(status, 400 | 409 | 422),
        _ => false,
    }
}

/// How many passes one record's write may fail with an answer (not
/// silence: a registry that does not answer holds everything, and loses
/// nothing) before it is recorded as not written and passed, so that one
/// version cannot hold up the registry's other models for ever.
pub(super) const ATTEMPTS: u32 = 10;

/// What one record asks of the registry.
enum Write {
    End {
        rollout: Box<RolloutRecord>,
        version: RegistryVersion,
        verdict: &'static str,
    },
    Champion {
        version: RegistryVersion,
    },
}

impl Follower<'_> {
    /// Writes back, in order, every record after the registry's cursor.
    pub(super) async fn write_back(&mut self) -> Result<(), PassError> {
        let c = cursor_name(self.name);
        // A new registry hears of ends from now on, as a new receiver does.
        let mut cursor =
            blocking(&self.ctx.store, move |st| crate::notify::cursor_of(st, &c)).await?;
        loop {
            let filter = AuditFilter {
                after_seq: Some(cursor),
                limit: Some(200),
                ..AuditFilter::default()
            };
            let page = blocking(&self.ctx.store, move |st| st.audit(&filter)).await?;
            let Some(last) = page.last().map(|r| r.seq) else {
                return Ok(());
            };
            for rec in &page {
                self.leading()?;
                if let Some(write) = self.write_of(rec).await? {
                    self.write(rec, write).await?;
                }
            }
            self.leading()?;
            let c = cursor_name(self.name);
            blocking(&self.ctx.store, move |st| st.set_notify_cursor(&c, last)).await?;
            cursor = last;
        }
    }

    /// What `rec` asks of this registry, if anything.
    async fn write_of(&self, rec: &AuditRecord) -> Result<Option<Write>, PassError> {
        let hand_champion = rec.kind == "champion_set"
            && rec.rollout.is_none()
            && rec.actor != super::actor(self.name);
        // A promotion that begins a watch is no end yet: the watch's end
        // (`watch_ended`, or a rollback restoring the champion) is.
        let watching = rec.body["to"]["phase"] == "watching";
        let end = matches!(
            rec.kind.as_str(),
            "promoted" | "watch_ended" | "rolled_back" | "aborted"
        ) && !watching;
        if !hand_champion && !end {
            return Ok(None);
        }
        let (rollout, to) = (rec.rollout, rec.body["to"].as_str().map(str::to_string));
        let found = blocking(&self.ctx.store, move |st| {
            if let Some(id) = rollout.filter(|_| end) {
                let r = st.rollout(id)?;
                let candidate = st.revision(&r.spec.candidate)?;
                return Ok((Some(r), candidate));
            }
            let to = to.unwrap_or_default();
            Ok((None, st.revision(&to)?))
        })
        .await;
        let (rollout, revision) = match found {
            Ok(f) => f,
            Err(Error::Store(StoreError::NotFound { .. })) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let version = revision
            .spec
            .registry_version
            .clone()
            .filter(|v| v.registry == self.name);
        let Some(rollout) = rollout else {
            return match version {
                Some(version) => Ok(Some(Write::Champion { version })),
                None => {
                    self.say_unregistered_champion(rec, &revision.id).await?;
                    Ok(None)
                }
            };
        };
        let Some(version) = version else {
            return Ok(None);
        };
        // A dry run changed nothing: nothing to say.
        if !rollout.spec.plan.mode.is_enforce() {
            return Ok(None);
        }
        let verdict = match &rollout.state.phase {
            Phase::Promoted { .. } => "promoted",
            Phase::RolledBack { .. } => "rolled_back",
            Phase::Aborted => "aborted",
            _ => return Ok(None),
        };
        Ok(Some(Write::End {
            rollout: Box::new(rollout),
            version,
            verdict,
        }))
    }

    /// A champion set by hand to a revision the registry never had: its
    /// champion alias cannot follow; said, once (the cursor moves with it).
    async fn say_unregistered_champion(
        &self,
        rec: &AuditRecord,
        revision: &str,
    ) -> Result<(), PassError> {
        let followers = blocking(&self.ctx.store, {
            let model = rec.model.clone();
            move |st| st.model(&model).map(|m| m.spec.registry)
        })
        .await;
        let follows = match followers {
            Ok(source) => source.is_some_and(|s| s.name == self.name),
            Err(Error::Store(StoreError::NotFound { .. })) => false,
            Err(e) => return Err(e.into()),
        };
        if !follows {
            return Ok(());
        }
        let body = serde_json::json!({
            "registry": self.name, "revision": revision,
            "problem": format!(
                "rollgate's champion was set by hand to {revision}, which no version of the registry \
                 became: its champion alias still names what served before"
            ),
        });
        self.note_at(&rec.model, None, "registry_conflict", body, Some(rec.seq))
            .await
    }

    /// Does what `rec` asks and records it with the cursor moved past it;
    /// a write refused for good is recorded as a conflict and passed.
    async fn write(&mut self, rec: &AuditRecord, write: Write) -> Result<(), PassError> {
        let (version, rollout) = match &write {
            Write::End {
                version, rollout, ..
            } => (version.clone(), Some(rollout.id)),
            Write::Champion { version } => (version.clone(), None),
        };
        match self.write_to_registry(rec, &write).await {
            Ok(body) => {
                tracing::info!(registry = %self.name, seq = rec.seq, version = %version.version, "written back to the registry");
                self.note_at(&rec.model, rollout, "registry_written", body, Some(rec.seq))
                    .await
            }
            Err(PassError::Registry(e))
                if refused_for_good(&e)
                    || (!matches!(e, RegistryError::Unreachable)
                        && self.failed_before(rec.seq) + 1 >= ATTEMPTS) =>
            {
                tracing::error!(registry = %self.name, seq = rec.seq, version = %version.version, error = %e, "the registry refused the write-back for good");
                let body = serde_json::json!({
                    "registry": self.name, "registered_model": version.model,
                    "version": version.version, "end": rec.seq,
                    "problem": format!(
                        "version {} of {} was not written back: {e}",
                        version.version, version.model
                    ),
                });
                self.note_at(
                    &rec.model,
                    rollout,
                    "registry_conflict",
                    body,
                    Some(rec.seq),
                )
                .await
            }
            Err(e) => {
                *self.attempts = (rec.seq, self.failed_before(rec.seq) + 1);
                Err(e)
            }
        }
    }

    /// How many passes failed on record `seq` before this one.
    fn failed_before(&self, seq: u64) -> u32 {
        if self.attempts.0 == seq {
            self.attempts.1
        } else {
            0
        }
    }

    /// The registry writes themselves; what the record of them says.
    async fn write_to_registry(
        &self,
        rec: &AuditRecord,
        write: &Write,
    ) -> Result<serde_json::Value, PassError> {
        let (v, champion_alias) = match write {
            Write::End { version, .. } | Write::Champion { version } => {
                let champion = if version.champion.is_empty() {
                    "champion"
                } else {
                    &version.champion
                };
                (version, champion.to_string())
            }
        };
        let mut moved = BTreeMap::new();
        let mut tags = Vec::new();
        match write {
            Write::Champion { .. } => {
                self.leading()?;
                self.mlflow
                    .set_alias(&v.model, &champion_alias, &v.version)
                    .await?;
                moved.insert(champion_alias, "set");
            }
            Write::End {
                rollout, verdict, ..
            } => {
                if *verdict == "promoted" {
                    self.leading()?;
                    self.mlflow
                        .set_alias(&v.model, &champion_alias, &v.version)
                        .await?;
                    moved.insert(champion_alias, "set");
                }
                let follow = if v.follow.is_empty() {
                    "challenger"
                } else {
                    &v.follow
                };
                self.leading()?;
                let aliases = self.mlflow.aliases(&v.model).await?;
                if aliases.get(follow) == Some(&v.version) {
                    self.leading()?;
                    self.mlflow.delete_alias(&v.model, follow).await?;
                    moved.insert(follow.to_string(), "removed");
                }
                tags.push(("rollgate.rollout", rollout.id.to_string()));
                tags.push(("rollgate.audit", format!("{}:{}", rec.seq, rec.hash)));
                if *verdict != "promoted" {
                    tags.push((
                        "rollgate.reason",
                        rollgate_core::words::phase_line(&rollout.state.phase),
                    ));
                }
                // The verdict last: a reader who sees it sees the rest.
                tags.push(("rollgate.verdict", verdict.to_string()));
                for (key, value) in &tags {
                    self.leading()?;
                    self.mlflow
                        .set_tag(&v.model, &v.version, key, value)
                        .await?;
                }
            }
        }
        let said: Vec<String> = moved.iter().map(|(a, how)| format!("@{a} {how}")).collect();
        let verdict = match write {
            Write::End { verdict, .. } => format!("tagged {verdict}"),
            Write::Champion { .. } => "rollgate's champion set by hand".into(),
        };
        Ok(serde_json::json!({
            "written": format!(
                "version {} of {}: {}{verdict}",
                v.version,
                v.model,
                said.iter().map(|s| format!("{s}, ")).collect::<String>()
            ),
            "registry": self.name, "registered_model": v.model, "version": v.version,
            "aliases": moved,
            "tags": tags.iter().map(|(k, v)| (k.to_string(), v.clone())).collect::<BTreeMap<_, _>>(),
            "end": rec.seq,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_gone_version_or_a_wrong_request_is_given_up_at_once() {
        let refused = |status| RegistryError::Refused {
            status,
            message: String::new(),
        };
        assert!(refused_for_good(&RegistryError::NotFound("v3".into())));
        assert!(refused_for_good(&refused(400)));
        assert!(refused_for_good(&refused(422)));
        assert!(!refused_for_good(&refused(401)));
        assert!(!refused_for_good(&refused(403)));
        assert!(!refused_for_good(&refused(404)));
        assert!(!refused_for_good(&refused(408)));
        assert!(!refused_for_good(&refused(429)));
        assert!(!refused_for_good(&refused(500)));
        assert!(!refused_for_good(&refused(503)));
        assert!(!refused_for_good(&RegistryError::Unreachable));
        assert!(!refused_for_good(&RegistryError::Unreadable("x".into())));
    }
}
