"""The worker loop and its pure helpers, driven by fakes: no server, no broker.

These pin down the settle rules a port to another language must keep: ack only
what was confirmed, nack rejections with the broker's reason and the outbox's
backoff, release failures for a prompt retry, extend long-running leases.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest

import relay
from relay import CONFIRMED, Delivery, failed, pb, rejected


def message(n: int, **headers: str) -> pb.OutboxMessage:
    m = pb.OutboxMessage(id=f"id-{n}", aggregate_id=f"agg-{n}", event_type="order.created",
                         payload=b'{"n": %d}' % n, attempt=2, sequence=100 + n, headers=headers)
    m.created_at.FromSeconds(1_700_000_000 + n)
    return m


class Unavailable(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """A transient gRPC failure, as grpcio raises it."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection refused"

    # grpc.Call's other abstract methods, unused here.
    def initial_metadata(self): ...  # noqa: E704
    def trailing_metadata(self): ...  # noqa: E704
    def is_active(self): ...  # noqa: E704
    def time_remaining(self): ...  # noqa: E704
    def cancel(self): ...  # noqa: E704
    def add_callback(self, callback): ...  # noqa: E704


class FakeLeases:
    """Records calls; claims hand out the queued batches (with a result for each
    carried ack, unless it plays an older server), then stop the worker."""

    def __init__(self, batches: Sequence[pb.ClaimBatchResponse] = (), stop: threading.Event | None = None,
                 ack_failures: int = 0, failing_claims: Sequence[int] = (), answers_carried: bool = True) -> None:
        self.batches = list(batches)
        self.stop = stop
        self.ack_failures = ack_failures
        self.failing_claims = set(failing_claims)
        self.answers_carried = answers_carried
        self.acks: list[pb.AckRequest] = []
        self.nacks: list[pb.NackRequest] = []
        self.extends: list[pb.ExtendLeaseRequest] = []
        self.claims: list[pb.ClaimBatchRequest] = []

    def claim(self, request, stop):
        self.claims.append(request)
        if len(self.claims) in self.failing_claims:
            raise Unavailable()
        if not self.batches:
            assert self.stop is not None
            self.stop.set()
            return None
        response = pb.ClaimBatchResponse()
        response.CopyFrom(self.batches.pop(0))
        if self.answers_carried:
            response.ack_results.extend(pb.MessageResult(message_id=i, outcome=pb.OUTCOME_OK)
                                        for ack in request.acks for i in ack.message_ids)
        return response

    def ack(self, request):
        if self.ack_failures:
            self.ack_failures -= 1
            raise Unavailable()
        self.acks.append(request)
        return pb.AckResponse(results=[pb.MessageResult(message_id=i, outcome=pb.OUTCOME_OK)
                                       for i in request.message_ids])

    def nack(self, request):
        self.nacks.append(request)
        return pb.NackResponse()

    def extend(self, request):
        self.extends.append(request)
        return pb.ExtendLeaseResponse()


class FakePublisher:
    """Answers each batch with the given deliveries, after an optional delay."""

    def __init__(self, deliveries: Sequence[Delivery] | Exception, delay: float = 0.0) -> None:
        self.deliveries = deliveries
        self.delay = delay
        self.published: list[list[str]] = []

    def ready(self) -> str | None:
        return None

    def publish(self, messages):
        self.published.append([m.id for m in messages])
        future: concurrent.futures.Future[list[Delivery]] = concurrent.futures.Future()

        def answer() -> None:
            if isinstance(self.deliveries, Exception):
                future.set_exception(self.deliveries)
            else:
                future.set_result(list(self.deliveries))

        if self.delay:
            timer = threading.Timer(self.delay, answer)
            timer.daemon = True  # a never-answering publisher must not hold up pytest's exit
            timer.start()
        else:
            answer()
        return future


def settings(lease: float = 30.0, confirm_timeout: float = 15.0, ack_with_claim: bool = True) -> relay.Settings:
    return relay.Settings(outbox="orders", worker_id="w-1", batch_size=10, lease=lease, wait=5.0,
                          confirm_timeout=confirm_timeout, ack_with_claim=ack_with_claim)


def worker(leases: FakeLeases, publisher: FakePublisher, **kw: float) -> relay.Worker:
    """A slot that acks with Ack calls: the settle rules are checked on the calls themselves."""
    return relay.Worker(leases, publisher, settings(ack_with_claim=False, **kw), relay.LinkState(up=True),
                        threading.Event())


