//! What an outbox is: a name clients use, the table behind it, and its policy.
//! Parsed from configuration only; table names never come from a request.

use std::{fmt, str::FromStr, time::Duration};

use outbox_runtime::cli::parse_duration;

use crate::lease::BackoffPolicy;

/// A `schema.table` whose parts passed `^[a-z_][a-z0-9_]{0,62}$`, so quoting them
/// as identifiers is exact and no configuration can inject SQL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableRef {
    schema: String,
    table: String,
}

impl TableRef {
    pub fn new(schema: &str, table: &str) -> Result<Self, String> {
        for part in [schema, table] {
            if !valid_identifier(part) {
                return Err(format!(
                    "invalid identifier {part:?}: expected ^[a-z_][a-z0-9_]{{0,62}}$"
                ));
            }
        }
        Ok(Self {
            schema: schema.to_owned(),
            table: table.to_owned(),
        })
    }

    pub fn schema(&self) -> &str {
        &self.schema
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    /// `"schema"."table"`, ready to splice into a statement.
    pub fn quoted(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.table)
    }

    /// A name for an object that belongs to this table (an index, a trigger),
    /// kept under PostgreSQL's 63-byte limit: a long table name is shortened and
    /// tagged with a hash so two long names never truncate into the same one.
    pub fn object_name(&self, suffix: &str) -> String {
        let full = format!("{}_{}", self.table, suffix);
        if full.len() <= 63 {
            return full;
        }
        let hash = self.table.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let keep = 63 - suffix.len() - 10;
        format!("{}_{:08x}_{}", &self.table[..keep], hash as u32, suffix)
    }
}

impl fmt::Display for TableRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.table)
    }
}

fn valid_identifier(part: &str) -> bool {
    let mut chars = part.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_lowercase())
        && part.len() <= 63
        && chars.all(|c| c == '_' || c.is_ascii_lowercase() || c.is_ascii_digit())
}

/// How an outbox treats failures and history. Its defaults are the flags'
/// (`--max-attempts`, `--backoff-*`, `--retention`), and nowhere else.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxPolicy {
    /// Deliveries before a row is dead-lettered instead of handed out again.
    pub max_attempts: u32,
    pub backoff: BackoffPolicy,
    /// Published rows are kept this long; zero deletes a row when it is acked.
    pub retention: Duration,
}

/// Whether events of one aggregate are handed out one at a time, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ordering {
    /// Any claimable event may go to any worker (`ordering=none`).
    #[default]
    None,
    /// Per-aggregate order (`ordering=aggregate`): only the first unsettled
    /// event of an aggregate is claimable, and only while no other event of
    /// the aggregate is leased.
    Aggregate(Poison),
}

/// What a dead-lettered head does to the rest of its aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Poison {
    /// The aggregate waits until an operator redrives or discards the head
    /// (`poison=block`): no later event overtakes it.
    #[default]
    Block,
    /// The head is set aside and the aggregate goes on (`poison=park`).
    Park,
}

impl Ordering {
    pub fn is_ordered(self) -> bool {
        matches!(self, Self::Aggregate(_))
    }

    /// Whether a dead-lettered head holds its aggregate back.
    pub fn blocks(self) -> bool {
        self == Self::Aggregate(Poison::Block)
    }
}

impl fmt::Display for Ordering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::Aggregate(Poison::Block) => f.write_str("aggregate (poison=block)"),
            Self::Aggregate(Poison::Park) => f.write_str("aggregate (poison=park)"),
        }
    }
}

/// One configured outbox.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxSpec {
    pub name: String,
    pub table: TableRef,
    pub policy: OutboxPolicy,
    pub ordering: Ordering,
}

/// `NAME=SCHEMA.TABLE[:key=value]...` as given on the command line, before the
/// global policy defaults are applied.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxArg {
    pub name: String,
    pub table: TableRef,
    pub max_attempts: Option<u32>,
    pub retention: Option<Duration>,
    pub backoff_base: Option<Duration>,
    pub backoff_factor: Option<f64>,
    pub backoff_max: Option<Duration>,
    pub ordering: Ordering,
}

