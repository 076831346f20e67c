"""The message END_TRANSACTION commits: built from the half message a send just stored (``RecentHalves``, no
CommitLog read) or, when that is gone (a restart, an old half), from the CommitLog; either way the record RocketMQ's
EndTransactionProcessor writes. Checked at byte positions computed by hand from the layout (MessageDecoder), not
with the record codec under test."""

from __future__ import annotations

import struct
import zlib

import pytest

from broker.client import LocalTransactionState, Message, PullConsumer
from broker.client.transaction_producer import TransactionProducer, end_transaction_ext
from broker.remoting import headers as h
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.loop import run
from broker.server import half_messages as hm
from broker.server.send import SendProcessor
from store.format import msgid, records, transaction
from tests.test_client_broker import make_topic, pull_all

CLIENT_PROPS = (b"TAGS\x01T\x02KEYS\x01k1\x02UNIQ_KEY\x01AC11000100002A9F0000000000000001\x02"
                b"TRAN_MSG\x01true\x02PGROUP\x01pg\x02")  # fmt: skip
BODY = b"payload-" * 40
V1, V2 = -626843481, -626843477  # 0xDAA320A7, 0xDAA320AB (2-byte topic length)


def _layout(raw: bytes) -> dict[str, object]:
    """The fields of a stored record, read at positions computed from the layout: 4-byte hosts take 8 bytes with
    their port, 16-byte ones 20 (sysFlag bits 0x10 born, 0x20 store)."""
    total, magic, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts = struct.unpack_from(">iiiiiqqiq", raw)
    born_len, store_len = (20 if sys_flag & 0x10 else 8), (20 if sys_flag & 0x20 else 8)
    p = 48 + born_len
    (store_ts,) = struct.unpack_from(">q", raw, p)
    store_host, p = raw[p + 8 : p + 8 + store_len], p + 8 + store_len
    reconsume, prepared, body_len = struct.unpack_from(">iqi", raw, p)
    p += 16
    body, p = raw[p : p + body_len], p + body_len
    if magic == V2:
        topic_len, p = struct.unpack_from(">h", raw, p)[0], p + 2
    else:
        topic_len, p = raw[p], p + 1
    topic, p = raw[p : p + topic_len].decode(), p + topic_len
    (props_len,) = struct.unpack_from(">h", raw, p)
    assert total == len(raw) == p + 2 + props_len
    return {"magic": magic, "crc": crc, "queue_id": queue_id, "flag": flag, "queue_offset": queue_offset,
            "physical_offset": phys, "sys_flag": sys_flag, "born_timestamp": born_ts,
            "born_host": raw[48 : 48 + born_len], "store_timestamp": store_ts, "store_host": store_host,
            "reconsume_times": reconsume, "prepared_transaction_offset": prepared, "body": body, "topic": topic,
            "properties": raw[p + 2 : p + 2 + props_len]}  # fmt: skip


def assert_commit_of(committed: bytes, half: bytes, topic: str, queue_id: int) -> None:
    """``committed`` is the real message of the half message ``half`` (both as stored), as Java writes it."""
    got, was = _layout(committed), _layout(half)
    assert (got["topic"], got["queue_id"]) == (topic, queue_id)
    assert got["magic"] == (V2 if len(topic.encode()) > 127 else V1)
    assert got["sys_flag"] == (was["sys_flag"] & ~0xC) | 0x8  # TRANSACTION_COMMIT_TYPE, every other bit kept
    assert got["prepared_transaction_offset"] == was["physical_offset"]
    assert got["crc"] == zlib.crc32(got["body"]) & 0x7FFFFFFF
    for kept in ("body", "flag", "born_timestamp", "born_host", "store_host", "reconsume_times", "properties"):
        assert got[kept] == was[kept], kept