def batch(count: int, lease_id: str = "lease-1") -> pb.ClaimBatchResponse:
    return pb.ClaimBatchResponse(lease_id=lease_id, messages=[message(n) for n in range(count)])


# ---- settle rules ----------------------------------------------------------


def test_confirmed_are_acked_and_the_rest_nacked_by_reason() -> None:
    leases = FakeLeases()
    publisher = FakePublisher([
        CONFIRMED,
        rejected("returned by broker: 312 NO_ROUTE"),
        failed("connection lost"),
        CONFIRMED,
        rejected("returned by broker: 312 NO_ROUTE"),
    ])
    worker(leases, publisher).relay(batch(5))

    assert [list(a.message_ids) for a in leases.acks] == [["id-0", "id-3"]]
    assert leases.acks[0].lease_id == "lease-1" and leases.acks[0].outbox == "orders"
    nacks = {n.error: n for n in leases.nacks}
    unroutable = nacks["returned by broker: 312 NO_ROUTE"]
    assert list(unroutable.message_ids) == ["id-1", "id-4"]
    assert not unroutable.HasField("retry_after"), "a rejection follows the outbox's backoff policy"
    lost = nacks["connection lost"]
    assert list(lost.message_ids) == ["id-2"]
    assert lost.retry_after.ToTimedelta().total_seconds() == relay.FAILED_RETRY_AFTER
    assert not any(n.dead_letter for n in leases.nacks)


def test_messages_without_an_outcome_are_released_never_acked() -> None:
    leases = FakeLeases()
    worker(leases, FakePublisher([CONFIRMED])).relay(batch(3))
    assert [list(a.message_ids) for a in leases.acks] == [["id-0"]]
    assert [(n.error, list(n.message_ids)) for n in leases.nacks] == [
        ("publisher gave no outcome", ["id-1", "id-2"])]


def test_an_unavailable_broker_releases_the_whole_batch() -> None:
    leases = FakeLeases()
    worker(leases, FakePublisher(relay.BrokerUnavailable("connection lost: 320 CONNECTION_FORCED"))).relay(batch(2))
    assert leases.acks == []
    assert [(n.error, list(n.message_ids)) for n in leases.nacks] == [
        ("connection lost: 320 CONNECTION_FORCED", ["id-0", "id-1"])]


def test_a_transient_ack_failure_is_retried() -> None:
    leases = FakeLeases(ack_failures=2)
    worker(leases, FakePublisher([CONFIRMED])).relay(batch(1))
    assert [list(a.message_ids) for a in leases.acks] == [["id-0"]]


def test_a_slow_publish_gets_its_lease_extended() -> None:
    leases = FakeLeases()
    # Lease 0.2 s: extended every 0.1 s while the publish takes 0.45 s.
    worker(leases, FakePublisher([CONFIRMED], delay=0.45), lease=0.2).relay(batch(1))
    assert len(leases.extends) >= 3
    assert all(e.lease_id == "lease-1" and e.lease_duration.ToTimedelta().total_seconds() == 0.2
               for e in leases.extends)
    assert [list(a.message_ids) for a in leases.acks] == [["id-0"]]


