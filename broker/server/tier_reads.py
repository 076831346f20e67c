"""Reads that fall through to the tier: what PULL_MESSAGE, the offset requests and the queries answer when
``lakePath`` is set and the local store no longer holds what was asked. Once a segment is tiered, its Delta table
is the only copy: the broker serves reads below the local minimum from it, byte for byte as the CommitLog held
them, so a consumer or a query never sees where the history lives.

Each function takes the local answer and returns the combined one; the lake is read in a worker thread
(delta-rs and parquet reads block), and without a lake (``broker.lake is None``) the local answer stands.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from broker.server.context import BrokerContext
from store.format.records import read_physical_offset
from store.message_store import GetMessageResult, GetMessageStatus

# Local answers that mean "not here (any more)": the tier may hold the offset.
_FALL_THROUGH = {
    GetMessageStatus.OFFSET_TOO_SMALL,
    GetMessageStatus.MESSAGE_WAS_REMOVING,
    GetMessageStatus.NO_MATCHED_LOGIC_QUEUE,
    GetMessageStatus.NO_MESSAGE_IN_QUEUE,
}
_UNBOUNDED = 1 << 62


async def pull(
    broker: BrokerContext,
    topic: str,
    queue_id: int,
    offset: int,
    local: GetMessageResult,
    max_nums: int,
    max_bytes: int,
    tag_codes: set[int] | None,
    record_filter: Callable[[bytes], bool] | None = None,
) -> GetMessageResult:
    """The local result, or, for an offset below the local store, the tier's records from there up to the
    local minimum (the next pull continues in the local store: no gap, no duplicate); tags and the SQL92
    ``record_filter`` apply as in the local store."""
    lake = broker.lake
    if lake is None:
        return local
    upper = _tier_upper(broker, topic, queue_id, offset, local)
    if upper is None:
        return local
    found = await asyncio.to_thread(
        lake.pull, topic, queue_id, offset, upper, max_nums, max_bytes, tag_codes, record_filter
    )
    if found is None:
        return local
    status = GetMessageStatus.FOUND if found.messages else GetMessageStatus.NO_MATCHED_MESSAGE
    return GetMessageResult(
        status, found.next_begin_offset, min(offset, local.min_offset), local.max_offset, found.messages,
        found.queue_offsets,
    )  # fmt: skip


def pull_falls_through(broker: BrokerContext, topic: str, queue_id: int, offset: int, local: GetMessageResult) -> bool:
    """Whether ``pull`` would read the tier for this local result (else it returns ``local`` as it is)."""
    return broker.lake is not None and _tier_upper(broker, topic, queue_id, offset, local) is not None


def _tier_upper(broker: BrokerContext, topic: str, queue_id: int, offset: int, local: GetMessageResult) -> int | None:
    """The queue offset below which the tier answers a pull from ``offset``; None when the local result stands."""
    if local.status is GetMessageStatus.FOUND and local.queue_offsets[0] > offset:
        # Units skipped before the first record: filtered out, or pointing at a segment the clean pass has just
        # deleted (the ConsumeQueue minimum moves right after).  The tier holds the latter: serve it, no gap.
        return local.queue_offsets[0] if _removed(broker, topic, queue_id, offset) else None
    if local.status not in _FALL_THROUGH:
        return None
    if local.status is GetMessageStatus.OFFSET_TOO_SMALL:
        return local.min_offset
    if local.status is GetMessageStatus.MESSAGE_WAS_REMOVING:
        return local.max_offset
    return _UNBOUNDED


def _removed(broker: BrokerContext, topic: str, queue_id: int, offset: int) -> bool:
    """Does the ConsumeQueue unit at ``offset`` point below the CommitLog's first offset (its segment deleted)?"""
    store = broker.store
    cq = store.find_consume_queue(topic, queue_id, create=False)
    if cq is None:
        return False
    if offset < cq.min_offset_in_queue:
        return True  # corrected since the read
    unit = cq.get_unit(offset)
    return unit is not None and unit[0] < store.min_phy_offset


async def min_offset(broker: BrokerContext, topic: str, queue_id: int, local: int) -> int:
    """GET_MIN_OFFSET: the first offset the tier holds when it is below the local one."""
    lake = broker.lake
    if lake is None:
        return local
    tiered = await asyncio.to_thread(lake.queue_range, topic, queue_id)
    return local if tiered is None else min(local, tiered[0])


async def earliest_store_time(broker: BrokerContext, topic: str, queue_id: int, local: int) -> int:
    """GET_EARLIEST_MSG_STORETIME: the store time of the first tiered message when the tier reaches further back."""
    lake = broker.lake
    if lake is None:
        return local
    store = broker.store
    tiered = await asyncio.to_thread(lake.queue_range, topic, queue_id)
    if tiered is None or tiered[0] >= store.get_min_offset_in_queue(topic, queue_id):
        return local
    ts = await asyncio.to_thread(lake.store_time_at, topic, queue_id, tiered[0])
    return local if ts is None else ts


async def offset_by_time(broker: BrokerContext, topic: str, queue_id: int, timestamp: int, upper: bool,
                         local: int) -> int:  # fmt: skip
    """SEARCH_OFFSET_BY_TIMESTAMP over tier and local store: the tier answers for times before the local
    store's first message."""
    lake = broker.lake
    if lake is None:
        return local
    store = broker.store
    local_min = store.get_min_offset_in_queue(topic, queue_id)
    tiered = await asyncio.to_thread(lake.queue_range, topic, queue_id)
    if tiered is None or tiered[0] >= local_min:
        return local
    first_local_time = await asyncio.to_thread(store.get_earliest_message_time, topic, queue_id)
    if first_local_time >= 0 and (first_local_time <= timestamp if upper else first_local_time < timestamp):
        return local  # the answer lies in the local store
    found = await asyncio.to_thread(lake.offset_by_time, topic, queue_id, timestamp, upper)
    return local if found is None else found


async def view_message(broker: BrokerContext, commitlog_offset: int, local: bytes | None) -> bytes | None:
    """VIEW_MESSAGE_BY_ID: the tiered record when the local CommitLog no longer holds the offset."""
    if local is not None or broker.lake is None:
        return local
    return await asyncio.to_thread(broker.lake.message_at, commitlog_offset)


async def query_messages(
    broker: BrokerContext, topic: str, key: str, max_num: int, begin: int, end: int, local: list[bytes]
) -> list[bytes]:
    """QUERY_MESSAGE: the local index's records, then tiered ones it no longer reaches (each record once)."""
    if broker.lake is None or len(local) >= max_num:
        return local
    tiered = await asyncio.to_thread(broker.lake.query_key, topic, key, max_num, begin, end)
    seen = {read_physical_offset(m, 0) for m in local}
    out = list(local)
    for m in tiered:
        if len(out) >= max_num:
            break
        if read_physical_offset(m, 0) not in seen:
            out.append(m)
    return out
