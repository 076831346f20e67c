"""Progress of long jobs: Spark's task counts turned into rows/bytes done, a rich bar in a terminal, log lines
elsewhere, and ``mqlake verify-index`` reporting its progress on a real store."""

from __future__ import annotations

import io
import logging
import shutil

import pytest
from rich.console import Console

from pipelines import job_progress as jp


@pytest.mark.unit
def test_done_is_clamped_monotonic_and_the_line_says_total_rate_and_eta() -> None:
    p = jp.JobProgress("tier", Console(file=io.StringIO()))
    p.set_total(4 * 1024 * 1024, "bytes")
    p.advance(1024 * 1024)
    assert p.done() == 1024 * 1024
    line = p.line()
    assert line.startswith("tier: 1.0 MiB of 4.0 MiB (25%), ") and "/s, ETA " in line
    p.advance(10 * 1024 * 1024)  # more than the total: never past it
    assert p.done() == 4 * 1024 * 1024
    rows = jp.JobProgress("replay", Console(file=io.StringIO()))
    rows.set_total(2000, "rows")
    assert rows.line().startswith("replay: 0 rows of 2,000 rows (0%)")
    # without a display, the jobs' calls do nothing
    jp.set_total(10, "rows")
    jp.advance(5)


@pytest.mark.unit
def test_outside_a_terminal_it_logs_a_line_every_interval(caplog) -> None:
    caplog.set_level(logging.INFO, logger="mqlake.progress")
    with jp.JobProgress("replay", Console(file=io.StringIO()), log_every=0.0) as p:
        jp.set_total(100, "rows")
        jp.advance(40)

        def logged() -> bool:
            return any("replay: 40 rows of 100 rows (40%)" in r.getMessage() for r in caplog.records)

        from tests.helpers import wait_until

        wait_until(logged, 10, what="a progress line")
        assert p.total == 100
    assert "replay: 40 rows of 100 rows (40%)" in caplog.records[-1].getMessage()
    assert caplog.records[-1].getMessage().endswith("(finished)")


@pytest.mark.spark
def test_spark_tasks_drive_the_bar_to_the_total(spark) -> None:
    out = io.StringIO()
    with jp.JobProgress("replay", Console(file=out, force_terminal=True, width=120)) as p:
        p.set_total(1000, "rows")
        assert spark.range(0, 20_000, numPartitions=8).repartition(4).count() == 20_000
        # every stage the job started has finished: all of the total is done
        assert p.done() == 1000
    assert "replay" in out.getvalue()


@pytest.mark.spark
def test_verify_index_reports_progress_in_its_log(spark, spark_store, tmp_path, caplog) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    store_dir = tmp_path / "store"
    shutil.copytree(spark_store.root, store_dir)
    total = sum(p.stat().st_size for p in (store_dir / "commitlog").iterdir())
    caplog.set_level(logging.INFO, logger="mqlake.progress")
    lake = tmp_path / "lake"
    res = CliRunner().invoke(app, ["verify-index", "--store-dir", str(store_dir), "--lake", str(lake)])
    assert res.exit_code == 0, res.output
    lines = [r.getMessage() for r in caplog.records if r.name == "mqlake.progress"]
    finished = [ln for ln in lines if ln.startswith("verify-index: ") and ln.endswith("(finished)")]
    assert len(finished) == 1, lines
    assert f"of {jp._human(total, 'bytes')} (100%)" in finished[0]
    # its report lands beside the tier and replay reports, where the broker's metrics find the last run
    from broker.server.metrics import last_job_runs
    from lake.objectstore import reports_dir

    assert last_job_runs(reports_dir(lake))["verify"][1] is True


@pytest.mark.spark
def test_tier_sets_its_total_to_the_claimed_segments(spark, tmp_path, caplog) -> None:
    from pipelines.compaction.job import tier
    from tests.fixtures_spark import write_store

    written = write_store(tmp_path / "s")
    caplog.set_level(logging.INFO, logger="mqlake.progress")
    with jp.JobProgress("tier", Console(file=io.StringIO())) as p:
        report = tier(written.root, tmp_path / "lake", spark=spark, file_reserved_time=0)
    assert report.segments and p.total == written.segment_size * len(report.segments)
    assert p.unit == "bytes" and p.done() == p.total
    last = caplog.records[-1].getMessage()
    assert last.startswith("tier: ") and "(100%)" in last and last.endswith("(finished)")
