"""Spark reads of a Delta snapshot on object storage without Hadoop's S3A jars (Maven cannot be reached here).

``lake.read_table`` lists the snapshot's files, their partition values and their column statistics from the
Delta log (delta-rs, on the driver) and hands them to this Python data source (``mqlake_delta_files``): each
Spark task opens its files through pyarrow's ``S3FileSystem`` and yields their row batches with the partition
columns filled in from the log.  Exactly the snapshot's files are read (never a listing, which would also find
removed files), as the local path does.

Pruning.  The filters Spark pushes down (``=``, ``IN``, ``<``, ``<=``, ``>``, ``>=`` against a literal: the
broker / topic / store date partitions, queue-offset, CommitLog-offset and store-time ranges) skip, at planning,
every file whose partition values or Delta min/max statistics rule it out, and in the tasks every row group
whose Parquet statistics do.  Spark still evaluates every filter on the rows read (a kept row group holds rows
that do not match), so pruning changes what is read, never the result.  Statistics are used for integer and
date columns only: string statistics may be truncated by a writer, which would make them unsafe bounds.

Settings.  No AWS setting is a read option: the relation keeps its options in the query's logical plan, where
whatever inspects the plan sees them, and Spark's redaction (``spark.redaction.regex``) hides ``secret`` and
``token`` names but not the key id.  The driver puts the settings in effect for it into the Python workers'
environment instead (``SparkContext.environment``, which Spark copies into each Python function it ships to the
executors, as ``spark.executorEnv.*`` does at start-up, but kept out of the session's configuration and the UI);
an executor whose driver has none uses its own environment (or an instance role, through the AWS SDK's chain).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

from broker.lake.objectstore import S3Settings, key_of, settings_env

NAME = "mqlake_delta_files"
FILES_PER_TASK = 4  # tier files are tens of MB; a few per task keeps task overhead small and spreads the reads
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"  # off by default; a reader with pushFilters needs it


@dataclass(frozen=True)
class SnapshotFile:
    """One data file of the snapshot: its location, its partition values as the Delta log's text (``None``:
    null) and the log's min/max statistics of its integer and date columns (a column without them is absent)."""

    uri: str
    partition_values: dict[str, str | None]
    stats: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # column -> (min, max)


def read(spark, files: Sequence[SnapshotFile], arrow_schema: pa.Schema, spark_schema):
    """A DataFrame of ``files`` in ``arrow_schema`` (the table's, from its Delta log)."""
    hand_settings(spark, settings_env())
    return (
        spark.read.format(NAME)
        .schema(spark_schema)
        .option("files", json.dumps([[f.uri, f.partition_values, f.stats] for f in files], default=str))
        .option("arrow_schema", base64.b64encode(arrow_schema.serialize().to_pybytes()).decode("ascii"))
        .load()
    )


def hand_settings(spark, env: Mapping[str, str]) -> None:
    """Make ``env`` (the driver's AWS settings) the environment of the Python workers that read snapshots.

    ``SparkContext.environment`` is copied into each Python function when it is made, so the data source is
    registered again (a cheap call: the class is pickled by reference)."""
    environment = spark.sparkContext.environment
    for name in _handed - set(env):  # a setting the driver no longer has must not linger in the workers
        environment.pop(name, None)
    environment.update(env)
    _handed.clear()
    _handed.update(env)
    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(DeltaFilesDataSource)


_handed: set[str] = set()  # the setting names last put into SparkContext.environment


# --------------------------------------------------------------------------------------------------------------
# Pruning


def _typed(value: Any, arrow_type: pa.DataType) -> Any:
    """A partition value or statistic from the Delta log (text or JSON) as the Python value Spark's filters use
    for ``arrow_type``; ``None`` when it is null or of a type not pruned on."""
    if value is None:
        return None
    if pa.types.is_integer(arrow_type):
        return int(value)
    if pa.types.is_date(arrow_type):
        return value if isinstance(value, date) else date.fromisoformat(str(value)[:10])
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return str(value)
    return None


def prunable_by_stats(arrow_type: pa.DataType) -> bool:
    """Are min/max statistics of a column of this type exact bounds (not truncated text)?"""
    return pa.types.is_integer(arrow_type) or pa.types.is_date(arrow_type)


_COMPARE: dict[type, Callable[[Any, Any, Any], bool]] = {
    # (min, max, literal) -> can a row in [min, max] satisfy the filter?
    EqualTo: lambda lo, hi, v: lo <= v <= hi,
    GreaterThan: lambda lo, hi, v: hi > v,
    GreaterThanOrEqual: lambda lo, hi, v: hi >= v,
    LessThan: lambda lo, hi, v: lo < v,
    LessThanOrEqual: lambda lo, hi, v: lo <= v,
    In: lambda lo, hi, values: any(lo <= v <= hi for v in values),
}


