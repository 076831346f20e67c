"""Replication across the two implementations (RocketMQ 4.x HA): an mqlake SLAVE of Apache RocketMQ's 4.9.7
master (``DefaultHAService``), and Apache RocketMQ's 4.9.7 SLAVE of an mqlake master.

In both directions the slave connects before the first message (a slave reporting offset 0 is started at the
master's newest segment, here segment 0), messages spanning several 64 KiB CommitLog segments are produced to the
master with the project's client, and then:

- the slave's CommitLog is the master's byte for byte over its used bytes ``[0, commitLogMaxOffset)``;
- a pull sent to the slave broker gives, queue by queue, the same messages as the master: msgId, queue offset,
  CommitLog offset and body, every message sent exactly once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import Message, Producer
from broker.client.message import MessageExt, decode_messages
from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.loop import run
from tests.fixtures_broker import MqlakeServer, remoting_call, stop_servers
from tests.helpers import wait_until
from tests.peers import JavaCluster
from tests.test_ha import HA_CONF, SEGMENT, commitlog_bytes, max_offset, runtime

JAVA_BROKER = "rocketmq-4-broker"  # DefaultHAService; 5.x keeps it as the default HA mode as well
TOPIC = "PeerHa"
QUEUES = 4  # the producer's defaultTopicQueueNums: the topic is created by the first send
COUNT = 300  # ~620-byte records: three 64 KiB segments
# the settings both sides must share: the CommitLog's segment size (a transfer names an offset, the slave's files
# are named by it); the broker name and cluster, so that the NameServer pairs master and slave
SHARED = {"mappedFileSizeCommitLog": str(SEGMENT), "brokerName": "broker-a", "brokerClusterName": "DefaultCluster"}
CATCH_UP = 60.0  # a Java slave learns its master's address from a registration, at most every 10 s
# a slave answers a pull it found with PULL_RETRY_IMMEDIATELY (and no body) unless it may serve reads
SLAVE_READ = {"slaveReadEnable": "true"}


def body(i: int) -> bytes:
    return f"ha-{i:05d};".encode() * 50


def produce(namesrv: str) -> None:
    async def go() -> None:
        async with Producer(f"peer_ha_{os.getpid()}", namesrv) as producer:
            for i in range(COUNT):
                await producer.send(Message(TOPIC, body(i), keys=[f"k{i}"]))

    run(go())


def pull_all(addr: str) -> list[tuple[int, int, int, str, bytes]]:
    """Every message of TOPIC that the broker at ``addr`` serves, pulled from it directly: (queue, queue offset,
    CommitLog offset, msgId, body), or an AssertionError naming the answer code and remark."""
    out = []
    for q in range(QUEUES):
        offset = 0
        while True:
            hdr = h.PullMessageRequestHeader(consumer_group="peer_ha_reader", topic=TOPIC, queue_id=q,
                                             queue_offset=offset, max_msg_nums=32, sys_flag=0x4, commit_offset=0,
                                             suspend_timeout_millis=0, subscription="*", sub_version=0)  # fmt: skip
            r = remoting_call(addr, RequestCode.PULL_MESSAGE, hdr)
            if r.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED) and offset > 0:
                break
            assert r.code == ResponseCode.SUCCESS, f"pull {TOPIC}:{q}@{offset} from {addr}: {r.code} {r.remark}"
            msgs: list[MessageExt] = decode_messages(r.body, source=f"pull from {addr}")
            out += [(m.queue_id, m.queue_offset, m.commit_log_offset, m.msg_id, m.body) for m in msgs]
            offset = r.read_header(h.PullMessageResponseHeader).next_begin_offset
    return out


def served(addr: str, timeout: float) -> list[tuple[int, int, int, str, bytes]]:
    """``pull_all`` once the broker serves every message (a slave learns the topic from its master's table); past
    ``timeout``, the last answer's code and remark, or the count it served."""

    def every() -> list[tuple[int, int, int, str, bytes]] | None:
        try:
            got = pull_all(addr)
        except AssertionError:
            return None
        return got if len(got) == COUNT else None

    try:
        return wait_until(every, timeout, what=f"{addr} to serve every message")  # type: ignore[return-value]
    except AssertionError:
        got = pull_all(addr)  # names the answer code and remark if a pull still fails
        raise AssertionError(f"{addr} serves {len(got)} of {COUNT} messages") from None


def assert_same_commitlog(master_addr: str, master_store: Path, slave_addr: str, slave_store: Path) -> None:
    """The slave reaches the master's end, and its CommitLog's used bytes are the master's."""
    end = max_offset(master_addr)
    assert end > 2 * SEGMENT, "the messages span three segments"
    wait_until(lambda: max_offset(slave_addr) == end, CATCH_UP, what=f"the slave to reach the master's end {end}")
    master_log = commitlog_bytes(master_store, 0, end)
    assert len(master_log) == end
    assert commitlog_bytes(slave_store, 0, end) == master_log


def assert_slave_serves(master_addr: str, slave_addr: str) -> None:
    """A pull sent to the slave gives what the master gives: every message sent, once."""
    from_master = served(master_addr, 30)
    from_slave = served(slave_addr, CATCH_UP)
    assert from_slave == from_master
    assert sorted(m[4] for m in from_slave) == sorted(body(i) for i in range(COUNT))
    assert len({m[3] for m in from_slave}) == COUNT


@pytest.mark.integration
def test_mqlake_slave_of_a_java_master_holds_its_commitlog_and_serves_reads(tmp_path: Path) -> None:
    # no haMasterAddress: the slave takes the master's HA address from the NameServer's register reply (4.x's
    # BrokerStartup puts the Java master's HA port at listenPort + 1 whatever haListenPort says)
    with JavaCluster(JAVA_BROKER, tmp_path / "java", tmp_path / "java-store", brokerRole="ASYNC_MASTER",
                     **SHARED) as master:  # fmt: skip
        slave = MqlakeServer(tmp_path / "slave", command="broker", brokerRole="SLAVE", brokerId="1",
                             namesrvAddr=master.namesrv_addr, **{**HA_CONF, **SHARED, **SLAVE_READ})  # fmt: skip
        try:
            slave.start()
            wait_until(lambda: runtime(slave.broker_addr).get("haConnected") == "true", 30,
                       what="the slave to connect to the Java master")  # fmt: skip
            produce(master.namesrv_addr)
            assert_same_commitlog(master.broker_addr, master.store, slave.broker_addr, slave.store_dir)
            assert_slave_serves(master.broker_addr, slave.broker_addr)
        finally:
            stop_servers([slave])


@contextlib.contextmanager
def java_slave_of_mqlake(tmp_path: Path) -> Iterator[tuple[MqlakeServer, JavaCluster]]:
    """An mqlake master and Apache RocketMQ's 4.9.7 slave, the slave reported to the master, the messages sent."""
    # the Java slave with its NameServer first; the mqlake master (its HA port the OS's pick) registers with that
    # NameServer, where the slave finds its master's address and HA address at its next registration
    slave = JavaCluster(JAVA_BROKER, tmp_path / "java", tmp_path / "java-store", brokerRole="SLAVE", brokerId=1,
                        **{**HA_CONF, **SHARED, **SLAVE_READ})  # fmt: skip
    with slave:
        master = MqlakeServer(tmp_path / "master", command="broker", brokerRole="ASYNC_MASTER",
                              namesrvAddr=slave.namesrv_addr, **{**HA_CONF, **SHARED})  # fmt: skip
        try:
            master.start()
            # reported, not only connected: the master streams from where the slave's first report places it
            wait_until(lambda: runtime(master.broker_addr).get("haSlaveAckOffsets"), CATCH_UP,
                       what="the Java slave to report its offset to the mqlake master")  # fmt: skip
            produce(slave.namesrv_addr)
            yield master, slave
        finally:
            stop_servers([master])


@pytest.mark.integration
def test_java_slave_of_an_mqlake_master_holds_its_commitlog(tmp_path: Path) -> None:
    with java_slave_of_mqlake(tmp_path) as (master, slave):
        assert_same_commitlog(master.broker_addr, master.store_dir, slave.broker_addr, slave.store)


@pytest.mark.integration
@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="Apache RocketMQ 4.x's slave copies its master's topics over the VIP channel "
                          "(listenPort - 2), which mqlake does not serve: the slave never has the topic")  # fmt: skip
def test_java_slave_of_an_mqlake_master_serves_reads(tmp_path: Path) -> None:
    with java_slave_of_mqlake(tmp_path) as (master, slave):
        assert_same_commitlog(master.broker_addr, master.store_dir, slave.broker_addr, slave.store)
        assert_slave_serves(master.broker_addr, slave.broker_addr)
