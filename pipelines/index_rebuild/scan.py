"""CommitLog records -> what dispatch derives from each one: the first half of the rebuild, in this process
(:func:`scan_local`, the default for a store on this machine) or in Spark tasks (:func:`scan_dispatch`, for a
cluster).

Both read the CommitLog segments in splits (as the ``commitlog`` source does: a split owns the records that
start in it, found with ``store.format.records.find_record_boundary``).  The reference path runs the store's
own dispatch extraction, ``store.format.records.check_record``, on every record: the same function the reput
service uses, so the tagsCode (tag hash, or a SCHEDULE_TOPIC_XXXX message's deliver time) and the keys cannot
differ from what the store derives; it then adds the IndexFile keys in the order ``IndexService.build_index``
puts them (``records.index_keys``: UNIQ_KEY, each KEYS entry, and RocketMQ 5.x's tag key, flagged so that 4.x's
rule can drop it) with their hashes.  Its compiled twin (``_scan.pyx``) takes the plain records (ASCII, no delay
level) with the GIL released and hands every other record to the reference path, as the store's compiled
dispatch loop does.

Why not ``spark.read.format("commitlog")``: the rebuild must derive exactly what dispatch derives, and the
source decodes every column (bodies included) only to drop them.  Why not Spark by default: for one store on
one machine the JVM, the Python workers and the trip of every row through Arrow cost more than the scan itself
(docs/benchmarks.md); Spark stays for a CommitLog its executors reach and this machine does not.

The result is one Arrow table in CommitLog order: the files are built from it in this process (an IndexFile is
one sequence by construction; per-queue building is a few numpy passes).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from store.format import delay, hashing, native, properties, records
from store.format.buffers import ReadBuffer

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# What dispatch needs of a record, plus the derived tagsCode and index keys.
DISPATCH_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("queue_id", pa.int32(), nullable=False),
        pa.field("queue_offset", pa.int64(), nullable=False),
        pa.field("commitlog_offset", pa.int64(), nullable=False),
        pa.field("msg_size", pa.int32(), nullable=False),
        pa.field("sys_flag", pa.int32(), nullable=False),
        pa.field("store_timestamp", pa.int64(), nullable=False),
        pa.field("tags_code", pa.int64(), nullable=False),
        pa.field("index_hashes", pa.list_(pa.int32()), nullable=False),  # RocketMQ 5.x's rule: with the tag key
        pa.field("tag_key", pa.bool_(), nullable=False),  # the last index hash is the tag key (4.x's rule omits it)
    ]
)
DEFAULT_SPLIT_SIZE = 64 * 1024 * 1024
BATCH_RECORDS = 65536


_tags_of = properties.property_finder(properties.PROPERTY_TAGS)
# The compiled twin of the per-record path below (pipelines/index_rebuild/_scan.pyx), or None: every record then
# takes the reference path.
_compiled = native.compiled_module("pipelines.index_rebuild._scan")
KEYS_PER_BATCH = 4 * BATCH_RECORDS  # room for index key hashes per batch (a UNIQ_KEY, a key and a tag each)


def _index_keys(req: records.DispatchRequest, buf: ReadBuffer, pos: int) -> tuple[list[str], bool]:
    """The index keys of the record at ``pos`` by RocketMQ 5.x's rule (``records.index_keys`` given its TAGS),
    and whether the last of them is the tag key: without that one they are 4.x's, so one list serves both."""
    tags = _tags_of(records.record_properties(buf, pos))
    keys = records.index_keys(req, tags)
    return keys, bool(keys and tags)


