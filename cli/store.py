"""``mqlake store``: read a store's files (``dump``) and install rebuilt indexes into it (``adopt-index``)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from pipelines.index_rebuild.cli import adopt_index_command
from store.console import console, print_error, table

store_app = typer.Typer(help="Inspect and verify native store files; install rebuilt indexes.", no_args_is_help=True)


@store_app.command("dump")
def dump(
    store_dir: Annotated[Path, typer.Argument(help="Store root (or its commitlog directory).")],
    json_lines: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table.")] = False,
    verify: Annotated[bool, typer.Option(help="Check CRC, offsets, lengths and ConsumeQueue units.")] = False,
    consume_queue: Annotated[bool, typer.Option("--consume-queue", help="Print ConsumeQueue units.")] = False,
    index: Annotated[bool, typer.Option("--index", help="Print IndexFile headers.")] = False,
    topic: Annotated[str | None, typer.Option(help="Only this topic.")] = None,
    limit: Annotated[int | None, typer.Option(help="Print at most this many rows.")] = None,
) -> None:
    """Print a store's records (like kafka-dump-log); --verify exits 1 naming each bad file and position.

    Entries of the store dir that are not store files are skipped and reported (on stderr when listing); a file
    that cannot be read ends the command with one error line naming it (exit 2).
    """
    from store.dump import Problem, iter_cq_units, iter_index_headers, iter_records, verify_store

    out = console()
    odd: list[Problem] = []

    def emit(rows: Iterable[dict], title: str, columns: list[str]) -> None:
        shown = rows if limit is None else itertools.islice(rows, limit)
        if json_lines:
            for r in shown:
                print(json.dumps(r, default=str))
            return
        t = table(*columns, title=title)
        for r in shown:
            t.add_row(*(str(r.get(c, "")) for c in columns))
        out.print(t)

    try:
        if not store_dir.exists():
            print_error(f"no such store directory: {store_dir}")
            raise typer.Exit(2)
        if verify:
            checked, problems = verify_store(store_dir)
            for p in problems:
                print(json.dumps(asdict(p)) if json_lines else str(p))
            if not json_lines:
                out.print(f"{checked} records checked, {len(problems)} problem(s)")
            raise typer.Exit(1 if problems else 0)

        if consume_queue:
            units = (u for u in iter_cq_units(store_dir, odd) if topic is None or u["topic"] == topic)
            emit(units, "ConsumeQueue", ["topic", "queue_id", "queue_offset", "commitlog_offset", "size", "tags_code"])
        if index:
            cols = ["file", "begin_timestamp", "end_timestamp", "begin_phy_offset", "end_phy_offset"]
            emit(iter_index_headers(store_dir, odd), "IndexFile headers", cols + ["hash_slot_count", "index_count"])
        if not consume_queue and not index:
            records = (r for r in iter_records(store_dir, odd=odd)
                       if isinstance(r, dict) and (topic is None or r["topic"] == topic))  # fmt: skip
            emit(records, "CommitLog", ["offset", "topic", "queue_id", "queue_offset", "keys", "tags", "size",
                                        "crc_ok"])  # fmt: skip
    except OSError as e:  # unreadable (permissions), vanished, a name the file system refuses
        print_error(f"{e.filename or store_dir}: cannot read: {e.strerror or e}")
        raise typer.Exit(2) from None
    for p in odd:
        print_error(f"skipped {p}")


# The repair's install step lives with verify-index (pipelines/index_rebuild/), which writes what it installs.
store_app.command("adopt-index")(adopt_index_command)
