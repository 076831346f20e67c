"""Progress of a long job (``mqlake tier``, ``verify-index``, ``replay``): in a terminal a rich progress bar (done
and total rows or bytes, rate, ETA); anywhere else (a pipe, an Airflow task log) one log line every 10 s.

The job says what it will go through once it knows (``set_total``: bytes of the segments it claimed, rows it
selected); how far it got is read from Spark: the share of tasks completed in the stages started since then,
applied to that total (Spark's own console bar stays off: pipelines/spark.py sets spark.ui.showConsoleProgress
false). A job can also report exact steps (``advance``). Without a display (a job called from Python or a DAG
task) these calls do nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

log = logging.getLogger("mqlake.progress")

POLL_SECONDS = 0.5
LOG_EVERY_SECONDS = 10.0

_current: JobProgress | None = None


def set_total(total: int, unit: str) -> None:
    """The amount of work of the running job, in ``unit`` ("bytes" or "rows"); no-op without a display."""
    if _current is not None:
        _current.set_total(total, unit)


def advance(amount: int) -> None:
    """Exact work done (added to what Spark's tasks suggest is done)."""
    if _current is not None:
        _current.advance(amount)


def _human(n: float, unit: str) -> str:
    if unit != "bytes":
        return f"{n:,.0f} {unit}"
    for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or suffix == "TiB":
            return f"{n:.1f} {suffix}" if suffix != "B" else f"{n:.0f} B"
        n /= 1024
    return f"{n:.1f} TiB"


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class SparkTasks:
    """Completed and total tasks of the Spark jobs started since ``reset`` (read from its status tracker): a job
    that succeeded counts whole, even when its stages came and went between two polls or were skipped."""

    def __init__(self) -> None:
        self._baseline: set[int] = set()

    @staticmethod
    def _tracker() -> Any:
        from pyspark import SparkContext

        sc = SparkContext._active_spark_context  # the process's context, whichever thread made it
        return None if sc is None else sc.statusTracker()

    def reset(self) -> None:
        tracker = self._tracker()
        self._baseline = set(tracker.getJobIdsForGroup(None)) if tracker is not None else set()

    def fraction(self) -> float:
        tracker = self._tracker()
        if tracker is None:
            return 0.0
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(None):
            if job_id in self._baseline:
                continue
            job = tracker.getJobInfo(job_id)
            if job is None:
                continue
            for sid in job.stageIds:
                stage = tracker.getStageInfo(sid)
                if stage is None or stage.numTasks <= 0:
                    continue
                total += stage.numTasks
                done += stage.numTasks if job.status == "SUCCEEDED" else stage.numCompletedTasks
        return done / total if total else 0.0


class JobProgress:
    """``with JobProgress("tier", console):`` around a job: shows its progress while it runs."""

    def __init__(self, job: str, console: Any, *, spark_tasks: SparkTasks | None = None,
                 log_every: float = LOG_EVERY_SECONDS) -> None:  # fmt: skip
        self.job = job
        self.console = console
        self.tasks = spark_tasks or SparkTasks()
        self.log_every = log_every
        self.total = 0
        self.unit = "bytes"
        self._exact = 0
        self._done = 0.0
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._bar: Any = None
        self._task_id: Any = None

    # --- fed by the job ---------------------------------------------------------------------------------------
    def set_total(self, total: int, unit: str) -> None:
        with self._lock:
            self.total, self.unit, self._exact, self._done = max(total, 0), unit, 0, 0.0
            self._started = time.monotonic()
        with contextlib.suppress(Exception):  # no Spark yet: tasks are read once it exists
            self.tasks.reset()
        if self._bar is not None:
            self._bar.update(self._task_id, total=self.total or None, completed=0,
                             description=f"{self.job} ({unit})")  # fmt: skip

    def advance(self, amount: int) -> None:
        with self._lock:
            self._exact += amount

    # --- measured -----------------------------------------------------------------------------------------------
    def done(self) -> float:
        """Work done so far (never decreasing, never above the total)."""
        try:
            spark_share = self.tasks.fraction() * self.total
        except Exception:  # the context went away between polls
            spark_share = 0.0
        with self._lock:
            self._done = min(max(self._done, spark_share + self._exact), self.total)
            return self._done

    def line(self) -> str:
        """One log line: done of total (percent), rate, ETA."""
        done, total, elapsed = self.done(), self.total, max(time.monotonic() - self._started, 1e-9)
        rate = done / elapsed
        eta = (total - done) / rate if rate > 0 else None
        pct = f" ({done / total:.0%})" if total else ""
        return (f"{self.job}: {_human(done, self.unit)} of {_human(total, self.unit)}{pct}, "
                f"{_human(rate, self.unit)}/s, ETA {_eta(eta)}")  # fmt: skip

    # --- display --------------------------------------------------------------------------------------------------
    def _poll(self) -> None:
        next_log = time.monotonic() + self.log_every
        while not self._stop.wait(POLL_SECONDS):
            if self._bar is not None:
                done, u = self.done(), self.unit
                rate = done / max(time.monotonic() - self._started, 1e-9)
                self._bar.update(self._task_id, completed=done, amount=f"{_human(done, u)} / {_human(self.total, u)}",
                                 rate=f"{_human(rate, u)}/s")  # fmt: skip
            elif time.monotonic() >= next_log and self.total:
                log.info("%s", self.line())
                next_log = time.monotonic() + self.log_every

    def __enter__(self) -> JobProgress:
        global _current
        if log.level == logging.NOTSET:  # the lines are wanted even where the command logs warnings only
            log.setLevel(logging.INFO)
        if not logging.getLogger().handlers and not log.handlers:  # a command that configured no logging
            handler = logging.StreamHandler(self.console.file)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            log.addHandler(handler)
        if self.console.is_terminal:
            from rich.progress import (
                BarColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                TextColumn("{task.fields[amount]}"), TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                TimeRemainingColumn(), console=self.console, transient=True,
            )  # fmt: skip
            self._task_id = self._bar.add_task(self.job, total=None, amount="", rate="")
            self._bar.start()
        _current = self
        self._thread = threading.Thread(target=self._poll, name=f"{self.job}-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        global _current
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        _current = None
        if self._bar is not None:
            self._bar.stop()
        elif self.total and exc[0] is None:
            log.info("%s (finished)", self.line())
