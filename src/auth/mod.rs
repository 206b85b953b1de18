//! Who may call what: bearer tokens and client-certificate names mapped to
//! per-outbox scopes, from a file re-read while serving.
//!
//! The gRPC handlers ask [`Authorizer::check`] first, before they parse or
//! touch anything, so a refused call changes nothing. The file format is
//! [`tokens`]; the task that re-reads it is [`Authorizer::reloader`].

mod tokens;

use std::{fmt, path::PathBuf, sync::Arc, time::Duration};

use arc_swap::ArcSwap;
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Status};

use crate::{lease::OutboxName, metrics::ServerMetrics};

pub use tokens::{Credential, Identity, ParseError, Scope, ScopeKind, Tokens, token_digest};

/// How often the file is read for a change: Kubernetes swaps a Secret's
/// symlink without an event outboxd could wait for, so it is read by path.
pub const RELOAD_POLL: Duration = Duration::from_secs(2);

/// How much of an outbox name a PERMISSION_DENIED message repeats.
const MAX_ECHOED_CHARS: usize = 64;

/// `--auth-tokens`, as configured.
#[derive(Debug, Clone)]
pub struct AuthSettings {
    pub tokens_file: PathBuf,
}

impl AuthSettings {
    /// Reads and parses the file once, so a bad one stops start-up (exit 64).
    /// The error names the flag, the file and the line.
    pub fn check(&self) -> Result<(), String> {
        Authorizer::load(self).map(drop)
    }
}

/// What an RPC needs, checked against the caller's scopes for its outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// ClaimBatch, Ack, Nack, ExtendLease: a `relay:` scope.
    Relay,
    /// GetStats: either kind of scope, since relays and operators both read it.
    Stats,
    /// The OutboxAdmin service: an `admin:` scope.
    Admin,
    /// An OutboxAdmin call about the database rather than one outbox
    /// (GetDatabaseReport): an `admin:` scope for any outbox.
    AnyAdmin,
}

impl Access {
    fn allowed_by(self, scope: &Scope, outbox: &str) -> bool {
        match self {
            Self::Relay => scope.covers(ScopeKind::Relay, outbox),
            Self::Admin => scope.covers(ScopeKind::Admin, outbox),
            Self::AnyAdmin => scope.kind == ScopeKind::Admin,
            Self::Stats => {
                scope.covers(ScopeKind::Relay, outbox) || scope.covers(ScopeKind::Admin, outbox)
            }
        }
    }

    fn needs(self) -> &'static str {
        match self {
            Self::Relay => "a relay scope",
            Self::Admin => "an admin scope",
            Self::AnyAdmin => "an admin scope (for any outbox)",
            Self::Stats => "a relay or admin scope",
        }
    }
}

/// Who made a call: the NAME of its line in the tokens file, or
/// `anonymous` when authorisation is off. For audit lines, never a credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(Arc<str>);

impl Caller {
    pub fn anonymous() -> Self {
        Self(Arc::from("anonymous"))
    }

    pub fn name(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Decides each call; cheap to clone. Without `--auth-tokens` every call is
/// allowed, as `anonymous`.
#[derive(Debug, Clone)]
pub struct Authorizer(Option<Arc<Table>>);

/// The file in force, swapped whole when a new version parses.
#[derive(Debug)]
struct Table {
    file: PathBuf,
    tokens: ArcSwap<Tokens>,
    /// The digest of the file's bytes last read, so an unchanged file is
    /// not parsed (nor a broken one logged) every poll.
    seen: std::sync::Mutex<Seen>,
}

/// What the last read of the file found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Content([u8; 32]),
    Unreadable(String),
}

impl Authorizer {
    /// Every call allowed.
    pub fn open() -> Self {
        Self(None)
    }

    /// Authorisation from `settings`' file, read now.
    pub fn load(settings: &AuthSettings) -> Result<Self, String> {
        let (seen, parsed) = read(&settings.tokens_file);
        let tokens =
            parsed.map_err(|e| format!("--auth-tokens {}: {e}", settings.tokens_file.display()))?;
        Ok(Self(Some(Arc::new(Table {
            file: settings.tokens_file.clone(),
            tokens: ArcSwap::from_pointee(tokens),
            seen: std::sync::Mutex::new(seen),
        }))))
    }

    /// How many identities the file in force names; `None` when open.
    pub fn identities(&self) -> Option<usize> {
        self.0.as_ref().map(|t| t.tokens.load().identities.len())
    }

    /// The caller of `request`, if it may call a method needing `access` on
    /// the outbox named on the wire (empty: `default`). UNAUTHENTICATED
    /// without a credential, with a malformed one or one that matches no
    /// identity; PERMISSION_DENIED for an identity without the scope.
    pub fn check<T>(
        &self,
        access: Access,
        wire_outbox: &str,
        request: &Request<T>,
    ) -> Result<Caller, Status> {
        Ok(self
            .admit_request(request)?
            .require(access, &OutboxName::from_wire(wire_outbox))?)
    }

