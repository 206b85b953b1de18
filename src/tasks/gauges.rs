//! The gauges (pending, in flight, dead letters, oldest ages), sampled on an
//! interval rather than per scrape.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{
    metrics::ServerMetrics,
    store::{OutboxStore as _, Store},
};

/// Samples each outbox's gauges: one query per outbox per interval, whatever
/// the scrape rate, using the pending-rows index.
pub async fn sample_gauges(
    store: impl Store,
    metrics: ServerMetrics,
    every: Duration,
    cancel: CancellationToken,
) {
    let outboxes = store.outboxes();
    let mut failing = false;
    let mut stretched = false;
    let mut pacing = GaugePacing::default();
    loop {
        let began = Instant::now();
        for outbox in &outboxes {
            let name = &outbox.spec().name;
            match outbox.gauges().await {
                Ok(stats) => {
                    metrics.set_gauges(name, stats);
                    failing = false;
                }
                Err(err) if !failing => {
                    tracing::warn!(outbox = %name, error = %err, "gauge sampling failed; keeping the last values");
                    failing = true;
                }
                Err(_) => {}
            }
        }
        let took = began.elapsed();
        let pause = pacing.next(every, took);
        if (pause > every) != stretched {
            stretched = pause > every;
            if stretched {
                tracing::info!(
                    took_ms = took.as_millis(),
                    next_in_secs = pause.as_secs(),
                    "gauge samples are slow (a sample reads every pending row): sampling less often"
                );
            } else {
                tracing::info!("gauge sampling back to every --metrics-interval");
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// The pause before the next gauge sample. A sample reads every pending row,
/// so with a large backlog (0.4–0.7 µs a row here: 140 ms for 200 000 rows,
/// 0.44–0.75 s for a million) it would keep a database backend busy for much
/// of each interval, just when the relays are behind. The pause stretches so
/// that sampling takes at most 1/20 of the time; the gauges then lag by more
/// than the interval, which the log says once.
fn gauge_pause(every: Duration, took: Duration) -> Duration {
    every.max(took.saturating_mul(GAUGE_DUTY))
}

/// Paces samples by the last two: one slow sample (the first, which opens a
/// connection and plans its query, or a blip) does not stretch the pause;
/// a backlog, which makes every sample slow, does.
#[derive(Debug, Default)]
struct GaugePacing {
    previous: Duration,
}

impl GaugePacing {
    fn next(&mut self, every: Duration, took: Duration) -> Duration {
        let pause = gauge_pause(every, took.min(self.previous));
        self.previous = took;
        pause
    }
}

/// The least pause after a sample, in samples' durations: 19 keeps sampling
/// to 1/20 of the time.
const GAUGE_DUTY: u32 = 19;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quick_sample_keeps_the_interval_and_a_slow_one_stretches_it() {
        let every = Duration::from_secs(5);
        assert_eq!(gauge_pause(every, Duration::from_millis(140)), every);
        // 3.5 s, as a backlog of some 5 million rows takes: 1/20 of the time.
        assert_eq!(
            gauge_pause(every, Duration::from_millis(3500)),
            Duration::from_millis(66_500)
        );
        assert_eq!(gauge_pause(Duration::ZERO, Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn one_slow_sample_keeps_the_interval_and_two_in_a_row_stretch_it() {
        let every = Duration::from_secs(5);
        let slow = Duration::from_millis(3500);
        let mut pacing = GaugePacing::default();
        assert_eq!(pacing.next(every, slow), every, "the first sample");
        assert_eq!(pacing.next(every, Duration::from_millis(10)), every);
        assert_eq!(pacing.next(every, slow), every, "a blip");
        assert_eq!(pacing.next(every, slow), Duration::from_millis(66_500));
    }
}
