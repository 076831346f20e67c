"""``mqlake lake erase``: erase messages from the tiered history by topic and key (or msgId), as a data-protection
request asks, and record that it was done.

1. The ``messages`` table's matching rows (KEYS holding the key or UNIQ_KEY equal to it, as a query by key
   matches; or the offset msgId / UNIQ_KEY for ``--msg-id``) are removed by a Delta DELETE.  Where the table
   has deletion vectors enabled, ``REORG TABLE ... APPLY (PURGE)`` rewrites the files the vectors point into,
   so no data file the snapshot uses still holds an erased row.
2. ``VACUUM`` deletes the files that held them once they are older than the retention the operator gives
   (``--retain-hours``; default: the table's ``delta.deletedFileRetentionDuration``).  Until then time travel
   (``VERSION AS OF``) to an older version still shows them; run the command again (or ``VACUUM``) after the
   retention to delete them for good.
3. The same messages leave the topic's typed table (``typed/<topic>``) and ``decode_errors``, which hold their
   fields and raw bodies: a row there is erased when it is one of the messages erased from ``messages`` (same
   broker, topic, queue and queue offset) or matches by the columns it carries itself (a KEYS token, or the
   offset msgId), so a message erased from ``messages`` before leaves them too.  Same purge and ``VACUUM``.
4. An audit row goes to the Delta table ``erasures`` (who, what, when, how many rows of each table, the
   ``messages`` table version).

Messages still in the live CommitLog (``--store-dir``) are named in the output: the CommitLog is append-only, so
they leave only when their segment expires; once the tier job has tiered that segment, run the erase again.
"""

from __future__ import annotations

import getpass
import json
import sys
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from lake import objectstore
from lake.tables import BROKER_NAME, DECODE_ERRORS, MESSAGES, table_uri, typed_table_uri
from pipelines.objectstore_cli import lake_option
from pipelines.spark import ConfOption, MasterOption, add_spark_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ERASURES = "erasures"  # the audit table under the lake root


@dataclass
class EraseReport:
    erased_at: str
    operator: str
    topic: str
    key: str | None
    msg_id: str | None
    rows: int  # erased from messages
    table_version: int | None  # of messages, after the erase
    vacuum_retain_hours: float | None
    typed_rows: int = 0  # erased from the topic's typed table
    decode_error_rows: int = 0  # erased from decode_errors
    live: list[dict] = field(default_factory=list)  # still in the CommitLog: commitlog_offset, msg_id, segment


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def match_condition(topic: str, key: str | None, msg_id: str | None) -> str:
    """The SQL condition of the messages to erase: a query by key's match (a KEYS token or UNIQ_KEY), or the
    offset msgId / UNIQ_KEY (the msgId a client sees)."""
    if (key is None) == (msg_id is None):
        raise typer.BadParameter("give exactly one of --key and --msg-id")
    return _condition(topic, key, msg_id, with_uniq_key=True)


def _condition(topic: str, key: str | None, msg_id: str | None, *, with_uniq_key: bool) -> str:
    """The match by key or msgId over a table's own columns (the typed tables and ``decode_errors`` carry
    ``keys`` and ``msg_id``, not ``uniq_key``)."""
    if key is not None:
        which = [f"array_contains(split(coalesce(keys, ''), ' '), {_literal(key)})"]
        value = key
    else:
        assert msg_id is not None
        which, value = [f"msg_id = {_literal(msg_id)}"], msg_id
    if with_uniq_key:
        which.append(f"uniq_key = {_literal(value)}")
    return f"topic = {_literal(topic)} AND ({' OR '.join(which)})"


