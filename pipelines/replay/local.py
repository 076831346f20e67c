"""The local replay engine: select, plan and send in this process, with no JVM.

select  each live store's manifest first (pipelines/history.py's order), then the lake's ``messages`` snapshot
        through delta-rs (partitions pruned on topic and store date, row groups on store time), then the live
        segments decoded by the store's columnar codec (pipelines/segment_reader.py's ``read_segment``); filtered on
        topic, store time, tags and keys.  Read so, the rows are in CommitLog order: each source queue in offset
        order, the queues interleaved as they were written.  Only when a queue's offsets do not rise as read (a
        tier file listed out of order, a segment both in the lake and live) are the rows sorted by queue offset
        (then source queue) and each (broker, topic, queue, offset) kept once, the lake's row first (the sender
        drops a repeated offset too)
plan    the same :class:`~pipelines.replay.plan.QueuePlan` per source queue as the Spark engine's
send    one :class:`~pipelines.replay.sender.PartitionSender` over every source queue: one asyncio producer with
        several connections, each source queue a coroutine with one batch in flight

The selection is held in memory as Arrow columns (about the bodies' size): for a selection larger than this
machine's memory use the Spark engine.  ``--where`` is a Spark SQL predicate and needs the Spark engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.history import live_segments
from pipelines.replay.plan import SOURCE_QUEUE, QueuePlan
from pipelines.replay.progress import QueueKey, QueueProgress
from pipelines.replay.source import COLUMNS, utc_date
from pipelines.replay.spec import ReplaySpec, ReplaySpecError

SORT = [("queue_offset", "ascending"), ("broker_name", "ascending"), ("topic", "ascending"), ("queue_id", "ascending")]
BATCH_ROWS = 8192


def select(spec: ReplaySpec) -> pa.Table:
    """Every selected row of the lake and the live stores (``COLUMNS``), sorted and each key once (module doc)."""
    live = [(broker, path, live_segments(path, spec.from_ms, spec.to_ms)) for broker, path in spec.live_stores()]
    parts = [_lake_rows(spec)]  # after the manifests: see pipelines/history.py
    for broker, path, bases in live:
        parts += [_live_rows(spec, broker, path, base) for base in bases]
    tables = [t for t in parts if t is not None and t.num_rows]
    if not tables:
        return _empty()
    rows = pa.concat_tables(tables)
    return in_order(rows.filter(_matches(spec, rows)) if spec.tags or spec.keys else rows)


def in_order(rows: pa.Table) -> pa.Table:
    """``rows`` with each source queue in offset order and each (broker, topic, queue, offset) once, the first of
    its copies kept: as they are when they already are (all live, or the lake and then live rows above it), else
    sorted by ``SORT`` (stable: the lake's copy comes first)."""
    if _ascending(rows):
        return rows
    rows = rows.take(pc.sort_indices(rows, sort_keys=SORT))
    return rows.filter(_first_of_key(rows))


def _ascending(rows: pa.Table) -> bool:
    """Whether each source queue's offsets strictly rise in the order of ``rows`` (then there is no key twice, and
    the rows need no sort: the sort's copy of every body is the select's largest cost)."""
    if rows.num_rows < 2:
        return True
    codes, _ = _queue_codes(rows)
    order = np.argsort(codes, kind="stable")
    codes, offsets = codes[order], rows.column("queue_offset").to_numpy()[order]
    same = codes[1:] == codes[:-1]
    return bool(np.all(offsets[1:][same] > offsets[:-1][same]))


def _empty() -> pa.Table:
    from lake.schema import MESSAGES_SCHEMA

    # from no batches: Schema.empty_table would import pandas (a second of the select on a loaded machine)
    return pa.Table.from_batches([], schema=pa.schema([MESSAGES_SCHEMA.field(c) for c in COLUMNS]))


def _lake_rows(spec: ReplaySpec) -> pa.Table | None:
    from lake import delta as lk
    from lake import tables

    uri = spec.lake_messages()
    if uri is None:
        return None
    cond = pc.field("topic").isin(list(spec.source_topics))
    if spec.from_ms is not None:  # the partition prunes files, the store time row groups
        cond &= (pc.field(tables.STORE_DATE) >= pa.scalar(utc_date(spec.from_ms))) & (
            pc.field("store_timestamp") >= spec.from_ms
        )
    if spec.to_ms is not None:
        cond &= (pc.field(tables.STORE_DATE) <= pa.scalar(utc_date(spec.to_ms - 1))) & (
            pc.field("store_timestamp") < spec.to_ms
        )
    try:
        return pa.Table.from_batches(list(lk.scan_batches(uri, COLUMNS, filter=cond)), schema=_empty().schema)
    except lk.LakeError as e:  # a table delta-rs cannot read right (deletion vectors, column mapping)
        raise ReplaySpecError(f"{e}; replay it with --engine spark") from None


def _live_rows(spec: ReplaySpec, broker: str, store_dir: Path, base: int) -> pa.Table:
    """One live segment's records of the source topics, as ``messages`` rows of ``broker``."""
    from lake.columnar import table_rows
    from pipelines.segment_reader import read_segment
    from store.format import units

    topics = pa.array(list(spec.source_topics), pa.string())
    path = Path(store_dir) / "commitlog" / units.offset_to_file_name(base)
    out = []
    for batch in read_segment(path):
        rows = table_rows(batch, broker).select(COLUMNS)
        keep = pc.is_in(rows.column("topic"), value_set=topics)
        if spec.from_ms is not None or spec.to_ms is not None:
            keep = pc.and_(keep, _time_mask(spec, rows))
        out.append(rows if pc.all(keep).as_py() else rows.filter(keep))  # a filter copies every body
    return pa.Table.from_batches(out, schema=_empty().schema)


def _time_mask(spec: ReplaySpec, rows: pa.RecordBatch) -> pa.Array:
    ts = rows.column("store_timestamp")
    mask = pa.array(np.ones(len(ts), bool))
    if spec.from_ms is not None:
        mask = pc.and_(mask, pc.greater_equal(ts, spec.from_ms))
    if spec.to_ms is not None:
        mask = pc.and_(mask, pc.less(ts, spec.to_ms))
    return mask


def _matches(spec: ReplaySpec, rows: pa.Table) -> pa.Array:
    """``--tags`` (one of the tags) and ``--keys`` (one of the keys among the space-separated KEYS), as the Spark
    engine's filters read them."""
    mask = np.ones(rows.num_rows, bool)
    if spec.tags:
        mask &= pc.fill_null(pc.is_in(rows.column("tags"), value_set=pa.array(spec.tags)), False).to_numpy()
    if spec.keys:
        lists = pc.split_pattern(pc.fill_null(rows.column("keys"), ""), " ")
        hit = pc.is_in(pc.list_flatten(lists), value_set=pa.array(spec.keys)).to_numpy(zero_copy_only=False)
        has = np.zeros(rows.num_rows, bool)
        has[pc.list_parent_indices(lists).to_numpy()[hit]] = True
        mask &= has
    return pa.array(mask)


def _first_of_key(rows: pa.Table) -> pa.Array:
    """True for the first row of each (broker, topic, queue, offset) of rows sorted by ``SORT``."""
    n = rows.num_rows
    first = np.ones(n, bool)
    if n > 1:
        same = np.ones(n - 1, bool)
        for name in ("queue_offset", "queue_id", "topic", "broker_name"):
            col = rows.column(name)
            same &= pc.equal(col.slice(1), col.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        first[1:] = ~same
    return pa.array(first)


def _queue_codes(rows: pa.Table) -> tuple[np.ndarray, dict[QueueKey, int]]:
    """A number per row naming its source queue, and the number of each source queue present."""
    codes = np.zeros(rows.num_rows, np.int64)
    for name in ("broker_name", "topic"):
        col = rows.column(name)
        values = pc.unique(col)
        codes = codes * len(values) + pc.index_in(col, value_set=values).to_numpy()
    codes = codes * (int(pc.max(rows.column("queue_id")).as_py() or 0) + 1) + rows.column("queue_id").to_numpy()
    first = np.unique(codes, return_index=True)[1]
    keys = rows.select(SOURCE_QUEUE).take(pa.array(first)).to_pylist()
    return codes, {
        (k["broker_name"], k["topic"], k["queue_id"]): int(codes[i]) for k, i in zip(keys, first, strict=True)
    }


def _done_mask(rows: pa.Table, recorded: dict[QueueKey, QueueProgress]) -> np.ndarray:
    """True for the rows at or below their source queue's recorded progress."""
    if not rows.num_rows:
        return np.zeros(0, bool)
    codes, of_key = _queue_codes(rows)
    last = np.full(int(codes.max()) + 1, -1, np.int64)
    for key, p in recorded.items():
        if key in of_key:
            last[of_key[key]] = p.last_offset
    return rows.column("queue_offset").to_numpy() <= last[codes]


def plan(rows: pa.Table, recorded: dict[QueueKey, QueueProgress]) -> list[QueuePlan]:
    """Per source queue: rows, offsets, rows done before (as the Spark engine's plan)."""
    counted = rows.select([*SOURCE_QUEUE, "queue_offset"]).append_column(
        "done", pa.array(_done_mask(rows, recorded).astype(np.int64))
    )
    groups = (
        counted.group_by(SOURCE_QUEUE)
        .aggregate([("queue_offset", "count"), ("queue_offset", "min"), ("queue_offset", "max"), ("done", "sum")])
        .to_pylist()
    )
    return sorted(
        (QueuePlan(g["broker_name"], g["topic"], g["queue_id"], g["queue_offset_count"], g["queue_offset_min"],
                   g["queue_offset_max"], g["done_sum"],
                   recorded[k].last_offset if (k := (g["broker_name"], g["topic"], g["queue_id"])) in recorded
                   else -1) for g in groups),
        key=lambda p: p.key,
    )  # fmt: skip


def to_send(rows: pa.Table, recorded: dict[QueueKey, QueueProgress], todo: list[QueuePlan]) -> Iterator[pa.RecordBatch]:
    """The rows of the queues ``todo`` above their recorded progress, in the selection's order."""
    if not rows.num_rows:
        return
    codes, of_key = _queue_codes(rows)
    wanted = np.isin(codes, [of_key[p.key] for p in todo]) & ~_done_mask(rows, recorded)
    sending = rows if wanted.all() else rows.filter(pa.array(wanted))  # a filter copies every body
    yield from sending.to_batches(max_chunksize=BATCH_ROWS)
