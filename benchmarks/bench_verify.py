"""Index verification benchmark: rebuild + verify rate in MB/s of CommitLog, beside the store's own
dispatch rate measured in the same run.

Run: ``.venv/bin/python -m benchmarks bench_verify`` (or ``make bench``).

Environment:
  BENCH_SCALE    multiplies the CommitLog size (default 1.0 = 1 GiB; 0.1 for a smoke run) and the dispatch count
  BENCH_JSON     a path: also write the JSON results there
  BENCH_VERIFY_SPARK   0: leave out the Spark engine's run (default 1)
  MQLAKE_SPARK_MASTER / MQLAKE_SPARK_CONF   the Spark session of that run (default local[*])

What is timed, exactly:
  * The store is written first, untimed: 1 KiB bodies built by ``bench_store.build_messages`` (KEYS, TAGS,
    UNIQ_KEY per message, topic ``BenchTopic``, 4 queues), 256 MiB segments, RocketMQ's default
    ConsumeQueue and IndexFile sizes; the store is shut down cleanly, so every record is dispatched.
  * ``verify_index`` end to end with the local engine (the default for a store on this machine): the scan
    (compiled, one thread per segment), rebuilding every ConsumeQueue and IndexFile, reading and comparing the
    live files.  *Cold*: the store's files are first dropped from the page cache (``posix_fadvise``
    DONTNEED on each, after an fsync), so the run reads them from disk, in a process that has not verified
    before; *warm*: the same again right after.
  * With BENCH_VERIFY_SPARK=1, one more run with the Spark engine on a warm session (its start-up reported
    apart): the path kept for a CommitLog only a cluster's executors reach.
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
TARGET_COLD_SECONDS_PER_GIB = 10.0
TARGET_WARM_SECONDS_PER_GIB = 5.0
TARGET_DISPATCH_RATIO = 0.25  # verify MB/s over the store's dispatch MB/s


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


def drop_from_page_cache(root: Path) -> None:
    """Write back and drop the store's files from the page cache, so the next read comes from disk."""
    for f in root.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed_verify(root: Path, label: str, **kw) -> dict:
    from pipelines.index_rebuild.job import verify_index

    print(f"  [verify: {label}]", flush=True)
    t0 = time.perf_counter()
    rep = verify_index(root, **kw)
    secs = time.perf_counter() - t0
    if not rep["summary"]["ok"]:
        raise RuntimeError("a store written by the store itself did not verify: " + json.dumps(rep["summary"]))
    mb = rep["commitlog"]["scanned_bytes"] / 1e6
    return {"label": label, "engine": rep["engine"], "seconds": secs, "mb_per_s": mb / secs,
            "records": rep["commitlog"]["scanned_records"], "scanned_bytes": rep["commitlog"]["scanned_bytes"],
            "timings": rep["timings"], "queues": rep["summary"]["queues"], "index_files": rep["summary"]["index_files"],
            "index_entries": rep["summary"]["index_entries_matched"]}  # fmt: skip


def run_all(tmp: Path) -> dict:
    r: dict = {"machine": machine(), "scale": SCALE, "load_before": os.getloadavg()}
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
    drop_from_page_cache(root)
    runs = [timed_verify(root, "local, cold", engine="local"), timed_verify(root, "local, warm", engine="local")]
    if os.environ.get("BENCH_VERIFY_SPARK", "1") != "0":
        from pipelines.spark import get_spark

        t0 = time.perf_counter()
        spark = get_spark(app_name="mqlake-bench-verify")
        spark.range(1).count()
        r["spark_startup_seconds"] = time.perf_counter() - t0
        runs.append(timed_verify(root, "spark, warm session", spark=spark))
    r["verify"] = runs
    after = dispatch(msgs)
    del msgs
    r["load_after"] = os.getloadavg()
    r["dispatch"] = {"mb_per_s": (before + after) / 2, "mb_per_s_before": before, "mb_per_s_after": after,
                     "record_bytes": rec}  # fmt: skip
    cold, warm = runs[0], runs[1]
    gib = cold["scanned_bytes"] / 2**30
    best = max(cold["mb_per_s"], warm["mb_per_s"])
    r["targets"] = [
        {"name": f"local verify MB/s >= {TARGET_DISPATCH_RATIO} x store dispatch MB/s (same run)",
         "target": TARGET_DISPATCH_RATIO * r["dispatch"]["mb_per_s"], "measured": best,
         "met": best >= TARGET_DISPATCH_RATIO * r["dispatch"]["mb_per_s"]},
        {"name": "1 GiB verified cold in <= 10 s (extrapolated from this size)", "target": TARGET_COLD_SECONDS_PER_GIB,
         "measured": cold["seconds"] / gib, "met": cold["seconds"] / gib <= TARGET_COLD_SECONDS_PER_GIB},
        {"name": "1 GiB verified warm in <= 5 s (extrapolated from this size)", "target": TARGET_WARM_SECONDS_PER_GIB,
         "measured": warm["seconds"] / gib, "met": warm["seconds"] / gib <= TARGET_WARM_SECONDS_PER_GIB},
    ]  # fmt: skip
    shutil.rmtree(root, ignore_errors=True)
    return r


def print_report(r: dict) -> None:
    d, s = r["dispatch"], r["store"]
    print(f"store written: {s['messages']:,} msgs x {s['record_bytes']} B = {s['commitlog_bytes'] / 1e6:,.1f} MB "
          f"in {s['write_seconds']:.1f} s ({QUEUES} queues)")  # fmt: skip
    print("load average before {:.1f} / after {:.1f} (1 min)".format(r["load_before"][0], r["load_after"][0]))
    if "spark_startup_seconds" in r:
        print(f"Spark session start-up: {r['spark_startup_seconds']:.1f} s (not in the rates below)")
    print(f"{'path':<52}{'seconds':>9}{'MB/s':>9}{'ratio':>8}")
    print(f"{'store dispatch: do_reput, CQ + IndexFile (baseline)':<52}{'':>9}{d['mb_per_s']:>9,.1f}{1:>8.2f}"
          f"   (before {d['mb_per_s_before']:,.1f}, after {d['mb_per_s_after']:,.1f})")  # fmt: skip
    for v in r["verify"]:
        t = v["timings"]
        print(f"{'verify_index, ' + v['label']:<52}{v['seconds']:>9.2f}{v['mb_per_s']:>9,.1f}"
              f"{v['mb_per_s'] / d['mb_per_s']:>8.2f}")  # fmt: skip
        print(f"    scan ({v['engine']}) {t['scan_seconds']:.2f} s, ConsumeQueues {t['consume_queue_seconds']:.2f} s, "
              f"IndexFiles {t['index_seconds']:.2f} s; {v['records']:,} records, {v['queues']} queues, "
              f"{v['index_files']} index file(s), {v['index_entries']:,} entries")  # fmt: skip
    print("targets")
    for t in r["targets"]:
        print(f"  {t['name']}: {t['measured']:,.2f} vs {t['target']:,.2f} -> {'MET' if t['met'] else 'NOT MET'}")


def main() -> dict:
    with tempfile.TemporaryDirectory(prefix="mqlake-bench-", dir="/tmp") as tmpdir:
        t0 = time.perf_counter()
        results = run_all(Path(tmpdir))
        results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_verify", results, print_report)


if __name__ == "__main__":
    main()
