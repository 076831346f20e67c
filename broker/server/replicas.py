"""Controller mode (RocketMQ 5's ``ReplicasManager``): the broker's side of automatic failover.

At start the broker finds the controller group's leader (CONTROLLER_GET_METADATA_INFO on each ``controllerAddr``),
gets an id for itself (GET_NEXT_BROKER_ID, ``brokerIdentity-temp``, APPLY_BROKER_ID, ``brokerIdentity``; a restart
reuses the id in ``brokerIdentity``) and registers (REGISTER_BROKER).  It then heartbeats to every controller
(BROKER_HEARTBEAT, oneway, with its last epoch and max offset: what an election compares), follows the master the
controller names (its answer to REGISTER_BROKER, NOTIFY_BROKER_ROLE_CHANGED at once after an election, and
GET_REPLICA_INFO every ``syncBrokerMetadataPeriod``; no master at all: ELECT_MASTER), and, as master, proposes
sync state sets (ALTER_SYNC_STATE_SET) as slaves catch up or fall behind.  Role changes go to the broker
(``RoleTarget``), one at a time, each for a higher master epoch only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from broker.remoting import controller_protocol as cp
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import HeaderError, RemotingError
from broker.remoting.headers import Header
from broker.remoting.protocol.wire import BodyError
from store.config_files import replace_file
from store.errors import MQLakeError

log = logging.getLogger(__name__)

IDENTITY_FILE = "brokerIdentity"  # MessageStoreConfig.storePathBrokerIdentity's default name
CALL_TIMEOUT = 3.0


class ControllerModeError(MQLakeError):
    """Controller mode cannot start; the message names the setting or file."""


class RoleTarget(Protocol):
    """What the broker does when the controller names a master."""

    async def become_master(self, epoch: int, sync_state_set: set[int]) -> None: ...

    async def become_slave(self, master_addr: str, epoch: int) -> None: ...

    def replica_state(self) -> tuple[int, int, int]:
        """(last epoch, max CommitLog offset, confirm offset) for the heartbeat."""
        ...

    def set_sync_state_set(self, members: set[int]) -> None: ...


class ReplicasManager:
    def __init__(self, *, cluster: str, broker_name: str, broker_addr: str, controller_addrs: list[str],
                 store_root: Path, target: RoleTarget, client: RemotingClient, heartbeat_interval: float,
                 heartbeat_timeout_ms: int, election_priority: int, sync_broker_period: float,
                 sync_controller_period: float) -> None:  # fmt: skip
        self.cluster = cluster
        self.broker_name = broker_name
        self.broker_addr = broker_addr
        self.controller_addrs = controller_addrs
        self.identity_path = Path(store_root) / IDENTITY_FILE
        self.temp_identity_path = Path(store_root) / f"{IDENTITY_FILE}-temp"
        self.target = target
        self.client = client
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.election_priority = election_priority
        self.sync_broker_period = sync_broker_period
        self.sync_controller_period = sync_controller_period
        self.leader: str | None = None
        self.broker_id: int | None = None  # the controller's id for this broker (1, 2, ...)
        self.master_epoch = 0
        self.master_id: int | None = None
        self.master_addr: str | None = None
        self.sync_state_set: set[int] = set()
        self.sync_state_set_epoch = 0
        self._lock = asyncio.Lock()  # one role change at a time
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def is_master(self) -> bool:
        return self.master_id is not None and self.master_id == self.broker_id

    # --- start-up --------------------------------------------------------------------------------------------
    async def start(self, wait: float) -> None:
        """Find the leader, get an id, register and learn the master; ControllerModeError naming ``controllerAddr``
        when this has not succeeded within ``wait`` seconds, or an address is not a controller.

        Every step is tried again until then, as RocketMQ's ReplicasManager does: a controller that has just won
        its election answers CONTROLLER_NOT_LEADER until its state machine has caught up, and a loaded one may
        not answer in time."""
        deadline = time.monotonic() + wait
        while True:
            try:
                await self._start_once()
                break
            except RemotingError as e:
                if time.monotonic() > deadline:
                    raise ControllerModeError(f"controllerAddr={';'.join(self.controller_addrs)}: {e} "
                                              f"(tried for {wait:.0f} s)") from e  # fmt: skip
                await asyncio.sleep(0.5)
        self._tasks = [
            asyncio.create_task(self._every(self.heartbeat_interval, self._heartbeat)),
            asyncio.create_task(self._every(self.sync_controller_period, self._find_leader)),
            asyncio.create_task(self._every(self.sync_broker_period, self.sync_broker_metadata)),
        ]

    async def _start_once(self) -> None:
        if not await self._find_leader(strict=True):
            raise RemotingError("no controller answered CONTROLLER_GET_METADATA_INFO with a leader")
        if self.broker_id is None:
            # the id applied for is kept in brokerIdentity-temp until granted, so a retry applies for the same one
            self.broker_id = await self._apply_id()
        await self._register()
        await self._heartbeat()
        if self.master_id is None:
            await self._elect()

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def _every(self, interval: float, fn: Callable[[], Awaitable[object]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await fn()
            except (RemotingError, HeaderError, BodyError) as e:
                log.warning("controller: %s failed: %s", fn.__name__, e)
            except Exception:
                log.exception("controller: %s failed", fn.__name__)

    async def _find_leader(self, strict: bool = False) -> bool:
        """The leader as this broker reaches it: the ``controllerAddr`` entry of the node that answers it leads
        (a relay, a NAT or a name the broker was given stays in the path of every request); else the address the
        nodes name for it."""
        named: str | None = None
        for addr in self.controller_addrs:
            try:
                resp = await self.client.invoke(addr, RemotingCommand.request(RequestCode.CONTROLLER_GET_METADATA_INFO),
                                                CALL_TIMEOUT)  # fmt: skip
            except RemotingError as e:
                log.debug("controller %s: %s", addr, e)
                continue
            if resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and strict:
                raise ControllerModeError(f"controllerAddr: {addr} is not a controller (it does not serve "
                                          f"CONTROLLER_GET_METADATA_INFO)")  # fmt: skip
            if resp.code != ResponseCode.SUCCESS:
                continue
            meta = resp.read_header(cp.GetMetaDataResponseHeader)
            if meta.is_leader:
                self._set_leader(addr)
                return True
            named = named or meta.controller_leader_address
        if named:
            self._set_leader(named)
            return True
        return False

    def _set_leader(self, addr: str) -> None:
        if addr != self.leader:
            log.info("controller leader: %s", addr)
        self.leader = addr

    async def _call(self, code: RequestCode, header: Header | None, body: bytes = b"") -> RemotingCommand:
        """A request to the leader; asked again of the new leader when it moved."""
        for _ in range(2):
            if self.leader is None and not await self._find_leader():
                raise RemotingError("no controller leader known")
            assert self.leader is not None
            try:
                resp = await self.client.invoke(self.leader, RemotingCommand.request(code, header, body), CALL_TIMEOUT)
            except RemotingError:
                self.leader = None
                continue
            if resp.code == ResponseCode.CONTROLLER_NOT_LEADER:
                self.leader = None
                continue
            return resp
        raise RemotingError(f"{RequestCode(code).name}: the controller leader did not answer")

    def _read_identity(self, path: Path) -> list[str] | None:
        if not path.exists():
            return None
        parts = path.read_text(encoding="utf-8").strip().split("#")
        if len(parts) < 3 or not parts[2].isdigit():
            raise ControllerModeError(f"{path}: not a broker identity (cluster#brokerName#brokerId...): {parts}")
        for key, want, have in (("brokerClusterName", self.cluster, parts[0]), ("brokerName", self.broker_name,
                                                                                 parts[1])):  # fmt: skip
            if want != have:
                raise ControllerModeError(f"{path}: this store's broker has {key}={have}, the config says {want}")
        return parts

    async def _apply_id(self) -> int:
        """``register()``'s id steps: the id in ``brokerIdentity``, else a new one applied for."""
        known = self._read_identity(self.identity_path)
        if known is not None:
            await self._check_not_claimed(int(known[2]))
            return int(known[2])
        for _ in range(10):
            temp = self._read_identity(self.temp_identity_path)
            if temp is None:
                resp = await self._call(RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
                                        cp.GetNextBrokerIdRequestHeader(cluster_name=self.cluster,
                                                                        broker_name=self.broker_name))  # fmt: skip
                next_id = resp.read_header(cp.GetNextBrokerIdResponseHeader).next_broker_id
                if resp.code != ResponseCode.SUCCESS or next_id is None:
                    raise ControllerModeError(f"controllerAddr: GET_NEXT_BROKER_ID refused: {resp.code} {resp.remark}")
                temp = [self.cluster, self.broker_name, str(next_id), f"{self.broker_addr};{int(time.time() * 1000)}"]
                replace_file(self.temp_identity_path, "#".join(temp).encode())
            if await self._apply(int(temp[2]), temp[3] if len(temp) > 3 else ""):
                replace_file(self.identity_path, "#".join(temp[:3]).encode())
                self.temp_identity_path.unlink(missing_ok=True)
                log.info("controller gave this broker id %s (%s)", temp[2], self.identity_path)
                return int(temp[2])
            self.temp_identity_path.unlink(missing_ok=True)  # taken meanwhile: ask for another
        raise ControllerModeError(f"{self.identity_path}: the controller refused every broker id this broker asked for")

    async def _check_not_claimed(self, broker_id: int) -> None:
        """CONTROLLER_GET_SYNC_STATE_DATA: a live broker at another address holding this id (a copied store) stops
        start-up; a controller that does not answer it (or knows no such broker) lets it go on."""
        resp = await self._call(RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, None,
                                json.dumps([self.broker_name]).encode())  # fmt: skip
        if resp.code != ResponseCode.SUCCESS or not resp.body:
            return
        try:
            info = json.loads(resp.body)["replicasInfoTable"][self.broker_name]
            replicas = (info.get("inSyncReplicas") or []) + (info.get("notInSyncReplicas") or [])
        except (ValueError, KeyError, TypeError, AttributeError):
            return
        for r in replicas:
            if r.get("brokerId") == broker_id and r.get("alive") and r.get("brokerAddress") != self.broker_addr:
                raise ControllerModeError(
                    f"{self.identity_path}: broker id {broker_id} of {self.broker_name} is held by the live broker at "
                    f"{r.get('brokerAddress')} (this one is {self.broker_addr}): two brokers claim one id; give this "
                    f"broker its own store directory")  # fmt: skip

    async def _apply(self, broker_id: int, check_code: str) -> bool:
        resp = await self._call(RequestCode.CONTROLLER_APPLY_BROKER_ID, cp.ApplyBrokerIdRequestHeader(
            cluster_name=self.cluster, broker_name=self.broker_name, applied_broker_id=broker_id,
            register_check_code=check_code))  # fmt: skip
        if resp.code != ResponseCode.SUCCESS:
            log.warning("controller refused broker id %d: %d %s", broker_id, resp.code, resp.remark)
        return resp.code == ResponseCode.SUCCESS

    async def _register(self, retry: bool = False) -> None:
        assert self.broker_id is not None
        resp = await self._call(RequestCode.CONTROLLER_REGISTER_BROKER, cp.RegisterBrokerToControllerRequestHeader(
            cluster_name=self.cluster, broker_name=self.broker_name, broker_id=self.broker_id,
            broker_address=self.broker_addr, invoke_time=int(time.time() * 1000)))  # fmt: skip
        if resp.code == ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED and not retry:
            # a controller that never gave out this id (a new controller group, this broker's store kept): apply
            # for the id this store already holds, then register (RocketMQ's broker would retry in vain)
            await self._apply(self.broker_id, f"{self.broker_addr};{int(time.time() * 1000)}")
            await self._register(retry=True)
            return
        if resp.code != ResponseCode.SUCCESS:
            raise RemotingError(f"REGISTER_BROKER refused: {resp.code} {resp.remark}")
        await self._follow(resp.read_header(cp.MasterInfoHeader), self._set_of(resp))

    @staticmethod
    def _set_of(resp: RemotingCommand) -> cp.SyncStateSet:
        return cp.SyncStateSet.decode(resp.body) if resp.body else cp.SyncStateSet()

    # --- following the controller ----------------------------------------------------------------------------
    async def _follow(self, info: cp.MasterInfoHeader, sss: cp.SyncStateSet) -> None:
        """``changeBrokerRole``: act on a master named for a higher epoch than the one followed."""
        if info.master_broker_id is None or not info.master_address or info.master_epoch is None:
            return
        async with self._lock:
            if info.master_epoch <= self.master_epoch:
                if info.master_epoch == self.master_epoch and self.is_master:
                    self._take_set(sss)
                return
            self.master_epoch = info.master_epoch
            self.master_id, self.master_addr = info.master_broker_id, info.master_address
            if self.is_master:
                self.sync_state_set_epoch = -1
                self._take_set(sss)
                log.info("controller: this broker (id %s) is master, epoch %d", self.broker_id, info.master_epoch)
                await self.target.become_master(info.master_epoch, self.sync_state_set)
            else:
                log.info("controller: master is %s (id %d), epoch %d", info.master_address, info.master_broker_id,
                         info.master_epoch)  # fmt: skip
                await self.target.become_slave(info.master_address, info.master_epoch)

    def _take_set(self, sss: cp.SyncStateSet) -> None:
        if sss.sync_state_set_epoch > self.sync_state_set_epoch:
            self.sync_state_set, self.sync_state_set_epoch = set(sss.sync_state_set), sss.sync_state_set_epoch
            self.target.set_sync_state_set(self.sync_state_set)

    async def sync_broker_metadata(self) -> None:
        resp = await self._call(RequestCode.CONTROLLER_GET_REPLICA_INFO,
                                cp.GetReplicaInfoRequestHeader(broker_name=self.broker_name))  # fmt: skip
        if resp.code == ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST:
            await self._register()
            return
        if resp.code != ResponseCode.SUCCESS:
            return
        info = resp.read_header(cp.MasterInfoHeader)
        if info.master_epoch is not None and info.master_epoch > self.master_epoch and not info.master_address:
            await self._elect()
            return
        await self._follow(info, self._set_of(resp))

    async def _elect(self) -> None:
        assert self.broker_id is not None
        resp = await self._call(RequestCode.CONTROLLER_ELECT_MASTER, cp.ElectMasterRequestHeader(
            cluster_name=self.cluster, broker_name=self.broker_name, broker_id=self.broker_id,
            invoke_time=int(time.time() * 1000)))  # fmt: skip
        info = resp.read_header(cp.MasterInfoHeader)
        if resp.code != ResponseCode.SUCCESS and info.master_broker_id is None:
            log.info("controller: no master elected yet: %d %s", resp.code, resp.remark)
            return
        members = cp.ElectMasterResponseBody.decode(resp.body).sync_state_set if resp.body else []
        await self._follow(info, cp.SyncStateSet(sync_state_set=members,
                                                 sync_state_set_epoch=info.sync_state_set_epoch or 0))  # fmt: skip

    async def notify_role_changed(self, cmd: RemotingCommand) -> None:
        """NOTIFY_BROKER_ROLE_CHANGED: the controller's word after an election, at once."""
        h = cmd.read_header(cp.NotifyBrokerRoleChangedRequestHeader)
        sss = self._set_of(cmd)
        info = cp.MasterInfoHeader(master_broker_id=h.master_broker_id, master_address=h.master_address,
                                   master_epoch=h.master_epoch, sync_state_set_epoch=h.sync_state_set_epoch)
        await self._follow(info, sss)

    async def _heartbeat(self) -> None:
        assert self.broker_id is not None
        epoch, max_offset, confirm = self.target.replica_state()
        header = cp.BrokerHeartbeatRequestHeader(
            cluster_name=self.cluster, broker_addr=self.broker_addr, broker_name=self.broker_name,
            broker_id=self.broker_id, epoch=epoch, max_offset=max_offset, confirm_offset=confirm,
            heartbeat_timeout_mills=self.heartbeat_timeout_ms, election_priority=self.election_priority)  # fmt: skip
        for addr in self.controller_addrs:
            with contextlib.suppress(RemotingError):
                await self.client.invoke_oneway(addr, RemotingCommand.request(RequestCode.BROKER_HEARTBEAT, header,
                                                                              oneway=True))  # fmt: skip

    async def propose_sync_state_set(self, members: set[int]) -> None:
        """ALTER_SYNC_STATE_SET as master: the controller's answer is the set in force."""
        if not self.is_master or members == self.sync_state_set:
            return
        assert self.broker_id is not None
        body = cp.SyncStateSet(sync_state_set=sorted(members), sync_state_set_epoch=self.sync_state_set_epoch).encode()
        resp = await self._call(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, cp.AlterSyncStateSetRequestHeader(
            broker_name=self.broker_name, master_broker_id=self.broker_id, master_epoch=self.master_epoch,
            invoke_time=int(time.time() * 1000)), body)  # fmt: skip
        if resp.code != ResponseCode.SUCCESS:
            log.warning("controller refused sync state set %s: %d %s", sorted(members), resp.code, resp.remark)
            return
        log.info("sync state set %s -> %s", sorted(self.sync_state_set), sorted(members))
        self._take_set(self._set_of(resp))

    def runtime_info(self) -> dict[str, str]:
        return {
            "controllerLeader": self.leader or "",
            "controllerBrokerId": str(self.broker_id or ""),
            "masterEpoch": str(self.master_epoch),
            "masterBrokerId": str(self.master_id or ""),
            "syncStateSet": ",".join(map(str, sorted(self.sync_state_set))),
            "syncStateSetEpoch": str(self.sync_state_set_epoch),
        }
