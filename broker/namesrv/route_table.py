"""The name server's state: which brokers are alive and which queues each serves per topic (RouteInfoManager).

Pure data, no I/O: the controller calls it from the event loop only, so it needs no lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from broker.remoting.connection import Channel
from broker.remoting.protocol.route import MASTER_ID, BrokerData, ClusterInfo, QueueData, TopicRouteData
from broker.remoting.protocol.topic import PERM_WRITE, DataVersion, TopicConfig

log = logging.getLogger(__name__)


@dataclass
class BrokerLive:
    last_update: float
    timeout: float
    data_version: DataVersion
    ha_server_addr: str
    conn: Channel | None = None


@dataclass
class RegisterResult:
    ha_server_addr: str | None = None
    master_addr: str | None = None


class RouteTable:
    """Topic -> queues per broker, broker name -> addresses, cluster -> broker names, broker liveness."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.topic_queues: dict[str, dict[str, QueueData]] = {}
        self.brokers: dict[str, BrokerData] = {}
        self.clusters: dict[str, set[str]] = {}
        self.live: dict[str, BrokerLive] = {}
        self.filter_servers: dict[str, list[str]] = {}

    # --- registration ------------------------------------------------------------------------------------------

    def register_broker(
        self,
        cluster: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        ha_server_addr: str,
        data_version: DataVersion | None,
        topics: dict[str, TopicConfig] | None,
        filter_servers: list[str],
        timeout: float,
        conn: Channel | None = None,
    ) -> RegisterResult:
        self.clusters.setdefault(cluster, set()).add(broker_name)
        broker = self.brokers.get(broker_name)
        first = broker is None
        if broker is None:
            broker = self.brokers[broker_name] = BrokerData(cluster=cluster, broker_name=broker_name)
        # A slave promoted to master (or the reverse) keeps its address under a new id: drop the old entry.
        for bid in [bid for bid, addr in broker.broker_addrs.items() if addr == broker_addr and bid != broker_id]:
            del broker.broker_addrs[bid]
        if self._newer_claim(broker, broker_id, broker_addr, data_version):
            self.live.pop(broker_addr, None)
            return RegisterResult()
        first = broker.broker_addrs.get(broker_id) != broker_addr or first
        broker.broker_addrs[broker_id] = broker_addr
        broker.cluster = cluster

        previous = self.live.get(broker_addr)
        changed = first or previous is None or not previous.data_version.same_as(data_version)
        if topics is not None and broker_id == MASTER_ID and changed:
            self._replace_topics(broker_name, topics)

        version = data_version if data_version is not None else DataVersion()
        self.live[broker_addr] = BrokerLive(self._clock(), timeout, version, ha_server_addr, conn)
        if filter_servers:
            self.filter_servers[broker_addr] = list(filter_servers)
        else:
            self.filter_servers.pop(broker_addr, None)

        result = RegisterResult()
        if broker_id != MASTER_ID:
            master = broker.broker_addrs.get(MASTER_ID)
            if master is not None:
                master_live = self.live.get(master)
                result.master_addr = master
                result.ha_server_addr = master_live.ha_server_addr if master_live else None
        # the 30 s heartbeat repeats an unchanged registration: worth a line only when something changed
        log.log(logging.INFO if changed else logging.DEBUG, "registered broker %s id=%d %s (cluster %s, %d topics)",
                broker_name, broker_id, broker_addr, cluster, len(topics or {}))  # fmt: skip
        return result

    def _newer_claim(self, broker: BrokerData, broker_id: int, broker_addr: str, version: DataVersion | None) -> bool:
        """Another live broker holds ``broker_id`` with a greater stateVersion (a controller-mode broker's master
        epoch): this registration is a master the controllers replaced, and is ignored, as RocketMQ 5's NameServer
        does."""
        holder = broker.broker_addrs.get(broker_id)
        held = self.live.get(holder) if holder is not None and holder != broker_addr else None
        if held is None:
            return False
        theirs, ours = held.data_version.state_version or 0, (version.state_version if version else None) or 0
        if theirs <= ours:
            return False
        log.warning("broker %s id=%d %s registers with state version %d, %s holds the id with %d: ignored",
                    broker.broker_name, broker_id, broker_addr, ours, holder, theirs)  # fmt: skip
        return True

    def _replace_topics(self, broker_name: str, topics: dict[str, TopicConfig]) -> None:
        for name, conf in topics.items():
            self.topic_queues.setdefault(name, {})[broker_name] = QueueData(
                broker_name=broker_name, read_queue_nums=conf.read_queue_nums, write_queue_nums=conf.write_queue_nums,
                perm=conf.perm, topic_sys_flag=conf.topic_sys_flag,
            )  # fmt: skip
        # A full registration is the broker's whole table: topics it no longer has lose its queues (as 5.x does).
        for name in [t for t, queues in self.topic_queues.items() if broker_name in queues and t not in topics]:
            self._remove_queue(name, broker_name)

    def _remove_queue(self, topic: str, broker_name: str) -> None:
        queues = self.topic_queues.get(topic)
        if queues is not None:
            queues.pop(broker_name, None)
            if not queues:
                del self.topic_queues[topic]

    def unregister_broker(self, cluster: str, broker_addr: str, broker_name: str, broker_id: int) -> None:
        self.live.pop(broker_addr, None)
        self.filter_servers.pop(broker_addr, None)
        broker = self.brokers.get(broker_name)
        if broker is not None and broker.broker_addrs.get(broker_id) == broker_addr:
            del broker.broker_addrs[broker_id]
        self._forget_if_empty(broker_name, cluster)
        log.info("unregistered broker %s id=%d %s", broker_name, broker_id, broker_addr)

    def _forget_if_empty(self, broker_name: str, cluster: str | None = None) -> None:
        broker = self.brokers.get(broker_name)
        if broker is not None and broker.broker_addrs:
            return
        if broker is not None:
            del self.brokers[broker_name]
            cluster = broker.cluster
        for name in [cluster] if cluster is not None else list(self.clusters):
            names = self.clusters.get(name)
            if names is not None:
                names.discard(broker_name)
                if not names:
                    del self.clusters[name]
        for topic in [t for t, queues in self.topic_queues.items() if broker_name in queues]:
            self._remove_queue(topic, broker_name)

    def _remove_addr(self, broker_addr: str) -> None:
        """Forget every trace of a broker address (channel closed or expired): RouteInfoManager.onChannelDestroy."""
        self.live.pop(broker_addr, None)
        self.filter_servers.pop(broker_addr, None)
        for name, broker in list(self.brokers.items()):
            for bid in [bid for bid, addr in broker.broker_addrs.items() if addr == broker_addr]:
                del broker.broker_addrs[bid]
            if not broker.broker_addrs:
                self._forget_if_empty(name)

    def remove_by_connection(self, conn: Channel) -> list[str]:
        """The channel a broker registered on closed: drop that broker."""
        gone = [addr for addr, live in self.live.items() if live.conn is conn]
        for addr in gone:
            log.info("broker %s channel closed: removing it", addr)
            self._remove_addr(addr)
        return gone

    def expire(self) -> list[BrokerLive]:
        """Drop brokers silent for longer than their timeout; returns their live entries (to close channels)."""
        now = self._clock()
        expired = [(addr, live) for addr, live in self.live.items() if now - live.last_update > live.timeout]
        for addr, live in expired:
            log.warning("broker %s expired: no registration for %.1fs", addr, now - live.last_update)
            self._remove_addr(addr)
        return [live for _, live in expired]

    # --- data version ------------------------------------------------------------------------------------------

    def data_version_changed(self, broker_addr: str, data_version: DataVersion | None) -> bool:
        live = self.live.get(broker_addr)
        return live is None or not live.data_version.same_as(data_version)

    def data_version(self, broker_addr: str) -> DataVersion | None:
        live = self.live.get(broker_addr)
        return None if live is None else live.data_version

    def touch(self, broker_addr: str) -> bool:
        live = self.live.get(broker_addr)
        if live is not None:
            live.last_update = self._clock()
        return live is not None

    # --- queries -----------------------------------------------------------------------------------------------

    def route(self, topic: str) -> TopicRouteData | None:
        """The topic's route, or None when no broker serves the topic."""
        queues = self.topic_queues.get(topic)
        if not queues:
            return None
        brokers = [self.brokers[name] for name in sorted(queues) if name in self.brokers]
        if not brokers:
            return None
        filters = {
            addr: self.filter_servers[addr]
            for b in brokers
            for addr in b.broker_addrs.values()
            if addr in self.filter_servers
        }
        return TopicRouteData(
            broker_datas=brokers, filter_server_table=filters, queue_datas=[queues[name] for name in sorted(queues)]
        )

    def cluster_info(self) -> ClusterInfo:
        return ClusterInfo(
            broker_addr_table=dict(sorted(self.brokers.items())),
            cluster_addr_table={c: sorted(names) for c, names in sorted(self.clusters.items())},
        )

    def topics(self) -> list[str]:
        return sorted(self.topic_queues)

    def topics_of_cluster(self, cluster: str) -> list[str]:
        names = self.clusters.get(cluster, set())
        return sorted(t for t, queues in self.topic_queues.items() if names & queues.keys())

    def delete_topic(self, topic: str, cluster: str | None = None) -> None:
        if cluster is None:
            self.topic_queues.pop(topic, None)
            return
        for broker_name in self.clusters.get(cluster, set()):
            self._remove_queue(topic, broker_name)

    def set_write_perm(self, broker_name: str, writable: bool) -> int:
        """Add or wipe PERM_WRITE on every queue of ``broker_name``; returns how many topics it touched
        (``wipeWritePermOfBroker``/``addWritePermOfBroker``)."""
        count = 0
        for queues in self.topic_queues.values():
            qd = queues.get(broker_name)
            if qd is not None:
                perm = qd.perm | PERM_WRITE if writable else qd.perm & ~PERM_WRITE
                queues[broker_name] = qd.model_copy(update={"perm": perm})
                count += 1
        return count
