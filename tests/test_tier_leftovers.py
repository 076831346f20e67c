"""Staged files of dead tier runs: a live run's lease keeps its files, a dead run's never-committed files go,
committed ones stay (real Delta table, real ``flock`` leases)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lake import delta as lk
from pipelines.compaction.leftovers import DONE, RunLease, remove_dead_runs_files

pytestmark = pytest.mark.unit

ROWS = pa.table({"x": pa.array([1, 2], pa.int64())})


def _staged(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(ROWS, path)
    return path


def test_a_dead_runs_uncommitted_files_go_and_a_live_runs_stay(tmp_path) -> None:
    root = tmp_path / "messages"
    live = RunLease(root, "live")
    live_file = _staged(live.acquire() / "part-live.parquet")
    dead = RunLease(root, "dead")
    dead_dir = dead.acquire()
    committed = _staged(dead_dir / "part-committed.parquet")
    lost = _staged(dead_dir / "x=1" / "part-lost.parquet")
    dead.release()  # as the kernel does when the run is killed
    legacy = _staged(root / "tier-before-leases" / "part-old.parquet")  # a run directory without a lease
    lk.commit_files(root, lk.add_actions(root, [committed]), schema=ROWS.schema, partition_by=[], app_id="t",
                    version=1)  # fmt: skip

    removed = remove_dead_runs_files(root)

    assert sorted(removed) == ["tier-before-leases/part-old.parquet", "tier-dead/x=1/part-lost.parquet"]
    assert live_file.exists() and committed.exists() and not lost.exists() and not legacy.parent.exists()
    assert (dead_dir / DONE).exists() and not (dead_dir / "x=1").exists()
    assert lk.to_arrow(root).num_rows == 2  # the table is as committed
    assert remove_dead_runs_files(root) == []  # a held lease and a done directory: nothing to look at

    live.release()
    assert remove_dead_runs_files(root) == ["tier-live/part-live.parquet"]
    assert not live_file.parent.exists()


def test_files_removed_from_the_table_stay_for_time_travel(tmp_path) -> None:
    root = tmp_path / "messages"
    run = RunLease(root, "r")
    directory = run.acquire()
    staged = [_staged(directory / f"part-{i}.parquet") for i in range(2)]
    run.release()
    version = lk.commit_files(root, lk.add_actions(root, staged), schema=ROWS.schema, partition_by=[], app_id="t",
                              version=1)  # fmt: skip
    lk.delete_rows(root, "x = 1 OR x = 2")  # both files leave the table (a reverted commit)
    assert lk.to_arrow(root).num_rows == 0

    assert remove_dead_runs_files(root) == []
    assert all(p.exists() for p in staged) and lk.to_arrow(root, version=version).num_rows == 4
