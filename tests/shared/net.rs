//! Local ports for processes under test.

/// A local port nothing listens on (bound, then released): for a server the
/// test starts on a port it knows, or for a peer that must refuse connections.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free local port")
        .port()
}
