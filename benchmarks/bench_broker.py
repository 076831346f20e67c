"""Broker benchmarks through the protocol: sends, batches and produce->consume latency on loopback,
each next to a raw asyncio request/response baseline measured in the same run.

Run: ``.venv/bin/python -m benchmarks bench_broker`` (or ``make bench``).

Environment:
  BENCH_SCALE    multiplies every message count and duration (default 1.0; 0.1 for a smoke run)
  BENCH_JSON     a path: also write the JSON results there
  BENCH_PROFILE  1: run the broker under cProfile during the 8-connection send phase and print its top functions
  BENCH_ONLY     sync_flush: only the SYNC_FLUSH rows; latency: only the latency rows (for A/B runs)
  BENCH_LATENCY_ROWS  comma-separated latency rows to run (default all): latency_low, latency, latency_high,
                 latency_proc, latency_high_proc
  BENCH_SWITCH_INTERVAL  run the broker with ``sys.setswitchinterval(value)`` (a diagnostic: GIL hand-offs between
                 its event loop, dispatch and group-commit threads; Python's default is 0.005 s)

What is measured, exactly:
  * The broker is ``mqlake up`` in its own process (ASYNC_FLUSH, a temporary store, free ports).  The load
    generator (this process, uvloop) is a raw-protocol producer for the throughput rows: SEND_MESSAGE_V2 and
    SEND_BATCH_MESSAGE frames encoded once as broker/client's Producer encodes them (``raw_frames``), kept
    ``WINDOW`` in flight over 1 or 8 connections, each answer checked to be SUCCESS; so the broker, not the
    Python client (~40 µs of CPU per send), gets the cores.  The row "the same, Python Producer" sends through
    ``Producer.send`` (``connections_per_addr=8``) for comparison.  1 KiB bodies with TAGS, KEYS and a UNIQ_KEY
    per message; topic ``BenchTopic`` with 8 queues, round-robin.
  * Latency: a ``PushConsumer`` (long polling) in this process; messages are sent at a fixed rate (ticks of 1 ms)
    by a raw-protocol sender on one connection (a frame per queue encoded once, the message's key written into
    its body), and the latency of each is from just before its frame is written to its handler call.  The
    ``_proc`` rows run the same PushConsumer in a child process of its own (``consumer_process_main``): its
    handler notes ``time.perf_counter()`` (CLOCK_MONOTONIC, one clock for every process of the machine) per key,
    and the latency is that minus the send time noted here; so the sender's loop, its bookkeeping and its
    garbage collections no longer delay the consumer, at the cost of a third busy process on the cores.
  * SYNC_FLUSH: a second broker, ``flushDiskType=SYNC_FLUSH``, and the same raw-protocol sender:
    ``SYNC_WINDOW`` (64) sends in flight on ONE connection, as 64 producer threads of one Java client share
    their broker channel (the target row), and 64 connections with one send each; every send is answered
    after the fdatasync that covers it, so acked/s depends on the disk's fdatasync time as well as the CPU.
  * Baseline: an asyncio echo server in its own process answers every frame with a frame of the size the broker's
    response has, writing all the answers to one read in one ``writelines`` (what the remoting layer does); a raw
    protocol client keeps the same number of frames of the request's size in flight on the same connection count.
    It is the ceiling of request/response over loopback in Python on this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import pstats
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_store import CpuMeter, codecs_line
from benchmarks.report import emit, machine
from broker.client import Admin, Message, MessageExt, Producer, PullConsumer, PushConsumer
from broker.client.message import ConsumeFromWhere
from broker.remoting import headers as h
from broker.remoting.batch_body import BatchItem, encode_batch_body
from broker.remoting.codes import RequestCode
from broker.remoting.command import RemotingCommand
from broker.remoting.loop import run
from store.constants import AUTO_CREATE_TOPIC_KEY_TOPIC, DEFAULT_REGION_ID
from store.format import msgid, properties

SCALE = float(os.environ.get("BENCH_SCALE", "1") or 1)
BODY = 1024
TOPIC = "BenchTopic"
BROKER_NAME = "bench-a"  # BrokerProcess's brokerName: a lake tiered for its broker must name it
QUEUES = 8
BATCH = 32
WINDOW_1 = 128  # sends in flight on 1 connection
WINDOW_8 = 256  # sends in flight over 8 connections
BATCH_WINDOW = 16  # batches in flight
SINGLE_COUNT = 40_000
BATCH_COUNT = 320_000  # messages, in batches of BATCH
LATENCY_RATE = 5_000
LATENCY_LOW_RATE = 500  # well under what the broker sustains here: the latency without a backlog
LATENCY_HIGH_RATE = 20_000
LATENCY_ROWS = (("latency_low", LATENCY_LOW_RATE), ("latency", LATENCY_RATE), ("latency_high", LATENCY_HIGH_RATE))
# The same with the PushConsumer in a process of its own (the sender's event loop and heap no longer delay it)
LATENCY_PROCESS_ROWS = (("latency_proc", LATENCY_RATE), ("latency_high_proc", LATENCY_HIGH_RATE))
LATENCY_SECONDS = 6.0
DRAIN_SECONDS = 60.0  # a consumer behind the rate gets this long to catch up before what arrived is reported
WARMUP = 2_000
BASELINE_COUNT = 400_000  # the raw path is ~20x faster: more requests for a timing well above timer noise

# The targets the broker is held to: sends/s at 8 connections, batched messages/s, p99 latency (ms) at the
# moderate and the high rate.
TARGET_SINGLE_8 = 40_000
TARGET_BATCH = 300_000
TARGET_P99_MS = 5.0
TARGET_P99_HIGH_MS = 10.0
TARGET_SYNC = 30_000  # SYNC_FLUSH, 64 writers, acked/s

SYNC_WINDOW = 64  # SYNC_FLUSH sends in flight (Java's 64 writer threads)
SYNC_COUNT = 40_000
SYNC_ROWS = (("sync_1x64", 1), ("sync_64x1", SYNC_WINDOW))  # (row, connections)

READY_TIMEOUT = 60.0
SWITCH_INTERVAL = os.environ.get("BENCH_SWITCH_INTERVAL", "")
_WITH_SWITCH_INTERVAL = ("import sys; sys.setswitchinterval(float(sys.argv.pop(1))); sys.argv[0] = 'mqlake'; "
                         "from cli.main import main; main()")  # fmt: skip
PORT_ATTEMPTS = 3  # starts of mqlake up when a port chosen free was taken before the broker bound it


def _n(count: float) -> int:
    return max(1, int(count * SCALE))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mqlake() -> str:
    exe = Path(sys.executable).with_name("mqlake")
    return str(exe) if exe.exists() else shutil.which("mqlake") or "mqlake"


class BrokerProcess:
    """``mqlake up -c broker.conf`` in a subprocess on free ports, optionally under cProfile."""

    def __init__(
        self,
        root: Path,
        profile_to: Path | None = None,
        flush: str = "ASYNC_FLUSH",
        extra: dict[str, str] | None = None,
        client: dict | None = None,
    ) -> None:
        """``extra``: more broker.conf keys; ``client``: keyword arguments for the Admin that waits for it."""
        self.root = root
        self.client = client or {}
        self._settings = (profile_to, flush, extra or {})
        self._starts = 0
        self._launch()

    def _launch(self) -> None:
        """``mqlake up`` on ports free a moment ago: another process may take one before the broker binds it (the
        HA port, listenPort + 1 by default, is chosen free too); ``wait_ready`` then starts again on new ones."""
        profile_to, flush, extra = self._settings
        root = self.root
        self._starts += 1
        self.namesrv_port, self.broker_port = free_port(), free_port()
        self.namesrv_addr = f"127.0.0.1:{self.namesrv_port}"
        self.broker_addr = f"127.0.0.1:{self.broker_port}"
        conf = root / "broker.conf"
        conf.write_text(
            f"brokerClusterName=BenchCluster\nbrokerName={BROKER_NAME}\nbrokerId=0\nbrokerIP1=127.0.0.1\n"
            f"listenPort={self.broker_port}\nnamesrvAddr={self.namesrv_addr}\nstorePathRootDir={root / 'store'}\n"
            f"haListenPort={free_port()}\nflushDiskType={flush}\n" + "".join(f"{k}={v}\n" for k, v in extra.items())
        )
        cmd = [_mqlake(), "up", "-c", str(conf)]
        if SWITCH_INTERVAL:  # the broker's GIL switch interval (a diagnostic of the hand-offs between its threads)
            cmd = [sys.executable, "-c", _WITH_SWITCH_INTERVAL, SWITCH_INTERVAL, *cmd[1:]]
        if profile_to is not None:
            cmd = [sys.executable, "-m", "cProfile", "-o", str(profile_to), *cmd]
        self.log = open(root / "broker.log", "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    async def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if self.process.poll() is not None:
                self.log.close()
                text = (self.root / "broker.log").read_text(errors="replace")
                if "is already in use by another process" in text and self._starts < PORT_ATTEMPTS:
                    print(f"  [a port was taken meanwhile: {text.strip().splitlines()[-1]}; new ports]", flush=True)
                    self._launch()
                    continue
                raise RuntimeError(f"mqlake up exited with {self.process.returncode}: see {self.root / 'broker.log'}")
            try:
                async with Admin(self.namesrv_addr, timeout=1.0, **self.client) as admin:
                    if any(b.addr == self.broker_addr for b in await admin.cluster_list()):
                        return
            except Exception:  # not listening yet
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"broker not ready after {READY_TIMEOUT:.0f}s: see {self.root / 'broker.log'}")
            await asyncio.sleep(0.1)

    def cpu_seconds(self, main_thread: bool = False) -> float:
        """user + system CPU the broker process (or its main thread: the event loop) has used so far."""
        pid = self.process.pid
        try:
            stat = Path(f"/proc/{pid}/task/{pid}/stat" if main_thread else f"/proc/{pid}/stat")
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    @contextlib.contextmanager
    def measured(self, out: dict):
        """CpuMeter for this process and the machine, plus the broker's own cores, into ``out``."""
        b0, m0, t0 = self.cpu_seconds(), self.cpu_seconds(main_thread=True), time.perf_counter()
        with CpuMeter() as cpu:
            yield
        wall = time.perf_counter() - t0
        broker = (self.cpu_seconds() - b0) / wall
        loop = (self.cpu_seconds(main_thread=True) - m0) / wall
        out.update(cpu.as_dict(), broker_cpu_cores=broker, bg_cpu_cores=max(0.0, cpu.other_cores - broker))
        if out.get("msgs_per_s"):
            out["broker_us_per_msg"] = broker / out["msgs_per_s"] * 1e6
            # the event loop's thread alone (the request path); the rest is dispatch, flush and housekeeping
            out["loop_us_per_msg"] = loop / out["msgs_per_s"] * 1e6

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


