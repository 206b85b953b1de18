//! Identifiers that cross the API, each parsed once at the edge.

use std::fmt;

use uuid::Uuid;

/// A configured outbox name; the empty name on the wire means `default`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OutboxName(String);

impl OutboxName {
    pub const DEFAULT: &'static str = "default";

    /// Wire form to name: empty selects the default outbox. Whether the name is
    /// configured is the registry's question (NOT_FOUND), not a syntax error.
    pub fn from_wire(raw: &str) -> Self {
        if raw.is_empty() {
            Self(Self::DEFAULT.to_owned())
        } else {
            Self(raw.to_owned())
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for OutboxName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The worker that holds a lease, recorded on claimed rows for operators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerId(String);

impl WorkerId {
    pub const MAX_CHARS: usize = 200;

    pub fn parse(raw: &str) -> Result<Self, &'static str> {
        if raw.trim().is_empty() {
            return Err("is required");
        }
        if raw.chars().count() > Self::MAX_CHARS {
            return Err("must be at most 200 characters");
        }
        if raw.chars().any(char::is_control) {
            return Err("must not contain control characters");
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Fences one claimed batch: settling a message requires the lease it was claimed under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseId(Uuid);

impl LeaseId {
    pub fn generate() -> Self {
        Self(Uuid::new_v4())
    }

    pub fn parse(raw: &str) -> Result<Self, &'static str> {
        if raw.is_empty() {
            return Err("is required");
        }
        Uuid::try_parse(raw).map(Self).map_err(|_| "must be a UUID")
    }

    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl From<Uuid> for LeaseId {
    fn from(id: Uuid) -> Self {
        Self(id)
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// An event id: the producer's primary key and the consumers' dedup key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(Uuid);

impl MessageId {
    pub fn parse(raw: &str) -> Result<Self, &'static str> {
        Uuid::try_parse(raw).map(Self).map_err(|_| "must be a UUID")
    }

    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl From<Uuid> for MessageId {
    fn from(id: Uuid) -> Self {
        Self(id)
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_outbox_means_default() {
        assert_eq!(OutboxName::from_wire("").as_str(), "default");
        assert_eq!(OutboxName::from_wire("orders").as_str(), "orders");
    }

    #[test]
    fn worker_id_limits() {
        assert!(WorkerId::parse("").is_err());
        assert!(WorkerId::parse("   ").is_err());
        assert!(WorkerId::parse(&"é".repeat(200)).is_ok());
        assert!(WorkerId::parse(&"é".repeat(201)).is_err());
        assert!(WorkerId::parse("a\0b").is_err());
        assert!(WorkerId::parse("relay-7f9c-1").is_ok());
    }

    #[test]
    fn ids_must_be_uuids() {
        assert!(LeaseId::parse("").is_err());
        assert!(LeaseId::parse("nope").is_err());
        assert!(MessageId::parse("6f1c2b0e-8a4b-4c3e-9d1f-0a2b3c4d5e6f").is_ok());
    }
}
