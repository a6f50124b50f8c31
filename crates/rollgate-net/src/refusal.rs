//! A body for the refusals hyper writes itself.
//!
//! hyper answers an HTTP/1 request head it cannot parse (too large,
//! malformed, a URI too long) on its own, before any service sees the
//! request: a bodiless 4xx with `connection: close`. It has no hook for
//! that answer's body, so a listener whose clients expect every refusal in
//! a JSON envelope (the admin API) wraps its HTTP/1 connections in
//! [`Enveloped`], which recognises exactly that answer on its way out and
//! writes it with the body a [`RefusalBody`] makes. Written by hand because
//! no crate does it; everything else passes through unchanged.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The JSON body for a refusal hyper made, by status (`None`: leave it).
pub type RefusalBody = fn(status: u16) -> Option<String>;

/// A connection whose bodiless parse-error answers get a body.
#[derive(Debug)]
pub struct Enveloped<S> {
    inner: S,
    body: Option<RefusalBody>,
    /// The rewritten answer, still being written.
    pending: Bytes,
}

impl<S> Enveloped<S> {
    pub fn new(inner: S, body: Option<RefusalBody>) -> Self {
        Enveloped {
            inner,
            body,
            pending: Bytes::new(),
        }
    }
}

/// `buf` rewritten with `body` if it is hyper's own refusal: a whole 4xx
/// head, `connection: close`, `content-length: 0` (a service's answers
/// carry bodies, so none of them looks like this).
pub fn with_body(buf: &[u8], body: RefusalBody) -> Option<Vec<u8>> {
    const EMPTY: &str = "\r\ncontent-length: 0\r\n";
    let head = std::str::from_utf8(buf).ok()?;
    // One whole head and nothing else (not the end of one answer and the
    // start of the next).
    if !(head.starts_with("HTTP/1.1 4")
        && head.ends_with("\r\n\r\n")
        && head.matches("\r\n\r\n").count() == 1
        && head.matches("HTTP/1.1 ").count() == 1
        && head.contains("\r\nconnection: close\r\n")
        && head.contains(EMPTY))
    {
        return None;
    }
    let status: u16 = head.get(9..12)?.parse().ok()?;
    let json = body(status)?;
    let head = head.replacen(
        EMPTY,
        &format!(
            "\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
            json.len()
        ),
        1,
    );
    Some([head.into_bytes(), json.into_bytes()].concat())
}

impl<S: AsyncWrite + Unpin> Enveloped<S> {
    /// Writes what is pending; ready when nothing is.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.pending.has_remaining() {
            match Pin::new(&mut self.inner).poll_write(cx, &self.pending) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => self.pending.advance(n),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Enveloped<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Enveloped<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.drain(cx)?.is_pending() {
            return Poll::Pending;
        }
        if let Some(rewritten) = this.body.and_then(|b| with_body(buf, b)) {
            // Taken whole; written out here and by the flush that follows.
            this.pending = Bytes::from(rewritten);
            let _ = this.drain(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.drain(cx)?.is_pending() {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.drain(cx)?.is_pending() {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.body.is_some() {
            // Not vectored (below): hyper writes one flat buffer.
            let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| b);
            return self.poll_write(cx, first);
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    /// With a body to add, hyper is told to write flat buffers, so its
    /// answer's head arrives in one write.
    fn is_write_vectored(&self) -> bool {
        self.body.is_none() && self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(status: u16) -> Option<String> {
        (status == 431).then(|| r#"{"error":{"code":"header_too_large"}}"#.to_string())
    }

    #[test]
    fn only_hypers_own_bodiless_refusal_gets_a_body() {
        let hyper = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\n\
                      content-length: 0\r\ndate: Thu, 03 Dec 2026 10:42:45 GMT\r\n\r\n";
        let out = String::from_utf8(with_body(hyper, json).expect("rewritten")).expect("utf-8");
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
        assert!(out.contains("\r\ncontent-type: application/json\r\ncontent-length: 37\r\n"));
        assert!(
            out.ends_with("\r\n\r\n{\"error\":{\"code\":\"header_too_large\"}}"),
            "{out}"
        );
        let service_answer = b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n\
                               content-length: 2\r\n\r\n{}";
        assert!(with_body(service_answer, json).is_none());
        let not_refused =
            b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
        assert!(
            with_body(not_refused, json).is_none(),
            "no body for that status"
        );
        let ok = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
        assert!(with_body(ok, |_| Some("{}".into())).is_none());
        let partial = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\n";
        assert!(with_body(partial, json).is_none());
        let two = [&service_answer[..], &hyper[..]].concat();
        assert!(with_body(&two, json).is_none(), "two answers in one write");
    }
}
