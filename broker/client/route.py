"""Topic routes from the NameServer (``TopicRouteData``) and the queues a producer or consumer derives from them.

Bodies come in two JSON dialects (quoted ``"0"`` or bare ``0`` keys in ``brokerAddrs``; old NameServers spell
``topicSynFlag``); both are read with the lenient fastjson reader in store/config_files.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.client.message import MessageQueue
from broker.remoting.route_data import BrokerData, QueueData
from store.config_files import load_lenient_json

PERM_PRIORITY = 8
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1
AUTO_CREATE_TOPIC = "TBW102"  # TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC
DEFAULT_TOPIC_QUEUE_NUMS = 4


class RouteError(ValueError):
    """A route body that is not a TopicRouteData."""


@dataclass(frozen=True, slots=True)
class TopicRouteData:
    queue_datas: tuple[QueueData, ...]
    broker_datas: tuple[BrokerData, ...]
    order_topic_conf: str | None = None
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    def master_addr(self, broker_name: str) -> str | None:
        for b in self.broker_datas:
            if b.broker_name == broker_name:
                return b.master_addr
        return None

    def publish_queues(self, topic: str, max_write_queues: int | None = None) -> list[MessageQueue]:
        """Writable queues on brokers with a master, in RocketMQ's order (``topicRouteData2TopicPublishInfo``).

        ``max_write_queues`` caps each broker's count: a topic auto-created from TBW102 gets
        ``min(defaultTopicQueueNums, TBW102's writeQueueNums)`` queues.
        """
        out = []
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
    text = body.decode("utf-8") if isinstance(body, bytes | bytearray) else body
    data = load_lenient_json(text, source)
    if not isinstance(data, dict):
        raise RouteError(f"{source}: expected a JSON object, got {type(data).__name__}")
    try:
        queues = tuple(QueueData.from_json(q) for q in data.get("queueDatas") or ())
        brokers = tuple(BrokerData.from_json(b) for b in data.get("brokerDatas") or ())
    except (KeyError, TypeError, ValueError) as e:
        raise RouteError(f"{source}: malformed TopicRouteData: {e!r}") from None
    return TopicRouteData(queues, brokers, data.get("orderTopicConf"), data)
