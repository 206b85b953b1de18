"""Checks of the chart's alerts and dashboard, run by scripts/check-helm:

    python monitoring.py rules OUT_DIR       render the PrometheusRule and the dashboard's
                                             queries into Prometheus rule files for promtool
    python monitoring.py metrics             every metric the rules and the dashboard name
                                             is one the code exports
    python monitoring.py dashboard           dashboards/outboxd.json against
                                             ci/grafana-dashboard.schema.json, and the
                                             rendered ConfigMap carries it unchanged
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

import helmkit

CHART = Path(__file__).resolve().parent.parent
REPO = CHART.parent.parent
DASHBOARD = CHART / "dashboards" / "outboxd.json"
DASHBOARD_SCHEMA = CHART / "ci" / "grafana-dashboard.schema.json"
# Where metric names are defined: each once, as a string literal.
METRIC_SOURCES = [REPO / "src" / "metrics.rs", REPO / "relay" / "src" / "metrics.rs"]
# Metrics the alerts and the dashboard may use before src/ exports them (none now:
# the watchdog's gauges were listed here until they landed). A name here is
# dropped as soon as src/ defines it; the check says so.
PENDING_METRICS: set[str] = set()
# Series Prometheus derives from a histogram's name.
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
# Prometheus' own series an alert may use instead (OutboxdDown: the scrape's `up`).
PROMETHEUS_OWN = re.compile(r"\bup\{")
# Grafana's variables, replaced by something PromQL parses so promtool can check
# the dashboard's queries too.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "$outbox": ".*"}
# Every switch on: what the checks look at.
ENABLED = {
    "auth": {"allowUnauthenticated": True},
    "prometheusRule": {"enabled": True},
    "grafanaDashboard": {"enabled": True},
}


def rendered() -> tuple[dict[str, Any], dict[str, Any]]:
    """(the PrometheusRule, the dashboard ConfigMap) as Helm renders them."""
    with helmkit.fake_api() as kubeconfig:
        docs = helmkit.render(CHART, ENABLED, kubeconfig)["manifests"]
    rule = [d for d in docs if d["kind"] == "PrometheusRule"]
    dashboards = [d for d in docs if d["kind"] == "ConfigMap" and "outboxd.json" in d.get("data", {})]
    assert len(rule) == 1 and len(dashboards) == 1, "expected one PrometheusRule and one dashboard ConfigMap"
    return rule[0], dashboards[0]


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every query of every panel, rows' panels included."""
    out = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                out.append((panel["title"], target["expr"]))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    return out


def _substitute(expr: str) -> str:
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"an unknown Grafana variable in {expr!r}"
    return expr


def rules(out_dir: Path) -> int:
    rule, _ = rendered()
    out_dir.mkdir(parents=True, exist_ok=True)
    # promtool reads a plain rules file: the PrometheusRule's spec.
    (out_dir / "prometheusrule.rules.yaml").write_text(yaml.safe_dump(rule["spec"], sort_keys=False, width=1000))
    # The dashboard's queries as recording rules, so they are parsed by the same tool.
    records = [{"record": f"dashboard:query_{i}", "expr": _substitute(expr)}
               for i, (_, expr) in enumerate(dashboard_exprs(json.loads(DASHBOARD.read_text())))]
    (out_dir / "dashboard.rules.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "outboxd-dashboard", "rules": records}]}, sort_keys=False))
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    print(f"wrote {len(alerts)} alerts and {len(records)} dashboard queries to {out_dir}")
    return 0


def exported() -> set[str]:
    names = set()
    for source in METRIC_SOURCES:
        names |= set(re.findall(r'"(outbox_[a-z0-9_]+)"', source.read_text()))
    return names


def metric_names(expr: str) -> set[str]:
    # Label names are never outbox_-prefixed; label values are quoted, so drop strings first.
    return set(re.findall(r"\b(outbox_[a-z0-9_]+)", re.sub(r'"[^"]*"', '""', expr)))


def unknown(used: set[str], known: set[str]) -> set[str]:
    def base(name: str) -> str:
        for suffix in HISTOGRAM_SUFFIXES:
            if name.endswith(suffix) and name.removesuffix(suffix) in known:
                return name.removesuffix(suffix)
        return name

    return {n for n in used if base(n) not in known}


def metrics() -> int:
    rule, _ = rendered()
    known = exported()
    landed = PENDING_METRICS & known
    if landed:
        print(f"note: now exported from src/, drop from PENDING_METRICS: {sorted(landed)}")
    exprs: dict[str, list[str]] = {}
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            exprs.setdefault(f"alert {r.get('alert', r.get('record'))}", []).append(r["expr"])
    for title, expr in dashboard_exprs(json.loads(DASHBOARD.read_text())):
        exprs.setdefault(f"panel {title!r}", []).append(expr)
    used = {where: set().union(*map(metric_names, es)) for where, es in exprs.items()}
    bad = 0
    for where, names in used.items():
        missing = unknown(names, known | PENDING_METRICS)
        if not names and not any(PROMETHEUS_OWN.search(e) for e in exprs[where]):
            print(f"FAIL  {where}: names no outbox_ metric")
            bad += 1
        elif missing:
            print(f"FAIL  {where}: {', '.join(sorted(missing))} not exported by src/ or relay/src/metrics.rs")
            bad += 1
    total = set().union(*used.values())
    print(f"{len(total)} metric names in {len(used)} alerts and panels; "
          f"{len(total & PENDING_METRICS)} from the pending watchdog list; {bad} failures")
    return 1 if bad else 0


def dashboard() -> int:
    import jsonschema

    data = json.loads(DASHBOARD.read_text())
    schema = json.loads(DASHBOARD_SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(data), key=lambda e: list(e.path))
    for e in errors:
        print(f"FAIL  {'/'.join(map(str, e.path)) or '(root)'}: {e.message}")
    ids = [p["id"] for p in data["panels"]]
    if len(ids) != len(set(ids)):
        print("FAIL  panel ids are not unique")
        errors.append(None)
    _, configmap = rendered()
    if json.loads(configmap["data"]["outboxd.json"]) != data:
        print("FAIL  the rendered ConfigMap does not carry dashboards/outboxd.json unchanged")
        errors.append(None)
    print(f"dashboard {data['uid']!r}: {len(data['panels'])} panels, {len(errors)} problems")
    return 1 if errors else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["rules"] and len(argv) == 2:
        return rules(Path(argv[1]))
    if argv == ["metrics"]:
        return metrics()
    if argv == ["dashboard"]:
        return dashboard()
    print(__doc__, file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
