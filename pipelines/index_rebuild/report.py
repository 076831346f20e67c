"""The verification result as data: rows of the Delta table ``index_verification`` and a terminal summary."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pyarrow as pa

from lake import objectstore, tables

TABLE = "index_verification"
MAX_ROWS_SHOWN = 30

# One row per queue / index file per run.
ROW_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("run_time", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("store_dir", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),  # consume_queue | index_file
        pa.field("topic", pa.string()),
        pa.field("queue_id", pa.int32()),
        pa.field("file", pa.string()),  # index: the live file (null when missing); queue: first differing file
        pa.field("status", pa.string(), nullable=False),
        pa.field("ok", pa.bool_(), nullable=False),
        pa.field("matched", pa.int64(), nullable=False),
        pa.field("missing", pa.int64(), nullable=False),
        pa.field("mismatched", pa.int64(), nullable=False),
        pa.field("extra", pa.int64(), nullable=False),
        pa.field("unreachable", pa.int64(), nullable=False),
        pa.field("first_bad_queue_offset", pa.int64()),
        pa.field("begin_phy_offset", pa.int64()),
        pa.field("end_phy_offset", pa.int64()),
        pa.field("problems", pa.string()),  # JSON list of the first problems, each naming file and offsets
    ]
)


def rows(report: dict, run_time: datetime) -> pa.Table:
    base = {"run_id": report["run_id"], "run_time": run_time, "store_dir": report["store_dir"]}
    out = []
    for q in report["consume_queues"]:
        bad = q["files_differing"] + q["files_missing"]
        out.append(base | {
            "kind": "consume_queue", "topic": q["topic"], "queue_id": q["queue_id"], "file": bad[0] if bad else None,
            "status": q["status"], "ok": q["status"] == "ok", "matched": q["matched"], "missing": q["missing"],
            "mismatched": q["mismatched"], "extra": q["extra"], "unreachable": 0,
            "first_bad_queue_offset": q["first_bad_queue_offset"], "begin_phy_offset": None, "end_phy_offset": None,
            "problems": json.dumps(q["problems"]) if q["problems"] else None,
        })  # fmt: skip
    for r in report["index_files"]:
        out.append(base | {
            "kind": "index_file", "topic": None, "queue_id": None, "file": r["file"], "status": r["status"],
            "ok": r["status"] == "ok", "matched": r["matched"], "missing": r["missing"], "mismatched": r["mismatched"],
            "extra": r["extra"], "unreachable": r["unreachable"], "first_bad_queue_offset": None,
            "begin_phy_offset": r["begin_phy_offset"], "end_phy_offset": r["end_phy_offset"],
            "problems": json.dumps(r["problems"]) if r["problems"] else None,
        })  # fmt: skip
    return pa.Table.from_pylist(out, schema=ROW_SCHEMA)


def append_to_lake(lake: Path | str, report: dict, run_time: datetime) -> str:
    """Write this run's rows to ``LAKE/index_verification`` in one driver-side delta-rs commit.

    The commit replaces any rows of the same run id, so a retried run (an orchestrator's retry reuses its
    id) leaves one set of rows, not two.
    """
    from deltalake import write_deltalake

    from lake import delta as lk

    table_dir = tables.table_uri(lake, TABLE)
    if not objectstore.is_remote(table_dir):
        Path(table_dir).parent.mkdir(parents=True, exist_ok=True)
    data = rows(report, run_time)
    opts = objectstore.storage_options(table_dir)
    with objectstore.reaching(table_dir, "appending the verification rows"):
        if lk.is_table(table_dir):
            write_deltalake(table_dir, data, mode="overwrite", predicate=f"run_id = '{report['run_id']}'",
                            storage_options=opts)  # fmt: skip
        else:
            write_deltalake(table_dir, data, mode="append", storage_options=opts)
    return table_dir


def _where(p: dict) -> str:
    bits = [f"{k}={p[k]}" for k in ("topic", "queue_id", "queue_offset", "key", "entry", "slot", "commitlog_offset",
                                    "position") if p.get(k) is not None]  # fmt: skip
    return " ".join(bits)


def print_summary(report: dict, console=None) -> None:
    """A rich table of every queue / index file that does not match, and the totals; outside a terminal each
    row is one line with every value in full (store/console.py)."""
    from store.console import console as new_console
    from store.console import styled, table

    console = console or new_console()
    s = report["summary"]
    bad_q = [q for q in report["consume_queues"] if q["status"] != "ok"]
    bad_i = [r for r in report["index_files"] if r["status"] != "ok"]
    if bad_q or bad_i:
        mismatches = table("kind", "topic/queue or file", "status", "matched", "missing", "mismatched", "extra",
                           "unreachable", "first problem", title="index verification: mismatches")  # fmt: skip
        for q in bad_q[:MAX_ROWS_SHOWN]:
            first = q["problems"][0] if q["problems"] else {}
            mismatches.add_row("ConsumeQueue", f"{q['topic']}-{q['queue_id']}", q["status"], str(q["matched"]),
                               str(q["missing"]), str(q["mismatched"]), str(q["extra"]), "",
                               f"{first.get('kind', '')} {first.get('file', '')} {_where(first)}")  # fmt: skip
        for r in bad_i[:MAX_ROWS_SHOWN]:
            first = r["problems"][0] if r["problems"] else {}
            name = r["file"] or f"(missing; offsets {r['begin_phy_offset']}..{r['end_phy_offset']})"
            mismatches.add_row("IndexFile", name, r["status"], str(r["matched"]), str(r["missing"]),
                               str(r["mismatched"]), str(r["extra"]), str(r["unreachable"]),
                               f"{first.get('kind', '')} {first.get('reason', first.get('detail', ''))} "
                               f"{_where(first)}")  # fmt: skip
        console.print(mismatches)
        hidden = max(0, len(bad_q) - MAX_ROWS_SHOWN) + max(0, len(bad_i) - MAX_ROWS_SHOWN)
        if hidden:
            console.print(f"... and {hidden} more; the JSON report (--report) lists them all")
    for entry in report.get("skipped", []):
        console.print(f"skipped {entry}", highlight=False)
    c = report["commitlog"]
    t = report["timings"]
    mib = c["scanned_bytes"] / 2**20  # binary units, as the job's progress line counts them
    verdict = ("all match", "green") if s["ok"] else ("MISMATCH", "red")
    console.print(styled(
        verdict, f": {s['queues_ok']}/{s['queues']} ConsumeQueues, {s['index_files_ok']}/{s['index_files']} "
        f"IndexFiles (RocketMQ {s['index_rule']} index rule);"
        f" {c['scanned_records']} records, {mib:,.1f} MiB of CommitLog in {t['total_seconds']:.1f} s"
        + (f" (broker running: judged up to offset {report['dispatched_bound']})" if report["broker_running"] else "")
    ))  # fmt: skip
    if report.get("repair"):
        console.print(f"rebuilt files written to {report['repair']['out']}")
