"""Prometheus metrics (``metricsExporterType=PROM``): ``/metrics`` on ``metricsPromExporterHost:Port`` with
RocketMQ 5's metric names and labels (BrokerMetricsConstant, DefaultStoreMetricsConstant, RemotingMetricsConstant),
plus mqlake's own (segments, tiering backlog, the pipeline jobs' last runs).

Almost everything is computed when Prometheus scrapes (``BrokerCollector``), from what the broker already keeps:
the message and byte counters are BrokerStatsManager's (so a send pays nothing more for metrics), lag comes from
the offset table and the queues' ends, storage figures from the store. Only ``rocketmq_rpc_latency`` is recorded
per request (a histogram cannot be rebuilt later), and only while the exporter is on.

Labels common to every metric, as RocketMQ sets them: ``cluster``, ``node_type="broker"``, ``node_id`` (the broker
name), and the ``metricsLabel`` pairs. The job metrics read the newest report each job writes under
``<lakePath>/_reports/`` (``tier-*.json``, ``verify-*.json``, ``replay-*.json``, whatever started the run:
lake/reports.py): its file time is the run's end, and its content says whether the run succeeded.
Without ``lakePath`` they are absent.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel, Handler
from broker.remoting.errors import RequestRefused
from broker.server.context import BrokerContext
from lake.objectstore import reports_dir
from lake.reports import report_job
from store.constants import RETRY_GROUP_TOPIC_PREFIX
from store.errors import MQLakeError
from store.retention import SegmentState

log = logging.getLogger(__name__)

RPC_LATENCY_BUCKETS_MS = (1, 3, 5, 7, 10, 100, 1000, 2000, 3000)  # RemotingMetricsManager's
PULL_SUSPEND_FLAG = 0x2
UNTIERED_STATES = (SegmentState.SEALED, SegmentState.EXPIRED, SegmentState.TIERING)


class MetricsError(MQLakeError, OSError):
    """The metrics exporter cannot start (its port is taken, its host does not resolve)."""


def parse_metrics_label(text: str) -> dict[str, str]:
    """``metricsLabel``: ``k1:v1,k2:v2`` (pairs that are not ``k:v`` are skipped, as RocketMQ warns and skips)."""
    out = {}
    for item in (p for p in text.split(",") if p):
        parts = item.split(":")
        if len(parts) == 2 and parts[0]:
            out[parts[0]] = parts[1]
        else:
            log.warning("metricsLabel %r: %r is not key:value, skipped", text, item)
    return out


def _bool(b: bool) -> str:
    return "true" if b else "false"


def job_success(job: str, report: dict[str, Any]) -> bool:
    """Whether a job's report says the run succeeded."""
    if job == "tier":
        bad = [s for s in report.get("segments", []) if s.get("state") == SegmentState.QUARANTINED.value]
        return not bad and not report.get("delete_error")
    if job == "verify":
        return bool(report.get("summary", {}).get("ok"))
    return not report.get("error") and not report.get("failed")


