//! `outboxctl` end to end (#35): the binary against a real outboxd, every
//! command's `--output json` parsed, and the exit codes scripts rely on (1 a
//! refused call, 2 usage, 3 no server).

use std::{path::Path, process::Stdio};

use serde_json::Value;
use tokio::process::Command;
use uuid::Uuid;

use crate::{
    shared::{bins, net::free_port},
    support::{TestApp, secs, within},
};

/// What one run of outboxctl left: exit code, stdout, stderr.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The one JSON document of a successful `--output json` run.
    fn json(&self) -> Value {
        assert_eq!(self.code, Some(0), "outboxctl failed: {self:?}");
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }
}

/// Runs outboxctl with `args`, stdin not a terminal, none of the caller's
/// OUTBOXCTL_* settings.
async fn ctl(args: &[&str]) -> Run {
    ctl_with(args, &[]).await
}

/// [`ctl`] with environment variables set (`Some`) or removed (`None`).
async fn ctl_with(args: &[&str], env: &[(&str, Option<&str>)]) -> Run {
    let mut command = Command::new(bins::outboxctl());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("OUTBOXCTL_") {
            command.env_remove(name);
        }
    }
    for (name, value) in env {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = within(secs(30), "outboxctl to finish", command.output())
        .await
        .expect("run outboxctl");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn server(app: &TestApp) -> String {
    format!("http://{}", app.addr)
}

/// Commits one event to `table`; its id.
async fn produce(app: &TestApp, table: &str, aggregate: &str) -> String {
    let id = Uuid::new_v4();
    let sql = format!(
        "INSERT INTO {table} (id, aggregate_id, event_type, payload) VALUES ($1, $2, 'test.event', '{{\"n\": 1}}')"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .bind(aggregate)
        .execute(app.pool())
        .await
        .expect("insert an event");
    id.to_string()
}

/// Claims everything `outbox` has and dead-letters it with `error`.
async fn dead_letter_all(app: &TestApp, outbox: &str, n: usize, error: &str) {
    let mut ids = Vec::new();
    let mut lease = String::new();
    while ids.len() < n {
        let batch = app
            .claim_from(outbox, "w-ctl", 100, secs(300), secs(1))
            .await;
        if !batch.messages.is_empty() {
            lease = batch.lease_id.clone();
            let these: Vec<String> = batch.messages.iter().map(|m| m.id.clone()).collect();
            app.nack(outboxd::grpc::pb::NackRequest {
                outbox: outbox.into(),
                lease_id: lease.clone(),
                message_ids: these.clone(),
                error: error.into(),
                dead_letter: true,
                ..Default::default()
            })
            .await;
            ids.extend(these);
        }
    }
    assert_eq!(ids.len(), n, "dead-lettered exactly {n} under {lease}");
}

fn two_outboxes(args: &mut crate::support::ServerArgs) {
    args.add("--outbox", "default=public.outbox")
        .add("--outbox", "orders=public.orders_outbox:ordering=aggregate");
}

#[tokio::test]
async fn every_command_answers_in_json_that_scripts_can_read() {
    let app = TestApp::spawn_with(two_outboxes).await;
    let s = server(&app);
    let a = produce(&app, "public.outbox", "agg-a").await;
    let b = produce(&app, "public.outbox", "agg-b").await;
    let pending = produce(&app, "public.outbox", "agg-c").await;
    let head = produce(&app, "public.orders_outbox", "order-1").await;
    produce(&app, "public.orders_outbox", "order-1").await;
    dead_letter_all(&app, "default", 3, "broker said no").await;
    dead_letter_all(&app, "orders", 1, "poison").await;
    // One more, pending, to inspect in that state.
    let _ = pending;
    let fresh = produce(&app, "public.outbox", "agg-d").await;

    let stats = ctl(&["--server", &s, "--output", "json", "stats"])
        .await
        .json();
    let outboxes = stats["outboxes"].as_array().expect("an array");
    let names: Vec<&str> = outboxes
        .iter()
        .filter_map(|o| o["outbox"].as_str())
        .collect();
    assert_eq!(names, ["default", "orders"], "{stats}");
    assert_eq!(outboxes[0]["dead_lettered"], 3, "{stats}");
    assert_eq!(outboxes[0]["pending"], 1, "{stats}");
    assert_eq!(outboxes[1]["blocked_keys"], 1, "{stats}");
    assert!(
        outboxes[1]["oldest_blocked_age_seconds"].is_number(),
        "{stats}"
    );
    let one = ctl(&[
        "--server", &s, "--output", "json", "stats", "--outbox", "orders",
    ])
    .await
    .json();
    assert_eq!(one["outboxes"].as_array().map(Vec::len), Some(1), "{one}");

    let dead = ctl(&["--server", &s, "--output", "json", "dead-letters", "list"])
        .await
        .json();
    let listed: Vec<&str> = dead["dead_letters"]
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|d| d["id"].as_str())
        .collect();
    assert_eq!(listed.len(), 3, "{dead}");
    assert!(
        listed.contains(&a.as_str()) && listed.contains(&b.as_str()),
        "{dead}"
    );
    assert_eq!(dead["dead_letters"][0]["last_error"], "broker said no");
    assert_eq!(dead["more"], false);
    let limited = ctl(&[
        "--server",
        &s,
        "--output",
        "json",
        "dead-letters",
        "list",
        "--limit",
        "1",
    ])
    .await
    .json();
    assert_eq!(limited["dead_letters"].as_array().map(Vec::len), Some(1));
    assert_eq!(limited["more"], true);
    let by_aggregate = ctl(&[
        "--server",
        &s,
        "--output",
        "json",
        "dead-letters",
        "list",
        "--aggregate",
        "agg-b",
    ])
    .await
    .json();
    assert_eq!(
        by_aggregate["dead_letters"][0]["id"],
        b.as_str(),
        "{by_aggregate}"
    );
    assert_eq!(
        by_aggregate["dead_letters"].as_array().map(Vec::len),
        Some(1)
    );

    let blocked = ctl(&[
        "--server",
        &s,
        "--output",
        "json",
        "blocked-keys",
        "list",
        "--outbox",
        "orders",
    ])
    .await
    .json();
    assert_eq!(
        blocked["blocked_keys"][0]["aggregate_id"], "order-1",
        "{blocked}"
    );
    assert_eq!(blocked["blocked_keys"][0]["head_message_id"], head.as_str());
    assert_eq!(blocked["blocked_keys"][0]["held"], 1);

    let inspected = ctl(&["--server", &s, "--output", "json", "inspect", &a])
        .await
        .json();
    assert_eq!(inspected["state"], "dead_lettered", "{inspected}");
    assert_eq!(inspected["aggregate_id"], "agg-a");
    assert_eq!(inspected["attempts"], 1);
    assert_eq!(inspected["last_error"], "broker said no");
    assert_eq!(inspected["payload"]["n"], 1);
    assert!(inspected["dead_lettered_at"].is_string() && inspected["published_at"].is_null());
    let fresh_one = ctl(&[
        "--server", &s, "--output", "json", "inspect", "--outbox", "default", &fresh,
    ])
    .await
    .json();
    assert_eq!(fresh_one["state"], "pending", "{fresh_one}");

    let redriven = ctl(&[
        "--server", &s, "--output", "json", "redrive", "--id", &a, "--yes",
    ])
    .await
    .json();
    assert_eq!(redriven["redriven"], 1, "{redriven}");
    let discarded = ctl(&[
        "--server", &s, "--output", "json", "discard", "--id", &b, "--yes",
    ])
    .await
    .json();
    assert_eq!(discarded["discarded"], 1, "{discarded}");
    assert_eq!(
        ctl(&["--server", &s, "--output", "json", "inspect", &b])
            .await
            .json()["state"],
        "discarded"
    );
    let all = ctl(&[
        "--server", &s, "--output", "json", "redrive", "--outbox", "orders", "--all", "--yes",
    ])
    .await
    .json();
    assert_eq!(all["redriven"], 1, "{all}");
    let by_agg = ctl(&[
        "--server",
        &s,
        "--output",
        "json",
        "redrive",
        "--aggregate",
        "agg-c",
        "--yes",
    ])
    .await
    .json();
    assert_eq!(by_agg["redriven"], 1, "{by_agg}");
    let after = ctl(&[
        "--server", &s, "--output", "json", "stats", "--outbox", "default",
    ])
    .await
    .json();
    assert_eq!(after["outboxes"][0]["dead_lettered"], 0, "{after}");
}

/// `stats` carries the database watchdog's last findings once its first
/// sample is in: the horizon, and each outbox table's upkeep.
#[tokio::test]
async fn stats_shows_what_the_database_watchdog_found() {
    let app = TestApp::spawn_with(|args| {
        args.set("--watchdog-interval", "200ms");
    })
    .await;
    let s = server(&app);
    produce(&app, "public.outbox", "agg-a").await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let database = loop {
        let stats = ctl(&["--server", &s, "--output", "json", "stats"])
            .await
            .json();
        if !stats["database"].is_null() {
            break stats["database"].clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no watchdog sample in `stats` after 30 s: {stats}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(database["read_at"].is_string(), "{database}");
    assert!(
        database["xmin_horizon_age_seconds"].is_number(),
        "{database}"
    );
    let tables = database["tables"].as_array().expect("tables");
    assert_eq!(tables.len(), 1, "{database}");
    assert_eq!(tables[0]["outbox"], "default", "{database}");
    assert!(tables[0]["table_bytes"].as_i64() > Some(0), "{database}");
    let text = ctl(&["--server", &s, "stats"]).await;
    assert!(
        text.stdout.contains("DATABASE (read at") && text.stdout.contains("DEAD TUPLES"),
        "{text:?}"
    );
}

#[tokio::test]
async fn tables_are_the_default_output() {
    let app = TestApp::spawn().await;
    let s = server(&app);
    let id = produce(&app, "public.outbox", "agg-a").await;
    let stats = ctl(&["--server", &s, "stats"]).await;
    assert_eq!(stats.code, Some(0), "{stats:?}");
    assert!(
        stats.stdout.starts_with("OUTBOX") && stats.stdout.contains("default"),
        "{stats:?}"
    );
    let inspected = ctl(&["--server", &s, "inspect", &id]).await;
    assert!(
        inspected.stdout.contains("pending") && inspected.stdout.contains("agg-a"),
        "{inspected:?}"
    );
    let dead = ctl(&["--server", &s, "dead-letters", "list"]).await;
    assert!(dead.stdout.starts_with("ID"), "{dead:?}");
}

#[tokio::test]
async fn a_refused_call_exits_1_with_the_grpc_code() {
    let app = TestApp::spawn().await;
    let s = server(&app);
    let unknown = ctl(&["--server", &s, "stats", "--outbox", "nope"]).await;
    assert_eq!(unknown.code, Some(1), "{unknown:?}");
    assert!(unknown.stderr.contains("NotFound"), "{unknown:?}");
    let missing = Uuid::new_v4().to_string();
    let not_there = ctl(&["--server", &s, "inspect", &missing]).await;
    assert_eq!(not_there.code, Some(1), "{not_there:?}");
    assert_eq!(not_there.stdout, "", "nothing on stdout");
}

#[tokio::test]
async fn usage_errors_exit_2_and_change_nothing() {
    let app = TestApp::spawn().await;
    let s = server(&app);
    let id = Uuid::new_v4().to_string();
    for args in [
        vec!["--server", s.as_str(), "--no-such-flag", "stats"],
        vec![
            "--server",
            s.as_str(),
            "dead-letters",
            "list",
            "--limit",
            "0",
        ],
        vec!["--server", s.as_str(), "--output", "yaml", "stats"],
        vec!["--server", s.as_str(), "inspect", "not-a-uuid"],
        vec![
            "--server",
            s.as_str(),
            "redrive",
            "--all",
            "--aggregate",
            "a",
            "--yes",
        ],
        vec!["--server", s.as_str(), "redrive"],
        // Destructive without --yes, and no terminal to ask on.
        vec!["--server", s.as_str(), "redrive", "--all"],
        vec!["--server", s.as_str(), "discard", "--id", id.as_str()],
    ] {
        let run = ctl(&args).await;
        assert_eq!(run.code, Some(2), "{args:?}: {run:?}");
        assert!(!run.stderr.is_empty(), "{args:?} says why");
    }
    let no_yes = ctl(&["--server", &s, "redrive", "--all"]).await;
    assert_eq!(
        no_yes.stderr.trim().lines().count(),
        1,
        "one line: {no_yes:?}"
    );
    assert!(no_yes.stderr.contains("--yes"), "{no_yes:?}");
}

#[tokio::test]
async fn a_server_that_is_down_exits_3() {
    let down = format!("http://127.0.0.1:{}", free_port());
    for args in [
        vec!["stats"],
        vec!["dead-letters", "list"],
        vec!["redrive", "--all", "--yes"],
    ] {
        let run = ctl(&[&["--server", down.as_str()], args.as_slice()].concat()).await;
        assert_eq!(run.code, Some(3), "{args:?}: {run:?}");
        // One sentence naming the address and the cause, each reason once
        // (tonic's chain says "tcp connect error" three times).
        assert_eq!(
            run.stderr,
            format!(
                "outboxctl: cannot reach the server at {down}: tcp connect error: \
                 Connection refused (os error 111)\n"
            ),
            "{args:?}"
        );
    }
}

/// A tokens file granting `admin:*` to `token`, and a file holding the token.
fn token_files(dir: &Path, token: &str) -> (String, String) {
    let tokens = dir.join("tokens");
    std::fs::write(
        &tokens,
        format!(
            "ops sha256:{} admin:*\n",
            hex::encode(outboxd::auth::token_digest(token))
        ),
    )
    .expect("write the tokens file");
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{token}\n")).expect("write the token file");
    let path = |p: &Path| p.to_str().expect("UTF-8 path").to_owned();
    (path(&tokens), path(&token_file))
}

#[tokio::test]
async fn a_token_file_is_sent_and_without_it_the_call_is_refused_with_1() {
    let dir = std::env::temp_dir().join(format!("outboxctl-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let token = format!("{}", Uuid::new_v4().simple());
    let (tokens, token_file) = token_files(&dir, &token);
    let app = TestApp::spawn_with(|args| {
        args.set("--auth-tokens", tokens.as_str());
    })
    .await;
    let s = server(&app);
    let refused = ctl(&["--server", &s, "dead-letters", "list"]).await;
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(refused.stderr.contains("Unauthenticated"), "{refused:?}");
    let allowed = ctl(&[
        "--server",
        &s,
        "--token-file",
        &token_file,
        "--output",
        "json",
        "dead-letters",
        "list",
    ])
    .await;
    assert_eq!(allowed.json()["dead_letters"], Value::Array(Vec::new()));
    let missing = ctl(&[
        "--server",
        &s,
        "--token-file",
        "/nonexistent/token",
        "stats",
    ])
    .await;
    assert_eq!(missing.code, Some(2), "{missing:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn over_mutual_tls_with_a_token_it_works_and_a_wrong_ca_cannot_connect_3() {
    use crate::support::pki::{Ca, TempDir};
    let dir = TempDir::new();
    let server_ca = Ca::new("outboxd test CA");
    let client_ca = Ca::new("operators CA");
    let other_ca = Ca::new("someone else's CA");
    let client_ca_file = dir.write("clients.crt", client_ca.cert_pem());
    let ca_file = dir.write("ca.crt", server_ca.cert_pem());
    let other_ca_file = dir.write("other.crt", other_ca.cert_pem());
    let (cert, key) = client_ca.client("ops").write_to(&dir, "client");
    let (server_cert, server_key) = server_ca.server(1).write_to(&dir, "tls");
    let token = format!("{}", Uuid::new_v4().simple());
    let tokens_dir = std::env::temp_dir().join(format!("outboxctl-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&tokens_dir).expect("a temp dir");
    let (tokens, token_file) = token_files(&tokens_dir, &token);
    let good = server_ca
        .client_tls()
        .identity(client_ca.client("relay").identity());
    let app = TestApp::spawn_with(|args| {
        args.set("--tls-cert", server_cert.as_str())
            .set("--tls-key", server_key.as_str())
            .set("--tls-client-ca", client_ca_file.as_str())
            .set("--auth-tokens", tokens.as_str())
            .client_tls(good);
    })
    .await;
    let s = format!("https://localhost:{}", app.addr.port());
    let tls = |ca: &str| -> Vec<String> {
        [
            "--server",
            &s,
            "--tls-ca",
            ca,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let run = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ctl(&args).await
    };
    let mut ok = tls(&ca_file);
    ok.extend(
        [
            "--token-file",
            token_file.as_str(),
            "--output",
            "json",
            "stats",
        ]
        .map(str::to_owned),
    );
    let stats = run(ok).await.json();
    assert_eq!(stats["outboxes"][0]["outbox"], "default", "{stats}");

    let mut wrong_ca = tls(&other_ca_file);
    wrong_ca.extend(["--token-file", token_file.as_str(), "stats"].map(str::to_owned));
    let refused = run(wrong_ca).await;
    assert_eq!(refused.code, Some(3), "{refused:?}");

    let plain = ctl(&[
        "--server",
        &format!("http://127.0.0.1:{}", app.addr.port()),
        "stats",
    ])
    .await;
    assert_eq!(plain.code, Some(3), "plaintext to the TLS port: {plain:?}");
    let _ = std::fs::remove_dir_all(&tokens_dir);
}

/// `outboxctl health` (the `helm test` pod's check, #36): 0 while both the
/// server and the API are SERVING, 1 naming the service once the database is
/// gone (or for a service outboxd does not serve), 3 with no server.
#[tokio::test]
async fn health_exits_0_while_serving_and_1_naming_what_is_not() {
    let app = TestApp::spawn().await;
    let server = server(&app);
    let serving = ctl(&["--server", &server, "--output", "json", "health"])
        .await
        .json();
    assert_eq!(serving["serving"], true, "{serving}");
    let services: Vec<(&str, &str)> = serving["services"]
        .as_array()
        .expect("services")
        .iter()
        .map(|s| {
            (
                s["service"].as_str().expect("a name"),
                s["status"].as_str().expect("a status"),
            )
        })
        .collect();
    assert_eq!(
        services,
        [("", "SERVING"), ("outbox.v1.OutboxService", "SERVING")]
    );
    let table = ctl(&["--server", &server, "health"]).await;
    assert_eq!(table.code, Some(0), "{table:?}");
    assert!(table.stdout.contains("(server)") && table.stdout.contains("SERVING"));

    let unknown = ctl(&[
        "--server",
        &server,
        "health",
        "--service",
        "no.such.Service",
    ])
    .await;
    assert_eq!(unknown.code, Some(1), "{unknown:?}");

    // The database goes: NOT_SERVING, exit 1, the service named on stderr.
    app.proxy.take_down();
    let mut last = None;
    let not_serving = crate::shared::wait::holds_within(secs(20), secs(1), async || {
        let run = ctl(&["--server", &server, "health"]).await;
        let seen = run.code == Some(1) && run.stderr.contains("NOT_SERVING");
        last = Some(run);
        seen
    })
    .await;
    assert!(not_serving, "{last:?}");
    app.proxy.bring_back();

    let port = free_port();
    let down = ctl(&["--server", &format!("http://127.0.0.1:{port}"), "health"]).await;
    assert_eq!(down.code, Some(3), "{down:?}");
}

/// A tokens file with `lines` (NAME, token, scopes), and a file holding the
/// token of the first.
fn scoped_token_files(
    dir: &crate::support::pki::TempDir,
    lines: &[(&str, &str, &str)],
) -> (String, String) {
    let text: String = lines
        .iter()
        .map(|(name, token, scopes)| {
            format!(
                "{name} sha256:{} {scopes}\n",
                hex::encode(outboxd::auth::token_digest(token))
            )
        })
        .collect();
    let tokens = dir.write("tokens", text);
    let token_file = dir.write("token", format!("{}\n", lines[0].1));
    (tokens, token_file)
}

/// An operator whose token covers only some outboxes (#46): `stats` shows
/// those and says how many others there are, rather than failing on the
/// first outbox it may not read.
#[tokio::test]
async fn stats_shows_the_outboxes_a_token_may_see_and_counts_the_others() {
    let dir = crate::support::pki::TempDir::new();
    let token = format!("{}", Uuid::new_v4().simple());
    let (tokens, token_file) = scoped_token_files(&dir, &[("orders-ops", &token, "admin:orders")]);
    let app = TestApp::spawn_with(|args| {
        two_outboxes(args);
        args.set("--auth-tokens", tokens.as_str());
    })
    .await;
    let s = server(&app);
    produce(&app, "public.orders_outbox", "order-1").await;
    let json = ctl(&[
        "--server",
        &s,
        "--token-file",
        &token_file,
        "--output",
        "json",
        "stats",
    ])
    .await
    .json();
    let names: Vec<&str> = json["outboxes"]
        .as_array()
        .expect("an array")
        .iter()
        .filter_map(|o| o["outbox"].as_str())
        .collect();
    assert_eq!(names, ["orders"], "{json}");
    assert_eq!(json["outboxes"][0]["pending"], 1, "{json}");
    assert_eq!(json["hidden_outboxes"], 1, "{json}");

    let text = ctl(&["--server", &s, "--token-file", &token_file, "stats"]).await;
    assert_eq!(text.code, Some(0), "{text:?}");
    assert!(
        text.stdout.contains("orders") && !text.stdout.lines().any(|l| l.starts_with("default")),
        "{text:?}"
    );
    assert!(
        text.stdout.contains(
            "1 more outbox(es) configured, not shown: this credential has no admin scope for them"
        ),
        "{text:?}"
    );
}

/// `https://` without `--tls-ca` (#46): the certificate is checked against
/// the system's roots. The test cannot add a CA to the system store, so it
/// names the bundle in SSL_CERT_FILE, which rustls-native-certs reads in the
/// store's place: the server's CA there connects, another CA there does not.
#[tokio::test]
async fn https_without_a_ca_file_checks_the_server_against_the_system_roots() {
    use crate::support::pki::{Ca, TempDir};
    let dir = TempDir::new();
    let server_ca = Ca::new("outboxd test CA");
    let other_ca = Ca::new("someone else's CA");
    let ca_file = dir.write("ca.crt", server_ca.cert_pem());
    let other_file = dir.write("other.crt", other_ca.cert_pem());
    let (cert, key) = server_ca.server(1).write_to(&dir, "tls");
    let app = TestApp::spawn_with(|args| {
        args.set("--tls-cert", cert.as_str())
            .set("--tls-key", key.as_str())
            .client_tls(server_ca.client_tls());
    })
    .await;
    let s = format!("https://localhost:{}", app.addr.port());
    let args = ["--server", s.as_str(), "--output", "json", "stats"];
    // outboxctl with only the roots in `file`, as rustls-native-certs reads them.
    let with_roots = |file: String| async move {
        ctl_with(
            &args,
            &[
                ("SSL_CERT_FILE", Some(file.as_str())),
                ("SSL_CERT_DIR", None),
            ],
        )
        .await
    };
    let trusted = with_roots(ca_file.to_string()).await;
    assert_eq!(
        trusted.json()["outboxes"][0]["outbox"],
        "default",
        "{trusted:?}"
    );
    let untrusted = with_roots(other_file.to_string()).await;
    assert_eq!(untrusted.code, Some(3), "another CA's roots: {untrusted:?}");
    assert!(
        untrusted.stderr.contains("cannot reach the server at"),
        "{untrusted:?}"
    );
    // No roots at all: a usage error saying what to give instead.
    let empty = dir.write("empty.pem", "");
    let none = with_roots(empty.to_string()).await;
    assert_eq!(none.code, Some(2), "{none:?}");
    assert!(
        none.stderr.contains("no system roots found") && none.stderr.contains("SSL_CERT_FILE"),
        "{none:?}"
    );
}
