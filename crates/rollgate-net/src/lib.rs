//! Connections in and out, shared by the gateway, the admin API and the
//! model server (which may not depend on each other, so this is its own
//! crate): TLS with rustls ([`tls`]), the accept loop that serves
//! HTTP/1.1 and HTTP/2 on every listener ([`serve`]), the connector
//! every outbound client uses ([`connector`]), and the small client of
//! the control plane and the adapters ([`HttpClient`]).

mod body;
pub mod client;
pub mod refusal;
pub mod serve;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tls;

pub use body::WholeBody;
pub use client::{HttpClient, bearer_token};
pub use serve::{Serving, serve};
pub use tls::{ClientTls, ListenerTls, ServerTls, TlsError};

use hyper_util::client::legacy::connect::HttpConnector;

/// A connector for `http://` and `https://` URLs.
pub type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// Wraps `http` (its timeouts and socket options kept) to speak TLS to
/// `https://` URLs, trusting and presenting what `tls` says. HTTP/2 is
/// offered by ALPN over TLS; in the clear a connection speaks HTTP/1.1.
pub fn connector(mut http: HttpConnector, tls: &ClientTls) -> Result<Connector, TlsError> {
    http.enforce_http(false);
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls.config()?)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http))
}

/// Like [`connector`] trusting the public roots only, presenting nothing:
/// for what reaches public services (an identity provider's keys, a
/// webhook), and cannot fail.
pub fn public_connector(mut http: HttpConnector) -> Connector {
    http.enforce_http(false);
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http)
}
