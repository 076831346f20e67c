"""BrokerStatsManager's windows, rates and day counters, driven by a clock the test advances (values computed by
hand from RocketMQ's ``StatsItem.computeStatsData`` and ``StoreStatsService`` rules)."""

from __future__ import annotations

import datetime as dt

import pytest

from broker.server import stats as st

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("pinned_zone")]  # hours and days are local time


class Clock:
    def __init__(self, start: float) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t


def _noon() -> float:
    return dt.datetime.combine(dt.date(2026, 3, 3), dt.time(12, 0)).timestamp()


def test_minute_window_starts_from_a_zero_sample_one_period_back() -> None:
    clock = Clock(_noon())
    s = st.BrokerStatsManager("C", clock)
    s.put("T", 10, 1000)  # counted before the first sample: still in the first window
    s.tick()
    for _ in range(4):
        s.put("T", 10, 1000)
    clock.t += 10
    s.tick()
    item = s.item(st.TOPIC_PUT_NUMS, "T")
    assert item is not None
    # samples (-10 s, 0 msgs), (0 s, 10), (10 s, 50): last - first = 50 over 20 s, 5 calls
    assert item.minute == st.StatsSnapshot(sum=50, tps=2.5, avgpt=10.0, times=5)
    size = s.item(st.TOPIC_PUT_SIZE, "T")
    assert size is not None and size.minute.sum == 5000 and size.minute.tps == 250.0
    # the hour and day samplers ran once (at the first tick): their windows hold the 10 messages before it
    assert item.hour.sum == 10 and item.day.sum == 10
    broker = s.item(st.BROKER_PUT_NUMS, "C")
    assert broker is not None and broker.minute.sum == 50


def test_minute_window_keeps_seven_samples() -> None:
    clock = Clock(_noon())
    s = st.BrokerStatsManager("C", clock)
    s.tick()
    for second in range(1, 11):  # ten 10-second periods, 1, 2, ... 10 messages in each
        s.got("T", "G", second, second * 100)
        clock.t += 10
        s.tick()
    item = s.item(st.GROUP_GET_NUMS, "T@G")
    assert item is not None
    # the last 7 samples span 60 s and hold the counts of periods 5..10
    assert item.minute.sum == sum(range(5, 11))
    assert item.minute.tps == pytest.approx(sum(range(5, 11)) / 60)
    assert s.tps_group_get_nums("G", "T") == item.minute.tps
    assert s.tps_group_get_nums("other", "T") == 0.0
    assert s.item(st.GROUP_GET_SIZE, "T@G").minute.sum == 100 * sum(range(5, 11))
    assert s.item(st.GROUP_GET_NUMS, "T@nobody") is None
    assert s.item("NO_SUCH_STATS", "T") is None


def test_store_tps_over_10_60_600_seconds() -> None:
    clock = Clock(_noon())
    s = st.BrokerStatsManager("C", clock)
    assert s.store_tps("put") == "0.0 0.0 0.0"
    s.tick()
    for _ in range(20):  # 20 s at 30 puts/s, then 40 s idle
        s.put("T", 30, 3000)
        clock.t += 1
        s.tick()
    for _ in range(40):
        s.got("T", "G", 5, 500)
        s.missed()
        clock.t += 1
        s.tick()
    put_10, put_60, put_600 = (float(x) for x in s.store_tps("put").split(" "))
    assert put_10 == 0.0
    assert put_60 == pytest.approx(600 / 60)
    assert put_600 == pytest.approx(600 / 60)  # only 60 s sampled so far: the rate over what is sampled
    assert s.store_tps("transferred").split(" ")[0] == "5.0"
    assert s.store_tps("found").split(" ")[0] == "1.0"
    assert s.get_total_tps().split(" ")[0] == "2.0"  # found + missed
    info = s.runtime_info()
    assert info["putTps"] == s.store_tps("put")
    assert info["getTransferedTps"] == info["getTransferredTps"] == s.store_tps("transferred")
    assert info["msgPutTotalTodayNow"] == "600" and info["msgGetTotalTodayNow"] == "200"
    assert info["runtime"] == "[ 0 days, 0 hours, 1 minutes, 0 seconds ]"


def test_day_counters_roll_at_local_midnight() -> None:
    clock = Clock(_noon())
    s = st.BrokerStatsManager("C", clock)
    s.put("T", 7, 70)
    s.tick()
    assert s.runtime_info()["msgPutTotalTodayMorning"] == "0"
    clock.t = dt.datetime.combine(dt.date(2026, 3, 4), dt.time(0, 0, 1)).timestamp()
    s.tick()
    s.put("T", 5, 50)
    s.got("T", "G", 3, 30)
    info = s.runtime_info()
    assert (info["msgPutTotalYesterdayMorning"], info["msgPutTotalTodayMorning"], info["msgPutTotalTodayNow"]) == (
        "0", "7", "12")  # fmt: skip
    # a second midnight: yesterday's morning is the first one's
    clock.t += 86_400
    s.tick()
    info = s.runtime_info()
    assert (info["msgPutTotalYesterdayMorning"], info["msgPutTotalTodayMorning"]) == ("7", "12")
    assert (info["msgGetTotalYesterdayMorning"], info["msgGetTotalTodayMorning"]) == ("0", "3")


def test_deleted_topics_and_groups_lose_their_items() -> None:
    s = st.BrokerStatsManager("C", Clock(_noon()))
    s.put("T", 1, 10)
    s.got("T", "G", 1, 10)
    s.got("U", "G", 1, 10)
    s.got("U", "H", 1, 10)
    s.sent_back("%RETRY%G", "G")
    s.forget_topic("T")
    assert s.item(st.TOPIC_PUT_NUMS, "T") is None and s.item(st.GROUP_GET_NUMS, "T@G") is None
    s.forget_group("G")
    assert s.item(st.GROUP_GET_NUMS, "U@G") is None and s.item(st.SNDBCK_PUT_NUMS, "%RETRY%G@G") is None
    assert s.item(st.GROUP_GET_NUMS, "U@H") is not None


def test_next_midnight_is_local() -> None:
    noon = _noon()
    assert st.next_midnight_ms(int(noon * 1000)) == int(
        dt.datetime.combine(dt.date(2026, 3, 4), dt.time()).timestamp() * 1000)  # fmt: skip
