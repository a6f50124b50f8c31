//! Connections to one plain-HTTP upstream, on hyper's `client::conn`.
//!
//! hyper-util's pooled client keys every checkout and return by scheme and
//! authority in a hash map (hashing the authority a byte at a time) and
//! keeps waiters and connecting sets besides: about a seventh of a proxied
//! request's instructions (`bench/gateway/callgrind.sh`). A target knows
//! its upstream, so here each upstream has its own stack of idle
//! connections and a checkout is a pop. `https://` upstreams keep the
//! pooled client (TLS, HTTP/2 by ALPN).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::stream::Outgoing;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Idle connections kept per upstream.
const MAX_IDLE: usize = 1024;

/// Why a request got no answer.
#[derive(Debug)]
pub enum SendError {
    /// No connection could be made.
    Connect,
    /// The connection failed while the request was sent or answered.
    Http(hyper::Error),
}

/// The idle connections to one upstream (`host:port`).
#[derive(Debug)]
pub struct Pool {
    addr: String,
    connect_timeout: Duration,
    idle_timeout: Duration,
    idle: Mutex<Vec<(SendRequest<Outgoing>, Instant)>>,
}

impl Pool {
    pub fn new(addr: String, connect_timeout: Duration, idle_timeout: Duration) -> Pool {
        Pool {
            addr,
            connect_timeout,
            idle_timeout,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// An idle connection, else a new one (`fresh`: always a new one).
    async fn checkout(&self, fresh: bool) -> Result<SendRequest<Outgoing>, SendError> {
        if !fresh && let Some(sender) = self.idle_connection().await {
            return Ok(sender);
        }
        let connect = TcpStream::connect(self.addr.as_str());
        let stream = match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(s)) => s,
            _ => return Err(SendError::Connect),
        };
        let _ = stream.set_nodelay(true);
        let (sender, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|_| SendError::Connect)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }

    /// The most recently used idle connection still open and not idle too
    /// long; the others popped on the way are dropped.
    async fn idle_connection(&self) -> Option<SendRequest<Outgoing>> {
        loop {
            let (mut sender, since) = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
            if since.elapsed() >= self.idle_timeout {
                continue; // closed by us before the server closes it
            }
            // Ready at once unless the connection is closed (then an error).
            if sender.ready().await.is_ok() {
                return Some(sender);
            }
        }
    }

    /// Sends `req` (origin-form URI, `Host` set) on a pooled or `fresh`
    /// connection. The connection comes back with the answer: return it
    /// with [`Pool::put`] once the body is read in full.
    pub async fn send(
        &self,
        req: Request<Outgoing>,
        fresh: bool,
    ) -> Result<(Response<Incoming>, SendRequest<Outgoing>), SendError> {
        let mut sender = self.checkout(fresh).await?;
        let resp = sender.send_request(req).await.map_err(SendError::Http)?;
        Ok((resp, sender))
    }

    /// Keeps a connection whose last answer was read in full.
    pub fn put(&self, sender: SendRequest<Outgoing>) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push((sender, Instant::now()));
        }
    }
}
