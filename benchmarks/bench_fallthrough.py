"""Reads that fall through to the tier: the broker's read path over tiered history against its local one.

Run: ``.venv/bin/python -m benchmarks bench_fallthrough`` (or ``make bench``).

Environment:
  BENCH_SCALE    multiplies the CommitLog size (default 1.0 = four sealed 256 MiB segments of 1 KiB messages,
                 1 GiB; 0.1 for a smoke run)
  BENCH_JSON     a path: also write the JSON results there
  BENCH_MASTER   Spark master of the tier job (default local[*])

What is timed, exactly (in process, no network: the two read paths PULL_MESSAGE takes in the broker):
  * local: ``MessageStore.get_message`` walking every queue from offset 0 to its end, 32 messages a pull,
    before tiering (the CommitLog in the page cache).
  * fall-through: the store's segments are tiered by the real tier job (which deletes them), then
    ``LakeReader.pull`` walks the same queues the same way, from a fresh reader (the first pulls of each
    row group decode it; the rest hit the cache), default cache bound (256 MiB).
  * first pull of a cold queue: a new ``LakeReader`` (no snapshot, empty cache), one 32-message pull from
    offset 0 of a queue; the median of QUEUES such pulls (each from a new reader), files in the page cache.
  * cache bound: 8 threads, each walking a queue with its own position, share one reader whose cache is
    bounded at CACHE_BOUND; the largest ``cache.bytes`` seen after any pull, and the growth of the
    process's resident set over the walk.
  msgs/s counts messages returned; each rate is messages / wall time of the whole walk.  Each walk also
  reports this process's CPU time per message (process_time: all its threads), steadier than the rates on a
  shared machine.

Through the broker (beside the in-process figures, not instead of them): ``mqlake up`` on the same store, a
stock-protocol pull consumer (``broker.client.PullConsumer``, this process) walking the same queues the same
way, 32 messages a pull: once before tiering (local), once after it with ``lakePath`` set (fall-through).
Reported: msgs/s and the broker process's CPU per message (its utime + stime over the walk).  The client
decodes every message, so its rate bounds both walks; the broker's CPU per message is the read path's cost.
BENCH_BROKER=0 leaves this part out.
"""

from __future__ import annotations

import gc
import os
import resource
import statistics
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.bench_store import STORE_HOST, TOPIC, build_messages
from benchmarks.bench_tier import BODY, SEALED, SEGMENT
from benchmarks.report import emit, machine
from store.config import MessageStoreConfig
from store.format.records import read_physical_offset
from store.message_store import GetMessageStatus, MessageStore

QUEUES = 8
PULL = 32
WITH_BROKER = os.environ.get("BENCH_BROKER", "1") != "0"
CACHE_BOUND = 64 * 1024 * 1024
TARGET_RATIO = 0.5
TARGET_COLD_MS = 200.0


def write_store(root: Path) -> tuple[MessageStoreConfig, int]:
    config = MessageStoreConfig(store_path_root_dir=root, mapped_file_size_commit_log=SEGMENT, store_host=STORE_HOST)
    n = 0
    with MessageStore(config) as store:
        while store.max_phy_offset <= SEALED * SEGMENT:
            for i, m in enumerate(build_messages(BODY, 2_000, start=n)):
                m.queue_id = (n + i) % QUEUES
                assert store.put_message(m).ok
            n += 2_000
        while store.dispatch_behind_bytes > 0:
            store.reput.do_reput()
    return config, n


