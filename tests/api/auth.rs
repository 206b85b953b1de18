//! Authorisation (#34): bearer tokens from `--auth-tokens` mapped to scopes
//! per outbox, checked before anything is touched; the file re-read when it
//! changes or on SIGHUP; refusals counted; the admin calls' audit line naming
//! the caller; and the load shedding beside it: `--max-waiting-claims` and
//! `--max-request-bytes`.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use outboxd::{
    auth::token_digest,
    grpc::pb::{
        AckRequest, DiscardRequest, GetStatsRequest, ListDeadLettersRequest, RedriveRequest,
        outbox_admin_client::OutboxAdminClient, outbox_service_client::OutboxServiceClient,
    },
};
use tonic::{Code, Request, Status, transport::Channel};
use tonic_health::pb::health_check_response::ServingStatus;
use uuid::Uuid;

use crate::support::{
    Outboxd, ServerArgs, TestApp, TestDb, claim_request, ids, run_outboxd, said, secs, strings,
    wait_until, within,
};

const A: &str = "a";
const A_TABLE: &str = "public.outbox_a";
const B: &str = "b";
const B_TABLE: &str = "public.outbox_b";

// ---- the tokens file and the callers ----

/// A tokens file in a directory of its own, removed with it.
struct TokensFile {
    dir: PathBuf,
    path: PathBuf,
}

impl TokensFile {
    fn new(text: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("outboxd-auth-{}", Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let file = Self {
            path: dir.join("tokens"),
            dir,
        };
        file.write(text);
        file
    }

    /// Replaces the file the way a Secret update does: a new file renamed
    /// over the old, so the server never reads half of one.
    fn write(&self, text: &str) {
        let next = self.dir.join("tokens.next");
        std::fs::write(&next, text).expect("write the tokens file");
        std::fs::rename(&next, &self.path).expect("swap the tokens file in");
    }

    fn path(&self) -> &str {
        self.path.to_str().expect("a UTF-8 temp path")
    }
}

impl Drop for TokensFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh random bearer token.
fn token() -> String {
    format!("{}{}", Uuid::new_v4().simple(), Uuid::new_v4().simple())
}

/// One line of the file granting `scopes` to the holder of `token`.
fn line(name: &str, token: &str, scopes: &str) -> String {
    format!(
        "{name} sha256:{} {scopes}\n",
        hex::encode(token_digest(token))
    )
}

/// The three callers most tests use, and their file.
struct Callers {
    relay_a: String,
    relay_all: String,
    ops_a: String,
}

impl Callers {
    fn new() -> Self {
        Self {
            relay_a: token(),
            relay_all: token(),
            ops_a: token(),
        }
    }

    fn file(&self) -> String {
        format!(
            "# relays\n{}\n{}# operators\n{}",
            line("relay-a", &self.relay_a, "relay:a"),
            line("relay-all", &self.relay_all, "relay:*  # every outbox"),
            line("ops-a", &self.ops_a, "admin:a")
        )
    }
}

/// Outboxes `a` and `b`, authorisation from `file`.
fn two_outboxes(file: &TokensFile) -> impl FnOnce(&mut ServerArgs) + '_ {
    move |args| {
        args.add("--outbox", format!("{A}={A_TABLE}"))
            .add("--outbox", format!("{B}={B_TABLE}"))
            .set("--auth-tokens", file.path());
    }
}

/// `message` with `authorization` metadata set to `header` (none: `None`).
fn with<T>(header: Option<&str>, message: T) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(value) = header {
        request
            .metadata_mut()
            .insert("authorization", value.parse().expect("ASCII metadata"));
    }
    request
}

fn bearer(token: &str) -> Option<String> {
    Some(format!("Bearer {token}"))
}

/// The headers that must not get anyone in: none, an unknown token, and
/// malformed ones.
fn strangers() -> Vec<Option<String>> {
    vec![
        None,
        bearer(&token()),
        Some("Bearer".into()),
        Some("Basic dXNlcjpwYXNz".into()),
        Some(token()),
        Some("Bearer two words".into()),
    ]
}

/// A new connection to `app` as its clients make them (over TLS when it serves TLS).
async fn channel(app: &TestApp) -> Channel {
    app.endpoint().connect().await.expect("connect")
}

