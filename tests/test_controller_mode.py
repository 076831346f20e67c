"""Controller mode (RocketMQ 5's automatic failover, docs/ha.md): mqlake brokers registered with Apache RocketMQ
5.4.0's own controller group (three DLedger nodes, ``tests.peers.ControllerCluster``), replicating with the
AutoSwitch protocol, and a stock C++ producer carrying on through a master's SIGKILL."""

from __future__ import annotations

import asyncio
import collections
import json
import signal
import threading
import time

import pytest

from broker.config import BrokerConfigError, build_configs, load_broker_conf
from broker.remoting.codes import ResponseCode
from store.config import BrokerRole
from store.epoch_file import EpochFile, consistent_point
from store.format import ha
from store.message_store import MessageStore, PutMessageStatus
from tests.clients4 import clients4
from tests.clients4 import run as run_java4
from tests.controller_mode import (
    SyncLoad,
    controller_broker,
    controller_conf,
    failover_seconds,
    in_sync,
    master_and_slave,
    max_offset,
    role,
    routed_master,
    runtime,
)
from tests.fixtures_broker import MqlakeServer, stop_servers
from tests.helpers import make_message, read_queue, wait_dispatched, wait_until
from tests.live_broker import LiveBroker
from tests.peers import ControllerCluster, java_json
from tests.test_ha import CuttableProxy, commitlog_bytes, consume_all, send_to, unique

__all__ = ["clients4"]  # the fixture, used by name


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
def test_autoswitch_frames_are_rocketmqs_big_endian_layouts() -> None:
    # slave handshake: int state HANDSHAKE(1), short isSyncFromLastFile, short isAsyncLearner, long slaveBrokerId
    assert ha.encode_slave_handshake(2) == bytes.fromhex("00000001" "0000" "0000" "0000000000000002")
    # slave report: int state TRANSFER(2), long max offset
    assert ha.encode_slave_report(0x1234) == bytes.fromhex("00000002" "0000000000001234")
    # master handshake: int state, int body size, long max offset, int last epoch, then 12 bytes per epoch
    assert ha.encode_master_handshake(0x100, 2, [(1, 0), (2, 0x80)]) == bytes.fromhex(
        "00000001" "00000018" "0000000000000100" "00000002" "00000001" "0000000000000000" "00000002" "0000000000000080")
    # master transfer header (36 bytes): state, body size, offset, epoch, epoch start offset, confirm offset
    header = ha.encode_master_transfer_header(0x40, 3, 2, 0x20, 0x30)
    assert header == bytes.fromhex(
        "00000002" "00000003" "0000000000000040" "00000002" "0000000000000020" "0000000000000030")
    assert len(header) == ha.MASTER_TRANSFER_SIZE
    assert ha.decode_master_header(header) == (2, 3, 0x40, 2)
    assert ha.decode_master_transfer_tail(header[ha.MASTER_HANDSHAKE_SIZE :]) == (0x20, 0x30)


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


def _wait_routed(namesrv: str, topic: str, master: MqlakeServer) -> None:
    """Until the NameServer routes ``topic`` to the elected ``master``: the new master registers as brokerId 0 on its
    next registration after the election, and a fresh client's route has no writable queue before that."""
    wait_until(lambda: routed_master(namesrv, topic) == master.broker_addr, 60,
               what="the NameServer to route to the new master")  # fmt: skip


@pytest.mark.integration
def test_master_sigkilled_under_sync_load_fails_over_and_loses_nothing_acknowledged(tmp_path) -> None:
    with ControllerCluster(tmp_path / "controllers", scanNotActiveBrokerInterval=1000) as controllers:
        namesrv, a, b = master_and_slave(tmp_path, controllers.addrs)
        try:
            load = SyncLoad(namesrv.namesrv_addr, unique("FoT"))
            load.wait_acked(300)
            # the slave refuses sends until it is elected
            assert send_to(b.broker_addr, load.topic, b"to-slave") == ResponseCode.SERVICE_NOT_AVAILABLE
            killed_at = time.monotonic()
            a.kill()
            wait_until(lambda: role(b) == "SYNC_MASTER", 60, what="the slave to be elected master")
            load.wait_acked(100)  # the stock client carries on through its own retries and route refresh
            load.stop()
            print(f"failover: {failover_seconds(load.acked, killed_at):.1f} s from SIGKILL to the first send the new "
                  f"master acknowledged ({load.failed} sends failed after the client's own retries)")

            # the old master returns as a slave and its CommitLog becomes the new master's, byte for byte
            a.start()
            wait_until(lambda: role(a) == "SLAVE", 60, what="the old master to return as a slave")
            wait_until(lambda: max_offset(a) == max_offset(b), 60, what="the old master to catch up")
            end = max_offset(b)
            log_a = commitlog_bytes(a.store_dir, 0, end)
            assert log_a == commitlog_bytes(b.store_dir, 0, end) and len(log_a) == end

            # a new consumer group reads every acknowledged message
            assert load.bodies <= consume_all(namesrv.namesrv_addr, load.topic, unique("Fresh"), load.bodies)
        finally:
            stop_servers([a, b, namesrv])


