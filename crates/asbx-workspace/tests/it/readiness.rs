//! A node cut off from its database says so: `/readyz` and every route that
//! needs the database answer `503 database_unavailable` with `Retry-After`
//! (not `500 internal`), so a load balancer takes the node out and clients
//! retry; once the database is back the node is ready again by itself.
//! PostgreSQL only: the workspace reaches it through a TCP forwarder the
//! test cuts (every connection dropped, new ones closed at once).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use url::Url;

use crate::support::{Db, TestWorkspace, bind_loopback, client, problem};

/// A TCP forwarder to `target` that can be cut and restored.
struct Forwarder {
    port: u16,
    cut: Arc<AtomicBool>,
    cutting: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.task.abort();
        self.cutting.notify_waiters();
    }
}

impl Forwarder {
    async fn start(target: String) -> Forwarder {
        let listener: TcpListener = bind_loopback().await;
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let cutting = Arc::new(Notify::new());
        let (c, n) = (cut.clone(), cutting.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                if c.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let (target, n) = (target.clone(), n.clone());
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = n.notified() => {}
                    }
                });
            }
        });
        Forwarder {
            port,
            cut,
            cutting,
            task,
        }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.cutting.notify_waiters();
    }

    fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_node_cut_off_from_postgres_answers_503_and_recovers_by_itself() {
    let Some(Db::Postgres(server)) = Db::postgres() else {
        asbx_test_support::skip(
            "readiness::a_node_cut_off_from_postgres",
            "set ASBX_TEST_PG_URL to run on PostgreSQL",
        );
        return;
    };
    let url = Url::parse(&server).unwrap();
    let target = format!(
        "{}:{}",
        url.host_str().unwrap(),
        url.port_or_known_default().unwrap()
    );
    let fwd = Forwarder::start(target).await;
    // The workspace's database, reached through the forwarder.
    let ws = TestWorkspace::start_on(Db::Postgres(server.clone()), None, |c| {
        let mut through = Url::parse(&c.database_url.clone().unwrap()).unwrap();
        through.set_port(Some(fwd.port)).unwrap();
        through.set_host(Some("127.0.0.1")).unwrap();
        c.database_url = Some(through.to_string());
    })
    .await;
    let http = client();

    let ready = http.get(ws.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let chats = http
        .get(ws.url("/api/assistant/chats"))
        .send()
        .await
        .unwrap();
    assert_eq!(chats.status(), 200);

    fwd.cut();
    let not_ready = http.get(ws.url("/readyz")).send().await.unwrap();
    assert_eq!(not_ready.headers()["retry-after"], "1");
    let body = problem(not_ready, 503).await;
    assert_eq!(body["code"], "database_unavailable");
    // A route that needs the database says the same, and `/healthz` (the
    // process) still answers.
    let refused = http
        .get(ws.url("/api/assistant/chats"))
        .send()
        .await
        .unwrap();
    assert_eq!(problem(refused, 503).await["code"], "database_unavailable");
    let alive = http.get(ws.url("/healthz")).send().await.unwrap();
    assert_eq!(alive.status(), 200);

    // Back: ready again without a restart.
    fwd.restore();
    let mut status = 0;
    for _ in 0..100 {
        status = http
            .get(ws.url("/readyz"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, 200, "the node did not become ready again");
    let chats = http
        .get(ws.url("/api/assistant/chats"))
        .send()
        .await
        .unwrap();
    assert_eq!(chats.status(), 200);
}
