"""docker-compose, Prometheus and Grafana files parse, and every series a dashboard panel
queries is one pgqueue exports (Docker does not run here, so names are what we can check)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client.core import Metric

from pgqueue.observability.metrics import WORKER_REGISTRY, DatabaseCollector

ROOT = Path(__file__).resolve().parents[2]
PROMQL_WORDS = {
    "sum",
    "by",
    "rate",
    "histogram_quantile",
    "topk",
    "le",
    "priority",
    "tenant_id",
    "outcome",
    "reason",
    "without",
    "avg",
    "max",
    "min",
    "increase",
    "irate",
    "count",
}


def exported_series() -> set[str]:
    names: set[str] = set()
    families: list[Metric] = list(DatabaseCollector("unused")._families({}))
    families += list(WORKER_REGISTRY.collect())
    for family in families:
        names.add(family.name)
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_count", "_sum"),
        }.get(family.type, ("",))
        names.update(family.name + s for s in suffixes)
    return names


def test_yaml_files_parse():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert {"postgres", "worker", "sandbox", "metrics", "prometheus", "grafana"} <= set(
        compose["services"]
    )
    prometheus = yaml.safe_load((ROOT / "deploy/prometheus.yml").read_text())
    targets = [
        t
        for job in prometheus["scrape_configs"]
        for c in job["static_configs"]
        for t in c["targets"]
    ]
    assert "metrics:9464" in targets
    for path in (ROOT / "deploy/grafana/provisioning").rglob("*.yml"):
        assert yaml.safe_load(path.read_text())["apiVersion"] == 1


def test_every_dashboard_query_uses_an_exported_series():
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/pgqueue.json").read_text())
    exported = exported_series()
    used: set[str] = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = re.sub(r"\[[^\]]*\]|\{[^}]*\}|\"[^\"]*\"", "", target["expr"])
            used.update(
                w for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr) if w not in PROMQL_WORDS
            )
    assert used, "no series found in the dashboard"
    missing = used - exported
    assert not missing, f"panels query series nobody exports: {sorted(missing)}"


def test_the_six_series_have_panels():
    text = (ROOT / "deploy/grafana/dashboards/pgqueue.json").read_text()
    for name in (
        "claude_queue_depth",
        "claude_request_latency_seconds",
        "claude_throttle_count",
        "claude_demoted_tenants",
        "claude_drr_fairness_index",
        "claude_input_tokens_total",
    ):
        assert name in text


def test_the_latency_panel_draws_the_slo_lines():
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/pgqueue.json").read_text())
    latency = next(p for p in dashboard["panels"] if "p99 latency" in p["title"])
    steps = latency["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert {s["value"] for s in steps} >= {2, 6, 120}


def test_compose_leaves_the_hosts_postgres_port_alone_and_brings_load():
    """Found by a tester: the compose file published host port 5432, which clashes with any
    local Postgres, and had no load, so its Grafana dashboard stayed empty."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    for name, service in services.items():
        for mapping in service.get("ports", []):
            host = re.sub(r"\$\{[A-Z_]+:-(\d+)\}", r"\1", str(mapping)).split(":")[0]
            assert host != "5432", f"{name} publishes host port 5432 by default"
    load = services["load"]
    assert load["command"][:2] == ["pgqueue", "replay"]
    assert "@postgres:5432/" in load["environment"]["PGQUEUE_DSN"]
    assert load["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    worker = services["worker"]
    assert worker["environment"]["ANTHROPIC_BASE_URL"] == "http://sandbox:8765"


def test_scraped_services_listen_beyond_their_container():
    """Prometheus scrapes the exporter and the worker from its own container: both bind
    127.0.0.1 by default (issue 28 made `work --metrics-port` do so), so the compose file
    must open them (`--host`, `--metrics-host`), or the worker's targets stay down."""
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for name, flag in (("metrics", "--host"), ("worker", "--metrics-host")):
        command = services[name]["command"]
        assert command[command.index(flag) + 1] == "0.0.0.0", name
