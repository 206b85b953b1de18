//! A channel to outboxd set up the way a relay worker needs it: TLS when the
//! address is `https://`, and a bearer token on every call when outboxd
//! checks tokens (`--auth-tokens`).

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

/// [`connect_lazy`] with TLS (`tls`, which an `https://` address needs) and
/// the credentials every call carries. Errors say which part is wrong and never
/// contain key material or the token.
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
        (true, Some(tls)) => endpoint
            .tls_config(tls.config())
            .map_err(|e| format!("{server:?}: TLS set-up failed: {}", source_chain(&e)))?,
        // tonic would fall back to the system roots, which this build does not
        // include (no `tls-native-roots`): every handshake would fail.
        (true, None) => return Err(format!("{server:?}: https:// needs a CA certificate")),
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
    ca: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl ClientTls {
    /// Trusts only `ca_pem` for the server's certificate.
    pub fn new(ca_pem: Vec<u8>) -> Self {
        Self {
            ca: ca_pem,
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
        let config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca));
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

    #[test]
    fn https_needs_tls_settings_and_http_refuses_them() {
        let tls = ClientTls::new(Vec::new());
        let err = connect_lazy_with("https://x:1", None, Credentials::none()).expect_err("ca");
        assert!(err.contains("CA certificate"), "{err}");
        let err = connect_lazy_with("http://x:1", Some(&tls), Credentials::none()).expect_err("");
        assert!(err.contains("https://"), "{err}");
    }
}
