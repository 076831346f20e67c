"""Arrival listeners told once per queue for a run of records (the compiled dispatch loop): a parked pull with a
tag or SQL92 filter still wakes for a matching message anywhere in the run, and only for one at or after its
offset; a real broker's parked pull is answered by the matching message of a batch."""

from __future__ import annotations

import asyncio
import time

import pytest

from broker.remoting import batch_body
from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from broker.server.long_polling import PullRequestHoldService
from store import dispatch_loop
from store.format import hashing, msgid, native, properties
from store.message_store import MAX_FILTER_UNITS
from tests.helpers import wait_until
from tests.live_broker import SUB, LiveBroker, records

SUSPEND = 0x2
A, B = hashing.tags_code("A"), hashing.tags_code("B")


async def _parked(hold: PullRequestHoldService, offset: int, tags: set[int] | None, accept=None) -> asyncio.Task:
    task = asyncio.create_task(hold.wait("T", 0, offset, tags, 30, accept))
    await asyncio.sleep(0)  # parked now
    assert hold.parked_count >= 1 and not task.done()
    return task


async def _told(hold: PullRequestHoldService, next_offset: int, codes: tuple[int, ...]) -> None:
    hold.on_arrival("T", 0, next_offset, codes, 0)
    await asyncio.sleep(0)  # the wake-up hops to the loop with call_soon_threadsafe
    await asyncio.sleep(0)


@pytest.mark.unit
def test_a_tag_filtered_pull_wakes_for_a_match_anywhere_in_the_run_at_or_after_its_offset():
    async def scenario() -> None:
        hold = PullRequestHoldService(lambda _t, _q: 0)  # the queue's end seen when a pull parks
        hold.start()
        try:
            pull = await _parked(hold, 5, {A})
            await _told(hold, 10, (A, A, B, B, B, B, B, B, B, B))  # offsets 0..9: the As are before the pull's
            assert not pull.done()
            await _told(hold, 12, (B, A))  # offsets 10, 11: an A that is not the newest record
            assert pull.done() and pull.result() is True
            late = await _parked(hold, 12, {A})
            await _told(hold, 15, (A, A, B))  # offsets 12..14: the As are at 12 and 13
            assert late.done() and late.result() is True
            other = await _parked(hold, 15, {B})
            await _told(hold, 17, (A, A))
            assert not other.done()
        finally:
            await hold.stop()

    asyncio.run(scenario())


@pytest.mark.unit
def test_a_sql92_pull_is_asked_from_its_first_fresh_record_across_the_whole_run():
    asked: list[int] = []

    def accept(next_offset: int) -> bool:  # as the pull's filter: a read scanning forward from next_offset - 1
        asked.append(next_offset)
        return next_offset - 1 <= 2500 < next_offset - 1 + MAX_FILTER_UNITS

    async def scenario() -> None:
        hold = PullRequestHoldService(lambda _t, _q: 0)
        hold.start()
        try:
            pull = await _parked(hold, 100, None, accept)
            await _told(hold, 3000, (B,) * 3000)  # offsets 0..2999; the match, at 2500, is past one read's scan
            assert pull.done() and pull.result() is True
        finally:
            await hold.stop()

    asyncio.run(scenario())
    assert asked == [101, 101 + MAX_FILTER_UNITS, 101 + 2 * MAX_FILTER_UNITS, 101 + 3 * MAX_FILTER_UNITS]


@pytest.fixture
def arrival_broker(tmp_path):
    """Parked pulls answered only by an arrival, their suspend timeout or shutdown (no periodic re-check)."""
    b = LiveBroker(tmp_path / "store").start(pull_recheck_s=3600)
    yield b
    b.close()


def _send_batch(b: LiveBroker, topic: str, tags: list[str]) -> None:
    gen = msgid.UniqKeyGenerator()
    items = [batch_body.BatchItem(0, f"{t}{i}".encode(), properties.encode_properties({"UNIQ_KEY": gen.next(),
                                                                                        "TAGS": t}))
             for i, t in enumerate(tags)]  # fmt: skip
    header = h.SendMessageRequestHeaderV2.from_v1(h.SendMessageRequestHeader(
        producer_group="pg", topic=topic, default_topic="TBW102", default_topic_queue_nums=4, queue_id=0,
        sys_flag=0, born_timestamp=int(time.time() * 1000), flag=0, batch=True,
        properties=properties.encode_properties({"WAIT": "true"}).decode(),
    ))  # fmt: skip
    r = b.call(RequestCode.SEND_BATCH_MESSAGE, header, batch_body.encode_batch_body(items))
    assert r.code == ResponseCode.SUCCESS, r.remark


@pytest.mark.integration
def test_a_parked_tag_pull_is_answered_by_the_matching_message_inside_a_batch(arrival_broker: LiveBroker) -> None:
    b = arrival_broker
    heard: list[tuple[int, tuple[int, ...]]] = []
    b.controller.store.add_arrival_listener(lambda topic, _q, nxt, codes, _ts: heard.append((nxt, codes)))
    b.send("BatchWake", b"first", tags="C")  # the queue's first record (the reference path makes its file)
    before = b.controller.hold.parked_count
    fut = asyncio.run_coroutine_threadsafe(
        asyncio.to_thread(b.pull, "BatchWake", 0, 1, "A", "g", SUB | SUSPEND, 60_000, 0, 90), b.loop
    )
    wait_until(lambda: fut.done() or b.controller.hold.parked_count > before, 10, what="the pull to park")
    assert not fut.done(), fut.result()
    _send_batch(b, "BatchWake", ["B", "B", "B"])
    wait_until(lambda: any(nxt == 4 for nxt, _ in heard), 10, what="the first batch's arrival")
    b.run(asyncio.sleep(0))  # the hold service heard of it first; one turn of the loop runs what it decided
    assert not fut.done() and b.controller.hold.parked_count == 1, "messages with another tag woke the pull"
    _send_batch(b, "BatchWake", ["B", "A", "B"])  # the match is not the batch's newest record
    resp = fut.result(30)  # well within its 60 s suspend: the arrival answered it
    assert resp.code == ResponseCode.SUCCESS and [g.body for g in records(resp.body)] == [b"A1"]
    if not native.disabled():  # the compiled loop (built by `make install`) told the listeners once for the batch
        assert dispatch_loop.available(), f"the compiled dispatch loop is not in use ({native.missing_cause})"
        wait_until(lambda: any(nxt == 7 for nxt, _ in heard), 10, what="the second batch's arrival")
        assert (7, (B, A, B)) in heard
