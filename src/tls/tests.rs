//! The TLS files' checks, the client certificate's name and the reloader, on
//! certificates made here with rcgen.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use super::*;

/// A directory of the test's own, removed at the end.
struct Dir(PathBuf);

impl Dir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("outboxd-tls-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        Self(dir)
    }

    fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).expect("write a test file");
        path
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("CA")
}

/// A certificate and its key, PEM.
struct Leaf {
    cert: String,
    key: String,
    der: CertificateDer<'static>,
}

fn leaf(ca: &CertifiedIssuer<'static, KeyPair>, cn: &str) -> Leaf {
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
    params.distinguished_name.push(DnType::CommonName, cn);
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, ca).expect("sign");
    Leaf {
        cert: cert.pem(),
        key: key.serialize_pem(),
        der: cert.der().clone(),
    }
}

fn settings(cert: &Path, key: &Path, client_ca: Option<&Path>) -> TlsSettings {
    TlsSettings {
        cert: cert.to_owned(),
        key: key.to_owned(),
        client_ca: client_ca.map(Path::to_owned),
        reload_interval: Duration::from_millis(10),
    }
}

#[track_caller]
fn refused(settings: &TlsSettings, says: &[&str]) {
    let err = settings.check().expect_err("the files are refused");
    for part in says {
        assert!(err.contains(part), "{part:?} in {err:?}");
    }
    assert!(!err.contains('\n'), "one line: {err:?}");
}

#[test]
fn good_files_pass_with_and_without_a_client_ca() {
    let dir = Dir::new();
    let ca = ca("test CA");
    let server = leaf(&ca, "outboxd");
    let cert = dir.write("tls.crt", &server.cert);
    let key = dir.write("tls.key", &server.key);
    let client_ca = dir.write("ca.crt", ca.pem());
    settings(&cert, &key, None).check().expect("no client CA");
    settings(&cert, &key, Some(&client_ca))
        .check()
        .expect("with a client CA");
}

#[test]
fn missing_files_name_their_flag() {
    let dir = Dir::new();
    let server = leaf(&ca("test CA"), "outboxd");
    let cert = dir.write("tls.crt", &server.cert);
    let key = dir.write("tls.key", &server.key);
    let missing = dir.0.join("missing.pem");
    refused(
        &settings(&missing, &key, None),
        &["--tls-cert", "missing.pem", "cannot read"],
    );
    refused(
        &settings(&cert, &missing, None),
        &["--tls-key", "missing.pem", "cannot read"],
    );
    refused(
        &settings(&cert, &key, Some(&missing)),
        &["--tls-client-ca", "missing.pem", "cannot read"],
    );
}

#[test]
fn files_that_are_not_pem_are_refused() {
    let dir = Dir::new();
    let server = leaf(&ca("test CA"), "outboxd");
    let cert = dir.write("tls.crt", &server.cert);
    let key = dir.write("tls.key", &server.key);
    let junk = dir.write("junk", "not a certificate\n");
    let der = dir.write("cert.der", server.der.as_ref());
    refused(
        &settings(&junk, &key, None),
        &["--tls-cert", "no certificate in the file"],
    );
    refused(
        &settings(&der, &key, None),
        &["--tls-cert", "no certificate in the file"],
    );
    refused(
        &settings(&cert, &junk, None),
        &["--tls-key", "no private key in the file"],
    );
    // A certificate where the key should be: the usual mix-up.
    refused(
        &settings(&cert, &cert, None),
        &["--tls-key", "no private key in the file"],
    );
    let broken = dir.write(
        "broken.crt",
        "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
    );
    refused(&settings(&broken, &key, None), &["--tls-cert", "not PEM"]);
    let not_x509 = dir.write(
        "not-x509.crt",
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    );
    refused(
        &settings(&not_x509, &key, None),
        &["--tls-cert", "not a valid X.509 certificate"],
    );
}

#[test]
fn a_key_that_is_not_the_certificates_is_refused() {
    let dir = Dir::new();
    let ca = ca("test CA");
    let one = leaf(&ca, "one");
    let other = leaf(&ca, "other");
    let cert = dir.write("tls.crt", &one.cert);
    let key = dir.write("tls.key", &other.key);
    refused(
        &settings(&cert, &key, None),
        &[
            "--tls-key",
            "is not the key of the certificate in --tls-cert",
        ],
    );
}

#[test]
fn a_client_ca_file_without_a_certificate_is_refused() {
    let dir = Dir::new();
    let server = leaf(&ca("test CA"), "outboxd");
    let cert = dir.write("tls.crt", &server.cert);
    let key = dir.write("tls.key", &server.key);
    let empty = dir.write("empty.pem", "");
    refused(
        &settings(&cert, &key, Some(&empty)),
        &["--tls-client-ca", "no certificate in the file"],
    );
    // The key where the CA should be.
    refused(
        &settings(&cert, &key, Some(&key)),
        &["--tls-client-ca", "no certificate in the file"],
    );
}

