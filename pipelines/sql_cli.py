"""``mqlake sql --lake DIR "SELECT ..."``: Spark SQL over the lake's Delta tables, printed as a table, JSON or CSV.
``mqlake sql --lake DIR --shell``: the same in one long-lived Spark session, statement after statement, so only the
first pays the JVM's start-up (docs/delta.md, "The SQL shell").
``--store-dir S`` (repeatable) and ``--broker-store NAME=PATH`` add the view ``messages_all``: the lake's rows and
the live CommitLog's records not yet tiered, each record once (pipelines/history.py), pinned anew before every
statement, so a message stored a moment ago is in the next one (docs/lake.md, "Live and tiered in one view"); and
for each topic with a declared body schema, ``<T>_all`` (T its typed table's SQL name): the same over the typed
table, the live records decoded as the tier decodes them.

Binary columns (``body``) print as base64 in JSON and CSV (``CAST(body AS STRING)`` in the query gives
UTF-8 text instead); maps and structs print as JSON objects; dates and timestamps in ISO 8601 (UTC).
"""

from __future__ import annotations

import base64
import contextlib
import csv
import json
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import date, datetime
from decimal import Decimal
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import typer

from lake import objectstore
from pipelines.history import Store
from pipelines.logs import error_line
from pipelines.objectstore_cli import lake_option
from pipelines.spark import ConfOption, MasterOption, add_spark_options
from store.console import console, table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipelines.history import LiveViews

# A cell's length in a terminal table (a body can be megabytes); outside a terminal cells are printed whole.
TERMINAL_CELL_WIDTH = 60
# The shell's readline history, kept across sessions (as spark-sql's ~/.hivehistory).
HISTORY_FILE = Path("~/.mqlake_sql_history")
HISTORY_LENGTH = 1000
PROMPT = "mqlake-sql> "
CONTINUATION = "         > "
QUIT = {"quit", "exit", "\\q"}
CANCEL = "\x03"  # Ctrl-C at the prompt: the statement under way is dropped


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


def _check_lake(lake: Path | str, limit: int | None, err: TextIO) -> int:
    if not objectstore.is_remote(lake) and not Path(lake).is_dir():
        err.write(f"error: lake directory {lake} does not exist\n")
        return 2
    if limit is not None and limit < 0:
        err.write(f"error: --limit {limit} must not be negative\n")
        return 2
    return 0


def _session(lake: Path | str, master: str | None, conf: dict[str, str] | None, err: TextIO) -> SparkSession | None:
    """The Spark session with the lake's tables registered; None (the reason written to ``err``) when the lake's
    tables cannot be registered."""
    from lake.delta import LakeError
    from pipelines.spark import get_spark
    from pipelines.spark_tables import register

    spark = get_spark(master=master, app_name="mqlake-sql", conf=conf)
    try:
        views = register(spark, lake)
    except LakeError as e:
        err.write(f"error: {e}\n")
        return None
    if not views:
        err.write(f"note: no Delta tables under {lake}; only queries without tables will work\n")
    return spark


def live_stores(
    lake: Path | str, store_dirs: Sequence[Path] = (), broker_stores: Sequence[str] = ()
) -> tuple[Store, ...]:
    """``--store-dir`` (each named by its own broker: pipelines.history.store_broker) and ``--broker-store
    NAME=PATH`` as (broker, store root) pairs, checked: raises ``MQLakeError`` naming the store or broker at fault."""
    from pipelines import history

    named = history.parse_broker_stores(broker_stores)
    stores = [(history.store_broker(lake, Path(p)), Path(p)) for p in store_dirs]
    stores += [(history.store_broker(lake, path, name), path) for name, path in named]
    history.check_stores(stores)
    return tuple(stores)


def _views(lake: Path | str, stores: Sequence[Store], err: TextIO) -> LiveViews | None:
    """The live views over ``stores`` (None without any): ``messages_all`` and each declared topic's ``<T>_all``;
    a declaration that cannot be used is noted on ``err`` and leaves out its own view only."""
    from pipelines.history import LiveViews, declared_topics

    if not stores:
        return None
    typed, skipped = declared_topics(lake)
    for topic, reason in skipped.items():
        err.write(f"note: no live view for topic {topic}: {reason}\n")
    return LiveViews(lake, stores, typed)


