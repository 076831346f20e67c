"""The broker's embedded tier schedule (``mqlake up`` with a lake): the hour gate and the back-off.

The schedule runs its job (a child process, as the CLI builds it) only in ``deleteWhen``'s hours of the local
clock, and after a run that failed it waits for the next deletion hour rather than starting the job again at
every pass.  The clock is injected and counts the schedule's looks, so "did not run" is seen after it looked.
The job here is a small Python child that records each run and fails or reports as the test says.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime

import pytest

from broker.lake.tier_schedule import TierSchedule
from broker.remoting.loop import run
from store.retention import SegmentEntry, SegmentState
from tests.aio import poll
from tests.helpers import local_zone, make_config

JOB = """
import json, pathlib, sys
runs, mode = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]).read_text()
runs.write_text(runs.read_text() + "run\\n" if runs.exists() else "run\\n")
if mode == "fail":
    print("Spark failed to start", file=sys.stderr)
    sys.exit(1)
print(json.dumps({"run_id": "r1", "segments": [{"state": "tiered"}], "report_path": "report.json"}))
"""


def _at(day: int, hour: int, minute: int = 0) -> float:
    return datetime(2026, 11, day, hour, minute, tzinfo=UTC).timestamp()


class _Clock:
    """The schedule's clock: set by the test, counting the schedule's reads of it (one per look, at least)."""

    def __init__(self, t: float) -> None:
        self.t, self.reads = t, 0

    def __call__(self) -> float:
        self.reads += 1
        return self.t

    async def looks(self, more: int) -> None:
        target = self.reads + more
        await poll(lambda: self.reads >= target, what=f"{more} looks of the schedule")


@pytest.mark.integration
@pytest.mark.expected_errors(r"tier run failed")
def test_the_tier_job_runs_only_in_the_deletion_hour_and_backs_off_after_a_failure(tmp_path, caplog):
    runs, mode = tmp_path / "runs.txt", tmp_path / "mode.txt"
    mode.write_text("fail")
    waiting = [SegmentEntry(base_offset=0, size=1024, state=SegmentState.EXPIRED)]
    cfg = make_config(tmp_path, deleteWhen="04", expiredSegmentPolicy="tier", cleanResourceInterval=10)
    clock = _Clock(_at(28, 3, 30))
    schedule = TierSchedule(cfg, lambda: waiting, tmp_path / "lake",
                            [sys.executable, "-c", JOB, str(runs), str(mode)], now=clock)  # fmt: skip

    def ran() -> int:
        return len(runs.read_text().splitlines()) if runs.exists() else 0

    async def scenario() -> None:
        task = asyncio.ensure_future(schedule.run())
        try:
            await clock.looks(5)  # 03:30: segments wait, but it is not a deletion hour
            assert (schedule.runs, ran()) == (0, 0)

            clock.t = _at(28, 4, 10)  # the deletion hour: the job runs, and fails
            await poll(lambda: "tier run failed (exit 1)" in caplog.text, 30, what="the failed run's log")
            assert (schedule.runs, ran()) == (1, 1)
            assert "Spark failed to start" in caplog.text, "the failure's stderr is in the log"

            clock.t = _at(28, 4, 50)  # the same hour: no second try
            await clock.looks(5)
            assert (schedule.runs, ran()) == (1, 1)

            clock.t = _at(28, 5, 0)  # past the hour, still segments waiting: the gate is closed
            await clock.looks(5)
            assert schedule.runs == 1

            mode.write_text("ok")
            clock.t = _at(29, 4, 0)  # the next deletion hour: tried again, and this run tiers
            await poll(lambda: "tier run r1: 1 tiered" in caplog.text, 30, what="the next day's run")
            assert (schedule.runs, ran()) == (2, 2)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    caplog.set_level("INFO", logger="broker.lake.tier_schedule")
    with local_zone("UTC"):
        run(scenario())
