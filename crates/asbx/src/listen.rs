//! The accept loop both HTTP servers (the workspace's and the runner's) run:
//! bounded, so idle or slow clients cannot exhaust the process.
//!
//! - A connection must send a whole request head within the header timeout
//!   of its opening, or of the first byte of each later request: a slow-header
//!   (slowloris) client is closed.
//! - A keep-alive connection with no request in flight (no handler running,
//!   no response body still streaming) for the idle timeout is closed. Only
//!   the time between requests counts: a stream lasting hours is never cut.
//! - At most `max` connections are open at once across the listeners of this
//!   process (below its open-file limit), and at most `per_peer` from one
//!   address. Past either, a connection is answered `503` with `Retry-After`
//!   and closed at once; the refusals are logged once a minute, not each.
//! - Accept errors (EMFILE and the like) back off briefly instead of spinning.
//!
//! Hyper's own `header_read_timeout` is not used: hyper 1 arms it the moment a
//! keep-alive connection goes idle, so it would be the idle timeout too. Each
//! connection instead keeps its own clock ([`ConnState`]), read by a watchdog
//! beside the connection. Cost: the shared counter (and, with a per-peer cap,
//! a short lock on the peer table) is touched once when a connection opens and
//! once when it closes; per request, two relaxed atomic operations on the
//! connection's own state and one clock read when it goes idle.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Connection limits of the servers (`up`, `runner`, `workspace`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ConnOpts {
    /// Most connections the process holds open at once (`up`: its two
    /// listeners together); more are answered 503 and closed. At most the
    /// open-file limit less a reserve for sandboxes, database and files,
    /// which is also the default.
    #[arg(long, env = "ASBX_MAX_CONNECTIONS")]
    pub(crate) max_connections: Option<usize>,
    /// Most connections one client address holds open at once (0: no cap,
    /// for a server behind a load balancer whose own limits apply).
    #[arg(long, env = "ASBX_MAX_CONNECTIONS_PER_PEER", default_value_t = 256)]
    pub(crate) max_connections_per_peer: usize,
    /// Seconds a client has to send a whole request head, from the
    /// connection's opening or the first byte of the request.
    #[arg(long, env = "ASBX_HEADER_TIMEOUT_SEC", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) header_timeout_sec: u64,
    /// Seconds a keep-alive connection stays open with no request in flight
    /// (a streaming response is in flight until it ends).
    #[arg(long, env = "ASBX_IDLE_TIMEOUT_SEC", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) idle_timeout_sec: u64,
}

/// Descriptors kept out of the connection budget for everything else the
/// process opens (database, files, logs, its own outbound connections).
const RESERVE_FDS: usize = 1024;

/// How long open streams get to finish after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// How long the accept loop pauses after an accept error such as EMFILE.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How often a refusal or accept error is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// The limits of one process's servers; clones share one connection budget.
#[derive(Clone)]
pub(crate) struct Limits {
    header: Duration,
    idle: Duration,
    per_peer: usize,
    budget: Arc<Budget>,
}

/// The connections open across the process's listeners, and their cap.
struct Budget {
    open: AtomicUsize,
    max: usize,
    full: Throttle,
}

impl Limits {
    /// The limits `opts` sets, the cap at most the open-file limit (read now:
    /// raise it first) less `reserve_fds` (the sandboxes' share) and
    /// [`RESERVE_FDS`].
    pub(crate) fn new(opts: &ConnOpts, reserve_fds: usize) -> Limits {
        let nofile = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map(|(soft, _)| usize::try_from(soft).unwrap_or(usize::MAX))
            .unwrap_or(1024);
        let max = connection_cap(opts.max_connections, nofile, reserve_fds);
        tracing::debug!(max, nofile, "connection cap");
        Limits {
            header: Duration::from_secs(opts.header_timeout_sec),
            idle: Duration::from_secs(opts.idle_timeout_sec),
            per_peer: opts.max_connections_per_peer,
            budget: Arc::new(Budget {
                open: AtomicUsize::new(0),
                max,
                full: Throttle::default(),
            }),
        }
    }
}

