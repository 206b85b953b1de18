//! The certificate and key files: read, parsed, checked against each other.
//! Every error names the flag and the path, and says what is wrong.

use std::path::Path;

use rustls::{
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    sign::CertifiedKey,
};

use super::TlsSettings;

/// The contents of `--tls-cert` and `--tls-key`, read together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Pem {
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl Pem {
    pub(super) fn read(settings: &TlsSettings) -> Result<Self, String> {
        Ok(Self {
            cert: read(&cert_flag(settings), &settings.cert)?,
            key: read(&key_flag(settings), &settings.key)?,
        })
    }
}

/// A certificate chain and its key, ready to serve.
pub(super) struct Loaded {
    pub(super) key: CertifiedKey,
    pub(super) summary: Summary,
}

/// What the logs say about a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Summary {
    pub(super) subject: String,
    pub(super) serial: String,
    pub(super) not_after: String,
    /// Expired or not yet valid: clients will refuse it.
    pub(super) outside_validity: bool,
}

impl Loaded {
    /// The chain and key of `pem`, checked: at least one certificate, a
    /// valid X.509 leaf, a key rustls can sign with, and the key the one the
    /// leaf certifies.
    pub(super) fn parse(
        settings: &TlsSettings,
        pem: &Pem,
        provider: &CryptoProvider,
    ) -> Result<Self, String> {
        let cert_flag = cert_flag(settings);
        let key_flag = key_flag(settings);
        let chain = certificates(&cert_flag, &pem.cert)?;
        let summary = chain
            .first()
            .map(|leaf| summarise(&cert_flag, leaf))
            .transpose()?
            .ok_or_else(|| format!("{cert_flag}: no certificate in the file"))?;
        let key = PrivateKeyDer::from_pem_slice(&pem.key).map_err(|e| match e {
            rustls::pki_types::pem::Error::NoItemsFound => format!(
                "{key_flag}: no private key in the file (expected PEM \"-----BEGIN PRIVATE KEY-----\" or an RSA or EC key)"
            ),
            other => format!("{key_flag}: not a PEM private key: {other}"),
        })?;
        let signing = provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| format!("{key_flag}: unusable private key: {e}"))?;
        let key = CertifiedKey::new(chain, signing);
        match key.keys_match() {
            Ok(()) => {}
            Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
                return Err(format!(
                    "{key_flag} is not the key of the certificate in {cert_flag}"
                ));
            }
            // ring can tell the public key of every key type it loads; a key
            // it cannot is refused rather than served unchecked.
            Err(e) => {
                return Err(format!(
                    "{key_flag}: cannot check it against {cert_flag}: {e}"
                ));
            }
        }
        Ok(Self { key, summary })
    }
}

fn cert_flag(settings: &TlsSettings) -> String {
    format!("--tls-cert {}", settings.cert.display())
}

fn key_flag(settings: &TlsSettings) -> String {
    format!("--tls-key {}", settings.key.display())
}

/// A file's bytes; `flag` is the flag and path the error starts with.
pub(super) fn read(flag: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{flag}: cannot read the file: {e}"))
}

/// Every PEM certificate in a file: at least one.
pub(super) fn certificates(flag: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{flag}: not PEM: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "{flag}: no certificate in the file (expected PEM \"-----BEGIN CERTIFICATE-----\")"
        ));
    }
    Ok(certs)
}

/// Subject, serial and expiry of a certificate that must parse as X.509.
fn summarise(flag: &str, cert: &CertificateDer<'_>) -> Result<Summary, String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert)
        .map_err(|e| format!("{flag}: not a valid X.509 certificate: {e}"))?;
    let not_after = parsed.validity().not_after;
    Ok(Summary {
        subject: parsed.subject().to_string(),
        serial: parsed.raw_serial_as_string(),
        not_after: not_after
            .to_rfc2822()
            .unwrap_or_else(|_| not_after.to_string()),
        outside_validity: !parsed.validity().is_valid(),
    })
}
