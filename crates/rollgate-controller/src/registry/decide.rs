//! What the follower does with what a registry's aliases say and what
//! rollgate holds: pure, so every case is a unit test.
//!
//! The registry says which version *should* serve; rollgate decides
//! whether it *may*. So the follower starts a rollout of a version the
//! followed alias names that rollgate has not judged, seeds a model with
//! no champion from the registry's, and otherwise only reports: an alias
//! moved under an active rollout is a conflict said in the audit log, never
//! followed (the rollout is neither abandoned nor restarted).

use std::collections::BTreeSet;

/// The registered model's aliases, as versions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Aliases {
    /// The version the champion alias names.
    pub champion: Option<String>,
    /// The version the followed alias names.
    pub followed: Option<String>,
}

/// What rollgate holds for the model, in the registry's versions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// The champion: `None` without one; `Some(None)` when it did not come
    /// from this registry.
    pub champion: Option<Option<String>>,
    /// The active rollout's id and its candidate's version (`None` when the
    /// candidate did not come from this registry).
    pub active: Option<(i64, Option<String>)>,
    /// Versions rollgate judged and will not roll out again by itself:
    /// rolled back, aborted, or blocked.
    pub judged: BTreeSet<String>,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Act {
    /// Make this version the model's champion (it has none).
    Seed(String),
    /// Register this version and start its rollout.
    Start(String),
}

/// An alias moved under an active rollout: said, not followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conflict {
    /// The champion alias no longer names rollgate's champion.
    ChampionMoved {
        rollout: i64,
        expected: String,
        found: Option<String>,
    },
    /// The followed alias names another version than the one rolling out.
    FollowedMoved {
        rollout: i64,
        rolling_out: Option<String>,
        found: String,
    },
}

impl Conflict {
    pub fn rollout(&self) -> i64 {
        match self {
            Conflict::ChampionMoved { rollout, .. } | Conflict::FollowedMoved { rollout, .. } => {
                *rollout
            }
        }
    }
}

/// The follower's decision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    pub act: Option<Act>,
    pub conflicts: Vec<Conflict>,
}