# -- the raw baseline ----------------------------------------------------------------------------------------------


class _EchoServer(asyncio.Protocol):
    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.buf = bytearray()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos, n = 0, 0
        while len(buf) - pos >= 4:
            size = int.from_bytes(buf[pos : pos + 4], "big")
            if len(buf) - pos - 4 < size:
                break
            pos += 4 + size
            n += 1
        del buf[:pos]
        if n:
            self.transport.writelines([self.reply] * n)


def echo_server_main() -> None:
    """Child process: ``echo_server_main PORT REPLY_SIZE`` answers each frame with a REPLY_SIZE-byte frame."""
    port, reply_size = int(sys.argv[1]), int(sys.argv[2])
    reply = (reply_size - 4).to_bytes(4, "big") + b"r" * (reply_size - 4)

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(lambda: _EchoServer(reply), "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    run(serve())


class _EchoClient(asyncio.Protocol):
    def __init__(self, request: bytes, reply_size: int, budget: itertools.count, total: int, done: asyncio.Future):
        self.request, self.reply_size = request, reply_size
        self.budget, self.total, self.done = budget, total, done
        self.pending = 0
        self.received = 0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def send(self, n: int) -> None:
        out = []
        for _ in range(n):
            if next(self.budget) >= self.total:
                break
            out.append(self.request)
        self.pending += len(out)
        if out:
            self.transport.writelines(out)
        elif self.pending == 0 and not self.done.done():
            self.done.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        n = self.received // self.reply_size
        self.received -= n * self.reply_size
        self.pending -= n
        self.send(n)


async def echo_rate(port: int, request_size: int, reply_size: int, conns: int, window: int, total: int) -> float:
    loop = asyncio.get_running_loop()
    request = (request_size - 4).to_bytes(4, "big") + b"q" * (request_size - 4)
    budget = itertools.count()
    clients = []
    for _ in range(conns):
        done = loop.create_future()
        _, c = await loop.create_connection(
            lambda d=done: _EchoClient(request, reply_size, budget, total, d), "127.0.0.1", port
        )
        clients.append(c)
    t0 = time.perf_counter()
    for c in clients:
        c.send(window // conns)
    await asyncio.gather(*(c.done for c in clients))
    elapsed = time.perf_counter() - t0
    for c in clients:
        c.transport.close()
    return total / elapsed


# -- the raw-protocol producer ---------------------------------------------------------------------------------------
# The Python Producer costs ~40 µs of this process's CPU per send, more than the broker: on 2 shared cores it, not
# the broker, would set the rate.  The throughput rows therefore send frames encoded once here, exactly as the
# Producer encodes them (SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE, the same header fields and properties, a UNIQ_KEY
# of its own per message), cycled over the queues; answers are counted and must be SUCCESS.

RAW_FRAMES = 512  # distinct frames cycled (distinct UNIQ_KEYs and KEYS for the broker's index)
_SUCCESS_HEAD = b'{"code":0,'  # the JSON header of a SUCCESS answer begins so (fastjson's key order)


def raw_frames(count: int, batch: int = 0) -> list[bytes]:
    """``count`` request frames of 1 KiB messages (``batch`` of them per SEND_BATCH_MESSAGE when not 0)."""
    uniq = msgid.UniqKeyGenerator()
    born = int(time.time() * 1000)
    frames = []
    for i in range(count):
        if batch:
            items = []
            for j in range(batch):
                m = bench_message(i * batch + j)
                items.append(BatchItem(m.flag, m.body_bytes(), properties.encode_properties(m.wire_properties(
                    uniq.next()))))  # fmt: skip
            body = encode_batch_body(items)
            props = properties.encode_properties(Message(TOPIC, body).wire_properties(None))
        else:
            m = bench_message(i)
            body, props = m.body_bytes(), properties.encode_properties(m.wire_properties(uniq.next()))
        header = h.SendMessageRequestHeaderV2(
            a="bench_raw", b=TOPIC, c=AUTO_CREATE_TOPIC_KEY_TOPIC, d=4, e=i % QUEUES, f=0, g=born, h=0,
            i=props.decode(), j=0, k=False, m=bool(batch), n="bench-a",
        )  # fmt: skip
        code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2
        cmd = RemotingCommand.request(code, header, body)
        cmd.opaque = i + 1
        frames.append(cmd.encode())
    return frames


class _RawProducer(asyncio.Protocol):
    def __init__(self, frames: list[bytes], budget: itertools.count, total: int, done: asyncio.Future) -> None:
        self.frames, self.budget, self.total, self.done = frames, budget, total, done
        self.next = 0
        self.pending = 0
        self.failed = 0
        self.buf = bytearray()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def send(self, n: int) -> None:
        out = []
        frames = self.frames
        for _ in range(n):
            if next(self.budget) >= self.total:
                break
            out.append(frames[self.next % len(frames)])
            self.next += 1
        self.pending += len(out)
        if out:
            self.transport.writelines(out)
        elif self.pending == 0 and not self.done.done():
            self.done.set_result(None)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos, n = 0, 0
        while len(buf) - pos >= 8:
            size = int.from_bytes(buf[pos : pos + 4], "big")
            if len(buf) - pos - 4 < size:
                break
            if buf[pos + 8 : pos + 8 + len(_SUCCESS_HEAD)] != _SUCCESS_HEAD:
                self.failed += 1
            pos += 4 + size
            n += 1
        del buf[:pos]
        self.pending -= n
        self.send(n)


async def raw_rate(addr: str, frames: list[bytes], conns: int, window: int, total: int, per: int = 1) -> float:
    """Messages per second of ``total`` requests (``per`` messages each) kept ``window`` in flight over ``conns``
    connections of raw frames; fails if any answer is not SUCCESS."""
    loop = asyncio.get_running_loop()
    host, port = addr.rsplit(":", 1)
    budget = itertools.count()
    clients = []
    for k in range(conns):
        done = loop.create_future()
        _, c = await loop.create_connection(
            lambda d=done, k=k: _RawProducer(frames[k:] + frames[:k], budget, total, d), host, int(port)
        )
        clients.append(c)
    t0 = time.perf_counter()
    for c in clients:
        c.send(max(1, window // conns))
    await asyncio.gather(*(c.done for c in clients))
    elapsed = time.perf_counter() - t0
    for c in clients:
        c.transport.close()
    failed = sum(c.failed for c in clients)
    if failed:
        raise RuntimeError(f"{failed} of {total} raw sends were not answered SUCCESS")
    return total * per / elapsed


# -- the broker path ------------------------------------------------------------------------------------------------


def bench_message(i: int) -> Message:
    return Message(TOPIC, b"x" * BODY, tags="TagA", keys=f"ORDER-{i:010d}")


async def send_rate(producer: Producer, total: int, window: int) -> float:
    budget = itertools.count()
    msg = bench_message(0)

    async def worker() -> None:
        while next(budget) < total:
            await producer.send(msg)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(window)))
    return total / (time.perf_counter() - t0)


async def batch_rate(producer: Producer, total: int, window: int) -> float:
    batches = max(1, total // BATCH)
    budget = itertools.count()
    msgs = [bench_message(i) for i in range(BATCH)]

    async def worker() -> None:
        while next(budget) < batches:
            await producer.send_batch(msgs)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(window)))
    return batches * BATCH / (time.perf_counter() - t0)


class _PacedSender(asyncio.Protocol):
    """The latency rows' producer: one connection, one SEND_MESSAGE_V2 frame per queue encoded once, each send a
    copy with the message's 16-byte key written over the start of its body; answers must be SUCCESS."""

    def __init__(self) -> None:
        self.templates = [bytearray(f) for f in raw_frames(QUEUES)]
        self.buf = bytearray()
        self.failed = 0
        self.acked: list[float] = []  # when each answer was read (answers come in send order on one connection)
        self.sent_at: list[float] = []  # when each was sent (paced_send)

    def connection_made(self, transport) -> None:
        self.transport = transport

    def send(self, i: int, key: bytes) -> None:
        frame = self.templates[i % QUEUES]
        frame[len(frame) - BODY : len(frame) - BODY + len(key)] = key
        self.transport.write(bytes(frame))

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        while len(buf) - pos >= 8:
            size = int.from_bytes(buf[pos : pos + 4], "big")
            if len(buf) - pos - 4 < size:
                break
            if buf[pos + 8 : pos + 8 + len(_SUCCESS_HEAD)] != _SUCCESS_HEAD:
                self.failed += 1
            pos += 4 + size
            self.acked.append(time.perf_counter())
        del buf[:pos]


async def _pace(loop: asyncio.AbstractEventLoop, due: float, i: int, rate: int) -> None:
    """Wait for send ``i``'s time ``due`` (ticks of 1 ms).  A sender behind its schedule (a timer fired late) sends
    what is due without sleeping, but still yields to the loop once per millisecond's worth of sends: catching up
    in one stretch held the loop for 12-40 ms at 20 k msgs/s (traced), and the in-process PushConsumer, whose
    handler calls are part of the latency measured, could not run meanwhile."""
    delay = due - loop.time()
    if delay > 0.001:
        await asyncio.sleep(delay)
    elif i % max(1, rate // 1000) == 0:
        await asyncio.sleep(0)


async def raw_latency(namesrv: str, broker_addr: str, rate: int, seconds: float, group: str) -> dict:
    """``latency`` with the paced raw-protocol sender instead of the Python Producer."""
    host, port = broker_addr.rsplit(":", 1)
    _, sender = await asyncio.get_running_loop().create_connection(_PacedSender, host, int(port))
    try:
        out = await latency(namesrv, None, rate, seconds, group, raw=sender)
    finally:
        sender.transport.close()
    if sender.failed:
        raise RuntimeError(f"{sender.failed} paced sends were not answered SUCCESS")
    return out


async def latency(namesrv: str, producer: Producer | None, rate: int, seconds: float, group: str,
                  raw: _PacedSender | None = None) -> dict:  # fmt: skip
    sent: dict[bytes, float] = {}
    # where a message waited: its send answered (send -> ack, the raw sender only), stored (the record's store
    # timestamp, wall clock in ms: 1 ms resolution) and handed to the handler (stored -> handler: dispatch,
    # the long-poll wake-up, the pull and its decode in this process)
    order: list[float] = []
    wall_at_send: dict[bytes, float] = {}
    stored_in: list[float] = []
    to_handler: list[float] = []
    lat: list[float] = []
    got = asyncio.Event()
    total = int(rate * seconds)

    async def handler(m: MessageExt) -> None:
        t = sent.pop(m.body[:16], None)
        if t is not None:
            lat.append(time.perf_counter() - t)
            now_ms = time.time() * 1000
            stored_in.append(m.store_timestamp - wall_at_send.pop(m.body[:16]))
            to_handler.append(now_ms - m.store_timestamp)
            if len(lat) >= total:
                got.set()

    # Start the group at the end of every queue: with no stored offset a broker may start a new group at 0
    # (QUERY_CONSUMER_OFFSET's "offset 0 still in memory" rule), and the backlog would be timed too.
    async with PullConsumer(group, namesrv) as pc:
        for mq in await pc.fetch_queues(TOPIC):
            await pc.update_offset(mq, await pc.max_offset(mq))
    consumer = await _parked_consumer(group, namesrv, handler)
    try:
        loop = asyncio.get_running_loop()
        pad = b"x" * (BODY - 16)
        tasks = set()
        t0 = loop.time()
        for i in range(total):
            await _pace(loop, t0 + i / rate, i, rate)
            key = f"{i:016d}".encode()
            sent[key] = t_send = time.perf_counter()
            order.append(t_send)
            wall_at_send[key] = time.time() * 1000
            if raw is not None:
                raw.send(i, key)
                continue
            assert producer is not None
            task = loop.create_task(producer.send(Message(TOPIC, key + pad, tags="TagA")))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        achieved = total / (loop.time() - t0)
        # A broker slower than the rate builds a backlog; give it time to drain, then report what arrived.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(60):
                await got.wait()
    finally:
        await consumer.shutdown()
    lat.sort()
    ms = [v * 1000 for v in lat] or [float("nan")]
    parts = {"stored_ms": sorted(stored_in) or [float("nan")], "stored_to_handler_ms": sorted(to_handler) or
             [float("nan")]}  # fmt: skip
    if raw is not None and raw.acked:
        parts["ack_ms"] = sorted((a - s) * 1000 for a, s in zip(raw.acked, order, strict=False))
    return {"rate": rate, "achieved_send_rate": achieved, "sent": total, "messages": len(lat),
            "p50_ms": _pct(ms, 50), "p99_ms": _pct(ms, 99), "max_ms": ms[-1],
            "mean_ms": statistics.fmean(ms),
            **{f"{k}_p{p}": _pct(v, p) for k, v in parts.items() for p in (50, 99)}}  # fmt: skip


async def _parked_consumer(group: str, namesrv: str, handler) -> PushConsumer:
    """A started PushConsumer of BenchTopic from its last offsets, once every queue is assigned and its first
    pull has had time to park at the broker."""
    consumer = PushConsumer(group, namesrv, consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET)
    consumer.subscribe(TOPIC, "*", handler)
    await consumer.start()
    deadline = time.monotonic() + 30
    while len(consumer.assigned_queues) < QUEUES and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    return consumer


def consumer_process_main() -> None:
    """Child process: ``consumer_process_main NAMESRV GROUP TOTAL OUT``: a PushConsumer of BenchTopic; prints
    ``ready`` once every queue is assigned, then writes ``{"got": [[key, perf_counter at the handler, store
    timestamp ms, time.time() ms at the handler], ...], "cpu_cores": its cores used from ready to the end}`` to OUT
    as JSON after TOTAL distinct messages (or WAIT seconds)."""
    namesrv, group, total, out, wait = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5])

    async def consume() -> None:
        got: list[tuple[str, float, int, float]] = []
        done = asyncio.Event()

        keys: set[bytes] = set()

        async def handler(m: MessageExt) -> None:
            got.append((m.body[:16].decode(), time.perf_counter(), m.store_timestamp, time.time() * 1000))
            keys.add(m.body[:16])
            if len(keys) >= total:
                done.set()

        consumer = await _parked_consumer(group, namesrv, handler)
        try:
            print("ready", flush=True)
            cpu0, t0 = time.process_time(), time.perf_counter()
            with contextlib.suppress(TimeoutError):  # a backlog drains, then what arrived is reported
                async with asyncio.timeout(wait):
                    await done.wait()
            cores = (time.process_time() - cpu0) / (time.perf_counter() - t0)
        finally:
            await consumer.shutdown()
        Path(out).write_text(json.dumps({"got": got, "cpu_cores": cores}))

    run(consume())


