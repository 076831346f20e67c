"""``BrokerStatsManager``: the broker's traffic figures, computed as RocketMQ computes them.

Three families, each with Java's names so that mqadmin, dashboards and operators read the same numbers:

- **Stats items** (``BrokerStatsManager``/``StatsItem``): per topic ``TOPIC_PUT_NUMS``/``TOPIC_PUT_SIZE``, per
  ``topic@group`` ``GROUP_GET_NUMS``/``GROUP_GET_SIZE``, per cluster ``BROKER_PUT_NUMS``/``BROKER_GET_NUMS``,
  per group ``SNDBCK_PUT_NUMS``. Each is sampled every 10 s (the last 7 samples: the minute window), every 10 min
  (7: the hour window) and every hour (25: the day window); a window's sum/tps/avgpt is last minus first over
  their time span (``StatsItem.computeStatsData``). VIEW_BROKER_STATS_DATA (315) and ``consumeTps`` read them.
- **Store TPS** (``StoreStatsService``): puts, found and missed gets and transferred messages sampled every
  second (601 samples); ``putTps``/``getTransferedTps``/... are the rates over the last 10, 60 and 600 s,
  space-separated, in GET_BROKER_RUNTIME_INFO.
- **Day counters** (``BrokerStats``): at each local midnight ``msgPutTotalTodayMorning`` becomes
  ``...YesterdayMorning`` and the running total becomes ``...TodayMorning``. ``msgPutTotalTodayNow`` is the
  running total, as in Java: today's count is ``TodayNow - TodayMorning`` and yesterday's
  ``TodayMorning - YesterdayMorning`` (what mqadmin's ``clusterList -m`` prints).

Counting runs on every send and pull, so it is a dict lookup and three integer additions on the event loop (no
lock: only the loop counts and samples); everything else runs in the samplers (``tick``, once a second).
"""

from __future__ import annotations

import datetime as dt
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from store.constants import DEFAULT_CLUSTER

TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
GROUP_GET_NUMS = "GROUP_GET_NUMS"
GROUP_GET_SIZE = "GROUP_GET_SIZE"
SNDBCK_PUT_NUMS = "SNDBCK_PUT_NUMS"
BROKER_PUT_NUMS = "BROKER_PUT_NUMS"
BROKER_GET_NUMS = "BROKER_GET_NUMS"

MINUTE_SAMPLE_MS, MINUTE_SAMPLES = 10_000, 7
HOUR_SAMPLE_MS, HOUR_SAMPLES = 600_000, 7
DAY_SAMPLE_MS, DAY_SAMPLES = 3_600_000, 25
STORE_SAMPLE_MS, STORE_SAMPLES = 1_000, 601
STORE_TPS_WINDOWS = (10, 60, 600)  # seconds


@dataclass(frozen=True, slots=True)
class StatsSnapshot:
    """One window of one stats item (``StatsSnapshot``): the count in it, its rate and the count per call."""

    sum: int = 0
    tps: float = 0.0
    avgpt: float = 0.0
    times: int = 0


# A sample: (timestamp ms, calls, messages, bytes).
_Sample = tuple[int, int, int, int]


def _window(samples: deque[_Sample], field: int) -> StatsSnapshot:
    if not samples:
        return StatsSnapshot()
    first, last = samples[0], samples[-1]
    total = last[field] - first[field]
    span = last[0] - first[0]
    times = last[1] - first[1]
    return StatsSnapshot(sum=total, tps=total * 1000.0 / span if span > 0 else 0.0,
                         avgpt=total / times if times > 0 else 0.0, times=times)  # fmt: skip


class Counter:
    """A key's calls, messages and bytes with its samples (one Java ``StatsItem`` for the NUMS name and one for
    the SIZE name: they share the calls, so one object counts both)."""

    __slots__ = ("times", "nums", "size", "minute", "hour", "day")

    def __init__(self) -> None:
        self.times = 0
        self.nums = 0
        self.size = 0
        self.minute: deque[_Sample] = deque(maxlen=MINUTE_SAMPLES)
        self.hour: deque[_Sample] = deque(maxlen=HOUR_SAMPLES)
        self.day: deque[_Sample] = deque(maxlen=DAY_SAMPLES)

    def add(self, nums: int, size: int = 0) -> None:
        self.times += 1
        self.nums += nums
        self.size += size

    @staticmethod
    def _sample(samples: deque[_Sample], now: int, period: int, values: _Sample) -> None:
        if not samples:  # as Java: a zero sample one period back, so the first window has a span
            samples.append((now - period, 0, 0, 0))
        samples.append(values)

    def sample(self, now: int, minute: bool, hour: bool, day: bool) -> None:
        values = (now, self.times, self.nums, self.size)
        if minute:
            self._sample(self.minute, now, MINUTE_SAMPLE_MS, values)
        if hour:
            self._sample(self.hour, now, HOUR_SAMPLE_MS, values)
        if day:
            self._sample(self.day, now, DAY_SAMPLE_MS, values)

    def in_minute(self, size: bool = False) -> StatsSnapshot:
        return _window(self.minute, 3 if size else 2)

    def in_hour(self, size: bool = False) -> StatsSnapshot:
        return _window(self.hour, 3 if size else 2)

    def in_day(self, size: bool = False) -> StatsSnapshot:
        return _window(self.day, 3 if size else 2)


