//! The private clusters the crash and failover cases run on, checked on
//! their own: a crash and a restart keep what was committed and empty the
//! unlogged tables; a synchronous standby has every commit and, promoted,
//! takes writes.

use crate::shared::cluster::PrivateCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_cluster_crashes_restarts_and_fails_over_to_its_standby() {
    let _turn = crate::harness::turn().await;
    let primary = PrivateCluster::start().await;
    let db = primary.create_db().await;
    db.execute(
        "CREATE TABLE kept (n int); CREATE UNLOGGED TABLE forgotten (n int);
         INSERT INTO kept VALUES (1); INSERT INTO forgotten VALUES (1);",
    )
    .await;

    primary.crash().await;
    primary.start_again().await;
    assert!(!primary.in_recovery().await, "recovered, accepting writes");
    assert_eq!(db.scalar_i64("SELECT count(*) FROM kept").await, 1);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM forgotten").await,
        0,
        "crash recovery empties unlogged tables"
    );

    let standby = primary.synchronous_standby().await;
    assert!(standby.in_recovery().await && standby.is_standby());
    db.execute("INSERT INTO kept VALUES (2)").await;
    primary.stop_immediate().await;
    standby.promote().await;
    assert!(!standby.in_recovery().await, "promoted");
    let mut url = standby.admin_url();
    url.set_path(&db.name);
    let promoted = sqlx::PgPool::connect(url.as_str())
        .await
        .expect("connect to the promoted standby");
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM kept")
        .fetch_one(&promoted)
        .await
        .expect("read the promoted standby");
    assert_eq!(kept, 2, "a synchronous standby has every commit");
    sqlx::query("INSERT INTO kept VALUES (3)")
        .execute(&promoted)
        .await
        .expect("the promoted standby takes writes");
    promoted.close().await;
}
