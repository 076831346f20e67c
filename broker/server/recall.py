"""RECALL_MESSAGE (370): take back a 5.x timer message before it is delivered, as RocketMQ 5.4's
``RecallMessageProcessor``.

A send whose message is parked as a timer message answers a *recall handle* (``SendMessageResponseHeader
.recallHandle``, gRPC ``SendResultEntry.recall_handle``): the URL-safe base64 (padded, as Java's
``Base64.getUrlEncoder``) of ``v1 <topic> <broker name> <delivery ms> <message id>`` joined by single spaces,
where the delivery time is the stored ``TIMER_OUT_MS`` + 1 and the message id its ``UNIQ_KEY``.  A recall writes
a *delete mark*: a message to the same topic with ``TIMER_DEL_UNIQKEY`` = that message id and ``TIMER_DELIVER_MS``
= that time, which the store parks in the timer topic beside the message; the timer service then delivers
neither (``store.schedule.TimerMessageService``).

Answers, as Java's: without ``recallMessageEnable`` (off by default) NO_PERMISSION; a handle that does not
decode, names another topic or broker, or a time already past (the message was delivered) or beyond
``timerMaxDelaySec`` is ILLEGAL_OPERATION; an unknown topic TOPIC_NOT_EXIST; a slave SLAVE_NOT_AVAILABLE.  A recall
of a message that was never a timer message, or was already recalled, is accepted and changes nothing (the broker
keeps no record of which ids are parked).
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from dataclasses import dataclass

from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.connection import Channel, Handler
from broker.remoting.errors import HeaderError
from broker.remoting.headers import RecallMessageRequestHeader, RecallMessageResponseHeader
from broker.server.context import BrokerContext
from store.config import BrokerRole
from store.constants import RECALL_MESSAGE_TAG
from store.format import msgid, records
from store.format import properties as P

log = logging.getLogger(__name__)

_VERSION = "v1"
_SEPARATOR = " "
_INVALID = "recall handle is invalid"  # DecoderException's message, the remark for any handle that does not decode


@dataclass(frozen=True)
class RecallHandle:
    """``RecallMessageHandle.HandleV1``: where a timer message waits and under which id."""

    topic: str
    broker_name: str
    timestamp: str  # the delivery time in ms, as text (Java keeps the string and parses it when it checks it)
    message_id: str

    def encode(self) -> str:
        raw = _SEPARATOR.join((_VERSION, self.topic, self.broker_name, self.timestamp, self.message_id))
        return base64.urlsafe_b64encode(raw.encode("utf-8")).decode("ascii")

    @classmethod
    def decode(cls, handle: str) -> RecallHandle:
        """Raises ValueError (:data:`_INVALID`) for anything Java's ``decodeHandle`` refuses."""
        if not handle:
            raise ValueError(_INVALID)
        # Java's URL decoder: a character outside the URL-safe alphabet fails ("+" and "/" too, which altchars
        # would let through); the padding may be left out
        raw = handle.encode("utf-8")
        if b"+" in raw or b"/" in raw:
            raise ValueError(_INVALID)
        try:
            decoded = base64.b64decode(raw + b"=" * (-len(raw) % 4), altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(_INVALID) from None
        parts = decoded.decode("utf-8", "replace").split(_SEPARATOR)
        if len(parts) < 5 or parts[0] != _VERSION:
            raise ValueError(_INVALID)
        return cls(parts[1], parts[2], parts[3], parts[4])


def send_recall_handle(stored: records.MessageRecord, broker_name: str) -> str | None:
    """The handle a send's answer carries for ``stored`` (the record as the put wrote it): only for a message the
    put parked as a timer message, not for a retry topic's (``SendMessageProcessor.attachRecallHandle``)."""
    props = stored.property_map
    out_ms, topic = props.get(P.PROPERTY_TIMER_OUT_MS), props.get(P.PROPERTY_REAL_TOPIC)
    uniq = props.get(P.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    if out_ms is None or topic is None or uniq is None or topic.startswith("%RETRY%"):
        return None
    try:
        timestamp = str(int(out_ms) + 1)
    except ValueError:
        return None
    return RecallHandle(topic, broker_name, timestamp, uniq).encode()


class RecallProcessor:
    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker

    def routes(self) -> dict[int, Handler]:
        return {RequestCode.RECALL_MESSAGE: self.recall_message}

    async def recall_message(self, cmd: RemotingCommand, conn: Channel) -> RemotingCommand:
        try:
            h = RecallMessageRequestHeader.from_ext(cmd.ext_fields)
        except HeaderError as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(e))
        code, remark, msg_id = await self.recall(h.topic, h.recall_handle, conn.remote_addr)
        header = RecallMessageResponseHeader(msg_id=msg_id) if code == ResponseCode.SUCCESS else None
        return cmd.response(code, remark, header)

    async def recall(self, topic: str, handle: str, peer: str) -> tuple[int, str | None, str]:
        """(response code, remark, the recalled message id); the gRPC RecallMessage's path as well."""
        b = self.broker
        if not b.config.recall_message_enable:
            return ResponseCode.NO_PERMISSION, "recall failed, operation is forbidden", ""
        if b.store_config.broker_role == BrokerRole.SLAVE:
            return ResponseCode.SLAVE_NOT_AVAILABLE, "recall failed, broker service not available", ""
        if b.topics.get(topic) is None:
            return ResponseCode.TOPIC_NOT_EXIST, f"recall failed, the topic[{topic}] not exist", ""
        try:
            h = RecallHandle.decode(handle)
        except ValueError as e:
            return ResponseCode.ILLEGAL_OPERATION, str(e), ""
        if h.topic != topic:
            return ResponseCode.ILLEGAL_OPERATION, "recall failed, topic not match", ""
        if h.broker_name != b.config.broker_name:
            return ResponseCode.ILLEGAL_OPERATION, "recall failed, broker service not available", ""
        try:
            deliver_ms = int(h.timestamp)
        except ValueError:
            deliver_ms = -1  # NumberUtils.toLong's default: refused below as a time past
        now = int(time.time() * 1000)
        if deliver_ms < now or deliver_ms - now > b.store_config.timer_max_delay_sec * 1000:
            return ResponseCode.ILLEGAL_OPERATION, "recall failed, timestamp invalid", ""
        result = await b.put([self._mark(h, now)])
        if not result.ok:
            log.warning("recall of %s in %s from %s not written: %s", h.message_id, topic, peer,
                        result.error or result.status)  # fmt: skip
            return ResponseCode.SYSTEM_ERROR, result.error or str(result.status.value), ""
        return ResponseCode.SUCCESS, None, h.message_id

    def _mark(self, h: RecallHandle, now_ms: int) -> records.MessageRecord:
        """The delete mark (``RecallMessageProcessor.buildMessage``); the put parks it in the timer topic.  The
        key is the bare message id: ``appendTopicForTimerDeleteKey`` is false by default and mqlake has no such
        option."""
        props = {
            P.PROPERTY_TAGS: RECALL_MESSAGE_TAG,
            P.PROPERTY_TIMER_DEL_UNIQKEY: h.message_id,
            P.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: h.message_id,
            P.PROPERTY_TIMER_DELIVER_MS: h.timestamp,
        }
        host = msgid.parse_host_string(self.broker.config.broker_addr)
        return records.MessageRecord(topic=h.topic, queue_id=0, body=b"0", properties=P.encode_properties(props),
                                     born_timestamp=now_ms, born_host=host)  # fmt: skip
