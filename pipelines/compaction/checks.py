"""The data the integrity expectations run over, and the match of committed rows against what was validated.

The chain of evidence: the file is scanned on the driver (``scan_segment``: record count, valid bytes,
BLANK, torn tail); the rows Spark decoded are validated against it by the expectations as they are
staged (as many rows as records, covering every valid byte, each body's CRC recomputed, offsets
contiguous; see staging.py); the committed snapshot is then read back, bodies included, and matched
against the digest of those rows (count, bytes, per-queue offset ranges, sums of stored body CRCs and of
body lengths, every committed body against its CRC) before the segment may be deleted.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c
import pyarrow as pa

from expectations.rules import MESSAGES, QUEUES, RULES, SEGMENTS
from pipelines.segment_reader import SegmentFacts
from store.retention import SegmentEntry

QueueKey = tuple[str, int]
CRC_RULE = next(r for r in RULES if r.name == "crc_matches")  # what makes a row's body count as bad


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
    """Aggregates of a segment's rows (staged, committed or decoded), folded from :class:`DigestParts`."""

    count: int
    bytes: int
    crc_sum: int  # sum of the stored BODYCRCs
    first_store_time: int | None
    last_store_time: int | None
    queues: dict[QueueKey, QueueRange]
    body_bytes: int = 0  # sum of the body lengths
    bad_crc: int = 0  # rows whose body does not match its stored CRC (counted where the CRC was recomputed)


# what a digest reads of the canonical rows, beside the body (or its length)
DIGEST_COLUMNS = ("segment", "topic", "queue_id", "sys_flag", "queue_offset", "msg_size", "body_crc", "position",
                  "store_timestamp")  # fmt: skip


class DigestParts:
    """Partial aggregates of rows, merged across batches and Spark tasks; :meth:`digests` folds them.

    One implementation for every place a digest is taken: the staging pass adds its decoded batches as it
    writes them, :func:`rows_digest` adds the batches of any Spark frame (the committed snapshot)."""

    def __init__(self) -> None:
        # segment -> [count, bytes, crc_sum, body_bytes, bad_crc, first_pos, first_ts, last_pos, last_ts]
        self.segments: dict[str, list] = {}
        self.queues: dict[tuple[str, str, int], list] = {}  # (segment, topic, queue) -> [first, last, count]

    def add(self, batch: pa.RecordBatch) -> None:
        """Fold in rows with :data:`DIGEST_COLUMNS` and ``body`` or ``body_len`` (and optionally ``bad_crc``)."""
        import pyarrow.compute as pc

        from expectations.sequence import consumable_mask

        if batch.num_rows == 0:
            return
        names = batch.schema.names
        body_len = batch.column("body_len") if "body_len" in names else pc.binary_length(batch.column("body"))
        bad = batch.column("bad_crc") if "bad_crc" in names else pa.nulls(batch.num_rows, pa.bool_())
        t = pa.table({
            **{c: batch.column(c) for c in DIGEST_COLUMNS},
            "body_len": body_len.cast(pa.int64()),
            "body_crc": batch.column("body_crc").cast(pa.int64()),
            "msg_size": batch.column("msg_size").cast(pa.int64()),
            "bad": pc.cast(pc.fill_null(bad, False), pa.int64()),
        }).sort_by([("segment", "ascending"), ("position", "ascending")])  # fmt: skip
        per_segment = t.group_by("segment", use_threads=False).aggregate([
            ("msg_size", "count"), ("msg_size", "sum"), ("body_crc", "sum"), ("body_len", "sum"), ("bad", "sum"),
            ("position", "first"), ("store_timestamp", "first"), ("position", "last"), ("store_timestamp", "last"),
        ])  # fmt: skip
        for r in per_segment.to_pylist():
            self._add_segment(r["segment"], [
                r["msg_size_count"], r["msg_size_sum"], r["body_crc_sum"], r["body_len_sum"], r["bad_sum"],
                r["position_first"], r["store_timestamp_first"], r["position_last"], r["store_timestamp_last"],
            ])  # fmt: skip
        queued = t.filter(pa.array(consumable_mask(t.column("sys_flag"))))
        per_queue = queued.group_by(["segment", "topic", "queue_id"], use_threads=False).aggregate(
            [("queue_offset", "min"), ("queue_offset", "max"), ("queue_offset", "count")]
        )
        for r in per_queue.to_pylist():
            self._add_queue(
                (r["segment"], r["topic"], r["queue_id"]),
                [r["queue_offset_min"], r["queue_offset_max"], r["queue_offset_count"]],
            )

    def _add_segment(self, segment: str, part: list) -> None:
        have = self.segments.get(segment)
        if have is None:
            self.segments[segment] = list(part)
            return
        for i in range(5):
            have[i] += part[i]
        if part[5] < have[5]:
            have[5:7] = part[5:7]
        if part[7] > have[7]:
            have[7:9] = part[7:9]

    def _add_queue(self, key: tuple[str, str, int], part: list) -> None:
        have = self.queues.get(key)
        if have is None:
            self.queues[key] = list(part)
        else:
            have[0], have[1], have[2] = min(have[0], part[0]), max(have[1], part[1]), have[2] + part[2]

    def merge(self, other: DigestParts) -> DigestParts:
        for segment, part in other.segments.items():
            self._add_segment(segment, part)
        for key, part in other.queues.items():
            self._add_queue(key, part)
        return self

    def digests(self) -> dict[str, RowsDigest]:
        out = {
            seg: RowsDigest(p[0], p[1], p[2], p[6], p[8], {}, body_bytes=p[3], bad_crc=p[4])
            for seg, p in self.segments.items()
        }
        for (seg, topic, qid), (lo, hi, n) in self.queues.items():
            out[seg].queues[(topic, qid)] = QueueRange(lo, hi, n)
        return out