class LeaseLost(Unavailable):
    """outboxd's answer to ExtendLease without ids of a lease that holds nothing."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.FAILED_PRECONDITION

    def details(self) -> str:
        return "lease lease-1 holds no messages: it expired and was claimed again, or never existed"


class LosingLeases(FakeLeases):
    def extend(self, request):
        self.extends.append(request)
        raise LeaseLost()


def test_a_lost_lease_is_not_extended_again() -> None:
    leases = LosingLeases()
    # Lease 0.2 s: the first extension (at 0.1 s) says the lease is lost.
    worker(leases, FakePublisher([CONFIRMED], delay=0.45), lease=0.2).relay(batch(1))
    assert len(leases.extends) == 1
    assert [list(a.message_ids) for a in leases.acks] == [["id-0"]], "the publish is still settled"


def test_a_publisher_that_never_answers_releases_the_batch() -> None:
    leases = FakeLeases()
    publisher = FakePublisher([CONFIRMED], delay=30)
    original_grace = relay.PUBLISH_GRACE
    relay.PUBLISH_GRACE = 0.0
    try:
        worker(leases, publisher, confirm_timeout=0.2).relay(batch(1))
    finally:
        relay.PUBLISH_GRACE = original_grace
    assert leases.acks == []
    assert [list(n.message_ids) for n in leases.nacks] == [["id-0"]]


def test_run_claims_until_stopped_and_settles_what_it_claimed() -> None:
    stop = threading.Event()
    leases = FakeLeases([batch(2, "lease-a"), pb.ClaimBatchResponse(), batch(1, "lease-b")], stop=stop)
    publisher = FakePublisher([CONFIRMED, CONFIRMED])
    relay.Worker(leases, publisher, settings(ack_with_claim=False), relay.LinkState(up=True), stop).run()
    assert publisher.published == [["id-0", "id-1"], ["id-0"]]
    assert [a.lease_id for a in leases.acks] == ["lease-a", "lease-b"]
    assert all(not c.acks for c in leases.claims)
    request = leases.claims[0]
    assert (request.outbox, request.worker_id, request.max_messages) == ("orders", "w-1", 10)
    assert request.lease_duration.seconds == 30 and request.wait.seconds == 5
    assert request.max_response_bytes == relay.MAX_RESPONSE_BYTES, "the channel's receive limit"


# ---- acks carried by the next claim ----------------------------------------


def carried(request: pb.ClaimBatchRequest) -> list[tuple[str, list[str]]]:
    return [(a.lease_id, list(a.message_ids)) for a in request.acks]


def run(leases: FakeLeases, stop: threading.Event, carried_acks: relay.CarriedAcks | None = None) -> FakePublisher:
    publisher = FakePublisher([CONFIRMED, CONFIRMED])
    relay.Worker(leases, publisher, settings(), relay.LinkState(up=True), stop, carried_acks).run()
    return publisher


def test_acks_ride_on_the_next_claim() -> None:
    stop = threading.Event()
    leases = FakeLeases([batch(2, "lease-a"), pb.ClaimBatchResponse(), batch(1, "lease-b")], stop=stop)
    publisher = run(leases, stop)
    assert publisher.published == [["id-0", "id-1"], ["id-0"]]
    assert [carried(c) for c in leases.claims] == [
        [], [("lease-a", ["id-0", "id-1"])], [], [("lease-b", ["id-0"])]]
    # The last claim was cancelled by the stop: its acks may not have been
    # applied, so they go again as an Ack call (a repeat is ALREADY_DONE).
    assert [(a.lease_id, list(a.message_ids)) for a in leases.acks] == [("lease-b", ["id-0"])]


def test_an_older_server_that_ignores_carried_acks_gets_ack_calls(caplog: pytest.LogCaptureFixture) -> None:
    stop = threading.Event()
    shared = relay.CarriedAcks()
    leases = FakeLeases([batch(2, "lease-a"), batch(1, "lease-b"), pb.ClaimBatchResponse()], stop=stop,
                        answers_carried=False)
    run(leases, stop, shared)
    assert [carried(c) for c in leases.claims] == [[], [("lease-a", ["id-0", "id-1"])], [], []]
    assert [a.lease_id for a in leases.acks] == ["lease-a", "lease-b"]
    assert not shared.supported()
    assert sum("ignores acks sent with a claim" in r.getMessage() for r in caplog.records) == 1


def test_the_acks_of_a_failed_claim_go_as_an_ack_call() -> None:
    stop = threading.Event()
    leases = FakeLeases([batch(2, "lease-a"), pb.ClaimBatchResponse()], stop=stop, failing_claims=[2])
    run(leases, stop)
    assert [carried(c) for c in leases.claims] == [[], [("lease-a", ["id-0", "id-1"])], [], []]
    assert [a.lease_id for a in leases.acks] == ["lease-a"]


def test_a_slot_that_backs_off_sends_its_acks_first() -> None:
    stop = threading.Event()
    leases = FakeLeases([batch(1, "lease-a")], stop=stop)
    publisher = FakePublisher([CONFIRMED])
    slot = relay.Worker(leases, publisher, settings(), relay.LinkState(up=True), stop)
    slot._step(0)
    assert leases.acks == []  # waiting for the next claim
    publisher.ready = lambda: "RabbitMQ not connected"  # type: ignore[method-assign]
    slot._step(0)
    assert [a.lease_id for a in leases.acks] == ["lease-a"]


# ---- pure helpers ----------------------------------------------------------


def test_amqp_properties_match_the_rust_relay() -> None:
    props = relay.amqp_properties(message(7, traceparent="00-abc-01", **{"x-outbox-attempt": "spoofed"}))
    assert props.message_id == "id-7"
    assert props.type == "order.created"
    assert props.content_type == "application/json"
    assert props.delivery_mode == 2
    assert props.timestamp == 1_700_000_007
    assert props.headers == {
        "traceparent": "00-abc-01",
        "x-aggregate-id": "agg-7",
        "x-outbox-attempt": 2,  # ours win over a producer header of the same name
        "x-outbox-sequence": 107,
    }


def test_routing_key_templates() -> None:
    assert relay.RoutingKey("{event_type}").render("order.created", "a1") == "order.created"
    assert relay.RoutingKey("orders.{aggregate_id}.{event_type}!").render("created", "42") == "orders.42.created!"
    assert relay.RoutingKey("fixed").render("x", "y") == "fixed"
    for bad in ["{event", "{nope}", "a}b"]:
        with pytest.raises(ValueError):
            relay.RoutingKey(bad)


@pytest.mark.parametrize(("raw", "seconds"), [
    ("30", 30.0), ("1.5", 1.5), ("30s", 30.0), ("500ms", 0.5), ("2m", 120.0), ("1m30s", 90.0), ("1h", 3600.0),
])
def test_durations(raw: str, seconds: float) -> None:
    assert relay.parse_duration(raw) == seconds


@pytest.mark.parametrize("raw", ["", "s", "10x", "ten", "5s junk"])
def test_bad_durations(raw: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        relay.parse_duration(raw)


def test_server_accepts_targets_and_the_rust_relays_urls() -> None:
    assert relay.grpc_target("127.0.0.1:50051") == ("127.0.0.1:50051", False)
    assert relay.grpc_target("dns:///outboxd:50051") == ("dns:///outboxd:50051", False)
    assert relay.grpc_target("http://127.0.0.1:50051") == ("127.0.0.1:50051", False)
    assert relay.grpc_target("https://outboxd.internal") == ("outboxd.internal:443", True)


def test_defaults_match_the_documented_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ["OUTBOX_SERVER", "AMQP_URL"] + [f"OUTBOX_RELAY_{s}" for s in (
            "OUTBOX", "EXCHANGE", "NO_DECLARE", "ROUTING_KEY", "BATCH_SIZE", "LEASE", "CONCURRENCY",
            "WORKER_ID", "CONFIRM_TIMEOUT", "WAIT", "DRAIN_TIMEOUT", "LOG_LEVEL", "ACK_WITH_CLAIM")]:
        monkeypatch.delenv(name, raising=False)
    config = relay.parse_config([])
    assert config.server == "127.0.0.1:50051"
    assert config.outbox == "default"
    assert config.amqp_url == "amqp://guest:guest@127.0.0.1:5672/%2f"
    assert config.exchange == "outbox" and config.declare
    assert config.routing_key.template == "{event_type}"
    assert (config.batch_size, config.lease, config.concurrency) == (100, 30.0, 4)
    assert (config.confirm_timeout, config.wait, config.drain_timeout) == (15.0, 20.0, 20.0)
    assert config.ack_with_claim
    assert config.worker_id.endswith(f"-{relay.os.getpid()}")
    assert "guest:guest" not in repr(config)


def test_env_vars_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_RELAY_LEASE", "45s")
    monkeypatch.setenv("OUTBOX_RELAY_NO_DECLARE", "true")
    monkeypatch.setenv("OUTBOX_RELAY_EXCHANGE", "events")
    config = relay.parse_config([])
    assert (config.lease, config.declare, config.exchange) == (45.0, False, "events")
    assert relay.parse_config(["--exchange", "flag-wins"]).exchange == "flag-wins"
    monkeypatch.setenv("OUTBOX_RELAY_ACK_WITH_CLAIM", "false")
    assert not relay.parse_config([]).ack_with_claim
    assert relay.parse_config(["--ack-with-claim", "true"]).ack_with_claim
    with pytest.raises(SystemExit):
        relay.parse_config(["--ack-with-claim", "maybe"])


def test_passwords_are_masked() -> None:
    assert relay.redact_url("amqp://guest:secret@host:5672/%2f") == "amqp://guest:redacted@host:5672/%2f"
    assert relay.redact_url("amqp://host/%2f") == "amqp://host/%2f"


# --------------------------------------------------------------------------
# TLS and token options
# --------------------------------------------------------------------------

TLS_ENV = ("OUTBOX_SERVER", "OUTBOX_RELAY_TOKEN_FILE", "OUTBOX_RELAY_TLS_CA", "OUTBOX_RELAY_TLS_CERT",
           "OUTBOX_RELAY_TLS_KEY", "AMQP_URL", "OUTBOX_RELAY_AMQP_TLS_CA")


@pytest.fixture
def pki(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A self-signed certificate for localhost (its own CA) and its key, a
    second one for a client, and a token file; no TLS env vars leak in."""
    for name in TLS_ENV:
        monkeypatch.delenv(name, raising=False)
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make test certificates")
    files = {}
    for name, cn in (("server", "localhost"), ("client", "relay")):
        cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                        "-nodes", "-days", "1", "-subj", f"/CN={cn}", "-addext", f"subjectAltName=DNS:{cn}",
                        "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
        files[f"{name}_cert"], files[f"{name}_key"] = str(cert), str(key)
    token = tmp_path / "token"
    token.write_text("  s3cret-token\n")
    files["token"] = str(token)
    files["dir"] = str(tmp_path)
    return files


