"""A Spark worker killed while ``mqlake tier`` stages on a standalone cluster: the run fails or its tasks finish
on the other worker, the next run finishes what is left, and the lake holds every sealed segment's messages
exactly once (the tier's idempotence holds across executors: a lost attempt's staged files are never committed).

A cluster of its own, since the kill leaves it one worker short.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from lake import tables
from pipelines.spark_cluster import StandaloneCluster
from store.retention import SegmentManifest, SegmentState
from tests.fixtures_spark import write_store
from tests.helpers import cli_env, signal_process_tree, wait_until

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parent.parent
MESSAGES = 3_000  # a dozen sealed 64 KiB segments, one staging task each: the kill lands while tasks remain


def _staged(lake: Path) -> Path | None:
    messages = lake / tables.MESSAGES
    return next(messages.rglob("*.parquet"), None) if messages.exists() else None


@pytest.mark.timeout(900)
def test_a_worker_killed_mid_tier_loses_and_duplicates_nothing(tmp_path):
    store = write_store(tmp_path / "store", MESSAGES)
    sealed = {e.file_name for e in SegmentManifest(store.root).entries() if e.state == SegmentState.SEALED}
    assert len(sealed) >= 4
    lake = tmp_path / "lake"
    with StandaloneCluster(tmp_path / "spark", workers=2) as cluster:

        def tier() -> subprocess.Popen:
            cmd = [sys.executable, "-m", "cli", "tier", "--store-dir", str(store.root), "--lake", str(lake),
                   "--file-reserved-time", "0", "--master", cluster.master_url, "--conf", "spark.cores.max=2",
                   "--conf", "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1"]  # fmt: skip
            env = cli_env(JAVA_TOOL_OPTIONS="-XX:TieredStopAtLevel=1")
            return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        first = tier()
        wait_until(lambda: _staged(lake) or first.poll() is not None, timeout=300, what="the first staged file")
        # the driver frozen while the worker is killed: the run cannot end in between (no task is handed out while it
        # is frozen, so tasks remain), however long the kill takes
        signal_process_tree(first.pid, signal.SIGSTOP)
        try:
            assert first.poll() is None, "the run ended before a worker could be killed while it staged"
            cluster.kill_worker(0)
        finally:
            signal_process_tree(first.pid, signal.SIGCONT)
        out1, err1 = first.communicate(timeout=400)
        second = tier()
        out2, err2 = second.communicate(timeout=400)
        assert second.returncode == 0, f"first exited {first.returncode}:\n{err1[-3000:]}\nsecond:\n{err2[-3000:]}"

    # every sealed segment tiered, each message once: the killed attempt's files are not in the table
    want = sorted(off for off, r in store.expected.items() if r["segment"] in sealed)
    got = DeltaTable(tables.table_uri(lake, tables.MESSAGES)).to_pyarrow_table(
        columns=["commitlog_offset", "body"]).to_pylist()  # fmt: skip
    assert sorted(r["commitlog_offset"] for r in got) == want, (out1, out2)
    assert all(r["body"] == store.expected[r["commitlog_offset"]]["body"] for r in got)
    segments = DeltaTable(tables.table_uri(lake, tables.SEGMENTS)).to_pyarrow_table(columns=["base_offset"])
    assert sorted(f"{b:020d}" for b in segments.column("base_offset").to_pylist()) == sorted(sealed)
