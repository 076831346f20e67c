"""QUERY_MESSAGE (12) by key and time range, VIEW_MESSAGE_BY_ID (33) by CommitLog offset.

With aclEnable, QUERY_MESSAGE's topic is checked (SUB) before it runs, and its answer holds only records of that
topic: the IndexFile matches by a 32-bit hash of ``topic#key``, which other topics' keys can be made to share.
VIEW_MESSAGE_BY_ID names no topic: the record is read first, and its body is returned only if the signing account
holds SUB on the record's topic.
"""

from __future__ import annotations

import asyncio

from broker.acl.rules import SUB
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel, Handler
from broker.remoting.headers import QueryMessageRequestHeader, QueryMessageResponseHeader, ViewMessageRequestHeader
from broker.server import tier_reads
from broker.server.context import BrokerContext
from store.constants import UNIQUE_MSG_QUERY_FLAG
from store.format.records import RecordError, read_topic

DEFAULT_QUERY_MAX_NUM = 32  # what a unique-key query is limited to


class QueryProcessor:
    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker

    def routes(self) -> dict[int, Handler]:
        return {RequestCode.QUERY_MESSAGE: self.query_message, RequestCode.VIEW_MESSAGE_BY_ID: self.view_message_by_id}

    async def query_message(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        h = cmd.read_header(QueryMessageRequestHeader)
        max_num = DEFAULT_QUERY_MAX_NUM if cmd.ext_fields.get(UNIQUE_MSG_QUERY_FLAG) == "true" else h.max_num
        # Index reads walk hash chains over mmapped files that may be cold: keep them off the event loop.
        result = await asyncio.to_thread(
            self.broker.store.query_message, h.topic, h.key, max_num, h.begin_timestamp, h.end_timestamp
        )
        header = QueryMessageResponseHeader(
            index_last_update_timestamp=result.index_last_update_timestamp,
            index_last_update_phyoffset=result.index_last_update_phyoffset,
        )
        messages = await tier_reads.query_messages(
            self.broker, h.topic, h.key, max_num, h.begin_timestamp, h.end_timestamp, result.messages
        )
        if self.broker.acl is not None:
            messages = [m for m in messages if _topic_of(m) == h.topic]
        if not messages:
            return cmd.response(ResponseCode.QUERY_NOT_FOUND, "no message found for this key in the time range", header)
        return cmd.response(ResponseCode.SUCCESS, None, header, b"".join(messages))

    async def view_message_by_id(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand | None:
        h = cmd.read_header(ViewMessageRequestHeader)
        raw = await asyncio.to_thread(self.broker.store.look_message_by_offset, h.offset)
        raw = await tier_reads.view_message(self.broker, h.offset, raw)
        if raw is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"no message at CommitLog offset {h.offset}")
        acl = self.broker.acl
        if acl is not None:
            topic = _topic_of(raw)
            if topic is None:  # a record the ACL cannot place is served to nobody
                return cmd.response(ResponseCode.SYSTEM_ERROR, f"unreadable record at CommitLog offset {h.offset}")
            acl.check(cmd, conn.remote_host[0], {topic: SUB})  # RequestRefused answers NO_PERMISSION
        return cmd.response(ResponseCode.SUCCESS, None, body=raw)


def _topic_of(raw: bytes) -> str | None:
    try:
        return read_topic(raw)
    except RecordError:
        return None
