"""Before a job on a Spark cluster: do the executors see the store and the lake at the driver's paths?

On ``local[*]`` the executors are threads of the driver and see what it sees.  On a cluster each executor
opens the CommitLog segments and the lake's Parquet files itself, at the paths the driver names, so the store
must be mounted at the same path on every worker (read-only is enough) and so must the lake (tiering's
executors also write their staged Parquet files into it).  Without this check a worker that lacks the mount
fails deep inside a task; with it the job stops first with the path and the executor's host.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from store.errors import MQLakeError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class ExecutorAccessError(MQLakeError, PermissionError):
    """A Spark executor cannot read (or write) a path the job needs."""


def _probe(read: Sequence[str], write: Sequence[str]) -> dict:
    """What this executor's Python worker cannot do: ``{path: reason}``, with its host and process."""
    problems: dict[str, str] = {}
    for path in read:
        try:
            if os.path.isdir(path):
                os.listdir(path)
            else:
                with open(path, "rb") as f:
                    f.read(1)
        except OSError as e:
            problems[path] = f"cannot read it ({e.strerror or e})"
    for path in write:
        if not os.path.isdir(path):
            problems[path] = "no such directory"
        elif not os.access(path, os.W_OK | os.X_OK):
            problems[path] = "cannot write into it"
    return {"host": socket.gethostname(), "pid": os.getpid(), "problems": problems}


def check_executors_see(
    spark: SparkSession, *, read: Sequence[Path] = (), write: Sequence[Path] = (), tasks: int | None = None
) -> list[dict]:
    """Run one small task per executor core that tries every path; raise :class:`ExecutorAccessError`
    naming the first path and host that fail.  Returns each task's report.  Nothing runs on a local master.

    ``read``: files (opened, one byte read) and directories (listed); ``write``: directories."""
    sc = spark.sparkContext
    if sc.master.startswith("local"):
        return []
    read_paths = [str(Path(p).absolute()) for p in read]
    write_paths = [str(Path(p).absolute()) for p in write]
    n = tasks or max(2, sc.defaultParallelism)

    def run(_: Iterator[int]) -> Iterator[dict]:
        yield _probe(read_paths, write_paths)

    reports = sc.parallelize(range(n), n).mapPartitions(run).collect()
    for r in reports:
        if r["problems"]:
            path, reason = next(iter(r["problems"].items()))
            more = len(r["problems"]) - 1
            raise ExecutorAccessError(
                f"a Spark executor on host {r['host']} (Python worker pid {r['pid']}) {reason}: {path}"
                + (f" (and {more} more paths)" if more else "")
                + "; every Spark worker must see the store at the driver's path (read-only is enough) and the lake"
                " (for a lake on S3: the staging directory, $MQLAKE_STAGING_DIR; see docs/scaling.md)"
            )
    return reports
