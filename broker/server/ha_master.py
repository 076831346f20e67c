"""The master's side of replication (RocketMQ 4.x ``HAService`` / ``HAConnection``), on the broker's event loop.

Each slave connects to ``haListenPort`` and reports the end of its CommitLog (8 bytes, ``store.format.ha``); the
first report says where to stream from (0: the start of the master's newest segment, as RocketMQ does), every
report acknowledges what the slave holds.  The master answers with transfers of at most ``haTransferBatchSize``
bytes, never past the end of a segment, and a heartbeat (an empty transfer) after ``haSendHeartbeatInterval`` of
silence; a slave silent for ``haHousekeepingInterval`` is dropped.  A SYNC_MASTER send waits in
``wait_for_slave`` until some slave acknowledged its end (``GroupTransferService``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable

from broker.remoting.errors import port_in_use
from broker.remoting.loop import send_frames
from store.config import MessageStoreConfig
from store.format import ha
from store.message_store import MessageStore

log = logging.getLogger(__name__)


class OffsetWaiters:
    """Sends waiting until replicas hold everything before an offset: each answered True once ``release`` finds
    its offset held, False at ``cancel`` (the service stopped) or when its timeout passes."""

    def __init__(self) -> None:
        self._waiting: list[tuple[int, asyncio.Future[bool]]] = []

    async def wait(self, end: int, timeout: float) -> bool:
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append((end, fut))
        try:
            async with asyncio.timeout(timeout):
                return await fut
        except TimeoutError:
            return False

    def release(self, held: Callable[[int], bool]) -> None:
        waiting = []
        for end, fut in self._waiting:
            if fut.done():
                continue
            if held(end):
                fut.set_result(True)
            else:
                waiting.append((end, fut))
        self._waiting = waiting

    def cancel(self) -> None:
        for _, fut in self._waiting:
            if not fut.done():
                fut.set_result(False)
        self._waiting.clear()

LAG_WINDOW = 100_000  # replication lags kept for GET_BROKER_RUNTIME_INFO's percentiles


class HAService:
    """Accepts slaves, streams the CommitLog to each, and tracks the highest offset any slave acknowledged."""

    def __init__(self, store: MessageStore, config: MessageStoreConfig, host: str, port: int) -> None:
        self.store = store
        self.config = config
        self.host = host
        self.port = port
        self.connections: set[HAConnection] = set()
        self.push_to_slave_max_offset = 0  # push2SlaveMaxOffset: the highest offset a slave acknowledged
        self._waiters = OffsetWaiters()
        # Replication lag: from an append on the master to a slave's ack covering it, for the latest appends
        self._unacked: deque[tuple[int, float]] = deque()  # (end offset, monotonic time of the append)
        self.ack_lags_ms: deque[float] = deque(maxlen=LAG_WINDOW)
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        try:
            self._server = await asyncio.start_server(self._accept, self.host, self.port)
        except OSError as e:  # the HA port defaults to listenPort + 1, which another process may hold
            raise port_in_use(e, self.host, self.port, "haListenPort (default: listenPort + 1)") from e
        self.port = self._server.sockets[0].getsockname()[1]
        self.store.add_append_listener(self.on_appended)
        log.info("HA service listening on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            await conn.close()
        if self._server is not None:
            await self._server.wait_closed()
        self._waiters.cancel()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = HAConnection(self, reader, writer)
        self.connections.add(conn)
        log.info("HA: slave %s connected", conn.remote)
        try:
            await conn.serve()
        finally:
            self.connections.discard(conn)
            log.info("HA: slave %s disconnected", conn.remote)

    # --- wake-ups and acknowledgements ------------------------------------------------------------------------
    def on_appended(self, end: int) -> None:
        """An append listener: wake every connection's writer (from whichever thread appended)."""
        if not self.connections:
            return  # no slave: nothing to wake (this runs on every put)
        if len(self._unacked) >= 4 * LAG_WINDOW:  # a slave connected but acking nothing: keep the newest
            self._unacked.clear()
        self._unacked.append((end, time.monotonic()))
        if threading.get_ident() == self._loop_thread:
            self._wake_writers()
        elif self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake_writers)

    def _wake_writers(self) -> None:
        for conn in self.connections:
            conn.appended.set()

    def notify_transfer_some(self, offset: int) -> None:
        """A slave acknowledged ``offset``: release every send waiting for less."""
        if offset <= self.push_to_slave_max_offset:
            return
        self.push_to_slave_max_offset = offset
        now = time.monotonic()
        while self._unacked and self._unacked[0][0] <= offset:
            self.ack_lags_ms.append((now - self._unacked.popleft()[1]) * 1000)
        self._waiters.release(lambda end: end <= offset)

    def is_slave_ok(self, master_put_where: int) -> bool:
        """``isSlaveOK``: a slave is connected and not more than ``haMaxGapNotInSync`` behind."""
        return bool(self.connections) and (
            master_put_where - self.push_to_slave_max_offset < self.config.ha_max_gap_not_in_sync
        )

    async def wait_for_slave(self, next_offset: int, timeout: float) -> bool:
        """Until a slave acknowledged everything before ``next_offset``; False after ``timeout`` seconds."""
        if self.push_to_slave_max_offset >= next_offset:
            return True
        return await self._waiters.wait(next_offset, timeout)

    def runtime_info(self) -> dict[str, str]:
        slaves = [c for c in self.connections if c.ack_offset >= 0]
        return {
            "haListenPort": str(self.port),
            "haConnections": str(len(self.connections)),
            "haPushToSlaveMaxOffset": str(self.push_to_slave_max_offset),
            "haSlaveAckOffsets": ",".join(f"{c.remote}={c.ack_offset}" for c in slaves),
            **self._lag_percentiles(),
        }

    def _lag_percentiles(self) -> dict[str, str]:
        lags = sorted(self.ack_lags_ms)
        if len(lags) < 2:
            return {}
        q = statistics.quantiles(lags, n=100)
        p50, p99 = q[49], q[98]
        return {"haAckLagCount": str(len(lags)), "haAckLagP50Ms": f"{p50:.3f}", "haAckLagP99Ms": f"{p99:.3f}",
                "haAckLagMaxMs": f"{lags[-1]:.3f}"}  # fmt: skip


