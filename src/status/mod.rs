//! The status page (`--admin-http-listen`): one read-only HTML page for
//! whoever is on call, with each outbox's figures and what the database
//! watchdog found, read when the page is loaded and refreshed by the browser.
//!
//! It has a listener of its own rather than a path on the metrics port: that
//! port is scraped in plaintext by whatever Prometheus runs, while this page
//! takes an admin credential and shows who holds the database's transactions
//! open, so it gets the API's TLS and can be exposed (or not) on its own.
//!
//! - [`listener`] accepts connections, over TLS when the API has it, and
//!   says which client certificate a connection came with;
//! - [`view`] gathers the figures an admin may see;
//! - [`page`] renders them as a self-contained page (no scripts, fonts or
//!   anything fetched from elsewhere).

mod listener;
mod page;
mod view;

use std::time::Duration;

use axum::{
    Extension, Router,
    extract::{ConnectInfo, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{Html, IntoResponse, Response},
    routing::get,
};
use base64::Engine as _;
use outbox_runtime::http;
use tokio_util::sync::CancellationToken;

use crate::{
    auth::{Access, Authorizer, Presented, Refusal, bearer},
    connections::CappedListener,
    lease::OutboxName,
    metrics::ServerMetrics,
    service::AdminService,
    tls::ServerTls,
};

pub use listener::Peer;

/// How often the page asks the browser to load it again.
pub const REFRESH: Duration = Duration::from_secs(10);

/// What the page reads from and who may read it.
#[derive(Debug, Clone)]
pub struct StatusPage {
    pub admin: AdminService,
    pub authorizer: Authorizer,
    pub metrics: ServerMetrics,
}

/// Serves the page on `listener` until `stop`; over TLS with `tls`. A
/// connection that sends no request header within
/// [`outbox_runtime::http::HEADER_READ_TIMEOUT`] is closed.
pub async fn serve(
    listener: CappedListener,
    tls: Option<ServerTls>,
    page: StatusPage,
    stop: CancellationToken,
) {
    let app = Router::new()
        .route("/", get(status))
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "not found: the status page is at /\n",
            )
        })
        .with_state(page);
    let with_peer = |peer: Peer| app.clone().layer(Extension(ConnectInfo(peer)));
    match tls {
        None => http::serve(listener, |_, _| with_peer(Peer::default()), stop).await,
        Some(tls) => {
            let listener = listener::TlsListener::new(listener, &tls);
            http::serve(listener, |io, _| with_peer(Peer::of(io)), stop).await;
        }
    }
}

/// `GET /`: the page, when the caller may read it.
async fn status(
    State(page): State<StatusPage>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    headers: HeaderMap,
) -> Response {
    let decoded;
    let presented = match headers.get(header::AUTHORIZATION) {
        Some(value) => {
            decoded = credential(value.as_bytes());
            Presented::Bearer(decoded.as_deref().map_err(|e| *e))
        }
        None => Presented::Certificate(peer.common_name.as_deref()),
    };
    // About the database as a whole, like GetDatabaseReport: an admin scope
    // for any outbox opens it; each outbox is shown to its admins only.
    let admitted = match page.authorizer.admit(presented).and_then(|admitted| {
        admitted.require(Access::AnyAdmin, &OutboxName::from_wire(""))?;
        Ok(admitted)
    }) {
        Ok(admitted) => admitted,
        Err(refusal) => return refused(&page.metrics, &refusal),
    };
    let visible = |name: &str| admitted.may(Access::Admin, &OutboxName::from_wire(name));
    let view = view::gather(&page.admin, &page.metrics, visible).await;
    let mut response = Html(page::render(&view, REFRESH).into_string()).into_response();
    secure(response.headers_mut());
    response
}

/// The token in an `authorization` value: `Bearer <token>` for scripts, or
/// `Basic` with the token as the password (any user name) for browsers,
/// which ask for it in their own dialog.
fn credential(value: &[u8]) -> Result<String, &'static str> {
    const MALFORMED: &str = "malformed authorization: expected `Bearer <token>`, or Basic with the token as the password";
    let Some(encoded) = value
        .strip_prefix(b"Basic ")
        .or_else(|| value.strip_prefix(b"basic "))
    else {
        return bearer(value).map(str::to_owned);
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim_ascii())
        .map_err(|_| MALFORMED)?;
    let text = String::from_utf8(decoded).map_err(|_| MALFORMED)?;
    let (_user, token) = text.split_once(':').ok_or(MALFORMED)?;
    if token.is_empty() || token.contains(char::is_whitespace) {
        return Err(MALFORMED);
    }
    Ok(token.to_owned())
}

/// 401 (with the challenge that makes a browser ask) or 403, counted like
/// the API's refusals; the message names no credential.
fn refused(metrics: &ServerMetrics, refusal: &Refusal) -> Response {
    let (status, code) = match refusal {
        Refusal::Unauthenticated(_) => (StatusCode::UNAUTHORIZED, tonic::Code::Unauthenticated),
        Refusal::PermissionDenied(_) => (StatusCode::FORBIDDEN, tonic::Code::PermissionDenied),
    };
    metrics.auth_refused("StatusPage", code);
    let mut response = (
        status,
        format!(
            "{}\nThe status page needs an admin token: as the password (any user name), or `authorization: Bearer <token>`.\n",
            refusal.message()
        ),
    )
        .into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(r#"Basic realm="outboxd status", charset="UTF-8""#),
        );
    }
    secure(response.headers_mut());
    response
}

/// Nothing on the page is to be cached, framed, or allowed to load anything
/// (it has no scripts and its style is inline).
fn secure(headers: &mut HeaderMap) {
    for (name, value) in [
        (header::CACHE_CONTROL, "no-store"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_comes_as_bearer_or_as_the_basic_password() {
        let basic = |text: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(text)
            )
        };
        assert_eq!(credential(b"Bearer tok").as_deref(), Ok("tok"));
        assert_eq!(
            credential(basic("ops:tok").as_bytes()).as_deref(),
            Ok("tok")
        );
        assert_eq!(credential(basic(":tok").as_bytes()).as_deref(), Ok("tok"));
        assert_eq!(credential(basic("a:b:c").as_bytes()).as_deref(), Ok("b:c"));
        for bad in [
            basic("ops:").into_bytes(),
            basic("no-colon").into_bytes(),
            b"Basic !!!".to_vec(),
            b"Digest x".to_vec(),
            b"tok".to_vec(),
        ] {
            assert!(
                credential(&bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(&bad)
            );
        }
    }
}
