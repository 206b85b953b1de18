//! The outboxd binary at start: what a new user meets before the first RPC.
//! Permanent database errors exit 69 with one line naming the database, the
//! role and what to do; a port in use exits 64 before the database is touched;
//! `migrate` never waits forever; a bad environment value names its variable.

use std::{net::TcpListener, process::Output, time::Duration};

use tokio::process::Command;
use url::Url;

use crate::{
    shared::{bins, net::free_port},
    support::{TestApp, TestDb, run_outboxd, said, secs, wait_until, within},
};

#[track_caller]
fn assert_exit(output: &Output, code: i32, says: &[&str]) {
    let text = said(output);
    assert_eq!(
        output.status.code(),
        Some(code),
        "exit code; output:\n{text}"
    );
    for part in says {
        assert!(text.contains(part), "the output says {part:?}:\n{text}");
    }
}

/// `url` with its database replaced.
fn with_database(url: &str, database: &str) -> String {
    let mut url = Url::parse(url).expect("test URL");
    url.set_path(database);
    url.to_string()
}

/// `url` with its user replaced.
fn with_user(url: &str, user: &str) -> String {
    let mut url = Url::parse(url).expect("test URL");
    url.set_username(user).expect("a postgres URL takes a user");
    url.to_string()
}

const LOCAL: [&str; 4] = ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"];

#[tokio::test]
async fn a_database_that_does_not_exist_exits_69_and_says_to_create_it() {
    let db = TestDb::create().await;
    let missing = format!("{}_missing", db.name);
    let url = with_database(&db.url(), &missing);
    let mut serve = vec!["--database-url", url.as_str()];
    serve.extend(LOCAL);
    let migrate = vec!["migrate", "--database-url", url.as_str()];
    for args in [serve, migrate] {
        let output = run_outboxd(&args, &[]).await;
        assert_exit(
            &output,
            69,
            &[
                &missing,
                r#"as role \"postgres\""#,
                "3D000",
                "create the database",
            ],
        );
    }
}

#[tokio::test]
async fn a_role_that_does_not_exist_exits_69_and_says_what_to_check() {
    let db = TestDb::create().await;
    let url = with_user(&db.url(), "outboxd_no_such_role");
    let mut args = vec!["--database-url", &url];
    args.extend(LOCAL);
    let output = run_outboxd(&args, &[]).await;
    assert_exit(
        &output,
        69,
        &[
            &db.name,
            "outboxd_no_such_role",
            "28000",
            "check the user and password",
        ],
    );
    // The server answered: no retry, so no "retrying" line before it.
    assert!(!said(&output).contains("retrying"), "{}", said(&output));
}

#[tokio::test]
async fn a_role_without_the_privilege_to_migrate_exits_69_and_says_what_to_do() {
    let db = TestDb::create().await;
    let role = format!("{}_nopriv", db.name);
    db.execute(&format!(
        "CREATE ROLE \"{role}\" LOGIN; REVOKE CREATE ON SCHEMA public FROM PUBLIC"
    ))
    .await;
    let url = with_user(&db.url(), &role);
    let mut args = vec!["--database-url", &url];
    args.extend(LOCAL);
    let output = run_outboxd(&args, &[]).await;
    // The role is the cluster's, not the database's: gone before asserting.
    db.execute(&format!("DROP ROLE \"{role}\"")).await;
    assert_exit(&output, 69, &[&db.name, &role, "42501", "--no-migrate"]);
}

#[tokio::test]
async fn a_missing_schema_it_may_not_create_exits_69() {
    let db = TestDb::create().await;
    let url = db.url();
    let mut args = vec![
        "--database-url",
        &url,
        "--outbox",
        "orders=no_such_schema.outbox",
    ];
    args.extend(LOCAL);
    let output = run_outboxd(&args, &[]).await;
    assert_exit(
        &output,
        69,
        &[&db.name, "no_such_schema", "3F000", "CREATE SCHEMA"],
    );
}