async def process_latency(b: BrokerProcess, rate: int, seconds: float, group: str, out: dict) -> None:
    """``raw_latency`` with the PushConsumer in a child process (``consumer_process_main``), into ``out``; the
    CPU figures cover the sends and the consumer's catching up, not the child's start-up."""
    namesrv, broker_addr = b.namesrv_addr, b.broker_addr
    total = int(rate * seconds)
    async with PullConsumer(group, namesrv) as pc:  # the group starts at the end of every queue (see latency)
        for mq in await pc.fetch_queues(TOPIC):
            await pc.update_offset(mq, await pc.max_offset(mq))
    with tempfile.NamedTemporaryFile(prefix="mqlake-bench-consumer-", suffix=".json") as f:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "from benchmarks.bench_broker import consumer_process_main; consumer_process_main()",
            namesrv, group, str(total), f.name, str(seconds + DRAIN_SECONDS), stdout=asyncio.subprocess.PIPE,
            cwd=Path(__file__).resolve().parent.parent,
        )  # fmt: skip
        assert child.stdout is not None
        try:
            async with asyncio.timeout(60):
                if (await child.stdout.readline()).strip() != b"ready":
                    raise RuntimeError("the consumer process did not start")
            host, port = broker_addr.rsplit(":", 1)
            _, sender = await asyncio.get_running_loop().create_connection(_PacedSender, host, int(port))
            try:
                with b.measured(out):
                    sent, wall, achieved = await paced_send(sender, rate, total)
                    async with asyncio.timeout(DRAIN_SECONDS + 30):  # it stops DRAIN_SECONDS after the sends at most
                        await child.wait()
                # Closing with answers unread would reset the connection and drop requests the broker has not read
                async with asyncio.timeout(DRAIN_SECONDS):
                    while len(sender.acked) < total and not sender.transport.is_closing():
                        await asyncio.sleep(0.01)
            finally:
                sender.transport.close()
        finally:
            if child.returncode is None:
                child.kill()
                await child.wait()
        report = json.loads(Path(f.name).read_text() or '{"got": []}')
    if sender.failed:
        raise RuntimeError(f"{sender.failed} paced sends were not answered SUCCESS")
    lat, stored_in, to_handler = [], [], []
    stray = 0
    for key, at, store_ms, wall_ms in report["got"]:
        k = key.encode()
        if k not in sent:
            stray += 1
        else:
            lat.append((at - sent.pop(k)) * 1000)
            stored_in.append(store_ms - wall.pop(k))
            to_handler.append(wall_ms - store_ms)
    parts = {"stored_ms": sorted(stored_in) or [float("nan")],
             "stored_to_handler_ms": sorted(to_handler) or [float("nan")],
             "ack_ms": sorted((a - s) * 1000 for a, s in zip(sender.acked, sender.sent_at, strict=False))}  # fmt: skip
    ms = sorted(lat) or [float("nan")]
    out.update({"rate": rate, "achieved_send_rate": achieved, "sent": total, "messages": len(lat),
            "consumer": "process",
            "consumer_cpu_cores": report.get("cpu_cores", float("nan")),
            "repeated_or_unknown": stray,
            "p50_ms": _pct(ms, 50), "p99_ms": _pct(ms, 99), "max_ms": ms[-1], "mean_ms": statistics.fmean(ms),
            **{f"{k}_p{p}": _pct(v, p) for k, v in parts.items() for p in (50, 99)}})  # fmt: skip


