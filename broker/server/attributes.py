"""RocketMQ 5's topic attributes and message types: ``updateTopic -a +message.type=FIFO`` and
``enableTopicMessageTypeCheck``.

A topic's attributes are a string map kept in its ``TopicConfig`` (``"attributes": {"message.type": "FIFO"}`` in
topics.json, as RocketMQ 5 writes it).  UPDATE_AND_CREATE_TOPIC carries the change as ``+key=value,-key``
(``AttributeParser``); ``alter`` applies it to the topic's current attributes as ``AttributeUtil
.alterCurrentAttributes`` does: only additions when the topic is created, unknown keys and values outside their set
refused, an unchangeable attribute never changed, a deletion only of a key that is there.

The attributes of RocketMQ 5.4 are all known; those mqlake cannot honour (a batch ConsumeQueue, compaction, a
per-topic retention, priority messages, mixed types) are accepted at their default value only and refused
otherwise with a message naming them, so a topic never claims what the broker does not do.

Message types (``TopicMessageType.parseFromMessageProperty``): a half message is TRANSACTION, one with a delay level
or a timer property DELAY, one with a message group (``__SHARDINGKEY``) FIFO, any other NORMAL.  With
``enableTopicMessageTypeCheck`` a send whose type is not its topic's is refused (``check``), as RocketMQ 5's proxy
refuses it, retry and DLQ topics excepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker.remoting.protocol.topic import TopicConfig
from store.constants import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX
from store.format import properties as P

MESSAGE_TYPE = "message.type"
NORMAL, FIFO, DELAY, TRANSACTION, UNSPECIFIED, MIXED = "NORMAL", "FIFO", "DELAY", "TRANSACTION", "UNSPECIFIED", "MIXED"
_TIMER_PROPERTIES = (P.PROPERTY_DELAY_TIME_LEVEL, P.PROPERTY_TIMER_DELIVER_MS, P.PROPERTY_TIMER_DELAY_SEC,
                     P.PROPERTY_TIMER_DELAY_MS)  # fmt: skip


@dataclass(frozen=True)
class Attribute:
    """One of ``TopicAttributes.ALL``: its values (None: a long within ``bounds``), whether an update may change
    it, its default, and the values mqlake honours (None: every valid one)."""

    name: str
    changeable: bool
    default: str
    values: frozenset[str] | None = None
    bounds: tuple[int, int] = (0, 0)
    honoured: frozenset[str] | None = None

    def verify(self, value: str) -> None:
        if self.values is not None:
            if value not in self.values:
                raise AttributeError_(f"value is not in set: {sorted(self.values)}")
        else:
            try:
                number = int(value)
            except ValueError:
                raise AttributeError_(f"{self.name}: {value!r} is not a number") from None
            low, high = self.bounds
            if not low <= number <= high:
                raise AttributeError_(f"value is not in range({low}, {high})")
        if self.honoured is not None and value not in self.honoured:
            raise AttributeError_(f"{self.name}={value} is not supported by this broker "
                                  f"(it honours {', '.join(sorted(self.honoured))})")  # fmt: skip


class AttributeError_(ValueError):  # noqa: N801 - AttributeError is Python's own
    """An attribute change RocketMQ refuses; the message is its ``RuntimeException``'s."""


_TYPES = frozenset({UNSPECIFIED, NORMAL, FIFO, DELAY, TRANSACTION, "PRIORITY", MIXED})  # TopicMessageType
TOPIC_ATTRIBUTES: dict[str, Attribute] = {a.name: a for a in (
    Attribute("queue.type", False, "SimpleCQ", frozenset({"BatchCQ", "SimpleCQ"}), honoured=frozenset({"SimpleCQ"})),
    Attribute("cleanup.policy", False, "DELETE", frozenset({"DELETE", "COMPACTION"}), honoured=frozenset({"DELETE"})),
    # MIXED is refused before (enableMixedMessageType is off, as RocketMQ 5's default)
    Attribute(MESSAGE_TYPE, True, NORMAL, _TYPES, honoured=_TYPES - {"PRIORITY"}),
    Attribute("reserve.time", True, "-1", bounds=(-1, 2**63 - 1), honoured=frozenset({"-1"})),
)}  # fmt: skip