def _sent_half(born_host: tuple[str, int], store_host: tuple[str, int], topic: str) -> records.MessageRecord:
    """A half message as the general send path builds it and the store fills it in: offsets and store time set."""
    sent = records.MessageRecord(
        topic=topic, queue_id=3, body=BODY, properties=CLIENT_PROPS + b"CLUSTER\x01DefaultCluster\x02", flag=5,
        sys_flag=records.TRANSACTION_PREPARED_TYPE | records.MULTI_TAGS_FLAG | records.COMPRESSED_FLAG,
        born_timestamp=1_700_000_000_123, born_host=born_host, reconsume_times=2,
    )  # fmt: skip
    half = hm.to_half(sent)
    half.store_host, half.store_timestamp = store_host, 1_700_000_000_456
    half.queue_offset, half.physical_offset = 7, 0x1_0000_2000  # past 4 GiB: the PREPARED offset takes 8 bytes
    return half


def _appended(record: bytes) -> bytes:
    """``record`` with what the append fills in (queue offset, physical offset, store time) zeroed."""
    out = bytearray(record)
    records.patch_record(out, 0, 0, 0, 0)
    return bytes(out)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("born_host", "store_host"),
    [(("10.0.0.1", 4321), ("127.0.0.1", 10911)), (("fe80::1", 4321), ("127.0.0.1", 10911)),
     (("10.0.0.1", 4321), ("::1", 10911)), (("2001:db8::7", 1), ("2001:db8::8", 2))],
)  # fmt: skip
@pytest.mark.parametrize("real_topic", ["Orders", "L" * 200])  # over 127 bytes: the V2 record format
def test_the_commit_of_a_remembered_half_equals_the_commit_of_the_stored_one(born_host, store_host, real_topic, twin):
    half = _sent_half(born_host, store_host, real_topic)
    stored = records.encode_record(half)
    # what the send fast path encodes and remembers: the same record before the append filled it in
    remembered, uniq, props = transaction.encode_half(real_topic, 3, BODY, CLIENT_PROPS, 5, half.sys_flag | 0x4,
                                                      1_700_000_000_123, born_host, store_host, 2, "DefaultCluster")
    assert remembered == _appended(stored) and uniq == "AC11000100002A9F0000000000000001"
    assert props == half.properties
    assert hm.real_target(records.decode_record(stored)) == (real_topic, 3)
    from_memory = transaction.commit_record(remembered, real_topic, 3, half.physical_offset)
    from_log = transaction.commit_record(stored, real_topic, 3, half.physical_offset)
    assert _appended(from_memory) == _appended(from_log)
    assert_commit_of(from_log, stored, real_topic, 3)


@pytest.mark.unit
def test_recent_halves_are_bounded_by_count_bytes_and_age() -> None:
    def half(offset: int, size: int = 10, stored: int = 1000) -> hm.StoredHalf:
        return hm.StoredHalf(b"x" * size, physical_offset=offset, queue_offset=0, store_timestamp=stored,
                             born_timestamp=0)  # fmt: skip

    recent = hm.RecentHalves(max_count=3, max_bytes=100)
    for offset in (10, 20, 30, 40):
        recent.add(half(offset))
    assert len(recent) == 3 and recent.get(10, 0) is None and recent.get(20, 0) is not None  # the oldest went
    recent.add(half(50, size=85))  # 10 + 10 + 10 + 85 > 100 bytes: the oldest go until it fits
    assert len(recent) == 2 and recent.get(30, 0) is None and recent.get(40, 0) is not None
    assert recent.get(50, stored_after_ms=999) is not None
    assert recent.get(50, stored_after_ms=1000) is None and len(recent) == 1  # too old: dropped, read from the log
    recent.discard(40)
    recent.discard(40)  # twice: no error
    assert len(recent) == 0
    recent.add(half(60, size=100))
    assert len(recent) == 1


async def _view(client: RemotingClient, addr: str, offset: int) -> bytes:
    cmd = RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, h.ViewMessageRequestHeader(offset=offset))
    resp = await client.invoke(addr, cmd)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return resp.body


