//! Graceful shutdown: health NOT_SERVING, long polls end at once with an empty
//! batch, in-flight RPCs drain, and `serve` returns within the drain timeout.

use std::time::Instant;

use outboxd::grpc::pb::{GetStatsRequest, outbox_service_client::OutboxServiceClient};
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::{TestApp, claim_request, secs, wait_until, within};

#[tokio::test]
async fn shutdown_ends_long_polls_and_stops_within_the_drain_timeout() {
    let mut app = TestApp::spawn_with(|args| {
        args.set("--poll-interval", "5s")
            .set("--drain-timeout", "5s");
    })
    .await;
    let claims = app.count_claims("public.outbox").await;
    let waiter = app.spawn_claim(claim_request("", "w", 10, secs(30), secs(10)));
    wait_until(secs(5), "the long poll is waiting", async || {
        claims.get().await >= 1
    })
    .await;

    let started = Instant::now();
    app.shutdown.cancel();
    let batch = within(secs(2), "the long poll after shutdown", waiter)
        .await
        .expect("waiter task")
        .expect("a long poll ends with OK at shutdown, not an error");
    assert!(batch.messages.is_empty());
    assert_eq!(batch.lease_id, "");

    wait_until(secs(2), "health is NOT_SERVING or refused", async || {
        !matches!(app.health_of("").await, Ok(ServingStatus::Serving))
    })
    .await;
    app.stop(secs(6)).await.expect("serve returns Ok");
    let took = started.elapsed();
    assert!(
        took < secs(5),
        "drained in {took:?}, before the 5 s drain timeout"
    );

    // The listener is closed: new connections are refused, old ones answer nothing.
    let fresh = OutboxServiceClient::connect(format!("http://{}", app.addr)).await;
    assert!(fresh.is_err(), "a stopped server accepts no connection");
    let mut old = app.client.clone();
    assert!(old.get_stats(GetStatsRequest::default()).await.is_err());
}
