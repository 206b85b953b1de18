"""Assertions on what Helm's own engine renders from the chart (see helmkit.py for
how it renders without a cluster). Run through scripts/check-helm."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

import helmkit
import values_doc

CHART = Path(__file__).resolve().parent.parent
REPO = CHART.parent.parent
CI_FILES = sorted((CHART / "ci").glob("*-values.yaml"))
VARIANTS = ["default"] + [p.name for p in CI_FILES]

HOOK = "helm.sh/hook"
READY_SERVICE = "outbox.v1.OutboxService"
# The chart refuses to render without auth (secure by default). Renders from a
# dict or "default" get this unless their values say something about auth; every
# ci/*-values.yaml sets auth itself (test_every_ci_values_file_sets_auth).
OPEN = {"auth": {"allowUnauthenticated": True}}


# --- which environment variables the binaries read -----------------------------

def _env_names(source: str) -> set[str]:
    return set(re.findall(r'env\s*=\s*"([A-Z0-9_]+)"', source))


def _struct(source: str, name: str) -> str:
    match = re.search(r"pub struct " + name + r" \{(.*?)\n\}", source, re.S)
    assert match, f"struct {name} not found"
    return match.group(1)


# Flags both binaries flatten in (the log format) live in the shared runtime crate.
CLI_SRC = (REPO / "runtime/src/cli.rs").read_text()
SERVER_SRC = (REPO / "src/config.rs").read_text()
# The relay's own flags, and each broker's (relay/src/publishers/<broker>/config.rs).
RELAY_SRC = "\n".join(
    p.read_text()
    for p in [REPO / "relay/src/config.rs", *sorted((REPO / "relay/src/publishers").glob("*/config.rs"))]
)
# Standard OpenTelemetry SDK variables both binaries read.
OTEL = {
    "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
}
# RUST_LOG: tracing-subscriber's EnvFilter. The *_METRICS_LISTEN flags are being
# added next to this chart; once in the source they are also found by _env_names.
SERVER_ENV = _env_names(SERVER_SRC) | OTEL | {"RUST_LOG", "OUTBOXD_METRICS_LISTEN"}
RELAY_ENV = _env_names(RELAY_SRC) | OTEL | {"RUST_LOG", "OUTBOX_RELAY_METRICS_LISTEN"}
for _src, _names in ((SERVER_SRC, SERVER_ENV), (RELAY_SRC, RELAY_ENV)):
    if "LogArgs" in _src:  # both flatten the shared log flags
        _names |= _env_names(_struct(CLI_SRC, "LogArgs"))


# --- rendering ----------------------------------------------------------------

class Rendered:
    def __init__(self, out: dict[str, Any], values: dict[str, Any]):
        self.docs: list[dict] = out["manifests"]
        self.hooks: list[dict] = out["hooks"]
        self.notes: str = out["notes"]
        self.values = values

    def all(self) -> list[dict]:
        return self.docs + self.hooks

    def of(self, kind: str, hooks: bool = True) -> list[dict]:
        return [d for d in (self.all() if hooks else self.docs) if d["kind"] == kind]

    def one(self, kind: str, component: str | None = None) -> dict:
        found = [d for d in self.of(kind) if component is None
                 or d["metadata"]["labels"].get("app.kubernetes.io/component") == component]
        assert len(found) == 1, f"expected one {kind} {component or ''}, got {len(found)}"
        return found[0]

    def maybe(self, kind: str, component: str | None = None) -> dict | None:
        found = [d for d in self.of(kind) if component is None
                 or d["metadata"]["labels"].get("app.kubernetes.io/component") == component]
        assert len(found) <= 1
        return found[0] if found else None

    def server(self) -> dict:
        return self.one("Deployment", "server")

    def relay(self) -> dict | None:
        return self.maybe("Deployment", "relay")

    def job(self) -> dict | None:
        return self.maybe("Job", "migrations")

    def configmap(self) -> dict:
        return self.one("ConfigMap", "server")

    def secrets(self, type_: str) -> list[dict]:
        """The chart's own Secrets of one type: Opaque (the inline database URL) or
        kubernetes.io/tls (the generated certificate)."""
        return [d for d in self.of("Secret") if d.get("type") == type_]


def _values_for(variant: str) -> dict[str, Any]:
    return dict(OPEN) if variant == "default" else helmkit.load_values(CHART / "ci" / variant)


def _with_auth(values: dict[str, Any]) -> dict[str, Any]:
    return values if "auth" in values else helmkit._deep_merge(OPEN, values)


def _merged(values: dict[str, Any]) -> dict[str, Any]:
    return helmkit._deep_merge(helmkit.load_values(CHART / "values.yaml"), values)


@pytest.fixture(scope="session")
def api():
    with helmkit.fake_api() as kubeconfig:
        yield kubeconfig


@pytest.fixture(scope="session")
def render(api):
    cache: dict[str, Rendered] = {}

    def _render(values: dict[str, Any] | str) -> Rendered:
        key = values if isinstance(values, str) else json.dumps(values, sort_keys=True)
        if key not in cache:
            raw = _values_for(values) if isinstance(values, str) else _with_auth(values)
            out = helmkit.render(CHART, raw, api)
            out_dir = CHART.parent / ".cache" / "rendered"
            out_dir.mkdir(parents=True, exist_ok=True)
            if isinstance(values, str):
                (out_dir / f"{values.removesuffix('.yaml')}.yaml").write_text(
                    out["manifest"] + "".join("\n---\n" + h for h in out["hook_manifests"]))
            cache[key] = Rendered(out, _merged(raw))
        return cache[key]

    return _render


@pytest.fixture(params=VARIANTS)
def variant(request, render) -> Rendered:
    return render(request.param)


def _containers(doc: dict) -> list[dict]:
    spec = doc["spec"]["template"]["spec"] if doc["kind"] != "Pod" else doc["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def _pod_spec(doc: dict) -> dict:
    return doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]


def _env(container: dict) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


# --- every variant ------------------------------------------------------------

def test_standard_labels_everywhere(variant):
    for doc in variant.all():
        labels = doc["metadata"]["labels"]
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                    "app.kubernetes.io/managed-by", "app.kubernetes.io/component", "helm.sh/chart"):
            assert key in labels, f"{doc['kind']}/{doc['metadata']['name']} lacks {key}"


def test_security_context_is_hardened(variant):
    for doc in variant.all():
        if doc["kind"] not in ("Deployment", "Job", "Pod"):
            continue
        pod = _pod_spec(doc)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod.get("automountServiceAccountToken") is False or doc["kind"] == "Deployment"
        for c in _containers(doc):
            sc = c["securityContext"]
            where = f"{doc['kind']}/{doc['metadata']['name']}/{c['name']}"
            assert sc["runAsNonRoot"] is True, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            assert not sc["capabilities"].get("add"), where
            assert sc.get("privileged") is False, where


def test_grpc_probes_point_at_the_right_services(variant):
    container = _containers(variant.server())[0]
    grpc_port = variant.values["containerPorts"]["grpc"]
    assert {"name": "grpc", "containerPort": grpc_port, "protocol": "TCP"} in container["ports"]
    # Kubernetes' gRPC probes cannot do TLS: with TLS on they use the plaintext health port.
    tls = variant.values["tls"]["enabled"]
    probe_port = variant.values["containerPorts"]["health"] if tls else grpc_port
    health = {"name": "health", "containerPort": probe_port, "protocol": "TCP"}
    assert (health in container["ports"]) == tls
    env = _env(container)
    assert env.get("OUTBOXD_HEALTH_LISTEN") == (f"0.0.0.0:{probe_port}" if tls else None)
    expected = {"startupProbe": "", "livenessProbe": "", "readinessProbe": READY_SERVICE}
    for probe, service in expected.items():
        spec = container[probe]
        assert set(spec) & {"httpGet", "exec", "tcpSocket"} == set(), probe
        assert spec["grpc"] == {"port": probe_port, "service": service}, probe


def test_rolling_update_keeps_capacity_and_grace_outlasts_the_drain(variant):
    deploy = variant.server()
    assert deploy["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = _pod_spec(deploy)
    pause = pod["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = variant.values["config"]["drainTimeout"]
    drain_s = int(re.fullmatch(r"(\d+)s", drain).group(1))
    assert pod["terminationGracePeriodSeconds"] > drain_s + pause
    assert variant.configmap()["data"]["OUTBOXD_DRAIN_TIMEOUT"] == drain


def test_checksum_annotation_tracks_the_config(variant):
    annotations = variant.server()["spec"]["template"]["metadata"]["annotations"]
    assert re.fullmatch(r"[0-9a-f]{64}", annotations["checksum/config"])


def test_topology_spread_selects_own_pods(variant):
    deploy = variant.server()
    selector = deploy["spec"]["selector"]["matchLabels"]
    constraints = _pod_spec(deploy).get("topologySpreadConstraints", [])
    assert constraints == [] or all(c["labelSelector"]["matchLabels"] == selector for c in constraints)


def test_env_vars_are_ones_the_binaries_read(variant):
    server_env = set(variant.configmap()["data"])
    for doc in [variant.server()] + ([variant.job()] if variant.job() else []):
        for c in _containers(doc):
            server_env |= set(_env(c))
    unknown = server_env - SERVER_ENV
    assert not unknown, f"outboxd does not read {sorted(unknown)}"
    relay = variant.relay()
    if relay:
        relay_env = set(_env(_containers(relay)[0]))
        unknown = relay_env - RELAY_ENV
        assert not unknown, f"outbox-relay does not read {sorted(unknown)}"


def test_database_url_comes_from_a_secret(variant):
    database = variant.values["database"]
    ref = _env(_containers(variant.server())[0])["DATABASE_URL"]
    assert set(ref) == {"secretKeyRef"}
    assert ref["secretKeyRef"]["key"] == database["existingSecretKey"]
    if variant.job():
        ref = _env(_containers(variant.job())[0])["DATABASE_URL"]
        assert set(ref) == {"secretKeyRef"}
        own = database["migrations"]["existingSecret"]
        assert ref["secretKeyRef"]["name"] == (own or database["existingSecret"])
        key = database["migrations"]["existingSecretKey"] if own else ""
        assert ref["secretKeyRef"]["key"] == (key or database["existingSecretKey"])


def test_migration_hook_only_with_an_existing_secret(variant):
    inline = bool(variant.values["database"]["url"])
    job = variant.job()
    no_migrate = variant.configmap()["data"].get("OUTBOXD_NO_MIGRATE")
    if inline:
        assert job is None, "a chart-created Secret does not exist at pre-install time"
        assert no_migrate is None, "with an inline URL the pods migrate on start"
        [secret] = variant.secrets("Opaque")
        assert HOOK not in secret["metadata"].get("annotations", {})
    else:
        assert job is not None
        assert job["metadata"]["annotations"][HOOK] == "pre-install,pre-upgrade"
        spec = job["spec"]
        assert spec["backoffLimit"] == variant.values["migrations"]["backoffLimit"]
        assert spec["ttlSecondsAfterFinished"] == variant.values["migrations"]["ttlSecondsAfterFinished"]
        container = _containers(job)[0]
        assert container["args"] == ["migrate"]
        assert _env(container)["OUTBOXD_OUTBOXES"] == variant.configmap()["data"]["OUTBOXD_OUTBOXES"]
        assert no_migrate == "true"
        assert not variant.secrets("Opaque"), "no chart-created Secret next to an existing one"
    # Nothing else is a hook except the test pod.
    for doc in variant.docs:
        assert HOOK not in (doc["metadata"].get("annotations") or {}), doc["metadata"]["name"]


def test_pdb_when_more_than_one_replica(variant):
    v = variant.values
    replicas = v["autoscaling"]["minReplicas"] if v["autoscaling"]["enabled"] else v["replicaCount"]
    wanted = v["podDisruptionBudget"]["enabled"]
    if wanted is None:
        wanted = replicas > 1
    pdb = variant.maybe("PodDisruptionBudget")
    assert (pdb is not None) == wanted
    if pdb:
        assert pdb["spec"]["selector"]["matchLabels"] == variant.server()["spec"]["selector"]["matchLabels"]


def test_relay_only_when_enabled(variant):
    relay = variant.relay()
    assert (relay is not None) == variant.values["relay"]["enabled"]
    if relay:
        container = _containers(relay)[0]
        env = _env(container)
        assert env["AMQP_URL"]["secretKeyRef"]["name"] == variant.values["relay"]["amqp"]["existingSecret"]
        tls = variant.values["tls"]["enabled"]
        assert env["OUTBOX_SERVER"].startswith("https://" if tls else "http://")
        assert ("OUTBOX_RELAY_TLS_CA" in env) == tls
        assert container["command"] == ["/usr/local/bin/outbox-relay"]
        assert _pod_spec(relay)["terminationGracePeriodSeconds"] > 20


def test_services(variant):
    services = {s["metadata"]["name"]: s for s in variant.of("Service")}
    main = services[variant.server()["metadata"]["name"]]
    grpc = next(p for p in main["spec"]["ports"] if p["name"] == "grpc")
    assert grpc["appProtocol"] == "grpc"
    assert any(p["name"] == "metrics" for p in main["spec"]["ports"])
    headless = [s for s in services.values() if s["metadata"]["name"].endswith("-headless")]
    assert bool(headless) == variant.values["headlessService"]["enabled"]
    for s in headless:
        assert s["spec"]["clusterIP"] == "None"
        assert s["spec"]["ports"][0]["appProtocol"] == "grpc"


def test_status_page_follows_its_switch(variant):
    """On: OUTBOXD_ADMIN_HTTP_LISTEN on the status port, the container and Service
    ports (https with TLS), and the NetworkPolicy admits it; off: none of them."""
    on = variant.values["statusPage"]["enabled"]
    port = variant.values["containerPorts"]["status"]
    data = variant.configmap()["data"]
    assert (data.get("OUTBOXD_ADMIN_HTTP_LISTEN") == f"0.0.0.0:{port}") == on
    assert ("OUTBOXD_ADMIN_HTTP_LISTEN" in data) == on
    container = variant.server()["spec"]["template"]["spec"]["containers"][0]
    assert ({"name": "status", "containerPort": port, "protocol": "TCP"} in container["ports"]) == on
    main = next(s for s in variant.of("Service") if s["metadata"]["name"] == variant.server()["metadata"]["name"])
    status = [p for p in main["spec"]["ports"] if p["name"] == "status"]
    assert bool(status) == on
    for p in status:
        assert p["appProtocol"] == ("https" if variant.values["tls"]["enabled"] else "http")
    for policy in variant.of("NetworkPolicy"):
        if policy["spec"]["podSelector"] != {"matchLabels": {}} and "server" in json.dumps(policy["spec"]["podSelector"]):
            ports = [p["port"] for rule in policy["spec"].get("ingress", []) for p in rule.get("ports", [])]
            assert ("status" in ports) == on


def test_status_page_off(render):
    off = render({"statusPage": {"enabled": False}})
    assert "OUTBOXD_ADMIN_HTTP_LISTEN" not in off.configmap()["data"]
    container = off.server()["spec"]["template"]["spec"]["containers"][0]
    assert all(p["name"] != "status" for p in container["ports"])


def test_optional_resources_follow_their_switches(variant):
    v = variant.values
    assert bool(variant.of("HorizontalPodAutoscaler")) == v["autoscaling"]["enabled"]
    assert ("replicas" in variant.server()["spec"]) != v["autoscaling"]["enabled"]
    assert bool(variant.of("ServiceMonitor")) == v["metrics"]["serviceMonitor"]["enabled"]
    assert bool(variant.of("PrometheusRule")) == v["prometheusRule"]["enabled"]
    dashboards = [c for c in variant.of("ConfigMap") if "outboxd.json" in c.get("data", {})]
    assert bool(dashboards) == v["grafanaDashboard"]["enabled"]
    assert bool(variant.of("NetworkPolicy")) == v["networkPolicy"]["enabled"]
    otel = "OTEL_EXPORTER_OTLP_ENDPOINT" in variant.configmap()["data"]
    assert otel == v["otel"]["enabled"]


def test_helm_test_pod_checks_grpc_health_from_the_outboxd_image(variant):
    pods = [h for h in variant.hooks if h["kind"] == "Pod"]
    assert len(pods) == 1
    pod = pods[0]
    assert pod["metadata"]["annotations"][HOOK] == "test"
    container = pod["spec"]["containers"][0]
    # The image the chart deploys (and CI builds and runs): no other image to pull.
    assert container["image"] == _pod_spec(variant.server())["containers"][0]["image"]
    command = container["command"]
    assert command[:2] == ["/usr/local/bin/outboxctl", "health"]
    services = [command[i + 1] for i, arg in enumerate(command) if arg == "--service"]
    assert services == ["", READY_SERVICE]
    service = variant.values["service"]
    port = service["healthPort"] if variant.values["tls"]["enabled"] else service["port"]
    # Health is plaintext and open, TLS or not.
    assert command[command.index("--server") + 1] == f"http://{variant.server()['metadata']['name']}:{port}"


def test_notes_explain_how_to_reach_and_check(variant):
    assert "grpc.health.v1.Health/Check" in variant.notes
    assert "helm test" in variant.notes


# --- specific variants and values ---------------------------------------------

def test_defaults(render):
    r = render("default")
    assert r.server()["spec"]["replicas"] == 2
    assert r.job() is not None
    assert r.maybe("PodDisruptionBudget") is not None
    assert r.relay() is None


def test_every_config_value_maps_to_one_env_var(render):
    # values.yaml names each config key's variable in its comment: "(OUTBOXD_...)".
    docs = dict(values_doc.documented())
    defaults = helmkit.load_values(CHART / "values.yaml")["config"]
    names = {}
    for key in defaults:
        found = re.findall(r"\(((?:OUTBOXD|RUST)_[A-Z_]+)\)", docs[f"config.{key}"])
        assert len(found) == 1, f"config.{key}: its comment must name one variable"
        names[key] = found[0]
    assert len(set(names.values())) == len(names), "two values set the same variable"
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["config"]["properties"]
    changed = {}
    for key, value in defaults.items():
        if key == "outboxes":
            changed[key] = [{"name": "a", "table": "s.t"}]
        elif isinstance(value, str) and re.fullmatch(r"\d+(ms|s|m|h|d)", value):
            changed[key] = "7" + value  # still a duration, and different
        elif value == "" and "ms|s|m|h" in schema[key].get("pattern", ""):
            changed[key] = "90s"  # a duration the chart leaves to outboxd by default
        elif value == "" and "[0-9]" in schema[key].get("pattern", ""):
            changed[key] = "300"  # a count the chart leaves to outboxd by default
        elif isinstance(value, (int, float)):
            changed[key] = {"backoffJitter": 0.5, "maxClaimBytes": 2048, "maxMessageBytes": 4096}.get(key, 3)
        else:
            changed[key] = {"logFormat": "text"}.get(key, "debug")
    base = render("default").configmap()["data"]
    data = render({"config": changed}).configmap()["data"]
    diff = {k for k in set(base) | set(data) if base.get(k) != data.get(k)}
    assert diff == set(names.values())
    for key, name in names.items():
        expected = "a=s.t" if key == "outboxes" else str(changed[key])
        assert data[name] == expected, key
    # An empty string leaves each variable to outboxd's default.
    emptied = render({"config": {k: "" for k in defaults if k != "outboxes"}}).configmap()["data"]
    assert set(base) - set(emptied) == {names[k] for k, v in defaults.items() if k != "outboxes" and v != ""}
    assert not {names[k] for k, v in defaults.items() if v == ""} & set(base), "an empty default sets nothing"


def test_chart_reaches_every_flag(render):
    """Every variable the binaries read from their flags can be set by the chart
    (a new flag without a value fails here)."""
    server_seen, relay_seen = set(), set()
    relay_on = {"enabled": True, "amqp": {"existingSecret": "amqp"},
                "config": {"workerId": "w", "noDeclare": True, "bindQueue": "q"}}
    # Values whose default ("") leaves the variable to outboxd's own default.
    server_unset = {"dbStartTimeout": "10m", "maxConnections": 300, "claimSweepInterval": "10m"}
    tls_on = {"tls": {"enabled": True, "existingSecret": "tls", "clientCA": True}, "auth": {"tokensSecret": "tokens"}}
    relay_tls = {**relay_on, "tokenSecret": "t", "amqp": {"existingSecret": "amqp", "caSecret": "ca"},
                 "tls": {"clientCertSecret": "relay-cert"}}
    for values in ["default", "dev-inline-url-values.yaml", {"relay": relay_on, "config": server_unset},
                   {**tls_on, "relay": relay_tls}]:
        r = render(values)
        server_seen |= set(r.configmap()["data"]) | set(_env(_containers(r.server())[0]))
        if r.relay():
            relay_seen |= set(_env(_containers(r.relay())[0]))
    assert _env_names(SERVER_SRC) - server_seen == set()
    assert _env_names(RELAY_SRC) - relay_seen == set()


def _rust_const(name: str) -> int:
    for path in (REPO / "src").rglob("*.rs"):  # outboxd's own defaults
        match = re.search(r"pub const " + name + r": (?:u64|usize) = ([0-9_ *]+);", path.read_text())
        if match:
            value = 1
            for factor in match.group(1).replace("_", "").split("*"):
                value *= int(factor)
            return value
    raise AssertionError(f"const {name} not found in src/")


def test_chart_defaults_are_the_binarys(render):
    """A config value the chart sets by default has outboxd's own default (only
    the log format differs on purpose), written as outboxd parses it: a byte count
    as digits, never as a float such as 3.145728e+06."""
    data = render("default").configmap()["data"]
    # The chart turns the status page on (statusPage.enabled); outboxd leaves it off.
    differ_on_purpose = {
        "OUTBOXD_LOG_FORMAT", "OUTBOXD_LISTEN", "OUTBOXD_METRICS_LISTEN", "OUTBOXD_NO_MIGRATE",
        "OUTBOXD_ADMIN_HTTP_LISTEN",
    }
    # Defaults outboxd applies after parsing rather than through clap.
    applied_later = {"OUTBOXD_OUTBOXES": "default=public.outbox"}
    checked = 0
    for attrs in re.findall(r"#\[arg\((.*?)\)\]\s*pub \w+:", SERVER_SRC, re.S):
        env = re.search(r'env\s*=\s*"([A-Z0-9_]+)"', attrs)
        if not env or env.group(1) not in data or env.group(1) in differ_on_purpose:
            continue
        literal = re.search(r'default_value\s*=\s*"([^"]*)"', attrs)
        given = re.search(r"default_value_t\s*=\s*([A-Za-z0-9_.]+)", attrs)
        if env.group(1) in applied_later:
            expected = applied_later[env.group(1)]
        elif literal:
            expected = literal.group(1)
        elif given:
            raw = given.group(1)
            expected = str(_rust_const(raw)) if raw.isupper() else raw.removesuffix(".0")
        else:
            raise AssertionError(f"the chart sets {env.group(1)} by default, outboxd has no default")
        assert data[env.group(1)] == expected, env.group(1)
        checked += 1
    assert checked >= 20
    assert data["OUTBOXD_MAX_CLAIM_BYTES"] == "3145728"
    assert data["OUTBOXD_MAX_MESSAGE_BYTES"] == "8388608"
    assert "OUTBOXD_DB_START_TIMEOUT" not in data, "outboxd's default differs for server and migrate"


def test_migration_job_gets_the_database_settings(variant):
    """`outboxd migrate` takes DatabaseArgs and LogArgs: the Job sets each such
    variable the ConfigMap sets, with the same value."""
    job = variant.job()
    if job is None:
        return
    migrate_env = _env_names(_struct(SERVER_SRC, "DatabaseArgs")) | _env_names(_struct(CLI_SRC, "LogArgs"))
    assert {"OUTBOXD_DB_START_TIMEOUT", "OUTBOXD_STATEMENT_TIMEOUT"} <= migrate_env
    job_env = _env(_containers(job)[0])
    for name, value in variant.configmap()["data"].items():
        if name in migrate_env:
            assert job_env.get(name) == value, name


def test_outboxes_render_with_options(render):
    data = render("all-options-values.yaml").configmap()["data"]
    assert data["OUTBOXD_OUTBOXES"] == (
        "default=public.outbox,"
        "orders=sales.outbox:ordering=aggregate:poison=park:backoff_base=2s:max_attempts=3:retention=0,"
        "payments=sales.payments_outbox:ordering=aggregate")


@pytest.mark.parametrize("outbox, spec", [
    ({"ordering": "aggregate"}, "o=s.t:ordering=aggregate"),
    ({"ordering": "aggregate", "poison": "block"}, "o=s.t:ordering=aggregate:poison=block"),
    ({"ordering": "aggregate", "poison": "park", "options": {"max_attempts": 5}},
     "o=s.t:ordering=aggregate:poison=park:max_attempts=5"),
    ({"ordering": "none"}, "o=s.t:ordering=none"),
    ({"ordering": "", "poison": ""}, "o=s.t"),  # empty: left to outboxd's default, not rendered
    ({}, "o=s.t"),
])
def test_ordered_outbox_renders_ordering_and_poison(render, outbox, spec):
    """An ordered outbox reaches outboxd as `:ordering=...:poison=...` in
    OUTBOXD_OUTBOXES (ConfigMap, and the migration Job's env), only when set;
    the probes do not change with it."""
    r = render({"config": {"outboxes": [{"name": "o", "table": "s.t", **outbox}]}})
    assert r.configmap()["data"]["OUTBOXD_OUTBOXES"] == spec
    assert _env(_containers(r.job())[0])["OUTBOXD_OUTBOXES"] == spec
    default = render("default").server()["spec"]["template"]["spec"]["containers"][0]
    container = _containers(r.server())[0]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe] == default[probe], probe


def test_config_change_rolls_the_pods(render):
    a = render("default").server()["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    b = render({"config": {"maxBatch": 10}}).server()["spec"]["template"]["metadata"]["annotations"]
    assert a != b["checksum/config"]


def test_inline_url_is_dev_only_secret(render):
    r = render("dev-inline-url-values.yaml")
    [secret] = r.secrets("Opaque")
    assert secret["stringData"] == {"database-url": "postgres://outboxd:devpassword@postgres.dev.svc:5432/outboxd"}
    assert "WARNING" in r.notes
    annotations = r.server()["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/secret" in annotations


def test_existing_service_account_runs_the_job(render):
    r = render("existing-secret-values.yaml")
    assert _pod_spec(r.job())["serviceAccountName"] == "payments-outboxd"
    assert not r.of("ServiceAccount")
    # With a chart-created account the Job cannot use it at pre-install time.
    assert "serviceAccountName" not in _pod_spec(render("default").job())


def test_migrations_use_a_role_of_their_own(render):
    """database.migrations.existingSecret: the hook Job connects as the DDL role,
    the pods as the runtime role of database.existingSecret."""
    r = render({"database": {"existingSecret": "outboxd-runtime",
                             "migrations": {"existingSecret": "outboxd-migrator"}}})
    job_ref = _env(_containers(r.job())[0])["DATABASE_URL"]["secretKeyRef"]
    assert job_ref == {"name": "outboxd-migrator", "key": "database-url"}
    pod_ref = _env(_containers(r.server())[0])["DATABASE_URL"]["secretKeyRef"]
    assert pod_ref == {"name": "outboxd-runtime", "key": "database-url"}
    assert r.configmap()["data"]["OUTBOXD_NO_MIGRATE"] == "true", "the pods never migrate"
    keyed = render({"database": {"existingSecret": "outboxd-runtime", "existingSecretKey": "url",
                                 "migrations": {"existingSecret": "outboxd-migrator", "existingSecretKey": "ddl"}}})
    assert _env(_containers(keyed.job())[0])["DATABASE_URL"]["secretKeyRef"] == {
        "name": "outboxd-migrator", "key": "ddl"}
    assert _env(_containers(keyed.server())[0])["DATABASE_URL"]["secretKeyRef"] == {
        "name": "outboxd-runtime", "key": "url"}
    # Without it, one Secret serves both, as before.
    shared = render("default")
    assert (_env(_containers(shared.job())[0])["DATABASE_URL"]
            == _env(_containers(shared.server())[0])["DATABASE_URL"])


@pytest.mark.parametrize("values", [
    {"migrations": {"mode": "onStart"}},
    {"migrations": {"mode": "none"}},
    {"database": {"url": "postgres://u:p@db/x"}},
])
def test_a_migrations_role_without_a_job_is_refused(render, values):
    values = helmkit._deep_merge(values, {"database": {"migrations": {"existingSecret": "ddl"}}})
    with pytest.raises(helmkit.RenderError, match="database.migrations.existingSecret"):
        render(values)


def test_migration_modes(render):
    none = render({"migrations": {"mode": "none"}})
    assert none.job() is None and none.configmap()["data"]["OUTBOXD_NO_MIGRATE"] == "true"
    on_start = render({"migrations": {"mode": "onStart"}})
    assert on_start.job() is None and "OUTBOXD_NO_MIGRATE" not in on_start.configmap()["data"]


def test_pdb_switches(render):
    assert render({"replicaCount": 1}).maybe("PodDisruptionBudget") is None
    assert render({"replicaCount": 1, "podDisruptionBudget": {"enabled": True}}).maybe("PodDisruptionBudget")
    assert render({"podDisruptionBudget": {"enabled": False}}).maybe("PodDisruptionBudget") is None


def test_all_options(render):
    r = render("all-options-values.yaml")
    image = _containers(r.server())[0]["image"]
    assert image.endswith("@sha256:" + "0123456789abcdef" * 4)
    assert _containers(r.relay())[0]["image"] == image
    assert _pod_spec(r.server())["terminationGracePeriodSeconds"] == 60
    assert r.one("PodDisruptionBudget")["spec"] == {
        "minAvailable": 2, "selector": r.server()["spec"]["selector"]}
    policies = {p["metadata"]["name"]: p for p in r.of("NetworkPolicy")}
    server_policy = policies[r.server()["metadata"]["name"]]
    egress = json.dumps(server_policy["spec"]["egress"])
    assert "10.20.0.0/16" in egress and '"port": 53' in egress and '"port": 4317' in egress
    assert len(r.of("ServiceMonitor")) == 2
    relay_env = _env(_containers(r.relay())[0])
    assert relay_env["OUTBOX_RELAY_NO_DECLARE"] == "true"
    assert relay_env["OUTBOX_RELAY_CLAIM_AHEAD"] == "false"
    assert relay_env["OUTBOX_RELAY_ACK_WITH_CLAIM"] == "false"
    assert relay_env["OTEL_SERVICE_NAME"] == "outbox-relay"
    assert relay_env["OUTBOX_RELAY_METRICS_LISTEN"] == "0.0.0.0:9091"
    data = r.configmap()["data"]
    assert (data["OUTBOXD_MAX_CLAIM_BYTES"], data["OUTBOXD_MAX_MESSAGE_BYTES"]) == ("2097152", "3145728")
    assert data["OUTBOXD_CLAIM_SWEEP_INTERVAL"] == "10m"
    job_env = _env(_containers(r.job())[0])
    assert (job_env["OUTBOXD_DB_START_TIMEOUT"], job_env["OUTBOXD_STATEMENT_TIMEOUT"]) == ("5m", "10s")


def test_claim_sweep_interval_reaches_outboxd(render):
    """config.claimSweepInterval sets OUTBOXD_CLAIM_SWEEP_INTERVAL in the ConfigMap the
    outboxd pods load; "0" (sweep off) is passed through, and the default (empty) sets
    nothing, leaving outboxd's own default, which values.yaml names."""
    default = render("default")
    assert "OUTBOXD_CLAIM_SWEEP_INTERVAL" not in default.configmap()["data"]
    flag = re.search(r'#\[arg\(([^]]*env = "OUTBOXD_CLAIM_SWEEP_INTERVAL"[^]]*)\)\]', SERVER_SRC)
    assert flag, "outboxd has no --claim-sweep-interval"
    outboxd_default = re.search(r'default_value\s*=\s*"([^"]*)"', flag.group(1)).group(1)
    assert f"outboxd's default, {outboxd_default}." in dict(values_doc.documented())["config.claimSweepInterval"]
    for value in ["1m", "0", "1h30m"]:
        r = render({"config": {"claimSweepInterval": value}})
        assert r.configmap()["data"]["OUTBOXD_CLAIM_SWEEP_INTERVAL"] == value
        server = _containers(r.server())[0]
        assert {"configMapRef": {"name": r.configmap()["metadata"]["name"]}} in server["envFrom"]
        assert "OUTBOXD_CLAIM_SWEEP_INTERVAL" not in _env(server), "set once, in the ConfigMap"


@pytest.mark.parametrize("values, reason", [
    ({"database": {"url": "postgres://u:p@db/x"}, "migrations": {"mode": "job"}}, "pre-install"),
    ({"config": {"claimSweepInterval": "5 minutes"}}, "claimSweepInterval"),
    ({"database": {"existingSecret": ""}}, "existingSecret"),
    ({"relay": {"enabled": True}}, "existingSecret"),
    ({"terminationGracePeriodSeconds": 20}, "terminationGracePeriodSeconds"),
    ({"config": {"drainTimeout": "20 seconds"}}, "drainTimeout"),
    ({"config": {"statementTimeout": "0"}}, "statementTimeout"),
    ({"config": {"dbStartTimeout": "forever"}}, "dbStartTimeout"),
    ({"prometheusRule": {"alerts": {"oldestPendingAge": {"threshold": -1}}}}, "threshold"),
    ({"prometheusRule": {"alerts": {"oldestPendingAge": {"for": "five minutes"}}}}, "for"),
    ({"prometheusRule": {"alerts": {"oldestPendingAges": {"enabled": True}}}}, "oldestPendingAges"),
    ({"prometheusRule": {"replicaLabels": ["pod name"]}}, "replicaLabels"),
    ({"config": {"maxClaimBytes": 512}}, "maxClaimBytes"),
    ({"config": {"maxClaimBytes": 65536, "maxMessageBytes": 4096}}, "maxMessageBytes"),
    ({"config": {"maxMessageBytes": "2097152"}}, "maxMessageBytes"),  # under the default claim budget
    ({"securityContext": {"readOnlyRootFilesystem": False}}, "readOnlyRootFilesystem"),
    ({"otel": {"enabled": True}}, "endpoint"),
    ({"migrations": {"mode": "sometimes"}}, "mode"),
    ({"replicaCont": 3}, "replicaCont"),
    ({"config": {"outboxes": [{"name": "o", "table": "s.t", "ordering": "partition"}]}}, "ordering"),
    ({"config": {"outboxes": [{"name": "o", "table": "s.t", "ordering": "aggregate", "poison": "drop"}]}},
     "poison"),
    ({"config": {"outboxes": [{"name": "o", "table": "s.t", "poison": "park"}]}}, "ordering"),
    ({"config": {"outboxes": [{"name": "o", "table": "s.t", "ordering": "none", "poison": "block"}]}},
     "ordering"),
    ({"config": {"outboxes": [{"name": "o", "table": "s.t", "options": {"ordering": "aggregate"}}]}},
     "ordering"),
])
def test_bad_values_are_refused(render, values, reason):
    with pytest.raises(helmkit.RenderError, match=reason):
        render(values)


# --- TLS and authorisation ------------------------------------------------------

def test_every_ci_values_file_sets_auth():
    for path in CI_FILES:
        auth = helmkit.load_values(path).get("auth", {})
        assert auth.get("tokensSecret") or auth.get("allowUnauthenticated"), path.name


@pytest.mark.parametrize("auth", [{}, {"allowUnauthenticated": False}, {"tokensSecret": ""}])
def test_an_open_api_is_refused_unless_asked_for(render, auth):
    """Secure by default: the chart listens on 0.0.0.0, so without tokens it
    renders only when the open API is asked for."""
    with pytest.raises(helmkit.RenderError, match="auth.tokensSecret"):
        render({"auth": auth})


def test_auth_modes_set_outboxd_variables(render):
    open_env = _env(_containers(render("default").server())[0])
    assert open_env["OUTBOXD_ALLOW_UNAUTHENTICATED"] == "true" and "OUTBOXD_AUTH_TOKENS" not in open_env
    r = render({"auth": {"tokensSecret": "outboxd-tokens", "tokensSecretKey": "file"}})
    env = _env(_containers(r.server())[0])
    assert env["OUTBOXD_AUTH_TOKENS"] == "/etc/outboxd/auth/file"
    assert "OUTBOXD_ALLOW_UNAUTHENTICATED" not in env
    pod = _pod_spec(r.server())
    volume = next(v for v in pod["volumes"] if v["name"] == "auth")
    assert volume["secret"]["secretName"] == "outboxd-tokens"
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "auth")
    assert mount == {"name": "auth", "mountPath": "/etc/outboxd/auth", "readOnly": True}, \
        "a directory, never subPath: an updated Secret must reach the pod"


