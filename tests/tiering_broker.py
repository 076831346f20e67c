"""A running broker whose history reaches a lake within a test, shared by the tests of the lake behind a broker
(tests/test_tier_fallthrough.py on a local lake, tests/test_s3_lake.py on a bucket, tests/test_two_brokers.py):
64 KiB CommitLog segments and 64-unit ConsumeQueue files, so a few hundred messages seal several segments; a
clean pass every 200 ms at every hour (``deleteWhen``), so tiered segments go within seconds; ``lakePath`` set,
so the broker reads what it deleted from the lake.  Also the topic sent to it with our client, and the reads of
its queues and its segment manifest the tests wait on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from broker.client.message import Message, PullStatus
from broker.client.producer import Producer
from broker.client.pull_consumer import PullConsumer
from broker.remoting import headers as h
from broker.remoting.codes import RequestCode
from store.retention import SegmentManifest, SegmentState
from tests.fixtures_broker import MqlakeServer, remoting_call
from tests.helpers import wait_until

SEGMENT = 64 * 1024
EVERY_HOUR = ";".join(f"{hour:02d}" for hour in range(24))  # deleteWhen: the clean pass may delete at any hour


def tiering_conf(lake: Path | str) -> dict[str, object]:
    """The broker.conf keys of a broker whose segments seal, tier and go within seconds, tiered to ``lake``."""
    return {"mappedFileSizeCommitLog": SEGMENT, "mappedFileSizeConsumeQueue": 20 * 64, "deleteWhen": EVERY_HOUR,
            "cleanResourceInterval": 200, "lakePath": lake}  # fmt: skip


def start_tiering_broker(work_dir: Path, lake: Path | str, queues: int) -> MqlakeServer:
    """A started ``mqlake up`` with :func:`tiering_conf` whose new topics get ``queues`` queues."""
    return MqlakeServer(work_dir, defaultTopicQueueNums=queues, **tiering_conf(lake)).start()


@dataclass
class Sent:
    body: bytes
    key: str
    tag: str
    queue_id: int
    queue_offset: int
    msg_id: str
    offset_msg_id: str


async def produce(namesrv: str, topic: str, count: int, name: str) -> list[Sent]:
    """``count`` messages of about 330 bytes, ``name`` in their bodies and producer group, keys ``key-i`` and
    ``group-(i % 64)``, tags ``T0``..``T2``."""
    sent = []
    async with Producer(f"pg_{name}", namesrv) as p:
        for i in range(count):
            body = f"{name}-{i:04d}-".encode() + bytes([65 + i % 26]) * 300  # no NUL: C clients read C strings
            key, tag = f"key-{i}", f"T{i % 3}"
            r = await p.send(Message(topic, body, tags=tag, keys=[key, f"group-{i % 64}"]))
            sent.append(Sent(body, key, tag, r.queue.queue_id, r.queue_offset, r.msg_id, r.offset_msg_id))
    return sent


def in_queue(sent: list[Sent], queue_id: int) -> list[Sent]:
    """What was sent to one queue, in queue-offset order."""
    return sorted((s for s in sent if s.queue_id == queue_id), key=lambda s: s.queue_offset)


async def walk(namesrv: str, topic: str, queue_id: int, expression: str = "*", max_nums: int = 32) -> list[bytes]:
    """Every message of a queue from GET_MIN_OFFSET to GET_MAX_OFFSET with our PullConsumer."""
    async with PullConsumer(f"cg_walk_{queue_id}", namesrv) as c:
        mq = next(q for q in await c.fetch_queues(topic) if q.queue_id == queue_id)
        offset, end = await c.min_offset(mq), await c.max_offset(mq)
        got: list[bytes] = []
        while offset < end:
            res = await c.pull(mq, offset, max_nums, expression)
            assert res.status in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG), (queue_id, offset, res.status)
            assert res.next_begin_offset > offset, (queue_id, offset, res)
            got.extend(m.body for m in res.messages)
            offset = res.next_begin_offset
        return got


def segment_states(store_dir: Path) -> dict[int, SegmentState]:
    """Base offset -> state of every segment in the store's manifest."""
    return {e.base_offset: e.state for e in SegmentManifest(store_dir).entries()}


def wait_sealed(store_dir: Path, at_least: int, who: str = "the broker") -> None:
    """Until the broker lists ``at_least`` sealed segments in its manifest (its clean pass does, on its schedule)."""
    wait_until(lambda: sum(s == SegmentState.SEALED for s in segment_states(store_dir).values()) >= at_least, 30,
               what=f"{who} to list sealed segments in its manifest")  # fmt: skip


def wait_deleted(store_dir: Path, bases: list[int], who: str = "the broker") -> None:
    """Until the broker's clean pass has deleted the segments at ``bases`` (which must not be empty)."""
    assert bases, "no segments to wait for"

    def deleted() -> bool:
        states = segment_states(store_dir)
        return all(states.get(b) == SegmentState.DELETED for b in bases)

    wait_until(deleted, 30, what=f"{who}'s clean pass to delete the tiered segments")


def min_offset(server: MqlakeServer, topic: str, queue_id: int) -> int:
    """The broker's GET_MIN_OFFSET answer for a queue."""
    header = h.GetMinOffsetRequestHeader(topic=topic, queue_id=queue_id)
    return int(remoting_call(server.broker_addr, RequestCode.GET_MIN_OFFSET, header).ext_fields["offset"])
