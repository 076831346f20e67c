"""The ``mqlake`` command line: one root composing every command.

- the servers (``up``, ``broker``, ``namesrv``): cli/servers.py
- ``admin``, mqadmin's everyday commands: cli/admin.py
- ``store`` (``dump``, ``adopt-index``): cli/store.py
- the pipeline jobs (``tier``, ``verify-index``, ``replay``, ``sql``, ``lake erase``, ``lake schema``): each
  command lives with its job under pipelines/ (spark-submit runs them as ``python -m pipelines.X``) and only
  joins the root here.

Command modules import typer only; pyspark, delta-rs and the client load when a command runs.
"""

from __future__ import annotations

from typing import Annotated

import typer

from cli import admin_ops as _admin_ops  # noqa: F401 - registers the operator commands on admin_app
from cli import demo, messages, servers
from cli.admin import admin_app
from cli.store import store_app
from pipelines.compaction.cli import tier_command
from pipelines.erase import erase_command
from pipelines.index_rebuild.cli import verify_index_command
from pipelines.migrate_brokers import migrate_command
from pipelines.replay.cli import replay_command
from pipelines.sql_cli import sql_command
from pipelines.typed_cli import schema_app
from store.console import run_app

app = typer.Typer(help="A RocketMQ-compatible broker whose store feeds Spark/Delta.", no_args_is_help=True)


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", help="Show Spark's and the libraries' logs on the console "
                                          "(else they go to ~/logs/mqlake/spark.log).")] = False,
) -> None:
    """mqlake: a RocketMQ-compatible broker whose store feeds Spark/Delta."""
    from pipelines.logs import set_verbose

    set_verbose(verbose)


app.command("up")(servers.up)
app.command("broker")(servers.broker)
app.command("namesrv")(servers.namesrv)
app.command("send")(messages.send)
app.command("consume")(messages.consume)
app.command("demo")(demo.demo)
app.add_typer(admin_app, name="admin")
app.add_typer(store_app, name="store")
app.command("tier")(tier_command)
app.command("tier-migrate")(migrate_command)
app.command("verify-index")(verify_index_command)
app.command("replay")(replay_command)
app.command("sql")(sql_command)
lake_app = typer.Typer(help="Operations on the tiered history (the lake's Delta tables).", no_args_is_help=True)
lake_app.command("erase")(erase_command)
lake_app.add_typer(schema_app, name="schema")
app.add_typer(lake_app, name="lake")


def main() -> None:
    """The console script ``mqlake`` (and ``python -m cli``)."""
    run_app(app)
