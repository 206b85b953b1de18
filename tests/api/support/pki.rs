//! Certificates made in the test with rcgen: a CA, server certificates for
//! `localhost` and 127.0.0.1, client certificates with a given CN, written
//! to a directory of the test's own; and the client TLS settings that go
//! with them.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SerialNumber,
};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// A directory of the test's own, removed when dropped.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("outboxd-test-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("create the test's directory");
        Self(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// Writes `name` and returns its path (as a string, for flags).
    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> String {
        let path = self.path(name);
        write_replacing(&path, contents.as_ref());
        path.display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Replaces a file whole (a sibling renamed over it), so a reader never sees
/// it half written: how cert-manager and Kubernetes update a Secret's files.
fn write_replacing(path: &Path, contents: &[u8]) {
    let tmp = path.with_extension(format!("tmp-{}", uuid::Uuid::new_v4()));
    std::fs::write(&tmp, contents).expect("write a test file");
    std::fs::rename(&tmp, path).expect("move a test file in place");
}

/// A certificate and its private key, PEM.
#[derive(Debug, Clone)]
pub struct Pair {
    pub cert: String,
    pub key: String,
}

impl Pair {
    /// Writes `NAME.crt` and `NAME.key`; returns their paths.
    pub fn write_to(&self, dir: &TempDir, name: &str) -> (String, String) {
        (
            dir.write(&format!("{name}.crt"), &self.cert),
            dir.write(&format!("{name}.key"), &self.key),
        )
    }

    /// This certificate as a client's identity.
    pub fn identity(&self) -> Identity {
        Identity::from_pem(&self.cert, &self.key)
    }
}

/// A certificate authority of the test's own.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        Self {
            issuer: CertifiedIssuer::self_signed(params, key).expect("self-sign the CA"),
        }
    }

    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for `localhost` and 127.0.0.1 with this serial.
    pub fn server(&self, serial: u64) -> Pair {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, format!("outboxd {serial}"));
        params.serial_number = Some(SerialNumber::from(serial));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(&params)
    }

    /// A client certificate whose subject CN is `cn`.
    pub fn client(&self, cn: &str) -> Pair {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(&params)
    }

    fn sign(&self, params: &CertificateParams) -> Pair {
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        Pair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// A client that trusts this CA only, with no certificate of its own.
    pub fn client_tls(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(self.cert_pem()))
            .domain_name("localhost")
    }
}
