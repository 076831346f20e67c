"""The replay driver: plan, prepare the target and the progress rows, send, report.

One run::

    select   lake ∪ live rows of the source topics, filtered (source.py for Spark, local.py for the local engine)
    plan     per source queue: rows, offsets, and the largest offset this run covers (later appends wait for
             the next run under the same replay id)
    target   create the topic when missing (enough queues for the mapping); note each target queue's end
    progress a first row for every source queue new to this replay id (nothing sent, watermarks = the ends)
    send     a PartitionSender (sender.py) per set of whole source queues, each queue in offset order:
             spark: rows repartitioned so each Spark task holds a balanced set, at rate / tasks each;
             local: one sender in this process for every queue
    report   counts per queue, rate achieved, first/last offsets: printed by the CLI, stored as JSON under
             LAKE/_reports and as a row of the ``replay_runs`` Delta table

Two engines (``engine``), with the same selection, plan, progress and report: ``local`` reads and sends in this
process (no JVM; the selection held in memory), ``spark`` on the session's executors.  The default is
:func:`choose_engine`'s.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from expectations.runner import write_report
from lake import objectstore
from lake.reports import report_path
from pipelines import job_progress
from pipelines.executor_access import check_executors_see
from pipelines.replay import progress as prog
from pipelines.replay.plan import SOURCE_QUEUE, QueuePlan
from pipelines.replay.progress import QueueKey, QueueProgress, TargetKey
from pipelines.replay.sender import REPORT_SCHEMA, ReplayError, TaskPlan, preserved_target, send_partition
from pipelines.replay.spec import ReplaySpec, ReplaySpecError
from pipelines.spark import ENGINE_LOCAL, ENGINE_SPARK, ENGINES
from pipelines.spark import choose_engine as engine_by_master
from store.errors import MQLakeError

log = logging.getLogger(__name__)

ROUTE_TIMEOUT = 30.0
REPORTS_DIR = "_reports"


@dataclass
class ReplayReport:
    replay_id: str
    run_id: str
    dry_run: bool
    target_topic: str
    started_at: datetime
    engine: str = ENGINE_SPARK
    finished_at: datetime | None = None
    target_queues: list[TargetKey] = field(default_factory=list)
    queues: list[dict[str, Any]] = field(default_factory=list)  # one per source queue
    sent: int = 0
    send_seconds: float = 0.0
    rate: float = 0.0
    tasks: int = 0
    report_path: str | None = None
    selection: dict = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per step of the driver
    task_spans: list[tuple[float, float]] = field(default_factory=list)  # per task: first send, last ack (epoch s)

    def total(self, name: str) -> int:
        return sum(q[name] or 0 for q in self.queues)

    def to_json(self) -> dict[str, Any]:
        return {
            "replay_id": self.replay_id, "run_id": self.run_id, "engine": self.engine, "dry_run": self.dry_run,
            "target_topic": self.target_topic, "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "target_queues": [f"{b}:{q}" for b, q in self.target_queues], "tasks": self.tasks,
            "selected": self.total("selected"), "already_done": self.total("already_done"),
            "found_in_target": self.total("found_in_target"), "sent": self.sent,
            "send_seconds": round(self.send_seconds, 3), "rate_msgs_per_s": round(self.rate, 1),
            "phases_s": {k: round(v, 3) for k, v in self.phases.items()}, "task_send_spans": self.task_spans,
            "selection": self.selection,
            "queues": self.queues,
        }  # fmt: skip


# --- target topic ----------------------------------------------------------------------------------------------


async def _target_queues(namesrv: str, topic: str, create_with: int | None) -> tuple[list[TargetKey], dict]:
    """The target's writable queues (created with ``create_with`` queues on every master when missing and
    ``create_with`` is given) and each queue's max offset."""
    from broker.client import Admin

    async with Admin(namesrv) as admin:
        route = await admin.topic_route(topic)
        queues = route.publish_queues(topic) if route is not None else []
        if not queues and route is not None and route.subscribe_queues(topic):
            raise ReplayError(f"target topic {topic} exists but has no writable queue (perm); nothing was sent")
        if not queues and create_with is not None:
            clusters = (await admin.cluster_info()).cluster_addr_table
            if not clusters:
                raise ReplayError(f"no broker is registered with the NameServer {namesrv}")
            for cluster in sorted(clusters):
                await admin.create_topic(topic, cluster=cluster, read_queue_nums=create_with,
                                         write_queue_nums=create_with)  # fmt: skip
            deadline = time.monotonic() + ROUTE_TIMEOUT
            while not queues:
                if time.monotonic() > deadline:
                    raise ReplayError(f"created topic {topic} but the NameServer shows no route for it")
                await asyncio.sleep(0.1)  # waiting on the broker's re-registration, not on time itself
                route = await admin.topic_route(topic)
                queues = route.publish_queues(topic) if route is not None else []
        ends = {}
        if queues:
            ends = {(s.broker_name, s.queue_id): s.max_offset for s in await admin.topic_status(topic)}
    return sorted({(q.broker_name, q.queue_id) for q in queues}), ends