/// Every call of both services, with `header`, on `outbox`; their codes in
/// order: ClaimBatch, Ack, GetStats, ListDeadLetters, Redrive, Discard.
async fn every_call(app: &TestApp, header: Option<&str>, outbox: &str) -> Vec<Code> {
    every_call_on(channel(app).await, header, outbox).await
}

/// [`every_call`] on a connection of the caller's.
async fn every_call_on(channel: Channel, header: Option<&str>, outbox: &str) -> Vec<Code> {
    let mut relay = OutboxServiceClient::new(channel.clone());
    let mut admin = OutboxAdminClient::new(channel);
    let some_id = vec![Uuid::new_v4().to_string()];
    let lease = Uuid::new_v4().to_string();
    vec![
        code(
            relay
                .claim_batch(with(
                    header,
                    claim_request(outbox, "w", 10, secs(30), Duration::ZERO),
                ))
                .await,
        ),
        code(
            relay
                .ack(with(
                    header,
                    AckRequest {
                        outbox: outbox.into(),
                        lease_id: lease.clone(),
                        message_ids: some_id.clone(),
                    },
                ))
                .await,
        ),
        code(
            relay
                .get_stats(with(
                    header,
                    GetStatsRequest {
                        outbox: outbox.into(),
                    },
                ))
                .await,
        ),
        code(
            admin
                .list_dead_letters(with(
                    header,
                    ListDeadLettersRequest {
                        outbox: outbox.into(),
                        ..ListDeadLettersRequest::default()
                    },
                ))
                .await,
        ),
        code(
            admin
                .redrive(with(
                    header,
                    RedriveRequest {
                        outbox: outbox.into(),
                        all: true,
                        ..RedriveRequest::default()
                    },
                ))
                .await,
        ),
        code(
            admin
                .discard(with(
                    header,
                    DiscardRequest {
                        outbox: outbox.into(),
                        message_ids: some_id,
                    },
                ))
                .await,
        ),
    ]
}

/// How a call ended.
fn code<R>(result: Result<R, Status>) -> Code {
    result.map_or_else(|s| s.code(), |_| Code::Ok)
}

use Code::{Ok as OK_, PermissionDenied as DENIED, Unauthenticated as UNAUTH};

/// A claim of everything in `outbox` as `token`; its ids.
async fn claim_as(app: &TestApp, token: &str, outbox: &str) -> Result<Vec<String>, Status> {
    let mut client = app.client.clone();
    client
        .claim_batch(with(
            bearer(token).as_deref(),
            claim_request(outbox, "w", 100, secs(30), Duration::ZERO),
        ))
        .await
        .map(|r| ids(&r.into_inner()))
}

