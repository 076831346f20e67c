"""The one check of a send (``AbstractSendMessageProcessor.msgCheck``), shared by every path that stores a sent
message: SEND_MESSAGE, SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE (their fast paths too, and the gRPC proxy's send,
which goes through them), a transaction's half message, and CONSUMER_SEND_MSG_BACK's target; and the one place
a sent record's sys flag gets its topic's MULTI_TAG bit.

In RocketMQ's order: the broker writable (NO_PERMISSION), the topic's name (``store.names``: SYSTEM_ERROR as
``TopicValidator`` answers it; a topic no send may name, NO_PERMISSION), the topic (created as a send creates it,
else TOPIC_NOT_EXIST), writable (NO_PERMISSION), the queue id within the topic's queues (SYSTEM_ERROR), then the
body within maxMessageSize (MESSAGE_ILLEGAL, which Java's store answers).
"""

from __future__ import annotations

from broker.remoting.codes import ResponseCode
from broker.remoting.errors import RequestRefused
from broker.remoting.headers import SendMessageRequestHeader
from broker.remoting.protocol.topic import FLAG_UNIT
from broker.server import topics as tp
from broker.server.context import BrokerContext
from store import names
from store.format import records

_NAMES_CACHED = 4096  # topic names whose verdict is remembered (the check runs on every send)
_UNSEEN = object()  # a topic name with no verdict remembered


def record_sys_flag(tc: tp.TopicConfig, sys_flag: int) -> int:
    """A sent record's sys flag: the client's, with MULTI_TAGS_FLAG when its topic's filter type is MULTI_TAG."""
    return sys_flag | records.MULTI_TAGS_FLAG if tc.topic_filter_type == "MULTI_TAG" else sys_flag


class SendCheck:
    """``msgCheck`` against one broker's settings and topics (see the module's docstring)."""

    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        # topic name -> None when a send may name it, else (the answer's code, its remark)
        self._names: dict[str, tuple[int, str] | None] = {}

    def broker_writable(self) -> None:
        """NO_PERMISSION while the broker's permission takes no writes."""
        b = self.broker
        if not tp.is_writeable(b.config.broker_permission):
            raise RequestRefused(ResponseCode.NO_PERMISSION, f"broker {b.config.broker_name} is not writable")

    def topic_writable(self, tc: tp.TopicConfig) -> None:
        if not tp.is_writeable(tc.perm):
            raise RequestRefused(ResponseCode.NO_PERMISSION, f"topic {tc.topic_name} is not writable")

    def target(
        self, topic: str, queue_id: int, body_len: int | None, create: SendMessageRequestHeader | None = None
    ) -> tp.TopicConfig | None:
        """The topic a send of ``body_len`` bytes (None: a batch, whose messages' bodies are checked one by one
        with :meth:`body`) to ``topic``'s queue ``queue_id`` stores into, raising ``RequestRefused`` with
        RocketMQ's answer when it may not.  A topic that does not exist is created as the header ``create`` asks
        (a ``%RETRY%`` topic as its group's); without one (the fast paths, which create nothing) the answer is
        None."""
        # Each refusal is raised by the method that says it; the checks are also made here first, so a send that
        # passes (nearly every one, on every send path) calls none of them.
        b = self.broker
        if not tp.is_writeable(b.config.broker_permission):
            self.broker_writable()
        verdict = self._names.get(topic, _UNSEEN)
        if verdict is _UNSEEN:
            verdict = self._name_verdict(topic)
        if verdict is not None:
            raise RequestRefused(*verdict)  # type: ignore[misc]
        tc = b.topics.get(topic)
        if tc is None:
            if create is None:
                return None
            if topic.startswith(tp.RETRY_GROUP_TOPIC_PREFIX):
                tc = b.create_retry_topic(topic[len(tp.RETRY_GROUP_TOPIC_PREFIX) :])
            else:
                unit = FLAG_UNIT if create.unit_mode else 0
                tc = b.topics.create_in_send(topic, create.default_topic, create.default_topic_queue_nums, unit)
            if tc is None:
                raise RequestRefused(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic} does not exist; auto-create refused")
        if not tp.is_writeable(tc.perm):
            self.topic_writable(tc)
        if queue_id >= max(tc.write_queue_nums, tc.read_queue_nums):
            raise RequestRefused(
                ResponseCode.SYSTEM_ERROR,
                f"queue {queue_id} is out of range: {tc.topic_name} has {tc.write_queue_nums} write queues",
            )
        if body_len is not None and body_len > b.store_config.max_message_size:
            self.body(body_len)
        return tc

    def plain(self, topic: str, queue_id: int, body_len: int, sys_flag: int) -> int | None:
        """The fast paths' check: the record's sys flag (:func:`record_sys_flag`) when the send passes
        :meth:`target` as it is, to an existing topic that is not a retry topic and is on disk; None hands
        anything else to the general path, which answers it."""
        try:
            tc = self.target(topic, queue_id, body_len)
        except RequestRefused:
            return None
        if tc is None or topic.startswith(tp.RETRY_GROUP_TOPIC_PREFIX) or topic in self.broker.topics.unsaved:
            return None
        return record_sys_flag(tc, sys_flag)

    def body(self, body_len: int) -> None:
        limit = self.broker.store_config.max_message_size
        if body_len > limit:
            why = f"body of {body_len} bytes exceeds maxMessageSize {limit}"
            raise RequestRefused(ResponseCode.MESSAGE_ILLEGAL, why)

    def _name_verdict(self, topic: str) -> tuple[int, str] | None:
        bad = names.topic_error(topic)
        if bad is not None:
            verdict: tuple[int, str] | None = (ResponseCode.SYSTEM_ERROR, bad)  # as msgCheck answers it
        elif names.send_forbidden(topic):
            verdict = (ResponseCode.NO_PERMISSION, names.forbidden_send_remark(topic))
        else:
            verdict = None
        if len(self._names) >= _NAMES_CACHED:
            self._names.clear()
        self._names[topic] = verdict
        return verdict
