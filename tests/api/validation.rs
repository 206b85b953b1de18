//! Every malformed field is INVALID_ARGUMENT naming the field (in the message and
//! in google.rpc.BadRequest details), and the request changes nothing.

use std::{fmt::Debug, time::Duration};

use outboxd::grpc::pb::{AckRequest, ClaimBatchRequest, ExtendLeaseRequest, LeaseAck, NackRequest};
use tonic::Status;
use tonic_types::StatusExt;
use uuid::Uuid;

use crate::support::{self, TestApp, claim_request, dur, ids, millis, secs, wire};

#[track_caller]
fn assert_invalid<T: Debug>(result: Result<T, Status>, field: &str) {
    support::assert_invalid(result, &[field]);
}

/// An outbox with claimable rows and one row held under a live lease, so a
/// request that slipped through validation would change something.
async fn app_with_work() -> (TestApp, String, String, String) {
    let app = TestApp::spawn().await;
    app.insert(3).await;
    let batch = app.claim("w", 1, secs(60), Duration::ZERO).await;
    let before = app.snapshot("outbox").await;
    let held = ids(&batch).remove(0);
    (app, batch.lease_id, held, before)
}

#[tokio::test]
async fn malformed_claim_requests_are_refused_and_change_nothing() {
    let (app, lease, held, before) = app_with_work().await;
    let claim = async |req: ClaimBatchRequest| app.client.clone().claim_batch(req).await;
    let valid = || claim_request("", "w", 10, secs(30), Duration::ZERO);

    assert_invalid(
        claim(ClaimBatchRequest {
            worker_id: String::new(),
            ..valid()
        })
        .await,
        "worker_id",
    );
    assert_invalid(
        claim(ClaimBatchRequest {
            worker_id: "   ".into(),
            ..valid()
        })
        .await,
        "worker_id",
    );
    assert_invalid(
        claim(ClaimBatchRequest {
            worker_id: "w".repeat(201),
            ..valid()
        })
        .await,
        "worker_id",
    );
    assert_invalid(
        claim(ClaimBatchRequest {
            max_messages: 0,
            ..valid()
        })
        .await,
        "max_messages",
    );
    assert_invalid(
        claim(ClaimBatchRequest {
            max_messages: 1001,
            ..valid()
        })
        .await,
        "max_messages",
    );
    for lease in [
        dur(millis(500)),
        dur(secs(15 * 60 + 1)),
        wire(-5, 0),
        wire(1, -1),
    ] {
        assert_invalid(
            claim(ClaimBatchRequest {
                lease_duration: lease,
                ..valid()
            })
            .await,
            "lease_duration",
        );
    }
    assert_invalid(
        claim(ClaimBatchRequest {
            wait: wire(-1, 0),
            ..valid()
        })
        .await,
        "wait",
    );
    // Several bad fields: all of them are reported at once.
    let all_bad = ClaimBatchRequest {
        outbox: String::new(),
        worker_id: String::new(),
        max_messages: 0,
        lease_duration: wire(-1, 0),
        wait: wire(-1, 0),
        acks: vec![LeaseAck {
            lease_id: "nope".into(),
            message_ids: vec![Uuid::new_v4().to_string()],
        }],
    };
    // A bad carried ack refuses the claim too: nothing acked, nothing claimed.
    let mut bad_ack = claim_request("", "w", 10, secs(30), Duration::ZERO);
    bad_ack.acks = vec![LeaseAck {
        lease_id: lease.clone(),
        message_ids: vec![held.clone(), "nope".into()],
    }];
    assert_invalid(claim(bad_ack.clone()).await, "acks[0].message_ids[1]");
    bad_ack.acks = vec![
        LeaseAck {
            lease_id: lease.clone(),
            message_ids: vec![held.clone()],
        };
        17
    ];
    assert_invalid(claim(bad_ack).await, "acks");

    let status = claim(all_bad).await.expect_err("refused");
    let details = status
        .get_details_bad_request()
        .expect("BadRequest details");
    let fields: Vec<&str> = details
        .field_violations
        .iter()
        .map(|v| v.field.as_str())
        .collect();
    assert_eq!(
        fields,
        [
            "worker_id",
            "max_messages",
            "lease_duration",
            "wait",
            "acks[0].lease_id"
        ]
    );

    assert_eq!(
        app.snapshot("outbox").await,
        before,
        "refused claims changed nothing"
    );
}