/// A value of counter `name` with all of `labels`; 0 when not exposed yet.
fn counter(body: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

// ---- who gets in ----

#[tokio::test]
async fn calls_without_a_known_well_formed_token_are_unauthenticated_and_change_nothing() {
    let callers = Callers::new();
    let file = TokensFile::new(&callers.file());
    let app = TestApp::spawn_with(two_outboxes(&file)).await;
    app.insert_into(A_TABLE, 3).await;
    // A dead letter, so a Redrive that got through would change something.
    app.db
        .execute(&format!(
            "UPDATE {A_TABLE} SET dead_lettered_at = now(), last_error = 'x' \
             WHERE seq = (SELECT min(seq) FROM {A_TABLE})"
        ))
        .await;
    let before = app.snapshot(A_TABLE).await;
    for header in strangers() {
        for outbox in [A, ""] {
            assert_eq!(
                every_call(&app, header.as_deref(), outbox).await,
                [UNAUTH; 6],
                "{header:?} on {outbox:?}"
            );
        }
    }
    assert_eq!(app.snapshot(A_TABLE).await, before, "nothing changed");
    // The same rows are there for a relay with the right token.
    assert_eq!(
        claim_as(&app, &callers.relay_a, A)
            .await
            .expect("claim")
            .len(),
        2
    );
}

#[tokio::test]
async fn a_relay_token_works_on_its_outbox_only_and_not_on_the_admin_service() {
    let callers = Callers::new();
    let file = TokensFile::new(&callers.file());
    let app = TestApp::spawn_with(two_outboxes(&file)).await;
    app.insert_into(B_TABLE, 2).await;
    let before = app.snapshot(B_TABLE).await;
    let relay_a = bearer(&callers.relay_a);
    assert_eq!(
        every_call(&app, relay_a.as_deref(), B).await,
        [DENIED; 6],
        "relay:a on outbox b"
    );
    assert_eq!(app.snapshot(B_TABLE).await, before, "nothing changed in b");
    // On `a`: the relay's calls (the Ack's lease is unknown, which is an
    // answer, not a refusal) and GetStats, but not the admin service.
    assert_eq!(
        every_call(&app, relay_a.as_deref(), A).await,
        [OK_, OK_, OK_, DENIED, DENIED, DENIED]
    );
    let status = claim_as(&app, &callers.relay_a, B)
        .await
        .expect_err("relay:a on b");
    assert!(
        status.message().contains("relay-a") && status.message().contains("\"b\""),
        "the refusal names the identity and the outbox: {status:?}"
    );
}

#[tokio::test]
async fn a_relay_star_token_works_on_every_outbox() {
    let callers = Callers::new();
    let file = TokensFile::new(&callers.file());
    let app = TestApp::spawn_with(two_outboxes(&file)).await;
    let in_a = app.insert_into(A_TABLE, 2).await;
    let in_b = app.insert_into(B_TABLE, 1).await;
    assert_eq!(
        claim_as(&app, &callers.relay_all, A).await.expect("a"),
        strings(&in_a)
    );
    assert_eq!(
        claim_as(&app, &callers.relay_all, B).await.expect("b"),
        strings(&in_b)
    );
    let relay_all = bearer(&callers.relay_all);
    assert_eq!(
        every_call(&app, relay_all.as_deref(), B).await,
        [OK_, OK_, OK_, DENIED, DENIED, DENIED]
    );
}

#[tokio::test]
async fn an_admin_token_redrives_on_its_outbox_but_does_not_claim() {
    let callers = Callers::new();
    let file = TokensFile::new(&callers.file());
    let app = TestApp::spawn_with(two_outboxes(&file)).await;
    app.insert_into(A_TABLE, 1).await;
    app.db
        .execute(&format!(
            "UPDATE {A_TABLE} SET dead_lettered_at = now(), last_error = 'x'"
        ))
        .await;
    let ops = bearer(&callers.ops_a);
    // ClaimBatch and Ack refused, GetStats and the admin calls allowed.
    assert_eq!(
        every_call(&app, ops.as_deref(), A).await,
        [DENIED, DENIED, OK_, OK_, OK_, OK_]
    );
    assert_eq!(
        app.count(A_TABLE, "dead_lettered_at IS NULL").await,
        1,
        "the redrive went through"
    );
    assert_eq!(
        app.count(&format!("{A_TABLE}_leases"), "NOT delayed").await,
        0,
        "the admin token claimed nothing (the redrive's delay row is no lease)"
    );
    assert_eq!(
        every_call(&app, ops.as_deref(), B).await,
        [DENIED; 6],
        "admin:a on outbox b"
    );
}

#[tokio::test]
async fn health_and_reflection_answer_without_a_token() {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let file = TokensFile::new(&Callers::new().file());
    let app = TestApp::spawn_with(two_outboxes(&file)).await;
    assert_eq!(
        app.health_of("").await.expect("health"),
        ServingStatus::Serving
    );
    let mut reflection = ServerReflectionClient::new(channel(&app).await);
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter([ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        }]))
        .await
        .expect("ServerReflectionInfo without a token")
        .into_inner();
    let listed = answers.message().await.expect("an answer").expect("a list");
    assert!(
        matches!(
            listed.message_response,
            Some(MessageResponse::ListServicesResponse(_))
        ),
        "{listed:?}"
    );
}

#[tokio::test]
async fn refusals_are_counted_by_method_and_code_without_credentials_in_labels() {
    let callers = Callers::new();
    let file = TokensFile::new(&callers.file());
    let app = TestApp::spawn_with(two_outboxes(&file)).await;
    let unknown = token();
    every_call(&app, None, A).await;
    every_call(&app, bearer(&unknown).as_deref(), A).await;
    every_call(&app, bearer(&callers.relay_a).as_deref(), B).await;
    let body = app.scrape().await;
    let refused = |method, code| {
        counter(
            &body,
            "outbox_auth_refusals_total",
            &[("method", method), ("code", code)],
        )
    };
    assert_eq!(refused("ClaimBatch", "Unauthenticated"), 2.0, "{body}");
    assert_eq!(refused("Redrive", "Unauthenticated"), 2.0);
    assert_eq!(refused("ClaimBatch", "PermissionDenied"), 1.0);
    assert_eq!(refused("Discard", "PermissionDenied"), 1.0);
    assert_eq!(refused("GetStats", "PermissionDenied"), 1.0);
    for secret in [&unknown, &callers.relay_a] {
        assert!(!body.contains(secret.as_str()));
        assert!(!body.contains(&hex::encode(token_digest(secret))[..16]));
    }
}

