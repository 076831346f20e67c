"""mqlake beside Apache RocketMQ 5.4.0 itself: the same load, the same settings, one after the other in one run.

Run: ``.venv/bin/python -m benchmarks bench_peer``.  ``BENCH_SCALE`` and ``BENCH_JSON`` as in bench_broker;
``BENCH_ONLY=mqlake`` or ``rocketmq`` runs one of the two (no ratios).  Needs ``make peers`` (Apache RocketMQ's
jars) and a JDK 17.

What is measured, exactly:
  * The two: ``mqlake up`` (NameServer and broker in one process, ``enableProxy=true``) and Apache RocketMQ 5.4.0
    as ``tests/peers.py`` runs it: a NameServer JVM and the proxy in local mode with its broker in one JVM, each JVM
    with ``BENCH_JVM_OPTS`` (printed: a heap of at most 384 MiB, sized for this 2-core machine, G1, the full JIT)
    and ``JAVA_BROKER_CONF``.  Both on loopback, on a
    fresh store in /tmp, brokerName ``bench-a``, a topic of 8 queues, 1 KiB bodies, ASYNC_FLUSH; then each again
    with SYNC_FLUSH (no proxy) for the acked/s row.  Everything else is each one's default.
  * The load generator is this process and the same for both: bench_broker's raw-protocol producer (SEND_MESSAGE_V2
    and SEND_BATCH_MESSAGE frames encoded once, every answer checked to be SUCCESS) for single sends over 1 and 8
    connections, batches of 32 and SYNC_FLUSH; bench_broker's paced sender and in-process PushConsumer for the
    produce->consume p99 at 5 k and 20 k msgs/s; a PullConsumer reading the topic whole, 32 per pull, one pull at a
    time (bench_grpc's); and grpc.aio stubs for gRPC SendMessage (64 in flight, one message per call, as the 5.x
    clients send) and ReceiveMessage 32 + one AckMessage per batch, after each client has sent its settings on a
    Telemetry stream as the official clients do (RocketMQ's proxy refuses a receive from a client without them).
  * Idle: the cores used and the resident memory (VmRSS) of the server's processes (mqlake: one; Apache RocketMQ:
    NameServer + broker/proxy JVMs) over ``IDLE_SECONDS`` once the topic exists and before any load; RSS again after
    the load.  The ratios are mqlake / Apache RocketMQ: above 1 is mqlake faster for a rate, below 1 is mqlake lower
    for latency, CPU and memory.
  * Others may share the machine: each row carries the cores everything else used meanwhile (bg cpu).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from benchmarks.bench_broker import (
    BATCH,
    BATCH_COUNT,
    BATCH_WINDOW,
    BODY,
    BROKER_NAME,
    LATENCY_HIGH_RATE,
    LATENCY_RATE,
    LATENCY_SECONDS,
    QUEUES,
    RAW_FRAMES,
    SINGLE_COUNT,
    SYNC_COUNT,
    SYNC_WINDOW,
    TOPIC,
    WINDOW_1,
    WINDOW_8,
    BrokerProcess,
    _n,
    _PacedSender,
    free_port,
    latency,
    next_segment_written,
    raw_frames,
    raw_rate,
    wait_dispatched,
)
from benchmarks.bench_grpc import _pull_all
from benchmarks.report import emit, machine
from broker.client import Admin, PullConsumer
from broker.proxy.v2 import definition_pb2 as pb
from broker.proxy.v2 import service_pb2 as svc
from broker.proxy.v2.service_pb2_grpc import MessagingServiceStub
from broker.remoting.codes import RequestCode, ResponseCode
from broker.remoting.command import RemotingCommand
from broker.remoting.loop import run
from broker.remoting.protocol.body import SubscriptionGroupConfig
from tests.peers import JVM_OPTS, JavaCluster

PEER = "rocketmq-5"
# The tests' JVM options (heap up to 384 MiB, direct memory 256 MiB) with the collector and JIT of a server: G1, as
# RocketMQ's runbroker.sh has it, and the full tiered JIT (the tests stop at C1 to start faster).
BENCH_JVM_OPTS = tuple(o for o in JVM_OPTS if o not in ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")) + (
    "-XX:+UseG1GC",)
# RocketMQ sheds a send that waited longer than this in its send queue (SYSTEM_BUSY, "[TIMEOUT_CLEAN_QUEUE]"); its
# default of 200 ms refused most of a 256-in-flight burst while the JVM warmed up on this 2-core machine; a Java
# producer would retry them.  Raised so that every row measures sends the broker serves, as mqlake's rows do.
JAVA_BROKER_CONF = {"waitTimeMillsInSendQueue": 5000}
PEER_VERSION = "Apache RocketMQ 5.4.0"
IDLE_SECONDS = 5.0
GRPC_TOPIC = "BenchGrpc"
GRPC_WINDOW = 64
GRPC_COUNT = 6_000
ADMIN_TIMEOUT = 30.0
GRPC_WARMUP = 2_000
WARMUP_SINGLES = 20_000
WARMUP_BATCHES = 1_000  # of BATCH
GRPC_GROUP = "bench_peer_grpc"
PULL_GROUP = "bench_peer_pull"


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class MqlakeTarget(BrokerProcess):
    """``mqlake up``: bench_broker's BrokerProcess, the server's processes being its one."""

    name = "mqlake"

    def pids(self) -> list[int]:
        return [self.process.pid]


class JavaTarget(BrokerProcess):
    """Apache RocketMQ's NameServer and broker (with the proxy in local mode when ``proxy``), seen through
    BrokerProcess's interface: addresses, and the CPU of its JVMs (both: mqlake's one process holds both parts)."""

    name = "rocketmq"

    def __init__(self, root: Path, flush: str, proxy: bool) -> None:
        self.root = root
        self.client: dict = {}
        self.cluster = JavaCluster(PEER, root / "home", root / "store", proxy=proxy, jvm_opts=BENCH_JVM_OPTS,
                                   brokerName=BROKER_NAME, flushDiskType=flush, **JAVA_BROKER_CONF)  # fmt: skip
        self.cluster.start()
        self.namesrv_addr, self.broker_addr = self.cluster.namesrv_addr, self.cluster.broker_addr
        self.grpc_port = self.cluster.grpc_port
        assert self.cluster.broker is not None and self.cluster.broker.process is not None
        self.process = self.cluster.broker.process

    def pids(self) -> list[int]:
        assert self.cluster.broker is not None
        return [p.pid for p in (self.cluster.namesrv.process, self.cluster.broker.process) if p is not None]

    async def wait_ready(self) -> None:
        pass  # JavaCluster.start returned once both logged their start

    def cpu_seconds(self, main_thread: bool = False) -> float:
        return sum(_cpu_seconds(pid) for pid in self.pids())

    def stop(self) -> None:
        self.cluster.stop()


async def _create(t: MqlakeTarget | JavaTarget, topic: str, queues: int) -> None:
    """The topic, and its route with every queue; a JVM just started on a busy machine may take seconds to answer."""
    async with Admin(t.namesrv_addr, timeout=ADMIN_TIMEOUT) as admin:
        await admin.create_topic(topic, broker_addr=t.broker_addr, read_queue_nums=queues, write_queue_nums=queues)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            route = await admin.topic_route(topic)
            if route is not None and len(route.subscribe_queues(topic)) == queues:
                return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"no route for {topic} with {queues} queues")


async def _create_groups(t: MqlakeTarget | JavaTarget, *groups: str) -> None:
    """The consumer groups, made beforehand: RocketMQ 5 refuses to store an offset of a group it does not know
    (SUBSCRIPTION_GROUP_NOT_EXIST), and the latency rows start their group at the end of every queue."""
    async with Admin(t.namesrv_addr, timeout=ADMIN_TIMEOUT) as admin:
        for group in groups:
            cmd = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None,
                                          SubscriptionGroupConfig(group_name=group).encode())  # fmt: skip
            r = await admin.invoke(t.broker_addr, cmd)
            if r.code != ResponseCode.SUCCESS:
                raise RuntimeError(f"group {group} not created: {r.code} {r.remark}")


def _rss(t: MqlakeTarget | JavaTarget) -> int:
    return sum(_rss_bytes(pid) for pid in t.pids())


async def _idle(t: MqlakeTarget | JavaTarget) -> dict:
    cpu0, t0 = t.cpu_seconds(), time.perf_counter()
    await asyncio.sleep(IDLE_SECONDS * min(1.0, max(0.2, _scale())))
    return {"cpu_cores": (t.cpu_seconds() - cpu0) / (time.perf_counter() - t0), "rss_mib": _rss(t) / 2**20}


def _row(t: MqlakeTarget | JavaTarget, out: dict, name: str):
    """``t.measured`` into ``out[name]``, printing the row's name."""
    print(f"  [{t.name}: {name}]", flush=True)
    out[name] = d = {}
    return d, t.measured(d)