    /// Who the caller of `request` is, before any scope is asked about: for
    /// a call that answers about several outboxes (ListOutboxes) and shows
    /// each only to a caller that may see it. UNAUTHENTICATED as for
    /// [`Authorizer::check`].
    pub fn admit_request<T>(&self, request: &Request<T>) -> Result<Admitted, Status> {
        let common_name;
        let presented = match request.metadata().get("authorization") {
            Some(header) => Presented::Bearer(bearer(header.as_bytes())),
            None => {
                common_name = crate::tls::peer_common_name(request);
                Presented::Certificate(common_name.as_deref())
            }
        };
        Ok(self.admit(presented)?)
    }

    /// Who `presented` proves to be, before any scope is asked about, so a
    /// caller that needs several outboxes' answers is identified once.
    pub fn admit(&self, presented: Presented<'_>) -> Result<Admitted, Refusal> {
        let Some(table) = &self.0 else {
            return Ok(Admitted(None));
        };
        let tokens = table.tokens.load();
        Ok(Admitted(Some(identify(&tokens, presented)?.clone())))
    }

    /// The task that keeps the file in force current: it re-reads it on
    /// SIGHUP and whenever its content changes (checked every `every`), and
    /// keeps the previous version when a new one does not parse. `None` when
    /// open. The SIGHUP handler is installed now, so a SIGHUP after this
    /// returns reloads instead of ending the process.
    pub fn reloader(
        &self,
        every: Duration,
        metrics: ServerMetrics,
        stop: CancellationToken,
    ) -> std::io::Result<Option<impl Future<Output = ()> + Send + 'static>> {
        let Some(table) = self.0.clone() else {
            return Ok(None);
        };
        let hangup = signal(SignalKind::hangup())?;
        Ok(Some(reload(table, hangup, every, metrics, stop)))
    }
}

async fn reload(
    table: Arc<Table>,
    mut hangup: Signal,
    every: Duration,
    metrics: ServerMetrics,
    stop: CancellationToken,
) {
    loop {
        let forced = tokio::select! {
            () = stop.cancelled() => return,
            Some(()) = hangup.recv() => true,
            () = tokio::time::sleep(every) => false,
        };
        if let Some(result) = table.refresh(forced, if forced { "SIGHUP" } else { "file changed" })
        {
            metrics.auth_reloaded(result);
        }
    }
}

