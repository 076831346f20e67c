"""The tiering job's staging pass: decode the segments, write them as parquet and check the rows, in ONE Spark job.

Each Spark task takes one whole segment file and, in Python:

- decodes it (``pipelines.segment_reader.read_segment``, as the commitlog source does), adds to each Arrow batch the
  two "previous record" columns the sequence rules need (expectations/sequence.py) and the body's length and
  CRC (recomputed here from the very bytes that are written), and folds the batch into the per-segment and
  per-queue digest (``checks.DigestParts``, a Spark accumulator);
- sorts the segment's rows as the ``messages`` table keeps them (by its partition columns, then queue id and
  queue offset: a broker pull falling through to the tier reads one small run of a row group,
  lake/reader.py) and writes them with pyarrow, one file per partition directory under the staging
  directory, in small row groups (``tables.ROW_GROUP_BYTES`` / ``ROW_GROUP_ROWS``: a fall-through pull decodes a
  whole row group);
- evaluates every ``messages`` rule over the same batches (``expectations.rules.flag_batch``: the rules are
  Arrow functions, the one definition ``expectations.rules.flagged`` also runs over Spark frames) and counts
  the rows breaking each (an accumulator).

So the rules and the digests see the rows exactly as they are staged, the staged files are never read back
before the commit, and no row crosses into the JVM: Spark only schedules the tasks (moving every body into
Spark and encoding it there was most of the staging cost, and evaluating the rules as Spark SQL over the
rows without bodies most of the rest, docs/benchmarks.md).  The post-commit verify reads the committed files and
matches them against these digests (every body against its CRC), so a row changed between here and the disk
is still caught before anything is deleted.

One task per segment makes every staged file hold the rows of one segment only, and the tasks report which
files they wrote (an accumulator: only successful task attempts count, so a file left by a failed attempt is
never committed): a segment that breaks a rule is left out of the commit by leaving out its files, without
staging again.  A task holds its segment's decoded rows in memory while it sorts them (about the segment's
size).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from expectations import sequence
from expectations.rules import MESSAGES, SEGMENT_FIRST_TIME, SEGMENT_LAST_TIME, flag_batch, rules_for
from lake import columnar, tables
from lake.schema import MESSAGE_SCHEMA, MESSAGES_SCHEMA
from pipelines.compaction.checks import DigestParts, RowsDigest, body_checks, digest_accumulator

BODY_LEN = "body_len"
BODY_CRC32 = "body_crc32"
# what the rules see of each staged row: every column but the body, plus what the rules need of the body
CHECKED_SCHEMA = pa.schema(
    [
        *(f for f in MESSAGE_SCHEMA if f.name != "body"),
        *sequence.FIELDS,
        pa.field(BODY_LEN, pa.int32(), nullable=False),
        pa.field(BODY_CRC32, pa.int64(), nullable=False),
        pa.field(SEGMENT_FIRST_TIME, pa.int64()),
        pa.field(SEGMENT_LAST_TIME, pa.int64()),
    ]
)
StoreTimes = tuple[int | None, int | None]  # a segment's first and last store time, as the store recorded them


@dataclass
class Staged:
    directory: str  # absolute path or URI
    digests: dict[str, RowsDigest]  # segment -> digest of the rows written
    violations: dict[str, int]  # messages rule -> rows breaking it, over the whole batch
    rows: int
    files: dict[str, list[str]]  # segment -> the staged files holding its rows (absolute)


def write_sorted(table: pa.Table, directory: str, tag: str) -> list[str]:
    """Write ``table`` (the ``messages`` columns) under ``directory`` as the table is partitioned, sorted by
    partition, queue id and queue offset, one file per partition; returns the files written."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from lake.delta import partition_path

    n = table.num_rows
    if n == 0:
        return []
    parts = list(tables.MESSAGES_PARTITION_BY)
    keys = [*parts, "queue_id", "queue_offset"]
    order = pc.sort_indices(table.select(keys), sort_keys=[(k, "ascending") for k in keys])
    by_part = table.select(parts).take(order)
    new_part = np.zeros(n, bool)
    new_part[0] = True
    for c in parts:
        col = by_part.column(c)
        new_part[1:] |= pc.fill_null(pc.not_equal(col.slice(1), col.slice(0, n - 1)), True).to_numpy(
            zero_copy_only=False
        )
    starts = [*np.flatnonzero(new_part).tolist(), n]
    data_schema = pa.schema([f for f in MESSAGES_SCHEMA if f.name not in parts])
    fs, root = pafs.FileSystem.from_uri(directory)
    written = []
    for a, b in zip(starts, starts[1:], strict=False):
        rows = table.take(order[a:b])
        rows = pa.Table.from_arrays([rows.column(f.name) for f in data_schema], schema=data_schema)
        sub = partition_path({c: _partition_text(by_part.column(c)[a].as_py()) for c in parts})
        fs.create_dir(f"{root}/{sub}", recursive=True)
        name = f"{sub}/part-{tag}-{uuid.uuid4().hex}.snappy.parquet"
        with pq.ParquetWriter(f"{root}/{name}", data_schema, filesystem=fs, compression="snappy") as w:
            for s, e in _row_groups(rows.column("msg_size").to_numpy()):
                w.write_table(rows.slice(s, e - s), row_group_size=e - s)
        written.append(f"{directory.rstrip('/')}/{name}")
    return written


