"""The slave's side of replication (RocketMQ 4.x ``HAClient``), on the broker's event loop.

Connects to the master's HA address (``haMasterAddress``, else what the NameServer's register reply names),
reports the end of its own CommitLog, and appends every transfer byte for byte where the master says it belongs;
the store's dispatch builds ConsumeQueue and IndexFile from the bytes as on the master.  It reports after each
transfer and every ``haSendHeartbeatInterval``; a master silent for ``haHousekeepingInterval``, a torn or
misplaced transfer, or a closed socket ends the connection and the next one starts from the slave's own end,
``haSendHeartbeatInterval`` later (RocketMQ waits a fixed 5 s, the same as that interval's default).

A slave whose log ends past the master's (the master lost a tail) stops replicating: streaming on would append
the master's new bytes after bytes the master no longer has.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import RemotingError
from broker.remoting.loop import send_frames
from broker.remoting.protocol.body import KVTable
from broker.remoting.protocol.wire import BodyError
from store.commitlog import ReplicaAppendError
from store.config import MessageStoreConfig
from store.errors import MQLakeError
from store.format import ha
from store.message_store import MessageStore

log = logging.getLogger(__name__)


async def append_replicated(store: MessageStore, offset: int, body: bytes) -> None:
    """Store a master's pushed bytes at ``offset``, the same for either replication protocol."""
    if store.replica_opens_segment(offset):  # creating a segment file blocks: off the loop
        await asyncio.to_thread(store.append_replica, offset, body)
    else:  # a memcpy into the mapped segment: a thread hop would cost more than it saves
        store.append_replica(offset, body)


def slave_runtime_info(master: str | None, connected: bool, reported: int, error: str | None) -> dict[str, str]:
    """A slave's replication keys in the broker's runtime info, the same for either replication protocol."""
    return {
        "haMasterAddress": master or "",
        "haConnected": str(connected).lower(),
        "haReportedOffset": str(reported),
        "haError": error or "",
    }


class HATransferError(MQLakeError):
    """A transfer this slave cannot take; the connection is closed and made again."""


class HAClient:
    def __init__(self, store: MessageStore, config: MessageStoreConfig, remoting: RemotingClient) -> None:
        self.store = store
        self.config = config
        self.remoting = remoting
        self.master_ha_address: str | None = config.ha_master_address
        self.master_address: str | None = None  # the master's remoting address, to compare offsets with
        self.connected = False
        self.error: str | None = None  # set when replication stopped for good
        self._reported = -1
        self._last_read = 0.0
        self._task: asyncio.Task[None] | None = None
        self._master_changed = asyncio.Event()  # cuts the wait before the next connection short
        self._writer: asyncio.StreamWriter | None = None

    @property
    def _interval(self) -> float:
        return self.config.ha_send_heartbeat_interval / 1000

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def update_master(self, ha_address: str | None, master_address: str | None) -> None:
        """From the NameServer's register reply: the HA address only when none is configured (as RocketMQ)."""
        if ha_address and self.config.ha_master_address is None and ha_address != self.master_ha_address:
            log.info("HA: master HA address %s -> %s", self.master_ha_address, ha_address)
            self.master_ha_address = ha_address
            self._master_changed.set()
        self.master_address = master_address

    def cut(self) -> None:
        """Close the current connection (the next one resumes from this slave's end)."""
        if self._writer is not None:
            self._writer.transport.abort()

    async def _run(self) -> None:
        while self.error is None:
            addr = self.master_ha_address
            if addr is not None and await self._master_not_behind():
                try:
                    await self._replicate(addr)
                except (OSError, asyncio.IncompleteReadError, TimeoutError, HATransferError, ReplicaAppendError) as e:
                    log.warning("HA: connection to master %s ended: %s", addr, e or type(e).__name__)
                except ValueError as e:  # an address without a port
                    log.error("HA: bad master HA address %r: %s", addr, e)
                except Exception:  # a bug must not end replication for good: log it and connect again
                    log.exception("HA: replication from %s failed", addr)
                finally:
                    self.connected = False
                    self._writer = None
            if self.error is None:
                self._master_changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._interval):
                        await self._master_changed.wait()

    async def _master_not_behind(self) -> bool:
        """False (and replication stopped) when the master's CommitLog ends before this slave's."""
        if self.master_address is None:
            return True
        mine = self.store.max_phy_offset  # read before asking: the master's answer can only be later
        try:
            cmd = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
            resp = await self.remoting.invoke(self.master_address, cmd, 3.0)
            if resp.code != ResponseCode.SUCCESS:
                return True  # a master still starting: its HA port refuses a slave ahead of it anyway
            theirs = int(KVTable.decode(resp.body).table["commitLogMaxOffset"])
        except (RemotingError, BodyError, KeyError, ValueError) as e:
            log.debug("HA: master %s runtime info unavailable: %s", self.master_address, e)
            return True
        if mine > theirs:
            self.error = (
                f"slave CommitLog max offset {mine} is ahead of master {self.master_address}'s max offset {theirs}: "
                f"the master lost data this slave holds; replication stopped (restore the master or rebuild the slave)"
            )
            log.error("HA: %s", self.error)
            return False
        return True

    async def _replicate(self, addr: str) -> None:
        host, _, port = addr.rpartition(":")
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), self._interval)
        self._writer = writer
        self.connected = True
        self._last_read = time.monotonic()
        log.info("HA: connected to master %s, reporting offset %d", addr, self.store.max_phy_offset)
        reporter = asyncio.ensure_future(self._report_periodically(writer))
        try:
            await self._report(writer, force=True)
            await self._receive(reader, writer)
        finally:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await reporter
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _report(self, writer: asyncio.StreamWriter, force: bool = False) -> None:
        end = self.store.max_phy_offset
        if force or end > self._reported:
            self._reported = end
            send_frames(writer, ha.encode_report(end))
            await writer.drain()

    async def _report_periodically(self, writer: asyncio.StreamWriter) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self._report(writer, force=True)

    async def _receive(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        housekeeping = self.config.ha_housekeeping_interval / 1000
        segment = self.config.mapped_file_size_commit_log
        while True:
            async with asyncio.timeout(housekeeping):
                header = await reader.readexactly(ha.TRANSFER_HEADER_SIZE)
                offset, size = ha.decode_transfer_header(header)
                if size < 0 or size > segment:
                    raise HATransferError(f"transfer at offset {offset} claims {size} bytes")
                mine = self.store.max_phy_offset
                if mine != 0 and offset != mine:
                    raise HATransferError(f"master pushed offset {offset}, not this slave's max offset {mine}")
                body = await reader.readexactly(size) if size else b""
            self._last_read = time.monotonic()
            if body:
                await append_replicated(self.store, offset, body)
                await self._report(writer)

    def runtime_info(self) -> dict[str, str]:
        return slave_runtime_info(self.master_ha_address, self.connected, self._reported, self.error)