# --- planning -------------------------------------------------------------------------------------------------


def _plan(spark, df, recorded: dict[QueueKey, QueueProgress]) -> list[QueuePlan]:
    from pyspark.sql import functions as F

    done = spark.createDataFrame(
        [(b, t, q, p.last_offset) for (b, t, q), p in recorded.items()] or [("", "", -1, -1)],
        "broker_name string, topic string, queue_id int, done bigint",
    )
    # distinct first (a row in both the lake and the live log counts once), then plain aggregates: two distinct
    # counts in one aggregation make Spark expand every row per count, twice the plan's time here (docs/benchmarks.md)
    rows = (
        df.select(*SOURCE_QUEUE, "queue_offset")
        .distinct()
        .join(F.broadcast(done), SOURCE_QUEUE, "left")
        .groupBy(*SOURCE_QUEUE)
        .agg(
            F.count("*").alias("rows"),
            F.min("queue_offset").alias("lo"),
            F.max("queue_offset").alias("hi"),
            F.sum(F.when(F.col("queue_offset") <= F.col("done"), 1).otherwise(0)).alias("done"),
        )
        .collect()
    )
    return sorted(
        (QueuePlan(r["broker_name"], r["topic"], r["queue_id"], r["rows"], r["lo"], r["hi"], r["done"],
                   recorded[k].last_offset if (k := (r["broker_name"], r["topic"], r["queue_id"])) in recorded
                   else -1) for r in rows),
        key=lambda p: p.key,
    )  # fmt: skip


def _assign(plans: list[QueuePlan], tasks: int) -> dict[int, list[QueueKey]]:
    """Whole source queues to ``tasks`` partitions, largest first onto the least loaded (balanced sends)."""
    load = [0] * tasks
    out: dict[int, list[QueueKey]] = {i: [] for i in range(tasks)}
    for p in sorted(plans, key=lambda p: (-(p.rows - p.already_done), p.key)):
        i = min(range(tasks), key=lambda j: (load[j], j))
        out[i].append(p.key)
        load[i] += p.rows - p.already_done
    return out


_U32 = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _U32


def _murmur3_mix(h: int, k: int) -> int:
    k = (_rotl32((k * 0xCC9E2D51) & _U32, 15) * 0x1B873593) & _U32
    return (_rotl32(h ^ k, 13) * 5 + 0xE6546B64) & _U32


def spark_hash_long(value: int, seed: int = 42) -> int:
    """Spark's ``hash`` of a bigint (``Murmur3_x86_32.hashLong``, seed 42): the function ``HashPartitioning``
    places a row with, as a signed int."""
    u = value & 0xFFFFFFFFFFFFFFFF
    h = _murmur3_mix(_murmur3_mix(seed, u & _U32), u >> 32) ^ 8  # fmix(h1, 8 bytes)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _U32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _U32
    h ^= h >> 16
    return h - (1 << 32) if h & 0x80000000 else h


def _partition_keys(tasks: int) -> list[int]:
    """For each partition i, a bigint whose Spark hash lands in partition i of ``repartition(tasks, col)``
    (HashPartitioning is pmod(murmur3(col), n)): an exact queue->task placement through the DataFrame API, with
    no Python-side RDD shuffle, found here rather than by a Spark job (seconds of scheduling per replay)."""
    found: dict[int, int] = {}
    for key in range(64 * tasks + 64):
        found.setdefault(spark_hash_long(key) % tasks, key)  # Python's % of a signed int is Spark's pmod
        if len(found) == tasks:
            break
    missing = [i for i in range(tasks) if i not in found]
    if missing:
        raise ReplayError(f"no partition key found for partitions {missing}")
    return [found[i] for i in range(tasks)]