def config_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one-line usage error parse_config exits with."""
    with pytest.raises(SystemExit) as exited:
        relay.parse_config(argv)
    assert exited.value.code == 64, "EX_USAGE, as the Rust relay"
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_https_turns_tls_on_with_the_given_ca_and_client_certificate(pki: dict[str, str]) -> None:
    plain = relay.parse_config([])
    assert plain.tls is None and plain.token is None
    system_roots = relay.parse_config(["--server", "https://outboxd:50051"])
    assert system_roots.tls is not None and system_roots.tls.ca is None
    mutual = relay.parse_config(["--server", "https://outboxd:50051", "--tls-ca", pki["server_cert"],
                                 "--tls-cert", pki["client_cert"], "--tls-key", pki["client_key"]])
    assert mutual.tls is not None and mutual.tls.ca and mutual.tls.cert and mutual.tls.key
    assert b"PRIVATE KEY" not in repr(mutual).encode(), "repr shows no key"


def test_tls_flags_need_https_and_come_in_pairs(pki: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    https = ["--server", "https://outboxd:50051"]
    for argv, says in [
        (["--tls-ca", pki["server_cert"]], "--tls-ca needs an https:// --server"),
        (["--server", "outboxd:50051", "--tls-cert", pki["client_cert"]], "--tls-cert needs an https://"),
        (https + ["--tls-cert", pki["client_cert"]], "--tls-cert needs --tls-key"),
        (https + ["--tls-key", pki["client_key"]], "--tls-key needs --tls-cert"),
        (https + ["--tls-ca", pki["token"]], "no PEM certificate"),
        (https + ["--tls-cert", pki["client_cert"], "--tls-key", pki["client_cert"]], "no PEM private key"),
        (https + ["--tls-ca", "/nonexistent/ca.pem"], "/nonexistent/ca.pem"),
    ]:
        assert says in config_error(argv, capsys), argv


def test_tls_flags_come_from_the_rust_relays_env_vars(pki: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_SERVER", "https://outboxd:50051")
    monkeypatch.setenv("OUTBOX_RELAY_TLS_CA", pki["server_cert"])
    monkeypatch.setenv("OUTBOX_RELAY_TLS_CERT", pki["client_cert"])
    monkeypatch.setenv("OUTBOX_RELAY_TLS_KEY", pki["client_key"])
    monkeypatch.setenv("OUTBOX_RELAY_TOKEN_FILE", pki["token"])
    config = relay.parse_config([])
    assert config.tls is not None and config.tls.cert is not None
    assert config.token is not None and config.token.path == pki["token"]


def test_the_token_file_is_trimmed_and_must_hold_a_token(pki: dict[str, str],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    config = relay.parse_config(["--token-file", pki["token"]])
    assert config.token is not None
    assert config.token.metadata() == (("authorization", "Bearer s3cret-token"),)
    assert "s3cret" not in repr(config)
    empty = Path(pki["dir"]) / "empty"
    empty.write_text("\n")
    spaced = Path(pki["dir"]) / "spaced"
    spaced.write_text("two words")
    for path, says in [(str(empty), "empty"), ("/nonexistent/token", "/nonexistent/token"),
                       (str(spaced), "visible ASCII")]:
        err = config_error(["--token-file", path], capsys)
        assert "--token-file" in err and says in err, err
        assert "two words" not in err


def test_a_changed_token_file_is_used_and_a_failed_read_keeps_the_token(
        pki: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    token = relay.TokenFile(pki["token"])
    assert not token.reload(), "unchanged"
    Path(pki["token"]).write_text("rotated\n")
    assert token.reload()
    assert token.metadata() == (("authorization", "Bearer rotated"),)
    Path(pki["token"]).unlink()
    assert not token.reload() and not token.reload()
    assert token.metadata() == (("authorization", "Bearer rotated"),)
    warnings = [r for r in caplog.records if "cannot re-read the token file" in r.getMessage()]
    assert len(warnings) == 1, "one warning per reason, not per poll"
    Path(pki["token"]).write_text("")
    assert not token.reload()
    assert token.metadata() == (("authorization", "Bearer rotated"),)
    Path(pki["token"]).write_text("third")
    assert token.reload()
    assert token.metadata() == (("authorization", "Bearer third"),)


class _Recorder(relay.pb_grpc.OutboxServiceServicer):
    """Answers ClaimBatch with nothing and records its authorization header."""

    def __init__(self) -> None:
        self.seen: list[str | None] = []

    def ClaimBatch(self, request, context):  # noqa: N802 - the generated name
        self.seen.append(dict(context.invocation_metadata()).get("authorization"))
        return relay.pb.ClaimBatchResponse()


def _serve(recorder: _Recorder, credentials: grpc.ServerCredentials | None) -> tuple[grpc.Server, int]:
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
    relay.pb_grpc.add_OutboxServiceServicer_to_server(recorder, server)
    address = "localhost:0"
    port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    server.start()
    return server, port


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "mutual-tls"])
def test_calls_carry_the_token_of_the_file_as_it_changes(pki: dict[str, str], tls: bool) -> None:
    """Metadata, not call credentials: grpc refuses those on a plaintext channel."""
    read = lambda name: Path(pki[name]).read_bytes()  # noqa: E731
    credentials = grpc.ssl_server_credentials([(read("server_key"), read("server_cert"))],
                                              root_certificates=read("client_cert"),
                                              require_client_auth=True) if tls else None
    recorder = _Recorder()
    server, port = _serve(recorder, credentials)
    try:
        argv = ["--server", f"{'https' if tls else 'http'}://localhost:{port}", "--token-file", pki["token"]]
        if tls:
            argv += ["--tls-ca", pki["server_cert"], "--tls-cert", pki["client_cert"], "--tls-key", pki["client_key"]]
        config = relay.parse_config(argv)
        leases = relay.GrpcLeases(config.server, config.tls, config.token)
        never = threading.Event()
        assert leases.claim(relay.pb.ClaimBatchRequest(outbox="default"), never) is not None
        Path(pki["token"]).write_text("rotated")
        assert config.token is not None and config.token.reload()
        assert leases.claim(relay.pb.ClaimBatchRequest(outbox="default"), never) is not None
        leases.close()
        assert recorder.seen == ["Bearer s3cret-token", "Bearer rotated"]
    finally:
        server.stop(None)


def test_a_server_the_ca_did_not_sign_is_refused(pki: dict[str, str]) -> None:
    read = lambda name: Path(pki[name]).read_bytes()  # noqa: E731
    recorder = _Recorder()
    server, port = _serve(recorder, grpc.ssl_server_credentials([(read("server_key"), read("server_cert"))]))
    try:
        config = relay.parse_config(["--server", f"https://localhost:{port}", "--tls-ca", pki["client_cert"]])
        leases = relay.GrpcLeases(config.server, config.tls, config.token)
        with pytest.raises(grpc.RpcError) as refused:
            leases.claim(relay.pb.ClaimBatchRequest(outbox="default"), threading.Event())
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        leases.close()
        assert recorder.seen == []
    finally:
        server.stop(None)


# --------------------------------------------------------------------------
# --amqp-tls-ca
# --------------------------------------------------------------------------

AMQPS = "amqps://guest:guest@localhost/%2f"


def test_amqp_tls_ca_is_read_and_added_to_pikas_context(pki: dict[str, str]) -> None:
    config = relay.parse_config(["--amqp-url", AMQPS, "--amqp-tls-ca", pki["server_cert"]])
    assert config.amqp_tls_ca is not None and "BEGIN CERTIFICATE" in config.amqp_tls_ca
    assert "BEGIN CERTIFICATE" not in repr(config), "repr shows no certificate"
    params = relay.amqp_parameters(config.amqp_url, config.amqp_tls_ca)
    assert params.port == 5671, "amqps:// keeps pika's TLS port"
    context = params.ssl_options.context
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    subjects = [dict(field[0] for field in ca["subject"]) for ca in context.get_ca_certs()]
    assert {"commonName": "localhost"} in subjects

    # Without the flag: pika's own default context, nothing added; amqp:// has no TLS at all.
    default = relay.parse_config(["--amqp-url", AMQPS])
    assert default.amqp_tls_ca is None
    params = relay.amqp_parameters(default.amqp_url, default.amqp_tls_ca)
    assert params.ssl_options is not None
    assert {"commonName": "localhost"} not in [dict(f[0] for f in ca["subject"])
                                               for ca in params.ssl_options.context.get_ca_certs()]
    assert relay.amqp_parameters("amqp://guest:guest@localhost/%2f", None).ssl_options is None


def test_amqp_tls_ca_comes_from_the_rust_relays_env_var(pki: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMQP_URL", AMQPS)
    monkeypatch.setenv("OUTBOX_RELAY_AMQP_TLS_CA", pki["server_cert"])
    assert relay.parse_config([]).amqp_tls_ca is not None
    # A flag wins over the env var, as every other option.
    with pytest.raises(SystemExit):
        relay.parse_config(["--amqp-tls-ca", "/nonexistent/ca.pem"])


def test_amqp_tls_ca_errors_are_one_line_and_exit_64(pki: dict[str, str], capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    garbled = tmp_path / "garbled.pem"
    garbled.write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")
    binary = tmp_path / "binary.pem"
    binary.write_bytes(b"-----BEGIN CERTIFICATE-----\n\xff\xfe\n-----END CERTIFICATE-----\n")
    for argv, says in [
        (["--amqp-url", "amqp://guest:guest@localhost/%2f", "--amqp-tls-ca", pki["server_cert"]],
         "--amqp-tls-ca needs an amqps:// --amqp-url"),
        # the default --amqp-url is amqp:// too
        (["--amqp-tls-ca", pki["server_cert"]], "--amqp-tls-ca needs an amqps:// --amqp-url"),
        (["--amqp-url", AMQPS, "--amqp-tls-ca", pki["token"]], "--amqp-tls-ca"),
        (["--amqp-url", AMQPS, "--amqp-tls-ca", "/nonexistent/ca.pem"], "--amqp-tls-ca /nonexistent/ca.pem"),
        (["--amqp-url", AMQPS, "--amqp-tls-ca", str(garbled)], "does not parse"),
        (["--amqp-url", AMQPS, "--amqp-tls-ca", str(binary)], "not a text PEM file"),
        (["--amqp-url", "http://localhost/", "--amqp-tls-ca", pki["server_cert"]],
         "--amqp-url must be an amqp:// or amqps:// URL"),
    ]:
        line = config_error(argv, capsys)
        assert says in line, (argv, line)
        assert "s3cret-token" not in line and "bm90IGEg" not in line, "the file's content is never shown"
    assert "no PEM certificate" in config_error(["--amqp-url", AMQPS, "--amqp-tls-ca", pki["token"]], capsys)


def _tls_handshake(context: ssl.SSLContext, pki: dict[str, str]) -> None:
    """A TLS handshake with `context` against a local server presenting the
    localhost certificate of `pki` (signed by itself)."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(pki["server_cert"], pki["server_key"])
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            try:
                with server_context.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (ssl.SSLError, OSError):
                pass

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                    context.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(b"x")
        finally:
            thread.join(10)


def test_the_amqp_ca_decides_the_brokers_handshake(pki: dict[str, str]) -> None:
    """What pika's connection gets: with --amqp-tls-ca a broker certificate that
    CA signed is accepted; without it the same certificate is refused."""
    trusted = relay.amqp_parameters(AMQPS, relay.amqp_ca(AMQPS, pki["server_cert"]))
    _tls_handshake(trusted.ssl_options.context, pki)
    with pytest.raises(ssl.SSLCertVerificationError):
        _tls_handshake(relay.amqp_parameters(AMQPS, None).ssl_options.context, pki)
