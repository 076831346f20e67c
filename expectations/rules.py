"""The segment-integrity rules: each one a SQL condition that is true for a row breaking it.

Every rule of a dataset becomes a flag column of one pass over that dataset (:func:`flagged`), so the
rows are read once however many rules there are; Great Expectations then evaluates the per-segment
violation counts (expectations/runner.py).

Three datasets are checked, each a Spark DataFrame:

``messages``
    The decoded rows of the segments being tiered, exactly as they will be committed (canonical schema,
    pipelines/schema.py), with ``body`` replaced by ``body_len`` and ``body_crc32`` (the CRC Spark
    recomputes from the body), plus ``prev_end`` (where the previous record of the segment ended) and
    ``prev_queue_offset`` (the previous queue offset of the same (topic, queue) in the segment, among
    records of the same consumability, see expectations/sequence.py).  The tiering job builds it while it
    decodes the segments; :func:`checked_messages` builds it from any frame of rows.
``segments``
    One row per segment being tiered: the facts of a scan of the file itself
    (``pipelines.segments.scan_segment``) beside the aggregates of its decoded rows.  Columns:
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

Every byte-layout constant in the SQL comes from store/format/ (records, properties).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

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
    condition: str  # SQL over one row of the dataset: true when the row breaks the rule
    columns: tuple[str, ...] = ()  # SQL expressions kept in the sample of breaking rows (beside segment, position)

    @property
    def flag(self) -> str:
        """The name of the rule's flag column (see :func:`flagged`)."""
        return f"_broken_{self.name}"


def _size_sql() -> str:
    """The TOTALSIZE a row's fields add up to, as SQL, from ``records.record_length`` (linear in each length)."""
    base = records.record_length(0, 0, 0, 0, records.MESSAGE_MAGIC_V1)
    born_v6 = records.record_length(records.BORNHOST_V6_FLAG, 0, 0, 0) - base
    store_v6 = records.record_length(records.STOREHOSTADDRESS_V6_FLAG, 0, 0, 0) - base
    v2 = records.record_length(0, 0, 0, 0, records.MESSAGE_MAGIC_V2) - base
    # name + value + the two separators: what encode_properties spends per entry beyond the text
    per_entry = len(properties.encode_properties({"k": "v"})) - 2
    return (
        f"({base}"
        f" + CASE WHEN (sys_flag & {records.BORNHOST_V6_FLAG}) != 0 THEN {born_v6} ELSE 0 END"
        f" + CASE WHEN (sys_flag & {records.STOREHOSTADDRESS_V6_FLAG}) != 0 THEN {store_v6} ELSE 0 END"
        f" + CASE WHEN magic = {records.MESSAGE_MAGIC_V2} THEN {v2} ELSE 0 END"
        " + body_len + octet_length(topic)"
        # the text of every name and value plus the separators; no lambda, so Spark compiles it with the rest
        " + coalesce(octet_length(array_join(map_keys(properties), ''))"
        f" + octet_length(array_join(map_values(properties), '')) + {per_entry} * size(properties), 0))"
    )


CONSUMABLE_SQL = (
    f"(sys_flag & {records.TRANSACTION_ROLLBACK_TYPE}) "
    f"IN ({records.TRANSACTION_NOT_TYPE}, {records.TRANSACTION_COMMIT_TYPE})"
)
BODY_CRC32_SQL = "(crc32(body) & 2147483647)"  # UtilAll.crc32: java.util.zip.CRC32 masked to 31 bits
_BAD_TEXT = "\ufffd"  # what a UTF-8 decode with errors="replace" leaves behind
# the store's first/last store time of a message's segment, joined onto the messages by :func:`flagged`
SEGMENT_FIRST_TIME = "_segment_first_store_time"
SEGMENT_LAST_TIME = "_segment_last_store_time"