def walk(pull, queue_id: int) -> int:
    """Pull a queue from 0 until ``pull`` answers None or a None next offset; returns messages read."""
    offset: int | None = 0
    got = 0
    while offset is not None:
        result = pull(queue_id, offset)
        if result is None:
            break
        msgs, offset = result
        got += len(msgs)
    return got


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _process_cpu(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def broker_walk(tmp: Path, sealed_end: int, lake: Path | None) -> dict:
    """``mqlake up`` on the store under ``tmp`` (with ``lakePath`` if ``lake``), and a pull consumer walking
    every queue from offset 0 until it reaches a message at or past ``sealed_end`` (the active segment, local
    in both walks) or the queue's end."""
    import asyncio

    from benchmarks.bench_broker import BrokerProcess
    from broker.client import Admin, PullConsumer
    from broker.client.message import MessageQueue, PullStatus
    from broker.remoting.loop import run as run_loop

    # the embedded tier job runs at deleteWhen: put that hour as far from now as a day allows
    far_hour = (time.gmtime().tm_hour + 12) % 24
    extra = {"mappedFileSizeCommitLog": str(SEGMENT), "deleteWhen": f"{far_hour:02d}"}
    if lake is not None:
        extra["lakePath"] = str(lake)
    # the broker's own directory (its broker.conf and log), with the store under it as BrokerProcess expects
    home = tmp / ("broker-fallthrough" if lake is not None else "broker-local")
    home.mkdir(exist_ok=True)
    if not (home / "store").exists():
        (home / "store").symlink_to(tmp / "store")

    async def walk_all() -> dict:
        await b.wait_ready()
        async with Admin(b.namesrv_addr) as admin:
            await admin.create_topic(TOPIC, broker_addr=b.broker_addr, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
        consumer = await PullConsumer("bench_fallthrough_walk", b.namesrv_addr).start()
        try:
            deadline = time.monotonic() + 30
            while len(queues := await consumer.fetch_queues(TOPIC)) < QUEUES:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{TOPIC} route never showed {QUEUES} queues")
                await asyncio.sleep(0.2)
            broker = next(iter({q.broker_name for q in queues}))
            # GET_MIN_OFFSET first: the broker imports the lake's libraries and takes its first snapshot
            # outside the timed walk (no row group is decoded: the walk starts with a cold cache)
            await consumer.min_offset(MessageQueue(TOPIC, broker, 0))
            got = 0
            cpu0, t0 = _process_cpu(b.process.pid), time.perf_counter()
            for q in range(QUEUES):
                mq, offset = MessageQueue(TOPIC, broker, q), 0
                while True:
                    r = await consumer.pull(mq, offset, PULL)
                    if r.status is not PullStatus.FOUND:
                        break
                    keep = [m for m in r.messages if m.commit_log_offset < sealed_end]
                    got += len(keep)
                    if len(keep) < len(r.messages):
                        break
                    offset = r.next_begin_offset
            seconds, cpu = time.perf_counter() - t0, _process_cpu(b.process.pid) - cpu0
        finally:
            await consumer.shutdown()
        return {"messages": got, "seconds": seconds, "msgs_per_s": got / seconds,
                "broker_us_per_msg": cpu / got * 1e6}  # fmt: skip

    for attempt in (1, 2):  # random free ports: the HA port (listenPort + 1) may be taken
        b = BrokerProcess(home, extra=extra)
        try:
            return run_loop(walk_all())
        except RuntimeError as e:
            if attempt == 2 or b.process.poll() is None:
                raise
            print(f"broker did not start ({e}); its log ends:\n{(home / 'broker.log').read_text()[-2000:]}")
        finally:
            b.stop()
    raise AssertionError("unreachable")


def run(tmp: Path) -> dict:
    from lake.reader import LakeReader
    from pipelines.compaction.job import tier
    from pipelines.spark import get_spark

    root, lake = tmp / "store", tmp / "lake"
    config, written = write_store(root)
    results: dict = {"machine": machine(), "messages_written": written, "queues": QUEUES}
    # local walk of what will be tiered: the sealed segments' messages (the active segment stays local)
    with MessageStore(config) as store:
        sealed_end = SEALED * SEGMENT

        def local_pull(queue_id: int, offset: int):
            r = store.get_message(TOPIC, queue_id, offset, PULL)
            if r.status is not GetMessageStatus.FOUND:
                return None
            keep = [m for m in r.messages if read_physical_offset(m, 0) < sealed_end]
            return keep, (r.next_begin_offset if len(keep) == len(r.messages) else None)

        t0, c0 = time.perf_counter(), time.process_time()
        local_msgs = sum(walk(local_pull, q) for q in range(QUEUES))
        local_s, local_cpu = time.perf_counter() - t0, time.process_time() - c0
    results["local"] = {"messages": local_msgs, "seconds": local_s, "msgs_per_s": local_msgs / local_s,
                        "cpu_us_per_msg": local_cpu / local_msgs * 1e6}  # fmt: skip
    if WITH_BROKER:
        results["broker_local"] = broker_walk(tmp, SEALED * SEGMENT, None)

    spark = get_spark(os.environ.get("BENCH_MASTER"), app_name="bench-fallthrough")
    t0 = time.perf_counter()
    from benchmarks.bench_broker import BROKER_NAME

    # as the broker's own name: a broker serves only the tiered rows of its own broker name
    report = tier(root, lake, spark=spark, file_reserved_time=0, broker_name=BROKER_NAME)
    results["tier_seconds"] = time.perf_counter() - t0
    results["tiered_segments"] = len(report.by_state("tiered"))
    spark.stop()
    # The tier job's driver (Spark, Great Expectations) leaves a large heap in this process, which made every
    # later garbage collection of the walk below slower (2.9 against 2.1 us a message). A broker never holds it:
    # its embedded tier job runs in a subprocess. So what the tier job left is kept out of the collector's way.
    gc.collect()
    gc.freeze()

    def tier_pull(reader):
        def pull(queue_id: int, offset: int):
            r = reader.pull(TOPIC, queue_id, offset, 1 << 62, PULL, 256 * 1024)
            return None if r is None else (r.messages, r.next_begin_offset)

        return pull

    cold = []
    for q in range(QUEUES):
        reader = LakeReader(lake)
        t0 = time.perf_counter()
        assert reader.pull(TOPIC, q, 0, 1 << 62, PULL, 256 * 1024) is not None
        cold.append((time.perf_counter() - t0) * 1000)
    results["cold_first_pull_ms"] = {"median": statistics.median(cold), "max": max(cold), "all": cold}

    reader = LakeReader(lake)
    t0, c0 = time.perf_counter(), time.process_time()
    tier_msgs = sum(walk(tier_pull(reader), q) for q in range(QUEUES))
    tier_s, tier_cpu = time.perf_counter() - t0, time.process_time() - c0
    results["fallthrough"] = {"messages": tier_msgs, "seconds": tier_s, "msgs_per_s": tier_msgs / tier_s,
                              "cpu_us_per_msg": tier_cpu / tier_msgs * 1e6,
                              "cache_hits": reader.cache.hits, "cache_misses": reader.cache.misses}  # fmt: skip
    assert tier_msgs == local_msgs, (tier_msgs, local_msgs)
    results["ratio_fallthrough_vs_local"] = results["fallthrough"]["msgs_per_s"] / results["local"]["msgs_per_s"]
    if WITH_BROKER:
        bl = results["broker_local"]
        bf = results["broker_fallthrough"] = broker_walk(tmp, SEALED * SEGMENT, lake)
        assert bf["messages"] == bl["messages"] == local_msgs, (bf["messages"], bl["messages"], local_msgs)
        results["ratio_broker_fallthrough_vs_local"] = bf["msgs_per_s"] / bl["msgs_per_s"]

    bounded = LakeReader(lake, cache_bytes=CACHE_BOUND)
    peak = [0]
    rss0 = rss_bytes()
    rss_peak = [rss0]

    def consumer(q: int) -> None:
        inner = tier_pull(bounded)

        def pull(queue_id: int, offset: int):
            r = inner(queue_id, offset)
            peak[0] = max(peak[0], bounded.cache.bytes)
            rss_peak[0] = max(rss_peak[0], rss_bytes())
            return r

        walk(pull, q)

    threads = [threading.Thread(target=consumer, args=(q,)) for q in range(QUEUES)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results["cache_bound"] = {
        "bound_bytes": CACHE_BOUND, "peak_cache_bytes": peak[0], "consumers": QUEUES,
        "rss_growth_bytes": rss_peak[0] - rss0, "seconds": time.perf_counter() - t0,
        "within_bound": peak[0] <= CACHE_BOUND,
    }  # fmt: skip
    results["targets"] = {
        "ratio": TARGET_RATIO, "cold_ms": TARGET_COLD_MS,
        "met": results["ratio_fallthrough_vs_local"] >= TARGET_RATIO
        and results["cold_first_pull_ms"]["median"] <= TARGET_COLD_MS and peak[0] <= CACHE_BOUND,
    }  # fmt: skip
    return results


def print_report(r: dict) -> None:
    lo, ft, cb = r["local"], r["fallthrough"], r["cache_bound"]
    print(f"{lo['messages']:,} tiered messages of {BODY} B in {r['queues']} queues ({r['tiered_segments']} segments)")
    print(f"local pull:        {lo['msgs_per_s']:10,.0f} msgs/s  ({lo['cpu_us_per_msg']:.2f} us CPU/msg)")
    print(f"fall-through pull: {ft['msgs_per_s']:10,.0f} msgs/s  ({ft['cpu_us_per_msg']:.2f} us CPU/msg)  ratio "
          f"{r['ratio_fallthrough_vs_local']:.2f} (target >= {TARGET_RATIO}); cache {ft['cache_hits']} hits / "
          f"{ft['cache_misses']} misses")  # fmt: skip
    print(f"first pull of a cold queue: median {r['cold_first_pull_ms']['median']:.0f} ms, "
          f"max {r['cold_first_pull_ms']['max']:.0f} ms (target <= {TARGET_COLD_MS:.0f})")  # fmt: skip
    print(f"{cb['consumers']} consumers, cache bound {cb['bound_bytes'] / 2**20:.0f} MiB: peak "
          f"{cb['peak_cache_bytes'] / 2**20:.1f} MiB, RSS growth {cb['rss_growth_bytes'] / 2**20:.0f} MiB")  # fmt: skip
    if "broker_fallthrough" in r:
        bl, bf = r["broker_local"], r["broker_fallthrough"]
        print(f"through the broker (pull consumer): local {bl['msgs_per_s']:,.0f} msgs/s, broker "
              f"{bl['broker_us_per_msg']:.1f} us/msg; fall-through {bf['msgs_per_s']:,.0f} msgs/s, broker "
              f"{bf['broker_us_per_msg']:.1f} us/msg; ratio {r['ratio_broker_fallthrough_vs_local']:.2f}")  # fmt: skip


def main() -> dict:
    with tempfile.TemporaryDirectory(prefix="mqlake-bench-fallthrough-", dir="/tmp") as d:
        t0 = time.perf_counter()
        results = run(Path(d))
        results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_fallthrough", results, print_report)


if __name__ == "__main__":
    main()
