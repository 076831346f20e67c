"""The segment-integrity rules: each one a condition that is true for a row breaking it.

A rule is a function over an Arrow batch of its dataset's rows (``Rule.condition``, pyarrow compute and numpy).
The tiering job evaluates the ``messages`` rules inside the task that decodes and writes the rows
(pipelines/compaction/staging.py), and :func:`flagged` evaluates the very same functions over any Spark frame of
rows (``mapInArrow``), so each rule has one definition wherever it runs and no row goes through Spark SQL to be
checked.  The ``segments`` and ``queues`` datasets are small Arrow tables built on the driver (one row per
segment or queue), checked on the driver (:func:`flag_batch`).

Every rule of a dataset becomes a flag column of one pass over that dataset (:func:`flagged`), so the
rows are read once however many rules there are; Great Expectations then evaluates the per-segment
violation counts (expectations/runner.py).

Three datasets are checked: ``messages`` a Spark DataFrame (or the staging tasks' batches), the other two Arrow
tables:

``messages``
    The decoded rows of the segments being tiered, exactly as they will be committed (canonical schema,
    lake/schema.py), with ``body`` replaced by ``body_len`` and ``body_crc32`` (the CRC Spark
    recomputes from the body), plus ``prev_end`` (where the previous record of the segment ended) and
    ``prev_queue_offset`` (the previous queue offset of the same (topic, queue) in the segment, among
    records of the same consumability, see expectations/sequence.py).  The tiering job builds it while it
    decodes the segments; :func:`checked_messages` builds it from any frame of rows.
``segments``
    One row per segment being tiered: the facts of a scan of the file itself
    (``pipelines.segment_reader.scan_segment``) beside the aggregates of its decoded rows.  Columns:
    ``segment``, ``base_offset``, ``file_size``, ``record_count``, ``valid_bytes``, ``ends_with_blank``,
    ``torn_tail``, ``scan_error``; ``message_count``, ``first_store_time``, ``last_store_time`` (what the
    store recorded in its manifest when it sealed the file, or null); ``row_count``, ``row_bytes``,
    ``row_first_store_time``, ``row_last_store_time`` (aggregates of the decoded rows).
``queues``
    One row per (segment, topic, queue) of the segments being tiered, beside what the tier already
    holds for that queue.  Columns: ``segment``, ``base_offset``, ``topic``, ``queue_id``,
    ``first_offset``, ``last_offset``, ``count``, ``prev_last`` (the last offset of the same queue in the
    nearest earlier segment, tiered or in this batch), ``prev_contiguous`` (true when every byte of
    CommitLog between that earlier segment and this one is tiered or in this batch), ``run_from_zero``
    (true when the tier plus this batch covers the CommitLog from offset 0 up to this segment without a
    hole), ``overlaps`` (how many already-tiered segments hold offsets of this queue inside
    [first_offset, last_offset]).

Queue-offset continuity across the tier.  A queue's first offset in a segment must be the previous
segment's last offset + 1 when the CommitLog between the two is wholly tiered (or in this batch), and
0 when the tier covers the CommitLog from offset 0 and the queue has no earlier offsets.  Where the tier
has a hole — segments deleted before tiering was enabled (or under ``expiredSegmentPolicy=delete``), or
a quarantined segment kept on disk — the offsets of that hole are legitimately missing, so no
continuity is required across it; duplicates are still refused everywhere (``overlaps``).

Every byte-layout constant in the conditions comes from store/format/ (records, properties).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from expectations import sequence
from store.format import properties, records

MESSAGES = "messages"
SEGMENTS = "segments"
QUEUES = "queues"
DATASETS = (MESSAGES, SEGMENTS, QUEUES)


@dataclass(frozen=True)
class Rule:
    name: str
    dataset: str
    description: str
    # true for a row breaking the rule: a function of an Arrow batch of the dataset's rows returning one boolean
    # per row (null: not broken, as in a WHERE clause)
    condition: Callable[[pa.RecordBatch], pa.Array]
    # columns kept in the sample of breaking rows (beside segment, position); ``name AS alias`` renames one
    columns: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        """The name of the rule's flag column (see :func:`flagged`)."""
        return f"_broken_{self.name}"