# --- the run ----------------------------------------------------------------------------------------------------

# (todo, a TaskPlan for an assignment of source queues to tasks, phase) -> (the senders' report rows, tasks)
Send = Callable[[list[QueuePlan], Callable[[dict[int, list[QueueKey]], int], TaskPlan], Callable[[str], None]],
                tuple[list[dict], int]]  # fmt: skip
LOCAL_CONNECTIONS = 8  # the local sender's connections to each broker (as the raw produce of bench_replay)


def choose_engine(spec: ReplaySpec, spark=None, master: str | None = None) -> str:
    """``spark`` when a session is given, the master is not local (as verify-index decides:
    ``pipelines.spark.choose_engine``) or ``--where`` (a Spark SQL predicate) is given; else ``local``."""
    return ENGINE_SPARK if spec.where else engine_by_master(spark, master)


def replay(
    spec: ReplaySpec,
    *,
    engine: str | None = None,
    spark=None,
    master: str | None = None,
    conf: dict[str, str] | None = None,
    report_path: Path | None = None,
) -> ReplayReport:
    """Run (or with ``spec.dry_run`` only plan) one replay; raises ReplaySpecError for bad options and
    ReplayError when the replay cannot go on (progress already recorded stays valid for a rerun).
    ``engine``: ``local`` or ``spark`` (default :func:`choose_engine`).
    ``report_path``: also write the JSON report there (dry runs included), for an orchestrator to pick up."""
    engine = engine or choose_engine(spec, spark, master)
    if engine not in ENGINES:
        raise ReplaySpecError(f"--engine {engine!r}: one of {', '.join(ENGINES)}")
    if engine == ENGINE_LOCAL and spec.where:
        raise ReplaySpecError("--where is a Spark SQL predicate: it needs --engine spark")
    started = datetime.now(UTC)
    run_id = started.strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]
    report = ReplayReport(spec.replay_id, run_id, spec.dry_run, spec.target_topic, started, engine,
                          selection=spec.selection())  # fmt: skip
    fingerprint = spec.fingerprint()
    recorded = prog.read_progress(spec.lake, spec.replay_id)
    other = sorted({p.spec_hash for p in recorded.values()} - {fingerprint})
    if other:
        raise ReplaySpecError(
            f"replay id {spec.replay_id} was started with other selection options (fingerprint {other[0]}, now "
            f"{fingerprint}); resume with the same --source-topic/--from/--to/--where/--tags/--keys/--queue-map/"
            f"--preserve-timestamps, or use a new --replay-id"
        )
    clock = time.monotonic()

    def phase(name: str) -> None:
        nonlocal clock
        now = time.monotonic()
        report.phases[name] = now - clock
        clock = now

    if engine == ENGINE_LOCAL:
        from pipelines.replay import local

        rows = local.select(spec)
        phase("select")
        plans = local.plan(rows, recorded)
        phase("plan")
        report = _run(spec, plans, recorded, report, phase, fingerprint, partial(_send_local, spec, rows, recorded))
    else:
        if spark is None:
            from pipelines.spark import get_spark

            spark = get_spark(master, app_name="mqlake-replay", conf=conf)
        report = _replay_spark(spark, spec, recorded, report, phase, fingerprint)
    if report_path is not None:
        write_report(Path(report_path), report.to_json())
    return report


def _replay_spark(spark, spec: ReplaySpec, recorded, report: ReplayReport, phase, fingerprint: str) -> ReplayReport:
    from pyspark import StorageLevel

    from pipelines.replay.source import source_frame

    # on a cluster the executors read the tier's Parquet files and the live CommitLog themselves
    store = [path / "commitlog" for _, path in spec.live_stores()]
    lake = [] if objectstore.is_remote(spec.lake) else [Path(spec.lake)]  # on S3: reached over the network
    check_executors_see(spark, read=[*lake, *store])
    # Read the sources once: the plan and the sends see the same rows (a snapshot of the live log as of the
    # plan), and the send job does not decode the CommitLog a second time.
    df = source_frame(spark, spec).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        plans = _plan(spark, df, recorded)
        phase("plan")
        return _run(spec, plans, recorded, report, phase, fingerprint, partial(_send_spark, spark, spec, df, recorded))
    finally:
        df.unpersist()


