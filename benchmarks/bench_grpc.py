"""The RocketMQ 5 gRPC endpoint against the remoting protocol, in the same run on one broker.

Run: ``.venv/bin/python -m benchmarks bench_grpc`` (or ``make bench``).  ``BENCH_SCALE`` and ``BENCH_JSON`` as in
bench_broker; ``BENCH_PROFILE=1`` adds a profiled pass of each gRPC phase after the rounds (py-spy, a dev
dependency, sampling the broker's Python and native frames) and prints where the broker's CPU goes.

The three figures it is judged by, each from the same rounds (targets in parentheses):
  * gRPC SendMessage rate / remoting single-send rate (>= 0.5);
  * gRPC ReceiveMessage + AckMessage rate / remoting pull rate (>= 0.5);
  * the broker CPU of one Heartbeat call (< 50 us).

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
    neighbour disturbs least), split into the broker's event-loop thread (grpc.aio's Cython layer, the RPC's
    Python, the store put) and its other threads (gRPC core's event engine and completion-queue poller, the
    store's dispatch and flush).
  * Handlers: after the rounds, MessagingService's SendMessage, Heartbeat, ReceiveMessage and AckMessage called on
    an in-process broker without gRPC (``handler_costs``): the broker's own work in a call, the rest of its
    event-loop CPU being grpc.aio's.
  * The driver is the raw generated stubs on grpc.aio, not the official 5.x Python client (synchronous per call:
    it would measure itself).  The driver's own CPU per message is printed beside each rate: the load generator
    shares the machine's cores with the broker, so a rate is bounded by the driver's cost as much as the broker's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from benchmarks.bench_broker import BrokerProcess, _n, free_port
from benchmarks.bench_tx_sql92 import _create, _dispatched
from benchmarks.report import emit, machine
from broker.client import Message, Producer, PullConsumer, PullStatus
from broker.config import build_configs
from broker.proxy.pop import PopService
from broker.proxy.service import MessagingService
from broker.proxy.v2 import definition_pb2 as pb
from broker.proxy.v2 import service_pb2 as svc
from broker.proxy.v2.service_pb2_grpc import MessagingServiceStub
from broker.remoting.loop import run
from broker.remoting.protocol.topic import TopicConfig
from broker.server.controller import BrokerController

BODY = 1024
QUEUES = 4
WINDOW = 64
COUNT = 6_000  # messages per round and path
ROUNDS = 3
META = (("x-mq-client-id", "bench-grpc"),)
TARGET_RATIO = 0.5  # gRPC send / remoting send, gRPC receive + ack / remoting pull
TARGET_HEARTBEAT_US = 50.0  # broker CPU of one Heartbeat call
PROFILE = os.environ.get("BENCH_PROFILE", "") not in ("", "0")
PROFILE_SECONDS = 4  # whole seconds: py-spy takes no fraction
PROFILE_RATE = 250  # samples a second; py-spy pauses the broker for each one (--native), so keep it modest


class _Meter:
    """Broker CPU (all threads, and its event-loop thread), the driver's CPU and the wall time over one phase."""

    def __init__(self, b: BrokerProcess) -> None:
        self.b = b
        self.cpu0, self.loop0 = b.cpu_seconds(), b.cpu_seconds(main_thread=True)
        self.driver0, self.t0 = time.process_time(), time.perf_counter()

    def result(self, count: int) -> dict:
        wall = time.perf_counter() - self.t0
        cpu, loop = self.b.cpu_seconds() - self.cpu0, self.b.cpu_seconds(main_thread=True) - self.loop0
        return {"msgs_per_s": count / wall, "broker_us_per_msg": cpu / count * 1e6,
                "broker_loop_us_per_msg": loop / count * 1e6,
                "driver_us_per_msg": (time.process_time() - self.driver0) / count * 1e6}  # fmt: skip


async def _timed(b: BrokerProcess, total: int, one) -> dict:
    """``one(i)`` for i < total, WINDOW at a time; messages per second and broker CPU per message."""
    budget = itertools.count()

    async def worker() -> None:
        while (i := next(budget)) < total:
            await one(i)

    meter = _Meter(b)
    await asyncio.gather(*(worker() for _ in range(WINDOW)))
    return meter.result(total)