# ---- the messages rules' building blocks, over Arrow -----------------------------------------------------
BODY_CRC32_SQL = "(crc32(body) & 2147483647)"  # UtilAll.crc32: java.util.zip.CRC32 masked to 31 bits
SIZE_FROM_FIELDS = "size_from_fields"  # the TOTALSIZE a row's fields add up to (a column of flagged messages)
_BAD_TEXT = "\ufffd"  # what a UTF-8 decode with errors="replace" leaves behind
_MAX_LONG = 9223372036854775807
# the store's first/last store time of a message's segment, joined onto the messages by :func:`flagged`
SEGMENT_FIRST_TIME = "_segment_first_store_time"
SEGMENT_LAST_TIME = "_segment_last_store_time"


def _np(a: pa.Array | pa.ChunkedArray, fill: int = 0) -> np.ndarray:
    return pc.fill_null(a, fill).to_numpy(zero_copy_only=False)


def _per_map(maps: pa.Array, per_entry: np.ndarray) -> np.ndarray:
    """The sum over each map's entries of ``per_entry`` (one value per entry of the maps' flattened children)."""
    offsets = maps.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    cum = np.concatenate([[0], np.cumsum(per_entry, dtype=np.int64)])
    return cum[offsets[1:]] - cum[offsets[:-1]]


def _flag_bits(sys_flag: np.ndarray, bit: int) -> np.ndarray:
    return (sys_flag & bit) != 0


def size_from_fields(batch: pa.RecordBatch) -> pa.Array:
    """The TOTALSIZE each row's fields add up to, from ``records.record_length`` (linear in each length)."""
    base = records.record_length(0, 0, 0, 0, records.MESSAGE_MAGIC_V1)
    born_v6 = records.record_length(records.BORNHOST_V6_FLAG, 0, 0, 0) - base
    store_v6 = records.record_length(records.STOREHOSTADDRESS_V6_FLAG, 0, 0, 0) - base
    v2 = records.record_length(0, 0, 0, 0, records.MESSAGE_MAGIC_V2) - base
    # name + value + the two separators: what encode_properties spends per entry beyond the text
    per_entry = len(properties.encode_properties({"k": "v"})) - 2
    sys_flag = _np(batch.column("sys_flag")).astype(np.int64)
    props = batch.column("properties")
    text = (_np(pc.binary_length(props.keys)).astype(np.int64) + _np(pc.binary_length(props.items)) + per_entry
            if len(props.keys) else np.zeros(0, np.int64))  # fmt: skip
    size = (
        base
        + born_v6 * _flag_bits(sys_flag, records.BORNHOST_V6_FLAG)
        + store_v6 * _flag_bits(sys_flag, records.STOREHOSTADDRESS_V6_FLAG)
        + v2 * (_np(batch.column("magic")) == records.MESSAGE_MAGIC_V2)
        + _np(batch.column("body_len")).astype(np.int64)
        + _np(pc.binary_length(batch.column("topic"))).astype(np.int64)
        + _per_map(props, text)  # a null map has no entries: 0, as an empty one
    )
    return pa.array(size, pa.int64())


def size_mismatch(batch: pa.RecordBatch) -> pa.Array:
    """TOTALSIZE is not what the row's fields add up to. A properties string may end with the separator after its
    last entry or without it: the clients and mqlake write it, Apache RocketMQ's broker (4.9.x, 5.x) re-encodes a
    message's properties without it. Both decode to the same entries, so both sizes are right."""
    size, computed = pc.cast(batch.column("msg_size"), pa.int64()), size_from_fields(batch)
    props = batch.column("properties")
    entries = _per_map(props, np.ones(len(props.keys), np.int64))
    unterminated = pc.and_(pa.array(entries > 0), pc.equal(size, pc.subtract(computed, 1)))
    return pc.and_(pc.not_equal(size, computed), pc.invert(unterminated))


