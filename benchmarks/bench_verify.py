"""Index verification benchmark: rebuild + verify rate in MB/s of CommitLog, beside the store's own
dispatch rate measured in the same run.

Run: ``.venv/bin/python -m benchmarks bench_verify`` (or ``make bench``).

Environment:
  BENCH_SCALE    multiplies the CommitLog size (default 1.0 = 1 GiB; 0.1 for a smoke run) and the dispatch count
  BENCH_JSON     a path: also write the JSON results there
  MQLAKE_SPARK_MASTER / MQLAKE_SPARK_CONF   the Spark session (default local[*])

What is timed, exactly:
  * The store is written first, untimed: 1 KiB bodies built by ``bench_store.build_messages`` (KEYS, TAGS,
    UNIQ_KEY per message, topic ``BenchTopic``, 4 queues), 256 MiB segments, RocketMQ's default
    ConsumeQueue and IndexFile sizes; the store is shut down cleanly, so every record is dispatched.
  * ``verify_index`` end to end on a warm Spark session: the Spark scan (decode + tagsCode + key hashes),
    collecting to the driver, rebuilding every ConsumeQueue and IndexFile, reading and comparing the live
    files.  The session start-up (JVM) is timed separately and reported beside it.
  * The baseline is ``bench_store.bench_do_reput`` (``ReputService.do_reput``, ConsumeQueue + IndexFile, the
    same message shape) in the same run, before and after the verify runs (their mean): what the store
    itself needs to build these files.
  * MB/s counts CommitLog record bytes, MB = 10^6 bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.bench_store import (
    QUEUES,
    bench_do_reput,
    build_messages,
    encode_all,
    machine,
    running_store,
    warm,
)
from benchmarks.report import emit

SCALE = float(os.environ.get("BENCH_SCALE", "1") or 1)
TARGET_BYTES = 1 << 30  # 1 GiB at BENCH_SCALE=1
SEGMENT = 256 * 1024 * 1024
CHUNK = 50_000  # messages built at a time while writing the store
DISPATCH_COUNT = 100_000
TARGET_SECONDS_PER_GIB = 60.0


def write_store(root: Path, target_bytes: int) -> dict:
    """Write ``target_bytes`` of 1 KiB messages with the real store; returns what was written."""
    record = len(encode_all(build_messages(1024, 1))[0])
    count = max(1, target_bytes // record)
    t0 = time.perf_counter()
    with running_store(root) as store:
        warm(store, build_messages(1024, 1)[0])
        done = 1
        while done < count:
            for m in build_messages(1024, min(CHUNK, count - done), start=done):
                res = store.put_message(m)
                if not res.ok:
                    raise RuntimeError(f"put failed: {res.status} {res.error}")
            done += min(CHUNK, count - done)
        max_offset = store.max_phy_offset
    return {"messages": count, "record_bytes": record, "commitlog_bytes": max_offset,
            "write_seconds": time.perf_counter() - t0}  # fmt: skip


def run_all(tmp: Path) -> dict:
    from pipelines.index_rebuild.job import verify_index
    from pipelines.spark import get_spark

    r: dict = {"machine": machine(), "scale": SCALE}
    msgs = build_messages(1024, max(2, int(DISPATCH_COUNT * SCALE)) + 1)
    rec = len(encode_all(msgs[:1])[0])

    def dispatch(pool: list) -> float:
        print(f"  [dispatch baseline: {len(pool) - 1} msgs]", flush=True)
        return bench_do_reput(tmp, pool, index=True)["msgs_per_s"] * rec / 1e6

    # Measured before and after the verify runs: on a shared machine the load moves; the mean is the baseline.
    before = dispatch(msgs)

    root = tmp / "store"
    print(f"  [writing {TARGET_BYTES * SCALE / 2**20:,.0f} MiB of CommitLog]", flush=True)
    r["store"] = write_store(root, int(TARGET_BYTES * SCALE))
    t0 = time.perf_counter()
    spark = get_spark(app_name="mqlake-bench-verify")
    r["spark_startup_seconds"] = time.perf_counter() - t0
    runs = []
    for i in range(2):  # the first run also starts the Python workers; both are reported
        print(f"  [verify run {i + 1}]", flush=True)
        t0 = time.perf_counter()
        rep = verify_index(root, spark=spark)
        secs = time.perf_counter() - t0
        if not rep["summary"]["ok"]:
            raise RuntimeError("a store written by the store itself did not verify: " + json.dumps(rep["summary"]))
        mb = rep["commitlog"]["scanned_bytes"] / 1e6
        runs.append({"seconds": secs, "mb_per_s": mb / secs, "records": rep["commitlog"]["scanned_records"],
                     "scanned_bytes": rep["commitlog"]["scanned_bytes"], "timings": rep["timings"],
                     "queues": rep["summary"]["queues"], "index_files": rep["summary"]["index_files"],
                     "index_entries": rep["summary"]["index_entries_matched"]})  # fmt: skip
    r["verify"] = runs
    after = dispatch(msgs)
    del msgs
    r["dispatch"] = {"mb_per_s": (before + after) / 2, "mb_per_s_before": before, "mb_per_s_after": after,
                     "record_bytes": rec}  # fmt: skip
    best = max(runs, key=lambda x: x["mb_per_s"])
    gib = best["scanned_bytes"] / 2**30
    r["targets"] = [
        {"name": "verify MB/s >= store dispatch MB/s (same run)", "target": r["dispatch"]["mb_per_s"],
         "measured": best["mb_per_s"], "met": best["mb_per_s"] >= r["dispatch"]["mb_per_s"]},
        {"name": "1 GiB of CommitLog verified in <= 60 s (extrapolated from this size)",
         "target": TARGET_SECONDS_PER_GIB, "measured": best["seconds"] / gib if gib else 0.0,
         "met": gib > 0 and best["seconds"] / gib <= TARGET_SECONDS_PER_GIB},
    ]  # fmt: skip
    shutil.rmtree(root, ignore_errors=True)
    return r


def print_report(r: dict) -> None:
    d, s = r["dispatch"], r["store"]
    print(f"store written: {s['messages']:,} msgs x {s['record_bytes']} B = {s['commitlog_bytes'] / 1e6:,.1f} MB "
          f"in {s['write_seconds']:.1f} s ({QUEUES} queues)")  # fmt: skip
    print(f"Spark session start-up: {r['spark_startup_seconds']:.1f} s (not in the rates below)")
    print(f"{'path':<52}{'seconds':>9}{'MB/s':>9}{'ratio':>8}")
    print(f"{'store dispatch: do_reput, CQ + IndexFile (baseline)':<52}{'':>9}{d['mb_per_s']:>9,.1f}{1:>8.2f}"
          f"   (before {d['mb_per_s_before']:,.1f}, after {d['mb_per_s_after']:,.1f})")  # fmt: skip
    for i, v in enumerate(r["verify"]):
        t = v["timings"]
        print(f"{'verify_index run ' + str(i + 1):<52}{v['seconds']:>9.1f}{v['mb_per_s']:>9,.1f}"
              f"{v['mb_per_s'] / d['mb_per_s']:>8.2f}")  # fmt: skip
        print(f"    scan (Spark) {t['scan_seconds']:.1f} s, ConsumeQueues {t['consume_queue_seconds']:.1f} s, "
              f"IndexFiles {t['index_seconds']:.1f} s; {v['records']:,} records, {v['queues']} queues, "
              f"{v['index_files']} index file(s), {v['index_entries']:,} entries")  # fmt: skip
    print("targets")
    for t in r["targets"]:
        print(f"  {t['name']}: {t['measured']:,.1f} vs {t['target']:,.1f} -> {'MET' if t['met'] else 'NOT MET'}")


def main() -> dict:
    with tempfile.TemporaryDirectory(prefix="mqlake-bench-", dir="/tmp") as tmpdir:
        t0 = time.perf_counter()
        results = run_all(Path(tmpdir))
        results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_verify", results, print_report)


if __name__ == "__main__":
    main()
