//! Accepting connections (plain or TLS, HTTP/1.1 or HTTP/2: the shared
//! accept loop of `rollgate_net`), and shutting down without dropping
//! requests.

use std::future::Future;

use hyper::service::service_fn;
use tokio::net::TcpListener;

use crate::Gateway;

/// Serves `gateway` on `listener` until `shutdown` completes; then stops
/// accepting and waits (up to the drain timeout) for requests in flight.
/// Tests pass a listener bound to `127.0.0.1:0` and their own shutdown.
pub async fn serve(
    listener: TcpListener,
    gateway: Gateway,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let limits = &gateway.inner.limits;
    let serving = rollgate_net::Serving {
        header_timeout: limits.client_header_timeout,
        drain_timeout: limits.drain_timeout,
        tls: gateway.inner.tls.clone(),
        refusal_body: None,
    };
    let inner = std::sync::Arc::clone(&gateway.inner);
    let make = move || {
        let inner = std::sync::Arc::clone(&inner);
        service_fn(move |req| {
            let inner = std::sync::Arc::clone(&inner);
            async move { Ok::<_, std::convert::Infallible>(crate::proxy::handle(inner, req).await) }
        })
    };
    rollgate_net::serve(listener, serving, make, shutdown).await
}