impl Table {
    /// Reads the file and puts it in force if it parses; `forced` re-parses
    /// an unchanged file too. A file that cannot be read or parsed is logged
    /// once per version, and the one in force stays. The outcome, for the
    /// metric; `None` when nothing was read anew.
    fn refresh(&self, forced: bool, trigger: &'static str) -> Option<&'static str> {
        let (now, parsed) = read(&self.file);
        {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if !forced && *seen == now {
                return None;
            }
            *seen = now;
        }
        let file = self.file.display();
        match parsed {
            Ok(tokens) => {
                let identities = tokens.identities.len();
                self.tokens.store(Arc::new(tokens));
                tracing::info!(%file, identities, trigger, "auth tokens reloaded");
                Some("ok")
            }
            Err(Refused::Unreadable(error)) => {
                tracing::warn!(
                    %file,
                    %error,
                    trigger,
                    "auth tokens file cannot be read; the previous version stays in force"
                );
                Some("unreadable")
            }
            Err(Refused::Invalid(error)) => {
                tracing::error!(
                    %file,
                    %error,
                    trigger,
                    "auth tokens file refused; the previous version stays in force"
                );
                Some("invalid")
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error("{0}")]
    Unreadable(String),
    #[error(transparent)]
    Invalid(#[from] ParseError),
}

/// The file's state and, if it can be read and parsed, its identities.
fn read(file: &std::path::Path) -> (Seen, Result<Tokens, Refused>) {
    // A few hundred bytes every two seconds: a blocking read costs less than
    // handing it to another thread.
    match std::fs::read(file) {
        Ok(bytes) => {
            let seen = Seen::Content(Sha256::digest(&bytes).into());
            let parsed = String::from_utf8(bytes)
                .map_err(|_| Refused::Unreadable("the file is not UTF-8 text".to_owned()))
                .and_then(|text| Ok(Tokens::parse(&text)?));
            (seen, parsed)
        }
        Err(e) => (
            Seen::Unreadable(e.to_string()),
            Err(Refused::Unreadable(e.to_string())),
        ),
    }
}

/// A caller whose credential matched an identity of the file in force when
/// it was admitted (or anyone, when authorisation is off).
#[derive(Debug, Clone)]
pub struct Admitted(Option<Identity>);

impl Admitted {
    /// Whether it may make calls needing `access` on `outbox`.
    pub fn may(&self, access: Access, outbox: &OutboxName) -> bool {
        self.0
            .as_ref()
            .is_none_or(|identity| identity.may(access, outbox))
    }

    /// Who it is, for audit lines: its NAME, or `anonymous` when
    /// authorisation is off.
    pub fn caller(&self) -> Caller {
        self.0.as_ref().map_or_else(Caller::anonymous, |identity| {
            Caller(Arc::from(identity.name.as_str()))
        })
    }

    /// Its name if it may, else PERMISSION_DENIED saying what it lacks.
    /// A call about no one outbox ([`Access::AnyAdmin`]) is refused without
    /// naming one: the caller named none.
    pub fn require(&self, access: Access, outbox: &OutboxName) -> Result<Caller, Refusal> {
        let Some(identity) = &self.0 else {
            return Ok(Caller::anonymous());
        };
        if identity.may(access, outbox) {
            return Ok(self.caller());
        }
        if access == Access::AnyAdmin {
            return Err(Refusal::PermissionDenied(format!(
                "{:?} has no admin scope for any outbox, which this call needs",
                identity.name
            )));
        }
        // The name is the client's: echo a bounded part of it, so an absurd
        // one cannot make the reply itself too large.
        let shown: String = outbox.as_str().chars().take(MAX_ECHOED_CHARS).collect();
        let more = if shown.len() < outbox.as_str().len() {
            "…"
        } else {
            ""
        };
        Err(Refusal::PermissionDenied(format!(
            "{:?} has no scope for this call on outbox {shown:?}{more}: it needs {}",
            identity.name,
            access.needs()
        )))
    }
}

/// What a caller presented to prove who it is.
#[derive(Debug, Clone, Copy)]
pub enum Presented<'a> {
    /// A bearer token, or why the `authorization` header that should have
    /// carried one was refused.
    Bearer(Result<&'a str, &'static str>),
    /// No `authorization` header: the verified client certificate's subject
    /// CN, if the connection has one.
    Certificate(Option<&'a str>),
}

/// Why a caller was refused: UNAUTHENTICATED or PERMISSION_DENIED in gRPC,
/// 401 or 403 in HTTP. The message names no credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Unauthenticated(String),
    PermissionDenied(String),
}

impl Refusal {
    pub fn message(&self) -> &str {
        match self {
            Self::Unauthenticated(message) | Self::PermissionDenied(message) => message,
        }
    }
}

impl From<Refusal> for Status {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Unauthenticated(message) => Status::unauthenticated(message),
            Refusal::PermissionDenied(message) => Status::permission_denied(message),
        }
    }
}

impl Identity {
    fn may(&self, access: Access, outbox: &OutboxName) -> bool {
        self.scopes
            .iter()
            .any(|scope| access.allowed_by(scope, outbox.as_str()))
    }
}

/// The identity `presented` proves: a bearer token if the caller sent an
/// `authorization` header, else its client certificate's common name.
fn identify<'t>(tokens: &'t Tokens, presented: Presented<'_>) -> Result<&'t Identity, Refusal> {
    let refused = |message: &str| Refusal::Unauthenticated(message.to_owned());
    match presented {
        Presented::Bearer(Err(malformed)) => Err(refused(malformed)),
        Presented::Bearer(Ok(token)) => {
            by_token(tokens, token).ok_or_else(|| refused("the bearer token matches no identity"))
        }
        Presented::Certificate(Some(name)) => tokens
            .identities
            .iter()
            .find(|i| matches!(&i.credential, Credential::CommonName(cn) if cn == name))
            .ok_or_else(|| refused("the client certificate's name matches no identity")),
        Presented::Certificate(None) => Err(refused(
            "no credential: send `authorization: Bearer <token>` metadata",
        )),
    }
}

/// The token of an `authorization` value `Bearer <token>`, the scheme in any
/// case; anything else is refused without saying what was sent.
pub fn bearer(header: &[u8]) -> Result<&str, &'static str> {
    const MALFORMED: &str = "malformed authorization: expected `Bearer <token>`";
    let text = std::str::from_utf8(header).map_err(|_| MALFORMED)?;
    let (scheme, token) = text.split_once(' ').ok_or(MALFORMED)?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer")
        || token.is_empty()
        || token.contains(char::is_whitespace)
    {
        return Err(MALFORMED);
    }
    Ok(token)
}

