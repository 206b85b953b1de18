//! TLS on the API port (`--tls-cert`, `--tls-key`), mutual TLS
//! (`--tls-client-ca`), certificate rotation while serving, bad files at
//! start, and the plaintext health port for probes (`--health-listen`).

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use outboxd::{
    connections::CappedListener,
    grpc::pb::{ClaimBatchRequest, outbox_service_client::OutboxServiceClient},
    metrics::{Metrics, ServerMetrics},
    server::SERVICE_NAME,
    tls::{ServerTls, TlsSettings, incoming, peer_common_name},
};
use tokio::{net::TcpListener, time::Instant};
use tokio_util::sync::CancellationToken;
use tonic::{
    Code,
    transport::{ClientTlsConfig, Server},
};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::{
    shared::net::free_port,
    support::{
        OK, ServerArgs, TestApp, endpoint, ids, millis,
        pki::{Ca, Pair, TempDir},
        run_outboxd, said, secs, wait_until, within,
    },
};

/// A Health/Check on a new connection to `addr`, plaintext without `tls`:
/// the error, if any, from connecting, the handshake or the call.
async fn check_health(
    addr: SocketAddr,
    tls: Option<&ClientTlsConfig>,
) -> Result<ServingStatus, String> {
    let attempt = async {
        let channel = endpoint(addr, tls)
            .map_err(|e| format!("{e:#}"))?
            .connect()
            .await
            .map_err(|e| format!("connect: {}", error_chain(&e)))?;
        let response = HealthClient::new(channel)
            .check(HealthCheckRequest::default())
            .await
            .map_err(|s| format!("check: {}", error_chain(&s)))?;
        Ok(ServingStatus::try_from(response.into_inner().status).unwrap_or(ServingStatus::Unknown))
    };
    within(secs(15), "a health check on a new connection", attempt).await
}

fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

/// The flags of a server with `server`'s certificate, written to `dir`.
fn serve_tls<'a>(
    args: &'a mut ServerArgs,
    dir: &TempDir,
    server: &Pair,
    client: ClientTlsConfig,
) -> &'a mut ServerArgs {
    let (cert, key) = server.write_to(dir, "tls");
    args.set("--tls-cert", cert)
        .set("--tls-key", key)
        .client_tls(client)
}

#[tokio::test]
async fn a_plaintext_client_cannot_talk_to_the_tls_port() {
    let dir = TempDir::new();
    let ca = Ca::new("outboxd test CA");
    let app = TestApp::spawn_with(|args| {
        serve_tls(args, &dir, &ca.server(1), ca.client_tls());
    })
    .await;
    let plain = check_health(app.addr, None).await;
    assert!(plain.is_err(), "plaintext was answered: {plain:?}");
    assert_eq!(
        check_health(app.addr, Some(&ca.client_tls())).await,
        Ok(ServingStatus::Serving)
    );
}

#[tokio::test]
async fn a_tls_client_claims_and_acks_end_to_end() {
    let dir = TempDir::new();
    let ca = Ca::new("outboxd test CA");
    let app = TestApp::spawn_with(|args| {
        serve_tls(args, &dir, &ca.server(1), ca.client_tls());
    })
    .await;
    assert_eq!(app.endpoint().uri().scheme_str(), Some("https"));
    app.insert(3).await;
    let batch = app.claim("w", 10, secs(30), Duration::ZERO).await;
    assert_eq!(batch.messages.len(), 3);
    assert_eq!(app.ack(&batch.lease_id, &ids(&batch)).await, [OK, OK, OK]);
    for id in ids(&batch) {
        assert!(app.row(&id).await.published_at.is_some());
    }
}