class _Columns:
    """Dispatch rows being collected for one batch, in numpy arrays the compiled scan fills in place; the
    reference path adds its rows to the same arrays, so the batch keeps CommitLog order."""

    def __init__(self) -> None:
        import numpy as np

        self.topics: list[bytes] = []  # raw topic bytes by number, as the compiled scan matches them
        self.names: list[str] = []  # the same topics decoded, as the rows carry them
        self._number: dict[str, int] = {}
        n = BATCH_RECORDS
        self.topic, self.queue_id = np.empty(n, np.int32), np.empty(n, np.int32)
        self.queue_offset, self.phys = np.empty(n, np.int64), np.empty(n, np.int64)
        self.size, self.sys_flag = np.empty(n, np.int32), np.empty(n, np.int32)
        self.store_ts, self.tags_code = np.empty(n, np.int64), np.empty(n, np.int64)
        self.key_count, self.tag_key = np.empty(n, np.int32), np.empty(n, np.uint8)
        self.hashes = np.empty(KEYS_PER_BATCH, np.int32)
        self.n = self.h = 0

    def full(self, keys: int) -> bool:
        return self.n >= len(self.topic) or self.h + keys > len(self.hashes)

    def scan(self, mm, base: int, pos: int, stop: int, bound: int | None) -> tuple[int, int]:
        """The compiled scan from ``pos``: (where it stopped, why: ``_scan.DONE``, ``FULL`` or ``REFERENCE``)."""
        pos, self.n, self.h, why = _compiled.scan_run(
            mm, base, pos, stop, -1 if bound is None else bound, self.topics, self.topic, self.queue_id,
            self.queue_offset, self.phys, self.size, self.sys_flag, self.store_ts, self.tags_code, self.key_count,
            self.tag_key, self.hashes, self.n, self.h,
        )  # fmt: skip
        return pos, why

    def add(self, req: records.DispatchRequest, keys: list[str], tag_key: bool) -> None:
        """One row by the reference path (the caller made room: see :meth:`full`)."""
        number = self._number.get(req.topic)
        if number is None:
            number = self._number[req.topic] = len(self.names)
            self.names.append(req.topic)
            self.topics.append(req.topic.encode("utf-8", "surrogatepass"))
        i = self.n
        self.topic[i], self.queue_id[i], self.queue_offset[i] = number, req.queue_id, req.queue_offset
        self.phys[i], self.size[i], self.sys_flag[i] = req.commitlog_offset, req.msg_size, req.sys_flag
        self.store_ts[i], self.tags_code[i] = req.store_timestamp, req.tags_code
        self.key_count[i], self.tag_key[i] = len(keys), tag_key
        for k in keys:
            self.hashes[self.h] = hashing.index_key_hash(hashing.index_key(req.topic, k))
            self.h += 1
        self.n += 1

    def __len__(self) -> int:
        return self.n

    def batch(self) -> pa.RecordBatch:
        import numpy as np

        n, h = self.n, self.h
        topics = pa.array(self.names, pa.string()).take(pa.array(self.topic[:n]))
        offsets = np.zeros(n + 1, np.int32)
        np.cumsum(self.key_count[:n], out=offsets[1:])
        hashes = pa.ListArray.from_arrays(pa.array(offsets), pa.array(self.hashes[:h].copy()))
        cols = [topics] + [pa.array(a[:n].copy()) for a in (self.queue_id, self.queue_offset, self.phys, self.size,
                                                             self.sys_flag, self.store_ts, self.tags_code)]
        cols += [hashes, pa.array(self.tag_key[:n].astype(bool))]
        self.n = self.h = 0
        return pa.RecordBatch.from_arrays(cols, schema=DISPATCH_SCHEMA)


def _torn_tail(mm, base: int, pos: int, last: bool) -> bool:
    """Nothing valid follows ``pos`` in the last segment: a torn tail, which recovery truncates."""
    return last and records.find_record_boundary(mm, base, pos + 1) >= len(mm)


def read_split(
    path: str, start: int, stop: int, *, last: bool = True, bound: int | None = None,
    delay_millis: list[int] | None = None, compiled: bool = True,
) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """Dispatch rows of the records starting in ``[start, stop)`` of one segment file (and ending by ``bound``).

    Zeros where a record would start end the data (the active segment's tail); so do bytes that are not
    a record when no record follows them in the ``last`` segment (a torn tail, which recovery truncates).
    Other bad bytes raise :class:`store.format.records.RecordError` naming the file and position.
    ``compiled`` False keeps every record on the reference path (the twin tests compare the two).
    """
    import mmap

    millis = delay_millis or delay.parse_delay_levels()
    base = int(Path(path).name)
    with open(path, "rb") as fh:
        if Path(path).stat().st_size == 0:
            return
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        stop = min(stop, len(mm))
        fast = compiled and _compiled is not None
        pos = records.find_record_boundary(mm, base, start, stop)
        out = _Columns()
        check = records.check_record
        while pos < stop:
            if fast:
                pos, why = out.scan(mm, base, pos, stop, bound)
                if why == _compiled.FULL:
                    yield out.batch()
                    continue
                if why == _compiled.DONE:
                    break
            # The record at pos, by the reference path.
            walk = records.RecordWalk(mm, pos, stop, max_records=1)
            found = next(iter(walk), None)
            if found is None:
                # BLANK or zeros end the data; so do bytes that are not a record in a torn tail
                if walk.ended is records.WalkEnd.INVALID and not _torn_tail(mm, base, walk.end, last):
                    raise records.RecordError(walk.end, walk.reason, path)
                break
            res = check(mm, pos, check_crc=False, delay_millis=millis, size=found[1])
            req = res.request
            if not res.ok or req is None or req.commitlog_offset != base + pos:
                if _torn_tail(mm, base, pos, last):
                    break
                reason = res.reason or f"PHYSICALOFFSET {req.commitlog_offset if req else None} is not {base + pos}"
                raise records.RecordError(pos, reason, path)
            if bound is not None and req.commitlog_offset + req.msg_size > bound:
                break  # records are in offset order: the rest is past the dispatched bound too
            keys, tag_key = _index_keys(req, mm, pos)
            if out.full(len(keys)):
                yield out.batch()
            out.add(req, keys, tag_key)
            pos += found[1]
        if len(out):
            yield out.batch()
    finally:
        mm.close()