#[tokio::test]
async fn malformed_ack_requests_are_refused_and_change_nothing() {
    let (app, lease, held, before) = app_with_work().await;
    let ack = async |lease_id: &str, ids: &[&str]| {
        let req = AckRequest {
            outbox: String::new(),
            lease_id: lease_id.into(),
            message_ids: ids.iter().map(|s| s.to_string()).collect(),
        };
        app.client.clone().ack(req).await
    };
    assert_invalid(ack("not-a-uuid", &[&held]).await, "lease_id");
    assert_invalid(ack("", &[&held]).await, "lease_id");
    assert_invalid(ack(&lease, &[]).await, "message_ids");
    assert_invalid(ack(&lease, &[&held, "nope"]).await, "message_ids[1]");
    let too_many: Vec<String> = (0..1001).map(|_| Uuid::new_v4().to_string()).collect();
    let too_many: Vec<&str> = too_many.iter().map(String::as_str).collect();
    assert_invalid(ack(&lease, &too_many).await, "message_ids");

    assert_eq!(
        app.snapshot("outbox").await,
        before,
        "refused acks changed nothing"
    );
}

#[tokio::test]
async fn malformed_nack_requests_are_refused_and_change_nothing() {
    let (app, lease, held, before) = app_with_work().await;
    let nack = async |req: NackRequest| app.client.clone().nack(req).await;
    let valid = || NackRequest {
        lease_id: lease.clone(),
        message_ids: vec![held.clone()],
        error: "boom".into(),
        ..NackRequest::default()
    };
    assert_invalid(
        nack(NackRequest {
            lease_id: "42".into(),
            ..valid()
        })
        .await,
        "lease_id",
    );
    assert_invalid(
        nack(NackRequest {
            lease_id: String::new(),
            ..valid()
        })
        .await,
        "lease_id",
    );
    assert_invalid(
        nack(NackRequest {
            message_ids: vec![],
            ..valid()
        })
        .await,
        "message_ids",
    );
    assert_invalid(
        nack(NackRequest {
            message_ids: vec![held.clone(), "x".into()],
            ..valid()
        })
        .await,
        "message_ids[1]",
    );
    assert_invalid(
        nack(NackRequest {
            retry_after: wire(-3, 0),
            ..valid()
        })
        .await,
        "retry_after",
    );
    assert_invalid(
        nack(NackRequest {
            retry_after: wire(0, -5),
            dead_letter: true,
            ..valid()
        })
        .await,
        "retry_after",
    );

    assert_eq!(
        app.snapshot("outbox").await,
        before,
        "refused nacks changed nothing"
    );
}

#[tokio::test]
async fn malformed_extend_requests_are_refused_and_change_nothing() {
    let (app, lease, held, before) = app_with_work().await;
    let extend = async |req: ExtendLeaseRequest| app.client.clone().extend_lease(req).await;
    let valid = || ExtendLeaseRequest {
        outbox: String::new(),
        lease_id: lease.clone(),
        message_ids: vec![held.clone()],
        lease_duration: dur(secs(120)),
    };
    assert_invalid(
        extend(ExtendLeaseRequest {
            lease_id: "lease".into(),
            ..valid()
        })
        .await,
        "lease_id",
    );
    assert_invalid(
        extend(ExtendLeaseRequest {
            lease_id: String::new(),
            ..valid()
        })
        .await,
        "lease_id",
    );
    assert_invalid(
        extend(ExtendLeaseRequest {
            message_ids: vec!["x".into()],
            ..valid()
        })
        .await,
        "message_ids[0]",
    );
    for lease in [wire(-1, 0), dur(millis(999)), dur(secs(3600))] {
        assert_invalid(
            extend(ExtendLeaseRequest {
                lease_duration: lease,
                ..valid()
            })
            .await,
            "lease_duration",
        );
    }

    assert_eq!(
        app.snapshot("outbox").await,
        before,
        "refused extends changed nothing"
    );
}
