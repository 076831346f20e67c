"""A topic's life on disk: ``deleteTopic`` destroys its ConsumeQueues (``DefaultMessageStore.deleteTopics``), so a
topic re-created under the name starts again at queue offset 0, and a topic auto-created by a send is in
topics.json before the send is acknowledged, so a SIGKILL right after the ack does not lose it."""

from __future__ import annotations

import asyncio
import json

import pytest

from broker.remoting import headers as h
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.protocol.topic import TopicConfigSerializeWrapper
from store.checkpoint import abort_file
from store.message_store import MessageStore
from tests.fixtures_broker import remoting_call
from tests.helpers import make_config, make_message, read_queue, wait_dispatched, wait_until
from tests.test_conformance_cpp_client import Collector, message, producer, push_consumer, unique, wait_routed
from tests.test_ops_admin import admin_json


@pytest.mark.unit
def test_store_delete_topic_never_dispatches_its_older_records(tmp_path) -> None:
    """Records appended before the deletion but not dispatched yet do not re-create the old queue, and the
    re-created topic's own records (numbered from 0 again) are all built."""
    store = MessageStore(make_config(tmp_path)).start()
    try:
        store.reput.shutdown()  # dispatch by hand from here: some old records stay undispatched at the deletion
        for i in range(3):
            assert store.put_message(make_message("T", 0, f"old-{i}")).ok
            assert store.put_message(make_message("Other", 0, f"other-{i}")).ok
        store.reput.do_reput()
        for i in range(3, 5):
            assert store.put_message(make_message("T", 0, f"old-{i}")).ok
        cq_dir = store.config.consume_queue_dir / "T"
        assert (cq_dir / "0").is_dir()

        assert store.delete_topic("T") == 1
        assert not cq_dir.exists()
        assert store.get_max_offset_in_queue("T", 0) == 0

        new = [store.put_message(make_message("T", 0, f"new-{i}")) for i in range(2)]
        assert [r.append.queue_offset for r in new] == [0, 1]
        store.reput.do_reput()
        assert [(q, m.body) for q, m in read_queue(store, "T", 0)] == [(0, b"new-0"), (1, b"new-1")]
        assert [m.body for _, m in read_queue(store, "Other", 0)] == [b"other-0", b"other-1", b"other-2"]
        assert store.get_max_offset_in_queue("Other", 0) == 3
        # a later delete of a topic never dispatched removes nothing but still resets its offsets
        assert store.put_message(make_message("Never", 1, "x")).append.queue_offset == 0
        assert store.delete_topic("Never") == 0
        assert store.put_message(make_message("Never", 1, "y")).append.queue_offset == 0
    finally:
        store.shutdown()
    # the deletion holds across a restart: recovery rebuilds nothing of the old queue
    with MessageStore(make_config(tmp_path)) as again:
        wait_dispatched(again)
        assert [(q, m.body) for q, m in read_queue(again, "T", 0)] == [(0, b"new-0"), (1, b"new-1")]


@pytest.mark.unit
def test_deleted_topic_is_not_rebuilt_by_the_redispatch_after_a_crash(tmp_path) -> None:
    with MessageStore(make_config(tmp_path)) as store:
        for i in range(3):
            assert store.put_message(make_message("T", 1, f"old-{i}")).ok
            assert store.put_message(make_message("Other", 0, f"other-{i}")).ok
        wait_dispatched(store)
        assert store.delete_topic("T") == 1
        assert store.put_message(make_message("Other", 0, "other-3")).ok
        wait_dispatched(store)
    abort_file(store.config.store_path_root_dir).touch()  # as a killed broker leaves it: recovery re-dispatches
    with MessageStore(make_config(tmp_path)) as again:
        wait_dispatched(again)
        assert again.recovery_report.abnormal and again.recovery_report.dispatch_from == 0
        assert not (again.config.consume_queue_dir / "T").exists()
        assert again.get_max_offset_in_queue("T", 1) == 0
        assert again.put_message(make_message("T", 1, "new-0")).append.queue_offset == 0
        wait_dispatched(again)
        assert [(q, m.body) for q, m in read_queue(again, "T", 1)] == [(0, b"new-0")]
        assert [m.body for _, m in read_queue(again, "Other", 0)] == [f"other-{i}".encode() for i in range(4)]


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_delete_topic_then_recreate_starts_at_offset_zero(mqlake_server) -> None:
    topic = unique("RecreateT")
    p = producer(mqlake_server)
    try:
        old = [p.send_sync(message(topic, f"old-{i}")) for i in range(8)]
    finally:
        p.shutdown()
    assert all(r.status == 0 for r in old)
    assert max(r.offset for r in old) > 0
    cq_dir = mqlake_server.store_dir / "consumequeue" / topic
    assert cq_dir.is_dir()

    admin_json(mqlake_server, "deleteTopic", "-t", topic, "-c", "DefaultCluster")
    assert not cq_dir.exists(), "deleteTopic leaves the topic's ConsumeQueue files on disk"

    admin_json(mqlake_server, "updateTopic", "-t", topic, "-b", mqlake_server.broker_addr, "-r", "1", "-w", "1")
    wait_routed(mqlake_server, topic)
    p = producer(mqlake_server)  # a new client: the old one's route of the deleted topic lingers for 30 s
    try:
        new = [p.send_sync(message(topic, f"new-{i}")) for i in range(3)]
    finally:
        p.shutdown()
    assert [r.offset for r in new] == [0, 1, 2]
    wait_until(cq_dir.is_dir, 30, what="the recreated topic's ConsumeQueue to be dispatched")  # dispatch is async
    assert sorted(d.name for d in cq_dir.iterdir()) == ["0"]
    got = Collector()
    c = push_consumer(mqlake_server, unique("RecreateCG"), topic, got)
    try:
        got.wait_bodies({f"new-{i}".encode() for i in range(3)})
        assert got.bodies() == {f"new-{i}".encode() for i in range(3)}, "an old message came back"
    finally:
        c.shutdown()


async def _send_then_kill(server, topic: str) -> RemotingCommand:
    """Send to a new topic and SIGKILL the broker the moment the acknowledgement arrives."""
    hdr = h.SendMessageRequestHeader(producer_group="pg", topic=topic, default_topic="TBW102",
                                     default_topic_queue_nums=4, queue_id=0, sys_flag=0, born_timestamp=0,
                                     flag=0)  # fmt: skip
    client = RemotingClient()
    try:
        resp = await client.invoke(server.broker_addr, RemotingCommand.request(RequestCode.SEND_MESSAGE, hdr,
                                                                               b"acked"), 10)  # fmt: skip
        server.kill()  # SIGKILL at once (then reaped): no shutdown, no later persist
        return resp
    finally:
        await client.close()


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_auto_created_topic_survives_a_sigkill_right_after_the_ack(mqlake_server_factory) -> None:
    server = mqlake_server_factory()
    topic = unique("KilledNewT")
    resp = asyncio.run(_send_then_kill(server, topic))
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    saved = json.loads((server.store_dir / "config" / "topics.json").read_text())
    assert topic in saved["topicConfigTable"]

    server.start()
    table = TopicConfigSerializeWrapper.decode(
        remoting_call(server.broker_addr, RequestCode.GET_ALL_TOPIC_CONFIG).body
    ).topic_config_table
    assert topic in table and table[topic].write_queue_nums == 4
    got = Collector()
    c = push_consumer(server, unique("KilledCG"), topic, got)
    try:
        got.wait_bodies({b"acked"})
    finally:
        c.shutdown()
