"""What a send that auto-creates its topic costs now that topics.json is written before the ack.

Run: ``.venv/bin/python -m benchmarks bench_topic_create`` (or ``make bench``).  BENCH_SCALE multiplies the counts.

What is measured, exactly:
  * A BrokerController (ASYNC_FLUSH, a temporary store on this machine's disk, no NameServer) in this process;
    SEND_MESSAGE_V2 requests of 1 KiB handed straight to the send handler (``SendProcessor.send_inline``) on the
    broker's event loop, awaiting what it returns: the broker-side latency of a send, without the network.
  * First sends (each to a topic the broker does not know, auto-created from TBW102: the topics.json write in a
    worker thread, crash-safe with its fsyncs, is awaited before the reply) against sends to a topic that
    exists, with a table of 100 and of 5,000 topics (the file written grows with the table).
  * While first sends wait for their write, the event loop keeps serving: the longest gap between two ticks of a
    1 ms ticker running beside them is reported (the loop is blocked only for the table copy and the send itself).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.report import emit, machine
from broker.config import build_configs
from broker.remoting import headers as h
from broker.remoting.codes import RequestCode
from broker.remoting.command import RemotingCommand
from broker.remoting.loop import run
from broker.remoting.protocol.topic import TopicConfig
from broker.server.controller import BrokerController
from broker.server.send import SendProcessor
from store.constants import AUTO_CREATE_TOPIC_KEY_TOPIC

SCALE = float(os.environ.get("BENCH_SCALE", "1") or 1)
FIRST_SENDS = max(20, int(100 * SCALE))
TABLE_SIZES = (100, 5000)


class _Peer:
    remote_addr = "127.0.0.1:5555"
    remote_host = ("127.0.0.1", 5555)


def _request(topic: str) -> RemotingCommand:
    v1 = h.SendMessageRequestHeader(
        producer_group="pg", topic=topic, default_topic=AUTO_CREATE_TOPIC_KEY_TOPIC, default_topic_queue_nums=4,
        queue_id=0, sys_flag=0, born_timestamp=int(time.time() * 1000), flag=0,
    )  # fmt: skip
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, h.SendMessageRequestHeaderV2.from_v1(v1), b"x" * 1024)


async def _send(proc: SendProcessor, topic: str) -> float:
    t0 = time.perf_counter()
    resp = proc.send_inline(_request(topic), _Peer())
    if isinstance(resp, bytes):  # a known topic's send answered by the fast path: the reply frame itself
        resp = RemotingCommand.decode(resp[4:])
    elif not isinstance(resp, RemotingCommand):
        resp = await resp
    assert resp.code == 0, resp.remark
    return time.perf_counter() - t0


async def _ticker(gaps: list[float], stop: asyncio.Event) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


async def _measure(store_dir: Path, table_size: int) -> dict:
    bc, sc = build_configs({"listenPort": "0", "storePathRootDir": str(store_dir), "flushDiskType": "ASYNC_FLUSH",
                            "mappedFileSizeCommitLog": str(64 * 1024 * 1024)})  # fmt: skip
    controller = BrokerController(bc, sc)
    await controller.start()
    try:
        for i in range(table_size):
            controller.topics.table[f"Existing{i}"] = TopicConfig(topic_name=f"Existing{i}", read_queue_nums=4,
                                                                  write_queue_nums=4)  # fmt: skip
        controller.topics.changed()
        await controller.topics_persisted()
        proc = SendProcessor(controller)
        await _send(proc, "Warm")
        existing = [await _send(proc, "Warm") for _ in range(FIRST_SENDS)]
        gaps: list[float] = []
        stop = asyncio.Event()
        ticker = asyncio.create_task(_ticker(gaps, stop))
        first = [await _send(proc, f"New{table_size}_{i}") for i in range(FIRST_SENDS)]
        stop.set()
        await ticker
    finally:
        await controller.shutdown()
    return {
        "first_send_ms_median": statistics.median(first) * 1e3,
        "first_send_ms_p90": sorted(first)[int(len(first) * 0.9)] * 1e3,
        "existing_send_ms_median": statistics.median(existing) * 1e3,
        "loop_longest_gap_ms": max(gaps) * 1e3 if gaps else 0.0,
    }


def print_report(r: dict) -> None:
    for size in TABLE_SIZES:
        m = r[f"topics_{size}"]
        print(f"{size} topics: first send {m['first_send_ms_median']:.2f} ms median "
              f"(p90 {m['first_send_ms_p90']:.2f} ms), to an existing topic {m['existing_send_ms_median']:.3f} ms; "
              f"longest event-loop gap meanwhile {m['loop_longest_gap_ms']:.1f} ms")  # fmt: skip


def main() -> dict:
    t0 = time.time()
    results: dict = {}
    for size in TABLE_SIZES:
        with tempfile.TemporaryDirectory(prefix="bench_topic_create_") as tmp:
            results[f"topics_{size}"] = run(_measure(Path(tmp), size))
    results["first_sends"] = FIRST_SENDS
    results["machine"] = machine()
    results["wall_seconds"] = time.time() - t0
    return emit("bench_topic_create", results, print_report)


if __name__ == "__main__":
    main()
