"""TLS on the remoting ports, as RocketMQ's ``TlsSystemConfig`` names it.

Server modes: ``disabled`` (plain TCP), ``enforcing`` (TLS only: a plain client fails the handshake and is
dropped), ``permissive`` (both: the first byte a client sends decides — 0x16 opens a TLS handshake record,
and no remoting frame can start with it since that would announce a frame of over 350 MB).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable
from pathlib import Path

from broker.tls_config import TlsMode
from store.errors import MQLakeError

log = logging.getLogger(__name__)

__all__ = ["SniffingServer", "TlsConfigError", "TlsMode", "client_context", "server_context"]
TLS_HANDSHAKE = 0x16  # the content type of a TLS handshake record: a ClientHello's first byte
FIRST_BYTE_TIMEOUT = 30.0  # a permissive port drops a client that sends nothing this long
_CLIENT_AUTH = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "require": ssl.CERT_REQUIRED}


class TlsConfigError(MQLakeError, ValueError):
    """A certificate, key or trust file that cannot be loaded; the message names the file (never a password)."""


def _load_chain(ctx: ssl.SSLContext, cert: Path, key: Path | None, password: str | None, what: str) -> None:
    try:
        ctx.load_cert_chain(str(cert), str(key) if key is not None else None, password)
    except (OSError, ssl.SSLError) as e:
        raise TlsConfigError(f"{what} certificate {cert} / key {key}: cannot be loaded: {_reason(e)}") from None


def _load_trust(ctx: ssl.SSLContext, trust: Path, what: str) -> None:
    try:
        ctx.load_verify_locations(cafile=str(trust))
    except (OSError, ssl.SSLError) as e:
        raise TlsConfigError(f"{what} trust certificate {trust}: cannot be loaded: {_reason(e)}") from None


def _reason(e: OSError | ssl.SSLError) -> str:
    return getattr(e, "reason", None) or e.strerror or str(e)


def server_context(
    cert: Path,
    key: Path,
    *,
    password: str | None = None,
    trust: Path | None = None,
    need_client_auth: str = "none",
) -> ssl.SSLContext:
    """The context of a TLS port (``tls.server.*``)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _load_chain(ctx, cert, key, password, "tls.server")
    ctx.verify_mode = _CLIENT_AUTH[need_client_auth]
    if trust is not None:
        _load_trust(ctx, trust, "tls.server")
    return ctx


def client_context(
    *,
    trust: Path | None = None,
    verify_server: bool = False,
    cert: Path | None = None,
    key: Path | None = None,
    password: str | None = None,
) -> ssl.SSLContext:
    """The context of a client (``tls.client.*``). As RocketMQ's ``tls.client.authServer=false`` default, the
    server's certificate is not checked unless ``verify_server`` (then against ``trust``, else the system's)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if verify_server:
        ctx.check_hostname = False  # brokers are reached by IP; the certificate's chain is what is checked
        ctx.verify_mode = ssl.CERT_REQUIRED
        if trust is not None:
            _load_trust(ctx, trust, "tls.client")
        else:
            ctx.load_default_certs()
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert is not None:
        _load_chain(ctx, cert, key, password, "tls.client")
    return ctx


class SniffingServer:
    """A listening socket for permissive mode: each accepted client is handed to ``protocol_factory`` over TLS
    or plain TCP by its first byte. Offers what RemotingServer uses of ``asyncio.Server``."""

    def __init__(self, protocol_factory: Callable[[], asyncio.Protocol], ssl_context: ssl.SSLContext) -> None:
        self._factory = protocol_factory
        self._ssl = ssl_context
        self.sockets: list[socket.socket] = []
        self._accepting: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()

    async def listen(self, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=1024)
        sock.setblocking(False)
        self.sockets = [sock]
        self._accepting = asyncio.get_running_loop().create_task(self._accept_loop(sock))

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                client, _ = await loop.sock_accept(sock)
            except OSError as e:
                log.warning("accept on %s failed: %s", sock.getsockname(), e)
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(self._hand_over(client))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _hand_over(self, client: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        client.setblocking(False)
        readable: asyncio.Future[None] = loop.create_future()
        fd = client.fileno()

        def ready() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(fd, ready)
        try:
            async with asyncio.timeout(FIRST_BYTE_TIMEOUT):
                await readable
            first = client.recv(1, socket.MSG_PEEK)
        except (TimeoutError, OSError):
            client.close()
            return
        finally:
            loop.remove_reader(fd)
        if not first:
            client.close()
            return
        tls = self._ssl if first[0] == TLS_HANDSHAKE else None
        try:
            await loop.connect_accepted_socket(self._factory, client, ssl=tls)
        except (OSError, ssl.SSLError, TimeoutError) as e:
            log.info("TLS handshake with %s failed: %s", _peer(client), e)
            client.close()

    def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
        for task in list(self._pending):
            task.cancel()
        for sock in self.sockets:
            sock.close()

    async def wait_closed(self) -> None:
        tasks = [t for t in [self._accepting, *self._pending] if t is not None]
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _peer(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"
