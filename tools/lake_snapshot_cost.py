"""What a big ``messages`` table costs to open, for docs/scaling.md "Sizing" (row L4).

Usage: ``.venv/bin/python tools/lake_snapshot_cost.py FILES PER_COMMIT``

Commits FILES add actions (no data files: only the log is read) with statistics like the tier's on 14 columns,
PER_COMMIT to a commit, under a temporary lake, then times ``DeltaTable(uri)`` and the broker's
``LakeReader(lake).snapshot()`` (every file's statistics) and prints one JSON line.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deltalake import DeltaTable, Schema  # noqa: E402
from deltalake.transaction import AddAction, create_table_with_add_actions  # noqa: E402

from lake import tables  # noqa: E402
from lake.delta import TABLE_PROPERTIES  # noqa: E402
from lake.reader import LakeReader  # noqa: E402
from lake.schema import MESSAGES_SCHEMA  # noqa: E402

INTS = ("queue_id", "queue_offset", "commitlog_offset", "msg_size", "store_timestamp", "born_timestamp", "body_crc",
        "flag", "sys_flag", "reconsume_times", "prepared_txn_offset", "magic")  # fmt: skip
PARTITIONS = [tables.MESSAGES_PARTITION_BY[0], tables.STORE_DATE]


def add(i: int) -> AddAction:
    lo: dict = {c: i * 8192 for c in INTS} | {"tags": "TagA", "segment": f"{i:020d}"}
    hi: dict = {c: i * 8192 + 8191 for c in INTS} | {"tags": "TagA", "segment": f"{i:020d}"}
    stats = json.dumps({"numRecords": 8192, "minValues": lo, "maxValues": hi, "nullCount": dict.fromkeys(INTS, 0)})
    part = {"topic": f"T{i % 100}", tables.STORE_DATE: f"2026-11-{1 + i % 28:02d}"}
    path = f"topic={part['topic']}/{tables.STORE_DATE}={part[tables.STORE_DATE]}/part-{i:08d}.parquet"
    return AddAction(path, 2_000_000, part, 1_700_000_000_000, True, stats)


def main(files: int, per_commit: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="mqlake-snapshot-cost-") as d:
        lake = Path(d)
        uri = tables.table_uri(lake, tables.MESSAGES)
        create_table_with_add_actions(
            uri, Schema.from_arrow(MESSAGES_SCHEMA), [add(i) for i in range(per_commit)], mode="error",
            partition_by=PARTITIONS, configuration=TABLE_PROPERTIES,
        )  # fmt: skip
        for k in range(per_commit, files, per_commit):
            DeltaTable(uri).create_write_transaction(
                [add(i) for i in range(k, min(files, k + per_commit))], mode="append",
                schema=MESSAGES_SCHEMA, partition_by=PARTITIONS,
            )  # fmt: skip
        log_bytes = sum(p.stat().st_size for p in (Path(uri) / "_delta_log").iterdir())
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        version = DeltaTable(uri).version()
        open_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        snap = LakeReader(lake).snapshot()
        snap_s = time.perf_counter() - t0
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "files": files, "version": version, "delta_log_mb": round(log_bytes / 1e6, 1),
        "open_table_s": round(open_s, 2), "broker_snapshot_s": round(snap_s, 2),
        "snapshot_files": len(snap.files) if snap else 0, "peak_rss_growth_mb": round((rss1 - rss0) / 1024),
        "loadavg": round(os.getloadavg()[0], 1),
    }  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]))))