KILLS_IN_A_ROW = 10


@pytest.mark.integration
def test_ten_masters_sigkilled_in_a_row_under_sync_load_lose_and_duplicate_nothing(tmp_path, clients4) -> None:
    """Each round SIGKILLs the current master while a stock Java 4.x producer sends SYNC (routes refreshed every
    second, no retries: each body goes out once), waits for the controller to elect the slave and the producer to
    carry on there, restarts the killed broker and waits for it to follow; its CommitLog must then be the new
    master's byte for byte.  At the end the last master's queues hold every acknowledged body exactly once."""
    with ControllerCluster(tmp_path / "controllers", scanNotActiveBrokerInterval=1000) as controllers:
        namesrv, a, b = master_and_slave(tmp_path, controllers.addrs)
        stop = tmp_path / "stop-producing"
        try:
            topic = unique("KillT")
            result: dict = {}

            def produce() -> None:
                result.update(java_json("clients4.ProduceUntil", "rocketmq-4", f"namesrv={namesrv.namesrv_addr}",
                                        f"topic={topic}", f"group={unique('PG')}", f"stop={stop}", "retries=0",
                                        classes=clients4, home=tmp_path / "java", timeout=3600))  # fmt: skip

            producer = threading.Thread(target=produce, daemon=True)
            producer.start()
            master, slave = a, b
            for n in range(KILLS_IN_A_ROW):
                wait_until(lambda m=master: in_sync(m) == "1,2", 60, what="the slave in the sync state set")
                start = max_offset(master)
                # SYNC load on this master: the producer's sends, each held by the slave before it is acknowledged
                wait_until(lambda m=master, s=start: max_offset(m) > s + 20_000, 120,
                           what=f"round {n + 1}: the producer's sends to the master")  # fmt: skip
                master.kill()
                wait_until(lambda s=slave: role(s) == "SYNC_MASTER", 60, what=f"round {n + 1}: a new master")
                start = max_offset(slave)
                wait_until(lambda s=slave, o=start: max_offset(s) > o + 20_000, 120,
                           what=f"round {n + 1}: the producer's sends to the new master")  # fmt: skip
                master.start()  # the killed master returns as a slave, cut to the epoch boundary if need be
                wait_until(lambda m=master: role(m) == "SLAVE", 60, what=f"round {n + 1}: the old master to follow")
                end = max_offset(slave)
                wait_until(lambda m=master, e=end: max_offset(m) >= e, 60,
                           what=f"round {n + 1}: the old master to catch up")  # fmt: skip
                log = commitlog_bytes(master.store_dir, 0, end)
                assert len(log) == end and log == commitlog_bytes(slave.store_dir, 0, end), f"round {n + 1}"
                master, slave = slave, master
            stop.touch()
            producer.join(300)
            assert not producer.is_alive() and result, "the producer did not finish"
        finally:
            stop.touch()
            stop_servers([a, b, namesrv])

    # the last master's store, read queue by queue: each body it holds, with how many copies
    _, store_conf = load_broker_conf(master.conf_path)
    store = MessageStore(store_conf).start()
    try:
        wait_dispatched(store)
        held = collections.Counter(record.body for cq in store.all_consume_queues() if cq.topic == topic
                                   for _, record in read_queue(store, topic, cq.queue_id))  # fmt: skip
    finally:
        store.shutdown()
    acked = {body.encode() for body in result["acked"]}
    print(f"{KILLS_IN_A_ROW} kills: {len(acked)} sends acknowledged, {result['failed']} failed, "
          f"{len(held.keys() - acked)} unacknowledged ones held")  # fmt: skip
    assert acked <= held.keys(), f"{len(acked - held.keys())} acknowledged sends lost"
    # without retries nothing may be held twice; what is held unacknowledged was sent and its answer lost
    assert [body for body, copies in held.items() if copies > 1] == []
    assert len(held.keys() - acked) <= result["failed"]