async def paced_send(raw: _PacedSender, rate: int, total: int) -> tuple[dict[bytes, float], dict[bytes, float], float]:
    """Send ``total`` messages at ``rate`` (ticks of 1 ms); returns each key's perf_counter and wall-clock (ms)
    send times and the rate achieved."""
    loop = asyncio.get_running_loop()
    sent: dict[bytes, float] = {}
    wall: dict[bytes, float] = {}
    t0 = loop.time()
    for i in range(total):
        await _pace(loop, t0 + i / rate, i, rate)
        key = f"{i:016d}".encode()
        sent[key] = t = time.perf_counter()
        raw.sent_at.append(t)
        wall[key] = time.time() * 1000
        raw.send(i, key)
    return sent, wall, total / (loop.time() - t0)


async def wait_dispatched(namesrv: str, acked: int, timeout: float = 300.0) -> float:
    """Seconds until the topic's ConsumeQueues hold ``acked`` messages (the broker's reput has caught up)."""
    t0 = time.monotonic()
    async with Admin(namesrv) as admin:
        while sum(q.max_offset for q in await admin.topic_status(TOPIC)) < acked:
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"broker dispatched fewer than {acked} messages after {timeout:.0f}s")
            await asyncio.sleep(0.05)
    return time.monotonic() - t0