#[tokio::test]
async fn a_missing_table_under_no_migrate_exits_69_and_says_to_migrate() {
    let db = TestDb::create().await;
    let url = db.url();
    let mut args = vec!["--database-url", &url, "--no-migrate"];
    args.extend(LOCAL);
    let output = run_outboxd(&args, &[]).await;
    assert_exit(&output, 69, &[&db.name, "public.outbox", "outboxd migrate"]);
}

#[tokio::test]
async fn migrate_gives_up_on_an_unreachable_database_and_says_why() {
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", free_port());
    let started = std::time::Instant::now();
    let output = run_outboxd(
        &[
            "migrate",
            "--database-url",
            &url,
            "--db-start-timeout",
            "2s",
        ],
        &[],
    )
    .await;
    assert_exit(
        &output,
        69,
        &["connection refused", "still unreachable after 2s"],
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "gave up in time"
    );
}

#[tokio::test]
async fn the_server_names_the_cause_while_the_database_is_unreachable() {
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", free_port());
    let mut args = vec!["--database-url", &url, "--db-start-timeout", "2s"];
    args.extend(LOCAL);
    let output = run_outboxd(&args, &[]).await;
    assert_exit(&output, 69, &["connection refused", "retrying"]);
    assert!(
        !said(&output).contains("pool timed out"),
        "{}",
        said(&output)
    );
}

