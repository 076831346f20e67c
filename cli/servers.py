"""``mqlake up``, ``mqlake broker`` and ``mqlake namesrv``: the servers, in the foreground until a signal."""

from __future__ import annotations

import errno
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from cli.log_files import add_log_files
from lake import objectstore
from pipelines.objectstore_cli import lake_option
from store.console import print_error
from store.constants import DEFAULT_NAMESRV_PORT

ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="broker.conf (Java properties, RocketMQ key names).")
]
LogLevel = Annotated[str, typer.Option(help="Logging level.")]
LakeOption = Annotated[
    str | None,
    typer.Option(
        "--lake",
        help="Delta lake root (lakePath), a directory or s3://bucket/prefix: serve tiered history from it; `up` "
        "also runs the tier job at deleteWhen.",
    ),
]


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )


def _load_conf(
    config: Path | None, store_dir: Path | None, broker_port: int | None, host: str | None, lake: str | None = None
):
    from broker.config import BrokerConfigError, load_broker_conf

    # Command-line options win over the file.
    flags = {"brokerIP1": host, "listenPort": broker_port, "storePathRootDir": store_dir,
             "lakePath": lake_option(lake) if lake is not None else None}  # fmt: skip
    try:
        return load_broker_conf(config, flags)
    except BrokerConfigError as e:
        print_error(e)
        raise typer.Exit(2) from None


def _tier_command(broker_cfg, store_cfg, config: Path | None) -> list[str] | None:
    """``mqlake tier`` as a child process of the broker (its own Spark JVM), when a lake is set."""
    if broker_cfg.lake_path is None:
        return None
    store_dir = Path(store_cfg.store_path_root_dir).absolute()
    # -P: the broker's working directory may hold a "store" directory that must not shadow the package; the
    # rows' broker name is the one the broker recorded in its store at start (store/identity.py)
    argv = [sys.executable, "-P", "-m", "pipelines.compaction", "--store-dir", str(store_dir),
            "--lake", objectstore.join(broker_cfg.lake_path), "--json", "--exit-zero"]  # fmt: skip
    if config is not None:
        argv += ["--broker-conf", str(config.absolute())]
    return argv


def _run(fn, *args, store_dir: Path | None = None, **kwargs) -> None:
    """Start-up failures the user can fix (a port in use, a locked or corrupt store, a store directory it cannot
    write) end with one line, exit 1."""
    from store.errors import MQLakeError

    try:
        if store_dir is not None:
            _check_store_dir(Path(store_dir))
        fn(*args, **kwargs)
    except MQLakeError as e:
        print_error(e)
        raise typer.Exit(1) from None
    except OSError as e:
        print_error(os_error_line(e, store_dir))
        raise typer.Exit(1) from None


def _check_store_dir(store_dir: Path) -> None:
    """This user may write the store directory, or make it (its nearest existing parent is writable).  Nothing is
    created here: a start-up refused later (a bad ACL file, a port in use) leaves no store behind."""
    existing = next(p for p in (store_dir, *store_dir.parents) if p.exists())
    if not existing.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(existing))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(store_dir))


def os_error_line(e: OSError, store_dir: Path | None) -> str:
    """An OS error as a sentence naming the option to change, without Python's ``[Errno n]`` prefix."""
    what = e.strerror or str(e)
    where = f" ({e.filename})" if e.filename else ""
    if store_dir is not None and e.filename is not None:
        return (f"cannot use the store directory {store_dir}: {what}{where}; give --store-dir (storePathRootDir) a "
                "directory this user can create and write")  # fmt: skip
    return f"{what}{where}"


def broker(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="Address to listen on and advertise (brokerIP1).")] = None,
    port: Annotated[int | None, typer.Option(help="Broker port (listenPort); 0 picks a free one.")] = None,
    store_dir: Annotated[Path | None, typer.Option(help="Store root (storePathRootDir).")] = None,
    lake: LakeOption = None,
    log_level: LogLevel = "INFO",
) -> None:
    """Run a Broker that registers with the NameServers in namesrvAddr; SIGTERM/SIGINT stop it gracefully."""
    from broker.embedded import run_servers

    _setup_logging(log_level)
    broker_cfg, store_cfg = _load_conf(config, store_dir, port, host, lake)
    if broker_cfg.log_dir is not None:
        add_log_files(broker_cfg.log_dir, broker=True, namesrv=False)
    _run(run_servers, broker_cfg, store_cfg, store_dir=store_cfg.store_path_root_dir)