def _grpc_message(topic: str, i: int) -> svc.SendMessageRequest:
    m = pb.Message(topic=pb.Resource(name=topic), body=b"g" * BODY)
    sp = m.system_properties
    sp.message_id, sp.message_type, sp.tag = f"01BENCH{i:027d}", pb.NORMAL, "T"
    return svc.SendMessageRequest(messages=[m])


async def _pull_all(b: BrokerProcess, c: PullConsumer, topic: str, expect: int) -> dict:
    meter = _Meter(b)
    got = 0
    for mq in await c.fetch_queues(topic):
        offset = 0
        while True:
            r = await c.pull(mq, offset, 32, "*")
            if r.status is PullStatus.NO_NEW_MSG:
                break
            got += len(r.messages)
            offset = r.next_begin_offset
    assert got == expect, (got, expect)
    return meter.result(got)


async def _receive_all(b: BrokerProcess, stub: MessagingServiceStub, topic: str, group: str, expect: int) -> dict:
    req = svc.ReceiveMessageRequest(group=pb.Resource(name=group), batch_size=32,
                                    message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
                                    filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))  # fmt: skip
    req.invisible_duration.FromSeconds(60)
    req.long_polling_timeout.FromSeconds(1)
    got = 0
    meter = _Meter(b)
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
    return meter.result(got)


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
        profile = await _profile_phases(b, stub, heartbeat, grpc_send, so_far) if PROFILE else None
    med = statistics.median
    out: dict = {"messages_per_round": total, "rounds": ROUNDS, "window": WINDOW}
    for kind in KINDS:
        out[kind] = {k: med(r[kind][k] for r in rounds) for k in rounds[0][kind]}
    out["send_ratio"] = med(r["grpc_send"]["msgs_per_s"] / r["remoting_send"]["msgs_per_s"] for r in rounds)
    out["consume_ratio"] = med(r["grpc_receive_ack"]["msgs_per_s"] / r["remoting_pull"]["msgs_per_s"] for r in rounds)
    out["heartbeat_broker_us"] = out["grpc_heartbeat"]["broker_us_per_msg"]
    out["targets"] = {"send_ratio": out["send_ratio"] >= TARGET_RATIO,
                      "consume_ratio": out["consume_ratio"] >= TARGET_RATIO,
                      "heartbeat_broker_us": out["heartbeat_broker_us"] < TARGET_HEARTBEAT_US}  # fmt: skip
    if profile is not None:
        out["profile"] = profile
    return out


class _Context:
    """What the RPC handlers read of a grpc.aio call: its metadata, its peer, its deadline."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return META

    def peer(self) -> str:
        return "ipv4:127.0.0.1:50000"

    def time_remaining(self) -> float:
        return 10.0


async def handler_costs(root: Path) -> dict:
    """The RPC handlers alone, without gRPC: MessagingService's SendMessage, Heartbeat, ReceiveMessage (32 a call)
    and AckMessage called on an in-process broker, event-loop thread CPU per message.  Against the gRPC rows'
    event-loop column, it splits a call's cost between the broker's own work and grpc.aio's."""
    bc, sc = build_configs({"storePathRootDir": str(root / "handlers"), "listenPort": "0", "brokerIP1": "127.0.0.1"})
    broker = BrokerController(bc, sc)
    await broker.start()
    pop = PopService(broker)
    try:
        broker.topics.update(TopicConfig(topic_name="BenchHandlers", read_queue_nums=QUEUES, write_queue_nums=QUEUES))
        await broker.topics_saved()
        await pop.start()
        service, ctx, total = MessagingService(broker, pop), _Context(), _n(COUNT)
        sends = [_grpc_message("BenchHandlers", i) for i in range(total)]
        beat = svc.HeartbeatRequest(client_type=pb.PRODUCER)
        t0 = time.thread_time()
        for req in sends:
            r = await service.SendMessage(req, ctx)
            assert r.status.code == pb.OK, r.status
        t1 = time.thread_time()
        for _ in range(total):
            await service.Heartbeat(beat, ctx)
        t2 = time.thread_time()
        while sum(broker.store.get_max_offset_in_queue("BenchHandlers", q) for q in range(QUEUES)) < total:
            await asyncio.sleep(0.01)  # dispatched: a receive sees what the consume queues hold
        t3 = time.thread_time()
        req = svc.ReceiveMessageRequest(group=pb.Resource(name="bench_handlers"), batch_size=32,
                                        message_queue=pb.MessageQueue(topic=pb.Resource(name="BenchHandlers")),
                                        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))  # fmt: skip
        req.invisible_duration.FromSeconds(60)
        got = 0
        while got < total:
            out = [r async for r in service.ReceiveMessage(req, ctx)]
            size = sum(len(r.SerializeToString()) for r in out)  # grpc.aio serializes each answer
            handles = [r.message.system_properties.receipt_handle for r in out if r.HasField("message")]
            if not handles or not size:
                raise RuntimeError(f"handlers: {got} of {total} received, then nothing")
            got += len(handles)
            entries = [svc.AckMessageEntry(message_id="m", receipt_handle=h) for h in handles]
            ack = svc.AckMessageRequest(group=req.group, topic=req.message_queue.topic, entries=entries)
            r = await service.AckMessage(ack, ctx)
            assert r.status.code == pb.OK, r.status
        t4 = time.thread_time()
    finally:
        await pop.stop()
        await broker.shutdown()
    return {"send_us": (t1 - t0) / total * 1e6, "heartbeat_us": (t2 - t1) / total * 1e6,
            "receive_ack_us": (t4 - t3) / got * 1e6}  # fmt: skip


