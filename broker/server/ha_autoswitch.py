"""Replication in controller mode (RocketMQ 5's ``AutoSwitchHAService``, ``AutoSwitchHAConnection``,
``AutoSwitchHAClient``), on the broker's event loop; the frames are ``store.format.ha``'s controller-mode ones.

A slave first shakes hands with its id; the master answers with its log's end and its epoch history
(``epochFileCheckpoint``).  A slave with a history of its own cuts its log to the last point both histories agree
on (a returning old master loses the records no replica acknowledged) and refuses to replicate when there is none;
then it reports its end, and the master streams from there, a transfer never spanning two epochs.  The master
tracks when each slave last caught up: that decides the sync state set it reports to the controller, and a SYNC
send waits for the set's acks (``allAckInSyncStateSet``: all of them, else the first).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from broker.remoting.errors import port_in_use
from broker.remoting.loop import send_frames
from broker.server.ha_master import OffsetWaiters
from broker.server.ha_slave import append_replicated, slave_runtime_info
from store.commitlog import ReplicaAppendError
from store.config import MessageStoreConfig
from store.epoch_file import EpochFile, consistent_point
from store.errors import MQLakeError
from store.format import ha
from store.message_store import MessageStore

log = logging.getLogger(__name__)


class HAProtocolError(MQLakeError):
    """A frame this side cannot take; the connection is closed."""


class AutoSwitchHAService:
    """The master's side: accepts slaves, streams to each, keeps the sync state set."""

    def __init__(self, store: MessageStore, config: MessageStoreConfig, epochs: EpochFile, host: str, port: int,
                 local_id: int, on_sync_state_set: Callable[[set[int]], None]) -> None:  # fmt: skip
        self.store = store
        self.config = config
        self.epochs = epochs
        self.host = host
        self.port = port
        self.local_id = local_id
        self.sync_state_set: set[int] = {local_id}
        self.on_sync_state_set = on_sync_state_set  # told a set to propose to the controller
        self.acks: dict[int, int] = {}  # slave id -> highest offset it acknowledged
        self.caught_up: dict[int, float] = {}  # slave id -> monotonic time it last held the master's end
        self.connections: set[AutoSwitchHAConnection] = set()
        self._waiters = OffsetWaiters()
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            self._server = await asyncio.start_server(self._accept, self.host, self.port)
        except OSError as e:
            raise port_in_use(e, self.host, self.port, "haListenPort (default: listenPort + 1)") from e
        self.port = self._server.sockets[0].getsockname()[1]
        self.store.add_append_listener(self._on_appended)
        log.info("HA (controller mode) listening on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        self._server = None
        self._release_waiters()

    def _on_appended(self, end: int) -> None:
        if self.connections and self._loop is not None and self._server is not None:
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        for conn in self.connections:
            conn.appended.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = AutoSwitchHAConnection(self, reader, writer)
        self.connections.add(conn)
        try:
            await conn.serve()
        finally:
            self.connections.discard(conn)

    # --- the sync state set and acks --------------------------------------------------------------------------
    def set_sync_state_set(self, members: set[int]) -> None:
        self.sync_state_set = set(members) | {self.local_id}
        self._release_waiters()

    def acked(self, slave_id: int, offset: int, master_end_at_last_transfer: int) -> None:
        self.acks[slave_id] = max(self.acks.get(slave_id, 0), offset)
        if offset >= master_end_at_last_transfer:
            self.caught_up[slave_id] = time.monotonic()
            # maybeExpandInSyncStateSet: a slave holding everything up to the current epoch joins
            if slave_id not in self.sync_state_set and offset >= self.epochs.entries[-1][1]:
                self.on_sync_state_set(self.sync_state_set | {slave_id})
        self._release_waiters()

    def shrunk_set(self) -> set[int]:
        """``maybeShrinkSyncStateSet``: the members that caught up within haMaxTimeSlaveNotCatchup (and this one)."""
        limit = self.config.ha_max_time_slave_not_catchup / 1000
        now = time.monotonic()
        return {m for m in self.sync_state_set
                if m == self.local_id or now - self.caught_up.get(m, float("-inf")) <= limit}  # fmt: skip

    def acked_by_set(self, end: int) -> int:
        """How many members of the sync state set hold everything before ``end`` (this master always does)."""
        return sum(1 for m in self.sync_state_set if m == self.local_id or self.acks.get(m, -1) >= end)

    def confirm_offset(self) -> int:
        """What every member of the set holds."""
        ends = [self.acks.get(m, 0) for m in self.sync_state_set if m != self.local_id]
        return min([self.store.max_phy_offset, *ends])

    def _satisfied(self, end: int) -> bool:
        members = len(self.sync_state_set)
        acked = self.acked_by_set(end)
        return acked >= members if self.config.all_ack_in_sync_state_set else acked >= min(2, members)

    def _release_waiters(self) -> None:
        if self._server is None:
            self._waiters.cancel()
        else:
            self._waiters.release(self._satisfied)

    async def wait_for_replicas(self, end: int, timeout: float) -> bool:
        """Until the sync state set holds everything before ``end`` (see ``_satisfied``); False after ``timeout``."""
        if self._satisfied(end):
            return True
        return await self._waiters.wait(end, timeout)

    def runtime_info(self) -> dict[str, str]:
        return {
            "haListenPort": str(self.port),
            "haConnections": str(len(self.connections)),
            "haSyncStateSet": ",".join(map(str, sorted(self.sync_state_set))),
            "haSlaveAckOffsets": ",".join(f"{k}={v}" for k, v in sorted(self.acks.items())),
            "haConfirmOffset": str(self.confirm_offset()),
        }


class AutoSwitchHAConnection:
    def __init__(self, service: AutoSwitchHAService, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.service = service
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.remote = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.slave_id = -1
        self.request_offset = -1
        self.last_master_end = 0  # the master's end when it last transferred (lastMasterMaxOffset)
        self.appended = asyncio.Event()
        self._requested = asyncio.Event()

    def close(self) -> None:
        self.writer.transport.abort()

    async def serve(self) -> None:
        try:
            await self._handshake()
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError, HAProtocolError) as e:
            log.warning("HA: handshake with %s failed: %s", self.remote, e or type(e).__name__)
            self.close()
            return
        tasks = [asyncio.ensure_future(self._read_reports()), asyncio.ensure_future(self._write_transfers())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                err = t.exception()
                if isinstance(err, TimeoutError):
                    log.warning("HA: slave %d (%s) silent for %d ms, closing", self.slave_id, self.remote,
                                self.service.config.ha_housekeeping_interval)  # fmt: skip
                elif isinstance(err, HAProtocolError):
                    log.warning("HA: slave %d (%s): %s", self.slave_id, self.remote, err)
                elif err is not None and not isinstance(err, asyncio.IncompleteReadError | ConnectionError | OSError):
                    log.error("HA: connection to slave %s failed: %r", self.remote, err)
        finally:
            for t in tasks:
                t.cancel()
            self.close()
            log.info("HA: slave %d (%s) disconnected", self.slave_id, self.remote)

    async def _handshake(self) -> None:
        cfg = self.service.config
        async with asyncio.timeout(cfg.ha_housekeeping_interval / 1000):
            state, _, _, slave_id = ha.decode_slave_handshake(await self.reader.readexactly(ha.SLAVE_HANDSHAKE_SIZE))
        if state != ha.STATE_HANDSHAKE:
            raise HAProtocolError(f"expected a handshake (state {ha.STATE_HANDSHAKE}), got state {state}")
        self.slave_id = slave_id
        epochs = self.service.epochs
        send_frames(self.writer, ha.encode_master_handshake(self.service.store.max_phy_offset, epochs.last_epoch,
                                                            epochs.entries))  # fmt: skip
        await self.writer.drain()
        log.info("HA: slave %d (%s) shook hands", slave_id, self.remote)

    async def _read_reports(self) -> None:
        cfg = self.service.config
        while True:
            async with asyncio.timeout(cfg.ha_housekeeping_interval / 1000):
                data = await self.reader.readexactly(ha.SLAVE_REPORT_SIZE)
            state, offset = ha.decode_slave_report(data)
            if state != ha.STATE_TRANSFER:
                raise HAProtocolError(f"slave {self.slave_id} reported in state {state}")
            if self.request_offset < 0:
                if offset > self.service.store.max_phy_offset:
                    raise HAProtocolError(f"slave {self.slave_id} reports offset {offset}, past this master's end "
                                          f"{self.service.store.max_phy_offset}")  # fmt: skip
                self.request_offset = offset
                self._requested.set()
            self.service.acked(self.slave_id, offset, self.last_master_end)

    async def _write_transfers(self) -> None:
        svc = self.service
        store, cfg = svc.store, svc.config
        await self._requested.wait()
        nxt = self.request_offset if self.request_offset > 0 else store.min_phy_offset
        heartbeat = cfg.ha_send_heartbeat_interval / 1000
        last_write = 0.0
        while True:
            self.appended.clear()
            epoch, start, end = svc.epochs.entry_for(nxt) if svc.epochs.entries else (0, 0, -1)
            limit = cfg.ha_transfer_batch_size if end < 0 else min(cfg.ha_transfer_batch_size, end - nxt)
            data = store.commitlog_data(nxt, limit) if limit > 0 else None
            self.last_master_end = store.max_phy_offset
            if data:
                header = ha.encode_master_transfer_header(nxt, len(data), epoch, start, svc.confirm_offset())
                send_frames(self.writer, header, data)
                nxt += len(data)
                await self.writer.drain()
                last_write = time.monotonic()
                continue
            if time.monotonic() - last_write >= heartbeat:
                send_frames(self.writer, ha.encode_master_transfer_header(nxt, 0, epoch, start, svc.confirm_offset()))
                await self.writer.drain()
                last_write = time.monotonic()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.01, heartbeat - (time.monotonic() - last_write))):
                    await self.appended.wait()


