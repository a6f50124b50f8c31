//! A model registry a model follows (MLflow's), as a model's spec names
//! it, and the registry version a revision was registered from.
//!
//! The registry's address and credential are the host's (the controller's
//! config declares them as `[registries.NAME]`); a spec names one. The
//! spec chooses only what an API caller may choose anyway: which
//! registered model and alias to follow, and where a version's model
//! server answers (a revision's upstream is the caller's to give).

use serde::{Deserialize, Serialize};

use crate::{Result, StoreError};

/// Where a version's model server is said to answer when no template is
/// given: this tag on the registry's version.
pub const UPSTREAM_TAG: &str = "rollgate.upstream";

/// `"registry"` in a model's spec: which registered model and alias the
/// controller follows, and how a version becomes a revision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RegistrySource {
    /// The registry, by the name the controller's config declares it under
    /// (`[registries.NAME]`).
    pub name: String,
    /// The registered model's name there (default: the model's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registered_model: Option<String>,
    /// The alias whose version is rolled out (default `challenger`).
    #[serde(default = "default_follow")]
    pub follow: String,
    /// The alias of the version that serves (default `champion`): read to
    /// seed the model's champion, moved on a promotion.
    #[serde(default = "default_champion")]
    pub champion: String,
    /// Where a version's model server answers: a URL with `{version}` in
    /// it. Unset: the version's `rollgate.upstream` tag. rollgate routes
    /// to running servers; it does not start them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// The plan of the rollouts the registry starts (default plan if unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<rollgate_core::Plan>,
}

fn default_follow() -> String {
    "challenger".into()
}

fn default_champion() -> String {
    "champion".into()
}

/// The mark a template's version fills.
pub const VERSION_MARK: &str = "{version}";

impl RegistrySource {
    /// The registered model's name for model `model`.
    pub fn registered_model<'a>(&'a self, model: &'a str) -> &'a str {
        self.registered_model.as_deref().unwrap_or(model)
    }

    /// Checks what a caller wrote; errors name the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(StoreError::Invalid(format!("model.registry.{m}")));
        if self.name.trim().is_empty() {
            return bad("name: the registry's name in the controller's config \
                 ([registries.NAME]; docs/config.md, \"MLflow\")"
                .into());
        }
        if let Some(m) = &self.registered_model
            && (m.trim().is_empty() || m.len() > 256)
        {
            return bad(format!(
                "registered_model: a registered model's name, got {m:?}"
            ));
        }
        for (field, alias) in [("follow", &self.follow), ("champion", &self.champion)] {
            let ok = !alias.is_empty()
                && alias.len() <= 255
                && alias
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !ok {
                return bad(format!(
                    "{field}: an alias of letters, digits, '_' and '-', got {alias:?}"
                ));
            }
        }
        if self.follow == self.champion {
            return bad("follow: must differ from champion (the alias that serves)".into());
        }
        if let Some(t) = &self.upstream {
            if !t.contains(VERSION_MARK) {
                return bad(format!(
                    "upstream: a URL with {VERSION_MARK} in it, got {t:?}"
                ));
            }
            let example = t.replace(VERSION_MARK, "1");
            if let Err(e) = rollgate_core::spec::check_upstream_url("upstream", &example) {
                return bad(e.to_string());
            }
        }
        if let Some(p) = &self.plan {
            p.validate()
                .map_err(|e| StoreError::Invalid(format!("model.registry.{e}")))?;
            if !p.mode.is_enforce() {
                // A dry run changes nothing, so it has no verdict to write
                // back, and the alias would start it again and again.
                return bad(
                    "plan.mode: the registry's rollouts enforce their verdicts; \
                     start a dry run by hand (rollgate rollout start --plan)"
                        .into(),
                );
            }
        }
        Ok(())
    }

    /// Version `version`'s upstream by the template, if there is one.
    pub fn upstream_of(&self, version: &str) -> Option<String> {
        self.upstream
            .as_ref()
            .map(|t| t.replace(VERSION_MARK, version))
    }
}

/// The registry version a revision was registered from (for the record,
/// and so that a version is registered once).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct RegistryVersion {
    /// The registry's name in the controller's config.
    pub registry: String,
    /// The registered model.
    pub model: String,
    pub version: String,
    /// The version's `source` (its artifact's URI).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The run that made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The aliases the model followed and moved when it was registered:
    /// what its end is written back to, even if the model's spec changed
    /// or the model is gone by then.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub follow: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub champion: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(json: &str) -> RegistrySource {
        serde_json::from_str(json).expect("a source")
    }

    #[test]
    fn defaults_follow_challenger_and_move_champion() {
        let s = source(r#"{"name": "mlflow"}"#);
        assert_eq!(
            (s.follow.as_str(), s.champion.as_str()),
            ("challenger", "champion")
        );
        assert_eq!(s.registered_model("fraud"), "fraud");
        assert!(s.validate().is_ok());
    }

    #[test]
    fn bad_sources_name_their_field() {
        for (json, field) in [
            (r#"{"name": " "}"#, "model.registry.name"),
            (
                r#"{"name": "m", "follow": "champion"}"#,
                "model.registry.follow",
            ),
            (
                r#"{"name": "m", "champion": "a b"}"#,
                "model.registry.champion",
            ),
            (
                r#"{"name": "m", "upstream": "http://h/v1"}"#,
                "model.registry.upstream",
            ),
            (
                r#"{"name": "m", "upstream": "ftp://h/{version}"}"#,
                "model.registry.upstream",
            ),
            (
                r#"{"name": "m", "plan": {"steps": [50, 20]}}"#,
                "model.registry.plan",
            ),
        ] {
            let e = source(json).validate().expect_err(json).to_string();
            assert!(e.contains(field), "{json}: {e}");
        }
    }

    #[test]
    fn a_template_fills_the_version() {
        let s = source(r#"{"name": "m", "upstream": "http://fraud-v{version}.models:8080"}"#);
        assert!(s.validate().is_ok());
        assert_eq!(
            s.upstream_of("7").as_deref(),
            Some("http://fraud-v7.models:8080")
        );
    }
}
