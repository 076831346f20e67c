"""Offsets: QUERY/UPDATE_CONSUMER_OFFSET (14/15), GET_MAX/MIN_OFFSET (30/31), GET_EARLIEST_MSG_STORETIME (32),
SEARCH_OFFSET_BY_TIMESTAMP (29)."""

from __future__ import annotations

import os

from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel, Handler
from broker.remoting.headers import (
    GetEarliestMsgStoretimeRequestHeader,
    GetEarliestMsgStoretimeResponseHeader,
    GetMaxOffsetRequestHeader,
    GetMaxOffsetResponseHeader,
    GetMinOffsetRequestHeader,
    GetMinOffsetResponseHeader,
    QueryConsumerOffsetRequestHeader,
    QueryConsumerOffsetResponseHeader,
    SearchOffsetRequestHeader,
    SearchOffsetResponseHeader,
    UpdateConsumerOffsetRequestHeader,
)
from broker.server import tier_reads
from broker.server.context import BrokerContext
from store import names

ACCESS_MESSAGE_IN_MEMORY_MAX_RATIO = 40  # percent of RAM behind the log's end still counted as hot


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


TOTAL_PHYSICAL_MEMORY = _total_memory()


class OffsetProcessor:
    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker

    def routes(self) -> dict[int, Handler]:
        return {
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_consumer_offset,
            RequestCode.GET_MAX_OFFSET: self.get_max_offset,
            RequestCode.GET_MIN_OFFSET: self.get_min_offset,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self.get_earliest_msg_storetime,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset_by_timestamp,
        }

    def _first_message_is_hot(self, topic: str, queue_id: int) -> bool:
        """4.9.8 ``!checkInDiskByConsumeOffset(topic, q, 0)``: is the queue's first message still in memory?"""
        store = self.broker.store
        cq = store.find_consume_queue(topic, queue_id, create=False)
        unit = cq.get_unit(0) if cq is not None else None
        if unit is None:
            return True  # nothing written yet: a new group starts at the beginning
        behind = store.max_phy_offset - unit[0]
        return behind <= TOTAL_PHYSICAL_MEMORY * ACCESS_MESSAGE_IN_MEMORY_MAX_RATIO // 100

    async def query_consumer_offset(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        h = cmd.read_header(QueryConsumerOffsetRequestHeader)
        offset = self.broker.offsets.query(h.consumer_group, h.topic, h.queue_id)
        if offset >= 0:
            return cmd.response(ResponseCode.SUCCESS, None, QueryConsumerOffsetResponseHeader(offset=offset))
        store = self.broker.store
        if (
            store.get_min_offset_in_queue(h.topic, h.queue_id) <= 0
            and h.set_zero_if_not_found is not False
            and self._first_message_is_hot(h.topic, h.queue_id)
        ):
            return cmd.response(ResponseCode.SUCCESS, None, QueryConsumerOffsetResponseHeader(offset=0))
        return cmd.response(ResponseCode.QUERY_NOT_FOUND, "no committed offset for this group and queue")

    async def update_consumer_offset(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        h = cmd.read_header(UpdateConsumerOffsetRequestHeader)
        # The names become a key of consumerOffset.json ("topic@group"): none a client could not create is kept
        bad_topic = names.stored_topic_error(h.topic)
        if bad_topic is not None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, bad_topic)
        bad_group = names.stored_group_error(h.consumer_group)
        if bad_group is not None:
            return cmd.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, bad_group)
        self.broker.offsets.commit(h.consumer_group, h.topic, h.queue_id, h.commit_offset)
        return cmd.response(ResponseCode.SUCCESS)

    async def get_max_offset(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        h = cmd.read_header(GetMaxOffsetRequestHeader)
        offset = self.broker.store.get_max_offset_in_queue(h.topic, h.queue_id)
        return cmd.response(ResponseCode.SUCCESS, None, GetMaxOffsetResponseHeader(offset=offset))

    async def get_min_offset(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        h = cmd.read_header(GetMinOffsetRequestHeader)
        offset = self.broker.store.get_min_offset_in_queue(h.topic, h.queue_id)
        offset = await tier_reads.min_offset(self.broker, h.topic, h.queue_id, offset)
        return cmd.response(ResponseCode.SUCCESS, None, GetMinOffsetResponseHeader(offset=offset))

    async def get_earliest_msg_storetime(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        h = cmd.read_header(GetEarliestMsgStoretimeRequestHeader)
        ts = self.broker.store.get_earliest_message_time(h.topic, h.queue_id)
        ts = await tier_reads.earliest_store_time(self.broker, h.topic, h.queue_id, ts)
        return cmd.response(ResponseCode.SUCCESS, None, GetEarliestMsgStoretimeResponseHeader(timestamp=ts))

    async def search_offset_by_timestamp(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        h = cmd.read_header(SearchOffsetRequestHeader)
        upper = (h.boundary_type or "").lower() == "upper"
        offset = self.broker.store.get_offset_in_queue_by_time(h.topic, h.queue_id, h.timestamp, upper=upper)
        offset = await tier_reads.offset_by_time(self.broker, h.topic, h.queue_id, h.timestamp, upper, offset)
        return cmd.response(ResponseCode.SUCCESS, None, SearchOffsetResponseHeader(offset=offset))
