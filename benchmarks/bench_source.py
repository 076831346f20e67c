"""CommitLog source benchmark: how fast the ``commitlog`` Spark source decodes, beside Spark
reading the same rows from plain parquet.

Run: ``.venv/bin/python -m benchmarks bench_source``.

Environment:
  BENCH_SCALE   multiplies the message count (default 1.0: 240,000 messages of 1 KiB = 290 MB of CommitLog,
                more than 256 MiB; 0.1 for a smoke run)
  BENCH_MASTER  Spark master (default ``local[*]``)
  BENCH_JSON    a path: also write the JSON results there

What is timed:
  * The store is written first by the real MessageStore (256 MiB segments, so one sealed segment and the
    active one), with ``bench_store``'s 1 KiB messages (Java producer properties); not timed.
  * ``python``: ``pipelines.segment_reader.read_segment`` over every segment in this process, one core, no Spark:
    walk + checks + columnar decode into Arrow batches.  ``scan``: ``scan_segment`` (the segment facts).
  * ``spark commitlog -> noop``: ``spark.read.format("commitlog").load(store)`` written to Spark's ``noop``
    sink, so every row reaches the JVM; one warm-up run, then the median of ``RUNS``.
  * ``spark parquet -> noop``: the same rows, written once as plain parquet (snappy), read the same way.
  * ``commitlog -> parquet`` and ``parquet -> parquet``: writing those rows as plain parquet from either
    source (what tiering does, without the Delta commit and checks).
  * MB/s always counts CommitLog record bytes (MB = 10^6 bytes), whatever was read, so rates compare.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.bench_store import build_messages

SCALE = float(os.environ.get("BENCH_SCALE", "1") or 1)
MASTER = os.environ.get("BENCH_MASTER", "local[*]")
MESSAGES = 240_000
SEGMENT = 256 * 1024 * 1024
RUNS = 3


def write_store(root: Path, count: int) -> int:
    """A store of ``count`` 1 KiB messages; returns the CommitLog bytes written."""
    from store.config import MessageStoreConfig
    from store.message_store import MessageStore

    config = MessageStoreConfig(storePathRootDir=root, mappedFileSizeCommitLog=SEGMENT)
    total = 0
    with MessageStore(config) as store:
        for start in range(0, count, 10_000):
            for m in build_messages(1024, min(10_000, count - start), start):
                res = store.put_message(m)
                assert res.ok, res
                total += res.append.wrote_bytes
    return total


LOADS: list[float] = []  # 1-minute load average after each timing: the machine is shared


def _timed(fn, runs: int = 1) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    LOADS.append(os.getloadavg()[0])
    return statistics.median(times)


def run(tmp: Path) -> dict:
    from pipelines.segment_reader import read_segment, scan_segment, segment_files
    from pipelines.spark import get_spark

    count = max(1000, int(MESSAGES * SCALE))
    store = tmp / "store"
    t0 = time.perf_counter()
    nbytes = write_store(store, count)
    results: dict = {"messages": count, "commitlog_bytes": nbytes, "write_store_s": time.perf_counter() - t0}
    files = segment_files(store)

    def python_decode() -> None:
        rows = sum(b.num_rows for f in files for b in read_segment(f))
        assert rows == count, rows

    def scan() -> None:
        assert sum(scan_segment(f).record_count for f in files) == count

    python_decode()  # warm the page cache and imports
    results["python_decode_s"] = _timed(python_decode, RUNS)
    results["scan_s"] = _timed(scan, RUNS)

    spark = get_spark(master=MASTER, app_name="bench_source")
    results["spark_master"] = MASTER
    results["spark_parallelism"] = spark.sparkContext.defaultParallelism
    source = spark.read.format("commitlog").load(str(store))
    plain, plain2 = tmp / "plain", tmp / "plain2"

    def noop(df) -> None:
        df.write.format("noop").mode("overwrite").save()

    noop(source)  # warm-up: JVM JIT, Python workers
    results["spark_commitlog_noop_s"] = _timed(lambda: noop(source), RUNS)
    results["commitlog_to_parquet_s"] = _timed(lambda: source.write.mode("overwrite").parquet(str(plain)), 1)
    parquet = spark.read.parquet(str(plain))
    assert parquet.count() == count
    noop(parquet)
    results["spark_parquet_noop_s"] = _timed(lambda: noop(parquet), RUNS)
    results["parquet_to_parquet_s"] = _timed(lambda: parquet.write.mode("overwrite").parquet(str(plain2)), 1)
    results["parquet_bytes"] = sum(p.stat().st_size for p in plain.rglob("*.parquet"))
    shutil.rmtree(plain2, ignore_errors=True)
    results["load_avg_1m"] = [round(x, 2) for x in LOADS]
    for key in [k for k in results if k.endswith("_s") and k != "write_store_s"]:
        results[key.removesuffix("_s") + "_mb_s"] = nbytes / results[key] / 1e6
    return results


def print_report(r: dict) -> None:
    print(f"{r['messages']:,} messages of 1 KiB, {r['commitlog_bytes'] / 1e6:.0f} MB of CommitLog "
          f"({r['parquet_bytes'] / 1e6:.0f} MB as snappy parquet); Spark {r['spark_master']}, "
          f"parallelism {r['spark_parallelism']}")  # fmt: skip
    print(f"{'what':34s} {'seconds':>8s} {'MB/s':>8s} {'msgs/s':>10s}")
    for label, key in [
        ("python read_segment (1 core)", "python_decode"),
        ("python scan_segment (1 core)", "scan"),
        ("spark commitlog -> noop", "spark_commitlog_noop"),
        ("spark parquet -> noop", "spark_parquet_noop"),
        ("spark commitlog -> parquet", "commitlog_to_parquet"),
        ("spark parquet -> parquet", "parquet_to_parquet"),
    ]:
        s = r[f"{key}_s"]
        print(f"{label:34s} {s:8.2f} {r[f'{key}_mb_s']:8.0f} {r['messages'] / s:10,.0f}")
    print(f"commitlog -> parquet is {r['parquet_to_parquet_s'] / r['commitlog_to_parquet_s']:.0%} of the "
          f"parquet -> parquet rate; load average after each timing {r['load_avg_1m']} (2 cores)")  # fmt: skip


def main() -> dict:
    with tempfile.TemporaryDirectory(prefix="mqlake-bench-source-", dir="/tmp") as d:
        t0 = time.perf_counter()
        results = run(Path(d))
        results["wall_seconds"] = time.perf_counter() - t0
    print_report(results)
    print("JSON " + json.dumps(results, sort_keys=True))
    path = os.environ.get("BENCH_JSON")
    if path:
        Path(path).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return results


if __name__ == "__main__":
    main()