def digest_accumulator(spark):
    """A Spark accumulator of :class:`DigestParts` (tasks add their parts; the driver reads ``.value``)."""
    from pyspark.accumulators import AccumulatorParam

    class MergeParts(AccumulatorParam):
        def zero(self, value: DigestParts) -> DigestParts:
            return DigestParts()

        def addInPlace(self, a: DigestParts, b: DigestParts) -> DigestParts:
            return a.merge(b)

    return spark.sparkContext.accumulator(DigestParts(), MergeParts())


def body_checks(body: pa.Array) -> tuple[pa.Array, pa.Array]:
    """``body_len`` and ``body_crc32`` of each body of a binary array: its length and its CRC recomputed
    (java.util.zip.CRC32 masked to 31 bits, as the store's BODYCRC), the two columns the ``crc_matches`` rule
    reads (``expectations.rules.with_body_checks`` computes the same in Spark)."""
    import zlib

    import numpy as np

    n = len(body)
    offsets = np.frombuffer(body.buffers()[1], np.int32, n + 1, body.offset * 4)
    data = body.buffers()[2]
    crc = zlib.crc32
    with memoryview(data if data is not None else b"") as mv:
        crcs = np.fromiter((crc(mv[a:b]) for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)),
                           np.int64, n)  # fmt: skip
    return pa.array((offsets[1:] - offsets[:-1]).astype(np.int32)), pa.array(crcs & 0x7FFFFFFF)


def rows_digest(df) -> dict[str, RowsDigest]:
    """segment -> digest of its rows in ``df`` (any frame of the canonical schema), bodies checked against
    their stored CRC: one Spark job over the digest columns, the body reduced to its length and CRC check."""
    from expectations.rules import with_body_checks

    acc = digest_accumulator(df.sparkSession)
    narrow = with_body_checks(df).select(*DIGEST_COLUMNS, "crc_ok", "body_len", "body_crc32")

    def fold(batches):
        parts = DigestParts()
        for batch in batches:
            bad = CRC_RULE.condition(batch)  # type: ignore[operator]
            parts.add(pa.RecordBatch.from_arrays([*batch.columns, bad], names=[*batch.schema.names, "bad_crc"]))
        acc.add(parts)
        return iter(())

    narrow.mapInArrow(fold, "segment string").collect()
    return acc.value.digests()


