//! The status page (`--admin-http-listen`, #35): loaded in a real headless
//! Chromium, the figures it shows are those GetStats reads, with the
//! watchdog's findings and a blocked key; with `--auth-tokens` it takes an
//! admin token (Basic, as a browser sends it, or Bearer) and shows each
//! outbox to its admins only; over TLS it takes the API's certificate and a
//! client certificate's `cn:` identity; it is read-only and never cached.
//!
//! Chromium is Debian's `chromium` (`scripts/test` installs it when missing;
//! `OUTBOXD_TEST_CHROMIUM` names another). Each run keeps a screenshot of
//! the page at `$CARGO_TARGET_TMPDIR/artifacts/status-page.png`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use hyper::{Method, StatusCode, header};
use outboxd::{
    auth::token_digest,
    grpc::pb::{GetStatsResponse, NackRequest},
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
use uuid::Uuid;

use crate::support::{
    DEAD_LETTERED, Reply, ServerArgs, TestApp, http, ids, millis, open_transaction, pki::Ca,
    pki::TempDir, run_outboxd, said, secs, wait_until, within,
};

const ORDERS_TABLE: &str = "public.orders_outbox";

fn with_page(args: &mut ServerArgs) -> &mut ServerArgs {
    args.set("--admin-http-listen", "127.0.0.1:0")
        .set("--watchdog-interval", "200ms")
}

async fn get(app: &TestApp, headers: &[(&str, &str)]) -> Reply {
    let addr = app.status_addr.expect("--admin-http-listen was given");
    http(addr, Method::GET, "/", headers, None).await
}

// ---- the page in a browser ----

/// Debian's Chromium, headless, with what keeps it off the network (this
/// machine's network is closed) and a profile of its own.
async fn chromium(args: &[&str]) -> String {
    let binary = std::env::var("OUTBOXD_TEST_CHROMIUM").unwrap_or_else(|_| "chromium".into());
    let profile = TempDir::new();
    let output = within(
        secs(90),
        "headless Chromium",
        tokio::process::Command::new(&binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
            ])
            .arg(format!("--user-data-dir={}", profile.path("profile").display()))
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|e| {
        panic!("cannot run {binary:?} ({e}): scripts/test installs Debian's chromium when it is missing; OUTBOXD_TEST_CHROMIUM names another")
    });
    assert!(
        output.status.success(),
        "chromium {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("the DOM is UTF-8")
}

/// The page's DOM once Chromium has loaded it.
async fn dom(url: &str) -> String {
    chromium(&["--dump-dom", url]).await
}

/// Where the screenshot is kept for whoever looks at a test run.
fn artifact(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("artifacts");
    std::fs::create_dir_all(&dir).expect("the artifacts directory");
    dir.join(name)
}

/// The `data-value` of every figure cell, by (outbox, figure).
fn figures(dom: &str) -> BTreeMap<(String, String), String> {
    dom.split('<')
        .filter_map(|tag| tag.split_once('>').map(|(attrs, _)| attrs))
        .filter_map(|attrs| {
            let figure = attr(attrs, "data-figure")?;
            let value = attr(attrs, "data-value")?;
            let outbox = attr(attrs, "data-outbox").unwrap_or_default();
            Some(((outbox, figure), value))
        })
        .collect()
}

fn attr(attrs: &str, name: &str) -> Option<String> {
    let start = attrs.find(&format!(" {name}=\""))? + name.len() + 3;
    let len = attrs[start..].find('"')?;
    Some(attrs[start..start + len].to_owned())
}

fn age(d: Option<&prost_types::Duration>) -> f64 {
    d.map_or(0.0, |d| d.seconds as f64 + f64::from(d.nanos) / 1e9)
}

/// The `data-attention` of one figure cell: `bad`, `warn`, or none.
fn attention(dom: &str, outbox: &str, figure: &str) -> Option<String> {
    dom.split('<')
        .filter_map(|tag| tag.split_once('>').map(|(attrs, _)| attrs))
        .find(|attrs| {
            attr(attrs, "data-outbox").as_deref() == Some(outbox)
                && attr(attrs, "data-figure").as_deref() == Some(figure)
        })
        .and_then(|attrs| attr(attrs, "data-attention"))
}

/// A figure the page shows, as a number.
fn shown_value(figures: &BTreeMap<(String, String), String>, outbox: &str, figure: &str) -> f64 {
    figures
        .get(&(outbox.to_owned(), figure.to_owned()))
        .unwrap_or_else(|| panic!("the page shows no {figure} for {outbox}: {figures:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("{figure} of {outbox} is not a number: {e}"))
}

/// Counts equal GetStats' exactly; ages lie between what GetStats read just
/// before and just after the page was loaded (ages only grow).
fn assert_matches(
    figures: &BTreeMap<(String, String), String>,
    outbox: &str,
    before: &GetStatsResponse,
    after: &GetStatsResponse,
) {
    for (figure, b, a) in [
        ("pending", before.pending, after.pending),
        ("in_flight", before.in_flight, after.in_flight),
        ("dead_lettered", before.dead_lettered, after.dead_lettered),
        ("blocked_keys", before.blocked_keys, after.blocked_keys),
    ] {
        assert_eq!(b, a, "{figure} of {outbox} changed while the page loaded");
        assert_eq!(
            shown_value(figures, outbox, figure),
            b as f64,
            "{figure} of {outbox}"
        );
    }
    for (figure, b, a) in [
        (
            "oldest_pending_age",
            age(before.oldest_pending_age.as_ref()),
            age(after.oldest_pending_age.as_ref()),
        ),
        (
            "oldest_blocked_age",
            age(before.oldest_blocked_age.as_ref()),
            age(after.oldest_blocked_age.as_ref()),
        ),
    ] {
        let page = shown_value(figures, outbox, figure);
        assert!(
            b - 0.001 <= page && page <= a + 0.001,
            "{figure} of {outbox}: the page shows {page}, GetStats read {b} before and {a} after"
        );
    }
}

#[tokio::test]
async fn the_page_in_a_browser_shows_what_get_stats_reads() {
    let app = TestApp::spawn_with(|args| {
        with_page(args)
            .add("--outbox", "default=public.outbox")
            .add("--outbox", "orders=public.orders_outbox:ordering=aggregate");
    })
    .await;

    // The default outbox: 3 pending, 2 of them leased, 1 dead-lettered.
    app.insert(4).await;
    let leased = app.claim("w-page", 2, secs(300), Duration::ZERO).await;
    assert_eq!(leased.messages.len(), 2);
    let poisoned = app.claim("w-page", 1, secs(300), Duration::ZERO).await;
    let dead = |outbox: &str, batch: &outboxd::grpc::pb::ClaimBatchResponse| NackRequest {
        outbox: outbox.into(),
        lease_id: batch.lease_id.clone(),
        message_ids: ids(batch),
        error: "poison".into(),
        dead_letter: true,
        ..NackRequest::default()
    };
    assert_eq!(app.nack(dead("", &poisoned)).await, [DEAD_LETTERED]);
    // The ordered outbox: aggregate agg-0's head dead-lettered, its second
    // event held behind it (poison=block, the default).
    app.insert_into(ORDERS_TABLE, 1).await;
    app.insert_into(ORDERS_TABLE, 1).await;
    let head = app
        .claim_from("orders", "w-page", 10, secs(300), millis(500))
        .await;
    assert_eq!(
        head.messages.len(),
        1,
        "only the head of agg-0 is claimable"
    );
    assert_eq!(app.nack(dead("orders", &head)).await, [DEAD_LETTERED]);

    // The default outbox's events are ten minutes old: past the 5-minute
    // page that OutboxOldestPendingAgeHigh sends by default.
    sqlx::query("UPDATE public.outbox SET created_at = now() - interval '10 minutes'")
        .execute(app.pool())
        .await
        .expect("age the default outbox's events");

    // A session of the test's own holding the xmin horizon.
    let (holder, _) = open_transaction(&app.db, "status-page-holder").await;
    let shows_holder = async || get(&app, &[]).await.body.contains("status-page-holder");
    wait_until(
        secs(30),
        "the watchdog sees the open transaction",
        shows_holder,
    )
    .await;

    let url = format!("http://{}/", app.status_addr.expect("listening"));
    let before = [app.stats_of("default").await, app.stats_of("orders").await];
    let page = dom(&url).await;
    let after = [app.stats_of("default").await, app.stats_of("orders").await];

    let figures = figures(&page);
    assert_matches(&figures, "default", &before[0], &after[0]);
    assert_matches(&figures, "orders", &before[1], &after[1]);
    assert_eq!(before[0].in_flight, 2, "the scenario's own figures");
    assert_eq!(before[0].dead_lettered, 1);
    assert_eq!(before[1].blocked_keys, 1);
    // When each figure was read, the blocked key, the holder, the tables.
    for outbox in ["default", "orders"] {
        assert!(
            page.contains(&format!("data-outbox=\"{outbox}\" data-figure=\"read_at\"")),
            "{outbox} has a read time"
        );
    }
    for expected in [
        "Blocked keys of orders",
        "<code>agg-0</code>",
        "status-page-holder",
        "Sampled ",
        "data-figure=\"xmin_horizon_age\"",
        "data-figure=\"dead_tuples\"",
        "<meta http-equiv=\"refresh\" content=\"10\">",
    ] {
        assert!(
            page.contains(expected),
            "the page lacks {expected:?}:\n{page}"
        );
    }
    assert!(
        shown_value(&figures, "", "xmin_horizon_age") > 0.0,
        "the open transaction holds the horizon"
    );
    // What needs attention is marked (and what does not, is not); the last
    // error is shown.
    for (outbox, figure, expected) in [
        ("default", "dead_lettered", Some("bad")),
        ("default", "oldest_pending_age", Some("bad")),
        ("default", "pending", None),
        ("default", "in_flight", None),
        ("default", "blocked_keys", None),
        ("orders", "blocked_keys", Some("bad")),
        ("orders", "oldest_blocked_age", Some("bad")),
        ("orders", "dead_lettered", Some("bad")),
        ("orders", "oldest_pending_age", None),
    ] {
        assert_eq!(
            attention(&page, outbox, figure).as_deref(),
            expected,
            "{outbox} {figure}"
        );
    }
    assert!(
        page.contains("class=\"n attention bad\""),
        "a class marks the cells (bold, bordered, a sign before the value)"
    );
    for outbox in ["default", "orders"] {
        assert!(
            page.contains(&format!(
                "data-outbox=\"{outbox}\" data-figure=\"last_error\"><code>poison</code>"
            )),
            "{outbox}'s last error is shown:\n{page}"
        );
        assert_eq!(
            app.stats_of(outbox).await.last_error,
            "poison",
            "GetStats has it too"
        );
    }

    let screenshot = artifact("status-page.png");
    let _ = std::fs::remove_file(&screenshot);
    chromium(&[
        &format!("--screenshot={}", screenshot.display()),
        "--window-size=1280,1500",
        &url,
    ])
    .await;
    let png = std::fs::read(&screenshot).expect("Chromium wrote the screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a real screenshot at {}",
        screenshot.display()
    );
    eprintln!("status page screenshot: {}", screenshot.display());
    drop(holder);
}

/// The commit-order guard's holdback, and the transaction it waits for, named
/// on the page (#35: "the status page shows which transaction is the cause").
#[tokio::test]
async fn the_page_names_the_transaction_the_commit_order_guard_waits_for() {
    let app = TestApp::spawn_with(|args| {
        with_page(args)
            .add("--outbox", "default=public.outbox")
            .add("--outbox", "orders=public.orders_outbox:ordering=aggregate")
            .set("--metrics-interval", "100ms");
    })
    .await;
    let (mut writer, pid) = open_transaction(&app.db, "status-page-writer").await;
    // An ordered event committed while the writer is open waits for it.
    app.insert_into(ORDERS_TABLE, 1).await;
    let named = format!("The oldest is pid {pid} (status-page-writer, idle in transaction)");
    let mut last = String::new();
    let shown = crate::shared::wait::holds_within(secs(20), millis(200), async || {
        last = get(&app, &[]).await.body;
        last.contains("Commit-order guard") && last.contains(&named)
    })
    .await;
    assert!(shown, "the page names {pid}:\n{last}");
    let figures = figures(&last);
    assert!(shown_value(&figures, "orders", "commit_order_holdback") > 0.0);

    sqlx::raw_sql("COMMIT")
        .execute(&mut writer)
        .await
        .expect("the writer ends");
    let cleared = crate::shared::wait::holds_within(secs(20), millis(200), async || {
        !get(&app, &[]).await.body.contains("Commit-order guard")
    })
    .await;
    assert!(cleared, "no holdback once the writer ended");
}

// ---- who may read it ----

fn token() -> String {
    format!("{}{}", Uuid::new_v4().simple(), Uuid::new_v4().simple())
}

fn line(name: &str, credential: &str, scopes: &str) -> String {
    format!("{name} {credential} {scopes}\n")
}

fn sha256(token: &str) -> String {
    let hex: String = token_digest(token)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

fn shows(reply: &Reply, outbox: &str) -> bool {
    reply
        .body
        .contains(&format!("<tr data-outbox=\"{outbox}\">"))
}

#[tokio::test]
async fn the_page_takes_an_admin_credential_and_shows_each_outbox_to_its_admins() {
    let dir = TempDir::new();
    let (ops_a, ops, relay) = (token(), token(), token());
    let tokens = dir.write(
        "tokens",
        format!(
            "{}{}{}",
            line("ops-a", &sha256(&ops_a), "admin:a"),
            line("ops", &sha256(&ops), "admin:*"),
            line("relay", &sha256(&relay), "relay:*"),
        ),
    );
    let app = TestApp::spawn_with(|args| {
        with_page(args)
            .add("--outbox", "a=public.outbox_a")
            .add("--outbox", "b=public.outbox_b")
            .set("--auth-tokens", &tokens);
    })
    .await;

    // No credential: 401 with the challenge that makes a browser ask.
    let none = get(&app, &[]).await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED, "{}", none.body);
    let challenge = none
        .headers
        .get(header::WWW_AUTHENTICATE)
        .expect("a challenge");
    assert!(challenge.to_str().is_ok_and(|c| c.starts_with("Basic ")));
    assert!(
        !none.body.contains("<table"),
        "nothing of the page: {}",
        none.body
    );
    // Unknown or malformed credentials: 401; a relay's token: 403.
    let bearer = |t: &str| format!("Bearer {t}");
    for (value, status) in [
        (bearer(&token()), StatusCode::UNAUTHORIZED),
        (basic("ops", &token()), StatusCode::UNAUTHORIZED),
        ("Bearer".to_owned(), StatusCode::UNAUTHORIZED),
        ("Basic !!".to_owned(), StatusCode::UNAUTHORIZED),
        (bearer(&relay), StatusCode::FORBIDDEN),
        (basic("relay", &relay), StatusCode::FORBIDDEN),
    ] {
        let reply = get(&app, &[("authorization", &value)]).await;
        assert_eq!(reply.status, status, "{}", reply.body);
        assert!(!reply.body.contains(&relay) && !reply.body.contains("sha256"));
    }
    // An admin of `a` sees `a` only; an admin of everything sees both.
    let reply = get(&app, &[("authorization", &basic("anyone", &ops_a))]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(shows(&reply, "a") && !shows(&reply, "b"), "{}", reply.body);
    assert!(
        reply
            .body
            .contains("1 more outbox(es) configured, not shown")
    );
    for value in [bearer(&ops), basic("ops", &ops)] {
        let reply = get(&app, &[("authorization", &value)]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(shows(&reply, "a") && shows(&reply, "b"), "{}", reply.body);
        for (name, value) in [
            (header::CACHE_CONTROL, "no-store"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ] {
            assert_eq!(
                reply.headers.get(&name).and_then(|v| v.to_str().ok()),
                Some(value)
            );
        }
        let csp = reply
            .headers
            .get(header::CONTENT_SECURITY_POLICY)
            .expect("a CSP");
        assert!(
            csp.to_str()
                .is_ok_and(|c| c.starts_with("default-src 'none'"))
        );
    }
    // Read-only: nothing but GET (and HEAD) is served.
    let addr = app.status_addr.expect("listening");
    for method in [Method::POST, Method::PUT, Method::DELETE] {
        let reply = http(
            addr,
            method.clone(),
            "/",
            &[("authorization", &bearer(&ops))],
            None,
        )
        .await;
        assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED, "{method}");
    }
    // A browser logs in with the token as the password.
    let page = dom(&format!("http://ops:{ops}@{addr}/")).await;
    assert!(page.contains("<tr data-outbox=\"b\">"), "{page}");
    // Refusals are counted like the API's, with no credential in a label.
    let scrape = app.scrape().await;
    for code in ["Unauthenticated", "PermissionDenied"] {
        assert!(
            scrape
                .lines()
                .any(|l| l.starts_with("outbox_auth_refusals_total{")
                    && l.contains("method=\"StatusPage\"")
                    && l.contains(&format!("code=\"{code}\""))),
            "{code} refusals counted"
        );
    }
    assert!(!scrape.contains(&relay) && !scrape.contains(&ops));
}

#[tokio::test]
async fn without_tokens_the_page_stays_on_loopback_unless_told() {
    let db = crate::support::TestDb::create().await;
    let url = db.url();
    let refused = run_outboxd(
        &["--database-url", &url, "--admin-http-listen", "0.0.0.0:0"],
        &[],
    )
    .await;
    assert_eq!(refused.status.code(), Some(64), "{}", said(&refused));
    assert!(
        said(&refused).contains("--admin-http-listen 0.0.0.0:0 is not a loopback address"),
        "{}",
        said(&refused)
    );
}

// ---- over TLS ----

fn client_config(
    ca: &Ca,
    identity: Option<&crate::support::pki::Pair>,
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).expect("the CA"))
        .expect("a root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some(pair) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(pair.cert.as_bytes()).expect("a cert")],
                PrivateKeyDer::from_pem_slice(pair.key.as_bytes()).expect("a key"),
            )
            .expect("a client identity"),
    };
    Arc::new(config)
}

#[tokio::test]
async fn over_tls_the_page_takes_the_apis_certificate_and_cn_identities() {
    let dir = TempDir::new();
    let ca = Ca::new("outboxd status CA");
    let (cert, key) = ca.server(1).write_to(&dir, "tls");
    let ca_file = dir.write("ca.crt", ca.cert_pem());
    let oncall = ca.client("oncall");
    let stranger = ca.client("stranger");
    let tokens = dir.write("tokens", line("oncall", "cn:oncall", "admin:*"));
    let app = TestApp::spawn_with(|args| {
        with_page(args)
            .set("--tls-cert", &cert)
            .set("--tls-key", &key)
            .set("--tls-client-ca", &ca_file)
            .set("--auth-tokens", &tokens)
            .client_tls(ca.client_tls().identity(oncall.identity()));
    })
    .await;
    let addr = app.status_addr.expect("listening");

    let reply = http(
        addr,
        Method::GET,
        "/",
        &[],
        Some(client_config(&ca, Some(&oncall))),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(shows(&reply, "default"), "{}", reply.body);
    // A certificate of the CA whose name has no line: 401.
    let reply = http(
        addr,
        Method::GET,
        "/",
        &[],
        Some(client_config(&ca, Some(&stranger))),
    )
    .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{}", reply.body);
    // No certificate: the handshake itself is refused, as on the API port.
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("a name");
    let refused = async {
        let mut tls = tokio_rustls::TlsConnector::from(client_config(&ca, None))
            .connect(name, tcp)
            .await?;
        // TLS 1.3 reports a missing client certificate on the first read.
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        tls.write_all(b"GET / HTTP/1.1\r\nhost: localhost\r\n\r\n")
            .await?;
        let mut buf = [0u8; 64];
        match tls.read(&mut buf).await? {
            0 => Err(std::io::Error::other("closed")),
            _ => Ok(()),
        }
    };
    assert!(
        within(secs(30), "the refused handshake", refused)
            .await
            .is_err(),
        "a client without a certificate must not get the page"
    );
}
