"""``verify_index``: rebuild every ConsumeQueue and IndexFile from the CommitLog, compare, report, repair.

Which CommitLog records are judged:
- no process holds the store lock: every record in the local segments;
- a broker holds it: the records that end at or below the dispatched bound, read *before* the scan: the
  highest offset a ConsumeQueue unit reaches (``live.dispatched_bound``), lowered to the end of the last
  record the IndexFile header says is complete (``live.indexed_bound``); live units and index entries
  beyond it were written after we looked and are counted as ``not_judged``, not as errors.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from lake import reports
from pipelines import job_progress
from pipelines.executor_access import check_executors_see
from pipelines.index_rebuild import consume_queue as cqmod
from pipelines.index_rebuild import index_file as idxmod
from pipelines.index_rebuild.live import LiveIndexFile, broker_running, dispatched_bound, index_files, indexed_bound
from pipelines.spark import ENGINE_LOCAL, ENGINES, choose_engine
from store.config import MessageStoreConfig
from store.dump import Problem
from store.errors import MQLakeError
from store.file_sizes import infer_store_config
from store.format import delay, records, units

if TYPE_CHECKING:
    import pyarrow as pa

    from pipelines.index_rebuild.scan import ScanResult

log = logging.getLogger(__name__)
REPAIR_MANIFEST = "repair.json"
_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,100}$")  # it goes into a Delta predicate


class VerifyError(MQLakeError, RuntimeError):
    """The store cannot be verified as given (no CommitLog, an unreadable record, a bad run id, a used --out)."""


def _name_ms(name: str) -> int:
    """The creation time an index file name (yyyyMMddHHmmssSSS, local time) stands for."""
    return int(datetime.strptime(name[:14], "%Y%m%d%H%M%S").timestamp() * 1000) + int(name[14:])


def _index_names(pairs: list[tuple]) -> list[str | None]:
    """Names for the rebuilt files: the live counterpart's, else the first store time; kept strictly rising
    because the store orders its files by name."""
    names: list[str | None] = []
    prev = -1
    for rf, lf in pairs:
        if rf is None:
            names.append(None)
            continue
        ms = _name_ms(lf.name) if lf is not None else rf.header.begin_timestamp
        ms = max(ms, prev + 1)
        prev = ms
        names.append(units.index_file_name(ms))
    return names


def verify_index(
    store_dir: Path,
    *,
    spark=None,
    master: str | None = None,
    conf: dict[str, str] | None = None,
    report_path: Path | None = None,
    lake: Path | str | None = None,
    repair_out: Path | None = None,
    store_config: MessageStoreConfig | None = None,
    run_id: str | None = None,
    engine: str | None = None,
) -> dict:
    """Verify ``store_dir``'s ConsumeQueue and IndexFile files against the CommitLog; returns the report.

    ``store_config`` gives the file sizes and delay levels (default: read off the files, as the tiering
    job does).  With ``repair_out`` the rebuilt files are written there in the store's layout.  ``run_id``
    names the run (default: random); a rerun under the same id replaces its ``index_verification`` rows.
    ``engine`` scans the CommitLog ``"local"``ly (this process, its cores) or with ``"spark"`` (executors read
    the segments); default: :func:`choose_engine`.  The report is the same either way.
    """
    from pipelines.segment_reader import segment_files

    store_dir = Path(store_dir)
    if not (store_dir / "commitlog").is_dir():
        raise VerifyError(f"{store_dir} has no commitlog directory")
    if run_id is not None and not _RUN_ID.match(run_id):
        raise VerifyError(f"run id {run_id!r}: 1-100 characters of [A-Za-z0-9_-]")
    engine = engine or choose_engine(spark, master)
    if engine not in ENGINES:
        raise VerifyError(f"engine {engine!r}: one of {', '.join(ENGINES)}")
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    cfg = store_config or infer_store_config(store_dir)
    running = broker_running(store_dir)
    bound = None
    if running:
        # The prefix both files are complete for: a record's unit is written before its index entries.
        bound = dispatched_bound(store_dir)
        indexed = indexed_bound(store_dir) if cfg.message_index_enable else None
        if indexed is not None:
            bound = min(bound, indexed)
    segments = segment_files(store_dir)
    cl_min = int(segments[0].name) if segments else 0
    job_progress.set_total(sum(p.stat().st_size for p in segments), "bytes")

    millis = delay.parse_delay_levels(cfg.message_delay_level)
    try:
        scan = _scan(engine, spark, master, conf, store_dir, bound, millis)
    except records.RecordError as e:
        raise VerifyError(f"cannot read the CommitLog: {e}") from None
    except Exception as e:  # a RecordError raised in a Spark task arrives wrapped; keep its words
        text = str(e)
        where = next((ln.strip() for ln in text.splitlines() if "invalid CommitLog record" in ln), text.splitlines()[0])
        raise VerifyError(f"cannot read the CommitLog: {where}") from None
    t_scan = time.perf_counter()

    cq_size = cfg.mapped_file_size_consume_queue
    rebuilt_q = cqmod.rebuild_queues(scan.table)
    odd: list[Problem] = []  # entries of consumequeue/ that are no queue: skipped, and reported
    queues = cqmod.compare_all(store_dir, rebuilt_q, file_size=cq_size, cl_min=cl_min, bound=bound, odd=odd)
    t_cq = time.perf_counter()

    slots, index_num = cfg.max_hash_slot_num, cfg.max_index_num
    live_idx = [LiveIndexFile(p, slots, index_num) for p in index_files(store_dir)]
    # Rebuild by each rule the records tell apart (with no tag key they agree) and keep the one the live files
    # follow exactly, else the closest: mismatches are reported against it.
    rules = idxmod.RULES if cfg.message_index_enable and idxmod.has_tag_keys(scan.table) else (idxmod.RULE_4,)
    rule, reindexed, rebuilt_idx, pairs, indexes = _choose_rule(
        rules, lambda r: _rebuild_index(scan.table, store_dir, r, live_idx, slots, index_num, cl_min,
                                        enabled=cfg.message_index_enable), slots, bound)  # fmt: skip
    t_idx = time.perf_counter()

    repair = None
    if repair_out is not None:
        names = [r.rebuilt_file for r in indexes]
        repair = _write_repair(Path(repair_out), store_dir, rebuilt_q, rebuilt_idx, pairs, names, cfg, scan, cl_min)
    t_end = time.perf_counter()

    q_ok = sum(1 for q in queues if q.ok)
    i_ok = sum(1 for r in indexes if r.ok)
    report = {
        "run_id": run_id or uuid.uuid4().hex[:12],
        "started_at": started.isoformat(),
        "store_dir": str(store_dir.resolve()),
        "broker_running": running,
        "dispatched_bound": bound,
        "abnormal_shutdown": not running and (store_dir / "abort").exists(),
        "commitlog": {"segments": len(segments), "min_offset": cl_min, "scanned_records": scan.table.num_rows,
                      "scanned_bytes": scan.bytes, "end_offset": scan.end_offset},
        "settings": {"mappedFileSizeConsumeQueue": cq_size, "maxHashSlotNum": slots, "maxIndexNum": index_num,
                     "messageIndexEnable": cfg.message_index_enable},
        "summary": {"ok": q_ok == len(queues) and i_ok == len(indexes), "queues": len(queues), "queues_ok": q_ok,
                    "index_files": len(indexes), "index_files_ok": i_ok,
                    # the RocketMQ IndexService rule the IndexFiles are judged by: "4.x" indexes the UNIQ_KEY and
                    # keys (the store's rule), "5.x" also each tag; the one they match exactly, else the closest
                    "index_rule": rule,
                    "cq_units_matched": sum(q.matched for q in queues),
                    "index_entries_matched": sum(r.matched for r in indexes)},
        "engine": engine,
        "timings": {"scan_seconds": t_scan - t0, "consume_queue_seconds": t_cq - t_scan,
                    "index_seconds": t_idx - t_cq, "repair_seconds": t_end - t_idx, "total_seconds": t_end - t0},
        # records a restart indexed again (the store's and RocketMQ's re-dispatch does that), offset -> times
        "reindexed_records": {str(k): v for k, v in sorted(reindexed.items())},
        "consume_queues": [asdict(q) for q in queues],
        "skipped": [str(p) for p in odd],
        "index_files": [asdict(r) for r in indexes],
        "repair": repair,
    }  # fmt: skip
    if report_path is not None:
        Path(report_path).parent.mkdir(parents=True, exist_ok=True)
        Path(report_path).write_text(json.dumps(report, indent=2) + "\n")
    if lake is not None:
        from pipelines.index_rebuild.report import append_to_lake

        append_to_lake(lake, report, started)
        # beside the tier and replay reports, where the broker's metrics read the last run of each job
        path = reports.report_path(lake, "verify", report["run_id"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
    return report


def _scan(engine: str, spark, master: str | None, conf: dict[str, str] | None, store_dir: Path, bound: int | None,
          millis: list[int]) -> ScanResult:  # fmt: skip
    from pipelines.index_rebuild.scan import scan_dispatch, scan_local

    if engine == ENGINE_LOCAL:
        return scan_local(store_dir, bound=bound, delay_millis=millis)
    if spark is None:
        from pipelines.spark import get_spark

        spark = get_spark(master, app_name="mqlake-verify-index", conf=conf)
    check_executors_see(spark, read=[store_dir / "commitlog"])  # on a cluster the executors scan the CommitLog
    return scan_dispatch(spark, store_dir, bound=bound, delay_millis=millis)


def _rebuild_index(table: pa.Table, store_dir: Path, rule: str, live_idx: list[LiveIndexFile], slots: int,
                   index_num: int, cl_min: int, *, enabled: bool) -> tuple:  # fmt: skip
    """(rule, reindexed records, entries, rebuilt files, pairs) of rebuilding the IndexFiles by ``rule``."""
    import numpy as np

    ent = idxmod.index_entries(table, store_dir, rule)
    if not enabled:
        ent = ent.take(np.zeros(0, np.int64))
    reindexed = idxmod.reindexed_records(ent, live_idx, cl_min)
    ent = idxmod.repeat_records(ent, reindexed)
    rebuilt_idx = idxmod.rebuild_index(ent, slots, index_num, live=live_idx, cl_min=cl_min)
    return rule, reindexed, ent, rebuilt_idx, idxmod.match_files(rebuilt_idx, live_idx)


def _choose_rule(rules: tuple[str, ...], rebuild: Callable[[str], tuple], slots: int, bound: int | None) -> tuple:
    """The judged rebuild of the rule the live files follow: the fewest entries apart, then the fewest files not
    ok, then the first listed (4.x's).  Judging walks the chains of every entry that differs, which by the wrong
    rule is nearly all of them, so rules are ranked by entries apart (numpy) first and only the closest are
    judged; a rule the files follow exactly ends the search before the next one is even rebuilt."""
    built = []
    exact = {}
    for rule in rules:
        b = rebuild(rule)
        apart = sum(idxmod.entries_apart(rf, lf) for rf, lf in b[4])
        if apart == 0:
            exact[rule] = judged = _judge_index(b, slots, bound)
            if all(r.ok for r in judged[4]):
                return judged
        built.append((apart, b))
    least = min(a for a, _ in built)
    judged_all = [exact.get(b[0]) or _judge_index(b, slots, bound) for a, b in built if a == least]
    return min(judged_all, key=lambda j: sum(not r.ok for r in j[4]))


def _judge_index(built: tuple, slots: int, bound: int | None) -> tuple:
    """(rule, reindexed records, rebuilt files, pairs, results) of comparing one rule's rebuild with the live files
    (``min`` over these keeps the first rule listed on a tie, 4.x's)."""
    rule, reindexed, ent, rebuilt_idx, pairs = built
    # With a broker running, the live file holding the rebuild's last entry may have grown (or rolled) since.
    last_rebuilt = rebuilt_idx[-1] if rebuilt_idx else None
    indexes = [
        idxmod.compare_file(rf, lf, ent, slots, bound=bound, last=rf is not None and rf is last_rebuilt)
        for rf, lf in pairs
    ]
    names = _index_names(pairs)
    for res, name in zip(indexes, names, strict=True):
        res.rebuilt_file = name
    return rule, reindexed, rebuilt_idx, pairs, indexes


def _write_repair(out: Path, store_dir: Path, rebuilt_q, rebuilt_idx, pairs, names, cfg, scan, cl_min: int) -> dict:
    """Rebuilt files under ``out`` in the store's layout, and ``repair.json`` saying what they cover."""
    if (out / "consumequeue").exists() or (out / "index").exists():
        raise VerifyError(f"{out} already holds rebuilt files; give an empty --out directory")
    out.mkdir(parents=True, exist_ok=True)
    queues = []
    for q in rebuilt_q.values():
        if cqmod.unnamable(q.topic) is not None:
            continue  # no directory can hold it (the report names its records); the store never dispatches them
        files = cqmod.write_queue(out, q, cfg.mapped_file_size_consume_queue)
        queues.append({"topic": q.topic, "queue_id": q.queue_id, "files": [p.name for p in files]})
    index_dir = out / "index"
    index_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for (rf, _lf), name in zip(pairs, names, strict=True):
        if rf is not None:
            idxmod.write_index_file(index_dir / name, rf, cfg.max_hash_slot_num, cfg.max_index_num)
            written.append(name)
    manifest = {
        "store_dir": str(store_dir.resolve()),
        "commitlog_min_offset": cl_min,
        "commitlog_end_offset": scan.end_offset,
        "settings": {"mappedFileSizeConsumeQueue": cfg.mapped_file_size_consume_queue,
                     "maxHashSlotNum": cfg.max_hash_slot_num, "maxIndexNum": cfg.max_index_num},
        "consume_queues": queues,
        "index_files": written,
        "written_at": datetime.now(UTC).isoformat(),
    }  # fmt: skip
    (out / REPAIR_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return {"out": str(out), "queues": len(queues), "index_files": len(written)}
