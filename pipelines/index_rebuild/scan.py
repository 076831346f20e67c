"""The Spark half of the rebuild: CommitLog records -> what dispatch derives from each one.

Spark tasks read the CommitLog segments in splits (as the ``commitlog`` source does: a split owns the
records that start in it, found with ``store.format.records.find_record_boundary``) and run the store's own
dispatch extraction, ``store.format.records.check_record``, on every record: the same function the reput
service uses, so the tagsCode (tag hash, or a SCHEDULE_TOPIC_XXXX message's deliver time) and the keys
cannot differ from what the store derives.  Each task then adds the IndexFile keys in the order
``IndexService.build_index`` puts them (``records.index_keys``: UNIQ_KEY, each KEYS entry, and RocketMQ
5.x's tag key, flagged so that 4.x's rule can drop it) with their hashes.

Why not ``spark.read.format("commitlog")``: the rebuild must derive exactly what dispatch derives, and
``check_record`` *is* that derivation; the source decodes every column (bodies included) and would ship
them through the JVM only to be dropped.  Its vectorised decode is cheaper per record (0.5 s vs 1.7 s CPU
for 107 MB of 1 KiB records, measured in one process), but it would still need this per-record pass for
tagsCode and key hashes; the Spark job's fixed cost dominates either way (docs/benchmarks.md).

The result comes back to the driver as one Arrow table in CommitLog order: the files are built from it
there (an IndexFile is one sequence by construction; per-queue building is a few numpy passes).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from store.format import delay, hashing, properties, records
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


def _index_keys(req: records.DispatchRequest, buf: ReadBuffer, pos: int) -> tuple[list[str], bool]:
    """The index keys of the record at ``pos`` by RocketMQ 5.x's rule (``records.index_keys`` given its TAGS),
    and whether the last of them is the tag key: without that one they are 4.x's, so one list serves both."""
    tags = _tags_of(records.record_properties(buf, pos))
    keys = records.index_keys(req, tags)
    return keys, bool(keys and tags)


class _Columns:
    """Dispatch rows being collected for one batch; index key hashes are computed per batch, vectorised."""

    def __init__(self) -> None:
        self.cols: list[list] = [[] for _ in range(10)]

    def add(self, req: records.DispatchRequest, buf: ReadBuffer, pos: int) -> None:
        c = self.cols
        c[0].append(req.topic)
        c[1].append(req.queue_id)
        c[2].append(req.queue_offset)
        c[3].append(req.commitlog_offset)
        c[4].append(req.msg_size)
        c[5].append(req.sys_flag)
        c[6].append(req.store_timestamp)
        c[7].append(req.tags_code)
        keys, tag_key = _index_keys(req, buf, pos)
        c[8].append(keys)
        c[9].append(tag_key)

    def __len__(self) -> int:
        return len(self.cols[0])

    def batch(self) -> pa.RecordBatch:
        import numpy as np
        import pyarrow.compute as pc

        # The keys' text stays here: only their hashes go to the driver (a report re-reads the few it names).
        tag_key = pa.array(self.cols.pop(), pa.bool_())
        keys = pa.array(self.cols.pop(), pa.list_(pa.string()))
        arrays = [pa.array(col, f.type) for col, f in zip(self.cols, list(DISPATCH_SCHEMA)[:8], strict=True)]
        topics = arrays[0].take(pc.list_parent_indices(keys))
        full = pc.binary_join_element_wise(topics, pc.list_flatten(keys), "#")  # hashing.index_key, per key
        hashes = pa.array(hashing.index_key_hashes(full).astype(np.int32))
        arrays.extend([pa.ListArray.from_arrays(keys.offsets, hashes), tag_key])
        self.cols = [[] for _ in range(10)]
        return pa.RecordBatch.from_arrays(arrays, schema=DISPATCH_SCHEMA)


def read_split(
    path: str, start: int, stop: int, *, last: bool = True, bound: int | None = None,
    delay_millis: list[int] | None = None,
) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """Dispatch rows of the records starting in ``[start, stop)`` of one segment file (and ending by ``bound``).

    Zeros where a record would start end the data (the active segment's tail); so do bytes that are not
    a record when no record follows them in the ``last`` segment (a torn tail, which recovery truncates).
    Other bad bytes raise :class:`store.format.records.RecordError` naming the file and position.
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
        walk = records.RecordWalk(mm, records.find_record_boundary(mm, base, start, stop), stop)
        out = _Columns()
        check = records.check_record
        for pos, size in walk:
            res = check(mm, pos, check_crc=False, delay_millis=millis, size=size)
            req = res.request
            if not res.ok or req.commitlog_offset != base + pos:
                if last and records.find_record_boundary(mm, base, pos + 1) >= len(mm):
                    break  # a torn tail: nothing valid follows
                reason = res.reason or f"PHYSICALOFFSET {req.commitlog_offset} is not {base + pos}"
                raise records.RecordError(pos, reason, path)
            if bound is not None and req.commitlog_offset + req.msg_size > bound:
                break  # records are in offset order: the rest is past the dispatched bound too
            out.add(req, mm, pos)
            if len(out) >= BATCH_RECORDS:
                yield out.batch()
        else:
            # BLANK or zeros end the data; so do bytes that are not a record with nothing valid after them
            # in the last segment (a torn tail)
            if walk.ended is records.WalkEnd.INVALID and not (
                last and records.find_record_boundary(mm, base, walk.end + 1) >= len(mm)
            ):
                raise records.RecordError(walk.end, walk.reason, path)
        if len(out):
            yield out.batch()
    finally:
        mm.close()


def index_key_at(store_dir: Path, commitlog_offset: int, n: int) -> str | None:
    """The ``n``-th index key of the record at ``commitlog_offset`` (None when it cannot be read)."""
    import mmap

    from pipelines.segments import segment_files

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
    from pipelines.segments import segment_files

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
    table = table.cast(DISPATCH_SCHEMA)  # Spark hands back nullable fields; the schema says what is set
    offsets = table.column("commitlog_offset").to_numpy()
    if len(offsets) > 1 and not (offsets[1:] > offsets[:-1]).all():
        # Partitions come back in split order, so this is a safety net, not the usual path.
        table = table.take(pa.array(offsets.argsort(kind="stable")))
        offsets = table.column("commitlog_offset").to_numpy()
    if len(offsets) == 0:
        return ScanResult(table, 0, 0, 0)
    sizes = table.column("msg_size").to_numpy()
    return ScanResult(table, int(offsets[0]), int(offsets[-1] + sizes[-1]), int(sizes.sum()))