async def _rate_row(t: MqlakeTarget | JavaTarget, out: dict, name: str, frames: list[bytes], conns: int,
                    window: int, total: int, per: int = 1) -> None:  # fmt: skip
    d, meter = _row(t, out, name)
    try:
        with meter:
            d["msgs_per_s"] = await raw_rate(t.broker_addr, frames, conns, window, total, per)
    except RuntimeError as e:  # answers other than SUCCESS (a broker that sheds load): the row says so
        d["msgs_per_s"], d["error"] = float("nan"), str(e)


class _Paced(_PacedSender):
    """bench_broker's paced sender, noting the first refusal's remark."""

    first_refusal = ""

    def data_received(self, data: bytes) -> None:
        before = self.failed
        super().data_received(data)
        if self.failed > before and not self.first_refusal:
            m = re.search(rb'"remark":"([^"]*)"', data)
            self.first_refusal = m.group(1).decode(errors="replace") if m else "a code other than SUCCESS"


async def _latency(t: MqlakeTarget | JavaTarget, rate: int, group: str) -> dict:
    """bench_broker's ``raw_latency`` (paced raw sends, an in-process PushConsumer); sends the broker refused are
    counted and named instead of failing the run (the p99 is of the messages received)."""
    host, port = t.broker_addr.rsplit(":", 1)
    _, sender = await asyncio.get_running_loop().create_connection(_Paced, host, int(port))
    try:
        out = await latency(t.namesrv_addr, None, rate, LATENCY_SECONDS * max(0.5, _scale()), group, raw=sender)
    finally:
        sender.transport.close()
    if sender.failed:
        out["refused"], out["error"] = sender.failed, f"{sender.failed} sends refused: {sender.first_refusal}"
    return out


