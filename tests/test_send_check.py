"""The one send check (``broker.server.send_check``, RocketMQ's ``msgCheck``) on a live broker: a send refused for
its broker, topic, queue or body gets the same answer code whichever path it takes (SEND_MESSAGE, the
SEND_MESSAGE_V2 fast path, a transaction's half message, SEND_BATCH_MESSAGE), and nothing is stored."""

from __future__ import annotations

import time

import pytest

from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.protocol.topic import PERM_READ, TopicConfig
from store.format import msgid, properties, records
from store.format.batch_body import BatchItem, encode_batch_body

pytestmark = pytest.mark.integration

KINDS = ("v1", "v2", "half", "batch")
MAX_BODY = 64 * 1024  # live_broker.SMALL's maxMessageSize


def _request(kind: str, topic: str, queue_id: int, body: bytes) -> tuple[int, object, bytes]:
    props = {"UNIQ_KEY": msgid.UniqKeyGenerator().next(), "TAGS": "a"}
    sys_flag = 0
    if kind == "half":
        props |= {"TRAN_MSG": "true", "PGROUP": "pg"}
        sys_flag = records.TRANSACTION_PREPARED_TYPE
    v1 = h.SendMessageRequestHeader(
        producer_group="pg", topic=topic, default_topic="TBW102", default_topic_queue_nums=4, queue_id=queue_id,
        sys_flag=sys_flag, born_timestamp=int(time.time() * 1000), flag=0,
        properties=properties.encode_properties(props).decode(),
    )  # fmt: skip
    if kind == "v1":
        return RequestCode.SEND_MESSAGE, v1, body
    if kind == "batch":
        v1.batch = True
        items = [BatchItem(0, body, b"TAGS\x01a\x02"), BatchItem(0, b"second", b"TAGS\x01b\x02")]
        return RequestCode.SEND_BATCH_MESSAGE, h.SendMessageRequestHeaderV2.from_v1(v1), encode_batch_body(items)
    return RequestCode.SEND_MESSAGE_V2, h.SendMessageRequestHeaderV2.from_v1(v1), body


def _answers(b, topic: str, queue_id: int, body: bytes) -> dict[str, int]:
    store = b.controller.store
    end = store.max_phy_offset
    codes = {kind: b.call(*_request(kind, topic, queue_id, body)).code for kind in KINDS}
    assert store.max_phy_offset == end  # nothing stored
    return codes


def test_every_send_path_gets_the_same_answer(fresh_broker):
    b = fresh_broker()
    for kind in KINDS:  # each path stores a well-formed send (the topic created by the first)
        assert b.call(*_request(kind, "Checked", 1, b"fine")).code == ResponseCode.SUCCESS, kind
    cases = {
        ("bad topic!", 0, b"x"): ResponseCode.SYSTEM_ERROR,  # TopicValidator's answer
        ("SCHEDULE_TOPIC_XXXX", 0, b"x"): ResponseCode.NO_PERMISSION,  # no send may name it
        ("Checked", 99, b"x"): ResponseCode.SYSTEM_ERROR,  # past the topic's queues
        ("Checked", 1, b"x" * (MAX_BODY + 1)): ResponseCode.MESSAGE_ILLEGAL,
    }
    for (topic, queue_id, body), code in cases.items():
        assert _answers(b, topic, queue_id, body) == dict.fromkeys(KINDS, code), topic

    read_only = TopicConfig(topic_name="ReadOnly", read_queue_nums=4, write_queue_nums=4, perm=PERM_READ)

    async def make_read_only() -> None:
        b.controller.topics.update(read_only)
        await b.controller.topics_saved()

    b.run(make_read_only())
    assert _answers(b, "ReadOnly", 0, b"x") == dict.fromkeys(KINDS, ResponseCode.NO_PERMISSION)

    b.controller.config.broker_permission = PERM_READ
    assert _answers(b, "Checked", 1, b"x") == dict.fromkeys(KINDS, ResponseCode.NO_PERMISSION)


@pytest.mark.parametrize(
    ("extra", "reconsume_times", "stored_in"),
    [
        ({"TRAN_MSG": "true"}, 0, "RMQ_SYS_TRANS_HALF_TOPIC"),
        ({"TRAN_MSG": "TRUE"}, 0, "RMQ_SYS_TRANS_HALF_TOPIC"),  # Boolean.parseBoolean ignores case
        ({"TRAN_MSG": "yes"}, 0, "Prepared"),
        # a client before 4.6.1 resends a failed transactional message with its TRAN_MSG: a delayed redelivery
        ({"TRAN_MSG": "true", "DELAY": "3"}, 1, "SCHEDULE_TOPIC_XXXX"),
    ],
)
def test_a_send_is_a_prepared_message_as_java_reads_it(fresh_broker, extra, reconsume_times, stored_in):
    b = fresh_broker()
    props = {"UNIQ_KEY": msgid.UniqKeyGenerator().next(), "PGROUP": "pg", **extra}
    v1 = h.SendMessageRequestHeader(
        producer_group="pg", topic="Prepared", default_topic="TBW102", default_topic_queue_nums=4, queue_id=0,
        sys_flag=0, born_timestamp=int(time.time() * 1000), flag=0, reconsume_times=reconsume_times,
        properties=properties.encode_properties(props).decode(),
    )  # fmt: skip
    resp = b.call(RequestCode.SEND_MESSAGE, v1, b"body")
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    offset = msgid.decode_offset_msg_id(resp.ext_fields["msgId"])[1]
    assert records.decode_record(b.controller.store.look_message_by_offset(offset)).topic == stored_in