def _pct(sorted_vals: list[float], p: float) -> float:
    return sorted_vals[min(len(sorted_vals) - 1, int(len(sorted_vals) * p / 100))]


def frame_sizes() -> dict[str, int]:
    """Request/response frame sizes of one single send and one batch of BATCH, as our client/broker send them."""
    props = "TAGS\x01TagA\x02KEYS\x01ORDER-0000000001\x02WAIT\x01true\x02UNIQ_KEY\x01" + "A" * 32 + "\x02"
    header = h.SendMessageRequestHeaderV2(
        a="bench_producer", b=TOPIC, c=AUTO_CREATE_TOPIC_KEY_TOPIC, d=4, e=3, f=0, g=int(time.time() * 1000), h=0,
        i=props, j=0, k=False, m=False, n="bench-a",
    )  # fmt: skip
    req = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header, b"x" * BODY)
    resp_header = h.SendMessageResponseHeader(msg_id="7F00000100002A9F" + "0" * 16, queue_id=3, queue_offset=123456,
                                              transaction_id="A" * 32)  # fmt: skip
    ext = {properties.PROPERTY_MSG_REGION: DEFAULT_REGION_ID, properties.PROPERTY_TRACE_SWITCH: "true"}
    resp = req.response(0, None, resp_header, ext=ext)
    item = len(props) + BODY + 22
    batch_req = RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, header, b"x" * (item * BATCH))
    batch_header = h.SendMessageResponseHeader(msg_id=",".join(["7F00000100002A9F" + "0" * 16] * BATCH), queue_id=3,
                                               queue_offset=123456)  # fmt: skip
    batch_resp = req.response(0, None, batch_header, ext=ext)
    return {"single_request": len(req.encode()), "single_reply": len(resp.encode()),
            "batch_request": len(batch_req.encode()), "batch_reply": len(batch_resp.encode())}  # fmt: skip


