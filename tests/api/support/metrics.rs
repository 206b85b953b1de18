//! The server's `/metrics`, read as an operator's scraper would.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::TestApp;

impl TestApp {
    /// Scrapes `/metrics` with a bare HTTP/1.0 request; fails unless it is a 200.
    pub async fn scrape(&self) -> String {
        let mut stream = tokio::net::TcpStream::connect(self.metrics_addr)
            .await
            .expect("metrics endpoint");
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: test\r\n\r\n")
            .await
            .expect("send scrape");
        let mut body = String::new();
        stream.read_to_string(&mut body).await.expect("read scrape");
        assert!(
            body.starts_with("HTTP/1.0 200") || body.starts_with("HTTP/1.1 200"),
            "{body}"
        );
        body
    }
}

/// The value of the series `name{outbox="<outbox>"}` in a scrape, if it is exposed.
pub fn gauge(body: &str, name: &str, outbox: &str) -> Option<f64> {
    let label = format!("outbox=\"{outbox}\"");
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(&label))
        .find_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
}