#[tokio::test]
async fn a_port_in_use_exits_64_before_the_database_is_touched() {
    let db = TestDb::create().await;
    let taken = TcpListener::bind("127.0.0.1:0").expect("take a port");
    let port = taken.local_addr().expect("addr").to_string();
    let url = db.url();
    let output = run_outboxd(
        &[
            "--database-url",
            &url,
            "--listen",
            &port,
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        &[],
    )
    .await;
    assert_exit(&output, 64, &["--listen", &port, "already in use"]);
    // Through the environment, for the metrics port.
    let output = run_outboxd(
        &["--database-url", &url, "--listen", "127.0.0.1:0"],
        &[("OUTBOXD_METRICS_LISTEN", &port)],
    )
    .await;
    assert_exit(&output, 64, &["OUTBOXD_METRICS_LISTEN", "already in use"]);
    let tables = db
        .scalar_i64("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        .await;
    assert_eq!(tables, 0, "nothing migrated before the ports were checked");
}

#[tokio::test]
async fn a_bad_environment_value_names_the_variable() {
    let output = run_outboxd(
        &["--database-url", "postgres://u@h/d"],
        &[("OUTBOXD_MAX_BATCH", "0")],
    )
    .await;
    assert_exit(&output, 64, &["OUTBOXD_MAX_BATCH", "at least 1"]);
    let output = run_outboxd(
        &["--database-url", "postgres://u@h/d"],
        &[("OUTBOXD_POLL_INTERVAL", "soon")],
    )
    .await;
    assert_exit(&output, 64, &["OUTBOXD_POLL_INTERVAL", "soon"]);
    // The same mistake as a flag names the flag alone.
    let output = run_outboxd(
        &["--database-url", "postgres://u@h/d", "--max-batch", "0"],
        &[],
    )
    .await;
    assert_exit(&output, 64, &["--max-batch must be at least 1"]);
    assert!(
        !said(&output).contains("OUTBOXD_MAX_BATCH"),
        "{}",
        said(&output)
    );
}

#[tokio::test]
async fn bad_outbox_args_exit_64_and_say_why() {
    for (bad, why) in [
        ("noequals", "expected NAME=SCHEMA.TABLE"),
        (
            "=public.outbox",
            "outbox name must be 1-63 characters of [A-Za-z0-9_.-]",
        ),
        (
            "x=Public.outbox",
            r#"invalid identifier "Public": expected ^[a-z_][a-z0-9_]{0,62}$"#,
        ),
        (
            "x=public.outbox:max_attempts=0",
            "max_attempts: must be at least 1",
        ),
        ("x=public.outbox:colour=blue", r#"unknown option "colour""#),
        (
            "x=public.outbox:retention=forever",
            r#"retention: invalid duration "forever""#,
        ),
    ] {
        let output = run_outboxd(
            &["--database-url", "postgres://u@h/d", "--outbox", bad],
            &[],
        )
        .await;
        assert_exit(&output, 64, &["--outbox", &format!("{bad:?}"), why]);
    }
}

#[tokio::test]
async fn two_outboxes_on_one_table_exit_64_naming_both_and_the_table() {
    // The README's quick start (`default`) beside its ordered example (`orders`):
    // the unordered one would hand out an aggregate's next event while the
    // ordered one still holds its head.
    for (flags, env) in [
        (
            vec![
                "--outbox",
                "default=public.outbox",
                "--outbox",
                "orders=outbox:ordering=aggregate",
            ],
            vec![],
        ),
        (
            vec![],
            vec![(
                "OUTBOXD_OUTBOXES",
                "default=outbox,orders=public.outbox:ordering=aggregate",
            )],
        ),
    ] {
        let mut args = vec!["--database-url", "postgres://u@h/d"];
        args.extend(flags);
        let output = run_outboxd(&args, &env).await;
        assert_exit(
            &output,
            64,
            &["outboxes default and orders both name table public.outbox"],
        );
    }
}

#[tokio::test]
async fn a_comma_in_outbox_is_an_error_on_the_flag_and_a_separator_in_the_variable() {
    let output = run_outboxd(
        &[
            "--database-url",
            "postgres://u@h/d",
            "--outbox",
            "orders=public.orders:max_attempts=3,retention=0",
        ],
        &[],
    )
    .await;
    assert_exit(&output, 64, &["--outbox", "options are separated by ':'"]);
    assert!(
        !said(&output).contains("invalid identifier"),
        "{}",
        said(&output)
    );

    // The variable splits on commas: an error in its second entry names it.
    let output = run_outboxd(
        &["--database-url", "postgres://u@h/d"],
        &[("OUTBOXD_OUTBOXES", "a=public.a,b=public.b:colour=blue")],
    )
    .await;
    assert_exit(
        &output,
        64,
        &["OUTBOXD_OUTBOXES", r#""b=public.b:colour=blue""#],
    );
}

#[tokio::test]
async fn outbox_help_documents_every_option() {
    let output = run_outboxd(&["--help"], &[]).await;
    let help = said(&output);
    for option in [
        "max_attempts",
        "retention",
        "backoff_base",
        "backoff_factor",
        "backoff_max",
        "ordering=none|aggregate",
        "poison=block|park",
        "OUTBOXD_OUTBOXES",
    ] {
        assert!(help.contains(option), "--help names {option}:\n{help}");
    }
}

#[tokio::test]
async fn a_host_name_is_accepted_as_listen_address() {
    let app = TestApp::spawn_with(|args| {
        args.set("--listen", "localhost:0")
            .set("--metrics-listen", "localhost:0");
    })
    .await;
    assert!(app.addr.ip().is_loopback(), "{}", app.addr);
    app.insert(1).await;
    let batch = app.claim("w", 10, secs(30), Duration::ZERO).await;
    assert_eq!(batch.messages.len(), 1);
}

#[tokio::test]
async fn sigterm_while_waiting_for_the_database_exits_0() {
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", free_port());
    let log = std::env::temp_dir().join(format!("outboxd-startup-{}.log", uuid::Uuid::new_v4()));
    let file = std::fs::File::create(&log).expect("log file");
    let mut child = Command::new(bins::outboxd())
        .args(["--database-url", &url])
        .args(LOCAL)
        .env("RUST_LOG", "info")
        .stdout(file)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn outboxd");
    wait_until(secs(20), "outboxd waits for the database", async || {
        std::fs::read_to_string(&log).is_ok_and(|text| text.contains("retrying"))
    })
    .await;
    let pid = child.id().expect("running").to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status().await;
    assert!(sent.is_ok_and(|s| s.success()), "SIGTERM delivered");
    let status = within(secs(20), "outboxd stops", child.wait())
        .await
        .expect("wait for outboxd");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert_eq!(status.code(), Some(0), "{text}");
}
