"""Prometheus metrics of a real ``mqlake up`` (metricsExporterType=PROM): traffic from the stock C++ client, /metrics
scraped over HTTP and parsed with prometheus_client's own text parser; a metrics port in use stops the start."""

from __future__ import annotations

import json
import os
import re
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from airflow_dags.config import Settings
from broker.server.metrics import job_success, last_job_runs, parse_metrics_label
from tests.fixtures_broker import REPO, MqlakeServer
from tests.helpers import wait_until
from tests.test_conformance_cpp_client import Collector, committed, max_offset, message, producer, push_consumer

pytestmark = pytest.mark.timeout(180)


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    """sample name + labels -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: dict, name: str, **labels: str) -> float | None:
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    return sum(found) if found else None


def _write_report(lake, name: str, report: dict, mtime: float) -> None:
    _write_at(lake / "_reports" / name, report, mtime)


def _write_at(path: Path, report: dict, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report))
    os.utime(path, (mtime, mtime))


@pytest.mark.integration
def test_metrics_carry_rocketmq_names_and_real_figures(mqlake_server_factory, tmp_path) -> None:
    lake = tmp_path / "lake"
    # the reports the jobs leave under <lake>/_reports (the fields the metrics read)
    _write_report(lake, "tier-r1.json", {"segments": [{"state": "tiered"}], "delete_error": None}, 1_700_000_000)
    _write_report(lake, "tier-r2.json", {"segments": [{"state": "quarantined"}], "delete_error": None}, 1_700_000_100)
    # the verify-index run's report as the mqlake_verify_index DAG names it: counted as any other run's
    airflow = Settings(lake=str(lake), store_dir=None, broker_conf=None, namesrv="", spark_master="local[1]")
    _write_at(Path(airflow.report("verify", "index-scheduled__2026")), {"summary": {"ok": True}}, 1_700_000_050)
    server = mqlake_server_factory(
        metricsExporterType="PROM",
        metricsPromExporterHost="127.0.0.1",
        metricsLabel="env:test,bad",
        lakePath=str(lake),
    )
    port = server.metrics_port
    topic, group = "MetricsT", "MetricsCG"
    p = producer(server)
    try:
        for i in range(6):
            assert p.send_sync(message(topic, f"m{i}")).status == 0
    finally:
        p.shutdown()
    got = Collector()
    c = push_consumer(server, group, topic, got)
    try:
        got.wait_bodies({f"m{i}".encode() for i in range(6)})
        wait_until(lambda: all(committed(server, group, topic, q) == max_offset(server, topic, q) for q in range(4)),
                   30, what="the consumer to commit")  # fmt: skip
        samples = scrape(port)
    finally:
        c.shutdown()

    common = {"cluster": "DefaultCluster", "node_type": "broker", "node_id": "broker-a", "env": "test"}
    assert value(samples, "rocketmq_messages_in_total", topic=topic, is_system="false", **common) == 6
    assert value(samples, "rocketmq_throughput_in_total", topic=topic) > 6 * len("m0")
    assert value(samples, "rocketmq_messages_out_total", topic=topic, consumer_group=group, is_retry="false") == 6
    assert value(samples, "rocketmq_throughput_out_total", topic=topic, consumer_group=group) > 0
    assert value(samples, "rocketmq_consumer_lag_messages", topic=topic, consumer_group=group) == 0
    assert value(samples, "rocketmq_storage_size", storage_type="local", storage_medium="disk") > 0
    # every message was consumed, so every one was dispatched; the async flush (every 500 ms) catches up too
    assert value(samples, "rocketmq_storage_dispatch_behind_bytes") == 0
    wait_until(lambda: value(scrape(port), "rocketmq_storage_flush_behind_bytes") == 0, 30,
               what="the flush-behind gauge to reach 0")  # fmt: skip
    assert value(samples, "rocketmq_topic_number") >= 7  # the system topics and MetricsT
    # every send was timed: SEND_MESSAGE (10) or SEND_MESSAGE_V2 (310), answered SUCCESS (0)
    sends = sum(value(samples, "rocketmq_rpc_latency_count", request_code=code, response_code="0",
                      protocol_type="remoting", result="success") or 0 for code in ("10", "310"))  # fmt: skip
    assert sends >= 6
    assert value(samples, "mqlake_segments", state="active") == 1
    assert value(samples, "mqlake_untiered_sealed_bytes") == 0
    # the newest tier report quarantined a segment: the last tier run failed; verify's succeeded; no replay yet
    assert value(samples, "mqlake_job_last_run_success", job="tier") == 0
    assert value(samples, "mqlake_job_last_run_timestamp_seconds", job="tier") == 1_700_000_100
    assert value(samples, "mqlake_job_last_run_success", job="verify") == 1
    assert value(samples, "mqlake_job_last_run_timestamp_seconds", job="verify") == 1_700_000_050
    assert value(samples, "mqlake_job_last_run_success", job="replay") is None

    # every series the Grafana dashboard in docs/ queries is one this exporter serves
    dashboard = json.loads((REPO / "docs" / "grafana-mqlake-dashboard.json").read_text())
    queried = {name for panel in dashboard["panels"] for t in panel["targets"]
               for name in re.findall(r"\b(?:rocketmq|mqlake)_[a-z_]+", t["expr"])}  # fmt: skip
    served = {name for name, _ in samples}
    assert queried and queried <= served, queried - served


@pytest.mark.integration
def test_a_metrics_port_in_use_stops_the_start_naming_it(tmp_path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = MqlakeServer(tmp_path / "s", metricsExporterType="PROM", metricsPromExporterHost="127.0.0.1",
                              metricsPromExporterPort=str(port))  # fmt: skip
        with pytest.raises(AssertionError) as e:
            server.start()
        assert server.process.wait(30) == 1
    assert f"127.0.0.1:{port}" in str(e.value) and "metricsPromExporterPort" in str(e.value)


@pytest.mark.unit
def test_job_reports_and_labels(tmp_path) -> None:
    assert parse_metrics_label("a:1,,b:2,broken,c:3:4") == {"a": "1", "b": "2"}
    assert job_success("tier", {"segments": [{"state": "tiered"}], "delete_error": None})
    assert not job_success("tier", {"segments": [], "delete_error": "disk gone"})
    assert not job_success("verify", {"summary": {"ok": False}})
    assert job_success("replay", {"sent": 3})
    _write_report(tmp_path, "replay-a-1.json", {"sent": 1}, 1_000)
    _write_report(tmp_path, "replay-a-2.json", {"error": "x"}, 2_000)
    (tmp_path / "_reports" / "verify-bad.json").write_text("{not json")
    runs = last_job_runs(tmp_path / "_reports")
    assert runs["replay"] == (2_000, False) and runs["verify"][1] is False and "tier" not in runs


@pytest.mark.unit
def test_a_jobs_newest_report_counts_whatever_started_the_run(tmp_path) -> None:
    from pipelines.compaction.job import TierJob

    airflow = Settings(lake=str(tmp_path), store_dir=None, broker_conf=None, namesrv="", spark_master="local[1]")
    store = tmp_path / "store"
    (store / "commitlog").mkdir(parents=True)
    cli = TierJob(store, tmp_path, run_id="20261129T000000Z-cli").report_path  # `mqlake tier`, the broker's schedule
    _write_at(cli, {"segments": [{"state": "tiered"}]}, 1_000)
    _write_at(Path(airflow.report("tier", "scheduled__2026-11-29")), {"segments": [{"state": "quarantined"}]}, 2_000)
    _write_at(Path(airflow.report("replay", "manual__1-dry-run")), {"sent": 0}, 3_000)
    (tmp_path / "_reports" / "notes.json").write_text("{}")  # not a run report
    runs = last_job_runs(tmp_path / "_reports")
    assert runs == {"tier": (2_000, False), "replay": (3_000, True)}
    assert cli.parent == Path(airflow.report("tier", "x")).parent
