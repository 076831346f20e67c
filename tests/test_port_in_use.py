"""A server whose port is taken stops start-up with an error naming the setting to change (``mqlake up`` prints it
and exits 1): the broker's listenPort, and the HA port, which defaults to listenPort + 1 and so may be held by
another process on a busy host even when listenPort was free."""

from __future__ import annotations

import asyncio
import errno
import socket

import pytest

from broker.remoting.errors import PortInUseError
from broker.remoting.server import RemotingServer
from store.errors import MQLakeError
from tests.live_broker import running_broker


def _held() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


@pytest.mark.integration
def test_a_taken_listen_port_names_listenport() -> None:
    with _held() as holder:
        port = holder.getsockname()[1]
        with pytest.raises(PortInUseError) as caught:
            asyncio.run(RemotingServer("127.0.0.1", port, name="broker").start())
    assert caught.value.errno == errno.EADDRINUSE and isinstance(caught.value, MQLakeError | OSError)
    assert f"127.0.0.1:{port} is already in use" in str(caught.value) and "listenPort" in str(caught.value)


@pytest.mark.integration
def test_a_taken_ha_port_stops_the_broker_naming_halistenport(tmp_path) -> None:
    async def start() -> None:
        async with running_broker(tmp_path / "store", haListenPort=str(port)):
            pass

    with _held() as holder:
        port = holder.getsockname()[1]
        with pytest.raises(PortInUseError, match=rf"127\.0\.0\.1:{port} .*haListenPort \(default: listenPort \+ 1\)"):
            asyncio.run(start())
