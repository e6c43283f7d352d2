//! Resilience of the OpenAI path: retries, stalls, cut streams, split UTF-8.

use std::time::Duration;

use asbx_protocol::gateway::ProviderKind;
use asbx_test_support::Tape;

use crate::harness::Harness;

#[tokio::test]
async fn rate_limited_with_retry_after_then_success() {
    let h = Harness::with_mock(ProviderKind::Openai).await;
    h.mock().push(Tape::rate_limited(1));
    h.mock().push(Tape::text("after the wait"));
    let o = h.run().await;
    assert_eq!(o.result(), "after the wait");
    assert_eq!(o.mock.as_ref().unwrap().requests().len(), 2);
}

#[tokio::test]
async fn server_error_then_success() {
    let h = Harness::with_mock(ProviderKind::Openai).await;
    h.mock().push(Tape::status(500, "boom"));
    h.mock().push(Tape::status(502, "bad gateway"));
    h.mock().push(Tape::text("recovered"));
    let o = h.run().await;
    assert_eq!(o.result(), "recovered");
    assert_eq!(o.mock.as_ref().unwrap().requests().len(), 3);
}

#[tokio::test]
async fn persistent_server_errors_give_up_with_model_error() {
    let h = Harness::with_mock(ProviderKind::Openai).await;
    for _ in 0..4 {
        h.mock().push(Tape::status(503, "still down"));
    }
    h.mock().push(Tape::text("never reached"));
    let o = h.run().await;
    let (code, msg) = o.error();
    assert_eq!(code, "model_error");
    assert!(msg.contains("still down"), "{msg}");
    assert_eq!(o.mock.as_ref().unwrap().remaining(), 1);
}

#[tokio::test]
async fn stalled_stream_is_model_timeout() {
    let mut h = Harness::with_mock(ProviderKind::Openai).await;
    h.options.http.stall_timeout = Duration::from_millis(300);
    h.mock().push(Tape::stall());
    let o = h.run().await;
    let (code, _) = o.error();
    assert_eq!(code, "model_timeout");
}

#[tokio::test]
async fn disconnect_mid_stream_is_retried_from_scratch() {
    let h = Harness::with_mock(ProviderKind::Openai).await;
    h.mock().push(Tape::disconnect());
    h.mock().push(Tape::text("complete answer"));
    let o = h.run().await;
    // Never half-applied: the cut attempt's text is not in the result.
    assert_eq!(o.result(), "complete answer");
    assert_eq!(o.mock.as_ref().unwrap().requests().len(), 2);
}

#[tokio::test]
async fn utf8_split_across_chunks_is_reassembled() {
    let h = Harness::with_mock(ProviderKind::Openai).await;
    h.mock().push(Tape::utf8_split("Grüße, 世界! 🦀 ok"));
    let o = h.run().await;
    assert_eq!(o.result(), "Grüße, 世界! 🦀 ok");
}
