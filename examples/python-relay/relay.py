#!/usr/bin/env python3
"""outboxd relay worker in Python: claim from outboxd, publish to RabbitMQ, settle.

Each in-flight slot (a thread) loops: ClaimBatch (long-poll) -> publish every
message with publisher confirms and ``mandatory`` -> Ack what the broker
confirmed -> Nack what it returned as unroutable or nacked (with its reason), and
what could not be published (with a short retry_after) -> again. The acks ride
on the slot's next ClaimBatch (``--ack-with-claim``), so a batch costs one call.

Delivery is at-least-once. A message is acked only after the broker confirmed
it; a crash at any point leaves the batch to lease expiry and redelivery, never
to loss. Consumers dedupe on the AMQP ``message_id`` (the event id).

This mirrors the Rust reference worker (``outbox-relay``): same flags, same env
vars, same AMQP properties, same settle rules. Generate the gRPC stubs first
(``./gen_stubs.py``); see README.md.
"""

from __future__ import annotations

import signal
import threading

#: Set by SIGTERM/SIGINT. The handlers go in before the heavy imports below
#: (grpc alone takes about a second), so a stop during start-up still exits 0.
STOP = threading.Event()


def _request_stop(_signum: int, _frame: object) -> None:
    STOP.set()  # only this: a signal handler should do as little as possible


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _request_stop)
    signal.signal(signal.SIGINT, _request_stop)

import argparse
import concurrent.futures
import dataclasses
import enum
import logging
import os
import random
import re
import socket
import ssl
import sys
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

import grpc
import pika
import pika.channel
import pika.exceptions
import pika.spec
from google.protobuf import duration_pb2

sys.path.insert(0, str(Path(__file__).resolve().parent / "gen"))
try:
    from outbox.v1 import outbox_pb2 as pb
    from outbox.v1 import outbox_pb2_grpc as pb_grpc
except ImportError as _err:  # pragma: no cover - a setup error, not a runtime one
    raise SystemExit(f"gRPC stubs not found ({_err}); run ./gen_stubs.py first") from _err

log = logging.getLogger("outbox-relay")

T = TypeVar("T")

# --------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------

#: Released messages that never reached the broker come back this soon.
FAILED_RETRY_AFTER = 1.0
#: Deadline for Ack, Nack and ExtendLease; a claim gets its long-poll wait on top.
CALL_TIMEOUT = 10.0
#: How often a blocked claim checks for a stop request.
STOP_POLL = 0.2
#: Extra time the slot gives the I/O thread beyond --confirm-timeout before it
#: stops waiting for an answer (the I/O thread enforces the timeout itself).
PUBLISH_GRACE = 5.0


def parse_duration(raw: str) -> float:
    """Seconds from ``30``, ``30s``, ``500ms``, ``1m30s``, ``2h``.

    Plain numbers are seconds; the suffixed forms are accepted so the env vars
    shared with the Rust relay (which writes ``30s``) mean the same here.
    """
    text = raw.strip().replace(" ", "")
    try:
        return float(text)
    except ValueError:
        pass
    units = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)([a-z]+)", text)
    if not parts or "".join(n + u for n, u in parts) != text or any(u not in units for _, u in parts):
        raise argparse.ArgumentTypeError(f"invalid duration {raw!r} (e.g. 30, 30s, 500ms, 1m)")
    return sum(float(n) * units[u] for n, u in parts)


def env_flag(name: str) -> bool:
    """A boolean env var as the Rust relay reads it (true/1/yes/on)."""
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def parse_bool(raw: str) -> bool:
    """``true`` or ``false``, as the Rust relay's ``BOOL`` flags take them."""
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"invalid value {raw!r} (true or false)")
    return value == "true"


class RoutingKey:
    """A routing-key template with ``{event_type}`` and ``{aggregate_id}``.

    Parsed once at start so a typo fails the relay at once, not every publish.
    """

    _FIELD = re.compile(r"\{([^{}]*)\}")
    _ALLOWED = ("event_type", "aggregate_id")

    def __init__(self, template: str) -> None:
        for name in self._FIELD.findall(template):
            if name not in self._ALLOWED:
                raise ValueError(
                    f"routing key {template!r}: unknown placeholder {{{name}}} "
                    "(use {event_type} or {aggregate_id})"
                )
        rest = self._FIELD.sub("", template)
        if "{" in rest:
            raise ValueError(f"routing key {template!r}: unclosed '{{'")
        if "}" in rest:
            raise ValueError(f"routing key {template!r}: stray '}}'")
        self.template = template

    def render(self, event_type: str, aggregate_id: str) -> str:
        values = {"event_type": event_type, "aggregate_id": aggregate_id}
        return self._FIELD.sub(lambda m: values[m.group(1)], self.template)


@dataclasses.dataclass(frozen=True)
class Config:
    """The relay's settings, validated."""

    server: str
    secure: bool
    #: TLS to outboxd (an https:// --server); None for plaintext.
    tls: ChannelTls | None
    #: The bearer token file (--token-file), read once already; None without one.
    token: TokenFile | None
    outbox: str
    amqp_url: str = dataclasses.field(repr=False)  # holds the password
    #: --amqp-tls-ca: the PEM of a CA trusted for an amqps:// broker besides
    #: the system's roots, read and checked already; None without one.
    amqp_tls_ca: str | None = dataclasses.field(repr=False)
    exchange: str
    declare: bool
    routing_key: RoutingKey
    batch_size: int
    lease: float
    concurrency: int
    ack_with_claim: bool
    worker_id: str
    confirm_timeout: float
    wait: float
    drain_timeout: float
    log_level: str


def grpc_target(server: str) -> tuple[str, bool]:
    """The gRPC target and whether to use TLS.

    The native form is a gRPC target (``host:port``). ``http://`` and
    ``https://`` URLs are accepted too, so one OUTBOX_SERVER value serves both
    this worker and the Rust one.
    """
    if server.startswith(("http://", "https://")):
        url = urllib.parse.urlsplit(server)
        if not url.hostname:
            raise ValueError(f"--server {server!r} has no host")
        secure = url.scheme == "https"
        host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
        return f"{host}:{url.port or (443 if secure else 80)}", secure
    if not server.strip():
        raise ValueError("--server must not be empty")
    return server, False


def redact_url(raw: str) -> str:
    """The URL with its password masked, for logs."""
    url = urllib.parse.urlsplit(raw)
    if url.password is None:
        return raw
    netloc = url.netloc.replace(f":{url.password}@", ":redacted@", 1)
    return urllib.parse.urlunsplit(url._replace(netloc=netloc))


#: How often --token-file is re-read: a few seconds, well inside the time
#: Kubernetes itself takes to update a mounted Secret.
TOKEN_POLL = 5.0


