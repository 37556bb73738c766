"""What a platform team gets for monitoring: the chart's ServiceMonitor, PodMonitor, alert rules
and Grafana dashboard, checked against the metrics real bookie and autorecovery processes export,
with promtool (Debian's prometheus package) for the rules."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import jsonschema
import pytest
import yaml
from polling import eventually
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pybk.cluster.spec import load_manifest
from pybk.operator import render

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (a Helm renderer from PyPI) is not installed")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "pybk"
DASHBOARD = CHART / "dashboards" / "pybk.json"
ALERT_TESTS = Path(__file__).with_name("alerts_test.yaml")
MONITORING = {"monitoring": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True},
                             "prometheusRule": {"enabled": True}, "dashboard": {"enabled": True}}}
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}  # Prometheus Operator CRDs
# The Prometheus Operator's v1 CRDs (monitoring.coreos.com), reduced to the fields the chart sets,
# written from its API reference: types, enums and duration patterns as the CRDs state them, and
# additionalProperties false where the CRDs list properties, so a misspelt field fails here.
DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                                         r"(([0-9]+)s)?(([0-9]+)ms)?)$"}
LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
OBJECT_META = {"type": "object", "required": ["name", "namespace"],
               "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": LABELS}}
RELABEL = {"type": "object", "additionalProperties": False, "properties": {
    "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
    "targetLabel": {"type": "string"}, "replacement": {"type": "string"}, "regex": {"type": "string"},
    "separator": {"type": "string"}, "modulus": {"type": "integer"},
    "action": {"enum": ["replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep", "lowercase",
                        "uppercase", "keepequal", "dropequal"]}}}
ENDPOINT = {"type": "object", "additionalProperties": False, "required": ["port"], "properties": {
    "port": {"type": "string"}, "path": {"type": "string"}, "interval": DURATION,
    "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]}, "tlsConfig": {"type": "object"},
    "relabelings": {"type": "array", "items": RELABEL}}}
MONITOR_SPEC = {"namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                    "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}},
                "selector": {"type": "object", "required": ["matchLabels"], "additionalProperties": False,
                             "properties": {"matchLabels": LABELS}}}


def _monitoring_kind(kind: str, spec: dict) -> dict:
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
            "properties": {"apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": kind},
                           "metadata": OBJECT_META, "spec": spec}}


MONITORING_SCHEMAS = {
    "ServiceMonitor": _monitoring_kind("ServiceMonitor", {
        "type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
        "properties": {**MONITOR_SPEC, "endpoints": {"type": "array", "minItems": 1, "items": ENDPOINT}}}),
    "PodMonitor": _monitoring_kind("PodMonitor", {
        "type": "object", "required": ["selector", "podMetricsEndpoints"], "additionalProperties": False,
        "properties": {**MONITOR_SPEC, "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": ENDPOINT}}}),
    "PrometheusRule": _monitoring_kind("PrometheusRule", {
        "type": "object", "required": ["groups"], "additionalProperties": False, "properties": {"groups": {
            "type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["name", "rules"], "additionalProperties": False, "properties": {
                    "name": {"type": "string", "minLength": 1}, "interval": DURATION,
                    "rules": {"type": "array", "minItems": 1, "items": {
                        "type": "object", "required": ["alert", "expr", "labels", "annotations"],
                        "additionalProperties": False, "properties": {
                            "alert": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9]*$"},
                            "expr": {"type": "string", "minLength": 1}, "for": DURATION,
                            "labels": LABELS, "annotations": LABELS}}}}}}}}),
}
# PromQL words that look like metric names but are not
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset",
                "bool", "le", "vector", "time", "rate", "increase", "changes", "sum", "max", "min", "count",
                "histogram_quantile", "predict_linear", "absent", "group"}


def rendered(values: dict) -> list[dict]:
    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render(values, name="pybk", namespace="pybk-system")
    return [d for name, text in sorted(out.items()) if name.endswith(".yaml") for d in yaml.safe_load_all(text) if d]


def one(docs: list[dict], kind: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def alert_rules() -> list[dict]:
    return one(rendered(MONITORING), "PrometheusRule")["spec"]["groups"][0]["rules"]


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    variables = [v["query"]["query"] for v in doc["templating"]["list"] if isinstance(v.get("query"), dict)]
    # label_values(SERIES, LABEL): the series is PromQL, the label is not
    return [t["expr"] for p in doc["panels"] for t in p.get("targets", [])] + \
        [re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", q) for q in variables]


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression selects (identifiers not followed by '(' that are not
    PromQL words or label names inside braces)."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    without_labels = re.sub(r"\{[^}]*\}", "{}", without_strings)
    without_by = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", without_labels)
    names = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", without_by))
    return {n for n in names - PROMQL_WORDS if not re.fullmatch(r"\d+[smhd]?|\$\w+|__\w+|[smhd]", n)} - {"$__rate_interval"}


# ---- promtool ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def promtool() -> str:
    """promtool, installed from Debian's prometheus package when missing (root with apt-get only)."""
    found = shutil.which("promtool")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("promtool is not installed and cannot be (needs root and apt-get): apt-get install prometheus")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "prometheus"]):
        res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
        if res.returncode != 0:
            pytest.skip(f"installing promtool failed ({' '.join(argv)}): {res.stderr.strip()[-300:]}")
    found = shutil.which("promtool")
    if not found:
        pytest.skip("the prometheus package did not install promtool")
    return found


