"""Reads that fall through to the tier (issue 16): the broker's read path over tiered history against its local one.

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
  msgs/s counts messages returned; each rate is messages / wall time of the whole walk.
"""

from __future__ import annotations

import os
import resource
import statistics
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.bench_store import STORE_HOST, build_messages, machine
from benchmarks.bench_tier import BODY, SEALED, SEGMENT
from benchmarks.report import emit
from store.config import MessageStoreConfig
from store.format.records import read_physical_offset
from store.message_store import GetMessageStatus, MessageStore

QUEUES = 8
PULL = 32
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


def run(tmp: Path) -> dict:
    from broker.lake.reader import LakeReader
    from pipelines.compaction.job import tier
    from pipelines.spark import get_spark

    root, lake = tmp / "store", tmp / "lake"
    config, written = write_store(root)
    results: dict = {"machine": machine(), "messages_written": written, "queues": QUEUES}
    # local walk of what will be tiered: the sealed segments' messages (the active segment stays local)
    with MessageStore(config) as store:
        sealed_end = SEALED * SEGMENT

        def local_pull(queue_id: int, offset: int):
            r = store.get_message("BenchTopic", queue_id, offset, PULL)
            if r.status is not GetMessageStatus.FOUND:
                return None
            keep = [m for m in r.messages if read_physical_offset(m, 0) < sealed_end]
            return keep, (r.next_begin_offset if len(keep) == len(r.messages) else None)

        t0 = time.perf_counter()
        local_msgs = sum(walk(local_pull, q) for q in range(QUEUES))
        local_s = time.perf_counter() - t0
    results["local"] = {"messages": local_msgs, "seconds": local_s, "msgs_per_s": local_msgs / local_s}

    spark = get_spark(os.environ.get("BENCH_MASTER"), app_name="bench-fallthrough")
    t0 = time.perf_counter()
    report = tier(root, lake, spark=spark, file_reserved_time=0)
    results["tier_seconds"] = time.perf_counter() - t0
    results["tiered_segments"] = len(report.by_state("tiered"))
    spark.stop()

    def tier_pull(reader):
        def pull(queue_id: int, offset: int):
            r = reader.pull("BenchTopic", queue_id, offset, 1 << 62, PULL, 256 * 1024)
            return None if r is None else (r.messages, r.next_begin_offset)

        return pull

    cold = []
    for q in range(QUEUES):
        reader = LakeReader(lake)
        t0 = time.perf_counter()
        assert reader.pull("BenchTopic", q, 0, 1 << 62, PULL, 256 * 1024) is not None
        cold.append((time.perf_counter() - t0) * 1000)
    results["cold_first_pull_ms"] = {"median": statistics.median(cold), "max": max(cold), "all": cold}

    reader = LakeReader(lake)
    t0 = time.perf_counter()
    tier_msgs = sum(walk(tier_pull(reader), q) for q in range(QUEUES))
    tier_s = time.perf_counter() - t0
    results["fallthrough"] = {"messages": tier_msgs, "seconds": tier_s, "msgs_per_s": tier_msgs / tier_s,
                              "cache_hits": reader.cache.hits, "cache_misses": reader.cache.misses}  # fmt: skip
    assert tier_msgs == local_msgs, (tier_msgs, local_msgs)
    results["ratio_fallthrough_vs_local"] = results["fallthrough"]["msgs_per_s"] / results["local"]["msgs_per_s"]

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
    print(f"local pull:        {lo['msgs_per_s']:10,.0f} msgs/s")
    print(f"fall-through pull: {ft['msgs_per_s']:10,.0f} msgs/s  ratio {r['ratio_fallthrough_vs_local']:.2f} "
          f"(target >= {TARGET_RATIO}); cache {ft['cache_hits']} hits / {ft['cache_misses']} misses")  # fmt: skip
    print(f"first pull of a cold queue: median {r['cold_first_pull_ms']['median']:.0f} ms, "
          f"max {r['cold_first_pull_ms']['max']:.0f} ms (target <= {TARGET_COLD_MS:.0f})")  # fmt: skip
    print(f"{cb['consumers']} consumers, cache bound {cb['bound_bytes'] / 2**20:.0f} MiB: peak "
          f"{cb['peak_cache_bytes'] / 2**20:.1f} MiB, RSS growth {cb['rss_growth_bytes'] / 2**20:.0f} MiB")  # fmt: skip


def main() -> dict:
    with tempfile.TemporaryDirectory(prefix="mqlake-bench-fallthrough-", dir="/tmp") as d:
        t0 = time.perf_counter()
        results = run(Path(d))
        results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_fallthrough", results, print_report)


if __name__ == "__main__":
    main()
