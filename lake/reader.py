"""Tiered history read back by the broker: the Delta ``messages`` table under ``lakePath``, through delta-rs and
pyarrow (no Spark), rebuilt into the CommitLog records it was tiered from (``lake.rebuild``).

Every read takes one :class:`Snapshot` — a Delta version's file list with each file's statistics — and reads
only those files, so a tiering run, a compaction or a vacuum committing meanwhile never shows it a half state
(a file a compaction removed stays on disk for ``delta.deletedFileRetentionDuration``).  Snapshots are taken
again at most every :data:`REFRESH_S` seconds, or sooner when a read finds nothing, so a segment tiered
and then deleted locally is found on the first pull that needs it; while neither table has a new version
the same snapshot stays, with what reads learnt in it.

Files are pruned by their Delta statistics (queue id, queue offset, CommitLog offset, store time) and row
groups by their parquet statistics; decoded row groups are kept in a bounded LRU (:mod:`lake.cache`).
A consumer walking a queue is served from a cursor (:mod:`lake.cursors`): its next records are
sliced from the cached row group without searching again.

Several brokers tier into one lake (``broker_name`` is the first partition of ``messages`` and a column of
``segments``): a reader given its broker's name takes only that broker's files and queue ranges into a
snapshot, so broker-a never serves broker-b's history (their topics, queue ids, queue offsets and CommitLog
offsets overlap).  A lake without the column (tiered before several brokers) is not read by a named reader
until ``mqlake tier-migrate`` gives it one: whose rows those are is not known.

Every method is blocking (file reads): the broker calls them in a thread.  A missing or unreadable lake is
never an error to the caller: the methods answer "nothing tiered" and the cause is logged once.
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote

from lake import objectstore
from lake.cache import DEFAULT_CACHE_BYTES, SizedLRU
from lake.cursors import Cursor, Cursors
from lake.rebuild import RecordBlob, records_blob
from lake.tables import BROKER_NAME, MESSAGES, SEGMENTS, table_uri
from store.errors import MQLakeError
from store.format.hashing import tags_code
from store.format.records import RecordError, read_store_timestamp

log = logging.getLogger(__name__)

T = TypeVar("T")

REFRESH_S = 1.0  # a snapshot older than this is taken again before a read
MISS_REFRESH_S = 0.1  # a read that found nothing takes a new snapshot if the one it used is older than this
# Row groups decoded at once: a decode holds the row group's columns and its rebuilt records (about three times
# the row group) outside the cache's bound, and decodes mostly hold the GIL, so more at once only adds memory
DECODERS = 2
MAX_FILTER_ROWS = 20 * 32  # rows a pull examines under a tag filter, as the local store's MAX_FILTER_UNITS bound
TOPIC = "topic"

_BLOB_ONLY = ("body", "properties")  # read only to rebuild the records
_STAT_COLUMNS = ("queue_id", "queue_offset", "commitlog_offset", "store_timestamp")
_HOST_COLUMNS = ["born_host", "store_host"]


# Delta features whose rows the table's data files alone do not give (deletion vectors mark rows deleted outside
# the files; column mapping names the files' columns other than the table's): a reader of the files refuses them
FILE_UNREADABLE_FEATURES = ("deletionVectors", "columnMapping")


def file_unreadable_reason(dt: Any) -> str | None:
    """Why the rows of delta-rs table ``dt`` cannot be read from its data files as they are (None: they can)."""
    proto = dt.protocol()
    found = set(proto.reader_features or ()) & set(FILE_UNREADABLE_FEATURES)
    if dt.metadata().configuration.get("delta.columnMapping.mode", "none") != "none":
        found.add("columnMapping")
    if found:
        return f"it uses the Delta reader feature(s) {', '.join(sorted(found))}"
    if proto.min_reader_version > 3:
        return f"it needs Delta reader version {proto.min_reader_version}"
    return None


class LakeReadError(MQLakeError, RuntimeError):
    """A tiered file or row that cannot be served as the record it was tiered from."""


@dataclass(frozen=True, slots=True)
class TierFile:
    """One data file of a snapshot, with the Delta statistics reads prune on (None: no bound recorded)."""

    path: str
    topic: str
    lo: dict[str, int | None]
    hi: dict[str, int | None]

    def may_hold(self, column: str, lo: int, hi: int) -> bool:
        """Could a row with ``lo <= column <= hi`` be in this file?"""
        a, b = self.lo.get(column), self.hi.get(column)
        return (a is None or a <= hi) and (b is None or b >= lo)


@dataclass(slots=True)
class Snapshot:
    version: int
    files: tuple[TierFile, ...]
    # (topic, queue) -> first, last tiered queue offset, from the segments table (None: there is none)
    queue_ranges: dict[tuple[str, int], tuple[int, int]] | None
    floor: int = -1  # the local store's first CommitLog offset when the snapshot was last checked
    taken: float = field(default_factory=time.monotonic)  # when it was last checked against the tables
    segments_version: int | None = None  # the segments table's version queue_ranges was read at
    # (topic, queue) -> its row groups as (lowest, highest queue offset, file, index), by lowest: pulls of a
    # queue walk these instead of every file's statistics (filled by LakeReader._queue_groups)
    queue_groups: dict[tuple[str, int], list[tuple[int, int, TierFile, int]]] = field(default_factory=dict)
    cursors: Cursors = field(default_factory=Cursors)  # where walking consumers read next, in this snapshot only

    def files_of(self, topic: str | None, **ranges: tuple[int, int]) -> list[TierFile]:
        return [
            f for f in self.files
            if (topic is None or f.topic == topic) and all(f.may_hold(c, a, b) for c, (a, b) in ranges.items())
        ]  # fmt: skip


@dataclass(slots=True)
class RowGroup:
    """A decoded row group, its rows ordered by (queue id, queue offset) for binary search: its records rebuilt
    once, end to end in one buffer in that order (a pull slices them, as a local pull slices the CommitLog), and
    the columns lookups read."""

    topic: str
    at: tuple[TierFile, int]  # the file and the index of the row group in it
    source: str
    table: Any  # pa.Table of lake.schema.RECORD_COLUMNS but the record parts only ``blob`` needs (body, properties)
    blob: RecordBlob
    qid: Any  # np.ndarray, sorted
    qoff: Any  # np.ndarray, sorted within a queue id
    sizes: Any  # np.ndarray: msg_size per row
    nbytes: int
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)  # queue id -> its rows [a, b)
    # queue id -> (first offset, rows) of a span whose queue offsets are consecutive (no gap, no repeat)
    runs: dict[int, tuple[int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        import numpy as np

        ids, starts = np.unique(self.qid, return_index=True)
        ends = [*starts[1:].tolist(), len(self.qid)]
        self.spans = dict(zip(ids.tolist(), zip(starts.tolist(), ends, strict=True), strict=True))
        for q, (a, b) in self.spans.items():
            first, last = int(self.qoff[a]), int(self.qoff[b - 1])
            if last - first == b - a - 1 and (b - a < 2 or bool((np.diff(self.qoff[a:b]) == 1).all())):
                self.runs[q] = (first, a)

    def queue_rows(self, queue_id: int, lo: int, hi: int, limit: int) -> tuple[Any, Any]:
        """(queue offsets, row indices) of the first ``limit`` rows of ``queue_id`` with ``lo <= queue offset <
        hi``, as numpy arrays in queue order."""
        import numpy as np

        a, b = self.spans.get(queue_id, (0, 0))
        offs = self.qoff[a:b]
        i = a + int(offs.searchsorted(lo, "left"))
        j = min(a + int(offs.searchsorted(hi, "left")), i + limit)
        return self.qoff[i:j], np.arange(i, j)

    def position(self, queue_id: int, offset: int) -> tuple[int, int] | None:
        """(row of ``offset``, first offset past this row group's run of the queue) when the queue's rows here
        are consecutive offsets and hold ``offset``; None otherwise."""
        run = self.runs.get(queue_id)
        if run is None:
            return None
        first, a = run
        end = first + self.spans[queue_id][1] - a
        return (a + offset - first, end) if first <= offset < end else None

    def run(self, row: int, count: int, max_bytes: int) -> list[bytes | memoryview]:
        """The records of rows ``row`` on, at most ``count`` and, after the first, ``max_bytes`` in all (rows of
        a run are adjacent in the buffer: one bounds look-up, then a slice per record)."""
        bounds = self.blob.offsets[row : row + count + 1].tolist()
        if bounds[-1] - bounds[0] > max_bytes:
            count = max(1, bisect_right(bounds, bounds[0] + max_bytes) - 1)
            del bounds[count + 1 :]
        data = self.blob.data
        return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]

    def records(self, indices: list[int]) -> list[memoryview]:
        """The CommitLog records of the rows at ``indices`` (views of the cached buffer)."""
        return self.blob.records(indices)

    def record(self, index: int) -> bytes:
        """One record, copied: lookups and filters keep it apart from the cached buffer."""
        return self.records([index])[0].tobytes()


@dataclass(slots=True)
class TierPull:
    """What a pull found in the tier: records in queue order and where the next pull begins.  An unfiltered
    pull's records are views of the cached row group, as a local pull's are slices of the CommitLog."""

    messages: list[bytes | memoryview]
    queue_offsets: list[int]
    next_begin_offset: int


class LakeReader:
    """Reads of the tier under one lake root; thread-safe."""

    def __init__(
        self,
        lake: str | Path,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        local_floor: Callable[[], int] | None = None,
        broker_name: str | None = None,
    ) -> None:
        """``local_floor``: the local store's first CommitLog offset.  The store deletes a segment only after
        the tier committed it, so once the floor moves, a snapshot taken earlier may lack what was deleted:
        the next read takes a new one, whatever its age.  ``broker_name``: read only this broker's rows (None:
        every row of the lake, for a lake one store fed)."""
        self.lake = objectstore.lake_location(lake)
        # a lake on S3 (objectstore.py): delta-rs and pyarrow reach it with the AWS settings of the environment
        self._options = objectstore.storage_options(self.lake)
        self._fs: Any = objectstore.filesystem(self.lake)[0] if self._options else None
        self.broker_name = broker_name
        self._floor = local_floor or (lambda: -1)
        self.messages_uri = table_uri(self.lake, MESSAGES)
        self.segments_uri = table_uri(self.lake, SEGMENTS)
        self.cache: SizedLRU[RowGroup] = SizedLRU(cache_bytes, lambda rg: rg.nbytes)
        self._lock = threading.Lock()
        self._decoding = threading.BoundedSemaphore(DECODERS)
        self._snapshot: Snapshot | None = None
        self._tables: dict[str, Any] = {}  # uri -> DeltaTable, updated incrementally
        self._metadata: dict[str, Any] = {}  # file path -> parquet FileMetaData (files never change)
        self._stats: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}  # file path -> row group bounds
        self._logged: set[str] = set()

    # --- snapshots ---------------------------------------------------------------------------------------------
    def snapshot(self, fresh: bool = False) -> Snapshot | None:
        """The current snapshot (None: no readable ``messages`` table); ``fresh`` takes a new one unless the
        current one is only just taken."""
        floor = self._floor()  # read before the snapshot is taken: it then holds all the store deleted
        with self._lock:
            snap = self._snapshot
            max_age = MISS_REFRESH_S if fresh else REFRESH_S
            if snap is not None and snap.floor == floor and time.monotonic() - snap.taken < max_age:
                return snap
            try:
                self._snapshot = self._take(floor, snap)
                if self._snapshot is not None and self._snapshot is not snap:
                    # footers of files no snapshot lists any more are not needed
                    live = {f.path for f in self._snapshot.files}
                    self._metadata = {p: md for p, md in self._metadata.items() if p in live}
                    self._stats = {p: st for p, st in self._stats.items() if p in live}
            except Exception as e:  # delta-rs and pyarrow raise their own types; none may reach a request
                self._warn_once(f"cannot read the tier at {self.lake}: {type(e).__name__}: {e}")
                self._snapshot = None
            return self._snapshot

    def _table(self, uri: str) -> Any:
        from deltalake import DeltaTable

        dt = self._tables.get(uri)
        if dt is None:
            dt = self._tables[uri] = DeltaTable(uri, storage_options=self._options)
        else:
            dt.update_incremental()
        return dt

    def _take(self, floor: int, current: Snapshot | None = None) -> Snapshot | None:
        """A snapshot of the tables as they are now: ``current`` itself, re-dated, when neither table has a
        new version since (its row groups per queue and its cursors stay good)."""
        import pyarrow as pa
        from deltalake import DeltaTable

        if not DeltaTable.is_deltatable(self.messages_uri, storage_options=self._options):
            self._warn_once(
                f"lakePath {self.lake} has no Delta table {MESSAGES!r} yet: serving local data only until the "
                f"tier job writes one"
            )
            return None
        dt = self._table(self.messages_uri)
        has_segments = DeltaTable.is_deltatable(self.segments_uri, storage_options=self._options)
        segments = self._table(self.segments_uri) if has_segments else None
        segments_version = None if segments is None else segments.version()
        if current is not None and (current.version, current.segments_version) == (dt.version(), segments_version):
            current.floor, current.taken = floor, time.monotonic()
            return current
        if self.broker_name is not None and BROKER_NAME not in dt.metadata().partition_columns:
            self._warn_once(
                f"{self.messages_uri} has no {BROKER_NAME} partition (tiered before several brokers): broker "
                f"{self.broker_name} serves local data only until `mqlake tier-migrate --lake {self.lake} "
                f"--broker-name NAME` gives it one"
            )
            return None
        unreadable = file_unreadable_reason(dt)
        if unreadable:  # its files would give deleted rows or wrong columns: refuse rather than serve them
            self._warn_once(
                f"{self.messages_uri}: not served from the tier: {unreadable} (written by another Delta engine), "
                f"which the broker's reader cannot apply; serving local data only.  To serve it again: "
                f"ALTER TABLE SET TBLPROPERTIES ('delta.enableDeletionVectors'='false'), REORG TABLE ... APPLY "
                f"(PURGE), ALTER TABLE DROP FEATURE deletionVectors (column mapping cannot be dropped: rewrite "
                f"the table)"
            )
            return None
        adds = pa.table(dt.get_add_actions(flatten=True))
        cols = {name: adds.column(name).to_pylist() for name in adds.column_names}
        files = []
        root = self.messages_uri.rstrip("/")
        # a column without statistics reads as None; looked up once, not once per file (a default list built
        # per file made this quadratic in the table's file count: 10 s for 10,000 files)
        nones = [None] * len(cols["path"])
        mins = {c: cols.get(f"min.{c}", nones) for c in _STAT_COLUMNS}
        maxs = {c: cols.get(f"max.{c}", nones) for c in _STAT_COLUMNS}
        brokers = cols.get(f"partition.{BROKER_NAME}")
        for i, rel in enumerate(cols["path"]):
            if self.broker_name is not None and brokers is not None and brokers[i] != self.broker_name:
                continue  # another broker's history
            path = rel if "://" in rel or rel.startswith("/") else f"{root}/{unquote(rel)}"
            lo = {c: v[i] for c, v in mins.items()}
            hi = {c: v[i] for c, v in maxs.items()}
            files.append(TierFile(path, cols[f"partition.{TOPIC}"][i], lo, hi))
        return Snapshot(dt.version(), tuple(files), self._queue_ranges(segments), floor,
                        segments_version=segments_version)  # fmt: skip

    def _queue_ranges(self, segments: Any) -> dict[tuple[str, int], tuple[int, int]] | None:
        """(topic, queue) -> first, last queue offset over the ``segments`` table's rows of this broker (None:
        no table)."""
        if segments is None:
            return None
        out: dict[tuple[str, int], tuple[int, int]] = {}
        names = {f.name for f in segments.schema().fields}
        mine = None
        if self.broker_name is not None and BROKER_NAME in names:
            mine = [(BROKER_NAME, "=", self.broker_name)]
        rows = segments.to_pyarrow_table(columns=["queue_ranges"], filters=mine).column(0).to_pylist()
        for ranges in rows:
            for r in ranges or ():
                key = (r["topic"], r["queue_id"])
                a, b = out.get(key, (r["first_offset"], r["last_offset"]))
                out[key] = (min(a, r["first_offset"]), max(b, r["last_offset"]))
        return out

    def _warn_once(self, message: str) -> None:
        if message not in self._logged:
            self._logged.add(message)
            log.warning("%s", message)

    def _guarded(self, what: str, fn: Callable[[Snapshot], T], default: T, fresh: bool = False) -> T:
        """``fn`` over a snapshot; again over a fresh one if a file is gone (vacuumed since); errors logged
        once per cause and answered with ``default``."""
        for attempt in (0, 1):
            snap = self.snapshot(fresh=fresh or attempt > 0)
            if snap is None:
                return default
            try:
                return fn(snap)
            except FileNotFoundError as e:
                if attempt:
                    self._warn_once(f"{what}: tiered file missing: {e}")
            except (RecordError, LakeReadError) as e:
                self._warn_once(f"{what}: {e}")
                return default
            except Exception as e:  # pyarrow / delta-rs errors: the lake is unreadable, local data still serves
                self._warn_once(f"{what}: cannot read the tier at {self.lake}: {type(e).__name__}: {e}")
                return default
        return default

    # --- row groups -------------------------------------------------------------------------------------------
    def _parquet(self, path: str, **kwargs: Any) -> Any:
        """A ``pq.ParquetFile`` of a snapshot's file, on local disk or through the S3 filesystem."""
        import pyarrow.parquet as pq

        if self._fs is None:
            return pq.ParquetFile(path, **kwargs)
        return pq.ParquetFile(objectstore.key_of(path), filesystem=self._fs, **kwargs)

    def _file_metadata(self, path: str) -> Any:
        md = self._metadata.get(path)
        if md is None:
            md = self._metadata[path] = self._parquet(path).metadata
        return md

    def _group_stats(self, path: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Per row group of a file: the min and max of the columns reads prune on (read from its footer once)."""
        stats = self._stats.get(path)
        if stats is None:
            md = self._file_metadata(path)
            names = {md.schema.column(i).path: i for i in range(md.num_columns)}
            stats = []
            for g in range(md.num_row_groups):
                rg = md.row_group(g)
                lo: dict[str, Any] = {}
                hi: dict[str, Any] = {}
                for c in _STAT_COLUMNS:
                    st = rg.column(names[c]).statistics if c in names else None
                    if st is not None and st.has_min_max:
                        lo[c], hi[c] = st.min, st.max
                stats.append((lo, hi))
            self._stats[path] = stats
        return stats

    def _row_groups(self, f: TierFile, **ranges: tuple[int, int]) -> Iterator[tuple[int, dict, dict]]:
        """(index, min, max) of the row groups of ``f`` whose parquet statistics allow ``ranges``."""
        for g, (lo, hi) in enumerate(self._group_stats(f.path)):
            if all((lo.get(c) is None or lo[c] <= b) and (hi.get(c) is None or hi[c] >= a)
                   for c, (a, b) in ranges.items()):  # fmt: skip
                yield g, lo, hi

    def _load(self, f: TierFile, g: int) -> RowGroup:
        import numpy as np

        from lake.schema import RECORD_COLUMNS

        source = f"{f.path} row group {g}"
        # hosts as the dictionary parquet keeps of them: the rebuild parses each distinct one once
        parquet = self._parquet(f.path, metadata=self._file_metadata(f.path), read_dictionary=_HOST_COLUMNS)
        # one thread: a row group is 8 MiB at most, and its columns decode faster than threads start and join
        # what a record is rebuilt from; the partition column ``topic`` is the file's Delta partition value
        columns = [c for c in RECORD_COLUMNS if c != TOPIC]
        table = parquet.read_row_group(g, columns, use_threads=False)
        qid = table.column("queue_id").to_numpy()
        qoff = table.column("queue_offset").to_numpy()
        if len(qid) > 1 and not ((qid[1:] > qid[:-1]) | ((qid[1:] == qid[:-1]) & (qoff[1:] >= qoff[:-1]))).all():
            # not in queue order (files the tier job wrote before it sorted): sort once, so a queue's records
            # are adjacent in the buffer
            order = np.lexsort((qoff, qid))
            table = table.take(order)
            qid, qoff = qid[order], qoff[order]
        blob = records_blob(table, f.topic, source)
        table = table.drop_columns(list(_BLOB_ONLY))  # the blob holds them; the cache bound counts it instead
        sizes = table.column("msg_size").to_numpy()
        nbytes = table.nbytes + blob.nbytes + qid.nbytes + qoff.nbytes
        return RowGroup(f.topic, (f, g), source, table, blob, qid, qoff, sizes, nbytes)

    def _group(self, f: TierFile, g: int) -> RowGroup:
        key = (f.path, g)

        def load() -> RowGroup:
            with self._decoding:
                done = self.cache.peek(key)  # decoded by another thread while this one waited
                return done if done is not None else self._load(f, g)

        return self.cache.get(key, load)

    # --- reads ------------------------------------------------------------------------------------------------
    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int] | None:
        """(first, last) queue offset the tier holds of a queue (None: nothing, or no readable lake)."""
        return self._guarded("queue range", lambda s: (s.queue_ranges or {}).get((topic, queue_id)), None)

    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        upper: int,
        max_nums: int,
        max_bytes: int,
        tag_codes: set[int] | None = None,
        record_filter: Callable[[bytes], bool] | None = None,
    ) -> TierPull | None:
        """Records of a queue from ``offset`` below ``upper`` (the local store serves from there on), at most
        ``max_nums`` and (after the first) ``max_bytes``; tag filter as the ConsumeQueue's, then
        ``record_filter`` (SQL92) on each rebuilt record.  None: the tier holds no row of the queue in that
        range (or cannot be read)."""

        def read(snap: Snapshot) -> TierPull | None:
            return self._pull(snap, topic, queue_id, offset, upper, max_nums, max_bytes, tag_codes, record_filter)

        what = f"pull {topic}/{queue_id}@{offset}"
        found = self._guarded(what, read, None)
        if found is None:  # tiered since the snapshot was taken?
            found = self._guarded(what, read, None, fresh=True)
        return found

    def _pull(
        self,
        snap: Snapshot,
        topic: str,
        queue_id: int,
        offset: int,
        upper: int,
        max_nums: int,
        max_bytes: int,
        tag_codes: set[int] | None,
        record_filter: Callable[[bytes], bool] | None = None,
    ) -> TierPull | None:
        if snap.queue_ranges is not None:
            # The segments table lists every queue range the broker may have deleted (its row is written
            # before a segment may go): a queue it does not reach below ``upper`` needs no file opened.
            known = snap.queue_ranges.get((topic, queue_id))
            if known is None or known[1] < offset or known[0] >= upper:
                return None
        unfiltered = tag_codes is None and record_filter is None
        if unfiltered and upper > offset:
            cursor = snap.cursors.find(topic, queue_id, offset)
            count = min(max_nums, upper - offset)
            # a consumer walking on: its rows are the next ones of a known run (one the pull would run past
            # is left to the full path, which goes on into the next row group as a pull from here must)
            if cursor is not None and cursor.limit - offset >= count:
                return self._pull_run(snap, topic, queue_id, cursor, count, max_bytes)
        import numpy as np

        want = max_nums if unfiltered else MAX_FILTER_ROWS
        groups = [(lo, f, g) for lo, hi, f, g in self._queue_groups(snap, topic, queue_id)
                  if lo < upper and hi >= offset]  # fmt: skip
        found: list[tuple[Any, Any, RowGroup]] = []  # (queue offsets, row indices, row group) per row group
        count = 0
        for low, f, g in groups:
            if count >= want:
                qos = found[0][0] if len(found) == 1 else np.sort(np.concatenate([q for q, _, _ in found]))
                if qos[want - 1] < low:
                    break  # every later row group starts past what this pull can take
            rg = self._group(f, g)
            qo, idx = rg.queue_rows(queue_id, offset, upper, want)
            if len(qo):
                found.append((qo, idx, rg))
                count += len(qo)
        if not found:
            return None
        if len(found) == 1 and unfiltered:  # the common case: one row group
            qos, idxs, rg = found[0]
            out = self._take_all(found, qos[:max_nums], idxs[:max_nums], np.zeros(min(len(qos), max_nums), int),
                                 rg.sizes[idxs[:max_nums]], max_bytes)  # fmt: skip
            self._note_cursor(snap, topic, queue_id, out.next_begin_offset, [rg])
            return out
        qos = np.concatenate([q for q, _, _ in found])
        idxs = np.concatenate([i for _, i, _ in found])
        which = np.repeat(np.arange(len(found)), [len(q) for q, _, _ in found])
        sizes = np.concatenate([rg.sizes[i] for _, i, rg in found])
        by = np.argsort(qos, kind="stable")[:want]
        qos, idxs, which, sizes = qos[by], idxs[by], which[by], sizes[by]
        # the same record in two files (a compaction's input and output never share a snapshot): keep one
        first = np.ones(len(qos), bool)
        first[1:] = qos[1:] != qos[:-1]
        qos, idxs, which, sizes = qos[first], idxs[first], which[first], sizes[first]
        if unfiltered:
            out = self._take_all(found, qos[:max_nums], idxs[:max_nums], which[:max_nums], sizes[:max_nums],
                                 max_bytes)  # fmt: skip
            self._note_cursor(snap, topic, queue_id, out.next_begin_offset, [rg for _, _, rg in found])
            return out
        out = TierPull([], [], offset)
        chosen: list[tuple[RowGroup, int, bytes | None]] = []
        total = 0
        for qo, i, k, size in zip(qos.tolist(), idxs.tolist(), which.tolist(), sizes.tolist(), strict=True):
            if len(chosen) >= max_nums:
                break
            rg = found[k][2]
            out.next_begin_offset = qo + 1
            if tag_codes is not None and tags_code(rg.table.column("tags")[i].as_py()) not in tag_codes:
                continue
            if chosen and total + size > max_bytes:
                out.next_begin_offset = qo
                break
            data = None
            if record_filter is not None:
                data = rg.record(i)
                if not record_filter(data):
                    continue
            chosen.append((rg, i, data))
            out.queue_offsets.append(qo)
            total += size
        for rg, i, data in chosen:
            out.messages.append(data if data is not None else rg.record(i))
        return out

    def _pull_run(
        self, snap: Snapshot, topic: str, queue_id: int, cursor: Cursor, count: int, max_bytes: int
    ) -> TierPull:
        """An unfiltered pull from a cursor whose run holds ``count`` rows more: those, sliced from the cached
        records, as far as ``max_bytes`` lets; the cursor moves on by what was taken."""
        rg = self._group(*cursor.group)  # reloaded if the cache let it go
        messages = rg.run(cursor.position, count, max_bytes)
        n = len(messages)
        snap.cursors.keep(topic, queue_id, cursor.advanced(n))
        return TierPull(messages, list(range(cursor.offset, cursor.offset + n)), cursor.offset + n)

    def _note_cursor(self, snap: Snapshot, topic: str, queue_id: int, offset: int, near: list[RowGroup]) -> None:
        """After an unfiltered pull: a cursor at the queue's next offset when one of the row groups just read
        holds it in a run of consecutive offsets; the run is cut where another row group of the snapshot holds
        an offset of the queue too (its statistics say so, and its rows confirm it), so a pull from the cursor
        returns what the full path would."""
        for rg in reversed(near):
            at = rg.position(queue_id, offset)
            if at is not None:
                break
        else:
            return
        row, limit = at
        f, g = rg.at
        for lo, hi, f2, g2 in self._queue_groups(snap, topic, queue_id):
            if lo >= limit:
                break  # by lowest offset: the rest start past the run
            if hi >= offset and (g2 != g or f2.path != f.path):
                qo, _ = self._group(f2, g2).queue_rows(queue_id, offset, limit, 1)
                if len(qo):
                    limit = int(qo[0])
        if limit > offset:
            snap.cursors.keep(topic, queue_id, Cursor(rg.at, offset, row, limit))

    def _queue_groups(self, snap: Snapshot, topic: str, queue_id: int) -> list[tuple[int, int, TierFile, int]]:
        key = (topic, queue_id)
        groups = snap.queue_groups.get(key)
        if groups is None:
            span = {"queue_id": (queue_id, queue_id)}
            groups = sorted(
                ((lo.get("queue_offset", 0), hi.get("queue_offset", 1 << 62), f, g)
                 for f in snap.files_of(topic, **span) for g, lo, hi in self._row_groups(f, **span)),
                key=lambda x: x[0],
            )  # fmt: skip
            snap.queue_groups[key] = groups
        return groups

    @staticmethod
    def _take_all(
        found: list[tuple[Any, Any, RowGroup]], qos: Any, idxs: Any, which: Any, sizes: Any, max_bytes: int
    ) -> TierPull:
        """An unfiltered pull: the rows in queue order while their sizes fit ``max_bytes`` (the first always)."""
        import numpy as np

        n = max(1, int(np.cumsum(sizes).searchsorted(max_bytes, "right")))
        qo = qos[:n].tolist()
        nxt = int(qos[n]) if n < len(qos) else qo[-1] + 1
        out = TierPull([], qo, nxt)
        w, ix = which[:n].tolist(), idxs[:n]
        start = 0
        while start < n:  # one slice of the offsets per run of rows from the same row group
            end = start + 1
            while end < n and w[end] == w[start]:
                end += 1
            out.messages.extend(found[w[start]][2].records(ix[start:end]))
            start = end
        return out

    def message_at(self, commitlog_offset: int) -> bytes | None:
        """The record tiered from this CommitLog offset (VIEW_MESSAGE_BY_ID), or None."""

        def find(snap: Snapshot) -> bytes | None:
            span = {"commitlog_offset": (commitlog_offset, commitlog_offset)}
            for f in snap.files_of(None, **span):
                for g, _lo, _hi in self._row_groups(f, **span):
                    rg = self._group(f, g)
                    col = rg.table.column("commitlog_offset").to_numpy()
                    hits = (col == commitlog_offset).nonzero()[0]
                    if len(hits):
                        return rg.record(int(hits[0]))
            return None

        return self._guarded(f"message at CommitLog offset {commitlog_offset}", find, None)

    def query_key(self, topic: str, key: str, max_num: int, begin: int, end: int) -> list[bytes]:
        """Records of ``topic`` stored in [begin, end] whose KEYS hold ``key`` or whose UNIQ_KEY is ``key``,
        newest first, at most ``max_num`` (QUERY_MESSAGE over the tier)."""

        def find(snap: Snapshot) -> list[bytes]:
            span = {"store_timestamp": (begin, end)}
            hits: list[tuple[int, RowGroup, int]] = []
            for f in snap.files_of(topic, **span):
                for g, _lo, _hi in self._row_groups(f, **span):
                    rg = self._group(f, g)
                    t = rg.table
                    ts = t.column("store_timestamp").to_numpy()
                    for i in sorted(_key_rows(t, key)):
                        if begin <= ts[i] <= end:
                            hits.append((int(ts[i]), rg, i))
            hits.sort(key=lambda h: -h[0])
            return [rg.record(i) for _, rg, i in hits[:max_num]]

        return self._guarded(f"query {topic}#{key}", find, [])

    def store_time_at(self, topic: str, queue_id: int, offset: int) -> int | None:
        """The store timestamp of a tiered message (None: not tiered)."""
        found = self.pull(topic, queue_id, offset, offset + 1, 1, 1 << 62)
        if found is None or not found.queue_offsets or found.queue_offsets[0] != offset:
            return None
        return read_store_timestamp(found.messages[0], 0)

    def offset_by_time(self, topic: str, queue_id: int, timestamp: int, upper: bool = False) -> int | None:
        """SEARCH_OFFSET_BY_TIMESTAMP over the tier: the first tiered offset of the queue stored at or after
        ``timestamp`` (``upper``: the last one at or before); None when no tiered row qualifies."""

        def find(snap: Snapshot) -> int | None:
            import numpy as np

            span = {"queue_id": (queue_id, queue_id)}
            span["store_timestamp"] = (-(1 << 62), timestamp) if upper else (timestamp, 1 << 62)
            best = None
            for f in snap.files_of(topic, **span):
                for g, _lo, _hi in self._row_groups(f, **span):
                    rg = self._group(f, g)
                    ts = rg.table.column("store_timestamp").to_numpy()
                    a, b = np.searchsorted(rg.qid, queue_id, "left"), np.searchsorted(rg.qid, queue_id, "right")
                    ok = (ts[a:b] <= timestamp) if upper else (ts[a:b] >= timestamp)
                    offs = rg.qoff[a:b][ok]
                    if len(offs):
                        cand = int(offs.max() if upper else offs.min())
                        best = cand if best is None else (max(best, cand) if upper else min(best, cand))
            return best

        return self._guarded(f"search {topic}/{queue_id} by time", find, None)


def _key_rows(table: Any, key: str) -> set[int]:
    """Rows whose KEYS (space-separated, as the IndexFile splits them) hold ``key`` or whose UNIQ_KEY is ``key``."""
    import pyarrow.compute as pc

    from store.format.properties import KEY_SEPARATOR

    keys = pc.split_pattern(table.column("keys").combine_chunks(), KEY_SEPARATOR)
    parents = pc.list_parent_indices(keys).to_numpy()
    flat = pc.list_flatten(keys)
    rows = set(parents[pc.equal(flat, key).to_numpy(zero_copy_only=False)].tolist()) if len(flat) else set()
    uniq = pc.fill_null(pc.equal(table.column("uniq_key"), key), False).combine_chunks()
    return rows | set(pc.indices_nonzero(uniq).to_pylist())
