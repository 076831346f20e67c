"""The rows a replay sends: the Delta ``messages`` table UNION the live CommitLog, filtered.

No row twice, and which live store is whose: pipelines/history.py holds the rules (each store's manifest read
before the lake's snapshot; ``tiered`` and ``deleted`` segments not read live; a record is (broker, topic, queue
id, queue offset)).  What overlap remains (a segment tiered between the manifest read and the lake snapshot) is
dropped by the sender, which walks each source queue in queue-offset order and skips any offset it has seen (a
dedupe that needs no extra shuffle).  Live stores: ``--store-dir`` named by ``--broker-name``, and every
``--broker-store NAME=PATH`` (ReplaySpec.live_stores).

Pushdown: the lake side filters on its partition columns (topic, store_date) and on store_timestamp (parquet
row-group skipping); whole files are not pruned because spark_tables.read_table takes no partition filter (it joins
partition values to rows by file name).  The live side skips whole segments whose store times (from the
segment manifest) fall outside --from/--to.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pipelines.history import live_frame, live_segments
from pipelines.replay.spec import ReplaySpec, ReplaySpecError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

# What the sender needs of the canonical schema (lake/schema.py), and the broker the row comes from.
COLUMNS = [
    "broker_name", "topic", "queue_id", "queue_offset", "msg_id", "uniq_key", "tags", "keys", "properties", "body",
    "born_timestamp", "store_timestamp", "flag", "sys_flag",
]  # fmt: skip


def utc_date(ms: int):
    return datetime.fromtimestamp(ms / 1000, UTC).date()


def _time_range(spec: ReplaySpec) -> Column | None:
    from pyspark.sql import functions as F

    cond = None
    if spec.from_ms is not None:
        cond = F.col("store_timestamp") >= F.lit(spec.from_ms)
    if spec.to_ms is not None:
        upper = F.col("store_timestamp") < F.lit(spec.to_ms)
        cond = upper if cond is None else cond & upper
    return cond


def _lake_frame(spark: SparkSession, spec: ReplaySpec) -> DataFrame | None:
    from pyspark.sql import functions as F

    from lake import tables
    from pipelines import spark_tables

    uri = spec.lake_messages()
    if uri is None:
        return None
    df = spark_tables.read_table(spark, uri).where(F.col("topic").isin(list(spec.source_topics)))
    if spec.from_ms is not None:
        df = df.where(F.col(tables.STORE_DATE) >= F.lit(utc_date(spec.from_ms)))
    if spec.to_ms is not None:
        df = df.where(F.col(tables.STORE_DATE) <= F.lit(utc_date(spec.to_ms - 1)))
    return df.select(*COLUMNS)


def _live_frames(spark: SparkSession, spec: ReplaySpec) -> list[DataFrame]:
    """One frame per live store with segments to read, its rows named by the store's broker."""
    from pyspark.sql import functions as F

    frames = []
    for broker, store_dir in spec.live_stores():
        bases = live_segments(store_dir, spec.from_ms, spec.to_ms)
        if not bases:
            continue
        df = live_frame(spark, broker, store_dir, bases)
        frames.append(df.where(F.col("topic").isin(list(spec.source_topics))).select(*COLUMNS))
    return frames


def source_frame(spark: SparkSession, spec: ReplaySpec) -> DataFrame:
    """Every selected row of both sources (duplicates between them still possible, see the module docstring)."""
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    from lake.schema import MESSAGES_SCHEMA, spark_schema

    live = _live_frames(spark, spec)  # the manifests first: see the module docstring
    lake = _lake_frame(spark, spec)
    frames = ([lake] if lake is not None else []) + live
    if frames:
        df = frames[0]
        for f in frames[1:]:
            df = df.unionByName(f)
    else:
        df = spark.createDataFrame([], spark_schema(MESSAGES_SCHEMA)).select(*COLUMNS)
    cond = _time_range(spec)
    if cond is not None:
        df = df.where(cond)
    if spec.tags:
        df = df.where(F.col("tags").isin(list(spec.tags)))
    if spec.keys:
        keys = F.split(F.coalesce(F.col("keys"), F.lit("")), " ")
        df = df.where(F.arrays_overlap(keys, F.array(*(F.lit(k) for k in spec.keys))))
    if spec.where:
        try:
            df = df.where(F.expr(spec.where))
            df.schema  # noqa: B018 - analysis happens here: a bad column fails now, not inside a task
        except PySparkException as e:
            raise ReplaySpecError(f"--where {spec.where!r} is not a valid predicate over {COLUMNS}: {e}") from None
    return df
