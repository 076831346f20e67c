"""The data the integrity expectations run over, and the match of committed rows against what was validated.

The chain of evidence: the file is scanned on the driver (``scan_segment``: record count, valid bytes,
BLANK, torn tail); the rows Spark decoded and staged are validated against it by the expectations (as
many rows as records, covering every valid byte, each body's CRC recomputed, offsets contiguous); the
committed snapshot is then matched against those validated rows (count, bytes, per-queue offset ranges,
sum of body CRCs) before the segment may be deleted.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import crc32c
import pyarrow as pa

from expectations.rules import CONSUMABLE_SQL, MESSAGES, QUEUES, SEGMENTS
from pipelines.segments import SegmentFacts
from store.retention import SegmentEntry

QueueKey = tuple[str, int]


@dataclass(frozen=True)
class QueueRange:
    first_offset: int
    last_offset: int
    count: int


def file_crc32c(path: Path) -> int:
    """CRC32C of the whole file, recorded in the ``segments`` table (to prove later which bytes were tiered)."""
    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            return crc32c.crc32c(b"")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return crc32c.crc32c(mm)


def is_clean(facts: SegmentFacts) -> bool:
    """Framed correctly from the first byte to a BLANK filler that closes the file."""
    return facts.error is None and not facts.torn_tail and facts.ends_with_blank


@dataclass
class TieredSegment:
    """What the ``segments`` table says about a segment tiered earlier (for queue continuity)."""

    base_offset: int
    file_size: int
    queues: dict[QueueKey, QueueRange]


@dataclass
class RowsDigest:
    """Aggregates of a segment's rows, computed by Spark from a table (staged or committed)."""

    count: int
    bytes: int
    crc_sum: int
    first_store_time: int | None
    last_store_time: int | None
    queues: dict[QueueKey, QueueRange]


def rows_digest(df) -> dict[str, RowsDigest]:
    """segment -> aggregates of its rows in ``df``: one Spark aggregation per (segment, topic, queue),
    rolled up on the driver (the groups are few)."""
    from pyspark.sql import functions as F

    consumable = F.expr(CONSUMABLE_SQL)
    groups = df.groupBy("segment", "topic", "queue_id").agg(
        F.count(F.lit(1)).alias("n"),
        F.sum("msg_size").alias("bytes"),
        F.sum(F.col("body_crc").cast("long")).alias("crc_sum"),
        F.min("position").alias("first_pos"),
        F.min_by("store_timestamp", "position").alias("first_ts"),
        F.max("position").alias("last_pos"),
        F.max_by("store_timestamp", "position").alias("last_ts"),
        F.min(F.when(consumable, F.col("queue_offset"))).alias("lo"),
        F.max(F.when(consumable, F.col("queue_offset"))).alias("hi"),
        F.count(F.when(consumable, 1)).alias("queued"),
    )
    out: dict[str, RowsDigest] = {}
    first: dict[str, tuple[int, int]] = {}
    last: dict[str, tuple[int, int]] = {}
    for r in groups.collect():
        seg = r["segment"]
        d = out.setdefault(seg, RowsDigest(0, 0, 0, None, None, {}))
        d.count += r["n"]
        d.bytes += r["bytes"]
        d.crc_sum += r["crc_sum"]
        if seg not in first or r["first_pos"] < first[seg][0]:
            first[seg] = (r["first_pos"], r["first_ts"])
        if seg not in last or r["last_pos"] > last[seg][0]:
            last[seg] = (r["last_pos"], r["last_ts"])
        if r["queued"]:
            d.queues[(r["topic"], r["queue_id"])] = QueueRange(r["lo"], r["hi"], r["queued"])
    for seg, d in out.items():
        d.first_store_time, d.last_store_time = first[seg][1], last[seg][1]
    return out


def mismatches(expected: RowsDigest, found: RowsDigest | None) -> list[str]:
    """How ``found`` (the committed rows of a segment) differs from ``expected``; empty when they match."""
    if found is None:
        return [f"no rows found (expected {expected.count})"]
    out = []
    for what in ("count", "bytes", "crc_sum"):
        if getattr(found, what) != getattr(expected, what):
            out.append(f"{what} {getattr(found, what)}, expected {getattr(expected, what)}")
    if found.queues != expected.queues:
        differing = sorted(
            f"{t}/{q}: found {found.queues.get((t, q))}, expected {expected.queues.get((t, q))}"
            for t, q in set(found.queues) | set(expected.queues)
            if found.queues.get((t, q)) != expected.queues.get((t, q))
        )
        out.append("queue offset ranges differ: " + "; ".join(differing[:5]))
    return out


SEGMENT_CHECK_SCHEMA = pa.schema(
    [
        ("segment", pa.string()),
        ("base_offset", pa.int64()),
        ("file_size", pa.int64()),
        ("record_count", pa.int64()),
        ("valid_bytes", pa.int64()),
        ("ends_with_blank", pa.bool_()),
        ("torn_tail", pa.bool_()),
        ("scan_error", pa.string()),
        ("message_count", pa.int64()),
        ("first_store_time", pa.int64()),
        ("last_store_time", pa.int64()),
        ("row_count", pa.int64()),
        ("row_bytes", pa.int64()),
        ("row_first_store_time", pa.int64()),
        ("row_last_store_time", pa.int64()),
    ]
)


