"""A failed ``mqlake sql`` prints one ``error:`` line on the console and keeps Spark's stack trace and query plan
in the log file that line names; ``--verbose`` puts Spark's own log back on the console."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import cli_env

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def _sql(tmp_path, *extra: str) -> subprocess.CompletedProcess[str]:
    lake = tmp_path / "lake"
    lake.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "cli", *extra, "sql", "--lake", str(lake), "SELECT * FROM nosuch"],
                          capture_output=True, text=True, timeout=500,
                          env=cli_env(MQLAKE_LOG_DIR=str(tmp_path / "logs")))  # fmt: skip


def test_a_failed_query_is_one_error_line_naming_the_log_with_the_details(tmp_path):
    done = _sql(tmp_path)
    assert done.returncode == 1
    [error] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    log = tmp_path / "logs" / "spark.log"
    assert "TABLE_OR_VIEW_NOT_FOUND" in error and str(log) in error
    # no JSON log record, Java stack trace, Spark plan or Spark banner on the console
    assert not any(line.lstrip().startswith(("{", "at ", "+-", "'")) for line in done.stderr.splitlines())
    assert "log4j" not in done.stderr and "setLogLevel" not in done.stderr and len(done.stderr) < 1000
    text = log.read_text()
    assert "UnresolvedRelation" in text  # the plan, kept for whoever needs it
    assert "at org.apache.spark" in text  # the JVM's stack trace, from its own log


def test_verbose_shows_spark_on_the_console(tmp_path):
    done = _sql(tmp_path, "--verbose")
    assert done.returncode == 1
    assert "at org.apache.spark" in done.stderr or '"exception"' in done.stderr
