//! Retry delay after a Nack without `retry_after`.

use std::time::Duration;

use rand::Rng;

/// Exponential backoff with jitter: `base * factor^(attempt-1)`, capped, then
/// spread by ±`jitter` so rows nacked together do not all return together.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffPolicy {
    pub base: Duration,
    pub factor: f64,
    pub cap: Duration,
    /// Fraction in `0.0..=1.0`.
    pub jitter: f64,
}

impl BackoffPolicy {
    /// The delay before delivery `attempt + 1`, after `attempt` (1-based) failed.
    pub fn delay(&self, attempt: u32, rng: &mut impl Rng) -> Duration {
        let exponent = attempt.saturating_sub(1).min(64) as i32;
        let raw = self.base.as_secs_f64() * self.factor.powi(exponent);
        let capped = raw.min(self.cap.as_secs_f64());
        let spread = if self.jitter > 0.0 {
            rng.random_range(-self.jitter..=self.jitter)
        } else {
            0.0
        };
        Duration::from_secs_f64((capped * (1.0 + spread)).clamp(0.0, self.cap.as_secs_f64()))
    }

    /// Delays for attempts `1..=max_attempts`, index 0 = attempt 1. The Nack
    /// statement picks each row's delay by its own attempt count from this table,
    /// so one statement settles a batch whose rows have different histories.
    pub fn schedule(&self, max_attempts: u32, rng: &mut impl Rng) -> Vec<f64> {
        (1..=max_attempts.max(1))
            .map(|attempt| self.delay(attempt, rng).as_secs_f64())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{SeedableRng, rngs::StdRng};

    /// outboxd's default flags (`--backoff-base 1s` and so on); the flags are
    /// where defaults live, this is test data.
    fn policy() -> BackoffPolicy {
        BackoffPolicy {
            base: Duration::from_secs(1),
            factor: 2.0,
            cap: Duration::from_secs(300),
            jitter: 0.2,
        }
    }

    #[test]
    fn grows_exponentially_up_to_the_cap() {
        let policy = BackoffPolicy {
            jitter: 0.0,
            ..policy()
        };
        let mut rng = StdRng::seed_from_u64(7);
        let secs: Vec<f64> = (1..=11)
            .map(|a| policy.delay(a, &mut rng).as_secs_f64())
            .collect();
        assert_eq!(&secs[..5], &[1.0, 2.0, 4.0, 8.0, 16.0]);
        assert_eq!(secs[9], 300.0);
        assert_eq!(secs[10], 300.0);
    }

    #[test]
    fn jitter_stays_within_bounds_and_under_the_cap() {
        let policy = policy();
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..1000 {
            let d = policy.delay(3, &mut rng).as_secs_f64();
            assert!((3.2..=4.8).contains(&d), "{d}");
            let capped = policy.delay(20, &mut rng).as_secs_f64();
            assert!((240.0..=300.0).contains(&capped), "{capped}");
        }
    }

    #[test]
    fn huge_attempt_counts_do_not_overflow() {
        let policy = policy();
        let mut rng = StdRng::seed_from_u64(2);
        assert!(policy.delay(u32::MAX, &mut rng) <= policy.cap);
    }

    #[test]
    fn schedule_has_one_delay_per_attempt() {
        let mut rng = StdRng::seed_from_u64(3);
        assert_eq!(policy().schedule(10, &mut rng).len(), 10);
        assert_eq!(policy().schedule(0, &mut rng).len(), 1);
    }
}
