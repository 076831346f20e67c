"""The send hot path's shortcuts give exactly what the generic code gives: the V2 header read straight into the
V1 fields, the inline (task-free) ASYNC_FLUSH answer, the hand-written response extFields, and SYNC_FLUSH still
answering only after the group commit."""

from __future__ import annotations

import inspect
import time

import pytest

from broker.remoting import headers as h
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.errors import HeaderError
from broker.remoting.protocol.topic import TopicConfig
from broker.server.send import SendProcessor
from store.format import msgid, properties
from store.format.records import MULTI_TAGS_FLAG, TRANSACTION_PREPARED_TYPE, decode_record
from tests.live_broker import records

FULL_V2 = {
    "a": "pg", "b": "Fast", "c": "TBW102", "d": "4", "e": "2", "f": "0", "g": "1795000000000", "h": "7",
    "i": "KEYS\x01k1\x02UNIQ_KEY\x01ABC\x02", "j": "3", "k": "true", "l": "16", "m": "false", "n": "broker-a",
}  # fmt: skip


@pytest.mark.unit
@pytest.mark.parametrize(
    "ext",
    [
        FULL_V2,
        {k: FULL_V2[k] for k in "abcdefgh"},  # only the required fields
        {**FULL_V2, "k": "TRUE", "m": "1"},  # Boolean.parseBoolean: case-insensitive "true"; "1" is false
        {**FULL_V2, "d": " 4", "e": "+2", "unknown": "x"},  # what Python's int accepts; unknown keys ignored
    ],
)
def test_read_v1_equals_the_generic_parse(ext: dict[str, str]) -> None:
    assert h.SendMessageRequestHeaderV2.read_v1(ext) == h.SendMessageRequestHeaderV2.from_ext(ext).to_v1()


@pytest.mark.unit
@pytest.mark.parametrize(
    ("ext", "message"),
    [
        ({k: v for k, v in FULL_V2.items() if k != "d"}, "the custom field <d> is null"),
        ({**FULL_V2, "e": "two"}, "the custom field <e> of SendMessageRequestHeaderV2 is not a valid int: 'two'"),
        ({**FULL_V2, "j": ""}, "the custom field <j> of SendMessageRequestHeaderV2 is not a valid int: ''"),
    ],
)
def test_read_v1_raises_the_generic_header_error(ext: dict[str, str], message: str) -> None:
    with pytest.raises(HeaderError) as e:
        h.SendMessageRequestHeaderV2.read_v1(ext)
    assert str(e.value) == message


class _Peer:
    """What SendProcessor reads from a connection: the peer address (it becomes the record's born host)."""

    remote_addr = "127.0.0.1:5555"
    remote_host = ("127.0.0.1", 5555)


def _request(topic: str, body: bytes, uniq: str) -> RemotingCommand:
    v1 = h.SendMessageRequestHeader(
        producer_group="pg", topic=topic, default_topic="TBW102", default_topic_queue_nums=4, queue_id=1,
        sys_flag=0, born_timestamp=int(time.time() * 1000), flag=0,
        properties=properties.encode_properties({"UNIQ_KEY": uniq, "TAGS": "T"}).decode(),
    )  # fmt: skip
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, h.SendMessageRequestHeaderV2.from_v1(v1), body)
    cmd.opaque = 42
    return cmd


@pytest.fixture
def live(fresh_broker):
    return fresh_broker


@pytest.mark.integration
def test_async_flush_send_is_answered_inline_with_the_stored_record(live) -> None:
    b = live()
    proc = SendProcessor(b.controller)

    async def send_twice() -> list[object]:
        # the send that auto-creates the topic waits for topics.json; the ones after it are answered inline
        created = proc.send_inline(_request("Inline", b"m0", "UNIQ0"), _Peer())
        assert not isinstance(created, RemotingCommand)
        assert (await created).code == ResponseCode.SUCCESS
        return [proc.send_inline(_request("Inline", f"m{i}".encode(), f"UNIQ{i}"), _Peer()) for i in (1, 2)]

    answers = b.run(send_twice())
    for i, resp in enumerate(answers, start=1):
        assert isinstance(resp, RemotingCommand | bytes), "ASYNC_FLUSH must answer without a coroutine"
        if isinstance(resp, bytes):  # the native fast path answers with the whole frame, length prefix first
            assert int.from_bytes(resp[:4], "big") == len(resp) - 4
            resp = RemotingCommand.decode(resp[4:])
        assert resp.code == ResponseCode.SUCCESS and resp.opaque == 42 and resp.is_response
        parsed = h.SendMessageResponseHeader.from_ext(resp.ext_fields)
        assert (parsed.queue_id, parsed.queue_offset, parsed.transaction_id) == (1, i, f"UNIQ{i}")
        assert list(resp.ext_fields) == ["msgId", "queueId", "queueOffset", "transactionId", "MSG_REGION", "TRACE_ON"]
        raw = b.controller.store.look_message_by_offset(msgid.decode_offset_msg_id(parsed.msg_id)[1])
        rec = decode_record(raw, check_crc=True)
        assert (rec.topic, rec.body, rec.queue_offset, rec.born_host) == ("Inline", f"m{i}".encode(), i,
                                                                          ("127.0.0.1", 5555))  # fmt: skip
    # and over the wire, through the registered route, the same shape comes back
    wire = b.send("Inline", b"m3", queue_id=1)
    assert wire.code == ResponseCode.SUCCESS and wire.ext_fields["queueOffset"] == "3"
    assert [r.body for r in records(b.pull("Inline", 1, 0).body)] == [b"m0", b"m1", b"m2", b"m3"]


