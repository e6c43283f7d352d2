//! A tunnel's bytes both ways, until either side closes, it idles out or
//! the session stops; counted each way for the audit log.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Copies both ways until either side closes, nothing moves for `idle`, or
/// `stop` is cancelled; the bytes moved each way (client to upstream,
/// upstream to client).
pub(super) async fn relay<C>(
    client: C,
    upstream: TcpStream,
    idle: Duration,
    stop: &CancellationToken,
) -> (u64, u64)
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let start = Instant::now();
    let last = AtomicU64::new(0);
    let (sent, received) = (AtomicU64::new(0), AtomicU64::new(0));
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = upstream.into_split();
    let up = copy_noting(&mut cr, &mut uw, &last, start, &sent);
    let down = copy_noting(&mut ur, &mut cw, &last, start, &received);
    let watchdog = async {
        loop {
            tokio::time::sleep(idle / 4).await;
            let since = start
                .elapsed()
                .saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)));
            if since >= idle {
                return;
            }
        }
    };
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        _ = watchdog => tracing::debug!("egress tunnel idle, closed"),
        _ = stop.cancelled() => {}
    }
    (
        sent.load(Ordering::Relaxed),
        received.load(Ordering::Relaxed),
    )
}

/// Copies `r` to `w`, noting when bytes last moved and adding each read's
/// length to `total` (one add per read, not per byte).
async fn copy_noting<R, W>(
    r: &mut R,
    w: &mut W,
    last: &AtomicU64,
    start: Instant,
    total: &AtomicU64,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
        total.fetch_add(n as u64, Ordering::Relaxed);
        if w.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = w.shutdown().await;
}
