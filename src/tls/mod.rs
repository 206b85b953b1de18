//! TLS on the API port: the certificate re-read when its files change, and
//! client certificates verified against a CA for mutual TLS.
//!
//! - [`TlsSettings::check`] reads every file once at validation, so bad ones
//!   stop start-up (exit 64) with the flag named;
//! - [`ServerTls`] is the rustls configuration the server accepts with; its
//!   certificate lives behind an [`ArcSwap`], swapped by [`ServerTls::reload`]
//!   while connections made with the old one carry on;
//! - [`incoming`] does each handshake in a task of its own, so a slow client
//!   cannot stall accepting;
//! - [`peer_common_name`] is who a mutual-TLS client is, for `cn:` identities.

mod accept;
mod files;

pub use accept::{HANDSHAKE_TIMEOUT, incoming};

use std::{path::PathBuf, sync::Arc, time::Duration};

use arc_swap::ArcSwap;
use rustls::{
    RootCertStore, ServerConfig,
    crypto::CryptoProvider,
    pki_types::CertificateDer,
    server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier, danger::ClientCertVerifier},
    sign::CertifiedKey,
};
use tokio_util::sync::CancellationToken;

use files::{Loaded, Pem, Summary};

/// `--tls-cert`, `--tls-key`, `--tls-client-ca`, as configured.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
    pub reload_interval: Duration,
}

impl TlsSettings {
    /// Reads and checks the files once, so bad ones stop start-up (exit 64).
    pub fn check(&self) -> Result<(), String> {
        ServerTls::new(self).map(|_| ())
    }
}

/// The provider every TLS object of outboxd's is built with: ring, the one
/// tonic, sqlx and lapin use (a second provider in the process makes rustls
/// panic at the first handshake).
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The API port's TLS: a rustls configuration whose certificate is swapped in
/// place when the files change. Clones share the certificate.
#[derive(Debug, Clone)]
pub struct ServerTls {
    settings: TlsSettings,
    provider: Arc<CryptoProvider>,
    current: Arc<Current>,
    config: Arc<ServerConfig>,
    /// What the files held when the serving certificate was read.
    loaded: Pem,
    summary: Summary,
}

impl ServerTls {
    /// Reads the certificate, the key and the client CA, and builds the
    /// configuration; the error names the flag and says what is wrong.
    pub fn new(settings: &TlsSettings) -> Result<Self, String> {
        let provider = provider();
        let pem = Pem::read(settings)?;
        let Loaded { key, summary } = Loaded::parse(settings, &pem, &provider)?;
        let current = Arc::new(Current(ArcSwap::from_pointee(key)));
        let versions = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS set-up: {e}"))?;
        let builder = match &settings.client_ca {
            Some(path) => versions.with_client_cert_verifier(client_verifier(path, &provider)?),
            None => versions.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(current.clone());
        // gRPC is HTTP/2 only; tonic's client refuses a server that does not say so.
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Self {
            settings: settings.clone(),
            provider,
            current,
            config: Arc::new(config),
            loaded: pem,
            summary,
        })
    }

    /// What accepts connections with this configuration.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(Arc::clone(&self.config))
    }

    /// The same certificate (and its reloads) and client-certificate rule for
    /// the status page, which speaks HTTP/1.1 rather than gRPC's HTTP/2.
    pub fn http_acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let mut config = ServerConfig::clone(&self.config);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    }

    /// The one line at start saying the API port speaks TLS, and with what.
    pub fn log_serving(&self) {
        let Summary {
            subject,
            serial,
            not_after,
            ..
        } = &self.summary;
        self.summary.warn_if_outside_validity();
        let cert = self.settings.cert.display();
        match &self.settings.client_ca {
            Some(client_ca) => tracing::info!(
                %cert,
                %subject,
                %serial,
                %not_after,
                client_ca = %client_ca.display(),
                "TLS on the API port, and mutual TLS: clients need a certificate signed by the client CA"
            ),
            None => tracing::info!(%cert, %subject, %serial, %not_after, "TLS on the API port"),
        }
    }

    /// The reload task: every `--tls-reload-interval`, re-reads the files by
    /// path (Kubernetes updates a Secret volume by swapping a symlink) and,
    /// when they changed, serves the new certificate to new handshakes.
    /// Connections already made keep theirs. Files that changed into
    /// something unusable are logged and the previous certificate stays.
    pub async fn reload(self, stop: CancellationToken) {
        let mut reloader = Reloader::new(self);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(reloader.tls.settings.reload_interval) => {}
            }
            match reloader.poll() {
                Reload::Unchanged => {}
                Reload::Reloaded(summary) => {
                    summary.warn_if_outside_validity();
                    let Summary {
                        subject,
                        serial,
                        not_after,
                        ..
                    } = summary;
                    tracing::info!(
                        cert = %reloader.tls.settings.cert.display(),
                        %subject,
                        %serial,
                        %not_after,
                        "TLS certificate reloaded"
                    );
                }
                Reload::Failed(error) => tracing::warn!(
                    %error,
                    "TLS certificate files changed but cannot be used; still serving the previous certificate"
                ),
            }
        }
    }
}

