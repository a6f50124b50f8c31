//! Accepting connections, and shutting down without dropping requests.

use std::future::Future;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
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
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(a) => a,
                    // Out of file descriptors or a reset during accept: keep serving.
                    Err(e) => { tracing::warn!(error = %e, "accept failed"); continue; }
                };
                let _ = stream.set_nodelay(true);
                let inner = std::sync::Arc::clone(&gateway.inner);
                let service = service_fn(move |req| {
                    let inner = std::sync::Arc::clone(&inner);
                    async move { Ok::<_, std::convert::Infallible>(crate::proxy::handle(inner, req).await) }
                });
                // The header timeout runs from the connection's start and
                // again whenever it waits for a next request: a client that
                // dribbles headers or idles holds nothing for long.
                let conn = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(gateway.inner.limits.client_header_timeout)
                    .serve_connection(TokioIo::new(stream), service);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    let drain = gateway.inner.limits.drain_timeout;
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(drain) => tracing::warn!("drain timeout: closing remaining connections"),
    }
    Ok(())
}