# -- gRPC: the official clients' calls, one client id per role, its settings sent first ------------------------------


@contextlib.asynccontextmanager
async def _grpc_client(stub: MessagingServiceStub, client_id: str, settings: pb.Settings) -> AsyncIterator[tuple]:
    """A client's Telemetry stream with its settings sent and answered, open while the block runs."""
    meta = (("x-mq-client-id", client_id), ("x-mq-language", "JAVA"), ("x-mq-protocol", "v2"),
            ("x-mq-client-version", "5.2.0"))  # fmt: skip
    settings.request_timeout.FromSeconds(10)
    queue: asyncio.Queue[svc.TelemetryCommand | None] = asyncio.Queue()
    queue.put_nowait(svc.TelemetryCommand(settings=settings))

    async def commands() -> AsyncIterator[svc.TelemetryCommand]:
        while (cmd := await queue.get()) is not None:
            yield cmd

    call = stub.Telemetry(commands(), metadata=meta)
    try:
        first = await asyncio.wait_for(call.read(), 30)
        if first is grpc.aio.EOF or (first.HasField("status") and first.status.code != pb.OK):
            raise RuntimeError(f"{client_id}: settings not accepted: {first}")
        yield meta
    finally:
        queue.put_nowait(None)
        call.cancel()


async def grpc_rows(t: MqlakeTarget | JavaTarget, port: int, out: dict) -> None:
    await _create(t, GRPC_TOPIC, QUEUES)
    total = _n(GRPC_COUNT)
    topic = pb.Resource(name=GRPC_TOPIC)
    group = pb.Resource(name=GRPC_GROUP)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = MessagingServiceStub(channel)
        await asyncio.wait_for(channel.channel_ready(), 30)
        publishing = pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[topic]))
        async with _grpc_client(stub, "bench-grpc-producer", publishing) as meta:
            serial = itertools.count()

            async def send_all(n: int) -> None:
                budget = itertools.count()

                async def worker() -> None:
                    while next(budget) < n:
                        m = pb.Message(topic=topic, body=b"g" * BODY)
                        sp = m.system_properties
                        sp.message_id, sp.message_type, sp.tag = f"01BENCH{next(serial):027d}", pb.NORMAL, "T"
                        sp.body_encoding = pb.IDENTITY
                        r = await stub.SendMessage(svc.SendMessageRequest(messages=[m]), metadata=meta, timeout=10)
                        if r.status.code != pb.OK:
                            raise RuntimeError(f"gRPC send refused: {r.status}")

                await asyncio.gather(*(worker() for _ in range(GRPC_WINDOW)))

            await send_all(_n(GRPC_WARMUP))  # warm: the channel, the route, the topic's queues, the JIT
            d, meter = _row(t, out, "grpc_send")
            with meter:
                t0 = time.perf_counter()
                await send_all(total)
                d["msgs_per_s"] = total / (time.perf_counter() - t0)
        sent = _n(GRPC_WARMUP) + total
        async with PullConsumer("bench_grpc_check", t.namesrv_addr) as c:
            queues = await c.fetch_queues(GRPC_TOPIC)
            deadline = time.monotonic() + 300
            while sum([await c.max_offset(mq) for mq in queues]) < sent and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        entry = pb.SubscriptionEntry(topic=topic, expression=pb.FilterExpression(type=pb.TAG, expression="*"))
        subscribing = pb.Settings(client_type=pb.SIMPLE_CONSUMER,
                                  subscription=pb.Subscription(group=group, subscriptions=[entry]))  # fmt: skip
        subscribing.subscription.long_polling_timeout.FromSeconds(1)
        async with _grpc_client(stub, "bench-grpc-consumer", subscribing) as meta:
            req = svc.ReceiveMessageRequest(group=group, batch_size=32, message_queue=pb.MessageQueue(topic=topic),
                                            filter_expression=entry.expression, auto_renew=False)  # fmt: skip
            req.invisible_duration.FromSeconds(60)
            req.long_polling_timeout.FromSeconds(1)
            d, meter = _row(t, out, "grpc_receive_ack")
            got = 0
            with meter:
                t0 = time.perf_counter()
                empty = 0
                while got < sent and empty < 5:
                    handles = [(r.message.system_properties.message_id, r.message.system_properties.receipt_handle)
                               async for r in stub.ReceiveMessage(req, metadata=meta, timeout=10)
                               if r.HasField("message")]  # fmt: skip
                    if not handles:
                        empty += 1
                        continue
                    got += len(handles)
                    ack = svc.AckMessageRequest(group=group, topic=topic, entries=[
                        svc.AckMessageEntry(message_id=i, receipt_handle=h) for i, h in handles])  # fmt: skip
                    r = await stub.AckMessage(ack, metadata=meta, timeout=10)
                    if r.status.code != pb.OK:
                        raise RuntimeError(f"gRPC ack refused: {r.status}")
                d["msgs_per_s"] = got / (time.perf_counter() - t0)
            d["received"], d["sent"] = got, sent


