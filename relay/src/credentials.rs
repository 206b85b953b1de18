//! What the relay proves itself with and checks others by: PEM files read and
//! checked once at start (so a bad one exits 64, not at the first handshake),
//! and the bearer token file, re-read while the relay runs so a rotated
//! Secret reaches it without a restart.

use std::{
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio_util::sync::CancellationToken;

use outboxd::client::BearerToken;

/// How often the token file is re-read: a few seconds, well inside the time
/// Kubernetes itself takes to update a mounted Secret (up to a minute or so).
pub const TOKEN_POLL: Duration = Duration::from_secs(5);

/// The token in `path`: the file's text with surrounding whitespace trimmed
/// (a trailing newline from `echo` or an editor is not part of it). The error
/// never contains the file's text.
pub fn read_token(path: &Path) -> Result<String, String> {
    outboxd::client::read_token(path)
}

/// `--token-file`: the token read at start, shared with every call, and the
/// file it came from, for [`TokenFile::watch`].
#[derive(Debug, Clone)]
pub struct TokenFile {
    pub path: PathBuf,
    pub token: BearerToken,
}

impl TokenFile {
    /// Reads the token once; errors name the flag.
    pub fn open(path: &Path) -> Result<Self, String> {
        let token = read_token(path)
            .and_then(|text| {
                BearerToken::new(&text).map_err(|e| format!("{}: {e}", path.display()))
            })
            .map_err(|e| format!("--token-file {e}"))?;
        Ok(Self {
            path: path.to_owned(),
            token,
        })
    }

    /// Re-reads the file every `every` until `stop`, and sends a changed
    /// token from the next call on. A failed read keeps the token in use (a
    /// Secret being rewritten is briefly missing or empty) and warns once per
    /// distinct reason.
    pub async fn watch(self, every: Duration, stop: CancellationToken) {
        let mut failing: Option<String> = None;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            let read = read_token(&self.path).and_then(|text| {
                if self.token.is(&text) {
                    return Ok(false);
                }
                self.token
                    .replace(&text)
                    .map(|()| true)
                    .map_err(|e| format!("{}: {e}", self.path.display()))
            });
            match read {
                Ok(changed) => {
                    if failing.take().is_some() {
                        tracing::info!(path = %self.path.display(), "token file readable again");
                    }
                    if changed {
                        tracing::info!(path = %self.path.display(), "token file changed; calls use the new token");
                    }
                }
                Err(reason) => {
                    if failing.as_deref() != Some(reason.as_str()) {
                        tracing::warn!(
                            path = %self.path.display(),
                            reason,
                            "cannot re-read the token file; keeping the token in use"
                        );
                        failing = Some(reason);
                    }
                }
            }
        }
    }
}

/// The PEM certificates in `path` (a CA bundle or a certificate chain), as
/// read; an error, naming `flag`, when there is none or one does not parse.
pub fn read_certificates(flag: &str, path: &Path) -> Result<Vec<u8>, String> {
    let pem = fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{flag} {}: not a PEM certificate: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{flag} {}: no PEM certificate in the file",
            path.display()
        ));
    }
    Ok(pem)
}

/// The PEM private key in `path`, as read; an error naming `flag` otherwise.
/// The error never contains the key.
pub fn read_private_key(flag: &str, path: &Path) -> Result<Vec<u8>, String> {
    let pem = fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|_| format!("{flag} {}: no PEM private key in the file", path.display()))?;
    Ok(pem)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A directory of its own under the system temp dir, removed on drop.
    pub(crate) struct Scratch(pub PathBuf);

    impl Scratch {
        pub(crate) fn new(case: &str) -> Self {
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let dir = std::env::temp_dir().join(format!(
                "outbox-relay-{case}-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            fs::create_dir_all(&dir).expect("scratch dir");
            Self(dir)
        }

        pub(crate) fn file(&self, name: &str, content: &[u8]) -> PathBuf {
            let path = self.0.join(name);
            fs::write(&path, content).expect("write scratch file");
            path
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn sent(token: &BearerToken) -> String {
        use tonic::service::Interceptor as _;
        let mut credentials = outboxd::client::Credentials::bearer(token.clone());
        let request = credentials.call(tonic::Request::new(())).expect("passes");
        request
            .metadata()
            .get("authorization")
            .expect("header")
            .to_str()
            .expect("ascii")
            .to_owned()
    }

    #[test]
    fn the_token_is_the_file_trimmed_and_an_empty_file_is_refused() {
        let dir = Scratch::new("token");
        let path = dir.file("token", b"  s3cret\n");
        assert_eq!(read_token(&path).as_deref(), Ok("s3cret"));
        let empty = dir.file("empty", b" \n\t");
        let err = read_token(&empty).expect_err("empty");
        assert!(err.contains("empty"), "{err}");
        let err = TokenFile::open(&dir.0.join("missing")).expect_err("missing");
        assert!(
            err.starts_with("--token-file ") && err.contains("missing"),
            "{err}"
        );
        let bad = dir.file("bad", "tö ken".as_bytes());
        let err = TokenFile::open(&bad).expect_err("not a header value");
        assert!(!err.contains("tö"), "the token stays out of errors: {err}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_changed_token_file_is_used_and_a_failed_read_keeps_the_old_token() {
        let dir = Scratch::new("watch");
        let path = dir.file("token", b"one\n");
        let file = TokenFile::open(&path).expect("valid");
        let token = file.token.clone();
        let stop = CancellationToken::new();
        let watch = tokio::spawn(file.watch(Duration::from_secs(1), stop.clone()));
        assert_eq!(sent(&token), "Bearer one");
        fs::write(&path, "two").expect("rewrite");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(sent(&token), "Bearer two");
        fs::remove_file(&path).expect("remove");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(sent(&token), "Bearer two", "a missing file keeps the token");
        fs::write(&path, "").expect("empty");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(sent(&token), "Bearer two", "an empty file keeps the token");
        fs::write(&path, "three").expect("rewrite");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(sent(&token), "Bearer three");
        stop.cancel();
        watch.await.expect("watch ends at stop");
    }

    #[test]
    fn pem_files_are_checked_at_start() {
        let dir = Scratch::new("pem");
        let not_pem = dir.file("x.pem", b"hello");
        let err = read_certificates("--tls-ca", &not_pem).expect_err("no cert");
        assert!(
            err.starts_with("--tls-ca ") && err.contains("no PEM certificate"),
            "{err}"
        );
        let err = read_private_key("--tls-key", &not_pem).expect_err("no key");
        assert!(
            err.starts_with("--tls-key ") && err.contains("no PEM private key"),
            "{err}"
        );
        let err = read_certificates("--tls-ca", &dir.0.join("nope.pem")).expect_err("missing");
        assert!(err.contains("nope.pem"), "{err}");
    }
}