def _partition_text(value) -> str | None:
    return None if value is None else value.isoformat() if hasattr(value, "isoformat") else str(value)


def _row_groups(sizes) -> list[tuple[int, int]]:
    """Row-group bounds: at most ``ROW_GROUP_ROWS`` rows and, past the first row, ``ROW_GROUP_BYTES`` of records."""
    import numpy as np

    ends = np.cumsum(sizes, dtype=np.int64)
    out, s, n = [], 0, len(sizes)
    while s < n:
        before = int(ends[s - 1]) if s else 0
        e = min(s + tables.ROW_GROUP_ROWS, int(np.searchsorted(ends, before + tables.ROW_GROUP_BYTES, "right")))
        e = max(e, s + 1)
        out.append((s, e))
        s = e
    return out


def stage_task(
    paths: list[str], times: list[StoreTimes], directory: str, parts_acc, files_acc, counts_acc, broker_name: str
):
    """The Python function of the staging pass: partition ``i`` stages ``paths[i]`` whole; ``times[i]`` is the
    first and last store time the store recorded for it; ``broker_name`` the rows' broker.  What it found goes
    to the accumulators: the digest parts, the files written, and the rows breaking each ``messages`` rule."""
    rules = rules_for(MESSAGES)

    def stage_one(batches):
        from pipelines.segment_reader import read_segment

        parts = DigestParts()
        files: dict[str, list[str]] = {}
        broken = dict.fromkeys((r.name for r in rules), 0)
        for ids in batches:
            for i in ids.column("id").to_pylist():
                path = Path(paths[i])
                previous = sequence.Previous()
                decoded = []
                for batch in read_segment(path):
                    parts.add(batch)
                    batch = previous.extend(batch)
                    body_len, body_crc32 = body_checks(batch.column("body"))
                    decoded.append(columnar.table_rows(batch, broker_name))
                    n = batch.num_rows
                    extra = [body_len, body_crc32, *(pa.repeat(pa.scalar(t, pa.int64()), n) for t in times[i])]
                    checked = flag_batch(pa.RecordBatch.from_arrays(
                        [*batch.drop_columns(["body"]).columns, *extra], schema=CHECKED_SCHEMA), rules)  # fmt: skip
                    for r in rules:
                        broken[r.name] += pc.sum(checked.column(r.flag).cast(pa.int64())).as_py() or 0
                if decoded:
                    files[path.name] = write_sorted(pa.Table.from_batches(decoded), directory, f"{i:05d}")
        parts_acc.add(parts)
        files_acc.add(files)
        counts_acc.add(broken)
        return iter(())

    return stage_one


def _accumulator(spark, merge):
    """A Spark accumulator of a dict (tasks add theirs; ``merge(a, b)`` folds ``b`` into ``a``; ``.value``)."""
    from pyspark.accumulators import AccumulatorParam

    class MergeDicts(AccumulatorParam):
        def zero(self, value: dict) -> dict:
            return {}

        def addInPlace(self, a: dict, b: dict) -> dict:
            merge(a, b)
            return a

    return spark.sparkContext.accumulator({}, MergeDicts())


def _extend_lists(a: dict, b: dict) -> None:
    for k, v in b.items():
        a.setdefault(k, []).extend(v)


def _add_counts(a: dict, b: dict) -> None:
    for k, v in b.items():
        a[k] = a.get(k, 0) + v


def stage(
    spark, store_dir: Path, bases: list[int], directory: str | Path, segment_times: dict[int, StoreTimes], *,
    broker_name: str,
) -> Staged:
    """Decode, write and check the segments ``bases`` of ``store_dir`` as parquet under ``directory``
    (partitioned and sorted as the ``messages`` table is); ``segment_times`` maps a base offset to the first and
    last store time the store recorded for the segment (None: not recorded), for the store-time rule;
    ``broker_name`` is the ``broker_name`` column of every row (the store's broker)."""
    # absolute: an executor on a cluster resolves a relative path against its own work dir
    paths = [str(Path(store_dir).absolute() / "commitlog" / f"{b:020d}") for b in bases]
    where = str(directory) if "://" in str(directory) else str(Path(directory).absolute())
    parts, files = digest_accumulator(spark), _accumulator(spark, _extend_lists)
    counts = _accumulator(spark, _add_counts)
    task = stage_task(
        paths, [segment_times.get(b, (None, None)) for b in bases], where, parts, files, counts, broker_name
    )
    spark.range(len(paths), numPartitions=len(paths)).mapInArrow(task, "id long").collect()
    digests = parts.value.digests()
    return Staged(
        where, digests, {r.name: int(counts.value.get(r.name, 0)) for r in rules_for(MESSAGES)},
        sum(d.count for d in digests.values()), {k: sorted(v) for k, v in files.value.items()},
    )  # fmt: skip


def staged_frame(spark, staged: Staged):
    """The staged rows, read back (only where a rule failed: for the breaking rows' counts and samples)."""
    from lake.schema import spark_schema

    files = [f for fs in staged.files.values() for f in fs]
    reader = spark.read.schema(spark_schema(MESSAGES_SCHEMA)).option("basePath", str(staged.directory))
    if not files:
        return spark.createDataFrame([], spark_schema(MESSAGES_SCHEMA))
    return reader.parquet(*files).select(*MESSAGES_SCHEMA.names)