/// Decides one poll.
pub fn decide(registry: &Aliases, held: &Held) -> Decision {
    let mut d = Decision::default();
    let Some(champion) = &held.champion else {
        // Nothing can roll out without a champion: seed it first.
        d.act = registry.champion.clone().map(Act::Seed);
        return d;
    };
    if let Some((rollout, candidate)) = &held.active {
        if let Some(expected) = champion
            && registry.champion.as_ref() != Some(expected)
        {
            d.conflicts.push(Conflict::ChampionMoved {
                rollout: *rollout,
                expected: expected.clone(),
                found: registry.champion.clone(),
            });
        }
        if let Some(found) = &registry.followed
            && candidate.as_ref() != Some(found)
            && champion.as_ref() != Some(found)
        {
            d.conflicts.push(Conflict::FollowedMoved {
                rollout: *rollout,
                rolling_out: candidate.clone(),
                found: found.clone(),
            });
        }
        return d;
    }
    if let Some(v) = &registry.followed
        && champion.as_ref() != Some(v)
        && !held.judged.contains(v)
    {
        d.act = Some(Act::Start(v.clone()));
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Option<String> {
        Some(s.to_string())
    }

    fn aliases(champion: Option<&str>, followed: Option<&str>) -> Aliases {
        Aliases {
            champion: champion.map(str::to_string),
            followed: followed.map(str::to_string),
        }
    }

    fn held(champion: Option<Option<&str>>, active: Option<(i64, Option<&str>)>) -> Held {
        Held {
            champion: champion.map(|c| c.map(str::to_string)),
            active: active.map(|(id, c)| (id, c.map(str::to_string))),
            judged: BTreeSet::new(),
        }
    }

    #[test]
    fn a_model_without_a_champion_is_seeded_from_the_registrys_and_nothing_starts_first() {
        let d = decide(&aliases(Some("1"), Some("2")), &held(None, None));
        assert_eq!(d.act, Some(Act::Seed("1".into())));
        assert!(d.conflicts.is_empty());
        assert_eq!(
            decide(&aliases(None, Some("2")), &held(None, None)),
            Decision::default()
        );
    }

    #[test]
    fn a_new_followed_version_starts_once_and_a_judged_or_serving_one_never() {
        let idle = held(Some(v("1").as_deref()), None);
        assert_eq!(
            decide(&aliases(Some("1"), Some("2")), &idle).act,
            Some(Act::Start("2".into()))
        );
        // The champion itself, or nothing followed: nothing to do.
        assert_eq!(
            decide(&aliases(Some("1"), Some("1")), &idle),
            Decision::default()
        );
        assert_eq!(
            decide(&aliases(Some("1"), None), &idle),
            Decision::default()
        );
        // Rolled back, aborted or blocked: not again by itself.
        let mut judged = idle.clone();
        judged.judged.insert("2".into());
        assert_eq!(
            decide(&aliases(Some("1"), Some("2")), &judged),
            Decision::default()
        );
        // A champion rollgate was given by hand: the registry's version
        // still rolls out against it.
        assert_eq!(
            decide(&aliases(None, Some("2")), &held(Some(None), None)).act,
            Some(Act::Start("2".into()))
        );
    }

    #[test]
    fn its_own_moves_seen_again_change_nothing() {
        // After a promotion is written back: @champion on the new champion,
        // the followed alias gone.
        let after = held(Some(Some("2")), None);
        assert_eq!(
            decide(&aliases(Some("2"), None), &after),
            Decision::default()
        );
        // Mid-rollout, the aliases as the follower left them.
        let rolling = held(Some(Some("1")), Some((7, Some("2"))));
        assert_eq!(
            decide(&aliases(Some("1"), Some("2")), &rolling),
            Decision::default()
        );
    }

    #[test]
    fn aliases_moved_under_an_active_rollout_are_conflicts_never_acts() {
        let rolling = held(Some(Some("1")), Some((7, Some("2"))));
        let d = decide(&aliases(Some("3"), Some("4")), &rolling);
        assert_eq!(d.act, None);
        assert_eq!(
            d.conflicts,
            vec![
                Conflict::ChampionMoved {
                    rollout: 7,
                    expected: "1".into(),
                    found: v("3")
                },
                Conflict::FollowedMoved {
                    rollout: 7,
                    rolling_out: v("2"),
                    found: "4".into()
                },
            ]
        );
        // The champion alias removed is a move too.
        let d = decide(&aliases(None, Some("2")), &rolling);
        assert_eq!(
            d.conflicts,
            vec![Conflict::ChampionMoved {
                rollout: 7,
                expected: "1".into(),
                found: None
            }]
        );
        // A rollout started by hand while the alias names a version.
        let by_hand = held(Some(Some("1")), Some((8, None)));
        assert_eq!(
            decide(&aliases(Some("1"), Some("2")), &by_hand).conflicts,
            vec![Conflict::FollowedMoved {
                rollout: 8,
                rolling_out: None,
                found: "2".into()
            }]
        );
        assert!(d.conflicts.iter().all(|c| c.rollout() == 7));
    }

    #[test]
    fn no_poll_starts_while_a_rollout_is_active_whatever_the_aliases() {
        let versions = [None, Some("1"), Some("2"), Some("3")];
        for champion in versions {
            for followed in versions {
                for active in [Some((1, Some("2"))), Some((1, None))] {
                    for held_champion in [None, Some(None), Some(Some("1"))] {
                        let d = decide(&aliases(champion, followed), &held(held_champion, active));
                        if held_champion.is_some() {
                            assert_eq!(d.act, None, "{champion:?} {followed:?} {active:?}");
                        }
                    }
                }
            }
        }
    }
}
