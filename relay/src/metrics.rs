//! outbox-relay's instruments, labelled by destination. The label keeps the
//! name `exchange` it had when RabbitMQ was the only broker: dashboards and
//! alerts select on it.

use opentelemetry::{
    KeyValue,
    metrics::{Counter, Histogram},
};
use outbox_runtime::metrics::{LATENCY_BUCKETS, Metrics};

/// outbox-relay's instruments, labelled by destination (RabbitMQ: the exchange).
#[derive(Debug, Clone)]
pub struct RelayMetrics {
    published: Counter<u64>,
    confirmed: Counter<u64>,
    returned: Counter<u64>,
    broker_nacked: Counter<u64>,
    failed: Counter<u64>,
    publish_duration: Histogram<f64>,
}

/// The label every instrument carries: where the messages went.
const DESTINATION: &str = "exchange";

/// How one publish ended, for the relay's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishResult {
    Confirmed,
    Returned,
    BrokerNacked,
    Failed,
}

impl RelayMetrics {
    pub fn new(metrics: &Metrics) -> Self {
        let meter = metrics.meter("outbox-relay");
        let counter = |name: &'static str, help: &'static str| {
            meter.u64_counter(name).with_description(help).build()
        };
        Self {
            published: counter(
                "outbox_relay_published_total",
                "Messages sent to the broker.",
            ),
            confirmed: counter(
                "outbox_relay_confirmed_total",
                "Messages the broker confirmed.",
            ),
            returned: counter(
                "outbox_relay_returned_total",
                "Messages the broker returned as unroutable (mandatory).",
            ),
            broker_nacked: counter(
                "outbox_relay_broker_nacked_total",
                "Messages the broker nacked.",
            ),
            failed: counter(
                "outbox_relay_publish_failed_total",
                "Publishes that failed or timed out before a confirm (connection loss).",
            ),
            publish_duration: meter
                .f64_histogram("outbox_relay_publish_duration_seconds")
                .with_description("From sending a message to its broker confirm.")
                .with_unit("s")
                .with_boundaries(LATENCY_BUCKETS.to_vec())
                .build(),
        }
    }

    pub fn published(&self, destination: &str, n: usize) {
        self.published.add(
            n as u64,
            &[KeyValue::new(DESTINATION, destination.to_owned())],
        );
    }

    /// A batch's outcomes, each with its seconds from send to confirm; counted
    /// per batch, with the label built once, since this runs for every message.
    pub fn settled(
        &self,
        destination: &str,
        outcomes: impl IntoIterator<Item = (PublishResult, f64)>,
    ) {
        let attrs = [KeyValue::new(DESTINATION, destination.to_owned())];
        let (mut confirmed, mut returned, mut nacked, mut failed) = (0, 0, 0, 0);
        for (result, seconds) in outcomes {
            match result {
                PublishResult::Confirmed => {
                    confirmed += 1;
                    self.publish_duration.record(seconds, &attrs);
                }
                PublishResult::Returned => returned += 1,
                PublishResult::BrokerNacked => nacked += 1,
                PublishResult::Failed => failed += 1,
            }
        }
        for (counter, n) in [
            (&self.confirmed, confirmed),
            (&self.returned, returned),
            (&self.broker_nacked, nacked),
            (&self.failed, failed),
        ] {
            if n > 0 {
                counter.add(n, &attrs);
            }
        }
    }
}