KINDS = ("remoting_send", "grpc_send", "grpc_heartbeat", "remoting_pull", "grpc_receive_ack")

# A sample with one of these among its innermost frames is a thread waiting (for I/O, a lock, the GIL), not working.
_IDLE = ("epoll_wait", "epoll_pwait", "PyThread_acquire_lock_timed", "SimpleQueue_get", "pthread_cond_wait",
         "pthread_cond_timedwait", "nanosleep", "sem_timedwait", "Condition.wait", "Event.wait",
         "select (")  # fmt: skip


def _where(frame: str) -> str:
    """The part of the broker a sampled innermost frame belongs to."""
    where = frame.rpartition("(")[2]
    if "cygrpc" in where or "grpc/_cython" in where:
        return "gRPC (cygrpc: grpc.aio's Cython and the C core)"
    if "libc.so" in where:
        return "libc (system calls and locks)"
    if "libpython" in where:
        return "CPython (the interpreter)"
    if "uvloop" in where or "loop.c" in where:
        return "uvloop"
    if where.startswith(("broker/", "store/")):
        return "mqlake's Python (broker/, store/)"
    if ".py:" in where:
        return "other Python (asyncio, grpc.aio's .py, protobuf's .py)"
    return "other native code (protobuf upb, libstdc++, ...)"


def summarize_profile(raw: str) -> dict:
    """py-spy's raw (collapsed, ``--threads``) stacks as shares of the broker's working samples: by part of the
    broker, by thread and by innermost frame.  py-spy samples the threads Python knows (the event loop, the
    store's threads), not gRPC core's own (their CPU is the ``broker - event loop`` column's part)."""
    parts: collections.Counter[str] = collections.Counter()
    names: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not count.isdigit() or len(frames) < 2 or any(idle in f for f in frames[-4:] for idle in _IDLE):
            continue
        n = int(count)
        names[frames[0].partition("): ")[2] or frames[0]] += n  # "thread (1234): reput"
        parts[_where(frames[-1])] += n
        leaves[frames[-1]] += n
    total = sum(parts.values()) or 1

    def shares(c: collections.Counter[str], top: int) -> list[tuple[str, float]]:
        return [(k, v / total) for k, v in c.most_common(top)]

    return {"samples": total, "parts": shares(parts, 8), "threads": shares(names, 6), "frames": shares(leaves, 12)}


