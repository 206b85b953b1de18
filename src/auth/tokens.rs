//! The `--auth-tokens` file: one identity a line, `NAME CREDENTIAL SCOPE...`,
//! parsed whole or not at all. Nothing here echoes a credential: an error
//! names the line and what is wrong, since a misplaced token would otherwise
//! end up in the logs.

use std::{collections::HashMap, fmt};

use sha2::{Digest, Sha256};

/// One line of the file: who, proved how, allowed what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub credential: Credential,
    pub scopes: Vec<Scope>,
}

/// How a caller proves to be an identity.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Credential {
    /// `sha256:<hex>`: the SHA-256 of a bearer token, so the file never
    /// holds a token that works.
    TokenSha256([u8; 32]),
    /// `cn:<name>`: a mutual-TLS client certificate's subject common name.
    CommonName(String),
}

impl fmt::Debug for Credential {
    // Even a hash helps an attacker with a guess list: not in debug output.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TokenSha256(_) => f.write_str("TokenSha256(..)"),
            Self::CommonName(name) => f.debug_tuple("CommonName").field(name).finish(),
        }
    }
}

/// What a scope allows: the relay's calls, or the operator's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopeKind {
    /// `relay:` ClaimBatch, Ack, Nack, ExtendLease, GetStats.
    Relay,
    /// `admin:` the OutboxAdmin service, and GetStats.
    Admin,
}

impl ScopeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Relay => "relay",
            Self::Admin => "admin",
        }
    }
}

/// `KIND:OUTBOX`; `None` is `*`, every outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    pub kind: ScopeKind,
    pub outbox: Option<String>,
}

impl Scope {
    pub fn covers(&self, kind: ScopeKind, outbox: &str) -> bool {
        self.kind == kind && self.outbox.as_deref().is_none_or(|o| o == outbox)
    }
}

/// A whole file, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tokens {
    pub identities: Vec<Identity>,
}

/// Why a file was refused: the first bad line and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct ParseError {
    pub line: usize,
    pub reason: String,
}

/// The digest a presented bearer token is compared by.
pub fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Tokens {
    /// Parses the file's text: `#` starts a comment, blank lines are ignored,
    /// fields are separated by whitespace. Names and credentials must be unique
    /// (a credential on two lines would make the caller's identity ambiguous).
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let mut identities: Vec<Identity> = Vec::new();
        let mut names: HashMap<String, usize> = HashMap::new();
        let mut credentials: HashMap<Credential, usize> = HashMap::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let content = raw.split_once('#').map_or(raw, |(before, _)| before);
            let mut fields = content.split_whitespace();
            let Some(name) = fields.next() else {
                continue;
            };
            let fail = |reason: String| ParseError { line, reason };
            let credential = fields.next().ok_or_else(|| {
                fail(format!(
                    "{name:?} has no credential (sha256:<64 hex> or cn:<name>) and no scope"
                ))
            })?;
            let credential = parse_credential(credential).map_err(fail)?;
            let scopes = fields
                .map(parse_scope)
                .collect::<Result<Vec<_>, _>>()
                .map_err(fail)?;
            if scopes.is_empty() {
                return Err(fail(format!(
                    "{name:?} has no scope (relay:<outbox> or admin:<outbox>)"
                )));
            }
            if let Some(first) = names.insert(name.to_owned(), line) {
                return Err(fail(format!(
                    "duplicate name {name:?} (first on line {first})"
                )));
            }
            if let Some(first) = credentials.insert(credential.clone(), line) {
                return Err(fail(format!(
                    "{name:?} has the same credential as line {first}"
                )));
            }
            identities.push(Identity {
                name: name.to_owned(),
                credential,
                scopes,
            });
        }
        Ok(Self { identities })
    }
}

/// Never echoes the field: a token pasted where its hash belongs stays out of logs.
fn parse_credential(field: &str) -> Result<Credential, String> {
    if let Some(hex_digest) = field.strip_prefix("sha256:") {
        let mut digest = [0u8; 32];
        return match hex::decode_to_slice(hex_digest, &mut digest) {
            Ok(()) => Ok(Credential::TokenSha256(digest)),
            Err(_) => Err(format!(
                "the sha256: credential is not 64 hex digits ({} characters; hash the token \
                 with `printf %s \"$TOKEN\" | sha256sum`)",
                hex_digest.chars().count()
            )),
        };
    }
    if let Some(name) = field.strip_prefix("cn:") {
        if name.is_empty() {
            return Err("the cn: credential names no common name".to_owned());
        }
        return Ok(Credential::CommonName(name.to_owned()));
    }
    Err("the credential must be sha256:<64 hex> or cn:<name>".to_owned())
}

