//! Who may call what: bearer tokens and client-certificate names mapped to
//! per-outbox scopes, from a file re-read while serving.

use std::path::PathBuf;

/// `--auth-tokens`, as configured.
#[derive(Debug, Clone)]
pub struct AuthSettings {
    pub tokens_file: PathBuf,
}

impl AuthSettings {
    /// Reads and parses the file once, so a bad one stops start-up (exit 64).
    pub fn check(&self) -> Result<(), String> {
        // Filled in by the authorisation change.
        Ok(())
    }
}