// ---- the file changes while serving ----

#[tokio::test]
async fn a_rewritten_file_takes_effect_and_a_broken_one_leaves_the_last_in_force() {
    let (old, new) = (token(), token());
    let file = TokensFile::new(&line("relay", &old, "relay:*"));
    let app = TestApp::spawn_with(two_outboxes(&file)).await;
    assert!(claim_as(&app, &old, A).await.is_ok());
    assert_eq!(
        claim_as(&app, &new, A).await.map_err(|s| s.code()),
        Err(UNAUTH)
    );

    file.write(&line("relay", &new, "relay:*"));
    wait_until(
        secs(10),
        "the new token works and the old one stops",
        async || {
            claim_as(&app, &new, A).await.is_ok()
                && claim_as(&app, &old, A).await.map_err(|s| s.code()) == Err(UNAUTH)
        },
    )
    .await;
    let reloads = async |result| {
        counter(
            &app.scrape().await,
            "outbox_auth_reloads_total",
            &[("result", result)],
        )
    };
    assert_eq!(reloads("ok").await, 1.0);

    // A bad line: the file is refused whole, the last good one stays.
    file.write(&format!(
        "{}ops sha256:not-hex admin:*\n",
        line("relay", &old, "relay:*")
    ));
    wait_until(
        secs(10),
        "the broken file was read and refused",
        async || reloads("invalid").await >= 1.0,
    )
    .await;
    assert!(claim_as(&app, &new, A).await.is_ok(), "the last good file");
    assert_eq!(
        claim_as(&app, &old, A).await.map_err(|s| s.code()),
        Err(UNAUTH)
    );

    // Gone for a moment (a symlink swap half done): the same.
    std::fs::remove_file(&file.path).expect("remove the tokens file");
    wait_until(secs(10), "the missing file was noticed", async || {
        reloads("unreadable").await >= 1.0
    })
    .await;
    assert!(claim_as(&app, &new, A).await.is_ok(), "the last good file");
}

// ---- the real binary: start-up, SIGHUP, the audit line ----

/// Redrive of everything in the default outbox of `server`, as the holder of `token`.
async fn redrive_all(server: &Outboxd, token: &str) -> Result<u64, Status> {
    let mut admin = OutboxAdminClient::connect(format!("http://{}", server.addr))
        .await
        .expect("connect to outboxd");
    admin
        .redrive(with(
            bearer(token).as_deref(),
            RedriveRequest {
                all: true,
                ..RedriveRequest::default()
            },
        ))
        .await
        .map(|r| r.into_inner().redriven)
}