/// The identity whose hash matches `token`, comparing with every entry in
/// constant time: how long it takes says nothing about how close a guess was.
fn by_token<'t>(tokens: &'t Tokens, token: &str) -> Option<&'t Identity> {
    let presented = token_digest(token);
    let mut found = u64::MAX;
    for (index, identity) in tokens.identities.iter().enumerate() {
        if let Credential::TokenSha256(digest) = &identity.credential {
            found.conditional_assign(&(index as u64), presented.ct_eq(digest));
        }
    }
    usize::try_from(found)
        .ok()
        .and_then(|index| tokens.identities.get(index))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> Authorizer {
        Authorizer(Some(Arc::new(Table {
            file: PathBuf::from("/nonexistent"),
            tokens: ArcSwap::from_pointee(Tokens::parse(text).expect("test file")),
            seen: std::sync::Mutex::new(Seen::Unreadable(String::new())),
        })))
    }

    fn line(name: &str, token: &str, scopes: &str) -> String {
        format!(
            "{name} sha256:{} {scopes}\n",
            hex::encode(token_digest(token))
        )
    }

    fn with(header: Option<&str>) -> Request<()> {
        let mut request = Request::new(());
        if let Some(value) = header {
            request
                .metadata_mut()
                .insert("authorization", value.parse().expect("ascii"));
        }
        request
    }

    #[test]
    fn open_allows_everything_as_anonymous() {
        let caller = Authorizer::open()
            .check(Access::Admin, "x", &with(None))
            .expect("open");
        assert_eq!(caller.name(), "anonymous");
    }

    #[test]
    fn a_database_call_takes_an_admin_scope_for_any_outbox_and_no_relay_scope() {
        let auth = table(&format!(
            "{}{}{}",
            line("ops-orders", "to", "admin:orders"),
            line("ops", "tops", "admin:*"),
            line("all", "tall", "relay:*")
        ));
        let code = |header: &str| {
            auth.check(Access::AnyAdmin, "", &with(Some(header)))
                .map(|c| c.name().to_owned())
                .map_err(|s| s.code())
        };
        assert_eq!(code("Bearer to"), Ok("ops-orders".into()));
        assert_eq!(code("Bearer tops"), Ok("ops".into()));
        assert_eq!(code("Bearer tall"), Err(tonic::Code::PermissionDenied));
        assert_eq!(code("Bearer nope"), Err(tonic::Code::Unauthenticated));
        // The call named no outbox, so the refusal names none either.
        let denied = auth
            .check(Access::AnyAdmin, "", &with(Some("Bearer tall")))
            .expect_err("relay:* only");
        assert_eq!(
            denied.message(),
            r#""all" has no admin scope for any outbox, which this call needs"#
        );
    }

    #[test]
    fn tokens_are_matched_to_their_identity_and_scopes() {
        let auth = table(&format!(
            "{}{}{}",
            line("relay-a", "ta", "relay:a"),
            line("all", "tall", "relay:*"),
            line("ops", "tops", "admin:default")
        ));
        let code = |access, outbox: &str, header: Option<&str>| {
            auth.check(access, outbox, &with(header))
                .map(|c| c.name().to_owned())
                .map_err(|s| s.code())
        };
        use tonic::Code::{PermissionDenied, Unauthenticated};
        assert_eq!(
            code(Access::Relay, "a", Some("Bearer ta")),
            Ok("relay-a".into())
        );
        assert_eq!(
            code(Access::Relay, "a", Some("bearer  ta ")),
            Ok("relay-a".into())
        );
        assert_eq!(
            code(Access::Stats, "a", Some("Bearer ta")),
            Ok("relay-a".into())
        );
        assert_eq!(
            code(Access::Relay, "b", Some("Bearer ta")),
            Err(PermissionDenied)
        );
        assert_eq!(
            code(Access::Admin, "a", Some("Bearer ta")),
            Err(PermissionDenied)
        );
        assert_eq!(
            code(Access::Relay, "zz", Some("Bearer tall")),
            Ok("all".into())
        );
        assert_eq!(
            code(Access::Admin, "", Some("Bearer tops")),
            Ok("ops".into())
        );
        assert_eq!(
            code(Access::Stats, "", Some("Bearer tops")),
            Ok("ops".into())
        );
        assert_eq!(
            code(Access::Relay, "", Some("Bearer tops")),
            Err(PermissionDenied)
        );
        let long = "n".repeat(10_000);
        let denied = auth
            .check(Access::Relay, &long, &with(Some("Bearer ta")))
            .expect_err("relay:a on another outbox");
        assert!(denied.message().len() < 200, "{}", denied.message());
        for bad in [
            None,
            Some("Bearer nope"),
            Some("Basic ta"),
            Some("Bearer"),
            Some("ta"),
            Some("Bearer a b"),
        ] {
            assert_eq!(
                code(Access::Relay, "a", bad),
                Err(Unauthenticated),
                "{bad:?}"
            );
        }
    }
}
