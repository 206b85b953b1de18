//! A plain HTTP/1.1 client for the status page, over TCP or TLS: one request
//! per connection, as a browser's first load makes.

use std::{net::SocketAddr, sync::Arc};

use http_body_util::{BodyExt as _, Empty};
use hyper::{
    Method, Request, StatusCode,
    body::Bytes,
    header::{HOST, HeaderMap},
};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
};

use super::{secs, within};

/// What came back.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

/// `method path` on `addr` with the given headers; over TLS with `tls`
/// (which names the server `localhost`).
pub async fn http(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Reply {
    let tcp = TcpStream::connect(addr).await.expect("connect to the page");
    match tls {
        None => send(tcp, method, path, headers).await,
        Some(config) => {
            let name = rustls::pki_types::ServerName::try_from("localhost").expect("a name");
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .expect("TLS handshake with the status page");
            send(stream, method, path, headers).await
        }
    }
}

async fn send<S>(stream: S, method: Method, path: &str, headers: &[(&str, &str)]) -> Reply
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("HTTP/1.1 handshake");
    tokio::spawn(connection);
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, "localhost");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Empty::<Bytes>::new()).expect("a request");
    let response = within(
        secs(30),
        "the status page's answer",
        sender.send_request(request),
    )
    .await
    .expect("an HTTP response");
    let status = response.status();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("the body")
        .to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8(body.to_vec()).expect("a UTF-8 body"),
    }
}
