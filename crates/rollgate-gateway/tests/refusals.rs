//! The gateway's own refusals over HTTP/2: a refused request's unread
//! body costs only its stream (reset), never the connection, so a
//! multiplexing client's next request on it is served. (HTTP/1.1 is
//! `it.rs`'s `a_refusal_keeps_the_connection_for_the_next_request`, on
//! raw sockets.)

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::BodyExt as _;
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::oneshot;

use crate::common::route;
use crate::it::{Behaviour, ONE, config, start, upstream};

/// A request body that arrives when its sender says (or ends empty when
/// the sender is dropped).
struct Late(Option<oneshot::Receiver<Bytes>>);

impl hyper::body::Body for Late {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let Some(rx) = self.0.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(rx).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(got) => {
                self.0 = None;
                Poll::Ready(got.ok().map(|b| Ok(Frame::data(b))))
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http2_a_refusal_costs_its_stream_not_the_connection() {
    let champ = upstream(Behaviour::Answer(200, ONE)).await;
    let gw = start(config(vec![route(&champ.url)])).await;
    let tcp = tokio::net::TcpStream::connect(gw.addr)
        .await
        .expect("connect");
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .expect("h2c with prior knowledge");
    let connection = tokio::spawn(conn);
    let body = Bytes::from_static(br#"{"instances":[[1,2]]}"#);
    let request = |path: &str, rx| {
        Request::post(format!("http://{}{path}", gw.addr))
            .header("content-type", "application/json")
            .body(Late(Some(rx)))
            .expect("request")
    };
    let mut served = 0;
    for (path, refused) in [
        ("/v1/models/nope:predict", StatusCode::NOT_FOUND),
        ("/v2/models/m/infer", StatusCode::BAD_REQUEST),
        ("/no/route/here", StatusCode::NOT_FOUND),
    ] {
        for late in [false, true] {
            let (tx, rx) = oneshot::channel();
            let tx = if late {
                Some(tx)
            } else {
                let _ = tx.send(body.clone());
                None
            };
            send.ready().await.expect("the connection takes a request");
            let answer = tokio::time::timeout(
                Duration::from_secs(10),
                send.send_request(request(path, rx)),
            )
            .await
            .expect("answered within 10 s")
            .expect("answered");
            assert_eq!(answer.status(), refused, "{path}");
            // The body that comes after the answer goes to a reset stream.
            if let Some(tx) = tx {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let _ = tx.send(body.clone());
            }
            let _ = answer.into_body().collect().await;
            // The next request on the same connection is served.
            let (tx, rx) = oneshot::channel();
            let _ = tx.send(body.clone());
            send.ready()
                .await
                .expect("the connection still takes a request");
            let ok = tokio::time::timeout(
                Duration::from_secs(10),
                send.send_request(request("/v1/models/m:predict", rx)),
            )
            .await
            .expect("answered within 10 s")
            .expect("answered on the same connection");
            assert_eq!(ok.status(), StatusCode::OK, "after {path}, late {late}");
            served += 1;
        }
    }
    assert_eq!(served, 6);
    assert!(!connection.is_finished(), "the connection was closed");
    gw.shutdown().await;
}