@pytest.mark.integration
def test_a_broker_commits_remembered_and_restarted_half_messages_as_java_does(mqlake_server_factory) -> None:
    server = mqlake_server_factory()
    topic, keys = "tx_commit_bytes", [f"k{i}" for i in range(6)]
    unknown, commit = LocalTransactionState.UNKNOW, LocalTransactionState.COMMIT_MESSAGE

    async def go() -> None:
        await make_topic(server, topic, queues=4)
        async with TransactionProducer("pg_tx_bytes", server.namesrv_addr, lambda m: unknown) as p:
            sent = []
            for k in keys:  # the first ones committed at once, the last one ended only after a restart
                msg = Message(topic, f"body-{k}" * 50, tags="T", keys=k, properties={"color": "red"})
                sent.append(await p.send_in_transaction(msg, lambda m, r, k=k: unknown if k == keys[-1] else commit))
        server.restart()  # nothing remembered now: the last END_TRANSACTION reads its half from the CommitLog
        last = sent[-1].send_result
        _host, last_offset = msgid.decode_offset_msg_id(last.offset_msg_id)
        ext = end_transaction_ext("pg_tx_bytes", last.queue_offset, last_offset, int(commit), False, last.msg_id,
                                  last.transaction_id)  # fmt: skip
        client = RemotingClient()
        try:
            end = RemotingCommand.request(RequestCode.END_TRANSACTION, oneway=True, ext=ext)
            await client.invoke_oneway(server.broker_addr, end)
            async with PullConsumer("cg_tx_bytes", server.namesrv_addr) as c:
                got = [m for msgs in (await pull_all(c, topic, len(keys))).values() for m in msgs]
            assert sorted(m.keys for m in got) == keys
            for r in sent:
                m = next(m for m in got if m.msg_id == r.send_result.msg_id)
                _host, half_offset = msgid.decode_offset_msg_id(r.send_result.offset_msg_id)
                half = await _view(client, server.broker_addr, half_offset)
                committed = await _view(client, server.broker_addr, m.commit_log_offset)
                assert_commit_of(committed, half, topic, r.send_result.queue.queue_id)
                assert _layout(committed)["queue_offset"] == m.queue_offset
        finally:
            await client.close()

    run(go())


class _Peer:
    """What SendProcessor reads from a connection: the peer address (it becomes the record's born host)."""

    remote_addr = "127.0.0.1:5555"
    remote_host = ("127.0.0.1", 5555)


def _half_request(code: int, topic: str, queue_id: int, uniq: str, born: int) -> RemotingCommand:
    v1 = h.SendMessageRequestHeader(
        producer_group="pg_fast", topic=topic, default_topic="TBW102", default_topic_queue_nums=4, queue_id=queue_id,
        sys_flag=records.TRANSACTION_PREPARED_TYPE, born_timestamp=born, flag=3,
        properties=(b"TAGS\x01T\x02KEYS\x01k\x02WAIT\x01true\x02UNIQ_KEY\x01" + uniq.encode()
                    + b"\x02TRAN_MSG\x01true\x02PGROUP\x01pg_fast\x02").decode(),
    )  # fmt: skip
    header = h.SendMessageRequestHeaderV2.from_v1(v1) if code == RequestCode.SEND_MESSAGE_V2 else v1
    cmd = RemotingCommand.request(code, header, b"half-body" * 20)
    cmd.opaque = 7
    return cmd


