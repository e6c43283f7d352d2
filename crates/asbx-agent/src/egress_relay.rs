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

use std::path::PathBuf;

use tokio::net::{TcpListener, UnixStream};
use tokio::task::JoinHandle;

/// A running relay; aborted when dropped.
#[derive(Debug)]
pub struct EgressRelay {
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
    pub async fn start(socket: impl Into<PathBuf>) -> std::io::Result<EgressRelay> {
        let socket = socket.into();
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut tcp, _)) = listener.accept().await else {
                    continue;
                };
                let socket = socket.clone();
                tokio::spawn(async move {
                    match UnixStream::connect(&socket).await {
                        Ok(mut unix) => {
                            let _ = tokio::io::copy_bidirectional(&mut tcp, &mut unix).await;
                        }
                        Err(e) => tracing::debug!("egress proxy unreachable: {e}"),
                    }
                });
            }
        });
        Ok(EgressRelay { port, task })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The proxy variables for tool processes.
    pub fn env(&self) -> Vec<(String, String)> {
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