def _same_messages(
    topic: str, key: str | None, msg_id: str | None, found: list[tuple[str | None, int, int]]
) -> str:
    """The condition of a typed table's or ``decode_errors``' rows of the erased messages: those ``found`` in
    ``messages`` ((broker, queue id, queue offset) of ``topic``; broker None: a table without the column), or
    matching by their own columns."""
    by_queue: dict[tuple[str | None, int], list[int]] = {}
    for broker, queue, offset in found:
        by_queue.setdefault((broker, queue), []).append(offset)
    which = [_condition(topic, key, msg_id, with_uniq_key=False)]
    for (broker, queue), offsets in sorted(by_queue.items(), key=lambda kv: (kv[0][0] or "", kv[0][1])):
        of_broker = "" if broker is None else f" AND {BROKER_NAME} = {_literal(broker)}"
        which.append(
            f"(topic = {_literal(topic)}{of_broker} AND queue_id = {int(queue)} "
            f"AND queue_offset IN ({', '.join(str(int(o)) for o in sorted(offsets))}))"
        )
    return " OR ".join(f"({w})" for w in which)


def erase(
    spark: SparkSession,
    lake: str | Path,
    topic: str,
    *,
    key: str | None = None,
    msg_id: str | None = None,
    retain_hours: float | None = None,
    store_dir: Path | None = None,
    operator: str | None = None,
) -> EraseReport:
    """Erase the matching messages from the lake's ``messages`` table (DELETE, purge, VACUUM), append the audit
    row, and name the matching messages still in the CommitLog under ``store_dir``."""
    from pyspark.sql import functions as F

    from lake import delta as lk
    from pipelines import spark_tables

    cond = match_condition(topic, key, msg_id)
    spark_tables.use_lake_settings(spark)
    uri = table_uri(lake, MESSAGES)
    found: list[tuple[str | None, int, int]] = []
    if lk.is_table(uri):
        matching = spark_tables.read_table(spark, uri).where(cond)
        broker = F.col(BROKER_NAME) if BROKER_NAME in matching.columns else F.lit(None)  # a lake of one broker
        found = [(r[0], r[1], r[2]) for r in matching.select(broker, "queue_id", "queue_offset").collect()]
    rows, version = _erase_rows(spark, uri, cond, retain_hours, counted=len(found))
    same = _same_messages(topic, key, msg_id, found)
    typed_rows, _ = _erase_rows(spark, typed_table_uri(lake, topic), same, retain_hours)
    error_rows, _ = _erase_rows(spark, table_uri(lake, DECODE_ERRORS), same, retain_hours)
    report = EraseReport(
        erased_at=datetime.now(UTC).isoformat(timespec="seconds"), operator=operator or getpass.getuser(),
        topic=topic, key=key, msg_id=msg_id, rows=rows, table_version=version,
        vacuum_retain_hours=None if retain_hours is None else float(retain_hours), typed_rows=typed_rows,
        decode_error_rows=error_rows,
    )  # fmt: skip
    if store_dir is not None:
        live = spark.read.format("commitlog").load(str(store_dir)).where(cond)
        report.live = [r.asDict() for r in live.select("commitlog_offset", "msg_id", "segment").collect()]
    _audit(spark, lake, report)
    return report


def _erase_rows(
    spark: SparkSession, uri: str, cond: str, retain_hours: float | None, counted: int | None = None
) -> tuple[int, int | None]:
    """DELETE the rows of the Delta table at ``uri`` matching ``cond``, purge the deletion vectors pointing at
    them, VACUUM; returns the rows erased and the table's version after (None: no table there).  ``counted``:
    the matching rows, when the caller has already read them (not read a second time)."""
    from lake import delta as lk
    from pipelines import spark_tables

    if not lk.is_table(uri):
        return 0, None
    rows = spark_tables.read_table(spark, uri).where(cond).count() if counted is None else counted
    if rows:
        spark.sql(f"DELETE FROM delta.`{uri}` WHERE {cond}")
        props = dict(spark.sql(f"SHOW TBLPROPERTIES delta.`{uri}`").collect())
        if props.get("delta.enableDeletionVectors", "false").lower() == "true":
            spark.sql(f"REORG TABLE delta.`{uri}` APPLY (PURGE)")
    _vacuum(spark, uri, retain_hours)
    return rows, lk.open_table(uri).version()


