"""NamesrvController: the name server process — a remoting server, the route table, broker expiry and, with
``aclEnable``, the plain ACL on its write codes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from pathlib import Path

from broker.acl.manager import WATCH_INTERVAL, PlainAclManager
from broker.namesrv.kv_config import DEFAULT_KV_CONFIG_PATH, KVConfigManager
from broker.namesrv.processor import WRITE_CODES, NamesrvProcessor
from broker.namesrv.replicas_controller import EmbeddedController
from broker.namesrv.route_table import RouteTable
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Handler, HandlerResult
from broker.remoting.errors import RequestRefused
from broker.remoting.loop import wait_for_signal
from broker.remoting.server import Channel, RemotingServer
from broker.remoting.signing import Credentials
from broker.remoting.tls import TlsMode
from store.constants import DEFAULT_NAMESRV_PORT

log = logging.getLogger(__name__)

BROKER_CHANNEL_EXPIRED_SECONDS = 120.0  # DEFAULT_BROKER_CHANNEL_EXPIRED_TIME
SCAN_NOT_ACTIVE_BROKER_SECONDS = 5.0  # scanNotActiveBrokerInterval


class NamesrvController:
    """``await start()`` binds (port 0 = ephemeral, see ``.port``); ``await stop()`` closes everything."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = DEFAULT_NAMESRV_PORT,
        *,
        broker_expired_seconds: float = BROKER_CHANNEL_EXPIRED_SECONDS,
        scan_interval: float = SCAN_NOT_ACTIVE_BROKER_SECONDS,
        tls_mode: TlsMode = "disabled",
        ssl_context: ssl.SSLContext | None = None,
        kv_config_path: Path | None = None,
        acl_file: Path | None = None,
        trusted: Credentials | None = None,
    ) -> None:
        """``kv_config_path``: where the KV config persists (RocketMQ's ``kvConfigPath``); None keeps it in memory.
        ``acl_file``: a plain_acl.yml (``aclEnable``): the write codes then need a signed admin account of it.
        ``trusted``: one more admin account, for this NameServer only (``mqlake up``'s own broker's)."""
        self.host = host
        self.port = port
        self.scan_interval = scan_interval
        self.table = RouteTable()
        self.kv = KVConfigManager(kv_config_path)
        self.processor = NamesrvProcessor(self.table, broker_expired_seconds, self.kv)
        self.server = RemotingServer(host, port, name="namesrv", tls_mode=tls_mode, ssl_context=ssl_context)
        self.acl_file = acl_file
        self.acl: PlainAclManager | None = None
        self.trusted = trusted
        for code, handler in self.processor.routes().items():
            self.server.register(code, self._admin_only(handler) if code in WRITE_CODES else handler)
        self.server.add_close_listener(self._channel_closed)
        self._scanner: asyncio.Task[None] | None = None
        self._acl_watch: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _admin_only(self, handler: Handler) -> Handler:
        def checked(cmd: RemotingCommand, conn: Channel) -> HandlerResult:
            acl = self.acl
            if acl is not None and not (self.trusted is not None and self.trusted.signed(cmd)):
                try:
                    acl.check_admin(cmd, conn.remote_host[0])
                except RequestRefused as e:
                    log.info("refused %s from %s: %s", cmd.code, conn.remote_addr, e.remark)
                    return cmd.response(e.code, e.remark)
            return handler(cmd, conn)

        return checked

    async def start(self) -> None:
        if self.acl_file is not None:  # a missing or bad file stops the start: never serve open by accident
            self.acl = await asyncio.to_thread(PlainAclManager, self.acl_file)
            log.info("ACL enabled: %s, %d accounts", self.acl.path, len(self.acl.acl.accounts))
        await asyncio.to_thread(self.kv.load)  # a bad kvConfig.json stops the start, naming the file
        await self.server.start()
        self.port = self.server.port
        loop = asyncio.get_running_loop()
        self._scanner = loop.create_task(self._scan_forever())
        if self.acl is not None:
            self._acl_watch = loop.create_task(self._watch_acl(self.acl))
        log.info("NameServer started on %s", self.address)

    async def stop(self) -> None:
        for task in (self._scanner, self._acl_watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._scanner = self._acl_watch = None
        await self.server.stop(grace=1.0)

    @staticmethod
    async def _watch_acl(acl: PlainAclManager) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            try:
                await acl.reload_if_changed_async()  # a bad file is logged and the rules in force stay
            except Exception:
                log.exception("checking %s for changes failed", acl.path)

    def _channel_closed(self, conn: Channel) -> None:
        self.table.remove_by_connection(conn)

    def scan_not_active_brokers(self) -> int:
        """Drop brokers whose last registration is older than their timeout; close their channels."""
        expired = self.table.expire()
        for live in expired:
            if live.conn is not None:
                live.conn.close()
        return len(expired)

    async def _scan_forever(self) -> None:
        while True:
            await asyncio.sleep(self.scan_interval)
            try:
                self.scan_not_active_brokers()
            except Exception:
                log.exception("scanning for inactive brokers failed")


async def serve_namesrv(
    host: str,
    port: int,
    *,
    tls_mode: TlsMode = "disabled",
    ssl_context: ssl.SSLContext | None = None,
    kv_config_path: Path | None = DEFAULT_KV_CONFIG_PATH,
    acl_file: Path | None = None,
    controller: EmbeddedController | None = None,
) -> None:
    """Run a NameServer until SIGTERM/SIGINT (``mqlake namesrv``); logs ``NameServer ready at host:port``, and
    ``Controller ready at host:port`` first when it embeds ``controller``."""
    namesrv = NamesrvController(host, port, tls_mode=tls_mode, ssl_context=ssl_context, kv_config_path=kv_config_path,
                                acl_file=acl_file)  # fmt: skip
    if controller is not None:
        await controller.start()
        logging.getLogger("mqlake").info("Controller ready at %s", controller.address)
    try:
        await namesrv.start()
        try:
            logging.getLogger("mqlake").info("NameServer ready at %s", namesrv.address)
            await wait_for_signal()
        finally:
            await namesrv.stop()
    finally:
        if controller is not None:
            await controller.stop()
