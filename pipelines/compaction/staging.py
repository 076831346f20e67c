"""The tiering job's staging pass: decode the segments, check the rows and write them, in ONE Spark job.

Each Spark task decodes one whole segment file (``pipelines.segments.read_segment``, as the commitlog
source does) and, while its batches go by, adds to them the two "previous record" columns the sequence
rules need (expectations/sequence.py) and folds them into the per-segment and per-queue digest
(``checks.DigestParts``, a Spark accumulator).  Spark then evaluates every ``messages`` rule as a flag column
(``expectations.rules.flagged``, the rules' own SQL) and counts the rows breaking each with
``DataFrame.observe``, on the rows it hands to the parquet writer.  So the rules and the digests see the
rows exactly as they are staged, and the staged files are never read back before the commit: the
post-commit verify reads the committed files and matches them against these digests (body CRCs
included), so a row changed between here and the disk is still caught before anything is deleted.

One task per segment also makes every staged file hold the rows of one segment only: a segment that breaks
a rule is left out of the commit by leaving out its files (:func:`files_of`), without staging again.

Why not a window (as ``expectations.rules.checked_messages`` over a frame) or a ``mapInArrow`` over the rows:
the window shuffles every body, and a second Python pass over the rows moved every body through Arrow again
(measured +2.5–3.4 s at ``BENCH_SCALE=0.25``, about half the staging write); the decoder already holds
each batch in Arrow, so the extra columns and the digest cost it almost nothing (docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from expectations import sequence
from expectations.rules import MESSAGES, flagged, rules_for, with_body_checks
from pipelines.compaction import tables
from pipelines.compaction.checks import DigestParts, RowsDigest, digest_accumulator
from pipelines.schema import MESSAGE_SCHEMA
from store.errors import MQLakeError

DECODED_SCHEMA = pa.schema([*MESSAGE_SCHEMA, *sequence.FIELDS])
ROWS = "rows"  # the observed row count, beside one count per rule


class StagingError(MQLakeError, RuntimeError):
    """Staged files that cannot be told apart by segment (each task writes one segment's rows)."""


@dataclass
class Staged:
    directory: Path
    digests: dict[str, RowsDigest]  # segment -> digest of the rows written
    violations: dict[str, int]  # messages rule -> rows breaking it, over the whole batch
    rows: int


def decode_checked(paths: list[str], parts_acc):
    """The Python function of the staging pass: partition ``i`` decodes ``paths[i]`` whole."""

    def decode(batches):
        from pipelines.segments import read_segment

        parts = DigestParts()
        for ids in batches:
            for i in ids.column("id").to_pylist():
                previous = sequence.Previous()
                for batch in read_segment(Path(paths[i])):
                    parts.add(batch)
                    yield previous.extend(batch)
        parts_acc.add(parts)

    return decode


def stage(spark, store_dir: Path, bases: list[int], directory: Path, segment_times) -> Staged:
    """Decode, check and write the segments ``bases`` of ``store_dir`` as parquet under ``directory``
    (partitioned and sorted as the ``messages`` table is); ``segment_times`` is a frame of ``segment``,
    ``first_store_time``, ``last_store_time`` (what the store recorded) for the store-time rule."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from pipelines.schema import spark_schema

    # absolute: an executor on a cluster resolves a relative path against its own work dir
    paths = [str(Path(store_dir).absolute() / "commitlog" / f"{b:020d}") for b in bases]
    parts = digest_accumulator(spark)
    decoded = spark.range(len(paths), numPartitions=len(paths)).mapInArrow(
        decode_checked(paths, parts), spark_schema(DECODED_SCHEMA)
    )
    # UTC day from the millis, independent of the session time zone
    day = F.date_from_unix_date(F.floor(F.col("store_timestamp") / 86_400_000).cast("int"))
    rules = rules_for(MESSAGES)
    checked = flagged(MESSAGES, with_body_checks(decoded.withColumn(tables.STORE_DATE, day)), segment_times, rules)
    observed = Observation(f"staging-{directory.name}")
    checked = checked.observe(
        observed, F.count(F.lit(1)).alias(ROWS), *(F.count_if(F.col(r.flag)).alias(r.name) for r in rules)
    )
    (
        checked.select(*tables.MESSAGES_SCHEMA.names)
        # A queue's rows together, in offset order: a broker pull falling through to the tier reads one
        # small run of a row group (broker/lake/reader.py), not rows spread over the whole file.
        .sortWithinPartitions(*tables.MESSAGES_PARTITION_BY, "queue_id", "queue_offset")
        .write.mode("errorifexists")
        # small row groups (parquet's default is 128 MiB *encoded*, and bodies compress well): a pull
        # falling through to the tier decodes a whole row group
        .option("parquet.block.size", str(tables.ROW_GROUP_BYTES))
        .option("parquet.block.row.count.limit", str(tables.ROW_GROUP_ROWS))
        .partitionBy(*tables.MESSAGES_PARTITION_BY)
        .parquet(str(directory))
    )
    metrics = observed.get
    return Staged(
        directory, parts.value.digests(), {r.name: int(metrics[r.name]) for r in rules}, int(metrics[ROWS])
    )


def staged_frame(spark, directory: Path):
    """The staged rows, read back (only where a rule failed: for the breaking rows' counts and samples)."""
    from pipelines.schema import spark_schema

    return (
        spark.read.schema(spark_schema(tables.MESSAGES_SCHEMA))
        .option("basePath", str(directory))
        .parquet(str(directory))
        .select(*tables.MESSAGES_SCHEMA.names)
    )


def staged_files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*.parquet") if not any(x.startswith(("_", ".")) for x in p.parts)]


def files_of(directory: Path, segments: set[str]) -> list[Path]:
    """The staged files holding rows of ``segments`` (each holds one segment's rows: its footer says which)."""
    import pyarrow.parquet as pq

    out = []
    for path in staged_files(directory):
        md = pq.ParquetFile(path).metadata
        col = next(i for i in range(md.num_columns) if md.schema.column(i).path == "segment")
        names = set()
        for rg in range(md.num_row_groups):
            st = md.row_group(rg).column(col).statistics
            if st is None or not st.has_min_max:
                raise StagingError(f"{path}: no statistics for the segment column")
            names |= {st.min, st.max}
        if len(names) > 1:
            raise StagingError(f"{path}: rows of segments {sorted(names)} in one staged file")
        if names & segments:
            out.append(path)
    return out
