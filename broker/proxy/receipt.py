"""Receipt handles: what a received message is acked, renewed or dead-lettered by.

The layout is RocketMQ 5's (``ExtraInfoUtil`` plus the proxy's ``ReceiptHandle``): space-separated
``ckQueueOffset popTime invisibleTime reviveQueueId topicType brokerName queueId queueOffset commitLogOffset``.
``ckQueueOffset`` is the offset of the message's checkpoint in the revive queue (``pop``), ``topicType`` is 0 for
the subscribed topic and 1 for the group's retry topic (``%RETRY%<group>``).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.proxy.status import Code, ProxyError

NORMAL_TOPIC = 0
RETRY_TOPIC = 1
_FIELDS = 9


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    ck_offset: int
    pop_time: int  # ms
    invisible_ms: int
    revive_qid: int
    topic_type: int
    broker_name: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int

    @property
    def next_visible(self) -> int:
        return self.pop_time + self.invisible_ms

    def encode(self) -> str:
        return (f"{self.ck_offset} {self.pop_time} {self.invisible_ms} {self.revive_qid} {self.topic_type} "
                f"{self.broker_name} {self.queue_id} {self.queue_offset} {self.commitlog_offset}")  # fmt: skip


def decode(text: str, broker_name: str) -> ReceiptHandle:
    """The handle in ``text``; INVALID_RECEIPT_HANDLE when it is malformed or names another broker."""
    parts = text.split(" ")
    if len(parts) != _FIELDS:
        raise ProxyError(Code.INVALID_RECEIPT_HANDLE, f"receipt handle {text!r}: expected {_FIELDS} fields")
    try:
        nums = [int(p) for i, p in enumerate(parts) if i != 5]
    except ValueError:
        raise ProxyError(Code.INVALID_RECEIPT_HANDLE, f"receipt handle {text!r}: a field is not a number") from None
    ck, pop_time, invisible, revive_qid, kind, queue_id, queue_offset, cl_offset = nums
    handle = ReceiptHandle(ck, pop_time, invisible, revive_qid, kind, parts[5], queue_id, queue_offset, cl_offset)
    if handle.broker_name != broker_name:
        raise ProxyError(Code.INVALID_RECEIPT_HANDLE,
                         f"receipt handle is from broker {handle.broker_name}, this is {broker_name}")  # fmt: skip
    if handle.topic_type not in (NORMAL_TOPIC, RETRY_TOPIC) or min(nums) < 0:
        raise ProxyError(Code.INVALID_RECEIPT_HANDLE, f"receipt handle {text!r}: a field is out of range")
    return handle
