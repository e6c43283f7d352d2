//! The drive task's line path, pump and status decoding, without a sandbox.

use std::collections::{HashMap, HashSet};

use asbx_protocol::line::{SessionInit, SessionLimits};
use asbx_protocol::session::SessionStats;
use asbx_protocol::{Line, LineDecoder, LogLevel};

use super::end::{OTHER_CODE, decode_status};
use super::*;
use crate::stamp::Stamper;

fn state(protocol: Protocol, filter: Option<Filter>) -> State {
    let sessions = crate::session::Sessions::default();
    let session = sessions
        .insert("s1", protocol, Duration::from_secs(1))
        .unwrap();
    State {
        session,
        stamper: Stamper::new("s1"),
        protocol,
        filter,
        open_steps: HashMap::new(),
        seen_steps: HashSet::new(),
        dropped: 0,
        terminal: None,
        stats: SessionStats::default(),
        skipping: false,
        max_line: 256,
        init: None,
        agent_error: None,
        agent_code: OTHER_CODE,
        started: Instant::now(),
        first_sent: false,
        counted_seq: 0,
        trace: tracing::Span::none(),
        bootstrap: None,
    }
}

fn feed(st: &mut State, chunks: &[&[u8]]) -> Vec<Line> {
    let mut buf = BytesMut::new();
    for c in chunks {
        buf.extend_from_slice(c);
        st.lines(&mut buf);
    }
    let (out, _) = st.stamper.take();
    LineDecoder::default()
        .push(&out)
        .into_iter()
        .map(|l| l.unwrap())
        .collect()
}

fn warnings(lines: &[Line]) -> usize {
    lines
        .iter()
        .filter(|l| matches!(&l.event, Event::Log(g) if g.level == LogLevel::Warn))
        .count()
}

#[test]
fn junk_is_dropped_with_a_warning_and_the_stream_goes_on() {
    let mut st = state(Protocol::V1, None);
    let lines = feed(
        &mut st,
        &[
            b"garbage\n[1,2]\n{\"type\":\"result\",\"message\":\"x\",\"seq\":99}\n",
            b"{\"type\":\"heartbeat\"}\n\n   \n{\"type\":\"delta\",\"text\":\"p2 only\"}\n",
            b"{\"type\":\"log\",\"level\":\"info\",\"message\":\"fine\"}\n",
        ],
    );
    assert_eq!(warnings(&lines), 5);
    assert!(matches!(&lines.last().unwrap().event, Event::Log(l) if l.message == "fine"));
    assert_eq!(
        lines.iter().map(|l| l.seq).collect::<Vec<_>>(),
        (1..=6).collect::<Vec<_>>()
    );
    assert!(st.terminal.is_none());
}

#[test]
fn lines_split_across_reads_are_joined() {
    let mut st = state(Protocol::V1, None);
    let lines = feed(
        &mut st,
        &[
            b"{\"type\":\"log\",\"lev",
            b"el\":\"info\",\"message\":\"h\xc3",
            b"\xa9\"}\n",
        ],
    );
    assert_eq!(lines.len(), 1);
    assert!(matches!(&lines[0].event, Event::Log(l) if l.message == "hé"));
}

#[test]
fn an_over_long_line_is_skipped_up_to_its_newline() {
    let mut st = state(Protocol::V1, None);
    let long = vec![b'x'; 300];
    let lines = feed(
        &mut st,
        &[
            &long,
            &long,
            b"tail\n{\"type\":\"result\",\"message\":\"ok\"}\n",
        ],
    );
    assert_eq!(warnings(&lines), 1);
    assert!(matches!(&lines.last().unwrap().event, Event::Result(r) if r.message == "ok"));
    assert_eq!(st.terminal, Some(End::Result));
}

