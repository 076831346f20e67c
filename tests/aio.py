"""asyncio test helpers: run an async test body on the project's event loop, poll with a deadline."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time

from broker.remoting.loop import run


def async_test(fn):
    """Decorator: run an ``async def test_...`` on a fresh (uvloop) event loop; fixtures still work."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return run(fn(*args, **kwargs))

    return wrapper


async def poll(predicate, timeout: float = 5.0, what: str = "", interval: float = 0.005) -> object:
    """The event-loop twin of tests.helpers.wait_until: yields to the loop between polls.  ``predicate`` may
    be a coroutine function (a remote query); give it a longer ``interval`` then."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what or predicate!r}")
        await asyncio.sleep(interval)
