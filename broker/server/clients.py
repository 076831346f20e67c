"""Who is connected: producer groups and consumer groups by channel (``ProducerManager``/``ConsumerManager``).

Clients announce themselves with HEART_BEAT every 30 s; a channel silent for ``channelExpiredTimeout``
(120 s) or closed is dropped. A change in a consumer group's membership is reported through
``on_group_changed`` so the broker can tell the group's consumers to rebalance at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.remoting.connection import Channel
from broker.remoting.protocol.heartbeat import SubscriptionData


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class ClientChannel:
    conn: Channel
    client_id: str
    language: str = "JAVA"
    version: int = 0
    last_update: int = field(default_factory=now_ms)


@dataclass(slots=True)
class ConsumerGroupInfo:
    group: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    channels: dict[Channel, ClientChannel] = field(default_factory=dict)
    subscriptions: dict[str, SubscriptionData] = field(default_factory=dict)
    last_update: int = field(default_factory=now_ms)

    def client_ids(self) -> list[str]:
        return [ch.client_id for ch in self.channels.values()]


class ConsumerManager:
    def __init__(self, on_group_changed: Callable[[str, list[Channel]], None] | None = None) -> None:
        self.groups: dict[str, ConsumerGroupInfo] = {}
        self.on_group_changed = on_group_changed

    def register(
        self,
        group: str,
        channel: ClientChannel,
        consume_type: str,
        message_model: str,
        consume_from_where: str,
        subscriptions: list[SubscriptionData],
    ) -> bool:
        """Record a heartbeat; returns True when the group's membership changed (a new channel)."""
        info = self.groups.get(group)
        if info is None:
            info = self.groups[group] = ConsumerGroupInfo(group)
        info.consume_type, info.message_model, info.consume_from_where = consume_type, message_model, consume_from_where
        old = info.channels.get(channel.conn)
        changed = old is None or old.client_id != channel.client_id
        info.channels[channel.conn] = channel
        info.last_update = now_ms()
        for sub in subscriptions:
            prev = info.subscriptions.get(sub.topic)
            if prev is None or prev.sub_version < sub.sub_version or prev.sub_string != sub.sub_string:
                info.subscriptions[sub.topic] = sub
        # Topics a group no longer subscribes to are forgotten (updateSubscription's removal pass).
        wanted = {s.topic for s in subscriptions}
        for topic in [t for t in info.subscriptions if t not in wanted]:
            del info.subscriptions[topic]
        if changed:
            self._notify(info)
        return changed

    def unregister(self, group: str, conn: Channel) -> bool:
        info = self.groups.get(group)
        if info is None or info.channels.pop(conn, None) is None:
            return False
        if not info.channels:
            del self.groups[group]
        self._notify(info)
        return True

    def channel_closed(self, conn: Channel) -> None:
        for group in [g for g, info in self.groups.items() if conn in info.channels]:
            self.unregister(group, conn)

    def scan_expired(self, timeout_ms: int, now: int | None = None) -> list[Channel]:
        """Drop channels silent for ``timeout_ms`` at ``now`` (epoch ms, default the clock's); returns their
        connections (to be closed)."""
        cutoff = (now_ms() if now is None else now) - timeout_ms
        dropped = []
        for group, info in list(self.groups.items()):
            for conn, ch in list(info.channels.items()):
                if ch.last_update < cutoff:
                    dropped.append(conn)
                    self.unregister(group, conn)
        return dropped

    def _notify(self, info: ConsumerGroupInfo) -> None:
        if self.on_group_changed is not None and info.channels:
            self.on_group_changed(info.group, list(info.channels))

    def find_subscription(self, group: str, topic: str) -> SubscriptionData | None:
        info = self.groups.get(group)
        return None if info is None else info.subscriptions.get(topic)

    def client_ids(self, group: str) -> list[str]:
        info = self.groups.get(group)
        return [] if info is None else info.client_ids()


class ProducerManager:
    def __init__(self) -> None:
        self.groups: dict[str, dict[Channel, ClientChannel]] = {}

    def register(self, group: str, channel: ClientChannel) -> None:
        self.groups.setdefault(group, {})[channel.conn] = channel

    def unregister(self, group: str, conn: Channel) -> None:
        channels = self.groups.get(group)
        if channels is not None:
            channels.pop(conn, None)
            if not channels:
                del self.groups[group]

    def channel_closed(self, conn: Channel) -> None:
        for group in [g for g, chans in self.groups.items() if conn in chans]:
            self.unregister(group, conn)

    def scan_expired(self, timeout_ms: int, now: int | None = None) -> list[Channel]:
        """As :meth:`ConsumerManager.scan_expired`."""
        cutoff = (now_ms() if now is None else now) - timeout_ms
        dropped = []
        for group, chans in list(self.groups.items()):
            for conn, ch in list(chans.items()):
                if ch.last_update < cutoff:
                    dropped.append(conn)
                    self.unregister(group, conn)
        return dropped