fn parse_scope(field: &str) -> Result<Scope, String> {
    let Some((kind, outbox)) = field.split_once(':') else {
        return Err(format!(
            "scope {field:?} is not KIND:OUTBOX (relay:<outbox> or admin:<outbox>)"
        ));
    };
    let kind = match kind {
        "relay" => ScopeKind::Relay,
        "admin" => ScopeKind::Admin,
        other => {
            return Err(format!(
                "unknown scope kind {other:?} in {field:?} (relay or admin)"
            ));
        }
    };
    let outbox = match outbox {
        "" => return Err(format!("scope {field:?} names no outbox (use * for all)")),
        "*" => None,
        name => Some(name.to_owned()),
    };
    Ok(Scope { kind, outbox })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn error(text: &str) -> ParseError {
        Tokens::parse(text).expect_err("the file is refused")
    }

    #[test]
    fn a_file_with_comments_and_blank_lines_parses() {
        let text = format!(
            "# relays\n\n  relay-a  sha256:{HASH}  relay:a relay:b # two outboxes\n\
             ops\tcn:ops.example.com\tadmin:*\n   \n# end\n"
        );
        let tokens = Tokens::parse(&text).expect("a good file");
        assert_eq!(tokens.identities.len(), 2);
        let relay = &tokens.identities[0];
        assert_eq!(relay.name, "relay-a");
        assert_eq!(
            relay.credential,
            Credential::TokenSha256(token_digest("test"))
        );
        assert!(relay.scopes[0].covers(ScopeKind::Relay, "a"));
        assert!(relay.scopes[1].covers(ScopeKind::Relay, "b"));
        assert!(!relay.scopes[0].covers(ScopeKind::Admin, "a"));
        assert!(!relay.scopes.iter().any(|s| s.covers(ScopeKind::Relay, "c")));
        let ops = &tokens.identities[1];
        assert_eq!(
            ops.credential,
            Credential::CommonName("ops.example.com".into())
        );
        assert_eq!(ops.scopes[0].outbox, None);
        assert!(ops.scopes[0].covers(ScopeKind::Admin, "anything"));
        assert!(!ops.scopes[0].covers(ScopeKind::Relay, "anything"));
    }

    #[test]
    fn an_empty_file_has_no_identities() {
        assert!(
            Tokens::parse("# nobody yet\n\n")
                .expect("ok")
                .identities
                .is_empty()
        );
    }

    #[test]
    fn each_error_names_its_line_and_what_is_wrong() {
        let ok = format!("a sha256:{HASH} relay:a\n");
        let cases: &[(String, &str)] = &[
            (format!("{ok}b sha256:abc relay:a"), "not 64 hex digits"),
            (
                format!("{ok}b sha256:{} relay:a", "zz".repeat(32)),
                "not 64 hex digits",
            ),
            (format!("{ok}b token123 relay:a"), "sha256:<64 hex> or cn:"),
            (format!("{ok}b cn: relay:a"), "no common name"),
            (
                format!("{ok}b cn:x publish:a"),
                "unknown scope kind \"publish\"",
            ),
            (format!("{ok}b cn:x relay"), "not KIND:OUTBOX"),
            (format!("{ok}b cn:x relay:"), "names no outbox"),
            (format!("{ok}b cn:x"), "no scope"),
            (format!("{ok}b"), "no credential"),
            (
                format!("{ok}a cn:x relay:a"),
                "duplicate name \"a\" (first on line 1)",
            ),
            (
                format!("{ok}b sha256:{HASH} relay:b"),
                "same credential as line 1",
            ),
        ];
        for (text, says) in cases {
            let err = error(text);
            assert_eq!(err.line, 2, "{text:?}: {err}");
            assert!(err.to_string().starts_with("line 2: "), "{err}");
            assert!(err.reason.contains(says), "{text:?}: {err}");
        }
    }

    #[test]
    fn an_error_never_repeats_the_credential() {
        let token = "s3cr3t-token-pasted-by-mistake";
        for text in [
            format!("a {token} relay:a"),
            format!("a sha256:{token} relay:a"),
        ] {
            let err = error(&text);
            assert!(!err.to_string().contains(token), "{err}");
        }
    }

    #[test]
    fn debug_output_hides_token_hashes() {
        let tokens = Tokens::parse(&format!("a sha256:{HASH} relay:a")).expect("ok");
        assert!(!format!("{tokens:?}").contains(&HASH[..16]));
    }
}
