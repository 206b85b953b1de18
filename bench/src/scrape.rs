//! Reads outboxd's and the relay's Prometheus endpoints at the end of a drain:
//! their histograms time the parts of outboxd's batch cycle from the inside,
//! so the report can set it beside the classic relay's.

use std::net::SocketAddr;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use prometheus_parse::{Scrape, Value};

pub async fn fetch(addr: SocketAddr) -> anyhow::Result<Scrape> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let uri = format!("http://{addr}/metrics").parse()?;
    let response = client
        .get(uri)
        .await
        .with_context(|| format!("GET http://{addr}/metrics"))?;
    anyhow::ensure!(
        response.status().is_success(),
        "GET http://{addr}/metrics: {}",
        response.status()
    );
    let body = response.into_body().collect().await?.to_bytes();
    let text = String::from_utf8_lossy(&body);
    Ok(Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))?)
}

/// Sum of a histogram's `_sum` and `_count` series over every label set that
/// has `label = value` (all of them when `label` is empty).
pub fn histogram(scrape: &Scrape, name: &str, label: &str, value: &str) -> (f64, f64) {
    let total = |suffix: &str| {
        let metric = format!("{name}{suffix}");
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == metric)
            .filter(|s| label.is_empty() || s.labels.get(label) == Some(value))
            .map(|s| match s.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
                _ => 0.0,
            })
            .sum::<f64>()
    };
    (total("_sum"), total("_count"))
}

/// Mean of a histogram in milliseconds, `None` when nothing was recorded.
pub fn mean_ms(scrape: &Scrape, name: &str, label: &str, value: &str) -> Option<f64> {
    let (sum, count) = histogram(scrape, name, label, value);
    (count > 0.0).then(|| sum / count * 1e3)
}

/// The largest value of a gauge over its label sets, `None` when absent.
pub fn gauge_max(scrape: &Scrape, name: &str) -> Option<f64> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter_map(|s| match s.value {
            Value::Gauge(v) | Value::Untyped(v) => Some(v),
            _ => None,
        })
        .reduce(f64::max)
}

/// A gauge's value in the label set with `label = value`, `None` when absent.
pub fn gauge(scrape: &Scrape, name: &str, label: &str, value: &str) -> Option<f64> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && s.labels.get(label) == Some(value))
        .find_map(|s| match s.value {
            Value::Gauge(v) | Value::Untyped(v) => Some(v),
            _ => None,
        })
}