@pytest.mark.integration
def test_a_master_cut_off_from_the_controllers_and_its_slave_is_replaced_and_steps_down(tmp_path) -> None:
    """Everything the master sends to the controllers (heartbeats to every node, its requests to the leader, which
    it reaches through its ``controllerAddr`` entry) and its HA stream to the slave go through relays the test
    isolates."""
    with ControllerCluster(tmp_path / "controllers", scanNotActiveBrokerInterval=1000) as controllers:
        controller_relays = [CuttableProxy(lambda port=port: ("127.0.0.1", port)) for port in controllers.ports]
        namesrv = MqlakeServer(tmp_path / "ns", "namesrv").start()
        # it registers with the NameServer every 2 s: the test sees one of its registrations while it is cut off
        a = controller_broker(tmp_path, "a", namesrv.namesrv_addr, [f"127.0.0.1:{r.port}" for r in controller_relays],
                              registerNameServerPeriod="2000")  # fmt: skip
        # the HA port is the OS's pick, bound once a is master: the relay asks for it at the slave's connection
        ha_relay = CuttableProxy(lambda: ("127.0.0.1", int(runtime(a.broker_addr)["haListenPort"])))
        b = controller_broker(tmp_path, "b", namesrv.namesrv_addr, controllers.addrs,
                              haMasterAddress=f"127.0.0.1:{ha_relay.port}")  # fmt: skip
        try:
            a.start()
            wait_until(lambda: role(a) == "SYNC_MASTER", 60, what="the first broker to be elected master")
            relayed = {f"127.0.0.1:{r.port}" for r in controller_relays}
            assert runtime(a.broker_addr)["controllerLeader"] in relayed  # the leader too is reached through one
            b.start()
            wait_until(lambda: in_sync(a) == "1,2", 60, what="the slave to join the sync state set")
            load = SyncLoad(namesrv.namesrv_addr, unique("CutT"))
            load.wait_acked(200)
            for relay in [*controller_relays, ha_relay]:
                relay.isolate()
            # the controllers no longer hear the master: they elect the slave, which held every acknowledged send
            wait_until(lambda: role(b) == "SYNC_MASTER", 60, what="the slave to be elected master")
            # the cut-off master still registers as brokerId 0, with its older epoch: the NameServer ignores it, and
            # the route keeps leading to the new master
            ignored = f"{a.broker_addr} registers with state version"
            wait_until(lambda: ignored in namesrv.log_text(), 60, what="the cut-off master's registration ignored")
            assert routed_master(namesrv.namesrv_addr, load.topic) == b.broker_addr
            # the cut-off master cannot hear of it, nor drop its slave from the sync state set (only the leader
            # can): it acknowledges nothing, so nothing it takes in can be lost
            assert role(a) == "SYNC_MASTER"
            assert send_to(a.broker_addr, load.topic, b"cut-off") != ResponseCode.SUCCESS
            for relay in controller_relays:
                relay.heal()
            # told by the controller leader, it steps down and follows the new master
            wait_until(lambda: role(a) == "SLAVE", 60, what="the cut-off master to step down")
            load.wait_acked(100)
            wait_until(lambda: max_offset(a) == max_offset(b), 60, what="the old master to catch up")
            load.stop()
            end = max_offset(b)
            assert commitlog_bytes(a.store_dir, 0, end) == commitlog_bytes(b.store_dir, 0, end)
            got = consume_all(namesrv.namesrv_addr, load.topic, unique("Fresh"), load.bodies)
            assert load.bodies <= got and b"cut-off" not in got
        finally:
            stop_servers([a, b, namesrv])
            for relay in [*controller_relays, ha_relay]:
                relay.close()