def _differs(a: pa.Array, b: pa.Array) -> pa.Array:
    """``NOT (a <=> b)``: exactly one is null, or both are set and differ."""
    return pc.if_else(pc.equal(pc.is_null(a), pc.is_null(b)), pc.fill_null(pc.not_equal(a, b), False), True)


def crc_mismatch(batch: pa.RecordBatch) -> pa.Array:
    """The body does not match its stored BODYCRC: ``body_crc32`` (recomputed from the body) against ``body_crc``."""
    differs = pc.not_equal(batch.column("body_crc32"), pc.cast(batch.column("body_crc"), pa.int64()))
    return pc.or_(pc.invert(batch.column("crc_ok")), pc.and_(pc.greater(batch.column("body_len"), 0), differs))


def _properties_broken(batch: pa.RecordBatch) -> pa.Array:
    props = batch.column("properties")
    out = pc.or_(
        pc.or_(_differs(batch.column("tags"), pc.map_lookup(props, properties.PROPERTY_TAGS, "first")),
               _differs(batch.column("keys"), pc.map_lookup(props, properties.PROPERTY_KEYS, "first"))),
        _differs(batch.column("uniq_key"),
                 pc.map_lookup(props, properties.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "first")),
    )  # fmt: skip
    if len(props.keys):  # a bad character in any name or value, or an empty name
        keys, values = props.keys, props.items
        bad = (_np(pc.match_substring(keys, _BAD_TEXT), False) | _np(pc.match_substring(values, _BAD_TEXT), False)
               | (_np(pc.binary_length(keys)) == 0))  # fmt: skip
        out = pc.or_(out, pa.array(_per_map(props, bad.astype(np.int64)) > 0))
    return out


def _store_time_outside(batch: pa.RecordBatch) -> pa.Array:
    t = batch.column("store_timestamp")
    first = pc.fill_null(batch.column(SEGMENT_FIRST_TIME), 0)
    last = pc.fill_null(batch.column(SEGMENT_LAST_TIME), _MAX_LONG)
    return pc.or_(pc.or_(pc.less_equal(t, 0), pc.less(t, first)), pc.greater(t, last))


def _queue_offset_gap(batch: pa.RecordBatch) -> pa.Array:
    prev = batch.column(sequence.PREV_QUEUE_OFFSET)
    gap = pc.fill_null(pc.not_equal(batch.column("queue_offset"), pc.add(prev, 1)), False)
    return pc.and_(pa.array(sequence.consumable_mask(pc.fill_null(batch.column("sys_flag"), 0))), gap)


def _ne(t: pa.RecordBatch, a: str, b: str) -> pa.Array:
    """``a != b``, false where either is null."""
    return pc.fill_null(pc.not_equal(t.column(a), t.column(b)), False)


def _queue_does_not_continue(t: pa.RecordBatch) -> pa.Array:
    first, prev_last = t.column("first_offset"), t.column("prev_last")
    after_tier = pc.and_(t.column("prev_contiguous"), pc.not_equal(first, pc.add(prev_last, 1)))  # null: no prev
    from_zero = pc.and_(pc.and_(pc.is_null(prev_last), t.column("run_from_zero")), pc.not_equal(first, 0))
    return pc.or_(pc.fill_null(after_tier, False), pc.fill_null(from_zero, False))


