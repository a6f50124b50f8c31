//! What the gateway's test files share: routes of one model `m`.
#![allow(dead_code)] // each test file uses its own part of these

use rollgate_core::Protocol;
use rollgate_gateway::{ModelRoute, Upstream};

/// An upstream of revision `revision` at `url`.
pub fn up(revision: &str, url: &str) -> Upstream {
    Upstream {
        revision: revision.into(),
        url: url.into(),
        timeout: None,
        served_name: None,
        headers: Default::default(),
        grpc_url: None,
    }
}

/// Model `m` (KServe V1) served by its champion at `champion` only.
pub fn route(champion: &str) -> ModelRoute {
    ModelRoute {
        name: "m".into(),
        protocol: Protocol::KserveV1,
        json_path: None,
        key_field: None,
        salt: None,
        assignment: Default::default(),
        output_pointer: None,
        output: None,
        confidence_threshold: 0.9,
        numeric_tolerance: 1e-6,
        fallback_to_champion: false,
        champion: up("champ", champion),
        candidate: None,
        shadow: None,
        epoch: None,
    }
}