def _send_spark(spark, spec: ReplaySpec, df, recorded, todo: list[QueuePlan], task_plan, phase) -> tuple[list, int]:
    from pyspark.sql import functions as F

    from lake.schema import spark_schema

    parallelism = spec.parallelism or spark.sparkContext.defaultParallelism
    tasks = max(1, min(len(todo), parallelism))
    assignment = _assign(todo, tasks)
    keys = _partition_keys(tasks)
    placement = spark.createDataFrame(
        [(*k, keys[i], recorded[k].last_offset if k in recorded else -1) for i, qs in assignment.items()
         for k in qs],
        "broker_name string, topic string, queue_id int, __task bigint, __done bigint",
    )  # fmt: skip
    plan = task_plan(assignment, tasks)
    rows = (
        df.join(F.broadcast(placement), SOURCE_QUEUE)
        .where(F.col("queue_offset") > F.col("__done"))  # done before: not even shipped to the task
        .repartition(tasks, "__task")
        .sortWithinPartitions("queue_offset", *SOURCE_QUEUE)
        .drop("__task", "__done")
    )
    try:
        sent = rows.mapInArrow(partial(send_partition, plan), spark_schema(REPORT_SCHEMA))
        phase("partitioning")
        results = [r.asDict() for r in sent.collect()]
        phase("send_job")
    except Exception as e:
        raise ReplayError(f"replay {spec.replay_id} stopped: {_root_cause(e)} (acknowledged sends are recorded; "
                          f"rerun with --replay-id {spec.replay_id} to continue)") from e  # fmt: skip
    return results, tasks


def _send_local(spec: ReplaySpec, rows, recorded, todo: list[QueuePlan], task_plan, phase) -> tuple[list, int]:
    from broker.remoting.loop import run
    from pipelines.replay import local
    from pipelines.replay.sender import PartitionSender

    plan = replace(task_plan({0: [p.key for p in todo]}, 1), connections=LOCAL_CONNECTIONS)
    try:
        # the command's own process: no Spark worker to outlive its job, so no parent to watch
        sent = run(PartitionSender(plan, 0, watch_parent=False).run(local.to_send(rows, recorded, todo)))
    except ReplayError:
        raise
    except (MQLakeError, OSError) as e:
        raise ReplayError(f"replay {spec.replay_id} stopped: {type(e).__name__}: {e} (acknowledged sends are "
                          f"recorded; rerun with --replay-id {spec.replay_id} to continue)") from e  # fmt: skip
    phase("send")
    return sent.to_pylist(), 1


