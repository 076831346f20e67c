"""Remoting layer: frame codec against hand-assembled bytes, typed headers, server and client on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import socket
import struct

import pytest

from broker.remoting import headers as h
from broker.remoting.client import RemotingClient, RemotingConnectError, RemotingTimeoutError
from broker.remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, RequestCode, ResponseCode, SerializeType
from broker.remoting.command import FrameError, HeaderError, RemotingCommand
from broker.remoting.server import Connection, RemotingServer
from tests.aio import async_test, poll

# The frame codec runs on both twins (store.format.native): the pure-Python reference and the compiled one.
pytestmark = pytest.mark.usefixtures("twin")


def json_frame(header: bytes, body: bytes = b"", serialize: int = 0) -> bytes:
    """A frame assembled from the documented layout: length, type<<24|headerLen, header, body."""
    prefix = struct.pack(">iI", 4 + len(header) + len(body), serialize << 24 | len(header))
    return prefix + header + body


def binary_header(code, language, version, opaque, flag, remark: bytes | None, ext: list[tuple[bytes, bytes]]) -> bytes:
    out = struct.pack(">h", code) + bytes([language]) + struct.pack(">h", version) + struct.pack(">i", opaque)
    out += struct.pack(">i", flag)
    out += struct.pack(">i", len(remark or b"")) + (remark or b"")
    entries = b"".join(struct.pack(">h", len(k)) + k + struct.pack(">i", len(v)) + v for k, v in ext)
    return out + struct.pack(">i", len(entries)) + entries


# --- codec ---------------------------------------------------------------------------------------------------------


@pytest.mark.unit
def test_json_frame_decodes_and_reencodes_byte_for_byte():
    header = (
        b'{"code":310,"extFields":{"a":"PG","b":"Orders","d":"4"},"flag":0,"language":"JAVA",'
        b'"opaque":7,"serializeTypeCurrentRPC":"JSON","version":401}'
    )
    frame = json_frame(header, b"hello")
    assert frame[4] == 0 and int.from_bytes(frame[5:8], "big") == len(header)

    cmd = RemotingCommand.decode(frame[4:])
    assert (cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag) == (310, "JAVA", 401, 7, 0)
    assert cmd.remark is None and cmd.ext_fields == {"a": "PG", "b": "Orders", "d": "4"} and cmd.body == b"hello"
    assert cmd.serialize_type == SerializeType.JSON
    assert not cmd.is_response and not cmd.is_oneway
    assert cmd.encode() == frame


@pytest.mark.unit
def test_json_response_with_remark_and_non_ascii():
    header = (
        '{"code":1,"extFields":{},"flag":1,"language":"JAVA","opaque":2147483647,'
        '"remark":"topic[é] not exist","serializeTypeCurrentRPC":"JSON","version":409}'
    ).encode()
    frame = json_frame(header)
    cmd = RemotingCommand.decode(frame[4:])
    assert cmd.is_response and not cmd.is_oneway and cmd.opaque == 2**31 - 1
    assert cmd.remark == "topic[é] not exist"
    assert cmd.encode() == frame


@pytest.mark.unit
def test_rocketmq_binary_frame_decodes_and_reencodes_byte_for_byte():
    header = binary_header(
        11, 3, 409, 42, FLAG_ONEWAY, "bad ä".encode(), [(b"consumerGroup", b"G1"), (b"queueId", b"3")]
    )
    frame = json_frame(header, b"\x00\x01body", serialize=1)
    assert frame[4] == 1  # serialize-type byte

    cmd = RemotingCommand.decode(frame[4:])
    assert (cmd.code, cmd.language, cmd.version, cmd.opaque) == (11, "PYTHON", 409, 42)
    assert cmd.is_oneway and not cmd.is_response
    assert cmd.remark == "bad ä" and cmd.ext_fields == {"consumerGroup": "G1", "queueId": "3"}
    assert cmd.body == b"\x00\x01body" and cmd.serialize_type == SerializeType.ROCKETMQ
    assert cmd.encode() == frame


@pytest.mark.unit
def test_rocketmq_binary_null_remark_and_no_ext():
    header = binary_header(0, 0, 401, 9, FLAG_RESPONSE, None, [])
    frame = json_frame(header, serialize=1)
    cmd = RemotingCommand.decode(frame[4:])
    assert cmd.is_response and cmd.remark is None and cmd.ext_fields == {} and cmd.language == "JAVA"
    assert cmd.encode() == frame


@pytest.mark.unit
def test_header_length_uses_24_bits():
    big = "x" * 70_000  # header longer than 16 bits
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE, ext={"k": big}, body=b"B")
    for st in SerializeType:
        cmd.serialize_type = st
        frame = cmd.encode()
        (word,) = struct.unpack(">I", frame[4:8])
        assert word >> 24 == st and (word & 0xFFFFFF) == len(frame) - 8 - 1 > 0xFFFF
        back = RemotingCommand.decode(frame[4:])
        assert back.ext_fields["k"] == big and back.body == b"B"


@pytest.mark.unit
def test_lenient_json_shapes_from_other_clients():
    # numbers and booleans as JSON values, language as a number, no remark/version/flag, an unquoted integer key
    header = b'{"code":"34","language":9,"opaque":"5","extFields":{"queueId":3,"unitMode":false,0:"x"}}'
    cmd = RemotingCommand.decode(json_frame(header)[4:])
    assert (cmd.code, cmd.language, cmd.opaque, cmd.version, cmd.flag) == (34, "GO", 5, 0, 0)
    assert cmd.ext_fields == {"queueId": "3", "unitMode": "false", "0": "x"}
    header = b'{"code":10,"extFields":null,"language":"CPP","remark":null}'
    cmd = RemotingCommand.decode(json_frame(header)[4:])
    assert cmd.ext_fields == {} and cmd.remark is None and cmd.language == "CPP"


@pytest.mark.unit
@pytest.mark.parametrize(
    "payload, message",
    [
        (b"\x00\x00", "shorter than"),
        (struct.pack(">I", 100) + b"{}", "header length 100 is larger than the frame"),
        (struct.pack(">I", 5 << 24 | 2) + b"{}", "unknown serialize type 5"),
        (struct.pack(">I", 4) + b"{no}", "unparsable JSON header"),
        (struct.pack(">I", 2) + b"[]", "not an object"),
        (struct.pack(">I", 10) + b'{"flag":0}', "no 'code'"),
        (struct.pack(">I", 1 << 24 | 3) + b"abc", "shorter than its fixed part"),
        (struct.pack(">I", 1 << 24 | 21) + binary_header(1, 0, 1, 1, 0, None, [])[:13] + struct.pack(">ii", 99, 0),
         "remark length 99"),
        (struct.pack(">I", 1 << 24 | 27) + binary_header(1, 0, 1, 1, 0, None, [])[:17] + struct.pack(">ihi", 6, 50, 0),
         "extFields entry at byte 21"),
    ],
)
def test_malformed_frames_raise_frame_error(payload, message):
    with pytest.raises(FrameError, match=message):
        RemotingCommand.decode(payload)


@pytest.mark.unit
def test_request_and_response_flags_and_types():
    req = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, oneway=True, ext={"x": "1"})
    assert req.is_oneway and not req.is_response and req.flag == FLAG_ONEWAY
    req.opaque = 77
    req.serialize_type = SerializeType.ROCKETMQ
    resp = req.response(ResponseCode.TOPIC_NOT_EXIST, "no route", ext={"a": "b"})
    assert resp.opaque == 77 and resp.flag == FLAG_RESPONSE and resp.is_response
    assert resp.serialize_type == SerializeType.ROCKETMQ and resp.code == 17 and resp.remark == "no route"
    assert RemotingCommand.decode(resp.encode()[4:]) == resp


# --- headers -------------------------------------------------------------------------------------------------------


@pytest.mark.unit
def test_header_round_trip_and_java_keys():
    hdr = h.PullMessageRequestHeader(
        consumer_group="G", topic="T", queue_id=1, queue_offset=2**40, max_msg_nums=32, sys_flag=6,
        commit_offset=0, suspend_timeout_millis=15000, sub_version=123,
    )
    ext = hdr.to_ext()
    assert ext == {
        "consumerGroup": "G", "topic": "T", "queueId": "1", "queueOffset": str(2**40), "maxMsgNums": "32",
        "sysFlag": "6", "commitOffset": "0", "suspendTimeoutMillis": "15000", "subVersion": "123",
    }
    assert h.PullMessageRequestHeader.from_ext({**ext, "unknownKey": "zzz"}) == hdr
    cmd = RemotingCommand.request(RequestCode.PULL_MESSAGE, hdr)
    assert RemotingCommand.decode(cmd.encode()[4:]).read_header(h.PullMessageRequestHeader) == hdr
    assert h.UnregisterClientRequestHeader(client_id="c@1").to_ext() == {"clientID": "c@1"}
    assert h.RegisterBrokerRequestHeader.from_ext(
        {"brokerName": "b", "brokerAddr": "a:1", "clusterName": "c", "haServerAddr": "a:2", "brokerId": "0",
         "compressed": "TRUE", "bodyCrc32": "-5"}
    ).body_crc32 == -5


@pytest.mark.unit
def test_header_errors_name_the_java_field():
    with pytest.raises(HeaderError, match=r"the custom field <consumerGroup> is null"):
        h.QueryConsumerOffsetRequestHeader.from_ext({"topic": "T", "queueId": "0"})
    with pytest.raises(HeaderError, match=r"<queueId> .* not a valid int: 'x'"):
        h.QueryConsumerOffsetRequestHeader.from_ext({"consumerGroup": "G", "topic": "T", "queueId": "x"})
    # Java Boolean.parseBoolean: anything but "true" (any case) is false, never an error
    hdr = h.GetRouteInfoRequestHeader.from_ext({"topic": "T", "acceptStandardJsonOnly": "yes"})
    assert hdr.accept_standard_json_only is False


@pytest.mark.unit
def test_send_header_v2_maps_to_v1():
    v2 = h.SendMessageRequestHeaderV2.from_ext(
        {"a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "2", "f": "0", "g": "1700000000000", "h": "0",
         "i": "TAGS\x01x\x02", "j": "0", "k": "false", "l": "16", "m": "false", "n": "broker-a"}
    )
    v1 = v2.to_v1()
    assert (v1.producer_group, v1.topic, v1.queue_id, v1.born_timestamp, v1.max_reconsume_times) == (
        "PG", "T", 2, 1700000000000, 16)
    assert v1.broker_name == "broker-a" and v1.unit_mode is False and v1.batch is False
    assert h.SendMessageRequestHeaderV2.from_v1(v1) == v2


# --- server --------------------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serving(handlers: dict[int, object], **kwargs):
    server = RemotingServer("127.0.0.1", 0, **kwargs)
    for code, handler in handlers.items():
        server.register(code, handler)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace=1.0)


async def echo(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
    return cmd.response(ResponseCode.SUCCESS, body=cmd.body, ext=cmd.ext_fields)


async def read_frame(reader: asyncio.StreamReader, timeout: float = 5.0) -> RemotingCommand:
    length = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), timeout))[0]
    return RemotingCommand.decode(await asyncio.wait_for(reader.readexactly(length), timeout))


@pytest.mark.integration
@async_test
async def test_slow_handler_does_not_block_fast_one_on_same_connection():
    release = asyncio.Event()

    async def slow(cmd, conn):
        await release.wait()
        return cmd.response(body=b"slow")

    async with serving({1: slow, 2: echo}) as server:
        client = RemotingClient()
        addr = f"127.0.0.1:{server.port}"
        slow_call = asyncio.ensure_future(client.invoke(addr, RemotingCommand.request(1), timeout=5))
        fast = await client.invoke(addr, RemotingCommand.request(2, body=b"fast"), timeout=5)
        assert fast.body == b"fast" and not slow_call.done()
        assert len(server.connections) == 1
        release.set()
        assert (await slow_call).body == b"slow"
        await client.close()


@pytest.mark.integration
@pytest.mark.expected_errors("handler for .* failed")  # a handler raises on purpose
@async_test
async def test_oneway_is_never_answered_even_when_handler_returns_or_raises():
    seen: list[str] = []

    async def answers(cmd, conn):
        seen.append("answers")
        return cmd.response(body=b"should not be sent")

    async def raises(cmd, conn):
        seen.append("raises")
        raise RuntimeError("boom")

    def sync_answers(cmd, conn):
        seen.append("sync")
        return cmd.response(body=b"should not be sent either")

    async with serving({1: answers, 2: raises, 3: echo, 4: sync_answers}) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        for code, opaque in ((1, 100), (2, 101), (4, 104), (99, 102)):  # 99: unknown code, still no answer
            cmd = RemotingCommand.request(code, oneway=True)
            cmd.opaque = opaque
            writer.write(cmd.encode())
        probe = RemotingCommand.request(3, body=b"probe")
        probe.opaque = 103
        writer.write(probe.encode())
        first = await read_frame(reader)
        assert first.opaque == 103 and first.body == b"probe"
        assert sorted(seen) == ["answers", "raises", "sync"]
        writer.close()


@pytest.mark.integration
@pytest.mark.expected_errors("handler for .* failed")  # a handler raises on purpose
@async_test
async def test_unknown_code_header_error_exception_and_sync_handlers():
    async def needs_header(cmd, conn):
        cmd.read_header(h.GetRouteInfoRequestHeader)
        return cmd.response()

    async def fails(cmd, conn):
        raise ValueError("disk on fire")

    def sync_fails(cmd, conn):
        cmd.read_header(h.PullMessageRequestHeader)

    def sync_echo(cmd, conn):  # a plain function: answered inline, without a task
        return cmd.response(body=b"sync " + cmd.body)

    async with serving({5: needs_header, 6: fails, 7: echo, 8: sync_fails, 9: sync_echo}) as server:
        client = RemotingClient()
        addr = f"127.0.0.1:{server.port}"
        r = await client.invoke(addr, RemotingCommand.request(4242))
        assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "4242" in r.remark
        r = await client.invoke(addr, RemotingCommand.request(5))
        assert r.code == ResponseCode.SYSTEM_ERROR and "the custom field <topic> is null" in r.remark
        r = await client.invoke(addr, RemotingCommand.request(6))
        assert r.code == ResponseCode.SYSTEM_ERROR and "disk on fire" in r.remark
        r = await client.invoke(addr, RemotingCommand.request(8))
        assert r.code == ResponseCode.SYSTEM_ERROR and "<consumerGroup> is null" in r.remark
        r = await client.invoke(addr, RemotingCommand.request(9, body=b"x"))
        assert r.code == ResponseCode.SUCCESS and r.body == b"sync x"
        r = await client.invoke(addr, RemotingCommand.request(7, body=b"still up"))
        assert r.body == b"still up" and len(server.connections) == 1
        await client.close()


@pytest.mark.integration
@async_test
async def test_response_uses_the_request_serialize_type():
    async with serving({7: echo}) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        req = RemotingCommand.request(7, ext={"k": "v"}, body=b"bin")
        req.opaque, req.serialize_type = 5, SerializeType.ROCKETMQ
        writer.write(req.encode())
        head = await asyncio.wait_for(reader.readexactly(8), 5)
        assert head[4] == SerializeType.ROCKETMQ
        rest = await asyncio.wait_for(reader.readexactly(struct.unpack(">i", head[:4])[0] - 4), 5)
        resp = RemotingCommand.decode(head[4:] + rest)
        assert resp.is_response and resp.opaque == 5 and resp.ext_fields == {"k": "v"} and resp.body == b"bin"
        writer.close()


MALFORMED = {
    # a plausible length, then noise: the noise makes the serialize type / header length invalid
    "random bytes": struct.pack(">i", 60) + random.Random(1).randbytes(60),
    "2 GiB length prefix": struct.pack(">I", 0x80000000) + b"\x00" * 16,
    "length over max frame": struct.pack(">i", 16 * 1024 * 1024 + 1) + b"\x00" * 16,
    "length below 4": struct.pack(">i", 2) + b"\x00\x00",
    "header length larger than frame": struct.pack(">iI", 8, 500) + b"abcd",
    "unknown serialize type": json_frame(b"{}", serialize=7),
    "unparsable JSON header": json_frame(b"{not json"),
}


@pytest.mark.integration
@pytest.mark.parametrize("name", list(MALFORMED))
@async_test
async def test_malformed_frame_closes_only_that_connection(name):
    async with serving({7: echo}) as server:
        client = RemotingClient()
        addr = f"127.0.0.1:{server.port}"
        assert (await client.invoke(addr, RemotingCommand.request(7, body=b"a"))).body == b"a"
        good = await client.connection(addr)

        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(MALFORMED[name])
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b"", "server must close the offending connection"
        writer.close()

        assert (await client.invoke(addr, RemotingCommand.request(7, body=b"b"))).body == b"b"
        assert await client.connection(addr) is good and not good.closed
        await client.close()


@pytest.mark.integration
@async_test
async def test_truncated_frame_then_close_is_dropped_quietly():
    async with serving({7: echo}) as server:
        client = RemotingClient()
        addr = f"127.0.0.1:{server.port}"
        await client.invoke(addr, RemotingCommand.request(7))
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(RemotingCommand.request(7, body=b"x" * 1000).encode()[:500])
        await writer.drain()
        await poll(lambda: len(server.connections) == 2, what="second connection accepted")
        writer.close()
        await poll(lambda: len(server.connections) == 1, what="truncated connection closed")
        assert (await client.invoke(addr, RemotingCommand.request(7, body=b"ok"))).body == b"ok"
        await client.close()


@pytest.mark.integration
@async_test
async def test_large_frame_and_small_max_frame():
    async with serving({7: echo}) as server:
        client = RemotingClient()
        body = os.urandom(4 * 1024 * 1024)
        r = await client.invoke(f"127.0.0.1:{server.port}", RemotingCommand.request(7, body=body), timeout=10)
        assert r.body == body
        await client.close()
    async with serving({7: echo}, max_frame=1024) as server:
        client = RemotingClient()
        addr = f"127.0.0.1:{server.port}"
        assert (await client.invoke(addr, RemotingCommand.request(7, body=b"x" * 900))).body == b"x" * 900
        with pytest.raises(RemotingConnectError):
            await client.invoke(addr, RemotingCommand.request(7, body=b"x" * 2000))
        await client.close()


@pytest.mark.integration
@async_test
async def test_in_flight_limit_stops_reading_until_answers_leave():
    release = asyncio.Event()
    started: list[int] = []

    async def blocked(cmd, conn):
        started.append(cmd.opaque)
        await release.wait()
        return cmd.response(body=cmd.body)

    async with serving({1: blocked, 7: echo}, max_in_flight_per_connection=2) as server:
        client = RemotingClient()
        addr = f"127.0.0.1:{server.port}"
        calls = [asyncio.ensure_future(client.invoke(addr, RemotingCommand.request(1, body=bytes([i])), timeout=10))
                 for i in range(5)]
        await poll(lambda: len(started) == 2, what="two handlers started")
        # a round trip on another connection proves the server had time to read the rest
        other = RemotingClient()
        await other.invoke(addr, RemotingCommand.request(7))
        await other.close()
        assert len(started) == 2
        release.set()
        assert [(await c).body for c in calls] == [bytes([i]) for i in range(5)]
        assert len(started) == 5
        await client.close()


@pytest.mark.integration
@async_test
async def test_full_write_buffer_stops_reading_requests():
    answered = 0
    big = b"r" * (256 * 1024)  # a few dozen answers overflow the socket buffers and the 4 MiB high-water mark

    async def large(cmd, conn):
        nonlocal answered
        answered += 1
        return cmd.response(body=big)

    async with serving({1: large, 7: echo}) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)

        def paused() -> bool:
            return any(c._reading_paused for c in server.connections)

        def send(opaque: int) -> None:
            req = RemotingCommand.request(1)
            req.opaque = opaque
            writer.write(req.encode())

        sent = 0
        while not paused():  # we read nothing, so the answers back up until the server stops reading
            assert sent < 2000, "the server never stopped reading"
            send(sent)
            sent += 1
            await poll(lambda n=sent: answered == n or paused(), what="request handled or reading paused")
        before = answered
        for _ in range(50):
            send(sent)
            sent += 1
        other = RemotingClient()  # round trips elsewhere give the server every chance to read the 50
        for _ in range(3):
            await other.invoke(f"127.0.0.1:{server.port}", RemotingCommand.request(7))
        await other.close()
        assert answered == before < sent
        opaques = [(await read_frame(reader, timeout=10)).opaque for _ in range(sent)]
        assert sorted(opaques) == list(range(sent)) and answered == sent
        writer.close()


@pytest.mark.integration
@async_test
async def test_server_invokes_and_notifies_the_client_on_its_channel():
    got: list[RemotingCommand] = []

    async def client_side(cmd, conn):
        got.append(cmd)
        return cmd.response(body=b"client says " + cmd.body)

    async def heartbeat(cmd, conn):
        await conn.send_oneway(RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                                       h.NotifyConsumerIdsChangedRequestHeader(consumer_group="G")))
        answer = await conn.invoke(RemotingCommand.request(RequestCode.GET_CONSUMER_RUNNING_INFO, body=b"hi"), 5)
        return cmd.response(answer.code, answer.remark, body=answer.body)

    closed: list[str] = []
    async with serving({RequestCode.HEART_BEAT: heartbeat}) as server:
        server.add_close_listener(lambda conn: closed.append(conn.remote_addr))
        client = RemotingClient(request_handler=client_side)
        r = await client.invoke(f"127.0.0.1:{server.port}", RemotingCommand.request(RequestCode.HEART_BEAT))
        assert r.body == b"client says hi"
        notify = next(c for c in got if c.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
        assert notify.is_oneway and notify.read_header(h.NotifyConsumerIdsChangedRequestHeader).consumer_group == "G"
        await client.close()
        await poll(lambda: closed, what="close listener")
        # a client without a request handler answers the server's requests with REQUEST_CODE_NOT_SUPPORTED
        bare = RemotingClient()
        r = await bare.invoke(f"127.0.0.1:{server.port}", RemotingCommand.request(RequestCode.HEART_BEAT))
        assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "307" in r.remark
        await bare.close()


@pytest.mark.integration
@async_test
async def test_stop_lets_in_flight_handlers_answer():
    release = asyncio.Event()

    async def slow(cmd, conn):
        await release.wait()
        return cmd.response(body=b"done")

    server = RemotingServer("127.0.0.1", 0)
    server.register(1, slow)
    await server.start()
    client = RemotingClient()
    call = asyncio.ensure_future(client.invoke(f"127.0.0.1:{server.port}", RemotingCommand.request(1), timeout=5))
    await poll(lambda: any(c.tasks for c in server.connections), what="handler running")
    stopping = asyncio.ensure_future(server.stop(grace=5))
    release.set()
    assert (await call).body == b"done"
    await stopping
    with pytest.raises(RemotingConnectError):
        await client.invoke(f"127.0.0.1:{server.port}", RemotingCommand.request(1), timeout=1)
    await client.close()


@pytest.mark.integration
@async_test
async def test_pipelined_invokes_are_matched_by_opaque():
    async def shuffled(cmd, conn):
        await asyncio.sleep(0 if cmd.body[0] % 2 else 0.001)  # odd ones answer first: out of order
        return cmd.response(body=cmd.body)

    async with serving({1: shuffled}) as server:
        client = RemotingClient(connections_per_addr=2)
        addr = f"127.0.0.1:{server.port}"
        bodies = [struct.pack(">i", i) for i in range(2000)]
        replies = await asyncio.gather(*(client.invoke(addr, RemotingCommand.request(1, body=b)) for b in bodies))
        assert [r.body for r in replies] == bodies
        assert len(server.connections) == 2
        await client.close()


# --- client --------------------------------------------------------------------------------------------------------


@pytest.mark.integration
@async_test
async def test_client_reconnects_after_server_restart():
    # The port stays ours while the server is down: a bound, never listening socket holds it (with SO_REUSEADDR,
    # as the server's own listener has, both may be bound while at most one listens), so no other process on the
    # host can take it between the stop and the restart, and a connection to it is refused meanwhile.
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    server = RemotingServer("127.0.0.1", port)
    server.register(7, echo)
    await server.start()
    client = RemotingClient()
    addr = f"127.0.0.1:{port}"
    assert (await client.invoke(addr, RemotingCommand.request(7, body=b"1"))).body == b"1"
    first = await client.connection(addr)
    await server.stop()
    await poll(lambda: first.closed, what="client notices the drop")
    with pytest.raises(RemotingConnectError):
        await client.invoke(addr, RemotingCommand.request(7))
    server = RemotingServer("127.0.0.1", port)
    server.register(7, echo)
    await server.start()
    assert (await client.invoke(addr, RemotingCommand.request(7, body=b"2"))).body == b"2"
    assert await client.connection(addr) is not first
    await client.close()
    await server.stop()
    holder.close()


@pytest.mark.integration
@async_test
async def test_client_timeout_then_connection_still_usable():
    release = asyncio.Event()

    async def never_in_time(cmd, conn):
        await release.wait()
        return cmd.response(body=b"late")

    async with serving({1: never_in_time, 7: echo}) as server:
        client = RemotingClient()
        addr = f"127.0.0.1:{server.port}"
        # The handler cannot answer before `release`: only the call's own timeout can end it, and it does, long
        # before a deadline 100 times as long.
        with pytest.raises(RemotingTimeoutError, match="within 0.3s"):
            await asyncio.wait_for(client.invoke(addr, RemotingCommand.request(1), timeout=0.3), 30)
        release.set()  # the late answer matches no call and is dropped
        assert (await client.invoke(addr, RemotingCommand.request(7, body=b"ok"))).body == b"ok"
        await client.close()


@pytest.mark.integration
@async_test
async def test_pending_calls_fail_at_once_when_connection_drops():
    async def hang(cmd, conn):
        await asyncio.Event().wait()

    async def drop(cmd, conn):
        conn.close()

    async with serving({1: hang, 2: drop}) as server:
        client = RemotingClient()
        addr = f"127.0.0.1:{server.port}"
        pending = [asyncio.ensure_future(client.invoke(addr, RemotingCommand.request(1), timeout=30)) for _ in range(3)]
        await poll(lambda: sum(len(c.tasks) for c in server.connections) == 3, what="three parked")
        with pytest.raises(RemotingConnectError):
            await client.invoke(addr, RemotingCommand.request(2), timeout=30)
        # failed by the dropped connection, not by their 30 s timeout (that would be a RemotingTimeoutError)
        for fut in pending:
            with pytest.raises(RemotingConnectError):
                await fut
        await client.close()


@pytest.mark.integration
@async_test
async def test_connect_refused_and_bad_address():
    client = RemotingClient(connect_timeout=2)
    with socket.socket() as s:  # bound but not listening: the port refuses, and no other process can take it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(RemotingConnectError, match=f"127.0.0.1:{port}"):
            await client.invoke(f"127.0.0.1:{port}", RemotingCommand.request(7))
    with pytest.raises(RemotingConnectError, match="bad address"):
        await client.invoke("no-port-here", RemotingCommand.request(7))
    await client.close()


@pytest.mark.unit
def test_json_header_keys_are_fastjson_order():
    cmd = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, h.GetRouteInfoRequestHeader(topic="T"))
    cmd.opaque = 3
    header = json.loads(cmd.encode()[8:])
    assert list(header) == ["code", "extFields", "flag", "language", "opaque", "serializeTypeCurrentRPC", "version"]
    assert header["extFields"] == {"topic": "T"} and header["serializeTypeCurrentRPC"] == "JSON"