#[tokio::test]
async fn sighup_rereads_the_file_and_redrive_is_logged_with_the_callers_name() {
    let db = TestDb::create().await;
    let (ops, next) = (token(), token());
    let file = TokensFile::new(&line("ops-team", &ops, "admin:*"));
    let mut server = Outboxd::start(&db, &["--auth-tokens", file.path()]).await;
    server
        .wait_said(&["authorisation on", "identities=1"])
        .await;

    assert_eq!(
        redrive_all(&server, &ops)
            .await
            .expect("Redrive as ops-team"),
        0
    );
    server
        .wait_said(&["redrive", "caller", "ops-team", "default"])
        .await;

    // SIGHUP re-reads even an unchanged file, and does not end the process.
    server.signal("HUP");
    server.wait_said(&["auth tokens reloaded", "SIGHUP"]).await;
    assert!(
        server.child.try_wait().expect("wait").is_none(),
        "outboxd survives SIGHUP"
    );
    // A new identity, picked up (by the poll or a SIGHUP, whichever first).
    file.write(&format!(
        "{}{}",
        line("ops-team", &ops, "admin:*"),
        line("ops-night", &next, "admin:*")
    ));
    server.signal("HUP");
    wait_until(secs(10), "the new token works", async || {
        redrive_all(&server, &next).await.is_ok()
    })
    .await;
    server.wait_said(&["redrive", "caller", "ops-night"]).await;

    let said = server.said();
    for secret in [&ops, &next] {
        assert!(
            !said.contains(secret.as_str()),
            "a token was logged:\n{said}"
        );
        assert!(
            !said.contains(&hex::encode(token_digest(secret))[..16]),
            "a hash was logged"
        );
    }
    server.signal("TERM");
    let status = within(secs(30), "outboxd stops", server.child.wait())
        .await
        .expect("wait");
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn a_bad_tokens_file_at_start_exits_64_naming_the_line_and_not_the_token() {
    let token = token();
    let file = TokensFile::new(&format!(
        "# operators\nops sha256:{} admin:*\n\nrelay {token} relay:*\n",
        hex::encode(token_digest("x"))
    ));
    let output = run_outboxd(
        &[
            "--database-url",
            "postgres://u@h/d",
            "--auth-tokens",
            file.path(),
        ],
        &[],
    )
    .await;
    let text = said(&output);
    assert_eq!(output.status.code(), Some(64), "{text}");
    assert!(
        text.contains("--auth-tokens") && text.contains("line 4"),
        "{text}"
    );
    assert!(!text.contains(&token), "the token is not echoed: {text}");
    assert_eq!(text.trim().lines().count(), 1, "one line: {text}");

    let missing = format!("{}.missing", file.path());
    let output = run_outboxd(
        &["--database-url", "postgres://u@h/d"],
        &[("OUTBOXD_AUTH_TOKENS", &missing)],
    )
    .await;
    let text = said(&output);
    assert_eq!(output.status.code(), Some(64), "{text}");
    assert!(text.contains("OUTBOXD_AUTH_TOKENS"), "{text}");
}

#[tokio::test]
async fn an_open_server_says_in_one_line_who_can_reach_it() {
    let db = TestDb::create().await;
    let server = Outboxd::start(&db, &[]).await;
    server
        .wait_said(&["INFO", "no --auth-tokens", "loopback only"])
        .await;
    drop(server);
    let mut open = Outboxd::start_on(&db, "0.0.0.0", &["--allow-unauthenticated"]).await;
    open.wait_said(&[
        "WARN",
        "--allow-unauthenticated",
        "ack events without publishing",
    ])
    .await;
    open.signal("TERM");
    let _ = within(secs(30), "outboxd stops", open.child.wait()).await;
}

// ---- load shedding ----

#[tokio::test]
async fn waiting_claims_beyond_the_limit_are_refused_at_once_and_admitted_again_later() {
    let app = TestApp::spawn_with(|args| {
        args.set("--max-waiting-claims", "2");
    })
    .await;
    let claims = app.count_claims("public.outbox").await;
    let waiters: Vec<_> = (0..2)
        .map(|_| app.spawn_claim(claim_request("", "w", 1, secs(30), secs(20))))
        .collect();
    wait_until(secs(10), "both claims looked once and wait", async || {
        claims.get().await >= 2
    })
    .await;

    let started = Instant::now();
    let refused = app
        .try_claim(claim_request("", "w", 1, secs(30), secs(20)))
        .await
        .expect_err("a third long poll");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("--max-waiting-claims 2"),
        "{refused:?}"
    );
    assert!(started.elapsed() < secs(5), "refused at once");
    // A claim that does not wait is never counted.
    assert!(app.nothing_to_claim().await);

    // Two events end both waits; then a long poll may wait again.
    let inserted = app.insert(2).await;
    let mut got = Vec::new();
    for waiter in waiters {
        let batch = within(secs(25), "a waiting claim", waiter)
            .await
            .expect("the waiter task")
            .expect("ClaimBatch");
        got.extend(ids(&batch));
    }
    got.sort();
    let mut want = strings(&inserted);
    want.sort();
    assert_eq!(got, want);
    let batch = app
        .try_claim(claim_request(
            "",
            "w",
            1,
            secs(30),
            Duration::from_millis(300),
        ))
        .await
        .expect("a long poll after the others ended");
    assert!(batch.messages.is_empty());
    let body = app.scrape().await;
    assert_eq!(
        counter(
            &body,
            "outbox_waiting_claims_refused_total",
            &[("outbox", "default")]
        ),
        1.0,
        "{body}"
    );
}