/// The most connections: `setting`, at most what `nofile` leaves past the
/// reserves; when the reserves take it all (a low limit), a quarter of it.
fn connection_cap(setting: Option<usize>, nofile: usize, reserve_fds: usize) -> usize {
    let room = nofile
        .saturating_sub(reserve_fds.saturating_add(RESERVE_FDS))
        .max(nofile / 4)
        .max(1);
    setting.map_or(room, |s| s.clamp(1, room))
}

/// The listen queue: room for a burst of connections (the kernel caps it at
/// `net.core.somaxconn`). The usual 128 overflows under a flood, and a full
/// queue drops every client's connection attempt alike.
const BACKLOG: u32 = 4096;

/// A listener on `addr` with a [`BACKLOG`]-deep queue.
pub(crate) fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// Serves `app` on `listener` within `limits` until `stop` is cancelled; then
/// waits up to [`SHUTDOWN_GRACE`] for open requests and streams.
pub(crate) async fn serve(
    listener: TcpListener,
    app: axum::Router,
    stop: CancellationToken,
    limits: Limits,
) -> anyhow::Result<()> {
    let gate = Arc::new(Gate::new(limits));
    // No hyper timer: the connection's own clock times the head and the idle
    // time (see the module's doc).
    let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
    let graceful = GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                accept_failed(&gate, &e).await;
                continue;
            }
        };
        match gate.admit(peer.ip()) {
            Ok(slot) => spawn_connection(
                Arc::clone(&builder),
                graceful.watcher(),
                Accepted { tcp, peer, slot },
                app.clone(),
            ),
            Err(refusal) => gate.refuse(&tcp, refusal, peer.ip()),
        }
    }
    drop(listener);
    // Streams may last hours: past the grace, stop waiting for them.
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await;
    Ok(())
}

/// Logs an accept error (at most once a minute) and, unless it concerns that
/// connection alone, pauses: EMFILE or ENOBUFS would otherwise spin.
async fn accept_failed(gate: &Gate, e: &io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    if let Some(more) = gate.accept_errors.due() {
        tracing::warn!(error = %e, more, "accepting a connection failed; backing off");
    }
    tokio::time::sleep(ACCEPT_BACKOFF).await;
}

/// A connection the gate let in.
struct Accepted {
    tcp: TcpStream,
    peer: SocketAddr,
    slot: Slot,
}

/// Serves one connection until it ends, its watchdog closes it, or a
/// graceful shutdown ends it.
fn spawn_connection(
    builder: Arc<auto::Builder<TokioExecutor>>,
    watcher: Watcher,
    accepted: Accepted,
    app: axum::Router,
) {
    let Accepted { tcp, peer, slot } = accepted;
    // Lines are small and latency matters: no Nagle delay behind the headers.
    let _ = tcp.set_nodelay(true);
    let (header, idle) = (slot.gate.limits.header, slot.gate.limits.idle);
    let state = Arc::new(ConnState::new());
    let io = TokioIo::new(Tracked {
        tcp,
        state: Arc::clone(&state),
        _slot: slot,
    });
    let service = Counted {
        app,
        state: Arc::clone(&state),
        peer,
    };
    tokio::spawn(async move {
        let conn = builder.serve_connection_with_upgrades(io, service);
        tokio::select! {
            _ = watcher.watch(conn) => {}
            // Nothing is in flight: dropping the connection closes it.
            () = watchdog(&state, header, idle) => {}
        }
    });
}

/// Returns once the connection has been idle for `idle`, or has waited
/// `header` for the rest of a request head.
async fn watchdog(state: &ConnState, header: Duration, idle: Duration) {
    let tick = (header.min(idle) / 4).max(Duration::from_millis(10));
    loop {
        let wait = match state.deadline(header, idle) {
            None => tick,
            Some(deadline) => match deadline.checked_sub(state.now()) {
                Some(left) if !left.is_zero() => left.min(tick),
                _ => return,
            },
        };
        tokio::time::sleep(wait).await;
    }
}

