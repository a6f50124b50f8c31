//! The kit's upstreams — two HTTP servers on 127.0.0.1 that answer every
//! request with their own name — and the client the kit sends requests
//! through a data plane with (a new connection per request, so that no
//! request rides a connection a reloaded data plane is still draining).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::KEY_HEADER;

/// The name the champion's upstream answers.
pub const CHAMPION: &str = "champion";
/// The name the candidate's upstream answers.
pub const CANDIDATE: &str = "candidate";

/// How long one request through a data plane may take.
const REQUEST_WITHIN: Duration = Duration::from_secs(5);

/// The champion's and the candidate's upstream, stopped when dropped.
#[derive(Debug)]
pub struct Upstreams {
    champion: Named,
    candidate: Named,
    /// The host their URLs name (they listen on 127.0.0.1).
    host: &'static str,
}

/// A server answering its name.
#[derive(Debug)]
struct Named {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Named {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstreams {
    /// Both upstreams, listening on 127.0.0.1.
    pub async fn start() -> Upstreams {
        Upstreams::start_at("127.0.0.1").await
    }

    /// Both upstreams, their URLs naming `host` (which must reach
    /// 127.0.0.1): `localhost` names a Kubernetes Service, as a revision
    /// routed by a Kubernetes data plane registers its upstream.
    pub async fn start_at(host: &'static str) -> Upstreams {
        Upstreams {
            champion: answering(CHAMPION).await,
            candidate: answering(CANDIDATE).await,
            host,
        }
    }

    /// `http://host:port` of [`CHAMPION`] or [`CANDIDATE`].
    pub fn url(&self, name: &str) -> String {
        let named = if name == CHAMPION {
            &self.champion
        } else {
            &self.candidate
        };
        format!("http://{}:{}", self.host, named.addr.port())
    }

    /// The champion's `http://host:port` (what a seed routes to).
    pub fn champion_url(&self) -> String {
        self.url(CHAMPION)
    }
}

/// A server on 127.0.0.1 answering every request `200 <name>`.
async fn answering(name: &'static str) -> Named {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(move |_req| async move {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                        Bytes::from_static(name.as_bytes()),
                    )))
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Named { addr, task }
}

/// `GET url` with sticky key `key` in [`KEY_HEADER`], on a connection of
/// its own: the body of a `200` answer (an upstream's name), `None` on
/// anything else or after 5 s.
pub async fn get(url: &str, key: &str) -> Option<String> {
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http::<Full<Bytes>>();
    let req = http::Request::get(url)
        .header(KEY_HEADER, key)
        .body(Full::new(Bytes::new()))
        .ok()?;
    let call = async {
        let resp = client.request(req).await.ok()?;
        if resp.status() != http::StatusCode::OK {
            return None;
        }
        let body = resp.into_body().collect().await.ok()?.to_bytes();
        Some(String::from_utf8_lossy(&body).into_owned())
    };
    tokio::time::timeout(REQUEST_WITHIN, call)
        .await
        .ok()
        .flatten()
}