#[tokio::test]
async fn an_oversized_ack_is_resource_exhausted_changes_nothing_and_the_server_serves_on() {
    let app = TestApp::spawn_with(|args| {
        args.set("--max-request-bytes", "1024");
    })
    .await;
    let inserted = app.insert(1).await;
    let batch = app.claim("w", 1, secs(30), Duration::ZERO).await;
    let claimed = ids(&batch);
    assert_eq!(claimed, strings(&inserted));
    let before = app.snapshot("public.outbox").await;

    // 41 ids of 36 characters: about 1.6 KB.
    let mut padded = claimed.clone();
    padded.extend((0..40).map(|_| Uuid::new_v4().to_string()));
    let mut client = app.client.clone();
    let status = client
        .ack(AckRequest {
            outbox: String::new(),
            lease_id: batch.lease_id.clone(),
            message_ids: padded.clone(),
        })
        .await
        .expect_err("an Ack over --max-request-bytes");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("(--max-request-bytes)"),
        "the message names the flag: {status:?}"
    );
    let mut admin = app.admin().await;
    let status = admin
        .discard(DiscardRequest {
            outbox: String::new(),
            message_ids: padded,
        })
        .await
        .expect_err("a Discard over --max-request-bytes");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(
        app.snapshot("public.outbox").await,
        before,
        "nothing changed"
    );

    assert_eq!(
        app.ack(&batch.lease_id, &claimed).await,
        [crate::support::OK]
    );
}

// ---- `cn:` identities over mutual TLS ----

/// `cn:` lines grant their scopes to a client whose verified certificate
/// carries that subject CN; a certificate with no line is a stranger; a
/// bearer token on a mutual-TLS connection is judged as the token; and a
/// rewritten file takes a `cn:` identity away like a token.
#[tokio::test]
async fn a_client_certificate_gets_the_scopes_of_its_cn_line() {
    use crate::support::{
        endpoint,
        pki::{Ca, TempDir},
    };
    let dir = TempDir::new();
    let server_ca = Ca::new("outboxd test CA");
    let client_ca = Ca::new("relays CA");
    let client_ca_file = dir.write("clients.crt", client_ca.cert_pem());
    let (cert, key) = server_ca.server(1).write_to(&dir, "tls");
    let ops = token();
    let cn_lines = "relay-a cn:relay-a relay:a\nrelay-b cn:relay-b relay:b\n";
    let file = TokensFile::new(&format!("{cn_lines}{}", line("ops", &ops, "admin:*")));
    let as_relay_a = server_ca
        .client_tls()
        .identity(client_ca.client("relay-a").identity());
    let app = TestApp::spawn_with(|args| {
        two_outboxes(&file)(args);
        args.set("--tls-cert", cert)
            .set("--tls-key", key)
            .set("--tls-client-ca", &client_ca_file)
            .client_tls(as_relay_a.clone());
    })
    .await;
    app.insert_into(B_TABLE, 2).await;
    let before = app.snapshot(B_TABLE).await;

    // The certificate alone: relay:a, nothing else.
    assert_eq!(
        every_call(&app, None, A).await,
        [OK_, OK_, OK_, DENIED, DENIED, DENIED],
        "cn:relay-a on its outbox"
    );
    assert_eq!(
        every_call(&app, None, B).await,
        [DENIED; 6],
        "cn:relay-a on b"
    );
    assert_eq!(app.snapshot(B_TABLE).await, before, "nothing changed in b");

    // A certificate of the client CA whose name has no line.
    let stranger = server_ca
        .client_tls()
        .identity(client_ca.client("nobody").identity());
    let channel = endpoint(app.addr, Some(&stranger))
        .expect("an endpoint")
        .connect()
        .await
        .expect("the handshake succeeds: the CA signed it");
    assert_eq!(every_call_on(channel, None, A).await, [UNAUTH; 6]);

    // A token on the same connection speaks for the caller instead.
    let ops_header = bearer(&ops);
    assert_eq!(
        every_call(&app, ops_header.as_deref(), A).await,
        [DENIED, DENIED, OK_, OK_, OK_, OK_],
        "the token's admin:*, not the certificate's relay:a"
    );

    // The cn: line removed: the certificate no longer gets in.
    file.write(&line("ops", &ops, "admin:*"));
    wait_until(
        secs(10),
        "the certificate without its line is refused",
        async || every_call(&app, None, A).await == [UNAUTH; 6],
    )
    .await;
    assert_eq!(app.snapshot(B_TABLE).await, before, "nothing changed in b");
}
