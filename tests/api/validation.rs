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
        max_response_bytes: 1,
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
            "max_response_bytes",
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

/// Request bytes exactly as given: what a client with a broken encoder (or
/// none) sends.
#[derive(Debug, Clone, Copy, Default)]
struct RawBytes;

impl tonic::codec::Codec for RawBytes {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Self;
    type Decoder = Self;

    fn encoder(&mut self) -> Self {
        Self
    }

    fn decoder(&mut self) -> Self {
        Self
    }
}

impl tonic::codec::Encoder for RawBytes {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        buf: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), Status> {
        bytes::BufMut::put_slice(buf, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawBytes {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, buf: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let n = bytes::Buf::remaining(buf);
        Ok(Some(bytes::Buf::copy_to_bytes(buf, n).to_vec()))
    }
}

#[tokio::test]
async fn undecodable_request_bytes_are_invalid_argument_on_every_rpc() {
    let (app, _, _, before) = app_with_work().await;
    let channel = app.endpoint().connect().await.expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel);
    // Field 1 with wire type 7, which does not exist.
    let bad_wire_type = vec![0x0f, 0x00];
    // ClaimBatch's worker_id (field 2, length-delimited) that is not UTF-8.
    let not_utf8 = vec![0x12, 0x02, 0xff, 0xfe];
    let rpcs = [
        "/outbox.v1.OutboxService/ClaimBatch",
        "/outbox.v1.OutboxService/Ack",
        "/outbox.v1.OutboxService/Nack",
        "/outbox.v1.OutboxService/ExtendLease",
        "/outbox.v1.OutboxService/GetStats",
        "/outbox.v1.OutboxAdmin/ListDeadLetters",
        "/outbox.v1.OutboxAdmin/ListBlockedKeys",
        "/outbox.v1.OutboxAdmin/Redrive",
        "/outbox.v1.OutboxAdmin/Discard",
        "/outbox.v1.OutboxAdmin/GetDatabaseReport",
        "/outbox.v1.OutboxAdmin/InspectMessage",
        "/outbox.v1.OutboxAdmin/ListOutboxes",
    ];
    let mut cases: Vec<(&str, Vec<u8>, &str)> = rpcs
        .iter()
        .map(|rpc| (*rpc, bad_wire_type.clone(), "invalid wire type value: 7"))
        .collect();
    cases.push((rpcs[0], not_utf8, "not UTF-8"));
    for (rpc, body, reason) in cases {
        grpc.ready().await.expect("channel ready");
        let status = grpc
            .unary(
                tonic::Request::new(body),
                tonic::codegen::http::uri::PathAndQuery::from_static(rpc),
                RawBytes,
            )
            .await
            .expect_err("undecodable bytes are refused");
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{rpc}: {status:?}"
        );
        assert!(
            status
                .message()
                .starts_with("invalid request: failed to decode Protobuf message"),
            "{rpc}: {status:?}"
        );
        assert!(status.message().contains(reason), "{rpc}: {status:?}");
    }
    assert_eq!(app.snapshot("outbox").await, before, "nothing changed");
}
