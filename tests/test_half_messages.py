"""The half/op record transformations of broker/server/half_messages.py, checked field by field against what
RocketMQ's TransactionalMessageBridge and EndTransactionProcessor write."""

from __future__ import annotations

import pytest

from broker.server import half_messages as hm
from store.format import properties, records, transaction

pytestmark = pytest.mark.unit

CLIENT_PROPS = (b"TAGS\x01T\x02KEYS\x01k1\x02UNIQ_KEY\x01AC11000100002A9F0000000000000001\x02"
                b"TRAN_MSG\x01true\x02PGROUP\x01pg\x02")


def _stored(rec: records.MessageRecord, physical_offset: int, queue_offset: int) -> records.MessageRecord:
    """As the store hands it back: encoded with its offsets, decoded."""
    rec.physical_offset, rec.queue_offset = physical_offset, queue_offset
    return records.decode_record(records.encode_record(rec))


def test_half_message_keeps_the_client_bytes_and_adds_the_real_address() -> None:
    sent = records.MessageRecord(topic="Orders", queue_id=3, body=b"b", properties=CLIENT_PROPS, sys_flag=0x4 | 0x1)
    half = hm.to_half(sent)
    assert (half.topic, half.queue_id) == ("RMQ_SYS_TRANS_HALF_TOPIC", 0)
    assert half.sys_flag == 0x1  # PREPARED reset to NOT_TYPE, the compression bit kept
    assert half.properties == (CLIENT_PROPS + b"__transactionId__\x01AC11000100002A9F0000000000000001\x02"
                               b"REAL_TOPIC\x01Orders\x02REAL_QID\x013\x02")  # fmt: skip
    assert hm.real_target(half) == ("Orders", 3)


def test_commit_re_puts_the_real_message_with_the_half_offset() -> None:
    half = _stored(hm.to_half(records.MessageRecord(topic="Orders", queue_id=3, body=b"body", properties=CLIENT_PROPS,
                                                    sys_flag=0x4, born_timestamp=1234, reconsume_times=2)),
                   physical_offset=4096, queue_offset=7)  # fmt: skip
    final = records.decode_record(transaction.commit_record(records.encode_record(half), "Orders", 3, 4096))
    assert (final.topic, final.queue_id, final.body) == ("Orders", 3, b"body")
    assert final.sys_flag == records.TRANSACTION_COMMIT_TYPE
    assert final.prepared_transaction_offset == 4096
    assert (final.born_timestamp, final.reconsume_times) == (1234, 2)
    assert final.properties == half.properties  # Java builds the string before it clears REAL_TOPIC and TRAN_MSG


@pytest.mark.expected_errors("op message at .* ignored")
def test_op_message_and_its_offsets() -> None:
    op = _stored(hm.op_record([7, 12], "ID", ("127.0.0.1", 10911), 99), physical_offset=0, queue_offset=0)
    assert (op.topic, op.queue_id, op.body, op.tags) == ("RMQ_SYS_TRANS_OP_HALF_TOPIC", 0, b"7,12", "d")
    assert hm.op_offsets(op) == [7, 12]
    single = records.MessageRecord(topic=hm.OP_TOPIC, queue_id=0, body=b"5",
                                   properties=properties.encode_properties({"TAGS": "d"}))  # fmt: skip
    assert hm.op_offsets(single) == [5]  # 4.x's one offset
    wrong = records.MessageRecord(topic=hm.OP_TOPIC, queue_id=0, body=b"5",
                                  properties=properties.encode_properties({"TAGS": "x"}))  # fmt: skip
    assert hm.op_offsets(wrong) == []


def test_a_re_put_copy_remembers_its_origin_and_resolving_either_resolves_both() -> None:
    first = _stored(hm.to_half(records.MessageRecord(topic="Orders", queue_id=0, body=b"b", properties=CLIENT_PROPS)),
                    physical_offset=0, queue_offset=4)  # fmt: skip
    copy = _stored(hm.renewed(first, 1), physical_offset=500, queue_offset=9)
    again = _stored(hm.renewed(copy, 2), physical_offset=900, queue_offset=15)
    assert hm.origin_offset(first) == 4 and hm.origin_offset(copy) == 4 and hm.origin_offset(again) == 4
    assert hm.check_times(first) == 0 and hm.check_times(copy) == 1 and hm.check_times(again) == 2
    resolved = hm.ResolvedHalves()
    assert not resolved.is_resolved(again)
    resolved.add([9, 4])  # what END_TRANSACTION for the copy at 9 writes
    assert resolved.is_resolved(first) and resolved.is_resolved(copy) and resolved.is_resolved(again)
    resolved.prune_below(5)  # offset 4's segment deleted
    assert 4 not in resolved and 9 in resolved