@pytest.mark.integration
def test_a_master_stepping_down_acknowledges_none_of_the_puts_it_takes_meanwhile(tmp_path) -> None:
    """A master told that another was elected cuts its log back to the new epoch's start when it follows: a put
    it stored during the change of role must not be answered PUT_OK (a stock producer whose route still leads to
    it sends there until its next route update)."""
    with ControllerCluster(tmp_path / "controllers", nodes=1) as controllers:
        namesrv = MqlakeServer(tmp_path / "ns", "namesrv").start()
        # the slave stays in the sync state set however long it is gone: every put waits for it
        conf = controller_conf(namesrv.namesrv_addr, controllers.addrs, haMaxTimeSlaveNotCatchup="3600000")
        a = LiveBroker(tmp_path / "a", **conf).start()
        b = MqlakeServer(tmp_path / "b", "broker", **conf)
        try:
            wait_until(lambda: runtime(a.addr).get("brokerRole") == "SYNC_MASTER", 60, what="a to be elected")
            b.start()
            wait_until(lambda: runtime(a.addr).get("haSyncStateSet") == "1,2", 60, what="b to join the set")
            b.stop()
            bc = a.controller
            assert bc is not None and bc.replicas is not None
            epoch = bc.replicas.master_epoch + 1

            async def put_while_stepping_down() -> list[PutMessageStatus]:
                step_down = asyncio.ensure_future(bc.become_slave(b.broker_addr, epoch))
                puts = []
                while not step_down.done():
                    puts.append(asyncio.ensure_future(bc.put([make_message("StepDownT", 0, b"taken meanwhile")])))
                    await asyncio.sleep(0)
                await step_down
                return [result.status for result in await asyncio.gather(*puts)]

            statuses = a.run(put_while_stepping_down(), timeout=60)
            assert statuses and PutMessageStatus.PUT_OK not in statuses, collections.Counter(statuses)
            assert runtime(a.addr)["brokerRole"] == "SLAVE"
        finally:
            a.close()
            stop_servers([b, namesrv])


@pytest.mark.integration
def test_an_old_master_returning_with_unacknowledged_records_is_cut_to_the_epoch_boundary(tmp_path) -> None:
    with ControllerCluster(tmp_path / "controllers", scanNotActiveBrokerInterval=1000) as controllers:
        namesrv, a, b = master_and_slave(tmp_path, controllers.addrs)
        try:
            topic = unique("CutT")
            first = [f"first-{i}".encode() * 10 for i in range(200)]
            _send(namesrv.namesrv_addr, topic, first)
            wait_until(lambda: max_offset(b) == max_offset(a), 30, what="the slave to catch up")
            boundary = max_offset(a)
            a.stop()
            wait_until(lambda: role(b) == "SYNC_MASTER", 60, what="the slave to be elected master")
            _wait_routed(namesrv.namesrv_addr, topic, b)
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
            wait_until(lambda: role(a) == "SLAVE", 60, what="the old master to return as a slave")
            wait_until(lambda: max_offset(a) == max_offset(b), 60,
                       what="the old master to catch up")  # fmt: skip
            assert "CommitLog cut from" in a.run_log() and f"to {boundary}," in a.run_log()
            end = max_offset(b)
            log_a = commitlog_bytes(a.store_dir, 0, end)
            assert log_a == commitlog_bytes(b.store_dir, 0, end) and len(log_a) == end
            assert b"extra-" not in log_a
            # the old master's epoch file is the new master's: epoch 1 from 0, epoch 2 from the boundary
            assert EpochFile(a.store_dir).entries == EpochFile(b.store_dir).entries == [(1, 0), (2, boundary)]
            got = consume_all(namesrv.namesrv_addr, topic, unique("Fresh"), set(first) | set(later))
            assert not any(body.startswith(b"extra-") for body in got)
        finally:
            stop_servers([a, b, namesrv])


@pytest.mark.integration
def test_a_stalled_slave_leaves_the_sync_state_set_and_rejoins_once_caught_up(tmp_path) -> None:
    with ControllerCluster(tmp_path / "controllers", scanNotActiveBrokerInterval=1000) as controllers:
        namesrv, a, b = master_and_slave(tmp_path, controllers.addrs)
        try:
            topic = unique("SlowT")
            _send(namesrv.namesrv_addr, topic, [b"both-%d" % i for i in range(20)])
            assert b.process is not None
            b.process.send_signal(signal.SIGSTOP)  # a slave that stops reading: it falls behind
            try:
                # a send now waits for the stalled member until haMaxTimeSlaveNotCatchup shrinks the set to the master
                wait_until(lambda: in_sync(a) == "1", 30,
                           what="the stalled slave to leave the sync state set")  # fmt: skip
                _send(namesrv.namesrv_addr, topic, [b"alone-%d" % i for i in range(50)])  # acknowledged by {1}
                assert max_offset(a) > int(runtime(a.broker_addr)["haSlaveAckOffsets"].split("=")[1])
            finally:
                b.process.send_signal(signal.SIGCONT)
            wait_until(lambda: in_sync(a) == "1,2", 30,
                       what="the slave to rejoin once caught up")  # fmt: skip
            end = max_offset(a)
            wait_until(lambda: max_offset(b) == end, 30, what="the slave to hold the master's end")
            assert commitlog_bytes(a.store_dir, 0, end) == commitlog_bytes(b.store_dir, 0, end)
        finally:
            stop_servers([a, b, namesrv])