@dataclass(frozen=True)
class Bound:
    """A pushed filter on one top-level column, as a test of a value range."""

    column: str
    kind: type
    value: Any

    @classmethod
    def of(cls, f: Filter, schema: pa.Schema) -> Bound | None:
        """The bound ``f`` sets, or None when it is not one this source prunes on."""
        if type(f) not in _COMPARE or len(f.attribute) != 1 or f.attribute[0] not in schema.names:
            return None
        return cls(f.attribute[0], type(f), f.value)  # type: ignore[attr-defined]

    def may_hold(self, lo: Any, hi: Any) -> bool:
        """Can a row whose value lies in [lo, hi] satisfy it?  Unknown or incomparable bounds: yes."""
        if lo is None or hi is None:
            return True
        try:
            return _COMPARE[self.kind](lo, hi, self.value)
        except TypeError:
            return True


def keep_file(f: SnapshotFile, bounds: Sequence[Bound], schema: pa.Schema) -> bool:
    """Can ``f`` hold rows satisfying every bound (by its partition values and Delta statistics)?"""
    for b in bounds:
        arrow_type = schema.field(b.column).type
        if b.column in f.partition_values:
            raw = f.partition_values[b.column]
            if raw is None:
                return False  # a null partition value satisfies no comparison
            value = _typed(raw, arrow_type)
            if not b.may_hold(value, value):
                return False
        elif b.column in f.stats and prunable_by_stats(arrow_type):
            lo, hi = (_typed(v, arrow_type) for v in f.stats[b.column])
            if not b.may_hold(lo, hi):
                return False
    return True


def row_groups_to_read(metadata: Any, bounds: Sequence[Bound], schema: pa.Schema) -> list[int]:
    """The row groups of a Parquet file (its ``FileMetaData``) whose statistics no bound rules out."""
    columns = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
    checks = [(b, columns[b.column]) for b in bounds
              if b.column in columns and prunable_by_stats(schema.field(b.column).type)]  # fmt: skip
    keep = []
    for rg in range(metadata.num_row_groups):
        group = metadata.row_group(rg)
        for b, i in checks:
            stats = group.column(i).statistics
            if stats is not None and stats.has_min_max and not b.may_hold(stats.min, stats.max):
                break
        else:
            keep.append(rg)
    return keep


# --------------------------------------------------------------------------------------------------------------
# The data source


@dataclass
class FileGroup(InputPartition):
    files: list[SnapshotFile]


class DeltaFilesDataSource(DataSource):
    """Reads given parquet files of a Delta snapshot on S3 (options ``files``, ``arrow_schema``)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self):
        raise ValueError(f"the {NAME} source needs the table's schema (DataFrameReader.schema)")

    def reader(self, schema) -> DataSourceReader:
        return DeltaFilesReader(dict(self.options))


class DeltaFilesReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.arrow_schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(options["arrow_schema"])))
        self.files = [SnapshotFile(uri, values, {c: tuple(mm) for c, mm in stats.items()})
                      for uri, values, stats in json.loads(options["files"])]  # fmt: skip
        self.bounds: list[Bound] = []

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:  # noqa: N802 - Spark's name
        """Keep the bounds to prune with; hand every filter back, since Spark must still apply it to the rows of
        the files and row groups that are read."""
        for f in filters:
            bound = Bound.of(f, self.arrow_schema)
            if bound is not None:
                self.bounds.append(bound)
        return filters

    def partitions(self) -> Sequence[InputPartition]:
        files = [f for f in self.files if keep_file(f, self.bounds, self.arrow_schema)]
        return [FileGroup(files[i : i + FILES_PER_TASK]) for i in range(0, len(files), FILES_PER_TASK)]

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        if partition is None:  # every file pruned: Spark plans one empty partition
            return
        fs = S3Settings.from_env().filesystem()
        schema = self.arrow_schema
        for f in partition.files:
            values = f.partition_values
            data = [c.name for c in schema if c.name not in values]
            parquet = pq.ParquetFile(key_of(f.uri), filesystem=fs)
            row_groups = row_groups_to_read(parquet.metadata, self.bounds, schema)
            if not row_groups:
                continue
            for batch in parquet.iter_batches(columns=data, row_groups=row_groups):
                n = batch.num_rows
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array([values[c.name]] * n, pa.string()).cast(c.type)
                        if c.name in values
                        else batch.column(c.name).cast(c.type)
                        for c in schema
                    ],
                    schema=schema,
                )
