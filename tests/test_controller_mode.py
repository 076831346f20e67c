"""Controller mode (RocketMQ 5's automatic failover, docs/ha.md): mqlake brokers registered with Apache RocketMQ
5.4.0's own controller group (three DLedger nodes, ``tests.peers.ControllerCluster``), replicating with the
AutoSwitch protocol, and a stock C++ producer carrying on through a master's SIGKILL."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import pytest

from broker.config import BrokerConfigError, build_configs, load_broker_conf
from store.config import BrokerRole
from store.epoch_file import EpochFile, consistent_point
from store.message_store import MessageStore
from tests.fixtures_broker import MqlakeServer, stop_servers
from tests.helpers import make_message, wait_until
from tests.peers import ControllerCluster
from tests.test_ha import SEGMENT, commitlog_bytes, consume_all, max_offset, runtime, unique


@pytest.mark.unit
def test_epoch_file_is_rocketmqs_checkpoint_text_and_finds_the_common_point(tmp_path) -> None:
    f = EpochFile(tmp_path)
    f.append(1, 0)
    f.append(2, 4096)
    text = (tmp_path / "epochFileCheckpoint").read_text()
    lines = text.splitlines()
    assert lines[0] == "2" and lines[2:] == ["1-0", "2-4096"]
    import zlib

    assert int(lines[1]) == zlib.crc32(b"1-0\n2-4096\n") & 0x7FFFFFFF
    assert EpochFile(tmp_path).entries == [(1, 0), (2, 4096)]  # read back, CRC checked
    # an old master (epoch 1 up to 9000) meets the new one (epoch 1 up to 4096, epoch 2 since): common to 4096
    assert consistent_point([(1, 0)], 9000, [(1, 0), (2, 4096)], 5000) == 4096
    # a slave behind the master keeps its whole log
    assert consistent_point([(1, 0), (2, 4096)], 4500, [(1, 0), (2, 4096)], 5000) == 4500
    # nothing in common: -1 (the broker refuses to replicate)
    assert consistent_point([(3, 100)], 9000, [(1, 0), (2, 4096)], 5000) == -1


@pytest.mark.unit
def test_controller_mode_without_a_usable_controller_address_stops_naming_the_key() -> None:
    with pytest.raises(BrokerConfigError, match="controllerAddr"):
        build_configs({"enableControllerMode": "true"})
    with pytest.raises(BrokerConfigError, match="controllerAddr"):
        build_configs({"enableControllerMode": "true", "controllerAddr": "127.0.0.1:9878;nowhere"})
    broker, store = build_configs({"enableControllerMode": "true", "controllerAddr": "127.0.0.1:1;127.0.0.1:2",
                                   "brokerRole": "ASYNC_MASTER"})  # fmt: skip
    assert broker.controller_addrs == ["127.0.0.1:1", "127.0.0.1:2"]
    assert store.broker_role == "SLAVE"  # until the controllers say otherwise


def _broker(tmp: Path, name: str, namesrv: str, controllers: list[str]) -> MqlakeServer:
    return MqlakeServer(
        tmp / name, "broker", namesrvAddr=namesrv, enableControllerMode="true", controllerAddr=";".join(controllers),
        allAckInSyncStateSet="true", brokerHeartbeatInterval="500", controllerHeartBeatTimeoutMills="3000",
        syncBrokerMetadataPeriod="1000", checkSyncStateSetPeriod="1000", haSendHeartbeatInterval="500",
        haMaxTimeSlaveNotCatchup="5000", slaveSyncInterval="1000", mappedFileSizeCommitLog=str(SEGMENT),
    )  # fmt: skip


def failover_seconds(acked: list[tuple[float, bytes]], killed_at: float) -> float:
    """From the kill to the first send acknowledged after the longest pause in acknowledgements since it: sends
    answered by the old master just before it died can arrive a moment after the kill, the new master's come after
    the pause the failover makes."""
    times = [killed_at] + [ts for ts, _ in acked if ts > killed_at]
    gaps = [(b - a, b) for a, b in itertools.pairwise(times)]
    return max(gaps)[1] - killed_at


def _master_and_slave(tmp: Path, controllers: ControllerCluster) -> tuple[MqlakeServer, MqlakeServer, MqlakeServer]:
    """A NameServer and two brokers of one broker set: ``a`` elected master, ``b`` its slave in the sync state set."""
    namesrv = MqlakeServer(tmp / "ns", "namesrv").start()
    a = _broker(tmp, "a", namesrv.namesrv_addr, controllers.addrs)
    b = _broker(tmp, "b", namesrv.namesrv_addr, controllers.addrs)
    try:
        a.start()
        wait_until(lambda: _role(a) == "SYNC_MASTER", 60, what="the first broker to be elected master")
        b.start()
        wait_until(lambda: _role(b) == "SLAVE", 30, what="the second broker to follow it")
        wait_until(lambda: runtime(a.broker_addr).get("haSyncStateSet") == "1,2", 30,
                   what="the slave to join the sync state set")  # fmt: skip
    except BaseException:
        stop_servers([a, b, namesrv])
        raise
    return namesrv, a, b


def _send(namesrv: str, topic: str, bodies: list[bytes]) -> None:
    """Send each body with a stock C++ producer; every one must be acknowledged SEND_OK."""
    from rocketmq.client import Message, Producer

    p = Producer(unique("PG"))
    p.set_namesrv_addr(namesrv)
    p.start()
    try:
        for body in bodies:
            m = Message(topic)
            m.set_body(body)
            assert p.send_sync(m).status == 0
    finally:
        p.shutdown()


def _role(server: MqlakeServer) -> str | None:
    try:
        return runtime(server.broker_addr).get("brokerRole")
    except (AssertionError, OSError):
        return None


@pytest.mark.integration
def test_master_sigkilled_under_sync_load_fails_over_and_loses_nothing_acknowledged(tmp_path) -> None:
    from rocketmq.client import Message, Producer

    with ControllerCluster(tmp_path / "controllers", scanNotActiveBrokerInterval=1000) as controllers:
        namesrv, a, b = _master_and_slave(tmp_path, controllers)
        try:

            topic = unique("FoT")
            p = Producer(unique("PG"))
            p.set_namesrv_addr(namesrv.namesrv_addr)
            p.start()
            acked: list[tuple[float, bytes]] = []
            failed: list[float] = []  # when a send failed (the client had tried its retries)
            stop = threading.Event()

            def produce() -> None:
                for i in itertools.count():
                    if stop.is_set():
                        return
                    body = f"m-{i:06d}-" + "p" * 200
                    m = Message(topic)
                    m.set_body(body)
                    try:
                        if p.send_sync(m).status == 0:  # SEND_OK: every member of the sync state set holds it
                            acked.append((time.monotonic(), body.encode()))
                    except Exception:  # the master is gone: sent again until the client's route names the new one
                        failed.append(time.monotonic())

            t = threading.Thread(target=produce, daemon=True)
            t.start()
            wait_until(lambda: len(acked) >= 300, 120, what="300 acknowledged sends")
            killed_at = time.monotonic()
            before = len(acked)
            a.kill()
            wait_until(lambda: _role(b) == "SYNC_MASTER", 60, what="the slave to be elected master")
            wait_until(lambda: len(acked) >= before + 100, 120, what="sends acknowledged by the new master")
            stop.set()
            t.join(60)
            p.shutdown()
            print(f"failover: {failover_seconds(acked, killed_at):.1f} s from SIGKILL to the first send the new "
                  f"master acknowledged ({len(failed)} sends failed after the client's own retries)")

            # the old master returns as a slave and its CommitLog becomes the new master's, byte for byte
            a.start()
            wait_until(lambda: _role(a) == "SLAVE", 60, what="the old master to return as a slave")
            wait_until(lambda: max_offset(a.broker_addr) == max_offset(b.broker_addr), 60,
                       what="the old master to catch up")  # fmt: skip
            end = max_offset(b.broker_addr)
            assert commitlog_bytes(a.store_dir, 0, end) == commitlog_bytes(b.store_dir, 0, end)
            assert len(commitlog_bytes(a.store_dir, 0, end)) == end

            # a new consumer group reads every acknowledged message
            sent = {body for _, body in acked}
            got = consume_all(namesrv.namesrv_addr, topic, unique("Fresh"), sent)
            assert sent <= got
        finally:
            stop_servers([a, b, namesrv])


@pytest.mark.integration
def test_an_old_master_returning_with_unacknowledged_records_is_cut_to_the_epoch_boundary(tmp_path) -> None:
    with ControllerCluster(tmp_path / "controllers", scanNotActiveBrokerInterval=1000) as controllers:
        namesrv, a, b = _master_and_slave(tmp_path, controllers)
        try:
            topic = unique("CutT")
            first = [f"first-{i}".encode() * 10 for i in range(200)]
            _send(namesrv.namesrv_addr, topic, first)
            wait_until(lambda: max_offset(b.broker_addr) == max_offset(a.broker_addr), 30, what="the slave to catch up")
            boundary = max_offset(a.broker_addr)
            a.stop()
            wait_until(lambda: _role(b) == "SYNC_MASTER", 60, what="the slave to be elected master")
            # while it is away, the old master's log gains records no replica has: as if written and never acked
            _, store_conf = load_broker_conf(a.conf_path)
            store_conf.broker_role = BrokerRole.ASYNC_MASTER
            store = MessageStore(store_conf).start()
            try:
                for i in range(50):
                    assert store.put_message(make_message(topic, i % 4, f"extra-{i}".encode() * 10)).ok
                assert store.max_phy_offset > boundary
            finally:
                store.shutdown()
            later = [f"later-{i}".encode() * 10 for i in range(100)]
            _send(namesrv.namesrv_addr, topic, later)

            a.start()
            wait_until(lambda: _role(a) == "SLAVE", 60, what="the old master to return as a slave")
            wait_until(lambda: max_offset(a.broker_addr) == max_offset(b.broker_addr), 60,
                       what="the old master to catch up")  # fmt: skip
            assert "CommitLog cut from" in a.run_log() and f"to {boundary}," in a.run_log()
            end = max_offset(b.broker_addr)
            log_a = commitlog_bytes(a.store_dir, 0, end)
            assert log_a == commitlog_bytes(b.store_dir, 0, end) and len(log_a) == end
            assert b"extra-" not in log_a
            # the old master's epoch file is the new master's: epoch 1 from 0, epoch 2 from the boundary
            assert EpochFile(a.store_dir).entries == EpochFile(b.store_dir).entries == [(1, 0), (2, boundary)]
            got = consume_all(namesrv.namesrv_addr, topic, unique("Fresh"), set(first) | set(later))
            assert not any(body.startswith(b"extra-") for body in got)
        finally:
            stop_servers([a, b, namesrv])
