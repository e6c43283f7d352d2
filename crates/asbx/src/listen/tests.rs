//! Unit tests of the connection limits: the cap, the gate, a connection's clock.

use super::*;

fn limits(max: usize, per_peer: usize) -> Limits {
    Limits {
        header: Duration::from_secs(10),
        idle: Duration::from_secs(60),
        per_peer,
        budget: Arc::new(Budget {
            open: AtomicUsize::new(0),
            max,
            full: Throttle::default(),
        }),
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn the_cap_stays_below_the_open_file_limit() {
    // 20,000 descriptors, 1,024 sandboxes of 10: the rest, less 1,024.
    assert_eq!(connection_cap(None, 20_000, 10_240), 8_736);
    assert_eq!(connection_cap(Some(1_000_000), 20_000, 10_240), 8_736);
    assert_eq!(connection_cap(Some(500), 20_000, 10_240), 500);
    assert_eq!(connection_cap(None, 20_000, 0), 18_976);
    // Reserves larger than the limit: a quarter of it, never none.
    assert_eq!(connection_cap(None, 1_024, 10_240), 256);
    assert_eq!(connection_cap(Some(0), 0, 0), 1);
}

#[test]
fn past_its_cap_an_address_is_refused_and_its_slots_come_back() {
    let gate = Arc::new(Gate::new(limits(3, 2)));
    let a1 = gate.admit(ip("127.0.0.1")).unwrap();
    let _a2 = gate.admit(ip("127.0.0.1")).unwrap();
    assert_eq!(gate.admit(ip("127.0.0.1")).err(), Some(Refusal::PeerFull));
    let _b = gate.admit(ip("127.0.0.2")).unwrap();
    assert_eq!(gate.admit(ip("127.0.0.3")).err(), Some(Refusal::Full));
    assert_eq!(gate.limits.budget.open.load(Ordering::Relaxed), 3);
    drop(a1);
    assert_eq!(gate.limits.budget.open.load(Ordering::Relaxed), 2);
    let _a3 = gate.admit(ip("127.0.0.1")).unwrap();
    assert_eq!(gate.peers.lock().unwrap()[&ip("127.0.0.1")], 2);
}

#[test]
fn without_a_per_peer_cap_one_address_may_take_the_whole_budget() {
    let gate = Arc::new(Gate::new(limits(3, 0)));
    let slots: Vec<_> = (0..3)
        .map(|_| gate.admit(ip("10.0.0.1")).unwrap())
        .collect();
    assert_eq!(gate.admit(ip("10.0.0.1")).err(), Some(Refusal::Full));
    drop(slots);
    assert_eq!(gate.limits.budget.open.load(Ordering::Relaxed), 0);
    assert!(gate.peers.lock().unwrap().is_empty());
}

#[test]
fn listeners_of_one_process_share_its_budget() {
    let shared = limits(2, 0);
    let runner = Arc::new(Gate::new(shared.clone()));
    let workspace = Arc::new(Gate::new(shared));
    let _r = runner.admit(ip("127.0.0.1")).unwrap();
    let _w = workspace.admit(ip("127.0.0.1")).unwrap();
    assert_eq!(runner.admit(ip("127.0.0.1")).err(), Some(Refusal::Full));
}

#[test]
fn a_connection_owes_a_head_then_idles_only_between_requests() {
    let (header, idle) = (Duration::from_secs(10), Duration::from_secs(60));
    let state = Arc::new(ConnState::new());
    // New: the first head is due within the header timeout.
    assert_eq!(state.deadline(header, idle), Some(header));
    let busy = state.begin();
    state.read_some();
    assert_eq!(state.deadline(header, idle), None, "a request in flight");
    let second = state.begin();
    drop(busy);
    assert_eq!(state.deadline(header, idle), None, "one still in flight");
    drop(second);
    let since = Duration::from_millis(state.idle_since.load(Ordering::Relaxed));
    assert_eq!(state.deadline(header, idle), Some(since + idle));
    // A byte between requests: the rest of the head is due.
    state.read_some();
    let head = state.deadline(header, idle).unwrap();
    assert!(head <= state.now() + header && head >= since + header);
}

#[tokio::test]
async fn the_watchdog_fires_at_the_deadline_and_never_while_busy() {
    let (header, idle) = (Duration::from_millis(200), Duration::from_millis(600));
    let state = Arc::new(ConnState::new());
    let busy = state.begin();
    let waited =
        tokio::time::timeout(Duration::from_millis(1500), watchdog(&state, header, idle)).await;
    assert!(waited.is_err(), "the watchdog fired during a request");
    drop(busy);
    let start = Instant::now();
    watchdog(&state, header, idle).await;
    let took = start.elapsed();
    assert!(took >= idle - Duration::from_millis(20), "{took:?}");
    assert!(took <= idle + Duration::from_millis(400), "{took:?}");
}

#[test]
fn a_refusal_is_a_whole_503_with_retry_after() {
    let bytes = refusal_response(Refusal::PeerFull);
    let text = std::str::from_utf8(bytes).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
    assert!(head.contains("\r\nretry-after: 1"), "{head}");
    assert!(head.contains(&format!("\r\ncontent-length: {}\r\n", body.len())));
    let problem: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(problem["code"], "too_many_connections");
    assert_eq!(problem["status"], 503);
}

#[test]
fn a_throttle_lets_one_message_through_and_counts_the_rest() {
    let t = Throttle::default();
    assert_eq!(t.due(), Some(0));
    assert_eq!(t.due(), None);
    assert_eq!(t.due(), None);
    t.0.lock().unwrap().0 = Instant::now().checked_sub(LOG_EVERY);
    assert_eq!(t.due(), Some(2));
}
