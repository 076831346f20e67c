"""A 5.x PullConsumer's RPCs: PullMessage, UpdateOffset, GetOffset and QueryOffset.

The consumer picks a queue and an offset itself and keeps its progress in the group's consumer offsets, the table
remoting consumers commit to: a 4.x consumer and a 5.x PullConsumer of one group share their offsets.  A pull goes
through the broker's own PULL_MESSAGE path (``PullProcessor``, as a pull that commits nothing), so tag and SQL92
filters, long polling, reads of tiered segments and the group checks are a remoting pull's.  RocketMQ 5.4's proxy
does not serve these RPCs (they answer UNIMPLEMENTED there); their semantics here follow the remoting calls they
stand for.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, cast

from broker.proxy import convert, namespaces
from broker.proxy.status import Code, ProxyError, from_remoting, status
from broker.proxy.v2 import definition_pb2 as pb
from broker.proxy.v2 import service_pb2 as svc
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel
from broker.remoting.errors import RequestRefused
from broker.remoting.headers import PullMessageRequestHeader, PullMessageResponseHeader
from broker.remoting.protocol.heartbeat import EXPRESSION_TYPE_SQL92, EXPRESSION_TYPE_TAG
from broker.server import tier_reads
from broker.server import topics as tp
from broker.server.pull import FLAG_SUBSCRIPTION, FLAG_SUSPEND, PullProcessor
from store.format import records

if TYPE_CHECKING:
    from broker.server.controller import BrokerController

MAX_PULL_BATCH = 32  # messages per pull (MAX_TRANSFER_COUNT of a remoting pull)
_ANSWERED = frozenset({ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY,
                       ResponseCode.PULL_OFFSET_MOVED})  # a pull's outcomes; any other code is a refusal


def _refusal(code: int, remark: str | None) -> ProxyError:
    v2 = Code.ILLEGAL_FILTER_EXPRESSION if code == ResponseCode.SUBSCRIPTION_PARSE_FAILED else from_remoting(code)
    return ProxyError(v2, remark or f"pull refused ({code})")


class PullService:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        self.puller = PullProcessor(broker)

    def _queue(self, tc: tp.TopicConfig, mq: pb.MessageQueue) -> int:
        if not 0 <= mq.id < max(tc.read_queue_nums, 1):
            raise ProxyError(Code.BAD_REQUEST, f"queue {mq.id} is out of range: {tc.topic_name} has "
                                               f"{tc.read_queue_nums} read queues")  # fmt: skip
        return mq.id

    async def pull(self, group: str, tc: tp.TopicConfig, request: svc.PullMessageRequest, wait_ms: int,
                   peer: Any) -> AsyncIterator[svc.PullMessageResponse]:  # fmt: skip
        """The stream a pull answers: its status, the messages found, then the offset to pull from next (also
        after MESSAGE_NOT_FOUND, and after ILLEGAL_OFFSET: the queue's nearest valid offset)."""
        qid = self._queue(tc, request.message_queue)
        if request.offset < 0:
            raise ProxyError(Code.ILLEGAL_OFFSET, f"offset {request.offset} is negative")
        if not 0 < request.batch_size <= MAX_PULL_BATCH:
            raise ProxyError(Code.BAD_REQUEST, f"batch size {request.batch_size} is outside [1, {MAX_PULL_BATCH}]")
        expr = request.filter_expression
        sql = expr.type == pb.SQL
        header = PullMessageRequestHeader(
            consumer_group=group, topic=tc.topic_name, queue_id=qid, queue_offset=request.offset,
            max_msg_nums=request.batch_size, sys_flag=FLAG_SUBSCRIPTION | (FLAG_SUSPEND if wait_ms > 0 else 0),
            commit_offset=0, suspend_timeout_millis=wait_ms, subscription=expr.expression.strip() or "*",
            sub_version=convert.now_ms(), expression_type=EXPRESSION_TYPE_SQL92 if sql else EXPRESSION_TYPE_TAG,
        )  # fmt: skip
        cmd = RemotingCommand.request(RequestCode.PULL_MESSAGE, header)
        try:
            answer = self.puller.pull_message(cmd, cast(Channel, peer))
            resp = answer if isinstance(answer, RemotingCommand | bytes) or answer is None else await answer
        except RequestRefused as e:
            raise _refusal(e.code, e.remark) from None
        assert isinstance(resp, RemotingCommand)  # a pull is always answered, and never with a ready frame
        if resp.code not in _ANSWERED:
            raise _refusal(resp.code, resp.remark)
        next_offset = resp.read_header(PullMessageResponseHeader).next_begin_offset
        if resp.code == ResponseCode.PULL_OFFSET_MOVED:
            yield svc.PullMessageResponse(status=status(Code.ILLEGAL_OFFSET, f"offset {request.offset} is outside "
                                                                            f"the queue; pull from {next_offset}"))
        elif resp.code != ResponseCode.SUCCESS:
            yield svc.PullMessageResponse(status=status(Code.MESSAGE_NOT_FOUND, "no new message"))
        else:
            yield svc.PullMessageResponse(status=status())
            body, pos = resp.body, 0
            while pos < len(body):
                rec = records.decode_record(body, pos)
                pos += rec.total_size
                message = convert.to_message(rec, "", 0)
                message.topic.CopyFrom(namespaces.resource(message.topic.name))
                message.system_properties.delivery_attempt = rec.reconsume_times + 1
                yield svc.PullMessageResponse(message=message)
        yield svc.PullMessageResponse(next_offset=next_offset)

    def update_offset(self, group: str, tc: tp.TopicConfig, request: svc.UpdateOffsetRequest) -> None:
        qid = self._queue(tc, request.message_queue)
        if request.offset < 0:
            raise ProxyError(Code.ILLEGAL_OFFSET, f"offset {request.offset} is negative")
        self.broker.offsets.commit(group, tc.topic_name, qid, request.offset)

    def get_offset(self, group: str, tc: tp.TopicConfig, request: svc.GetOffsetRequest) -> int:
        offset = self.broker.offsets.query(group, tc.topic_name, self._queue(tc, request.message_queue))
        if offset < 0:
            raise ProxyError(Code.OFFSET_NOT_FOUND, f"group {group} has no offset for {tc.topic_name} queue "
                                                    f"{request.message_queue.id}")  # fmt: skip
        return offset

    async def query_offset(self, tc: tp.TopicConfig, request: svc.QueryOffsetRequest) -> int:
        """BEGINNING: the queue's first offset (in the tier too, as GET_MIN_OFFSET); END: the one after its last
        message; TIMESTAMP: SEARCH_OFFSET_BY_TIMESTAMP's answer, the first message stored at or after the time (the
        last message for a later time)."""
        store, topic = self.broker.store, tc.topic_name
        qid = self._queue(tc, request.message_queue)
        policy = request.query_offset_policy
        if policy == pb.BEGINNING:
            return await tier_reads.min_offset(self.broker, topic, qid, store.get_min_offset_in_queue(topic, qid))
        if policy == pb.END:
            return store.get_max_offset_in_queue(topic, qid)
        if policy == pb.TIMESTAMP:
            if not request.HasField("timestamp"):
                raise ProxyError(Code.BAD_REQUEST, "query offset by TIMESTAMP without a timestamp")
            ms = request.timestamp.seconds * 1000 + request.timestamp.nanos // 1_000_000
            local = store.get_offset_in_queue_by_time(topic, qid, ms)
            return await tier_reads.offset_by_time(self.broker, topic, qid, ms, False, local)
        raise ProxyError(Code.BAD_REQUEST, f"query offset policy {policy} is unknown")