impl OutboxArg {
    pub fn resolve(&self, defaults: &OutboxPolicy) -> OutboxSpec {
        let backoff = BackoffPolicy {
            base: self.backoff_base.unwrap_or(defaults.backoff.base),
            factor: self.backoff_factor.unwrap_or(defaults.backoff.factor),
            cap: self.backoff_max.unwrap_or(defaults.backoff.cap),
            jitter: defaults.backoff.jitter,
        };
        OutboxSpec {
            name: self.name.clone(),
            table: self.table.clone(),
            policy: OutboxPolicy {
                max_attempts: self.max_attempts.unwrap_or(defaults.max_attempts),
                backoff,
                retention: self.retention.unwrap_or(defaults.retention),
            },
            ordering: self.ordering,
        }
    }
}

impl FromStr for OutboxArg {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let mut parts = raw.split(':');
        let head = parts.next().unwrap_or_default();
        let (name, table) = head
            .split_once('=')
            .ok_or_else(|| format!("{raw:?}: expected NAME=SCHEMA.TABLE"))?;
        let name_ok = !name.is_empty()
            && name.len() <= 63
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !name_ok {
            return Err(format!(
                "{raw:?}: outbox name must be 1-63 characters of [A-Za-z0-9_.-]"
            ));
        }
        let (schema, table) = table.split_once('.').unwrap_or(("public", table));
        let table = TableRef::new(schema, table).map_err(|e| format!("{raw:?}: {e}"))?;
        let mut arg = OutboxArg {
            name: name.to_owned(),
            table,
            max_attempts: None,
            retention: None,
            backoff_base: None,
            backoff_factor: None,
            backoff_max: None,
            ordering: Ordering::None,
        };
        let mut ordered = false;
        let mut poison = None;
        for option in parts {
            let (key, value) = option
                .split_once('=')
                .ok_or_else(|| format!("{raw:?}: option {option:?} must be key=value"))?;
            let bad = |e: &dyn fmt::Display| format!("{raw:?}: {key}: {e}");
            match key {
                "max_attempts" => {
                    let n: u32 = value.parse().map_err(|e| bad(&e))?;
                    if n == 0 {
                        return Err(bad(&"must be at least 1"));
                    }
                    arg.max_attempts = Some(n);
                }
                "retention" => arg.retention = Some(parse_duration(value).map_err(|e| bad(&e))?),
                "backoff_base" => {
                    arg.backoff_base = Some(parse_duration(value).map_err(|e| bad(&e))?)
                }
                "backoff_max" => {
                    arg.backoff_max = Some(parse_duration(value).map_err(|e| bad(&e))?)
                }
                "backoff_factor" => {
                    let f: f64 = value.parse().map_err(|e| bad(&e))?;
                    if !(1.0..=10.0).contains(&f) {
                        return Err(bad(&"must be between 1 and 10"));
                    }
                    arg.backoff_factor = Some(f);
                }
                "ordering" => {
                    ordered = match value {
                        "none" => false,
                        "aggregate" => true,
                        _ => return Err(bad(&"expected none or aggregate")),
                    }
                }
                "poison" => {
                    poison = Some(match value {
                        "block" => Poison::Block,
                        "park" => Poison::Park,
                        _ => return Err(bad(&"expected block or park")),
                    })
                }
                _ => {
                    return Err(format!(
                        "{raw:?}: unknown option {key:?} (max_attempts, retention, backoff_base, backoff_factor, backoff_max, ordering, poison)"
                    ));
                }
            }
        }
        arg.ordering = match (ordered, poison) {
            (true, poison) => Ordering::Aggregate(poison.unwrap_or_default()),
            (false, None) => Ordering::None,
            (false, Some(_)) => {
                return Err(format!(
                    "{raw:?}: poison: only with ordering=aggregate (an unordered outbox never holds events back)"
                ));
            }
        };
        Ok(arg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_strict() {
        assert!(TableRef::new("public", "outbox").is_ok());
        assert!(TableRef::new("sales_2", "_events").is_ok());
        for bad in ["", "Outbox", "out box", "x\";drop", "1abc", &"a".repeat(64)] {
            assert!(TableRef::new("public", bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            TableRef::new("a", "b").map(|t| t.quoted()),
            Ok("\"a\".\"b\"".into())
        );
    }

    #[test]
    fn object_names_fit_and_stay_distinct() {
        let short = TableRef::new("public", "outbox").expect("valid");
        assert_eq!(short.object_name("pending_idx"), "outbox_pending_idx");
        let a = TableRef::new("public", &format!("{}a", "x".repeat(62))).expect("valid");
        let b = TableRef::new("public", &format!("{}b", "x".repeat(62))).expect("valid");
        let (na, nb) = (a.object_name("pending_idx"), b.object_name("pending_idx"));
        assert!(na.len() <= 63 && nb.len() <= 63);
        assert_ne!(na, nb);
    }

    #[test]
    fn outbox_args_parse_with_options() {
        let arg: OutboxArg = "orders=sales.outbox:max_attempts=3:retention=0:backoff_base=250ms"
            .parse()
            .expect("valid");
        assert_eq!(arg.name, "orders");
        assert_eq!(arg.table.to_string(), "sales.outbox");
        let defaults = OutboxPolicy {
            max_attempts: 10,
            backoff: BackoffPolicy {
                base: Duration::from_secs(1),
                factor: 2.0,
                cap: Duration::from_secs(300),
                jitter: 0.2,
            },
            retention: Duration::from_secs(3600),
        };
        let spec = arg.resolve(&defaults);
        assert_eq!(spec.policy.max_attempts, 3);
        assert_eq!(spec.policy.retention, Duration::ZERO);
        assert_eq!(spec.policy.backoff.base, Duration::from_millis(250));
        assert_eq!(spec.policy.backoff.factor, 2.0);

        let bare: OutboxArg = "default=outbox".parse().expect("valid");
        assert_eq!(bare.table.to_string(), "public.outbox");
        assert_eq!(bare.resolve(&defaults).ordering, Ordering::None);
    }

    #[test]
    fn ordering_and_poison_parse() {
        for (raw, ordering) in [
            ("o=outbox:ordering=none", Ordering::None),
            (
                "o=outbox:ordering=aggregate",
                Ordering::Aggregate(Poison::Block),
            ),
            (
                "o=outbox:ordering=aggregate:poison=block",
                Ordering::Aggregate(Poison::Block),
            ),
            (
                "o=outbox:poison=park:ordering=aggregate",
                Ordering::Aggregate(Poison::Park),
            ),
        ] {
            let arg: OutboxArg = raw.parse().expect(raw);
            assert_eq!(arg.ordering, ordering, "{raw}");
        }
        assert!(Ordering::Aggregate(Poison::Block).blocks());
        assert!(!Ordering::Aggregate(Poison::Park).blocks());
        assert!(!Ordering::None.is_ordered());
    }

    #[test]
    fn bad_outbox_args_say_why() {
        for (bad, why) in [
            ("noequals", "expected NAME=SCHEMA.TABLE"),
            ("=public.outbox", "outbox name must be 1-63 characters"),
            ("x y=public.outbox", "outbox name must be 1-63 characters"),
            ("x=Public.outbox", "\"Public\""),
            (
                "x=public.outbox:max_attempts=0",
                "max_attempts: must be at least 1",
            ),
            (
                "x=public.outbox:max_attempts=many",
                "max_attempts: invalid digit",
            ),
            ("x=public.outbox:colour=blue", "unknown option \"colour\""),
            (
                "x=public.outbox:retention=forever",
                "retention: invalid duration",
            ),
            (
                "x=public.outbox:backoff_factor=20",
                "backoff_factor: must be between 1 and 10",
            ),
            (
                "x=public.outbox:nokey",
                "option \"nokey\" must be key=value",
            ),
            (
                "x=public.outbox:ordering=sideways",
                "ordering: expected none or aggregate",
            ),
            (
                "x=public.outbox:ordering=aggregate:poison=drop",
                "poison: expected block or park",
            ),
            (
                "x=public.outbox:poison=park",
                "poison: only with ordering=aggregate",
            ),
            (
                "x=public.outbox:ordering=none:poison=block",
                "poison: only with ordering=aggregate",
            ),
        ] {
            let err = bad.parse::<OutboxArg>().expect_err(bad);
            assert!(err.contains(why), "{bad}: {err:?} does not say {why:?}");
            assert!(
                err.starts_with(&format!("{bad:?}")),
                "{bad}: {err:?} does not quote the argument"
            );
        }
    }
}