def segment_check_table(
    facts: list[SegmentFacts], entries: dict[int, SegmentEntry], staged: dict[str, RowsDigest]
) -> pa.Table:
    """The ``segments`` dataset of the expectations: file scan + manifest + staged-row aggregates."""
    rows = []
    for f in facts:
        e = entries.get(f.base_offset)
        d = staged.get(f.segment) or RowsDigest(0, 0, 0, None, None, {})
        rows.append(
            {
                "segment": f.segment,
                "base_offset": f.base_offset,
                "file_size": f.file_size,
                "record_count": f.record_count,
                "valid_bytes": f.valid_bytes,
                "ends_with_blank": f.ends_with_blank,
                "torn_tail": f.torn_tail,
                "scan_error": f.error,
                "message_count": e.message_count if e else None,
                "first_store_time": e.first_store_time if e else None,
                "last_store_time": e.last_store_time if e else None,
                "row_count": d.count,
                "row_bytes": d.bytes,
                "row_first_store_time": d.first_store_time,
                "row_last_store_time": d.last_store_time,
            }
        )
    return pa.Table.from_pylist(rows, schema=SEGMENT_CHECK_SCHEMA)


QUEUE_CHECK_SCHEMA = pa.schema(
    [
        ("segment", pa.string()),
        ("base_offset", pa.int64()),
        ("topic", pa.string()),
        ("queue_id", pa.int32()),
        ("first_offset", pa.int64()),
        ("last_offset", pa.int64()),
        ("count", pa.int64()),
        ("prev_last", pa.int64()),
        ("prev_contiguous", pa.bool_()),
        ("run_from_zero", pa.bool_()),
        ("overlaps", pa.int64()),
    ]
)


def queue_check_table(
    batch: list[SegmentFacts], staged: dict[str, RowsDigest], tiered: Iterable[TieredSegment]
) -> pa.Table:
    """The ``queues`` dataset: per (segment, topic, queue) of the batch, its range beside the nearest earlier
    range of that queue in the tier or the batch.

    Only cleanly scanned batch files take part as neighbours: a file that does not scan clean is about to
    be quarantined, so it is a hole in the tier, not a source of offsets to continue from.
    """
    tiered = [t for t in tiered if t.base_offset not in {f.base_offset for f in batch}]
    ranges = {f.base_offset: (staged[f.segment].queues if f.segment in staged else {}) for f in batch}
    chain = sorted(
        [(t.base_offset, t.file_size, t.queues) for t in tiered]
        + [(f.base_offset, f.file_size, ranges[f.base_offset]) for f in batch if is_clean(f)],
        key=lambda x: x[0],
    )
    # run_start[i]: where the hole-free stretch of CommitLog holding chain[i] begins
    run_start: list[int] = []
    for i, (base, _size, _q) in enumerate(chain):
        prev_end = chain[i - 1][0] + chain[i - 1][1] if i else None
        run_start.append(run_start[i - 1] if i and prev_end == base else base)
    index = {base: i for i, (base, _s, _q) in enumerate(chain)}
    rows = []
    for f in batch:
        i = index.get(f.base_offset)
        for (topic, qid), r in sorted(ranges[f.base_offset].items()):
            prev_last = None
            prev_contiguous = False
            if i is not None:
                for j in range(i - 1, -1, -1):
                    q = chain[j][2].get((topic, qid))
                    if q is not None:
                        prev_last = q.last_offset
                        prev_contiguous = run_start[j] == run_start[i]
                        break
            overlaps = sum(
                1
                for t in tiered
                if (q := t.queues.get((topic, qid))) is not None
                and q.first_offset <= r.last_offset
                and r.first_offset <= q.last_offset
            )
            rows.append(
                {
                    "segment": f.segment,
                    "base_offset": f.base_offset,
                    "topic": topic,
                    "queue_id": qid,
                    "first_offset": r.first_offset,
                    "last_offset": r.last_offset,
                    "count": r.count,
                    "prev_last": prev_last,
                    "prev_contiguous": prev_contiguous,
                    "run_from_zero": i is not None and run_start[i] == 0,
                    "overlaps": overlaps,
                }
            )
    return pa.Table.from_pylist(rows, schema=QUEUE_CHECK_SCHEMA)


def expectation_frames(spark, checked_df, segment_checks: pa.Table, queue_checks: pa.Table) -> dict:
    """The three datasets; ``checked_df`` is ``expectations.rules.checked_messages`` of the rows."""
    return {
        MESSAGES: checked_df,
        SEGMENTS: spark.createDataFrame(segment_checks),
        QUEUES: spark.createDataFrame(queue_checks),
    }
