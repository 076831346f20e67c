"""Delta tables of the tier: idempotent commits through delta-rs, reads and Spark SQL views over a snapshot.

Spark tasks write the parquet data files; :func:`commit_files` makes them visible in one Delta commit
carrying a transaction id ``(app_id, version)``, after checking that id was not committed already
(delta-rs records the ``txn`` action but does not refuse a repeat by itself).

Table properties set on every table this module creates (:data:`TABLE_PROPERTIES`), deliberately:

- ``delta.logRetentionDuration = interval 30 days``: how far back time travel (``read_table(version=)``)
  and the audit of a tiering run reach; the log is small (one commit per tiered batch).
- ``delta.deletedFileRetentionDuration = interval 7 days``: a file removed by compaction stays on disk
  for a week before vacuum may delete it, far longer than any query or tiering run holds a snapshot.
- ``delta.checkpointInterval = 10``: a checkpoint every 10 commits keeps opening the table cheap.
- ``delta.setTransactionRetentionDuration`` is left UNSET, so transaction ids never expire: the id of a
  segment's commit must outlive any retry, however late (a quarantined segment repaired months later
  must still not be committed twice).  There is one id per tiered segment, so the set stays small.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa

from broker.lake import objectstore
from store.errors import MQLakeError

if TYPE_CHECKING:
    from deltalake.transaction import AddAction
    from pyspark.sql import DataFrame, SparkSession

TABLE_PROPERTIES: dict[str, str] = {
    "delta.logRetentionDuration": "interval 30 days",
    "delta.deletedFileRetentionDuration": "interval 7 days",
    "delta.checkpointInterval": "10",
}
UNSUPPORTED_READER_FEATURES = ("deletionVectors", "columnMapping")
_STATS_STRING_LIMIT = 32  # longer strings get no min/max: a truncated max would be below the real one


class LakeError(MQLakeError, RuntimeError):
    """A Delta table this module cannot read or commit to as asked."""


def _uri(table_uri: str | Path) -> str:
    return str(table_uri)


def open_table(table_uri: str | Path, version: int | None = None):
    """A delta-rs handle on the table (local or ``s3://``: broker/lake/objectstore.py)."""
    from deltalake import DeltaTable

    uri = _uri(table_uri)
    with objectstore.reaching(uri, "opening the Delta table"):
        return DeltaTable(uri, version=version, storage_options=objectstore.storage_options(uri))


def is_table(table_uri: str | Path) -> bool:
    from deltalake import DeltaTable

    uri = _uri(table_uri)
    with objectstore.reaching(uri, "opening the Delta table"):
        return DeltaTable.is_deltatable(uri, storage_options=objectstore.storage_options(uri))


def transaction_version(table_uri: str | Path, app_id: str) -> int | None:
    """The last version committed under ``app_id`` (None: never, or no table yet)."""
    if not is_table(table_uri):
        return None
    return open_table(table_uri).transaction_version(app_id)


# =====================================================================================================
# Add actions for files written by Spark tasks
# =====================================================================================================


_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
# the characters Spark escapes in a partition directory name (ExternalCatalogUtils.escapePathName)
_PATH_ESCAPED = frozenset("\"#%'*/:=?\\{[]^\x7f") | frozenset(map(chr, range(1, 32)))


def partition_values_from_path(rel_path: str, partition_by: Sequence[str]) -> dict[str, str | None]:
    """``k=v`` directories of a Hive-style path (Spark escapes values as ``%XX``) -> partition values."""
    found: dict[str, str | None] = {}
    for part in rel_path.split("/")[:-1]:
        key, sep, value = part.partition("=")
        if sep:
            raw = unquote(value)
            found[unquote(key)] = None if raw == _HIVE_NULL else raw
    missing = [c for c in partition_by if c not in found]
    if missing:
        raise LakeError(f"{rel_path}: no directory for partition column(s) {', '.join(missing)}")
    return {c: found[c] for c in partition_by}


def partition_path(values: Mapping[str, Any]) -> str:
    """The ``k=v/k=v`` directories of a row with partition ``values``, escaped as Spark names them (the
    inverse of :func:`partition_values_from_path`)."""

    def esc(text: str) -> str:
        return "".join(f"%{ord(c):02X}" if c in _PATH_ESCAPED else c for c in text)

    return "/".join(f"{esc(k)}={_HIVE_NULL if v is None else esc(str(v))}" for k, v in values.items())


def _stat_value(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return None  # left out: Delta wants its own timestamp text, and a wrong bound would skip real rows
    if isinstance(value, str) and len(value) > _STATS_STRING_LIMIT:
        return None
    if isinstance(value, bytes | bytearray):
        return None
    return value


def file_stats(path: str | Path, skip_columns: Sequence[str] = ()) -> str:
    """Delta ``stats`` JSON from a parquet footer: numRecords and, per top-level primitive column,
    minValues / maxValues / nullCount (a bound is left out where any row group lacks it)."""
    import pyarrow.parquet as pq

    md = pq.ParquetFile(path).metadata
    schema = md.schema.to_arrow_schema()
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    leaf_of = {}
    for i in range(md.num_columns):
        col = md.schema.column(i)
        name = col.path
        if "." in name or name in skip_columns:
            continue  # nested (maps, structs): no stats
        field = schema.field(name)
        if pa.types.is_nested(field.type):
            continue
        leaf_of[name] = i
    for name, i in leaf_of.items():
        lo = hi = None
        null_count: int | None = 0
        bounds = True
        for rg in range(md.num_row_groups):
            st = md.row_group(rg).column(i).statistics
            if st is None:
                bounds, null_count = False, None
                break
            if st.has_null_count and null_count is not None:
                null_count += st.null_count
            else:
                null_count = None
            if not st.has_min_max:
                if md.row_group(rg).num_rows != (st.null_count if st.has_null_count else -1):
                    bounds = False  # all-null row groups have no bounds, and need none
                continue
            a, b = _stat_value(st.min), _stat_value(st.max)
            if a is None or b is None:
                bounds = False
                continue
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
        if null_count is not None:
            nulls[name] = null_count
        if bounds and lo is not None:
            mins[name], maxs[name] = lo, hi
    return json.dumps(
        {"numRecords": md.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}, separators=(",", ":")
    )


def add_actions(
    table_uri: str | Path,
    files: Sequence[str | Path],
    partition_by: Sequence[str] = (),
    *,
    partition_values: Mapping[str, Mapping[str, str | None]] | None = None,
) -> list[AddAction]:
    """AddActions for parquet files already written under the table root (absolute, or relative to it).

    Partition values come from the ``k=v`` directories unless ``partition_values`` maps a file to them.
    Stats are read from each file's footer, so readers can skip files.
    """
    from deltalake.transaction import AddAction

    root = Path(_uri(table_uri)).resolve()
    out = []
    for f in files:
        p = Path(f)
        p = (p if p.is_absolute() else root / p).resolve()
        try:
            rel = p.relative_to(root).as_posix()
        except ValueError:
            raise LakeError(f"{p} is not under the table root {root}") from None
        st = p.stat()
        given = (partition_values or {}).get(str(f))
        values = dict(given) if given is not None else partition_values_from_path(rel, partition_by)
        out.append(AddAction(rel, st.st_size, values, int(st.st_mtime * 1000), True, file_stats(p, partition_by)))
    return out


# =====================================================================================================
# Commit
# =====================================================================================================


def commit_files(
    table_uri: str | Path,
    adds: list[AddAction],
    *,
    schema: pa.Schema,
    partition_by: list[str],
    app_id: str,
    version: int,
    table_properties: dict[str, str] | None = None,
    metadata: dict[str, Any] | None = None,
) -> int | None:
    """Make ``adds`` visible in one commit carrying ``Transaction(app_id, version)``; create the table
    (with :data:`TABLE_PROPERTIES` and ``table_properties``) when there is none.

    Returns the new table version, or None, committing nothing, when ``app_id`` already recorded
    ``version`` or a later one.  A concurrent commit under the same ``app_id`` fails
    (``deltalake.exceptions.CommitFailedError``) rather than committing twice.
    """
    from deltalake import Schema
    from deltalake.exceptions import DeltaError
    from deltalake.transaction import CommitProperties, Transaction, create_table_with_add_actions

    uri = _uri(table_uri)
    props = CommitProperties(
        custom_metadata={k: str(v) for k, v in (metadata or {}).items()} or None,
        app_transactions=[Transaction(app_id, version)],
    )
    with objectstore.reaching(uri, f"committing {len(adds)} file(s) to the Delta table"):
        if not is_table(uri):
            try:
                create_table_with_add_actions(
                    uri, Schema.from_arrow(schema), adds, mode="error", partition_by=partition_by or None,
                    configuration=TABLE_PROPERTIES | dict(table_properties or {}), commit_properties=props,
                    storage_options=objectstore.storage_options(uri),
                )  # fmt: skip
                return 0
            except DeltaError:
                if not is_table(uri):
                    raise
                # another writer created it first: fall through and append as everyone else does
        dt = open_table(uri)
        recorded = dt.transaction_version(app_id)
        if recorded is not None and version <= recorded:
            return None
        before = dt.version()
        _check_partitioning(dt, partition_by, uri)
        dt.create_write_transaction(
            adds, mode="append", schema=schema, partition_by=partition_by or None, commit_properties=props
        )
        return _version_with_txn(uri, app_id, version, before)


def delete_rows(table_uri: str | Path, predicate: str, *, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """Remove the rows matching ``predicate`` (SQL over the table's columns) in one commit carrying
    ``metadata``; a file all of whose rows match leaves the table whole, without being rewritten.  Returns
    delta-rs's metrics of the delete."""
    from deltalake.transaction import CommitProperties

    uri = _uri(table_uri)
    props = CommitProperties(custom_metadata={k: str(v) for k, v in (metadata or {}).items()} or None)
    with objectstore.reaching(uri, "deleting rows of the Delta table"):
        return dict(open_table(uri).delete(predicate, commit_properties=props))


def remove_files(
    table_uri: str | Path, adds: list[AddAction], *, schema: pa.Schema, partition_by: list[str],
    metadata: dict[str, Any] | None = None,
) -> None:
    """Take the files of ``adds`` (as an earlier commit added them) out of the table in one commit carrying
    ``metadata``, whatever rows they share with other files: a remove action each, so the versions that hold
    them still read them (time travel) and vacuum deletes them once the retention has passed."""
    from deltalake.transaction import CommitProperties, RemoveAction

    uri = _uri(table_uri)
    now = int(time.time() * 1000)
    removes = [RemoveAction(a.path, True, now, a.size, a.partition_values) for a in adds]
    props = CommitProperties(custom_metadata={k: str(v) for k, v in (metadata or {}).items()} or None)
    with objectstore.reaching(uri, f"removing {len(removes)} file(s) from the Delta table"):
        open_table(uri).create_write_transaction(
            removes, mode="append", schema=schema, partition_by=partition_by or None, commit_properties=props
        )


def sql_text(value: str) -> str:
    """``value`` as a SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def _check_partitioning(dt, partition_by: list[str], uri: str) -> None:
    have = list(dt.metadata().partition_columns)
    if have != list(partition_by):
        raise LakeError(f"{uri} is partitioned by {have}, the commit by {partition_by}")


def _version_with_txn(uri: str, app_id: str, version: int, before: int) -> int:
    """The first table version after ``before`` that records our transaction (others may commit meanwhile)."""
    latest = open_table(uri).version()
    for v in range(before + 1, latest + 1):
        recorded = open_table(uri, version=v).transaction_version(app_id)
        if recorded is not None and recorded >= version:
            return v
    return latest


# =====================================================================================================
# Reads
# =====================================================================================================


def delta_available(spark: SparkSession) -> bool:
    """Are the Delta Lake Spark jars on the classpath (then Spark's native ``delta`` format is used)?"""
    try:
        spark.sparkContext._jvm.java.lang.Class.forName("org.apache.spark.sql.delta.sources.DeltaDataSource")
        return True
    except Exception:  # py4j wraps ClassNotFoundException; no JVM access (Spark Connect) also means no
        return False


def _readable_snapshot(table_uri: str | Path, version: int | None):
    uri = _uri(table_uri)
    if not is_table(uri):
        raise LakeError(f"{uri} is not a Delta table (no _delta_log)")
    dt = open_table(uri, version=version)
    proto = dt.protocol()
    features = set(proto.reader_features or ())
    mode = dt.metadata().configuration.get("delta.columnMapping.mode", "none")
    bad = sorted(features & set(UNSUPPORTED_READER_FEATURES)) + (["columnMapping"] if mode != "none" else [])
    if bad or proto.min_reader_version > 3:
        raise LakeError(
            f"{uri}: reader features {sorted(set(bad)) or proto.min_reader_version} need the Delta Lake Spark "
            f"jars; this reader takes the snapshot's parquet files as they are"
        )
    return dt


def snapshot_files(table_uri: str | Path, version: int | None = None) -> pa.Table:
    """The add actions of the table at ``version`` (default latest), flattened (``partition.<c>``, ``min.<c>``,
    ``max.<c>``, ...), with ``path`` made a location to read."""
    uri = _uri(table_uri)
    actions = pa.table(_readable_snapshot(uri, version).get_add_actions(flatten=True))
    locations = pa.array([_file_location(uri, p) for p in actions["path"].to_pylist()], pa.string())
    return actions.set_column(actions.schema.get_field_index("path"), "path", locations)


def table_schema(table_uri: str | Path, version: int | None = None) -> pa.Schema:
    """The table's schema from the Delta log, as Arrow."""
    return pa.schema(_readable_snapshot(table_uri, version).schema().to_arrow())


def read_table(spark: SparkSession, table_uri: str | Path, version: int | None = None) -> DataFrame:
    """The table at ``version`` (default latest): exactly the snapshot's files, columns in table order.

    Without the Delta jars: the files listed by the Delta log (never a directory listing, which would
    also read removed files), the schema from the log, and partition values from the log's add actions
    (not from directory names, so any file layout under the root reads right).
    """
    uri = _uri(table_uri)
    if delta_available(spark):
        reader = spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(uri)
    from pyspark.sql import functions as F

    from pipelines.schema import spark_schema

    dt = _readable_snapshot(uri, version)
    arrow_schema = pa.schema(dt.schema().to_arrow())
    schema = spark_schema(arrow_schema)
    parts = list(dt.metadata().partition_columns)
    actions = pa.table(dt.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return spark.createDataFrame([], schema)
    files = [_file_location(uri, p) for p in actions["path"].to_pylist()]
    if objectstore.is_remote(uri):  # no S3A jars: a Python data source reads the files over pyarrow's S3
        from pipelines import remote_snapshot

        return remote_snapshot.read(spark, _snapshot_files(actions, files, parts, arrow_schema), arrow_schema, schema)
    data_schema = spark_schema(pa.schema([f for f in arrow_schema if f.name not in parts]))
    reader = spark.read.schema(data_schema)
    if not parts:
        return reader.parquet(*files).select(*schema.names)
    names = [f.rsplit("/", 1)[-1] for f in files]
    values = pa.table({"__file": pa.array(names)} | {c: actions[f"partition.{c}"] for c in parts})
    if len(set(names)) == len(names) and all(_PLAIN_NAME.fullmatch(n) for n in names):
        # Each row learns its partition values from its file's add action: one broadcast join on the name.
        data = reader.parquet(*files).withColumn("__file", F.col("_metadata.file_name"))
        df = data.join(F.broadcast(spark.createDataFrame(values)), "__file")
    else:  # names that repeat or need escaping: one scan per partition, values as literals
        df = None
        for key, group in _group_files(values, files, parts).items():
            scan = reader.parquet(*group).select(
                "*", *(F.lit(v).cast(schema[c].dataType).alias(c) for c, v in zip(parts, key, strict=True))
            )
            df = scan if df is None else df.unionByName(scan)
    return df.select(*(F.col(f.name).cast(f.dataType) for f in schema.fields))  # table order and types


_PLAIN_NAME = re.compile(r"[A-Za-z0-9._-]+")


def _snapshot_files(actions: pa.Table, files: list[str], parts: list[str], schema: pa.Schema) -> list:
    """The add actions as ``remote_snapshot.SnapshotFile``: partition values as text, and the min/max statistics
    of the columns the data source prunes on."""
    from pipelines.remote_snapshot import SnapshotFile, prunable_by_stats

    values = {c: actions[f"partition.{c}"].to_pylist() for c in parts}
    stats = {f.name: (actions[f"min.{f.name}"].to_pylist(), actions[f"max.{f.name}"].to_pylist()) for f in schema
             if f.name not in parts and prunable_by_stats(f.type) and f"min.{f.name}" in actions.column_names
             and f"max.{f.name}" in actions.column_names}  # fmt: skip
    return [
        SnapshotFile(
            uri,
            {c: None if v[i] is None else str(v[i]) for c, v in values.items()},
            {c: (lo[i], hi[i]) for c, (lo, hi) in stats.items() if lo[i] is not None and hi[i] is not None},
        )
        for i, uri in enumerate(files)
    ]


def _file_location(root: str, path: str) -> str:
    """An add action's path (URI-encoded, relative to the root unless absolute) as a location to read."""
    if "://" in path:
        return path
    return f"{root.rstrip('/')}/{unquote(path)}"


def _group_files(values: pa.Table, files: list[str], parts: list[str]) -> dict[tuple, list[str]]:
    groups: dict[tuple, list[str]] = {}
    cols = [values[c].to_pylist() for c in parts]
    for i, f in enumerate(files):
        groups.setdefault(tuple(col[i] for col in cols), []).append(f)
    return groups


def _view_name(name: str) -> str:
    return re.sub(r"\W", "_", name)


def register(spark: SparkSession, lake_root: str | Path) -> list[str]:
    """A temp view per Delta table directly under ``lake_root`` (``messages``, ``segments``,
    ``quality_results``, ...), over its current snapshot; returns the view names.

    A view keeps the snapshot it was made on: call again to see later commits.
    """
    if objectstore.is_remote(lake_root):
        root = _uri(lake_root)
        tables = [(name, objectstore.join(root, name)) for name in objectstore.child_dirs(root)]
    else:
        local = Path(_uri(lake_root))
        if not local.is_dir():
            raise LakeError(f"lake directory {local} does not exist")
        tables = [(d.name, str(d)) for d in sorted(p for p in local.iterdir() if p.is_dir())]
    names = []
    for dir_name, uri in tables:
        if not is_table(uri):
            continue
        name = _view_name(dir_name)
        read_table(spark, uri).createOrReplaceTempView(name)
        names.append(name)
    return names


def to_arrow(table_uri: str | Path, filter: Any = None, version: int | None = None) -> pa.Table:
    """A small table read on the driver (delta-rs, no Spark); ``filter`` as deltalake's ``filters``
    (DNF tuples like ``[("topic", "=", "T")]``) or a pyarrow dataset expression."""
    if not is_table(table_uri):
        raise LakeError(f"{table_uri} is not a Delta table (no _delta_log)")
    dt = open_table(table_uri, version=version)
    with objectstore.reaching(_uri(table_uri), "reading the Delta table"):
        return pa.table(dt.to_pyarrow_table(filters=filter))


def file_count(table_uri: str | Path) -> int:
    return len(open_table(table_uri).file_uris())


__all__ = [
    "TABLE_PROPERTIES",
    "LakeError",
    "add_actions",
    "commit_files",
    "delta_available",
    "file_count",
    "file_stats",
    "is_table",
    "open_table",
    "partition_values_from_path",
    "read_table",
    "register",
    "snapshot_files",
    "table_schema",
    "to_arrow",
    "transaction_version",
]
