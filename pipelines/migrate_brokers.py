"""``mqlake tier-migrate``: give a lake tiered before the broker column its ``broker_name``, once.

A lake written when one store fed it has ``messages`` partitioned by (topic, store_date) and ``segments``
without ``broker_name``.  Delta cannot add a partition column in place, so the migration rewrites each table
in ONE overwrite commit (delta-rs ``schema_mode="overwrite"``), every row getting the broker name given:

- readers keep their snapshot (the old files stay on disk, removed from the new version only, until vacuum
  passes ``delta.deletedFileRetentionDuration``), and a migration that dies before its commit changed nothing;
- ``replay_progress`` gets ``source_broker`` the same way (a replay started before can then resume);
- the tier's transaction ids (``mqlake-tier:<store id>``) stay in the log, so a re-run after the migration
  still skips what was committed before it.

The lake may be local or on S3 (``--lake s3://bucket/prefix``, settings from the AWS variables as every job
reads them, lake/objectstore.py): each overwrite is a conditional-put commit like the tier's, so a
writer that slipped in meanwhile makes the migration fail with a conflict rather than be overwritten.

Run it with no tier job or broker writing to the lake (the broker only reads it; it serves local data alone
until the migration commits, see lake/reader.py).  A table already migrated is left alone, so a second
run does nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from store.console import console, print_error, run_app

MIGRATION = "mqlake.migration"


def _rows(uri: str, schema, column: str, broker_name: str):
    """The snapshot's rows, file by file, with ``column`` = ``broker_name`` and the old partition values as
    columns, in ``schema``.  The file list is read from the Delta log now; the generator then reads the files with
    plain pyarrow, because it runs inside delta-rs's writer, which must not be re-entered."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lake import delta as lk
    from lake import objectstore
    from lake.delta import file_location

    dt = lk.open_table(uri)
    actions = pa.table(dt.get_add_actions(flatten=True))
    parts = list(dt.metadata().partition_columns)
    files = [
        (file_location(uri, rel), {c: actions[f"partition.{c}"][i].as_py() for c in parts})
        for i, rel in enumerate(actions["path"].to_pylist())
    ]

    def read():
        for path, values in files:
            fs, where = objectstore.filesystem(path)  # a lake on S3 too
            data = pq.read_table(where, filesystem=fs)
            n = data.num_rows
            if n == 0:
                continue
            cols = {name: data.column(name) for name in data.column_names}
            for c, value in values.items():
                cols[c] = pa.array([value] * n).cast(schema.field(c).type)
            cols[column] = pa.array([broker_name] * n, pa.string())
            yield from pa.table([cols[f.name].cast(f.type) for f in schema], schema=schema).to_batches()

    return read()


def _rewrite(uri: str, schema, column: str, partition_by: list[str] | None, broker_name: str,
             row_group_rows: int | None) -> int:  # fmt: skip
    """Overwrite the table at ``uri`` with its rows plus ``column`` = ``broker_name``; returns the rows."""
    import pyarrow as pa
    from deltalake import CommitProperties, WriterProperties, write_deltalake

    rows = 0
    batches = _rows(uri, schema, column, broker_name)  # reads the Delta log now, outside the writer

    def counted():
        nonlocal rows
        for b in batches:
            rows += b.num_rows
            yield b

    from lake import objectstore

    with objectstore.reaching(uri, "migrating the table"):
        write_deltalake(
            uri, pa.RecordBatchReader.from_batches(schema, counted()), mode="overwrite", schema_mode="overwrite",
            partition_by=partition_by,
            writer_properties=WriterProperties(max_row_group_size=row_group_rows) if row_group_rows else None,
            commit_properties=CommitProperties(custom_metadata={MIGRATION: f"broker_name={broker_name}"}),
            storage_options=objectstore.storage_options(uri),
        )  # fmt: skip
    return rows


def migrate(lake: Path | str, broker_name: str) -> dict[str, Any]:
    """Migrate the tier tables under ``lake`` that lack the broker column; returns what was done, per table."""
    from lake import delta as lk
    from lake import tables
    from lake.broker_names import BrokerNameError, missing_broker_column
    from lake.schema import MESSAGES_SCHEMA, SEGMENTS_SCHEMA
    from pipelines.replay import progress

    if not broker_name:
        raise BrokerNameError("the broker name is empty")
    old = set(missing_broker_column(lake))
    replays = progress.table_uri(lake, progress.PROGRESS)
    if lk.is_table(replays) and "source_broker" not in lk.table_schema(replays).names:
        old.add(replays)
    out: dict[str, Any] = {}
    for name, schema, column, parts, group_rows in (
        (tables.MESSAGES, MESSAGES_SCHEMA, tables.BROKER_NAME, tables.MESSAGES_PARTITION_BY,
         tables.ROW_GROUP_ROWS),
        (tables.SEGMENTS, SEGMENTS_SCHEMA, tables.BROKER_NAME, None, None),
        (progress.PROGRESS, progress.PROGRESS_SCHEMA, "source_broker", None, None),
    ):  # fmt: skip
        uri = tables.table_uri(lake, name)
        if uri not in old:
            out[name] = {"migrated": False}
            continue
        rows = _rewrite(uri, schema, column, parts, broker_name, group_rows)
        out[name] = {"migrated": True, "rows": rows, "version": _version(uri)}
    return out


def _version(uri: str) -> int:
    from lake import delta as lk

    return lk.open_table(uri).version()


def migrate_command(
    lake: Annotated[
        str, typer.Option("--lake", help="Lake root tiered before the broker column (directory or s3://bucket/prefix).")
    ],
    broker_name: Annotated[
        str, typer.Option("--broker-name", help="brokerName of the broker whose store was tiered there.")
    ],
) -> None:
    """Give a lake tiered before several brokers its broker_name column (one overwrite commit per table)."""
    import json

    from lake.broker_names import BrokerNameError
    from lake.objectstore import ObjectStoreError, exists, is_remote
    from pipelines.objectstore_cli import lake_option

    root = lake_option(lake)
    try:
        if not (exists(root) if is_remote(root) else Path(root).is_dir()):
            raise typer.BadParameter(f"{root} is not a directory" + (" (no object under it)" if is_remote(root)
                                     else ""), param_hint="--lake")  # fmt: skip
        done = migrate(root, broker_name)
    except BrokerNameError as e:
        print_error(str(e))
        raise typer.Exit(2) from None
    except ObjectStoreError as e:
        print_error(str(e))
        raise typer.Exit(1) from None
    console().print(json.dumps(done))


def main() -> None:
    app = typer.Typer(add_completion=False)
    app.command()(migrate_command)
    run_app(app)
