//! Overload at the door: a client that names a thousand bad ids must not
//! take its own metadata limits with it.

use outboxd::grpc::pb::{
    AckRequest, DiscardRequest, NackRequest, RedriveRequest,
    outbox_admin_client::OutboxAdminClient, outbox_service_client::OutboxServiceClient,
};
use tonic::Code;
use tonic_types::StatusExt as _;

use crate::{
    harness::{Case, Outboxd},
    shared::net::free_port,
};

/// A refusal naming a thousand bad ids used to carry a 32.9 KB message and
/// 68.9 KB of details, over a default client's 16 KiB of response metadata:
/// the client saw RESOURCE_EXHAUSTED instead of why. The refusal names the
/// first few and counts the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_of_a_thousand_bad_ids_reaches_a_default_client() {
    const LEASE: &str = "6f1c2b0e-8a4b-4c3e-9d1f-0a2b3c4d5e6f";
    let case = Case::begin().await;
    let server = Outboxd::start(&case.db.url(), free_port()).await;
    let ids: Vec<String> = (0..1000).map(|i| format!("bad-{i}")).collect();
    let mut client = OutboxServiceClient::connect(server.url())
        .await
        .expect("a default client");
    let mut admin = OutboxAdminClient::connect(server.url())
        .await
        .expect("a default admin client");

    let discard = admin
        .discard(DiscardRequest {
            outbox: "default".into(),
            message_ids: ids.clone(),
        })
        .await;
    assert_bounded("Discard", discard.map(|_| ()));
    let redrive = admin
        .redrive(RedriveRequest {
            outbox: "default".into(),
            message_ids: ids.clone(),
            ..Default::default()
        })
        .await;
    assert_bounded("Redrive", redrive.map(|_| ()));
    let ack = client
        .ack(AckRequest {
            outbox: "default".into(),
            lease_id: LEASE.into(),
            message_ids: ids.clone(),
        })
        .await;
    assert_bounded("Ack", ack.map(|_| ()));
    let nack = client
        .nack(NackRequest {
            outbox: "default".into(),
            lease_id: LEASE.into(),
            message_ids: ids,
            ..Default::default()
        })
        .await;
    assert_bounded("Nack", nack.map(|_| ()));
    drop(server);
}

/// INVALID_ARGUMENT, naming the first ids and how many more, in under 1 KB.
fn assert_bounded(method: &str, answer: Result<(), tonic::Status>) {
    let status = answer.expect_err("a thousand bad ids are refused");
    let message = status.message();
    let shown: String = message.chars().take(300).collect();
    assert_eq!(status.code(), Code::InvalidArgument, "{method}: {shown:?}…");
    assert!(
        message.len() < 1024,
        "{method}: {} bytes: {shown:?}",
        message.len()
    );
    assert!(
        message.contains("message_ids[0]") && message.contains("990 more"),
        "{method}: names the first ids and counts the rest: {message:?}"
    );
    assert!(
        status.details().len() < 1024,
        "{method}: details of {} bytes",
        status.details().len()
    );
    let listed = status
        .get_details_bad_request()
        .map_or(0, |bad| bad.field_violations.len());
    assert!(
        (1..=11).contains(&listed),
        "{method}: the first few violations in the details, not {listed}"
    );
    println!(
        "door: {method} with 1000 bad ids: {} B message, {} B details: {message}",
        message.len(),
        status.details().len()
    );
}
