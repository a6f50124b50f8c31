//! The controller's outbound HTTP: readiness probes, gateway stats and
//! Prometheus queries, to `http://` or `https://` URLs, every call bounded
//! by a timeout. The client lives in `rollgate_net` (shared with the
//! adapters); it is re-exported here under the paths it always had.

pub use rollgate_net::{HttpClient, bearer_token};
