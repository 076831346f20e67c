"""RemotingServer: accept remoting connections and dispatch requests to handlers registered per code."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

from broker.remoting.codes import MAX_FRAME
from broker.remoting.connection import Channel, Connection, Handler
from broker.remoting.errors import port_in_use
from broker.remoting.tls import SniffingServer, TlsMode

__all__ = ["Channel", "Connection", "Handler", "RemotingServer"]

log = logging.getLogger(__name__)


# what a user changes when a server's port is taken
_PORT_SETTINGS = {"broker": "listenPort", "namesrv": "the NameServer's port (namesrvAddr, or --namesrv-port)"}


class RemotingServer:
    """An asyncio TCP server speaking the remoting protocol. ``port=0`` binds an ephemeral port (see ``.port``)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        name: str = "remoting",
        max_frame: int = MAX_FRAME,
        max_in_flight_per_connection: int = 1024,
        tls_mode: TlsMode = "disabled",
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``tls_mode`` permissive or enforcing needs ``ssl_context`` (see broker.remoting.tls)."""
        if tls_mode != "disabled" and ssl_context is None:
            raise ValueError(f"TLS mode {tls_mode} needs an SSL context")
        self.host = host
        self.port = port
        self.name = name
        self._max_frame = max_frame
        self._max_in_flight = max_in_flight_per_connection
        self._handlers: dict[int, Handler] = {}
        self._close_listeners: list[Callable[[Connection], None]] = []
        self._connections: set[Connection] = set()
        self._server: asyncio.AbstractServer | SniffingServer | None = None
        self.tls_mode = tls_mode
        self._ssl = ssl_context

    def register(self, code: int, handler: Handler) -> None:
        """Route requests with ``code`` to ``handler`` (a later registration replaces an earlier one)."""
        self._handlers[int(code)] = handler

    def add_close_listener(self, cb: Callable[[Connection], None]) -> None:
        """Call ``cb(connection)`` when a client's channel closes (e.g. to drop its consumers)."""
        self._close_listeners.append(cb)

    @property
    def connections(self) -> frozenset[Connection]:
        return frozenset(self._connections)

    def _new_connection(self) -> Connection:
        return Connection(
            self._handlers.get,
            name=self.name,
            max_frame=self._max_frame,
            max_in_flight=self._max_in_flight,
            on_open=self._connections.add,
            on_close=self._connection_closed,
        )

    def _connection_closed(self, conn: Connection) -> None:
        self._connections.discard(conn)
        for cb in self._close_listeners:
            try:
                cb(conn)
            except Exception:
                log.exception("%s: close listener %r failed for %s", self.name, cb, conn.remote_addr)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            if self.tls_mode == "permissive" and self._ssl is not None:
                sniffing = SniffingServer(self._new_connection, self._ssl)
                await sniffing.listen(self.host, self.port)
                self._server = sniffing
            else:
                tls = self._ssl if self.tls_mode == "enforcing" else None
                self._server = await loop.create_server(
                    self._new_connection, self.host, self.port, reuse_address=True, ssl=tls
                )
        except OSError as e:
            raise port_in_use(e, self.host, self.port, _PORT_SETTINGS.get(self.name, f"the {self.name}'s port")) from e
        self.port = self._server.sockets[0].getsockname()[1]
        tls_note = "" if self.tls_mode == "disabled" else f" (TLS {self.tls_mode})"
        log.info("%s: listening on %s:%d%s", self.name, self.host, self.port, tls_note)

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, give in-flight handlers up to ``grace`` seconds to answer, then close every channel."""
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close()
        for conn in list(self._connections):
            conn.stop_reading()
        tasks = [t for conn in self._connections for t in conn.tasks]
        if tasks:
            _, unfinished = await asyncio.wait(tasks, timeout=grace)
            for task in unfinished:
                task.cancel()
            if unfinished:
                log.warning("%s: cancelled %d requests still running after %.1fs", self.name, len(unfinished), grace)
                await asyncio.wait(unfinished, timeout=1.0)
        # let the replies queued by the finished handlers reach the transports before closing them
        await asyncio.sleep(0)
        for conn in list(self._connections):
            conn.close()
        await server.wait_closed()
        log.info("%s: stopped", self.name)
