"""Replay throughput: ``pipelines.replay`` unthrottled, next to our client's raw produce rate measured
against the same broker in the same run.

Run: ``.venv/bin/python -m benchmarks bench_replay`` (or ``make bench``).

Environment:
  BENCH_SCALE          multiplies the message count (default 1.0; 0.1 for a smoke run)
  BENCH_JSON           a path: also write the JSON results there
  BENCH_REPLAY_SPARK   0: skip the Spark engine's run (default 1)
  BENCH_PROFILE        1: run the local engine's replay under cProfile and print where its time goes

What is measured, exactly:
  * The broker is ``mqlake up`` in its own process (bench_broker.BrokerProcess: ASYNC_FLUSH, a temporary store,
    free ports).  1 KiB bodies with TAGS and KEYS, topic ``BenchTopic`` of 8 queues.
  * Raw produce: this process (uvloop) with broker/client ``Producer``, the two ways bench_broker measures it:
    ``send`` with 256 in flight over 8 connections, and ``send_batch`` of 32 with 16 batches in flight.  Those
    messages are the replay's source.
  * Replay: ``pipelines.replay.job.replay`` from the live CommitLog (``--store-dir``; no tiered part, the tier's
    read path is bench_tier's) into a new topic, ``--queue-map preserve``, no rate limit: first by the local
    engine (this process, no JVM), then into another topic by the Spark engine on a ``local[*]`` session started
    before its clock (so JVM start-up is not counted).  Two figures each: the *send* rate (messages over the
    span from the first send to the last acknowledgement, across all tasks) and the *end-to-end* rate (messages
    over the whole call: source scan and plan, target creation, progress rows, the sends, report).
  * The target: the local engine's end-to-end rate against the raw single-send produce (the way an
    application publishes one message at a time), and beside it against the batched produce.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path

from benchmarks.bench_broker import (
    BATCH,
    BATCH_WINDOW,
    QUEUES,
    TOPIC,
    WINDOW_8,
    BrokerProcess,
    batch_rate,
    send_rate,
)
from benchmarks.bench_store import CpuMeter
from benchmarks.report import emit, machine
from broker.client import Admin, Producer
from broker.remoting.loop import run

SCALE = float(os.environ.get("BENCH_SCALE", "1") or 1)
SINGLE_COUNT = 40_000
BATCH_COUNT = 160_000
TARGET = "BenchReplayTarget"
TARGET_RATIO = 0.60  # local replay end to end / raw produce (send, 256 in flight)
SPARK = os.environ.get("BENCH_REPLAY_SPARK", "1") != "0"
PROFILE = os.environ.get("BENCH_PROFILE") == "1"


def _n(count: float) -> int:
    return max(BATCH, int(count * SCALE) // BATCH * BATCH)


async def produce_phase(b: BrokerProcess) -> dict:
    await b.wait_ready()
    async with Admin(b.namesrv_addr) as admin:
        await admin.create_topic(TOPIC, broker_addr=b.broker_addr, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
    out: dict = {}
    p8 = await Producer("bench_replay_producer", b.namesrv_addr, connections_per_addr=8).start()
    try:
        deadline = time.monotonic() + 30
        while len(await p8.publish_queues(TOPIC, refresh=True)) < QUEUES:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{TOPIC} route never showed {QUEUES} queues")
        await send_rate(p8, 2_000, 64)  # connections, routes, the broker's first segment
        with CpuMeter() as cpu:
            rate = await send_rate(p8, _n(SINGLE_COUNT), WINDOW_8)
        out["single_8"] = {"msgs_per_s": rate, **cpu.as_dict()}
        with CpuMeter() as cpu:
            rate = await batch_rate(p8, _n(BATCH_COUNT), BATCH_WINDOW)
        out["batch_8"] = {"msgs_per_s": rate, **cpu.as_dict()}
    finally:
        await p8.shutdown()
    out["messages"] = 2_000 + _n(SINGLE_COUNT) + _n(BATCH_COUNT)
    return out


def replay_phase(b: BrokerProcess, work: Path, engine: str) -> dict:
    from pipelines.replay.job import replay
    from pipelines.replay.spec import ReplaySpec

    spark = None
    if engine == "spark":
        from pipelines.spark import get_spark

        spark = get_spark(app_name="mqlake-bench-replay")
        spark.range(1).count()  # the JVM and the first job's start-up are not replay costs
    spec = ReplaySpec(lake=work / "lake", store_dir=work / "store", source_topics=(TOPIC,),
                      target_topic=f"{TARGET}_{engine}", namesrv=b.namesrv_addr,
                      replay_id=f"bench-{engine}")  # fmt: skip
    profile = None
    if PROFILE and engine == "local":
        import cProfile

        profile = cProfile.Profile()
    t0 = time.perf_counter()
    with CpuMeter() as cpu:
        if profile is not None:
            profile.enable()
        report = replay(spec, engine=engine, spark=spark)
        if profile is not None:
            profile.disable()
    wall = time.perf_counter() - t0
    if profile is not None:
        import pstats

        pstats.Stats(profile).sort_stats(os.environ.get("BENCH_PROFILE_SORT", "tottime")).print_stats(30)
    return {
        "messages": report.sent, "send_seconds": report.send_seconds, "send_msgs_per_s": report.rate,
        "wall_seconds": wall, "end_to_end_msgs_per_s": report.sent / wall, "tasks": report.tasks,
        "phases_s": report.phases, **cpu.as_dict(),
    }  # fmt: skip


def print_report(r: dict) -> None:
    m = r["machine"]
    print(f"machine: {m['nproc']} cores, {m['memory_gib']} GiB, {m['cpu']}, Python {m['python']}, {m['date']}")
    p, rp = r["produce"], r["replay"]
    print(f"BENCH_SCALE={m['bench_scale']}; 1 KiB bodies, ASYNC_FLUSH, {TOPIC} of {QUEUES} queues, "
          f"{rp['messages']:,} messages replayed by each engine\n")  # fmt: skip
    hdr = f"{'run':<48}{'msgs/s':>10}{'gen cpu':>9}{'other cpu':>10}"
    print(hdr)
    print("-" * len(hdr))
    rows = (
        (f"produce: send, 8 connections, {WINDOW_8} in flight", p["single_8"]),
        (f"produce: batch of {BATCH}, 8 conns, {BATCH_WINDOW} in flight", p["batch_8"]),
    )
    for label, d in rows:
        print(f"{label:<48}{d['msgs_per_s']:>10,.0f}{d['own_cpu_cores']:>9.2f}{d['other_cpu_cores']:>10.2f}")
    for engine, key in (("local", "replay"), ("spark", "replay_spark")):
        if key not in r:
            continue
        rp = r[key]
        print(f"{f'replay {engine}: send span (first send -> last ack)':<48}{rp['send_msgs_per_s']:>10,.0f}")
        print(f"{f'replay {engine}: end to end (select .. report)':<48}{rp['end_to_end_msgs_per_s']:>10,.0f}"
              f"{rp['own_cpu_cores']:>9.2f}{rp['other_cpu_cores']:>10.2f}")  # fmt: skip
        print(f"  {engine} phases (s), {rp['tasks']} task(s): "
              + json.dumps({k: round(v, 2) for k, v in rp["phases_s"].items()}))
    print("\ntargets")
    for name, ok, got, want in r["targets"]:
        verdict = "" if ok is None else "met" if ok else "NOT met"
        print(f"  {name:<52} {verdict:<8} {got:,.2f}" + ("" if want is None else f" (target {want:,})"))


def main() -> dict:
    with tempfile.TemporaryDirectory(prefix="mqlake-bench-replay-", dir="/tmp") as d:
        work = Path(d)
        t0 = time.perf_counter()
        results: dict = {"machine": machine()}
        b = BrokerProcess(work)
        try:
            print("  [produce]", flush=True)
            results["produce"] = run(produce_phase(b))
            print("  [replay: local engine]", flush=True)
            results["replay"] = replay_phase(b, work, "local")
            if SPARK:
                print("  [replay: spark engine]", flush=True)
                results["replay_spark"] = replay_phase(b, work, "spark")
        finally:
            b.stop()
        local, produce = results["replay"]["end_to_end_msgs_per_s"], results["produce"]
        single = local / produce["single_8"]["msgs_per_s"]
        results["targets"] = [
            ("local replay end to end / raw produce (send)", single >= TARGET_RATIO, single, TARGET_RATIO),
            ("local replay end to end / raw batched produce", None, local / produce["batch_8"]["msgs_per_s"], None),
        ]
        results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_replay", results, print_report)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
