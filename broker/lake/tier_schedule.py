"""The embedded default of tiering (``mqlake up``): with ``lakePath`` set, the broker runs the tier job itself at
its ``deleteWhen`` hours; without it, it says how many bytes wait for tiering, so the disk never fills silently.

The job runs as a child process (``command``, built by the CLI: ``python -m pipelines.compaction ... --json``),
so its Spark JVM never shares the broker's process; one run at a time, its JSON report summarised in the log.
The store's own clean pass then deletes the segments the run tiered.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from store.config import ExpiredSegmentPolicy, MessageStoreConfig
from store.retention import SegmentEntry, SegmentState, is_deletion_hour

log = logging.getLogger(__name__)

WAITING = (SegmentState.EXPIRED, SegmentState.TIERING)  # expired, not yet in the tier: they stay on disk


def waiting_for_tier(entries: Sequence[SegmentEntry]) -> tuple[int, int]:
    """(segments, bytes) that expired under the tier policy and are not tiered yet."""
    waiting = [e for e in entries if e.state in WAITING]
    return len(waiting), sum(e.size for e in waiting)


def _summary(report: dict) -> str:
    states: dict[str, int] = {}
    for s in report.get("segments", []):
        states[s["state"]] = states.get(s["state"], 0) + 1
    parts = [f"{n} {state}" for state, n in sorted(states.items())] or ["nothing due"]
    return f"run {report.get('run_id')}: {', '.join(parts)}; report {report.get('report_path')}"


class TierSchedule:
    """Runs in the broker's event loop until cancelled."""

    def __init__(
        self,
        store_config: MessageStoreConfig,
        entries: Callable[[], list[SegmentEntry]],
        lake: Path | str | None,
        command: Sequence[str] | None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.store_config = store_config
        self.entries = entries
        self.lake = lake
        self.command = list(command or ())
        self.now = now
        self.runs = 0
        self._skip_hour: int | None = None  # a run failed or found nothing: the next try is the next deletion hour
        self._logged_backlog: tuple[int, int] | None = None

    @property
    def interval(self) -> float:
        return self.store_config.clean_resource_interval / 1000

    async def run(self) -> None:
        if self.store_config.expired_segment_policy != ExpiredSegmentPolicy.TIER:
            return  # expired segments are deleted, never wait for a tier
        while True:
            try:
                if self.lake is None or not self.command:
                    self.log_backlog(await self._entries())
                elif self._due() and waiting_for_tier(await self._entries())[0] > 0:
                    await self.run_once()
            except Exception:  # a schedule that dies would leave the disk to fill: log and go on
                log.exception("tier schedule")
            await asyncio.sleep(self.interval)

    async def _entries(self) -> list[SegmentEntry]:
        # A worker thread, not aiofiles: the read holds the manifest's flock, which waits for a tier run's
        # read-modify-write; one thread call takes the lock, reads and parses.
        return await asyncio.to_thread(self.entries)

    def log_backlog(self, entries: Sequence[SegmentEntry]) -> None:
        """Without the embedded run: the bytes waiting, at start-up and whenever they change."""
        backlog = waiting_for_tier(entries)
        if backlog == self._logged_backlog:
            return
        self._logged_backlog = backlog
        count, size = backlog
        store = self.store_config.store_path_root_dir
        if self.lake is None:
            how = (
                f"set lakePath in broker.conf (or --lake on `mqlake up`) so the broker tiers them at deleteWhen, "
                f"or run `mqlake tier --store-dir {store} --lake LAKE`"
            )
        else:
            how = f"run `mqlake tier --store-dir {store} --lake {self.lake}` (or the mqlake_tier DAG)"
        level = logging.WARNING if count else logging.INFO
        log.log(level, "%d bytes in %d expired CommitLog segment(s) wait for tiering (expiredSegmentPolicy=tier) "
                    "and stay on disk until tiered: %s", size, count, how)  # fmt: skip

    def _due(self) -> bool:
        now = self.now()
        if not is_deletion_hour(self.store_config.delete_when, now):
            return False
        return self._skip_hour != int(now // 3600)

    async def run_once(self) -> dict | None:
        """One tier run as a child process; its report (None when it failed, logged)."""
        self.runs += 1
        log.info("tiering expired segments into %s", self.lake)
        proc = await asyncio.create_subprocess_exec(
            *self.command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            out, err = await proc.communicate()
        except asyncio.CancelledError:  # the broker is stopping: the job's claims are taken over by the next run
            proc.kill()
            await proc.wait()
            raise
        lines = out.decode("utf-8", "replace").strip().splitlines()
        report = None
        if proc.returncode == 0 and lines:
            try:
                report = json.loads(lines[-1])
            except ValueError:
                report = None
        if report is None or not report.get("segments"):
            self._skip_hour = int(self.now() // 3600)  # no loop of runs: another job holds the claims, or Spark fails
        if report is None:
            tail = err.decode("utf-8", "replace").strip().splitlines()[-5:]
            log.error("tier run failed (exit %s): %s", proc.returncode, " | ".join(tail) or "no output")
            return None
        log.info("tier %s", _summary(report))
        return report