@dataclass(frozen=True, slots=True)
class ItemStats:
    """What VIEW_BROKER_STATS_DATA answers for one stats item: its minute, hour and day windows."""

    minute: StatsSnapshot
    hour: StatsSnapshot
    day: StatsSnapshot


class BrokerStatsManager:
    def __init__(self, cluster_name: str = DEFAULT_CLUSTER, clock: Callable[[], float] = time.time) -> None:
        self.cluster_name = cluster_name
        self._clock = clock
        now = self.now_ms()
        self.boot_timestamp = now
        self.topic_put: dict[str, Counter] = {}
        self.group_get: dict[str, Counter] = {}  # "topic@group"
        self.sndbck_put: dict[str, Counter] = {}  # "topic@group" as Java keys SNDBCK_PUT_NUMS
        self.broker_put = Counter()  # filled from the running totals when sampled
        self.broker_get = Counter()
        # StoreStatsService's running totals
        self.put_total = 0
        self.get_found_times = 0
        self.get_miss_times = 0
        self.get_total = 0  # transferred messages
        self._store_samples: deque[tuple[int, int, int, int, int]] = deque(maxlen=STORE_SAMPLES)
        self._store_samples.append((now, 0, 0, 0, 0))  # at boot, as Java's sampler starts with the store
        # BrokerStats' day counters
        self.msg_put_total_yesterday_morning = 0
        self.msg_put_total_today_morning = 0
        self.msg_get_total_yesterday_morning = 0
        self.msg_get_total_today_morning = 0
        self._next_minute = self._next_hour = self._next_day = now  # as Java: every sampler runs at once
        self._next_store = now + STORE_SAMPLE_MS
        self._next_midnight = next_midnight_ms(now)

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    # --- counting (hot paths) -----------------------------------------------------------------------------------
    def put(self, topic: str, nums: int, size: int) -> None:
        """A stored send of ``nums`` messages, ``size`` bytes as written."""
        self.put_total += nums
        c = self.topic_put.get(topic)
        if c is None:
            c = self.topic_put[topic] = Counter()
        c.times += 1
        c.nums += nums
        c.size += size

    def got(self, topic: str, group: str, nums: int, size: int) -> None:
        """A pull that found ``nums`` messages of ``size`` bytes."""
        self.get_found_times += 1
        self.get_total += nums
        key = f"{topic}@{group}"
        c = self.group_get.get(key)
        if c is None:
            c = self.group_get[key] = Counter()
        c.times += 1
        c.nums += nums
        c.size += size

    def missed(self) -> None:
        """A pull that found nothing."""
        self.get_miss_times += 1

    def sent_back(self, topic: str, group: str) -> None:
        """A message a consumer sent back (CONSUMER_SEND_MSG_BACK)."""
        key = f"{topic}@{group}"
        c = self.sndbck_put.get(key)
        if c is None:
            c = self.sndbck_put[key] = Counter()
        c.add(1)

    def forget_topic(self, topic: str) -> None:
        """A deleted topic's items go with it (``onTopicDeleted``)."""
        self.topic_put.pop(topic, None)
        for table in (self.group_get, self.sndbck_put):
            for key in [k for k in table if k.startswith(topic + "@")]:
                del table[key]

    def forget_group(self, group: str) -> None:
        """A deleted group's items go with it (``onGroupDeleted``)."""
        for table in (self.group_get, self.sndbck_put):
            for key in [k for k in table if k.endswith("@" + group)]:
                del table[key]

    # --- sampling ----------------------------------------------------------------------------------------------
    def tick(self) -> None:
        """Run whichever samplers are due (the broker calls this every second)."""
        now = self.now_ms()
        if now >= self._next_store:
            self._next_store = now + STORE_SAMPLE_MS
            self._store_samples.append((now, self.put_total, self.get_found_times, self.get_miss_times,
                                        self.get_total))  # fmt: skip
        minute, hour, day = now >= self._next_minute, now >= self._next_hour, now >= self._next_day
        if minute or hour or day:
            if minute:
                self._next_minute = now + MINUTE_SAMPLE_MS
            if hour:
                self._next_hour = now + HOUR_SAMPLE_MS
            if day:
                self._next_day = now + DAY_SAMPLE_MS
            # The broker items count messages only, no calls (``incBrokerPutNums``): the running totals are theirs.
            self.broker_put.nums, self.broker_get.nums = self.put_total, self.get_total
            for c in self._counters():
                c.sample(now, minute, hour, day)
        if now >= self._next_midnight:
            self.record_day()
            self._next_midnight = next_midnight_ms(now)

    def _counters(self) -> Iterator[Counter]:
        yield self.broker_put
        yield self.broker_get
        for table in (self.topic_put, self.group_get, self.sndbck_put):
            yield from list(table.values())

    def record_day(self) -> None:
        """Midnight (``BrokerStats.record``): today's morning becomes yesterday's, now becomes today's morning."""
        self.msg_put_total_yesterday_morning = self.msg_put_total_today_morning
        self.msg_get_total_yesterday_morning = self.msg_get_total_today_morning
        self.msg_put_total_today_morning = self.put_total
        self.msg_get_total_today_morning = self.get_total

    # --- reading -----------------------------------------------------------------------------------------------
    def item(self, stats_name: str, stats_key: str) -> ItemStats | None:
        """A stats item by Java's name and key (None when it never counted), as VIEW_BROKER_STATS_DATA reads it."""
        found: tuple[Counter | None, bool]
        if stats_name in (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE):
            found = self.topic_put.get(stats_key), stats_name == TOPIC_PUT_SIZE
        elif stats_name in (GROUP_GET_NUMS, GROUP_GET_SIZE):
            found = self.group_get.get(stats_key), stats_name == GROUP_GET_SIZE
        elif stats_name == SNDBCK_PUT_NUMS:
            found = self.sndbck_put.get(stats_key), False
        elif stats_name == BROKER_PUT_NUMS and stats_key == self.cluster_name:
            found = self.broker_put, False
        elif stats_name == BROKER_GET_NUMS and stats_key == self.cluster_name:
            found = self.broker_get, False
        else:
            return None
        c, size = found
        if c is None:
            return None
        return ItemStats(c.in_minute(size), c.in_hour(size), c.in_day(size))

    def tps_group_get_nums(self, group: str, topic: str) -> float:
        """The group's pull rate on the topic over the last minute (``tpsGroupGetNums``: consumeTps)."""
        c = self.group_get.get(f"{topic}@{group}")
        return c.in_minute().tps if c is not None else 0.0

    def _store_tps(self, field: int, seconds: int) -> float:
        samples = self._store_samples
        if len(samples) < 2:
            return 0.0
        # Java answers "" until a whole window is sampled; the span sampled so far is more useful to an operator.
        last = samples[-1]
        first = samples[-min(seconds + 1, len(samples))]
        span = last[0] - first[0]
        return (last[field] - first[field]) * 1000.0 / span if span > 0 else 0.0

    def store_tps(self, field: str) -> str:
        """``putTps``-style figure: the rate over 10, 60 and 600 s, space-separated (``StoreStatsService``)."""
        index = {"put": 1, "found": 2, "miss": 3, "transferred": 4}[field]
        return " ".join(_java_double(self._store_tps(index, s)) for s in STORE_TPS_WINDOWS)

    def get_total_tps(self) -> str:
        return " ".join(_java_double(self._store_tps(2, s) + self._store_tps(3, s)) for s in STORE_TPS_WINDOWS)

    def runtime_info(self) -> dict[str, str]:
        """The figures GET_BROKER_RUNTIME_INFO carries from these stats, under Java's keys."""
        transferred = self.store_tps("transferred")
        now = self.now_ms()
        return {
            "bootTimestamp": str(self.boot_timestamp),
            "runtime": format_runtime(now - self.boot_timestamp),
            "putTps": self.store_tps("put"),
            "getFoundTps": self.store_tps("found"),
            "getMissTps": self.store_tps("miss"),
            "getTotalTps": self.get_total_tps(),
            "getTransferredTps": transferred,  # 5.x spelling
            "getTransferedTps": transferred,  # 4.x spelling, which 4.x mqadmin reads
            "putMessageTimesTotal": str(self.put_total),
            "msgPutTotalYesterdayMorning": str(self.msg_put_total_yesterday_morning),
            "msgPutTotalTodayMorning": str(self.msg_put_total_today_morning),
            "msgPutTotalTodayNow": str(self.put_total),
            "msgGetTotalYesterdayMorning": str(self.msg_get_total_yesterday_morning),
            "msgGetTotalTodayMorning": str(self.msg_get_total_today_morning),
            "msgGetTotalTodayNow": str(self.get_total),
        }


def next_midnight_ms(now_ms: int) -> int:
    """The next local midnight after ``now_ms`` (``UtilAll.computeNextMorningTimeMillis``)."""
    today = dt.datetime.fromtimestamp(now_ms / 1000).date()
    midnight = dt.datetime.combine(today + dt.timedelta(days=1), dt.time())
    return int(midnight.timestamp() * 1000)


def format_runtime(ms: int) -> str:
    """``StoreStatsService.getFormatRuntime``: ``[ d days, h hours, m minutes, s seconds ]``."""
    secs = ms // 1000
    days, secs = divmod(secs, 86_400)
    hours, secs = divmod(secs, 3600)
    minutes, secs = divmod(secs, 60)
    return f"[ {days} days, {hours} hours, {minutes} minutes, {secs} seconds ]"


def _java_double(x: float) -> str:
    """Rates as Java's ``Double.toString`` prints the common cases (``0.0``, ``12.5``)."""
    return repr(float(x))