#[tokio::test]
async fn mutual_tls_accepts_only_certificates_of_the_client_ca() {
    let dir = TempDir::new();
    let server_ca = Ca::new("outboxd test CA");
    let client_ca = Ca::new("relays CA");
    let other_ca = Ca::new("someone else's CA");
    let client_ca_file = dir.write("clients.crt", client_ca.cert_pem());
    let good = server_ca
        .client_tls()
        .identity(client_ca.client("relay-a").identity());
    let app = TestApp::spawn_with(|args| {
        serve_tls(args, &dir, &server_ca.server(1), good.clone())
            .set("--tls-client-ca", &client_ca_file);
    })
    .await;

    // A certificate of the client CA: served, RPCs and all.
    app.insert(1).await;
    let batch = app.claim("w", 10, secs(30), Duration::ZERO).await;
    assert_eq!(app.ack(&batch.lease_id, &ids(&batch)).await, [OK]);
    assert_eq!(
        check_health(app.addr, Some(&good)).await,
        Ok(ServingStatus::Serving)
    );

    let anonymous = check_health(app.addr, Some(&server_ca.client_tls())).await;
    assert!(
        anonymous
            .as_ref()
            .is_err_and(|e| e.contains("CertificateRequired")),
        "no client certificate: refused at the handshake: {anonymous:?}"
    );
    let stranger = server_ca
        .client_tls()
        .identity(other_ca.client("relay-a").identity());
    let stranger = check_health(app.addr, Some(&stranger)).await;
    assert!(
        stranger.as_ref().is_err_and(|e| e.contains("UnknownCA")),
        "another CA's certificate: refused at the handshake: {stranger:?}"
    );
    // The server's own CA is not the client CA either.
    let wrong_ca = server_ca
        .client_tls()
        .identity(server_ca.client("relay-a").identity());
    let wrong_ca = check_health(app.addr, Some(&wrong_ca)).await;
    assert!(
        wrong_ca.as_ref().is_err_and(|e| e.contains("UnknownCA")),
        "{wrong_ca:?}"
    );
}

