//! ExtendLease: keeps a slow publish's lease alive, only for messages still held.

use std::time::Duration;

use tonic::Code;
use uuid::Uuid;

use crate::support::{LEASE_LOST, NOT_FOUND, OK, TestApp, ids, outcomes, secs, time, wait_until};

#[tokio::test]
async fn extend_outcomes_come_back_one_per_id_in_request_order() {
    let app = TestApp::spawn().await;
    app.insert(3).await;
    let batch = app.claim("w", 10, secs(5), Duration::ZERO).await;
    let [a, b, c] = <[String; 3]>::try_from(ids(&batch)).expect("three messages");
    let lease = batch.lease_id.as_str();
    let missing = Uuid::new_v4().to_string();
    assert_eq!(app.ack(lease, &[&c]).await, [OK]);

    let requested = [missing, a.clone(), c.clone()];
    let resp = app.extend(lease, &requested, secs(120)).await;
    assert_eq!(
        outcomes(&requested, &resp.results),
        [NOT_FOUND, OK, LEASE_LOST],
        "an acked message has no lease left to extend"
    );
    let row_a = app.row(&a).await;
    assert_eq!(
        Some(time(resp.lease_expires_at)),
        row_a.locked_until,
        "the new expiry is reported"
    );
    let left = row_a.lease_left.expect("leased");
    assert!(
        (115.0..=120.0).contains(&left),
        "extended to ~120 s from now, {left}"
    );
    let left_b = app.row(&b).await.lease_left.expect("leased");
    assert!(left_b <= 5.0, "an id not named keeps its expiry, {left_b}");

    let other = Uuid::new_v4().to_string();
    let resp = app.extend(&other, &[&b], secs(60)).await;
    assert_eq!(outcomes(&[&b], &resp.results), [LEASE_LOST]);
    assert!(app.row(&b).await.lease_left.expect("leased") <= 5.0);
}

#[tokio::test]
async fn extend_without_ids_extends_every_message_still_held() {
    let app = TestApp::spawn().await;
    app.insert(3).await;
    let batch = app.claim("w", 10, secs(5), Duration::ZERO).await;
    let all = ids(&batch);
    assert_eq!(
        app.nack_retry(&batch.lease_id, &all[..1], Some(secs(60)))
            .await,
        [OK]
    );

    let resp = app.extend(&batch.lease_id, &[] as &[&str], secs(60)).await;
    let mut extended: Vec<String> = resp.results.iter().map(|r| r.message_id.clone()).collect();
    extended.sort();
    let mut held = all[1..].to_vec();
    held.sort();
    assert_eq!(
        extended, held,
        "the nacked message is no longer under the lease"
    );
    assert!(resp.results.iter().all(|r| r.outcome == OK as i32));
    for id in &held {
        let left = app.row(id).await.lease_left.expect("leased");
        assert!((55.0..=60.0).contains(&left), "{id} extended, {left}");
    }
}

#[tokio::test]
async fn an_extended_lease_outlives_its_original_expiry() {
    let app = TestApp::spawn().await;
    app.insert(1).await;
    let batch = app.claim("slow", 1, secs(1), Duration::ZERO).await;
    let id = batch.messages[0].id.clone();
    let original = time(batch.lease_expires_at);
    let resp = app.extend(&batch.lease_id, &ids(&batch), secs(30)).await;
    assert_eq!(outcomes(&ids(&batch), &resp.results), [OK]);

    wait_until(
        secs(5),
        "the database clock passes the original expiry",
        async || {
            sqlx::query_scalar::<_, bool>("SELECT now() > $1")
                .bind(original)
                .fetch_one(app.pool())
                .await
                .expect("read the database clock")
        },
    )
    .await;
    assert!(
        app.nothing_to_claim().await,
        "the extended lease still holds the row"
    );
    assert_eq!(app.row(&id).await.attempts, 1);
    assert_eq!(app.ack(&batch.lease_id, &ids(&batch)).await, [OK]);
}

#[tokio::test]
async fn extending_a_lost_or_unknown_lease_says_so() {
    let app = TestApp::spawn().await;
    app.insert(2).await;
    let lost = app.claim("slow", 10, secs(1), Duration::ZERO).await;
    let lost_ids = ids(&lost);
    assert_eq!(lost_ids.len(), 2);
    // The lease expires and another worker claims both messages again.
    let mut again = None;
    wait_until(secs(10), "the expired batch is claimed again", async || {
        let batch = app.claim("fast", 10, secs(60), Duration::ZERO).await;
        let got = !batch.messages.is_empty();
        if got {
            again = Some(batch);
        }
        got
    })
    .await;
    let again = again.expect("claimed again");
    assert_eq!(ids(&again).len(), 2);

    // The README's worker loop: extend the whole lease, no ids.
    let status = app
        .try_extend(&lost.lease_id, &[] as &[&str], secs(60))
        .await
        .expect_err("a lost lease is not extended in silence");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(
        status.message(),
        format!(
            "lease {} holds no messages: it expired and was claimed again, or never existed",
            lost.lease_id
        )
    );
    // With ids, each one says LEASE_LOST.
    let resp = app.extend(&lost.lease_id, &lost_ids, secs(60)).await;
    assert_eq!(outcomes(&lost_ids, &resp.results), [LEASE_LOST, LEASE_LOST]);
    assert!(resp.lease_expires_at.is_none(), "nothing was extended");

    // A lease id that never existed, and a lease whose messages are all acked.
    let never = Uuid::new_v4().to_string();
    let status = app
        .try_extend(&never, &[] as &[&str], secs(60))
        .await
        .expect_err("an unknown lease");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains(&never), "{status:?}");
    assert_eq!(app.ack(&again.lease_id, &ids(&again)).await, [OK, OK]);
    let status = app
        .try_extend(&again.lease_id, &[] as &[&str], secs(60))
        .await
        .expect_err("a lease with nothing left");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");

    // The live lease is untouched by the refused calls.
    let rows = app.row(&lost_ids[0]).await;
    assert!(rows.published_at.is_some(), "acked under the second lease");
}