@pytest.mark.integration
def test_refusals_are_answered_inline_too(live) -> None:
    b = live()
    proc = SendProcessor(b.controller)
    bad = _request("Refused", b"x", "U")
    del bad.ext_fields["d"]

    async def answers() -> list[object]:  # on the broker's loop, as the remoting layer calls it
        too_big = _request("Refused", b"x" * (64 * 1024 + 1), "U")
        return [proc.send_inline(bad, _Peer()), proc.send_inline(too_big, _Peer())]

    resp, big = b.run(answers())
    assert resp.code == ResponseCode.SYSTEM_ERROR and "<d>" in resp.remark
    assert big.code == ResponseCode.MESSAGE_ILLEGAL and "maxMessageSize" in big.remark
    assert b.controller.store.commitlog.max_offset == 0  # nothing was stored


@pytest.mark.integration
def test_sync_flush_send_inline_waits_for_the_group_commit(live) -> None:
    b = live(flushDiskType="SYNC_FLUSH")
    proc = SendProcessor(b.controller)

    async def send() -> tuple[bool, RemotingCommand, int]:
        pending = proc.send_inline(_request("Durable", b"on disk", "U1"), _Peer())
        is_awaitable = inspect.isawaitable(pending)
        resp = await pending
        return is_awaitable, resp, b.controller.store.commitlog.queue.flushed_offset

    is_awaitable, resp, flushed = b.run(send())
    assert is_awaitable, "SYNC_FLUSH must not answer before the group commit"
    assert resp.code == ResponseCode.SUCCESS
    offset = msgid.decode_offset_msg_id(resp.ext_fields["msgId"])[1]
    assert flushed > offset  # the record's bytes were on disk when the answer was made


@pytest.mark.integration
def test_a_half_message_is_stored_alike_by_the_fast_and_the_general_path(live) -> None:
    """A half message's record encoded in one call by the fast path is the one the general path builds
    (``half_messages.to_half``), its topic's MULTI_TAG bit included."""
    b = live()
    proc = SendProcessor(b.controller)
    props = properties.encode_properties({"UNIQ_KEY": "H1", "TAGS": "T", "TRAN_MSG": "true", "PGROUP": "pg"})

    def half(code: int) -> RemotingCommand:
        v1 = h.SendMessageRequestHeader(
            producer_group="pg", topic="TxTags", default_topic="TBW102", default_topic_queue_nums=4, queue_id=1,
            sys_flag=TRANSACTION_PREPARED_TYPE, born_timestamp=1795000000000, flag=3, properties=props.decode(),
        )  # fmt: skip
        header = h.SendMessageRequestHeaderV2.from_v1(v1) if code == RequestCode.SEND_MESSAGE_V2 else v1
        return RemotingCommand.request(code, header, b"half body")

    async def send_both() -> list[object]:  # on the broker's loop, as the remoting layer calls it
        b.controller.topics.update(TopicConfig(topic_name="TxTags", read_queue_nums=4, write_queue_nums=4,
                                               topic_filter_type="MULTI_TAG"))  # fmt: skip
        await b.controller.topics_saved()
        general = proc.send_inline(half(RequestCode.SEND_MESSAGE), _Peer())  # creates the half topic
        if not isinstance(general, RemotingCommand):
            general = await general  # type: ignore[misc]
        return [general, proc.send_inline(half(RequestCode.SEND_MESSAGE_V2), _Peer())]

    general, fast = b.run(send_both())
    assert isinstance(general, RemotingCommand) and general.code == ResponseCode.SUCCESS
    assert isinstance(fast, bytes), "a common half message is answered by the fast path's ready frame"
    stored = []
    for resp in (general, RemotingCommand.decode(fast[4:])):
        offset = msgid.decode_offset_msg_id(resp.ext_fields["msgId"])[1]
        stored.append(decode_record(b.controller.store.look_message_by_offset(offset), check_crc=True))
    shape = [(r.topic, r.queue_id, r.body, r.properties, r.flag, r.sys_flag, r.born_timestamp, r.born_host)
             for r in stored]  # fmt: skip
    assert shape[0] == shape[1]
    assert stored[1].sys_flag & MULTI_TAGS_FLAG
