//! A channel to outboxd set up the way a relay worker needs it.

use std::time::Duration;

use tonic::transport::Channel;

use crate::pb::outbox_service_client::OutboxServiceClient;

/// The largest response a client accepts. outboxd keeps a claim within
/// `--max-claim-bytes` (3 MiB) but hands out one larger event alone, up to
/// `--max-message-bytes` (8 MiB by default); gRPC's default limit of 4 MiB
/// would refuse that claim and leave the event to expire and be redelivered
/// until it is dead-lettered. This bound leaves room to raise the server's
/// limit without touching the workers.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// A client whose channel connects on first use and reconnects by itself;
/// HTTP/2 keep-alives find a silently dead connection while it is idle. The
/// error names the bad address.
pub fn connect_lazy(server: &str) -> Result<OutboxServiceClient<Channel>, String> {
    let channel = Channel::from_shared(server.to_owned())
        .map_err(|e| format!("{server:?}: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        .connect_lazy();
    Ok(OutboxServiceClient::new(channel).max_decoding_message_size(MAX_RESPONSE_BYTES))
}