/// One connection's clock: requests in flight, since when it is idle, and
/// since when a request head is arriving. Times are milliseconds since the
/// connection opened.
struct ConnState {
    opened: Instant,
    busy: AtomicU32,
    idle_since: AtomicU64,
    /// One more than the time the head's first byte came; 0: no head yet.
    head_since: AtomicU64,
}

impl ConnState {
    fn new() -> ConnState {
        ConnState {
            opened: Instant::now(),
            busy: AtomicU32::new(0),
            idle_since: AtomicU64::new(0),
            // A new connection owes its first request head from the start.
            head_since: AtomicU64::new(1),
        }
    }

    fn now(&self) -> Duration {
        self.opened.elapsed()
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.now().as_millis()).unwrap_or(u64::MAX)
    }

    /// When the connection is to be closed; `None` while a request is in
    /// flight.
    fn deadline(&self, header: Duration, idle: Duration) -> Option<Duration> {
        if self.busy.load(Ordering::Relaxed) > 0 {
            return None;
        }
        Some(match self.head_since.load(Ordering::Relaxed) {
            0 => Duration::from_millis(self.idle_since.load(Ordering::Relaxed)) + idle,
            since => Duration::from_millis(since - 1) + header,
        })
    }

    /// Bytes came: between requests, they start a request head.
    fn read_some(&self) {
        if self.busy.load(Ordering::Relaxed) == 0 && self.head_since.load(Ordering::Relaxed) == 0 {
            self.head_since.store(self.now_ms() + 1, Ordering::Relaxed);
        }
    }

    /// A request's head is in: it is in flight until its [`Busy`] drops.
    fn begin(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::Relaxed);
        self.head_since.store(0, Ordering::Relaxed);
        Busy(Arc::clone(self))
    }
}

/// A request in flight: its handler, then its response body.
struct Busy(Arc<ConnState>);

impl Drop for Busy {
    fn drop(&mut self) {
        if self.0.busy.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.0.idle_since.store(self.0.now_ms(), Ordering::Relaxed);
        }
    }
}

/// The router as a hyper service: each request counts as in flight, and
/// carries `ConnectInfo<SocketAddr>` as `into_make_service_with_connect_info`
/// would give it.
struct Counted {
    app: axum::Router,
    state: Arc<ConnState>,
    peer: SocketAddr,
}

impl hyper::service::Service<http::Request<Incoming>> for Counted {
    type Response = http::Response<CountedBody>;
    type Error = Infallible;
    type Future = CountedFuture;

    fn call(&self, req: http::Request<Incoming>) -> CountedFuture {
        let busy = self.state.begin();
        let mut req = req.map(axum::body::Body::new);
        req.extensions_mut().insert(ConnectInfo(self.peer));
        let inner = tower::Service::call(&mut self.app.clone(), req);
        CountedFuture {
            inner,
            busy: Some(busy),
        }
    }
}

/// The router's answer, its [`Busy`] handed on to the body.
struct CountedFuture {
    inner: axum::routing::future::RouteFuture<Infallible>,
    busy: Option<Busy>,
}

impl Future for CountedFuture {
    type Output = Result<http::Response<CountedBody>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Poll::Ready(Ok(res)) = Pin::new(&mut self.inner).poll(cx) else {
            return Poll::Pending;
        };
        let busy = self.busy.take();
        Poll::Ready(Ok(res.map(|inner| CountedBody { inner, _busy: busy })))
    }
}

/// A response body; the request is in flight until it is dropped.
struct CountedBody {
    inner: axum::body::Body,
    _busy: Option<Busy>,
}

impl hyper::body::Body for CountedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<bytes::Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A connection's socket: notes reads between requests, and holds the
/// connection's slot (through an upgrade too) until it closes.
struct Tracked {
    tcp: TcpStream,
    state: Arc<ConnState>,
    _slot: Slot,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.state.read_some();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// The process holds its most connections.
    Full,
    /// Its address holds its most connections.
    PeerFull,
}

