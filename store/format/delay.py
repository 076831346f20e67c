"""Delay levels (``ScheduleMessageService``): the level table and the tagsCode of a SCHEDULE_TOPIC_XXXX unit,
which holds the time the message is due rather than a tag hash."""

from __future__ import annotations

from store.constants import SCHEDULE_TOPIC as SCHEDULE_TOPIC  # re-exported: the topics this codec's units live in
from store.constants import TIMER_TOPIC as TIMER_TOPIC
from store.errors import MQLakeError

# What a properties string holding a delay level or a timer contains (the DELAY property, the TIMER_* ones)
PARK_MARKERS = (b"DELAY\x01", b"TIMER_")
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"


class DelayLevelError(MQLakeError, ValueError):
    """A ``messageDelayLevel`` string RocketMQ could not parse either."""


def parse_delay_levels(levels: str = DEFAULT_DELAY_LEVELS) -> list[int]:
    """``ScheduleMessageService.parseDelayLevel``: level n (1-based) -> milliseconds at index n-1."""
    units = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    out = []
    for tok in levels.split():
        if len(tok) < 2 or tok[-1] not in units or not tok[:-1].isascii() or not tok[:-1].isdigit():
            raise DelayLevelError(
                f"bad delay level {tok!r} in messageDelayLevel {levels!r}: expected digits then s, m, h or d"
            )
        out.append(int(tok[:-1]) * units[tok[-1]])
    if not out:
        raise DelayLevelError("messageDelayLevel names no level")
    return out


DEFAULT_DELAY_MILLIS = parse_delay_levels()


def delay_deliver_timestamp(level: int, store_timestamp: int, delay_millis: list[int] = DEFAULT_DELAY_MILLIS) -> int:
    """``computeDeliverTimestamp``: the tagsCode of a SCHEDULE_TOPIC_XXXX unit."""
    level = min(level, len(delay_millis))
    if level >= 1:
        return store_timestamp + delay_millis[level - 1]
    return store_timestamp + 1000


def schedule_tags_code(
    delay: str | bytes | None, store_timestamp: int, tag_hash: int, delay_millis: list[int] = DEFAULT_DELAY_MILLIS
) -> int:
    """tagsCode of a SCHEDULE_TOPIC_XXXX unit: the deliver time when DELAY is a positive level, else ``tag_hash``.

    Java rejects the whole record on a non-numeric DELAY; we keep the tag hash rather than let recovery
    truncate the log at a message whose only fault is a bad property.
    """
    raw = delay.encode("utf-8") if isinstance(delay, str) else delay
    if raw is not None and raw.isdigit() and int(raw) > 0:  # bytes.isdigit: ASCII digits only
        return delay_deliver_timestamp(int(raw), store_timestamp, delay_millis)
    return tag_hash


def may_park(props: bytes) -> bool:
    """A cheap first look on every put: could this properties string hold a delay level or a timer?"""
    # find, not ``in``: bytes.__contains__ first tries the marker as an int and raises and clears a TypeError
    return props.find(PARK_MARKERS[0]) >= 0 or props.find(PARK_MARKERS[1]) >= 0
