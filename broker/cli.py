"""The ``mqlake`` command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(help="A RocketMQ-compatible broker whose store feeds Spark/Delta.", no_args_is_help=True)
store_app = typer.Typer(help="Inspect and verify native store files.", no_args_is_help=True)
app.add_typer(store_app, name="store")

console = Console()


@app.callback()
def _root() -> None:
    """mqlake: a RocketMQ-compatible broker whose store feeds Spark/Delta."""


@app.command()
def up(
    host: Annotated[str, typer.Option(help="Address both servers listen on.")] = "127.0.0.1",
    namesrv_port: Annotated[int, typer.Option(help="NameServer port.")] = 9876,
    broker_port: Annotated[int, typer.Option(help="Broker port.")] = 10911,
    store_dir: Annotated[Path, typer.Option(help="Store root directory.")] = Path(".mqlake/store"),
) -> None:
    """Run a NameServer and a Broker in one process (embedded mode)."""
    console.print("mqlake up will start:")
    console.print(f"  NameServer  {host}:{namesrv_port}")
    console.print(f"  Broker      {host}:{broker_port}  store {store_dir}")
    # The servers do not exist yet; printing the plan keeps `make up` usable meanwhile.
    console.print("(broker not implemented yet: nothing started)")


@store_app.command("dump")
def store_dump(
    store_dir: Annotated[Path, typer.Argument(help="Store root (or its commitlog directory).")],
    json_lines: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table.")] = False,
    verify: Annotated[bool, typer.Option(help="Check CRC, offsets, lengths and ConsumeQueue units.")] = False,
    consume_queue: Annotated[bool, typer.Option("--consume-queue", help="Print ConsumeQueue units.")] = False,
    index: Annotated[bool, typer.Option("--index", help="Print IndexFile headers.")] = False,
    topic: Annotated[str | None, typer.Option(help="Only this topic.")] = None,
    limit: Annotated[int | None, typer.Option(help="Print at most this many rows.")] = None,
) -> None:
    """Print a store's records (like kafka-dump-log); --verify exits 1 naming each bad file and position."""
    from store.dump import run

    raise typer.Exit(
        run(
            store_dir,
            as_json=json_lines,
            verify=verify,
            consume_queue=consume_queue,
            index=index,
            topic=topic,
            limit=limit,
        )
    )


def main() -> None:
    """Console-script entry point."""
    app()
