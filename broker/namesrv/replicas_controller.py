"""A single-node controller inside mqlake's NameServer (``enableControllerInNamesrv``): elections for brokers in
controller mode on a one-machine set-up, answering the same requests as Apache RocketMQ 5's controller.

It is one process: no consensus, and a single point for elections (while it is down no master is elected,
though the brokers keep serving as they are).  Its state (broker sets, ids, masters, epochs, sync state sets) is
written to ``controllerStorePath``/``controller.json`` on every change and read back at start; liveness is not
persisted (a restarted controller counts every known broker alive for one heartbeat timeout).  To move to Apache
RocketMQ's distributed controller, see docs/ha.md ("The embedded controller").

Elections follow ``DefaultElectPolicy``: among the live members of the sync state set, the highest epoch, then
the largest max offset, then the lowest ``electionPriority``; the new set is the new master alone, and every live
broker of the set is told (NOTIFY_BROKER_ROLE_CHANGED).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from broker.remoting import controller_protocol as cp
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel, Handler
from broker.remoting.errors import HeaderError, RemotingError
from broker.remoting.server import RemotingServer
from store.config_files import replace_file

log = logging.getLogger(__name__)

STATE_FILE = "controller.json"
CONTROLLER_ID = "namesrv"


@dataclass
class BrokerSet:
    cluster: str
    members: dict[int, str] = field(default_factory=dict)  # broker id -> address
    check_codes: dict[int, str] = field(default_factory=dict)  # broker id -> registerCheckCode that claimed it
    master: int | None = None
    master_epoch: int = 0
    sync_state_set: list[int] = field(default_factory=list)
    sync_state_set_epoch: int = 0


@dataclass
class Liveness:
    seen: float  # monotonic
    timeout: float  # seconds
    epoch: int = 0
    max_offset: int = 0
    priority: int = 2**31 - 1


class EmbeddedController:
    def __init__(self, host: str, port: int, store_path: Path, scan_interval: float) -> None:
        self.host = host
        self.store_path = Path(store_path)
        self.scan_interval = scan_interval
        self.server = RemotingServer(host, port, name="controller")
        self.client = RemotingClient(language="JAVA")
        self.sets: dict[str, BrokerSet] = {}
        self.live: dict[tuple[str, int], Liveness] = {}
        self._scanner: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        handlers = {
            RequestCode.CONTROLLER_GET_METADATA_INFO: self.metadata,
            RequestCode.CONTROLLER_GET_NEXT_BROKER_ID: self.next_broker_id,
            RequestCode.CONTROLLER_APPLY_BROKER_ID: self.apply_broker_id,
            RequestCode.CONTROLLER_REGISTER_BROKER: self.register_broker,
            RequestCode.BROKER_HEARTBEAT: self.heartbeat,
            RequestCode.CONTROLLER_GET_REPLICA_INFO: self.replica_info,
            RequestCode.CONTROLLER_ELECT_MASTER: self.elect_master,
            RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET: self.alter_sync_state_set,
            RequestCode.CONTROLLER_GET_SYNC_STATE_DATA: self.sync_state_data,
        }
        for code, handler in handlers.items():
            self.server.register(code, self._checked(handler))

    @property
    def address(self) -> str:
        return f"{self.host}:{self.server.port}"

    @staticmethod
    def _checked(handler: Callable[[RemotingCommand], RemotingCommand | None]) -> Handler:
        """A header that does not parse is answered CONTROLLER_INVALID_REQUEST, naming the field."""

        def run(cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
            try:
                return handler(cmd)
            except HeaderError as e:
                return cmd.response(ResponseCode.CONTROLLER_INVALID_REQUEST, str(e))
        return run

    # --- lifecycle and state ----------------------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.to_thread(self._load)
        await self.server.start()
        self._scanner = asyncio.get_running_loop().create_task(self._scan_forever())
        log.info("embedded controller (single node, no consensus) on %s, state in %s", self.address,
                 self.store_path / STATE_FILE)  # fmt: skip

    async def stop(self) -> None:
        if self._scanner is not None:
            self._scanner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scanner
        await self.server.stop(grace=1.0)
        await self.client.close()

    def _load(self) -> None:
        path = self.store_path / STATE_FILE
        if not path.exists():
            return
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            self.sets = {name: BrokerSet(cluster=v["cluster"], members={int(k): a for k, a in v["members"].items()},
                                         check_codes={int(k): c for k, c in v["checkCodes"].items()},
                                         master=v["master"], master_epoch=v["masterEpoch"],
                                         sync_state_set=list(v["syncStateSet"]),
                                         sync_state_set_epoch=v["syncStateSetEpoch"])
                         for name, v in raw["brokerSets"].items()}  # fmt: skip
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{path}: not an embedded controller's state: {e}") from None
        now = time.monotonic()
        for name, bs in self.sets.items():  # alive until a heartbeat timeout passes without one
            for bid in bs.members:
                self.live[(name, bid)] = Liveness(now, 10.0)
        log.info("embedded controller: %d broker set(s) loaded from %s", len(self.sets), path)

    def _save(self) -> None:
        doc = {"brokerSets": {name: {"cluster": bs.cluster, "members": {str(k): a for k, a in bs.members.items()},
                                     "checkCodes": {str(k): c for k, c in bs.check_codes.items()},
                                     "master": bs.master, "masterEpoch": bs.master_epoch,
                                     "syncStateSet": bs.sync_state_set, "syncStateSetEpoch": bs.sync_state_set_epoch}
                              for name, bs in self.sets.items()}}  # fmt: skip
        replace_file(self.store_path / STATE_FILE, json.dumps(doc, indent=1, sort_keys=True).encode(), backup=True)

    def _alive(self, name: str, bid: int) -> bool:
        live = self.live.get((name, bid))
        return live is not None and time.monotonic() - live.seen <= live.timeout

    # --- requests ---------------------------------------------------------------------------------------------
    def metadata(self, cmd: RemotingCommand) -> RemotingCommand:
        header = cp.GetMetaDataResponseHeader(group="mqlake-embedded", controller_leader_id=CONTROLLER_ID,
                                              controller_leader_address=self.address, is_leader=True,
                                              peers=f"{CONTROLLER_ID}:{self.address}")  # fmt: skip
        return cmd.response(ResponseCode.SUCCESS, header=header)

    def next_broker_id(self, cmd: RemotingCommand) -> RemotingCommand:
        h = cmd.read_header(cp.GetNextBrokerIdRequestHeader)
        bs = self.sets.get(h.broker_name)
        nxt = max(bs.members, default=0) + 1 if bs is not None else 1
        return cmd.response(ResponseCode.SUCCESS, header=cp.GetNextBrokerIdResponseHeader(
            cluster_name=h.cluster_name, broker_name=h.broker_name, next_broker_id=nxt))  # fmt: skip

    def apply_broker_id(self, cmd: RemotingCommand) -> RemotingCommand:
        h = cmd.read_header(cp.ApplyBrokerIdRequestHeader)
        bs = self.sets.get(h.broker_name)
        if bs is None:
            if h.applied_broker_id != 1:
                return cmd.response(ResponseCode.CONTROLLER_BROKER_ID_INVALID,
                                    f"broker set {h.broker_name} is new: its first broker id is 1")  # fmt: skip
            bs = self.sets[h.broker_name] = BrokerSet(cluster=h.cluster_name)
        claimed = bs.check_codes.get(h.applied_broker_id)
        if claimed is not None and claimed != h.register_check_code:
            return cmd.response(ResponseCode.CONTROLLER_BROKER_ID_INVALID,
                                f"broker id {h.applied_broker_id} of {h.broker_name} is taken ({claimed})")  # fmt: skip
        bs.check_codes[h.applied_broker_id] = h.register_check_code
        bs.members[h.applied_broker_id] = h.register_check_code.split(";")[0]
        self._save()
        return cmd.response(ResponseCode.SUCCESS)

    def _master_header(self, bs: BrokerSet, name: str) -> cp.MasterInfoHeader:
        header = cp.MasterInfoHeader(master_epoch=bs.master_epoch, sync_state_set_epoch=bs.sync_state_set_epoch)
        if bs.master is not None:
            header.master_broker_id, header.master_address = bs.master, bs.members.get(bs.master)
        return header

    def _set_body(self, bs: BrokerSet) -> bytes:
        return cp.SyncStateSet(sync_state_set=bs.sync_state_set, sync_state_set_epoch=bs.sync_state_set_epoch).encode()

    def register_broker(self, cmd: RemotingCommand) -> RemotingCommand:
        h = cmd.read_header(cp.RegisterBrokerToControllerRequestHeader)
        bs = self.sets.get(h.broker_name)
        if bs is None or h.broker_id not in bs.members:
            return cmd.response(ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                                f"broker id {h.broker_id} of {h.broker_name} was never applied for")  # fmt: skip
        if bs.members[h.broker_id] != h.broker_address:
            bs.members[h.broker_id] = h.broker_address
            self._save()
        self.live.setdefault((h.broker_name, h.broker_id), Liveness(time.monotonic(), 10.0))
        header = self._master_header(bs, h.broker_name)
        if bs.master is not None and not self._alive(h.broker_name, bs.master):
            header.master_broker_id = header.master_address = None
        return cmd.response(ResponseCode.SUCCESS, header=header, body=self._set_body(bs))

    def heartbeat(self, cmd: RemotingCommand) -> None:
        h = cmd.read_header(cp.BrokerHeartbeatRequestHeader)
        self.live[(h.broker_name, h.broker_id)] = Liveness(time.monotonic(), h.heartbeat_timeout_mills / 1000,
                                                           h.epoch, h.max_offset, h.election_priority)  # fmt: skip
        return None

    def replica_info(self, cmd: RemotingCommand) -> RemotingCommand:
        h = cmd.read_header(cp.GetReplicaInfoRequestHeader)
        bs = self.sets.get(h.broker_name)
        if bs is None:
            return cmd.response(ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST, f"no broker set {h.broker_name}")
        header = self._master_header(bs, h.broker_name)
        header.sync_state_set_epoch = None
        return cmd.response(ResponseCode.SUCCESS, header=header, body=self._set_body(bs))

    def sync_state_data(self, cmd: RemotingCommand) -> RemotingCommand:
        """CONTROLLER_GET_SYNC_STATE_DATA: ``BrokerReplicasInfo`` for the broker names in the body (a JSON list)."""
        try:
            names = json.loads(cmd.body or b"[]")
        except ValueError:
            return cmd.response(ResponseCode.CONTROLLER_INVALID_REQUEST, "the body is not a JSON list of broker names")
        table = {}
        for name in names if isinstance(names, list) else []:
            bs = self.sets.get(name)
            if bs is None:
                continue
            def replica(bid: int, name: str = name, bs: BrokerSet = bs) -> dict[str, object]:
                return {"brokerName": name, "brokerId": bid, "brokerAddress": bs.members[bid],
                        "alive": self._alive(name, bid)}  # fmt: skip
            table[name] = {
                "masterBrokerId": bs.master, "masterAddress": bs.members.get(bs.master) if bs.master else None,
                "masterEpoch": bs.master_epoch, "syncStateSetEpoch": bs.sync_state_set_epoch,
                "inSyncReplicas": [replica(b) for b in sorted(bs.members) if b in bs.sync_state_set],
                "notInSyncReplicas": [replica(b) for b in sorted(bs.members) if b not in bs.sync_state_set],
            }  # fmt: skip
        return cmd.response(ResponseCode.SUCCESS, body=json.dumps({"replicasInfoTable": table}).encode())

    def elect_master(self, cmd: RemotingCommand) -> RemotingCommand:
        h = cmd.read_header(cp.ElectMasterRequestHeader)
        bs = self.sets.get(h.broker_name)
        if bs is None:
            return cmd.response(ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST, f"no broker set {h.broker_name}")
        if bs.master is not None and self._alive(h.broker_name, bs.master):
            return cmd.response(ResponseCode.CONTROLLER_MASTER_STILL_EXIST, "the master is alive",
                                header=self._master_header(bs, h.broker_name),
                                body=cp.ElectMasterResponseBody(sync_state_set=bs.sync_state_set).encode())  # fmt: skip
        if not self._elect(h.broker_name, bs):
            return cmd.response(ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE,
                                f"no live member of {h.broker_name}'s sync state set {bs.sync_state_set}")  # fmt: skip
        return cmd.response(ResponseCode.SUCCESS, header=self._master_header(bs, h.broker_name),
                            body=cp.ElectMasterResponseBody(sync_state_set=bs.sync_state_set).encode())  # fmt: skip

    def _elect(self, name: str, bs: BrokerSet) -> bool:
        """``DefaultElectPolicy`` over the live members of the set (a set never used yet: any live member)."""
        pool = bs.sync_state_set or list(bs.members)
        candidates = [bid for bid in pool if self._alive(name, bid)]
        if not candidates:
            if bs.master is not None:
                bs.master = None
                bs.master_epoch += 1
                self._save()
            return False
        def rank(bid: int) -> tuple[int, int, int]:
            live = self.live[(name, bid)]
            return (-live.epoch, -live.max_offset, live.priority)
        new = min(candidates, key=rank)
        bs.master, bs.master_epoch = new, bs.master_epoch + 1
        bs.sync_state_set, bs.sync_state_set_epoch = [new], bs.sync_state_set_epoch + 1
        self._save()
        log.info("embedded controller: broker %s id %d (%s) elected master, epoch %d", name, new, bs.members[new],
                 bs.master_epoch)  # fmt: skip
        self._notify(name, bs)
        return True

    def alter_sync_state_set(self, cmd: RemotingCommand) -> RemotingCommand:
        h = cmd.read_header(cp.AlterSyncStateSetRequestHeader)
        proposed = cp.SyncStateSet.decode(cmd.body)
        bs = self.sets.get(h.broker_name)
        if bs is None:
            return cmd.response(ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST, f"no broker set {h.broker_name}")
        if bs.master != h.master_broker_id or bs.master_epoch != h.master_epoch:
            return cmd.response(ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH,
                                f"master {h.master_broker_id} epoch {h.master_epoch} is not the current "
                                f"({bs.master}, {bs.master_epoch})")  # fmt: skip
        if proposed.sync_state_set_epoch != bs.sync_state_set_epoch:
            return cmd.response(ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
                                f"sync state set epoch {proposed.sync_state_set_epoch} is not "
                                f"{bs.sync_state_set_epoch}")  # fmt: skip
        members = sorted(set(proposed.sync_state_set))
        if bs.master not in members or any(m not in bs.members or not self._alive(h.broker_name, m)
                                           for m in members):  # fmt: skip
            return cmd.response(ResponseCode.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED,
                                f"{members}: must hold the master and live members only")  # fmt: skip
        bs.sync_state_set, bs.sync_state_set_epoch = members, bs.sync_state_set_epoch + 1
        self._save()
        return cmd.response(ResponseCode.SUCCESS, header=cp.AlterSyncStateSetResponseHeader(
            new_sync_state_set_epoch=bs.sync_state_set_epoch), body=self._set_body(bs))  # fmt: skip

    # --- elections on a dead master ---------------------------------------------------------------------------
    async def _scan_forever(self) -> None:
        while True:
            await asyncio.sleep(self.scan_interval)
            for name, bs in self.sets.items():
                if bs.master is not None and not self._alive(name, bs.master):
                    log.info("embedded controller: master %d of %s is not alive; electing", bs.master, name)
                    self._elect(name, bs)

    def _notify(self, name: str, bs: BrokerSet) -> None:
        header = cp.NotifyBrokerRoleChangedRequestHeader(
            master_address=bs.members.get(bs.master) if bs.master is not None else None, master_epoch=bs.master_epoch,
            sync_state_set_epoch=bs.sync_state_set_epoch, master_broker_id=bs.master)  # fmt: skip
        for bid, addr in bs.members.items():
            if self._alive(name, bid):
                cmd = RemotingCommand.request(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, header, self._set_body(bs))
                task = asyncio.get_running_loop().create_task(self._send(addr, cmd))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _send(self, addr: str, cmd: RemotingCommand) -> None:
        try:
            await self.client.invoke(addr, cmd, 3.0)
        except RemotingError as e:
            log.info("embedded controller: notifying %s failed: %s", addr, e)