/// One listener's admission: the process's budget and this listener's
/// count of connections per address.
struct Gate {
    limits: Limits,
    peers: Mutex<HashMap<IpAddr, usize>>,
    peer_full: Throttle,
    accept_errors: Throttle,
}

impl Gate {
    fn new(limits: Limits) -> Gate {
        Gate {
            limits,
            peers: Mutex::new(HashMap::new()),
            peer_full: Throttle::default(),
            accept_errors: Throttle::default(),
        }
    }

    /// A slot for a connection from `ip`, or why there is none.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Slot, Refusal> {
        let budget = &self.limits.budget;
        if budget.open.fetch_add(1, Ordering::Relaxed) >= budget.max {
            budget.open.fetch_sub(1, Ordering::Relaxed);
            return Err(Refusal::Full);
        }
        if self.limits.per_peer > 0 {
            let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
            let held = peers.entry(ip).or_insert(0);
            if *held >= self.limits.per_peer {
                drop(peers);
                budget.open.fetch_sub(1, Ordering::Relaxed);
                return Err(Refusal::PeerFull);
            }
            *held += 1;
        }
        Ok(Slot {
            gate: Arc::clone(self),
            ip,
        })
    }

    /// Answers 503 if the socket takes it now (it never waits) and closes
    /// it; logs at most once a minute.
    fn refuse(&self, tcp: &TcpStream, refusal: Refusal, ip: IpAddr) {
        let _ = tcp.try_write(refusal_response(refusal));
        let max = self.limits.budget.max;
        match refusal {
            Refusal::Full => {
                if let Some(more) = self.limits.budget.full.due() {
                    tracing::warn!(
                        max,
                        more,
                        "connection cap reached (ASBX_MAX_CONNECTIONS): refusing connections"
                    );
                }
            }
            Refusal::PeerFull => {
                if let Some(more) = self.peer_full.due() {
                    tracing::warn!(
                        %ip,
                        max = self.limits.per_peer,
                        more,
                        "a client address holds its most connections \
                         (ASBX_MAX_CONNECTIONS_PER_PEER): refusing its new ones"
                    );
                }
            }
        }
    }
}

/// The whole answer to a refused connection: 503, problem+json, stable code.
fn refusal_response(refusal: Refusal) -> &'static [u8] {
    static FULL: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    static PEER_FULL: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let (cell, detail) = match refusal {
        Refusal::Full => (&FULL, "the server holds its most connections"),
        Refusal::PeerFull => (&PEER_FULL, "your address holds its most connections"),
    };
    cell.get_or_init(|| {
        let problem = asbx_protocol::Problem::of(
            503,
            asbx_protocol::ProblemCode::TooManyConnections,
            "Too many connections",
            detail,
        );
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        let mut out = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: {}\r\nretry-after: 1\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n",
            asbx_protocol::Problem::CONTENT_TYPE,
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(&body);
        out
    })
}

/// A connection's place in the budget and its address's count; given back
/// when dropped.
struct Slot {
    gate: Arc<Gate>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.gate.limits.per_peer > 0 {
            let mut peers = self
                .gate
                .peers
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(held) = peers.get_mut(&self.ip) {
                *held -= 1;
                if *held == 0 {
                    peers.remove(&self.ip);
                }
            }
        }
        self.gate.limits.budget.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Lets a message through at most once per [`LOG_EVERY`], counting the
/// ones held back.
#[derive(Default)]
struct Throttle(Mutex<(Option<Instant>, u64)>);

impl Throttle {
    /// `Some(held back since the last)` when a message is due.
    fn due(&self) -> Option<u64> {
        let mut s = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match s.0 {
            Some(at) if at.elapsed() < LOG_EVERY => {
                s.1 += 1;
                None
            }
            _ => {
                let more = s.1;
                *s = (Some(Instant::now()), 0);
                Some(more)
            }
        }
    }
}

#[cfg(test)]
mod tests;
