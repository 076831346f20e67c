"""Connection: one remoting TCP channel, used by both the server and the client side.

Every inbound request runs as its own task (a parked long-poll must not hold up the requests behind it);
responses are matched to callers by opaque. Replies queued in one event-loop iteration go out in one
``writelines`` call, which on loopback is worth several times the throughput of one write per reply.
Backpressure: reading stops while ``max_in_flight`` requests are unanswered or while the transport's write
buffer is above its high-water mark, so a client that pipelines without reading cannot grow our memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, cast

from broker.remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, MAX_FRAME, ResponseCode, code_name
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import (
    BodyError,
    FrameError,
    HeaderError,
    RemotingConnectError,
    RemotingTimeoutError,
    RequestRefused,
)

log = logging.getLogger(__name__)


class Channel(Protocol):
    """What a request handler uses of the connection a request came on (RocketMQ's ``Channel``); hashable, so
    it can key the client tables. ``Connection`` is the one the remoting layer passes."""

    remote_addr: str  # "ip:port" of the peer
    remote_host: tuple[str, int]  # the peer as (ip, port): a sent record's born host

    def close(self) -> None: ...

    async def send_oneway(self, cmd: RemotingCommand) -> None: ...


# Normally an ``async def``; a plain function returning the response (or None) is also accepted and is answered
# without creating a task, which saves a few microseconds per request on hot paths that never wait.  A plain
# function may also return the response already encoded (``bytes``: the whole frame, its opaque the request's),
# as the send fast path does. An ``asyncio.Future`` (not a coroutine) is answered when it completes, without a
# task either: a SYNC_FLUSH send's ready frame waits so for its group commit (``broker.server.flush_acks``).
HandlerResult = Awaitable[RemotingCommand | bytes | None] | RemotingCommand | bytes | None
Handler = Callable[[RemotingCommand, Channel], HandlerResult]
Dispatcher = Callable[[int], Handler | None]

_LENGTH = struct.Struct(">i")
WRITE_HIGH_WATER = 4 * 1024 * 1024
WRITE_LOW_WATER = 1024 * 1024
_OPAQUE_WRAP = 0x7FFFFFFF


class Connection(asyncio.Protocol):
    """A remoting channel. Created by RemotingServer / RemotingClient, never directly by users."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        name: str = "remoting",
        max_frame: int = MAX_FRAME,
        max_in_flight: int = 1024,
        on_open: Callable[[Connection], None] | None = None,
        on_close: Callable[[Connection], None] | None = None,
    ) -> None:
        self._dispatch = dispatcher
        self._name = name
        self._max_frame = max_frame
        self._max_in_flight = max_in_flight
        self._on_open = on_open
        self._on_close = on_close
        self.remote_addr = "?"
        self.remote_host: tuple[str, int] = ("127.0.0.1", 0)  # the peer as (ip, port): a sent record's born host
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._loop = asyncio.get_running_loop()
        self._buf = bytearray()
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._opaques = itertools.count(1)
        self.tasks: set[asyncio.Future[Any]] = set()  # requests being answered: tasks, or a handler's futures
        self._in_flight = 0
        self._write_paused = False
        self._stopped_reading = False  # set by the server while it shuts down
        self._reading_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._held = 0  # requests held by hold_answer, not answered yet
        self._held_answered: asyncio.Future[None] | None = None  # while stopping: done once _held is back to 0

    # --- asyncio.Protocol --------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream's transport: an asyncio.Transport in all but name (uvloop's do not subclass asyncio's).
        self.transport = stream = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.remote_host = (str(peer[0]), int(peer[1]))
            self.remote_addr = f"{peer[0]}:{peer[1]}"
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stream.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        if self._on_open is not None:
            self._on_open(self)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self._buf += data
        self._parse()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        self._buf = bytearray()
        self._out.clear()
        error = RemotingConnectError(f"connection {self.remote_addr} closed" + (f": {exc}" if exc else ""))
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(error)
        self._wake_drainers(error)
        if self._on_close is not None:
            try:
                self._on_close(self)
            except Exception:
                log.exception("%s: close listener failed for %s", self._name, self.remote_addr)

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_drainers(None)
        self._update_reading()

    # --- inbound -----------------------------------------------------------------------------------------------

    def _parse(self) -> None:
        buf = self._buf
        pos = 0
        end = len(buf)
        # Slicing a memoryview copies each frame once (bytearray slices copy twice: 10x slower for 4 MiB bodies).
        with memoryview(buf) as view:
            while end - pos >= 4 and self._in_flight < self._max_in_flight and not self.closed:
                (length,) = _LENGTH.unpack_from(buf, pos)
                if length < 4 or length > self._max_frame:
                    self._protocol_error(f"frame length {length} outside [4, {self._max_frame}]")
                    return
                if end - pos - 4 < length:
                    break
                try:
                    cmd = RemotingCommand.decode(view[pos + 4 : pos + 4 + length])
                except Exception as e:  # FrameError, or anything a hostile frame provokes: drop this peer only
                    self._protocol_error(str(e) if isinstance(e, FrameError) else repr(e))
                    return
                pos += 4 + length
                self._on_command(cmd)
        if pos:
            del buf[:pos]
        self._update_reading()

    def _protocol_error(self, reason: str) -> None:
        # RocketMQ closes a channel whose bytes it cannot decode; the peer's other requests are lost with it.
        log.warning("%s: closing %s: malformed frame: %s", self._name, self.remote_addr, reason)
        self._buf = bytearray()
        self.close()

    def _on_command(self, cmd: RemotingCommand) -> None:
        if cmd.is_response:
            fut = self._pending.pop(cmd.opaque, None)
            if fut is not None and not fut.done():
                fut.set_result(cmd)
            else:
                log.debug("%s: response opaque=%d from %s matches no call", self._name, cmd.opaque, self.remote_addr)
            return
        handler = self._dispatch(cmd.code)
        if handler is None:
            log.warning("%s: %s sent unsupported request code %d", self._name, self.remote_addr, cmd.code)
            if not cmd.is_oneway:
                self._send_response(
                    cmd,
                    cmd.response(
                        ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported"
                    ),
                )
            return
        try:
            result = handler(cmd, self)
        except Exception as e:
            self._finish(cmd, self._failure(cmd, e))
            return
        if isinstance(result, bytes):
            if not cmd.is_oneway:
                self._queue(result)
            return
        if result is None or isinstance(result, RemotingCommand):
            self._finish(cmd, result)  # a plain-function handler: answered without a task
            return
        self._in_flight += 1
        if isinstance(result, asyncio.Future):
            self.tasks.add(result)
            result.add_done_callback(functools.partial(self._future_done, cmd))
            return
        task = asyncio.ensure_future(self._run(result, cmd), loop=self._loop)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def hold_answer(self) -> None:
        """The request being handled is answered later by ``answer_held`` (no task, no future per request: a
        SYNC_FLUSH send whose group commit answers it); until then it counts as in flight, as a task would."""
        self._in_flight += 1
        self._held += 1

    def answer_held(self, response: bytes | RemotingCommand) -> None:
        """Answer a request held by ``hold_answer`` with its whole frame (or a response carrying its opaque and
        the response flag already); answers made in one loop callback go out in one ``writelines``. Nothing is
        written once the channel is closed."""
        self._in_flight -= 1
        self._held -= 1
        if isinstance(response, bytes):
            self._queue(response)
        elif not self.closed:
            self._write(response)
        self._after_held_answers()

    def answer_held_frames(self, frames: list[bytes]) -> None:
        """``answer_held`` for several whole frames at once, in their order (a group commit's replies to this
        connection): one look at the write queue and at the reading state for all of them."""
        count = len(frames)
        self._in_flight -= count
        self._held -= count
        if not self.closed:
            self._out.extend(frames)
            self._schedule_flush()
        self._after_held_answers()

    def _after_held_answers(self) -> None:
        if not self._held and self._held_answered is not None:
            self.tasks.discard(self._held_answered)
            if not self._held_answered.done():
                self._held_answered.set_result(None)
            self._held_answered = None
        self._resume_after_answer()

    def _future_done(self, cmd: RemotingCommand, fut: asyncio.Future[RemotingCommand | bytes | None]) -> None:
        self.tasks.discard(fut)
        self._in_flight -= 1
        if fut.cancelled():
            response: object = cmd.response(ResponseCode.SYSTEM_ERROR, "request cancelled")
        else:
            e = fut.exception()
            response = fut.result() if e is None else self._failure(cmd, cast(Exception, e))
        self._finish(cmd, response)
        self._resume_after_answer()

    async def _run(self, pending: Awaitable[RemotingCommand | bytes | None], cmd: RemotingCommand) -> None:
        try:
            response = await pending
        except Exception as e:
            response = self._failure(cmd, e)
        self._finish(cmd, response)

    def _failure(self, cmd: RemotingCommand, e: Exception) -> RemotingCommand:
        if isinstance(e, RequestRefused):
            return cmd.response(e.code, e.remark)
        if isinstance(e, HeaderError | BodyError):
            # Java turns RemotingCommandException from decoding a header or body into SYSTEM_ERROR + message.
            log.info("%s: bad %s from %s: %s", self._name, code_name(cmd.code, False), self.remote_addr, e)
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(e))
        log.error("%s: handler for %s from %s failed", self._name, code_name(cmd.code, False), self.remote_addr,
                  exc_info=e)
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")

    def _finish(self, cmd: RemotingCommand, response: object) -> None:
        if response is None or cmd.is_oneway:
            return
        if isinstance(response, bytes):  # a whole frame, encoded by the handler
            self._queue(response)
            return
        if not isinstance(response, RemotingCommand):
            log.error("%s: handler for %s returned %r", self._name, code_name(cmd.code, False), type(response))
            response = cmd.response(ResponseCode.SYSTEM_ERROR, f"handler returned {type(response).__name__}")
        self._send_response(cmd, response)

    def _send_response(self, request: RemotingCommand, response: RemotingCommand) -> None:
        response.opaque = request.opaque
        response.flag |= FLAG_RESPONSE
        try:
            self._write(response)
        except Exception as e:
            # An unencodable response must still answer, or the caller waits for its timeout.
            log.exception("%s: cannot encode response to %s", self._name, code_name(request.code, False))
            self._write(request.response(ResponseCode.SYSTEM_ERROR, f"cannot encode response: {e}"))

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self._in_flight -= 1
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: request task failed", self._name, exc_info=task.exception())
        self._resume_after_answer()

    def _resume_after_answer(self) -> None:
        if self._in_flight == self._max_in_flight - 1 and self._buf and not self.closed:
            self._parse()  # frames left in the buffer when the limit was hit
        else:
            self._update_reading()

    def _update_reading(self) -> None:
        if self.transport is None or self.closed:
            return
        pause = self._write_paused or self._stopped_reading or self._in_flight >= self._max_in_flight
        if pause != self._reading_paused:
            self._reading_paused = pause
            if pause:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def stop_reading(self) -> None:
        """Take no new requests (server shutdown); in-flight ones still answer."""
        self._stopped_reading = True
        if self._held and self._held_answered is None:  # the server waits for the held answers as for tasks
            self._held_answered = self._loop.create_future()
            self.tasks.add(self._held_answered)
        self._update_reading()

    # --- outbound ----------------------------------------------------------------------------------------------

    def _write(self, cmd: RemotingCommand) -> None:
        head, body = cmd.encode_parts()
        self._queue(head, body)

    def _queue(self, head: bytes, body: bytes = b"") -> None:
        """Queue an encoded frame; everything queued in one loop iteration goes out in one ``writelines``."""
        if self.closed:
            return
        self._out.append(head)
        if body:
            self._out.append(body)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(out)

    def _wake_drainers(self, error: Exception | None) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for fut in waiters:
            if not fut.done():
                if error is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(error)

    async def drain(self) -> None:
        """Wait while the write buffer is above its high-water mark."""
        while self._write_paused and not self.closed:
            fut = self._loop.create_future()
            self._drain_waiters.append(fut)
            await fut
        if self.closed:
            raise RemotingConnectError(f"connection {self.remote_addr} closed")

    def _next_opaque(self) -> int:
        opaque = next(self._opaques)
        if opaque >= _OPAQUE_WRAP:
            self._opaques = itertools.count(1)
        return opaque

    async def send_oneway(self, cmd: RemotingCommand) -> None:
        """Send a request that gets no answer (flag ONEWAY); e.g. broker -> consumer notifications."""
        if self._write_paused or self.closed:
            await self.drain()
        cmd.flag = (cmd.flag | FLAG_ONEWAY) & ~FLAG_RESPONSE
        cmd.opaque = self._next_opaque()
        self._write(cmd)

    async def invoke(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send a request and wait for its response; RemotingTimeoutError / RemotingConnectError otherwise."""
        if self._write_paused or self.closed:
            await self.drain()
        cmd.flag &= ~(FLAG_ONEWAY | FLAG_RESPONSE)
        opaque = cmd.opaque = self._next_opaque()
        fut: asyncio.Future[RemotingCommand] = self._loop.create_future()
        self._pending[opaque] = fut
        timer = self._loop.call_later(timeout, self._expire, opaque, cmd.code, timeout)
        try:
            self._write(cmd)
            return await fut
        finally:
            timer.cancel()
            self._pending.pop(opaque, None)

    def _expire(self, opaque: int, code: int, timeout: float) -> None:
        fut = self._pending.pop(opaque, None)
        if fut is not None and not fut.done():
            fut.set_exception(
                RemotingTimeoutError(
                    f"no response from {self.remote_addr} to {code_name(code, False)} opaque={opaque} "
                    f"within {timeout:g}s"
                )
            )

    def close(self) -> None:
        """Close the channel after writing what is queued; pending calls fail with RemotingConnectError."""
        if self.transport is not None and not self.transport.is_closing():
            self._flush()
            self.transport.close()
