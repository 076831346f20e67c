"""``prev_end`` and ``prev_queue_offset``: what each record of a segment follows, for the sequence rules.

``prev_end`` is where the previous record of the same segment ended (position + size); ``prev_queue_offset``
the queue offset of the previous record of the same (segment, topic, queue) among records of the same
consumability (transaction half/rollback records take no queue offset).  Both are "previous" by position,
and null for the first such record.

They are computed over Arrow batches that arrive in (segment, position) order — the order the tiering
job's decoder emits a segment's records in, or a partition sorted by segment and position — with a
:class:`Previous` carrying the last record of each segment and queue from one batch to the next.  So no
window over the rows is needed: a Spark window would shuffle every row (and, while staging, every body).
"""

from __future__ import annotations

import pyarrow as pa

from store.format import records

PREV_END = "prev_end"
PREV_QUEUE_OFFSET = "prev_queue_offset"
FIELDS = [pa.field(PREV_END, pa.int64()), pa.field(PREV_QUEUE_OFFSET, pa.int64())]


def consumable_mask(sys_flag: pa.Array):
    """Per row: does the record take a queue offset (``records.is_consumable``, vectorised)."""
    tx = sys_flag.to_numpy(zero_copy_only=False) & records.TRANSACTION_ROLLBACK_TYPE
    return (tx == records.TRANSACTION_NOT_TYPE) | (tx == records.TRANSACTION_COMMIT_TYPE)


class Previous:
    """The last record seen of each segment and each (segment, topic, queue, consumable), across batches."""

    def __init__(self) -> None:
        self.end: dict[str, int] = {}
        self.queue_offset: dict[tuple[str, str, int, bool], int] = {}

    def columns(self, batch: pa.RecordBatch) -> tuple[pa.Array, pa.Array]:
        """``prev_end`` and ``prev_queue_offset`` of ``batch``'s rows, which follow the rows seen so far."""
        import numpy as np

        n = batch.num_rows
        if n == 0:
            return pa.nulls(0, pa.int64()), pa.nulls(0, pa.int64())
        seg = batch.column("segment").dictionary_encode()
        seg_code = seg.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        seg_names = seg.dictionary.to_pylist()
        pos = batch.column("position").to_numpy(zero_copy_only=False).astype(np.int64)
        ends = pos + batch.column("msg_size").to_numpy(zero_copy_only=False).astype(np.int64)

        # prev_end: the row before, when it is of the same segment; else what the last batch left
        prev_end = np.zeros(n, np.int64)
        prev_end[1:] = ends[:-1]
        has_end = np.ones(n, bool)
        starts = np.flatnonzero(np.r_[True, seg_code[1:] != seg_code[:-1]])
        for i in starts:
            last = self.end.get(seg_names[seg_code[i]])
            has_end[i] = last is not None
            prev_end[i] = 0 if last is None else last
        for i in np.r_[starts[1:] - 1, n - 1]:
            self.end[seg_names[seg_code[i]]] = int(ends[i])

        # prev_queue_offset: the same lag within each (segment, topic, queue, consumable), in position order
        topic = batch.column("topic").dictionary_encode()
        topic_code = topic.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        topic_names = topic.dictionary.to_pylist()
        qid = batch.column("queue_id").to_numpy(zero_copy_only=False).astype(np.int64)
        cons = consumable_mask(batch.column("sys_flag"))
        order = np.lexsort((cons, qid, topic_code, seg_code))  # stable: position order within a group
        key = np.stack([seg_code, topic_code, qid, cons.astype(np.int64)], axis=1)[order]
        offsets = batch.column("queue_offset").to_numpy(zero_copy_only=False).astype(np.int64)[order]
        first = np.r_[True, (key[1:] != key[:-1]).any(axis=1)]
        prev_q = np.r_[0, offsets[:-1]]
        has_q = ~first

        def name(i: int) -> tuple[str, str, int, bool]:
            s, t, q, c = key[i]
            return seg_names[s], topic_names[t], int(q), bool(c)

        group_starts = np.flatnonzero(first)
        for i in group_starts:
            last = self.queue_offset.get(name(i))
            if last is not None:
                prev_q[i], has_q[i] = last, True
        for i in np.r_[group_starts[1:] - 1, n - 1]:
            self.queue_offset[name(i)] = int(offsets[i])
        unsorted_q = np.empty(n, np.int64)
        unsorted_q[order] = prev_q
        unsorted_has = np.empty(n, bool)
        unsorted_has[order] = has_q
        return pa.array(prev_end, mask=~has_end), pa.array(unsorted_q, mask=~unsorted_has)

    def extend(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` with the two columns appended."""
        prev_end, prev_q = self.columns(batch)
        return pa.RecordBatch.from_arrays(
            [*batch.columns, prev_end, prev_q], schema=pa.schema([*batch.schema, *FIELDS])
        )