def _run(spec: ReplaySpec, plans: list[QueuePlan], recorded, report: ReplayReport, phase, fingerprint: str,
         send: Send) -> ReplayReport:  # fmt: skip
    from broker.remoting.loop import run

    run_id = report.run_id
    max_queue = max((p.queue_id for p in plans), default=0)
    need = max(max_queue + 1, 1)
    if spec.dry_run:
        targets, _ = run(_target_queues(spec.namesrv, spec.target_topic, None)) if spec.namesrv else ([], {})
        report.target_queues = targets
        shown = targets or [("(new)", i) for i in range(need)]  # what a real run would create
        report.queues = [_queue_row(p, _mapping(spec, p, shown)) for p in plans]
        report.finished_at = datetime.now(UTC)
        return report
    if not plans:  # nothing selected: no topic to create, nothing to record but the report
        report.finished_at = datetime.now(UTC)
        _store_report(spec, report)
        return report

    targets, ends = run(_target_queues(spec.namesrv, spec.target_topic, need))
    report.target_queues = targets
    new = {p.key: QueueProgress(-1, dict(ends), fingerprint) for p in plans if p.key not in recorded}
    if new:
        prog.append_progress(spec.lake, spec.replay_id, run_id, f"mqlake-replay:{spec.replay_id}:{run_id}:driver",
                             {k: (v, 0) for k, v in new.items()})  # fmt: skip
    phase("target_and_progress")

    todo = [p for p in plans if p.rows > p.already_done]
    job_progress.set_total(sum(p.rows - p.already_done for p in todo), "rows")
    results: list[dict] = []
    if todo:

        def task_plan(assignment: dict[int, list[QueueKey]], tasks: int) -> TaskPlan:
            return TaskPlan(
                namesrv=spec.namesrv, lake=objectstore.join(spec.lake), replay_id=spec.replay_id, run_id=run_id,
                lake_settings=objectstore.settings_env() if objectstore.is_remote(spec.lake) else {},
                spec_hash=fingerprint, target_topic=spec.target_topic, target_queues=targets,
                queue_map=spec.queue_map, preserve_timestamps=spec.preserve_timestamps,
                bounds={p.key: p.max_offset for p in todo}, assignment=assignment,
                rate_per_task=spec.rate / tasks if spec.rate else None, batch_size=spec.batch_size,
                commit_every=spec.commit_every, commit_seconds=spec.commit_seconds,
            )  # fmt: skip

        results, report.tasks = send(todo, task_plan, phase)

    by_key = {(r["source_broker"], r["source_topic"], r["source_queue"]): r for r in results}
    for p in plans:
        r = by_key.get(p.key, {})
        row = _queue_row(p, r.get("target_queues") or _mapping(spec, p, targets))
        row.update({k: r[k] for k in ("sent", "found_in_target", "first_offset", "last_offset") if k in r})
        # A task reads the progress again when it starts; rows recorded in between (a previous run's worker
        # finishing its last commit after that run was killed) were shipped to it and skipped there.
        row["already_done"] += r.get("already_done") or 0
        report.queues.append(row)
    report.sent = report.total("sent")
    # every queue row of a task carries the task's span; tasks may start apart (scheduling, shuffle reads)
    report.task_spans = sorted({(r["send_started"], r["send_finished"]) for r in results if r["send_started"]})
    starts = [r["send_started"] for r in results if r["send_started"]]
    ends_t = [r["send_finished"] for r in results if r["send_finished"]]
    report.send_seconds = (max(ends_t) - min(starts)) if starts and ends_t else 0.0
    report.rate = report.sent / report.send_seconds if report.send_seconds > 0 else 0.0
    report.finished_at = datetime.now(UTC)
    _store_report(spec, report)
    phase("report")
    return report


def _mapping(spec: ReplaySpec, p: QueuePlan, targets: list[TargetKey]) -> str:
    if not targets:
        return ""
    if spec.queue_map == "hash":
        return "by key hash over " + ",".join(str(q) for _, q in targets)
    return str(preserved_target(targets, p.key)[1])  # on the source's broker when the target has queues there


def _queue_row(p: QueuePlan, target: str) -> dict[str, Any]:
    return {
        "source_broker": p.broker, "source_topic": p.topic, "source_queue": p.queue_id, "target_queues": target,
        "selected": p.rows,
        "min_offset": p.min_offset, "max_offset": p.max_offset, "already_done": p.already_done,
        "resume_after": p.resume_after, "found_in_target": 0, "sent": 0, "first_offset": None, "last_offset": None,
    }  # fmt: skip


def _root_cause(e: BaseException) -> str:
    """The Python error inside a failed Spark task, not the JVM's wrapping of it."""
    text = str(e)
    for marker in ("ReplayError: ", "MQBrokerError: ", "MQClientError: ", "RecordError: ", "FileNotFoundError: "):
        i = text.rfind(marker)
        if i >= 0:
            return text[i:].splitlines()[0]
    return text.splitlines()[0] if text else type(e).__name__


def _store_report(spec: ReplaySpec, report: ReplayReport) -> None:
    path = report_path(spec.lake, "replay", f"{report.replay_id}-{report.run_id}")
    report.report_path = str(path)
    write_report(path, report.to_json())
    prog.append_run(spec.lake, {
        "replay_id": report.replay_id, "run_id": report.run_id, "started_at": report.started_at,
        "finished_at": report.finished_at, "dry_run": report.dry_run, "target_topic": report.target_topic,
        "selection": json.dumps(report.selection, sort_keys=True), "sent": report.sent,
        "send_seconds": report.send_seconds, "rate_msgs_per_s": report.rate,
        "queues": [{k: q[k] for k in ("source_topic", "source_queue", "target_queues", "selected", "already_done",
                                      "found_in_target", "sent", "first_offset", "last_offset")}
                   for q in report.queues],
        "report_path": report.report_path,
    })  # fmt: skip
