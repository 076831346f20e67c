"""Running the servers in one process: ``mqlake broker`` (a Broker) and ``mqlake up`` (NameServer + Broker).

Each server logs one ``... ready at host:port`` line once it accepts requests; SIGTERM and SIGINT shut
down gracefully (the broker unregisters, answers parked pulls, persists offsets and closes its store).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from broker.config import BrokerConfig, InnerCredentials
from broker.lake.tier_schedule import TierSchedule
from broker.namesrv import NamesrvController
from broker.remoting.loop import run, wait_for_signal
from broker.remoting.signing import Credentials
from broker.server.controller import BrokerController
from broker.tls_settings import tls_server_context
from store.config import MessageStoreConfig

if TYPE_CHECKING:
    from broker.proxy.server import GrpcProxy

log = logging.getLogger("mqlake")


def ready_address(log_text: str, server: str) -> str | None:
    """``host:port`` of the first ``<server> ready at host:port`` line in a log (``server``: NameServer, Broker,
    Controller or gRPC proxy): where that server accepts requests, the OS's pick when its port was 0; None before
    it is ready."""
    m = re.search(rf"\b{re.escape(server)} ready at (\S+?:\d+)", log_text)
    return m.group(1) if m else None


async def serve(
    broker_config: BrokerConfig,
    store_config: MessageStoreConfig,
    *,
    namesrv_host: str | None = None,
    namesrv_port: int | None = None,
    broker_host: str | None = None,
    tier_command: Sequence[str] | None = None,
) -> None:
    """Run until SIGTERM/SIGINT: a NameServer first when ``namesrv_port`` is given, then the Broker.

    ``tier_command``: the tier job's command line, run at deleteWhen when ``lakePath`` is set (see
    :mod:`broker.lake.tier_schedule`); without one the broker only reports what waits for tiering."""
    namesrv = None
    if namesrv_port is not None:
        # One process, one TLS configuration: the NameServer's port is set up as the broker's.
        tls = broker_config.tls
        # Beside the store, as RocketMQ's ~/namesrv/kvConfig.json is beside ~/store.
        kv_path = store_config.store_path_root_dir.parent / "namesrv" / "kvConfig.json"
        # One process, one ACL: with aclEnable the NameServer takes registrations, KV and permission changes only
        # from admin accounts. The broker signs its own with innerClientAuthenticationCredentials, or else with
        # an account made here, known to this process alone: `mqlake up` keeps working without the key.
        acl_file, own = None, None
        if broker_config.acl_enable:
            acl_file = broker_config.acl_file
            if broker_config.inner_client_authentication_credentials is None:
                own = InnerCredentials(access_key=f"mqlake-up-{secrets.token_hex(8)}",
                                       secret_key=secrets.token_urlsafe(32))  # fmt: skip
                broker_config.inner_client_authentication_credentials = own
        namesrv = NamesrvController(namesrv_host or "127.0.0.1", namesrv_port, tls_mode=tls.server_mode,
                                    ssl_context=tls_server_context(tls), kv_config_path=kv_path, acl_file=acl_file,
                                    trusted=Credentials(own.access_key, own.secret_key) if own else None)  # fmt: skip
        if tls.server_mode == "enforcing":
            tls.client_enable = True  # the broker registers with a NameServer that speaks TLS only
        await namesrv.start()
        addr = f"{namesrv_host or '127.0.0.1'}:{namesrv.port}"
        log.info("NameServer ready at %s", addr)
        if not broker_config.namesrv_addrs:
            broker_config.namesrv_addr = addr
    broker = BrokerController(broker_config, store_config, host=broker_host)
    schedule: asyncio.Task | None = None
    proxy: GrpcProxy | None = None
    try:
        if broker_config.enable_proxy:  # the RocketMQ 5 gRPC endpoint (docs/grpc.md); grpcio loaded only then
            from broker.proxy.server import GrpcProxy

            starting = GrpcProxy(broker)
            starting.check()  # its role and TLS files, before anything opens

            async def open_proxy() -> None:
                nonlocal proxy
                await starting.start()
                proxy = starting  # stopped below even when the broker's start fails after this

            # its port opens before the broker registers: a taken grpcServerPort stops the start unseen
            await broker.start(before_register=open_proxy)
            assert proxy is not None
            log.info("gRPC proxy ready at %s:%d", proxy.host, proxy.port)
        else:
            await broker.start()
        log.info("Broker ready at %s (store %s)", broker.addr, store_config.store_path_root_dir)
        tiering = TierSchedule(store_config, broker.store.manifest.entries, broker_config.lake_path, tier_command)
        schedule = asyncio.create_task(tiering.run())
        await wait_for_signal()
        log.info("shutting down")
    finally:
        if schedule is not None:
            schedule.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await schedule
        if proxy is not None:
            await proxy.stop()
        await broker.shutdown()
        if namesrv is not None:
            await namesrv.stop()


def run_servers(broker_config: BrokerConfig, store_config: MessageStoreConfig, **kwargs: Any) -> None:
    """Blocking entry point for the CLI (uvloop when available)."""
    run(serve(broker_config, store_config, **kwargs))