async def _profile_phases(b: BrokerProcess, stub: MessagingServiceStub, heartbeat, grpc_send, readable: int) -> dict:
    """BENCH_PROFILE=1: each gRPC phase again, under py-spy for PROFILE_SECONDS (Python and native frames)."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        print("  [BENCH_PROFILE: py-spy is not installed (pip install -c constraints.txt py-spy)]", flush=True)
        return {}
    pid = b.process.pid
    out: dict = {}
    groups = (f"bench_profile_{i}" for i in itertools.count())  # each receive pass reads the topic whole again
    for label, work in [
        ("grpc_heartbeat", lambda: _timed(b, _n(1000), heartbeat)),
        ("grpc_send", lambda: _timed(b, _n(1000), grpc_send)),
        ("grpc_receive_ack", lambda: _receive_all(b, stub, "BenchGrpc", next(groups), readable)),
    ]:  # fmt: skip
        print(f"  [profile: {label}, {PROFILE_SECONDS} s under py-spy]", flush=True)
        with tempfile.NamedTemporaryFile(suffix=".txt") as f:
            cmd = [spy, "record", "--pid", str(pid), "--native", "--threads", "--format", "raw", "--rate",
                   str(PROFILE_RATE), "--duration", str(PROFILE_SECONDS), "--output", f.name]  # fmt: skip
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            while proc.poll() is None:
                await work()
            if proc.returncode != 0:
                print(f"  [py-spy failed: {proc.stderr.read().decode(errors='replace').strip()[-300:]}]"
                      if proc.stderr else "  [py-spy failed]", flush=True)  # fmt: skip
                continue
            out[label] = summarize_profile(Path(f.name).read_text())
    return out


def print_report(r: dict) -> None:
    m = r["machine"]
    print(f"machine: {m['nproc']} cores, {m['memory_gib']} GiB, {m['cpu']}, Python {m['python']}, {m['date']}")
    print(f"BENCH_SCALE={m['bench_scale']}; 1 KiB bodies, ASYNC_FLUSH, {WINDOW} in flight on 1 connection; "
          f"medians of {ROUNDS} rounds; driver: raw stubs on grpc.aio / mqlake's remoting client\n")  # fmt: skip
    g = r["grpc"]
    rows = [("remoting send (SEND_MESSAGE_V2)", "remoting_send"), ("gRPC SendMessage", "grpc_send"),
            ("gRPC Heartbeat (per-call floor)", "grpc_heartbeat"),
            ("remoting pull, 32 per pull", "remoting_pull"), ("gRPC receive 32 + ack the batch", "grpc_receive_ack")]
    print(f"{'':<34} {'msgs/s':>10}  {'broker us/msg':>13} {'(event loop)':>12}  {'driver us/msg':>13}")
    for label, key in rows:
        x = g[key]
        print(f"{label:<34} {x['msgs_per_s']:>10,.0f}  {x['broker_us_per_msg']:>13.1f} "
              f"{x['broker_loop_us_per_msg']:>12.1f}  {x['driver_us_per_msg']:>13.1f}")  # fmt: skip

    hc = r.get("handlers")
    if hc is not None:
        print(f"\nthe RPC handlers alone (in process, no gRPC), event-loop CPU: SendMessage {hc['send_us']:.1f} us, "
              f"Heartbeat {hc['heartbeat_us']:.1f} us, receive + ack {hc['receive_ack_us']:.1f} us/msg")  # fmt: skip

    def met(key: str) -> str:
        return "met" if g["targets"][key] else "NOT met"

    print(f"\ngRPC send / remoting send:            {g['send_ratio']:.2f}  "
          f"(target >= {TARGET_RATIO}: {met('send_ratio')})")  # fmt: skip
    print(f"gRPC receive+ack / remoting pull:     {g['consume_ratio']:.2f}  "
          f"(target >= {TARGET_RATIO}: {met('consume_ratio')})")  # fmt: skip
    print(f"broker CPU of one gRPC Heartbeat:     {g['heartbeat_broker_us']:.0f} us  "
          f"(target < {TARGET_HEARTBEAT_US:.0f} us: {met('heartbeat_broker_us')})")  # fmt: skip
    for label, p in g.get("profile", {}).items():
        print(f"\nprofile of {label} ({p['samples']} working samples of the broker):")
        for title, key in (("part", "parts"), ("thread", "threads"), ("innermost frame", "frames")):
            print(f"  by {title}:")
            for name, share in p[key]:
                print(f"    {share * 100:5.1f}%  {name}")


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
        print("  [the RPC handlers alone, in process, without gRPC]", flush=True)
        results["handlers"] = run(handler_costs(Path(d)))
        results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_grpc", results, print_report)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
