"""Producer retry and routing against a scripted peer: a real RemotingServer on loopback that plays NameServer and
broker and answers as the test says (busy on one queue, unknown topics, a non-retryable refusal), so the paths a
healthy broker never takes are exercised through the real client and the real wire."""

from __future__ import annotations

import json

import pytest

from broker.client import Message, MQBrokerError, MQClientError, Producer, SendStatus
from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.loop import run
from broker.remoting.server import RemotingServer
from store.format.hashing import java_string_hash

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]  # a scripted broker on a loopback port


class ScriptedPeer:
    """NameServer + broker in one RemotingServer: topic -> write queue count; queue 0 of BusyTopic is SYSTEM_BUSY."""

    def __init__(self) -> None:
        self.server = RemotingServer("127.0.0.1", 0, name="scripted")
        self.topics = {"BusyTopic": 2, "IllegalTopic": 2, "TBW102": 8, "ReadOnlyTopic": 2}
        self.perms = {"ReadOnlyTopic": 4}
        self.route_calls: list[str] = []
        self.sends: list[tuple[str, int, str]] = []  # (topic, queue id, defaultTopic)
        self.server.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, self.route)
        self.server.register(RequestCode.SEND_MESSAGE_V2, self.send)

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    async def route(self, cmd, conn):
        topic = cmd.read_header(h.GetRouteInfoRequestHeader).topic
        self.route_calls.append(topic)
        if topic == "GarbageTopic":
            return cmd.response(ResponseCode.SUCCESS, body=b'{"queueDatas":[{"perm":6}],"brokerDatas":[]}')
        n = self.topics.get(topic)
        if n is None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"no route for {topic}")
        body = {
            "queueDatas": [{"brokerName": "scripted", "readQueueNums": n, "writeQueueNums": n,
                            "perm": self.perms.get(topic, 6)}],
            "brokerDatas": [{"cluster": "C", "brokerName": "scripted", "brokerAddrs": {"0": self.addr}}],
        }
        return cmd.response(ResponseCode.SUCCESS, body=json.dumps(body).encode())

    async def send(self, cmd, conn):
        hd = cmd.read_header(h.SendMessageRequestHeaderV2)
        self.sends.append((hd.b, hd.e, hd.c))
        if hd.b == "BusyTopic" and hd.e == 0:
            return cmd.response(ResponseCode.SYSTEM_BUSY, "[PC_SYNCHRONIZED]broker busy")
        if hd.b == "IllegalTopic":
            return cmd.response(ResponseCode.MESSAGE_ILLEGAL, "the message is illegal")
        header = h.SendMessageResponseHeader(msg_id="7F00000100002A9F0000000000000000", queue_id=hd.e, queue_offset=7)
        ext = {"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
        return cmd.response(ResponseCode.SUCCESS, header=header, ext=ext)


def with_peer(test):
    async def go():
        peer = ScriptedPeer()
        await peer.server.start()
        try:
            async with Producer("pg_scripted", peer.addr, send_timeout=2.0) as p:
                await test(peer, p)
        finally:
            await peer.server.stop()

    run(go())


def test_a_retryable_code_is_retried_on_another_queue_after_a_route_refresh():
    async def test(peer, p):
        results = [await p.send(Message("BusyTopic", f"m{i}")) for i in range(6)]
        assert all(r.status is SendStatus.SEND_OK and r.queue.queue_id == 1 for r in results)
        busy = [s for s in peer.sends if s[1] == 0]
        assert busy, "round robin never tried queue 0"
        for i, s in enumerate(peer.sends):  # every refused attempt is followed by one on the other queue
            if s[1] == 0:
                assert peer.sends[i + 1][:2] == ("BusyTopic", 1)
        assert peer.route_calls.count("BusyTopic") == 1 + len(busy)  # first use + one refresh per failure

    with_peer(test)


def test_a_non_retryable_code_fails_at_once_naming_the_code():
    async def test(peer, p):
        with pytest.raises(MQBrokerError, match=r"code 13 \(MESSAGE_ILLEGAL\).*the message is illegal") as e:
            await p.send(Message("IllegalTopic", b"x"))
        assert e.value.code == ResponseCode.MESSAGE_ILLEGAL and len(peer.sends) == 1

    with_peer(test)


def test_an_unknown_topic_is_sent_through_the_tbw102_route():
    async def test(peer, p):
        r = await p.send(Message("BrandNewTopic", b"x"))
        assert r.status is SendStatus.SEND_OK
        topic, queue_id, default_topic = peer.sends[-1]
        # TBW102 has 8 queues; the new topic gets min(defaultTopicQueueNums=4, 8)
        assert (topic, default_topic) == ("BrandNewTopic", "TBW102") and queue_id < 4
        assert peer.route_calls[:2] == ["BrandNewTopic", "TBW102"]

    with_peer(test)


def test_an_unreachable_broker_fails_after_the_retries_with_a_clear_error():
    async def test(peer, p):
        await p.send(Message("BusyTopic", b"warm"))  # learn the routes first
        await peer.server.stop()
        with pytest.raises(MQClientError, match=r"BusyTopic failed after 3 attempt\(s\): connect to 127\.0\.0\.1"):
            await p.send(Message("BusyTopic", b"x"))

    with_peer(test)


def test_a_read_only_topic_is_refused_before_the_wire():
    async def test(peer, p):
        with pytest.raises(MQClientError, match="'ReadOnlyTopic' has no writable queue"):
            await p.send(Message("ReadOnlyTopic", b"x"))
        assert peer.sends == []

    with_peer(test)


def test_a_malformed_route_is_a_clear_error():
    async def test(peer, p):
        with pytest.raises(ValueError, match="route of GarbageTopic: malformed TopicRouteData"):
            await p.send(Message("GarbageTopic", b"x"))
        assert peer.sends == []

    with_peer(test)


def test_a_selector_key_pins_the_queue_and_is_not_moved_on_failure():
    async def test(peer, p):
        keys = {q: next(k for k in (f"order-{i}" for i in range(100)) if abs(java_string_hash(k)) % 2 == q)
                for q in (0, 1)}  # fmt: skip
        results = [await p.send(Message("BusyTopic", f"m{i}"), selector_key=keys[1]) for i in range(4)]
        assert {r.queue.queue_id for r in results} == {1}
        before = len(peer.sends)
        with pytest.raises(MQBrokerError, match=r"code 2 \(SYSTEM_BUSY\)"):
            await p.send(Message("BusyTopic", b"x"), selector_key=keys[0])  # ordered: no other queue tried
        assert peer.sends[before:] == [("BusyTopic", 0, "TBW102")]

    with_peer(test)