RULES: tuple[Rule, ...] = (
    # ---- per record ------------------------------------------------------------------------------------
    Rule(
        "magic_valid",
        MESSAGES,
        "MAGICCODE is a message magic (V1 or V2)",
        lambda b: pc.invert(pc.is_in(b.column("magic"), pa.array([records.MESSAGE_MAGIC_V1, records.MESSAGE_MAGIC_V2],
                                                                   b.schema.field("magic").type))),
        ("magic",),
    ),
    Rule(
        "crc_matches",
        MESSAGES,
        "the body CRC recomputed from the row's body equals the stored BODYCRC",
        crc_mismatch,
        ("body_crc", "body_crc32 AS recomputed"),
    ),
    Rule(
        "size_matches_fields",
        MESSAGES,
        "TOTALSIZE equals the length computed from the record's fields",
        size_mismatch,
        ("msg_size", f"{SIZE_FROM_FIELDS} AS computed"),
    ),
    Rule(
        "offset_is_base_plus_position",
        MESSAGES,
        "PHYSICALOFFSET equals the segment's base offset plus the record's position",
        lambda b: pc.not_equal(
            b.column("commitlog_offset"), pc.add(pc.cast(b.column("segment"), pa.int64()), b.column("position"))
        ),
        ("commitlog_offset",),
    ),
    Rule(
        "records_contiguous",
        MESSAGES,
        "the first record starts at position 0 and each record starts where the previous one ended",
        lambda b: pc.not_equal(b.column("position"), pc.fill_null(b.column(sequence.PREV_END), 0)),
        ("prev_end",),
    ),
    Rule(
        "queue_offsets_contiguous_in_segment",
        MESSAGES,
        "within a segment each (topic, queue)'s offsets go up by exactly 1: no gap, no duplicate "
        "(transaction half/rollback records take no queue offset and are skipped)",
        _queue_offset_gap,
        ("topic", "queue_id", "queue_offset", "prev_queue_offset"),
    ),
    Rule(
        "store_time_in_segment_range",
        MESSAGES,
        "STORETIMESTAMP is positive and inside the [first, last] store time the store recorded for the segment",
        _store_time_outside,
        ("store_timestamp",),
    ),
    Rule(
        "properties_parse",
        MESSAGES,
        "the properties string parses into valid UTF-8 names and values, and tags/keys/uniq_key agree with it",
        _properties_broken,
    ),
    # ---- per segment -----------------------------------------------------------------------------------
    Rule(
        "file_scans_clean",
        SEGMENTS,
        "every record of the file decodes, up to the BLANK filler (no bad record, no torn tail)",
        lambda t: pc.or_(pc.is_valid(t.column("scan_error")), t.column("torn_tail")),
        ("scan_error", "torn_tail"),
    ),
    Rule(
        "ends_with_blank",
        SEGMENTS,
        "a sealed segment ends in a BLANK record (only the active tail may end otherwise, and it is never tiered)",
        lambda t: pc.invert(t.column("ends_with_blank")),
        ("valid_bytes", "file_size"),
    ),
    Rule(
        "rows_cover_file",
        SEGMENTS,
        "the decoded rows are every record of the file: as many rows as records, covering every valid byte",
        lambda t: pc.or_(_ne(t, "row_count", "record_count"), _ne(t, "row_bytes", "valid_bytes")),
        ("record_count", "row_count", "valid_bytes", "row_bytes"),
    ),
    Rule(
        "matches_manifest",
        SEGMENTS,
        "the rows' count and first/last store times equal what the store recorded when it sealed the segment",
        # a fact the store did not record (null) is not compared
        lambda t: pc.or_(
            pc.or_(_ne(t, "row_count", "message_count"), _ne(t, "row_first_store_time", "first_store_time")),
            _ne(t, "row_last_store_time", "last_store_time"),
        ),
        ("message_count", "row_count", "first_store_time", "row_first_store_time", "last_store_time",
         "row_last_store_time"),
    ),
    # ---- per queue, against the tier -------------------------------------------------------------------
    Rule(
        "queue_offsets_continue_tier",
        QUEUES,
        "a queue's first offset in the segment follows the last one tiered before it (+1), or is 0 when the "
        "tier covers the CommitLog from offset 0; no continuity is required across a hole in the tier",
        _queue_does_not_continue,
        ("topic", "queue_id", "first_offset", "prev_last"),
    ),
    Rule(
        "queue_offsets_not_in_tier",
        QUEUES,
        "no queue offset of the segment is already in the tier (no duplicate across everything tiered)",
        lambda t: pc.greater(t.column("overlaps"), 0),
        ("topic", "queue_id", "first_offset", "last_offset", "overlaps"),
    ),
)