#[test]
fn the_common_name_is_the_subjects_one() {
    let ca = ca("test CA");
    assert_eq!(
        common_name(&leaf(&ca, "relay-a").der).as_deref(),
        Some("relay-a")
    );
    assert_eq!(common_name(ca.der()).as_deref(), Some("test CA"));

    let key = KeyPair::generate().expect("key");
    let mut nameless = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
    nameless.distinguished_name = rcgen::DistinguishedName::new();
    nameless
        .distinguished_name
        .push(DnType::OrganizationName, "relays");
    let cert = nameless.signed_by(&key, &ca).expect("sign");
    assert_eq!(common_name(cert.der()), None, "no CN");

    let mut two = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
    two.distinguished_name.push(DnType::CommonName, "relay-a");
    two.distinguished_name
        .push(DnType::CustomDnType(vec![2, 5, 4, 3]), "relay-b");
    let cert = two.signed_by(&key, &ca).expect("sign");
    assert_eq!(common_name(cert.der()), None, "two CNs are ambiguous");

    assert_eq!(common_name(&CertificateDer::from(vec![1, 2, 3])), None);
}

#[test]
fn without_tls_a_request_has_no_common_name() {
    assert_eq!(peer_common_name(&tonic::Request::new(())), None);
}

/// The end-entity certificate new handshakes get.
fn serving(tls: &ServerTls) -> CertificateDer<'static> {
    tls.current.0.load().cert[0].clone()
}

#[test]
fn the_reloader_swaps_in_changed_files_and_keeps_serving_through_broken_ones() {
    let dir = Dir::new();
    let ca = ca("test CA");
    let first = leaf(&ca, "first");
    let cert = dir.write("tls.crt", &first.cert);
    let key = dir.write("tls.key", &first.key);
    let tls = ServerTls::new(&settings(&cert, &key, None)).expect("good files");
    let mut reloader = Reloader::new(tls.clone());
    assert!(matches!(reloader.poll(), Reload::Unchanged));
    assert_eq!(serving(&tls), first.der);

    let second = leaf(&ca, "second");
    dir.write("tls.crt", &second.cert);
    dir.write("tls.key", &second.key);
    match reloader.poll() {
        Reload::Reloaded(summary) => assert!(summary.subject.contains("second"), "{summary:?}"),
        other => panic!("expected a reload, got {other:?}"),
    }
    assert_eq!(
        serving(&tls),
        second.der,
        "the clone serves the new one too"
    );
    assert!(matches!(reloader.poll(), Reload::Unchanged));

    // Half a rotation: a new certificate with the old key.
    let third = leaf(&ca, "third");
    dir.write("tls.crt", &third.cert);
    match reloader.poll() {
        Reload::Failed(why) => assert!(why.contains("is not the key"), "{why}"),
        other => panic!("expected a failure, got {other:?}"),
    }
    assert_eq!(serving(&tls), second.der, "the previous certificate stays");
    assert!(
        matches!(reloader.poll(), Reload::Unchanged),
        "said once per change"
    );

    std::fs::remove_file(&key).expect("remove the key");
    assert!(matches!(reloader.poll(), Reload::Failed(why) if why.contains("--tls-key")));
    assert_eq!(serving(&tls), second.der);

    dir.write("tls.key", &third.key);
    assert!(matches!(reloader.poll(), Reload::Reloaded(_)));
    assert_eq!(serving(&tls), third.der);
}

#[test]
fn an_expired_certificate_is_served_but_flagged() {
    let dir = Dir::new();
    let ca = ca("test CA");
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
    params.not_before = rcgen::date_time_ymd(2000, 1, 1);
    params.not_after = rcgen::date_time_ymd(2001, 1, 1);
    let key = KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, &ca).expect("sign");
    let cert = dir.write("tls.crt", cert.pem());
    let key = dir.write("tls.key", key.serialize_pem());
    let tls = ServerTls::new(&settings(&cert, &key, None)).expect("expired is not refused");
    assert!(tls.summary.outside_validity);
    assert!(tls.summary.not_after.contains("2001"), "{:?}", tls.summary);

    let fresh = leaf(&ca, "fresh");
    dir.write("tls.crt", &fresh.cert);
    dir.write("tls.key", &fresh.key);
    let tls = ServerTls::new(&settings(&cert, &key, None)).expect("good files");
    assert!(!tls.summary.outside_validity);
}
