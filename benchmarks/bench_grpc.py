"""The RocketMQ 5 gRPC endpoint against the remoting protocol, in the same run on one broker.

Run: ``.venv/bin/python -m benchmarks bench_grpc`` (or ``make bench``).  ``BENCH_SCALE`` and ``BENCH_JSON`` as in
bench_broker.

What is measured, exactly:
  * The broker is ``mqlake up`` in its own process (ASYNC_FLUSH, ``enableProxy=true``, a temporary store, free
    ports); the load generator is this process (uvloop).  1 KiB bodies with a tag, ``WINDOW`` requests in flight
    on one connection (one HTTP/2 connection for gRPC), topics of ``QUEUES`` queues.
  * Send: remoting ``Producer.send`` (broker/client, SEND_MESSAGE_V2) against gRPC ``SendMessage`` (mqlake's
    generated stubs on grpc.aio, one message per call, as the 5.x clients send), ``ROUNDS`` rounds back to back,
    each counted from the first send to the last answer.
  * Consume: a remoting ``PullConsumer`` reads its topic whole, 32 per pull, against a gRPC consumer group that
    receives 32 per ``ReceiveMessage`` and acks each batch with one ``AckMessage`` (a checkpoint per message and an
    ack record per message go to the revive log), over the same number of messages, back to back per round.
  * Floor: gRPC ``Heartbeat`` calls (no store work) in the same rounds: what one unary call costs the broker in
    grpc.aio alone, the part of a gRPC send that is not the send.
  * The figures are the medians over the rounds, and the broker's CPU microseconds per message (what a busy
    neighbour disturbs least). The official 5.x Python client is not the load generator: it is synchronous per
    call and would measure itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import tempfile
import time
from pathlib import Path

import grpc

from benchmarks.bench_broker import BrokerProcess, _n, free_port
from benchmarks.bench_store import machine
from benchmarks.bench_tx_sql92 import _create, _dispatched
from benchmarks.report import emit
from broker.client import Message, Producer, PullConsumer, PullStatus
from broker.proxy.v2 import definition_pb2 as pb
from broker.proxy.v2 import service_pb2 as svc
from broker.proxy.v2.service_pb2_grpc import MessagingServiceStub
from broker.remoting.loop import run

BODY = 1024
QUEUES = 4
WINDOW = 64
COUNT = 6_000  # messages per round and path
ROUNDS = 3
META = (("x-mq-client-id", "bench-grpc"),)


async def _timed(b: BrokerProcess, total: int, one) -> dict:
    """``one(i)`` for i < total, WINDOW at a time; messages per second and broker CPU per message."""
    budget = itertools.count()

    async def worker() -> None:
        while (i := next(budget)) < total:
            await one(i)

    cpu0, t0 = b.cpu_seconds(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(WINDOW)))
    wall, cpu = time.perf_counter() - t0, b.cpu_seconds() - cpu0
    return {"msgs_per_s": total / wall, "broker_us_per_msg": cpu / total * 1e6}


def _grpc_message(topic: str, i: int) -> svc.SendMessageRequest:
    m = pb.Message(topic=pb.Resource(name=topic), body=b"g" * BODY)
    sp = m.system_properties
    sp.message_id, sp.message_type, sp.tag = f"01BENCH{i:027d}", pb.NORMAL, "T"
    return svc.SendMessageRequest(messages=[m])


async def _pull_all(b: BrokerProcess, c: PullConsumer, topic: str, expect: int) -> dict:
    cpu0, t0 = b.cpu_seconds(), time.perf_counter()
    got = 0
    for mq in await c.fetch_queues(topic):
        offset = 0
        while True:
            r = await c.pull(mq, offset, 32, "*")
            if r.status is PullStatus.NO_NEW_MSG:
                break
            got += len(r.messages)
            offset = r.next_begin_offset
    wall, cpu = time.perf_counter() - t0, b.cpu_seconds() - cpu0
    assert got == expect, (got, expect)
    return {"msgs_per_s": got / wall, "broker_us_per_msg": cpu / got * 1e6}


async def _receive_all(b: BrokerProcess, stub: MessagingServiceStub, topic: str, group: str, expect: int) -> dict:
    req = svc.ReceiveMessageRequest(group=pb.Resource(name=group), batch_size=32,
                                    message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
                                    filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))  # fmt: skip
    req.invisible_duration.FromSeconds(60)
    req.long_polling_timeout.FromSeconds(1)
    got = 0
    cpu0, t0 = b.cpu_seconds(), time.perf_counter()
    while got < expect:
        handles = [r.message.system_properties.receipt_handle
                   async for r in stub.ReceiveMessage(req, metadata=META, timeout=10) if r.HasField("message")]
        if not handles:
            raise RuntimeError(f"{group}: {got} of {expect} received, then nothing")
        got += len(handles)
        ack = svc.AckMessageRequest(group=req.group, topic=pb.Resource(name=topic),
                                    entries=[svc.AckMessageEntry(message_id="m", receipt_handle=h) for h in handles])
        r = await stub.AckMessage(ack, metadata=META, timeout=10)
        assert r.status.code == pb.OK, r.status
    wall, cpu = time.perf_counter() - t0, b.cpu_seconds() - cpu0
    return {"msgs_per_s": got / wall, "broker_us_per_msg": cpu / got * 1e6}


async def phases(b: BrokerProcess, grpc_port: int) -> dict:
    body = b"r" * BODY
    for t in ("BenchRemoting", "BenchGrpc"):
        await _create(b, t, QUEUES)
    total = _n(COUNT)
    rounds = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel, \
            Producer("bench_remoting", b.namesrv_addr) as producer, \
            PullConsumer("bench_pull", b.namesrv_addr) as consumer:  # fmt: skip
        stub = MessagingServiceStub(channel)
        await asyncio.wait_for(channel.channel_ready(), 30)

        async def grpc_send(i: int) -> None:
            r = await stub.SendMessage(_grpc_message("BenchGrpc", i), metadata=META, timeout=10)
            assert r.status.code == pb.OK, r.status

        async def remoting_send(i: int) -> None:
            await producer.send(Message("BenchRemoting", body, tags="T"))

        async def heartbeat(i: int) -> None:
            r = await stub.Heartbeat(svc.HeartbeatRequest(client_type=pb.PRODUCER), metadata=META, timeout=10)
            assert r.status.code == pb.OK, r.status

        await _timed(b, _n(500), grpc_send)  # warm: connections, routes, the store's first segments
        await _timed(b, _n(500), remoting_send)
        for r in range(ROUNDS):
            print(f"  [round {r + 1}: remoting send / gRPC send / gRPC heartbeat / remoting pull / gRPC receive + ack]",
                  flush=True)  # fmt: skip
            remote = await _timed(b, total, remoting_send)
            grpc_sent = await _timed(b, total, grpc_send)
            floor = await _timed(b, total, heartbeat)
            # each round reads every message sent so far (warm-up included) with a new group / from offset 0, once
            # all of them are dispatched
            so_far = _n(500) + total * (r + 1)
            await _dispatched(consumer, "BenchRemoting", so_far)
            await _dispatched(consumer, "BenchGrpc", so_far)
            pulled = await _pull_all(b, consumer, "BenchRemoting", so_far)
            received = await _receive_all(b, stub, "BenchGrpc", f"bench_pop_{r}", so_far)
            rounds.append({"remoting_send": remote, "grpc_send": grpc_sent, "grpc_heartbeat": floor,
                           "remoting_pull": pulled, "grpc_receive_ack": received})
    med = statistics.median
    out: dict = {"messages_per_round": total, "rounds": ROUNDS, "window": WINDOW}
    for kind in ("remoting_send", "grpc_send", "grpc_heartbeat", "remoting_pull", "grpc_receive_ack"):
        out[kind] = {k: med(r[kind][k] for r in rounds) for k in ("msgs_per_s", "broker_us_per_msg")}
    out["send_ratio"] = med(r["grpc_send"]["msgs_per_s"] / r["remoting_send"]["msgs_per_s"] for r in rounds)
    out["consume_ratio"] = med(r["grpc_receive_ack"]["msgs_per_s"] / r["remoting_pull"]["msgs_per_s"] for r in rounds)
    return out


def print_report(r: dict) -> None:
    m = r["machine"]
    print(f"machine: {m['nproc']} cores, {m['memory_gib']} GiB, {m['cpu']}, Python {m['python']}, {m['date']}")
    print(f"BENCH_SCALE={m['bench_scale']}; 1 KiB bodies, ASYNC_FLUSH, {WINDOW} in flight on 1 connection; "
          f"medians of {ROUNDS} rounds\n")  # fmt: skip
    g = r["grpc"]
    rows = [("remoting send (SEND_MESSAGE_V2)", "remoting_send"), ("gRPC SendMessage", "grpc_send"),
            ("gRPC Heartbeat (per-call floor)", "grpc_heartbeat"),
            ("remoting pull, 32 per pull", "remoting_pull"), ("gRPC receive 32 + ack the batch", "grpc_receive_ack")]
    for label, key in rows:
        print(f"{label:<34} {g[key]['msgs_per_s']:>10,.0f} msgs/s  broker {g[key]['broker_us_per_msg']:.1f} us/msg")
    print(f"\ngRPC send / remoting send: {g['send_ratio']:.2f};  gRPC receive+ack / remoting pull: "
          f"{g['consume_ratio']:.2f}")  # fmt: skip


def main() -> dict:
    with tempfile.TemporaryDirectory(prefix="mqlake-bench-grpc-", dir="/tmp") as d:
        t0 = time.perf_counter()
        results: dict = {"machine": machine()}
        port = free_port()
        b = BrokerProcess(Path(d), extra={"enableProxy": "true", "grpcServerPort": str(port)})
        try:
            async def go() -> None:
                await b.wait_ready()
                results["grpc"] = await phases(b, port)

            run(go())
        finally:
            b.stop()
        results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_grpc", results, print_report)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
