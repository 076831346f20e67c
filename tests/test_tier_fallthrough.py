"""A broker with ``lakePath`` serves history it tiered and deleted: a real ``mqlake up`` with 64 KiB segments,
the real tier job (local Spark) and its compaction, our client and the stock C++ client (PyPI ``rocketmq``).

The module's fixture produces a topic, tiers every sealed segment while a reader walks a queue through the
broker, lets the broker's clean pass delete the tiered segments, then compacts the tier while the reader
walks on; the tests assert what the clients and the reader saw.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from broker.client.admin import Admin
from broker.remoting import headers as h
from broker.remoting.codes import RequestCode
from tests.fixtures_broker import MqlakeServer, stop_servers
from tests.fixtures_broker import remoting_call as broker_call
from tests.helpers import wait_until
from tests.tiering_broker import (
    Sent,
    in_queue,
    min_offset,
    produce,
    start_tiering_broker,
    wait_deleted,
    wait_sealed,
    walk,
)

TOPIC = "TieredT"
QUEUES = 4
COUNT = 640


@dataclass
class Race:
    """What a reader walking queue 0 through the broker saw while the tier job and the compaction ran."""

    passes: list[list[bytes]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class Tiered:
    server: MqlakeServer
    lake: Path
    sent: list[Sent]
    deleted: list[int]
    race: Race

    def queue(self, queue_id: int) -> list[Sent]:
        return in_queue(self.sent, queue_id)


def _racer(namesrv: str, race: Race, stop: threading.Event) -> None:
    async def go() -> None:
        while not stop.is_set():
            try:
                race.passes.append(await walk(namesrv, TOPIC, 0))
            except Exception as e:  # recorded, asserted by the test
                race.errors.append(f"{type(e).__name__}: {e}")

    asyncio.run(go())


def _racing(namesrv: str, race: Race, work) -> None:
    """Run ``work()`` while the racer walks queue 0; at least one walk starts and ends during the work."""
    stop = threading.Event()
    before = len(race.passes)
    t = threading.Thread(target=_racer, args=(namesrv, race, stop), daemon=True)
    t.start()
    try:
        work()
        wait_until(lambda: len(race.passes) >= before + 2 or bool(race.errors), 60, what="reads during the race")
    finally:
        stop.set()
        t.join(60)


@pytest.fixture(scope="module")
def tiered(spark, tmp_path_factory) -> Tiered:
    from pipelines.compaction.job import tier
    from pipelines.compaction.upkeep import compact

    work = tmp_path_factory.mktemp("tier_fallthrough")
    lake = work / "lake"
    server = start_tiering_broker(work / "server", lake, QUEUES)
    try:
        sent = asyncio.run(produce(server.namesrv_addr, TOPIC, COUNT, "tiered"))
        wait_sealed(server.store_dir, 4)
        race = Race()
        reports = []
        _racing(server.namesrv_addr, race,
                lambda: reports.append(tier(server.store_dir, lake, spark=spark, file_reserved_time=0)))  # fmt: skip
        tiered_bases = [s.base_offset for s in reports[0].segments if s.state == "tiered"]
        assert len(tiered_bases) >= 4, reports[0].segments
        wait_deleted(server.store_dir, tiered_bases)
        tomorrow = datetime.now(UTC).date() + timedelta(days=1)  # today's partition counts as closed
        _racing(server.namesrv_addr, race, lambda: compact(lake, today=tomorrow))
        yield Tiered(server, lake, sent, tiered_bases, race)
    finally:
        stop_servers([server])


@pytest.mark.spark
def test_reads_racing_a_tier_run_and_a_compaction_see_every_message_once_in_order(tiered) -> None:
    want = [s.body for s in tiered.queue(0)]
    assert tiered.race.errors == []
    assert len(tiered.race.passes) >= 4
    for seen in tiered.race.passes:
        assert seen == want


@pytest.mark.spark
def test_our_client_reads_a_partly_deleted_topic_from_the_first_offset(tiered) -> None:
    for queue_id in range(QUEUES):
        assert min_offset(tiered.server, TOPIC, queue_id) == 0  # the tier's first offset, not the local one
        assert asyncio.run(walk(tiered.server.namesrv_addr, TOPIC, queue_id, max_nums=7)) == [
            s.body for s in tiered.queue(queue_id)
        ]
        tagged = [s.body for s in tiered.queue(queue_id) if s.tag == "T1"]
        assert asyncio.run(walk(tiered.server.namesrv_addr, TOPIC, queue_id, "T1")) == tagged
    assert "cannot read the tier" not in tiered.server.log_text()


@pytest.mark.spark
def test_the_stock_cpp_client_pulls_every_message_once_from_offset_zero(tiered) -> None:
    from rocketmq.client import PullConsumer as CppPullConsumer

    c = CppPullConsumer("cg_cpp_tiered")
    c.offset_table = {}  # the binding shares one offset table between consumers: this one starts at 0
    c.set_namesrv_addr(tiered.server.namesrv_addr)
    c.start()
    got: dict[int, list[tuple[int, bytes]]] = {}
    try:

        def pull_all() -> bool:
            for msg in c.pull(TOPIC):
                got.setdefault(msg.queue_id, []).append((msg.queue_offset, msg.body))
            return sum(len(v) for v in got.values()) >= COUNT

        wait_until(pull_all, 60, what="the C++ pull consumer to read the topic")
    finally:
        c.shutdown()
    for queue_id in range(QUEUES):
        assert got[queue_id] == [(s.queue_offset, s.body) for s in tiered.queue(queue_id)]


@pytest.mark.spark
def test_queries_by_key_unique_key_and_offset_msg_id_find_tiered_messages(tiered) -> None:
    first = tiered.queue(1)[0]  # in the first segment: deleted locally
    assert first.queue_offset == 0

    async def go() -> None:
        async with Admin(tiered.server.namesrv_addr) as admin:
            by_key = await admin.query_msg_by_key(TOPIC, first.key)
            assert [m.body for m in by_key] == [first.body]
            group = await admin.query_msg_by_key(TOPIC, "group-3", max_num=32)  # tiered and local ones
            assert sorted(m.body for m in group) == sorted(s.body for s in tiered.sent if int(s.key[4:]) % 64 == 3)
            by_uniq = await admin.query_msg_by_unique_key(TOPIC, first.msg_id)
            assert [m.body for m in by_uniq] == [first.body]
            viewed = await admin.view_message(first.offset_msg_id)
            assert (viewed.body, viewed.queue_offset, viewed.offset_msg_id) == (first.body, 0, first.offset_msg_id)

    asyncio.run(go())


@pytest.mark.spark
def test_offset_searches_and_earliest_store_time_reach_into_the_tier(tiered) -> None:
    addr = tiered.server.broker_addr
    queue = tiered.queue(2)

    async def store_times() -> list[int]:
        async with Admin(tiered.server.namesrv_addr) as admin:
            return [(await admin.view_message(s.offset_msg_id)).store_timestamp for s in queue]

    times = asyncio.run(store_times())
    r = broker_call(addr, RequestCode.GET_EARLIEST_MSG_STORETIME,
                    h.GetEarliestMsgStoretimeRequestHeader(topic=TOPIC, queue_id=2))  # fmt: skip
    assert int(r.ext_fields["timestamp"]) == times[0]

    def search(ts: int, boundary: str | None = None) -> int:
        header = h.SearchOffsetRequestHeader(topic=TOPIC, queue_id=2, timestamp=ts, boundary_type=boundary)
        return int(broker_call(addr, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, header).ext_fields["offset"])

    assert search(0) == 0  # before everything: the tier's first offset
    k = 5  # a tiered message: the first offset stored at or after its time, the last at or before it
    assert search(times[k]) == min(i for i, t in enumerate(times) if t >= times[k])
    assert search(times[k], "upper") == max(i for i, t in enumerate(times) if t <= times[k])
