"""The replay's Delta tables under the lake: ``replay_progress`` (resume points) and ``replay_runs`` (reports).

``replay_progress`` holds one row per progress commit and source queue; the row with the largest ``seq``
of a (replay id, source broker, source topic, source queue) is its current state (a source queue is a queue
of one broker: broker-a's queue 0 of a topic and broker-b's are two queues with their own offsets):

- ``last_offset``: every selected message of the source queue up to this queue offset is in the target
  (-1: none yet);
- ``watermarks``: per target queue, a queue offset below which no message of this source queue sent after
  ``last_offset`` can be.  A restart scans the target from there to find sends that were acknowledged (or
  landed without an answer) after the last commit, so it neither loses nor repeats them;
- ``spec_hash``: the selection the offsets refer to (``ReplaySpec.fingerprint``).

Rows are appended through ``lake.delta.append_arrow`` (``commit_files`` underneath), each
Spark task under its own Delta app id, because delta-rs refuses concurrent commits that share one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from lake import tables
from pipelines.replay.spec import ReplaySpecError

PROGRESS = "replay_progress"
RUNS = "replay_runs"

WATERMARK = pa.struct(
    [
        pa.field("broker_name", pa.string(), nullable=False),
        pa.field("queue_id", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
    ]
)
PROGRESS_SCHEMA = pa.schema(
    [
        pa.field("replay_id", pa.string(), nullable=False),
        pa.field("source_broker", pa.string(), nullable=False),
        pa.field("source_topic", pa.string(), nullable=False),
        pa.field("source_queue", pa.int32(), nullable=False),
        pa.field("last_offset", pa.int64(), nullable=False),
        pa.field("watermarks", pa.list_(WATERMARK), nullable=False),
        pa.field("sent", pa.int64(), nullable=False),  # sent by the run that wrote the row, so far
        pa.field("spec_hash", pa.string(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),  # time_ns of the commit: the latest row wins
        pa.field("updated_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

QUEUE_REPORT = pa.struct(
    [
        pa.field("source_topic", pa.string(), nullable=False),
        pa.field("source_queue", pa.int32(), nullable=False),
        pa.field("target_queues", pa.string(), nullable=False),
        pa.field("selected", pa.int64(), nullable=False),
        pa.field("already_done", pa.int64(), nullable=False),
        pa.field("found_in_target", pa.int64(), nullable=False),
        pa.field("sent", pa.int64(), nullable=False),
        pa.field("first_offset", pa.int64()),
        pa.field("last_offset", pa.int64()),
    ]
)
RUNS_SCHEMA = pa.schema(
    [
        pa.field("replay_id", pa.string(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("started_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("finished_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("dry_run", pa.bool_(), nullable=False),
        pa.field("target_topic", pa.string(), nullable=False),
        pa.field("selection", pa.string(), nullable=False),  # ReplaySpec.selection() as JSON
        pa.field("sent", pa.int64(), nullable=False),
        pa.field("send_seconds", pa.float64(), nullable=False),
        pa.field("rate_msgs_per_s", pa.float64(), nullable=False),
        pa.field("queues", pa.list_(QUEUE_REPORT), nullable=False),
        pa.field("report_path", pa.string(), nullable=False),
    ]
)

QueueKey = tuple[str, str, int]  # (source broker, source topic, source queue id)
TargetKey = tuple[str, int]  # (broker name, target queue id)


@dataclass
class QueueProgress:
    """The resume point of one source queue (see the module docstring)."""

    last_offset: int = -1
    watermarks: dict[TargetKey, int] = field(default_factory=dict)
    spec_hash: str = ""
    seq: int = 0


def table_uri(lake: Path | str, name: str) -> str:
    return tables.table_uri(lake, name)


def read_progress(lake: Path | str, replay_id: str) -> dict[QueueKey, QueueProgress]:
    """The current row of every source queue of ``replay_id`` ({} when there is none)."""
    from lake import delta as lk

    uri = table_uri(lake, PROGRESS)
    if not lk.is_table(uri):
        return {}
    dt = lk.open_table(uri)
    if "source_broker" not in {f.name for f in dt.schema().fields}:
        from lake.broker_names import migration_hint

        raise ReplaySpecError(f"{uri} was written before replays had a source broker: {migration_hint(lake)}")
    rows = dt.to_pyarrow_table(filters=[("replay_id", "=", replay_id)]).to_pylist()
    out: dict[QueueKey, QueueProgress] = {}
    for r in rows:
        key = (r["source_broker"], r["source_topic"], r["source_queue"])
        if key in out and out[key].seq >= r["seq"]:
            continue
        marks = {(w["broker_name"], w["queue_id"]): w["offset"] for w in r["watermarks"]}
        out[key] = QueueProgress(r["last_offset"], marks, r["spec_hash"], r["seq"])
    return out


def append_progress(
    lake: Path | str, replay_id: str, run_id: str, app_id: str, rows: dict[QueueKey, tuple[QueueProgress, int]]
) -> None:
    """One commit of ``rows``: source queue -> (its progress, messages sent so far by this run)."""
    from datetime import UTC, datetime

    seq = time.time_ns()
    now = datetime.now(UTC)
    table = pa.Table.from_pylist(
        [
            {
                "replay_id": replay_id, "source_broker": broker, "source_topic": topic, "source_queue": queue,
                "last_offset": p.last_offset,
                "watermarks": [{"broker_name": b, "queue_id": q, "offset": o}
                               for (b, q), o in sorted(p.watermarks.items())],
                "sent": sent, "spec_hash": p.spec_hash, "run_id": run_id, "seq": seq, "updated_at": now,
            }  # fmt: skip
            for (broker, topic, queue), (p, sent) in sorted(rows.items())
        ],
        schema=PROGRESS_SCHEMA,
    )
    _append_with_retry(table_uri(lake, PROGRESS), table, app_id, seq)


def append_run(lake: Path | str, row: dict) -> None:
    _append_with_retry(table_uri(lake, RUNS), pa.Table.from_pylist([row], schema=RUNS_SCHEMA),
                       f"mqlake-replay-run:{row['replay_id']}:{row['run_id']}", 1)  # fmt: skip


def _append_with_retry(uri: str, table: pa.Table, app_id: str, version: int, attempts: int = 5) -> None:
    """Tasks of one replay commit to the same table at once; delta-rs resolves most such races itself, and
    the few it reports as conflicts are safe to retry (appends never conflict in substance)."""
    from deltalake.exceptions import CommitFailedError

    from lake.delta import append_arrow

    for attempt in range(attempts):
        try:
            append_arrow(uri, table, app_id=app_id, version=version)
            return
        except CommitFailedError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
