"""Headers of the operator calls that the everyday client never sends: stats, group offsets, write
permission, named after RocketMQ's Java classes (wire keys are their field names)."""

from __future__ import annotations

from broker.remoting.headers import Header


class ViewBrokerStatsDataRequestHeader(Header):
    """VIEW_BROKER_STATS_DATA (315): one stats item, e.g. ``TOPIC_PUT_NUMS`` of a topic."""

    stats_name: str
    stats_key: str


class CloneGroupOffsetRequestHeader(Header):
    """CLONE_GROUP_OFFSET (314)."""

    src_group: str
    dest_group: str
    topic: str | None = None
    offline: bool = False


class AddWritePermOfBrokerRequestHeader(Header):
    """ADD_WRITE_PERM_OF_BROKER (327, NameServer)."""

    broker_name: str


class AddWritePermOfBrokerResponseHeader(Header):
    add_topic_count: int
