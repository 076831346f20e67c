"""RocketMQ 5.x gRPC clients through a controller-mode failover (docs/ha.md, "RocketMQ 5 clients through a
failover"): two mqlake brokers of one broker set with ``enableProxy=true``, registered with Apache RocketMQ 5.4.0's
controller group (``tests.peers.ControllerCluster``); the clients list both brokers' gRPC endpoints as their access
point, as a 5.x user lists a proxy cluster.  The master is SIGKILLed while they send; the slave is elected, routes
lead the clients there, and every send a client saw acknowledged is read afterwards."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from broker.proxy.v2 import definition_pb2 as pb
from broker.proxy.v2 import service_pb2 as svc
from broker.proxy.v2.service_pb2_grpc import MessagingServiceStub
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.headers import GetMaxOffsetRequestHeader
from tests import rmq5
from tests.controller_mode import master_and_slave, max_offset, role
from tests.fixtures_broker import MqlakeServer, remoting_call, stop_servers
from tests.helpers import wait_until
from tests.peers import JAVA_SOURCES, ControllerCluster, compile_java, java_json
from tests.test_grpc_clients import ProxyServer
from tests.test_ha import consume_all, unique

pytestmark = pytest.mark.integration

META = (("x-mq-client-id", "failover-test"),)
QUEUES = 4  # the test topic's
SERVICE_NOT_AVAILABLE_AS_V2 = pb.INTERNAL_SERVER_ERROR  # the broker's SERVICE_NOT_AVAILABLE, as RocketMQ 5's proxy


def _brokers(tmp_path: Path, controllers: list[str]) -> tuple[MqlakeServer, MqlakeServer, MqlakeServer, str]:
    """NameServer, master ``a``, slave ``b`` (each with its gRPC endpoint) and a topic created on the master that
    the slave has copied (its route answers for it, naming the master)."""
    namesrv, a, b = master_and_slave(tmp_path, controllers, enableProxy="true")
    topic = ProxyServer(a, tmp_path / "home").create_topic(QUEUES, unique("G5F"))
    wait_until(lambda: route(b, topic) == a.grpc_endpoint, 30, what="the slave to copy the topic and route to a")
    return namesrv, a, b, topic


def queue_end(server: MqlakeServer, topic: str, queue_id: int) -> int:
    r = remoting_call(server.broker_addr, RequestCode.GET_MAX_OFFSET, GetMaxOffsetRequestHeader(topic=topic,
                                                                                               queue_id=queue_id))
    assert r.code == ResponseCode.SUCCESS, r.remark
    return int(r.ext_fields["offset"])


def _stub(server: MqlakeServer) -> tuple[grpc.Channel, MessagingServiceStub]:
    channel = grpc.insecure_channel(server.grpc_endpoint)
    return channel, MessagingServiceStub(channel)


def route(server: MqlakeServer, topic: str) -> str | None:
    """The endpoint ``server``'s QueryRoute names for ``topic``'s queues, or None when it refuses the route; asked
    through an access point that is neither broker's, so a route that only echoed it would name 127.0.0.1:1."""
    channel, stub = _stub(server)
    with channel:
        r = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name=topic), endpoints=pb.Endpoints(
            scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1", port=1)])), metadata=META, timeout=10)  # fmt: skip
    if r.status.code != pb.OK:
        return None
    found = {f"{q.broker.endpoints.addresses[0].host}:{q.broker.endpoints.addresses[0].port}" for q in r.message_queues}
    assert len(found) == 1 and all(q.broker.id == 0 for q in r.message_queues), r
    return found.pop()


def test_a_slaves_endpoint_routes_to_the_master_and_refuses_writes_with_a_clear_code(tmp_path) -> None:
    with ControllerCluster(tmp_path / "controllers", scanNotActiveBrokerInterval=1000) as controllers:
        namesrv, a, b, topic = _brokers(tmp_path, controllers.addrs)
        try:
            assert route(a, topic) == a.grpc_endpoint  # the master names itself
            assert route(b, topic) == a.grpc_endpoint  # the slave names its master, not the access point asked
            group = ProxyServer(a, tmp_path / "home").create_group()
            wait_until(lambda: max_offset(b) == max_offset(a), 30, what="the slave to hold the master's end")
            before = max_offset(b)
            channel, stub = _stub(b)
            with channel:
                props = pb.SystemProperties(message_id="01" + "0" * 30, message_type=pb.NORMAL,
                                            body_encoding=pb.IDENTITY)  # fmt: skip
                msg = pb.Message(topic=pb.Resource(name=topic), body=b"to-the-slave", system_properties=props)
                sent = stub.SendMessage(svc.SendMessageRequest(messages=[msg]), metadata=META, timeout=10)
                got = list(stub.ReceiveMessage(svc.ReceiveMessageRequest(
                    group=pb.Resource(name=group), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
                    filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"), batch_size=1,
                    auto_renew=False), metadata=META, timeout=10))  # fmt: skip
            for answer in (sent.status, sent.entries[0].status, got[0].status):
                assert answer.code == SERVICE_NOT_AVAILABLE_AS_V2, answer
                assert f"is a slave (its master: {a.broker_addr})" in answer.message, answer
            assert len(got) == 1
            # neither the send nor a pop checkpoint reached the slave's CommitLog (nor the master's)
            assert max_offset(b) == before == max_offset(a)
        finally:
            stop_servers([a, b, namesrv])


@pytest.fixture(scope="module")
def produce_until5(tmp_path_factory) -> Path:
    return compile_java([JAVA_SOURCES / "failover5" / "ProduceUntil5.java"], "client-java-5",
                        tmp_path_factory.getbasetemp() / "java-classes")  # fmt: skip


@contextlib.contextmanager
def _through_a_failover(tmp_path: Path, produce: Callable[[str, str, Path], dict],
                        what: str) -> Iterator[tuple[MqlakeServer, MqlakeServer, MqlakeServer, str, dict]]:  # fmt: skip
    """Run ``produce(access_point, topic, stop_file) -> result`` in a thread while the master is SIGKILLed: its
    sends reach the master, the slave is elected, routes name it and the producer's sends reach it.  Yields the
    NameServer, the old master (killed), the new one, the topic and the producer's result, with the controllers
    still running."""
    with ControllerCluster(tmp_path / "controllers", scanNotActiveBrokerInterval=1000) as controllers:
        namesrv, a, b, topic = _brokers(tmp_path, controllers.addrs)
        stop = tmp_path / "stop-producing"
        result: dict = {}
        try:
            # the slave first: the client must be routed to the master, not land on the first address listed
            access = f"{b.grpc_endpoint};{a.grpc_endpoint}"
            t = threading.Thread(target=lambda: result.update(produce(access, topic, stop)), daemon=True)
            t.start()
            start = max_offset(a)
            wait_until(lambda: max_offset(a) > start + 10_000, 120, what=f"the {what}'s sends to the first master")
            killed_at = time.monotonic()
            a.kill()
            wait_until(lambda: role(b) == "SYNC_MASTER", 60, what="the slave to be elected master")
            wait_until(lambda: route(b, topic) == b.grpc_endpoint, 30, what="the new master to name itself")
            start = max_offset(b)
            # its sends reach the new master: through its retries and its next route refresh (every 30 s)
            wait_until(lambda: max_offset(b) > start, 120, what=f"the {what}'s first send to the new master")
            print(f"{what}: {time.monotonic() - killed_at:.1f} s from the SIGKILL to its first send the new master "
                  f"stored")  # fmt: skip
            wait_until(lambda: max_offset(b) > start + 10_000, 120, what=f"the {what}'s sends to the new master")
            stop.touch()
            t.join(120)
            assert not t.is_alive() and result, f"the {what} did not finish"
            yield namesrv, a, b, topic, result
        finally:
            stop.touch()
            stop_servers([a, b, namesrv])


def test_the_java_5x_client_keeps_producing_through_a_failover_and_loses_nothing_acknowledged(
        tmp_path, produce_until5) -> None:  # fmt: skip
    def produce(access: str, topic: str, stop: Path) -> dict:
        return java_json("ProduceUntil5", "client-java-5", f"endpoint={access}", f"topic={topic}", f"stop={stop}",
                         classes=produce_until5, home=tmp_path / "java", timeout=900)  # fmt: skip

    with _through_a_failover(tmp_path, produce, "Java 5.x producer") as (namesrv, _, _, topic, result):
        acked = {body.encode() for body in result["acked"]}
        print(f"Java 5.x producer: {len(acked)} sends acknowledged, {result['failed']} failed "
              f"({result['failures'][:2]})")  # fmt: skip
        # a new consumer group (the C++ client, through the NameServer's route to the new master) reads them all
        assert acked <= consume_all(namesrv.namesrv_addr, topic, unique("Fresh"), acked)


def test_the_python_5x_client_keeps_producing_through_a_failover_and_a_simple_consumer_reads_it_all(
        tmp_path) -> None:  # fmt: skip
    home = tmp_path / "rmq5"

    def produce(access: str, topic: str, stop: Path) -> dict:
        return rmq5.client("produce_until", access, home / "producer", "--topic", topic, "--stop", str(stop),
                           "--prefix", "p5", timeout=900)  # fmt: skip

    with _through_a_failover(tmp_path, produce, "Python 5.x producer") as (_, a, b, topic, result):
        acked = set(result["acked"])
        print(f"Python 5.x producer: {len(acked)} sends acknowledged, {result['failed']} failed "
              f"({result['failures'][:2]})")  # fmt: skip
        # the old master returns as a slave; its endpoint too routes to the new master
        a.start()
        wait_until(lambda: role(a) == "SLAVE", 60, what="the old master to return as a slave")
        wait_until(lambda: route(a, topic) == b.grpc_endpoint, 30, what="the old master to route to the new one")
        # a 5.x SimpleConsumer given both endpoints receives from the new master every message it holds (each
        # acknowledged send, and any whose answer was lost with the old master), every acknowledged one among them
        group = ProxyServer(b, home).create_group()
        held = sum(queue_end(b, topic, q) for q in range(QUEUES))
        got = rmq5.client("receive", f"{a.grpc_endpoint};{b.grpc_endpoint}", home / "consumer", "--topic", topic,
                          "--group", group, "--expect", str(held), "--ack", "--deadline", "240",
                          timeout=300)  # fmt: skip
        assert len(got["received"]) == held
        received = {m["body"] for m in got["received"]}
        assert acked <= received, f"{len(acked - received)} acknowledged sends not received"
