"""Delta tables of the tier through delta-rs (no Spark): idempotent commits, snapshots, reads on the driver.
Spark's side (session settings, reads, SQL tables) is :mod:`pipelines.spark_tables`.

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
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa

from lake import objectstore
from lake.reader import file_unreadable_reason
from store.errors import MQLakeError

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction, RemoveAction

TABLE_PROPERTIES: dict[str, str] = {
    "delta.logRetentionDuration": "interval 30 days",
    "delta.deletedFileRetentionDuration": "interval 7 days",
    "delta.checkpointInterval": "10",
}
_STATS_STRING_LIMIT = 32  # longer strings get no min/max: a truncated max would be below the real one


class LakeError(MQLakeError, RuntimeError):
    """A Delta table this module cannot read or commit to as asked."""


def _uri(table_uri: str | Path) -> str:
    return str(table_uri)


def open_table(table_uri: str | Path, version: int | None = None) -> DeltaTable:
    """A delta-rs handle on the table (local or ``s3://``: lake/objectstore.py)."""
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
    if isinstance(value, bytes | bytearray | Decimal):
        return None  # Delta wants a decimal bound as a JSON number of its scale: left out rather than risked
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
        actions: list[AddAction | RemoveAction] = [*adds]
        dt.create_write_transaction(
            actions, mode="append", schema=schema, partition_by=partition_by or None, commit_properties=props
        )
        return _version_with_txn(uri, app_id, version, before)


def append_arrow(table_uri: str, table: pa.Table, *, app_id: str, version: int) -> int | None:
    """Append a small driver-side table as one parquet file, committed through commit_files (so the
    same txn check, table properties and commit path as the Spark-written data)."""
    import pyarrow.parquet as pq

    remote = objectstore.is_remote(table_uri)
    if remote:  # written locally (its stats come from the footer), uploaded, then committed
        recorded = transaction_version(table_uri, app_id)
        if recorded is not None and version <= recorded:
            return None
        root = objectstore.local_staging_root() / f"append-{uuid.uuid4().hex}"
    else:
        root = Path(table_uri)
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"part-{uuid.uuid4().hex}.parquet"
    try:
        pq.write_table(table, path)
        adds = add_actions(root, [path])
        if remote:
            objectstore.upload([path], root, table_uri)
        committed = commit_files(
            table_uri, adds, schema=table.schema, partition_by=[], app_id=app_id, version=version
        )
    finally:
        if remote:
            shutil.rmtree(root, ignore_errors=True)
    if committed is None and not remote:
        path.unlink(missing_ok=True)  # already committed by an earlier attempt: this copy is not needed
    return committed


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
    removes: list[AddAction | RemoveAction] = [
        RemoveAction(a.path, True, now, a.size, dict(a.partition_values)) for a in adds
    ]
    props = CommitProperties(custom_metadata={k: str(v) for k, v in (metadata or {}).items()} or None)
    with objectstore.reaching(uri, f"removing {len(removes)} file(s) from the Delta table"):
        open_table(uri).create_write_transaction(
            removes, mode="append", schema=schema, partition_by=partition_by or None, commit_properties=props
        )


def sql_text(value: str) -> str:
    """``value`` as a SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def _check_partitioning(dt: DeltaTable, partition_by: list[str], uri: str) -> None:
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


def _raw_readable(table_uri: str | Path, version: int | None) -> DeltaTable:
    """The delta-rs handle of a snapshot whose data files hold exactly its rows (no deletion vector, no column
    mapping): for the readers that take its parquet files as they are (the tier's verify digests them, delta-rs
    reads them on the driver)."""
    uri = _uri(table_uri)
    if not is_table(uri):
        raise LakeError(f"{uri} is not a Delta table (no _delta_log)")
    dt = open_table(uri, version=version)
    reason = file_unreadable_reason(dt)
    if reason:
        raise LakeError(f"{uri}: {reason}: its data files alone do not give its rows; read it with Spark (read_table)")
    return dt


def snapshot_files(table_uri: str | Path, version: int | None = None) -> pa.Table:
    """The add actions of the table at ``version`` (default latest), flattened (``partition.<c>``, ``min.<c>``,
    ``max.<c>``, ...), with ``path`` made a location to read; refused for a table whose files alone do not
    give its rows (deletion vectors, column mapping)."""
    uri = _uri(table_uri)
    actions = pa.table(_raw_readable(uri, version).get_add_actions(flatten=True))
    locations = pa.array([file_location(uri, p) for p in actions["path"].to_pylist()], pa.string())
    return actions.set_column(actions.schema.get_field_index("path"), "path", locations)


def table_schema(table_uri: str | Path, version: int | None = None) -> pa.Schema:
    """The table's (logical) schema from the Delta log, as Arrow."""
    uri = _uri(table_uri)
    if not is_table(uri):
        raise LakeError(f"{uri} is not a Delta table (no _delta_log)")
    return pa.schema(open_table(uri, version=version).schema().to_arrow())


def file_location(root: str, path: str) -> str:
    """An add action's path (URI-encoded, relative to the root unless absolute) as a location to read."""
    if "://" in path:
        return path
    return f"{root.rstrip('/')}/{unquote(path)}"


def table_name(name: str) -> str:
    """A directory's name as a SQL name: characters other than letters, digits and ``_`` become ``_``."""
    return re.sub(r"\W", "_", name)


def lake_tables(lake_root: str | Path) -> list[tuple[str, str]]:
    """(SQL name, location) of each Delta table directly under ``lake_root``."""
    if objectstore.is_remote(lake_root):
        root = _uri(lake_root)
        found = [(name, objectstore.join(root, name)) for name in objectstore.child_dirs(root)]
    else:
        local = Path(_uri(lake_root))
        if not local.is_dir():
            raise LakeError(f"lake directory {local} does not exist")
        found = [(d.name, str(d.absolute())) for d in sorted(p for p in local.iterdir() if p.is_dir())]
    return [(table_name(name), uri) for name, uri in found if is_table(uri)]


def to_arrow(table_uri: str | Path, filter: Any = None, version: int | None = None) -> pa.Table:
    """A small table read on the driver (delta-rs, no Spark); ``filter`` as deltalake's ``filters``
    (DNF tuples like ``[("topic", "=", "T")]``) or a pyarrow dataset expression.  Refused (LakeError) for a table
    delta-rs cannot read right (deletion vectors, column mapping)."""
    dt = _raw_readable(table_uri, version)
    with objectstore.reaching(_uri(table_uri), "reading the Delta table"):
        return pa.table(dt.to_pyarrow_table(filters=filter))


def scan_batches(
    table_uri: str | Path, columns: Sequence[str], filter: Any = None, version: int | None = None
) -> Iterator[pa.RecordBatch]:
    """The table's rows at ``version`` (default latest) as a stream of batches of ``columns``, ``filter`` a
    pyarrow dataset expression (partitions pruned by it): for reads larger than the driver's memory.  Refused
    as :func:`to_arrow` is."""
    dt = _raw_readable(table_uri, version)
    with objectstore.reaching(_uri(table_uri), "reading the Delta table"):
        yield from dt.to_pyarrow_dataset().to_batches(columns=list(columns), filter=filter)


def file_count(table_uri: str | Path) -> int:
    return len(open_table(table_uri).file_uris())


__all__ = [
    "TABLE_PROPERTIES",
    "LakeError",
    "add_actions",
    "append_arrow",
    "commit_files",
    "file_count",
    "file_location",
    "file_stats",
    "is_table",
    "lake_tables",
    "open_table",
    "partition_values_from_path",
    "scan_batches",
    "snapshot_files",
    "table_name",
    "table_schema",
    "to_arrow",
    "transaction_version",
]