def parse(text: str | None) -> dict[str, str]:
    """``AttributeParser.parseToMap``: ``+a=b,+c=d,-e`` -> {"+a": "b", "+c": "d", "-e": ""}."""
    out: dict[str, str] = {}
    if not text:
        return out
    for kv in text.split(","):
        if kv.startswith("+"):
            key, sep, value = kv.partition("=")
            if not sep or len(key) <= 1 or not value or "=" in value:
                raise AttributeError_(f"add/alter attribute format is wrong: {kv}")
        elif kv.startswith("-"):
            key, value = kv, ""
            if len(key) <= 1 or "=" in key:
                raise AttributeError_(f"delete attribute format is wrong: {kv}")
        else:
            raise AttributeError_(f"add/alter attribute format is wrong: {kv}")
        if key in out:
            raise AttributeError_(f"key duplication: {key}")
        out[key] = value
    return out


def alter(create: bool, current: Mapping[str, str], change: Mapping[str, str],
          known: Mapping[str, Attribute] = TOPIC_ATTRIBUTES) -> dict[str, str]:  # fmt: skip
    """``AttributeUtil.alterCurrentAttributes``: the attributes after ``change`` (``parse``'s form)."""
    final = dict(current)
    seen: set[str] = set()
    for signed, value in change.items():
        sign, key = signed[0], signed[1:]
        if key in seen:
            raise AttributeError_(f"alter duplication key. key: {key}")
        seen.add(key)
        attribute = known.get(key)
        if attribute is None:
            raise AttributeError_(f"unsupported key: {key}")
        if sign == "+":
            if not create and key in current and not attribute.changeable:
                raise AttributeError_(f"attempt to update an unchangeable attribute. key: {key}")
            attribute.verify(value)
            final[key] = value
        elif create:
            raise AttributeError_(f"only add attribute is supported while creating topic. key: {key}")
        elif key not in current:
            raise AttributeError_(f"attempt to delete a nonexistent key: {key}")
        else:
            if not attribute.changeable:
                raise AttributeError_(f"attempt to update an unchangeable attribute. key: {key}")
            del final[key]
    return final


def topic_type(attributes: Mapping[str, str] | None) -> str:
    """``TopicConfig.getTopicMessageType``: the topic's ``message.type``, NORMAL when it has none."""
    return (attributes or {}).get(MESSAGE_TYPE, NORMAL)


def message_type(props: Mapping[str, str]) -> str:
    """``TopicMessageType.parseFromMessageProperty``."""
    if props.get(P.PROPERTY_TRANSACTION_PREPARED, "").lower() == "true":
        return TRANSACTION
    if any(name in props for name in _TIMER_PROPERTIES):
        return DELAY
    if P.PROPERTY_SHARDING_KEY in props:
        return FIFO
    return NORMAL


def check(expected: str, props: Mapping[str, str]) -> str | None:
    """Why a message of ``props`` may not go to a topic of type ``expected`` (the proxy's
    ``DefaultTopicMessageTypeValidator``), None when it may; ``expected`` is UNSPECIFIED for a missing topic."""
    return type_refusal(expected, message_type(props))


def type_refusal(expected: str, actual: str) -> str | None:
    """Why a message of type ``actual`` may not go to a topic of type ``expected``, None when it may."""
    if actual == UNSPECIFIED or (actual != expected and expected != MIXED):
        return f"TopicMessageType validate failed, the expected type is {expected}, but actual type is {actual}"
    return None


def send_refusal(topic: str, tc: TopicConfig | None, props: Mapping[str, str]) -> str | None:
    """Why ``enableTopicMessageTypeCheck`` refuses a send to ``topic`` (``tc``, None when it does not exist) of a
    message of ``props``; None when it passes.  Retry and DLQ topics, and a message a proxy forwards
    (``TRANSFER_FLAG``), are not checked, as RocketMQ 5's proxy does not check them."""
    if topic.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)) or P.PROPERTY_TRANSFER_FLAG in props:
        return None
    return check(topic_type(tc.attributes) if tc is not None else UNSPECIFIED, props)