def namesrv(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="NameServer port; 0 picks a free one.")] = DEFAULT_NAMESRV_PORT,
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="Properties file: RocketMQ's tls.server.* keys (TLS on the port), aclEnable and "
        "rocketmqHome (write codes need a signed admin account of {rocketmqHome}/conf/plain_acl.yml), "
        "enableControllerInNamesrv (a single-node controller for brokers in controller mode).")] = None,
    log_level: LogLevel = "INFO",
    log_dir: Annotated[Path | None, typer.Option(help="Also log to a rotating namesrv.log here.")] = None,
) -> None:
    """Run a NameServer alone; SIGTERM/SIGINT stop it."""
    from broker.config import BrokerConfigError, load_namesrv_conf
    from broker.namesrv.controller import serve_namesrv
    from broker.namesrv.replicas_controller import EmbeddedController
    from broker.remoting.loop import run
    from broker.tls_settings import tls_server_context

    _setup_logging(log_level)
    try:
        conf = load_namesrv_conf(config)
    except BrokerConfigError as e:
        print_error(e)
        raise typer.Exit(2) from None
    if log_dir is not None:
        add_log_files(log_dir, broker=False, namesrv=True)
    tls = conf.tls
    acl_file = conf.acl_file if conf.acl_enable else None
    controller = (
        EmbeddedController(host, conf.controller_listen_port, conf.controller_store_path,
                           conf.scan_not_active_broker_interval / 1000)  # fmt: skip
        if conf.enable_controller_in_namesrv
        else None
    )
    _run(lambda: run(serve_namesrv(host, port, tls_mode=tls.server_mode, ssl_context=tls_server_context(tls),
                                   acl_file=acl_file, controller=controller)))  # fmt: skip


def up(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="Address both servers listen on.")] = None,
    namesrv_port: Annotated[int | None, typer.Option(
        help="NameServer port (default: namesrvAddr's, or 9876); 0 picks a free one.")] = None,
    broker_port: Annotated[int | None, typer.Option(
        help="Broker port (default: listenPort, or 10911); 0 picks a free one.")] = None,
    store_dir: Annotated[
        Path | None, typer.Option(help="Store root (default: storePathRootDir, or .mqlake/store).")
    ] = None,
    lake: LakeOption = None,
    log_level: LogLevel = "INFO",
    proxy: Annotated[bool | None, typer.Option(
        "--proxy/--no-proxy", help="Serve RocketMQ 5 gRPC clients on grpcServerPort (default: enableProxy).")] = None,
) -> None:
    """Run a NameServer and a Broker in one process (embedded mode); SIGTERM/SIGINT stop both gracefully."""
    from broker.embedded import run_servers

    _setup_logging(log_level)
    broker_cfg, store_cfg = _load_conf(config, store_dir, broker_port, host, lake)
    if proxy is not None:
        broker_cfg.enable_proxy = proxy
    ns_host = host or broker_cfg.broker_ip1
    configured = broker_cfg.namesrv_addrs
    if namesrv_port is None:
        namesrv_port = int(configured[0].rpartition(":")[2]) if configured else DEFAULT_NAMESRV_PORT
    if namesrv_port == 0:  # the broker registers with the port the NameServer was given (run_servers sets it)
        broker_cfg.namesrv_addr = None
    elif not configured or namesrv_port != int(configured[0].rpartition(":")[2]):
        broker_cfg.namesrv_addr = f"{ns_host}:{namesrv_port}"
    if broker_cfg.log_dir is not None:
        add_log_files(broker_cfg.log_dir, broker=True, namesrv=True)
    _run(run_servers, broker_cfg, store_cfg, namesrv_host=ns_host, namesrv_port=namesrv_port,
         tier_command=_tier_command(broker_cfg, store_cfg, config),
         store_dir=store_cfg.store_path_root_dir)  # fmt: skip
