"""Tiering benchmark: a >= 1 GiB CommitLog of 1 KiB messages tiered into Delta, end to end.

Run: ``.venv/bin/python -m benchmarks bench_tier`` (or ``make bench``).

Environment:
  BENCH_SCALE    multiplies the CommitLog size (default 1.0 = four sealed 256 MiB segments, 1 GiB;
                 0.1 for a smoke run)
  BENCH_JSON     a path: also write the JSON results there
  BENCH_MASTER   Spark master (default local[*])
  BENCH_TYPED    1: the bodies are JSON orders (bench_typed's, about 800 B) with a JSON Schema declared for the
                 topic, so the tier also writes its typed table (docs/lake.md, "Typed tables"); the baseline
                 writes the same segments as before

What is timed, exactly:
  * The store is written first (MessageStore.put_message of 1 KiB bodies, 4 queues, properties as the
    Java producer sends them; bench_store's messages) and closed; that is not timed.
  * Baseline, in the same run and the same Spark session: the same segments read by the commitlog
    source and written as plain parquet (no partitioning, no validation, no Delta), i.e. the cost of
    decode + write alone.
  * delta-spark, in the same session: the same segments decoded and written by delta-spark's own idempotent
    write (``txnAppId`` / ``txnVersion``), partitioned as the tier's ``messages`` table: the alternative to the
    tier's stage-then-commit with delta-rs (no validation, verify or delete), i.e. decode + Delta write alone.
  * Tier: ``pipelines.compaction.job.tier(..., file_reserved_time=0)`` end to end — claim, scan, stage
    (decode + partitioned parquet write), validate (Great Expectations, 14 rules), commit (delta-rs),
    verify (read back + match), segments table, delete (the store's deletion path).  Per-phase times
    come from the job's own report.
  * MB/s counts CommitLog file bytes of the tiered segments (MB = 10^6 bytes).
  * Both runs read the segments from the page cache (the baseline runs first; 24 GiB of RAM).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.bench_store import SCALE, STORE_HOST, TOPIC, build_messages
from benchmarks.bench_typed import order, order_json_schema
from benchmarks.report import emit, machine
from store.config import MessageStoreConfig
from store.message_store import MessageStore
from store.retention import SegmentManifest, SegmentState

SEGMENT = max(4 << 20, int(256 * 1024 * 1024 * SCALE) // 4096 * 4096)
SEALED = 4
BODY = 1024
CHUNK = 2_000
TARGET_RATIO = 0.6  # the tier job must reach this fraction of a plain Parquet write of the same rows
TARGET_SECONDS_PER_GIB = 90.0
TYPED = os.environ.get("BENCH_TYPED", "") == "1"


def write_store(root: Path) -> dict:
    """Put 1 KiB messages until SEALED segments are full; returns the store facts."""
    t0 = time.perf_counter()
    n = 0
    config = MessageStoreConfig(store_path_root_dir=root, mapped_file_size_commit_log=SEGMENT, store_host=STORE_HOST)
    with MessageStore(config) as store:
        while store.max_phy_offset <= SEALED * SEGMENT:  # SEALED full segments, then a few into the next
            for i, m in enumerate(build_messages(BODY, CHUNK, start=n), n):
                if TYPED:
                    m.body = json.dumps(order(i)).encode()
                res = store.put_message(m)
                assert res.ok, res
            n += CHUNK
        while store.dispatch_behind_bytes > 0:
            store.reput.do_reput()
    # the store's housekeeping may already have expired some (disk pressure on a shared machine)
    sealed = [e for e in SegmentManifest(root).entries() if e.state in (SegmentState.SEALED, SegmentState.EXPIRED)]
    return {
        "messages": n,
        "segment_bytes": SEGMENT,
        "sealed_segments": len(sealed),
        "sealed_bases": [e.base_offset for e in sealed],
        "sealed_bytes": sum(e.size for e in sealed),
        "sealed_messages": sum(e.message_count or 0 for e in sealed),
        "write_seconds": time.perf_counter() - t0,
    }


def _loadavg() -> float:
    return os.getloadavg()[0]


def bench_baseline(spark, root: Path, out: Path, bases: list[int]) -> float:
    df = spark.read.format("commitlog").option("segments", ",".join(map(str, bases))).load(str(root))
    t0 = time.perf_counter()
    df.write.mode("overwrite").parquet(str(out))
    return time.perf_counter() - t0


def bench_delta_spark(spark, root: Path, out: Path, bases: list[int]) -> float:
    from pyspark.sql import functions as F

    df = spark.read.format("commitlog").option("segments", ",".join(map(str, bases))).load(str(root))
    df = df.withColumn("store_date", F.to_date(F.timestamp_millis("store_timestamp")))
    t0 = time.perf_counter()
    (df.write.format("delta").mode("append").partitionBy("topic", "store_date")
       .option("txnAppId", "bench-tier").option("txnVersion", "1").save(str(out)))  # fmt: skip
    return time.perf_counter() - t0


def run(tmp: Path) -> dict:
    from pipelines.compaction.job import tier
    from pipelines.spark import get_spark

    root = tmp / "store"
    results: dict = {"machine": machine(), "loadavg_before": _loadavg()}
    results["store"] = write_store(root)
    sealed_bytes = results["store"]["sealed_bytes"]
    bases = results["store"]["sealed_bases"]

    t0 = time.perf_counter()
    spark = get_spark(os.environ.get("BENCH_MASTER"), app_name="bench-tier")
    results["spark_start_seconds"] = time.perf_counter() - t0
    # warm the session (Python workers, the source's imports) on a small job, as any real session is
    spark.range(4).count()
    bench_baseline(spark, root, tmp / "warm", bases[:1])

    base_s = bench_baseline(spark, root, tmp / "plain", bases)
    results["baseline"] = {"seconds": base_s, "mb_per_s": sealed_bytes / base_s / 1e6}
    shutil.rmtree(tmp / "plain", ignore_errors=True)
    shutil.rmtree(tmp / "warm", ignore_errors=True)
    delta_s = bench_delta_spark(spark, root, tmp / "delta-spark", bases)
    results["delta_spark"] = {"seconds": delta_s, "mb_per_s": sealed_bytes / delta_s / 1e6}
    shutil.rmtree(tmp / "delta-spark", ignore_errors=True)

    if TYPED:
        from lake import typed

        typed.declare(tmp / "lake", TOPIC, typed.JSON, order_json_schema())
    t0 = time.perf_counter()
    report = tier(root, tmp / "lake", spark=spark, file_reserved_time=0)
    tier_s = time.perf_counter() - t0
    tiered = report.by_state("tiered")
    assert [s.base_offset for s in tiered] == bases, (bases, report.to_json())
    assert sorted(report.deleted or []) == sorted(bases), report.deleted
    results["tier"] = {
        "seconds": tier_s,
        "mb_per_s": sealed_bytes / tier_s / 1e6,
        "rows": sum(s.rows or 0 for s in tiered),
        "phases_seconds": report.phases,
        "seconds_per_gib": tier_s / (sealed_bytes / 2**30),
        "typed": report.typed,
    }
    results["ratio_vs_plain_parquet"] = results["tier"]["mb_per_s"] / results["baseline"]["mb_per_s"]
    results["targets"] = {
        "ratio_vs_plain_parquet": TARGET_RATIO,
        "seconds_per_gib": TARGET_SECONDS_PER_GIB,
        "met": results["ratio_vs_plain_parquet"] >= TARGET_RATIO
        and results["tier"]["seconds_per_gib"] <= TARGET_SECONDS_PER_GIB,
    }
    results["loadavg_after"] = _loadavg()
    return results


def print_report(r: dict) -> None:
    s, b, t = r["store"], r["baseline"], r["tier"]
    print(f"CommitLog: {s['sealed_segments']} sealed segments x {s['segment_bytes'] / 2**20:.0f} MiB "
          f"= {s['sealed_bytes'] / 2**30:.2f} GiB, {s['sealed_messages']:,} messages of {BODY} B")  # fmt: skip
    print(f"plain parquet (decode + write):   {b['seconds']:7.1f} s  {b['mb_per_s']:7.1f} MB/s")
    d = r["delta_spark"]
    print(f"delta-spark write (decode+Delta): {d['seconds']:7.1f} s  {d['mb_per_s']:7.1f} MB/s")
    print(f"tier end to end:                  {t['seconds']:7.1f} s  {t['mb_per_s']:7.1f} MB/s  "
          f"({t['seconds_per_gib']:.1f} s/GiB; target <= {TARGET_SECONDS_PER_GIB:.0f})")  # fmt: skip
    print(f"ratio tier / plain parquet:       {r['ratio_vs_plain_parquet']:7.2f}   (target >= {TARGET_RATIO})")
    for k, v in t["phases_seconds"].items():
        print(f"  {k:16} {v:7.2f} s")
    for typed in t.get("typed", []):
        print(f"typed table {typed['topic']}: {typed['rows']:,} rows, {typed['errors']} decode errors")
    print(f"load average before/after: {r['loadavg_before']:.2f} / {r['loadavg_after']:.2f}")


def main() -> dict:
    with tempfile.TemporaryDirectory(prefix="mqlake-bench-tier-", dir="/tmp") as d:
        t0 = time.perf_counter()
        results = run(Path(d))
        results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_tier", results, print_report)


if __name__ == "__main__":
    main()
