"""Event loop choice: uvloop when importable (about 2x asyncio's throughput on loopback), else asyncio; one
behaviour of a closed stream under both; and the wait for SIGTERM/SIGINT that every server process (``mqlake up``,
``broker``, ``namesrv``) ends with."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def send_frames(writer: asyncio.StreamWriter, *frames: bytes) -> None:
    """Write frames to a stream; ConnectionResetError when its connection has closed already. A closed transport
    refuses a write with RuntimeError under uvloop and drops it under asyncio: either way the peer is gone, which a
    stream's loop handles as a ConnectionError."""
    if writer.is_closing():
        raise ConnectionResetError("the peer's connection is closed")
    for frame in frames:
        writer.write(frame)


def _uvloop() -> Any:
    if os.environ.get("MQLAKE_NO_UVLOOP"):
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop


def install_event_loop_policy() -> bool:
    """Make new event loops uvloop loops; returns whether uvloop is in use."""
    uvloop = _uvloop()
    if uvloop is None:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def new_event_loop() -> asyncio.AbstractEventLoop:
    uvloop = _uvloop()
    return uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()


async def wait_for_signal() -> None:
    """Return once the process gets SIGTERM or SIGINT (the handlers are removed again)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on a uvloop loop when available (MQLAKE_NO_UVLOOP=1 forces plain asyncio)."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)
