"""Topic routes from the NameServer (``TopicRouteData``) and the queues a producer or consumer derives from them.

Bodies come in two JSON dialects (quoted ``"0"`` or bare ``0`` keys in ``brokerAddrs``; old NameServers spell
``topicSynFlag``); both are read by the one route model (broker/remoting/protocol/route.py).
"""

from __future__ import annotations

from broker.client.message import MessageQueue
from broker.remoting.protocol import route
from broker.remoting.protocol.topic import PERM_READ, PERM_WRITE
from broker.remoting.protocol.wire import BodyError

DEFAULT_TOPIC_QUEUE_NUMS = 4


class RouteError(BodyError):
    """A route body that is not a TopicRouteData."""


class TopicRouteData(route.TopicRouteData):
    """A route as a client uses it: the queues to publish to and to subscribe from."""

    def publish_queues(self, topic: str, max_write_queues: int | None = None) -> list[MessageQueue]:
        """Writable queues on brokers with a master, in RocketMQ's order (``topicRouteData2TopicPublishInfo``).

        ``max_write_queues`` caps each broker's count: a topic auto-created from TBW102 gets
        ``min(defaultTopicQueueNums, TBW102's writeQueueNums)`` queues.
        """
        out: list[MessageQueue] = []
        for qd in sorted(self.queue_datas, key=lambda q: q.broker_name):
            if not qd.perm & PERM_WRITE or self.master_addr(qd.broker_name) is None:
                continue
            n = qd.write_queue_nums if max_write_queues is None else min(qd.write_queue_nums, max_write_queues)
            out.extend(MessageQueue(topic, qd.broker_name, i) for i in range(n))
        return out

    def subscribe_queues(self, topic: str) -> list[MessageQueue]:
        """Readable queues (``topicRouteData2TopicSubscribeInfo``), sorted."""
        return sorted(
            MessageQueue(topic, qd.broker_name, i)
            for qd in self.queue_datas
            if qd.perm & PERM_READ
            for i in range(qd.read_queue_nums)
        )

    def broker_addrs(self) -> list[str]:
        return [b.master_addr for b in self.broker_datas if b.master_addr]


def parse_route(body: bytes | str, source: str = "route") -> TopicRouteData:
    """Parse a GET_ROUTEINFO_BY_TOPIC body in either JSON dialect."""
    data = TopicRouteData.load_json(body, source)
    try:
        return TopicRouteData.from_json(data, f"{source}: malformed TopicRouteData")
    except BodyError as e:
        raise RouteError(str(e)) from None