@pytest.fixture
def rules_dir(tmp_path) -> Path:
    """The chart's rendered alert rules as a Prometheus rule file, next to a copy of the rule tests."""
    rule = one(rendered(MONITORING), "PrometheusRule")
    (tmp_path / "pybk-alerts.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    return tmp_path


def test_alert_rules_pass_promtool_check(promtool, rules_dir):
    res = subprocess.run([promtool, "check", "rules", str(rules_dir / "pybk-alerts.yaml")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in res.stdout


def test_every_alert_fires_on_its_synthetic_series_in_promtool(promtool, rules_dir):
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    fired = {t["alertname"] for case in tests for t in case["alert_rule_test"] if t.get("exp_alerts")}
    assert fired == {r["alert"] for r in alert_rules()}
    res = subprocess.run([promtool, "test", "rules", str(rules_dir / ALERT_TESTS.name)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_every_alert_has_a_severity_summary_description_and_a_runbook_url_to_its_section():
    operations = (ROOT / "docs" / "operations.md").read_text()
    headings = {re.sub(r"[^a-z0-9]", "", h.lower()) for h in re.findall(r"^#+\s+(.*)$", operations, re.M)}
    for rule in alert_rules():
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        page, anchor = rule["annotations"]["runbook_url"].split("#")
        assert (ROOT / page).resolve() == (ROOT / "docs" / "operations.md").resolve(), rule["alert"]
        assert anchor == rule["alert"].lower()
        assert anchor in headings, f"docs/operations.md has no section {rule['alert']}"


def test_runbook_urls_follow_the_base_url_given():
    values = json.loads(json.dumps(MONITORING))
    values["monitoring"]["prometheusRule"]["runbookBaseUrl"] = "https://docs.example.org/pybk/operations"
    rules = one(rendered(values), "PrometheusRule")["spec"]["groups"][0]["rules"]
    assert [r["annotations"]["runbook_url"] for r in rules] == \
        [f"https://docs.example.org/pybk/operations#{r['alert'].lower()}" for r in rules]


def test_alert_thresholds_come_from_the_values():
    values = json.loads(json.dumps(MONITORING))
    values["monitoring"]["prometheusRule"].update(underReplicatedMinutes=5, diskFullHours=12,
                                                  journalFsyncP99Seconds=0.2, decommissionStuckMinutes=90)
    rules = {r["alert"]: r["expr"] for r in one(rendered(values), "PrometheusRule")["spec"]["groups"][0]["rules"]}
    assert rules["PybkLedgersUnderReplicated"].endswith("> 300")
    assert "[1h], 43200)" in rules["PybkBookieDiskFillingUp"]
    assert rules["PybkJournalFsyncSlow"].endswith("> 0.2")
    assert "[90m]" in rules["PybkDecommissionStuck"] and "offset 90m" in rules["PybkDecommissionStuck"]


# ---- the dashboard -------------------------------------------------------------------------


def test_dashboard_is_grafana_dashboard_json_with_a_datasource_and_queries_on_every_panel():
    doc = json.loads(DASHBOARD.read_text())
    assert isinstance(doc["schemaVersion"], int) and doc["schemaVersion"] >= 36
    assert doc["uid"] and doc["title"]
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"cluster", "bookie"} <= set(variables)
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    graphs = [p for p in doc["panels"] if p["type"] != "row"]
    assert len(graphs) >= 20
    cells: set[tuple[int, int]] = set()
    for p in doc["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
    for p in graphs:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["refId"] and t["datasource"] == p["datasource"], p["title"]
    titles = " ".join(p["title"].lower() for p in graphs)
    for question in ("adds", "reads", "add latency", "read latency", "journal fsync", "write cache", "disk",
                     "read-only", "under-replicated", "re-replication", "audit", "decommission", "gc",
                     "scrubber", "etcd errors", "errors by status", "grpc errors", "read-only bookies by reason"):
        assert question in titles, f"no panel answers {question!r}"


def test_docs_carry_a_copy_of_the_charts_dashboard():
    """docs/grafana-dashboard.json is a file of its own (a raw download must be the JSON, not a
    symlink's target path): after editing the chart's, `cp charts/pybk/dashboards/pybk.json docs/grafana-dashboard.json`."""
    copy = ROOT / "docs" / "grafana-dashboard.json"
    assert not copy.is_symlink()
    assert copy.read_text() == DASHBOARD.read_text(), "docs/grafana-dashboard.json differs from the chart's dashboard"


# ---- the chart -----------------------------------------------------------------------------


def test_chart_renders_and_validates_with_monitoring_on():
    values = {**MONITORING, "networkPolicy": {"enabled": True, "metricsFrom": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]}}
    docs = rendered(values)
    assert {d["kind"] for d in docs} >= MONITORING_KINDS | {"ConfigMap"}
    for doc in docs:
        if doc["kind"] in MONITORING_KINDS:  # not in kubernetes_validate's schemas: our own check
            jsonschema.validate(doc, MONITORING_SCHEMAS[doc["kind"]])
            continue
        kubernetes_validate.validate(doc, "1.33.0", strict=True)
    board = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "pybk-dashboard")
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(board["data"]["pybk.json"]) == json.loads(DASHBOARD.read_text())
    bookie_policy = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "pybk-bookies")
    metrics_rule = bookie_policy["spec"]["ingress"][-1]
    assert metrics_rule["ports"] == [{"port": render.HTTP_PORT, "protocol": "TCP"}]
    assert metrics_rule["from"] == values["networkPolicy"]["metricsFrom"]


def test_the_monitoring_check_rejects_what_the_prometheus_operator_would():
    """The hand-written schemas catch a misspelt field, a bad duration and a rule without expr."""
    docs = {d["kind"]: d for d in rendered(MONITORING) if d["kind"] in MONITORING_KINDS}
    broken = json.loads(json.dumps(docs))
    broken["ServiceMonitor"]["spec"]["endpoints"][0]["intervall"] = "30s"
    broken["PodMonitor"]["spec"]["podMetricsEndpoints"][0]["interval"] = "half a minute"
    del broken["PrometheusRule"]["spec"]["groups"][0]["rules"][0]["expr"]
    for kind, doc in broken.items():
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, MONITORING_SCHEMAS[kind])


def test_monitoring_is_off_by_default():
    kinds = {d["kind"] for d in rendered({})}
    assert not kinds & MONITORING_KINDS
    assert not [d for d in rendered({}) if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "pybk-dashboard"]


def test_monitors_select_what_the_operator_creates_on_its_metrics_port():
    spec = load_manifest(ROOT / "examples" / "bookiecluster-minimal.yaml")
    docs = rendered(MONITORING)
    service = render.service(spec)
    sm = one(docs, "ServiceMonitor")["spec"]
    assert sm["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert sm["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    recovery_pod = render.autorecovery(spec)["spec"]["template"]
    pm = one(docs, "PodMonitor")["spec"]
    assert pm["selector"]["matchLabels"].items() <= recovery_pod["metadata"]["labels"].items()
    ports = {p["name"] for c in recovery_pod["spec"]["containers"] for p in c.get("ports", [])}
    assert pm["podMetricsEndpoints"][0]["port"] in ports
    # Prometheus turns label pybk.io/cluster into ..._label_pybk_io_cluster
    cluster_label = re.sub(r"[^a-zA-Z0-9_]", "_", render.CLUSTER_LABEL)
    assert {"sourceLabels": [f"__meta_kubernetes_service_label_{cluster_label}"], "targetLabel": "cluster"} \
        in sm["endpoints"][0]["relabelings"]
    assert {"sourceLabels": [f"__meta_kubernetes_pod_label_{cluster_label}"], "targetLabel": "cluster"} \
        in pm["podMetricsEndpoints"][0]["relabelings"]
    jobs = {r.get("replacement") for r in sm["endpoints"][0]["relabelings"] + pm["podMetricsEndpoints"][0]["relabelings"]
            if r["targetLabel"] == "job"}
    assert jobs == {"pybk-bookie", "pybk-autorecovery"}


# ---- the metrics they use exist ------------------------------------------------------------


def scrape(url: str) -> dict[str, str]:
    """Every series name a /metrics page can carry, with its family's type (counters: name_total,
    histograms: name_bucket/_sum/_count), from the families it declares, with samples or not."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        return scrape_text(resp.read().decode())


def scrape_text(text: str) -> dict[str, str]:
    """`scrape` of an exposition already read."""
    names: dict[str, str] = {}
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""],
                "summary": ["_sum", "_count", ""], "info": ["_info"], "untyped": [""]}
    for family in text_string_to_metric_families(text):
        for suffix in suffixes.get(family.type, [""]):
            names[family.name + suffix] = family.type
    return names


def expected_type(name: str) -> str:
    if name.endswith("_total"):
        return "counter"
    if name.endswith(("_bucket", "_sum", "_count")):
        return "histogram"
    return "gauge"


def test_every_metric_the_dashboard_and_alerts_use_is_exported_by_real_processes(bookies, metadata_uri, tmp_path):
    from pybk.local.autorecovery import AutoRecoveryProcess
    (bookie,) = bookies(1)
    recovery = AutoRecoveryProcess(tmp_path / "autorecovery.log", metadata_uri).start()
    try:
        exported = {"pybk-bookie": scrape(bookie.http_url + "/metrics"),
                    "pybk-autorecovery": scrape(recovery.http_url + "/metrics")}
    finally:
        recovery.kill()
    used = {n for e in dashboard_exprs() + [r["expr"] for r in alert_rules()] for n in metric_names(e)}
    assert {"pybk_bookie_adds_total", "pybk_recovery_is_auditor", "pybk_bookie_grpc_errors_total", "up"} <= used
    assert not {"by", "group", "sum"} & used  # the parser skips PromQL's own words
    import pybk.log.metrics  # noqa: F401 - a process using named logs exports the writers' metrics
    exported["a named-log writer"] = scrape_text(generate_latest().decode())
    for name in sorted(used - {"up"}):  # `up` is Prometheus' own, per target
        if name.startswith(("pybk_recovery_", "pybk_log_retention_", "pybk_log_end_offset", "pybk_log_cursor_lag")):
            where = ["pybk-autorecovery"]
        elif name.startswith("pybk_log_"):
            where = ["a named-log writer"]
        elif name.startswith("pybk_etcd_"):
            where = ["pybk-bookie", "pybk-autorecovery"]
        else:
            where = ["pybk-bookie"]
        for job in where:
            assert name in exported[job], f"{name} is used but {job} does not export it"
            assert exported[job][name] == expected_type(name), f"{name} is a {exported[job][name]} in {job}"


def samples(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


def test_a_bookie_measures_add_and_read_latency_and_its_disk_room(bookies, metadata_uri):
    from pybk.client.sync import BookKeeper
    (bookie,) = bookies(1, high_water_mark=0.97, low_water_mark=0.9)
    with BookKeeper.connect(metadata_uri) as bk:
        lh = bk.create_ledger(ensemble=1, write_quorum=1, ack_quorum=1, password=b"pw")
        lh.add_entries([b"x" * 100] * 20)
        assert len(lh.read_entries(0, 19)) == 20
        lh.close()
    deadline = time.monotonic() + 10  # the bookie records a read once its stream ends, just after the client
    while (m := samples(bookie.http_url + "/metrics"))["pybk_bookie_read_latency_seconds_count"] < 1:
        assert time.monotonic() < deadline, "no read latency recorded"
        time.sleep(0.05)
    assert m["pybk_bookie_add_latency_seconds_count"] >= 1
    assert m["pybk_bookie_add_latency_seconds_sum"] > 0
    assert m["pybk_bookie_adds_total"] == 20
    assert (m["pybk_bookie_disk_high_water_mark_ratio"], m["pybk_bookie_disk_low_water_mark_ratio"]) == (0.97, 0.9)
    assert m["pybk_bookie_disk_total_bytes"] > 0
    assert m["pybk_bookie_disk_used_bytes"] == pytest.approx(
        m["pybk_bookie_disk_usage_ratio"] * m["pybk_bookie_disk_total_bytes"], rel=1e-6)


def test_only_a_process_running_autorecovery_reports_recovery_figures(bookies):
    """A bookie without --autorecovery has no auditor or worker: it must not show a 0 under
    pybk_recovery_* that a dashboard would take for a real reading; one with it does report them."""
    (plain,) = bookies(1)
    (embedded,) = bookies(1, autorecovery=True)
    assert not [n for n in scrape(plain.http_url + "/metrics") if n.startswith("pybk_recovery_")]
    assert scrape(embedded.http_url + "/metrics")["pybk_recovery_is_auditor"] == "gauge"


async def test_a_bookie_counts_grpc_errors_by_method_and_code(bookies):
    import grpc
    (bookie,) = bookies(1, metadata_uri=None)
    async with grpc.aio.insecure_channel(bookie.address) as ch:
        read = ch.unary_stream("/pybk.Bookie/Read", request_serializer=None, response_deserializer=None)
        for _ in range(2):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in read(b"\xff\xff\xff\xff\x0f"):  # not a ReadRequest
                    pass
            assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        info = ch.unary_unary("/pybk.Bookie/Info", request_serializer=None, response_deserializer=None)
        assert await info(b"")  # an answered call is no error
    m = labelled(bookie.http_url + "/metrics", "pybk_bookie_grpc_errors_total")
    assert m == {(("code", "INVALID_ARGUMENT"), ("method", "Read")): 2.0}


async def test_a_bookie_says_why_it_is_read_only(bookies):
    (bookie,) = bookies(1, metadata_uri=None, disk_capacity=8 * 1024 * 1024, high_water_mark=0.5,
                        low_water_mark=0.4, disk_check_interval=0.1, journal_prealloc_size="1MiB")
    url = bookie.http_url + "/metrics"

    def reasons() -> dict[str, float]:
        return {dict(k)["reason"]: v for k, v in labelled(url, "pybk_bookie_read_only_reason").items()}

    assert reasons() == {"disk": 0.0, "journal": 0.0, "requested": 0.0}
    bookie.http_json("/api/v1/bookie/state/readonly", "PUT", {"readOnly": True})
    assert reasons() == {"disk": 0.0, "journal": 0.0, "requested": 1.0}
    filler = bookie.ledger_dirs[0] / "filler"
    filler.write_bytes(b"\0" * 5 * 1024 * 1024)  # past the high-water mark of the 8 MiB budget
    await eventually(lambda: reasons()["disk"] == 1.0, 30, what="the disk reason")
    assert reasons()["requested"] == 1.0 and samples(url)["pybk_bookie_read_only"] == 1.0
    filler.unlink()
    bookie.http_json("/api/v1/bookie/state/readonly", "PUT", {"readOnly": False})
    await eventually(lambda: reasons() == {"disk": 0.0, "journal": 0.0, "requested": 0.0}, 30,
                     what="no reason left")
    assert samples(url)["pybk_bookie_read_only"] == 0.0


async def test_the_oldest_under_replicated_age_grows_between_worker_passes():
    """The age is worked out when scraped, from the oldest marker's time: a long replication pass
    does not hold it still (the under-replicated alert would otherwise wait for the pass)."""
    from pybk.recovery import metrics
    registry = CollectorRegistry()
    registry.register(metrics.OLDEST_UNDER_REPLICATED)
    age = "pybk_recovery_oldest_under_replicated_age_seconds"
    try:
        metrics.under_replicated_seen(3, time.time() - 100)
        first = registry.get_sample_value(age)
        assert 100 <= first < 160
        await eventually(lambda: registry.get_sample_value(age) >= first + 0.2, 10, what="the age to grow")
        metrics.under_replicated_seen(0, None)
        assert registry.get_sample_value(age) == 0.0
    finally:
        registry.unregister(metrics.OLDEST_UNDER_REPLICATED)


def labelled(url: str, name: str) -> dict[tuple, float]:
    """{sorted label pairs: value} of one metric's samples (a counter's under its _total name)."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}