# -- the phases ----------------------------------------------------------------------------------------------------


async def async_phase(t: MqlakeTarget | JavaTarget, grpc_port: int) -> dict:
    await t.wait_ready()
    await _create(t, TOPIC, QUEUES)
    await _create_groups(t, PULL_GROUP, GRPC_GROUP, *(f"bench_peer_{key}" for key in ("latency", "latency_high")))
    out: dict = {"idle": await _idle(t)}
    print(f"  [{t.name}: idle {out['idle']['cpu_cores']:.3f} cores, RSS {out['idle']['rss_mib']:.0f} MiB]", flush=True)
    singles, batches = raw_frames(RAW_FRAMES), raw_frames(RAW_FRAMES // 8, BATCH)
    # Warm-up, untimed, the same for both: connections, the first segment, and a JVM's JIT (a few thousand requests
    # leave the JVM in its interpreter and C1 code; the timed rows would then measure its compiling)
    warm = _n(WARMUP_SINGLES), _n(WARMUP_BATCHES)
    await raw_rate(t.broker_addr, singles, 8, WINDOW_8, warm[0])
    await raw_rate(t.broker_addr, batches, 8, BATCH_WINDOW, warm[1], BATCH)
    await _rate_row(t, out, "single_1", singles, 1, WINDOW_1, _n(SINGLE_COUNT))
    await _rate_row(t, out, "single_8", singles, 8, WINDOW_8, _n(SINGLE_COUNT))
    await _rate_row(t, out, "batch_8", batches, 8, BATCH_WINDOW, _n(BATCH_COUNT) // BATCH, BATCH)
    # every acknowledged message dispatched (a row that failed part-way stored some too: all stored are read)
    batched = _n(BATCH_COUNT) // BATCH * BATCH
    rows = (("single_1", _n(SINGLE_COUNT)), ("single_8", _n(SINGLE_COUNT)), ("batch_8", batched))
    acked = warm[0] + warm[1] * BATCH + sum(n for k, n in rows if "error" not in out[k])
    out["dispatch_catch_up_s"] = await wait_dispatched(t.namesrv_addr, acked)
    async with PullConsumer(PULL_GROUP, t.namesrv_addr) as consumer:
        stored = sum([await consumer.max_offset(mq) for mq in await consumer.fetch_queues(TOPIC)])
        d, meter = _row(t, out, "pull")
        with meter:
            d.update(await _pull_all(t, consumer, TOPIC, stored))
    for key, rate in (("latency", LATENCY_RATE), ("latency_high", LATENCY_HIGH_RATE)):
        d, meter = _row(t, out, key)
        with meter:
            d.update(await _latency(t, rate, f"bench_peer_{key}"))
    await grpc_rows(t, grpc_port, out)
    out["rss_after_mib"] = _rss(t) / 2**20
    return out


async def sync_phase(t: MqlakeTarget | JavaTarget) -> dict:
    await t.wait_ready()
    await _create(t, TOPIC, QUEUES)
    singles = raw_frames(RAW_FRAMES)
    out: dict = {}
    await raw_rate(t.broker_addr, singles, 1, SYNC_WINDOW, _n(WARMUP_SINGLES) // 2)  # untimed, as above
    with contextlib.suppress(RuntimeError):  # the next segment written ahead, outside the timed row
        await next_segment_written(t.root / "store" / "commitlog", timeout=20)
    await _rate_row(t, out, "sync_1x64", singles, 1, SYNC_WINDOW, _n(SYNC_COUNT))
    return out


def _scale() -> float:
    return float(os.environ.get("BENCH_SCALE", "1") or 1)


def _run_target(kind: str, root: Path, flush: str) -> dict:
    root.mkdir(parents=True)
    with_proxy = flush == "ASYNC_FLUSH"
    if kind == "mqlake":
        port = free_port()
        extra = {"enableProxy": "true", "grpcServerPort": str(port)} if with_proxy else {}
        t: MqlakeTarget | JavaTarget = MqlakeTarget(root, flush=flush, extra=extra)
    else:
        t = JavaTarget(root, flush, proxy=with_proxy)
        port = t.grpc_port or 0
    try:
        return run(async_phase(t, port) if with_proxy else sync_phase(t))
    finally:
        t.stop()


# -- the report ----------------------------------------------------------------------------------------------------

ROWS = (  # (label, key path, higher is better)
    ("send, 1 connection, 128 in flight (msgs/s)", ("async", "single_1", "msgs_per_s"), True),
    ("send, 8 connections, 256 in flight (msgs/s)", ("async", "single_8", "msgs_per_s"), True),
    (f"batches of {BATCH}, 8 connections (msgs/s)", ("async", "batch_8", "msgs_per_s"), True),
    (f"SYNC_FLUSH, {SYNC_WINDOW} in flight, 1 conn (acked/s)", ("sync", "sync_1x64", "msgs_per_s"), True),
    (f"produce->consume p99 at {LATENCY_RATE:,}/s (ms)", ("async", "latency", "p99_ms"), False),
    (f"produce->consume p99 at {LATENCY_HIGH_RATE:,}/s (ms)", ("async", "latency_high", "p99_ms"), False),
    ("pull, 32 per pull, one at a time (msgs/s)", ("async", "pull", "msgs_per_s"), True),
    ("gRPC SendMessage, 64 in flight (msgs/s)", ("async", "grpc_send", "msgs_per_s"), True),
    ("gRPC receive 32 + ack (msgs/s)", ("async", "grpc_receive_ack", "msgs_per_s"), True),
    ("idle CPU (cores)", ("async", "idle", "cpu_cores"), False),
    ("idle RSS (MiB)", ("async", "idle", "rss_mib"), False),
    ("RSS after the load (MiB)", ("async", "rss_after_mib"), False),
)


def _get(r: dict, kind: str, path: tuple[str, ...]) -> float:
    v: object = r[kind]
    for k in path:
        if not isinstance(v, dict) or k not in v:
            return float("nan")
        v = v[k]
    return float(v)  # type: ignore[arg-type]


def _targets(r: dict) -> list[tuple[str, str]]:
    """The targets against Apache RocketMQ's broker: mqlake >= 1.0x on every rate, p99 no worse, RSS <= 0.5x;
    each met or its gap."""
    out = []
    for label, path, higher in ROWS:
        m, j = _get(r, "mqlake", path), _get(r, "rocketmq", path)
        if "CPU" in label or "after" in label:
            continue
        want = 0.5 if "RSS" in label else 1.0
        ratio = m / j if j else float("nan")
        ok = ratio >= want if higher else ratio <= want
        out.append((label, f"{'met' if ok else 'NOT met'} ({ratio:.2f}x, target {'>=' if higher else '<='} {want}x)"))
    return out


def print_report(r: dict) -> None:
    m = r["machine"]
    print(f"machine: {m['nproc']} cores, {m['memory_gib']} GiB, {m['cpu']}, Python {m['python']}, {m['date']}")
    print(f"BENCH_SCALE={m['bench_scale']}; 1 KiB bodies, topic of {QUEUES} queues, ASYNC_FLUSH (SYNC_FLUSH row: a "
          f"second start of each); mqlake: `mqlake up` with enableProxy; {PEER_VERSION}: NameServer JVM + proxy "
          f"(local mode) with its broker in one JVM; JVM options: {' '.join(BENCH_JVM_OPTS[:3])} "
          f"{BENCH_JVM_OPTS[-1]}; broker.conf beyond the defaults: {JAVA_BROKER_CONF}")  # fmt: skip
    print("load generator: this process, the same for both (bench_broker's raw-protocol producer and paced sender,"
          " a PullConsumer, grpc.aio stubs)\n")
    hdr = f"{'row':<46}{'mqlake':>12}{'RocketMQ':>12}{'mqlake/RocketMQ':>17}{'bg cpu m/R':>13}"
    print(hdr)
    print("-" * len(hdr))
    for label, path, _ in ROWS:
        a, b = _get(r, "mqlake", path), _get(r, "rocketmq", path)
        bg = "/".join(f"{_get(r, k, (*path[:2], 'bg_cpu_cores')):.2f}" for k in ("mqlake", "rocketmq"))
        fmt = ",.3f" if "cores" in label else ",.2f" if "ms" in label else ",.0f"
        print(f"{label:<46}{a:>12{fmt}}{b:>12{fmt}}{(a / b if b else float('nan')):>17.2f}{bg:>13}")
    for kind in ("mqlake", "rocketmq"):
        for phase in ("async", "sync"):
            if "failed" in r[kind][phase]:
                print(f"  {kind} {phase}: {r[kind][phase]['failed']}")
                continue
            for row, d in r[kind][phase].items():
                if isinstance(d, dict) and "error" in d:
                    print(f"  {kind} {row}: {d['error']}")
    print("\ntargets")
    for label, verdict in r["targets"]:
        print(f"  {label:<46} {verdict}")


def main() -> dict:
    with tempfile.TemporaryDirectory(prefix="mqlake-bench-peer-", dir="/tmp") as d:
        tmp = Path(d)
        t0 = time.perf_counter()
        results: dict = {"machine": machine(), "peer": PEER_VERSION, "jvm_options": list(BENCH_JVM_OPTS),
                         "java_broker_conf": JAVA_BROKER_CONF}  # fmt: skip
        kinds = [k for k in ("mqlake", "rocketmq") if os.environ.get("BENCH_ONLY", k) == k]
        for kind in kinds:
            results[kind] = {}
            for phase, flush in (("async", "ASYNC_FLUSH"), ("sync", "SYNC_FLUSH")):
                print(f"  [{kind}, {flush}]", flush=True)
                try:
                    results[kind][phase] = _run_target(kind, tmp / f"{kind}-{phase}", flush)
                except Exception as e:  # noqa: BLE001 - the run goes on; the report names what failed
                    results[kind][phase] = {"failed": f"{type(e).__name__}: {e}"}
                    print(f"  [{kind}, {flush} failed: {e}]", flush=True)
        if len(kinds) == 2:
            results["targets"] = _targets(results)
        else:
            results.setdefault("mqlake" if kinds == ["rocketmq"] else "rocketmq", {"async": {}, "sync": {}})
            results["targets"] = []
        results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_peer", results, print_report)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
