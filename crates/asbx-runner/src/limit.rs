//! A Unix listener that holds at most N connections at once.
//!
//! The gateway and the egress proxy are reachable from a sandbox that may be
//! hostile; without a bound, one sandbox could open connections until the
//! runner runs out of memory or descriptors. `accept` waits for a free slot,
//! and each connection gives its slot back when it closes.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream, unix::SocketAddr};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Most connections one sandbox may hold open to one of its sockets.
pub(crate) const MAX_CONNECTIONS: usize = asbx_protocol::rules::limits::MAX_SANDBOX_CONNECTIONS;

pub(crate) struct LimitedListener {
    inner: UnixListener,
    slots: Arc<Semaphore>,
}

impl LimitedListener {
    pub(crate) fn new(inner: UnixListener, max: usize) -> Self {
        LimitedListener {
            inner,
            slots: Arc::new(Semaphore::new(max)),
        }
    }

    /// The next connection, once one of the slots is free.
    pub(crate) async fn accept_limited(&self) -> io::Result<(LimitedStream, SocketAddr)> {
        let permit = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .map_err(|_| io::Error::other("listener closed"))?;
        let (stream, addr) = self.inner.accept().await?;
        Ok((
            LimitedStream {
                stream,
                _permit: permit,
            },
            addr,
        ))
    }
}

impl axum::serve::Listener for LimitedListener {
    type Io = LimitedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.accept_limited().await {
                Ok(v) => return v,
                // Transient accept errors (EMFILE, ECONNABORTED): try again shortly.
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection holding one slot of its listener.
pub(crate) struct LimitedStream {
    stream: UnixStream,
    _permit: OwnedSemaphorePermit,
}

impl AsyncRead for LimitedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for LimitedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_connection_past_the_limit_waits_for_a_free_slot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = LimitedListener::new(UnixListener::bind(&path).unwrap(), 2);
        let _c1 = UnixStream::connect(&path).await.unwrap();
        let _c2 = UnixStream::connect(&path).await.unwrap();
        let c3 = UnixStream::connect(&path).await.unwrap();
        let a1 = listener.accept_limited().await.unwrap();
        let _a2 = listener.accept_limited().await.unwrap();
        let third = tokio::time::timeout(
            std::time::Duration::from_millis(100),
            listener.accept_limited(),
        )
        .await;
        assert!(third.is_err(), "a third connection got a slot");
        drop(a1);
        let a3 = listener.accept_limited().await;
        assert!(a3.is_ok());
        drop(c3);
    }
}