impl Summary {
    /// Served anyway (a renewal may be on its way), but said: clients refuse it.
    fn warn_if_outside_validity(&self) {
        if self.outside_validity {
            tracing::warn!(
                subject = %self.subject,
                not_after = %self.not_after,
                "the TLS certificate is expired or not yet valid: clients will refuse it"
            );
        }
    }
}

/// What one look at the files did.
#[derive(Debug)]
enum Reload {
    Unchanged,
    Reloaded(Summary),
    /// The files changed into something unusable (said once per change).
    Failed(String),
}

/// The reload task's state: what the files held last time it looked.
struct Reloader {
    tls: ServerTls,
    /// Compared by content: mtimes do not change when a symlink does, and
    /// both files are a few kilobytes.
    seen: Result<Pem, String>,
}

impl Reloader {
    fn new(tls: ServerTls) -> Self {
        let seen = Ok(tls.loaded.clone());
        Self { tls, seen }
    }

    /// Reads the files (a few kilobytes, on a local or memory volume: read
    /// in place rather than on the blocking pool) and swaps in a certificate
    /// that changed and is usable.
    /// The two files are not read atomically: a rotation that lands between
    /// the reads shows as a mismatch once, and is picked up at the next look.
    fn poll(&mut self) -> Reload {
        let now = Pem::read(&self.tls.settings);
        if now == self.seen {
            return Reload::Unchanged;
        }
        self.seen = now.clone();
        match now.and_then(|pem| Loaded::parse(&self.tls.settings, &pem, &self.tls.provider)) {
            Ok(Loaded { key, summary }) => {
                self.tls.current.0.store(Arc::new(key));
                Reload::Reloaded(summary)
            }
            Err(why) => Reload::Failed(why),
        }
    }
}

/// The certificate new handshakes get: whatever was loaded last.
#[derive(Debug)]
struct Current(ArcSwap<CertifiedKey>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }
}

/// Mutual TLS: a client certificate is required, and must chain to a
/// certificate of the `--tls-client-ca` file. The file is read once, at start.
fn client_verifier(
    path: &std::path::Path,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let flag = format!("--tls-client-ca {}", path.display());
    let pem = files::read(&flag, path)?;
    let certs = files::certificates(&flag, &pem)?;
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| format!("{flag}: not a usable CA certificate: {e}"))?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider))
        .build()
        .map_err(|e| format!("{flag}: {e}"))
}

/// The subject common name of the client certificate a mutual-TLS request
/// came with, for `cn:` identities; `None` without one. The certificate was
/// verified against `--tls-client-ca` during the handshake (tonic only has
/// peer certificates for connections that completed it).
pub fn peer_common_name<T>(request: &tonic::Request<T>) -> Option<String> {
    let certs = request.peer_certs()?;
    common_name(certs.first()?)
}

/// The same for a connection accepted by [`incoming`] (the status page).
pub fn connection_common_name<IO>(stream: &tokio_rustls::server::TlsStream<IO>) -> Option<String> {
    common_name(stream.get_ref().1.peer_certificates()?.first()?)
}

/// The subject CN of a certificate; `None` when there is none, or more than
/// one (an identity that could be read two ways is no identity).
fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert).ok()?;
    let mut names = parsed.subject().iter_common_name();
    let first = names.next()?;
    if names.next().is_some() {
        return None;
    }
    first.as_str().ok().map(str::to_owned)
}

#[cfg(test)]
mod tests;