@pytest.mark.integration
def test_a_half_message_sent_by_the_fast_path_is_stored_as_the_general_path_stores_it(fresh_broker) -> None:
    b = fresh_broker()
    proc = SendProcessor(b.controller)
    born = 1_700_000_000_999

    async def send() -> tuple[object, object]:
        # the first half creates the topic and the half topic (the general path, waiting for topics.json)
        first = proc.send_inline(_half_request(RequestCode.SEND_MESSAGE, "TxFast", 2, "U0", born), _Peer())
        assert not isinstance(first, RemotingCommand | bytes)
        assert (await first).code == ResponseCode.SUCCESS
        fast = proc.send_inline(_half_request(RequestCode.SEND_MESSAGE_V2, "TxFast", 2, "U1", born), _Peer())
        general = proc.send_inline(_half_request(RequestCode.SEND_MESSAGE, "TxFast", 2, "U1", born), _Peer())
        return fast, general

    fast, general = b.run(send())
    assert isinstance(fast, bytes), "an ASYNC_FLUSH half message is answered by the fast path's ready frame"
    assert isinstance(general, RemotingCommand)
    fast_resp = RemotingCommand.decode(fast[4:])
    answers = [fast_resp.ext_fields, general.ext_fields]
    assert fast_resp.code == general.code == ResponseCode.SUCCESS and fast_resp.opaque == 7
    assert [list(a) for a in answers] == [["msgId", "queueId", "queueOffset", "transactionId", "MSG_REGION",
                                           "TRACE_ON"]] * 2  # fmt: skip
    assert [(a["queueId"], a["queueOffset"], a["transactionId"]) for a in answers] == [("2", "1", "U1"),
                                                                                      ("2", "2", "U1")]  # fmt: skip
    stored = []
    for a in answers:
        _host, offset = msgid.decode_offset_msg_id(a["msgId"])
        raw = b.controller.store.look_message_by_offset(offset)
        assert raw is not None
        fields = _layout(raw)
        assert fields["topic"] == hm.HALF_TOPIC and fields["physical_offset"] == offset
        same = bytearray(raw)  # what the append fills in (queue offset, physical offset, store time) aside
        records.patch_record(same, 0, 0, 0, 0)
        stored.append(bytes(same))
        half = records.decode_record(raw)
        assert hm.real_target(half) == ("TxFast", 2) and half.property_map["__transactionId__"] == "U1"
    assert stored[0] == stored[1]
    _host, fast_offset = msgid.decode_offset_msg_id(answers[0]["msgId"])
    remembered = b.controller.recent_halves.get(fast_offset, 0)
    stored_raw = b.controller.store.look_message_by_offset(fast_offset)
    assert remembered is not None and stored_raw is not None
    assert remembered.raw == _appended(stored_raw)  # the record as encoded, before the append filled it in
    assert (remembered.physical_offset, remembered.queue_offset) == (fast_offset, 1)
    assert remembered.properties == _layout(stored_raw)["properties"]


@pytest.mark.integration
def test_an_end_transaction_awaiting_its_answer_commits_once_and_a_repeat_is_refused(mqlake_server_factory) -> None:
    """The put made at once (an END_TRANSACTION that wants a response) writes the record the deferred run does; a
    second one for the same half is answered SYSTEM_ERROR and delivers nothing."""
    server = mqlake_server_factory()
    topic, unknown = "tx_commit_answered", LocalTransactionState.UNKNOW

    async def go() -> None:
        await make_topic(server, topic, queues=2)
        async with TransactionProducer("pg_tx_answered", server.namesrv_addr, lambda m: unknown) as p:
            sent = (await p.send_in_transaction(Message(topic, "answered" * 30, tags="T", keys="k"),
                                                lambda m, r: unknown)).send_result  # fmt: skip
        _host, half_offset = msgid.decode_offset_msg_id(sent.offset_msg_id)
        ext = end_transaction_ext("pg_tx_answered", sent.queue_offset, half_offset,
                                  int(LocalTransactionState.COMMIT_MESSAGE), False, sent.msg_id, sent.transaction_id)
        client = RemotingClient()
        try:
            answers = [await client.invoke(server.broker_addr, RemotingCommand.request(RequestCode.END_TRANSACTION,
                                                                                       ext=ext)) for _ in range(2)]
            assert [a.code for a in answers] == [ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR]
            assert answers[1].remark == "The transaction is already resolved"
            async with PullConsumer("cg_tx_answered", server.namesrv_addr) as c:
                got = [m for msgs in (await pull_all(c, topic, 1)).values() for m in msgs]
            assert [m.keys for m in got] == ["k"]
            committed = await _view(client, server.broker_addr, got[0].commit_log_offset)
            assert_commit_of(committed, await _view(client, server.broker_addr, half_offset), topic,
                             sent.queue.queue_id)  # fmt: skip
        finally:
            await client.close()

    run(go())