def index_key_at(store_dir: Path, commitlog_offset: int, n: int) -> str | None:
    """The ``n``-th index key of the record at ``commitlog_offset`` (None when it cannot be read)."""
    import mmap

    from pipelines.segment_reader import segment_files

    seg = next((f for f in reversed(segment_files(store_dir)) if int(f.name) <= commitlog_offset), None)
    if seg is None:
        return None
    with open(seg, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        pos = commitlog_offset - int(seg.name)
        res = records.check_record(mm, pos, check_crc=False)
        keys = _index_keys(res.request, mm, pos)[0] if res.ok and res.request is not None else []
        return keys[n] if n < len(keys) else None
    finally:
        mm.close()


def splits(store_dir: Path, split_size: int = DEFAULT_SPLIT_SIZE) -> list[tuple[str, int, int, bool]]:
    """(segment path, start, stop, last segment?) for every ``split_size`` bytes of every local segment."""
    from pipelines.segment_reader import segment_files

    out = []
    files = segment_files(store_dir)
    for f in files:
        size = f.stat().st_size
        last = f == files[-1]
        out.extend((str(f), a, min(size, a + split_size), last) for a in range(0, size, split_size))
    return out


@dataclass
class ScanResult:
    table: pa.Table  # DISPATCH_SCHEMA rows in CommitLog order
    min_offset: int  # the first scanned record's CommitLog offset
    end_offset: int  # where the last scanned record ends
    bytes: int  # CommitLog bytes covered by the scanned records


def scan_dispatch(
    spark: SparkSession, store_dir: Path, *, bound: int | None = None, delay_millis: list[int] | None = None,
    split_size: int = DEFAULT_SPLIT_SIZE,
) -> ScanResult:  # fmt: skip
    """Read every local CommitLog segment of ``store_dir`` with Spark; keep records ending at or below ``bound``."""
    from lake.schema import spark_schema

    parts = splits(store_dir, split_size)
    if not parts:
        return ScanResult(DISPATCH_SCHEMA.empty_table(), 0, 0, 0)
    millis = delay_millis or delay.parse_delay_levels()
    df = spark.sparkContext.parallelize(parts, len(parts)).toDF("path string, start long, stop long, last boolean")

    def derive(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            for path, start, stop, last in zip(*(b.column(i).to_pylist() for i in range(4)), strict=True):
                yield from read_split(path, start, stop, last=last, bound=bound, delay_millis=millis)

    table = df.mapInArrow(derive, spark_schema(DISPATCH_SCHEMA)).toArrow()
    return _result(table.cast(DISPATCH_SCHEMA))  # Spark hands back nullable fields; the schema says what is set


def scan_local(
    store_dir: Path, *, bound: int | None = None, delay_millis: list[int] | None = None, workers: int | None = None,
) -> ScanResult:  # fmt: skip
    """:func:`scan_dispatch` without Spark: each segment scanned whole in this process, ``workers`` at once (the
    compiled scan releases the GIL; default: one per core).  Whole segments, because a split that starts inside
    one must search for its first record, and past the end of the data that search reads every zero byte."""
    from concurrent.futures import ThreadPoolExecutor

    from pipelines import job_progress
    from pipelines.segment_reader import segment_files

    files = segment_files(store_dir)
    parts = [(str(f), 0, f.stat().st_size, f == files[-1]) for f in files]
    millis = delay_millis or delay.parse_delay_levels()

    def one(part: tuple[str, int, int, bool]) -> list[pa.RecordBatch]:
        path, start, stop, last = part
        found = list(read_split(path, start, stop, last=last, bound=bound, delay_millis=millis))
        job_progress.advance(stop - start)  # the job's total is the segments' bytes
        return found

    with ThreadPoolExecutor(max_workers=max(1, min(workers or os.cpu_count() or 1, len(parts) or 1))) as pool:
        batches = [b for found in pool.map(one, parts) for b in found]  # map keeps the splits' order
    return _result(pa.Table.from_batches(batches, DISPATCH_SCHEMA))


def _result(table: pa.Table) -> ScanResult:
    """The scan's rows in CommitLog order, and the range they cover."""
    offsets = table.column("commitlog_offset").to_numpy()
    if len(offsets) > 1 and not (offsets[1:] > offsets[:-1]).all():
        # Splits come back in order, so this is a safety net, not the usual path.
        table = table.take(pa.array(offsets.argsort(kind="stable")))
        offsets = table.column("commitlog_offset").to_numpy()
    if len(offsets) == 0:
        return ScanResult(table, 0, 0, 0)
    sizes = table.column("msg_size").to_numpy()
    return ScanResult(table, int(offsets[0]), int(offsets[-1] + sizes[-1]), int(sizes.sum()))
