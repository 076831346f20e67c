"""Freshness of ``mqlake sql --store-dir``: a message produced, then visible in ``messages_all``, p50 and max.

Run: ``.venv/bin/python -m benchmarks bench_fresh``.

Environment:
  BENCH_SCALE    multiplies the seed history (default 1.0 = 48,000 1 KiB messages, 8 MiB segments: about 40 MiB
                 tiered into the lake and the rest live)
  BENCH_ROUNDS   messages timed (default 10)
  BENCH_JSON     a path: also write the JSON results there

What is measured, exactly:
  * The broker is ``mqlake up`` in its own process (bench_broker.BrokerProcess: ASYNC_FLUSH, a temporary store,
    free ports) with 8 MiB CommitLog segments; ``BenchFresh`` of 4 queues.  The seed is produced by this process
    with broker/client ``Producer`` (batches of 32), then the sealed segments are tiered into the lake by the tier
    job (``pipelines.compaction.job.tier``, its own Spark session, stopped before the clock starts): the view is
    the lake's rows UNION the live records.  Not timed.
  * One ``mqlake sql --lake L --store-dir S --shell --format csv`` process; its first statement (which pays
    Spark's start-up) is not counted.
  * Under load: a background thread keeps producing (batches of 32 1 KiB messages, LOAD_RATE msgs/s) for the
    whole measurement, so the live segment grows and seals while the statements read it.
  * Each round: one message with a unique key is sent and acknowledged (``Producer.send``), then the statement
    ``SELECT count(*) FROM messages_all WHERE keys = '<key>'`` runs again and again in the shell until it answers
    1.  produce -> visible is the time from the send's start to that answer (the send, the views pinned anew, the
    query over lake and live log).  Reported: p50 and max over the rounds, and how many statements each took
    (1: the first statement after the acknowledgement saw it).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.bench_broker import BrokerProcess
from benchmarks.bench_sql import Shell
from benchmarks.report import emit, machine
from broker.client import Admin, Message, Producer
from broker.remoting.loop import run

SCALE = float(os.environ.get("BENCH_SCALE", "1") or 1)
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "10") or 10)
TOPIC = "BenchFresh"
QUEUES = 4
SEGMENT = 8 * 1024 * 1024
SEED = 48_000
BATCH = 32
BODY = b"f" * 1024
LOAD_RATE = 200  # msgs/s of the background producer: the live log grows 12 MiB a minute, every statement reads it
TARGET_SECONDS = 10.0  # produce -> visible, the bound


async def _seed(b: BrokerProcess, count: int) -> None:
    await b.wait_ready()
    async with Admin(b.namesrv_addr) as admin:
        await admin.create_topic(TOPIC, broker_addr=b.broker_addr, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
    async with Producer("bench_fresh_seed", b.namesrv_addr) as p:
        deadline = time.monotonic() + 30
        while len(await p.publish_queues(TOPIC, refresh=True)) < QUEUES:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{TOPIC} route never showed {QUEUES} queues")
            await asyncio.sleep(0.1)
        for n in range(0, count, BATCH):
            await p.send_batch([Message(TOPIC, BODY, keys=[f"seed-{n + i}"]) for i in range(BATCH)])


def _sealed(store: Path) -> int:
    from store.retention import SegmentManifest, SegmentState

    return sum(e.state == SegmentState.SEALED for e in SegmentManifest(store).entries())


def _tier(store: Path, lake: Path) -> dict:
    from pipelines.compaction.job import tier
    from pipelines.spark import get_spark

    deadline = time.monotonic() + 60
    while _sealed(store) < 2:  # the broker's clean pass lists sealed segments in the manifest on its schedule
        if time.monotonic() > deadline:
            raise RuntimeError(f"the broker listed no sealed segments in {store}'s manifest")
        time.sleep(0.2)
    spark = get_spark(os.environ.get("BENCH_MASTER"), app_name="bench-fresh-tier")
    try:
        report = tier(store, lake, spark=spark, file_reserved_time=0)
    finally:
        spark.stop()
    tiered = report.by_state("tiered")
    return {"segments": len(tiered), "rows": sum(s.rows for s in tiered)}


def _live_bytes(store: Path) -> int:
    from pipelines.history import live_segments

    return sum((store / "commitlog" / f"{base:020d}").stat().st_size for base in live_segments(store))


class Load:
    """A producer in its own thread and event loop, LOAD_RATE msgs/s in batches, until stopped."""

    def __init__(self, namesrv: str) -> None:
        self.namesrv = namesrv
        self.sent = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            run(self._send())
        except BaseException as e:  # reported by close()
            self.error = e

    async def _send(self) -> None:
        async with Producer("bench_fresh_load", self.namesrv) as p:
            t0 = time.monotonic()
            while not self.stop.is_set():
                await p.send_batch([Message(TOPIC, BODY, keys=[f"load-{self.sent + i}"]) for i in range(BATCH)])
                self.sent += BATCH
                ahead = self.sent / LOAD_RATE - (time.monotonic() - t0)
                if ahead > 0:
                    await asyncio.sleep(ahead)

    def close(self) -> int:
        self.stop.set()
        self.thread.join(60)
        if self.error is not None:
            raise self.error
        return self.sent


async def _send_one(namesrv: str, key: str) -> None:
    async with Producer("bench_fresh_probe", namesrv) as p:
        await p.publish_queues(TOPIC, refresh=True)
        await p.send(Message(TOPIC, BODY, keys=[key]))


def _round(shell: Shell, namesrv: str, i: int) -> dict:
    key = f"probe-{i}"
    t0 = time.perf_counter()
    run(_send_one(namesrv, key))
    acked = time.perf_counter() - t0
    statements = []
    while True:
        r = shell.run(f"SELECT count(*) AS n FROM messages_all WHERE keys = '{key}'")
        statements.append(r["seconds"])
        if r["printed"][1:] == ["1"]:
            return {"visible_s": time.perf_counter() - t0, "ack_s": acked, "statements": statements}
        if len(statements) > 50:
            raise AssertionError(f"{key} not visible after {len(statements)} statements: {r['printed']}")


def run_bench(work: Path) -> dict:
    results: dict = {"machine": machine(), "loadavg_before": os.getloadavg()[0], "rounds": ROUNDS}
    b = BrokerProcess(work, extra={"mappedFileSizeCommitLog": str(SEGMENT), "cleanResourceInterval": "200"})
    try:
        run(_seed(b, max(BATCH, int(SEED * SCALE)) // BATCH * BATCH))
        results["tiered"] = _tier(work / "store", work / "lake")
        shell = Shell(work / "lake", ["--store-dir", str(work / "store")])
        try:
            results["first_statement_s"] = shell.run("SELECT count(*) FROM messages_all")["seconds"]
            load = Load(b.namesrv_addr)
            try:
                results["measured"] = [_round(shell, b.namesrv_addr, i) for i in range(ROUNDS)]
            finally:
                results["load_sent"] = load.close()
            results["rows_at_end"] = int(shell.run("SELECT count(*) FROM messages_all")["printed"][1])
            results["live_bytes_at_end"] = _live_bytes(work / "store")
        finally:
            shell.close()
    finally:
        b.stop()
    visible = [r["visible_s"] for r in results["measured"]]
    results["visible_p50_s"] = statistics.median(visible)
    results["visible_max_s"] = max(visible)
    results["statement_p50_s"] = statistics.median(s for r in results["measured"] for s in r["statements"])
    results["target_s"] = TARGET_SECONDS
    results["met"] = results["visible_max_s"] <= TARGET_SECONDS
    results["loadavg_after"] = os.getloadavg()[0]
    return results


def print_report(r: dict) -> None:
    m = r["machine"]
    print(f"machine: {m['nproc']} cores, {m['memory_gib']} GiB, {m['cpu']}, load average before/after "
          f"{r['loadavg_before']:.2f} / {r['loadavg_after']:.2f}")  # fmt: skip
    print(f"lake: {r['tiered']['rows']:,} rows from {r['tiered']['segments']} tiered 8 MiB segments; messages_all held "
          f"{r['rows_at_end']:,} rows at the end ({r['load_sent']:,} sent by the background load at {LOAD_RATE:,}/s)")
    print(f"live CommitLog read by the last statement: {r['live_bytes_at_end'] / 2**20:.0f} MiB")
    print(f"first statement of the shell (Spark start-up): {r['first_statement_s']:.2f} s")
    tries = [len(x["statements"]) for x in r["measured"]]
    print(f"produce -> visible in messages_all over {r['rounds']} messages: p50 {r['visible_p50_s']:.2f} s, "
          f"max {r['visible_max_s']:.2f} s (statements per message: {min(tries)}..{max(tries)}; one statement "
          f"p50 {r['statement_p50_s']:.2f} s)")  # fmt: skip
    print(f"target max <= {r['target_s']:.0f} s: {'met' if r['met'] else 'NOT met'}")


def main() -> dict:
    with tempfile.TemporaryDirectory(prefix="mqlake-bench-fresh-", dir="/tmp") as d:
        t0 = time.perf_counter()
        results = run_bench(Path(d))
        results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_fresh", results, print_report)


if __name__ == "__main__":
    main()
