"""End to end: real PostgreSQL, a real outboxd, real RabbitMQ, relay.py as a subprocess.

Each test gets its own database, outboxd (on a free port), exchange and queue,
all removed at the end, also when the test fails. Every wait polls a condition
under a deadline; nothing sleeps a fixed time to let something happen.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pika
import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from relay import pb, pb_grpc

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RELAY = HERE / "relay.py"
OUTBOXD_BIN = Path(os.environ.get("OUTBOXD_BIN", REPO / "target" / "debug" / "outboxd"))
ADMIN_URL = os.environ.get("OUTBOXD_TEST_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
AMQP_URL = os.environ.get("OUTBOXD_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")

#: Upper bound for any one wait in these tests; a healthy run needs a few seconds.
DEADLINE = 40.0


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def wait_until(condition: Callable[[], Any], what: str, timeout: float = DEADLINE,
               diagnostics: Callable[[], str] = lambda: "") -> Any:
    """Polls `condition` until it returns something truthy; fails after `timeout`.

    The short pause only paces the polling; the deadline is what decides.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting until {what}\n{diagnostics()}")
        time.sleep(0.05)


def database_url(name: str) -> str:
    url = urllib.parse.urlsplit(ADMIN_URL)
    return urllib.parse.urlunsplit(url._replace(path=f"/{name}"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int = 60) -> str:
    if not path.exists():
        return f"({path.name}: no output)"
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return f"--- last lines of {path.name} ---\n" + "\n".join(text)


@dataclasses.dataclass
class Process:
    """A child process with its output in a file, for diagnostics on failure."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def logs(self) -> str:
        return tail(self.log)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then the exit code; SIGKILL only if it does not exit in time."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            pytest.fail(f"{self.name} did not exit within {timeout:.0f}s of SIGTERM\n{self.logs()}")


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Callable[..., Process]]:
    """Starts child processes; kills whatever is still running at the end."""
    started: list[Process] = []

    def start(name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        log = tmp_path / f"{name}-{len(started) + 1}.log"  # a restarted process gets a log of its own
        out = log.open("wb")
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        out.close()
        proc = Process(name, popen, log)
        started.append(proc)
        return proc

    yield start
    for proc in reversed(started):
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait()
        # Shown by pytest only when the test failed.
        print(proc.logs())


# --------------------------------------------------------------------------
# PostgreSQL, outboxd, RabbitMQ
# --------------------------------------------------------------------------


@pytest.fixture
def database() -> Iterator[str]:
    """A fresh database of its own, dropped at the end even when the test fails."""
    name = f"outboxd_pyrelay_{uuid.uuid4().hex}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield database_url(name)
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@dataclasses.dataclass
class Outboxd:
    target: str
    process: Process

    @property
    def port(self) -> int:
        return int(self.target.rsplit(":", 1)[1])


@pytest.fixture
def outboxd(database: str, processes: Callable[..., Process]) -> Callable[..., Outboxd]:
    """Starts outboxd against the test database on a free port, ready to serve."""

    def start(*extra: str, port: int | None = None) -> Outboxd:
        """Starts outboxd; pass `port` to bring one back where a killed one was."""
        assert OUTBOXD_BIN.exists(), f"{OUTBOXD_BIN} not found; run `cargo build` or set OUTBOXD_BIN"
        port = port or free_port()
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info"), "NO_COLOR": "1"}
        proc = processes("outboxd", [
            str(OUTBOXD_BIN), "--database-url", database, "--listen", f"127.0.0.1:{port}",
            "--metrics-listen", "127.0.0.1:0", "--poll-interval", "200ms", *extra,
        ], env=env)
        target = f"127.0.0.1:{port}"
        with grpc.insecure_channel(target) as channel:
            stub = pb_grpc.OutboxServiceStub(channel)

            def serving() -> bool:
                assert proc.popen.poll() is None, f"outboxd exited with {proc.popen.returncode}\n{proc.logs()}"
                try:
                    stub.GetStats(pb.GetStatsRequest(outbox="default"), timeout=1)
                    return True
                except grpc.RpcError:
                    return False

            wait_until(serving, "outboxd serves", diagnostics=proc.logs)
        return Outboxd(target, proc)

    return start


@dataclasses.dataclass
class Rabbit:
    exchange: str
    queue: str


def amqp_connection() -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(AMQP_URL))


@pytest.fixture
def rabbit() -> Iterator[Rabbit]:
    """A unique exchange (durable topic, as the relay declares it) and queue
    names; both are deleted at the end, also when the test fails."""
    exchange = f"pyrelay_{uuid.uuid4().hex[:12]}"
    names = Rabbit(exchange=exchange, queue=f"{exchange}_q")
    with amqp_connection() as conn:
        conn.channel().exchange_declare(names.exchange, exchange_type="topic", durable=True)
    try:
        yield names
    finally:
        with amqp_connection() as conn:
            channel = conn.channel()
            channel.queue_delete(names.queue)
            channel.exchange_delete(names.exchange)


def start_relay(processes: Callable[..., Process], server: Outboxd, exchange: str, *extra: str,
                worker_id: str | None = None) -> Process:
    # Flags override any OUTBOX_* / AMQP_URL set in the caller's environment.
    return processes("relay", [
        sys.executable, str(RELAY),
        "--server", server.target,
        "--amqp-url", AMQP_URL,
        "--exchange", exchange,
        "--worker-id", worker_id or f"pytest-{uuid.uuid4().hex[:8]}",
        *extra,
    ])


def close_amqp_connection(connection_name: str) -> None:
    """Has RabbitMQ force-close one named client connection (and only that one:
    other tests may share the broker)."""
    listing = subprocess.run(
        ["rabbitmqctl", "list_connections", "pid", "client_properties", "-q", "--no-table-headers"],
        check=True, capture_output=True, text=True, timeout=30,
    ).stdout
    pids = [line.split("\t", 1)[0] for line in listing.splitlines() if connection_name in line]
    assert pids, f"no RabbitMQ connection named {connection_name!r}:\n{listing}"
    for pid in pids:
        subprocess.run(["rabbitmqctl", "close_connection", pid, "closed by test_e2e"],
                       check=True, capture_output=True, timeout=30)


# --------------------------------------------------------------------------
# producers
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Event:
    id: str
    aggregate_id: str
    event_type: str
    payload: dict[str, Any]
    headers: dict[str, str]


def make_event(producer: int, txn: int, n: int) -> Event:
    return Event(
        id=str(uuid.uuid4()),
        aggregate_id=f"order-{producer}-{txn}",
        event_type=("order.created", "order.paid", "order.shipped")[n % 3],
        payload={"producer": producer, "txn": txn, "n": n, "note": "ünïcode ✓"},
        headers={"traceparent": f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01", "x-producer": str(producer)},
    )


def insert(cur: psycopg.Cursor[Any], events: list[Event]) -> None:
    cur.executemany(
        "INSERT INTO outbox (id, aggregate_id, event_type, payload, headers) VALUES (%s, %s, %s, %s, %s)",
        [(e.id, e.aggregate_id, e.event_type, Jsonb(e.payload), Jsonb(e.headers)) for e in events],
    )


def produce(db_url: str, producer: int, txns: int, per_txn: int, rollback_every: int) -> tuple[list[Event], list[Event]]:
    """One producer: `txns` transactions of `per_txn` events; every
    `rollback_every`-th transaction is rolled back. Returns (committed, rolled back)."""
    committed: list[Event] = []
    rolled_back: list[Event] = []
    with psycopg.connect(db_url, autocommit=True) as conn:
        for txn in range(txns):
            events = [make_event(producer, txn, n) for n in range(per_txn)]
            rollback = txn % rollback_every == rollback_every - 1
            with conn.transaction(force_rollback=rollback), conn.cursor() as cur:
                insert(cur, events)
            (rolled_back if rollback else committed).extend(events)
    return committed, rolled_back


def produce_concurrently(db_url: str, producers: int, txns: int, per_txn: int,
                         rollback_every: int) -> tuple[dict[str, Event], set[str]]:
    with concurrent.futures.ThreadPoolExecutor(producers) as pool:
        futures = [pool.submit(produce, db_url, p, txns, per_txn, rollback_every) for p in range(producers)]
        results = [f.result() for f in futures]
    committed = {e.id: e for c, _ in results for e in c}
    rolled_back = {e.id for _, r in results for e in r}
    return committed, rolled_back


def outbox_rows(db_url: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(db_url) as conn, conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT id::text AS id, seq, created_at, published_at, dead_lettered_at, attempts, last_error "
                    "FROM outbox")
        return {row["id"]: row for row in cur.fetchall()}


# --------------------------------------------------------------------------
# consumer
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Received:
    routing_key: str
    properties: pika.BasicProperties
    body: bytes


class Consumer:
    """Collects what arrives in a queue, keyed by message_id (duplicates kept),
    and the message_ids in the order they arrived."""

    def __init__(self, queue: str) -> None:
        self.conn = amqp_connection()
        self.channel = self.conn.channel()
        self.channel.basic_qos(prefetch_count=500)
        self.queue = queue
        self.received: dict[str, list[Received]] = collections.defaultdict(list)
        self.arrivals: list[str] = []

    def take(self, stop_when: Callable[[], bool], timeout: float) -> bool:
        """Consumes until `stop_when()` holds (True) or `timeout` passes (False)."""
        deadline = time.monotonic() + timeout
        for method, props, body in self.channel.consume(self.queue, inactivity_timeout=0.2):
            if method is not None:
                self._keep(method, props, body)
            if stop_when():
                return True
            if time.monotonic() >= deadline:
                return False
        return False

    def drain(self, timeout: float = 10.0) -> None:
        """Takes whatever is still queued (late duplicates, or events that must not be there).

        Done when nothing is buffered locally (the consumer went idle) and the
        queue has no ready message left.
        """
        deadline = time.monotonic() + timeout
        for method, props, body in self.channel.consume(self.queue, inactivity_timeout=0.2):
            if method is not None:
                self._keep(method, props, body)
            elif self.channel.queue_declare(self.queue, passive=True).method.message_count == 0:
                return
            if time.monotonic() >= deadline:
                pytest.fail(f"queue {self.queue} did not drain within {timeout:.0f}s")

    def _keep(self, method: Any, props: pika.BasicProperties, body: bytes) -> None:
        self.received[props.message_id].append(Received(method.routing_key, props, body))
        self.arrivals.append(props.message_id)
        self.channel.basic_ack(method.delivery_tag)

    def first_arrivals(self) -> list[str]:
        """message_ids in the order of their first arrival (later copies left out)."""
        return list(dict.fromkeys(self.arrivals))

    def close(self) -> None:
        self.channel.cancel()
        self.conn.close()


# --------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------

PRODUCERS = 8
TXNS_PER_PRODUCER = 30
EVENTS_PER_TXN = 10
ROLLBACK_EVERY = 6  # 5 of 30 transactions per producer roll back


def test_every_committed_event_arrives_with_its_properties(database: str, outboxd, rabbit: Rabbit, processes) -> None:
    server = outboxd()
    with amqp_connection() as conn:
        channel = conn.channel()
        channel.queue_declare(rabbit.queue, durable=True)
        channel.queue_bind(rabbit.queue, rabbit.exchange, routing_key="#")

    # The relay runs while the producers write, so claims race with commits.
    relay = start_relay(processes, server, rabbit.exchange,
                        "--routing-key", "outbox.{event_type}.{aggregate_id}",
                        "--batch-size", "50", "--concurrency", "4")
    started = time.monotonic()
    committed, rolled_back = produce_concurrently(database, PRODUCERS, TXNS_PER_PRODUCER, EVENTS_PER_TXN,
                                                  ROLLBACK_EVERY)
    assert len(committed) + len(rolled_back) == PRODUCERS * TXNS_PER_PRODUCER * EVENTS_PER_TXN >= 2000
    assert len(committed) == 2000 and len(rolled_back) == 400

    consumer = Consumer(rabbit.queue)
    try:
        arrived = consumer.take(lambda: committed.keys() <= consumer.received.keys(), timeout=DEADLINE)
        missing = committed.keys() - consumer.received.keys()
        assert arrived, f"{len(missing)} committed events never arrived\n{relay.logs()}"

        # Arrival in the queue comes before the Ack to outboxd: wait for the table too.
        def all_published() -> bool:
            return all(r["published_at"] is not None for r in outbox_rows(database).values())
        wait_until(all_published, "every outbox row is published", diagnostics=relay.logs)
        elapsed = time.monotonic() - started

        assert relay.stop() == 0, relay.logs()
        consumer.drain()
    finally:
        consumer.close()

    received = consumer.received
    assert not (received.keys() & rolled_back), "a rolled-back event was published"
    assert received.keys() == committed.keys(), "something arrived that no producer committed"

    rows = outbox_rows(database)
    assert rows.keys() == committed.keys()
    assert all(r["published_at"] is not None and r["dead_lettered_at"] is None for r in rows.values())

    for event_id, copies in received.items():
        event, row = committed[event_id], rows[event_id]
        for message in copies:
            p = message.properties
            assert message.routing_key == f"outbox.{event.event_type}.{event.aggregate_id}"
            assert p.message_id == event.id
            assert p.type == event.event_type
            assert p.content_type == "application/json"
            assert p.delivery_mode == 2
            assert p.timestamp == int(row["created_at"].timestamp())
            assert json.loads(message.body) == event.payload
            headers = dict(p.headers)
            assert headers.pop("x-aggregate-id") == event.aggregate_id
            assert headers.pop("x-outbox-sequence") == row["seq"]
            assert headers.pop("x-outbox-attempt") >= 1
            # Every stored header passes through unchanged, and nothing else is added.
            assert {k: (v.decode() if isinstance(v, bytes) else v) for k, v in headers.items()} == event.headers

    duplicates = sum(len(copies) - 1 for copies in received.values())
    relay_log = relay.log.read_text(errors="replace")
    assert "Traceback" not in relay_log, relay_log
    # The acks rode on the claims: outboxd answered for every one it carried.
    assert "ignores acks sent with a claim" not in relay_log, relay_log
    print(f"{len(committed)} events relayed in {elapsed:.1f}s, {duplicates} duplicates")


def test_unroutable_messages_are_nacked_with_the_reason_and_never_published(database: str, outboxd, rabbit: Rabbit,
                                                                             processes) -> None:
    # Quick retries and few attempts, so the messages also reach the dead letter state.
    server = outboxd("--max-attempts", "3", "--backoff-base", "100ms", "--backoff-max", "300ms")
    with psycopg.connect(database, autocommit=True) as conn, conn.transaction(), conn.cursor() as cur:
        events = [make_event(0, 0, n) for n in range(25)]
        insert(cur, events)
    ids = {e.id for e in events}

    # The exchange exists (the fixture declared it) but no queue is bound to it.
    relay = start_relay(processes, server, rabbit.exchange, "--batch-size", "10")

    def settled() -> dict[str, dict[str, Any]] | None:
        rows = outbox_rows(database)
        done = all(r["dead_lettered_at"] is not None for r in rows.values())
        return rows if done else None

    rows = wait_until(settled, "every unroutable message is dead-lettered", diagnostics=relay.logs)
    assert relay.stop() == 0, relay.logs()

    assert rows.keys() == ids
    for row in rows.values():
        assert row["published_at"] is None, "an unroutable message was acked"
        assert row["attempts"] == 3
        assert "NO_ROUTE" in row["last_error"] and "312" in row["last_error"], row["last_error"]
    relay_log = relay.log.read_text(errors="replace")
    assert "releasing unpublished messages" in relay_log and "NO_ROUTE" in relay_log
    assert "Traceback" not in relay_log, relay_log


def test_relay_recovers_from_lost_broker_and_server_connections(database: str, outboxd, rabbit: Rabbit,
                                                                processes) -> None:
    server = outboxd()
    with amqp_connection() as conn:
        channel = conn.channel()
        channel.queue_declare(rabbit.queue, durable=True)
        channel.queue_bind(rabbit.queue, rabbit.exchange, routing_key="#")
    worker_id = f"pytest-{uuid.uuid4().hex[:8]}"
    # A short lease: a claim that outboxd committed but could not answer before
    # its SIGKILL is only recovered by lease expiry, and that should not take 30 s.
    relay = start_relay(processes, server, rabbit.exchange, "--batch-size", "20", "--concurrency", "2",
                        "--lease", "5", worker_id=worker_id)

    def log_count(text: str) -> int:
        return relay.log.read_text(errors="replace").count(text)

    # A producer that keeps writing for a few seconds, so the faults below hit
    # a relay that is busy, with batches in flight.
    committed: dict[str, Event] = {}

    def paced_producer() -> None:
        with psycopg.connect(database, autocommit=True) as conn:
            for txn in range(120):
                events = [make_event(9, txn, n) for n in range(10)]
                with conn.transaction(), conn.cursor() as cur:
                    insert(cur, events)
                committed.update((e.id, e) for e in events)
                time.sleep(0.03)  # pacing only: spreads the writes over the faults

    consumer = Consumer(rabbit.queue)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            producer = pool.submit(paced_producer)
            assert consumer.take(lambda: len(consumer.received) >= 50, timeout=DEADLINE), relay.logs()

            # 1. RabbitMQ drops the relay's connection: it reconnects by itself.
            close_amqp_connection(f"outbox-relay-py {worker_id}")
            wait_until(lambda: log_count("RabbitMQ connected") >= 2, "the relay reconnects to RabbitMQ",
                       diagnostics=relay.logs)

            # 2. outboxd dies without warning and comes back on the same port.
            server.process.popen.kill()
            server.process.popen.wait()
            wait_until(lambda: log_count("outboxd unavailable") >= 1, "the relay notices outboxd is gone",
                       diagnostics=relay.logs)
            outboxd(port=server.port)
            producer.result()

        # 3. Events written after the restart must come through the new outboxd.
        with psycopg.connect(database, autocommit=True) as conn, conn.transaction(), conn.cursor() as cur:
            late = [make_event(10, 0, n) for n in range(200)]
            insert(cur, late)
        committed.update((e.id, e) for e in late)

        assert consumer.take(lambda: committed.keys() <= consumer.received.keys(), timeout=DEADLINE), \
            f"{len(committed.keys() - consumer.received.keys())} events lost\n{relay.logs()}"
        wait_until(lambda: all(r["published_at"] is not None for r in outbox_rows(database).values()),
                   "every outbox row is published", diagnostics=relay.logs)
        assert relay.stop() == 0, relay.logs()
        consumer.drain()
    finally:
        consumer.close()

    assert consumer.received.keys() == committed.keys()
    assert log_count("RabbitMQ unavailable") >= 1 and log_count("outboxd reachable again") >= 1, relay.logs()
    assert "Traceback" not in relay.log.read_text(errors="replace"), relay.logs()
    duplicates = sum(len(copies) - 1 for copies in consumer.received.values())
    print(f"{len(committed)} events through two faults, {duplicates} duplicates")


# --------------------------------------------------------------------------
# an ordered outbox (ordering=aggregate)
# --------------------------------------------------------------------------

ORDERED_PRODUCERS = 8
ORDERED_TXNS = 20
ORDERED_PER_TXN = 5
ORDERED_AGGREGATES = 30
ORDERED_ROLLBACK_EVERY = 5  # 4 of 20 transactions per producer roll back


def produce_shared(db_url: str, producer: int, txns: int, per_txn: int,
                   rollback_every: int) -> tuple[list[Event], list[Event]]:
    """One producer writing to aggregates that every producer shares, so
    concurrent transactions interleave each aggregate's sequence numbers (and
    commit in an order of their own). Paced a little, so the writes overlap the
    faults the test injects."""
    rng = random.Random(producer)
    committed: list[Event] = []
    rolled_back: list[Event] = []
    with psycopg.connect(db_url, autocommit=True) as conn:
        for txn in range(txns):
            events = [Event(id=str(uuid.uuid4()), aggregate_id=f"acct-{rng.randrange(ORDERED_AGGREGATES)}",
                            event_type="account.changed", payload={"producer": producer, "txn": txn, "n": n},
                            headers={})
                      for n in range(per_txn)]
            rollback = txn % rollback_every == rollback_every - 1
            with conn.transaction(force_rollback=rollback), conn.cursor() as cur:
                insert(cur, events)
            (rolled_back if rollback else committed).extend(events)
            time.sleep(0.2)  # pacing only
    return committed, rolled_back


def pause_holding_a_lease(relay: Process, worker_id: str, db_url: str) -> None:
    """Stops `relay` (SIGSTOP) at a moment it holds a live lease on an event
    not yet acked, so the fault that follows hits a batch in flight. The lease
    table is the one the README describes (`<table>_leases`)."""

    def holds_one() -> bool:
        relay.popen.send_signal(signal.SIGSTOP)
        with psycopg.connect(db_url) as conn:
            held = conn.execute(
                "SELECT count(*) FROM outbox_leases AS l JOIN outbox AS o ON o.id = l.id "
                "WHERE l.claimed_by = %s AND l.locked_until > now() AND o.published_at IS NULL",
                (worker_id,)).fetchone()[0]
        if not held:
            relay.popen.send_signal(signal.SIGCONT)
        return held > 0

    wait_until(holds_one, f"{relay.name} {worker_id} holds a lease", diagnostics=relay.logs)


def test_ordered_outbox_delivers_each_aggregate_in_order(database: str, outboxd, rabbit: Rabbit,
                                                        processes) -> None:
    """The worker runs unchanged against an outbox with ordering=aggregate: two
    relay processes of 4 slots each, producers sharing 30 aggregates, a
    transaction held open while a later event of its aggregate commits, and
    faults (RabbitMQ drops a relay's connection, a relay and outboxd are killed
    with SIGKILL and restarted). On the queue, each aggregate's first deliveries
    come in `sequence` order; duplicates may come later and are ignored, as a
    consumer deduping on the event id would."""
    outbox = "default=public.outbox:ordering=aggregate"
    server = outboxd("--outbox", outbox, "--backoff-base", "200ms", "--backoff-max", "1s")
    with amqp_connection() as conn:
        channel = conn.channel()
        channel.queue_declare(rabbit.queue, durable=True)
        channel.queue_bind(rabbit.queue, rabbit.exchange, routing_key="#")
    relay_args = ("--batch-size", "10", "--concurrency", "4", "--lease", "3")
    worker_a, worker_b = (f"pytest-{name}-{uuid.uuid4().hex[:8]}" for name in "ab")
    relay_a = start_relay(processes, server, rabbit.exchange, *relay_args, worker_id=worker_a)
    relay_b = start_relay(processes, server, rabbit.exchange, *relay_args, worker_id=worker_b)

    committed: dict[str, Event] = {}
    rolled_back: set[str] = set()
    consumer = Consumer(rabbit.queue)
    try:
        with concurrent.futures.ThreadPoolExecutor(ORDERED_PRODUCERS) as pool:
            producers = [pool.submit(produce_shared, database, p, ORDERED_TXNS, ORDERED_PER_TXN,
                                     ORDERED_ROLLBACK_EVERY) for p in range(ORDERED_PRODUCERS)]
            assert consumer.take(lambda: len(consumer.received) >= 50, timeout=DEADLINE), relay_a.logs()

            # Commit order, not insert order: T1 draws the lower sequence of
            # acct-slow and stays open while T2 inserts the next one and commits.
            first, second = (Event(str(uuid.uuid4()), "acct-slow", "account.changed", {"n": n}, {})
                             for n in range(2))
            with psycopg.connect(database) as t1, psycopg.connect(database, autocommit=True) as t2:
                with t1.cursor() as cur:
                    insert(cur, [first])
                with t2.transaction(), t2.cursor() as cur:
                    insert(cur, [second])
                # While T1 is open, the relays keep claiming; `second` must not go out.
                consumer.take(lambda: second.id in consumer.received, timeout=1.5)
                assert second.id not in consumer.received, "an event went out before an earlier one committed"
                t1.commit()
            committed.update({first.id: first, second.id: second})

            # 1. RabbitMQ drops relay A's connection while A holds a batch: what
            #    it had not seen confirmed is nacked and retried.
            pause_holding_a_lease(relay_a, worker_a, database)
            close_amqp_connection(f"outbox-relay-py {worker_a}")
            relay_a.popen.send_signal(signal.SIGCONT)
            wait_until(lambda: relay_a.log.read_text(errors="replace").count("RabbitMQ connected") >= 2,
                       "relay A reconnects to RabbitMQ", diagnostics=relay_a.logs)
            # 2. Relay B dies holding a batch: its leases expire and those
            #    aggregates go on through relay A, the held event first.
            pause_holding_a_lease(relay_b, worker_b, database)
            relay_b.popen.kill()
            relay_b.popen.wait()
            relay_b = start_relay(processes, server, rabbit.exchange, *relay_args, worker_id=worker_b)
            # 3. outboxd dies without warning and comes back on the same port.
            server.process.popen.kill()
            server.process.popen.wait()
            server = outboxd("--outbox", outbox, "--backoff-base", "200ms", "--backoff-max", "1s",
                             port=server.port)
            for producer in producers:
                c, r = producer.result()
                committed.update((e.id, e) for e in c)
                rolled_back.update(e.id for e in r)
        assert len(committed) == ORDERED_PRODUCERS * ORDERED_TXNS * ORDERED_PER_TXN * 4 // 5 + 2

        def diagnostics() -> str:
            return f"{len(committed.keys() - consumer.received.keys())} events missing\n" \
                   f"{relay_a.logs()}\n{relay_b.logs()}"
        assert consumer.take(lambda: committed.keys() <= consumer.received.keys(), timeout=60), diagnostics()
        wait_until(lambda: all(r["published_at"] is not None for r in outbox_rows(database).values()),
                   "every outbox row is published", diagnostics=diagnostics)
        assert relay_a.stop() == 0, relay_a.logs()
        assert relay_b.stop() == 0, relay_b.logs()
        consumer.drain()
    finally:
        consumer.close()

    assert not (consumer.received.keys() & rolled_back), "a rolled-back event was published"
    assert consumer.received.keys() == committed.keys(), "something arrived that no producer committed"
    rows = outbox_rows(database)
    assert rows.keys() == committed.keys()

    # Each aggregate's first deliveries, in the order they reached the queue,
    # against the order of its events' sequence numbers.
    delivered: dict[str, list[str]] = collections.defaultdict(list)
    for event_id in consumer.first_arrivals():
        delivered[committed[event_id].aggregate_id].append(event_id)
    assert len(delivered) == ORDERED_AGGREGATES + 1
    for aggregate, ids in delivered.items():
        by_sequence = sorted(ids, key=lambda i: rows[i]["seq"])
        assert ids == by_sequence, (
            f"{aggregate}: first deliveries out of sequence order: "
            f"{[rows[i]['seq'] for i in ids]}")
        first_copies = [consumer.received[i][0] for i in ids]
        assert [dict(m.properties.headers)["x-outbox-sequence"] for m in first_copies] == \
            [rows[i]["seq"] for i in ids]
    assert delivered["acct-slow"] == [first.id, second.id]

    for relay in (relay_a, relay_b):
        assert "Traceback" not in relay.log.read_text(errors="replace"), relay.logs()
    duplicates = len(consumer.arrivals) - len(committed)
    retried = sum(1 for r in rows.values() if r["attempts"] > 1)
    assert retried >= 1, "relay B was killed holding a lease, yet no event was claimed twice"
    print(f"{len(committed)} events over {len(delivered)} aggregates in order, "
          f"{duplicates} duplicates, {retried} claimed more than once")


# --------------------------------------------------------------------------
# security: outboxd with TLS, mutual TLS and tokens; RabbitMQ over amqps://
# --------------------------------------------------------------------------

#: The common name of the worker's client certificate. The tokens file gives it
#: an identity (a `cn:` line) scoped to the admin service only, so the relay
#: scope can come from the bearer token alone: a worker that failed to send its
#: token would be refused (PERMISSION_DENIED) and the test would fail.
WORKER_CN = "pyrelay-worker"


@dataclasses.dataclass(frozen=True)
class Pki:
    """A test CA (PEM files in a temp dir), a certificate it signed for
    localhost/127.0.0.1 and one for the worker (CN=WORKER_CN)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    #: A second, unrelated CA: trusted by nobody.
    other_ca: Path