class AutoSwitchHAClient:
    """The slave's side: follows the master the controller named (its HA address from the NameServer's reply)."""

    def __init__(self, store: MessageStore, config: MessageStoreConfig, epochs: EpochFile, broker_id: int) -> None:
        self.store = store
        self.config = config
        self.epochs = epochs
        self.broker_id = broker_id
        self.master_ha_address: str | None = None
        self.connected = False
        self.error: str | None = None  # set when this slave cannot follow its master (no common history)
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._writer: asyncio.StreamWriter | None = None
        self._reported = -1

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def update_master(self, ha_address: str | None) -> None:
        if ha_address and ha_address != self.master_ha_address:
            log.info("HA: master HA address %s -> %s", self.master_ha_address, ha_address)
            self.master_ha_address = ha_address
            if self._writer is not None:
                self._writer.transport.abort()
            self._changed.set()

    async def _run(self) -> None:
        interval = self.config.ha_send_heartbeat_interval / 1000
        while self.error is None:
            addr = self.master_ha_address
            if addr is not None:
                try:
                    await self._replicate(addr)
                except (OSError, asyncio.IncompleteReadError, TimeoutError, HAProtocolError, ReplicaAppendError) as e:
                    log.warning("HA: connection to master %s ended: %s", addr, e or type(e).__name__)
                except Exception:
                    log.exception("HA: replication from %s failed", addr)
                finally:
                    self.connected = False
                    self._writer = None
            if self.error is None:
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(interval):
                        await self._changed.wait()

    async def _replicate(self, addr: str) -> None:
        host, _, port = addr.rpartition(":")
        interval = self.config.ha_send_heartbeat_interval / 1000
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), max(interval, 3.0))
        self._writer = writer
        try:
            send_frames(writer, ha.encode_slave_handshake(self.broker_id))
            await writer.drain()
            housekeeping = self.config.ha_housekeeping_interval / 1000
            async with asyncio.timeout(housekeeping):
                state, size, master_end, _ = ha.decode_master_header(await reader.readexactly(ha.MASTER_HANDSHAKE_SIZE))
                body = await reader.readexactly(size) if size else b""
            if state != ha.STATE_HANDSHAKE:
                raise HAProtocolError(f"master answered the handshake in state {state}")
            if not await self._truncate(ha.decode_epoch_entries(body), master_end):
                return
            self.connected = True
            await self._report(writer, force=True)
            reporter = asyncio.ensure_future(self._report_periodically(writer, interval))
            try:
                await self._receive(reader, writer, housekeeping)
            finally:
                reporter.cancel()
        finally:
            writer.transport.abort()

    async def _truncate(self, master_epochs: list[tuple[int, int]], master_end: int) -> bool:
        """Cut this log to where it agrees with the master's (``doTruncate``); False, and replication stopped for
        good, when the two share no epoch."""
        if not self.epochs.entries:
            return True
        mine = self.store.max_phy_offset
        point = consistent_point(self.epochs.entries, mine, master_epochs, master_end)
        if point < 0:
            self.error = (f"{self.epochs.path}: no epoch in common with the master's {master_epochs} (this log's: "
                          f"{self.epochs.entries}): this broker cannot truncate to a point its master agrees on, and "
                          f"does not replicate; rebuild its store from an empty directory")  # fmt: skip
            log.error("HA: %s", self.error)
            return False
        if point < mine:
            log.warning("HA: CommitLog cut from %d to %d, where it agrees with the master's (epochs %s vs %s); the "
                        "records past it were never acknowledged by the sync state set", mine, point,
                        self.epochs.entries, master_epochs)  # fmt: skip
            await asyncio.to_thread(self.store.truncate_to, point)
            self.epochs.truncate_from(point)
        return True

    async def _report(self, writer: asyncio.StreamWriter, force: bool = False) -> None:
        end = self.store.max_phy_offset
        if force or end > self._reported:
            self._reported = end
            send_frames(writer, ha.encode_slave_report(end))
            await writer.drain()

    async def _report_periodically(self, writer: asyncio.StreamWriter, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await self._report(writer, force=True)

    async def _receive(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, housekeeping: float) -> None:
        segment = self.config.mapped_file_size_commit_log
        current_epoch = self.epochs.last_epoch
        while True:
            async with asyncio.timeout(housekeeping):
                head = await reader.readexactly(ha.MASTER_TRANSFER_SIZE)
                state, size, offset, epoch = ha.decode_master_header(head)
                epoch_start, _confirm = ha.decode_master_transfer_tail(head[ha.MASTER_HANDSHAKE_SIZE:])
                if state != ha.STATE_TRANSFER or size < 0 or size > segment:
                    raise HAProtocolError(f"bad transfer header: state {state}, {size} bytes at offset {offset}")
                body = await reader.readexactly(size) if size else b""
            mine = self.store.max_phy_offset
            if mine != 0 and offset != mine:
                raise HAProtocolError(f"master pushed offset {offset}, not this slave's max offset {mine}")
            if epoch != current_epoch and (size or offset == mine):
                if epoch > self.epochs.last_epoch:
                    self.epochs.append(epoch, epoch_start)
                current_epoch = epoch
            if body:
                await append_replicated(self.store, offset, body)
                await self._report(writer)

    def runtime_info(self) -> dict[str, str]:
        return slave_runtime_info(self.master_ha_address, self.connected, self._reported, self.error)
