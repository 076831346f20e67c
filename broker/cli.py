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


def main() -> None:
    """Console-script entry point."""
    app()
