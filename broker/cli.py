"""The ``mqlake`` command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from broker.admin_cli import admin_app
from pipelines.compaction.cli import tier_command
from pipelines.index_rebuild.cli import adopt_index_command, verify_index_command
from pipelines.replay.cli import replay_command
from pipelines.sql_cli import sql_command

app = typer.Typer(help="A RocketMQ-compatible broker whose store feeds Spark/Delta.", no_args_is_help=True)
store_app = typer.Typer(help="Inspect and verify native store files.", no_args_is_help=True)
app.add_typer(store_app, name="store")
app.add_typer(admin_app, name="admin")

console = Console()


@app.callback()
def _root() -> None:
    """mqlake: a RocketMQ-compatible broker whose store feeds Spark/Delta."""


ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="broker.conf (Java properties, RocketMQ key names).")
]


def _setup_logging(level: str) -> None:
    import logging

    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )


def _load_conf(config: Path | None, store_dir: Path | None, broker_port: int | None, host: str | None):
    from broker.config import BrokerConfigError, load_broker_conf

    try:
        broker_cfg, store_cfg = load_broker_conf(config)
    except BrokerConfigError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    # Command-line options win over the file.
    if host is not None:
        broker_cfg.broker_ip1 = host
    if broker_port is not None:
        broker_cfg.listen_port = broker_port
    if store_dir is not None:
        store_cfg.store_path_root_dir = store_dir
    store_cfg.store_host = broker_cfg.broker_addr
    return broker_cfg, store_cfg


def _run(fn, *args, **kwargs) -> None:
    """Start-up failures the user can fix (a port in use, a locked or corrupt store) end with one line, exit 1."""
    from store.checkpoint import StoreLockedError
    from store.config_files import ConfigFileError
    from store.mapped_file import StoreFileError
    from store.recovery import StoreCorruptError

    try:
        fn(*args, **kwargs)
    except (OSError, ConfigFileError, StoreLockedError, StoreFileError, StoreCorruptError) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(1) from None


@app.command()
def broker(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="Address to listen on and advertise (brokerIP1).")] = None,
    port: Annotated[int | None, typer.Option(help="Broker port (listenPort); 0 picks a free one.")] = None,
    store_dir: Annotated[Path | None, typer.Option(help="Store root (storePathRootDir).")] = None,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
) -> None:
    """Run a Broker that registers with the NameServers in namesrvAddr; SIGTERM/SIGINT stop it gracefully."""
    from broker.embedded import run_servers

    _setup_logging(log_level)
    broker_cfg, store_cfg = _load_conf(config, store_dir, port, host)
    _run(run_servers, broker_cfg, store_cfg)


@app.command()
def namesrv(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="NameServer port; 0 picks a free one.")] = 9876,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
) -> None:
    """Run a NameServer alone; SIGTERM/SIGINT stop it."""
    from broker.namesrv.controller import serve_namesrv
    from broker.remoting.loop import run

    _setup_logging(log_level)
    run(serve_namesrv(host, port))


@app.command()
def up(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="Address both servers listen on.")] = None,
    namesrv_port: Annotated[int | None, typer.Option(help="NameServer port (default: namesrvAddr's, or 9876).")] = None,
    broker_port: Annotated[int | None, typer.Option(help="Broker port (default: listenPort, or 10911).")] = None,
    store_dir: Annotated[
        Path | None, typer.Option(help="Store root (default: storePathRootDir, or .mqlake/store).")
    ] = None,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
) -> None:
    """Run a NameServer and a Broker in one process (embedded mode); SIGTERM/SIGINT stop both gracefully."""
    from broker.embedded import run_servers

    _setup_logging(log_level)
    broker_cfg, store_cfg = _load_conf(config, store_dir, broker_port, host)
    ns_host = host or broker_cfg.broker_ip1
    configured = broker_cfg.namesrv_addrs
    if namesrv_port is None:
        namesrv_port = int(configured[0].rpartition(":")[2]) if configured else 9876
    if not configured or namesrv_port != int(configured[0].rpartition(":")[2]):
        broker_cfg.namesrv_addr = f"{ns_host}:{namesrv_port}"
    _run(run_servers, broker_cfg, store_cfg, namesrv_host=ns_host, namesrv_port=namesrv_port)


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


# `mqlake tier`: the command lives with the tiering job; it imports pyspark only when it runs.
app.command("tier")(tier_command)

# `mqlake sql`: Spark SQL over the lake; pyspark is imported only when it runs.
app.command("sql")(sql_command)

# `mqlake verify-index` / `mqlake store adopt-index`: rebuild and verify ConsumeQueue + IndexFile with Spark.
app.command("verify-index")(verify_index_command)
store_app.command("adopt-index")(adopt_index_command)

# `mqlake replay`: history (Delta + live CommitLog) into a new topic; pyspark is imported only when it runs.
app.command("replay")(replay_command)


def main() -> None:
    """Console-script entry point."""
    app()