def rules_for(dataset: str) -> list[Rule]:
    return [r for r in RULES if r.dataset == dataset]


def with_body_checks(df):
    """``df`` with ``body_len`` and ``body_crc32`` (the CRC Spark recomputes from the body) beside ``body``."""
    from pyspark.sql import functions as F

    return df.select("*", F.octet_length("body").alias("body_len"), F.expr(BODY_CRC32_SQL).alias("body_crc32"))


def checked_messages(df):
    """The ``messages`` dataset from rows of the canonical schema (see the module docstring).

    The tiering job builds the same columns while it decodes (pipelines/compaction/staging.py); this is
    the same dataset over any frame of rows: the bodies are reduced to length and CRC first, then each
    segment's rows are brought together in position order (one shuffle of narrow rows) for
    :class:`expectations.sequence.Previous`.
    """
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    narrow = with_body_checks(df).drop("body")
    ordered = narrow.repartition("segment").sortWithinPartitions("segment", "position")
    out_schema = pa.schema([*to_arrow_schema(ordered.schema), *sequence.FIELDS])

    def previous(batches):
        state = sequence.Previous()
        for batch in batches:
            yield state.extend(batch)

    return ordered.mapInArrow(previous, from_arrow_schema(out_schema))


def flag_batch(batch: pa.RecordBatch, rules: tuple[Rule, ...] | list[Rule]) -> pa.RecordBatch:
    """``batch`` (rows of the rules' dataset) with one boolean column per rule (``rule.flag``: the row breaks it);
    rows of ``messages`` also get :data:`SIZE_FROM_FIELDS` (what the size rule compares TOTALSIZE with, kept for
    its samples)."""
    cols = []
    if rules and rules[0].dataset == MESSAGES:
        cols.append((pa.field(SIZE_FROM_FIELDS, pa.int64()), size_from_fields(batch)))
    cols += [(pa.field(r.flag, pa.bool_(), nullable=False), pc.fill_null(r.condition(batch), False)) for r in rules]
    return pa.RecordBatch.from_arrays(
        [*batch.columns, *(a for _, a in cols)], schema=pa.schema([*batch.schema, *(f for f, _ in cols)])
    )


def flagged(df, segments: pa.Table, rules: tuple[Rule, ...] | list[Rule]):
    """``df`` (a Spark frame of the ``messages`` dataset) with one boolean column per rule of ``rules``
    (``rule.flag``): the rules' Arrow functions (:func:`flag_batch`) over the frame's batches, every rule in the
    same pass over the rows.  ``segments`` (the ``segments`` dataset) supplies the store's per-segment time range
    the store-time rule compares against (a broadcast join: one row per segment), unless ``df`` has the two
    columns already."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    if SEGMENT_FIRST_TIME not in df.columns:
        times = segments.select(["segment", "first_store_time", "last_store_time"]).rename_columns(
            ["segment", SEGMENT_FIRST_TIME, SEGMENT_LAST_TIME]
        )
        df = df.join(F.broadcast(df.sparkSession.createDataFrame(times)), "segment", "left")
    rules = tuple(rules)
    out = flag_batch(pa.RecordBatch.from_pylist([], to_arrow_schema(df.schema)), rules).schema

    def flag(batches):
        for batch in batches:
            yield flag_batch(batch, rules)

    return df.mapInArrow(flag, from_arrow_schema(out))
