"""Remoting layer benchmarks: the frame codec, and RemotingServer/RemotingClient request/response over
loopback with nothing behind the handler, so the figures are the layer's own cost.

Run: ``.venv/bin/python -m benchmarks bench_remoting``.

Environment:
  BENCH_SCALE    multiplies every request count (default 1.0; 0.1 for a smoke run)
  BENCH_JSON     a path: also write the JSON results there
  BENCH_PROFILE  1: profile the server process during the last loopback phase and print its top functions

What is measured:
  * Codec: encode and decode of a SEND_MESSAGE_V2 request as the Java client sends it (14 short ext fields,
    1 KiB body), in both header types, and the typed header parse (``SendMessageRequestHeaderV2.from_ext``).
  * Loopback: an echo RemotingServer in its own process (uvloop) answers each SEND_MESSAGE_V2 with a
    SendMessageResponseHeader and the MSG_REGION/TRACE_ON ext fields (the broker's response shape, no body);
    this process's RemotingClient keeps WINDOW requests in flight over 1 or 8 connections.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
import timeit

from benchmarks.bench_store import CpuMeter
from benchmarks.report import machine
from broker.remoting import headers as h
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, SerializeType
from broker.remoting.command import RemotingCommand
from broker.remoting.loop import run
from broker.remoting.server import RemotingServer
from store.constants import AUTO_CREATE_TOPIC_KEY_TOPIC, DEFAULT_REGION_ID
from store.format import properties

SCALE = float(os.environ.get("BENCH_SCALE", "1") or 1)
BODY = b"x" * 1024
PHASES = [  # (name, connections, requests in flight, requests)
    ("sequential, 1 connection", 1, 1, 10_000),
    ("64 in flight, 1 connection", 1, 64, 100_000),
    ("256 in flight, 8 connections", 8, 256, 200_000),
]


def send_request() -> RemotingCommand:
    header = h.SendMessageRequestHeaderV2(
        a="BenchProducerGroup", b="BenchTopic", c=AUTO_CREATE_TOPIC_KEY_TOPIC, d=4, e=3, f=0, g=1_795_000_000_000, h=0,
        i="KEYS\x01ORDER-0000000001\x02TAGS\x01TagA\x02WAIT\x01true\x02UNIQ_KEY\x01" + "A" * 32 + "\x02",
        j=0, k=False, l=16, m=False, n="broker-a",
    )
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header, BODY)


def bench_codec() -> dict[str, float]:
    out = {}
    number = max(1000, int(50_000 * SCALE))
    for st in SerializeType:
        cmd = send_request()
        cmd.serialize_type = st
        cmd.opaque = 12345
        frame = cmd.encode()[4:]
        out[f"encode {st.name} us"] = timeit.timeit(cmd.encode, number=number) / number * 1e6
        decode_s = timeit.timeit(lambda f=frame: RemotingCommand.decode(f), number=number)
        out[f"decode {st.name} us"] = decode_s / number * 1e6
    ext = send_request().ext_fields
    out["SendMessageRequestHeaderV2.from_ext us"] = (
        timeit.timeit(lambda: h.SendMessageRequestHeaderV2.from_ext(ext), number=number) / number * 1e6
    )
    return out


# --- the echo server process ---------------------------------------------------------------------------------------


async def _serve() -> None:
    server = RemotingServer("127.0.0.1", 0, name="bench-echo")
    header = h.SendMessageResponseHeader(msg_id="7F00000100002A9F0000000000000000", queue_id=3, queue_offset=1)
    ext = {properties.PROPERTY_MSG_REGION: DEFAULT_REGION_ID, properties.PROPERTY_TRACE_SWITCH: "true"}

    async def send(cmd: RemotingCommand, conn) -> RemotingCommand:
        return cmd.response(0, header=header, ext=ext)

    server.register(RequestCode.SEND_MESSAGE_V2, send)
    await server.start()
    print(server.port, flush=True)
    profiler = cProfile.Profile() if os.environ.get("BENCH_PROFILE") else None
    loop = asyncio.get_running_loop()
    # stdin carries commands from the parent: "profile" starts the profiler, EOF ends the process
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        if line.strip() == b"profile" and profiler is not None:
            profiler.enable()
    if profiler is not None:
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(20)
    await server.stop()


# --- the load generator --------------------------------------------------------------------------------------------


def _proc_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CpuMeter._TICK  # utime, stime


async def _phase(addr: str, connections: int, window: int, count: int) -> dict[str, float]:
    client = RemotingClient(connections_per_addr=connections)
    latencies: list[float] = []
    for _ in range(connections * 4):  # connect every channel and warm up
        await client.invoke(addr, send_request())
    remaining = count

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            cmd = send_request()
            t = time.perf_counter()
            await client.invoke(addr, cmd, timeout=30)
            latencies.append(time.perf_counter() - t)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(window)))
    elapsed = time.perf_counter() - start
    await client.close()
    latencies.sort()
    return {
        "requests": count,
        "req/s": round(count / elapsed),
        "p50 ms": round(statistics.median(latencies) * 1000, 3),
        "p99 ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 3),
    }


def bench_loopback() -> dict[str, dict[str, float]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bench_remoting", "serve"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ},
    )
    try:
        port = int(proc.stdout.readline())
        addr = f"127.0.0.1:{port}"
        results = {}
        for i, (name, connections, window, count) in enumerate(PHASES):
            if i == len(PHASES) - 1 and os.environ.get("BENCH_PROFILE"):
                proc.stdin.write(b"profile\n")
                proc.stdin.flush()
            server_cpu = _proc_cpu_seconds(proc.pid)
            wall = time.perf_counter()
            with CpuMeter() as meter:
                results[name] = run(_phase(addr, connections, window, max(100, int(count * SCALE))))
            server_cores = (_proc_cpu_seconds(proc.pid) - server_cpu) / (time.perf_counter() - wall)
            # the server process is "other" to CpuMeter: take it out so bg cpu is only the neighbours
            results[name].update({
                "client cores": round(meter.own_cores, 2),
                "server cores": round(server_cores, 2),
                "bg cpu": round(meter.other_cores - server_cores, 2),
            })
            print(f"  {name:32s} {results[name]}", flush=True)
        return results
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def main() -> dict:
    codec = bench_codec()
    for name, value in codec.items():
        print(f"  {name:40s} {value:8.2f}")
    results = {"machine": machine(), "codec": codec, "loopback": bench_loopback()}
    text = json.dumps(results)
    print("JSON", text)
    if os.environ.get("BENCH_JSON"):
        with open(os.environ["BENCH_JSON"], "w") as f:
            f.write(text)
    return results


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        run(_serve())
    else:
        main()
