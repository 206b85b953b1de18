//! A channel to outboxd set up the way a relay worker needs it: TLS when the
//! address is `https://` (checked against a given CA, or else the system's
//! roots), and a bearer token on every call when outboxd checks tokens
//! (`--auth-tokens`).

use std::{
    fmt,
    sync::{Arc, PoisonError, RwLock},
    time::Duration,
};

use tonic::{
    Request, Status,
    metadata::{AsciiMetadataValue, MetadataValue},
    service::{Interceptor, interceptor::InterceptedService},
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity},
};

use crate::pb::outbox_service_client::OutboxServiceClient;

/// The largest response a client accepts. outboxd keeps a claim within
/// `--max-claim-bytes` (3 MiB) but hands out one larger event alone, up to
/// `--max-message-bytes` (8 MiB by default); gRPC's default limit of 4 MiB
/// would refuse that claim and leave the event to expire and be redelivered
/// until it is dead-lettered. This bound leaves room to raise the server's
/// limit without touching the workers.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// The client [`connect_lazy_with`] returns: every call passes [`Credentials`].
pub type AuthClient = OutboxServiceClient<InterceptedService<Channel, Credentials>>;

/// A client whose channel connects on first use and reconnects by itself;
/// HTTP/2 keep-alives find a silently dead connection while it is idle. The
/// error names the bad address.
pub fn connect_lazy(server: &str) -> Result<OutboxServiceClient<Channel>, String> {
    let channel = endpoint(server, None)?.connect_lazy();
    Ok(OutboxServiceClient::new(channel).max_decoding_message_size(MAX_RESPONSE_BYTES))
}

/// [`connect_lazy`] with TLS (`tls`; an `https://` address without it trusts
/// the system's roots) and the credentials every call carries. Errors say
/// which part is wrong and never contain key material or the token.
pub fn connect_lazy_with(
    server: &str,
    tls: Option<&ClientTls>,
    credentials: Credentials,
) -> Result<AuthClient, String> {
    let channel = endpoint(server, tls)?.connect_lazy();
    Ok(OutboxServiceClient::with_interceptor(channel, credentials)
        .max_decoding_message_size(MAX_RESPONSE_BYTES))
}

/// The channel under [`connect_lazy_with`], for a client of another service
/// (`outboxctl` calls OutboxAdmin too) with the same TLS and limits.
pub fn channel_lazy(server: &str, tls: Option<&ClientTls>) -> Result<Channel, String> {
    Ok(endpoint(server, tls)?.connect_lazy())
}

/// The token in a `--token-file`: the file's text with surrounding whitespace
/// trimmed (a trailing newline from `echo` or an editor is not part of it).
/// The error never contains the file's text.
pub fn read_token(path: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("{}: the file is empty", path.display()));
    }
    Ok(token.to_owned())
}

fn endpoint(server: &str, tls: Option<&ClientTls>) -> Result<Endpoint, String> {
    let endpoint =
        Channel::from_shared(server.to_owned()).map_err(|e| format!("{server:?}: {e}"))?;
    let https = endpoint.uri().scheme_str() == Some("https");
    let endpoint = match (https, tls) {
        (true, tls) => {
            let system = ClientTls::system_roots();
            let tls = tls.unwrap_or(&system);
            endpoint.tls_config(tls.config()).map_err(|e| {
                let why = source_chain(&e);
                // tonic's words for an empty system store (its error type is private).
                if tls.ca.is_none() && why.contains("no native certs found") {
                    format!(
                        "{server:?}: no CA certificate given and no system roots found: \
                         give outboxd's CA certificate, or point SSL_CERT_FILE at a PEM bundle"
                    )
                } else {
                    format!("{server:?}: TLS set-up failed: {why}")
                }
            })?
        }
        (false, Some(_)) => {
            return Err(format!("{server:?}: TLS settings need an https:// address"));
        }
        (false, None) => endpoint,
    };
    Ok(endpoint
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true))
}

