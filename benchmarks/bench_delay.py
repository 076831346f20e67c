"""Delayed delivery lateness (issue 15): 10 k messages due within the same second, through delay levels and
through 5.x timers, each message's lateness measured against the time it was due.

Run: ``.venv/bin/python -m benchmarks bench_delay`` (or ``make bench``).

Environment: BENCH_SCALE multiplies the message count (default 1.0); BENCH_JSON also writes the JSON there.

What is measured, exactly:
  * ``mqlake up`` in its own process (ASYNC_FLUSH, temporary store) with ``messageDelayLevel=4s``: level 1 is 4 s,
    longer than the sends take, so every message is parked before the first is due.
  * Delay levels: COUNT messages sent with level 1 (broker/client Producer, WINDOW sends in flight, QUEUES queues).
    Each is due at its parked record's store time + 4 s (read back with VIEW_MESSAGE_BY_ID afterwards); the send
    span (about half a second) is the window they fall due in.
  * Timers: COUNT messages with the same ``TIMER_DELIVER_MS`` T, a whole second at least 4 s ahead: all due in the
    same millisecond, the worst case (RocketMQ rounds T into the slot before it, dequeued at T).
  * Lateness, per message: ``store`` = the delivered copy's store time - due (what the broker adds); ``consumer``
    = the moment a PushConsumer (long polling, same process) is handed it - due (what an application sees).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import tempfile
import time
from pathlib import Path

from benchmarks.bench_broker import BrokerProcess, _pct
from benchmarks.bench_store import machine
from benchmarks.report import emit
from broker.client import Admin, Message, MessageExt, Producer, PushConsumer
from broker.client.message import ConsumeFromWhere
from broker.remoting.loop import run

COUNT = 10_000
WINDOW = 128
QUEUES = 4
DELAY_MS = 4000
TARGET_P99_MS = 100.0


def _stats(vals: list[float]) -> dict:
    s = sorted(vals) or [math.nan]
    return {"p50_ms": _pct(s, 50), "p99_ms": _pct(s, 99), "max_ms": s[-1], "min_ms": s[0]}


async def _variant(b: BrokerProcess, name: str, count: int, timer: bool) -> dict:
    topic, group = f"Delay_{name}", f"cg_delay_{name}"
    received: dict[str, tuple[float, int]] = {}  # UNIQ_KEY -> (wall ms handed over, delivered store time)
    done = asyncio.Event()
    parked: dict[str, str] = {}  # UNIQ_KEY -> offset msg id of the parked record

    async def handler(m: MessageExt) -> None:
        if m.properties.get("REAL_TOPIC"):
            received[m.msg_id] = (time.time() * 1000, m.store_timestamp)
            if len(received) >= count:
                done.set()

    async with Admin(b.namesrv_addr) as admin:
        await admin.create_topic(topic, broker_addr=b.broker_addr, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
        deadline = time.monotonic() + 30
        while await admin.topic_route(topic) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    async with Producer(f"pg_delay_{name}", b.namesrv_addr) as p:
        consumer = PushConsumer(group, b.namesrv_addr, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        consumer.subscribe(topic, "*", handler)
        await consumer.start()
        try:
            deadline = time.monotonic() + 30
            while len(consumer.assigned_queues) < QUEUES and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # every queue's pull parked at the broker
            due_at = (int(time.time()) + DELAY_MS // 1000 + 1) * 1000  # a whole second, >= 4 s ahead
            budget = itertools.count()
            body = b"x" * 256

            async def worker() -> None:
                while next(budget) < count:
                    if timer:
                        msg = Message(topic, body, tags="TagT", properties={"TIMER_DELIVER_MS": str(due_at)})
                    else:
                        msg = Message(topic, body, tags="TagD", delay_time_level=1)
                    r = await p.send(msg)
                    parked[r.msg_id] = r.offset_msg_id

            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(WINDOW)))
            send_span = time.perf_counter() - t0
            with contextlib.suppress(TimeoutError):  # what did not arrive shows as received < messages
                async with asyncio.timeout(DELAY_MS / 1000 + 60):
                    await done.wait()
        finally:
            await consumer.shutdown()
    if timer:
        due = dict.fromkeys(parked, float(due_at))
    else:
        due = {}
        async with Admin(b.namesrv_addr) as admin:
            sem = asyncio.Semaphore(64)

            async def look(uniq: str, off_id: str) -> None:
                async with sem:
                    due[uniq] = (await admin.view_message(off_id)).store_timestamp + DELAY_MS

            await asyncio.gather(*(look(u, o) for u, o in parked.items()))
    store_late = [received[u][1] - due[u] for u in received]
    consumer_late = [received[u][0] - due[u] for u in received]
    handoff = [wall - stored for wall, stored in received.values()]
    spread = max(due.values()) - min(due.values())
    return {
        "messages": count, "received": len(received), "send_span_s": send_span, "due_spread_ms": spread,
        "store": _stats(store_late), "consumer": _stats(consumer_late), "handoff": _stats(handoff),
        "early": sum(1 for v in store_late if v < 0),
    }  # fmt: skip


def print_report(r: dict) -> None:
    print(f"{'variant':<14}{'msgs':>7}{'due within':>12}{'store p50':>11}{'p99':>8}{'max':>8}"
          f"{'consumer p50':>14}{'p99':>8}{'max':>8}{'early':>7}")  # fmt: skip
    for name in ("delay_level", "timer"):
        v = r[name]
        s, c = v["store"], v["consumer"]
        print(
            f"{name:<14}{v['received']:>7,}{v['due_spread_ms']:>10.0f}ms{s['p50_ms']:>11.1f}{s['p99_ms']:>8.1f}"
            f"{s['max_ms']:>8.1f}{c['p50_ms']:>14.1f}{c['p99_ms']:>8.1f}{c['max_ms']:>8.1f}{v['early']:>7}"
        )
    print("(lateness in ms after the time each message was due; 'early' counts deliveries before it)")
    print("\ntargets")
    for name, ok, got, want in r["targets"]:
        print(f"  {name:<52} {'met' if ok else 'NOT met':<8} {got:,.1f} (target {want:,})")


def main() -> dict:
    count = max(1, int(COUNT * float(os.environ.get("BENCH_SCALE", "1") or 1)))
    with tempfile.TemporaryDirectory(prefix="mqlake-bench-delay-", dir="/tmp") as d:
        t0 = time.perf_counter()
        results: dict = {"machine": machine()}
        b = BrokerProcess(Path(d), extra={"messageDelayLevel": f"{DELAY_MS // 1000}s"})
        try:
            run(b.wait_ready())
            for name, timer in (("delay_level", False), ("timer", True)):
                print(f"  [{name}: {count:,} messages]", flush=True)
                results[name] = run(_variant(b, name, count, timer))
        finally:
            b.stop()
        results["targets"] = [
            (f"{name} delivery lateness p99, consumer (ms)", results[name]["consumer"]["p99_ms"] <= TARGET_P99_MS,
             results[name]["consumer"]["p99_ms"], TARGET_P99_MS)
            for name in ("delay_level", "timer")
        ]  # fmt: skip
        results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_delay", results, print_report)


if __name__ == "__main__":
    main()
