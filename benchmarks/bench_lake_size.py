"""Lake sizing figures (docs/scaling.md "Sizing"): bytes a message takes in the CommitLog and in the
tier, the files, row groups and Delta commits a tiering run leaves, what compaction does to them, and the CPU
the tiering run costs (all its processes: driver, JVM, Python workers), per MB of CommitLog.

Run: ``.venv/bin/python -m benchmarks bench_lake_size`` (about 2-4 min on 2 cores).

Environment:
  BENCH_SCALE    multiplies the segment size (default 1.0 = four 16 MiB segments per body kind)
  BENCH_BODIES   comma list of body kinds (default ``bench,random``): ``bench`` = bench_store's 1 KiB body
                 (the same periodic bytes in every message: compresses far better than real payloads),
                 ``random`` = 1 KiB of os.urandom per message (incompressible: the upper bound)
  BENCH_MASTER   Spark master (default local[*])

Per body kind: four segments are written by ``MessageStore.put_message`` (bench_store's properties, 4 queues,
one topic), then tiered in two runs of two segments (``max_segments=2``), then ``upkeep.compact`` as if the
day had closed.  Sizes are on-disk bytes of the ``messages`` table's data files.
"""

from __future__ import annotations

import os
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import unquote

from benchmarks.bench_store import SCALE, STORE_HOST, build_messages
from benchmarks.report import emit, machine
from store.config import MessageStoreConfig
from store.message_store import MessageStore

