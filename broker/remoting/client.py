"""RemotingClient: calls to many servers by "host:port", with one (or N round-robin) channels per address."""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from collections.abc import Callable

from broker.remoting.codes import MAX_FRAME
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Connection, Handler
from broker.remoting.errors import RemotingConnectError, RemotingError, RemotingTimeoutError

__all__ = ["RemotingClient", "RemotingConnectError", "RemotingError", "RemotingTimeoutError", "split_addr"]

log = logging.getLogger(__name__)


def split_addr(addr: str) -> tuple[str, int]:
    """``"host:port"`` -> (host, port); raises RemotingConnectError naming the address when it is not one."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise RemotingConnectError(f"bad address {addr!r}: expected host:port")
    return host.strip("[]"), int(port)


class _Slots:
    """The channels to one address; a lock per slot so concurrent callers share one connect."""

    def __init__(self, n: int) -> None:
        self.conns: list[Connection | None] = [None] * n
        self.locks = [asyncio.Lock() for _ in range(n)]
        self.next = itertools.cycle(range(n))


class RemotingClient:
    """Invoke requests on remoting servers; server-initiated requests go to ``request_handler``."""

    def __init__(
        self,
        *,
        request_handler: Handler | None = None,
        language: str = "PYTHON",
        connect_timeout: float = 3.0,
        connections_per_addr: int = 1,
        max_frame: int = MAX_FRAME,
        rpc_hook: Callable[[RemotingCommand], None] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``rpc_hook`` sees every request just before it is sent (signing); ``ssl_context`` makes every
        channel TLS (the server's name is not checked unless the context asks for it)."""
        if connections_per_addr < 1:
            raise ValueError("connections_per_addr must be >= 1")
        self._handler = request_handler
        self._language = language
        self._connect_timeout = connect_timeout
        self._per_addr = connections_per_addr
        self._max_frame = max_frame
        self._hook = rpc_hook
        self._ssl = ssl_context
        self._addrs: dict[str, _Slots] = {}
        self._closed = False

    def _dispatch(self, code: int) -> Handler | None:
        return self._handler

    async def _connect(self, addr: str) -> Connection:
        host, port = split_addr(addr)
        loop = asyncio.get_running_loop()

        def factory() -> Connection:
            return Connection(self._dispatch, name=f"client->{addr}", max_frame=self._max_frame)

        try:
            async with asyncio.timeout(self._connect_timeout):
                if self._ssl is None:
                    _, conn = await loop.create_connection(factory, host, port)
                else:
                    server_name = host if self._ssl.check_hostname else None
                    _, conn = await loop.create_connection(
                        factory, host, port, ssl=self._ssl, server_hostname=server_name
                    )
        except (OSError, TimeoutError) as e:  # ssl.SSLError is an OSError
            # the OS's sentence ("Connection refused") without Python's "[Errno 111]"; a TLS error keeps its text
            reason = e.strerror if isinstance(e, OSError) and e.strerror and not e.filename else str(e)
            raise RemotingConnectError(f"connect to {addr} failed: {type(e).__name__}: {reason}") from None
        conn.remote_addr = addr
        return conn

    async def connection(self, addr: str) -> Connection:
        """A live channel to ``addr`` (reconnecting a dropped one)."""
        if self._closed:
            raise RemotingConnectError("client is closed")
        slots = self._addrs.get(addr)
        if slots is None:
            slots = self._addrs[addr] = _Slots(self._per_addr)
        i = next(slots.next)
        conn = slots.conns[i]
        if conn is not None and not conn.closed:
            return conn
        async with slots.locks[i]:
            conn = slots.conns[i]
            if conn is None or conn.closed:
                conn = await self._connect(addr)
                if self._closed:
                    conn.close()
                    raise RemotingConnectError("client is closed")
                slots.conns[i] = conn
            return conn

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float = 3.0) -> RemotingCommand:
        """Send ``cmd`` to ``addr`` and return the response (its opaque is assigned here)."""
        cmd.language = self._language
        if self._hook is not None:
            self._hook(cmd)
        conn = await self.connection(addr)
        return await conn.invoke(cmd, timeout)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        """Send ``cmd`` with the ONEWAY flag; nothing comes back."""
        cmd.language = self._language
        if self._hook is not None:
            self._hook(cmd)
        conn = await self.connection(addr)
        await conn.send_oneway(cmd)

    def close_addr(self, addr: str) -> None:
        """Drop the channels to one address (e.g. a broker that went away); the next call reconnects."""
        slots = self._addrs.pop(addr, None)
        if slots is not None:
            for conn in slots.conns:
                if conn is not None:
                    conn.close()

    async def close(self) -> None:
        """Close every channel; pending calls fail with RemotingConnectError."""
        self._closed = True
        conns = [c for slots in self._addrs.values() for c in slots.conns if c is not None]
        self._addrs.clear()
        for conn in conns:
            conn.close()
        # give the transports a turn to run connection_lost, so pending futures are failed before we return
        for _ in range(2):
            if all(c.closed for c in conns):
                break
            await asyncio.sleep(0)