#[tokio::test]
async fn peer_common_name_is_the_cn_of_the_verified_client_certificate() {
    let dir = TempDir::new();
    let server_ca = Ca::new("outboxd test CA");
    let client_ca = Ca::new("relays CA");
    let (cert, key) = server_ca.server(1).write_to(&dir, "tls");
    let settings = TlsSettings {
        cert: cert.into(),
        key: key.into(),
        client_ca: Some(dir.write("clients.crt", client_ca.cert_pem()).into()),
        reload_interval: secs(5),
    };
    let tls = ServerTls::new(&settings).expect("good files");

    // A probe: the health service behind an interceptor that notes the name.
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let noted = Arc::clone(&seen);
    let (_reporter, health) = tonic_health::server::health_reporter();
    let probe = tonic::service::interceptor::InterceptedService::new(
        health,
        move |request: tonic::Request<()>| {
            noted
                .lock()
                .expect("not poisoned")
                .push(peer_common_name(&request));
            Ok(request)
        },
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let metrics = ServerMetrics::new(&Metrics::new("test").expect("metrics"));
    let listener = CappedListener::new(listener, "api", 16, &metrics);
    let stop = CancellationToken::new();
    let server = tokio::spawn(
        Server::builder()
            .add_service(probe)
            .serve_with_incoming_shutdown(
                incoming(listener, tls.acceptor()),
                stop.clone().cancelled_owned(),
            ),
    );

    let client = server_ca
        .client_tls()
        .identity(client_ca.client("relay-a").identity());
    assert_eq!(
        check_health(addr, Some(&client)).await,
        Ok(ServingStatus::Serving)
    );
    assert_eq!(
        *seen.lock().expect("not poisoned"),
        [Some("relay-a".to_owned())]
    );
    stop.cancel();
    within(secs(10), "the probe server stops", server)
        .await
        .expect("no panic")
        .expect("served");
}

#[tokio::test]
async fn a_rotated_certificate_reaches_new_connections_and_open_ones_carry_on() {
    let dir = TempDir::new();
    let first_ca = Ca::new("first CA");
    let second_ca = Ca::new("second CA");
    let app = TestApp::spawn_with(|args| {
        serve_tls(args, &dir, &first_ca.server(1), first_ca.client_tls())
            .set("--tls-reload-interval", "100ms");
    })
    .await;
    app.insert(2).await;
    let before = app.claim("w", 1, secs(30), Duration::ZERO).await;

    // cert-manager renews: a certificate from another CA, so a client can
    // tell which one the server presents.
    second_ca.server(2).write_to(&dir, "tls");
    wait_until(
        secs(10),
        "a new connection trusting only the second CA is served",
        async || {
            check_health(app.addr, Some(&second_ca.client_tls()))
                .await
                .is_ok()
        },
    )
    .await;
    let old = check_health(app.addr, Some(&first_ca.client_tls())).await;
    assert!(
        old.as_ref().is_err_and(|e| e.contains("UnknownIssuer")),
        "new connections get the new certificate: {old:?}"
    );

    // The connection made before the rotation trusts only the first CA: it
    // works only if it was kept, not re-made.
    assert_eq!(app.ack(&before.lease_id, &ids(&before)).await, [OK]);
    let after = app.claim("w", 1, secs(30), Duration::ZERO).await;
    assert_eq!(after.messages.len(), 1);
}

#[tokio::test]
async fn a_broken_rotation_keeps_the_previous_certificate() {
    let dir = TempDir::new();
    let first_ca = Ca::new("first CA");
    let second_ca = Ca::new("second CA");
    let first = first_ca.server(1);
    let app = TestApp::spawn_with(|args| {
        serve_tls(args, &dir, &first, first_ca.client_tls()).set("--tls-reload-interval", "50ms");
    })
    .await;

    let new = second_ca.server(2);
    // Each, for 20 reload intervals: new connections still get the first certificate.
    for (what, cert, key) in [
        (
            "a certificate file that is not PEM",
            "junk\n",
            first.key.as_str(),
        ),
        (
            "a key of another certificate",
            new.cert.as_str(),
            first.key.as_str(),
        ),
        ("an empty key file", first.cert.as_str(), ""),
    ] {
        dir.write("tls.crt", cert);
        dir.write("tls.key", key);
        let until = Instant::now() + millis(1000);
        let mut tick = tokio::time::interval(millis(100));
        while Instant::now() < until {
            tick.tick().await;
            assert_eq!(
                check_health(app.addr, Some(&first_ca.client_tls())).await,
                Ok(ServingStatus::Serving),
                "after {what}, the previous certificate is served"
            );
        }
    }

    // A good rotation after the broken ones still happens.
    new.write_to(&dir, "tls");
    wait_until(secs(10), "the good rotation is served", async || {
        check_health(app.addr, Some(&second_ca.client_tls()))
            .await
            .is_ok()
    })
    .await;
}

#[tokio::test]
async fn a_silent_client_does_not_hold_up_other_handshakes() {
    let dir = TempDir::new();
    let ca = Ca::new("outboxd test CA");
    let app = TestApp::spawn_with(|args| {
        serve_tls(args, &dir, &ca.server(1), ca.client_tls());
    })
    .await;
    // Connected, and saying nothing: its handshake waits for its hello.
    let _silent = tokio::net::TcpStream::connect(app.addr)
        .await
        .expect("connect");
    let _half = {
        let mut half = tokio::net::TcpStream::connect(app.addr)
            .await
            .expect("connect");
        tokio::io::AsyncWriteExt::write_all(&mut half, &[0x16, 0x03, 0x01])
            .await
            .expect("write");
        half
    };
    let served = within(secs(5), "a handshake beside silent clients", async {
        check_health(app.addr, Some(&ca.client_tls())).await
    })
    .await;
    assert_eq!(served, Ok(ServingStatus::Serving));
}

#[tokio::test]
async fn the_health_port_answers_in_plaintext_while_the_api_port_is_tls() {
    let dir = TempDir::new();
    let ca = Ca::new("outboxd test CA");
    let app = TestApp::spawn_with(|args| {
        serve_tls(args, &dir, &ca.server(1), ca.client_tls()).set("--health-listen", "127.0.0.1:0");
    })
    .await;
    let health_addr = app.health_addr.expect("--health-listen is bound");
    assert_eq!(
        check_health(health_addr, None).await,
        Ok(ServingStatus::Serving)
    );
    let channel = endpoint(health_addr, None)
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut health = HealthClient::new(channel.clone());
    let api = health
        .check(HealthCheckRequest {
            service: SERVICE_NAME.into(),
        })
        .await
        .expect("the API's status");
    assert_eq!(api.into_inner().status, ServingStatus::Serving as i32);

    // Health only: the API is not on this port.
    let claim = OutboxServiceClient::new(channel)
        .claim_batch(ClaimBatchRequest {
            worker_id: "w".into(),
            max_messages: 1,
            ..Default::default()
        })
        .await
        .expect_err("no API on the health port");
    assert_eq!(claim.code(), Code::Unimplemented, "{claim:?}");

    // The same statuses as the API port: down with the database.
    app.proxy.take_down();
    wait_until(secs(10), "the health port says NOT_SERVING", async || {
        check_health(health_addr, None).await == Ok(ServingStatus::NotServing)
    })
    .await;
}

const NO_DATABASE: [&str; 6] = [
    "--database-url",
    "postgres://127.0.0.1:1/outboxd_tls_never_reached",
    "--listen",
    "127.0.0.1:0",
    "--metrics-listen",
    "127.0.0.1:0",
];

#[tokio::test]
async fn bad_tls_files_at_start_exit_64_naming_the_flag() {
    let dir = TempDir::new();
    let ca = Ca::new("outboxd test CA");
    let (cert, key) = ca.server(1).write_to(&dir, "tls");
    let (other_cert, _) = ca.server(2).write_to(&dir, "other");
    let junk = dir.write("junk.pem", "not PEM at all\n");
    let missing = dir.path("missing.pem").display().to_string();
    let cases: [(&str, &[&str], &[&str]); 6] = [
        (
            "a missing certificate",
            &["--tls-cert", &missing, "--tls-key", &key],
            &["--tls-cert", "missing.pem", "cannot read"],
        ),
        (
            "a certificate file that is not PEM",
            &["--tls-cert", &junk, "--tls-key", &key],
            &["--tls-cert", "no certificate in the file"],
        ),
        (
            "a missing key",
            &["--tls-cert", &cert, "--tls-key", &missing],
            &["--tls-key", "cannot read"],
        ),
        (
            "the key of another certificate",
            &["--tls-cert", &other_cert, "--tls-key", &key],
            &[
                "--tls-key",
                "is not the key of the certificate in --tls-cert",
            ],
        ),
        (
            "a client CA file without a certificate",
            &[
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
                "--tls-client-ca",
                &key,
            ],
            &["--tls-client-ca", "no certificate in the file"],
        ),
        (
            "a missing client CA file",
            &[
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
                "--tls-client-ca",
                &missing,
            ],
            &["--tls-client-ca", "cannot read"],
        ),
    ];
    for (what, tls, says) in cases {
        let mut args = NO_DATABASE.to_vec();
        args.extend(tls);
        let output = run_outboxd(&args, &[]).await;
        let text = said(&output);
        assert_eq!(output.status.code(), Some(64), "{what}: {text}");
        for part in says {
            assert!(text.contains(part), "{what}: says {part:?}:\n{text}");
        }
        assert_eq!(
            String::from_utf8_lossy(&output.stderr).lines().count(),
            1,
            "{what}: one line:\n{text}"
        );
    }

    // From the environment, the line names the variable.
    let output = run_outboxd(
        &NO_DATABASE,
        &[("OUTBOXD_TLS_CERT", &missing), ("OUTBOXD_TLS_KEY", &key)],
    )
    .await;
    assert_eq!(output.status.code(), Some(64), "{}", said(&output));
    assert!(
        said(&output).contains("OUTBOXD_TLS_CERT (--tls-cert)"),
        "{}",
        said(&output)
    );
}

#[tokio::test]
async fn a_health_port_in_use_exits_64_naming_the_flag() {
    let taken = std::net::TcpListener::bind(("127.0.0.1", free_port())).expect("bind");
    let port = taken.local_addr().expect("addr").port().to_string();
    let health = format!("127.0.0.1:{port}");
    let mut args = NO_DATABASE.to_vec();
    args.extend(["--health-listen", &health]);
    let output = run_outboxd(&args, &[]).await;
    let text = said(&output);
    assert_eq!(output.status.code(), Some(64), "{text}");
    assert!(text.contains("--health-listen"), "{text}");
    assert!(text.contains("already in use"), "{text}");
}
