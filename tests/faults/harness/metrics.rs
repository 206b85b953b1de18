//! outboxd's `/metrics`, read as a case reads it: one plain HTTP/1.1 GET
//! and the Prometheus text parsed for the series a case asserts on.

use std::net::SocketAddr;

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
    time::timeout,
};

use crate::shared::wait::secs;

/// One HTTP/1.1 GET on a connection of its own: the status code and the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    match try_http_get(addr, path).await {
        Ok(answer) => answer,
        Err(e) => panic!("GET {path} on {addr}: {e}"),
    }
}

/// As [`http_get`], or why not (nothing listens, no answer within 10 s).
pub async fn try_http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("send the request: {e}"))?;
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .await
            .map_err(|e| format!("read the response: {e}"))?;
        Ok::<_, String>(String::from_utf8_lossy(&response).into_owned())
    };
    let response = timeout(secs(10), exchange)
        .await
        .map_err(|_| "no answer within 10 s".to_owned())??;
    let code = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("not an HTTP status line: {response:?}"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

/// One scrape of a `/metrics` page.
#[derive(Debug, Clone)]
pub struct Scrape(String);

impl Scrape {
    /// GETs `/metrics` on `addr`; fails the test unless it answers 200.
    pub async fn of(addr: SocketAddr) -> Self {
        let (code, body) = http_get(addr, "/metrics").await;
        assert_eq!(code, 200, "GET /metrics on {addr}: {body}");
        Self(body)
    }

    /// The sum of the samples of `name` (a counter or gauge, its exact
    /// name) whose labels include every one of `labels` (`key="value"`
    /// each); `None` when there is no such series.
    pub fn value(&self, name: &str, labels: &[&str]) -> Option<f64> {
        let mut found = None;
        for line in self.0.lines() {
            let Some(rest) = line.strip_prefix(name) else {
                continue;
            };
            let (set, value) = if let Some(inner) = rest.strip_prefix('{') {
                let Some((set, value)) = inner.split_once('}') else {
                    continue;
                };
                (set, value)
            } else if rest.starts_with(' ') {
                ("", rest)
            } else {
                // Another metric whose name begins with this one.
                continue;
            };
            if !labels.iter().all(|l| set.split(',').any(|s| s == *l)) {
                continue;
            }
            let Some(v) = value
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok())
            else {
                continue;
            };
            *found.get_or_insert(0.0) += v;
        }
        found
    }

    /// [`Scrape::value`] for the series of outbox `outbox`.
    pub fn of_outbox(&self, name: &str, outbox: &str) -> Option<f64> {
        let label = format!("outbox=\"{outbox}\"");
        self.value(name, &[label.as_str()])
    }

    pub fn text(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::Scrape;

    #[test]
    fn a_series_is_found_by_its_exact_name_and_labels() {
        let page = Scrape(
            "# HELP outbox_claim_sweeps_total Sweeps.\n\
             outbox_claim_sweeps_total{outbox=\"default\",otel_scope_name=\"outboxd\"} 3\n\
             outbox_claim_sweeps_total{outbox=\"other\"} 5\n\
             outbox_claim_sweeps_total_extra{outbox=\"default\"} 7\n\
             outbox_claim_cursor{outbox=\"default\"} 1.2e3\n\
             up 1\n"
                .into(),
        );
        assert_eq!(
            page.of_outbox("outbox_claim_sweeps_total", "default"),
            Some(3.0)
        );
        assert_eq!(page.value("outbox_claim_sweeps_total", &[]), Some(8.0));
        assert_eq!(
            page.of_outbox("outbox_claim_cursor", "default"),
            Some(1200.0)
        );
        assert_eq!(page.value("up", &[]), Some(1.0));
        assert_eq!(
            page.of_outbox("outbox_claim_sweep_found_total", "default"),
            None
        );
    }
}
