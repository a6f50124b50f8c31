//! The API's shared state: the controller's context, the shared token, the
//! identity provider, and the names the API answers to.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::context::Context;

/// Shared state of the API. Its `Debug` never shows the token.
#[derive(Clone)]
pub struct ApiState {
    pub ctx: Context,
    /// The shared bearer token (an admin named `token`).
    pub token: Option<Arc<str>>,
    /// Every request must carry a token, named or shared. Without one (and
    /// only on loopback) a request without a token is the `local` admin.
    pub require_token: bool,
    /// OIDC tokens from the team's identity provider, if configured.
    pub oidc: Option<Arc<crate::oidc::Oidc>>,
    /// `Host` (and `Origin` authority) values a state-changing request may
    /// carry ([`allowed_hosts`]); empty: not checked.
    pub allowed_hosts: Arc<[String]>,
}

/// The names the API at `addr` answers to: its address, and for loopback
/// also `localhost` and both loopback addresses on its port; plus `extra`
/// (e.g. the name a proxy in front of it uses).
pub fn allowed_hosts(addr: SocketAddr, extra: &[String]) -> Arc<[String]> {
    let mut hosts = vec![addr.to_string()];
    if addr.ip().is_loopback() {
        let port = addr.port();
        hosts.extend([
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
        ]);
    }
    hosts.extend(extra.iter().cloned());
    hosts.sort();
    hosts.dedup();
    hosts.into()
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

impl ApiState {
    /// Whether a request must carry a token.
    pub fn token_required(&self) -> bool {
        self.require_token || self.token.is_some()
    }
}
