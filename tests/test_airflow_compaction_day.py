"""The mqlake_tier DAG's weekly branch: ``compact`` runs on the ``mqlake_compact_weekday`` and is skipped on the
other days, after a run that had nothing to tier.

``dag.test()`` runs in a child process as tests/test_airflow_dags.py runs it (its ``airflow_home`` fixture and
``run_dag``), on the real clock: the DAG judges the day by the run's ``run_after``, which its run id carries, so
the test reads the day from there (a run that crosses midnight is judged by the day it ran on).
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime

import pytest

from store.message_store import MessageStore
from tests.helpers import make_config, make_message
from tests.test_airflow_dags import run_dag

pytestmark = pytest.mark.airflow

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


def _run_day(run_id: str) -> date:
    """The day of a ``dag.test()`` run, from its id (``manual__2026-11-29T04:15:00...``)."""
    m = re.search(r"(\d{4}-\d{2}-\d{2})T", run_id)
    assert m, f"no date in the run id {run_id!r}"
    return date.fromisoformat(m.group(1))


def test_weekly_compaction_runs_on_its_weekday_and_is_skipped_on_the_others(airflow_home, tmp_path):  # noqa: F811
    s = MessageStore(make_config(tmp_path)).start()  # a store with nothing sealed: nothing to tier
    assert s.put_message(make_message("Weekly", 0, b"m")).ok
    s.shutdown()
    env = airflow_home | {"TZ": "UTC"}  # the DAG's weekday is the broker's local clock: UTC here, as the run id
    today = datetime.now(UTC).weekday()
    for name, shift in (("on", 0), ("off", 3)):
        weekday = WEEKDAYS[(today + shift) % 7]
        result = run_dag(env, tmp_path, "mqlake_tier", {"compact": "weekly"}, spark_submit=False,
                         store_dir=tmp_path / "store", lake=tmp_path / "lake", compact_weekday=weekday)  # fmt: skip
        assert result["state"] == "success", result["log"][-6000:]
        t = result["tasks"]
        assert (t["find_expired"], t["tier_args"], t["check_integrity"]) == ("success", "skipped", "skipped")
        assert t["compaction_day"] == "success", name
        due = WEEKDAYS[_run_day(result["run_id"]).weekday()] == weekday
        if due:
            assert t["compact"] == "success", result["log"][-6000:]
            assert "compaction: {}" in result["log"], "compact ran (on a lake with no table yet)"
        else:
            assert t["compact"] == "skipped", result["log"][-6000:]
            assert "compaction: " not in result["log"]
