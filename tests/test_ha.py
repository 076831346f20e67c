"""Master/slave replication (RocketMQ 4.x HA): the wire format, the slave's store, and master, slave and NameServer
as separate processes with the stock C++ client (PyPI ``rocketmq``).

Intervals are short (heartbeat 200 ms, housekeeping 2 s, slave sync 300 ms) and segments small (64 KiB), so a
transfer crosses segments and every test takes seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.config import BrokerConfigError, build_configs
from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.loop import run, send_frames
from broker.remoting.protocol.body import KVTable
from store.commitlog import ReplicaAppendError
from store.config import BrokerRole
from store.format import ha, units
from store.message_store import MessageStore
from store.retention import SegmentManifest, SegmentState
from tests.fixtures_broker import MqlakeServer, remoting_call, stop_servers
from tests.helpers import make_config, make_message, read_queue, wait_dispatched, wait_until

SEGMENT = 64 * 1024
HA_CONF = {
    "mappedFileSizeCommitLog": str(SEGMENT),
    "haSendHeartbeatInterval": "200",
    "haHousekeepingInterval": "2000",
    "slaveSyncInterval": "300",
    "registerNameServerPeriod": "1000",
}
_ids = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{next(_ids)}"


# =====================================================================================================
# the wire format and the slave's store (unit)
# =====================================================================================================


@pytest.mark.unit
def test_frame_layouts_are_rocketmq_big_endian_longs_and_ints() -> None:
    # HAClient.reportSlaveMaxOffset: putLong; HAConnection's header: putLong(offset) then putInt(size)
    assert ha.encode_report(0x0102030405060708) == bytes.fromhex("0102030405060708")
    assert ha.encode_transfer_header(0x1122334455667788, 0x0A0B0C0D) == bytes.fromhex("1122334455667788 0A0B0C0D")
    assert ha.encode_transfer_header(1 << 30, 0) == bytes.fromhex("0000000040000000 00000000")  # a heartbeat
    assert ha.decode_report(bytes.fromhex("00000000000003e8")) == 1000
    assert ha.decode_transfer_header(bytes.fromhex("0000000000010000 00008000")) == (65536, 32768)
    assert (ha.REPORT_HEADER_SIZE, ha.TRANSFER_HEADER_SIZE) == (8, 12)


def _store(tmp_path: Path, name: str, **overrides) -> MessageStore:
    return MessageStore(make_config(tmp_path / name, mappedFileSizeCommitLog=4096, **overrides)).start()


@pytest.mark.unit
def test_replica_bytes_in_odd_chunks_give_the_masters_log_and_queues(tmp_path) -> None:
    master = _store(tmp_path, "master")
    slave = _store(tmp_path, "slave", brokerRole="SLAVE")
    try:
        for i in range(60):  # ~3 segments of 4 KiB, BLANK records included
            assert master.put_message(make_message("T", i % 2, b"x" * (50 + i))).ok
        end = master.max_phy_offset
        offset = 0
        while offset < end:  # 97-byte transfers end inside records and headers; dispatch must wait for the rest
            data = master.commitlog_data(offset, 97)
            assert data
            offset = slave.append_replica(offset, data)
        wait_dispatched(master)
        wait_dispatched(slave)
        assert slave.max_phy_offset == end
        for mf_m, mf_s in zip(master.commitlog.queue.files, slave.commitlog.queue.files, strict=True):
            assert mf_m.path.name == mf_s.path.name
            assert mf_m.mm[: mf_m.wrote] == mf_s.mm[: mf_s.wrote]
        for q in (0, 1):
            assert [o for o, _ in read_queue(slave, "T", q)] == [o for o, _ in read_queue(master, "T", q)]
            assert len(read_queue(slave, "T", q)) == 30
        # a slave refuses sends, as RocketMQ's store does in slave mode
        refused = slave.put_message(make_message("T", 0, b"no"))
        assert refused.status.value == "SERVICE_NOT_AVAILABLE" and "slave" in refused.error
    finally:
        master.shutdown()
        slave.shutdown()


@pytest.mark.unit
def test_a_new_slave_starts_at_the_masters_newest_segment_and_serves_its_queues_from_there(tmp_path) -> None:
    master = _store(tmp_path, "master")
    slave = _store(tmp_path, "slave", brokerRole="SLAVE")
    slave.prepare_segment()  # an empty first segment at 0, made ahead of any data, does not stand in the way
    try:
        for _ in range(40):
            assert master.put_message(make_message("T", 0, b"y" * 100)).ok
        wait_dispatched(master)
        end = master.max_phy_offset
        offset = end - end % 4096  # where a master starts a slave that reports 0
        assert offset > 0
        while offset < end:
            data = master.commitlog_data(offset, 32 * 1024)
            assert data
            offset = slave.append_replica(offset, data)
        wait_dispatched(slave)
        tail = [o for o, _ in read_queue(master, "T", 0) if o >= slave.get_min_offset_in_queue("T", 0)]
        assert slave.get_min_offset_in_queue("T", 0) > 0
        assert [o for o, _ in read_queue(slave, "T", 0)] == tail
        assert slave.get_max_offset_in_queue("T", 0) == master.get_max_offset_in_queue("T", 0) == 40
        assert slave.get_message("T", 0, 0, 32).status.value == "OFFSET_TOO_SMALL"
        assert slave.min_phy_offset == end - end % 4096
    finally:
        master.shutdown()
        slave.shutdown()


ALL_HOURS = ";".join(f"{h:02d}" for h in range(24))


@pytest.mark.unit
def test_a_slave_deletes_only_whole_segments_its_master_tiered(tmp_path) -> None:
    master = _store(tmp_path, "master")
    # fileReservedTime 0 and every hour a deletion hour: only the tiering rule keeps a segment here
    slave = _store(tmp_path, "slave", brokerRole="SLAVE", fileReservedTime=0, deleteWhen=ALL_HOURS)
    try:
        for _ in range(100):
            assert master.put_message(make_message("T", 0, b"z" * 120)).ok
        offset = 0
        while offset < master.max_phy_offset:
            offset = slave.append_replica(offset, master.commitlog_data(offset, 32 * 1024))
        wait_dispatched(slave)
        bases = [mf.file_from_offset for mf in slave.commitlog.queue.files]
        assert len(bases) >= 4
        assert slave.clean_expired_files() == []  # a slave never expires segments for tiering on its own
        assert {e.state for e in slave.manifest.entries()[:-1]} == {SegmentState.SEALED}  # no job can claim them
        # the master says: the first two and the active one tiered, and one this slave never had
        adopted = slave.adopt_tiered([bases[0], bases[1], bases[-1], bases[-1] + 4096])
        assert adopted == [bases[0], bases[1]]  # the active (still growing) segment is never taken as whole
        assert slave.clean_expired_files() == [bases[0], bases[1]]
        assert [mf.file_from_offset for mf in slave.commitlog.queue.files] == bases[2:]
        assert slave.get_min_offset_in_queue("T", 0) > 0
    finally:
        master.shutdown()
        slave.shutdown()


@pytest.mark.unit
def test_only_the_master_delivers_delayed_messages_the_slave_gets_its_delivery_as_bytes(tmp_path) -> None:
    master = _store(tmp_path, "master", messageDelayLevel="1s 2s")
    slave = _store(tmp_path, "slave", brokerRole="SLAVE", messageDelayLevel="1s 2s")
    try:
        assert master.put_message(make_message("DelayT", 0, b"later", DELAY="1")).ok
        offset = 0

        def copy_and_check_delivered() -> bool:
            nonlocal offset
            while (data := master.commitlog_data(offset, 32 * 1024)) is not None:
                offset = slave.append_replica(offset, data)
            return master.get_max_offset_in_queue("DelayT", 0) == 1

        wait_until(copy_and_check_delivered, 20, what="the master to deliver the delayed message")
        wait_dispatched(slave)
        # the slave delivered nothing itself: its log is the master's, byte for byte, and holds one delivery
        assert slave.max_phy_offset == master.max_phy_offset
        assert slave.commitlog_data(0, 4096) == master.commitlog_data(0, 4096)
        assert slave.get_max_offset_in_queue("DelayT", 0) == 1
    finally:
        master.shutdown()
        slave.shutdown()


@pytest.mark.expected_errors("unreadable record at position 0 during dispatch")
@pytest.mark.unit
def test_replica_bytes_that_do_not_continue_the_log_are_refused_naming_offsets(tmp_path) -> None:
    slave = _store(tmp_path, "slave", brokerRole="SLAVE")
    try:
        with pytest.raises(ReplicaAppendError, match="segment boundary .* not at 100"):
            slave.append_replica(100, b"\0" * 10)
        slave.append_replica(4096, b"\1" * 10)  # a new slave starts at the master's newest segment
        with pytest.raises(ReplicaAppendError, match="start at offset 4000 but this CommitLog ends at 4106"):
            slave.append_replica(4000, b"\1")
        with pytest.raises(ReplicaAppendError, match="run past the segment's end 8192"):
            slave.append_replica(4106, b"\1" * 4096)
        assert slave.max_phy_offset == 4106
    finally:
        slave.shutdown()


@pytest.mark.unit
def test_broker_role_settings_validate_as_broker_startup_does() -> None:
    broker, store = build_configs({"brokerRole": "SYNC_MASTER", "brokerId": "3"})
    assert store.broker_role == BrokerRole.SYNC_MASTER and broker.broker_id == 0  # a master is always id 0
    broker, store = build_configs({"brokerRole": "SLAVE", "brokerId": "1", "haMasterAddress": "10.0.0.1:10912"})
    assert (store.broker_role, broker.broker_id, store.ha_master_address) == (BrokerRole.SLAVE, 1, "10.0.0.1:10912")
    assert build_configs({})[1].broker_role == BrokerRole.ASYNC_MASTER
    assert build_configs({"haSlaveFallbehindMax": "1024"})[1].ha_max_gap_not_in_sync == 1024  # 4.9's name
    with pytest.raises(BrokerConfigError, match="brokerRole=SLAVE needs brokerId > 0"):
        build_configs({"brokerRole": "SLAVE"})
    with pytest.raises(BrokerConfigError, match="brokerRole='MASTER'"):
        build_configs({"brokerRole": "MASTER"})
    with pytest.raises(BrokerConfigError, match="haListenPort='70000'"):
        build_configs({"haListenPort": "70000"})


# =====================================================================================================
# master, slave and NameServer as processes
# =====================================================================================================


class CuttableProxy:
    """A TCP relay between the slave and the master's HA port that the test can cut mid-stream."""

    def __init__(self, target: Callable[[], tuple[str, int]]) -> None:
        self.target = target  # asked at each connection: the master's HA port is known once it has started
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections: list[socket.socket] = []
        self.relayed = 0
        self.flowing = threading.Event()  # cleared: bytes from the master are held back (the slave acks nothing new)
        self.flowing.set()
        self.isolated = False
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.isolated:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target())
            except OSError:
                client.close()
                continue
            with self._lock:
                self.connections += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        try:
            while data := src.recv(4096):
                if count:
                    self.flowing.wait()
                    # forward half of each read first: a cut then tears the transfer the slave is reading
                    dst.sendall(data[: len(data) // 2])
                    self.relayed += len(data)
                    dst.sendall(data[len(data) // 2 :])
                else:
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            src.close()
            dst.close()

    def isolate(self) -> None:
        """A network partition: the connections are cut and new ones closed at once, until ``heal``."""
        self.isolated = True
        self.cut()

    def heal(self) -> None:
        self.isolated = False

    def cut(self) -> None:
        with self._lock:
            conns, self.connections = self.connections, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.flowing.set()
        self.listener.close()
        self.cut()


class Cluster:
    """A NameServer, a master (brokerId 0) and a slave (brokerId 1, brokerRole SLAVE) of one broker name."""

    def __init__(self, tmp_path: Path, role: str = "ASYNC_MASTER", *, proxied: bool = False,
                 master_conf: dict[str, str] | None = None, **slave_conf: str) -> None:  # fmt: skip
        self.namesrv = MqlakeServer(tmp_path / "ns", command="namesrv").start()
        ns = {"namesrvAddr": self.namesrv.namesrv_addr}
        master = {"brokerRole": role, **HA_CONF, **ns, **(master_conf or {})}
        self.proxy: CuttableProxy | None = None
        self.master = MqlakeServer(tmp_path / "master", command="broker", **master)
        if proxied:  # the slave reaches the master's HA port (the OS's pick) through a relay the test can cut or pause
            self.proxy = CuttableProxy(lambda: ("127.0.0.1", int(self.master.values["haListenPort"])))
            slave_conf["haMasterAddress"] = f"127.0.0.1:{self.proxy.port}"
        self.slave = MqlakeServer(tmp_path / "slave", command="broker", brokerRole="SLAVE", brokerId="1",
                                  **{**HA_CONF, **ns, **slave_conf})  # fmt: skip
        self.servers = [self.slave, self.master, self.namesrv]

    @property
    def namesrv_addr(self) -> str:
        return self.namesrv.namesrv_addr

    def finish(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
        stop_servers(self.servers)


@pytest.fixture
def cluster_factory(tmp_path):
    made: list[Cluster] = []

    def make(role: str = "ASYNC_MASTER", **kwargs) -> Cluster:
        c = Cluster(tmp_path / f"c{len(made)}", role, **kwargs)
        made.append(c)
        return c

    yield make
    for c in made:
        c.finish()


def runtime(addr: str) -> dict[str, str]:
    r = remoting_call(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
    assert r.code == ResponseCode.SUCCESS, r.remark
    return KVTable.decode(r.body).table


def max_offset(addr: str) -> int:
    return int(runtime(addr)["commitLogMaxOffset"])


def commitlog_bytes(store_dir: Path, start: int, end: int) -> bytes:
    """The CommitLog's bytes in [start, end), from the segment files on disk."""
    out = bytearray()
    for f in sorted((store_dir / "commitlog").iterdir()):
        if not units.is_offset_file_name(f.name):
            continue  # the next segment's preallocation in progress (<name>.tmp)
        base = int(f.name)
        if base + SEGMENT <= start or base >= end:
            continue
        out += f.read_bytes()[max(0, start - base) : end - base]
    return bytes(out)


def first_segment(store_dir: Path) -> int:
    return int(sorted((store_dir / "commitlog").iterdir())[0].name)


def assert_same_log(c: Cluster, end: int) -> None:
    """The slave holds the master's CommitLog byte for byte (same file names and offsets), from the slave's first
    segment up to ``end``."""
    start = first_segment(c.slave.store_dir)
    assert (c.master.store_dir / "commitlog" / f"{start:020d}").exists()
    assert commitlog_bytes(c.slave.store_dir, start, end) == commitlog_bytes(c.master.store_dir, start, end)
    assert len(commitlog_bytes(c.slave.store_dir, start, end)) == end - start


def send_to(addr: str, topic: str, body: bytes) -> int:
    hdr = h.SendMessageRequestHeader(producer_group="PG", topic=topic, default_topic="TBW102",
                                     default_topic_queue_nums=4, queue_id=0, sys_flag=0, born_timestamp=0, flag=0,
                                     properties="", reconsume_times=0)  # fmt: skip
    return remoting_call(addr, RequestCode.SEND_MESSAGE, hdr, body).code


def consume_all(namesrv_addr: str, topic: str, group: str, sent: set[bytes]) -> set[bytes]:
    """What a new C++ push consumer group reads of ``topic`` once it has every body in ``sent``."""
    from rocketmq.client import PushConsumer

    got: set[bytes] = set()
    lock = threading.Lock()

    def on_message(msg) -> None:
        with lock:
            got.add(msg.body)

    consumer = PushConsumer(group)
    consumer.set_namesrv_addr(namesrv_addr)
    consumer.subscribe(topic, on_message)
    consumer.start()
    try:
        # bounded by progress, not by the whole read: on a loaded machine a read of thousands may take minutes,
        # but 60 s in which nothing new arrives is a consumer that has stopped
        while not sent <= got:
            before = len(got)
            wait_until(lambda n=before: sent <= got or len(got) > n, 60,
                       what=f"{len(sent - got)} of {len(sent)} acknowledged messages (none came for 60 s)")  # fmt: skip
    except AssertionError as e:  # where the consumer was sent: the NameServer's route for the topic then
        hdr = h.GetRouteInfoRequestHeader(topic=topic)
        routed = remoting_call(namesrv_addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, hdr)
        route = routed.body.decode(errors="replace")
        raise AssertionError(f"{e}; {len(got)} consumed; route {routed.code} {route}") from e
    finally:
        consumer.shutdown()
    return got


@pytest.mark.integration
def test_an_ha_frame_for_a_peer_gone_already_is_a_connection_error() -> None:
    """Every HA loop (master and slave, both modes) ends a connection on a ConnectionError; a write to a transport
    that closed in the same loop turn must be one too, not uvloop's RuntimeError (logged as an unhandled error)."""

    async def write_after_close() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
            writer.transport.abort()
            with pytest.raises(ConnectionResetError):
                send_frames(writer, ha.encode_report(0))
        finally:
            server.close()

    run(write_after_close())


@pytest.mark.integration
def test_sync_master_sigkilled_mid_produce_loses_nothing_acknowledged(cluster_factory) -> None:
    from rocketmq.client import Message, Producer

    c = cluster_factory("SYNC_MASTER", slaveReadEnable="true")  # as in RocketMQ, a slave serves reads only so
    c.master.start()
    topic = unique("HaT")
    # no slave yet: SYNC_MASTER stores the message but answers SLAVE_NOT_AVAILABLE (11)
    assert send_to(c.master.broker_addr, topic, b"before-slave") == ResponseCode.SLAVE_NOT_AVAILABLE
    c.slave.start()
    wait_until(lambda: runtime(c.master.broker_addr).get("haConnections") == "1", 20, what="the slave to connect")
    # the slave refuses sends
    assert send_to(c.slave.broker_addr, topic, b"to-slave") == ResponseCode.SERVICE_NOT_AVAILABLE

    p = Producer(unique("PG"))
    p.set_namesrv_addr(c.namesrv_addr)
    p.start()
    acked: set[bytes] = set()
    stop = threading.Event()

    def produce() -> None:
        for i in itertools.count():
            if stop.is_set():
                return
            m = Message(topic)
            body = f"m-{i:06d}-" + "p" * 200
            m.set_body(body)
            try:
                if p.send_sync(m).status == 0:  # SEND_OK: under SYNC_MASTER, the slave holds it
                    acked.add(body.encode())
            except Exception:  # the master is gone: sends fail from here on
                return

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    wait_until(lambda: len(acked) >= 400, 60, what="400 acknowledged sends")  # several 64 KiB segments
    c.master.kill()
    stop.set()
    t.join(60)
    assert not t.is_alive(), "the producer thread did not end"
    p.shutdown()
    sent = set(acked)

    # the slave's CommitLog is the master's, byte for byte, up to the slave's end
    slave_end = max_offset(c.slave.broker_addr)
    assert slave_end > 2 * SEGMENT
    assert_same_log(c, slave_end)

    # a new consumer group reads every acknowledged message from the slave (the route now has only brokerId 1)
    got = consume_all(c.namesrv_addr, topic, unique("Fresh"), sent)
    assert b"before-slave" in got  # stored on the master before the slave came, and replicated since


@pytest.mark.integration
def test_cuts_and_restarts_mid_stream_converge_to_equal_commitlogs(cluster_factory) -> None:
    from broker.client import Message as OurMessage
    from broker.client import Producer as OurProducer

    c = cluster_factory(proxied=True)
    proxy = c.proxy
    assert proxy is not None
    topic = unique("CutT")

    async def produce(n: int, tag: str) -> None:
        async with OurProducer(unique("PG"), c.namesrv_addr) as p:
            for i in range(n):
                await p.send(OurMessage(topic, f"{tag}-{i}".encode() * 20))

    def caught_up() -> bool:
        return max_offset(c.slave.broker_addr) == max_offset(c.master.broker_addr)

    try:
        c.master.start()
        c.slave.start()
        run(produce(300, "a"))
        # cut while bytes flow, several times: each torn transfer is dropped and the slave resumes from its end
        relayed = proxy.relayed
        proxy.cut()
        run(produce(200, "b"))
        wait_until(lambda: proxy.relayed > relayed, 20, what="the slave to reconnect after a cut")
        proxy.cut()
        wait_until(caught_up, 30, what="the slave to catch up after cuts")
        c.slave.restart()
        run(produce(200, "c"))
        wait_until(caught_up, 30, what="the slave to catch up after its restart")
        c.master.restart(graceful=False)
        run(produce(200, "d"))
        wait_until(caught_up, 30, what="the slave to catch up after the master's SIGKILL and restart")
        end = max_offset(c.master.broker_addr)
        assert end > 3 * SEGMENT
        assert_same_log(c, end)
        assert "connection to master" in c.slave.log_text()  # the cuts were seen and survived
    finally:
        proxy.close()


@pytest.mark.expected_errors("ahead of this master's max offset", "is ahead of master")
@pytest.mark.integration
def test_slave_ahead_of_a_master_that_lost_its_tail_stops_naming_both_offsets(cluster_factory) -> None:
    from broker.client import Message as OurMessage
    from broker.client import Producer as OurProducer

    c = cluster_factory()
    c.master.start()
    c.slave.start()
    topic = unique("AheadT")

    async def produce(n: int) -> None:
        async with OurProducer(unique("PG"), c.namesrv_addr) as p:
            for i in range(n):
                await p.send(OurMessage(topic, f"x-{i}".encode() * 30))

    run(produce(50))
    wait_until(lambda: max_offset(c.slave.broker_addr) == max_offset(c.master.broker_addr), 30, what="replication")
    slave_end = max_offset(c.slave.broker_addr)
    c.master.stop()
    # the master loses its tail: zero the last 1000 bytes of its log (recovery cuts the log at the first bad record)
    last = sorted((c.master.store_dir / "commitlog").iterdir())[-1]
    pos = slave_end - int(last.name)
    if pos <= 0:
        last = sorted((c.master.store_dir / "commitlog").iterdir())[-2]
        pos = slave_end - int(last.name)
    with open(last, "r+b") as f:
        f.seek(max(0, pos - 1000))
        f.write(b"\0" * min(pos, 1000))
    c.master.start()
    master_end = max_offset(c.master.broker_addr)
    assert master_end < slave_end
    wait_until(lambda: runtime(c.slave.broker_addr).get("haError"), 30, what="the slave to stop replicating")
    error = runtime(c.slave.broker_addr)["haError"]
    assert str(slave_end) in error and str(master_end) in error
    assert max_offset(c.slave.broker_addr) == slave_end  # nothing of the master's new log appended
    assert "ahead of master" in c.slave.log_text()


def pull(addr: str, group: str, topic: str, offset: int) -> tuple[int, h.PullMessageResponseHeader | None]:
    hdr = h.PullMessageRequestHeader(consumer_group=group, topic=topic, queue_id=0, queue_offset=offset,
                                     max_msg_nums=1, sys_flag=0x4, commit_offset=0, suspend_timeout_millis=0,
                                     subscription="*", sub_version=0)  # fmt: skip
    r = remoting_call(addr, RequestCode.PULL_MESSAGE, hdr)
    return r.code, (r.read_header(h.PullMessageResponseHeader) if "suggestWhichBrokerId" in r.ext_fields else None)


@pytest.mark.integration
def test_master_suggests_the_slave_to_a_reader_far_behind(mqlake_server_factory) -> None:
    def suggestion(**conf: str) -> int:
        server = mqlake_server_factory(slaveReadEnable="true", **conf)
        topic, group = unique("SuggestT"), unique("SuggestG")
        for i in range(3):
            assert send_to(server.broker_addr, topic, f"s-{i}".encode()) == ResponseCode.SUCCESS
        wait_until(lambda: pull(server.broker_addr, group, topic, 2)[0] == ResponseCode.SUCCESS, 10, what="dispatch")
        code, header = pull(server.broker_addr, group, topic, 0)
        assert code == ResponseCode.SUCCESS and header is not None
        return header.suggest_which_broker_id

    # accessMessageInMemoryMaxRatio=0: a reader anywhere before the log's end reads from disk: the group's
    # whichBrokerWhenConsumeSlowly (1); with the default 40 % of RAM, three messages behind is in memory: brokerId 0
    assert suggestion(accessMessageInMemoryMaxRatio="0") == 1
    assert suggestion() == 0


@pytest.mark.integration
def test_offsets_committed_to_the_slave_while_the_master_is_down_survive_its_return(cluster_factory) -> None:
    c = cluster_factory()
    c.master.start()
    c.slave.start()
    topic, group = unique("OffT"), unique("OffG")
    for i in range(5):
        assert send_to(c.master.broker_addr, topic, f"o-{i}".encode()) == ResponseCode.SUCCESS

    def commit(addr: str, offset: int) -> None:
        hdr = h.UpdateConsumerOffsetRequestHeader(consumer_group=group, topic=topic, queue_id=0, commit_offset=offset)
        assert remoting_call(addr, RequestCode.UPDATE_CONSUMER_OFFSET, hdr).code == ResponseCode.SUCCESS

    def committed(addr: str) -> int:
        hdr = h.QueryConsumerOffsetRequestHeader(consumer_group=group, topic=topic, queue_id=0)
        r = remoting_call(addr, RequestCode.QUERY_CONSUMER_OFFSET, hdr)
        return int(r.ext_fields["offset"]) if r.code == ResponseCode.SUCCESS else -1

    # without slaveReadEnable a slave sends readers to the master (RocketMQ 4.9), once it has the topic
    wait_until(lambda: pull(c.slave.broker_addr, group, topic, 0)[0] != ResponseCode.TOPIC_NOT_EXIST, 20,
               what="the slave to copy the master's topics")  # fmt: skip
    code, retry = pull(c.slave.broker_addr, group, topic, 0)
    assert code == ResponseCode.PULL_RETRY_IMMEDIATELY and retry is not None and retry.suggest_which_broker_id == 0
    commit(c.master.broker_addr, 2)
    wait_until(lambda: committed(c.slave.broker_addr) == 2, 20, what="the slave to copy the master's offsets")
    c.master.stop()
    commit(c.slave.broker_addr, 4)  # where a client commits while the master is gone
    c.master.start()
    wait_until(lambda: committed(c.master.broker_addr) == 4, 30, what="the master to get the slave's commit")
    # and the slave keeps it: the next copy from the master brings 4 back, not 2
    wait_until(lambda: committed(c.slave.broker_addr) == 4, 20, what="the slave's offsets to settle")


@pytest.mark.integration
def test_sync_master_answers_flush_slave_timeout_while_the_slave_acks_nothing(cluster_factory) -> None:
    c = cluster_factory("SYNC_MASTER", proxied=True, master_conf={"syncFlushTimeout": "5000"})
    assert c.proxy is not None
    c.master.start()
    c.slave.start()
    topic = unique("TimeoutT")
    wait_until(lambda: send_to(c.master.broker_addr, topic, b"first") == ResponseCode.SUCCESS, 20,
               what="a send acknowledged by the slave")  # fmt: skip
    c.proxy.flowing.clear()  # the connection stays up, but nothing reaches the slave: no acks
    assert send_to(c.master.broker_addr, topic, b"held") == ResponseCode.FLUSH_SLAVE_TIMEOUT
    c.proxy.flowing.set()
    # stored on the master all the same (as RocketMQ: the send is not undone), and replicated once bytes flow
    wait_until(lambda: max_offset(c.slave.broker_addr) == max_offset(c.master.broker_addr), 20, what="catch-up")
    assert send_to(c.master.broker_addr, topic, b"after") == ResponseCode.SUCCESS


@pytest.mark.integration
def test_the_slave_deletes_what_the_masters_tiering_job_tiered(cluster_factory) -> None:
    c = cluster_factory(deleteWhen=ALL_HOURS, fileReservedTime="0", cleanResourceInterval="200",
                        master_conf={"cleanResourceInterval": "200"})  # fmt: skip
    c.master.start()
    c.slave.start()
    topic = unique("TierT")
    for i in range(300):  # several 64 KiB segments
        assert send_to(c.master.broker_addr, topic, f"t-{i:04d}".encode() * 160) == ResponseCode.SUCCESS
    wait_until(lambda: max_offset(c.slave.broker_addr) == max_offset(c.master.broker_addr), 30, what="replication")
    # the master's tiering job, through the manifest's own API as the pipeline uses it
    manifest = SegmentManifest(c.master.store_dir)
    wait_until(lambda: len([e for e in manifest.entries() if e.state == SegmentState.SEALED]) >= 3, 20,
               what="sealed segments in the master's manifest")  # fmt: skip
    claimed = manifest.claim("test-tier-job", limit=2, treat_sealed_as_expired=True)
    tiered = [e.base_offset for e in claimed]
    for base in tiered:
        manifest.mark_tiered(base, "test-tier-job")
    slave_files = c.slave.store_dir / "commitlog"
    wait_until(lambda: not any((slave_files / f"{b:020d}").exists() for b in tiered), 30,
               what=f"the slave to delete the tiered segments {tiered}")
    left = sorted(int(p.name) for p in slave_files.iterdir())
    assert left and left[0] == tiered[-1] + SEGMENT  # the next, untiered segment is still there
    # the slave's copy of what is left is still the master's
    assert_same_log(c, max_offset(c.slave.broker_addr))


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


@pytest.mark.integration
def test_a_slave_follows_a_hand_written_master_and_survives_torn_and_misplaced_transfers(
    cluster_factory, tmp_path
) -> None:  # fmt: skip
    """The master here is the test itself, speaking the 4.x protocol byte by byte from a socket."""
    source = _store(tmp_path, "source")  # real CommitLog bytes to stream
    try:
        for i in range(30):
            assert source.put_message(make_message("HandT", 0, f"h-{i}".encode() * 30)).ok
        log = bytes(source.commitlog_data(0, 4096) or b"")
    finally:
        source.shutdown()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(30)
    c = cluster_factory(haMasterAddress=f"127.0.0.1:{listener.getsockname()[1]}", mappedFileSizeCommitLog="4096")
    c.slave.start()
    try:
        conn, _ = listener.accept()
        conn.settimeout(30)
        assert ha.decode_report(_recv_exactly(conn, 8)) == 0  # a new slave reports 0 at once
        first = 1000
        conn.sendall(ha.encode_transfer_header(0, first) + log[:first])
        assert ha.decode_report(_recv_exactly(conn, 8)) == first  # the ack: its new max offset
        # a torn transfer: the header promises 500 bytes, 200 arrive, the socket closes
        conn.sendall(ha.encode_transfer_header(first, 500) + log[first : first + 200])
        conn.close()
        conn, _ = listener.accept()
        conn.settimeout(30)
        assert ha.decode_report(_recv_exactly(conn, 8)) == first  # resumes from its own end: the torn part is gone
        conn.sendall(ha.encode_transfer_header(first, 0))  # a heartbeat at the right offset is fine
        conn.sendall(ha.encode_transfer_header(first + 8, 10) + log[first + 8 : first + 18])  # misplaced
        with pytest.raises(ConnectionError):
            while True:
                _recv_exactly(conn, 8)  # periodic reports, until the slave drops the connection
        conn.close()
        conn, _ = listener.accept()
        conn.settimeout(30)
        assert ha.decode_report(_recv_exactly(conn, 8)) == first
        conn.sendall(ha.encode_transfer_header(first, len(log) - first) + log[first:])
        while ha.decode_report(_recv_exactly(conn, 8)) != len(log):
            pass
        conn.close()
        assert commitlog_bytes(c.slave.store_dir, 0, len(log)) == log
        wait_until(lambda: queue_max(c.slave.broker_addr, "HandT") > 0, 20, what="the slave to dispatch the copy")
    finally:
        listener.close()


def queue_max(addr: str, topic: str) -> int:
    r = remoting_call(addr, RequestCode.GET_MAX_OFFSET, h.GetMaxOffsetRequestHeader(topic=topic, queue_id=0))
    return int(r.ext_fields["offset"]) if r.code == ResponseCode.SUCCESS else -1


@pytest.mark.expected_errors("ahead of this master's max offset")
@pytest.mark.integration
def test_a_hand_written_slave_gets_the_masters_commitlog_in_rocketmq_frames(cluster_factory) -> None:
    c = cluster_factory()
    c.master.start()
    topic = unique("FrameT")
    for i in range(200):
        assert send_to(c.master.broker_addr, topic, f"f-{i}".encode() * 50) == ResponseCode.SUCCESS
    end = max_offset(c.master.broker_addr)
    ha_port = int(runtime(c.master.broker_addr)["haListenPort"])
    with socket.create_connection(("127.0.0.1", ha_port), timeout=30) as s:
        s.sendall(ha.encode_report(0))  # a new slave: the master starts at its newest segment
        start = end - end % SEGMENT
        got = bytearray()
        offset = start
        while offset < end:
            frame_offset, size = ha.decode_transfer_header(_recv_exactly(s, ha.TRANSFER_HEADER_SIZE))
            assert frame_offset == offset and 0 < size <= 32 * 1024  # haTransferBatchSize
            got += _recv_exactly(s, size)
            offset += size
            s.sendall(ha.encode_report(offset))
        assert bytes(got) == commitlog_bytes(c.master.store_dir, start, end)
        # nothing more to send: a heartbeat (an empty transfer at the next offset) within haSendHeartbeatInterval
        assert ha.decode_transfer_header(_recv_exactly(s, ha.TRANSFER_HEADER_SIZE)) == (end, 0)
        assert int(runtime(c.master.broker_addr)["haPushToSlaveMaxOffset"]) == end
    # a slave whose log ends past this master's (the master lost a tail) is refused, naming both offsets
    with socket.create_connection(("127.0.0.1", ha_port), timeout=30) as s:
        s.sendall(ha.encode_report(end + 4096))
        assert s.recv(1) == b""  # closed without a transfer
    wait_until(lambda: f"offset {end + 4096}, ahead of this master's max offset {end}" in c.master.log_text(), 10,
               what="the master's error naming both offsets")  # fmt: skip


# =====================================================================================================
# topics created just before a master dies
# =====================================================================================================


def create_topic(addr: str, topic: str, queues: int) -> None:
    hdr = h.CreateTopicRequestHeader(topic=topic, default_topic="TBW102", read_queue_nums=queues,
                                     write_queue_nums=queues, perm=6, topic_filter_type="SINGLE_TAG")  # fmt: skip
    r = remoting_call(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, hdr)
    assert r.code == ResponseCode.SUCCESS, r.remark


def topic_table(addr: str) -> tuple[dict, dict]:
    """A broker's GET_ALL_TOPIC_CONFIG: (data version, {topic: config})."""
    from broker.remoting.protocol.topic import TopicConfigSerializeWrapper

    r = remoting_call(addr, RequestCode.GET_ALL_TOPIC_CONFIG)
    assert r.code == ResponseCode.SUCCESS, r.remark
    wrapper = TopicConfigSerializeWrapper.decode(r.body)
    return wrapper.data_version.to_json(), wrapper.topics()


def wait_first_copy(c: Cluster) -> None:
    """Until the slave's start-up copy of the master's topic table is done (so a later topic cannot ride on it)."""
    wait_until(lambda: topic_table(c.slave.broker_addr)[0] == topic_table(c.master.broker_addr)[0], 30,
               what="the slave's first copy of the master's topics")  # fmt: skip


# The slave's periodic table copy is pushed out of reach (RocketMQ: every 10 s), so only the copy a new topic's
# replicated records start can give the slave its config
NO_PERIODIC_COPY = {"slaveReadEnable": "true", "slaveSyncInterval": "600000"}


@pytest.mark.integration
def test_a_topic_created_just_before_the_master_is_killed_is_read_whole_from_the_slave(cluster_factory) -> None:
    from rocketmq.client import Message, Producer

    c = cluster_factory("SYNC_MASTER", **NO_PERIODIC_COPY)  # every SEND_OK is on the slave
    c.master.start()
    c.slave.start()
    wait_until(lambda: runtime(c.master.broker_addr).get("haConnections") == "1", 20, what="the slave to connect")
    wait_first_copy(c)
    p = Producer(unique("PG"))
    p.set_namesrv_addr(c.namesrv_addr)
    p.start()
    topic = unique("NewT")
    create_topic(c.master.broker_addr, topic, 3)  # not the default 4 or 8 queues: the slave must get the master's
    wait_until(lambda: topic in topic_table(c.master.broker_addr)[1], 10, what="the topic on the master")
    sent: set[bytes] = set()
    try:
        for i in range(60):
            m = Message(topic)
            body = f"new-{i:03d}"
            m.set_body(body)
            assert p.send_sync(m).status == 0
            sent.add(body.encode())
    finally:
        p.shutdown()
    c.master.kill()  # SIGKILL, right after the last acknowledged send

    slave_config = topic_table(c.slave.broker_addr)[1].get(topic)
    assert slave_config is not None, "the slave holds the topic's messages but not its config"
    assert (slave_config.read_queue_nums, slave_config.write_queue_nums, slave_config.perm) == (3, 3, 6)
    consume_all(c.namesrv_addr, topic, unique("AfterCrash"), sent)


def pull_queue(addr: str, topic: str, queue_id: int) -> tuple[int, int]:
    """A pull of up to 32 messages from offset 0: (code, how many came)."""
    from store.format import records

    hdr = h.PullMessageRequestHeader(consumer_group="HaTopicsG", topic=topic, queue_id=queue_id, queue_offset=0,
                                     max_msg_nums=32, sys_flag=0x4, commit_offset=0, suspend_timeout_millis=0,
                                     subscription="*", sub_version=0)  # fmt: skip
    r = remoting_call(addr, RequestCode.PULL_MESSAGE, hdr)
    return r.code, sum(1 for _ in records.RecordWalk(r.body, 0, len(r.body))) if r.body else 0


@pytest.mark.integration
def test_a_slave_whose_master_died_takes_a_topic_from_the_route_and_invents_none(cluster_factory) -> None:
    """The master dies before its slave could ask for a new topic's config: here the slave gets the master's log
    only afterwards, from a master the test plays on the HA port (as in the test above) with the dead master's
    bytes.  The slave takes what the master registered with the NameServer, and a topic the master deleted (its
    records still in the log) it does not serve, nor add to its table."""
    # the port the test plays the master on: bound now, so no other process takes it; not listening until then, so
    # the slave's connections are refused as by a dead master's
    played = socket.socket()
    played.bind(("127.0.0.1", 0))
    ha_port = played.getsockname()[1]
    c = cluster_factory(haMasterAddress=f"127.0.0.1:{ha_port}", **NO_PERIODIC_COPY)
    c.master.start()
    c.slave.start()
    wait_first_copy(c)
    kept, deleted = unique("KeptT"), unique("GoneT")
    create_topic(c.master.broker_addr, kept, 3)
    create_topic(c.master.broker_addr, deleted, 2)
    for i in range(9):
        assert send_to(c.master.broker_addr, kept, f"k-{i}".encode()) == ResponseCode.SUCCESS
        assert send_to(c.master.broker_addr, deleted, f"g-{i}".encode()) == ResponseCode.SUCCESS
    drop = h.DeleteTopicRequestHeader(topic=deleted)
    r = remoting_call(c.master.broker_addr, RequestCode.DELETE_TOPIC_IN_BROKER, drop)
    assert r.code == ResponseCode.SUCCESS, r.remark

    def routed(topic: str) -> bool:
        hdr = h.GetRouteInfoRequestHeader(topic=topic)
        return remoting_call(c.namesrv_addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, hdr).code == ResponseCode.SUCCESS

    wait_until(lambda: routed(kept) and not routed(deleted), 20, what="the master's registration of both changes")
    end = max_offset(c.master.broker_addr)
    c.master.kill()
    log = commitlog_bytes(c.master.store_dir, 0, end)
    assert len(log) == end < SEGMENT  # one segment: the frames below never cross into the next

    with played as listener:
        listener.listen()
        listener.settimeout(30)
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(30)
            assert ha.decode_report(_recv_exactly(conn, 8)) == 0
            conn.sendall(ha.encode_transfer_header(0, len(log)) + log)
            while ha.decode_report(_recv_exactly(conn, 8)) != len(log):
                pass
    wait_until(lambda: queue_max(c.slave.broker_addr, kept) == 9, 20, what="the slave to dispatch the copy")

    assert pull_queue(c.slave.broker_addr, kept, 0) == (ResponseCode.SUCCESS, 9)
    config = topic_table(c.slave.broker_addr)[1].get(kept)
    assert config is not None and (config.read_queue_nums, config.write_queue_nums, config.perm) == (3, 3, 6)

    assert queue_max(c.slave.broker_addr, deleted) > 0  # its records are in the slave's log and queues
    assert pull_queue(c.slave.broker_addr, deleted, 0)[0] == ResponseCode.TOPIC_NOT_EXIST
    assert deleted not in topic_table(c.slave.broker_addr)[1]
    assert deleted not in (c.slave.store_dir / "config" / "topics.json").read_text()
