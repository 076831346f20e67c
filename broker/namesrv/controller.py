"""NamesrvController: the name server process — a remoting server, the route table, and broker expiry."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from pathlib import Path

from broker.namesrv.kv_config import DEFAULT_KV_CONFIG_PATH, KVConfigManager
from broker.namesrv.processor import NamesrvProcessor
from broker.namesrv.route_table import RouteTable
from broker.remoting.loop import wait_for_signal
from broker.remoting.server import Channel, RemotingServer
from broker.remoting.tls import TlsMode

log = logging.getLogger(__name__)

BROKER_CHANNEL_EXPIRED_SECONDS = 120.0  # DEFAULT_BROKER_CHANNEL_EXPIRED_TIME
SCAN_NOT_ACTIVE_BROKER_SECONDS = 5.0  # scanNotActiveBrokerInterval


class NamesrvController:
    """``await start()`` binds (port 0 = ephemeral, see ``.port``); ``await stop()`` closes everything."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 9876,
        *,
        broker_expired_seconds: float = BROKER_CHANNEL_EXPIRED_SECONDS,
        scan_interval: float = SCAN_NOT_ACTIVE_BROKER_SECONDS,
        tls_mode: TlsMode = "disabled",
        ssl_context: ssl.SSLContext | None = None,
        kv_config_path: Path | None = None,
    ) -> None:
        """``kv_config_path``: where the KV config persists (RocketMQ's ``kvConfigPath``); None keeps it in memory."""
        self.host = host
        self.port = port
        self.scan_interval = scan_interval
        self.table = RouteTable()
        self.kv = KVConfigManager(kv_config_path)
        self.processor = NamesrvProcessor(self.table, broker_expired_seconds, self.kv)
        self.server = RemotingServer(host, port, name="namesrv", tls_mode=tls_mode, ssl_context=ssl_context)
        for code, handler in self.processor.routes().items():
            self.server.register(code, handler)
        self.server.add_close_listener(self._channel_closed)
        self._scanner: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        await asyncio.to_thread(self.kv.load)  # a bad kvConfig.json stops the start, naming the file
        await self.server.start()
        self.port = self.server.port
        self._scanner = asyncio.get_running_loop().create_task(self._scan_forever())
        log.info("NameServer started on %s", self.address)

    async def stop(self) -> None:
        if self._scanner is not None:
            self._scanner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scanner
            self._scanner = None
        await self.server.stop(grace=1.0)

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
) -> None:
    """Run a NameServer until SIGTERM/SIGINT (``mqlake namesrv``); logs ``NameServer ready at host:port``."""
    namesrv = NamesrvController(host, port, tls_mode=tls_mode, ssl_context=ssl_context, kv_config_path=kv_config_path)
    await namesrv.start()
    try:
        logging.getLogger("mqlake").info("NameServer ready at %s", namesrv.address)
        await wait_for_signal()
    finally:
        await namesrv.stop()