def test_tls_from_a_secret(render):
    r = render("tls-secret-values.yaml")
    container = _containers(r.server())[0]
    env = _env(container)
    assert env["OUTBOXD_TLS_CERT"] == "/etc/outboxd/tls/tls.crt"
    assert env["OUTBOXD_TLS_KEY"] == "/etc/outboxd/tls/tls.key"
    assert "OUTBOXD_TLS_CLIENT_CA" not in env
    pod = _pod_spec(r.server())
    volume = next(v for v in pod["volumes"] if v["name"] == "tls")
    assert volume["secret"]["secretName"] == "outboxd-tls" and "items" not in volume["secret"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "tls")
    assert mount["readOnly"] is True and "subPath" not in mount
    assert not r.of("Certificate")
    assert not r.secrets("kubernetes.io/tls"), "a given Secret: the chart makes no certificate"
    service = next(s for s in r.of("Service") if s["metadata"]["name"] == r.server()["metadata"]["name"])
    health = next(p for p in service["spec"]["ports"] if p["name"] == "health")
    assert health["targetPort"] == "health"
    # The NetworkPolicy lets the kubelet's probes (from the node) reach the health port only.
    policy = next(p for p in r.of("NetworkPolicy") if p["metadata"]["name"] == r.server()["metadata"]["name"])
    open_rules = [rule for rule in policy["spec"]["ingress"] if "from" not in rule]
    assert open_rules == [{"ports": [{"port": "health", "protocol": "TCP"}]}]
    # The relay: https://, the Secret's CA alone (never the server's key), its token.
    relay = r.relay()
    env = _env(_containers(relay)[0])
    assert env["OUTBOX_SERVER"] == "https://outboxd.outboxd-test.svc:50051"
    assert env["OUTBOX_RELAY_TLS_CA"] == "/etc/outbox-relay/ca/ca.crt"
    assert env["OUTBOX_RELAY_TOKEN_FILE"] == "/etc/outbox-relay/token/token"
    volumes = {v["name"]: v for v in _pod_spec(relay)["volumes"]}
    assert volumes["ca"]["secret"]["secretName"] == "outboxd-tls"
    assert volumes["ca"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    assert volumes["token"]["secret"]["secretName"] == "relay-token"
    # `helm test` asks the plaintext health-only port: the API port speaks TLS.
    command = next(h for h in r.hooks if h["kind"] == "Pod")["spec"]["containers"][0]["command"]
    assert "http://outboxd:50052" in command


def test_tls_from_cert_manager_with_client_certificates(render):
    r = render("all-options-values.yaml")
    cert = r.one("Certificate")
    name = r.server()["metadata"]["name"]
    assert cert["apiVersion"] == "cert-manager.io/v1"
    assert cert["spec"]["secretName"] == f"{name}-tls"
    assert cert["spec"]["issuerRef"] == {"name": "internal-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    ns = "outboxd-test"
    for host in (name, f"{name}.{ns}.svc", f"{name}-headless.{ns}.svc.cluster.local"):
        assert host in cert["spec"]["dnsNames"], host
    assert (cert["spec"]["duration"], cert["spec"]["renewBefore"]) == ("720h", "240h")
    env = _env(_containers(r.server())[0])
    assert env["OUTBOXD_TLS_CLIENT_CA"] == "/etc/outboxd/tls/ca.crt"
    assert env["OUTBOXD_AUTH_TOKENS"] == "/etc/outboxd/auth/tokens.txt"
    volumes = {v["name"]: v for v in _pod_spec(r.server())["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == f"{name}-tls"
    assert not r.secrets("kubernetes.io/tls"), "cert-manager writes the Secret, not the chart"
    # The relay trusts the CA in the Secret cert-manager writes.
    relay_volumes = {v["name"]: v for v in _pod_spec(r.relay())["volumes"]}
    assert relay_volumes["ca"]["secret"] == {"secretName": f"{name}-tls", "defaultMode": 0o440,
                                             "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert "checksum/tls-ca" not in r.relay()["spec"]["template"]["metadata"]["annotations"]
    relay_env = _env(_containers(r.relay())[0])
    assert relay_env["OUTBOX_RELAY_TLS_CERT"] == "/etc/outbox-relay/client/tls.crt"
    assert relay_env["OUTBOX_RELAY_TLS_KEY"] == "/etc/outbox-relay/client/tls.key"
    assert relay_env["OUTBOX_RELAY_TOKEN_FILE"] == "/etc/outbox-relay/token/bearer"
    assert relay_env["OUTBOX_RELAY_AMQP_TLS_CA"] == "/etc/outbox-relay/amqp-ca/ca.crt"
    custom = render({"tls": {"enabled": True, "certManager": {"enabled": True, "issuerRef": {"name": "ca"},
                                                               "dnsNames": ["outboxd.example.com"]}}})
    assert custom.one("Certificate")["spec"]["dnsNames"] == ["outboxd.example.com"]


@pytest.mark.parametrize("values, reason", [
    ({"tls": {"enabled": True, "certManager": {"enabled": True}}}, "issuerRef.name"),
    ({"tls": {"clientCA": True}}, "tls.clientCA needs a CA"),
    ({"tls": {"enabled": True, "existingSecret": "t", "clientCA": True},
      "relay": {"enabled": True, "amqp": {"existingSecret": "a"}}}, "relay.tls.clientCertSecret"),
    ({"auth": {"tokensSecret": "t"}, "relay": {"enabled": True, "amqp": {"existingSecret": "a"}}},
     "relay.tokenSecret"),
    ({"tls": {"enabled": False},
      "relay": {"enabled": True, "amqp": {"existingSecret": "a"}, "server": "https://o:1"}}, "relay.tls.caSecret"),
    ({"tls": {"enabled": False},
      "relay": {"enabled": True, "amqp": {"existingSecret": "a"}, "tls": {"clientCertSecret": "c"}}},
     "needs TLS"),
])
def test_tls_and_auth_mistakes_are_refused(render, values, reason):
    with pytest.raises(helmkit.RenderError, match=reason):
        render(values)


# --- TLS by default: the generated certificate ---------------------------------

RELAY_ON = {"enabled": True, "amqp": {"existingSecret": "rabbitmq-url"}}


def _pem(secret: dict, key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


def _generated(r: Rendered) -> dict:
    [secret] = r.secrets("kubernetes.io/tls")
    return secret


def test_tls_is_on_by_default_with_a_certificate_the_chart_generates(render):
    """No TLS value given: outboxd serves TLS with a CA and certificate the chart
    made (ECDSA, for the Service's names), the probes use the plaintext health
    port, and the chart's relay connects with https:// trusting that CA alone."""
    r = render({"relay": RELAY_ON})
    name = r.server()["metadata"]["name"]
    secret = _generated(r)
    assert secret["metadata"]["name"] == f"{name}-tls"
    assert set(secret["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    ca = x509.load_pem_x509_certificate(_pem(secret, "ca.crt"))
    cert = x509.load_pem_x509_certificate(_pem(secret, "tls.crt"))
    key = serialization.load_pem_private_key(_pem(secret, "tls.key"), password=None)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    cert.verify_directly_issued_by(ca)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers(), "the key is the certificate's"
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName)
    ns = "outboxd-test"
    assert names == [name, f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"]
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.SERVER_AUTH in usages
    days = (cert.not_valid_after_utc - cert.not_valid_before_utc).days
    assert days >= r.values["tls"]["generated"]["validityDays"] - 1
    # outboxd serves TLS from it, and the probes use the plaintext health port.
    container = _containers(r.server())[0]
    env = _env(container)
    assert (env["OUTBOXD_TLS_CERT"], env["OUTBOXD_TLS_KEY"]) == ("/etc/outboxd/tls/tls.crt", "/etc/outboxd/tls/tls.key")
    assert env["OUTBOXD_HEALTH_LISTEN"] == "0.0.0.0:50052"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["grpc"]["port"] == 50052, probe
    volumes = {v["name"]: v for v in _pod_spec(r.server())["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == f"{name}-tls"
    status = next(p for p in r.one("Service", "server")["spec"]["ports"] if p["name"] == "status")
    assert status["appProtocol"] == "https"
    # The relay: https://, the generated CA alone (never the server's key), and a
    # checksum of that CA, so a new one restarts it.
    relay = r.relay()
    relay_env = _env(_containers(relay)[0])
    assert relay_env["OUTBOX_SERVER"] == f"https://{name}.{ns}.svc:50051"
    assert relay_env["OUTBOX_RELAY_TLS_CA"] == "/etc/outbox-relay/ca/ca.crt"
    relay_volumes = {v["name"]: v for v in _pod_spec(relay)["volumes"]}
    assert relay_volumes["ca"]["secret"]["secretName"] == f"{name}-tls"
    assert relay_volumes["ca"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    annotations = relay["spec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/tls-ca"] == hashlib.sha256(secret["data"]["ca.crt"].encode()).hexdigest()
    # The relay's server name is one the certificate holds.
    assert relay_env["OUTBOX_SERVER"].removeprefix("https://").rsplit(":", 1)[0] in names
    assert "https://" in r.notes and "ca.crt" in r.notes


def test_the_generated_certificate_covers_the_headless_service(render):
    cert = x509.load_pem_x509_certificate(_pem(_generated(render({"headlessService": {"enabled": True}})), "tls.crt"))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName)
    assert "outboxd-headless.outboxd-test.svc" in names and "outboxd.outboxd-test.svc" in names


def test_the_generated_certificate_is_kept_across_upgrades():
    """An upgrade finds the release's Secret (Helm's lookup) and keeps its CA,
    certificate and key, so relays keep trusting outboxd; an install without one
    makes a new CA, and so do other Service names and a Secret missing a key."""
    values = {**OPEN, "relay": RELAY_ON}
    with helmkit.fake_api() as kubeconfig:
        first = Rendered(helmkit.render(CHART, values, kubeconfig), _merged(values))
        again = Rendered(helmkit.render(CHART, values, kubeconfig), _merged(values))
    installed = _generated(first)
    assert _generated(again)["data"] != installed["data"], "nothing to look up: a new CA each install"
    existing = helmkit.owned_by(copy.deepcopy(installed))
    with helmkit.fake_api([existing]) as kubeconfig:
        upgraded = Rendered(helmkit.render(CHART, values, kubeconfig), _merged(values))
    assert _generated(upgraded)["data"] == installed["data"], "kept across the upgrade"
    checksum = "checksum/tls-ca"
    assert (upgraded.relay()["spec"]["template"]["metadata"]["annotations"][checksum]
            == first.relay()["spec"]["template"]["metadata"]["annotations"][checksum]), \
        "the same CA does not restart the relays"
    # Turning the headless Service on changes the names: a certificate for them.
    headless = {**values, "headlessService": {"enabled": True}}
    with helmkit.fake_api([helmkit.owned_by(copy.deepcopy(installed))]) as kubeconfig:
        renamed = Rendered(helmkit.render(CHART, headless, kubeconfig), _merged(headless))
    assert _generated(renamed)["data"]["ca.crt"] != installed["data"]["ca.crt"]
    assert "outboxd-headless.outboxd-test.svc" in _generated(renamed)["metadata"]["annotations"][
        "outboxd.io/dns-names"].split(",")
    broken = helmkit.owned_by(copy.deepcopy(installed))
    del broken["data"]["tls.key"]
    with helmkit.fake_api([broken]) as kubeconfig:
        remade = Rendered(helmkit.render(CHART, values, kubeconfig), _merged(values))
    data = _generated(remade)["data"]
    assert set(data) == {"ca.crt", "tls.crt", "tls.key"}
    assert data["ca.crt"] != installed["data"]["ca.crt"], "made again, all three together"
    x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"])).verify_directly_issued_by(
        x509.load_pem_x509_certificate(base64.b64decode(data["ca.crt"])))


def test_tls_from_cert_manager_or_a_given_secret_generates_nothing(render):
    managed = render({"tls": {"certManager": {"enabled": True, "issuerRef": {"name": "ca"}}}, "relay": RELAY_ON})
    name = managed.server()["metadata"]["name"]
    assert managed.one("Certificate")["spec"]["secretName"] == f"{name}-tls"
    assert not managed.secrets("kubernetes.io/tls")
    assert _env(_containers(managed.relay())[0])["OUTBOX_SERVER"].startswith("https://")
    given = render({"tls": {"existingSecret": "my-tls"}, "relay": RELAY_ON})
    assert not given.secrets("kubernetes.io/tls") and not given.of("Certificate")
    assert {v["name"]: v for v in _pod_spec(given.server())["volumes"]}["tls"]["secret"]["secretName"] == "my-tls"
    assert {v["name"]: v for v in _pod_spec(given.relay())["volumes"]}["ca"]["secret"]["secretName"] == "my-tls"


def test_plaintext_only_when_tls_is_turned_off(render):
    r = render({"tls": {"enabled": False}, "relay": RELAY_ON})
    assert not r.secrets("kubernetes.io/tls") and not r.of("Certificate")
    container = _containers(r.server())[0]
    env = _env(container)
    assert not {n for n in env if n.startswith("OUTBOXD_TLS_")}
    assert "OUTBOXD_HEALTH_LISTEN" not in env
    assert all(p["name"] != "health" for p in container["ports"])
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["grpc"]["port"] == 50051, probe
    assert all(v["name"] != "tls" for v in _pod_spec(r.server())["volumes"])
    relay_env = _env(_containers(r.relay())[0])
    assert relay_env["OUTBOX_SERVER"].startswith("http://") and "OUTBOX_RELAY_TLS_CA" not in relay_env
    assert all(v["name"] != "ca" for v in _pod_spec(r.relay())["volumes"])
    status = next(p for p in r.one("Service", "server")["spec"]["ports"] if p["name"] == "status")
    assert status["appProtocol"] == "http"
    assert "plaintext" in r.notes


# --- NetworkPolicy by default ----------------------------------------------------

def _server_policy(r: Rendered) -> dict:
    return next(p for p in r.of("NetworkPolicy") if p["metadata"]["name"] == r.server()["metadata"]["name"])


def _ingress_from(policy: dict, port: str) -> list[dict]:
    return [peer for rule in policy["spec"]["ingress"] if {"port": port, "protocol": "TCP"} in rule.get("ports", [])
            for peer in rule.get("from", [{"anyone": True}])]


def test_network_policy_is_on_by_default_and_follows_its_values(render):
    """On without a word: the API port and the status page from this release's
    relay and test pods, the release namespace and the labelled namespaces; the
    plaintext metrics port from Prometheus in the monitoring namespace only;
    egress left alone until asked for."""
    r = render("default")
    policy = _server_policy(r)
    assert policy["spec"]["policyTypes"] == ["Ingress"] and "egress" not in policy["spec"]
    own = {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "outboxd"},
                           "matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "In",
                                                 "values": ["relay", "test"]}]}}
    namespace = {"podSelector": {}}
    labelled = {"namespaceSelector": {"matchLabels": {"outboxd.io/client": "true"}}, "podSelector": {}}
    for port in ("grpc", "status"):
        assert _ingress_from(policy, port) == [own, namespace, labelled], port
    assert _ingress_from(policy, "metrics") == [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    assert _ingress_from(policy, "health") == [{"anyone": True}], "the kubelet's probes"
    # The values reach the policy.
    custom = _server_policy(render({"networkPolicy": {"ingress": {
        "grpcFromReleaseNamespace": False,
        "grpcNamespaceSelector": {"matchLabels": {"outboxd.io/client": None, "team": "orders"}},
        "metricsNamespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
        "metricsPodSelector": {"matchLabels": None}}}}))
    assert _ingress_from(custom, "grpc") == [
        own, {"namespaceSelector": {"matchLabels": {"team": "orders"}}, "podSelector": {}}]
    assert _ingress_from(custom, "metrics") == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}, "podSelector": {}}]
    limited = render({"networkPolicy": {"egress": {"enabled": True}}, "relay": RELAY_ON})
    for p in limited.of("NetworkPolicy"):
        assert p["spec"]["policyTypes"] == ["Ingress", "Egress"] and p["spec"]["egress"], p["metadata"]["name"]
    relay_policy = next(p for p in render({"relay": RELAY_ON}).of("NetworkPolicy")
                        if p["metadata"]["name"].endswith("-relay"))
    assert relay_policy["spec"]["policyTypes"] == ["Ingress"] and "egress" not in relay_policy["spec"]
    assert not render({"networkPolicy": {"enabled": False}}).of("NetworkPolicy")


def test_metrics_listen_is_set_explicitly_for_prometheus(render):
    """outboxd's own default may keep metrics on loopback; the chart always binds
    every address on the metrics container port, which the Service targets."""
    for values, port in [("default", 9090), ({"containerPorts": {"metrics": 9100}}, 9100)]:
        r = render(values)
        assert r.configmap()["data"]["OUTBOXD_METRICS_LISTEN"] == f"0.0.0.0:{port}"
        container = _containers(r.server())[0]
        assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in container["ports"]
        metrics = next(p for p in r.one("Service", "server")["spec"]["ports"] if p["name"] == "metrics")
        assert metrics["targetPort"] == "metrics"


# --- alerts and dashboard -----------------------------------------------------

def _alerts(doc: dict) -> dict[str, dict]:
    return {r["alert"]: r for g in doc["spec"]["groups"] for r in g["rules"] if "alert" in r}


def test_alerts_and_dashboard_are_off_by_default(render):
    r = render("default")
    assert r.of("PrometheusRule") == []
    assert [c for c in r.of("ConfigMap") if "outboxd.json" in c.get("data", {})] == []


def test_prometheus_rule_carries_labels_namespace_and_the_readme_alerts(render):
    r = render({"prometheusRule": {"enabled": True, "namespace": "monitoring",
                                   "labels": {"release": "kube-prometheus"}}})
    rule = r.one("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    assert rule["metadata"]["labels"]["app.kubernetes.io/component"] == "monitoring"
    alerts = _alerts(rule)
    metrics = " ".join(a["expr"] for a in alerts.values())
    for name in ["outbox_oldest_pending_age_seconds", "outbox_dead_lettered_messages",
                 "outbox_blocked_keys", "outbox_oldest_blocked_key_age_seconds",
                 "outbox_commit_order_holdback_seconds", "outbox_db_xmin_horizon_age_seconds",
                 "outbox_table_dead_tuples", "outbox_table_last_autovacuum_age_seconds",
                 "outbox_messages_acked_total", 'outbox_rpc_duration_seconds_count{code="Unavailable"}',
                 "outbox_auth_refusals_total", 'outbox_auth_reloads_total{result!="ok"}',
                 "outbox_waiting_claims_refused_total", "outbox_claim_sweep_found_total"]:
        assert name in metrics, name
    # The job label a ServiceMonitor gives its targets is the Service's name.
    assert 'up{job="outboxd", namespace="outboxd-test"}' in alerts["OutboxdDown"]["expr"]
    for name, a in alerts.items():
        assert a["labels"]["severity"] in ("critical", "warning"), name
        assert {"summary", "description", "runbook_url"} <= set(a["annotations"]), name
        # Prometheus' templating reaches Prometheus: Helm did not eat it.
        assert "{{ $" in a["annotations"]["summary"] + a["annotations"]["description"], name
        assert a["annotations"]["runbook_url"].startswith(
            r.values["prometheusRule"]["runbookBaseUrl"] + "#"), name


def test_alert_values_reach_the_rules(render):
    rule = render({"prometheusRule": {
        "enabled": True,
        "replicaLabels": ["pod"],
        "runbookBaseUrl": "https://wiki.example/outboxd",
        "additionalAlertLabels": {"team": "payments"},
        "alerts": {
            "oldestPendingAge": {"threshold": 120, "for": "2m", "severity": "page"},
            "deadTuplesGrowing": {"threshold": 5000000},
            "waitingClaimsRefused": {"threshold": 0.5},
            "blockedKeys": {"enabled": False},
        },
        "additionalRules": [{"alert": "OutboxCustom", "expr": "vector(1)", "labels": {"severity": "info"}}],
    }}).one("PrometheusRule")
    alerts = _alerts(rule)
    age = alerts["OutboxOldestPendingAgeHigh"]
    assert age["expr"] == "max without (pod) (outbox_oldest_pending_age_seconds) > 120"
    assert age["for"] == "2m"
    assert age["labels"] == {"severity": "page", "team": "payments"}
    assert age["annotations"]["runbook_url"] == "https://wiki.example/outboxd#operations-what-to-alert-on"
    # Large thresholds print as PromQL numbers, not Go's 5e+06.
    assert "outbox_table_dead_tuples) > 5000000 and" in alerts["OutboxTableDeadTuplesGrowing"]["expr"]
    assert alerts["OutboxWaitingClaimsRefused"]["expr"].endswith("> 0.5")
    assert "OutboxBlockedKeys" not in alerts
    assert alerts["OutboxCustom"] == {"alert": "OutboxCustom", "expr": "vector(1)", "labels": {"severity": "info"}}


def test_claim_sweep_found_alert(render):
    """OutboxClaimSweepFound: on by default, at once (for 0m), a warning; any increase
    in the last hour, or a series new in the last hour that appears above 0, summed
    over the replica labels per outbox; the runbook is the README's operations
    section; it can be turned off and its values reach the rule."""
    found = _alerts(render({"prometheusRule": {"enabled": True}}).one("PrometheusRule"))["OutboxClaimSweepFound"]
    assert found["expr"] == (
        "sum without (instance, pod) (increase(outbox_claim_sweep_found_total[1h]) > 0"
        " or (outbox_claim_sweep_found_total > 0 unless outbox_claim_sweep_found_total offset 1h))")
    assert found["for"] == "0m"
    assert found["labels"] == {"severity": "warning"}
    assert found["annotations"]["runbook_url"] == (
        "https://github.com/outboxd/outboxd/blob/main/README.md#operations-what-to-alert-on")
    assert "{{ $labels.outbox }}" in found["annotations"]["summary"]
    assert "--claim-sweep-interval" in found["annotations"]["description"]
    assert "the claim sweep found a claimable event below the claim cursor" in found["annotations"]["description"]
    assert "the claim sweep found a claimable event below the claim cursor" in (REPO / "src/tasks/sweep.rs").read_text(), \
        "the description quotes outboxd's WARN line"

    tuned = _alerts(render({"prometheusRule": {"enabled": True, "replicaLabels": ["pod"], "alerts": {
        "claimSweepFound": {"for": "1m", "severity": "critical"}}}}).one("PrometheusRule"))
    assert tuned["OutboxClaimSweepFound"]["expr"].startswith("sum without (pod) (increase(")
    assert (tuned["OutboxClaimSweepFound"]["for"], tuned["OutboxClaimSweepFound"]["labels"]) == (
        "1m", {"severity": "critical"})

    off = _alerts(render({"prometheusRule": {"enabled": True, "alerts": {
        "claimSweepFound": {"enabled": False}}}}).one("PrometheusRule"))
    assert "OutboxClaimSweepFound" not in off and "OutboxCommitOrderHoldback" in off


def test_commit_order_holdback_alert_covers_unordered_outboxes(render):
    """outbox_commit_order_holdback_seconds holds unordered outboxes' claim cursors
    too (#48): the alert no longer speaks of ordered outboxes only."""
    holdback = _alerts(render({"prometheusRule": {"enabled": True}}).one("PrometheusRule"))["OutboxCommitOrderHoldback"]
    text = holdback["annotations"]["summary"] + " " + holdback["annotations"]["description"]
    assert "claim cursor" in text and "ordered outbox {{" not in text
    assert holdback["annotations"]["runbook_url"].endswith("#operations-what-to-alert-on")


def test_dashboard_configmap_carries_the_chart_dashboard(render):
    r = render({"grafanaDashboard": {"enabled": True, "namespace": "grafana",
                                     "sidecarLabels": {"grafana_dashboard": "outboxd"},
                                     "labels": {"team": "payments"},
                                     "annotations": {"grafana_folder": "Outbox"}}})
    [cm] = [c for c in r.of("ConfigMap") if "outboxd.json" in c.get("data", {})]
    assert cm["metadata"]["namespace"] == "grafana"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "outboxd"
    assert cm["metadata"]["labels"]["team"] == "payments"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Outbox"}
    assert json.loads(cm["data"]["outboxd.json"]) == json.loads((CHART / "dashboards/outboxd.json").read_text())
    assert r.configmap()["metadata"]["name"] != cm["metadata"]["name"]


def test_dashboard_sidecar_label_defaults_to_grafana_dashboard_1(render):
    [cm] = [c for c in render({"grafanaDashboard": {"enabled": True}}).of("ConfigMap")
            if "outboxd.json" in c.get("data", {})]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "outboxd-test"


def test_dashboard_has_the_panels_and_variables(render):
    dash = json.loads((CHART / "dashboards/outboxd.json").read_text())
    titles = {p["title"] for p in dash["panels"]}
    for title in ["Pending", "In flight", "Oldest pending age", "Dead letters", "Blocked keys",
                  "Claim / ack rates", "RPC latency p50 / p99 by method", "RPC codes",
                  "Commit-order holdback", "xmin horizon age", "Dead tuples", "Last autovacuum age",
                  "Auth refusals"]:
        assert title in titles, title
    assert {v["name"] for v in dash["templating"]["list"]} >= {"datasource", "outbox"}


# --- values.yaml documentation and schema coverage ----------------------------

def test_every_value_is_documented():
    assert values_doc.undocumented() == []


def test_schema_covers_every_value():
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = helmkit.load_values(CHART / "values.yaml")

    def walk(node: Any, sch: dict, path: str) -> list[str]:
        missing = []
        if isinstance(node, dict):
            props = sch.get("properties")
            if props is None:
                if sch.get("type") != "object":
                    missing.append(path)
                return missing
            for key, value in node.items():
                sub = f"{path}.{key}" if path else key
                if key not in props:
                    missing.append(sub)
                else:
                    missing += walk(value, props[key], sub)
        return missing

    assert walk(values, schema, "") == []


def test_readme_values_table_is_current():
    _, expected = values_doc._readme_with(values_doc.table())
    assert (CHART / "README.md").read_text() == expected, \
        "run: python helm/outboxd/ci/values_doc.py --write"