@dataclass(frozen=True)
class DataFile:
    """A parquet file of a table: where to read it, and its partition values (as the Delta log records them)."""

    location: str
    partition_values: dict[str, Any]


def files_digest(
    spark, files: list[DataFile], schema: pa.Schema, segments: set[str], offsets: tuple[int, int]
) -> dict[str, RowsDigest]:
    """segment -> digest of the rows of ``segments`` with ``offsets[0] <= commitlog_offset < offsets[1]`` in
    ``files`` (a table of ``schema``), every body checked against its stored CRC (the ``crc_matches`` rule).

    One Spark task per file reads it with pyarrow and folds its rows where it reads them: no body crosses into
    the JVM, and the JVM has nothing to compile."""
    if not files:
        return {}
    acc = digest_accumulator(spark)
    names, (lo, hi) = pa.array(sorted(segments)), offsets
    wanted = (*DIGEST_COLUMNS, "crc_ok", "commitlog_offset", "body")

    def fold(batches):
        import pyarrow.compute as pc
        import pyarrow.fs as pafs
        import pyarrow.parquet as pq

        parts = DigestParts()
        for ids in batches:
            for i in ids.column("id").to_pylist():
                f = files[i]
                fs, path = pafs.FileSystem.from_uri(f.location)
                t = pq.read_table(path, filesystem=fs, columns=[c for c in wanted if c not in f.partition_values])
                offset = t.column("commitlog_offset")
                keep = pc.and_(pc.is_in(t.column("segment"), names),
                               pc.and_(pc.greater_equal(offset, lo), pc.less(offset, hi)))  # fmt: skip
                for batch in t.filter(keep).to_batches(max_chunksize=8192):
                    n = batch.num_rows
                    body_len, body_crc32 = body_checks(batch.column("body"))
                    cols = {c: batch.column(c) for c in batch.schema.names if c != "body"}
                    bad = CRC_RULE.condition(pa.RecordBatch.from_pydict(
                        {**cols, "body_len": body_len, "body_crc32": body_crc32}))  # type: ignore[operator]
                    cols |= {c: pa.repeat(pa.scalar(v, schema.field(c).type), n)
                             for c, v in f.partition_values.items() if c in wanted}  # fmt: skip
                    parts.add(pa.RecordBatch.from_pydict(cols | {"body_len": body_len, "bad_crc": bad}))
        acc.add(parts)
        return iter(())

    spark.range(len(files), numPartitions=len(files)).mapInArrow(fold, "id long").collect()
    return acc.value.digests()


def mismatches(expected: RowsDigest, found: RowsDigest | None) -> list[str]:
    """How ``found`` (the committed rows of a segment) differs from ``expected``; empty when they match."""
    if found is None:
        return [f"no rows found (expected {expected.count})"]
    out = []
    for what in ("count", "bytes", "crc_sum", "body_bytes"):
        if getattr(found, what) != getattr(expected, what):
            out.append(f"{what} {getattr(found, what)}, expected {getattr(expected, what)}")
    if found.bad_crc:
        out.append(f"{found.bad_crc} committed row(s) whose body does not match its stored CRC")
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


def expectation_frames(checked_df, segment_checks: pa.Table, queue_checks: pa.Table) -> dict:
    """The three datasets; ``checked_df`` is ``expectations.rules.checked_messages`` of the rows (None: the
    ``messages`` rules were counted where the rows were staged, and none broke).  The two small tables stay Arrow
    tables: their rules are checked on the driver."""
    return {MESSAGES: checked_df, SEGMENTS: segment_checks, QUEUES: queue_checks}
