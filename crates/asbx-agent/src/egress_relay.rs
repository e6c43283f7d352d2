//! The tools' way out: a loopback relay to the runner's egress proxy.
//!
//! The sandbox has no network, but the runner mounts an HTTP forward proxy
//! (allow-listed hosts only) on a Unix socket (`bootstrap.proxy_socket`).
//! Programs expect a TCP `HTTP_PROXY`, so the agent listens on
//! `127.0.0.1:<ephemeral>` inside the sandbox and copies each connection
//! byte for byte to a fresh connection on that socket. It does not parse or
//! filter anything: the runner's proxy decides. Tools get `HTTP_PROXY`,
//! `HTTPS_PROXY` (both cases) pointing at the relay and `NO_PROXY` for
//! loopback. The relay stops when the run ends.
//!
//! Bounds: at most [`MAX_CONNECTIONS`] relayed connections at once (the
//! runner's proxy takes no more per sandbox); further ones wait in the
//! listen backlog until one ends. A failed `accept` (`EMFILE` when a tool
//! exhausted the descriptors, ...) backs off, doubling from
//! [`BACKOFF_MIN`] to [`BACKOFF_MAX`], so the agent never spins.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// Most connections relayed at once: as many as the runner's proxy takes
/// from one sandbox.
pub(crate) const MAX_CONNECTIONS: usize = asbx_protocol::rules::limits::MAX_SANDBOX_CONNECTIONS;
/// First pause after a failed `accept`.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest pause after failed `accept`s in a row.
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// A running relay; aborted when dropped.
#[derive(Debug)]
pub(crate) struct EgressRelay {
    port: u16,
    task: JoinHandle<()>,
}

impl Drop for EgressRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EgressRelay {
    /// Listens on 127.0.0.1 and relays to `socket`.
    pub(crate) async fn start(socket: impl Into<PathBuf>) -> std::io::Result<EgressRelay> {
        let socket = socket.into();
        let listener = Arc::new(TcpListener::bind(("127.0.0.1", 0)).await?);
        let port = listener.local_addr()?.port();
        let task = tokio::spawn(serve(
            move || {
                let l = listener.clone();
                async move { l.accept().await.map(|(tcp, _)| tcp) }
            },
            socket,
            MAX_CONNECTIONS,
        ));
        Ok(EgressRelay { port, task })
    }

    /// The proxy variables for tool processes.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        let url = format!("http://127.0.0.1:{}", self.port);
        let mut v = Vec::new();
        for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            v.push((k.to_owned(), url.clone()));
        }
        for k in ["NO_PROXY", "no_proxy"] {
            v.push((k.to_owned(), "localhost,127.0.0.1,::1".to_owned()));
        }
        v
    }
}

/// The accept loop: at most `max` relays at once, backing off on errors.
async fn serve<A, F>(mut accept: A, socket: PathBuf, max: usize)
where
    A: FnMut() -> F,
    F: Future<Output = std::io::Result<TcpStream>>,
{
    let slots = Arc::new(Semaphore::new(max));
    let mut backoff = BACKOFF_MIN;
    loop {
        // Wait for a free slot before taking the next connection.
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut tcp = match accept().await {
            Ok(tcp) => {
                backoff = BACKOFF_MIN;
                tcp
            }
            Err(e) => {
                tracing::debug!("egress relay: accept failed, pausing {backoff:?}: {e}");
                drop(permit);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        let socket = socket.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match UnixStream::connect(&socket).await {
                Ok(mut unix) => {
                    let _ = tokio::io::copy_bidirectional(&mut tcp, &mut unix).await;
                }
                Err(e) => tracing::debug!("egress proxy unreachable: {e}"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixListener;

    use super::*;

    /// A proxy that holds every connection open and counts how many it
    /// holds at once.
    fn holding_proxy(dir: &std::path::Path) -> (PathBuf, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let path = dir.join("proxy.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (n, p) = (now.clone(), peak.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let open = n.fetch_add(1, Ordering::SeqCst) + 1;
                p.fetch_max(open, Ordering::SeqCst);
                let n = n.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    // Held until the client hangs up.
                    while matches!(s.read(&mut buf).await, Ok(k) if k > 0) {}
                    n.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        (path, now, peak)
    }

    #[tokio::test]
    async fn relays_at_most_the_cap_at_once_then_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let (sock, now, peak) = holding_proxy(dir.path());
        let relay = EgressRelay::start(&sock).await.unwrap();
        let mut clients = Vec::new();
        for _ in 0..MAX_CONNECTIONS + 8 {
            let mut c = TcpStream::connect(("127.0.0.1", relay.port)).await.unwrap();
            c.write_all(b"x").await.unwrap();
            clients.push(c);
        }
        let until = Instant::now() + Duration::from_secs(5);
        while now.load(Ordering::SeqCst) < MAX_CONNECTIONS && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Positive control: the relay does fill the cap...
        assert_eq!(now.load(Ordering::SeqCst), MAX_CONNECTIONS);
        // ...and never goes past it.
        assert_eq!(peak.load(Ordering::SeqCst), MAX_CONNECTIONS);
        // Closing some lets the waiting ones through.
        clients.drain(..8);
        let until = Instant::now() + Duration::from_secs(5);
        let mut relayed_late = false;
        while Instant::now() < until {
            if now.load(Ordering::SeqCst) == MAX_CONNECTIONS
                && peak.load(Ordering::SeqCst) == MAX_CONNECTIONS
            {
                relayed_late = true;
                // Let the last waiting ones settle.
                tokio::time::sleep(Duration::from_millis(100)).await;
                if now.load(Ordering::SeqCst) == MAX_CONNECTIONS {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(relayed_late, "waiting connections were never relayed");
        assert_eq!(peak.load(Ordering::SeqCst), MAX_CONNECTIONS);
    }

    #[tokio::test]
    async fn accept_errors_back_off_instead_of_spinning() {
        let dir = tempfile::tempdir().unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let task = tokio::spawn(serve(
            move || {
                c.fetch_add(1, Ordering::SeqCst);
                async { Err::<TcpStream, _>(std::io::Error::from_raw_os_error(libc::EMFILE)) }
            },
            dir.path().join("none.sock"),
            MAX_CONNECTIONS,
        ));
        tokio::time::sleep(Duration::from_millis(1000)).await;
        task.abort();
        let n = calls.load(Ordering::SeqCst);
        // 10 + 20 + 40 + ... ms: about 7 tries in a second; a spinning loop
        // would make millions.
        assert!((2..=12).contains(&n), "{n} accept calls in one second");
    }
}