#[test]
fn step_rules_are_enforced_and_open_steps_close_before_the_result() {
    let mut st = state(Protocol::V1, None);
    let lines = feed(
        &mut st,
        &[
            b"{\"type\":\"step\",\"id\":\"a\",\"name\":\"shell\",\"status\":\"succeeded\",\"durationMs\":1}\n",
            b"{\"type\":\"step\",\"id\":\"b\",\"name\":\"shell\",\"status\":\"running\"}\n",
            b"{\"type\":\"step\",\"id\":\"b\",\"name\":\"shell\",\"status\":\"running\"}\n",
            b"{\"type\":\"result\",\"message\":\"done\"}\n",
            b"{\"type\":\"log\",\"level\":\"info\",\"message\":\"after the end\"}\n",
        ],
    );
    // Two rejected step lines, then b running, b failed (closed by the runner), result.
    assert_eq!(warnings(&lines), 2);
    let kinds: Vec<String> = lines
        .iter()
        .filter(|l| !matches!(l.event, Event::Log(_)))
        .map(|l| match &l.event {
            Event::Step(s) => format!("{}:{:?}", s.id, s.status),
            e => e.type_name().to_owned(),
        })
        .collect();
    assert_eq!(kinds, vec!["b:Running", "b:Failed", "result"]);
    assert_eq!(st.stats.tool_calls, 1);
}

#[test]
fn filtered_lines_keep_their_seq_numbers() {
    let f = Filter::Block {
        blocked_types: vec![asbx_protocol::EventKind::Log],
    };
    let mut st = state(Protocol::V2, Some(f));
    let lines = feed(
        &mut st,
        &[
            b"{\"type\":\"log\",\"level\":\"info\",\"message\":\"hidden\"}\n",
            b"{\"type\":\"delta\",\"text\":\"hi\"}\n",
            b"{\"type\":\"log\",\"level\":\"info\",\"message\":\"hidden\"}\n",
            b"{\"type\":\"result\",\"message\":\"done\"}\n",
        ],
    );
    assert_eq!(lines.iter().map(|l| l.seq).collect::<Vec<_>>(), vec![2, 4]);
}

