"""PULL_MESSAGE (11) and LITE_PULL_MESSAGE (361): read a queue from an offset, filtered by tags, with long polling
(reference §7.7).  As in Java's PullMessageProcessor the two codes share one header and one path; a lite pull is
refused (NO_PERMISSION) only when ``litePullMessageEnable`` is false."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel, Handler, HandlerResult
from broker.remoting.errors import RequestRefused
from broker.remoting.headers import PullMessageRequestHeader, PullMessageResponseHeader
from broker.remoting.protocol.heartbeat import expression_tag_codes, is_tag_type
from broker.remoting.protocol.route import MASTER_ID
from broker.server import tier_reads
from broker.server import topics as tp
from broker.server.context import BrokerContext
from broker.server.filters import property_selector
from store.config import BrokerRole
from store.message_store import MAX_TRANSFER_BYTES, GetMessageResult, GetMessageStatus

log = logging.getLogger(__name__)

RecordFilter = Callable[[bytes], bool]  # a raw CommitLog record -> whether it matches

# PullSysFlag
FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4
FLAG_CLASS_FILTER = 0x8

_STATUS_CODES = {
    GetMessageStatus.FOUND: ResponseCode.SUCCESS,
    GetMessageStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.MESSAGE_WAS_REMOVING: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.OFFSET_FOUND_NULL: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetMessageStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
}


def pull_code(status: GetMessageStatus, queue_offset: int) -> int:
    if status in (GetMessageStatus.NO_MESSAGE_IN_QUEUE, GetMessageStatus.NO_MATCHED_LOGIC_QUEUE):
        # An empty (or never written) queue asked from 0 is simply "nothing yet"; from elsewhere it moved.
        return ResponseCode.PULL_NOT_FOUND if queue_offset == 0 else ResponseCode.PULL_OFFSET_MOVED
    return _STATUS_CODES[status]


def _limits(h: PullMessageRequestHeader) -> tuple[int, int]:
    """The most messages and bytes a pull may take."""
    limit = h.max_msg_nums if h.max_msg_nums > 0 else 32
    return limit, h.max_msg_bytes if h.max_msg_bytes and h.max_msg_bytes > 0 else MAX_TRANSFER_BYTES


class PullProcessor:
    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker

    def routes(self) -> dict[int, Handler]:
        return {RequestCode.PULL_MESSAGE: self.pull_message, RequestCode.LITE_PULL_MESSAGE: self.pull_message}

    def _tag_codes(self, h: PullMessageRequestHeader) -> set[int] | None:
        """The tag codes to match, from the pull's own expression or the group's registered subscription."""
        if h.sys_flag & FLAG_SUBSCRIPTION:
            if not is_tag_type(h.expression_type):
                return None  # an expression over properties (SQL92): see _record_filter
            return expression_tag_codes(h.subscription)
        info = self.broker.consumers.groups.get(h.consumer_group)
        if info is None:
            raise RequestRefused(
                ResponseCode.SUBSCRIPTION_NOT_EXIST, f"no consumer of group {h.consumer_group} is online"
            )
        sub = info.subscriptions.get(h.topic)
        if sub is None:
            raise RequestRefused(
                ResponseCode.SUBSCRIPTION_NOT_EXIST, f"{h.consumer_group} has no subscription to {h.topic}"
            )
        if sub.sub_version < h.sub_version:
            raise RequestRefused(
                ResponseCode.SUBSCRIPTION_NOT_LATEST, f"subscription of {h.consumer_group} is out of date"
            )
        return sub.tag_codes

    def _check(self, h: PullMessageRequestHeader) -> set[int] | None:
        b = self.broker
        if not tp.is_readable(b.config.broker_permission):
            raise RequestRefused(ResponseCode.NO_PERMISSION, f"broker {b.config.broker_name} is not readable")
        cfg = b.groups.find(h.consumer_group)
        if cfg is None:
            raise RequestRefused(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"no subscription group {h.consumer_group}")
        if not cfg.consume_enable:
            raise RequestRefused(ResponseCode.NO_PERMISSION, f"subscription group {h.consumer_group} may not consume")
        tc = b.topics.get(h.topic)
        if tc is None:
            raise RequestRefused(ResponseCode.TOPIC_NOT_EXIST, f"topic {h.topic} does not exist")
        if not tp.is_readable(tc.perm):
            raise RequestRefused(ResponseCode.NO_PERMISSION, f"topic {h.topic} is not readable")
        if h.queue_id < 0 or h.queue_id >= tc.read_queue_nums:
            raise RequestRefused(
                ResponseCode.SYSTEM_ERROR,
                f"queue {h.queue_id} is out of range: topic {h.topic} has {tc.read_queue_nums} read queues",
            )
        return self._tag_codes(h)

    def _record_filter(self, h: PullMessageRequestHeader) -> RecordFilter | None:
        """The SQL92 filter (``enablePropertyFilter``) of the pull's own expression or of the group's registered
        subscription, compiled once per expression; None for a TAG subscription."""
        if h.sys_flag & FLAG_SUBSCRIPTION:
            expression_type, expression = h.expression_type, h.subscription
        else:
            sub = self.broker.consumers.find_subscription(h.consumer_group, h.topic)
            if sub is None:  # _check has refused the pull already
                return None
            expression_type, expression = sub.expression_type, sub.sub_string
        if is_tag_type(expression_type):
            return None
        return property_selector(self.broker.config, expression_type or "", expression or "").matches_record

    def _read_local(
        self, h: PullMessageRequestHeader, tag_codes: set[int] | None, record_filter: RecordFilter | None = None
    ) -> GetMessageResult:
        limit, max_bytes = _limits(h)
        return self.broker.store.get_message(h.topic, h.queue_id, h.queue_offset, limit, tag_codes, max_bytes,
                                             record_filter=record_filter)  # fmt: skip

    async def _with_tier(
        self, h: PullMessageRequestHeader, tag_codes: set[int] | None, record_filter: RecordFilter | None,
        local: GetMessageResult,
    ) -> GetMessageResult:  # fmt: skip
        limit, max_bytes = _limits(h)
        return await tier_reads.pull(self.broker, h.topic, h.queue_id, h.queue_offset, local, limit, max_bytes,
                                     tag_codes, record_filter)  # fmt: skip

    async def _read(
        self, h: PullMessageRequestHeader, tag_codes: set[int] | None, record_filter: RecordFilter | None = None
    ) -> GetMessageResult:
        return await self._with_tier(h, tag_codes, record_filter, self._read_local(h, tag_codes, record_filter))

    def _arrival_filter(self, h: PullMessageRequestHeader, record_filter: RecordFilter) -> Callable[[int], bool]:
        """Whether the message that made a queue's end ``next_offset`` matches: a parked SQL92 pull wakes only
        for one that does (``PullRequestHoldService`` runs the filter on arrival too)."""

        def accept(next_offset: int) -> bool:
            found = self.broker.store.get_message(h.topic, h.queue_id, next_offset - 1, 1, record_filter=record_filter)
            return found.status == GetMessageStatus.FOUND

        return accept

    def _suggest_broker(self, group: str, result: GetMessageResult) -> int:
        """``suggestWhichBrokerId``: with slaveReadEnable, a reader far behind is sent to the group's
        whichBrokerWhenConsumeSlowly (a slave), any other to the group's brokerId; without it, the master."""
        if not self.broker.config.slave_read_enable:
            return MASTER_ID
        cfg = self.broker.groups.find(group, create=False)
        if cfg is None:
            return MASTER_ID
        return cfg.which_broker_when_consume_slowly if result.suggest_pulling_from_slave else cfg.broker_id

    def pull_message(self, cmd: RemotingCommand, conn: Channel) -> HandlerResult:
        """A refusal (RequestRefused) and a bad header are answered by the remoting layer.  A pull the local store
        answers at once (messages found, or none and no park) is answered here, without a task: on a busy queue
        that is most pulls, and a task would wait for the loop's next pass (traced at 20 k msgs/s: every pull
        round trip crossed that pass).  A pull that parks, or reads the tier, goes on as a coroutine."""
        b = self.broker
        h = cmd.read_header(PullMessageRequestHeader)
        if cmd.code == RequestCode.LITE_PULL_MESSAGE and not b.config.lite_pull_message_enable:
            raise RequestRefused(
                ResponseCode.NO_PERMISSION, f"the broker[{b.config.broker_ip1}] for lite pull consumer is forbidden"
            )
        if self._replica_without_config(h):
            return self._pull_after_learning(cmd, h)
        return self._pull(cmd, h)

    def _replica_without_config(self, h: PullMessageRequestHeader) -> bool:
        """A slave asked for a topic its replicated log holds a queue of, before it copied the topic's config."""
        b = self.broker
        return (
            b.store_config.broker_role == BrokerRole.SLAVE
            and b.topics.get(h.topic) is None
            and b.store.find_consume_queue(h.topic, h.queue_id, create=False) is not None
        )

    async def _pull_after_learning(self, cmd: RemotingCommand, h: PullMessageRequestHeader) -> RemotingCommand:
        await self.broker.learn_topic(h.topic)  # still unknown afterwards: _check answers TOPIC_NOT_EXIST
        answer = self._pull(cmd, h)
        return answer if isinstance(answer, RemotingCommand) else await answer

    def _pull(
        self, cmd: RemotingCommand, h: PullMessageRequestHeader
    ) -> RemotingCommand | Coroutine[Any, Any, RemotingCommand]:
        b = self.broker
        tag_codes = self._check(h)
        record_filter = self._record_filter(h)
        local = self._read_local(h, tag_codes, record_filter)
        if tier_reads.pull_falls_through(b, h.topic, h.queue_id, h.queue_offset, local):
            return self._pull_from_tier(cmd, h, tag_codes, record_filter, local)
        return self._answer_or_park(cmd, h, tag_codes, record_filter, local)

    async def _pull_from_tier(
        self, cmd: RemotingCommand, h: PullMessageRequestHeader, tag_codes: set[int] | None,
        record_filter: RecordFilter | None, local: GetMessageResult,
    ) -> RemotingCommand:  # fmt: skip
        result = await self._with_tier(h, tag_codes, record_filter, local)
        answer = self._answer_or_park(cmd, h, tag_codes, record_filter, result)
        return answer if isinstance(answer, RemotingCommand) else await answer

    def _answer_or_park(
        self, cmd: RemotingCommand, h: PullMessageRequestHeader, tag_codes: set[int] | None,
        record_filter: RecordFilter | None, result: GetMessageResult,
    ) -> RemotingCommand | Coroutine[Any, Any, RemotingCommand]:  # fmt: skip
        """The answer to ``result``, or, for nothing found and a pull that may wait, the coroutine that parks it."""
        b = self.broker
        code = pull_code(result.status, h.queue_offset)
        # As RocketMQ: a slave keeps the offsets it copies from its master, not those pulls carry
        if h.sys_flag & FLAG_COMMIT_OFFSET and h.commit_offset >= 0 and b.store_config.broker_role != BrokerRole.SLAVE:
            b.offsets.commit(h.consumer_group, h.topic, h.queue_id, h.commit_offset)
        if code == ResponseCode.PULL_NOT_FOUND and h.sys_flag & FLAG_SUSPEND and not b.stopping:
            return self._park(cmd, h, tag_codes, record_filter)
        return self._response(cmd, h, result, code)

    async def _park(
        self, cmd: RemotingCommand, h: PullMessageRequestHeader, tag_codes: set[int] | None,
        record_filter: RecordFilter | None,
    ) -> RemotingCommand:  # fmt: skip
        b = self.broker
        timeout_ms = h.suspend_timeout_millis if b.config.long_polling_enable else b.config.short_polling_time_mills
        accept = None if record_filter is None else self._arrival_filter(h, record_filter)
        await b.hold.wait(h.topic, h.queue_id, h.queue_offset, tag_codes, timeout_ms / 1000, accept)
        result = await self._read(h, tag_codes, record_filter)
        return self._response(cmd, h, result, pull_code(result.status, h.queue_offset))

    def _response(
        self, cmd: RemotingCommand, h: PullMessageRequestHeader, result: GetMessageResult, code: int
    ) -> RemotingCommand:
        b = self.broker
        slave = b.store_config.broker_role == BrokerRole.SLAVE
        if result.status == GetMessageStatus.FOUND:
            b.stats.got(h.topic, h.consumer_group, len(result.messages), result.buffer_total_size)
        else:
            b.stats.missed()
        header = PullMessageResponseHeader(
            suggest_which_broker_id=self._suggest_broker(h.consumer_group, result),
            next_begin_offset=result.next_begin_offset,
            min_offset=result.min_offset,
            max_offset=result.max_offset,
        )
        if slave and not b.config.slave_read_enable:
            # RocketMQ 4.9: a slave serves reads only with slaveReadEnable; the client is sent to the master
            code, header.suggest_which_broker_id = ResponseCode.PULL_RETRY_IMMEDIATELY, MASTER_ID
        body = b"".join(result.messages) if code == ResponseCode.SUCCESS else b""
        return cmd.response(code, result.status.value, header, body)
