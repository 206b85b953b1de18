//! The relay's gRPC channel against a throwaway outboxd stand-in that serves
//! TLS, requires a client certificate and records the `authorization` header
//! each call arrived with: what `--tls-*` and `--token-file` set up, end to
//! end through `RelayArgs`, without the real server's TLS and tokens.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use clap::Parser as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::{
    Request, Response, Status,
    transport::{Certificate, Identity, Server, ServerTlsConfig, server::TcpIncoming},
};

use outboxd::pb::{
    self,
    outbox_service_server::{OutboxService, OutboxServiceServer},
};

use super::{GrpcLeases, Leases};
use crate::{RelayArgs, credentials::tests::Scratch};

/// Answers ClaimBatch with nothing, remembering its `authorization` header.
#[derive(Default, Clone)]
struct StandIn {
    seen: Arc<Mutex<Vec<Option<String>>>>,
}

#[tonic::async_trait]
impl OutboxService for StandIn {
    async fn claim_batch(
        &self,
        request: Request<pb::ClaimBatchRequest>,
    ) -> Result<Response<pb::ClaimBatchResponse>, Status> {
        let auth = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.seen.lock().expect("seen").push(auth);
        Ok(Response::new(pb::ClaimBatchResponse::default()))
    }
    async fn ack(&self, _: Request<pb::AckRequest>) -> Result<Response<pb::AckResponse>, Status> {
        Err(Status::unimplemented("stand-in"))
    }
    async fn nack(
        &self,
        _: Request<pb::NackRequest>,
    ) -> Result<Response<pb::NackResponse>, Status> {
        Err(Status::unimplemented("stand-in"))
    }
    async fn extend_lease(
        &self,
        _: Request<pb::ExtendLeaseRequest>,
    ) -> Result<Response<pb::ExtendLeaseResponse>, Status> {
        Err(Status::unimplemented("stand-in"))
    }
    async fn get_stats(
        &self,
        _: Request<pb::GetStatsRequest>,
    ) -> Result<Response<pb::GetStatsResponse>, Status> {
        Err(Status::unimplemented("stand-in"))
    }
}

/// Made-up certificates: the server's for `localhost`, a client's, and a
/// stranger's that no one trusts.
struct Pki {
    dir: Scratch,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    stranger_cert: PathBuf,
}

impl Pki {
    fn new() -> Self {
        let dir = Scratch::new("pki");
        let write = |name: &str, san: &str| {
            let made = rcgen::generate_simple_self_signed(vec![san.to_owned()]).expect("rcgen");
            (
                dir.file(&format!("{name}.pem"), made.cert.pem().as_bytes()),
                dir.file(
                    &format!("{name}.key"),
                    made.signing_key.serialize_pem().as_bytes(),
                ),
            )
        };
        let (server_cert, server_key) = write("server", "localhost");
        let (client_cert, client_key) = write("client", "relay");
        let (stranger_cert, _) = write("stranger", "localhost");
        Self {
            dir,
            server_cert,
            server_key,
            client_cert,
            client_key,
            stranger_cert,
        }
    }

    /// Serves the stand-in over TLS that requires a client certificate
    /// signed by (here: equal to) the client's; returns its https:// address.
    async fn serve(&self, stand_in: StandIn, stop: CancellationToken) -> String {
        let read = |p: &PathBuf| std::fs::read(p).expect("pem");
        let tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(
                read(&self.server_cert),
                read(&self.server_key),
            ))
            .client_ca_root(Certificate::from_pem(read(&self.client_cert)));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = Server::builder()
            .tls_config(tls)
            .expect("server tls")
            .add_service(OutboxServiceServer::new(stand_in))
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), stop.cancelled_owned());
        tokio::spawn(server);
        format!("https://localhost:{port}")
    }
}

fn leases(args: &[&str]) -> (GrpcLeases, crate::RelayConfig) {
    let argv = std::iter::once("outbox-relay").chain(args.iter().copied());
    let config = RelayArgs::try_parse_from(argv)
        .expect("parses")
        .validate()
        .expect("valid");
    let leases =
        GrpcLeases::connect_lazy(&config.server, config.tls.as_ref(), config.token.as_ref())
            .expect("channel");
    (leases, config)
}

fn claim() -> pb::ClaimBatchRequest {
    pb::ClaimBatchRequest {
        outbox: "default".into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn calls_go_over_mutual_tls_with_the_token_of_the_file_as_it_changes() {
    let pki = Pki::new();
    let stand_in = StandIn::default();
    let stop = CancellationToken::new();
    let server = pki.serve(stand_in.clone(), stop.clone()).await;
    let token = pki.dir.file("token", b"first-token\n");
    let path = |p: &PathBuf| p.to_str().expect("utf-8").to_owned();
    let (ca, cert, key, token_path) = (
        path(&pki.server_cert),
        path(&pki.client_cert),
        path(&pki.client_key),
        path(&token),
    );
    let (leases, config) = leases(&[
        "--server",
        &server,
        "--tls-ca",
        &ca,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--token-file",
        &token_path,
    ]);
    leases.claim(claim()).await.expect("claim over mutual TLS");
    let file = config.token.clone().expect("token file");
    let watch = tokio::spawn(file.watch(Duration::from_millis(50), stop.clone()));
    std::fs::write(&token, "second-token").expect("rotate");
    // Wait for the condition, not a guessed time: the watcher polls.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !config
        .token
        .as_ref()
        .expect("token")
        .token
        .is("second-token")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "token never re-read"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    leases
        .claim(claim())
        .await
        .expect("claim with the new token");
    let seen = stand_in.seen.lock().expect("seen").clone();
    assert_eq!(
        seen,
        [
            Some("Bearer first-token".to_owned()),
            Some("Bearer second-token".to_owned())
        ]
    );
    stop.cancel();
    watch.await.expect("watch stops");
}

#[tokio::test]
async fn a_server_the_ca_did_not_sign_and_a_missing_client_certificate_are_refused() {
    let pki = Pki::new();
    let stand_in = StandIn::default();
    let stop = CancellationToken::new();
    let server = pki.serve(stand_in.clone(), stop.clone()).await;
    let path = |p: &PathBuf| p.to_str().expect("utf-8").to_owned();
    let (wrong_ca, ca) = (path(&pki.stranger_cert), path(&pki.server_cert));
    let (untrusting, _) = leases(&["--server", &server, "--tls-ca", &wrong_ca]);
    let err = untrusting.claim(claim()).await.expect_err("unknown CA");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
    let (anonymous, _) = leases(&["--server", &server, "--tls-ca", &ca]);
    let err = anonymous
        .claim(claim())
        .await
        .expect_err("no client certificate");
    // TLS 1.3 reports it after the client's handshake is done, with the request.
    assert!(
        format!("{err:?}").contains("CertificateRequired"),
        "{err:?}"
    );
    assert!(stand_in.seen.lock().expect("seen").is_empty());
    stop.cancel();
}