def _query(
    spark: SparkSession, query: str, output: OutputFormat, limit: int | None, out: TextIO,
    views: LiveViews | None = None,
) -> int:
    """Run one statement and print its rows; returns how many (Spark's errors propagate).  With the live stores'
    ``views``, the history is pinned first, so the statement sees every record stored before it started."""
    if views is not None:
        views.refresh(spark)
    df = spark.sql(query)
    if limit is not None:
        df = df.limit(limit)
    # JSON and CSV stream partition by partition; a rich table needs every row first
    rows = df.collect() if output == OutputFormat.table else df.toLocalIterator()
    return print_rows(df.columns, rows, output, out)


def run_sql(
    lake: Path | str,
    query: str,
    *,
    output: OutputFormat | str = OutputFormat.table,
    master: str | None = None,
    conf: dict[str, str] | None = None,
    limit: int | None = None,
    stores: Sequence[Store] = (),
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Register the lake's tables as views (and ``messages_all`` over them and the live ``stores``: (broker,
    store root) pairs, see :func:`live_stores`), run ``query``, print the result; returns the exit code
    (0 ok, 1 the query failed, 2 bad arguments)."""
    out = out or sys.stdout
    err = err or sys.stderr
    output = OutputFormat(output)
    if code := _check_lake(lake, limit, err):
        return code
    from pyspark.errors import PySparkException

    from store.errors import MQLakeError

    spark = _session(lake, master, conf, err)
    if spark is None:
        return 2
    try:
        _query(spark, query, output, limit, out, _views(lake, stores, err))
    except (PySparkException, MQLakeError) as e:
        err.write(f"error: {error_line(e)}\n")
        return 1
    return 0


def statements(lines: Iterable[str], buffer: list[str] | None = None) -> Iterator[str]:
    """The shell's statements: lines are joined until one ends with ``;`` (the ``;`` is dropped); ``quit``,
    ``exit`` or ``\\q`` on a line of their own end the input; what is left at the end is a last statement.
    ``buffer`` holds the lines of the statement under way (the prompt shows whether one is); a ``CANCEL`` line
    drops them."""
    buffer = [] if buffer is None else buffer
    for line in lines:
        text = line.strip()
        if line == CANCEL:
            buffer.clear()
            continue
        if not buffer and text.rstrip(";").strip().lower() in QUIT:
            return
        if not text and not buffer:
            continue
        buffer.append(line.rstrip("\n"))
        if text.endswith(";"):
            statement = "\n".join(buffer).strip().rstrip(";").strip()
            buffer.clear()
            if statement:
                yield statement
    rest = "\n".join(buffer).strip()
    buffer.clear()
    if rest:
        yield rest


def _prompted_lines(buffer: list[str]) -> Iterator[str]:
    """Lines typed at a terminal, with readline's editing and history; ``buffer`` (the statement under way)
    chooses the prompt."""
    while True:
        try:
            yield input(CONTINUATION if buffer else PROMPT)
        except EOFError:  # Ctrl-D
            print()
            return
        except KeyboardInterrupt:  # Ctrl-C at the prompt drops the half-typed statement
            print()
            yield CANCEL


def _readline_history() -> Path | None:
    """Load the history file into readline (on a terminal only); returns where to save it, None without readline."""
    try:
        import readline
    except ImportError:  # a Python built without it: plain input() still works
        return None
    path = HISTORY_FILE.expanduser()
    readline.set_history_length(HISTORY_LENGTH)
    with contextlib.suppress(OSError):  # none yet
        readline.read_history_file(path)
    return path


def run_shell(
    lake: Path | str,
    *,
    output: OutputFormat | str = OutputFormat.table,
    master: str | None = None,
    conf: dict[str, str] | None = None,
    limit: int | None = None,
    stores: Sequence[Store] = (),
    lines: Iterable[str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """One Spark session, then statement after statement from ``lines`` (default: a prompt with readline at a
    terminal, else standard input). Each prints its rows, then ``(N rows, T s)`` on ``err``; a failed one prints
    ``error: ...`` in one line and the shell goes on. Returns 0, 1 when a statement failed, 2 for bad arguments."""
    out = out or sys.stdout
    err = err or sys.stderr
    output = OutputFormat(output)
    if code := _check_lake(lake, limit, err):
        return code
    interactive = lines is None and sys.stdin.isatty()
    history = _readline_history() if interactive else None
    if interactive:
        err.write(f"starting Spark for {lake} ...\n")
    spark = _session(lake, master, conf, err)
    if spark is None:
        return 2
    if interactive:
        err.write("statements end with ';'; quit or Ctrl-D leaves\n")
    views = _views(lake, stores, err)
    buffer: list[str] = []
    source: Iterable[str] = lines if lines is not None else (_prompted_lines(buffer) if interactive else sys.stdin)
    failed = False
    try:
        for statement in statements(source, buffer):
            t0 = time.perf_counter()
            try:
                n = _query(spark, statement, output, limit, out, views)
            except KeyboardInterrupt:  # Ctrl-C during a query cancels its jobs, not the session
                spark.sparkContext.cancelAllJobs()
                err.write("cancelled\n")
                continue
            except Exception as e:  # whatever a statement raises, the shell stays up
                failed = True
                err.write(f"error: {error_line(e)}\n")
                continue
            finally:
                out.flush()
            err.write(f"({n} row{'' if n == 1 else 's'}, {time.perf_counter() - t0:.2f} s)\n")
            err.flush()
    finally:
        if history is not None:
            import readline

            with contextlib.suppress(OSError):  # an unwritable home: the session worked, only its history is lost
                readline.write_history_file(history)
    return 1 if failed else 0


def sql_command(
    lake: Annotated[
        str, typer.Option("--lake", help="The lake directory or s3://bucket/prefix (one Delta table per subdirectory).")
    ],
    query: Annotated[
        str | None, typer.Argument(help="Spark SQL over the views messages, segments, quality_results, ...")
    ] = None,
    shell: Annotated[
        bool,
        typer.Option(
            "--shell",
            help="Keep one Spark session and read statements (ending with ';') from a prompt with history, or "
            "from standard input: only the first pays Spark's start-up.",
        ),
    ] = False,
    output: Annotated[OutputFormat, typer.Option("--format", help="table, json (JSON lines) or csv.")] = (
        OutputFormat.table
    ),
    master: MasterOption = None,
    conf: ConfOption = None,
    limit: Annotated[int | None, typer.Option(help="Print at most this many rows (of each statement).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines: the same as --format json.")] = False,
    store_dir: Annotated[
        list[Path] | None,
        typer.Option("--store-dir", help="A broker's store root (repeatable): adds the view messages_all, the "
                     "lake's rows and this store's records not yet tiered, each once, as of each statement, and "
                     "<T>_all the same for each typed table T."),
    ] = None,
    broker_store: Annotated[
        list[str] | None,
        typer.Option("--broker-store", metavar="NAME=PATH", help="A store root with its brokerName, for a store "
                     "that does not record its broker (repeatable); as --store-dir otherwise."),
    ] = None,
) -> None:
    """Run Spark SQL over the tiered history (each Delta table under --lake is a view of its current snapshot),
    and with --store-dir over the live records too (messages_all)."""
    if json_out:
        if output not in (OutputFormat.table, OutputFormat.json):
            raise typer.BadParameter(f"--json and --format {output.value} disagree", param_hint="--json")
        output = OutputFormat.json
    if shell == (query is not None):
        raise typer.BadParameter("give a query or --shell (one of them)", param_hint="QUERY")
    from store.errors import MQLakeError

    lake_root = lake_option(lake)
    try:
        stores = live_stores(lake_root, store_dir or (), broker_store or ())
    except MQLakeError as e:
        raise typer.BadParameter(str(e), param_hint="--store-dir / --broker-store") from None
    spark_options = add_spark_options(master, conf)
    if query is None:
        raise typer.Exit(run_shell(lake_root, output=output, limit=limit, stores=stores, **spark_options))
    raise typer.Exit(run_sql(lake_root, query, output=output, limit=limit, stores=stores, **spark_options))
