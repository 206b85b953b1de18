//! TLS on the API port: the certificate re-read when its files change, and
//! client certificates verified against a CA for mutual TLS.

use std::{path::PathBuf, time::Duration};

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
        // Filled in by the TLS change.
        Ok(())
    }
}

/// The subject common name of the client certificate a mutual-TLS request
/// came with, for `cn:` identities; `None` without one.
pub fn peer_common_name<T>(_request: &tonic::Request<T>) -> Option<String> {
    // Filled in by the TLS change.
    None
}