def last_job_runs(reports: Path) -> dict[str, tuple[float, bool]]:
    """job -> (end time of its newest report in the directory ``reports``, succeeded), for the jobs that wrote
    one."""
    newest: dict[str, tuple[float, Path]] = {}
    try:
        files = list(reports.iterdir())
    except OSError:  # no report yet
        return {}
    for p in files:
        job = report_job(p.name)
        if job is None:
            continue
        try:
            mtime = p.stat().st_mtime
        except OSError:
            continue
        if job not in newest or mtime > newest[job][0]:
            newest[job] = (mtime, p)
    out: dict[str, tuple[float, bool]] = {}
    for job, (mtime, path) in newest.items():
        try:
            ok = job_success(job, json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            ok = False  # a report that cannot be read is not a success
        out[job] = (mtime, ok)
    return out


class BrokerCollector(Collector):
    def __init__(self, broker: BrokerContext, labels: dict[str, str]) -> None:
        self.broker = broker
        self.labels = labels

    def _family(self, kind: type, name: str, doc: str, extra: tuple[str, ...] = (), unit: str = "") -> Any:
        return kind(name, doc, labels=[*self.labels, *extra], unit=unit)

    def collect(self) -> Iterator[Any]:
        b = self.broker
        base = list(self.labels.values())
        stats = b.stats
        is_system = b.topics.is_system_topic

        msgs_in = self._family(CounterMetricFamily, "rocketmq_messages_in", "Messages stored, per topic.",
                               ("topic", "message_type", "is_system"))  # fmt: skip
        bytes_in = self._family(CounterMetricFamily, "rocketmq_throughput_in", "Bytes stored, per topic.",
                                ("topic", "message_type", "is_system"))  # fmt: skip
        for topic, c in list(stats.topic_put.items()):
            values = [*base, topic, "Normal", _bool(is_system(topic))]
            msgs_in.add_metric(values, c.nums)
            bytes_in.add_metric(values, c.size)
        out_labels = ("topic", "consumer_group", "is_retry", "is_system")
        msgs_out = self._family(CounterMetricFamily, "rocketmq_messages_out", "Messages pulled.", out_labels)
        bytes_out = self._family(CounterMetricFamily, "rocketmq_throughput_out", "Bytes pulled.", out_labels)
        for key, c in list(stats.group_get.items()):
            topic, _, group = key.rpartition("@")
            values = [*base, topic, group, _bool(topic.startswith(RETRY_GROUP_TOPIC_PREFIX)), _bool(is_system(topic))]
            msgs_out.add_metric(values, c.nums)
            bytes_out.add_metric(values, c.size)
        yield from (msgs_in, bytes_in, msgs_out, bytes_out)
        yield self._lag()
        yield from self._broker_gauges(base)
        yield from self._storage(base)
        yield from self._segments(base)
        lake = b.config.lake_path
        if lake is not None:
            yield from self._jobs(base, reports_dir(lake))

    def _lag(self) -> Any:
        b = self.broker
        lag = self._family(GaugeMetricFamily, "rocketmq_consumer_lag_messages",
                           "Messages stored but not yet consumed, per group and topic.",
                           ("consumer_group", "topic", "is_retry", "is_system"))  # fmt: skip
        base = list(self.labels.values())
        for key, queues in list(b.offsets.table.items()):
            topic, _, group = key.partition("@")
            if b.topics.get(topic) is None:
                continue
            total = sum(max(b.store.get_max_offset_in_queue(topic, q) - off, 0) for q, off in list(queues.items()))
            lag.add_metric([*base, group, topic, _bool(topic.startswith(RETRY_GROUP_TOPIC_PREFIX)),
                            _bool(b.topics.is_system_topic(topic))], total)  # fmt: skip
        return lag

    def _broker_gauges(self, base: list[str]) -> Iterator[Any]:
        b = self.broker
        for name, doc, value in (
            ("rocketmq_broker_permission", "brokerPermission.", b.config.broker_permission),
            ("rocketmq_topic_number", "Topics on this broker.", len(b.topics.table)),
            ("rocketmq_consumer_group_number", "Subscription groups on this broker.", len(b.groups.table)),
        ):
            g = self._family(GaugeMetricFamily, name, doc)
            g.add_metric(base, value)
            yield g
        conns = self._family(GaugeMetricFamily, "rocketmq_consumer_connections", "Consumer connections per group.",
                             ("consumer_group",))  # fmt: skip
        for group, info in list(b.consumers.groups.items()):
            conns.add_metric([*base, group], len(info.channels))
        yield conns
        prods = self._family(GaugeMetricFamily, "rocketmq_producer_connections", "Producer connections.")
        prods.add_metric(base, sum(len(c) for c in list(b.producers.groups.values())))
        yield prods

    def _storage(self, base: list[str]) -> Iterator[Any]:
        store = self.broker.store
        labels = [*base, "local", "disk"]
        extra = ("storage_type", "storage_medium")
        size = sum(mf.file_size for mf in list(store.commitlog.queue.files))
        size += sum(mf.file_size for cq in store.all_consume_queues() for mf in list(cq.queue.files))
        size += sum(f.path.stat().st_size for f in list(store.index.files) if f.path.exists())
        for name, doc, value in (
            ("rocketmq_storage_size", "Bytes of the store's files (CommitLog, ConsumeQueue, IndexFile).", size),
            ("rocketmq_storage_flush_behind_bytes", "CommitLog bytes written but not yet flushed.",
             max(store.commitlog.max_offset - store.commitlog.queue.flushed_offset, 0)),
            ("rocketmq_storage_dispatch_behind_bytes", "CommitLog bytes not yet dispatched to the queues.",
             store.dispatch_behind_bytes),
        ):  # fmt: skip
            g = self._family(GaugeMetricFamily, name, doc, extra)
            g.add_metric(labels, value)
            yield g
        disk: tuple[tuple[str, str, float], ...] = (
            ("mqlake_disk_used_ratio", "Used share of the store's fuller disk at the last disk check "
             "(commitLogDiskRatio; -1 when it cannot be measured).", store.disk_ratio),
            ("mqlake_disk_full", "1 while puts are refused because the disk is full.", float(store.disk_full)),
        )  # fmt: skip
        for name, doc, ratio in disk:
            g = self._family(GaugeMetricFamily, name, doc)
            g.add_metric(base, ratio)
            yield g

    def _segments(self, base: list[str]) -> Iterator[Any]:
        store = self.broker.store
        states = {e.base_offset: (e.state, e.size) for e in store.manifest.entries()}
        # The manifest is synced with the files at start, shutdown and each clean pass: a file it does not list
        # yet is the one being written (the last) or one sealed since.
        files = list(store.commitlog.queue.files)
        for i, mf in enumerate(files):
            if mf.file_from_offset not in states:
                last = i == len(files) - 1
                states[mf.file_from_offset] = (SegmentState.ACTIVE if last else SegmentState.SEALED, mf.file_size)
        by_state = self._family(GaugeMetricFamily, "mqlake_segments", "CommitLog segments by state.", ("state",))
        for state in SegmentState:
            by_state.add_metric([*base, state.value], sum(1 for st, _ in states.values() if st == state))
        yield by_state
        backlog = self._family(
            GaugeMetricFamily,
            "mqlake_untiered_sealed_bytes",
            "Bytes of sealed segments not yet tiered (sealed, expired or being tiered).",
        )
        backlog.add_metric(base, sum(size for st, size in states.values() if st in UNTIERED_STATES))
        yield backlog

    def _jobs(self, base: list[str], reports: Path) -> Iterator[Any]:
        runs = last_job_runs(reports)
        when = self._family(GaugeMetricFamily, "mqlake_job_last_run_timestamp_seconds",
                            "When the job's newest report was written.", ("job",))  # fmt: skip
        ok = self._family(GaugeMetricFamily, "mqlake_job_last_run_success",
                          "1 when the job's newest report says it succeeded, else 0.", ("job",))  # fmt: skip
        for job, (mtime, success) in sorted(runs.items()):
            when.add_metric([*base, job], mtime)
            ok.add_metric([*base, job], 1 if success else 0)
        yield when
        yield ok


class MetricsExporter:
    """The registry, the per-request latency histogram and the HTTP server (a thread of prometheus_client's)."""

    def __init__(self, broker: BrokerContext) -> None:
        c = broker.config
        self.labels = {"cluster": c.broker_cluster_name, "node_type": "broker", "node_id": c.broker_name,
                       **parse_metrics_label(c.metrics_label)}  # fmt: skip
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(broker, self.labels))
        self.rpc_latency = Histogram(
            "rocketmq_rpc_latency", "Time to answer a request, in ms.",
            [*self.labels, "protocol_type", "request_code", "response_code", "is_long_polling", "result"],
            registry=self.registry, buckets=RPC_LATENCY_BUCKETS_MS,
        )  # fmt: skip
        self.host = c.metrics_prom_exporter_host or c.broker_ip1
        self.port = c.metrics_prom_exporter_port
        self._server: Any = None

    def start(self) -> None:
        try:
            self._server, _ = start_http_server(self.port, self.host, self.registry)
        except OSError as e:
            raise MetricsError(
                f"metrics exporter cannot listen on {self.host}:{self.port} "
                f"(metricsPromExporterHost/metricsPromExporterPort): {e.strerror or e}"
            ) from None
        self.port = self._server.server_port
        log.info("Prometheus metrics on http://%s:%d/metrics", self.host, self.port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def timed(self, handler: Handler) -> Handler:
        """``handler`` recording ``rocketmq_rpc_latency`` for each request it answers."""
        base = list(self.labels.values())
        hist = self.rpc_latency

        def record(cmd: RemotingCommand, t0: float, resp: RemotingCommand | int | None, result: str) -> None:
            long_poll = cmd.code == RequestCode.PULL_MESSAGE and _suspends(cmd)
            code = "" if resp is None else str(resp if isinstance(resp, int) else resp.code)
            hist.labels(*base, "remoting", str(cmd.code), code, _bool(long_poll), result).observe(
                (time.perf_counter() - t0) * 1000
            )

        async def wait(cmd: RemotingCommand, t0: float, pending: Awaitable[RemotingCommand | bytes | None]
                       ) -> RemotingCommand | bytes | None:  # fmt: skip
            try:
                resp = await pending
            except RequestRefused as e:  # answered with its code by the remoting layer
                record(cmd, t0, e.code, "success")
                raise
            except BaseException:
                record(cmd, t0, None, "process_request_failed")
                raise
            # a ready frame (a SYNC_FLUSH send after its group commit) answers SUCCESS
            record(cmd, t0, ResponseCode.SUCCESS if isinstance(resp, bytes) else resp,
                   "oneway" if resp is None else "success")  # fmt: skip
            return resp

        def timed_handler(cmd: RemotingCommand, conn: Channel) -> Any:
            t0 = time.perf_counter()
            try:
                out = handler(cmd, conn)
            except RequestRefused as e:
                record(cmd, t0, e.code, "success")
                raise
            except BaseException:
                record(cmd, t0, None, "process_request_failed")
                raise
            if isinstance(out, RemotingCommand) or out is None:
                record(cmd, t0, out, "oneway" if out is None else "success")
                return out
            if isinstance(out, bytes):  # a reply frame already encoded: only SUCCESS is answered so
                record(cmd, t0, ResponseCode.SUCCESS, "success")
                return out
            return wait(cmd, t0, out)

        return timed_handler


def _suspends(cmd: RemotingCommand) -> bool:
    try:
        return bool(int(cmd.ext_fields.get("sysFlag", "0")) & PULL_SUSPEND_FLAG)
    except ValueError:
        return False
