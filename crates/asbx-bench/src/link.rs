//! A TCP forwarder on loopback that holds every byte for a fixed time in
//! each direction: a network link with latency but no bandwidth limit
//! between the bench's workspace and runner (`asbx-bench turn` with
//! `ASBX_BENCH_LINK_DELAY_MS`). Each chunk read is written once its
//! arrival time plus the delay has passed, so a stream keeps its rate.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// A forwarder listening on loopback; ends with the bench's runtime.
pub(crate) struct Link {
    /// Where clients connect.
    addr: SocketAddr,
    /// Where it forwards; connections made before it is set are dropped.
    upstream: Arc<OnceLock<SocketAddr>>,
}

impl Link {
    /// Listens at once; [`Link::forward_to`] says where to.
    pub(crate) async fn start(delay: Duration) -> anyhow::Result<Link> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let upstream: Arc<OnceLock<SocketAddr>> = Arc::default();
        let target = Arc::clone(&upstream);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Some(to) = target.get().copied() else {
                    continue;
                };
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(to).await {
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let (cr, cw) = client.into_split();
                        let (sr, sw) = server.into_split();
                        tokio::join!(carry(cr, sw, delay), carry(sr, cw, delay));
                    }
                });
            }
        });
        Ok(Link { addr, upstream })
    }

    /// Forwards to the `http://host:port` of `url` from now on.
    pub(crate) fn forward_to(&self, url: &str) -> anyhow::Result<()> {
        let parsed = reqwest::Url::parse(url)?;
        let addr = parsed
            .socket_addrs(|| None)?
            .into_iter()
            .next()
            .context("no address")?;
        self.upstream
            .set(addr)
            .map_err(|_| anyhow::anyhow!("the link already forwards"))
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// Copies `from` to `to`, each chunk `delay` after it arrived; shuts `to`
/// down `delay` after `from` ended.
async fn carry(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin + Send + 'static,
    delay: Duration,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if chunk.is_empty() || to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf).await.unwrap_or(0);
        let chunk = buf[..n].to_vec();
        if tx.send((Instant::now() + delay, chunk)).is_err() || n == 0 {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}