SEGMENT = max(1 << 20, int(16 * 1024 * 1024 * SCALE) // 4096 * 4096)
SEALED = 4
BODY = 1024
CHUNK = 1_000


def tree_cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds of ``pid`` (default this process) and every live descendant, with their reaped children."""
    root = pid or os.getpid()
    stats: dict[int, list[str]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    stats[int(d)] = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
    children: dict[int, list[int]] = {}
    for p, s in stats.items():
        children.setdefault(int(s[1]), []).append(p)
    total, todo = 0, [root]
    while todo:
        p = todo.pop()
        if p in stats:
            total += sum(int(x) for x in stats[p][11:15])  # utime, stime, cutime, cstime
        todo.extend(children.get(p, []))
    return total / os.sysconf("SC_CLK_TCK")


def write_store(root: Path, kind: str) -> dict:
    config = MessageStoreConfig(store_path_root_dir=root, mapped_file_size_commit_log=SEGMENT, store_host=STORE_HOST)
    n = 0
    with MessageStore(config) as store:
        while store.max_phy_offset <= SEALED * SEGMENT:
            for m in build_messages(BODY, CHUNK, start=n):
                if kind == "random":
                    m.body = os.urandom(BODY)
                assert store.put_message(m).ok
            n += CHUNK
        while store.dispatch_behind_bytes > 0:
            store.reput.do_reput()
    return {"messages_written": n}


def table_files(uri: str) -> dict:
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    dt = DeltaTable(uri)
    files = [Path(unquote(u.removeprefix("file://"))) for u in dt.file_uris()]
    groups = rows = comp = 0
    for f in files:
        md = pq.ParquetFile(f).metadata
        groups += md.num_row_groups
        rows += md.num_rows
        comp += sum(md.row_group(g).column(c).total_compressed_size
                    for g in range(md.num_row_groups) for c in range(md.num_columns))  # fmt: skip
    log = Path(uri) / "_delta_log"
    return {
        "version": dt.version(),
        "files": len(files),
        "bytes": sum(f.stat().st_size for f in files),
        "rows": rows,
        "row_groups": groups,
        "row_group_compressed_bytes_mean": comp / groups if groups else 0,
        "checkpoints": len(list(log.glob("*.checkpoint.parquet"))),
    }


def run_kind(spark, tmp: Path, kind: str) -> dict:
    from lake import tables
    from pipelines.compaction.job import tier
    from pipelines.compaction.upkeep import compact

    root, lake = tmp / f"store-{kind}", tmp / f"lake-{kind}"
    out: dict = write_store(root, kind)
    uris = {t: tables.table_uri(lake, t) for t in (tables.MESSAGES, tables.SEGMENTS, tables.QUALITY_RESULTS)}
    runs = []
    for _ in range(2):
        cpu0, t0 = tree_cpu_seconds(), time.perf_counter()
        report = tier(root, lake, spark=spark, file_reserved_time=0, max_segments=2)
        cpu, wall = tree_cpu_seconds() - cpu0, time.perf_counter() - t0
        tiered = report.by_state("tiered")
        runs.append({
            "segments": len(tiered),
            "commitlog_bytes": len(tiered) * SEGMENT,
            "rows": sum(s.rows or 0 for s in tiered),
            "wall_seconds": wall,
            "cpu_seconds": cpu,
            "phases_seconds": report.phases,
            "versions": {t: table_files(u)["version"] for t, u in uris.items()},
        })  # fmt: skip
    out["runs"] = runs
    out["before_compaction"] = table_files(uris[tables.MESSAGES])
    t0 = time.perf_counter()
    out["compaction"] = compact(lake, today=datetime.now(UTC).date() + timedelta(days=2))
    out["compaction_seconds"] = time.perf_counter() - t0
    out["after_compaction"] = table_files(uris[tables.MESSAGES])
    out["commitlog_bytes"] = sum(r["commitlog_bytes"] for r in runs)
    out["rows"] = sum(r["rows"] for r in runs)
    out["cpu_seconds"] = sum(r["cpu_seconds"] for r in runs)
    out["lake_bytes_per_commitlog_byte"] = out["after_compaction"]["bytes"] / out["commitlog_bytes"]
    return out


def main() -> dict:
    from pipelines.spark import get_spark

    t0 = time.perf_counter()
    results: dict = {"machine": machine(), "segment_bytes": SEGMENT, "loadavg_before": os.getloadavg()[0]}
    spark = get_spark(os.environ.get("BENCH_MASTER"), app_name="bench-lake-size")
    spark.range(4).count()
    with tempfile.TemporaryDirectory(prefix="mqlake-bench-lake-size-", dir="/tmp") as d:
        for kind in os.environ.get("BENCH_BODIES", "bench,random").split(","):
            results[kind] = run_kind(spark, Path(d), kind)
    results["loadavg_after"] = os.getloadavg()[0]
    results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_lake_size", results, print_report)


def print_report(r: dict) -> None:
    print(f"segments of {r['segment_bytes'] / 2**20:.0f} MiB, 1 KiB bodies, 4 queues, one topic; "
          f"load average {r['loadavg_before']:.1f} -> {r['loadavg_after']:.1f}")  # fmt: skip
    for kind in ("bench", "random"):
        k = r.get(kind)
        if not k:
            continue
        b, a = k["before_compaction"], k["after_compaction"]
        per_msg = k["commitlog_bytes"] / k["rows"]
        print(
            f"[{kind} bodies] {k['rows']:,} messages, CommitLog {per_msg:,.0f} B/msg (segment bytes), "
            f"lake {a['bytes'] / k['rows']:,.0f} B/msg: lake/CommitLog {k['lake_bytes_per_commitlog_byte']:.3f}"
        )
        for i, run in enumerate(k["runs"]):
            print(
                f"  tier run {i + 1}: {run['segments']} segments, {run['wall_seconds']:.1f} s wall, "
                f"{run['cpu_seconds']:.1f} CPU s (all processes) = "
                f"{run['commitlog_bytes'] / 1e6 / run['cpu_seconds']:.1f} MB per CPU-second; "
                f"table versions after {run['versions']}"
            )
        print(
            f"  before compaction: {b['files']} files, {b['bytes'] / 1e6:.1f} MB, {b['row_groups']} row groups "
            f"(mean {b['row_group_compressed_bytes_mean'] / 2**20:.2f} MiB compressed, "
            f"{b['rows'] / max(1, b['row_groups']):,.0f} rows), version {b['version']}"
        )
        print(
            f"  after compaction ({k['compaction_seconds']:.1f} s): {a['files']} files, {a['bytes'] / 1e6:.1f} MB, "
            f"{a['row_groups']} row groups (mean {a['row_group_compressed_bytes_mean'] / 2**20:.2f} MiB), "
            f"version {a['version']}, checkpoints {a['checkpoints']}; {k['compaction']}"
        )