def _vacuum(spark: SparkSession, uri: str, retain_hours: float | None) -> None:
    if retain_hours is None:
        spark.sql(f"VACUUM delta.`{uri}`")  # the table's delta.deletedFileRetentionDuration
        return
    # the operator chose the retention: Delta's guard against one below the table's default is for accidents
    key = "spark.databricks.delta.retentionDurationCheck.enabled"
    spark.conf.set(key, "false")
    try:
        spark.sql(f"VACUUM delta.`{uri}` RETAIN {float(retain_hours)} HOURS")
    finally:
        spark.conf.unset(key)


def _audit(spark: SparkSession, lake: str | Path, report: EraseReport) -> None:
    from pyspark.sql import types as T

    schema = T.StructType([
        T.StructField("erased_at", T.TimestampType(), False), T.StructField("operator", T.StringType(), False),
        T.StructField("topic", T.StringType(), False), T.StructField("key", T.StringType()),
        T.StructField("msg_id", T.StringType()), T.StructField("rows", T.LongType(), False),
        T.StructField("table_version", T.LongType()), T.StructField("vacuum_retain_hours", T.DoubleType()),
        T.StructField("live_commitlog_offsets", T.ArrayType(T.LongType()), False),
        T.StructField("typed_rows", T.LongType()), T.StructField("decode_error_rows", T.LongType()),
    ])  # fmt: skip
    row = (datetime.fromisoformat(report.erased_at), report.operator, report.topic, report.key, report.msg_id,
           report.rows, report.table_version, report.vacuum_retain_hours,
           [m["commitlog_offset"] for m in report.live], report.typed_rows, report.decode_error_rows)  # fmt: skip
    # mergeSchema: an audit table written before the typed tables were erased gains their two columns
    spark.createDataFrame([row], schema).write.format("delta").mode("append").option("mergeSchema", "true").save(
        table_uri(lake, ERASURES))  # fmt: skip


def erase_command(
    lake: Annotated[str, typer.Option("--lake", help="The lake directory or s3://bucket/prefix.")],
    topic: Annotated[str, typer.Option("--topic", help="The topic of the messages to erase.")],
    key: Annotated[
        str | None, typer.Option("--key", help="Erase the messages with this key (KEYS or UNIQ_KEY).")
    ] = None,
    msg_id: Annotated[str | None, typer.Option("--msg-id", help="Erase the message with this msgId.")] = None,
    retain_hours: Annotated[
        float | None,
        typer.Option("--retain-hours", help="VACUUM retention: files that held erased rows are deleted once older "
                     "(default: the table's delta.deletedFileRetentionDuration)."),
    ] = None,
    store_dir: Annotated[
        Path | None, typer.Option("--store-dir", help="The broker's store: name matching messages still in it.")
    ] = None,
    operator: Annotated[str | None, typer.Option("--operator", help="Who asks (default: the OS user).")] = None,
    master: MasterOption = None,
    conf: ConfOption = None,
) -> None:
    """Erase messages from the tiered history by topic and key or msgId (Delta DELETE + VACUUM, audited)."""
    match_condition(topic, key, msg_id)  # a usage error before any Spark starts
    location = lake_option(lake)
    if not objectstore.is_remote(location) and not Path(location).is_dir():
        raise typer.BadParameter(f"lake directory {lake} does not exist", param_hint="--lake")
    if retain_hours is not None and retain_hours < 0:
        raise typer.BadParameter("must not be negative", param_hint="--retain-hours")
    from pipelines.spark import get_spark

    spark = get_spark(app_name="mqlake-erase", **add_spark_options(master, conf))
    report = erase(spark, location, topic, key=key, msg_id=msg_id, retain_hours=retain_hours, store_dir=store_dir,
                   operator=operator)  # fmt: skip
    print(json.dumps(asdict(report)))
    if report.live:
        sys.stderr.write(
            f"note: {len(report.live)} matching message(s) are still in the live CommitLog of {store_dir} (offsets "
            f"{', '.join(str(m['commitlog_offset']) for m in report.live)}): the CommitLog is append-only, so they "
            f"are served until their segment expires (fileReservedTime); run this erase again once the tier job "
            f"has tiered that segment\n"
        )