@pytest.mark.integration
@pytest.mark.expected_errors("two brokers claim one id")
def test_the_namesrvs_embedded_controller_fails_over_and_keeps_its_state_across_its_restart(tmp_path) -> None:
    namesrv = MqlakeServer(tmp_path / "ns", "namesrv", enableControllerInNamesrv="true", controllerListenPort="0",
                           controllerStorePath=str(tmp_path / "controller"), scanNotActiveBrokerInterval="500")
    namesrv.start()
    assert namesrv.controller_addr is not None
    _, a, b = master_and_slave(tmp_path, [namesrv.controller_addr], namesrv, registerNameServerPeriod="1000")
    try:
        topic = unique("EmbT")
        first = [b"first-%d" % i for i in range(100)]
        _send(namesrv.namesrv_addr, topic, first)
        first_epoch = int(runtime(a.broker_addr)["masterEpoch"])
        a.kill()
        wait_until(lambda: role(b) == "SYNC_MASTER", 60, what="the embedded controller to elect the slave")
        _wait_routed(namesrv.namesrv_addr, topic, b)
        later = [b"later-%d" % i for i in range(50)]
        _send(namesrv.namesrv_addr, topic, later)

        # restarted, the controller has its state back: broker ids, the master, and the master's epoch, which is
        # the one the master serves (a late heartbeat on a loaded machine may have made it re-elect b, at a higher
        # epoch: the two still agree once b has heard of it)
        namesrv.restart()

        def persisted() -> dict:
            return json.loads((tmp_path / "controller" / "controller.json").read_text())["brokerSets"]["broker-a"]

        assert sorted(persisted()["members"]) == ["1", "2"]

        def b_serves_the_persisted_epoch() -> bool:
            state = persisted()
            return (state["master"] == 2 and role(b) == "SYNC_MASTER"
                    and runtime(b.broker_addr)["masterEpoch"] == str(state["masterEpoch"]))  # fmt: skip

        wait_until(b_serves_the_persisted_epoch, 60, what="the restarted controller and the master to agree")
        assert persisted()["masterEpoch"] > first_epoch
        a.start()  # the old master registers with the restarted controller and follows the master it names
        wait_until(lambda: role(a) == "SLAVE", 60, what="the old master to return as a slave")
        wait_until(lambda: max_offset(a) == max_offset(b), 60, what="the old master to catch up")
        end = max_offset(b)
        assert commitlog_bytes(a.store_dir, 0, end) == commitlog_bytes(b.store_dir, 0, end)
        assert set(first) | set(later) <= consume_all(namesrv.namesrv_addr, topic, unique("Fresh"),
                                                      set(first) | set(later))  # fmt: skip
        # it knows who holds which id: a copy of the master's store cannot start as a second broker 2
        c = controller_broker(tmp_path, "c", namesrv.namesrv_addr, [namesrv.controller_addr])
        c.store_dir.mkdir(parents=True)
        (c.store_dir / "brokerIdentity").write_bytes((b.store_dir / "brokerIdentity").read_bytes())
        with pytest.raises(AssertionError, match="broker id 2 of broker-a is held by the live broker"):
            c.start()
    finally:
        stop_servers([a, b, namesrv])