class HAConnection:
    """One slave: a reader of its reports and a writer of transfers, ended together."""

    def __init__(self, service: HAService, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.service = service
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.remote = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.request_offset = -1  # slaveRequestOffset: the slave's first report
        self.ack_offset = -1  # slaveAckOffset: its latest
        self.appended = asyncio.Event()
        self._requested = asyncio.Event()
        self._closed = False

    async def serve(self) -> None:
        tasks = [asyncio.ensure_future(self._read_reports()), asyncio.ensure_future(self._write_transfers())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                    await t
            await self.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()

    async def _read_reports(self) -> None:
        cfg = self.service.config
        store = self.service.store
        while True:
            try:
                async with asyncio.timeout(cfg.ha_housekeeping_interval / 1000):
                    data = await self.reader.readexactly(ha.REPORT_HEADER_SIZE)
            except TimeoutError:
                log.warning("HA: slave %s silent for %d ms, closing", self.remote, cfg.ha_housekeeping_interval)
                return
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            offset = ha.decode_report(data)
            if self.request_offset < 0:
                master_max = store.max_phy_offset
                if offset > master_max:
                    log.error(
                        "HA: slave %s reports CommitLog offset %d, ahead of this master's max offset %d: the master "
                        "lost a tail the slave holds; refusing to replicate (the logs would diverge)",
                        self.remote, offset, master_max,
                    )  # fmt: skip
                    return
                self.request_offset = offset
                log.info("HA: slave %s requests from offset %d", self.remote, offset)
                self._requested.set()
            self.ack_offset = offset
            self.service.notify_transfer_some(offset)

    async def _write_transfers(self) -> None:
        cfg = self.service.config
        store = self.service.store
        await self._requested.wait()
        file_size = cfg.mapped_file_size_commit_log
        if self.request_offset == 0:
            master_max = store.max_phy_offset
            next_offset = master_max - master_max % file_size
        else:
            next_offset = self.request_offset
        if next_offset < store.min_phy_offset:
            log.error(
                "HA: slave %s needs offset %d, but this master's CommitLog starts at %d (older segments deleted): "
                "rebuild the slave from an empty store", self.remote, next_offset, store.min_phy_offset,
            )  # fmt: skip
            return
        log.info("HA: streaming to slave %s from offset %d", self.remote, next_offset)
        heartbeat = cfg.ha_send_heartbeat_interval / 1000
        last_write = time.monotonic()
        while True:
            self.appended.clear()  # before reading, so an append after the read wakes the wait below
            data = store.commitlog_data(next_offset, cfg.ha_transfer_batch_size)
            if data:
                send_frames(self.writer, ha.encode_transfer_header(next_offset, len(data)), data)
                next_offset += len(data)
                await self.writer.drain()
                last_write = time.monotonic()
                continue
            if time.monotonic() - last_write >= heartbeat:
                send_frames(self.writer, ha.encode_transfer_header(next_offset, 0))
                await self.writer.drain()
                last_write = time.monotonic()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, heartbeat - (time.monotonic() - last_write))):
                    await self.appended.wait()