/// tonic's transport error says "transport error"; the cause is in its sources.
fn source_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// How the client checks outboxd's certificate, and the certificate it shows
/// for mutual TLS. PEM throughout.
#[derive(Clone)]
pub struct ClientTls {
    /// `None`: the system's roots.
    ca: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl ClientTls {
    /// Trusts only `ca_pem` for the server's certificate.
    pub fn new(ca_pem: Vec<u8>) -> Self {
        Self {
            ca: Some(ca_pem),
            identity: None,
        }
    }

    /// Trusts the system's roots, so that an outboxd with a publicly signed
    /// certificate needs no CA file: the platform's store, read by
    /// rustls-native-certs when the channel is built, or the PEM bundle
    /// named by `SSL_CERT_FILE` (and the directories in `SSL_CERT_DIR`) in
    /// its place.
    pub fn system_roots() -> Self {
        Self {
            ca: None,
            identity: None,
        }
    }

    /// Presents `cert_pem` (with its `key_pem`) to the server: mutual TLS.
    pub fn with_identity(self, cert_pem: Vec<u8>, key_pem: Vec<u8>) -> Self {
        Self {
            identity: Some((cert_pem, key_pem)),
            ..self
        }
    }

    fn config(&self) -> ClientTlsConfig {
        let config = match &self.ca {
            Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)),
            None => ClientTlsConfig::new().with_native_roots(),
        };
        match &self.identity {
            Some((cert, key)) => config.identity(Identity::from_pem(cert, key)),
            None => config,
        }
    }
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key stays out of logs and panics.
        f.debug_struct("ClientTls")
            .field("system_roots", &self.ca.is_none())
            .field("mutual", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

/// A bearer token that can be replaced while calls are using it: a rotated
/// token file reaches the next call without a reconnect. Its `Debug` shows
/// nothing of the token.
#[derive(Clone)]
pub struct BearerToken(Arc<RwLock<AsciiMetadataValue>>);

impl BearerToken {
    /// The `authorization` value for `token`; an error for a token that cannot
    /// be a header value (the message does not contain it).
    pub fn new(token: &str) -> Result<Self, String> {
        Ok(Self(Arc::new(RwLock::new(header(token)?))))
    }

    /// Sends `token` from the next call on; on error the old one stays.
    pub fn replace(&self, token: &str) -> Result<(), String> {
        let value = header(token)?;
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = value;
        Ok(())
    }

    /// Whether `token` is the one being sent: a re-read file that has not
    /// changed is not a change.
    pub fn is(&self, token: &str) -> bool {
        self.value().as_encoded_bytes().strip_prefix(b"Bearer ") == Some(token.as_bytes())
    }

    fn value(&self) -> AsciiMetadataValue {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

fn header(token: &str) -> Result<AsciiMetadataValue, String> {
    if token.is_empty() {
        return Err("the token is empty".into());
    }
    // RFC 6750's token68 is visible ASCII; a space or a control character
    // would make another header or none.
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("the token has characters other than visible ASCII".into());
    }
    let mut value = MetadataValue::try_from(format!("Bearer {token}"))
        .map_err(|_| "the token cannot be a header value".to_owned())?;
    // Kept out of HTTP/2 header compression tables and debug output.
    value.set_sensitive(true);
    Ok(value)
}

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BearerToken(..)")
    }
}

/// What every call carries: `authorization: Bearer <token>`, or nothing.
#[derive(Debug, Clone, Default)]
pub struct Credentials(Option<BearerToken>);

impl Credentials {
    pub fn none() -> Self {
        Self(None)
    }

    pub fn bearer(token: BearerToken) -> Self {
        Self(Some(token))
    }
}

impl Interceptor for Credentials {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(token) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", token.value());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_goes_in_the_authorization_header_and_can_be_replaced() {
        let token = BearerToken::new("abc").expect("valid");
        let mut credentials = Credentials::bearer(token.clone());
        let sent = |c: &mut Credentials| {
            c.call(Request::new(()))
                .expect("passes")
                .metadata()
                .get("authorization")
                .map(|v| v.to_str().expect("ascii").to_owned())
        };
        assert_eq!(sent(&mut credentials).as_deref(), Some("Bearer abc"));
        token.replace("def").expect("valid");
        assert_eq!(sent(&mut credentials).as_deref(), Some("Bearer def"));
        assert!(token.is("def") && !token.is("abc"));
        for bad in ["bad\ntoken", "two words", "tö", ""] {
            assert!(token.replace(bad).is_err(), "{bad:?}");
        }
        assert_eq!(sent(&mut credentials).as_deref(), Some("Bearer def"));
        assert_eq!(sent(&mut Credentials::none()), None);
        assert!(!format!("{token:?}{credentials:?}").contains("def"));
    }

    #[tokio::test]
    async fn https_without_a_ca_trusts_the_system_roots_and_http_refuses_tls_settings() {
        // The roots are read when the channel is built: where the system has
        // none, the error says what to give instead.
        for tls in [None, Some(&ClientTls::system_roots())] {
            if let Err(err) = connect_lazy_with("https://x:1", tls, Credentials::none()) {
                assert!(
                    err.contains("no system roots found") && err.contains("SSL_CERT_FILE"),
                    "{err}"
                );
            }
        }
        assert!(format!("{:?}", ClientTls::system_roots()).contains("system_roots: true"));
        let tls = ClientTls::new(Vec::new());
        let err = connect_lazy_with("http://x:1", Some(&tls), Credentials::none()).expect_err("");
        assert!(err.contains("https://"), "{err}");
    }
}
