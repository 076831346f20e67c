"""ConsumeQueues rebuilt from the dispatch table, compared unit by unit with the live files, and written out.

A queue's rebuilt units are what ``ConsumeQueue.put`` writes for each consumable record: at
``queue_offset`` the unit (CommitLog offset, size, tagsCode).  Units are judged from the queue's first
local record on; live units below it that point below the CommitLog minimum are data tiered away and
are expected to be gone, not errors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipelines.index_rebuild.live import cq_files, queue_dirs, read_units
from store import names as store_names
from store.dump import Problem
from store.format import records, units

UNIT = units.CQ_UNIT_SIZE
MAX_PROBLEMS = 20  # listed per queue; the counts are always complete


@dataclass
class RebuiltQueue:
    topic: str
    queue_id: int
    queue_offsets: np.ndarray  # sorted
    units: np.ndarray  # units.CQ_UNIT_DTYPE, aligned with queue_offsets

    @property
    def first(self) -> int:
        return int(self.queue_offsets[0])

    @property
    def end(self) -> int:
        return int(self.queue_offsets[-1]) + 1


def rebuild_queues(table: pa.Table) -> dict[tuple[str, int], RebuiltQueue]:
    """Group the consumable records per (topic, queue) and sort them by queue offset.  A topic that cannot name a
    directory is kept here: :func:`compare_all` reports it (the broker's dispatch quarantines its records) and a
    repair leaves it out."""
    sys_flag = table.column("sys_flag").to_numpy()
    tx = sys_flag & records.TRANSACTION_ROLLBACK_TYPE
    # records.is_consumable, over the whole column
    keep = np.flatnonzero((tx == records.TRANSACTION_NOT_TYPE) | (tx == records.TRANSACTION_COMMIT_TYPE))
    if len(keep) == 0:
        return {}
    t = table.select(["topic", "queue_id", "queue_offset", "commitlog_offset", "msg_size", "tags_code"]).take(keep)
    topics = t.column("topic").combine_chunks().dictionary_encode()
    codes = topics.indices.to_numpy(zero_copy_only=False)
    qid = t.column("queue_id").to_numpy()
    qo = t.column("queue_offset").to_numpy()
    order = np.lexsort((qo, qid, codes))
    codes, qid, qo = codes[order], qid[order], qo[order]
    rows = np.empty(len(order), units.CQ_UNIT_DTYPE)
    rows["phy"] = t.column("commitlog_offset").to_numpy()[order]
    rows["size"] = t.column("msg_size").to_numpy()[order]
    rows["tags"] = t.column("tags_code").to_numpy()[order]
    starts = np.flatnonzero(np.r_[True, (codes[1:] != codes[:-1]) | (qid[1:] != qid[:-1])])
    ends = np.r_[starts[1:], len(order)]
    names = topics.dictionary.to_pylist()
    out = {}
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        key = (names[codes[a]], int(qid[a]))
        out[key] = RebuiltQueue(key[0], key[1], qo[a:b], rows[a:b])
    return out


@dataclass
class QueueResult:
    topic: str
    queue_id: int
    status: str = "ok"  # ok | mismatch | missing (no live files) | extra (live only)
    verified_from: int | None = None  # first queue offset judged
    verified_to: int | None = None  # one past the last
    matched: int = 0
    missing: int = 0
    extra: int = 0
    mismatched: int = 0
    expected_gone: int = 0  # live units below the local minimum (tiered data)
    not_judged: int = 0  # live units past the dispatched bound of a running broker
    first_bad_queue_offset: int | None = None
    files_identical: list[str] = field(default_factory=list)
    files_differing: list[str] = field(default_factory=list)
    files_missing: list[str] = field(default_factory=list)
    problems: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _unit_dict(u) -> dict:
    return {"commitlog_offset": int(u["phy"]), "size": int(u["size"]), "tags_code": int(u["tags"])}


def compare_queue(
    qdir: Path, rebuilt: RebuiltQueue | None, topic: str, queue_id: int, *, file_size: int, cl_min: int,
    bound: int | None,
) -> QueueResult:  # fmt: skip
    """Judge one queue's live files against its rebuilt units; ``bound`` is set when a broker is running."""
    res = QueueResult(topic, queue_id)
    per_file = file_size // UNIT
    files = cq_files(qdir)
    live_lo = min((int(p.name) // UNIT for p in files), default=None)
    live_hi = max((int(p.name) // UNIT + per_file for p in files), default=None)
    lo = min(x for x in (live_lo, rebuilt.first if rebuilt else None) if x is not None) if (files or rebuilt) else 0
    hi = max(x for x in (live_hi, rebuilt.end if rebuilt else None) if x is not None) if (files or rebuilt) else 0
    n = hi - lo
    live = np.zeros(n, units.CQ_UNIT_DTYPE)
    live_file = np.full(n, -1, np.int32)  # which file a position was read from
    for i, path in enumerate(files):
        size = path.stat().st_size
        if size != file_size:
            res.problems.append({"kind": "file_size", "topic": topic, "queue_id": queue_id, "file": str(path),
                                 "position": 0, "detail": f"size {size}, mappedFileSizeConsumeQueue is {file_size}"})
        in_file = read_units(path)[:per_file]
        at = int(path.name) // UNIT - lo
        live[at : at + len(in_file)] = in_file
        live_file[at : at + len(in_file)] = i
    live_present = (live["phy"] != 0) | (live["size"] != 0) | (live["tags"] != 0)
    exp = np.zeros(n, units.CQ_UNIT_DTYPE)
    exp_present = np.zeros(n, bool)
    if rebuilt is not None:
        exp[rebuilt.queue_offsets - lo] = rebuilt.units
        exp_present[rebuilt.queue_offsets - lo] = True
        res.verified_from, res.verified_to = rebuilt.first, rebuilt.end
    # Not judged: fill units and units pointing below the CommitLog minimum (tiered data) ahead of the
    # first local record; with a running broker, units past the dispatched bound (written after we looked).
    first = rebuilt.first - lo if rebuilt is not None else n
    ahead = np.arange(n) < first
    gone = live_present & ~exp_present & ahead & (
        (live["size"] == units.CQ_FILL_SIZE) | (live["phy"].astype(np.int64) + live["size"] <= cl_min)
    )
    late = np.zeros(n, bool)
    if bound is not None:
        late = live_present & ~exp_present & (live["phy"].astype(np.int64) + live["size"] > bound)
    res.expected_gone = int(gone.sum())
    res.not_judged = int(late.sum())
    equal = live.view(np.uint8).reshape(n, UNIT) == exp.view(np.uint8).reshape(n, UNIT)
    same = equal.all(axis=1)
    matched = exp_present & live_present & same
    missing = exp_present & ~live_present
    mismatched = exp_present & live_present & ~same
    extra = live_present & ~exp_present & ~gone & ~late
    res.matched, res.missing = int(matched.sum()), int(missing.sum())
    res.mismatched, res.extra = int(mismatched.sum()), int(extra.sum())
    bad = np.flatnonzero(missing | mismatched | extra)
    if len(bad):
        res.first_bad_queue_offset = int(bad[0]) + lo
    for k in bad[:MAX_PROBLEMS].tolist():
        q = k + lo
        f = live_file[k]
        path = str(files[f]) if f >= 0 else str(qdir / units.offset_to_file_name(q // per_file * file_size))
        kind = "missing" if missing[k] else "mismatched" if mismatched[k] else "extra"
        p = {"kind": kind, "topic": topic, "queue_id": queue_id, "queue_offset": q, "file": path,
             "position": (q % per_file) * UNIT,
             "expected": _unit_dict(exp[k]) if exp_present[k] else None,
             "actual": _unit_dict(live[k]) if live_present[k] else None}  # fmt: skip
        res.problems.append(p)
    # Files, byte for byte over the range the rebuild covers.
    judged = exp_present | extra
    names = {int(p.name): p.name for p in files}
    for base_q in range((lo // per_file) * per_file, hi, per_file):
        a, b = max(base_q, lo) - lo, min(base_q + per_file, hi) - lo
        if not judged[a:b].any():
            continue
        name = units.offset_to_file_name(base_q * UNIT)
        if base_q * UNIT not in names:
            res.files_missing.append(name)
        elif (matched[a:b] | ~judged[a:b]).all():
            res.files_identical.append(name)
        else:
            res.files_differing.append(name)
    if rebuilt is None and not files:
        res.status = "ok"
    elif not files and rebuilt is not None:
        res.status = "missing"
    elif rebuilt is None and res.extra:
        res.status = "extra"
    elif bad.size or any(p["kind"] == "file_size" for p in res.problems):
        res.status = "mismatch"
    return res


def unnamable(topic: str) -> str | None:
    """Why ``topic`` cannot name a ConsumeQueue directory (``consumequeue/{topic}/``), or None when it can."""
    return store_names.file_name_error(topic)


def _unnamable_result(store_dir: Path, rebuilt: RebuiltQueue, topic: str, queue_id: int, why: str) -> QueueResult:
    """A queue of records whose topic cannot be a directory: nothing to compare, one problem naming where its
    first record lies."""
    from pipelines.segment_reader import segment_files

    phy = int(rebuilt.units["phy"][0])
    seg = next((p for p in reversed(segment_files(store_dir)) if int(p.name) <= phy), None)
    detail = (f"the topic cannot name a ConsumeQueue directory ({why}): {len(rebuilt.queue_offsets)} record(s) of "
              f"queue {queue_id} from CommitLog offset {phy} cannot be dispatched")  # fmt: skip
    problem = {"kind": "topic_name", "topic": topic, "queue_id": queue_id, "commitlog_offset": phy,
               "file": str(seg) if seg is not None else "", "position": phy - int(seg.name) if seg else phy,
               "detail": detail}  # fmt: skip
    return QueueResult(topic, queue_id, status="bad_topic_name", problems=[problem])


def compare_all(
    store_dir: Path, rebuilt: dict[tuple[str, int], RebuiltQueue], *, file_size: int, cl_min: int, bound: int | None,
    odd: list[Problem] | None = None,
) -> list[QueueResult]:
    """Every queue, live or rebuilt, judged; entries of ``consumequeue/`` that are no queue go to ``odd``."""
    live = queue_dirs(store_dir, odd)
    cq_root = Path(store_dir) / "consumequeue"
    out = []
    for topic, qid in sorted(set(live) | set(rebuilt)):
        why = unnamable(topic) if (topic, qid) not in live else None
        if why is not None:
            out.append(_unnamable_result(store_dir, rebuilt[(topic, qid)], topic, qid, why))
            continue
        qdir = live.get((topic, qid), cq_root / topic / str(qid))
        out.append(compare_queue(qdir, rebuilt.get((topic, qid)), topic, qid, file_size=file_size, cl_min=cl_min,
                                 bound=bound))  # fmt: skip
    return out


def write_queue(out_root: Path, q: RebuiltQueue, file_size: int) -> list[Path]:
    """Write a queue's rebuilt files, full size, in the store's layout under ``out_root/consumequeue``.

    Positions below the first local record in its file hold fill units, as ``ConsumeQueue.put`` writes
    when a queue starts mid-file.
    """
    per_file = file_size // UNIT
    qdir = out_root / "consumequeue" / q.topic / str(q.queue_id)
    qdir.mkdir(parents=True, exist_ok=True)
    written = []
    first_file = q.first // per_file
    for f in range(first_file, (q.end - 1) // per_file + 1):
        in_file = np.zeros(per_file, units.CQ_UNIT_DTYPE)
        if f == first_file:
            fill = np.zeros(1, units.CQ_UNIT_DTYPE)
            fill["phy"], fill["size"], fill["tags"] = units.CQ_FILL_UNIT
            in_file[: q.first - f * per_file] = fill
        sel = (q.queue_offsets >= f * per_file) & (q.queue_offsets < (f + 1) * per_file)
        in_file[q.queue_offsets[sel] - f * per_file] = q.units[sel]
        path = qdir / units.offset_to_file_name(f * file_size)
        with open(path, "wb") as fh:
            fh.write(in_file.tobytes())
            os.fsync(fh.fileno())
        written.append(path)
    return written
