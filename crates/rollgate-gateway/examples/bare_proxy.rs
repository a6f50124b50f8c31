//! The floor under the gateway's cost: the least a proxy built on the same
//! stack (tokio, hyper's HTTP/1 server and `client::conn`) does per
//! request — no routing, recording, limits or answer reading. The
//! benchmarks run it beside nginx and the gateway, so what the stack costs
//! and what rollgate adds on top are measured apart
//! (`bench/gateway/floor.sh`). Not a product: any failure is a bare 502.
//!
//! Usage: `bare_proxy LISTEN UPSTREAM [--like-gateway]`. Without the flag
//! bodies stream through and nothing is timed; with it, the parts of the
//! gateway's request path that are not measurement: rollgate's accept
//! loop (`rollgate_net::serve`: header timeout, protocol sniffing,
//! graceful drain), both bodies read whole, the upstream call under a
//! timeout.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

type Body = BoxBody<Bytes, hyper::Error>;

/// Idle upstream connections, most recently used last.
struct Upstream {
    addr: SocketAddr,
    idle: Mutex<Vec<SendRequest<Body>>>,
    /// Bodies read whole, the call timed (`--like-gateway`).
    like_gateway: bool,
}

impl Upstream {
    async fn sender(&self) -> Option<SendRequest<Body>> {
        loop {
            let popped = self.idle.lock().ok()?.pop();
            match popped {
                Some(mut s) => {
                    if s.ready().await.is_ok() {
                        return Some(s);
                    }
                }
                None => break,
            }
        }
        let stream = TcpStream::connect(self.addr).await.ok()?;
        stream.set_nodelay(true).ok()?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .ok()?;
        tokio::spawn(conn);
        Some(sender)
    }

    async fn forward(&self, req: Request<Incoming>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let body: Body = if self.like_gateway {
            match body.collect().await {
                Ok(b) => Full::new(b.to_bytes()).map_err(|n| match n {}).boxed(),
                Err(_) => return bad_gateway(),
            }
        } else {
            body.boxed()
        };
        let Some(mut sender) = self.sender().await else {
            return bad_gateway();
        };
        let call = sender.send_request(Request::from_parts(parts, body));
        let resp = if self.like_gateway {
            match tokio::time::timeout(std::time::Duration::from_secs(30), call).await {
                Ok(Ok(r)) => r,
                _ => return bad_gateway(),
            }
        } else {
            match call.await {
                Ok(r) => r,
                Err(_) => return bad_gateway(),
            }
        };
        let (parts, body) = resp.into_parts();
        if self.like_gateway {
            let Ok(b) = body.collect().await else {
                return bad_gateway();
            };
            if let Ok(mut idle) = self.idle.lock() {
                idle.push(sender);
            }
            Response::from_parts(
                parts,
                Full::new(b.to_bytes()).map_err(|n| match n {}).boxed(),
            )
        } else {
            // Kept before its answer's body is read: `ready()` waits for
            // that before the connection takes another request.
            if let Ok(mut idle) = self.idle.lock() {
                idle.push(sender);
            }
            Response::from_parts(parts, body.boxed())
        }
    }
}

fn bad_gateway() -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::new()).map_err(|n| match n {}).boxed());
    *r.status_mut() = StatusCode::BAD_GATEWAY;
    r
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(listen), Some(upstream)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: bare_proxy LISTEN UPSTREAM [--like-gateway]");
        std::process::exit(2);
    };
    let listen: SocketAddr = listen.parse().map_err(std::io::Error::other)?;
    let upstream = Arc::new(Upstream {
        addr: upstream.parse().map_err(std::io::Error::other)?,
        idle: Mutex::new(Vec::new()),
        like_gateway: args.iter().any(|a| a == "--like-gateway"),
    });
    // One thread, as the gateway runs with `--threads 1`.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if upstream.like_gateway {
        return rt.block_on(async move {
            let listener = TcpListener::bind(listen).await?;
            let serving = rollgate_net::serve::Serving {
                header_timeout: std::time::Duration::from_secs(30),
                drain_timeout: std::time::Duration::from_secs(1),
                tls: None,
                refusal_body: None,
            };
            rollgate_net::serve::serve(
                listener,
                serving,
                move || {
                    let upstream = upstream.clone();
                    hyper::service::service_fn(move |req| {
                        let upstream = upstream.clone();
                        async move { Ok::<_, Infallible>(upstream.forward(req).await) }
                    })
                },
                std::future::pending(),
            )
            .await
        });
    }
    rt.block_on(async move {
        let listener = TcpListener::bind(listen).await?;
        loop {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let upstream = upstream.clone();
                    async move { Ok::<_, Infallible>(upstream.forward(req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}