async def broker_phase(b: BrokerProcess, profile_only: bool) -> dict:
    await b.wait_ready()
    async with Admin(b.namesrv_addr) as admin:
        await admin.create_topic(TOPIC, broker_addr=b.broker_addr, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
    out: dict = {}
    p1 = await Producer("bench_producer", b.namesrv_addr, connections_per_addr=1).start()
    p8 = await Producer("bench_producer8", b.namesrv_addr, connections_per_addr=8).start()
    try:
        deadline = time.monotonic() + 30
        while len(await p1.publish_queues(TOPIC, refresh=True)) < QUEUES:
            if time.monotonic() > deadline:
                raise RuntimeError("BenchTopic route never showed 8 queues")
            await asyncio.sleep(0.2)
        await p8.publish_queues(TOPIC, refresh=True)
        await send_rate(p1, _n(WARMUP), 32)  # connections, routes, the broker's first segment
        await send_rate(p8, _n(WARMUP), 64)
        singles, batches = raw_frames(RAW_FRAMES), raw_frames(RAW_FRAMES // 8, BATCH)
        addr = b.broker_addr
        if os.environ.get("BENCH_ONLY") == "latency":
            await latency_rows(b, out)
            return out
        if profile_only:
            out["single_8"] = d = {}
            with b.measured(d):
                d["msgs_per_s"] = await raw_rate(addr, singles, 8, WINDOW_8, _n(SINGLE_COUNT))
            return out
        for name, conns, window in (("single_1", 1, WINDOW_1), ("single_8", 8, WINDOW_8)):
            print(f"  [{name}]", flush=True)
            out[name] = d = {"window": window}
            with b.measured(d):
                d["msgs_per_s"] = await raw_rate(addr, singles, conns, window, _n(SINGLE_COUNT))
        print("  [single_8_client]", flush=True)  # the same through the Python Producer, for its cost
        out["single_8_client"] = d = {"window": WINDOW_8}
        with b.measured(d):
            d["msgs_per_s"] = await send_rate(p8, _n(SINGLE_COUNT) // 2, WINDOW_8)
        print("  [batch_8]", flush=True)
        await raw_rate(addr, batches, 8, 4, _n(20), BATCH)
        out["batch_8"] = d = {"window_batches": BATCH_WINDOW}
        with b.measured(d):
            d["msgs_per_s"] = await raw_rate(addr, batches, 8, BATCH_WINDOW, _n(BATCH_COUNT) // BATCH, BATCH)
        # Everything acknowledged so far must be dispatched (ConsumeQueue) before latency means anything.
        acked = (2 * _n(WARMUP) + 2 * _n(SINGLE_COUNT) + _n(SINGLE_COUNT) // 2
                 + (_n(20) + _n(BATCH_COUNT) // BATCH) * BATCH)  # fmt: skip
        out["dispatch_catch_up_s"] = await wait_dispatched(b.namesrv_addr, acked)
        print(f"  [dispatch caught up {out['dispatch_catch_up_s']:.1f} s after the batch phase]", flush=True)
        await latency_rows(b, out)
    finally:
        await p1.shutdown()
        await p8.shutdown()
    return out


async def sync_flush_phase(b: BrokerProcess) -> dict:
    """Single sends to a SYNC_FLUSH broker, SYNC_WINDOW in flight over 1 and over SYNC_WINDOW connections."""
    await b.wait_ready()
    async with Admin(b.namesrv_addr) as admin:
        await admin.create_topic(TOPIC, broker_addr=b.broker_addr, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
    singles = raw_frames(RAW_FRAMES)
    out: dict = {}
    await raw_rate(b.broker_addr, singles, 1, SYNC_WINDOW, _n(WARMUP))  # the first segment, the topic's queues
    await next_segment_written(b.root / "store" / "commitlog")
    for name, conns in SYNC_ROWS:
        print(f"  [{name}]", flush=True)
        out[name] = d = {"connections": conns, "window": SYNC_WINDOW}
        with b.measured(d):
            d["msgs_per_s"] = await raw_rate(b.broker_addr, singles, conns, SYNC_WINDOW, _n(SYNC_COUNT))
    return out


def _latency_row_wanted(key: str) -> bool:
    wanted = os.environ.get("BENCH_LATENCY_ROWS", "")
    return not wanted or key in wanted.split(",")


async def next_segment_written(commitlog: Path, timeout: float = READY_TIMEOUT) -> None:
    """Wait until the broker has written the CommitLog's next segment ahead (``preallocate_next``): a 1 GiB
    file of zeros written and fsynced once per segment, which inside a short timed row took about 0.7 s of the
    broker's CPU (30-40 us per ack of a 20,000-send row) and loaded the disk its fdatasyncs wait on."""
    deadline = time.monotonic() + timeout
    while sum(1 for p in commitlog.iterdir() if p.name.isdigit()) < 2:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{commitlog}: the next segment was not written within {timeout:.0f}s")
        await asyncio.sleep(0.05)


async def latency_rows(b: BrokerProcess, out: dict) -> None:
    for key, rate in LATENCY_ROWS:
        if not _latency_row_wanted(key):
            continue
        print(f"  [{key} {rate}/s]", flush=True)
        out[key] = d = {}
        with b.measured(d):
            d.update(await raw_latency(b.namesrv_addr, b.broker_addr, rate, LATENCY_SECONDS * SCALE,
                                       group=f"bench_{key}"))  # fmt: skip
    for key, rate in LATENCY_PROCESS_ROWS:
        if not _latency_row_wanted(key):
            continue
        print(f"  [{key} {rate}/s, the consumer in its own process]", flush=True)
        out[key] = {}
        await process_latency(b, rate, LATENCY_SECONDS * SCALE, f"bench_{key}", out[key])


def baseline_phase(sizes: dict[str, int]) -> dict:
    out = {}
    port = free_port()
    cmd = [sys.executable, "-c", "from benchmarks.bench_broker import echo_server_main; echo_server_main()", str(port)]
    runs = (
        ("single_1", sizes["single_request"], sizes["single_reply"], 1, WINDOW_1, _n(BASELINE_COUNT)),
        ("single_8", sizes["single_request"], sizes["single_reply"], 8, WINDOW_8, _n(BASELINE_COUNT)),
        ("batch_8", sizes["batch_request"], sizes["batch_reply"], 8, BATCH_WINDOW, _n(BASELINE_COUNT) // BATCH * 4),
    )
    for name, req, reply, conns, window, total in runs:
        proc = subprocess.Popen([*cmd, str(reply)], cwd=Path(__file__).resolve().parent.parent)
        try:

            async def go(req=req, reply=reply, conns=conns, window=window, total=total) -> tuple[float, CpuMeter]:
                deadline = time.monotonic() + 20
                while True:
                    try:
                        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                            break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.05)
                await echo_rate(port, req, reply, conns, window, min(total, 2000))
                with CpuMeter() as cpu:
                    rate = await echo_rate(port, req, reply, conns, window, total)
                return rate, cpu

            rate, cpu = run(go())
            per = BATCH if name.startswith("batch") else 1
            out[name] = {"requests_per_s": rate, "msgs_per_s": rate * per, **cpu.as_dict()}
        finally:
            proc.terminate()
            proc.wait()
    return out


def print_report(r: dict) -> None:
    m = r["machine"]
    print(f"machine: {m['nproc']} cores, {m['memory_gib']} GiB, {m['cpu']}, Python {m['python']}, {m['date']}")
    print(codecs_line(m) + "; the broker process (mqlake up) inherits the choice, the load generator too;")
    print("raw-protocol frames encoded once send (the broker gets the cores); latency: a PushConsumer receives")
    s = r["frame_sizes"]
    print(f"BENCH_SCALE={m['bench_scale']}; 1 KiB bodies, ASYNC_FLUSH, topic of {QUEUES} queues; frames: send "
          f"{s['single_request']} B -> {s['single_reply']} B, batch of {BATCH} {s['batch_request']} B -> "
          f"{s['batch_reply']} B")  # fmt: skip
    print("gen / broker cpu = cores used by the load generator (this process) / the broker process; bg cpu = cores")
    print("used by everything else on the machine meanwhile (other engineers' jobs); raw echo rows: gen = client\n")
    print("broker us/msg = broker CPU per message (load-independent); 1-core ceiling = 10^6 / that;")
    print("loop us/msg = the part of it in the event loop's thread (the request path; the rest is dispatch)\n")
    hdr = (f"{'run':<34}{'msgs/s':>10}{'raw echo':>11}{'vs raw':>8}{'gen cpu':>9}{'broker cpu':>11}{'bg cpu':>8}"
           f"{'broker us/msg':>15}{'loop us/msg':>13}{'1-core ceiling':>16}")  # fmt: skip
    print(hdr)
    print("-" * len(hdr))
    labels = {"single_1": f"send, 1 connection, {WINDOW_1} in flight", "single_8": f"send, 8 connections, {WINDOW_8}"
              " in flight", "single_8_client": "  the same, Python Producer",
              "batch_8": f"batch of {BATCH}, 8 conns, {BATCH_WINDOW} in flight"}  # fmt: skip
    for k, label in labels.items():
        d, base = r["broker"][k], r["baseline"][k.removesuffix("_client")]
        print(f"{label:<34}{d['msgs_per_s']:>10,.0f}{base['msgs_per_s']:>11,.0f}"
              f"{d['msgs_per_s'] / base['msgs_per_s']:>8.2f}{d['own_cpu_cores']:>9.2f}{d['broker_cpu_cores']:>11.2f}"
              f"{d['bg_cpu_cores']:>8.2f}{d['broker_us_per_msg']:>15.1f}{d['loop_us_per_msg']:>13.1f}"
              f"{1e6 / d['broker_us_per_msg']:>16,.0f}")
    print()
    print_latency(r)
    if "sync_flush" in r:
        print_sync(r)
    print("\ntargets")
    for name, ok, got, want in r["targets"]:
        print(f"  {name:<40} {'met' if ok else 'NOT met':<8} {got:,.1f} (target {want:,})")


def print_latency(r: dict) -> None:
    print(f"the broker's GIL switch interval: {r['broker_switch_interval'] * 1000:g} ms")
    for key, _ in LATENCY_ROWS + LATENCY_PROCESS_ROWS:
        if key not in r["broker"]:
            continue
        lat = r["broker"][key]
        where = ""
        if lat.get("consumer") == "process":
            where = f" (the consumer in its own process, {lat['consumer_cpu_cores']:.2f} cores; in bg cpu)"
        print(f"produce->consume latency{where} at {lat['rate']:,} msgs/s (achieved {lat['achieved_send_rate']:,.0f}), "
              f"{lat['messages']:,} of {lat['sent']:,} received: p50 {lat['p50_ms']:.2f} ms, "
              f"p99 {lat['p99_ms']:.2f} ms, max {lat['max_ms']:.2f} ms")
        print(f"    gen cpu {lat['own_cpu_cores']:.2f}, broker cpu {lat['broker_cpu_cores']:.2f}, "
              f"bg cpu {lat['bg_cpu_cores']:.2f}; p50 / p99 ms: send -> answer {lat.get('ack_ms_p50', 0):.2f} / "
              f"{lat.get('ack_ms_p99', 0):.2f}, send -> store timestamp {lat['stored_ms_p50']:.0f} / "
              f"{lat['stored_ms_p99']:.0f}, stored -> handler {lat['stored_to_handler_ms_p50']:.0f} / "
              f"{lat['stored_to_handler_ms_p99']:.0f}")


def print_sync(r: dict) -> None:
    print(f"\nSYNC_FLUSH broker (flushDiskType=SYNC_FLUSH), single sends, {SYNC_WINDOW} in flight; a send is answered"
          " after the fdatasync covering it")  # fmt: skip
    for name, conns in SYNC_ROWS:
        d = r["sync_flush"][name]
        print(f"  {conns:>2} connection(s): {d['msgs_per_s']:>9,.0f} acked/s; gen cpu {d['own_cpu_cores']:.2f}, broker"
              f" cpu {d['broker_cpu_cores']:.2f}, bg cpu {d['bg_cpu_cores']:.2f}; broker {d['broker_us_per_msg']:.1f}"
              f" us/msg, loop {d['loop_us_per_msg']:.1f} us/msg")  # fmt: skip


def run_sync_flush(tmp: Path) -> dict:
    b = BrokerProcess(tmp / "sync", flush="SYNC_FLUSH")
    try:
        return run(sync_flush_phase(b))
    finally:
        b.stop()


def profile_broker(tmp: Path) -> dict:
    prof = tmp / "broker.prof"
    b = BrokerProcess(tmp, profile_to=prof)
    try:
        out = run(broker_phase(b, profile_only=True))
    finally:
        b.stop()
    print(f"8-connection sends under cProfile: {out['single_8']['msgs_per_s']:,.0f} msgs/s")
    stats = pstats.Stats(str(prof))
    # Coroutines waiting in the event loop show up as time in asyncio's run(); only mqlake's code is of interest.
    stats.sort_stats("tottime").print_stats(r"(broker|store)/", 25)
    stats.sort_stats("cumulative").print_stats(r"(broker|store)/", 40)
    return out


def main() -> dict:
    with tempfile.TemporaryDirectory(prefix="mqlake-bench-broker-", dir="/tmp") as d:
        tmp = Path(d)
        if os.environ.get("BENCH_PROFILE", "") not in ("", "0"):
            return profile_broker(tmp)
        t0 = time.perf_counter()
        results: dict = {"machine": machine(), "frame_sizes": frame_sizes(),
                         "broker_switch_interval": float(SWITCH_INTERVAL or 0.005)}  # fmt: skip
        (tmp / "sync").mkdir()
        if os.environ.get("BENCH_ONLY") == "sync_flush":
            results["sync_flush"] = sf = run_sync_flush(tmp)
            results["targets"] = [("SYNC_FLUSH, 64 in flight, 1 connection (acked/s)",
                                   sf["sync_1x64"]["msgs_per_s"] >= TARGET_SYNC, sf["sync_1x64"]["msgs_per_s"],
                                   TARGET_SYNC)]  # fmt: skip
            results["wall_seconds"] = time.perf_counter() - t0
            return emit("bench_broker", results, lambda r: (print_sync(r), print(r["targets"])))
        if os.environ.get("BENCH_ONLY") != "latency":
            print("  [raw echo baseline]", flush=True)
            results["baseline"] = baseline_phase(results["frame_sizes"])
        b = BrokerProcess(tmp)
        try:
            results["broker"] = run(broker_phase(b, profile_only=False))
        finally:
            b.stop()
        if os.environ.get("BENCH_ONLY") == "latency":
            results["wall_seconds"] = time.perf_counter() - t0
            return emit("bench_broker", results, print_latency)
        results["sync_flush"] = run_sync_flush(tmp)
        br = results["broker"]
        results["targets"] = [
            ("send, 8 connections (msgs/s)", br["single_8"]["msgs_per_s"] >= TARGET_SINGLE_8,
             br["single_8"]["msgs_per_s"], TARGET_SINGLE_8),
            ("batches of 32 (msgs/s)", br["batch_8"]["msgs_per_s"] >= TARGET_BATCH, br["batch_8"]["msgs_per_s"],
             TARGET_BATCH),
            ("latency p99 at 5,000 msgs/s (ms)", br["latency"]["p99_ms"] <= TARGET_P99_MS, br["latency"]["p99_ms"],
             TARGET_P99_MS),
            ("latency p99 at 20,000 msgs/s (ms)", br["latency_high"]["p99_ms"] <= TARGET_P99_HIGH_MS,
             br["latency_high"]["p99_ms"], TARGET_P99_HIGH_MS),
            ("  the same, the consumer in its own process", br["latency_high_proc"]["p99_ms"] <= TARGET_P99_HIGH_MS,
             br["latency_high_proc"]["p99_ms"], TARGET_P99_HIGH_MS),
            ("SYNC_FLUSH, 64 in flight, 1 connection (acked/s)",
             results["sync_flush"]["sync_1x64"]["msgs_per_s"] >= TARGET_SYNC,
             results["sync_flush"]["sync_1x64"]["msgs_per_s"], TARGET_SYNC),
        ]  # fmt: skip
        results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_broker", results, print_report)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
