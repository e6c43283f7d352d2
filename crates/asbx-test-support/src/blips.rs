//! A TCP forwarder that breaks connections: put between the workspace and
//! its runner (loopback only), it forwards every connection to the target
//! and cuts each at a random moment, as a load balancer's idle timeout or a
//! restarted proxy would, within a budget of cuts per minute (so the
//! system under test gets to make progress). What it did is counted
//! ([`Blips::cuts`], [`Blips::connections`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio::time::Instant;

/// How the forwarder cuts.
#[derive(Debug, Clone, Copy)]
pub struct CutPlan {
    /// Each connection is cut after a random time up to this long
    /// (uniform), counted from when it was accepted.
    pub within: Duration,
    /// At most this many cuts per minute (a sliding window); a connection
    /// whose moment comes past the budget lives on uncut.
    pub per_minute: usize,
}

/// The running forwarder; stops when dropped.
#[derive(Debug)]
pub struct Blips {
    /// `http://127.0.0.1:{port}`: give this as the runner's URL.
    pub url: String,
    cuts: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Blips {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Blips {
    /// Forwards `127.0.0.1:0` to `target` (a loopback address), cutting as
    /// `plan` says.
    pub async fn start(target: SocketAddr, plan: CutPlan) -> std::io::Result<Blips> {
        if !target.ip().is_loopback() {
            return Err(std::io::Error::other("the forwarder is loopback only"));
        }
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let cuts = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let budget = Arc::new(Mutex::new(Budget::new(plan.per_minute)));
        let (c, n) = (Arc::clone(&cuts), Arc::clone(&connections));
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                n.fetch_add(1, Ordering::Relaxed);
                let within_ms = u64::try_from(plan.within.as_millis()).unwrap_or(u64::MAX);
                let after = Duration::from_millis(rand::random_range(0..within_ms.max(1)));
                tokio::spawn(forward(
                    client,
                    target,
                    after,
                    Arc::clone(&budget),
                    Arc::clone(&c),
                ));
            }
        });
        Ok(Blips {
            url,
            cuts,
            connections,
            task,
        })
    }

    /// Connections cut so far.
    pub fn cuts(&self) -> usize {
        self.cuts.load(Ordering::Relaxed)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }
}

/// The cuts of the last minute.
#[derive(Debug)]
struct Budget {
    per_minute: usize,
    recent: std::collections::VecDeque<Instant>,
}

impl Budget {
    fn new(per_minute: usize) -> Budget {
        Budget {
            per_minute,
            recent: std::collections::VecDeque::new(),
        }
    }

    /// Takes one cut if the last minute has room for it.
    fn take(&mut self) -> bool {
        let now = Instant::now();
        while self
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > Duration::from_secs(60))
        {
            self.recent.pop_front();
        }
        if self.recent.len() >= self.per_minute {
            return false;
        }
        self.recent.push_back(now);
        true
    }
}

/// Copies both ways until either side closes, or the moment `after` comes
/// and the budget allows a cut: then both sides are reset.
async fn forward(
    client: TcpStream,
    target: SocketAddr,
    after: Duration,
    budget: Arc<Mutex<Budget>>,
    cuts: Arc<AtomicUsize>,
) {
    let Ok(upstream) = TcpStream::connect(target).await else {
        return;
    };
    let (mut client, mut upstream) = (client, upstream);
    let cut = {
        let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
        tokio::pin!(copy);
        tokio::select! {
            _ = &mut copy => false,
            () = tokio::time::sleep(after) => {
                let allowed = budget.lock().await.take();
                if !allowed {
                    let _ = copy.await;
                }
                allowed
            }
        }
    };
    if !cut {
        return;
    }
    cuts.fetch_add(1, Ordering::Relaxed);
    // A reset, not a goodbye: with SO_LINGER 0 the close is an RST (and
    // never blocks, the reason `set_linger` is deprecated).
    #[allow(deprecated)]
    for s in [&client, &upstream] {
        let _ = s.set_linger(Some(Duration::ZERO));
    }
    drop((client, upstream));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_allows_so_many_cuts_a_minute() {
        let mut b = Budget::new(3);
        let taken = (0..10).filter(|_| b.take()).count();
        assert_eq!(taken, 3);
    }
}