#[tokio::test]
async fn session_init_waits_for_config_and_carries_the_effective_limits() {
    use tokio::io::AsyncWriteExt;
    let mut st = state(Protocol::V2, None);
    st.init = Some(SessionInit {
        protocol_version: 2,
        limits: SessionLimits {
            max_duration_ms: 1000,
            max_steps: 50,
            max_tool_calls: 200,
            heartbeat_interval_ms: 5000,
        },
        encryption: None,
    });
    let session = Arc::clone(&st.session);
    let (mut w, r) = tokio::io::duplex(4096);
    let (tx, mut rx) = mpsc::channel::<Bytes>(16);
    let deadline = Instant::now() + Duration::from_secs(30);
    let pumping = async {
        let mut tx = Some(tx);
        pump(&mut st, r, &mut tx, &session, deadline).await
    };
    let driving = async {
        w.write_all(b"{\"type\":\"log\",\"level\":\"info\",\"message\":\"early\"}\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(rx.try_recv().is_err(), "a line went out before /config");
        session.set_run_limits(Some(asbx_protocol::callback::RunLimits {
            max_steps: Some(3),
            max_tool_calls: Some(1000),
            ..Default::default()
        }));
        let mut out = rx.recv().await.unwrap().to_vec();
        w.write_all(b"{\"type\":\"result\",\"message\":\"done\"}\n")
            .await
            .unwrap();
        drop(w);
        while let Some(c) = rx.recv().await {
            out.extend_from_slice(&c);
        }
        out
    };
    let (end, out) = tokio::join!(pumping, driving);
    assert_eq!(end, End::Result);
    let lines: Vec<Line> = LineDecoder::default()
        .push(&out)
        .into_iter()
        .map(|l| l.unwrap())
        .collect();
    match &lines[0].event {
        Event::SessionInit(i) => {
            assert_eq!(i.limits.max_steps, 3, "lowered by /config");
            assert_eq!(i.limits.max_tool_calls, 200, "clamped to the ceiling");
            assert_eq!(i.limits.max_duration_ms, 1000, "the ceiling");
        }
        other => panic!("first line {other:?}"),
    }
    assert!(matches!(&lines[1].event, Event::Log(l) if l.message == "early"));
    assert!(matches!(&lines[2].event, Event::Result(_)));
    assert_eq!(
        lines.iter().map(|l| l.seq).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
}

#[tokio::test]
async fn without_config_session_init_goes_out_after_one_heartbeat_interval() {
    use tokio::io::AsyncWriteExt;
    let mut st = state(Protocol::V2, None);
    let ceilings = SessionLimits {
        max_duration_ms: 1000,
        max_steps: 50,
        max_tool_calls: 200,
        heartbeat_interval_ms: 5000,
    };
    st.init = Some(SessionInit {
        protocol_version: 2,
        limits: ceilings.clone(),
        encryption: None,
    });
    let session = Arc::clone(&st.session);
    let (mut w, r) = tokio::io::duplex(4096);
    let (tx, mut rx) = mpsc::channel::<Bytes>(16);
    let deadline = Instant::now() + Duration::from_secs(30);
    let started = Instant::now();
    let pumping = async {
        let mut tx = Some(tx);
        pump(&mut st, r, &mut tx, &session, deadline).await
    };
    let driving = async {
        w.write_all(b"{\"type\":\"log\",\"level\":\"info\",\"message\":\"early\"}\n")
            .await
            .unwrap();
        let first = rx.recv().await.unwrap();
        let waited = started.elapsed();
        w.write_all(b"{\"type\":\"result\",\"message\":\"done\"}\n")
            .await
            .unwrap();
        drop(w);
        while rx.recv().await.is_some() {}
        (first, waited)
    };
    let (end, (first, waited)) = tokio::join!(pumping, driving);
    assert_eq!(end, End::Result);
    assert!(
        waited >= HEARTBEAT - Duration::from_millis(50) && waited < HEARTBEAT * 2,
        "{waited:?}"
    );
    let lines: Vec<Line> = LineDecoder::default()
        .push(&first)
        .into_iter()
        .map(|l| l.unwrap())
        .collect();
    assert!(
        matches!(&lines[0].event, Event::SessionInit(i) if i.limits == ceilings),
        "{lines:?}"
    );
    assert!(matches!(&lines[1].event, Event::Log(l) if l.message == "early"));
    assert!(
        !lines.iter().any(|l| matches!(l.event, Event::Heartbeat(_))),
        "session_init stands in for the first heartbeat"
    );
}

/// Issue 28, defect 11: the dispatch metric's `code` of an agent error
/// is the error line's code when it is one of ours, `other` beyond.
#[test]
fn an_agent_errors_code_is_its_metric_label() {
    for (line, code) in [
        (
            &b"{\"type\":\"error\",\"code\":\"model_error\",\"message\":\"m\"}\n"[..],
            "model_error",
        ),
        (
            b"{\"type\":\"error\",\"code\":\"step_limit_exceeded\",\"message\":\"m\"}\n",
            "step_limit_exceeded",
        ),
        (
            b"{\"type\":\"error\",\"code\":\"my_own_code\",\"message\":\"m\"}\n",
            "other",
        ),
    ] {
        let mut st = state(Protocol::V1, None);
        feed(&mut st, &[line]);
        assert_eq!(st.terminal, Some(End::AgentError));
        assert_eq!(st.agent_code, code);
    }
}

#[test]
fn exit_statuses_decode_signals_reported_by_the_jail() {
    use std::os::unix::process::ExitStatusExt;
    let st = |raw| Some(std::process::ExitStatus::from_raw(raw));
    assert_eq!(decode_status(st(7 << 8)), (Some(7), None));
    assert_eq!(decode_status(st((128 + 9) << 8)), (None, Some(9)));
    assert_eq!(decode_status(st(9)), (None, Some(9)));
    assert_eq!(decode_status(None), (None, None));
}