RULES: tuple[Rule, ...] = (
    # ---- per record ------------------------------------------------------------------------------------
    Rule(
        "magic_valid",
        MESSAGES,
        "MAGICCODE is a message magic (V1 or V2)",
        f"magic NOT IN ({records.MESSAGE_MAGIC_V1}, {records.MESSAGE_MAGIC_V2})",
        ("magic",),
    ),
    Rule(
        "crc_matches",
        MESSAGES,
        "the body CRC recomputed from the row's body equals the stored BODYCRC",
        "NOT crc_ok OR (body_len > 0 AND body_crc32 != body_crc)",
        ("body_crc", "body_crc32 AS recomputed"),
    ),
    Rule(
        "size_matches_fields",
        MESSAGES,
        "TOTALSIZE equals the length computed from the record's fields",
        f"msg_size != {_size_sql()}",
        ("msg_size", f"{_size_sql()} AS computed"),
    ),
    Rule(
        "offset_is_base_plus_position",
        MESSAGES,
        "PHYSICALOFFSET equals the segment's base offset plus the record's position",
        "commitlog_offset != CAST(segment AS BIGINT) + position",
        ("commitlog_offset",),
    ),
    Rule(
        "records_contiguous",
        MESSAGES,
        "the first record starts at position 0 and each record starts where the previous one ended",
        "position != coalesce(prev_end, 0)",
        ("prev_end",),
    ),
    Rule(
        "queue_offsets_contiguous_in_segment",
        MESSAGES,
        "within a segment each (topic, queue)'s offsets go up by exactly 1: no gap, no duplicate "
        "(transaction half/rollback records take no queue offset and are skipped)",
        f"{CONSUMABLE_SQL} AND prev_queue_offset IS NOT NULL AND queue_offset != prev_queue_offset + 1",
        ("topic", "queue_id", "queue_offset", "prev_queue_offset"),
    ),
    Rule(
        "store_time_in_segment_range",
        MESSAGES,
        "STORETIMESTAMP is positive and inside the [first, last] store time the store recorded for the segment",
        f"store_timestamp <= 0 OR store_timestamp < coalesce({SEGMENT_FIRST_TIME}, 0) "
        f"OR store_timestamp > coalesce({SEGMENT_LAST_TIME}, 9223372036854775807)",
        ("store_timestamp",),
    ),
    Rule(
        "properties_parse",
        MESSAGES,
        "the properties string parses into valid UTF-8 names and values, and tags/keys/uniq_key agree with it",
        f"NOT (tags <=> properties['{properties.PROPERTY_TAGS}']) "
        f"OR NOT (keys <=> properties['{properties.PROPERTY_KEYS}']) "
        f"OR NOT (uniq_key <=> properties['{properties.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX}']) "
        # a bad character in any name or value is one in their concatenation (a decode leaves whole characters)
        f"OR instr(array_join(map_keys(properties), ''), '{_BAD_TEXT}') > 0 "
        f"OR instr(array_join(map_values(properties), ''), '{_BAD_TEXT}') > 0 "
        "OR array_contains(map_keys(properties), '')",
    ),
    # ---- per segment -----------------------------------------------------------------------------------
    Rule(
        "file_scans_clean",
        SEGMENTS,
        "every record of the file decodes, up to the BLANK filler (no bad record, no torn tail)",
        "scan_error IS NOT NULL OR torn_tail",
        ("scan_error", "torn_tail"),
    ),
    Rule(
        "ends_with_blank",
        SEGMENTS,
        "a sealed segment ends in a BLANK record (only the active tail may end otherwise, and it is never tiered)",
        "NOT ends_with_blank",
        ("valid_bytes", "file_size"),
    ),
    Rule(
        "rows_cover_file",
        SEGMENTS,
        "the decoded rows are every record of the file: as many rows as records, covering every valid byte",
        "row_count != record_count OR row_bytes != valid_bytes",
        ("record_count", "row_count", "valid_bytes", "row_bytes"),
    ),
    Rule(
        "matches_manifest",
        SEGMENTS,
        "the rows' count and first/last store times equal what the store recorded when it sealed the segment",
        "(message_count IS NOT NULL AND row_count != message_count) "
        "OR (first_store_time IS NOT NULL AND row_first_store_time != first_store_time) "
        "OR (last_store_time IS NOT NULL AND row_last_store_time != last_store_time)",
        ("message_count", "row_count", "first_store_time", "row_first_store_time", "last_store_time",
         "row_last_store_time"),
    ),
    # ---- per queue, against the tier -------------------------------------------------------------------
    Rule(
        "queue_offsets_continue_tier",
        QUEUES,
        "a queue's first offset in the segment follows the last one tiered before it (+1), or is 0 when the "
        "tier covers the CommitLog from offset 0; no continuity is required across a hole in the tier",
        "(prev_last IS NOT NULL AND prev_contiguous AND first_offset != prev_last + 1) "
        "OR (prev_last IS NULL AND run_from_zero AND first_offset != 0)",
        ("topic", "queue_id", "first_offset", "prev_last"),
    ),
    Rule(
        "queue_offsets_not_in_tier",
        QUEUES,
        "no queue offset of the segment is already in the tier (no duplicate across everything tiered)",
        "overlaps > 0",
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


def flagged(dataset: str, df, segments_df, rules: tuple[Rule, ...] | list[Rule]):
    """``df`` (the ``dataset``) with one boolean column per rule of ``rules`` (``rule.flag``), so every rule is
    evaluated in the same pass over the rows; ``segments_df`` supplies the store's per-segment time range the
    ``messages`` rules compare against (a broadcast join: one row per segment), unless ``df`` has the two
    columns already (the tiering job's staging pass adds them as it decodes)."""
    from pyspark.sql import functions as F

    needs_times = any(SEGMENT_FIRST_TIME in r.condition for r in rules) and SEGMENT_FIRST_TIME not in df.columns
    if dataset == MESSAGES and needs_times:
        times = segments_df.select(
            "segment",
            F.col("first_store_time").alias(SEGMENT_FIRST_TIME),
            F.col("last_store_time").alias(SEGMENT_LAST_TIME),
        )
        df = df.join(F.broadcast(times), "segment", "left")
    # a NULL condition does not break the rule, as in a WHERE clause
    return df.select("*", *(F.coalesce(F.expr(f"({r.condition})"), F.lit(False)).alias(r.flag) for r in rules))