def openssl(*argv: str) -> None:
    result = subprocess.run(["openssl", *argv], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"openssl {' '.join(argv)}:\n{result.stderr}"


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is needed to make test certificates")
    d = tmp_path / "pki"
    d.mkdir()
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    for name in ("ca", "other-ca"):
        openssl("req", "-x509", *ec, "-days", "1", "-subj", f"/CN=pyrelay test {name}",
                "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.crt"))
    for name, cn, ext in (
        ("server", "localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        ("client", WORKER_CN, "extendedKeyUsage=clientAuth\n"),
    ):
        (d / f"{name}.ext").write_text(ext)
        openssl("req", *ec, "-subj", f"/CN={cn}", "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))
        openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.crt"), "-CAkey", str(d / "ca.key"),
                "-CAcreateserial", "-days", "1", "-extfile", str(d / f"{name}.ext"), "-out", str(d / f"{name}.crt"))
    return Pki(ca=d / "ca.crt", server_cert=d / "server.crt", server_key=d / "server.key",
               client_cert=d / "client.crt", client_key=d / "client.key", other_ca=d / "other-ca.crt")


def sha256_line(name: str, token: str, *scopes: str) -> str:
    return f"{name} sha256:{hashlib.sha256(token.encode()).hexdigest()} {' '.join(scopes)}\n"


def health_serving(port: int) -> bool:
    """grpc.health.v1 Check on the plaintext health port says SERVING. The
    messages are encoded by hand (no health stubs needed): an empty request
    asks for the whole server; the answer is field 1, status, SERVING = 1."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        try:
            return check(b"", timeout=1) == b"\x08\x01"
        except grpc.RpcError:
            return False


@dataclasses.dataclass
class SecureOutboxd:
    server: Outboxd  # target: the https:// URL the worker is given
    port: int
    pki: Pki

    def call(self, token: str | None, method: str = "GetStats") -> grpc.StatusCode:
        """A call over mutual TLS (the worker's certificate) with `token`: OK,
        or the code it failed with. GetStats needs a relay or admin scope; Ack
        (of a lease that does not exist: refused before it is looked at, or
        answered without effect) needs the relay scope."""
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.pki.ca.read_bytes(), private_key=self.pki.client_key.read_bytes(),
            certificate_chain=self.pki.client_cert.read_bytes())
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        with grpc.secure_channel(f"localhost:{self.port}", credentials) as channel:
            stub = pb_grpc.OutboxServiceStub(channel)
            try:
                if method == "GetStats":
                    stub.GetStats(pb.GetStatsRequest(outbox="default"), timeout=5, metadata=metadata)
                else:
                    stub.Ack(pb.AckRequest(outbox="default", lease_id=str(uuid.uuid4()),
                                           message_ids=[str(uuid.uuid4())]), timeout=5, metadata=metadata)
                return grpc.StatusCode.OK
            except grpc.RpcError as err:
                return err.code()

    def stats(self, token: str | None) -> grpc.StatusCode:
        return self.call(token)


def start_secure_outboxd(processes: Callable[..., Process], database: str, pki: Pki, tokens: Path) -> SecureOutboxd:
    assert OUTBOXD_BIN.exists(), f"{OUTBOXD_BIN} not found; run `cargo build` or set OUTBOXD_BIN"
    port, health_port = free_port(), free_port()
    env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info"), "NO_COLOR": "1"}
    proc = processes("outboxd", [
        str(OUTBOXD_BIN), "--database-url", database, "--listen", f"127.0.0.1:{port}",
        "--metrics-listen", "127.0.0.1:0", "--poll-interval", "200ms",
        "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tls-client-ca", str(pki.ca),
        "--health-listen", f"127.0.0.1:{health_port}", "--auth-tokens", str(tokens),
    ], env=env)

    def ready() -> bool:
        assert proc.popen.poll() is None, f"outboxd exited with {proc.popen.returncode}\n{proc.logs()}"
        return health_serving(health_port)

    wait_until(ready, "outboxd's health port says SERVING", diagnostics=proc.logs)
    return SecureOutboxd(Outboxd(f"https://localhost:{port}", proc), port, pki)


def insert_events(database: str, count: int, producer: int) -> dict[str, Event]:
    events = [make_event(producer, 0, n) for n in range(count)]
    with psycopg.connect(database, autocommit=True) as conn, conn.transaction(), conn.cursor() as cur:
        insert(cur, events)
    return {e.id: e for e in events}


def bind_queue(rabbit: Rabbit) -> None:
    with amqp_connection() as conn:
        channel = conn.channel()
        channel.queue_declare(rabbit.queue, durable=True)
        channel.queue_bind(rabbit.queue, rabbit.exchange, routing_key="#")


def queued(queue: str) -> int:
    with amqp_connection() as conn:
        return conn.channel().queue_declare(queue, passive=True).method.message_count


def test_tls_mutual_tls_and_a_rotated_token(database: str, rabbit: Rabbit, processes, pki: Pki,
                                            tmp_path: Path) -> None:
    old_token, new_token, wrong_token = (secrets.token_hex(32) for _ in range(3))
    tokens = tmp_path / "tokens"
    cn_line = f"worker-cert cn:{WORKER_CN} admin:default\n"
    tokens.write_text("# relay tokens\n" + sha256_line("relay-old", old_token, "relay:default") + cn_line)
    secure = start_secure_outboxd(processes, database, pki, tokens)
    bind_queue(rabbit)

    # The API port speaks TLS only, and the test's own client gets in with the token.
    assert secure.stats(old_token) == grpc.StatusCode.OK
    with grpc.insecure_channel(f"127.0.0.1:{secure.port}") as channel:
        with pytest.raises(grpc.RpcError):
            pb_grpc.OutboxServiceStub(channel).GetStats(pb.GetStatsRequest(outbox="default"), timeout=5)
    # The client certificate alone names an identity without the relay scope.
    assert secure.call(None, "Ack") == grpc.StatusCode.PERMISSION_DENIED
    assert secure.call(wrong_token, "Ack") == grpc.StatusCode.UNAUTHENTICATED

    token_file = tmp_path / "worker-token"
    token_file.write_text(old_token + "\n")
    tls_flags = ("--tls-ca", str(pki.ca), "--tls-cert", str(pki.client_cert), "--tls-key", str(pki.client_key))
    relay = start_relay(processes, secure.server, rabbit.exchange, *tls_flags, "--token-file", str(token_file),
                        "--batch-size", "20", "--concurrency", "2", "--wait", "2")

    def log_count(process: Process, text: str) -> int:
        return process.log.read_text(errors="replace").count(text)

    consumer = Consumer(rabbit.queue)
    try:
        # 1. Over mutual TLS with the token: everything arrives.
        first = insert_events(database, 100, producer=1)
        assert consumer.take(lambda: first.keys() <= consumer.received.keys(), timeout=DEADLINE), \
            f"{len(first.keys() - consumer.received.keys())} events never arrived\n{relay.logs()}"

        # 2. Rotation: the server file holds both tokens, the worker's file gets
        #    the new one, then the old line goes. No call is refused meanwhile.
        tokens.write_text(sha256_line("relay-old", old_token, "relay:default")
                          + sha256_line("relay-new", new_token, "relay:default") + cn_line)
        wait_until(lambda: secure.stats(new_token) == grpc.StatusCode.OK, "outboxd accepts the new token",
                   diagnostics=secure.server.process.logs)
        token_file.write_text(new_token + "\n")
        wait_until(lambda: log_count(relay, "token file changed; calls use the new token") >= 1,
                   "the worker re-reads its token file", diagnostics=relay.logs)
        tokens.write_text(sha256_line("relay-new", new_token, "relay:default") + cn_line)
        wait_until(lambda: secure.stats(old_token) == grpc.StatusCode.UNAUTHENTICATED,
                   "outboxd refuses the old token", diagnostics=secure.server.process.logs)

        second = insert_events(database, 100, producer=2)
        assert consumer.take(lambda: second.keys() <= consumer.received.keys(), timeout=DEADLINE), \
            f"{len(second.keys() - consumer.received.keys())} events never arrived after the rotation\n{relay.logs()}"
        wait_until(lambda: all(r["published_at"] is not None for r in outbox_rows(database).values()),
                   "every outbox row is published", diagnostics=relay.logs)
        assert relay.stop() == 0, relay.logs()
        assert log_count(relay, "claim refused") == 0, relay.logs()
        assert "Traceback" not in relay.log.read_text(errors="replace"), relay.logs()
        consumer.drain()
        assert consumer.received.keys() == first.keys() | second.keys()

        # 3. A worker with a wrong token, and one with none (its certificate has
        #    no relay scope), publish nothing; each stays up and says why.
        wrong_file = tmp_path / "wrong-token"
        wrong_file.write_text(wrong_token)
        wrong = start_relay(processes, secure.server, rabbit.exchange, *tls_flags, "--token-file", str(wrong_file),
                            "--wait", "2")
        no_token = start_relay(processes, secure.server, rabbit.exchange, *tls_flags, "--wait", "2")
        third = insert_events(database, 30, producer=3)
        wait_until(lambda: log_count(wrong, "claim refused") >= 2, "the wrong-token worker logs its refusals",
                   diagnostics=wrong.logs)
        wait_until(lambda: log_count(no_token, "claim refused") >= 2, "the token-less worker logs its refusals",
                   diagnostics=no_token.logs)
        assert "UNAUTHENTICATED" in wrong.log.read_text(errors="replace"), wrong.logs()
        assert "PERMISSION_DENIED" in no_token.log.read_text(errors="replace"), no_token.logs()
        assert wrong.popen.poll() is None and no_token.popen.poll() is None, "a refused worker exited"
        rows = outbox_rows(database)
        assert all(rows[i]["published_at"] is None and rows[i]["attempts"] == 0 for i in third), \
            "a refused worker claimed or published"
        assert queued(rabbit.queue) == 0, "a refused worker published"
        assert wrong.stop() == 0 and no_token.stop() == 0

        # The same events were publishable all along: a worker with the right token relays them.
        good = start_relay(processes, secure.server, rabbit.exchange, *tls_flags, "--token-file", str(token_file))
        assert consumer.take(lambda: third.keys() <= consumer.received.keys(), timeout=DEADLINE), good.logs()
        assert good.stop() == 0, good.logs()
    finally:
        consumer.close()


class TlsProxy:
    """A throwaway amqps:// endpoint: TLS terminated here with `pki`'s
    localhost certificate, the bytes forwarded to RabbitMQ's plaintext port,
    so no broker needs a TLS listener. Counts completed handshakes."""

    def __init__(self, pki: Pki, upstream: tuple[str, int]) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(pki.server_cert, pki.server_key)
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.handshakes = 0
        self.failed_handshakes = 0
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="tls-proxy", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(10)
            tls = self.context.wrap_socket(conn, server_side=True)
            tls.settimeout(None)
        except (ssl.SSLError, OSError):
            with self._lock:
                self.failed_handshakes += 1
            conn.close()
            return
        try:
            plain = socket.create_connection(self.upstream, timeout=10)
            plain.settimeout(None)
        except OSError:
            tls.close()
            return
        with self._lock:
            self.handshakes += 1
            self._sockets += [tls, plain]
        threading.Thread(target=self._pump, args=(plain, tls), daemon=True).start()
        self._pump(tls, plain)

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()
        with self._lock:
            for s in self._sockets:
                s.close()


def test_amqps_with_the_amqp_tls_ca(database: str, outboxd, rabbit: Rabbit, processes, pki: Pki) -> None:
    amqp = urllib.parse.urlsplit(AMQP_URL)
    proxy = TlsProxy(pki, (amqp.hostname or "127.0.0.1", amqp.port or 5672))
    amqps_url = urllib.parse.urlunsplit(amqp._replace(scheme="amqps", netloc=f"guest:guest@localhost:{proxy.port}"))
    server = outboxd()
    bind_queue(rabbit)
    consumer = Consumer(rabbit.queue)
    try:
        # Without the CA, the broker's certificate is refused: nothing is claimed.
        untrusting = start_relay(processes, server, rabbit.exchange, "--amqp-url", amqps_url)
        events = insert_events(database, 50, producer=1)
        wait_until(lambda: "RabbitMQ unavailable" in untrusting.log.read_text(errors="replace"),
                   "the relay without the CA reports the broker unavailable", diagnostics=untrusting.logs)
        assert "CERTIFICATE_VERIFY_FAILED" in untrusting.log.read_text(errors="replace"), untrusting.logs()
        assert untrusting.stop() == 0, untrusting.logs()
        assert proxy.handshakes == 0 and proxy.failed_handshakes >= 1
        assert all(r["published_at"] is None and r["attempts"] == 0 for r in outbox_rows(database).values())

        # Another CA does not help either.
        other = start_relay(processes, server, rabbit.exchange, "--amqp-url", amqps_url,
                            "--amqp-tls-ca", str(pki.other_ca))
        wait_until(lambda: "CERTIFICATE_VERIFY_FAILED" in other.log.read_text(errors="replace"),
                   "the relay trusting another CA refuses the broker", diagnostics=other.logs)
        assert other.stop() == 0, other.logs()
        assert proxy.handshakes == 0

        # With it, every event arrives, over the proxy's TLS.
        relay = start_relay(processes, server, rabbit.exchange, "--amqp-url", amqps_url,
                            "--amqp-tls-ca", str(pki.ca))
        assert consumer.take(lambda: events.keys() <= consumer.received.keys(), timeout=DEADLINE), relay.logs()
        wait_until(lambda: all(r["published_at"] is not None for r in outbox_rows(database).values()),
                   "every outbox row is published", diagnostics=relay.logs)
        assert relay.stop() == 0, relay.logs()
        assert proxy.handshakes >= 1
        assert "Traceback" not in relay.log.read_text(errors="replace"), relay.logs()
        consumer.drain()
        assert consumer.received.keys() == events.keys()
    finally:
        consumer.close()
        proxy.close()
