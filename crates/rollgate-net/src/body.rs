//! A body held whole: its bytes and then, for gRPC, the trailers that end
//! it (a gRPC answer's status is in them). Written here because
//! `http_body_util::Full` carries no trailers; the gateway's answers and
//! the model kit's are all whole.

use bytes::Bytes;
use http::HeaderMap;

/// Bytes, then optional trailers.
#[derive(Debug, Default)]
pub struct WholeBody {
    data: Option<Bytes>,
    /// Boxed: most bodies have none, and a body is moved several times.
    trailers: Option<Box<HeaderMap>>,
}

impl WholeBody {
    pub fn new(data: Bytes) -> WholeBody {
        WholeBody {
            data: Some(data),
            trailers: None,
        }
    }

    pub fn with_trailers(data: Bytes, trailers: Option<HeaderMap>) -> WholeBody {
        WholeBody {
            data: Some(data),
            trailers: trailers.map(Box::new),
        }
    }
}

impl hyper::body::Body for WholeBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(data) = this.data.take().filter(|d| !d.is_empty()) {
            return std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(data))));
        }
        std::task::Poll::Ready(
            this.trailers
                .take()
                .map(|t| Ok(hyper::body::Frame::trailers(*t))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.data.as_ref().is_none_or(Bytes::is_empty) && self.trailers.is_none()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}