def read_token(path: str) -> str:
    """The token in ``path``: the file's text with surrounding whitespace trimmed.

    Errors never contain the file's text. A token is visible ASCII (RFC 6750's
    token68): a space or a control character would break the header.
    """
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: {getattr(err, 'strerror', None) or err}") from None
    if not text:
        raise ValueError(f"{path}: the file is empty")
    if not all(33 <= ord(c) <= 126 for c in text):
        raise ValueError(f"{path}: the token has characters other than visible ASCII")
    return text


class TokenFile:
    """--token-file: the bearer token every call carries, re-read while the
    relay runs so a rotated Secret reaches it without a restart. A failed
    re-read keeps the token in use (a Secret being rewritten is briefly missing
    or empty) and warns once per distinct reason. Its repr shows no token."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._token = read_token(path)
        self._lock = threading.Lock()
        self._failing: str | None = None

    def __repr__(self) -> str:
        return f"TokenFile({self.path!r})"

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The call metadata: works on plaintext channels too, where grpc
        refuses call credentials."""
        with self._lock:
            return (("authorization", f"Bearer {self._token}"),)

    def reload(self) -> bool:
        """Re-reads the file; True when the token changed."""
        try:
            token = read_token(self.path)
        except ValueError as err:
            if self._failing != str(err):
                self._failing = str(err)
                log.warning("cannot re-read the token file; keeping the token in use path=%s reason=%s",
                            self.path, err)
            return False
        if self._failing is not None:
            self._failing = None
            log.info("token file readable again path=%s", self.path)
        with self._lock:
            if token == self._token:
                return False
            self._token = token
        log.info("token file changed; calls use the new token path=%s", self.path)
        return True

    def watch(self, stop: threading.Event, every: float = TOKEN_POLL) -> None:
        """Re-reads the file every ``every`` seconds until ``stop``."""
        while not stop.wait(every):
            self.reload()


@dataclasses.dataclass(frozen=True)
class ChannelTls:
    """TLS to outboxd: the CA to check its certificate by (None: the system's
    roots) and the client certificate and key for mutual TLS. PEM bytes."""

    ca: bytes | None = dataclasses.field(repr=False)
    cert: bytes | None = dataclasses.field(repr=False)
    key: bytes | None = dataclasses.field(repr=False)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)


def read_pem(flag: str, path: str, kind: str) -> bytes:
    """The PEM file at ``path``, checked to hold a ``kind`` block (CERTIFICATE,
    PRIVATE KEY) so a wrong file fails at start, not at the first handshake.
    Errors name the flag and never contain the file's content."""
    try:
        pem = Path(path).read_bytes()
    except OSError as err:
        raise ValueError(f"{flag} {path}: {err.strerror or err}") from None
    if not re.search(rb"-----BEGIN [A-Z ]*" + kind.encode() + rb"-----", pem):
        raise ValueError(f"{flag} {path}: no PEM {kind.lower()} in the file")
    return pem


