"""CommitLog segment files read in this process, no Spark: list them (:func:`segment_files`), walk one checking
every record (:func:`scan_segment`), decode the records of a byte range as Arrow batches (:func:`read_segment`).
The ``commitlog`` Spark source (pipelines/segments.py) reads through these, and so do the jobs' local engines.

Zeros where a record would start end a segment quietly: that is the active segment's unwritten tail
(the store writes TOTALSIZE + MAGICCODE last, so a concurrent append is either whole or invisible).
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import pyarrow as pa

from lake import columnar
from lake.schema import MESSAGE_SCHEMA, SEGMENT_FACTS_SCHEMA
from store.errors import MQLakeError
from store.format import records, units

DEFAULT_SPLIT_SIZE = 1024 * 1024 * 1024
DEFAULT_BATCH_RECORDS = 8192
_BATCH_BYTES = 16 * 1024 * 1024  # a batch also ends here, so large messages do not make huge batches
_TAIL_WINDOW = 4 * 1024 * 1024 + 64 * 1024  # a torn append is at most one record (maxMessageSize 4 MiB)
_SCAN_RECORDS = 65536


class CommitLogSourceError(MQLakeError, ValueError):
    """A path or an option the commitlog source cannot use."""


class CommitLogNotFoundError(MQLakeError, FileNotFoundError):
    """A path given to the commitlog source does not exist."""


def segment_files(path: str | Path | Sequence[str | Path]) -> list[Path]:
    """The CommitLog segment files under ``path``, by base offset.

    ``path``: a store root (has ``commitlog/``), a commitlog directory, a segment file, a
    comma-separated string of those, or a list of them.  A named path that does not exist raises.
    """
    items = [p.strip() for p in path.split(",") if p.strip()] if isinstance(path, str) else (
        [path] if isinstance(path, Path) else list(path)
    )
    found: dict[Path, None] = {}
    for item in items:
        p = Path(item)
        if not p.exists():
            raise CommitLogNotFoundError(f"no CommitLog store, directory or segment at {p}")
        if p.is_dir():
            d = p / "commitlog" if (p / "commitlog").is_dir() else p
            for f in d.iterdir():
                if f.is_file() and units.is_offset_file_name(f.name):
                    found[f] = None
        elif units.is_offset_file_name(p.name):
            found[p] = None
        else:
            raise CommitLogSourceError(f"{p} is not a CommitLog segment (its name must be a 20-digit base offset)")
    return sorted(found, key=lambda f: int(f.name))


@dataclass(slots=True)
class SegmentFacts:
    """What one pass over a segment file finds; the columns of ``SEGMENT_FACTS_SCHEMA``."""

    segment: str
    path: str
    base_offset: int
    file_size: int
    record_count: int = 0
    valid_bytes: int = 0
    ends_with_blank: bool = False
    torn_tail: bool = False
    torn_tail_bytes: int = 0
    crc_errors: int = 0
    first_store_timestamp: int | None = None
    last_store_timestamp: int | None = None
    min_commitlog_offset: int | None = None
    max_commitlog_offset: int | None = None
    error: str | None = None

    def as_row(self) -> dict:
        return asdict(self)


assert [f.name for f in fields(SegmentFacts)] == SEGMENT_FACTS_SCHEMA.names


def _map(path: Path) -> mmap.mmap | None:
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return None
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def _close(mm: mmap.mmap | None) -> None:
    if mm is None:
        return
    with contextlib.suppress(BufferError):  # a view still alive (e.g. held by a traceback): the GC unmaps it
        mm.close()


def _nonzero_tail(mm, pos: int) -> int:
    """How many bytes from ``pos`` up to the last non-zero byte within one record's reach (0: all zeros)."""
    import numpy as np

    window = np.frombuffer(mm, np.uint8, count=min(len(mm), pos + _TAIL_WINDOW) - pos, offset=pos)
    nz = np.flatnonzero(window)
    return int(nz[-1]) + 1 if len(nz) else 0


def scan_segment(path: Path, check_crc: bool = True) -> SegmentFacts:
    """Walk a whole segment file, checking every record's fields and (``check_crc``) body CRC (no Spark needed);
    without ``check_crc``, ``crc_errors`` stays 0."""
    path = Path(path)
    facts = SegmentFacts(path.name, str(path), int(path.name), path.stat().st_size)
    mm = _map(path)
    if mm is None:
        return facts
    try:
        pos = 0
        while True:
            w = records.RecordWalk(mm, pos, max_records=_SCAN_RECORDS)
            positions = w.positions()
            if positions:
                layout = columnar.layout_records(mm, positions, source=str(path))
                _count(facts, mm, layout, check_crc)
                if layout.error is not None:
                    _bad_at(facts, mm, layout.error)
                    return facts
            if w.ended is not records.WalkEnd.LIMIT:
                _end_of_data(facts, mm, w)
                return facts
            pos = w.end
    finally:
        _close(mm)


