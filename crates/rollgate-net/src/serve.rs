//! The one accept loop of every rollgate listener (gateway, admin API,
//! model server): plain or TLS, HTTP/1.1 or HTTP/2, bounded handshakes,
//! graceful drain.
//!
//! Which HTTP a connection speaks is decided before hyper sees it: over
//! TLS by ALPN, in the clear by whether its first bytes are HTTP/2's
//! connection preface (h2c with prior knowledge). hyper-util's `auto`
//! builder sniffs the same way but waits for those bytes without a time
//! limit, so a client that connects and says nothing would hold a
//! connection for ever; here every step before the first request is
//! bounded by the header timeout.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use hyper::body::{Body, Incoming};
use hyper::service::Service;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use crate::refusal::Enveloped;
use crate::tls::ServerTls;

/// HTTP/2's connection preface: what an h2c client with prior knowledge
/// sends first.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How often a TLS listener looks for a renewed certificate.
pub const CERT_CHECK_EVERY: Duration = Duration::from_secs(1);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What serves one connection's requests: a hyper service whose future,
/// error and body can cross threads (written once here, implemented for
/// every such service).
pub trait ConnectionService:
    Service<
        http::Request<Incoming>,
        Response = http::Response<Self::ResponseBody>,
        Future: Send + 'static,
        Error: Into<BoxError>,
    > + Clone
    + Send
    + 'static
{
    type ResponseBody: Body<Data: Send, Error: Into<BoxError>> + Send + 'static;
}

impl<S, B> ConnectionService for S
where
    S: Service<http::Request<Incoming>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body<Data: Send, Error: Into<BoxError>> + Send + 'static,
{
    type ResponseBody = B;
}

/// How connections are served.
#[derive(Debug, Clone)]
pub struct Serving {
    /// The TLS handshake, the first bytes and every request's headers
    /// must arrive within this long (of connecting, or of the previous
    /// answer): slow or idle clients hold nothing for long.
    pub header_timeout: Duration,
    /// How long shutdown waits for requests in flight.
    pub drain_timeout: Duration,
    /// TLS on this listener, if any.
    pub tls: Option<ServerTls>,
    /// A body for the bodiless refusals hyper writes itself (a request
    /// head too large or malformed), for clients that expect every
    /// refusal in one shape; `None`: hyper's as they are.
    pub refusal_body: Option<crate::refusal::RefusalBody>,
}

/// A connection's bytes, with what was read to sniff its protocol put
/// back in front.
struct Prefixed<S> {
    prefix: Bytes,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.prefix.has_remaining() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Reads until the bytes either are HTTP/2's preface or cannot be:
/// `(is h2c, what was read)`. An HTTP/1 request differs at its second
/// byte at the latest.
async fn sniff(stream: &mut TcpStream) -> io::Result<(bool, Bytes)> {
    let mut buf = [0u8; PREFACE.len()];
    let mut n = 0;
    while n < PREFACE.len() {
        let got = stream.read(&mut buf[n..]).await?;
        if got == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        n += got;
        if buf[..n] != PREFACE[..n] {
            return Ok((false, Bytes::copy_from_slice(&buf[..n])));
        }
    }
    Ok((true, Bytes::copy_from_slice(&buf)))
}

/// Serves `service` (one per connection, from `make`) on `listener` until
/// `shutdown` completes; then stops accepting and waits up to the drain
/// timeout for requests in flight.
pub async fn serve<M, S>(
    listener: TcpListener,
    serving: Serving,
    make: M,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()>
where
    M: Fn() -> S,
    S: ConnectionService,
{
    let graceful = GracefulShutdown::new();
    let watcher = serving.tls.as_ref().map(|tls| {
        let cert = Arc::clone(&tls.cert);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(CERT_CHECK_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let cert = Arc::clone(&cert);
                match tokio::task::spawn_blocking(move || cert.reload_if_changed()).await {
                    Ok(Ok(true)) => tracing::info!("TLS certificate reloaded"),
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "TLS certificate not reloaded; keeping the one in use")
                    }
                    _ => {}
                }
            }
        })
    });
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
                let service = make();
                let serving = serving.clone();
                // Counted from here: a drain waits for connections still
                // in their handshake too.
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    if let Err(e) = connection(stream, &serving, service, watcher).await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    if let Some(w) = watcher {
        w.abort();
    }
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(serving.drain_timeout) => tracing::warn!("drain timeout: closing remaining connections"),
    }
    Ok(())
}

/// One connection: handshake and protocol choice within the header
/// timeout, then HTTP until it closes or the server drains.
async fn connection<S: ConnectionService>(
    mut stream: TcpStream,
    serving: &Serving,
    service: S,
    graceful: Watcher,
) -> Result<(), BoxError> {
    let limit = serving.header_timeout;
    match &serving.tls {
        Some(tls) => {
            let tls_stream = tokio::time::timeout(limit, tls.acceptor.accept(stream))
                .await
                .map_err(|_| {
                    io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")
                })??;
            let h2 = tls_stream.get_ref().1.alpn_protocol() == Some(b"h2");
            let io = Enveloped::new(tls_stream, serving.refusal_body.filter(|_| !h2));
            http(TokioIo::new(io), h2, limit, service, graceful).await
        }
        None => {
            let (h2, prefix) = tokio::time::timeout(limit, sniff(&mut stream))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no request in time"))??;
            let io = Prefixed {
                prefix,
                inner: stream,
            };
            let io = Enveloped::new(io, serving.refusal_body.filter(|_| !h2));
            http(TokioIo::new(io), h2, limit, service, graceful).await
        }
    }
}

async fn http<I, S: ConnectionService>(
    io: I,
    h2: bool,
    header_timeout: Duration,
    service: S,
    graceful: Watcher,
) -> Result<(), BoxError>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    if h2 {
        let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            // An idle HTTP/2 client is pinged; one that stops answering is
            // dropped.
            .keep_alive_interval(header_timeout)
            .keep_alive_timeout(header_timeout)
            .serve_connection(io, service);
        graceful.watch(conn).await?;
    } else {
        // The header timeout runs from the connection's start and again
        // whenever it waits for a next request: a client that dribbles
        // headers or idles holds nothing for long.
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .serve_connection(io, service);
        graceful.watch(conn).await?;
    }
    Ok(())
}
