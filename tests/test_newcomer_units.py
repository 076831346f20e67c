"""The small habits a newcomer and an operator meet first, each checked where it is decided: the registration
heartbeat's log level, the start-up error that names --store-dir, the tier run that explains why nothing was
due, the replay report's name, verify-index's one unit, and `make airflow`'s loopback-only components."""

from __future__ import annotations

import io
import logging
import subprocess
import time
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from broker.namesrv.route_table import RouteTable
from broker.remoting.protocol.topic import DataVersion
from cli.main import app
from lake.reports import report_path
from pipelines.compaction.cli import waiting_segments_note
from pipelines.index_rebuild.report import print_summary
from pipelines.replay.spec import new_replay_id
from store.config import MessageStoreConfig
from store.retention import SegmentManifest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.unit
def test_an_unchanged_re_registration_logs_at_debug_a_changed_one_at_info(caplog):
    table = RouteTable()

    def register(counter: int) -> None:
        table.register_broker("DefaultCluster", "127.0.0.1:10911", "broker-a", 0, "127.0.0.1:10912",
                              DataVersion(counter=counter, timestamp=1), {}, [], 120.0)  # fmt: skip

    with caplog.at_level(logging.DEBUG, logger="broker.namesrv"):
        register(1)
        register(1)  # the 30 s heartbeat, nothing changed
        register(2)  # a topic was created
    levels = [r.levelno for r in caplog.records if r.getMessage().startswith("registered broker")]
    assert levels == [logging.INFO, logging.DEBUG, logging.INFO]


@pytest.mark.unit
def test_a_store_dir_that_cannot_be_made_is_one_error_line_naming_the_option(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = CliRunner().invoke(app, ["up", "--store-dir", str(blocker / "store"), "--namesrv-port", "1",
                                      "--broker-port", "1", "--no-proxy"])  # fmt: skip
    assert result.exit_code == 1
    [line] = [x for x in result.stderr.splitlines() if "error" in x.lower()]
    assert line.startswith("error: cannot use the store directory") and "--store-dir" in line
    assert "[Errno" not in line and "Not a directory" in line


@pytest.mark.unit
def test_tier_with_nothing_due_says_what_waits_and_the_option_to_take_it(tmp_path):
    now_ms = int(time.time() * 1000)
    manifest = SegmentManifest(tmp_path)
    size = 1024 * 1024
    # eleven sealed segments, written an hour ago, and the open one
    files = [(i * size, size) for i in range(12)]
    stats = {i * size: (100, now_ms - 3_600_000, now_ms - 3_600_000 + i) for i in range(11)}
    manifest.sync_files(files, stats)
    note = waiting_segments_note(tmp_path, MessageStoreConfig(fileReservedTime=72))
    assert note.startswith("11 sealed segment(s) wait to expire after fileReservedTime=72 h, the first at ")
    assert "--file-reserved-time" in note and "1.00 h old" in note

    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no sealed segment waits" in waiting_segments_note(empty)


@pytest.mark.unit
def test_a_replay_report_is_named_once_replay():
    replay_id = new_replay_id()
    assert not replay_id.startswith("replay-")
    assert report_path("/lake", "replay", f"{replay_id}-run1").name == f"replay-{replay_id}-run1.json"


@pytest.mark.unit
def test_verify_index_speaks_one_unit():
    out = io.StringIO()
    report = {"summary": {"ok": True, "queues_ok": 1, "queues": 1, "index_files_ok": 1, "index_files": 1,
                          "index_rule": "4.x"},
              "consume_queues": [], "index_files": [], "commitlog": {"scanned_records": 10, "scanned_bytes": 3 << 20},
              "timings": {"total_seconds": 1.0}, "broker_running": False}  # fmt: skip
    print_summary(report, Console(file=out, width=200))
    assert "3.0 MiB of CommitLog" in out.getvalue() and " MB " not in out.getvalue()


@pytest.mark.integration  # runs make
def test_make_airflow_starts_no_log_server_and_binds_the_api_to_loopback():
    plan = subprocess.run(["make", "-n", "-W", "install", "airflow"], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=True).stdout  # fmt: skip
    assert "airflow standalone" not in plan  # its scheduler and triggerer serve logs on 0.0.0.0:8793/8794
    assert "airflow scheduler --skip-serve-logs" in plan and "airflow triggerer --skip-serve-logs" in plan
    assert "AIRFLOW__API__HOST=127.0.0.1" in plan
