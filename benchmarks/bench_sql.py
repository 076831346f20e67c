"""``mqlake sql`` on a 1 GiB lake: one query per command (a JVM each) against statements in one ``--shell`` session.

Run: ``.venv/bin/python -m benchmarks bench_sql``.

Environment:
  BENCH_SCALE    multiplies the CommitLog tiered into the lake (default 1.0 = bench_tier's four sealed 256 MiB
                 segments, 1 GiB of 1 KiB messages)
  BENCH_LAKE     a lake directory to query instead of building one (kept as it is); with BENCH_KEEP_LAKE=DIR the
                 lake built is moved there afterwards, for the next run
  BENCH_JSON     a path: also write the JSON results there

What is timed, exactly (wall clock seen by this process, which only waits):
  * The lake: bench_tier's store (MessageStore.put_message, 1 KiB bodies, one topic, 4 queues) tiered by
    ``pipelines.compaction.job.tier`` into the ``messages`` Delta table; not timed.
  * cold: ``mqlake sql --lake L --format csv "<GROUP BY topic>"`` as a new process, start to exit: today's path
    (Python and the JVM start, the session, the lake's tables registered, the query).
  * shell: ``mqlake sql --lake L --shell --format csv`` as a new process, its statements written to its standard
    input; each statement is timed from the write to the shell's ``(N rows, T s)`` line. The first pays the
    session's start-up; the second is the same GROUP BY again; the third another GROUP BY topic that reads a
    column of every row (the time range of each topic), so no file is answered from its footer alone.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.bench_tier import write_store
from benchmarks.report import emit, machine

GROUP_BY = "SELECT topic, count(*) AS n FROM messages GROUP BY topic"
GROUP_BY_COLUMN = (
    "SELECT topic, count(*) AS n, min(store_timestamp) AS first, max(store_timestamp) AS last FROM messages "
    "GROUP BY topic"
)
STATS = re.compile(r"^\((\d+) rows?, ([\d.]+) s\)$")
TARGET_SECOND_QUERY_SECONDS = 2.0


def mqlake() -> str:
    return str(Path(sys.executable).with_name("mqlake"))


def build_lake(tmp: Path) -> tuple[Path, dict]:
    from pipelines.compaction.job import tier
    from pipelines.spark import get_spark

    store = write_store(tmp / "store")
    spark = get_spark(os.environ.get("BENCH_MASTER"), app_name="bench-sql-lake")
    try:
        report = tier(tmp / "store", tmp / "lake", spark=spark, file_reserved_time=0)
    finally:
        spark.stop()
    assert len(report.by_state("tiered")) == store["sealed_segments"], report.to_json()
    shutil.rmtree(tmp / "store")
    return tmp / "lake", store


def lake_facts(lake: Path) -> dict:
    files = [p for p in (lake / "messages").rglob("*.parquet")]
    return {"data_files": len(files), "data_bytes": sum(p.stat().st_size for p in files)}


def cold_query(lake: Path) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([mqlake(), "sql", "--lake", str(lake), "--format", "csv", GROUP_BY],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {"seconds": seconds, "rows": proc.stdout.splitlines()[1:]}


class Shell:
    """``mqlake sql --shell`` in a child process (``extra``: more of its options); ``run`` writes a statement and
    waits for its stats line."""

    def __init__(self, lake: Path, extra: Sequence[str] = ()) -> None:
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [mqlake(), "sql", "--lake", str(lake), *extra, "--shell", "--format", "csv"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.stdout: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.stdout.append), daemon=True).start()

    @staticmethod
    def _pump(stream, put) -> None:
        for line in stream:
            put(line.rstrip("\n"))

    def run(self, statement: str) -> dict:
        """Run ``statement``; returns its wall time (``seconds``, from the write to the stats line), the shell's own
        figure, its row count and (``printed``) the CSV lines it printed, header first."""
        assert self.proc.stdin is not None
        before = len(self.stdout)
        t0 = time.perf_counter()
        self.proc.stdin.write(statement + ";\n")
        self.proc.stdin.flush()
        while True:
            line = self.lines.get(timeout=900)
            if line.startswith("error:"):
                raise AssertionError(f"{statement}: {line}")
            m = STATS.match(line)
            if m:
                seconds = time.perf_counter() - t0
                rows = int(m.group(1))
                # the shell flushes its rows before the stats line, but they come through another pipe
                while len(self.stdout) < before + 1 + rows:
                    time.sleep(0.001)
                printed = self.stdout[before : before + 1 + rows]
                return {"seconds": seconds, "shell_seconds": float(m.group(2)), "rows": rows, "printed": printed}

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=120) == 0


def run(tmp: Path) -> dict:
    results: dict = {"machine": machine(), "loadavg_before": os.getloadavg()[0]}
    given = os.environ.get("BENCH_LAKE")
    if given:
        lake = Path(given)
    else:
        lake, results["store"] = build_lake(tmp)
    results["lake"] = lake_facts(lake)
    results["cold"] = cold_query(lake)
    shell = Shell(lake)
    try:
        results["shell"] = {
            "first": shell.run(GROUP_BY),
            "second": shell.run(GROUP_BY),
            "third": shell.run(GROUP_BY_COLUMN),
        }
        results["shell"]["session_start_to_first_result"] = time.perf_counter() - shell.started
    finally:
        shell.close()
    results["target_second_query_seconds"] = TARGET_SECOND_QUERY_SECONDS
    results["met"] = results["shell"]["second"]["seconds"] <= TARGET_SECOND_QUERY_SECONDS
    results["loadavg_after"] = os.getloadavg()[0]
    keep = os.environ.get("BENCH_KEEP_LAKE")
    if keep and not given:
        shutil.move(str(lake), keep)
    return results


def print_report(r: dict) -> None:
    lake, s = r["lake"], r["shell"]
    print(f"lake: messages table of {lake['data_files']} files, {lake['data_bytes'] / 2**20:.0f} MiB"
          + (f" (from {r['store']['sealed_bytes'] / 2**30:.2f} GiB of CommitLog, {r['store']['sealed_messages']:,} "
             f"messages)" if "store" in r else ""))  # fmt: skip
    print(f"cold `mqlake sql` GROUP BY topic (new process):  {r['cold']['seconds']:6.2f} s")
    for name in ("first", "second", "third"):
        q = s[name]
        own = f"(the shell's own figure {q['shell_seconds']:.2f} s)"
        print(f"--shell {name:6} statement:                      {q['seconds']:6.2f} s  {own}")
    print(f"second statement target <= {r['target_second_query_seconds']:.0f} s: {'met' if r['met'] else 'NOT met'}")
    print(f"load average before/after: {r['loadavg_before']:.2f} / {r['loadavg_after']:.2f}")


def main() -> dict:
    with tempfile.TemporaryDirectory(prefix="mqlake-bench-sql-", dir="/tmp") as d:
        t0 = time.perf_counter()
        results = run(Path(d))
        results["wall_seconds"] = time.perf_counter() - t0
    return emit("bench_sql", results, print_report)


if __name__ == "__main__":
    main()
