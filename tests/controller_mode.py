"""A broker set in controller mode for the tests and ``benchmarks/bench_failover``: mqlake brokers
(``mqlake broker`` processes) registered with Apache RocketMQ 5's controller group (``tests.peers.ControllerCluster``)
and an mqlake NameServer, with intervals short enough that a failover takes seconds."""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path

from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.errors import RemotingError
from broker.remoting.headers import GetRouteInfoRequestHeader
from broker.remoting.protocol.body import KVTable
from broker.remoting.protocol.route import TopicRouteData
from tests.fixtures_broker import MqlakeServer, remoting_call, stop_servers
from tests.helpers import wait_until
from tests.test_ha import SEGMENT  # small CommitLog segments, as the classic HA tests use: load spans several


def controller_conf(namesrv: str, controllers: list[str], **conf: str) -> dict[str, str]:
    """The config of a broker of ``broker-a`` in controller mode, with allAckInSyncStateSet and short heartbeats and
    checks."""
    return {
        "namesrvAddr": namesrv, "enableControllerMode": "true", "controllerAddr": ";".join(controllers),
        "allAckInSyncStateSet": "true", "brokerHeartbeatInterval": "500", "controllerHeartBeatTimeoutMills": "3000",
        "syncBrokerMetadataPeriod": "1000", "checkSyncStateSetPeriod": "1000", "haSendHeartbeatInterval": "500",
        "haMaxTimeSlaveNotCatchup": "5000", "slaveSyncInterval": "1000", "mappedFileSizeCommitLog": str(SEGMENT),
        **conf,
    }  # fmt: skip


def controller_broker(tmp: Path, name: str, namesrv: str, controllers: list[str], **conf: str) -> MqlakeServer:
    """An ``mqlake broker`` process of ``broker-a`` in controller mode (``controller_conf``)."""
    return MqlakeServer(tmp / name, "broker", **controller_conf(namesrv, controllers, **conf))


def runtime(addr: str) -> dict[str, str]:
    r = remoting_call(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
    assert r.code == ResponseCode.SUCCESS, r.remark
    return KVTable.decode(r.body).table


def role(server: MqlakeServer) -> str | None:
    """SYNC_MASTER or SLAVE as the broker says; None while it does not answer."""
    if not server.running:
        return None
    try:
        return runtime(server.broker_addr).get("brokerRole")
    except (AssertionError, OSError, RemotingError):  # not answering (yet): the caller's wait goes on
        return None


def routed_master(namesrv: str, topic: str) -> str | None:
    """The address the NameServer routes ``topic``'s broker-a master (brokerId 0) to."""
    r = remoting_call(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, GetRouteInfoRequestHeader(topic=topic))
    assert r.code == ResponseCode.SUCCESS, r.remark
    return TopicRouteData.decode(r.body).master_addr("broker-a")


def max_offset(server: MqlakeServer) -> int:
    return int(runtime(server.broker_addr)["commitLogMaxOffset"])


def in_sync(master: MqlakeServer) -> str:
    """The master's sync state set as ``1,2``."""
    return runtime(master.broker_addr).get("haSyncStateSet", "")


def master_and_slave(tmp: Path, controllers: list[str], namesrv: MqlakeServer | None = None,
                     **conf: str) -> tuple[MqlakeServer, MqlakeServer, MqlakeServer]:  # fmt: skip
    """A NameServer (``namesrv``, else a new one) and two brokers of one broker set with ``conf``: ``a`` elected
    master, ``b`` its slave in the sync state set."""
    if namesrv is None:
        namesrv = MqlakeServer(tmp / "ns", "namesrv").start()
    a = controller_broker(tmp, "a", namesrv.namesrv_addr, controllers, **conf)
    b = controller_broker(tmp, "b", namesrv.namesrv_addr, controllers, **conf)
    try:
        a.start()
        wait_until(lambda: role(a) == "SYNC_MASTER", 60, what="the first broker to be elected master")
        b.start()
        wait_until(lambda: role(b) == "SLAVE", 30, what="the second broker to follow it")
        wait_until(lambda: in_sync(a) == "1,2", 30, what="the slave to join the sync state set")
    except BaseException:
        stop_servers([a, b, namesrv])
        raise
    return namesrv, a, b


def failover_seconds(acked: list[tuple[float, bytes]], killed_at: float) -> float:
    """From the kill to the first send acknowledged after the longest pause in acknowledgements since it: sends
    the old master answered just before it died can arrive a moment after the kill; the new master's come after
    the pause the failover makes."""
    times = [killed_at] + [ts for ts, _ in acked if ts > killed_at]
    gaps = [(later - earlier, later) for earlier, later in itertools.pairwise(times)]
    return max(gaps)[1] - killed_at


class SyncLoad:
    """A stock C++ producer (``rocketmq.client``) sending unique 200-byte bodies with ``send_sync``, one after the
    other, until stopped; a body counts as acknowledged when answered SEND_OK, and when is remembered."""

    def __init__(self, namesrv: str, topic: str) -> None:
        from rocketmq.client import Producer

        self.topic = topic
        self.acked: list[tuple[float, bytes]] = []
        self.failed = 0
        self._stop = threading.Event()
        self._producer = Producer(f"sync-load-{os.getpid()}-{topic}")
        self._producer.set_namesrv_addr(namesrv)
        self._producer.start()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from rocketmq.client import Message

        for i in itertools.count():
            if self._stop.is_set():
                return
            body = f"m-{i:08d}-" + "p" * 188
            m = Message(self.topic)
            m.set_body(body)
            try:
                if self._producer.send_sync(m).status == 0:
                    self.acked.append((time.monotonic(), body.encode()))
            except Exception:  # noqa: BLE001 - no master yet: the loop sends the next body
                self.failed += 1

    def wait_acked(self, more: int, timeout: float = 120) -> None:
        """Until ``more`` sends beyond those acknowledged now are."""
        target = len(self.acked) + more
        wait_until(lambda: len(self.acked) >= target, timeout, what=f"{more} more acknowledged sends")

    @property
    def bodies(self) -> set[bytes]:
        return {body for _, body in self.acked}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self._producer.shutdown()