def channel_tls(args: argparse.Namespace, secure: bool) -> ChannelTls | None:
    """The TLS flags, read and checked: they need an https:// --server, and
    the client certificate comes with its key."""
    flags = (("--tls-ca", args.tls_ca), ("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key))
    if not secure:
        for flag, value in flags:
            if value:
                raise ValueError(f"{flag} needs an https:// --server, not {args.server!r}")
        return None
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert needs --tls-key" if args.tls_cert else "--tls-key needs --tls-cert")
    return ChannelTls(
        ca=read_pem("--tls-ca", args.tls_ca, "CERTIFICATE") if args.tls_ca else None,
        cert=read_pem("--tls-cert", args.tls_cert, "CERTIFICATE") if args.tls_cert else None,
        key=read_pem("--tls-key", args.tls_key, "PRIVATE KEY") if args.tls_key else None,
    )


def amqp_ca(url: str, path: str | None) -> str | None:
    """--amqp-tls-ca read and checked, as the Rust relay does: it needs an
    amqps:// --amqp-url (with amqp:// it would be silently ignored), and the
    file must hold certificates OpenSSL can load, so a wrong file fails at
    start, not at every connection attempt. Errors never contain the file."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in ("amqp", "amqps"):
        raise ValueError("--amqp-url must be an amqp:// or amqps:// URL")
    if not path:
        return None
    if scheme != "amqps":
        raise ValueError("--amqp-tls-ca needs an amqps:// --amqp-url")
    try:
        pem = read_pem("--amqp-tls-ca", path, "CERTIFICATE").decode("ascii")
    except UnicodeDecodeError:
        raise ValueError(f"--amqp-tls-ca {path}: not a text PEM file") from None
    try:
        ssl.create_default_context().load_verify_locations(cadata=pem)
    except ssl.SSLError:
        raise ValueError(f"--amqp-tls-ca {path}: a certificate in the file does not parse") from None
    return pem


def amqp_parameters(url: str, tls_ca: str | None) -> pika.URLParameters:
    """pika's connection parameters for ``url``. For amqps:// pika makes an
    ``ssl.create_default_context()`` (the system's roots, the host name checked)
    and wraps it in ``pika.SSLOptions``; --amqp-tls-ca adds its CA to that
    context. A URL's own ``ssl_options`` query argument, if any, gives pika's
    context from it, and the CA is added to that one."""
    params = pika.URLParameters(url)
    if tls_ca is not None:
        if params.ssl_options is None:  # amqp_ca() allows the CA with amqps:// only
            raise ValueError("--amqp-tls-ca needs an amqps:// --amqp-url")
        params.ssl_options.context.load_verify_locations(cadata=tls_ca)
    return params


def build_parser() -> argparse.ArgumentParser:
    """The relay's flags, each with the Rust relay's env var.

    Help shows the built-in defaults, never an env var's value, so a password
    in AMQP_URL does not end up in a terminal or a log.
    """
    p = argparse.ArgumentParser(
        prog="relay.py",
        description="outboxd relay worker: claims from outboxd, publishes to RabbitMQ with confirms, acks.",
    )

    def option(flag: str, env: str, default: str | None, text: str, shown: str | None = None, **kw: object) -> None:
        shown = shown or default
        suffix = f" [env {env}" + (f"; default {shown}]" if shown else "]")
        # argparse %-formats help text, and URLs contain %2f.
        help_text = (text + suffix).replace("%", "%%")
        p.add_argument(flag, default=os.environ.get(env, default), help=help_text, **kw)  # type: ignore[arg-type]

    option("--server", "OUTBOX_SERVER", "127.0.0.1:50051",
           "outboxd gRPC target, host:port (http:// and https:// URLs work too)")
    option("--token-file", "OUTBOX_RELAY_TOKEN_FILE", None,
           "file holding the bearer token sent on every call (authorization: Bearer), for an outboxd "
           "run with --auth-tokens; whitespace trimmed, re-read every few seconds", shown="none")
    option("--tls-ca", "OUTBOX_RELAY_TLS_CA", None,
           "outboxd's CA certificate (PEM) for an https:// --server", shown="the system's roots")
    option("--tls-cert", "OUTBOX_RELAY_TLS_CERT", None,
           "client certificate (PEM) for mutual TLS; needs --tls-key", shown="none")
    option("--tls-key", "OUTBOX_RELAY_TLS_KEY", None, "the PEM private key of --tls-cert", shown="none")
    option("--outbox", "OUTBOX_RELAY_OUTBOX", "default", "outbox to relay")
    option("--amqp-url", "AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f",
           "RabbitMQ URL, amqp:// or amqps://; never logged with its password",
           shown="amqp://guest:***@127.0.0.1:5672/%2f")
    option("--amqp-tls-ca", "OUTBOX_RELAY_AMQP_TLS_CA", None,
           "CA certificate (PEM) trusted for an amqps:// broker besides the system's roots, "
           "for a broker whose certificate a private CA signed; needs an amqps:// --amqp-url", shown="none")
    option("--exchange", "OUTBOX_RELAY_EXCHANGE", "outbox",
           "exchange to publish to; declared durable topic unless --no-declare")
    p.add_argument("--no-declare", action="store_true", default=env_flag("OUTBOX_RELAY_NO_DECLARE"),
                   help="do not declare the exchange (it is managed elsewhere) [env OUTBOX_RELAY_NO_DECLARE]")
    option("--routing-key", "OUTBOX_RELAY_ROUTING_KEY", "{event_type}",
           "routing key template; placeholders {event_type} and {aggregate_id}")
    option("--batch-size", "OUTBOX_RELAY_BATCH_SIZE", "100", "messages claimed per batch", type=int)
    option("--lease", "OUTBOX_RELAY_LEASE", "30",
           "lease per batch in seconds (or 30s, 1m); extended while publishing runs past half of it",
           type=parse_duration)
    option("--concurrency", "OUTBOX_RELAY_CONCURRENCY", "4", "in-flight batches (slot threads) per process",
           type=int)
    option("--ack-with-claim", "OUTBOX_RELAY_ACK_WITH_CLAIM", "true",
           "send a batch's acks with the slot's next claim (true or false); "
           "an older server that ignores them is detected and acked with Ack calls",
           type=parse_bool, metavar="BOOL")
    option("--worker-id", "OUTBOX_RELAY_WORKER_ID", None,
           "recorded on claimed rows", shown="host name and pid")
    option("--confirm-timeout", "OUTBOX_RELAY_CONFIRM_TIMEOUT", "15",
           "seconds to wait for a batch's confirms before releasing it", type=parse_duration)
    option("--wait", "OUTBOX_RELAY_WAIT", "20",
           "long-poll wait per claim when the outbox is empty, seconds", type=parse_duration)
    option("--drain-timeout", "OUTBOX_RELAY_DRAIN_TIMEOUT", "20",
           "after SIGTERM, seconds in-flight batches may take to publish and settle", type=parse_duration)
    option("--log-level", "OUTBOX_RELAY_LOG_LEVEL", "INFO", "log level",
           choices=["DEBUG", "INFO", "WARNING", "ERROR"], type=str.upper)
    return p


def parse_config(argv: Sequence[str] | None = None) -> Config:
    """Parses and validates the flags; exits with a usage error before connecting anything."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return validate(args)
    except ValueError as err:
        # One line and EX_USAGE (64), as the Rust relay exits on bad configuration.
        print(f"{parser.prog}: invalid configuration: {err}", file=sys.stderr)
        raise SystemExit(64) from None


def validate(args: argparse.Namespace) -> Config:
    target, secure = grpc_target(args.server)
    tls = channel_tls(args, secure)
    amqp_tls_ca = amqp_ca(args.amqp_url, args.amqp_tls_ca)
    if not 1 <= args.batch_size <= 10_000:
        raise ValueError("--batch-size must be between 1 and 10000")
    if not 1 <= args.concurrency <= 1024:
        raise ValueError("--concurrency must be between 1 and 1024")
    if args.lease < 1:
        raise ValueError("--lease must be at least 1s")
    if args.confirm_timeout <= 0:
        raise ValueError("--confirm-timeout must be positive")
    if args.wait < 0 or args.drain_timeout < 0:
        raise ValueError("--wait and --drain-timeout must not be negative")
    worker_id = args.worker_id
    if worker_id is None:
        worker_id = f"{socket.gethostname()}-{os.getpid()}"
    elif not worker_id.strip() or len(worker_id) > 200:
        raise ValueError("--worker-id must be 1-200 characters")
    token = None
    if args.token_file:
        try:
            token = TokenFile(args.token_file)
        except ValueError as err:
            raise ValueError(f"--token-file {err}") from None
    return Config(
        server=target,
        secure=secure,
        tls=tls,
        token=token,
        outbox=args.outbox,
        amqp_url=args.amqp_url,
        amqp_tls_ca=amqp_tls_ca,
        exchange=args.exchange,
        declare=not args.no_declare,
        routing_key=RoutingKey(args.routing_key),
        batch_size=args.batch_size,
        lease=args.lease,
        concurrency=args.concurrency,
        ack_with_claim=args.ack_with_claim,
        worker_id=worker_id,
        confirm_timeout=args.confirm_timeout,
        wait=args.wait,
        drain_timeout=args.drain_timeout,
        log_level=args.log_level,
    )


# --------------------------------------------------------------------------
# Small shared pieces
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with jitter, for reconnects and retried calls.

    Jitter keeps many relays that lost the same dependency from retrying in step.
    """

    base: float = 0.2
    factor: float = 2.0
    cap: float = 10.0
    jitter: float = 0.2

    def delay(self, attempt: int) -> float:
        exponent = min(max(attempt - 1, 0), 64)
        raw = min(self.cap, self.base * self.factor**exponent)
        return raw * random.uniform(1 - self.jitter, 1 + self.jitter)


RETRY = Backoff()


class LinkState:
    """Whether a dependency was last seen up, so each change is logged once, not each retry.

    `up=None` means "not known yet": then the first state, either way, is a change.
    """

    def __init__(self, up: bool | None) -> None:
        self._up = up
        self._lock = threading.Lock()

    def change(self, up: bool) -> bool:
        """Records the state; true when it differs from the last one."""
        with self._lock:
            changed, self._up = self._up != up, up
            return changed


def to_duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(round(seconds * 1e9))
    return d


class Outcome(enum.Enum):
    CONFIRMED = "confirmed"
    REJECTED = "rejected"
    FAILED = "failed"


@dataclasses.dataclass(frozen=True)
class Delivery:
    """What became of one published message.

    CONFIRMED: the broker has it, safe to ack. REJECTED: the broker refused it
    (nack, or returned as unroutable), nack with the reason and let the outbox's
    backoff and max attempts decide. FAILED: it may not have reached the broker
    (connection lost, confirm timed out), release it for a prompt retry.
    """

    outcome: Outcome
    reason: str = ""


CONFIRMED = Delivery(Outcome.CONFIRMED)


def rejected(reason: str) -> Delivery:
    return Delivery(Outcome.REJECTED, reason)


def failed(reason: str) -> Delivery:
    return Delivery(Outcome.FAILED, reason)


def amqp_properties(m: pb.OutboxMessage) -> pika.BasicProperties:
    """The AMQP properties of one outbox message, as the Rust relay sets them."""
    # Producer headers first, so ours win on a clash.
    headers: dict[str, object] = dict(m.headers)
    headers["x-aggregate-id"] = m.aggregate_id
    headers["x-outbox-attempt"] = m.attempt
    headers["x-outbox-sequence"] = m.sequence
    return pika.BasicProperties(
        message_id=m.id,
        type=m.event_type,
        content_type="application/json",
        delivery_mode=pika.DeliveryMode.Persistent,
        timestamp=m.created_at.seconds if m.HasField("created_at") else None,
        headers=headers,
    )


# --------------------------------------------------------------------------
# outboxd: the lease side
# --------------------------------------------------------------------------

TRANSIENT_CODES = frozenset({
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
})


def rpc_error(err: grpc.RpcError) -> tuple[grpc.StatusCode | None, str]:
    """Code and message of a failed call (grpc's RpcError is also a Call)."""
    code = err.code() if isinstance(err, grpc.Call) else None
    details = err.details() if isinstance(err, grpc.Call) else str(err)
    return code, details or ""


class Leases(Protocol):
    """outboxd's four worker calls; a protocol so the loop can be tested with a fake."""

    def claim(self, request: pb.ClaimBatchRequest, stop: threading.Event) -> pb.ClaimBatchResponse | None: ...
    def ack(self, request: pb.AckRequest) -> pb.AckResponse: ...
    def nack(self, request: pb.NackRequest) -> pb.NackResponse: ...
    def extend(self, request: pb.ExtendLeaseRequest) -> pb.ExtendLeaseResponse: ...


MAX_RESPONSE_BYTES = 64 * 1024 * 1024


class GrpcLeases:
    """outboxd over gRPC. One channel for every slot: it is thread-safe and
    reconnects by itself; every call carries a deadline, so a silently dead
    connection costs one timeout, not a hang."""

    def __init__(self, target: str, tls: ChannelTls | None = None, token: TokenFile | None = None) -> None:
        self._token = token
        options = [
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            # grpc's own reconnect backoff grows to 120 s by default; keep it
            # within the relay's cap so a restarted outboxd is found promptly.
            ("grpc.initial_reconnect_backoff_ms", int(RETRY.base * 1000)),
            ("grpc.max_reconnect_backoff_ms", int(RETRY.cap * 1000)),
            # outboxd keeps a claim within --max-claim-bytes (3 MiB) but hands
            # out one larger event alone, up to --max-message-bytes (8 MiB by
            # default): gRPC's default 4 MiB would refuse that claim.
            ("grpc.max_receive_message_length", MAX_RESPONSE_BYTES),
        ]
        if tls is not None:
            self._channel = grpc.secure_channel(target, tls.credentials(), options)
        else:
            self._channel = grpc.insecure_channel(target, options)
        self._stub = pb_grpc.OutboxServiceStub(self._channel)

    def claim(self, request: pb.ClaimBatchRequest, stop: threading.Event) -> pb.ClaimBatchResponse | None:
        """Long-polls for a batch; None when `stop` cancelled the wait.

        A claim that completed before the cancel is returned, not dropped, so
        its batch is relayed rather than left to lease expiry.
        """
        wait = request.wait.ToTimedelta().total_seconds() if request.HasField("wait") else 0.0
        call = self._stub.ClaimBatch.future(request, timeout=CALL_TIMEOUT + wait, metadata=self._metadata())
        done = threading.Event()
        call.add_done_callback(lambda _call: done.set())
        while not done.wait(STOP_POLL):
            if stop.is_set() and call.cancel():
                return None
        return call.result()

    def ack(self, request: pb.AckRequest) -> pb.AckResponse:
        return self._stub.Ack(request, timeout=CALL_TIMEOUT, metadata=self._metadata())

    def nack(self, request: pb.NackRequest) -> pb.NackResponse:
        return self._stub.Nack(request, timeout=CALL_TIMEOUT, metadata=self._metadata())

    def extend(self, request: pb.ExtendLeaseRequest) -> pb.ExtendLeaseResponse:
        return self._stub.ExtendLease(request, timeout=CALL_TIMEOUT, metadata=self._metadata())

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        """The token as it is now: a rotated file reaches the next call."""
        return self._token.metadata() if self._token is not None else ()

    def close(self) -> None:
        self._channel.close()


# --------------------------------------------------------------------------
# RabbitMQ: the publish side
# --------------------------------------------------------------------------


class BrokerUnavailable(Exception):
    """RabbitMQ cannot take messages right now; the slot backs off."""


class Publisher(Protocol):
    """One slot's publisher; a protocol so the loop can be tested without a broker."""

    def ready(self) -> str | None:
        """None when messages can be published now, else why not."""

    def publish(self, messages: Sequence[pb.OutboxMessage]) -> concurrent.futures.Future[list[Delivery]]:
        """Publishes a batch with confirms, pipelined; resolves to one Delivery per message."""


def describe(reason: BaseException | None) -> str:
    """A short reason from a pika exception, for logs and Nack errors."""
    if reason is None:
        return "closed"
    if isinstance(reason, (pika.exceptions.ChannelClosed, pika.exceptions.ConnectionClosed)):
        return f"{reason.reply_code} {reason.reply_text}"
    # pika wraps the cause of a failed connect: one exception per attempt, each
    # holding e.g. the socket's ConnectionRefusedError.
    attempts = getattr(reason, "exceptions", None)
    if attempts:
        return describe(attempts[-1])
    cause = getattr(reason, "exception", None)
    if isinstance(cause, BaseException):
        return describe(cause)
    if reason.args and isinstance(reason.args[0], BaseException):
        return describe(reason.args[0])
    return str(reason) or type(reason).__name__


@dataclasses.dataclass(eq=False)
class _InFlight:
    """A batch between publish and its last confirm. I/O thread only."""

    first_tag: int
    results: list[Delivery | None]
    index_by_id: dict[str, int]
    future: concurrent.futures.Future[list[Delivery]]
    returned: dict[int, str] = dataclasses.field(default_factory=dict)
    cancel_timer: Callable[[], None] = lambda: None


@dataclasses.dataclass(eq=False)
class _Slot:
    """One slot's confirm-mode channel and in-flight batch. I/O thread only."""

    number: int
    channel: pika.channel.Channel | None = None
    ready: bool = False
    next_tag: int = 1
    waiters: list[concurrent.futures.Future[None]] = dataclasses.field(default_factory=list)
    batch: _InFlight | None = None


def _resolve(future: concurrent.futures.Future[T], result: T | None = None, error: BaseException | None = None) -> None:
    """Resolves a future once; later attempts are ignored (a batch can fail
    from several directions at once: channel close, connection close, timeout)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)  # type: ignore[arg-type]


class Broker:
    """The process's RabbitMQ connection, driven by its own I/O thread.

    pika's SelectConnection lets a batch be pipelined: every message is sent
    before any confirm is awaited, which is many times faster than
    BlockingChannel's one-confirm-per-publish. pika is not thread-safe, so every
    pika call happens on the I/O thread; slot threads hand work over with
    ``add_callback_threadsafe`` (pika's one thread-safe entry point) and wait on
    a concurrent.futures.Future. Each slot owns one confirm channel, so a channel
    error in one batch cannot fail another slot's batch.
    """

    def __init__(self, config: Config) -> None:
        self._params = amqp_parameters(config.amqp_url, config.amqp_tls_ca)
        self._params.client_properties = {"connection_name": f"outbox-relay-py {config.worker_id}"}
        self._broker = redact_url(config.amqp_url)
        self._exchange = config.exchange
        self._declare = config.declare
        self._routing_key = config.routing_key
        self._confirm_timeout = config.confirm_timeout
        self._lock = threading.Lock()
        # Guarded by _lock: the live connection (None between connections),
        # whether it is open, and the futures handed to its I/O loop.
        self._conn: pika.SelectConnection | None = None
        self._open = False
        self._handed_over: list[concurrent.futures.Future] = []
        self._opened = threading.Event()
        self._stopping = threading.Event()
        self._slots: list[_Slot] = []
        self._last_error = "not connected yet"
        self._channel_warning = ""  # last channel error logged (I/O thread only)
        self._link = LinkState(up=None)  # so a broker that is down at start gets its line
        self._thread = threading.Thread(target=self._run, name="amqp-io", daemon=True)

    # ---- slot-thread side ------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def publisher(self) -> AmqpPublisher:
        """A publisher for one slot; call before start()."""
        slot = _Slot(number=len(self._slots))
        self._slots.append(slot)
        return AmqpPublisher(self, slot)

    def close(self, timeout: float) -> None:
        """Closes the connection cleanly (in-flight confirms were awaited by the slots)."""
        self._stopping.set()
        with self._lock:
            conn = self._conn
        if conn is not None:
            try:
                conn.ioloop.add_callback_threadsafe(lambda: self._close_connection(conn))
            except Exception:  # the loop is already gone
                pass
        self._thread.join(timeout)

    def wait_open(self, timeout: float) -> bool:
        return self._opened.wait(timeout)

    def submit(self, work: Callable[[concurrent.futures.Future[T]], None]) -> concurrent.futures.Future[T]:
        """Runs `work(future)` on the I/O thread; the future fails at once when
        there is no open connection, and is failed, never left hanging, if the
        connection dies before the work ran."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            conn = self._conn if self._open else None
            if conn is not None:
                self._handed_over = [f for f in self._handed_over if not f.done()]
                self._handed_over.append(future)
        if conn is None:
            future.set_exception(BrokerUnavailable(self._last_error))
            return future
        try:
            conn.ioloop.add_callback_threadsafe(lambda: self._guarded(work, future))
        except Exception as err:  # the loop closed under us
            _resolve(future, error=BrokerUnavailable(str(err)))
        return future

    # ---- I/O thread ------------------------------------------------------

    def _run(self) -> None:
        """Connects, runs the I/O loop until the connection ends, backs off, again."""
        failures = 0
        while not self._stopping.is_set():
            conn = pika.SelectConnection(
                self._params,
                on_open_callback=self._on_open,
                on_open_error_callback=self._on_open_error,
                on_close_callback=self._on_close,
            )
            with self._lock:
                if self._stopping.is_set():  # close() ran since the loop's check
                    conn.ioloop.close()
                    break
                self._conn = conn  # from here on, close() sees it and closes it
            try:
                conn.ioloop.start()
            except Exception:
                log.exception("AMQP I/O loop failed; reconnecting")
            with self._lock:
                was_open, self._open, self._conn = self._open, False, None
                stranded, self._handed_over = self._handed_over, []
            self._opened.clear()
            for slot in self._slots:
                self._reset_slot(slot, self._last_error)
            for future in stranded:
                _resolve(future, error=BrokerUnavailable(self._last_error))
            try:
                conn.ioloop.close()
            except Exception:
                pass
            failures = 1 if was_open else failures + 1
            self._stopping.wait(RETRY.delay(failures))

    def _on_open(self, conn: pika.SelectConnection) -> None:
        with self._lock:
            self._open = True
        self._opened.set()
        if self._link.change(up=True):
            log.info("RabbitMQ connected broker=%s", self._broker)

    def _on_open_error(self, conn: pika.SelectConnection, err: BaseException) -> None:
        self._went_down(f"cannot connect: {describe(err)}")
        conn.ioloop.stop()

    def _on_close(self, conn: pika.SelectConnection, reason: BaseException) -> None:
        with self._lock:
            self._open = False
        self._opened.clear()
        self._went_down(f"connection lost: {describe(reason)}")
        for slot in self._slots:
            self._reset_slot(slot, self._last_error)
        conn.ioloop.stop()

    def _went_down(self, reason: str) -> None:
        self._last_error = reason
        if self._stopping.is_set():
            return
        if self._link.change(up=False):
            log.warning("RabbitMQ unavailable; holding claims until it is back broker=%s reason=%s",
                        self._broker, reason)

    def _close_connection(self, conn: pika.SelectConnection) -> None:
        if conn.is_closed:
            conn.ioloop.stop()
        elif not conn.is_closing:
            # Also aborts a connection still opening (on_open_error then stops the loop).
            conn.close(reply_text="relay stopping")

    def _guarded(self, work: Callable[[concurrent.futures.Future[T]], None], future: concurrent.futures.Future[T]) -> None:
        """A bug in one piece of work fails its future instead of the I/O thread."""
        try:
            work(future)
        except Exception as err:
            log.exception("AMQP work failed")
            _resolve(future, error=BrokerUnavailable(f"internal error: {err}"))

    def ensure_channel(self, slot: _Slot, future: concurrent.futures.Future[None]) -> None:
        """Opens the slot's confirm channel (and declares the exchange) if needed."""
        if slot.channel is not None and slot.ready and slot.channel.is_open:
            _resolve(future)
            return
        if self._conn is None or not self._conn.is_open:
            _resolve(future, error=BrokerUnavailable(self._last_error))  # closing right now
            return
        slot.waiters.append(future)
        if slot.channel is not None:
            return  # already opening
        channel = self._conn.channel(on_open_callback=lambda ch: self._on_channel_open(slot, ch))
        channel.add_on_close_callback(lambda ch, reason: self._on_channel_closed(slot, ch, reason))
        channel.add_on_return_callback(lambda ch, method, props, _body: self._on_return(slot, ch, method, props))
        slot.channel, slot.ready = channel, False

    def _on_channel_open(self, slot: _Slot, channel: pika.channel.Channel) -> None:
        def declared(_frame: object = None) -> None:
            if slot.channel is not channel:
                return
            slot.ready, slot.next_tag = True, 1
            waiters, slot.waiters = slot.waiters, []
            for waiter in waiters:
                _resolve(waiter)

        def confirming(_frame: object) -> None:
            if self._declare:
                channel.exchange_declare(exchange=self._exchange, exchange_type="topic",
                                         durable=True, callback=declared)
            else:
                declared()

        channel.confirm_delivery(ack_nack_callback=lambda frame: self._on_confirm(slot, channel, frame),
                                 callback=confirming)

    def _on_channel_closed(self, slot: _Slot, channel: pika.channel.Channel, reason: BaseException) -> None:
        if slot.channel is not channel:
            return  # one we let go of on purpose
        text = describe(reason)
        if isinstance(reason, pika.exceptions.ChannelClosedByBroker) and text != self._channel_warning:
            self._channel_warning = text  # every slot hits the same cause: one line for all
            log.warning("RabbitMQ closed a channel: %s", text)
        self._reset_slot(slot, f"channel closed: {text}")

    def _reset_slot(self, slot: _Slot, reason: str) -> None:
        """Forgets the slot's channel; its waiters and in-flight batch fail with `reason`."""
        slot.channel, slot.ready = None, False
        waiters, slot.waiters = slot.waiters, []
        for waiter in waiters:
            _resolve(waiter, error=BrokerUnavailable(reason))
        if slot.batch is not None:
            self._fail_rest(slot, slot.batch, reason)

    def publish(self, slot: _Slot, messages: Sequence[pb.OutboxMessage],
                future: concurrent.futures.Future[list[Delivery]]) -> None:
        """Sends the whole batch, then lets the confirm callbacks fill in the outcomes."""
        channel = slot.channel
        if channel is None or not slot.ready or not channel.is_open or self._conn is None:
            _resolve(future, [failed("no open channel")] * len(messages))
            return
        batch = _InFlight(
            first_tag=slot.next_tag,
            results=[None] * len(messages),
            index_by_id={m.id: i for i, m in enumerate(messages)},
            future=future,
        )
        slot.batch = batch
        for i, m in enumerate(messages):
            try:
                channel.basic_publish(
                    exchange=self._exchange,
                    routing_key=self._routing_key.render(m.event_type, m.aggregate_id),
                    body=m.payload,
                    properties=amqp_properties(m),
                    mandatory=True,
                )
            except Exception as err:
                # pika marshals a message completely before writing any of it, so
                # a failed publish sent nothing and used no delivery tag.
                batch.results[i] = failed(f"publish failed: {describe(err)}")
                continue
            slot.next_tag += 1
        ioloop = self._conn.ioloop
        timer = ioloop.call_later(self._confirm_timeout,
                                  lambda: self._fail_rest(slot, batch, "publisher confirm timed out"))
        batch.cancel_timer = lambda: ioloop.remove_timeout(timer)
        self._finish_if_done(slot, batch)

    def _on_return(self, slot: _Slot, channel: pika.channel.Channel,
                   method: pika.spec.Basic.Return, props: pika.BasicProperties) -> None:
        """Notes an unroutable message; its confirm (an ack) follows and is turned into a rejection.

        RabbitMQ sends basic.return before the basic.ack of the same message.
        """
        batch = slot.batch
        if slot.channel is not channel or batch is None:
            return
        index = batch.index_by_id.get(props.message_id or "")
        if index is not None:
            batch.returned[index] = f"returned by broker: {method.reply_code} {method.reply_text}"

    def _on_confirm(self, slot: _Slot, channel: pika.channel.Channel, frame: pika.frame.Method) -> None:
        batch = slot.batch
        if slot.channel is not channel or batch is None:
            return  # a confirm of a channel or batch already given up on
        method = frame.method
        is_ack = isinstance(method, pika.spec.Basic.Ack)
        last = method.delivery_tag
        if method.multiple and last == 0:
            last = slot.next_tag - 1  # "everything so far"
        first = batch.first_tag if method.multiple else last
        for tag in range(max(first, batch.first_tag), last + 1):
            index = tag - batch.first_tag
            if index >= len(batch.results) or batch.results[index] is not None:
                continue
            if not is_ack:
                batch.results[index] = rejected("nacked by broker")
            elif index in batch.returned:
                batch.results[index] = rejected(batch.returned[index])
            else:
                batch.results[index] = CONFIRMED
        self._finish_if_done(slot, batch)

    def _fail_rest(self, slot: _Slot, batch: _InFlight, reason: str) -> None:
        """Every message of the batch without an outcome yet failed with `reason`."""
        if slot.batch is not batch:
            return
        batch.results = [r if r is not None else failed(reason) for r in batch.results]
        self._finish_if_done(slot, batch)

    def _finish_if_done(self, slot: _Slot, batch: _InFlight) -> None:
        if any(r is None for r in batch.results):
            return
        batch.cancel_timer()
        slot.batch = None
        if any(r is not None and r.outcome is Outcome.CONFIRMED for r in batch.results):
            self._channel_warning = ""  # publishing works: the next channel error is news again
        if any(r is not None and r.outcome is Outcome.FAILED for r in batch.results):
            # Whatever failed may have broken the channel, and late confirms must
            # not be counted for the next batch: start afresh next time.
            channel, slot.channel, slot.ready = slot.channel, None, False
            if channel is not None and channel.is_open:
                channel.close()
        _resolve(batch.future, [r for r in batch.results if r is not None])


class AmqpPublisher:
    """One slot's handle on the Broker (see Publisher)."""

    #: How long ready() waits for a connection before reporting "not now"; short,
    #: because the slot then backs off on the stop event, which a signal interrupts.
    READY_TIMEOUT = 0.5

    def __init__(self, broker: Broker, slot: _Slot) -> None:
        self._broker = broker
        self._slot = slot

    def ready(self) -> str | None:
        if not self._broker.wait_open(self.READY_TIMEOUT):
            return "RabbitMQ not connected"
        future = self._broker.submit(lambda f: self._broker.ensure_channel(self._slot, f))
        try:
            future.result(timeout=CALL_TIMEOUT)
        except BrokerUnavailable as err:
            return str(err)
        except concurrent.futures.TimeoutError:
            return "timed out opening a channel"
        return None

    def publish(self, messages: Sequence[pb.OutboxMessage]) -> concurrent.futures.Future[list[Delivery]]:
        return self._broker.submit(lambda f: self._broker.publish(self._slot, messages, f))


# --------------------------------------------------------------------------
# The worker loop
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every slot of a relay process shares."""

    outbox: str
    worker_id: str
    batch_size: int
    lease: float
    wait: float
    confirm_timeout: float
    #: Send a batch's acks with the slot's next claim (--ack-with-claim).
    ack_with_claim: bool = True


class CarriedAcks:
    """Whether outboxd applies the acks a claim carries. A server older than the
    ``acks`` field drops it unread and answers without ``ack_results``; every slot
    then falls back to Ack calls, and the change is logged once."""

    def __init__(self) -> None:
        self._ignored = False
        self._lock = threading.Lock()

    def supported(self) -> bool:
        with self._lock:
            return not self._ignored

    def ignored(self) -> None:
        with self._lock:
            if self._ignored:
                return
            self._ignored = True
        log.warning("outboxd ignores acks sent with a claim (an older server); acking with Ack calls")


@dataclasses.dataclass(frozen=True)
class _Carried:
    """A published batch's confirmed ids, waiting for the slot's next claim."""

    ack: pb.LeaseAck
    #: Past this the lease has long expired and another worker owns the messages.
    give_up: float


class Worker:
    """One in-flight slot: claim -> publish -> ack/nack -> again, until stopped.

    Never acks what the broker did not confirm. A batch already claimed when
    the stop request comes is still published and settled.

    With ``ack_with_claim`` a batch's acks ride on the slot's next claim, which
    follows at once: one call per batch instead of two. outboxd applies them
    straight away, even when the claim then long-polls. Acks that cannot ride
    (the slot backs off or stops, the claim failed or was cancelled) go as an
    Ack call of their own: a repeated ack is harmless (``ALREADY_DONE``).
    """

    def __init__(self, leases: Leases, publisher: Publisher, settings: Settings,
                 server: LinkState, stop: threading.Event, carried: CarriedAcks | None = None) -> None:
        self.leases = leases
        self.publisher = publisher
        self.settings = settings
        self.server = server
        self.stop = stop
        self.carried = carried or CarriedAcks()
        self._carry: _Carried | None = None

    def run(self) -> None:
        failures = 0
        while not self.stop.is_set():
            try:
                failures = self._step(failures)
            except Exception:
                # A bug must not silently lose a slot; what it held expires with its lease.
                log.exception("unexpected error in the relay loop; continuing")
                failures += 1
                self._ack_carried()
                self.stop.wait(RETRY.delay(failures))
        self._ack_carried()

    def _step(self, failures: int) -> int:
        """One claim and its batch; returns the updated failure count."""
        not_ready = self.publisher.ready()
        if not_ready is not None:
            log.debug("publisher not ready: %s", not_ready)
            self._ack_carried()
            self.stop.wait(RETRY.delay(failures + 1))
            return failures + 1
        request = self._claim_request()
        carried, self._carry = self._carry, None
        if carried is not None:
            request.acks.append(carried.ack)
        try:
            batch = self.leases.claim(request, self.stop)
        except grpc.RpcError as err:
            code, details = rpc_error(err)
            if code in TRANSIENT_CODES:
                if self.server.change(up=False):
                    log.warning("outboxd unavailable; retrying with backoff code=%s message=%s",
                                code.name if code else "?", details)
            else:
                log.error("claim refused; check the relay's configuration code=%s message=%s",
                          code.name if code else "?", details)
            # Whether outboxd applied the acks is unknown: send them again.
            self._ack(carried)
            self.stop.wait(RETRY.delay(failures + 1))
            return failures + 1
        if batch is None:
            self._ack(carried)  # stopped while waiting: the call was cancelled
            return failures
        if self.server.change(up=True):
            log.info("outboxd reachable again")
        if carried is not None:
            if batch.ack_results:
                self._report("ack", carried.ack.lease_id, len(carried.ack.message_ids), batch.ack_results)
            else:
                self.carried.ignored()
                self._ack(carried)
        if batch.messages:
            self.relay(batch)
        return 0

    def _claim_request(self) -> pb.ClaimBatchRequest:
        return pb.ClaimBatchRequest(
            outbox=self.settings.outbox,
            worker_id=self.settings.worker_id,
            max_messages=self.settings.batch_size,
            lease_duration=to_duration(self.settings.lease),
            wait=to_duration(self.settings.wait),
            # The channel's receive limit: outboxd never sends more, and leaves
            # an event too large for it to a client that can take it.
            max_response_bytes=MAX_RESPONSE_BYTES,
        )

    def relay(self, batch: pb.ClaimBatchResponse) -> None:
        """Publishes one claimed batch, extending its lease while that runs long,
        then acks what the broker confirmed and nacks the rest."""
        log.debug("claimed lease_id=%s count=%d", batch.lease_id, len(batch.messages))
        future = self.publisher.publish(batch.messages)
        deliveries = self._await_deliveries(batch.lease_id, future, len(batch.messages))
        self.settle(batch.lease_id, batch.messages, deliveries)

    def _await_deliveries(self, lease_id: str, future: concurrent.futures.Future[list[Delivery]],
                          count: int) -> list[Delivery]:
        """Waits for the publish outcome, calling ExtendLease every half lease meanwhile."""
        half = self.settings.lease / 2
        started = time.monotonic()
        next_extend: float | None = started + half
        give_up = started + self.settings.confirm_timeout + PUBLISH_GRACE
        while True:
            now = time.monotonic()
            if now >= give_up:
                log.warning("publisher gave no outcome in time lease_id=%s", lease_id)
                return []
            until = give_up if next_extend is None else min(next_extend, give_up)
            try:
                return future.result(timeout=max(0.0, until - now))
            except concurrent.futures.TimeoutError:
                if next_extend is not None and time.monotonic() >= next_extend:
                    # A lost lease is not extended again; the publish goes on and
                    # its acks come back LEASE_LOST.
                    next_extend = next_extend + half if self._extend(lease_id) else None
            except BrokerUnavailable as err:
                return [failed(str(err))] * count

    def settle(self, lease_id: str, messages: Sequence[pb.OutboxMessage], deliveries: Sequence[Delivery]) -> None:
        """Acks the confirmed, nacks the rest: one Nack per distinct reason.

        A message without an outcome (the publisher answered for fewer than it
        was given) is released, never acked.
        """
        acks: list[str] = []
        nacks: dict[tuple[str, float | None], list[str]] = {}
        for index, message in enumerate(messages):
            delivery = deliveries[index] if index < len(deliveries) else failed("publisher gave no outcome")
            if delivery.outcome is Outcome.CONFIRMED:
                acks.append(message.id)
            elif delivery.outcome is Outcome.REJECTED:
                nacks.setdefault((delivery.reason, None), []).append(message.id)
            else:
                nacks.setdefault((delivery.reason, FAILED_RETRY_AFTER), []).append(message.id)

        # Past this the lease has long expired and another worker owns the messages.
        give_up = time.monotonic() + self.settings.lease * 2
        if acks:
            carried = _Carried(pb.LeaseAck(lease_id=lease_id, message_ids=acks), give_up)
            if self.settings.ack_with_claim and self.carried.supported():
                self._carry = carried  # the next claim takes it
            else:
                self._ack(carried)
        for (reason, retry_after), ids in nacks.items():
            log.warning("releasing unpublished messages lease_id=%s count=%d reason=%s", lease_id, len(ids), reason)
            request = pb.NackRequest(outbox=self.settings.outbox, lease_id=lease_id, message_ids=ids,
                                     error=reason, dead_letter=False)
            if retry_after is not None:
                request.retry_after.CopyFrom(to_duration(retry_after))
            response = self._retry(self.leases.nack, request, give_up)
            if response is not None:
                self._report("nack", lease_id, len(ids), response.results)

    def _ack_carried(self) -> None:
        """Sends the acks waiting for a claim as an Ack call: no claim comes soon."""
        carried, self._carry = self._carry, None
        self._ack(carried)

    def _ack(self, carried: _Carried | None) -> None:
        if carried is None:
            return
        lease_id, ids = carried.ack.lease_id, list(carried.ack.message_ids)
        request = pb.AckRequest(outbox=self.settings.outbox, lease_id=lease_id, message_ids=ids)
        response = self._retry(self.leases.ack, request, carried.give_up)
        if response is not None:
            self._report("ack", lease_id, len(ids), response.results)

    def _extend(self, lease_id: str) -> bool:
        """Extends the whole lease; False once outboxd says it holds nothing (lost
        to expiry and claimed by another worker): extending again is useless."""
        request = pb.ExtendLeaseRequest(outbox=self.settings.outbox, lease_id=lease_id,
                                        lease_duration=to_duration(self.settings.lease))
        try:
            response = self.leases.extend(request)
        except grpc.RpcError as err:
            code, details = rpc_error(err)
            if code is grpc.StatusCode.FAILED_PRECONDITION:
                log.warning("lease lost while publishing: another worker holds the batch now lease_id=%s reason=%s",
                            lease_id, details)
                return False
            log.warning("could not extend lease; publishing on lease_id=%s code=%s",
                        lease_id, code.name if code else "?")
            return True
        log.debug("lease extended while publishing lease_id=%s extended=%d", lease_id, len(response.results))
        return True

    def _retry(self, call: Callable[[T], object], request: T, give_up: float) -> object | None:
        """Retries a settle call on transient errors until `give_up`."""
        attempt = 0
        while True:
            try:
                return call(request)
            except grpc.RpcError as err:
                code, details = rpc_error(err)
                if code in TRANSIENT_CODES and time.monotonic() < give_up:
                    attempt += 1
                    time.sleep(RETRY.delay(attempt))
                    continue
                log.error("settle failed; the lease will expire and the messages be redelivered code=%s message=%s",
                          code.name if code else "?", details)
                return None

    @staticmethod
    def _report(what: str, lease_id: str, count: int, results: Sequence[pb.MessageResult]) -> None:
        lost = sum(1 for r in results if r.outcome == pb.OUTCOME_LEASE_LOST)
        if lost:
            log.warning("%s: lease lost for some messages; they will be delivered again lease_id=%s lost=%d",
                        what, lease_id, lost)
        log.debug("%s done lease_id=%s count=%d", what, lease_id, count)


# --------------------------------------------------------------------------
# Process
# --------------------------------------------------------------------------


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(threadName)s %(message)s",
        stream=sys.stderr,
    )
    # pika logs every failed reconnect attempt; we log state changes ourselves.
    logging.getLogger("pika").setLevel(logging.DEBUG if level == "DEBUG" else logging.CRITICAL)


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(argv)
    configure_logging(config.log_level)

    stop = STOP
    signal.signal(signal.SIGTERM, _request_stop)  # again, for callers of main() other than __main__
    signal.signal(signal.SIGINT, _request_stop)

    leases = GrpcLeases(config.server, config.tls, config.token)
    if config.token is not None:
        threading.Thread(target=config.token.watch, args=(stop,), name="token-file", daemon=True).start()
    broker = Broker(config)
    settings = Settings(
        outbox=config.outbox,
        worker_id=config.worker_id,
        batch_size=config.batch_size,
        lease=config.lease,
        wait=config.wait,
        confirm_timeout=config.confirm_timeout,
        ack_with_claim=config.ack_with_claim,
    )
    server = LinkState(up=True)  # assume up: the first failure is then a change worth a line
    carried = CarriedAcks()
    slots = [
        threading.Thread(
            target=Worker(leases, broker.publisher(), settings, server, stop, carried).run,
            name=f"slot-{n}",
            daemon=True,
        )
        for n in range(config.concurrency)
    ]
    broker.start()
    for thread in slots:
        thread.start()
    log.info("relaying server=%s tls=%s token_file=%s outbox=%s exchange=%s worker_id=%s concurrency=%d",
             config.server, config.secure, config.token.path if config.token else None, config.outbox,
             config.exchange, config.worker_id, config.concurrency)

    while not stop.wait(1.0):
        pass
    log.info("stopped claiming; finishing in-flight batches timeout=%.0fs", config.drain_timeout)
    deadline = time.monotonic() + config.drain_timeout
    for thread in slots:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = any(thread.is_alive() for thread in slots)
    if stuck:
        log.warning("drain timed out; unfinished batches are left to lease expiry")
    broker.close(timeout=5.0)
    leases.close()
    log.info("stopped")
    if stuck:
        # Slot threads still blocked in a call must not hold up interpreter exit.
        logging.shutdown()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
