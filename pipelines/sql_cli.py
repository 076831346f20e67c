"""``mqlake sql --lake DIR "SELECT ..."``: Spark SQL over the lake's Delta tables, printed as a table, JSON or CSV.

Binary columns (``body``) print as base64 in JSON and CSV (``CAST(body AS STRING)`` in the query gives
UTF-8 text instead); maps and structs print as JSON objects; dates and timestamps in ISO 8601 (UTC).
"""

from __future__ import annotations

import base64
import csv
import json
import sys
from datetime import date, datetime
from decimal import Decimal
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer

from lake import objectstore
from pipelines.objectstore_cli import lake_option
from pipelines.spark import ConfOption, MasterOption, add_spark_options
from store.console import console, table

# A cell's length in a terminal table (a body can be megabytes); outside a terminal cells are printed whole.
TERMINAL_CELL_WIDTH = 60


class OutputFormat(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


def _plain(value: Any) -> Any:
    """A JSON-ready value: bytes as base64, maps/structs as dicts, dates as ISO text."""
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if hasattr(value, "asDict"):  # a struct Row
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _cell(value: Any) -> str:
    """CSV text: scalars as themselves, nested values as JSON, NULL as empty."""
    if value is None:
        return ""
    plain = _plain(value)
    return json.dumps(plain, ensure_ascii=False) if isinstance(plain, dict | list) else str(plain)


def _table_cell(value: Any, width: int | None) -> str:
    if value is None:
        return "NULL"
    text = repr(bytes(value)) if isinstance(value, bytes | bytearray) else _cell(value)
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def print_rows(columns: list[str], rows, output: OutputFormat, out: TextIO) -> int:
    """Write ``rows`` (Spark Rows or tuples) in ``output`` format; returns how many were written."""
    n = 0
    if output == OutputFormat.json:
        for row in rows:
            out.write(json.dumps(dict(zip(columns, map(_plain, row), strict=True)), ensure_ascii=False) + "\n")
            n += 1
    elif output == OutputFormat.csv:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_cell(v) for v in row])
            n += 1
    else:
        printer = console(file=out)
        width = TERMINAL_CELL_WIDTH if printer.is_terminal else None
        result = table(*columns)
        for row in rows:
            result.add_row(*(_table_cell(v, width) for v in row))
            n += 1
        printer.print(result)
    return n


def run_sql(
    lake: Path | str,
    query: str,
    *,
    output: OutputFormat | str = OutputFormat.table,
    master: str | None = None,
    conf: dict[str, str] | None = None,
    limit: int | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Register the lake's tables as views, run ``query``, print the result; returns the exit code
    (0 ok, 1 the query failed, 2 bad arguments)."""
    out = out or sys.stdout
    err = err or sys.stderr
    output = OutputFormat(output)
    if not objectstore.is_remote(lake) and not Path(lake).is_dir():
        err.write(f"error: lake directory {lake} does not exist\n")
        return 2
    if limit is not None and limit < 0:
        err.write(f"error: --limit {limit} must not be negative\n")
        return 2
    from pyspark.errors import PySparkException

    from lake.delta import LakeError
    from pipelines.spark import get_spark
    from pipelines.spark_tables import register

    spark = get_spark(master=master, app_name="mqlake-sql", conf=conf)
    try:
        views = register(spark, lake)
    except LakeError as e:
        err.write(f"error: {e}\n")
        return 2
    if not views:
        err.write(f"note: no Delta tables under {lake}; only queries without tables will work\n")
    try:
        df = spark.sql(query)
        if limit is not None:
            df = df.limit(limit)
        # JSON and CSV stream partition by partition; a rich table needs every row first
        rows = df.collect() if output == OutputFormat.table else df.toLocalIterator()
        print_rows(df.columns, rows, output, out)
    except PySparkException as e:
        err.write(f"error: {e}\n")
        return 1
    return 0


def sql_command(
    query: Annotated[str, typer.Argument(help="Spark SQL over the views messages, segments, quality_results, ...")],
    lake: Annotated[
        str, typer.Option("--lake", help="The lake directory or s3://bucket/prefix (one Delta table per subdirectory).")
    ],
    output: Annotated[OutputFormat, typer.Option("--format", help="table, json (JSON lines) or csv.")] = (
        OutputFormat.table
    ),
    master: MasterOption = None,
    conf: ConfOption = None,
    limit: Annotated[int | None, typer.Option(help="Print at most this many rows.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines: the same as --format json.")] = False,
) -> None:
    """Run Spark SQL over the tiered history (each Delta table under --lake is a view of its current snapshot)."""
    if json_out:
        if output not in (OutputFormat.table, OutputFormat.json):
            raise typer.BadParameter(f"--json and --format {output.value} disagree", param_hint="--json")
        output = OutputFormat.json
    raise typer.Exit(run_sql(lake_option(lake), query, output=output, limit=limit, **add_spark_options(master, conf)))
