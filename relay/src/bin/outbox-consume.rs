//! Shows what outbox-relay published: waits for `--count` messages on a queue,
//! prints each as one line (message id, routing key, type, every header and
//! the JSON body), acks them and exits 0. Exits 1, saying why, when
//! `--timeout` passes first or the queue does not exist. It never creates the
//! queue: a mistyped name would make a new one that nothing is bound to, and
//! the wait would end in a timeout that hides the mistake.
//!
//! ```sh
//! cargo run --release --bin outbox-consume -- --queue quickstart
//! ```
#![allow(clippy::print_stdout)] // Printing the messages is what it is for.

use std::{fmt::Write as _, process::ExitCode, time::Duration};

use clap::Parser;
use futures::StreamExt;
use lapin::{
    message::Delivery,
    options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions},
    types::{AMQPValue, FieldTable},
};
use outbox_relay::publishers::rabbitmq::{
    ConnectionArgs, connect, redact_url,
    topology::{QueueCheck, check_queue},
};
use tokio::time::{Instant, timeout_at};

/// Waits for messages on a RabbitMQ queue, prints each as one line and acks it.
#[derive(Debug, Parser)]
#[command(name = "outbox-consume", version, long_about = None)]
struct Args {
    /// Queue to read; it must exist (`outbox-relay --bind-queue NAME` declares one).
    #[arg(long)]
    queue: String,

    #[command(flatten)]
    broker: ConnectionArgs,

    /// Messages to wait for.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    count: u32,

    /// How long to wait for all of them (`90s`, `5m`).
    #[arg(long, value_parser = outbox_runtime::cli::parse_duration, default_value = "60s")]
    timeout: Duration,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    match consume(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(reason) => {
            eprintln!("outbox-consume: {reason}");
            ExitCode::FAILURE
        }
    }
}

async fn consume(args: &Args) -> Result<(), String> {
    let deadline = Instant::now() + args.timeout;
    let broker = redact_url(&args.broker.amqp_url);
    let timed_out = |doing: &str| format!("timed out after {:?} {doing}", args.timeout);
    let tls = args.broker.tls_config()?;
    let conn = timeout_at(
        deadline,
        connect(&args.broker.amqp_url, &tls, "outbox-consume"),
    )
    .await
    .map_err(|_| timed_out(&format!("connecting to RabbitMQ at {broker}")))?
    .map_err(|e| format!("cannot connect to RabbitMQ at {broker}: {e}"))?;
    let channel = conn.create_channel().await.map_err(|e| e.to_string())?;
    let queue = args.queue.as_str();
    // Passive: only checks that the queue exists (see the module comment).
    check_queue(&channel, queue)
        .await
        .map_err(|check| match check {
            QueueCheck::Missing => format!(
                "queue {queue:?} does not exist on {broker}; start outbox-relay with \
             --bind-queue {queue}, or declare it and bind it to the relay's exchange"
            ),
            QueueCheck::Failed(e) => format!("checking queue {queue:?}: {e}"),
        })?;
    // No more unacked messages in hand than asked for: the rest stay queued.
    let prefetch = u16::try_from(args.count).unwrap_or(u16::MAX);
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "outbox-consume".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| format!("consuming from {queue:?}: {e}"))?;
    let mut received = 0;
    while received < args.count {
        let delivery = match timeout_at(deadline, consumer.next()).await {
            Err(_) => {
                return Err(timed_out(&format!(
                    "waiting for {} message(s) on queue {queue:?}: {received} arrived",
                    args.count
                )));
            }
            Ok(None) => return Err(format!("the broker cancelled the consumer on {queue:?}")),
            Ok(Some(delivery)) => delivery.map_err(|e| format!("receiving: {e}"))?,
        };
        println!("{}", line(&delivery));
        delivery
            .ack(BasicAckOptions::default())
            .await
            .map_err(|e| format!("acking: {e}"))?;
        received += 1;
    }
    let _ = channel.close(200, "done".into()).await;
    let _ = conn.close(200, "done".into()).await;
    Ok(())
}

/// `message_id=… routing_key=… type=… HEADER=… body=…`: every header, in
/// name order (the producer's, such as `traceparent`, as well as the relay's
/// `x-outbox-*`), a value with spaces or quotes as a JSON string so the line
/// still splits on spaces; the body as compact JSON (as text when it is not
/// JSON), last, since it may hold spaces.
fn line(delivery: &Delivery) -> String {
    let p = &delivery.properties;
    let text = |s: &Option<lapin::types::ShortString>| {
        s.as_ref().map_or_else(|| "-".to_owned(), |s| s.to_string())
    };
    let mut out = format!(
        "message_id={} routing_key={} type={}",
        text(p.message_id()),
        delivery.routing_key,
        text(p.kind()),
    );
    if let Some(headers) = p.headers() {
        for (key, value) in headers.inner() {
            let _ = write!(out, " {key}={}", quoted(header(value)));
        }
    }
    let body = serde_json::from_slice::<serde_json::Value>(&delivery.data).map_or_else(
        |_| String::from_utf8_lossy(&delivery.data).into_owned(),
        |json| json.to_string(),
    );
    let _ = write!(out, " body={body}");
    out
}

/// `value` as it is, or as a JSON string when it is empty or has a space,
/// quote or control character that would make the line ambiguous.
fn quoted(value: String) -> String {
    if !value.is_empty()
        && !value
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '"')
    {
        return value;
    }
    serde_json::Value::String(value).to_string()
}

fn header(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(s) => s.to_string(),
        AMQPValue::ShortString(s) => s.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::Boolean(b) => b.to_string(),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use lapin::{
        BasicProperties,
        types::{FieldTable, LongString, ShortString},
    };

    use super::*;

    #[test]
    fn every_header_is_printed_not_only_the_x_ones() {
        let mut headers = FieldTable::default();
        headers.insert(
            ShortString::from("traceparent"),
            AMQPValue::LongString(LongString::from(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            )),
        );
        headers.insert(
            ShortString::from("tenant"),
            AMQPValue::LongString(LongString::from("acme corp")),
        );
        headers.insert(
            ShortString::from("x-outbox-attempt"),
            AMQPValue::LongLongInt(2),
        );
        let mut delivery = Delivery::mock(
            1,
            ShortString::from("outbox"),
            ShortString::from("order.paid"),
            false,
            br#"{"n": 1}"#.to_vec(),
        );
        delivery.properties = BasicProperties::default()
            .with_message_id(ShortString::from("m-1"))
            .with_type(ShortString::from("order.paid"))
            .with_headers(headers);
        assert_eq!(
            line(&delivery),
            "message_id=m-1 routing_key=order.paid type=order.paid \
             tenant=\"acme corp\" \
             traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 \
             x-outbox-attempt=2 body={\"n\":1}"
        );
    }
}
