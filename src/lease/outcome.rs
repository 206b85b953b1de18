//! How one settle attempt (ack, nack, extend) on one row becomes an outcome.

use super::MessageId;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Acked, requeued or extended.
    Ok,
    /// An ack repeated under the same lease: nothing to do.
    AlreadyDone,
    /// Someone else claimed the message since, or it was never under this lease.
    LeaseLost,
    /// No such id in this outbox.
    NotFound,
    /// The nack dead-lettered it (max attempts reached or asked for).
    DeadLettered,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageResult {
    pub message_id: MessageId,
    pub outcome: Outcome,
    pub detail: String,
}

/// Which settle call is being classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    Ack,
    Nack,
    Extend,
}

/// A row as the settle statement saw it, locked, before changing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowState {
    /// The row carries the lease named in the request.
    pub held: bool,
    pub published: bool,
    pub dead_lettered: bool,
}

impl Settle {
    /// Classifies one requested id. `row` is `None` when the id is not in the
    /// outbox; `applied` says whether the statement changed the row, and
    /// `dead_lettered_now` whether that change dead-lettered it.
    pub fn outcome(
        self,
        row: Option<RowState>,
        applied: bool,
        dead_lettered_now: bool,
    ) -> (Outcome, &'static str) {
        let Some(row) = row else {
            return (Outcome::NotFound, "no such message in this outbox");
        };
        if applied {
            return match (self, dead_lettered_now) {
                (Settle::Nack, true) => (Outcome::DeadLettered, "dead-lettered"),
                _ => (Outcome::Ok, ""),
            };
        }
        match self {
            Settle::Ack if row.held && row.published => {
                (Outcome::AlreadyDone, "already acked under this lease")
            }
            _ if row.published => (Outcome::LeaseLost, "already published under another lease"),
            _ if row.dead_lettered => (Outcome::LeaseLost, "message is dead-lettered"),
            _ => (
                Outcome::LeaseLost,
                "message is not held under this lease (re-claimed, released, or never claimed with it)",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELD: RowState = RowState {
        held: true,
        published: false,
        dead_lettered: false,
    };

    #[test]
    fn missing_rows_are_not_found() {
        for settle in [Settle::Ack, Settle::Nack, Settle::Extend] {
            assert_eq!(settle.outcome(None, false, false).0, Outcome::NotFound);
        }
    }

    #[test]
    fn applied_changes_are_ok_or_dead_lettered() {
        assert_eq!(Settle::Ack.outcome(Some(HELD), true, false).0, Outcome::Ok);
        assert_eq!(
            Settle::Extend.outcome(Some(HELD), true, false).0,
            Outcome::Ok
        );
        assert_eq!(Settle::Nack.outcome(Some(HELD), true, false).0, Outcome::Ok);
        assert_eq!(
            Settle::Nack.outcome(Some(HELD), true, true).0,
            Outcome::DeadLettered
        );
    }

    #[test]
    fn repeated_ack_under_the_same_lease_is_already_done() {
        let acked = RowState {
            published: true,
            ..HELD
        };
        assert_eq!(
            Settle::Ack.outcome(Some(acked), false, false).0,
            Outcome::AlreadyDone
        );
        // Only an ack is idempotent; extending or nacking a published row is refused.
        assert_eq!(
            Settle::Nack.outcome(Some(acked), false, false).0,
            Outcome::LeaseLost
        );
        assert_eq!(
            Settle::Extend.outcome(Some(acked), false, false).0,
            Outcome::LeaseLost
        );
    }

    #[test]
    fn rows_under_another_lease_are_lease_lost() {
        let other = RowState {
            held: false,
            ..HELD
        };
        for settle in [Settle::Ack, Settle::Nack, Settle::Extend] {
            assert_eq!(
                settle.outcome(Some(other), false, false).0,
                Outcome::LeaseLost
            );
        }
        let published_by_other = RowState {
            held: false,
            published: true,
            dead_lettered: false,
        };
        assert_eq!(
            Settle::Ack
                .outcome(Some(published_by_other), false, false)
                .0,
            Outcome::LeaseLost
        );
    }
}