@pytest.mark.integration
def test_the_controller_leader_killed_with_the_master_still_elects_the_slave(tmp_path) -> None:
    with ControllerCluster(tmp_path / "controllers", scanNotActiveBrokerInterval=1000) as controllers:
        namesrv, a, b = master_and_slave(tmp_path, controllers.addrs)
        try:
            leader = controllers.leader_named_by(controllers.addrs[0])
            leader_index = controllers.ids.index(leader)
            load = SyncLoad(namesrv.namesrv_addr, unique("LdrT"))
            load.wait_acked(200)
            # the master and the controller that would elect its successor die together: the two controllers left
            # elect a leader of their own, which finds the master's heartbeats gone and elects the slave
            a.kill()
            controllers.servers[leader_index].kill()
            wait_until(lambda: role(b) == "SYNC_MASTER", 90, what="the slave to be elected by the new leader")
            survivors = [addr for i, addr in enumerate(controllers.addrs) if i != leader_index]
            controllers.leader_named_by(survivors[0], other_than=leader)  # fails unless a new leader is named
            load.wait_acked(100)
            load.stop()
            assert load.bodies <= consume_all(namesrv.namesrv_addr, load.topic, unique("Fresh"), load.bodies)
        finally:
            stop_servers([a, b, namesrv])


@pytest.mark.integration
def test_a_stock_java_4x_producer_keeps_sending_through_a_failover(tmp_path, clients4) -> None:
    with ControllerCluster(tmp_path / "controllers", scanNotActiveBrokerInterval=1000) as controllers:
        namesrv, a, b = master_and_slave(tmp_path, controllers.addrs)
        try:
            topic = unique("J4T")
            stop = tmp_path / "stop-producing"
            result: dict = {}

            def produce() -> None:
                result.update(run_java4("ProduceUntil", clients4, tmp_path / "java", namesrv=namesrv.namesrv_addr,
                                        topic=topic, group=unique("PG"), stop=stop))  # fmt: skip

            t = threading.Thread(target=produce, daemon=True)
            t.start()
            wait_until(lambda: max_offset(a) > 50_000, 120, what="the Java producer's sends to the first master")
            a.kill()
            wait_until(lambda: role(b) == "SYNC_MASTER", 60, what="the slave to be elected master")
            start = max_offset(b)
            wait_until(lambda: max_offset(b) > start + 20_000, 120, what="the Java producer's sends to the new master")
            stop.touch()
            t.join(120)
            assert not t.is_alive()
            acked = set(result["acked"])
            got = consume_all(namesrv.namesrv_addr, topic, unique("Fresh"), {s.encode() for s in acked})
            assert {s.encode() for s in acked} <= got
        finally:
            stop_servers([a, b, namesrv])


@pytest.mark.integration
@pytest.mark.expected_errors("two brokers claim one id")
def test_a_second_broker_claiming_a_live_brokers_id_stops_at_start_naming_the_file(tmp_path) -> None:
    with ControllerCluster(tmp_path / "controllers", scanNotActiveBrokerInterval=1000) as controllers:
        namesrv = MqlakeServer(tmp_path / "ns", "namesrv").start()
        a = controller_broker(tmp_path, "a", namesrv.namesrv_addr, controllers.addrs)
        try:
            a.start()
            wait_until(lambda: role(a) == "SYNC_MASTER", 60, what="the first broker to be elected master")
            # a store copied from the live master's: same brokerIdentity, another address
            c = controller_broker(tmp_path, "c", namesrv.namesrv_addr, controllers.addrs)
            c.store_dir.mkdir(parents=True)
            (c.store_dir / "brokerIdentity").write_bytes((a.store_dir / "brokerIdentity").read_bytes())
            with pytest.raises(AssertionError, match="brokerIdentity: broker id 1 of broker-a is held by the live"):
                c.start()
            assert role(a) == "SYNC_MASTER"  # the master is untouched
        finally:
            stop_servers([a, namesrv])


@pytest.mark.integration
@pytest.mark.expected_errors("controllerAddr: .* is not a controller")
def test_a_controller_address_that_is_no_controller_stops_start_up_naming_the_key(tmp_path) -> None:
    namesrv = MqlakeServer(tmp_path / "ns", "namesrv").start()
    try:
        # the NameServer's own address, given as the controller's by mistake; the gRPC endpoint, open by then, is
        # closed on the way out (else grpcio's finalizer logs a traceback after the event loop has closed)
        broker = controller_broker(tmp_path, "a", namesrv.namesrv_addr, [namesrv.namesrv_addr], enableProxy="true",
                                   grpcServerPort="0")  # fmt: skip
        with pytest.raises(AssertionError, match=f"controllerAddr: {namesrv.namesrv_addr} is not a controller"):
            broker.start()
        assert not (broker.store_dir / "brokerIdentity").exists()
        assert "gRPC proxy stopped" in broker.log_text()
    finally:
        stop_servers([namesrv])