def _count(facts: SegmentFacts, mm, layout: columnar.RecordLayout, check_crc: bool) -> None:
    """Fold a run of checked records into the facts."""
    import numpy as np

    if not len(layout):
        return
    cols = columnar.read_columns(mm, layout, ("store_timestamp", "commitlog_offset"))
    ts, off = cols["store_timestamp"], cols["commitlog_offset"]
    if facts.first_store_timestamp is None:
        facts.first_store_timestamp, facts.min_commitlog_offset = int(ts[0]), int(off.min())
        facts.max_commitlog_offset = int(off.max())
    facts.last_store_timestamp = int(ts[-1])
    facts.min_commitlog_offset = min(facts.min_commitlog_offset, int(off.min()))
    facts.max_commitlog_offset = max(facts.max_commitlog_offset, int(off.max()))
    facts.record_count += len(layout)
    if check_crc:
        facts.crc_errors += int(np.count_nonzero(~columnar.body_crc_ok(mm, layout)))
    facts.valid_bytes = int(layout.pos[-1] + layout.total[-1])


def _end_of_data(facts: SegmentFacts, mm, w: records.RecordWalk) -> None:
    """What ends the records: a BLANK reaching the file's end, zeros (maybe after a torn append), bad bytes."""
    facts.valid_bytes = w.end
    size = facts.file_size
    if w.ended is records.WalkEnd.BLANK:
        if w.end + w.blank_size == size:
            facts.ends_with_blank = True
        else:
            reason = f"BLANK of {w.blank_size} bytes does not reach the end of the {size}-byte file"
            facts.error = str(records.RecordError(w.end, reason, facts.path))
    elif w.ended is records.WalkEnd.ZEROS:
        garbage = _nonzero_tail(mm, w.end)
        if garbage:
            nxt = records.find_record_boundary(mm, facts.base_offset, w.end + 1)
            if nxt < size:
                reason = f"zeros where a record should start, but a record follows at {nxt}"
                facts.error = str(records.RecordError(w.end, reason, facts.path))
            else:
                facts.torn_tail, facts.torn_tail_bytes = True, garbage
    elif w.ended is records.WalkEnd.INVALID:
        _bad_at(facts, mm, records.RecordError(w.end, w.reason, facts.path))


def _bad_at(facts: SegmentFacts, mm, error: records.RecordError) -> None:
    """Record a decode error; it is also a torn tail when no record follows it."""
    facts.error = str(error)
    facts.valid_bytes = error.position
    if records.find_record_boundary(mm, facts.base_offset, error.position + 1) >= len(mm):
        facts.torn_tail, facts.torn_tail_bytes = True, _nonzero_tail(mm, error.position)


def read_segment(
    path: Path,
    start: int = 0,
    stop: int | None = None,
    *,
    batch_records: int = DEFAULT_BATCH_RECORDS,
    on_error: str = "fail",
) -> Iterator[pa.RecordBatch]:
    """The records that start in ``[start, stop)`` of a segment file as Arrow batches of ``MESSAGE_SCHEMA``.

    ``on_error="fail"`` raises :class:`store.format.records.RecordError` (file and position) at an undecodable
    record; ``"stop"`` ends there.
    """
    if on_error not in ("fail", "stop"):
        raise CommitLogSourceError(f"onError must be 'fail' or 'stop', not {on_error!r}")
    path = Path(path)
    base = int(path.name)
    mm = _map(path)
    if mm is None:
        return
    try:
        stop = len(mm) if stop is None else min(stop, len(mm))
        pos = records.find_record_boundary(mm, base, start, stop)
        segment = pa.array([path.name])
        while pos < stop:
            chunk_stop = min(stop, pos + _BATCH_BYTES)
            w = records.RecordWalk(mm, pos, chunk_stop, max_records=batch_records)
            positions = w.positions()
            error = None
            if positions:
                layout = columnar.layout_records(mm, positions, source=str(path))
                error = layout.error
                if len(layout):
                    yield _batch(columnar.decode_columns(mm, layout), segment)
                del layout
            if error is None and w.ended is records.WalkEnd.INVALID:
                error = records.RecordError(w.end, w.reason, str(path))
            if error is not None:
                if on_error == "fail":
                    raise error
                return
            if w.ended is not records.WalkEnd.LIMIT:
                return  # BLANK, zeros or the end of the file
            pos = w.end
    finally:
        _close(mm)


def _batch(columns: dict, segment: pa.Array) -> pa.RecordBatch:
    import numpy as np

    columns["segment"] = segment.take(np.zeros(len(columns["position"]), np.int32))  # the file name on every row
    return pa.RecordBatch.from_arrays([columns[f.name] for f in MESSAGE_SCHEMA], schema=MESSAGE_SCHEMA)


def facts_batch(facts: list[SegmentFacts]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([f.as_row() for f in facts], schema=SEGMENT_FACTS_SCHEMA)
